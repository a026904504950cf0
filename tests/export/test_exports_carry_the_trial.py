"""Exports that carry the trial (issue 52, item 2).

The torchtitan export of the quickstart's pick kept 21 of its 29 FP8 layers in BF16 under a header still
quoting the trial's ``memory_saved=0.05216``; a Megatron export of ``fp8_block`` moments with remainders
warned of 2 + 1 + 1 bytes per parameter more without saying what that came to. Here the export prints,
before it writes, what the framework runs differently (per module, per knob) and the memory it costs, and
the files' headers state the figures of what is written, the trial's labelled as the trial's.
"""

from __future__ import annotations

import math
import re

import pytest

from _spaces import tiny_space_dict
from _studies import one_trial_study
from precsearch.cli import main
from precsearch.config.loader import parse_space
from precsearch.config.space import ModelSection
from precsearch.export import policy_export
from precsearch.policy import MemoryKnobs, Policy, Rule
from precsearch.precision import Precision
from precsearch.probe.memory.peak import MASTER_BYTES, STATE_BYTES, predict_peak
from precsearch.runtime.study_export import export

TRIAL_SAVED = 0.05216  # the trial's recorded memory_saved, as the quickstart's pick had it
QKV_DELAYED = Rule("qkv", ("*.self_attention.linear_qkv",), Precision.FP8_DELAYED)
MLP_CURRENT = Rule("mlp", ("*.mlp.*",), Precision.FP8_CURRENT)
ATTN_CURRENT = Rule("attn", ("*.self_attention.*",), Precision.FP8_CURRENT)
#: fp8_block moments with 16-bit remainders, the 8B study's max-memory pick
BLOCK_STATE = MemoryKnobs(master_weights=True, moment_dtype="fp8_block", master_dtype="remainders")
#: a small model of its own width, with BF16 parameters (where master weights count)
SMALL = {"model.dim": 512, "model.ffn_dim": 2048, "model.n_heads": 8, "model.n_kv_heads": 4,
         "probe.param_dtype": "bf16"}


def _study(tmp_path, monkeypatch, policy: Policy, **overrides):
    """A finished study of one trial of ``policy`` on disk, as ``precsearch run`` leaves it."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    space = parse_space(tiny_space_dict(**overrides))
    score = {"memory_saved": TRIAL_SAVED, "instability": 0.0, "loss_gap": -0.001, "tokens_per_s": 100.0,
             "feasible": True, "stable": True, "diverged": False}
    study, ws = one_trial_study(tmp_path, space, policy.to_dict(), score, [TRIAL_SAVED, 0.0])
    return study, ws, space


def _predicted(space, precisions: dict, memory: MemoryKnobs) -> int:
    """The memory model's peak at the study's target model, computed here from the space."""
    cfg = ModelSection(**space.model.model_dump()).target()
    p = space.probe
    return predict_peak(cfg, precisions, seq_len=p.seq_len, micro_batch=p.micro_batch, param_dtype=p.param_dtype,
                        memory=memory, grad_accum=p.grad_accum).total


def _export_printing_before_write(monkeypatch, capsys, argv: list[str]) -> tuple[str, str]:
    """Run ``precsearch export``; return what it had printed to stderr when it wrote, and all it printed."""
    seen = {}
    real = policy_export.write_export

    def spy(files, output):
        seen["before"] = capsys.readouterr().err
        return real(files, output)

    monkeypatch.setattr(policy_export, "write_export", spy)
    assert main(argv) == 0
    return seen["before"], seen["before"] + capsys.readouterr().err


def test_torchtitan_names_the_layers_kept_bf16_and_its_header_states_the_written_memory(tmp_path, monkeypatch,
                                                                                         capsys):
    """torchtitan has no delayed scaling: q/k/v run BF16, so the written policy saves less than the
    trial; a header quoting the trial's memory_saved would promise memory the run does not save."""
    study, ws, space = _study(tmp_path, monkeypatch, Policy(rules=(QKV_DELAYED, MLP_CURRENT)))
    out = tmp_path / "tt"
    before, _ = _export_printing_before_write(monkeypatch, capsys, [
        "export", "--output-dir", str(tmp_path), "--trial", "0", "--format", "torchtitan", "-o", f"{out}/"])
    assert "2 module(s) fp8_delayed -> bf16: self_attention.linear_qkv in blocks 0-1" in before
    assert "what it costs:" in before and "speed not predicted" in before
    text = (out / "torchtitan_float8.toml").read_text()
    written = float(re.search(r"# as written: memory_saved=([-0-9.e]+)", text).group(1))
    mlp = {f"decoder.layers.{i}.mlp.{u}": Precision.FP8_CURRENT for i in range(2) for u in ("linear_fc1", "linear_fc2")}
    baseline = _predicted(space, {}, space.baseline_knobs())
    assert written == pytest.approx(1 - _predicted(space, mlp, MemoryKnobs()) / baseline, rel=1e-5)
    trial = _predicted(space, mlp | {f"decoder.layers.{i}.self_attention.linear_qkv": Precision.FP8_DELAYED
                                     for i in range(2)}, MemoryKnobs())
    assert written < 1 - trial / baseline  # the BF16 q/k/v input costs memory the trial saved
    assert written != pytest.approx(TRIAL_SAVED)
    # the trial's own figure stays, labelled as the trial's
    assert f"# trial's probe objectives (the policy as searched, not as written): memory_saved={TRIAL_SAVED}" in text


