"""One spec per precision (:mod:`precsearch.precision_spec`, the recipes' rows), and the figures read from it.

Every consumer covering every precision, or saying why not, is the recipes' contract test
(``tests/recipes/test_contract.py``); here are the figures whose values matter beyond that contract.
"""

from __future__ import annotations

from precsearch.arch import PRESETS
from precsearch.precision import Precision
from precsearch.precision_spec import SPECS, spec_of
from precsearch.probe.memory.peak import ELEMENT_BYTES, WEIGHT_BYTES
from precsearch.search.sensitivity import speed_effect


def test_every_precision_has_one_spec():
    """A precision without a row would make every consumer fail with a KeyError at run time."""
    assert set(SPECS) == set(Precision)
    assert spec_of("mxfp8") is SPECS[Precision.MXFP8]


def test_the_memory_model_reads_the_bytes_it_always_had():
    """The spec's bytes are the memory model's old hand-written figures (else every memory prediction moves);
    rowwise keeps one scale per row, left out like a per-tensor scale."""
    assert ELEMENT_BYTES == {Precision.BF16: 2.0, Precision.FP8_DELAYED: 1.0, Precision.FP8_CURRENT: 1.0,
                             Precision.FP8_BLOCK: 1.0 + 4 / 128, Precision.MXFP8: 1.0 + 1 / 32,
                             Precision.NVFP4: 0.5 + 1 / 16, Precision.FP8_ROWWISE: 1.0}
    assert WEIGHT_BYTES == ELEMENT_BYTES | {Precision.FP8_BLOCK: 1.0 + 4 / 128**2, Precision.NVFP4: 0.5 + 1 / 256}


def test_fp4_saves_more_gemm_time_than_fp8():
    """NVFP4's nominal rate is twice FP8's on Blackwell: the sensitivity table predicts more time saved."""
    cfg = PRESETS["llama3-8b"].with_overrides(n_layers=2)
    unit = "decoder.layers.0.mlp.linear_fc1"
    assert speed_effect(cfg, unit, Precision.NVFP4) > speed_effect(cfg, unit, Precision.FP8_CURRENT) > 0
