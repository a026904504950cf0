"""precsearch: find per-layer FP8 precision policies that save memory without breaking training.

Public API: :func:`load_policy` (apply a policy that ``precsearch export`` wrote to a model) and
``__version__``; the command line is :mod:`precsearch.cli`. Each subpackage's ``__init__`` names its
own public API; the base modules beside this file are :mod:`.precision` (precision names and recipes),
:mod:`.precision_spec` (the facts of each precision), :mod:`.errors` and :mod:`.redact`.
"""

from precsearch.version import __version__

__all__ = ["__version__", "load_policy"]


def load_policy(path):
    """Load a policy file written by ``precsearch export``: a :class:`~precsearch.policy.PolicyRuntime`
    with ``apply(model)``, ``autocast(model, step)`` and ``clip_gradients(model)``."""
    from precsearch.backends.policy_runtime import load_policy as _load_policy

    return _load_policy(path)
