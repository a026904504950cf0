"""benchmarks/bench_probe.py: the BEFORE and AFTER studies of ``--compare`` differ only where they should."""

import importlib.util
import sys
from pathlib import Path

import torch

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_probe.py"
_spec = importlib.util.spec_from_file_location("bench_probe", _PATH)
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_probe"] = bench
_spec.loader.exec_module(bench)


def test_before_records_inline_and_after_runs_the_defaults(monkeypatch):
    """An AFTER that inherited PRECSEARCH_SYNC_RECORD (or a BEFORE without it) would compare a path with itself."""
    monkeypatch.setenv("PRECSEARCH_SYNC_RECORD", "1")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    after = bench.variant_env("after", torch.device("cpu"))
    before = bench.variant_env("before", torch.device("cpu"))
    assert "PRECSEARCH_SYNC_RECORD" not in after and "PRECSEARCH_CPU_THREADS" not in after
    assert before["PRECSEARCH_SYNC_RECORD"] == "1"
    assert before["PRECSEARCH_CPU_THREADS"] == str(len(__import__("os").sched_getaffinity(0)))  # torch's default
    assert "PRECSEARCH_CPU_THREADS" not in bench.variant_env("before", torch.device("cuda"))


def test_the_fixed_state_reading_is_its_own_component_not_logging():
    """A study read by ``damage`` spends GPU time in each trial's reading; counted as "logging + other" it would
    look like overhead to hide. Its BF16 side (the first reading's extra seconds) is a per-process cost."""
    def run(start, end, damage=None, dup="-"):
        return {"start": start, "end": end, "duplicate_of": dup,
                "probe_result": {"phase_s": {"build": 1.0, "warmup_steps": 0.5, "fp8_steps": 2.0, "eval": 0.5},
                                 "damage": damage}}
    runs = [run(10.0, 30.0, {"seconds": 14.0, "seconds_by_part": {"side": 1.0, "compare": 2.0}}),
            run(30.0, 40.0, {"seconds": 3.0, "seconds_by_part": {"side": 1.0, "compare": 2.0}}),
            run(40.0, 41.0, {"seconds": 3.0, "seconds_by_part": {"side": 1.0, "compare": 2.0}}, dup="1")]
    totals = bench.breakdown(0.0, 42.0, runs, 2.0, {"process_s": 5.0})
    assert totals["fixed-state reading: BF16 side"] == 11.0  # 14 - (1 + 2), once
    assert totals["fixed-state reading"] == 6.0  # two read trials; the duplicate reads nothing
    assert totals["logging + other"] == 31.0 - 2.0 - 2 * 4.0 - 11.0 - 6.0
    assert abs(sum(totals.values()) - 42.0) < 1e-9
    assert "fixed-state reading: BF16 side" in bench.PER_PROCESS


def _only_report(path, variant, trials_per_hour, trial_s, steps=40):
    """What ``--only VARIANT --json PATH`` writes, cut to what :func:`bench.merge` reads."""
    import json
    settings = {"space": "s.yaml", "steps": steps, "n_trials": 16, "probe": {"dim": 8}, "backend": "te"}
    path.write_text(json.dumps({"meta": {"date": f"2026-12-03 {variant}", "settings": settings},
                                "compare": {variant: {"trials_per_gpu_hour": trials_per_hour, "trial_s": trial_s}}}))
    return path


def test_merge_puts_two_single_studies_side_by_side_with_their_ratios(tmp_path):
    before = _only_report(tmp_path / "b.json", "before", 300.0, 12.0)
    after = _only_report(tmp_path / "a.json", "after", 480.0, 7.5)
    report = bench.merge([before, after])
    c = report["compare"]
    assert c["before"]["trial_s"] == 12.0 and c["after"]["trial_s"] == 7.5
    assert abs(c["trials_per_gpu_hour_ratio"] - 1.6) < 1e-12
    assert abs(c["trial_s_ratio"] - 0.625) < 1e-12
    assert report["meta"]["dates"] == ["2026-12-03 before", "2026-12-03 after"]
    assert bench.merge([after, before])["compare"]["trials_per_gpu_hour_ratio"] == c["trials_per_gpu_hour_ratio"]