def test_megatron_reports_the_extra_gib_of_whole_fp32_masters_and_bf16_moments(tmp_path, monkeypatch, capsys):
    """Under --fp8-recipe tensorwise Megatron keeps whole FP32 main parameters (no remainders: 2 B/param more)
    and writes fp8_block moments as BF16 (about 1 B/param more each): the export must say what that costs."""
    policy = Policy(rules=(ATTN_CURRENT, MLP_CURRENT), memory=BLOCK_STATE)
    study, ws, space = _study(tmp_path, monkeypatch, policy, **SMALL)
    result = export(study, ws, trial=0, fmt="megatron")
    cfg = ModelSection(**space.model.model_dump()).target()
    n = cfg.num_params()
    # the rule, independently of the exporter: whole FP32 masters against remainders, BF16 against fp8_block
    extra = int(n * (2 * STATE_BYTES["bf16"] + MASTER_BYTES["fp32"])) - int(
        n * (2 * STATE_BYTES["fp8_block"] + MASTER_BYTES["remainders"]))
    assert result.cost.written_bytes - result.cost.trial_bytes == extra
    assert extra == pytest.approx(4 * n, rel=0.02)  # "2 bytes/param + 1 byte/param per moment"
    assert "master weights: remainders -> fp32" in result.cost.changes
    assert "first moment: fp8_block -> bf16" in result.cost.changes
    assert "second moment: fp8_block -> bf16" in result.cost.changes
    before, _ = _export_printing_before_write(monkeypatch, capsys, [
        "export", "--output-dir", str(tmp_path), "--trial", "0", "--format", "megatron", "-o", f"{tmp_path}/m/"])
    said = float(re.search(r"what it costs: \+([0-9.e-]+) GiB", before).group(1))
    assert said == pytest.approx(extra / 2 ** 30, rel=0.01)
    args = (tmp_path / "m" / "megatron_args.sh").read_text()
    written = float(re.search(r"# as written: memory_saved=([-0-9.e]+)", args).group(1))
    baseline = _predicted(space, {}, space.baseline_knobs())  # FP32 masters and moments: the standard set-up
    assert written == pytest.approx(1 - result.cost.written_bytes / baseline, rel=1e-5)


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan", "accelerate"])
def test_a_policy_every_framework_runs_as_is_says_nothing_changes(tmp_path, monkeypatch, capsys, fmt):
    """fp8_current blocks with a BF16 head and no knobs: every framework expresses it whole, so the export
    must not claim a change (nor a cost), and the header keeps the trial's objectives unlabelled."""
    _study(tmp_path, monkeypatch, Policy(rules=(ATTN_CURRENT, MLP_CURRENT)))
    before, _ = _export_printing_before_write(monkeypatch, capsys, [
        "export", "--output-dir", str(tmp_path), "--trial", "0", "--format", fmt, "-o", f"{tmp_path}/out/"])
    assert f"nothing changes: {fmt} runs trial 0's policy as searched" in before
    assert "what it costs" not in before
    text = "".join(p.read_text() for p in (tmp_path / "out").iterdir())
    assert "# the framework runs the trial's policy as searched: nothing changes" in text
    assert "as written:" not in text and f"# probe objectives: memory_saved={TRIAL_SAVED}" in text


