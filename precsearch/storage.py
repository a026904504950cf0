"""How optimizer state is stored: the moment storages and master-weight storages, one vocabulary of their own.

These are not GEMM precisions (:mod:`precsearch.recipes`): a moment stored as :data:`BLOCK_FP8` is E4M3 with
an FP32 scale per 128 elements (the second moment as its square root, precsearch's ``FP8StateAdamW``), whatever
precision the layer's GEMMs run. The values are what policy and space files write (``moment_dtype:
fp8_block``), kept as they were; code names the storage by the constants here, never by the spelling.
"""

from __future__ import annotations

from typing import Literal, get_args

#: A moment in FP32.
FP32 = "fp32"
#: A moment in BF16.
BF16 = "bf16"
#: A moment in E4M3 with one scale per tensor (TE ``FusedAdam``'s FP8 states).
TENSOR_FP8 = "fp8"
#: A moment in E4M3 with an FP32 scale per 128 elements, the second moment as its square root (``FP8StateAdamW``).
BLOCK_FP8 = "fp8_block"
#: The parameters' own dtype (``torch.optim.AdamW``'s choice), for both moments.
PARAM = "param"

StateDtype = Literal["fp32", "bf16", "fp8", "fp8_block"]
"""One moment's own storage (:attr:`~precsearch.policy.MemoryKnobs.exp_avg_dtype`, ``exp_avg_sq_dtype``)."""
STATE_DTYPES: tuple[str, ...] = get_args(StateDtype)
MomentDtype = Literal["param", "fp32", "bf16", "fp8", "fp8_block"]
"""Both AdamW moments' storage (:attr:`~precsearch.policy.MemoryKnobs.moment_dtype`); ``param`` is the
parameters' dtype (as ``torch.optim.AdamW``); the space file's knob takes the same."""
MOMENT_DTYPES: tuple[str, ...] = get_args(MomentDtype)
#: The storages kept in FP8 with scales beside them.
SCALED_FP8: tuple[str, ...] = (TENSOR_FP8, BLOCK_FP8)

MasterDtype = Literal["fp32", "fp16", "remainders"]
"""How FP32 master weights are kept: whole, in FP16 with a per-tensor scale, or as the 16 low bits
beside the BF16 parameter (TE ``store_param_remainders``: the same FP32 values in 2 bytes)."""
MASTER_DTYPES: tuple[str, ...] = get_args(MasterDtype)

assert set(STATE_DTYPES) == {FP32, BF16, TENSOR_FP8, BLOCK_FP8} and set(MOMENT_DTYPES) == {PARAM, *STATE_DTYPES}
