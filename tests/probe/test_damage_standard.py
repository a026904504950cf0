"""The standard FP8 recipe a trial's fixed-state reading is set beside (``objectives.damage.standard_reference``).

What would be wrong if these failed: the reference point is not Megatron-Core's default FP8 set-up (delayed scaling
on every block Linear, BF16 output layer, the baseline's optimizer state, the space's recipe settings), or a backend
without delayed scaling reads another recipe under the standard's name without saying so.
"""

from __future__ import annotations

import math

from _spaces import tiny_space_dict
from precsearch.arch.units import OUTPUT_LAYER, unit_names
from precsearch.config.loader import parse_space
from precsearch.policy import MemoryKnobs
from precsearch.precision import Precision
from precsearch.probe.damage.standard import standard_policy
from precsearch.recipes import DEFAULT_PRECISION, STANDARD_FP8, recipe_for, standard_fp8
from precsearch.runtime.probe_host import ProbeHost

BASELINE = MemoryKnobs(master_weights=True, moment_dtype="fp32")  # objectives.baseline_memory with BF16 parameters
DELAYED, CURRENT = STANDARD_FP8


def _every(reason: str | None = None, *missing: Precision) -> dict[Precision, str | None]:
    return {p: (reason if p in missing else None) for p in Precision}


def test_the_registry_names_delayed_scaling_first_and_current_scaling_where_delayed_cannot_run():
    assert recipe_for(DELAYED).spec.te_recipe == "DelayedScaling" and recipe_for(DELAYED).history
    assert standard_fp8(lambda p: True).precision == DELAYED
    assert standard_fp8(lambda p: p != DELAYED).precision == CURRENT
    assert standard_fp8(lambda p: False) is None


def test_the_standard_runs_every_block_linear_in_delayed_fp8_and_the_output_layer_in_bf16():
    cfg = parse_space(tiny_space_dict()).model.probe()
    policy, label = standard_policy({"margin": 1}, _every(), 0.5, BASELINE, "bf16")
    units = unit_names(cfg)
    assert {policy.precision_for(u, cfg.n_layers) for u in units if u != OUTPUT_LAYER} == {DELAYED}
    assert policy.precision_for(OUTPUT_LAYER, cfg.n_layers) == DEFAULT_PRECISION
    assert policy.recipe.margin == 1 and policy.recipe.amax_history_len == 1024  # the space's settings, else Megatron's
    assert policy.clip_grad == 0.5 and policy.memory == BASELINE and policy.warmup_steps == 0
    assert label == "FP8 delayed scaling on every block Linear, BF16 output layer, FP32 master and moments"


def test_a_backend_without_delayed_scaling_reads_current_scaling_and_the_label_says_why():
    policy, label = standard_policy({}, _every("no delayed scaling in torchao", DELAYED), None, MemoryKnobs(), "fp32")
    assert policy.precision_for("decoder.layers.0.mlp.linear_fc1", 2) == CURRENT
    assert label.startswith("FP8 current scaling on every block Linear (this backend cannot run FP8 delayed scaling "
                            "here: no delayed scaling in torchao)")
    assert label.endswith("BF16 output layer, FP32 weights and moments")  # FP32 parameters: no master copy
    assert standard_policy({}, _every("none", DELAYED, CURRENT), None, MemoryKnobs(), "fp32") is None


def test_the_probe_process_reads_the_fallback_and_carries_its_label(monkeypatch):
    """Through the probe process's host (as a study asks it): no probe of its own, the reading at the space's states,
    and the label of what it ran, here with delayed scaling taken away from the emulated backend."""
    space = parse_space(tiny_space_dict(**{"objectives.reading": "damage", "objectives.damage.states": [1.0],
                                           "objectives.damage.batches": 3}))
    host = ProbeHost(space)
    table = host.backend.supported_precisions(host.device)
    monkeypatch.setattr(host.backend, "supported_precisions",
                        lambda device: table | {DELAYED: "taken away by this test"})
    result = host.read_standard(1.0)
    assert result.losses == [] and math.isfinite(result.damage["value"]) and result.damage["value"] > 0
    assert [s["step"] for s in result.damage["states"]] == space.objectives.damage.state_steps(space.probe.steps)
    assert result.damage["recipe"].startswith("FP8 current scaling on every block Linear (this backend cannot run "
                                              "FP8 delayed scaling here: taken away by this test)")