def test_merge_refuses_two_of_one_variant_and_studies_that_differ(tmp_path):
    import pytest
    b1 = _only_report(tmp_path / "b1.json", "before", 300.0, 12.0)
    b2 = _only_report(tmp_path / "b2.json", "before", 310.0, 11.0)
    with pytest.raises(SystemExit, match="second 'before'"):
        bench.merge([b1, b2])
    other = _only_report(tmp_path / "a.json", "after", 480.0, 7.5, steps=20)
    with pytest.raises(SystemExit, match="differ in their settings"):
        bench.merge([b1, other])


def test_before_code_runs_the_study_with_another_checkouts_package(tmp_path, monkeypatch):
    """``--before-code DIR``: the BEFORE study is ``python -m precsearch`` of DIR's package with the defaults (no
    inline records), not this checkout's; otherwise the "before/after" ratio would compare this code with itself."""
    monkeypatch.setenv("PRECSEARCH_SYNC_RECORD", "1")
    tree = tmp_path / "old"
    (tree / "precsearch").mkdir(parents=True)
    (tree / "precsearch" / "__init__.py").write_text("")
    (tree / "precsearch" / "__main__.py").write_text("import os, precsearch; print('ran', precsearch.__file__, "
                                                     "os.environ.get('PRECSEARCH_SYNC_RECORD'))\n")
    env = bench.variant_env("before", torch.device("cuda"), tree)
    assert env["PYTHONPATH"].split(__import__("os").pathsep)[0] == str(tree)
    assert "PRECSEARCH_SYNC_RECORD" not in env
    out = tmp_path / "study"
    out.mkdir()
    bench.run_study_process(tmp_path / "space.yaml", 1, out, env, cwd=tree)
    log = (out / "bench_study.log").read_text()
    assert f"ran {tree / 'precsearch' / '__init__.py'} None" in log


def test_before_space_runs_the_before_study_on_that_file_and_after_on_the_other(tmp_path, monkeypatch):
    """``--before-space``: a shipped space that changed with the code (fewer reference seeds) is compared as it
    was against as it is; each study writes the space it runs, so the files must differ only there."""
    seen = {}

    def fake_breakdown(space_data, n_trials, work, device, env=None, code=None):
        seen[work.name] = space_data
        return {"trials_per_gpu_hour": 100.0 if work.name == "before" else 150.0, "trial_s": 1.0}

    monkeypatch.setattr(bench, "trial_breakdown", fake_breakdown)
    after, before = {"objectives": {"reference_seeds": 1}}, {"objectives": {"reference_seeds": 3}}
    report = bench.compare(after, 4, tmp_path, torch.device("cpu"), before_space=before)
    assert seen == {"before": before, "after": after}
    assert report["trials_per_gpu_hour_ratio"] == 1.5
    bench.compare(after, 4, tmp_path, torch.device("cpu"))
    assert seen == {"before": after, "after": after}  # without it both run the same space


def test_each_study_compiles_into_its_own_empty_cache(tmp_path, monkeypatch):
    """Back to back on one machine, a second study would find the first one's compiled kernels in torch.compile's
    default caches and a BEFORE/AFTER pair would credit the code after with them: each study gets caches of its
    own inside its output directory, which the bench empties first (a stale file there is gone)."""
    seen = {}

    class Stop(Exception):
        pass

    def run_study_process(space_path, n_trials, out_dir, env=None, cwd=None):
        seen[out_dir.parent.name] = (env, sorted(p.name for p in out_dir.iterdir()))
        raise Stop

    monkeypatch.setattr(bench, "time_startup", lambda cuda: {"process_s": 1.0})
    monkeypatch.setattr(bench, "run_study_process", run_study_process)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/shared/inductor")  # a user's own cache is not used either
    for variant in bench.VARIANTS:
        (tmp_path / variant / "study" / "compile_cache").mkdir(parents=True)  # left by an earlier run
        try:
            bench.trial_breakdown({"study": {}}, 1, tmp_path / variant, torch.device("cpu"))
        except Stop:
            pass
    caches = {v: (env["TORCHINDUCTOR_CACHE_DIR"], env["TRITON_CACHE_DIR"]) for v, (env, _) in seen.items()}
    assert set(caches) == set(bench.VARIANTS)
    for variant, paths in caches.items():
        assert all(Path(p).is_relative_to(tmp_path / variant / "study") for p in paths), paths
        assert "compile_cache" not in seen[variant][1]  # emptied before the study starts
    assert caches["before"] != caches["after"]
