"""How a byte-level BPE tokenizer cuts text into pieces before merging: the split patterns, by family.

BPE merges never cross a piece, so the pattern is part of the tokenizer: the same vocabulary and merges
under another pattern give other ids. The patterns use ``\\p{..}`` classes, which both ``tiktoken`` and
``tokenizers`` (Oniguruma) understand.
"""

from __future__ import annotations

#: GPT-2's pattern (also SmolLM's, after its digits are split off one by one).
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
#: Llama 3's pattern (Meta's ``llama/tokenizer.py``, ``pat_str``).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
