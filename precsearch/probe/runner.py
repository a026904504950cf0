"""One probe: build the Llama 3 probe, apply a policy, train a few steps, measure.

The loop is the one a user's training job would run under the policy: BF16
for the warm-up steps, then FP8 where the policy assigns it; gradients clipped
to the policy's threshold; fp32 parameters with ``torch.autocast`` to BF16;
AdamW. A probe that produces a non-finite value (in the loss, a gradient, an
optimizer state or a weight: :mod:`precsearch.probe.measure.nonfinite`), or
whose loss blows up, stops early and says so; it never raises for that.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from precsearch.arch.units import unit_names
from precsearch.arch.hf_checkpoint import CheckpointStart
from precsearch.backends.base import Backend, UnsupportedRecipe
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy
from precsearch.probe import continuation
from precsearch.probe.model.checkpoint_init import init_from_checkpoint
from precsearch.probe.memory.calibration import Calibration, DepthMeasurement, fit_calibration, predict_target
from precsearch.probe.data import TokenBatches
from precsearch.probe.measure.diagnostics import DiagnosticsConfig, LayerWatch
from precsearch.probe.measure.events import StepMonitor
from precsearch.probe.measure.nonfinite import Agree, NonFiniteWatch
from precsearch.probe.memory.peak import predict_peak
from precsearch.probe.memory.phases import PhaseMemory
from precsearch.probe.model.llama3 import Llama3, ModelConfig, build_model
from precsearch.probe.model.reuse import BuildKey, Built, ModelCache, named_plan
from precsearch.probe.result import ProbeResult
from precsearch.probe.measure.signal_recorder import SignalRecorder
from precsearch.probe.measure.step_rate import step_rate

StepCallback = Callable[[int, float, float], None]


def clip_unless_nonfinite(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_``, bit for bit, except that a non-finite norm leaves the gradients as they
    are: scaled by it they would all be NaN, and the one that was not finite could no longer be named."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if math.isfinite(float(norm)):  # the step reads the norm on the host anyway: no extra sync
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


PARAM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Parallel:
    """How a probe's training spans processes; the default is one process and changes nothing.

    Attributes:
        split: Called on the whole, seeded model before a backend converts it (tensor parallelism
            keeps this rank's slices here, :mod:`precsearch.probe.parallel.tensor_parallel`).
        shard: Called on the converted model before the optimizer is built (FSDP2 wraps it here,
            see :mod:`precsearch.probe.parallel.distributed`).
        mean: The mean over processes of a per-process scalar (each process's loss on its rows).
        clip: After the backward: completes the gradients (sums the shares ranks hold) and clips them
            to a max norm in place unless the norm is not finite; returns the whole model's gradient norm.
        first: The first in rank order of the processes' findings of a non-finite tensor (a name or None), the
            same on every process (:class:`~precsearch.probe.measure.nonfinite.NonFiniteWatch`).
    """

    split: Callable[[torch.nn.Module], None] = lambda model: None
    shard: Callable[[torch.nn.Module], None] = lambda model: None
    mean: Callable[[float], float] = lambda value: value
    clip: Callable[[torch.nn.Module, float], torch.Tensor] = clip_unless_nonfinite
    first: Agree = lambda found: found


ONE_PROCESS = Parallel()
EVERY_10_STEPS = DiagnosticsConfig()  # per-layer FP8 statistics every 10 steps and at the last


def build_probe(cfg: ModelConfig, policy: Policy, backend: Backend, device: torch.device, seed: int,
                param_dtype: str = "fp32", init: CheckpointStart | None = None,
                split: Callable[[torch.nn.Module], None] | None = None,
                weights: dict[str, torch.Tensor] | None = None) -> Llama3:
    """The probe model on ``device``, seeded (or with ``init``'s checkpoint weights, or ``weights``: a
    ``state_dict`` of the plain probe), with its precision units converted per ``policy``.

    Every unit's recipe goes to the backend, BF16 ones included: the emulated
    backend leaves those as they are, the ``te`` backend builds every unit
    from Transformer Engine modules, as the training stack does.
    """
    return _build(cfg, policy, backend, device, seed, param_dtype, init, split, weights)[0]


def _build(cfg, policy, backend, device, seed, param_dtype="fp32", init=None, split=None, weights=None,
           view: bool = False) -> Built:
    """:func:`build_probe`'s model, and with ``view`` the init plan of its plain model by Parameter name and its
    plain view (:meth:`Backend.plain_tensors`): what :class:`ModelCache` needs to set it again in place."""
    model = build_model(cfg, seed, device)  # a seed gives the same weights on the same kind of device
    if init is not None:
        init_from_checkpoint(model, init)  # before conversion: the TE stack copies these weights in
    if weights is not None:
        _load_weights(model, weights)  # a state of another run (the fixed-state reading), before conversion too
    model.to(dtype=PARAM_DTYPES[param_dtype])
    model.rotary_pos_emb.reset_inv_freq()  # RoPE frequencies stay fp32 whatever the parameters' dtype
    if split is not None:
        split(model)  # tensor parallelism: this rank's slices, before the backend builds its units from them
    plan = named_plan(model) if view else []  # the plain model's Parameters by name, in init order
    plain = dict(model.named_parameters()) if view else {}
    recipes = policy.layer_recipes(unit_names(cfg), cfg.n_layers)
    backend.check_supported(recipes, device)
    # the emulated NVFP4 stochastic-rounding streams start from torch.initial_seed(), which an unseeded
    # process draws at random: seeding here makes a probe's seed fix them (and the rerun of a trial repeat it)
    torch.manual_seed(seed)
    model = backend.convert(model, recipes)
    if backend.probe_compiles_blocks(device):
        compile_probe_blocks(model)
    return model, plan, backend.plain_tensors(model, plain) if view else {}


#: ``torch._dynamo``'s recompile limit while the probe's blocks are compiled. One process compiles a block once per
#: variant: which of its units are FP8, FP8 on or off, training or evaluation, statistics on or off. At the
#: default of 8 a study's ninth variant ran eager, without a word (seen on a CPU: 2 x 2 x 2 variants hit it).
RECOMPILE_LIMIT = 64


def compile_probe_blocks(model: Llama3, **compile_kwargs) -> None:
    """Compile each block of the probe's ``model`` in place (``compile_kwargs`` to ``torch.compile``), with room
    for every variant a study compiles."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    model.compile_blocks(**compile_kwargs)


def _load_weights(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """``model.load_state_dict(weights)``; a mapping that reads each tensor when indexed (a state kept on disk,
    :class:`precsearch.probe.damage.spill.Spilled`) is copied in one tensor at a time, as ``load_state_dict``
    copies, so that its tensors are never all in memory at once."""
    if isinstance(weights, dict):
        model.load_state_dict(weights)
        return
    own = model.state_dict()
    if set(own) != set(weights):
        raise ValueError(f"weights for another model: {sorted(set(own) ^ set(weights))[:3]} differ")
    with torch.no_grad():
        for name, tensor in own.items():
            value = weights[name]
            if value.shape != tensor.shape:
                raise ValueError(f"weights[{name!r}] has shape {tuple(value.shape)}, the model's {tuple(tensor.shape)}")
            tensor.copy_(value)


def _probe_model(cfg: ModelConfig, probe: ProbeSection, policy: Policy, backend: Backend, device: torch.device,
                 parallel: Parallel, init: CheckpointStart | None, models: ModelCache | None,
                 weights: dict[str, torch.Tensor] | None = None) -> Llama3:
    """The probe's model: ``models``'s kept one set again where it was built for the same key (one process,
    seeded random init or ``weights``), else a fresh build (:mod:`precsearch.probe.model.reuse`)."""
    if models is None or init is not None or parallel is not ONE_PROCESS:
        return build_probe(cfg, policy, backend, device, probe.seed, probe.param_dtype, init, parallel.split,
                           weights)
    recipes = policy.layer_recipes(unit_names(cfg), cfg.n_layers)
    key = BuildKey(cfg, str(device), probe.param_dtype, (backend.name, repr(policy.memory)),
                   tuple(recipes.items()))
    return models.take(key, probe.seed, backend,
                       lambda: _build(cfg, policy, backend, device, probe.seed, probe.param_dtype, weights=weights,
                                      view=True),
                       weights=weights)


def _lr_lambda(probe: ProbeSection, steps: int | None = None) -> Callable[[int], float]:
    steps = steps or probe.steps  # a leg of a longer run lays its schedule over the whole run
    def factor(step: int) -> float:
        if step < probe.lr_warmup_steps:
            return (step + 1) / probe.lr_warmup_steps
        if probe.schedule == "constant":
            return 1.0
        progress = (step - probe.lr_warmup_steps) / max(1, steps - probe.lr_warmup_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return probe.min_lr_ratio + (1 - probe.min_lr_ratio) * cosine

    return factor


def run_probe(
    cfg: ModelConfig,
    probe: ProbeSection,
    policy: Policy,
    data: TokenBatches,
    backend: Backend,
    device: torch.device,
    on_step: StepCallback | None = None,
    parallel: Parallel = ONE_PROCESS,
    diagnostics: DiagnosticsConfig = EVERY_10_STEPS,
    target: ModelConfig | None = None,
    leg: continuation.Leg | None = None,
    init: CheckpointStart | None = None,
    models: ModelCache | None = None,
    held_bytes: int = 0,
) -> ProbeResult:
    """Train the probe under ``policy`` for ``probe.steps`` steps and measure it.

    ``target`` is the full model the policy is meant for (default: ``cfg``); its peak memory
    is predicted, and calibrated by this probe's measurement on a GPU
    (:mod:`precsearch.probe.memory.calibration`).

    ``diagnostics`` sets how often per-layer FP8 statistics are collected; a
    diverged probe names its first bad layer (:mod:`precsearch.probe.measure.diagnostics`).

    ``leg`` makes this probe a stretch of a longer run: continued from a checkpoint, its LR
    schedule laid over the whole run, its state saved at the end (:mod:`precsearch.probe.continuation`).

    ``init`` makes the probe start from a checkpoint's weights (``model.init_from``) instead of
    the seeded random init; the optimizer state starts fresh either way. The seed then has no
    init to change, so it draws the training windows instead (held-out batches unchanged):
    otherwise every BF16 reference seed would be the same run and the noise floor zero.

    ``models`` keeps the model for the next probe of the same shape and policy structure, which
    initialises it again in place instead of building it (:mod:`precsearch.probe.model.reuse`).

    ``held_bytes`` is device memory the process holds outside the probe for the whole probe (the fixed-state
    reader's BF16 gradients, kept between trials): it is taken off the measured peak and phases, which are the
    probe's own.
    """
    if data.grad_accum != probe.grad_accum:  # a programming error: load_batches cuts the data for the space's probe
        raise ValueError(f"the data is cut into {data.grad_accum} micro-batches a step, the probe asks for "
                         f"{probe.grad_accum} (probe.grad_accum)")
    start = time.perf_counter()
    run = _prepare(cfg, probe, policy, data, backend, device, parallel, leg, init, models)
    run.result.phase_s["build"] = time.perf_counter() - start
    run.phases = PhaseMemory(device, held_bytes)
    _train(run, LayerWatch(run.model, run.backend, unit_names(cfg), diagnostics, probe.steps),
           SignalRecorder(probe.steps, diagnostics.every), on_step)
    result = run.result
    if not result.diverged:
        continuation.save(leg, run.model, run.opt, run.sched, run.monitor, result)  # before the eval's FP8 forwards
    t0 = time.perf_counter()
    if not result.diverged:
        result.eval_loss = parallel.mean(evaluate(run.model, run.data, run.backend, device, fp8_on=policy.uses_fp8))
    result.phase_s["eval"] = time.perf_counter() - t0
    # a sharded probe's per-rank peak is not what the one-process memory model predicts: no calibration
    if run.optimizer_times:
        result.optimizer_step_s = statistics.median(run.optimizer_times)
    _measure(result, cfg, probe, policy, run.model, device, run.step_times, start, target=target,
             calibrate=parallel is ONE_PROCESS, phases=run.phases, held_bytes=held_bytes,
             fp8_linear=run.backend.fp8_linear, compiled_blocks=run.backend.probe_compiles_blocks(device))
    if models is not None:
        models.keep(run.model)
    return result


@dataclass
class _Run:
    """One probe's training state: what :func:`_prepare` builds and each step of :func:`_train` works on."""

    probe: ProbeSection
    policy: Policy
    device: torch.device
    parallel: Parallel
    backend: Backend
    data: TokenBatches
    model: Llama3
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    monitor: StepMonitor
    result: ProbeResult
    first: int
    phases: PhaseMemory | None = None
    step_times: list[float] = field(default_factory=list)
    optimizer_times: list[float] = field(default_factory=list)
    nonfinite: NonFiniteWatch | None = None


def _prepare(cfg: ModelConfig, probe: ProbeSection, policy: Policy, data: TokenBatches, backend: Backend,
             device: torch.device, parallel: Parallel, leg: continuation.Leg | None,
             init: CheckpointStart | None, models: ModelCache | None = None) -> _Run:
    """The model, optimizer, schedule and monitor of a probe, restored from ``leg``'s checkpoint if it has one."""
    if device.type == "cuda":
        torch.empty(0, device=device)  # initialise CUDA in this process: the reset below needs a context
        torch.cuda.reset_peak_memory_stats(device)
    problem = backend.memory_knob_problem(policy.memory, device)
    if problem:
        raise UnsupportedRecipe(problem)
    backend = backend.for_memory(policy.memory)
    model = _probe_model(cfg, probe, policy, backend, device, parallel, init, models)
    if init is not None and data.seed != probe.seed:
        data = data.with_seed(probe.seed)
    parallel.shard(model)
    opt = backend.build_optimizer(model, policy.memory, lr=probe.lr, betas=probe.betas,
                                  weight_decay=probe.weight_decay)
    horizon = continuation.schedule_steps(leg, probe.steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(probe, horizon))
    result = ProbeResult(device=str(device), card=torch.cuda.get_device_name(device) if device.type == "cuda" else "")
    monitor = StepMonitor(probe.spike_threshold, probe.grad_blowup_factor)
    first = continuation.restore(leg, model, opt, sched, monitor, result)
    return _Run(probe, policy, device, parallel, backend, data, model, opt, sched, monitor, result, first,
                nonfinite=NonFiniteWatch(model, opt, parallel.first))


def _train(run: _Run, watch: LayerWatch, signals: SignalRecorder, on_step: StepCallback | None) -> None:
    """The steps from ``run.first`` to ``probe.steps``, or to divergence, with diagnostics and signals attached."""
    # Compiled blocks (torchao on a GPU) see the signals' observers only on the steps that read them: an observer
    # breaks a block's graph, which the other timed steps then run whole, as torchtitan's blocks
    compiled = run.backend.probe_compiles_blocks(run.device)
    detach_signals = (lambda: None) if compiled else signals.attach(run.model)
    for step in range(run.first, run.probe.steps):
        observed = signals.attach(run.model, compiled=True) if compiled and signals.is_stat_step(step) else None
        stepped = _step(run, step, watch, signals, on_step)
        if observed is not None:
            observed()
        if not stepped:
            break
    watch.close()
    detach_signals()
    signals.add_layer_stats(run.result.layer_stats)
    run.result.signals = signals.signals().to_dict()


def _step(run: _Run, step: int, watch: LayerWatch, signals: SignalRecorder, on_step: StepCallback | None) -> bool:
    """One training step, timed and recorded; False when the probe diverged at it (its first bad layer named)."""
    policy, result, parallel = run.policy, run.result, run.parallel
    fp8_on = policy.uses_fp8 and step >= policy.warmup_steps
    t0 = time.perf_counter()
    watch.begin_step(step)
    if signals.begin_step(step) and parallel is ONE_PROCESS:  # sharded weights are not whole here
        signals.record_fc1_weights(run.model)
    run.phases.mark("start")
    loss, grad_norm = _train_step(run.model, run.opt, run.data, step, fp8_on, policy.clip_grad, run.backend,
                                  run.device, run.phases, parallel.clip, run.probe.grad_accum, run.nonfinite,
                                  trained=lambda t_opt: _time_step(run, step, fp8_on, t0, t_opt))
    signals.record_grad_norm(grad_norm)
    signals.end_step()
    loss = parallel.mean(loss)
    run.sched.step()
    result.losses.append(loss)
    result.grad_norms.append(grad_norm)
    result.fp8_steps.append(fp8_on)
    watch.end_step(result.layer_stats, step)
    result.events.extend(e.to_dict() for e in run.monitor.observe(step, loss, grad_norm))
    if on_step:
        on_step(step, loss, grad_norm)
    if not _diverged(result, run.probe.divergence_factor, step, run.nonfinite):
        return True
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):  # the weights are still the step's
        watch.replay(step, lambda: _accumulate(run.model, run.data, step, fp8_on, run.backend, run.device,
                                               accum=run.probe.grad_accum))
    if (bad := watch.explain(step, result.layer_stats)) is not None:
        result.first_bad = bad.to_dict()
        result.reason += f"; {bad.describe()}"
    return False


def _time_step(run: _Run, step: int, fp8_on: bool, t0: float, t_opt: float) -> None:
    """Add the step's time to its phase, and to the throughput's steps once its regime is past its first step;
    beside it, the time from ``t_opt`` (the optimizer step's start, the backward and clipping done) to the end.

    Called when the step's training is done (its optimizer step queued), before the non-finite check of its
    states and weights: on a GPU after a device synchronize, so the time is the step's work and not the check's,
    which a framework's run does not pay (at the 8B width on an H100 it was 12% of a BF16 step and 22% of an FP8
    one with ``fp8_block`` moments: ``bench_nonfinite.py@6f05340``)."""
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)
    policy, now = run.policy, time.perf_counter()
    phase = "fp8_steps" if fp8_on else ("warmup_steps" if policy.uses_fp8 else "bf16_steps")
    run.result.phase_s[phase] = run.result.phase_s.get(phase, 0.0) + now - t0
    final_regime = policy.warmup_steps if policy.uses_fp8 else 0  # throughput is timed in this regime
    if step > max(final_regime, run.first):  # a regime's or leg's first step pays one-off costs (allocations)
        run.step_times.append(now - t0)
        run.optimizer_times.append(now - t_opt)


def _forward_backward(model, data, step, fp8_on, backend, device, phases: PhaseMemory | None = None,
                      micro: int = 0, accum: int = 1) -> torch.Tensor:
    inputs, targets = (t.to(device) for t in data.train_batch(step, micro))
    with backend.autocast(model, enabled=fp8_on), torch.autocast(device.type, dtype=torch.bfloat16):
        loss = model(inputs, targets)
    if phases is not None:
        phases.mark("forward")
    # gradients add up over the micro-batches: each contributes 1/accum of the step's mean-loss gradient
    (loss / accum if accum > 1 else loss).backward()
    return loss


def _accumulate(model, data, step, fp8_on, backend, device, phases: PhaseMemory | None = None,
                accum: int = 1) -> torch.Tensor:
    """Forward and backward of every micro-batch of ``step``; their mean loss (one tensor, no host sync)."""
    losses = [_forward_backward(model, data, step, fp8_on, backend, device, phases, micro, accum)
              for micro in range(accum)]
    return losses[0].detach() if accum == 1 else torch.stack([loss.detach() for loss in losses]).mean()


def _train_step(model, opt, data, step, fp8_on, clip, backend, device, phases: PhaseMemory | None = None,
                clip_grads: Callable[[torch.nn.Module, float], torch.Tensor] = ONE_PROCESS.clip,
                accum: int = 1, nonfinite: NonFiniteWatch | None = None,
                trained: Callable[[float], None] | None = None) -> tuple[float, float]:
    """One optimizer step over ``accum`` micro-batches (gradient accumulation): the gradients of their mean
    loss clipped and applied once. A non-finite loss or gradient skips the optimizer step (the weights stay
    as they were). ``nonfinite`` then names the first non-finite gradient; after a step, it checks the
    optimizer states and weights. ``trained`` is called once the step's training is done, before that check
    (the probe stops its clock there: the check is the probe's, not the training's), with the
    ``time.perf_counter()`` at which the optimizer step began (reading the loss and the gradient norm waited for
    the backward and the clipping, so what follows is the optimizer's)."""
    loss = _accumulate(model, data, step, fp8_on, backend, device, phases, accum)
    max_norm = clip if clip is not None else math.inf
    grad_norm = clip_grads(model, max_norm)
    loss_v, grad_v = float(loss), float(grad_norm)
    if phases is not None:
        phases.mark("backward")
    stepped = math.isfinite(loss_v) and math.isfinite(grad_v)
    t_opt = time.perf_counter()
    if stepped:
        opt.step()
    elif nonfinite is not None and not math.isfinite(grad_v):  # the norm is every process's: all of them scan
        nonfinite.gradients()
    if phases is not None:
        phases.mark("step")
    opt.zero_grad(set_to_none=True)
    if trained is not None:
        trained(t_opt)
    if stepped and nonfinite is not None:
        nonfinite.after_update(step)
    return loss_v, grad_v


def _diverged(result: ProbeResult, factor: float, step: int, nonfinite: NonFiniteWatch | None = None) -> bool:
    """Whether the probe diverged at ``step``: a non-finite value anywhere (named, with ``nonfinite``), or a loss
    blow-up; ``result`` then says which and where."""
    loss, grad = result.losses[-1], result.grad_norms[-1]
    if nonfinite is not None and (not math.isfinite(loss) or not math.isfinite(grad)):
        nonfinite.stopped(step, math.isfinite(loss))
    if nonfinite is not None and nonfinite.found is not None:
        result.nonfinite = nonfinite.found.to_dict()
        result.reason = nonfinite.found.describe()
    elif not math.isfinite(loss) or not math.isfinite(grad):
        what = "loss" if not math.isfinite(loss) else "gradient norm"
        result.reason = f"non-finite {what} at step {step}"
    elif loss > factor * result.losses[0]:
        result.reason = f"loss {loss:.3f} at step {step} exceeds {factor}x the first loss {result.losses[0]:.3f}"
    else:
        return False
    result.diverged, result.diverged_step = True, step
    return True


def evaluate(model: Llama3, data: TokenBatches, backend: Backend, device: torch.device, fp8_on: bool) -> float:
    """Mean loss over the fixed held-out batches, in the precision training ended in."""
    losses = eval_losses(model, data, backend, device, fp8_on)
    return sum(losses) / len(losses)


@torch.no_grad()
def eval_losses(model: Llama3, data: TokenBatches, backend: Backend, device: torch.device, fp8_on: bool
                ) -> list[float]:
    """The loss of each fixed held-out batch, with FP8 on or off."""
    model.eval()
    losses = []
    for inputs, targets in data.eval_set():
        with backend.autocast(model, enabled=fp8_on), torch.autocast(device.type, dtype=torch.bfloat16):
            losses.append(float(model(inputs.to(device), targets.to(device))))
    model.train()
    return losses


def _measure(result, cfg, probe, policy, model, device, step_times, start, target=None, calibrate=True,
             phases: PhaseMemory | None = None, held_bytes: int = 0, fp8_linear: str = "te",
             compiled_blocks: bool = False) -> None:
    tokens = probe.seq_len * probe.micro_batch * probe.grad_accum  # every micro-batch's tokens, each step
    if step_times:
        result.tokens_per_s, result.tokens_per_s_rel_se = step_rate(step_times, tokens)
    precisions = backend_precisions(policy, cfg)
    predicted = predict_peak(cfg, precisions, seq_len=probe.seq_len, micro_batch=probe.micro_batch,
                             param_dtype=probe.param_dtype, memory=policy.memory, grad_accum=probe.grad_accum,
                             fp8_linear=fp8_linear, compiled_blocks=compiled_blocks)
    result.predicted_memory = predicted.to_dict()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        overall = phases.overall_peak() if phases is not None else 0
        result.peak_memory_bytes = int(max(overall, torch.cuda.max_memory_allocated(device) - held_bytes))
        result.memory_source = "measured"
        result.memory_phases = phases.to_dict() if phases is not None else {}
    else:
        result.peak_memory_bytes = predicted.total
        result.memory_source = "predicted"
    _predict_target(result, cfg, target or cfg, probe, policy, predicted.total, calibrate, fp8_linear,
                    compiled_blocks)
    result.wall_s = time.perf_counter() - start


#: Steps a probe must run for its peak to include the optimizer state (created by the first step).
_STEPS_TO_PEAK = 2


def _predict_target(result: ProbeResult, cfg: ModelConfig, target: ModelConfig, probe: ProbeSection,
                    policy: Policy, predicted_bytes: int, calibrate: bool = True, fp8_linear: str = "te",
                    compiled_blocks: bool = False) -> None:
    """Fill the target's predicted peak, corrected by this probe's measurement when there is one."""
    calibration = Calibration()
    if calibrate and result.memory_source == "measured" and len(result.losses) >= _STEPS_TO_PEAK:
        calibration = fit_calibration([DepthMeasurement(cfg.n_layers, predicted_bytes, result.peak_memory_bytes)])
    prediction = predict_target(target, backend_precisions(policy, target), calibration, seq_len=probe.seq_len,
                                micro_batch=probe.micro_batch, param_dtype=probe.param_dtype, memory=policy.memory,
                                grad_accum=probe.grad_accum, fp8_linear=fp8_linear, compiled_blocks=compiled_blocks)
    result.target_memory_bytes = prediction.bytes
    result.target_breakdown = prediction.breakdown.components()
    result.target_memory_source = prediction.source
    result.target_layers = target.n_layers
    result.memory_calibration = calibration.to_dict()


def backend_precisions(policy: Policy, cfg: ModelConfig) -> dict:
    """Layer name -> precision under ``policy`` for a model of shape ``cfg``."""
    return {n: r.precision for n, r in policy.layer_recipes(unit_names(cfg), cfg.n_layers).items()}
