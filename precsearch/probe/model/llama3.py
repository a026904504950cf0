"""The Llama 3 probe model, in Megatron-Core's module layout.

The modules, and so the precision units a policy names
(:mod:`precsearch.arch.units`), are those of Megatron-Core's GPT model on
Transformer Engine, the stack users train Llama 3 on::

    embedding.word_embeddings
    decoder.layers.{i}.self_attention.linear_qkv    RMSNorm fused in, q/k/v in one GEMM
    decoder.layers.{i}.self_attention.core_attention
    decoder.layers.{i}.self_attention.linear_proj
    decoder.layers.{i}.mlp.linear_fc1               RMSNorm fused in, gate/up in one GEMM
    decoder.layers.{i}.mlp.linear_fc2
    decoder.final_layernorm
    output_layer

This file is the plain-PyTorch reference (CPU, emulated FP8, torchao); the
``te`` backend swaps each unit for the Transformer Engine module of the same
name (:mod:`precsearch.backends.te_stack`). Weight layouts are Megatron's:
``linear_qkv`` rows are grouped per KV head (the group's query heads, then its
key, then its value head), ``linear_fc1`` rows are gate then up. Hugging Face
``LlamaForCausalLM`` state dicts convert both ways with
:mod:`precsearch.probe.model.hf_weights`.

RoPE uses the half-split layout (Hugging Face ``rotate_half``, TE's
non-interleaved mode) and the Llama 3.1 frequency scaling.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from precsearch import cpu_bf16
from precsearch.arch.config import PRESETS, ModelConfig, RopeScaling, rope_inv_freq
from precsearch.arch.units import OUTPUT_LAYER
from precsearch.backends.cross_entropy import cross_entropy

#: Std of the normal init of every weight matrix (HF ``initializer_range``).
INIT_STD = 0.02

#: ``f(q, k, angles)`` -> rotated ``(q, k)``; tensors ``(B, T, heads, head_dim)``, angles ``(T, head_dim)``.
RopeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32 (as HF and TE), returned in ``x``'s dtype times ``weight``."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class RMSNorm(nn.Module):
    """Root-mean-square norm, scaled by ``weight``."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension."""
        return rms_norm(x, self.weight, self.eps)


class Linear(nn.Linear):
    """``nn.Linear`` without bias; on a CPU without BF16 dot products its BF16 GEMMs run in float32
    (:func:`precsearch.cpu_bf16.linear`)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T``."""
        return cpu_bf16.linear(x, self.weight)


