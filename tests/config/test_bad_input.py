"""Every user error exits with status 2 and one message naming file, field and what is valid.

These go through the real CLI entry point (in-process) so they also check that
no traceback reaches the user.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.precision import Precision


def _run(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    return code, err


def _assert_user_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"


def test_yaml_syntax_error_names_file_and_line(tmp_path, capsys):
    path = write_space(tmp_path, "model:\n  preset: tiny\n   bad: [\n")
    _assert_user_error(*_run(capsys, "validate", path), str(path), "YAML syntax error", "line")


def test_unknown_key_lists_valid_keys(tmp_path, capsys):
    data = tiny_space_dict()
    data["probe"]["stepz"] = 3
    path = write_space(tmp_path, data)
    _assert_user_error(*_run(capsys, "validate", path), "probe.stepz", "unknown key", "steps")


def test_wrong_type_names_field(tmp_path, capsys):
    path = write_space(tmp_path, tiny_space_dict(**{"probe.steps": "many"}))
    _assert_user_error(*_run(capsys, "validate", path), "probe.steps", "integer")


def test_empty_choice_list(tmp_path, capsys):
    data = tiny_space_dict()
    data["search"]["groups"][0]["precision"] = {"choices": []}
    path = write_space(tmp_path, data)
    _assert_user_error(*_run(capsys, "validate", path), "search.groups[0].precision", "non-empty")


def test_unknown_precision_lists_valid(tmp_path, capsys):
    data = tiny_space_dict()
    data["search"]["groups"][0]["precision"] = "fp7"
    path = write_space(tmp_path, data)
    _assert_user_error(*_run(capsys, "validate", path), "search.groups[0].precision", "fp8_current")


def test_warmup_longer_than_probe(tmp_path, capsys):
    path = write_space(tmp_path, tiny_space_dict(**{"search.warmup_steps": {"choices": [0, 50]}}))
    _assert_user_error(*_run(capsys, "validate", path), "search.warmup_steps", "probe.steps")


def test_group_matching_no_layer(tmp_path, capsys):
    data = tiny_space_dict()
    data["search"]["groups"][1]["modules"] = ["*.feed_forward.*"]
    path = write_space(tmp_path, data)
    _assert_user_error(*_run(capsys, "validate", path), "search.groups[1].modules", "matches no Linear",
                       "model.layers.0.self_attn.q_proj")


def test_precision_backend_cannot_run(tmp_path, capsys, monkeypatch, unsoaked_nvfp4):
    """A backend's refusal (here a made-up one for nvfp4) must come back naming the group's field."""
    # what the emulated backend runs (its built object's answers too) is EmulatedSupport's: validate asks it
    from precsearch.backends.support import EmulatedSupport

    monkeypatch.setattr(EmulatedSupport, "supported_precisions",
                        lambda self, device: {p: ("refused for the test" if p.value == "nvfp4" else None)
                                              for p in Precision})
    data = tiny_space_dict()
    data["search"]["groups"][1]["precision"] = {"choices": ["bf16", "nvfp4"]}
    data["search"]["allow_unsoaked"] = True  # with unsoaked_nvfp4: else the soak check refuses NVFP4 first
    path = write_space(tmp_path, data)
    _assert_user_error(*_run(capsys, "validate", path), "search.groups[1].precision", "nvfp4", "Valid here")


def test_blackwell_recipes_validate_emulated_with_a_note(tmp_path, capsys, unsoaked_nvfp4):
    """NVFP4 and MXFP8 must validate on a CPU (emulated), saying their speed and memory are not a B200's (NVFP4,
    which the soak refuses, taken as unsoaked: the note is the backend's, whatever the soak says)."""
    data = tiny_space_dict()
    data["search"]["groups"][1]["precision"] = {"choices": ["bf16", "nvfp4", "mxfp8"]}
    data["search"]["allow_unsoaked"] = True  # NVFP4 unsoaked here (tests/config/test_soak_checks.py)
    code, err = _run(capsys, "validate", write_space(tmp_path, data))
    assert code == 0, err
    assert "mxfp8 and nvfp4 run emulated" in err and "not a B200's" in err


def test_gpu_backend_not_available_here(tmp_path, capsys):
    path = write_space(tmp_path, tiny_space_dict(backend="te"))
    _assert_user_error(*_run(capsys, "run", path, "--output-dir", tmp_path / "out"), "backend", "te")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a GPU space on a machine without a GPU")
def test_validate_checks_a_gpu_space_on_a_cpu_and_lists_what_needs_the_gpu(tmp_path, capsys):
    """``validate`` refused every H100/H200 space on a CPU ("no CUDA GPU"), so a user could not check one
    before renting the GPU: it checks the file, fields and data, and names the checks the GPU must run."""
    space = Path(__file__).resolve().parents[2] / "search_spaces" / "llama3_70b_h200x2.yaml"
    assert main(["validate", str(space)]) == 0
    out = capsys.readouterr().out
    assert "valid on this machine (file, fields, checkpoint and data)" in out
    assert "Not checked here, no CUDA GPU on this machine" in out
    assert "- backend te: it runs bf16, fp8_block, fp8_current, fp8_delayed on that GPU" in out
    assert "- probe.nproc 2: that many GPUs are visible" in out
    data = yaml.safe_load(space.read_text())
    data["probe"]["steps"] = 2  # a field error is still found on the CPU
    _assert_user_error(*_run(capsys, "validate", write_space(tmp_path, data)), "probe.lr_warmup_steps")
    data = tiny_space_dict(backend="te", data={"source": "tokens", "path": "nope.npy"})
    _assert_user_error(*_run(capsys, "validate", write_space(tmp_path, data)), "data.path", "nope.npy")


