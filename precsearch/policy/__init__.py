"""Precision policies: what a trial chose, as data (rules) and as a file (``policy.yaml``).

Applying one to a model is the backends' job: :func:`load_policy` and :class:`PolicyRuntime` are
re-exported here from :mod:`precsearch.backends.policy_runtime`.
"""

from precsearch.policy.rules import (Fp8Attention, MemoryKnobs, Policy, PrecisionConflict, Rule, block_index,
                                     member_rules)
from precsearch.storage import MasterDtype, MomentDtype, StateDtype

__all__ = ["Fp8Attention", "MasterDtype", "MemoryKnobs", "MomentDtype", "Policy", "PolicyError", "PolicyRuntime",
           "PrecisionConflict", "Rule", "StateDtype", "block_index", "dump_policy", "load_policy", "load_policy_file",
           "member_rules"]

_APPLY = ("PolicyError", "PolicyRuntime", "load_policy")
_FILE = ("dump_policy", "load_policy_file")  # policy.yaml (pydantic, YAML): imported on first use


def __getattr__(name: str):
    # applying a policy is the backends' job (precsearch.backends.policy_runtime): the runtime pulls in
    # torch and the backends, so it is imported only when asked for (precsearch._layers.UPWARD_ALLOWED)
    if name in _APPLY:
        from precsearch.backends import policy_runtime

        return getattr(policy_runtime, name)
    if name in _FILE:
        from precsearch.policy import file

        return getattr(file, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
