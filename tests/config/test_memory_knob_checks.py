"""Space files: the new memory knobs are searchable, validated against the backend, and the standard baseline.

What would be wrong if these failed: a space could not search FP8 moments or FP8 attention, a knob the
backend cannot apply would reach a trial, or the default baseline would break the CPU spaces.
"""

from __future__ import annotations

import optuna
import pytest

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.config.loader import parse_space
from precsearch.policy import MemoryKnobs
from precsearch.search.sampling import suggest_policy


def _validate(tmp_path, capsys, **overrides) -> tuple[int, str]:
    code = main(["validate", str(write_space(tmp_path, tiny_space_dict(**overrides)))])
    return code, capsys.readouterr().err


def test_the_default_baseline_is_the_standard_set_up_resolved_for_the_probe():
    space = parse_space(tiny_space_dict())
    assert (space.objectives.baseline_memory.master_weights, space.objectives.baseline_memory.moment_dtype) == (
        True, "fp32")
    assert space.baseline_knobs().is_default  # FP32 parameters: plain AdamW is the standard set-up
    bf16 = parse_space(tiny_space_dict(**{"probe.param_dtype": "bf16"}))
    assert bf16.baseline_knobs() == MemoryKnobs(master_weights=True, moment_dtype="fp32")


def test_the_cpu_smoke_space_still_validates(tmp_path, capsys):
    code, err = _validate(tmp_path, capsys)
    assert code == 0, err


@pytest.mark.parametrize("field, value, named", [
    ("moment_dtype", {"choices": ["fp32", "fp8_block"]}, "search.memory.moment_dtype"),
    ("exp_avg_sq_dtype", "fp32", "search.memory.exp_avg_sq_dtype"),  # fp8_block alone: a mixed pair, unsoaked
    ("fp8_attention", {"choices": ["off", "dpa"]}, "search.memory.fp8_attention"),
])
def test_a_knob_the_cpu_backend_cannot_apply_is_refused_naming_the_field(tmp_path, capsys, field, value, named):
    code, err = _validate(tmp_path, capsys, **{f"search.memory.{field}": value})
    assert code == 2 and named in err and "backend 'te'" in err, err
    assert err.count(f"{field}=") == 1, err  # the knob is named once, not "knob=v: knob=v: ..."


def test_fp16_master_with_fp32_parameters_is_refused(tmp_path, capsys):
    code, err = _validate(tmp_path, capsys, **{"search.memory.master_dtype": "remainders"})
    assert code == 2 and "search.memory.master_dtype" in err and "param_dtype" in err, err


def test_the_cpu_backend_refuses_the_standard_baseline_with_bf16_parameters(tmp_path, capsys):
    # master weights (remainders, with the BF16 moments) in the trials too: without them, or with a whole FP32
    # master beside BF16 moments, the soak check refuses first (test_soak_checks.py)
    code, err = _validate(tmp_path, capsys, **{"probe.param_dtype": "bf16", "search.memory.master_weights": True,
                                               "search.memory.master_dtype": "remainders"})
    assert code == 2 and "objectives.baseline_memory" in err and "moment_dtype: param" in err, err


def test_every_memory_knob_is_sampled_and_named_as_an_mlflow_param():
    space = parse_space(tiny_space_dict(**{
        "search.memory.moment_dtype": {"choices": ["bf16", "fp8"]},
        "search.memory.exp_avg_dtype": {"choices": ["fp8", None]},
        "search.memory.master_dtype": {"choices": ["fp32", "fp16", "remainders"]},
        "search.memory.fp8_attention": {"choices": ["off", "dpa"]}}))
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    memory = suggest_policy(space, trial).memory
    named = {k: v for k, v in trial.params.items() if k.startswith("memory.")}
    assert set(named) == {"memory.moment_dtype", "memory.exp_avg_dtype", "memory.master_dtype",
                          "memory.fp8_attention"}
    assert all(getattr(memory, k.split(".")[1]) == v for k, v in named.items())
