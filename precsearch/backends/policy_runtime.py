"""Applying a policy file in a user's own training loop.

:func:`load_policy` returns a :class:`PolicyRuntime`: the frozen
:class:`~precsearch.policy.rules.Policy` plus the three things a training loop
needs from it::

    policy = precsearch.load_policy("policy.yaml")
    model = policy.apply(model)                      # convert the Linear layers
    for step, (inputs, targets) in enumerate(batches):
        with policy.autocast(model, step):           # BF16 during the FP8 warm-up
            loss = loss_fn(model(inputs), targets)
        loss.backward()
        policy.clip_gradients(model)                 # the policy's clip_grad
        optimizer.step(); optimizer.zero_grad()

Layer names are matched as they appear in ``model.named_modules()``. A policy
names precision units (:mod:`precsearch.arch.units`): Megatron-Core's names,
which the probe uses (``decoder.layers.3.mlp.linear_fc1``), or the Hugging Face
names they compute (``model.layers.3.mlp.gate_proj`` and ``up_proj``), so it
applies to a Hugging Face ``LlamaForCausalLM`` directly, every projection of a
fused unit getting the unit's precision; for a model named otherwise pass
``name_map``, a callable from the model's name to the policy's name (or None to
leave that layer alone).
"""

from __future__ import annotations

import contextlib
import math
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from precsearch.backends import Backend, get_backend
from precsearch.policy.rules import MemoryKnobs, Policy, Rule, block_index, member_rules
from precsearch.precision import LayerRecipe, Precision

NameMap = Callable[[str], "str | None"]

# model -> the backend that converted it, so autocast() finds it again (also under DDP/FSDP wrappers)
_CONVERTED: "weakref.WeakKeyDictionary[nn.Module, Backend]" = weakref.WeakKeyDictionary()


class PolicyError(ValueError):
    """A policy cannot be applied to a model (no layer matched, wrong names)."""


