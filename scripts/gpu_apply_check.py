"""Does an exported policy reproduce its trial? (H200; issue: export and apply)

Takes a finished study, exports the feasible front trial that saves the most
memory to a policy file, then trains a freshly built probe with the public API
only (``precsearch.load_policy``, ``policy.apply(model, backend=...)``,
``policy.build_optimizer``, ``policy.autocast``, ``policy.clip_gradients``) on
the same data, seed and steps, and compares peak memory and held-out loss with
what the study recorded for that trial. On a CPU only the loss is compared
(the study's memory there is a prediction, not a measurement).

    python scripts/gpu_apply_check.py SPACE STUDY_DIR [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import optuna
import torch

import precsearch
from precsearch.backends import resolve_device
from precsearch.config.loader import load_space
from precsearch.runtime.study_export import export_trial
from precsearch.policy import Policy
from precsearch.backends.policy_runtime import _backend_of
from precsearch.probe.runner import _lr_lambda, build_probe, evaluate
from precsearch.search.front import trial_rows
from precsearch.probe.data import load_batches
from precsearch.runtime.workspace import Workspace


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("space", type=Path)
    ap.add_argument("study_dir", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    space, ws = load_space(args.space), Workspace.load(args.study_dir)
    study = optuna.load_study(study_name=ws.study_name, storage=ws.storage_url)
    rows = [r for r in trial_rows(study, study.user_attrs["objectives"]) if r["pareto"]]
    row = max(rows, key=lambda r: r["memory_saved"])
    trial = next(t for t in study.trials if t.number == row["trial"])
    path = Path(tempfile.mkdtemp()) / "policy.yaml"
    path.write_text(export_trial(study, ws, trial.number))
    policy = precsearch.load_policy(path)

    cfg, probe, device = space.model.probe(), space.probe, resolve_device(space.probe.device)
    data = load_batches(space)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model = build_probe(cfg, Policy(), _NoConvert(), device, probe.seed, probe.param_dtype)
    policy.apply(model, backend=space.backend.value)
    opt = policy.build_optimizer(model, lr=probe.lr, betas=probe.betas, weight_decay=probe.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(probe))
    for step in range(probe.steps):
        inputs, targets = (t.to(device) for t in data.train_batch(step))
        with policy.autocast(model, step):
            loss = model(inputs, targets)
        loss.backward()
        policy.clip_gradients(model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
    backend = _backend_of(model)
    eval_loss = evaluate(model, data, backend, device, fp8_on=policy.policy.uses_fp8)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else trial.user_attrs["peak_memory_bytes"]
    study_peak, study_eval = trial.user_attrs["peak_memory_bytes"], trial.user_attrs["eval_loss"]
    result = {"trial": trial.number, "policy": policy.policy.to_dict(),
              "study_peak_gib": study_peak / 2**30, "apply_peak_gib": peak / 2**30,
              "peak_rel_diff": peak / study_peak - 1,
              "study_eval_loss": study_eval, "apply_eval_loss": eval_loss,
              "eval_rel_diff": eval_loss / study_eval - 1}
    print(f"trial {trial.number}: peak {study_peak / 2**30:.2f} GiB in the study, {peak / 2**30:.2f} GiB via "
          f"policy.apply ({100 * result['peak_rel_diff']:+.2f}%); held-out loss {study_eval:.4f} vs "
          f"{eval_loss:.4f} ({100 * result['eval_rel_diff']:+.2f}%)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


class _NoConvert:
    """A stand-in backend for building the plain BF16 probe: converts nothing."""

    def check_supported(self, recipes, device) -> None:
        return None

    def convert(self, model, recipes):
        return model


if __name__ == "__main__":
    sys.exit(main())