def test_the_policy_format_prints_no_change_report(tmp_path, monkeypatch, capsys):
    """policy.yaml is the trial itself: no report, and its provenance carries no as-written figures."""
    _study(tmp_path, monkeypatch, Policy(rules=(QKV_DELAYED,)))
    before, _ = _export_printing_before_write(monkeypatch, capsys, [
        "export", "--output-dir", str(tmp_path), "--trial", "0", "-o", str(tmp_path / "p.yaml")])
    assert "nothing changes" not in before and "what it costs" not in before
    assert "as_written" not in (tmp_path / "p.yaml").read_text()


def test_megatron_reads_back_the_head_and_the_blocks_a_pipeline_cannot_serve():
    """What Megatron runs is read from the written flags and matchers: an FP8 head without --fp8-output-proj
    runs BF16, and blocks sharing a local number under a pipeline run the precision the warning names."""
    from precsearch.export.as_run import as_searched, describe_changes
    from precsearch.export.registry import as_run

    head = Policy(rules=(ATTN_CURRENT, MLP_CURRENT, Rule("head", ("output_layer",), Precision.FP8_CURRENT)))
    assert describe_changes(as_searched(head, 4), as_run("megatron", head, 4), "fp32") == [
        "1 module(s) fp8_current -> bf16: output_layer"]
    # blocks 0 and 2 share local number 0 with 2 chunks of 2; block 2's fc2 alone differs, so it loses
    odd = Policy(rules=(Rule("fc2", ("*.mlp.linear_fc2",), Precision.FP8_BLOCK, indices=(2,)), MLP_CURRENT))
    changes = describe_changes(as_searched(odd, 4), as_run("megatron", odd, 4, pipeline=2), "fp32")
    assert changes == ["1 module(s) fp8_block -> fp8_current: mlp.linear_fc2 in blocks 2"]
    assert describe_changes(as_searched(odd, 4), as_run("megatron", odd, 4), "fp32") == []


def test_the_header_states_the_targets_predicted_speed_up_where_the_study_scored_one():
    """A Megatron study scores Megatron's speed-up, predicted (precsearch.runtime.target_speed); its export's header
    says so, labelled as the trial's when what is written differs; a study without one says nothing of it."""
    from precsearch.export.format_output import header
    from precsearch.runtime.study_export import _target_speed

    score = {"speedup_framework": 1.18, "speedup_probe": 1.06, "memory_framework": "megatron"}
    provenance = {"study": "s", "trial": 1, **_target_speed(score)}
    line = ("# speed-up in megatron: 1.18x over its standard BF16 run, predicted (the probe's step with megatron's "
            "measured optimizer step; the probe: 1.06x)")
    assert line in header(provenance, "Megatron-Core flags")
    changed = header(provenance | {"as_written": {"changed": True, "n_layers": 2, "memory_saved": 0.1, "peak_gib": 1.0,
                                                  "baseline_peak_gib": 2.0, "trial_memory_saved_predicted": 0.2,
                                                  "trial_peak_gib": 0.9, "speed": "not predicted"}}, "flags")
    assert line.replace("# speed-up", "# the trial's speed-up") in changed
    assert _target_speed({"speedup_framework": math.nan, "speedup_probe": 1.06}) == {}
    assert not [x for x in header({"study": "s", "trial": 1}, "flags") if "speed-up" in x]
