"""Precision policies: what a trial chose, as data (rules) and as a file (``policy.yaml``).

Applying one to a model is the backends' job: :func:`load_policy` and :class:`PolicyRuntime` are
re-exported here from :mod:`precsearch.backends.policy_runtime`.
"""

from precsearch.policy.rules import MemoryKnobs, Policy, Rule, block_index

__all__ = ["MemoryKnobs", "Policy", "PolicyError", "PolicyRuntime", "Rule", "block_index", "load_policy"]

_APPLY = ("PolicyError", "PolicyRuntime", "load_policy")


def __getattr__(name: str):
    # applying a policy is the backends' job (precsearch.backends.policy_runtime): the runtime pulls in
    # torch and the backends, so it is imported only when asked for (precsearch._layers.UPWARD_ALLOWED)
    if name in _APPLY:
        from precsearch.backends import policy_runtime

        return getattr(policy_runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
