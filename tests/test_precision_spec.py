"""One spec per precision (:mod:`precsearch.precision_spec`), and every consumer covering every precision.

Each consumer either handles a precision or says why not; a new ``Precision`` with a row in the spec
but no handling in one consumer fails here, naming the consumer.
"""

from __future__ import annotations

import sys
import types

import pytest

from precsearch.backends.capability import TORCHAO_NEVER, te_reason, torchao_reason
from precsearch.backends.te import make_te_recipe
from precsearch.backends.torchao_backend import RECIPE_NAMES
from precsearch.export.megatron import megatron_export
from precsearch.export.torchtitan import EXPRESSIBLE, torchtitan_export
from precsearch.fp8.scaling import ROLES, make_scaler
from precsearch.arch import PRESETS
from precsearch.policy import Policy
from precsearch.precision import LayerRecipe, Precision
from precsearch.precision_spec import BLACKWELL, HOPPER, SPECS, spec_of
from precsearch.probe.memory.peak import ELEMENT_BYTES, WEIGHT_BYTES
from precsearch.search.sensitivity import speed_effect

LOW = [p for p in Precision if p.is_fp8]


def test_every_precision_has_one_spec():
    """A precision without a row would make every consumer below fail with a KeyError at run time."""
    assert set(SPECS) == set(Precision)
    assert spec_of("mxfp8") is SPECS[Precision.MXFP8]


def test_the_memory_model_reads_the_bytes_it_always_had():
    """The spec's bytes are the memory model's old hand-written figures (else every memory prediction moves)."""
    assert ELEMENT_BYTES == {Precision.BF16: 2.0, Precision.FP8_DELAYED: 1.0, Precision.FP8_CURRENT: 1.0,
                             Precision.FP8_BLOCK: 1.0 + 4 / 128, Precision.MXFP8: 1.0 + 1 / 32,
                             Precision.NVFP4: 0.5 + 1 / 16}
    assert WEIGHT_BYTES == ELEMENT_BYTES | {Precision.FP8_BLOCK: 1.0 + 4 / 128**2, Precision.NVFP4: 0.5 + 1 / 256}


@pytest.mark.parametrize("precision", list(Precision))
def test_capability_decides_every_precision(precision):
    """TE runs every precision on a B200 (10.0, CUDA 12.9); on an H100 it refuses only what needs Blackwell,
    naming it by its label. A precision the capability table forgot would raise or pass silently."""
    assert te_reason(precision, BLACKWELL, (12, 9)) is None
    hopper = te_reason(precision, HOPPER, (12, 9))
    needs_blackwell = precision.is_fp8 and SPECS[precision].min_capability == BLACKWELL
    assert (hopper is not None) == needs_blackwell
    if needs_blackwell:
        assert SPECS[precision].label in hopper


@pytest.mark.parametrize("precision", LOW)
def test_torchao_runs_a_precision_or_says_why_not(precision):
    """Exactly one of: a torchao recipe name, or a reason that holds on every GPU."""
    assert (precision in RECIPE_NAMES) != (precision in TORCHAO_NEVER)
    assert torchao_reason(precision, BLACKWELL) == TORCHAO_NEVER.get(precision)


@pytest.mark.parametrize("precision", LOW)
def test_te_builds_a_recipe_for_every_low_precision(precision, monkeypatch):
    """make_te_recipe picks the spec's TE class; a stand-in TE module records which (TE needs a GPU here)."""
    fake = types.ModuleType("transformer_engine.common.recipe")
    for spec in SPECS.values():
        if spec.te_recipe:
            setattr(fake, spec.te_recipe, lambda _name=spec.te_recipe, **kw: (_name, kw))
    fake.Format = types.SimpleNamespace(HYBRID="HYBRID", E4M3="E4M3")
    common = types.ModuleType("transformer_engine.common")
    common.recipe = fake
    monkeypatch.setitem(sys.modules, "transformer_engine", types.ModuleType("transformer_engine"))
    monkeypatch.setitem(sys.modules, "transformer_engine.common", common)
    monkeypatch.setitem(sys.modules, "transformer_engine.common.recipe", fake)
    name, kwargs = make_te_recipe(LayerRecipe(precision))
    assert name == SPECS[precision].te_recipe
    assert ("fp8_format" in kwargs) == (precision is not Precision.NVFP4)


@pytest.mark.parametrize("precision", LOW)
def test_the_emulation_quantizes_every_low_precision(precision):
    """The emulated backend's scalers exist for every role of every low precision."""
    for role in ROLES:
        assert make_scaler(LayerRecipe(precision), role) is not None


def _uniform(precision: Precision) -> Policy:
    return Policy(default=precision)


@pytest.mark.parametrize("precision", LOW)
def test_megatron_expresses_every_low_precision(precision):
    """A policy all in one precision becomes Megatron's global recipe flag, the name the spec gives."""
    flags, _, _ = megatron_export(_uniform(precision), 4)
    flag = "--fp4-recipe" if precision is Precision.NVFP4 else "--fp8-recipe"
    assert flags[flags.index(flag) + 1] == SPECS[precision].megatron_recipe


@pytest.mark.parametrize("precision", LOW)
def test_torchtitan_expresses_a_precision_or_warns_why_not(precision):
    """Either a converter from the spec, or every layer kept BF16 with a warning naming the precision."""
    settings, warnings = torchtitan_export(_uniform(precision), 2)
    if precision in EXPRESSIBLE:
        assert settings["converters"] == [SPECS[precision].torchtitan[0]]
    else:
        assert settings["converters"] == []
        assert any(precision.value in w for w in warnings)


@pytest.mark.parametrize("precision", list(Precision))
def test_the_sensitivity_table_has_a_speed_for_every_precision(precision):
    """BF16 saves nothing; a faster nominal GEMM saves more of the same unit's time."""
    cfg = PRESETS["llama3-8b"].with_overrides(n_layers=2)
    saved = speed_effect(cfg, "decoder.layers.0.mlp.linear_fc1", precision)
    assert (saved > 0) == precision.is_fp8
    if precision is Precision.NVFP4:
        assert saved > speed_effect(cfg, "decoder.layers.0.mlp.linear_fc1", Precision.FP8_CURRENT)
