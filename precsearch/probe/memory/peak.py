"""A model of peak training memory, for where it cannot be measured (CPU) or
for shapes that were not run (the full-depth target).

It counts the bytes alive in one training step of the probe's own set-up
(parameters in fp32 or BF16, ``torch.autocast`` to BF16, FP8 Linears as
Transformer Engine runs them, AdamW) at the two moments that can hold the peak:

* **backward**: the start of the backward pass, when the cross-entropy's
  backward runs. Alive: the parameters and optimizer state (gradients were
  freed by ``zero_grad(set_to_none=True)``), every tensor the forward saved for
  the backward, the low-precision weight copies, and the loss's float32 softmax
  with the BF16 gradient it becomes (:data:`~precsearch.backends.cross_entropy.LOGIT_BYTES`);
* **optimizer step**: parameters, gradients and optimizer state. On the GPU
  the probe steps with a fused Adam (``torch.optim.AdamW(fused=True)``, or TE
  ``FusedAdam`` for the memory knobs), which allocates no temporaries for FP32
  or BF16 states; TE's scaled states (FP8 or FP16 moments, FP16 masters) get
  FP32 copies for up to two param groups, counted as ``step_transient`` (FP8 moments
  the ``te`` backend steps itself, :mod:`precsearch.backends.fp8_state_adam`, get none); the
  foreach path the CPU uses would add ``sqrt(exp_avg_sq)`` for every parameter,
  which this model does not count (CPU peaks are predicted, never measured).

With gradient accumulation (``probe.grad_accum`` above 1) the activations stay one micro-batch's,
but the backward of every micro-batch after the first starts with the gradients of the ones
before it alive: the backward moment then counts the gradients too (``accumulated_grads``).

The peak is the larger of the two. What a step keeps:

* parameters at 4 (fp32) or 2 (BF16) bytes; a layer under ``fp8_weights``
  stores FP8 data and its transpose (2 bytes) instead; gradients in the
  parameters' dtype; AdamW moments in :meth:`MemoryKnobs.moments`' dtype;
  FP32 master weights (4 bytes) when the knobs ask for them;
* weight copies saved for the backward: with fp32 parameters, autocast's BF16
  cast of each BF16 Linear's weight (2 bytes/param; none with BF16
  parameters); for an FP8 Linear, the FP8 weight and its transpose (2 bytes/param,
  both layouts are needed by Hopper's FP8 GEMMs), none under ``fp8_weights``;
* unit inputs saved for the backward: each precision unit is one GEMM
  (q/k/v fused in ``linear_qkv``, gate/up in ``linear_fc1``) and saves its
  input once: a BF16 copy (with fp32 parameters, autocast's cast), or its
  quantized copy when FP8 (1 byte/element, plus block scales for the block
  recipes). ``linear_proj`` reads the attention output, which attention saves
  anyway;
* the rest of each block: each RMSNorm saves its fp32 input and its
  normalised output (in the residual stream's dtype), attention saves q and k
  (after RoPE), the fused q/k/v output (v is a view of it), its output and an
  fp32 log-sum-exp per head, SwiGLU saves the fc1 output (gate and up) and
  silu(gate) (BF16), RoPE a BF16 cos/sin pair per block; FP8 does not change these.

FP8 Linears other than Transformer Engine's keep other tensors: :data:`FP8_LINEARS` names each
implementation the model knows (``fp8_linear`` of :func:`predict_peak`).

On the CPU, :func:`activation_bytes` equals what autograd saves for the probe's
plain-PyTorch layers (``tests/probe/memory/test_memory.py``). Transformer Engine's
fused modules save less (its fused RMSNorm and RoPE keep fewer tensors), so on
the GPU this model over-predicts by a per-layer amount: at the Llama-3-8B shape
(seq 4096, micro-batch 1, BF16 parameters, TE 2.20.2 on an H200) 76.70 GiB
predicted against 67.89 GiB measured for BF16, +7% to +13% over the other
policies but FP8 weight storage (−9%). Figures from this module are labelled "predicted";
:mod:`precsearch.probe.memory.calibration` corrects them from GPU measurements (the
residual is linear in depth: calibrated on 2- and 4-block probes, the full
32-block peaks came within 1.93%, ``2026-11-30_h200_bench_memory.log@2d4ed84``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from precsearch.backends.cross_entropy import LOGIT_BYTES
from precsearch.backends.fp8_state_adam import QBLOCK, applies
from precsearch.policy.rules import MemoryKnobs
from precsearch.precision import Precision
from precsearch.storage import BF16, BLOCK_FP8, FP32, TENSOR_FP8
from precsearch.recipes import DEFAULT_PRECISION, HOPPER, RECIPES, recipe_for
from precsearch.arch.config import ModelConfig
from precsearch.probe.memory.compiled import compiled_activation_bytes
from precsearch.arch.units import BLOCK_UNITS, NORMED_UNITS, OUTPUT_LAYER, unit_names, unit_shape

_FP32, _BF16 = 4, 2

#: Bytes per element of a saved activation (a Linear's input), scales included (:mod:`precsearch.precision_spec`).
ELEMENT_BYTES: dict[Precision, float] = {p: r.spec.activation_bytes for p, r in RECIPES.items()}
#: Bytes per element of one layout of a low-precision weight, scales included (block: 128x128 blocks;
#: NVFP4: TE's default 16x16 tiles, an E4M3 scale per 256 weights; with 1x16 blocks it is 0.5 + 1/16).
#: The per-tensor FP32 scales of NVFP4 (4 bytes per tensor) are left out.
WEIGHT_BYTES: dict[Precision, float] = {p: r.spec.weight_bytes for p, r in RECIPES.items()}

#: Block units whose input attention saves anyway (its output): the unit adds no BF16 copy of it.
_SAVED_BY_ATTENTION = ("self_attention.linear_proj",)


def _unit_inputs() -> list[tuple[str, bool, bool]]:
    """The units of one block: (suffix, does its input arrive in BF16, is it saved anyway).

    A normed unit (:data:`~precsearch.arch.units.NORMED_UNITS`) reads the normalised residual stream,
    in the stream's dtype (fp32 with fp32 parameters); the others read a BF16 activation (the attention
    output, which attention saves; ``silu(gate) * up``, saved only by ``linear_fc2``).
    """
    return [(suffix, suffix not in NORMED_UNITS, suffix in _SAVED_BY_ATTENTION) for suffix in BLOCK_UNITS]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Predicted bytes by component; ``total`` is the predicted peak.

    Attributes:
        params: Stored parameters (fp32, BF16, or FP8 under ``fp8_weights``).
        grads: Gradients (alive at the optimizer step, not at the start of the backward).
        optimizer: AdamW moments plus FP32 master weights.
        weight_copies: Low-precision weight copies saved for the backward.
        linear_inputs: Linear inputs saved for the backward, BF16 or quantized.
        other_activations: Norm, attention and SwiGLU tensors saved for the backward.
        logits: The cross-entropy's logit-sized tensors at its backward.
        master: The master-weight part of ``optimizer`` (FP32, FP16, or 16-bit remainders).
        step_transient: FP32 copies TE ``FusedAdam`` makes of scaled states (FP8 or FP16
            moments, FP16 master weights, a BF16 moment beside a non-BF16 one) for one
            param group during the step (:mod:`precsearch.backends.te_optimizer`); none where
            FP8 moments are stepped by :mod:`precsearch.backends.fp8_state_adam`.
        accumulated_grads: Gradients alive when a later micro-batch's backward starts (gradient
            accumulation; 0 without it).
        head_transient: What TE holds beyond the rest while an FP8 output layer runs its forward
            (:data:`FP8_HEAD_TRANSIENT_BYTES`; 0 for a BF16 head).
    """

    params: int
    grads: int
    optimizer: int
    weight_copies: int
    linear_inputs: int
    other_activations: int
    logits: int
    master: int = 0
    step_transient: int = 0
    accumulated_grads: int = 0
    head_transient: int = 0

    @property
    def forward_peak(self) -> int:
        """Bytes alive while an FP8 output layer runs its forward (the blocks' activations saved, no logits yet)."""
        return (self.params + self.optimizer + self.weight_copies + self.linear_inputs + self.other_activations
                + self.accumulated_grads + self.head_transient)

    @property
    def backward_peak(self) -> int:
        """Bytes alive when the backward starts."""
        return (self.params + self.optimizer + self.weight_copies + self.linear_inputs
                + self.other_activations + self.logits + self.accumulated_grads)

    @property
    def step_peak(self) -> int:
        """Bytes alive during the optimizer step."""
        return self.params + self.grads + self.optimizer + self.step_transient

    @property
    def total(self) -> int:
        """The predicted peak: the largest of the backward-phase, optimizer-step and FP8-head forward peaks
        (bytes; the last exceeds the backward's only with an FP8 output layer)."""
        return max(self.backward_peak, self.step_peak, self.forward_peak)

    def to_dict(self) -> dict[str, int]:
        """Every field plus the derived ``forward_peak``, ``backward_peak``, ``step_peak`` and ``total`` (bytes)."""
        return asdict(self) | {"forward_peak": self.forward_peak, "backward_peak": self.backward_peak,
                               "step_peak": self.step_peak, "total": self.total}

    def components(self) -> dict[str, int]:
        """The training state and activations by kind, as a memory breakdown shows them (bytes)."""
        return {"weights": self.params, "fp8_weight_copies": self.weight_copies, "master_weights": self.master,
                "moments": self.optimizer - self.master, "gradients": self.grads,
                "activations": self.linear_inputs + self.other_activations, "logits": self.logits,
                "step_transient": self.step_transient, "fp8_head_transient": self.head_transient}