class PolicyRuntime:
    """A loaded policy, with the methods a training loop calls.

    Attributes:
        policy: The frozen :class:`Policy` (rules, default, recipe, warmup_steps, clip_grad).
        provenance: Where the policy came from (study, trial, objectives), as written by export.

    Every attribute of :class:`Policy` is also readable here (``runtime.warmup_steps``,
    ``runtime.to_dict()``), so code written for a plain ``Policy`` keeps working.
    """

    def __init__(self, policy: Policy, provenance: dict[str, Any] | None = None):
        self.policy = policy
        self.provenance = dict(provenance or {})

    def __getattr__(self, name: str) -> Any:
        # only called for names not found normally: delegate to the frozen Policy
        if name in ("policy", "provenance"):
            raise AttributeError(name)
        return getattr(self.policy, name)

    def __repr__(self) -> str:
        trial = self.provenance.get("trial")
        where = f" (study {self.provenance.get('study')!r}, trial {trial})" if trial is not None else ""
        return f"PolicyRuntime({self.policy!r}){where}"

    # ---- which layers run what ---------------------------------------------------------

    def plan(self, model: nn.Module, name_map: NameMap | None = None,
             n_layers: int | None = None) -> dict[str, LayerRecipe]:
        """The recipe of every ``nn.Linear`` of ``model`` the policy covers, by the model's own names.

        Args:
            model: Any module; its ``nn.Linear`` submodules are looked at.
            name_map: Model name -> policy name (HF ``LlamaForCausalLM`` style), or None to skip
                the layer. Default: names are used as they are.
            n_layers: Transformer blocks, for rules limited to the last k blocks. Default: one
                more than the largest block index among the (mapped) layer names.

        Raises:
            PolicyError: The policy has rules and no rule's name pattern matches any Linear of
                ``model`` (the model names its layers differently: give ``name_map``).
        """
        mapped = _mapped_linear_names(model, name_map)
        whole = n_layers is None
        if n_layers is None:
            indices = [i for i in (block_index(n) for n in mapped.values()) if i is not None]
            n_layers = max(indices) + 1 if indices else 0
        if not mapped and self.policy.uses_fp8:
            raise PolicyError(f"{type(model).__name__} has no nn.Linear layer (after name_map) for the policy to "
                              "convert; FP8 would run nowhere")
        if self.policy.rules and not any(_could_match(r, p) for r in self.policy.rules for p in mapped.values()):
            patterns = sorted({m for r in self.policy.rules for m in r.modules})
            sample = list(mapped.values())[:3] or ["(the model has no nn.Linear)"]
            hint = "" if name_map else "; if the model names its layers differently, pass name_map"
            raise PolicyError(
                f"no rule of the policy matches any Linear layer of {type(model).__name__}: the rules "
                f"match {', '.join(patterns)}; the model's layers are named like {', '.join(sample)}{hint}"
            )
        _check_every_rule_decides(self.policy.rules, list(mapped.values()), n_layers, whole=whole)
        recipes = self.policy.layer_recipes(list(mapped.values()), n_layers)
        return {name: recipes[policy_name] for name, policy_name in mapped.items()}

    def precisions(self, model: nn.Module, name_map: NameMap | None = None,
                   n_layers: int | None = None) -> dict[str, Precision]:
        """Model layer name -> the precision the policy gives it (BF16 included)."""
        return {n: r.precision for n, r in self.plan(model, name_map, n_layers).items()}

    # ---- the three calls of a training loop -----------------------------------------------

    def apply(self, model: nn.Module, backend: str | Backend = "emulated", *,
              name_map: NameMap | None = None, n_layers: int | None = None) -> nn.Module:
        """Convert, in place, the Linear layers the policy runs in FP8; return ``model``.

        Call it before building the optimizer and before wrapping the model (DDP, FSDP,
        ``accelerator.prepare``). Parameters keep their identity and values.

        Args:
            model: The model (the probe ``Llama3``, ``LlamaForCausalLM``, or any model with ``name_map``).
            backend: A backend name (``emulated``; see :func:`precsearch.backends.get_backend`)
                or a :class:`Backend` instance.
            name_map: Model name -> policy name, or None to skip a layer (see :meth:`plan`).
            n_layers: Transformer blocks (see :meth:`plan`).

        Raises:
            PolicyError: No layer of the model matched the policy.
            UnsupportedRecipe: The backend cannot run a precision the policy uses, on this device.
        """
        fp8 = {n: r for n, r in self.plan(model, name_map, n_layers).items() if r.precision.is_fp8}
        chosen = backend if isinstance(backend, Backend) else get_backend(backend, _device_of(model))
        problem = chosen.memory_knob_problem(_layer_knobs(self.policy.memory, model), _device_of(model))
        if problem:
            raise PolicyError(f"the policy's memory settings cannot be applied: {problem}")
        chosen = chosen.for_memory(self.policy.memory)
        chosen.check_supported(fp8, _device_of(model))
        chosen.convert(model, fp8)
        _CONVERTED[model] = chosen
        _warn_unapplied_attention(model, self.policy.memory.fp8_attention)
        return model

    def build_optimizer(self, model: nn.Module, *, lr: float, betas: tuple[float, float] = (0.9, 0.95),
                        weight_decay: float = 0.0) -> torch.optim.Optimizer:
        """The AdamW the policy's memory settings ask for (master weights and their dtype, each
        moment's dtype, FP8 weights).

        Default settings give ``torch.optim.AdamW``; FP8 moments (``fp8``, ``fp8_block``) give
        precsearch's fused :class:`~precsearch.backends.fp8_state_adam.FP8StateAdamW`, as the probe
        trained with, whichever backend converted the layers (or none: a model FP8 runs in through a
        framework's own path), on any device (eager PyTorch off CUDA); others give Transformer Engine's
        ``FusedAdam`` (:func:`precsearch.backends.te_optimizer.build_optimizer`: row-wise FP8 states,
        size-bounded param groups), which needs a CUDA GPU. Call it after :meth:`apply`, with the model
        on its device (the states are made beside the parameters).

        Raises:
            PolicyError: The settings need ``FusedAdam`` and Transformer Engine cannot run here.
        """
        knobs = self.policy.memory
        backend = _backend_of(model)
        device = _device_of(model)
        if knobs.optimizer_knobs.is_default or (backend and not backend.memory_knob_problem(knobs, device)):
            if backend is None:
                return torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
            return backend.build_optimizer(model, knobs, lr=lr, betas=betas, weight_decay=weight_decay)
        from precsearch.backends.fp8_state_adam import for_knobs

        own = for_knobs(model.parameters(), knobs, lr=lr, betas=betas, weight_decay=weight_decay)
        if own is not None:
            return own
        if device.type != "cuda":
            raise PolicyError(f"the policy's optimizer cannot be built: {', '.join(knobs.optimizer_knobs.changed())} "
                              f"need Transformer Engine's FusedAdam, on a CUDA GPU (the model is on {device})")
        te = get_backend("te", device)
        if problem := te.memory_knob_problem(knobs.optimizer_knobs, device):
            raise PolicyError(f"the policy's optimizer cannot be built: {problem}")
        return te.build_optimizer(model, knobs, lr=lr, betas=betas, weight_decay=weight_decay)

    def fp8_enabled(self, step: int) -> bool:
        """Whether FP8 runs at ``step`` (0-based): off for the first ``warmup_steps`` steps."""
        return self.policy.uses_fp8 and step >= self.policy.warmup_steps

    @contextlib.contextmanager
    def autocast(self, model: nn.Module, step: int, *, bf16: bool = True) -> Iterator[None]:
        """Run the enclosed forward with FP8 as the policy wants it at ``step``.

        FP8 is off during the first ``warmup_steps`` steps and on after. The backward of
        a forward run inside the block follows the same choice, so ``loss.backward()``
        may be called after the block ends.

        Args:
            model: The model given to :meth:`apply` (or a wrapper around it: DDP, FSDP, ...).
            step: The 0-based optimizer step.
            bf16: Also enter ``torch.autocast(dtype=torch.bfloat16)``, as the probe that
                validated the policy did. Pass False if the loop manages that itself.
        """
        backend = _backend_of(model)
        if backend is None:
            if self.policy.uses_fp8:
                raise PolicyError("this model was not converted by a policy: call policy.apply(model) first")
            fp8_ctx: contextlib.AbstractContextManager = contextlib.nullcontext()
        else:
            fp8_ctx = backend.autocast(model, enabled=self.fp8_enabled(step))
        device_type = _device_of(model).type
        bf16_ctx = torch.autocast(device_type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with fp8_ctx, bf16_ctx:
            yield

    def clip_gradients(self, model: nn.Module | list[torch.Tensor]) -> torch.Tensor:
        """Clip the global gradient norm to ``clip_grad``; return the norm before clipping.

        With ``clip_grad`` None nothing is changed and the norm is still returned.
        """
        params = model.parameters() if isinstance(model, nn.Module) else model
        max_norm = self.policy.clip_grad if self.policy.clip_grad is not None else math.inf
        return torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)


