"""Collects the early-warning signals (:mod:`precsearch.probe.measure.signals`) while a probe trains.

The training loop owns the step; the recorder only keeps values. On a *stat step* (every ``every`` steps and
the last one, like the FP8 diagnostics) the model side hands it block outputs, fused gate/up weights and
attention queries/keys; each is reduced on the device to a 0-d tensor and kept there, and all of a step's
values reach the host together in :meth:`SignalRecorder.end_step` (one sync per stat step). Grad norms
are taken every step. Nothing is computed off a stat step, so the cost is a few reductions per block
every ``every`` steps.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import Tensor, nn

from precsearch.probe.measure.attention_logit import max_attention_logit
from precsearch.probe.measure.signals import History, Signals, gate_up_alignment, summarise, token_kurtosis

_BLOCK = re.compile(r"(?:^|\.)layers\.(\d+)$")
_FC1 = re.compile(r"(?:^|\.)layers\.(\d+)\.mlp(?:\.linear_fc1\.weight|\.fc1_weight)$")


class SignalRecorder:
    """Per-step signal values of one probe run.

    Args:
        steps: The probe's length (its last step is always a stat step).
        every: Stat steps are ``0, every, 2 * every, ...`` and ``steps - 1``.
        max_tokens: Tokens per block output used for the kurtosis (strided sample).
        attention_batch: Sequences per attention layer used for the max logit.
        tail: Share of the run (last part) that trends are fitted over.
    """

    def __init__(self, steps: int, every: int = 10, *, max_tokens: int = 4096, attention_batch: int = 1,
                 tail: float = 0.5) -> None:
        if steps < 1 or every < 1 or not 0 < tail <= 1:
            raise ValueError(f"need steps >= 1, every >= 1, 0 < tail <= 1; got {steps}, {every}, {tail}")
        self.steps, self.every, self.tail = steps, every, tail
        self.max_tokens, self.attention_batch = max_tokens, attention_batch
        self.history: History = {}
        self.step = -1
        self.active = False
        self._pending: list[tuple[str, str, Tensor]] = []

    def is_stat_step(self, step: int) -> bool:
        """True when ``step`` collects signals."""
        return step % self.every == 0 or step == self.steps - 1

    def begin_step(self, step: int) -> bool:
        """Start ``step``; returns (and sets :attr:`active` to) whether it is a stat step."""
        self.step, self.active = step, self.is_stat_step(step)
        return self.active

    def record_block_output(self, block: int, x: Tensor) -> None:
        """Kurtosis and amax of decoder block ``block``'s output (channels last)."""
        self._check_active()
        self._keep("kurtosis", str(block), token_kurtosis(x, self.max_tokens))
        self._keep("amax", f"block.{block}.output", x.detach().abs().amax().float())

    def record_fc1_weight(self, block: int, weight: Tensor) -> None:
        """Gate/up alignment of block ``block``'s fused ``(2 * ffn, dim)`` SwiGLU weight."""
        self._check_active()
        mean, most = gate_up_alignment(weight)
        self._keep("alignment", str(block), mean)
        self._keep("alignment_max", str(block), most)

    def record_attention(self, block: int, q: Tensor, k: Tensor, scale: float) -> None:
        """Max causal logit of block ``block``'s attention: ``q (B, H, T, D)``, ``k (B, Hkv, T, D)``."""
        self._check_active()
        self._keep("attention_logit", str(block), max_attention_logit(q, k, scale, max_batch=self.attention_batch))

    def record_amax(self, name: str, amax: Tensor | float) -> None:
        """Any other tensor's amax on a stat step (e.g. a Linear input in a BF16 reference)."""
        self._check_active()
        self._keep("amax", name, amax)

    def record_grad_norm(self, value: Tensor | float) -> None:
        """This step's global grad norm (before clipping); every step, stat step or not."""
        self._keep("grad_norm", "model", value)

    def add_layer_stats(self, rows: list[dict[str, Any]]) -> None:
        """FP8 operand amaxes from :attr:`ProbeResult.layer_stats` rows, as tensors ``layer:role``.

        Kept apart from the block-output amaxes (``fp8_amax``): a BF16 reference has none to compare with.
        """
        for row in rows:
            self._put("fp8_amax", f"{row['layer']}:{row['role']}", int(row["step"]), float(row["amax"]))

    def record_fc1_weights(self, model: nn.Module) -> None:
        """:meth:`record_fc1_weight` for every block's fused gate/up weight.

        The probe's blocks (``model.decoder.layers``) are read by module, whatever a backend made of
        ``linear_fc1`` (a converted layer, or TE's fused ``LayerNormMLP``); any other model by
        parameter name (``...layers.N.mlp.linear_fc1.weight`` / ``...mlp.fc1_weight``).
        """
        layers = getattr(getattr(model, "decoder", None), "layers", None)
        if layers is None:
            for name, weight in model.named_parameters():
                if match := _FC1.search(name):
                    self.record_fc1_weight(int(match.group(1)), weight)
            return
        for block, layer in enumerate(layers):
            fc1 = getattr(layer.mlp, "linear_fc1", None) or getattr(layer.mlp, "layernorm_mlp", None)
            weight = fc1.weight if fc1 is not None else getattr(layer.mlp, "fc1_weight", None)
            if weight is not None:
                self.record_fc1_weight(block, weight)

    def attach(self, model: nn.Module, *, compiled: bool = False) -> Any:
        """Hooks that feed this recorder from the probe on stat steps; returns a function removing them.

        Block outputs through :meth:`watch_blocks`; queries and keys after RoPE through each
        attention module's ``observe_qk`` slot (:class:`precsearch.probe.model.llama3.SelfAttention`).
        With ``compiled`` (the blocks' forwards are compiled: ``Llama3.compile_blocks``) the observers run eager,
        a break in the block's graph: traced, their own values (the block's index, :attr:`active`) would make
        dynamo compile the block again for each block and each kind of step.
        """
        handles = self.watch_blocks(model)
        attentions = [(i, layer.self_attention) for i, layer in
                      enumerate(getattr(getattr(model, "decoder", None), "layers", []))]
        for block, attention in attentions:
            observe = self._qk_observer(block, attention.cfg.head_dim ** -0.5)
            attention.observe_qk = torch.compiler.disable(observe) if compiled else observe

        def detach() -> None:
            for handle in handles:
                handle.remove()
            for _, attention in attentions:
                attention.observe_qk = None
        return detach

    def _qk_observer(self, block: int, scale: float) -> Any:
        def observe(q: Tensor, k: Tensor) -> None:  # (B, T, heads, head_dim) as the probe holds them
            if self.active and torch.is_grad_enabled():
                with torch.no_grad():
                    self.record_attention(block, q.transpose(1, 2), k.transpose(1, 2), scale)
        return observe

    def watch_blocks(self, model: nn.Module) -> list[Any]:
        """Forward hooks on ``...layers.N`` modules that record their outputs on stat steps; returns the handles.

        A tuple output (Megatron's ``(hidden, context)``) is read at index 0. The hooks run eager around a block
        whose forward is compiled (``Llama3.compile_blocks``); not for a ``torch.compile`` wrapper of the module
        itself (its hooks are traced into its graph): call :meth:`record_block_output` instead.
        """
        handles = []
        for name, module in model.named_modules():
            match = _BLOCK.search(name)
            if match:
                handles.append(module.register_forward_hook(self._block_hook(int(match.group(1)))))
        return handles

    def _block_hook(self, block: int) -> Any:
        def hook(_module: nn.Module, _args: tuple, output: Any) -> None:
            if self.active and torch.is_grad_enabled():  # training forward only, not evaluation
                self.record_block_output(block, output[0] if isinstance(output, tuple) else output)
        return hook

    def end_step(self) -> None:
        """Bring this step's values to the host (one sync), then go inactive."""
        if self._pending:
            values = torch.stack([t.to(self._pending[0][2].device) for _, _, t in self._pending]).tolist()
            for (kind, item, _), value in zip(self._pending, values):
                self._put(kind, item, self.step, value)
            self._pending.clear()
        self.active = False

    def signals(self) -> Signals:
        """The run's :class:`Signals` so far (flushes a step left open)."""
        self.end_step()
        return summarise(self.history, self.tail)

    def _keep(self, kind: str, item: str, value: Tensor | float) -> None:
        if isinstance(value, Tensor):
            self._pending.append((kind, item, value.detach().float().reshape(())))
        else:
            self._put(kind, item, self.step, float(value))

    def _put(self, kind: str, item: str, step: int, value: float) -> None:
        self.history.setdefault(kind, {}).setdefault(item, {})[step] = value if math.isfinite(value) else math.nan

    def _check_active(self) -> None:
        if not self.active:
            raise RuntimeError(f"step {self.step} is not a stat step: call begin_step and check its result first")
