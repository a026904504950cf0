"""Per-unit forward+backward time of the 8B-wide probe on the GPU, BF16 vs each low precision of a space.

Writes ``$OUT/unit_speed.json``: unit -> precision -> ms, and each unit's measured speed gain
(1 - t_low / t_bf16), the measured counterpart of the sensitivity table's predicted speed column.

    python scripts/gpu_unit_speed.py search_spaces/llama3_8b_h200_per_module.yaml $OUT/unit_speed.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from precsearch.backends import get_backend
from precsearch.config.loader import load_space
from precsearch.config.unit_space import searched_units
from precsearch.policy import Policy
from precsearch.precision import Precision
from precsearch.probe.data import load_batches
from precsearch.probe.runner import _forward_backward, build_probe
from precsearch.probe.measure.unit_timing import time_units, timed_module


def main(space_path: str, out: str) -> int:
    space = load_space(Path(space_path))
    cfg, device = space.model.probe(), torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backend = get_backend(space.backend.value, device)
    data = load_batches(space)
    units = searched_units(space.search.units, cfg.n_layers)
    precisions = sorted({p for u in units for p in u.knob.options()}, key=list(Precision).index)
    names = [u.unit for u in units]
    table: dict[str, dict[str, float]] = {n: {} for n in names}
    fused: dict[str, dict[str, str]] = {}  # precision -> unit -> the fused module timed for it
    for p in precisions:
        model = build_probe(cfg, Policy(default=p), backend, device, 0, space.probe.param_dtype)
        fused[p.value] = {n: m for n in names if (m := timed_module(model, n)) != n}
        step = lambda: (_forward_backward(model, data, 0, p.is_fp8, backend, device),  # noqa: E731
                        model.zero_grad(set_to_none=True))
        for unit, ms in time_units(model, names, step).items():
            table[unit][p.value] = ms
        del model
        torch.cuda.empty_cache()
    gains = {u: {p: 1 - ms / t["bf16"] for p, ms in t.items() if p != "bf16"} for u, t in table.items()}
    payload = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (wall clock, emulated: "
               "not an FP8 speed)", "backend": space.backend.value,
               "tokens_per_step": space.probe.seq_len * space.probe.micro_batch, "ms": table, "speed_gain": gains,
               "timed_together": fused}
    Path(out).write_text(json.dumps(payload, indent=1))
    for u in names:
        print(f"{u:45s} " + "  ".join(f"{p}: {ms:7.3f} ms" for p, ms in table[u].items())
              + "  gain " + ", ".join(f"{p} {100 * g:+.1f}%" for p, g in gains[u].items())
              + ("  (fc1+fc2 timed together: one te.LayerNormMLP)" if any(u in f for f in fused.values()) else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
