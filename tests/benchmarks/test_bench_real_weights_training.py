"""benchmarks/bench_real_weights.py --stages verdicts finetune --smoke on a tiny GGUF (tests/_gguf.py): each policy's
fixed-state reading with its band and top units, the reading's peak memory against its target, and each policy's
fine-tuned held-out gap against BF16 with the BF16 seeds' noise, on the checkpoint and on the random init."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_real_weights as bench  # noqa: E402
from _gguf import hf_state, write_llama_gguf  # noqa: E402

pytest.importorskip("gguf")
POLICIES = ["a_all_current", "d_head_current"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("rw")
    gguf = tmp / "tiny.gguf"
    state = hf_state(seed=1)
    state["model.norm.weight"][5] = 1000.0  # a massive activation at the output layer's input
    write_llama_gguf(gguf, state)
    out = tmp / "rw.json"
    argv = ["--gguf", str(gguf), "--smoke", "--stages", "verdicts", "finetune", "--policies", *POLICIES,
            "--json", str(out), "--save-tokens", str(tmp / "tokens.pt")]
    assert bench.main(argv) == 0
    return json.loads(out.read_text()), tmp


def test_every_policy_is_read_with_a_band_and_top_units_beside_their_inputs_amax(run):
    """BF16 reads exactly 0 (the reading is deterministic at a state) and is stable; every FP8 policy reads more;
    each row has the band of the space's limit and its units ranked by the measure, each with its GEMM input's
    amax / RMS from the same weights."""
    result, _ = run
    for init in ("real", "random"):
        verdicts = result["inits"][init]["verdicts"]
        assert verdicts["measure"] == "update_norm" and verdicts["limit"] == 0.002
        assert list(verdicts["rows"]) == ["bf16", *POLICIES]
        bf16 = verdicts["rows"]["bf16"]
        assert bf16["value"] == 0 and bf16["band"] == "stable"
        for name in POLICIES:
            row = verdicts["rows"][name]
            assert row["value"] > 0 and row["band"] in ("stable", "near the limit", "unstable")
            values = [u["value"] for u in row["top_units"]]
            assert values == sorted(values, reverse=True) and len(values) == 9  # 2 blocks x 4 units + the head
            inputs = result["inits"][init]["inputs"]
            assert all(u["input_amax_over_rms"] == inputs[u["unit"]]["amax_over_rms"] for u in row["top_units"])
        mem = verdicts["memory"]
        assert mem["peak_bytes"] > 0 and mem["target_bytes"] == 3 * mem["model_bf16_bytes"] + mem["batch_bytes"]
    # the planted outlier feeds the head: the seed's policy (head in FP8) reads more on the checkpoint, the head
    # itself several times more (which unit ranks first among the checkpoint's moved with the library versions:
    # a block's QKV above the head with transformers 5.25, numpy 2.4, on 2026-12-07)
    real, rand = (result["inits"][i]["verdicts"]["rows"]["a_all_current"] for i in ("real", "random"))
    assert real["value"] > rand["value"]
    head = {init: next(u["value"] for u in row["top_units"] if u["unit"] == "output_layer")
            for init, row in (("real", real), ("random", rand))}
    assert head["real"] > 3 * head["random"]


def test_fine_tuned_gaps_are_against_bf16_seed_0_with_the_bf16_seeds_noise(run):
    """BF16's gap to itself is 0; the noise floor is the BF16 seeds' stdev / mean (positive: a seed draws other
    training windows); each gap is the policy's held-out loss against BF16 seed 0, in % and in spreads."""
    result, _ = run
    for init in ("real", "random"):
        ft = result["inits"][init]["finetune"]
        assert ft["steps"] == 3 and ft["seeds"] == 2 and len(ft["bf16_eval_losses"]) == 2
        losses = ft["bf16_eval_losses"]
        mean = sum(losses) / 2
        assert ft["noise_floor"] > 0
        assert ft["noise_floor"] == pytest.approx(abs(losses[0] - losses[1]) / math.sqrt(2) / mean)
        assert ft["rows"]["bf16"]["gap_pct"] == 0 and ft["rows"]["bf16"]["beyond_noise"] is False
        for name in POLICIES:
            row = ft["rows"][name]
            assert row["gap_pct"] == pytest.approx(100 * (row["eval_loss"] / losses[0] - 1))
            assert row["gap_spreads"] == pytest.approx(row["gap_pct"] / 100 / ft["noise_floor"])
            assert row["beyond_noise"] == (abs(row["gap_spreads"]) > ft["noise_k"])
    summary = {(r["init"], r["policy"]): r for r in result["summary"]}
    assert set(summary) == {(i, n) for i in ("real", "random") for n in ["bf16", *POLICIES]}
    for (init, name), r in summary.items():  # the log's side-by-side table: the reading beside the gap
        assert r["reading"] == result["inits"][init]["verdicts"]["rows"][name]["value"]
        assert r["gap_pct"] == result["inits"][init]["finetune"]["rows"][name]["gap_pct"]
    flagged = {(r["init"], r["policy"]) for r in result["stable_beyond_noise"]}
    expected = {(i, n) for i in ("real", "random") for n in POLICIES
                if result["inits"][i]["verdicts"]["rows"][n]["band"] == "stable"
                and result["inits"][i]["finetune"]["rows"][n]["beyond_noise"]
                and result["inits"][i]["finetune"]["rows"][n]["gap_pct"] > 0}
    assert flagged == expected


