"""torchtitan itself, set up from precsearch's exported TOML, for ``benchmarks/bench_frameworks.py``.

The export targets torchtitan v0.2.x (``precsearch/export/torchtitan.py``); this module builds what that
release's ``Trainer.__init__`` builds for one GPU (``torchtitan/train.py`` at v0.2.2), piece by piece, without
its dataloader, tokenizer, checkpointing and metrics (the bench brings its own batches):

* the job config: ``ConfigManager().parse_args(["--job.config_file", TOML, ...])``, the exported file as
  torchtitan reads it, plus the bench's run settings on the command line (:func:`job_args`);
* the model: ``get_train_spec("llama3").model_cls`` on the meta device, at the bench's shape;
* the converters: ``build_model_converters(job_config, parallel_dims).convert(model)`` (the exported
  ``[model] converters`` and ``[quantize.linear.float8]``);
* ``parallelize_fn`` (one GPU: its per-block ``torch.compile`` when ``[compile]`` asks for it), then
  ``to_empty`` and ``init_weights``;
* ``build_optimizers_fn`` (its AdamW), ``build_loss_fn`` (cross-entropy summed, divided by the tokens as the
  trainer does), ``maybe_enable_amp`` (single-device runs autocast to ``mixed_precision_param``) and its
  ``clip_grad_norm_`` with the exported ``[training] max_norm``.

The bench sets ``[activation_checkpoint] mode = "none"``: torchtitan's default is selective recomputation,
which the probe does not do; a user's own TOML says what theirs does.

On a CPU, PyTorch's wheels carry no Triton, which torchtitan's MoE kernels import at module level; the dense
Llama 3 never calls them, so :func:`import_torchtitan` puts an empty module in their place there.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

#: The torchtitan release the export targets and the bench installs.
VERSION = "0.2.2"


def importable() -> bool:
    return importlib.util.find_spec("torchtitan") is not None


def import_torchtitan() -> None:
    """Import what the run needs; without Triton (CPU PyTorch), stub the MoE kernels the dense model never calls."""
    if importlib.util.find_spec("triton") is None and "torchtitan.models.moe.kernels" not in sys.modules:
        stub = types.ModuleType("torchtitan.models.moe.kernels")
        stub.generate_permute_indices = None  # the one name torchtitan.models.moe.utils imports from it
        sys.modules["torchtitan.models.moe.kernels"] = stub
    import torchtitan.components.quantization  # noqa: F401 - registers the converters


def job_args(toml: Path, shape, *, lr: float, weight_decay: float, compile_model: bool,
             emulate: bool = False) -> list[str]:
    """torchtitan's command line: the exported TOML as the job's config file, then the bench's settings."""
    args = ["--job.config_file", str(toml), "--model.name", "llama3", "--training.seq_len", str(shape.seq),
            "--training.local_batch_size", str(shape.mb), "--training.steps", str(shape.steps),
            "--activation_checkpoint.mode", "none", "--optimizer.lr", str(lr),
            "--optimizer.weight_decay", str(weight_decay)]
    if compile_model:  # the export's comment: [compile] enable = true, components = ["model"]
        args += ["--compile.enable", "--compile.components", "model"]
    if emulate:  # torchao's emulated FP8 (a CPU, or a GPU below compute capability 8.9); eager only
        args += ["--quantize.linear.float8.emulate"]
    return args


def model_args(spec, shape) -> Any:
    """torchtitan's Llama 3 arguments at the bench's shape (RoPE theta 500000 as its 8B flavour). The SwiGLU
    width comes out as ``shape.ffn``: with ``multiple_of = ffn`` and no multiplier, torchtitan rounds
    ``8 * dim / 3`` up to it (checked after the build by :func:`build`)."""
    base = spec.model_args["8B"]
    return dataclasses.replace(base, dim=shape.dim, n_layers=shape.layers, n_heads=shape.heads,
                               n_kv_heads=shape.kv_heads, vocab_size=shape.vocab, multiple_of=shape.ffn,
                               ffn_dim_multiplier=None, rope_theta=500000)


@dataclasses.dataclass
class TitanRun:
    """What one torchtitan training step needs."""

    job: Any
    model: Any
    optimizer: Any
    loss_fn: Any
    amp: Any
    max_norm: float

    def forward(self, ids, targets):
        """Logits, loss summed and divided by the tokens (``Trainer.forward_backward_step``); ``pred`` freed."""
        with self.amp:
            pred = self.model(ids)
            loss = self.loss_fn(pred, targets) / targets.numel()
        del pred
        return loss

    def clip(self) -> Any:
        from torchtitan.distributed import utils as dist_utils

        return dist_utils.clip_grad_norm_([p for p in self.model.parameters()], self.max_norm, foreach=True,
                                          pp_mesh=None, ep_enabled=False)


def build(toml: Path, shape, device: str, *, lr: float, weight_decay: float, compile_model: bool,
          emulate: bool = False) -> TitanRun:
    """Build the job, model, converters, compile, optimizer and loss as torchtitan's trainer does (one device)."""
    import torch

    import_torchtitan()
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims, utils as dist_utils
    from torchtitan.protocols.model_converter import build_model_converters
    from torchtitan.protocols.train_spec import get_train_spec
    from torchtitan.tools import utils

    job = ConfigManager().parse_args(job_args(toml, shape, lr=lr, weight_decay=weight_decay,
                                              compile_model=compile_model, emulate=emulate))
    spec = get_train_spec(job.model.name)
    margs = model_args(spec, shape)
    margs.update_from_config(job)
    parallel = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    with torch.device("meta"), utils.set_default_dtype(getattr(torch, job.training.dtype)):
        model = spec.model_cls(margs)
    converters = build_model_converters(job, parallel)
    converters.convert(model)
    model = spec.parallelize_fn(model, parallel, job)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    ffn = model.layers["0"].feed_forward.w1.out_features
    if ffn != shape.ffn:
        raise ValueError(f"torchtitan built a SwiGLU width of {ffn}, the shape asks for {shape.ffn}")
    optimizer = spec.build_optimizers_fn([model], job.optimizer, parallel)
    optimizer.register_step_post_hook(lambda *a, **k: converters.post_optimizer_hook([model]))
    amp = dist_utils.maybe_enable_amp(parallel, job.training.mixed_precision_param, torch.device(device).type)
    return TitanRun(job, model, optimizer, spec.build_loss_fn(job), amp, job.training.max_norm)


def observed(model) -> dict[str, str]:
    """torchtitan FQN (``_orig_mod`` dropped) -> the precision its Linear runs: torchao's ``Float8Linear``
    (tensorwise: precsearch's ``fp8_current``) or BF16 under autocast."""
    import torch
    from torchao.float8.float8_linear import Float8Linear

    import frameworks_plan as plan

    return {plan.uncompiled_name(n): (plan.P.FP8_CURRENT if isinstance(m, Float8Linear) else plan.P.BF16).value
            for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def expected(policy, n_layers: int) -> dict[str, str]:
    """torchtitan FQN -> the precision the policy gives that layer (``export.torchtitan.tt_name``)."""
    import frameworks_plan as plan
    from precsearch.export.torchtitan import tt_name

    return {tt_name(hf): p for hf, p in plan.hf_expected(policy, n_layers).items()}
