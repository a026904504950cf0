"""precsearch: find per-layer FP8 precision policies that save memory without breaking training."""

from precsearch.version import __version__  # noqa: F401 - the public name


def load_policy(path):
    """Load a policy file written by ``precsearch export``: a :class:`~precsearch.policy.PolicyRuntime`
    with ``apply(model)``, ``autocast(model, step)`` and ``clip_gradients(model)``."""
    from precsearch.backends.policy_runtime import load_policy as _load_policy

    return _load_policy(path)