def test_missing_data_file(tmp_path, capsys):
    path = write_space(tmp_path, tiny_space_dict(data={"source": "tokens", "path": "nope.npy"}))
    _assert_user_error(*_run(capsys, "validate", path), "data.path", "nope.npy")


def test_missing_space_file(tmp_path, capsys):
    _assert_user_error(*_run(capsys, "validate", tmp_path / "absent.yaml"), "absent.yaml", "not found")


def test_unreachable_storage(tmp_path, capsys):
    path = write_space(tmp_path, tiny_space_dict(**{"study.storage": "sqlite:////nonexistent-dir/x/optuna.db"}))
    code, err = _run(capsys, "run", path, "--output-dir", tmp_path / "out", "--no-progress")
    _assert_user_error(code, err, "study.storage", "nonexistent-dir")


def test_unreachable_tracking_uri(tmp_path, capsys):
    path = write_space(tmp_path, tiny_space_dict(tracking={"uri": "http://127.0.0.1:9"}))
    code, err = _run(capsys, "run", path, "--output-dir", tmp_path / "out", "--no-progress")
    _assert_user_error(code, err, "tracking.uri", "127.0.0.1:9")


@pytest.mark.parametrize("command", ["front", "export --trial 0", "ui"])
def test_commands_on_a_directory_without_a_study(tmp_path, capsys, command):
    code, err = _run(capsys, *command.split(), "--output-dir", tmp_path)
    _assert_user_error(code, err, "precsearch.json", "--output-dir")


def test_memory_knobs_need_the_te_backend(tmp_path, capsys):
    data = tiny_space_dict()
    data["search"]["memory"] = {"moment_dtype": {"choices": ["fp32", "bf16"]}}  # both passed the soak
    path = write_space(tmp_path, data)
    _assert_user_error(*_run(capsys, "validate", path), "search.memory.moment_dtype", "backend 'te'")


def test_group_splitting_a_fused_unit_names_the_unit_and_the_group(tmp_path, capsys):
    """q/k/v are one GEMM on the training stack: a group of q alone cannot get its own precision."""
    data = tiny_space_dict()
    data["search"]["groups"] = [{"name": "q_only", "modules": ["*.q_proj"], "precision": {"choices": ["bf16", "fp8_current"]}}]
    path = write_space(tmp_path, data)
    _assert_user_error(*_run(capsys, "validate", path), "search.groups[0].modules", "linear_qkv", "q_proj in q_only",
                       "k_proj in search.default_precision")


def test_groups_may_name_units_by_either_scheme(tmp_path, capsys):
    data = tiny_space_dict()
    data["search"]["groups"] = [
        {"name": "hf", "modules": ["*.self_attn.*"], "precision": {"choices": ["bf16", "fp8_current"]}},
        {"name": "megatron", "modules": ["*.mlp.linear_fc1", "*.mlp.linear_fc2"], "precision": "fp8_delayed"},
    ]
    code, err = _run(capsys, "validate", write_space(tmp_path, data))
    assert code == 0, err


def test_a_library_message_over_several_lines_stays_one_line(tmp_path, capsys):
    """A directory as the tokenizer: transformers' error spans four lines, which split the refusal (issue 34)."""
    pytest.importorskip("transformers")
    (tmp_path / "tok").mkdir()
    (tmp_path / "a.txt").write_text("some text\n" * 100)
    path = write_space(tmp_path, tiny_space_dict(data={"source": "text", "path": "a.txt", "tokenizer": "tok"}))
    _assert_user_error(*_run(capsys, "validate", path), "data.tokenizer", "cannot use tokenizer")


def test_every_problem_is_a_line_naming_file_field_bad_value_and_the_closest_choice(tmp_path, capsys):
    """A file with two mistakes said ``Input should be 'bf16', 'fp8_delayed', ... (and 1 more problem)``: neither
    the value written nor the other problem. Each problem must be a line of its own naming the file, the field,
    the bad value, the valid choices and the closest one."""
    data = tiny_space_dict(**{"probe.steps": -3})
    data["search"]["groups"][0]["precision"] = {"choices": ["bf16", "fp8_delayd"]}
    path = write_space(tmp_path, data)
    code, err = _run(capsys, "validate", path)
    assert code == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 2, err
    steps = next(line for line in lines if "probe.steps" in line)
    choice = next(line for line in lines if "search.groups[0].precision" in line)
    assert str(path) in steps and "-3" in steps and "> 0" in steps, steps
    assert str(path) in choice and "'fp8_delayd'" in choice and "did you mean 'fp8_delayed'?" in choice, choice
    assert "valid: bf16, fp8_delayed, fp8_current, fp8_block" in choice, choice
    assert "more problem" not in err


def test_a_misspelt_key_is_named_with_the_key_meant_and_only_once(tmp_path, capsys):
    """``stepz`` is an unknown key and leaves ``steps`` missing: one problem (the misspelling), with the key meant."""
    data = tiny_space_dict()
    data["probe"]["stepz"] = data["probe"].pop("steps", 12)
    path = write_space(tmp_path, data)
    _assert_user_error(*_run(capsys, "validate", path), "probe.stepz", "unknown key 'stepz'",
                       "did you mean 'steps'?")


def test_a_value_near_no_choice_lists_the_choices_without_a_guess(tmp_path, capsys):
    path = write_space(tmp_path, tiny_space_dict(**{"backend": "xyzzy"}))
    code, err = _run(capsys, "validate", path)
    _assert_user_error(code, err, "backend", "'xyzzy'", "valid: auto, emulated, te, torchao")
    assert "did you mean" not in err
