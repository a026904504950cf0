"""Precision policies: what a trial chose, in a form training code can apply."""

from precsearch.policy.rules import MemoryKnobs, Policy, Rule, block_index

__all__ = ["MemoryKnobs", "Policy", "PolicyError", "PolicyRuntime", "Rule", "block_index", "load_policy"]

_APPLY = ("PolicyError", "PolicyRuntime", "load_policy")


def __getattr__(name: str):
    # the runtime pulls in torch and the backends; import it only when asked for
    if name in _APPLY:
        from precsearch.policy import apply

        return getattr(apply, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