def _layer_knobs(memory: MemoryKnobs, model: nn.Module) -> MemoryKnobs:
    """The memory settings the layers' backend must apply: all but the optimizer's when precsearch's own
    ``FP8StateAdamW`` keeps them (:meth:`PolicyRuntime.build_optimizer` builds it for any backend)."""
    from precsearch.backends.fp8_state_adam import keeps

    if not keeps(memory, model.parameters()):
        return memory
    return replace(memory, master_weights=False, master_dtype="fp32", moment_dtype="param", exp_avg_dtype=None,
                   exp_avg_sq_dtype=None)


def _warn_unapplied_attention(model: nn.Module, mode: str) -> None:
    """FP8 attention reaches only the probe's TE attention; say so when the model has none."""
    if mode == "off":
        return
    from precsearch.backends.te_stack import TECoreAttention

    if not any(isinstance(m, TECoreAttention) for m in model.modules()):
        warnings.warn(f"fp8_attention={mode}: applied to the probe's Transformer Engine attention only; this "
                      "model's own attention stays in BF16 (set fp8_dpa in its TE recipe, or "
                      "TransformerConfig.fp8_dot_product_attention in Megatron-Core)", stacklevel=3)


def load_policy(path: str | Path) -> PolicyRuntime:
    """Read a policy file written by ``precsearch export`` (see :mod:`precsearch.policy.file`)."""
    from precsearch.policy.file import load_policy_file

    policy, provenance = load_policy_file(Path(path))
    return PolicyRuntime(policy, provenance)