def test_saved_tokens_give_the_same_held_out_batches(run):
    """--tokens (what the GPU script carries instead of a tokenizer and this Python's stdlib) cuts the same
    held-out set as the text it was saved from."""
    _, tmp = run
    from_text = bench.held_out(bench.parse_args(["--smoke"]))
    from_ids = bench.held_out(bench.parse_args(["--smoke", "--tokens", str(tmp / "tokens.pt")]))
    for (a, b), (c, d) in zip(from_text.eval_set(), from_ids.eval_set(), strict=True):
        assert a.equal(c) and b.equal(d)


def test_a_budget_stops_new_rows_and_names_them(tmp_path, run):
    """Past --budget-s no row starts: the JSON names every row not started."""
    _, tmp = run
    out = tmp_path / "rw.json"
    assert bench.main(["--gguf", str(tmp / "tiny.gguf"), "--smoke", "--stages", "verdicts", "finetune",
                       "--policies", "d_head_current", "--budget-s", "0", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["meta"]["not_started"][0] == "verdicts/real/bf16"
    assert len(result["meta"]["not_started"]) == 2 * 2 + 2 * 1  # 2 inits x (2 readings + 1 BF16 seed: then stop)
    assert result["inits"]["real"]["verdicts"]["rows"] == {}


def test_gpu_script_assembles_the_gguf_from_parts_carried_one_call_at_a_time(tmp_path, run):
    """benchmarks/gpu/gpu_real_weights.sh on the device: each call stashes the part it carries; calls before the last
    stop with 0 and name the parts still to carry; the call that completes the set checks the sha256 and runs
    the bench on the whole file (here LOCAL=1: on this CPU, with this venv)."""
    import hashlib
    import os
    import shutil
    import subprocess

    result, tmp = run
    if shutil.which("split") is None:
        pytest.skip("no coreutils")
    repo = Path(__file__).resolve().parents[2]
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("benchmarks", "precsearch", "search_spaces"):
        (tree / name).symlink_to(repo / name)
    gguf = (tmp / "tiny.gguf").read_bytes()
    cut = [0, len(gguf) // 3, 2 * len(gguf) // 3, len(gguf)]
    manifest = f"3 {hashlib.sha256(gguf).hexdigest()}\n"
    stash = tmp_path / "stash"
    env = os.environ | {"LOCAL": "1", "OUT": str(tmp_path / "out"), "STAGES": "change", "RW_STASH": str(stash),
                        "RW_GGUF_DIR": str(tmp_path / "gguf"), "OMP_NUM_THREADS": "1", "PYTHON": sys.executable,
                        "EXTRA": "--smoke --policies d_head_current --split"}
    for i in range(3):
        carried = tree / ".rw_carry"
        shutil.rmtree(carried, ignore_errors=True)
        part = carried / f"smollm2_{i + 1}"
        part.mkdir(parents=True)
        (part / f"gguf.part.{i}").write_bytes(gguf[cut[i]:cut[i + 1]])
        (part / "manifest").write_text(manifest)
        if i == 2:
            shutil.copy(tmp / "tokens.pt", part / "tokens.pt")
            (part / "site.tar.xz").write_bytes(b"")  # LOCAL=1 does not unpack it
        done = subprocess.run(["bash", str(tree / "benchmarks" / "gpu" / "gpu_real_weights.sh")], env=env, cwd=tree,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        if i < 2:
            assert f"have {i + 1} of 3 GGUF parts" in done.stdout
    assert (tmp_path / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf").read_bytes() == gguf
    out = json.loads((tmp_path / "out" / "real_weights.json").read_text())
    assert out["meta"]["tokens"] == 30_000 and "d_head_current/both/-" in out["inits"]["real"]["rows"]


def test_top_units_are_none_for_a_whole_model_measure_and_ranked_for_a_per_unit_one():
    # forward is a loss change of the whole model: the units carry the other figures, not it (a KeyError before)
    units = {"a": {"update_norm": (0.1, 0.01)}, "b": {"update_norm": (0.3, 0.02)}}
    state = {"step": 5, "units": units}
    assert bench.top_units({"measure": "forward", "state_step": 5, "states": [state]}, 3, None) == []
    ranked = bench.top_units({"measure": "update_norm", "state_step": 5, "states": [state]}, 3, {"b": {"amax_over_rms": 9.0}})
    assert [u["unit"] for u in ranked] == ["b", "a"] and ranked[0]["input_amax_over_rms"] == 9.0