class NormLinear(Linear):
    """A Linear whose input is RMS-normalised first (TE ``LayerNormLinear`` with RMSNorm, no bias).

    It is an ``nn.Linear`` (``weight`` is the GEMM's) with one more Parameter,
    ``layer_norm_weight``; a backend that converts the GEMM keeps the norm
    (:meth:`precsearch.backends.base.WrappedLinear.norm_input`).
    """

    def __init__(self, in_features: int, out_features: int, eps: float):
        super().__init__(in_features, out_features)
        self.eps = eps
        self.layer_norm_weight = nn.Parameter(torch.ones(in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``rms_norm(x) @ weight.T``."""
        return cpu_bf16.linear(rms_norm(x, self.layer_norm_weight, self.eps), self.weight)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dimension (half-split RoPE)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor, angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q`` and ``k`` ``(B, T, heads, head_dim)`` by the position ``angles`` ``(T, head_dim)``."""
    cos, sin = angles.cos()[:, None, :].to(q.dtype), angles.sin()[:, None, :].to(q.dtype)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class CoreAttention(nn.Module):
    """Causal grouped-query attention on ``(B, T, heads, head_dim)`` tensors; returns ``(B, T, dim)``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gqa = cfg.n_kv_heads != cfg.n_heads

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Softmax attention; each KV head serves consecutive query heads (as HF ``repeat_kv``)."""
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.gqa)
        return out.transpose(1, 2).flatten(2)


def split_qkv(qkv: torch.Tensor, cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron's grouped ``linear_qkv`` output ``(B, T, qkv)`` -> q, k, v ``(B, T, heads, head_dim)``."""
    groups, per_group, hd = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
    grouped = qkv.view(*qkv.shape[:2], groups, (per_group + 2) * hd)
    q, k, v = grouped.split([per_group * hd, hd, hd], dim=-1)
    return q.reshape(*qkv.shape[:2], cfg.n_heads, hd), k, v


class SelfAttention(nn.Module):
    """Norm + fused QKV, RoPE, core attention, output projection (Megatron ``SelfAttention``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        qkv_dim = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
        self.linear_qkv = NormLinear(cfg.dim, qkv_dim, cfg.norm_eps)
        self.core_attention = CoreAttention(cfg)
        self.linear_proj = Linear(cfg.dim, cfg.dim)
        self.rope: RopeFn = apply_rope  # a backend may put a fused kernel here
        self.observe_qk = None  # no observer (the property below)
        #: Tensor parallelism's collectives around the units (:mod:`precsearch.probe.parallel.tensor_parallel`).
        self.tp_in: Callable[[torch.Tensor], torch.Tensor] = _identity
        self.tp_out: Callable[[torch.Tensor], torch.Tensor] = _identity

    @property
    def observe_qk(self) -> Callable[[torch.Tensor, torch.Tensor], None] | None:
        """Called with (q, k) after RoPE when set (the early-warning signals read attention logits)."""
        return self._observe_qk

    @observe_qk.setter
    def observe_qk(self, observe: Callable[[torch.Tensor, torch.Tensor], None] | None) -> None:
        self._observe_qk = observe
        # what forward tests: a compiled block is specialised on a bool's value, where dynamo (torch 2.13) kept
        # running the code compiled with an observer after the slot was set back to None
        self.observing = observe is not None

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        """Self-attention over ``x`` ``(B, T, dim)`` (not normalised: ``linear_qkv`` does it)."""
        q, k, v = split_qkv(self.linear_qkv(self.tp_in(x)), self.cfg)
        q, k = self.rope(q, k, angles)
        if self.observing:
            self.observe_qk(q, k)
        return self.tp_out(self.linear_proj(self.core_attention(q, k, v)))


class MLP(nn.Module):
    """Norm + fused gate/up, SwiGLU, down projection (Megatron ``MLP`` with ``gated_linear_unit``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.linear_fc1 = NormLinear(cfg.dim, 2 * cfg.ffn_dim, cfg.norm_eps)
        self.linear_fc2 = Linear(cfg.ffn_dim, cfg.dim)
        self.tp_in: Callable[[torch.Tensor], torch.Tensor] = _identity  # as in SelfAttention
        self.tp_out: Callable[[torch.Tensor], torch.Tensor] = _identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``fc2(silu(gate) * up)`` with ``[gate, up] = fc1(norm(x))``."""
        gate, up = self.linear_fc1(self.tp_in(x)).chunk(2, dim=-1)
        return self.tp_out(self.linear_fc2(F.silu(gate) * up))


class TransformerLayer(nn.Module):
    """One pre-norm block: residual attention, then residual MLP (norms fused into the units)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attention = SelfAttention(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        """``x + attn(x)``, then ``+ mlp(.)``."""
        x = x + self.self_attention(x, angles)
        return x + self.mlp(x)


class Decoder(nn.Module):
    """The blocks and the final norm (Megatron ``TransformerBlock``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.n_layers))
        self.final_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, angles)
        return self.final_layernorm(x)


class CompiledForward:
    """A module's forward compiled (``torch.compile(forward, **compile_kwargs)``) for passes that record gradients,
    and the eager ``forward`` for passes that do not."""

    def __init__(self, forward: Callable[..., torch.Tensor], **compile_kwargs) -> None:
        self.eager = forward
        self.compiled = torch.compile(forward, **compile_kwargs)

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        return (self.compiled if torch.is_grad_enabled() else self.eager)(*args, **kwargs)


class Embedding(nn.Module):
    """Token embeddings (Megatron ``LanguageModelEmbedding``, no position embedding)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.word_embeddings(input_ids)


class RotaryEmbedding(nn.Module):
    """Holds the inverse frequencies; gives the float32 angles ``(T, head_dim)`` of positions ``0..T-1``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        # Non-persistent: derived from the config, not part of the state dict.
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def reset_inv_freq(self) -> None:
        """Recompute ``inv_freq`` in float32 (after ``to_empty`` or a dtype cast of the model)."""
        self.inv_freq = rope_inv_freq(self.cfg).to(self.inv_freq.device)

    def forward(self, seq_len: int) -> torch.Tensor:
        positions = torch.arange(seq_len, device=self.inv_freq.device, dtype=torch.float32)
        # Elementwise product (not matmul) so autocast cannot lower it to bf16.
        freqs = positions[:, None] * self.inv_freq.float()[None, :]
        return torch.cat((freqs, freqs), dim=-1)


class Llama3(nn.Module):
    """Llama 3 causal LM in Megatron-Core's layout, with an untied ``output_layer``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embedding = Embedding(cfg)
        self.rotary_pos_emb = RotaryEmbedding(cfg)
        self.decoder = Decoder(cfg)
        self.output_layer = Linear(cfg.dim, cfg.vocab_size)
        #: Set by :func:`precsearch.probe.parallel.tensor_parallel.split_model` when the blocks are split over ranks.
        self.tensor_parallel = None

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``(B, T, vocab)``, or the mean cross-entropy (float32) when ``targets`` is given.

        Args:
            input_ids: token ids ``(B, T)``, ``T <= cfg.max_seq_len``.
            targets: next-token ids ``(B, T)``; ``-100`` entries are ignored.
        """
        if input_ids.shape[1] > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {input_ids.shape[1]} > max_seq_len {self.cfg.max_seq_len}")
        tp = self.tensor_parallel
        if tp is not None:  # the vocabulary split over ranks, as Megatron-Core (precsearch.probe.parallel.tensor_parallel)
            return self._forward_split(input_ids, targets, tp)
        hidden = self.decoder(self.embedding(input_ids), self.rotary_pos_emb(input_ids.shape[1]))
        logits = self.output_layer(hidden)
        if targets is None:
            return logits
        # float32 log-softmax (bf16 CE is too coarse to compare precision policies), with one float32 copy
        # of the logits, as Megatron-Core's loss (F.cross_entropy held three: 3 GiB more at the 8B shape)
        return cross_entropy(logits, targets)

    def compile_blocks(self, **compile_kwargs) -> None:
        """Compile each transformer block's forward in place (``compile_kwargs`` to ``torch.compile``), as torchtitan
        compiles its blocks: names, Parameters and state dicts stay the eager model's.

        Only the training pass runs compiled (:class:`CompiledForward`): the block's hooks (the probe's signals)
        run around it, eager, and a pass without gradients (evaluation, held-out losses) runs the eager forward.
        Each would otherwise be another compile of every block variant, and none of them is timed.
        """
        for layer in self.decoder.layers:
            if not isinstance(layer.forward, CompiledForward):
                layer.forward = CompiledForward(layer.forward, **compile_kwargs)

    def _forward_split(self, input_ids: torch.Tensor, targets: torch.Tensor | None, tp) -> torch.Tensor:
        """:meth:`forward` with the embedding, output layer and loss split over the vocabulary."""
        embedded = tp.embed(self.embedding.word_embeddings.weight, input_ids)
        hidden = self.decoder(embedded, self.rotary_pos_emb(input_ids.shape[1]))
        logits = self.output_layer(tp.column_in(hidden))  # this rank's vocabulary columns
        return tp.gather_vocab(logits) if targets is None else tp.cross_entropy(logits, targets)


def init_plan(model: Llama3) -> list[tuple[torch.Tensor, str]]:
    """What :func:`init_weights` sets, in its order: ``(parameter, "normal" | "ones")`` of the plain model.

    Taken before a backend converts the model, the list still names the same Parameters after (a
    converted layer keeps its Parameter objects), so the model can be initialised again in place
    (:mod:`precsearch.probe.model.reuse`).
    """
    plan: list[tuple[torch.Tensor, str]] = []
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            plan.append((module.weight, "normal"))
        if isinstance(module, NormLinear):
            plan.append((module.layer_norm_weight, "ones"))
        elif isinstance(module, RMSNorm):
            plan.append((module.weight, "ones"))
    return plan


def apply_init(plan: list[tuple[torch.Tensor, str]], seed: int, device: torch.device) -> None:
    """Set each tensor of ``plan`` as :func:`init_weights` does, drawing from one generator seeded ``seed``.

    A tensor not in float32 (``probe.param_dtype: bf16``) gets the float32 draw rounded to its dtype,
    what building in float32 and casting the model gives.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for tensor, how in plan:
            if how == "ones":
                tensor.fill_(1.0)
            elif tensor.dtype == torch.float32:
                tensor.normal_(0.0, INIT_STD, generator=gen)
            else:
                draw = torch.empty(tensor.shape, dtype=torch.float32, device=tensor.device)
                tensor.copy_(draw.normal_(0.0, INIT_STD, generator=gen))


def init_weights(model: Llama3, seed: int) -> None:
    """Deterministic init: weight matrices and embeddings ~ N(0, 0.02), norm weights = 1.

    Draws in module order from one generator on the model's device, so two
    models built with the same seed on the same device are identical.
    """
    apply_init(init_plan(model), seed, next(model.parameters()).device)
    model.rotary_pos_emb.reset_inv_freq()


def build_model(cfg: ModelConfig, seed: int, device: torch.device | str = "cpu") -> Llama3:
    """Build :class:`Llama3` on ``device`` and initialise it with :func:`init_weights`."""
    with torch.device(device):
        model = Llama3(cfg)
    init_weights(model, seed)
    return model


__all__ = [
    "OUTPUT_LAYER",
    "PRESETS",
    "Llama3",
    "ModelConfig",
    "RopeScaling",
    "apply_init",
    "build_model",
    "init_plan",
    "init_weights",
    "rope_inv_freq",
]