def _mapped_linear_names(model: nn.Module, name_map: NameMap | None) -> dict[str, str]:
    """Model name -> policy name for every ``nn.Linear`` the map keeps, in module order."""
    out = {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or not name:
            continue
        mapped = name_map(name) if name_map is not None else name
        if mapped is not None:
            out[name] = mapped
    return out


def _check_every_rule_decides(rules: tuple[Rule, ...], names: list[str], n_layers: int, *, whole: bool) -> None:
    """A rule that decides no layer converts nothing: the policy was made for another model.

    Blocks past ``n_layers`` and empty block selections are errors. A rule that matches no layer, or
    whose layers all go to earlier rules, is an error for a whole model (``n_layers`` inferred) and a
    warning when ``n_layers`` is given: the model may be one pipeline stage, its other blocks elsewhere.
    """
    for i, rule in enumerate(rules):
        where = f"policy.rules[{i}] ('{rule.name}')"
        past = [b for b in (rule.indices or ()) if b >= n_layers]
        if past:
            raise PolicyError(f"{where} names block {past[0]}, past this model's {n_layers} blocks (0 to "
                              f"{n_layers - 1}): the policy was made for a deeper model")
        if rule.limits_blocks and not (rule.first or rule.last or rule.indices):
            raise PolicyError(f"{where} selects no block (first/last 0 or no indices): it can convert nothing")
    deciding = {id(r) for name in names for r in member_rules(rules, name, n_layers).values() if r is not None}
    for i, rule in enumerate(rules):
        if id(rule) in deciding:
            continue
        message = (f"policy.rules[{i}] ('{rule.name}') decides no layer of this {n_layers}-block model: no Linear "
                   f"matches {', '.join(rule.modules)} in the blocks it selects, or earlier rules take them all")
        if whole:
            raise PolicyError(message + "; the policy was made for another model (pass n_layers if this is a part "
                                        "of a deeper one)")
        warnings.warn(message + " (n_layers was given: the layers it decides may be elsewhere)", stacklevel=4)


def _could_match(rule: Rule, name: str) -> bool:
    """Whether ``name`` is the kind of layer ``rule`` is about: a name pattern matches and, for a
    rule limited to some blocks, the name has a block index (which blocks is not asked, so a
    rule for the last block of a deeper model still counts)."""
    # a rule may name a layer by its unit (decoder.layers.3.mlp.linear_fc1) or its Hugging Face names
    if not rule.names_match(name):
        return False
    return not rule.limits_blocks or block_index(name) is not None


def _device_of(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def _backend_of(model: nn.Module) -> Backend | None:
    """The backend that converted ``model`` or a module inside it (a wrapped model)."""
    if model in _CONVERTED:
        return _CONVERTED[model]
    for module in model.modules():
        if module in _CONVERTED:
            return _CONVERTED[module]
    return None


__all__ = ["PolicyError", "PolicyRuntime", "load_policy"]