def linear_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) for each precision unit suffix of one block."""
    return {suffix: unit_shape(cfg, suffix) for suffix in BLOCK_UNITS}


def _layers(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    return {name: unit_shape(cfg, name) for name in unit_names(cfg)}


def predict_peak(
    cfg: ModelConfig, precisions: dict[str, Precision], *, seq_len: int, micro_batch: int,
    param_dtype: str = "fp32", memory: MemoryKnobs | None = None, state_group_elements: int | None = None,
    grad_accum: int = 1, fp8_linear: str = "te", fused_adam_fp8: bool = False, compiled_blocks: bool = False,
) -> MemoryBreakdown:
    """Predicted peak bytes of one training step; layers missing from ``precisions`` are BF16.

    ``state_group_elements``: the largest optimizer param group (default: the largest
    parameter, as :func:`precsearch.backends.te_optimizer.build_optimizer` splits them;
    ``num_params()`` for one group). Two groups' FP32 copies are alive at once: FusedAdam's
    ``tensor_lists`` still holds the previous group's until the next group's kernel
    (measured at the 8B width: 7.5 GiB with groups of 525M elements, two FP8 moments).
    ``grad_accum``: micro-batches per step; above 1 the gradients are alive at a backward's start.
    ``fp8_linear``: which FP8 Linear runs the FP8 units (:data:`FP8_LINEARS`).
    ``fused_adam_fp8``: FP8 moments step in TE ``FusedAdam`` (its FP32 copies) rather than in the ``te``
    backend's own :class:`~precsearch.backends.fp8_state_adam.FP8StateAdamW` (none).
    ``compiled_blocks``: each block runs under ``torch.compile`` (torchtitan's per-block compile): its saved
    activations are :func:`~precsearch.probe.memory.compiled.compiled_activation_bytes` (FP32 or BF16
    parameters, torchao's FP8 Linear only).
    """
    if fp8_linear not in FP8_LINEARS:
        raise ValueError(f"fp8_linear={fp8_linear!r}: expected one of {', '.join(FP8_LINEARS)}")
    memory = memory or MemoryKnobs()
    tokens = seq_len * micro_batch
    n_params = cfg.num_params()
    width = _FP32 if param_dtype == "fp32" else _BF16
    copies = fp8_stored = stored_bytes = 0.0
    for w in unit_weight_bytes(cfg, precisions, param_dtype, memory, fp8_linear).values():
        copies += w.copies
        if w.fp8_stored:
            fp8_stored, stored_bytes = fp8_stored + w.elements, stored_bytes + w.stored
    moments = memory.moment_dtypes(param_dtype)
    master = MASTER_BYTES[memory.master] if width != _FP32 or memory.fp8_weights else 0
    group = state_group_elements or max_param_elements(cfg)
    if compiled_blocks:
        inputs, other = compiled_activation_bytes(cfg, precisions, seq_len=seq_len, micro_batch=micro_batch,
                                                  param_dtype=param_dtype, fp8_linear=fp8_linear)
    else:
        inputs = int(tokens * saved_linear_input_bytes(cfg, _as_saved(precisions, fp8_linear), param_dtype))
        other = (other_activation_bytes(cfg, seq_len=seq_len, micro_batch=micro_batch, param_dtype=param_dtype)
                 - fp8_attention_saving(cfg, precisions, memory, tokens))
    return MemoryBreakdown(
        params=int((n_params - fp8_stored) * width + stored_bytes),
        grads=n_params * width,
        optimizer=int(n_params * (sum(STATE_BYTES[m] for m in moments) + master)),
        weight_copies=int(copies),
        linear_inputs=inputs,
        other_activations=other,
        logits=tokens * cfg.vocab_size * LOGIT_BYTES,
        master=int(n_params * master),
        step_transient=_FP32 * min(n_params, 2 * group) * scaled_states(memory, param_dtype, fused_adam_fp8),
        accumulated_grads=n_params * width if grad_accum > 1 else 0,
        head_transient=head_transient_bytes(cfg, precisions, fp8_linear),
    )


#: Bytes per output-layer weight element that an FP8 output layer holds beyond the model's other terms while
#: its forward runs, by recipe (each recipe's ``head_transient_bytes``): measured on the H200 (TE 2.20.2,
#: 2026-12-04, ``fp8_head_memory.py@0dd7e53``: the probe at the 8B width, 2 and 4 blocks, seq 2048 and 4096)
#: as the peak less the forward's other terms, the same within +-3% at every depth and length (so per weight
#: element, not per logit); 7.4-7.8 GiB more than a BF16 head at vocabulary 128,256, where the FP8 weight
#: copies account for 1 GiB. What TE allocates there was not identified. MXFP8 and NVFP4 heads were not
#: measured (no Blackwell GPU) and get none, as does a recipe TE does not run.
FP8_HEAD_TRANSIENT_BYTES: dict[Precision, float] = {p: r.head_transient_bytes for p, r in RECIPES.items()
                                                    if r.head_transient_bytes}


def head_transient_bytes(cfg: ModelConfig, precisions: dict[str, Precision], fp8_linear: str = "te") -> int:
    """Bytes of :data:`FP8_HEAD_TRANSIENT_BYTES` for this model's output layer (0 unless TE runs it in FP8)."""
    if fp8_linear != "te":
        return 0
    per_element = recipe_for(precisions.get(OUTPUT_LAYER, DEFAULT_PRECISION)).head_transient_bytes
    return int(per_element * cfg.vocab_size * cfg.dim)


@dataclass(frozen=True)
class UnitWeight:
    """One unit's weight: its elements, FP8 storage under ``fp8_weights`` and the copies saved for the backward.

    Attributes:
        elements: Weight elements (``fan_in * fan_out``).
        fp8_stored: Stored in FP8 (``fp8_weights`` on an FP8 unit); ``stored`` bytes then replace the parameter.
        stored: Bytes of the FP8-stored weight (data + transpose), 0 when not ``fp8_stored``.
        copies: Bytes of the low-precision copies saved for the backward (FP8 data + transpose, or
            autocast's BF16 cast of an fp32 weight).
    """

    elements: int
    fp8_stored: bool
    stored: float
    copies: float


def unit_weight_bytes(cfg: ModelConfig, precisions: dict[str, Precision], param_dtype: str,
                      memory: MemoryKnobs, fp8_linear: str = "te") -> dict[str, UnitWeight]:
    """Unit name -> :class:`UnitWeight` for every precision unit of ``cfg`` (missing from ``precisions``: BF16)."""
    out: dict[str, UnitWeight] = {}
    for name, (fan_in, fan_out) in _layers(cfg).items():
        p = precisions.get(name, DEFAULT_PRECISION)
        n = fan_in * fan_out
        weight = 2 * WEIGHT_BYTES[p]  # FP8 data + its transpose
        if p.is_fp8 and fp8_linear == "torchao":  # the parameter itself is saved, cast to FP8 per GEMM
            out[name] = UnitWeight(n, False, 0.0, 0.0)
        elif p.is_fp8 and memory.fp8_weights:
            out[name] = UnitWeight(n, True, n * weight, 0.0)
        elif p.is_fp8:
            out[name] = UnitWeight(n, False, 0.0, n * weight)
        else:
            out[name] = UnitWeight(n, False, 0.0, n * _BF16 if param_dtype == "fp32" else 0.0)  # autocast's cast
    return out


#: Bytes per element of an AdamW moment; FP8 is one layout with a per-tensor scale
#: (``te_optimizer.compact_fp8_states``; FusedAdam alone would also keep a transpose: 2 bytes), ``fp8_block``
#: one FP32 scale per 128 elements beside it (``backends.fp8_state_adam``).
STATE_BYTES: dict[str, float] = {FP32: 4, BF16: 2, TENSOR_FP8: 1, BLOCK_FP8: 1 + 4 / QBLOCK}
#: Bytes per parameter of the master weights: whole FP32, FP16, or the 16 low bits of FP32.
MASTER_BYTES: dict[str, int] = {"none": 0, "fp32": 4, "fp16": 2, "remainders": 2}

#: What an FP8 Linear keeps for its backward, by implementation:
#:
#: * ``te``: Transformer Engine (and the emulated backend, which models it) saves its input quantized to FP8
#:   and the FP8 weight with its transpose;
#: * ``torchao``: torchao's ``Float8Linear`` (``matmul_with_hp_or_float8_args.forward`` saves ``input_hp,
#:   weight_hp_t``) keeps the high-precision input (cast to the autocast dtype first, like a BF16 Linear's)
#:   and the parameter itself: it casts an FP32 weight to FP8 for each GEMM and keeps no copy, so it holds
#:   what a BF16 Linear holds less autocast's BF16 weight cast. On the H200 (4 blocks at the 8B width, FP32
#:   parameters, eager, 2026-12-03) the converted runs peaked exactly 2 B per converted weight element under
#:   the BF16 run (1.62 GiB for 4 blocks, 0.81 for 2, 0.31 for the attention only).
FP8_LINEARS = ("te", "torchao")


def scaled_states(memory: MemoryKnobs, param_dtype: str, fused_adam_fp8: bool = False) -> int:
    """How many states per parameter FusedAdam's step copies to FP32 (see :class:`MemoryBreakdown`).

    None where the ``te`` backend steps FP8 moments with :class:`~precsearch.backends.fp8_state_adam.FP8StateAdamW`,
    which makes no FP32 copy (:func:`~precsearch.backends.fp8_state_adam.applies`), unless ``fused_adam_fp8``
    says FusedAdam steps them.
    """
    first, second = memory.moment_dtypes(param_dtype)
    if not fused_adam_fp8 and applies(first, second, memory.master, memory.fp8_weights):
        return 0
    fused_bf16 = first == second == "bf16"  # unscaled inside the kernel
    moments = sum(1 for m in (first, second) if m == "fp8" or (m == "bf16" and not fused_bf16))
    return moments + (1 if memory.master == "fp16" else 0)


def _as_saved(precisions: dict[str, Precision], fp8_linear: str) -> dict[str, Precision]:
    """The precision each unit's saved input has: torchao's FP8 Linears save theirs unquantized (BF16)."""
    if fp8_linear == "te":
        return precisions
    return {n: DEFAULT_PRECISION if p.is_fp8 else p for n, p in precisions.items()}


def max_param_elements(cfg: ModelConfig) -> int:
    """The largest parameter (the embedding or output layer at Llama shapes): the size of a param group."""
    return max(cfg.vocab_size * cfg.dim, *(i * o for i, o in _layers(cfg).values()))


def fp8_attention_saving(cfg: ModelConfig, precisions: dict[str, Precision], memory: MemoryKnobs,
                         tokens: int) -> int:
    """Bytes FP8 attention saves: q, k, v and the output kept in FP8 (1 byte) instead of BF16 per block.

    Counted for blocks whose q/k/v unit runs a recipe whose FP8 attention TE fuses on Hopper (delayed scaling:
    its ``te_fp8_attention_from``; current scaling needs sm_100; see :mod:`precsearch.backends.te_knobs`).
    """
    if memory.fp8_attention == "off":
        return 0
    kv = cfg.n_kv_heads * cfg.head_dim
    blocks = sum(1 for i in range(cfg.n_layers)
                 if _fused_on_hopper(precisions.get(f"decoder.layers.{i}.self_attention.linear_qkv")))
    return tokens * blocks * (2 * cfg.dim + 2 * kv) * (_BF16 - 1)


def _fused_on_hopper(precision: Precision | None) -> bool:
    fused_from = recipe_for(precision or DEFAULT_PRECISION).te_fp8_attention_from
    return fused_from is not None and fused_from <= HOPPER


def saved_linear_input_bytes(cfg: ModelConfig, precisions: dict[str, Precision], param_dtype: str,
                             split: dict[str, int] | None = None) -> float:
    """Bytes per token of unit inputs saved for the backward, over all blocks and ``output_layer``.

    ``split``: block unit suffix -> the ranks its saved input is divided over (tensor parallelism,
    :mod:`precsearch.probe.memory.rank_peak`); absent units, and the output layer, keep theirs whole.
    """
    split = split or {}
    total = 0.0
    for i in range(cfg.n_layers):
        for suffix, arrives_bf16, saved_anyway in _unit_inputs():
            p = precisions.get(f"decoder.layers.{i}.{suffix}", DEFAULT_PRECISION)
            saved = _group_input_bytes([p], unit_shape(cfg, suffix)[0], arrives_bf16, saved_anyway, param_dtype)
            total += saved / split.get(suffix, 1)
    head = [precisions.get(OUTPUT_LAYER, DEFAULT_PRECISION)]
    return total + _group_input_bytes(head, cfg.dim, False, False, param_dtype)


def _group_input_bytes(group: list[Precision], width: int, arrives_bf16: bool, saved_anyway: bool,
                       param_dtype: str) -> float:
    """Bytes per token saved by Linears reading one tensor of ``width`` features."""
    quantized = sum(width * ELEMENT_BYTES[p] for p in group if p.is_fp8)
    n_bf16 = sum(1 for p in group if not p.is_fp8)
    if n_bf16 == 0 or saved_anyway:
        return quantized
    shared = arrives_bf16 or param_dtype == "bf16"  # autocast casts an fp32 input once per Linear
    return quantized + width * _BF16 * (1 if shared else n_bf16)


def other_activation_bytes(cfg: ModelConfig, *, seq_len: int, micro_batch: int, param_dtype: str,
                           heads_split: int = 1, tokens_split: int = 1) -> int:
    """Bytes saved for the backward by everything but the Linear inputs and the logits.

    Under tensor parallelism a rank keeps ``1 / heads_split`` of the attention and SwiGLU tensors
    (its heads and FFN rows) and ``1 / tokens_split`` of the norms' (its tokens, under sequence
    parallelism); see :mod:`precsearch.probe.memory.rank_peak`.
    """
    residual = _FP32 if param_dtype == "fp32" else _BF16
    kv = cfg.n_kv_heads * cfg.head_dim
    norm = (cfg.dim * (_FP32 + residual) + _FP32) / tokens_split  # fp32 input, normalised output, 1/rms
    # q and k after RoPE, the fused q/k/v output (v is a view of it, as in Megatron), the output; log-sum-exp
    attention = ((3 * cfg.dim + 3 * kv) * _BF16 + cfg.n_heads * _FP32) / heads_split
    swiglu = 3 * cfg.ffn_dim * _BF16 / heads_split  # gate, silu(gate), up
    per_token = cfg.n_layers * (2 * norm + attention + swiglu) + norm + 8  # + the final norm, the token ids
    # RoPE's cos/sin tables, cast to BF16 in every block.
    rope = 2 * seq_len * cfg.head_dim * _BF16 * cfg.n_layers
    return int(seq_len * micro_batch * per_token) + rope


def activation_bytes(cfg: ModelConfig, precisions: dict[str, Precision], *, seq_len: int, micro_batch: int,
                     param_dtype: str = "fp32") -> int:
    """Bytes the forward saves for the backward, weights and logits excluded (what autograd holds)."""
    inputs = seq_len * micro_batch * saved_linear_input_bytes(cfg, precisions, param_dtype)
    return int(inputs) + other_activation_bytes(cfg, seq_len=seq_len, micro_batch=micro_batch,
                                                param_dtype=param_dtype)
