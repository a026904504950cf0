"""A probe started from a GGUF file computes what transformers builds from the same file.

transformers' own GGUF loader (``from_pretrained(..., gguf_file=...)``) is the independent reference: a
tensor in the wrong place, llama.cpp's Q/K row order not undone, or a metadata key read wrong (GQA heads,
eps, RoPE theta) changes the logits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from _gguf import SHAPE, hf_state, write_llama_gguf
from precsearch.arch.gguf_checkpoint import read_config

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_llama_gguf(path, hf_state())


@pytest.mark.slow
def test_probe_matches_transformers_loading_the_same_file(written):
    """The probe built from the GGUF computes what transformers' own GGUF loader builds from it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from precsearch.arch.hf_checkpoint import CheckpointStart
    from precsearch.backends import get_backend
    from precsearch.policy import Policy
    from precsearch.probe.runner import build_probe

    path, _ = written
    try:
        hf = transformers.LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           torch_dtype=torch.float32).eval()
    except (ImportError, ValueError, OSError) as exc:  # an older transformers without this GGUF path
        pytest.skip(f"transformers cannot load this GGUF: {exc}")
    cpu = torch.device("cpu")
    cfg = read_config(path)
    probe = build_probe(cfg, Policy.bf16(None), get_backend("emulated", cpu), cpu, seed=0,
                        init=CheckpointStart(path, (0, 1))).eval()
    ids = torch.randint(0, SHAPE["vocab"], (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(probe(ids), hf(ids).logits, rtol=1e-4, atol=1e-4)
