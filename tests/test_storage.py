"""Optimizer-state storage has its own names (:mod:`precsearch.storage`), apart from the GEMM precisions.

If this fails, a policy or space file written before the storages had their own module no longer loads, or
a storage name reads as a precision again.
"""

from __future__ import annotations

from precsearch import storage
from precsearch.policy import MemoryKnobs
from precsearch.policy.file import dump_policy, parse_policy
from precsearch.policy.rules import Policy

import yaml


def test_the_values_files_write_are_unchanged():
    """``moment_dtype: fp8_block`` (and every other storage value) still loads and is written back as it was."""
    assert storage.MOMENT_DTYPES == ("param", "fp32", "bf16", "fp8", "fp8_block")
    assert storage.MASTER_DTYPES == ("fp32", "fp16", "remainders")
    for value in storage.MOMENT_DTYPES:
        policy = Policy(memory=MemoryKnobs(moment_dtype=value, master_weights=True))
        back, _ = parse_policy(yaml.safe_load(dump_policy(policy)))
        assert back.memory.moment_dtype == value


def test_every_storage_has_its_bytes_and_its_optimizer_dtype():
    """The memory model prices, and FP8StateAdamW allocates, every moment storage a file can name: a storage
    missing from either would fail at the first prediction or step. Block-scaled FP8 costs its scales."""
    from precsearch.backends.fp8_state_adam import STATE_DTYPES as ADAM_DTYPES
    from precsearch.probe.memory.peak import STATE_BYTES

    assert set(STATE_BYTES) == set(ADAM_DTYPES) == set(storage.STATE_DTYPES)
    assert STATE_BYTES[storage.BLOCK_FP8] == 1 + 4 / 128 > STATE_BYTES[storage.TENSOR_FP8] == 1
