"""precsearch: find per-layer FP8 precision policies that save memory without breaking training."""

__version__ = "0.1.0"


def load_policy(path):
    """Load a policy file written by ``precsearch export`` (see :mod:`precsearch.policy.file`)."""
    from precsearch.policy.file import load_policy_file

    return load_policy_file(path)[0]
