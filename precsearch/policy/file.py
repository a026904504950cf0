"""The policy file (``policy.yaml``): schema-versioned, human-readable, with provenance.

Layout::

    schema_version: 1
    policy:        # what Policy.to_dict() writes: default, rules, recipe, warmup_steps, clip_grad
      ...
    provenance:    # where it came from: study, trial, objectives, probe, versions
      ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from precsearch.errors import UserError
from precsearch.policy.rules import Policy

SCHEMA_VERSION = 1


def dump_policy(policy: Policy, provenance: dict[str, Any] | None = None) -> str:
    """The YAML text of a policy file."""
    data = {"schema_version": SCHEMA_VERSION, "policy": policy.to_dict(), "provenance": provenance or {}}
    return yaml.safe_dump(data, sort_keys=False)


def save_policy(policy: Policy, path: Path, provenance: dict[str, Any] | None = None) -> None:
    """Write a policy file."""
    Path(path).write_text(dump_policy(policy, provenance))


def load_policy_file(path: Path) -> tuple[Policy, dict[str, Any]]:
    """Read a policy file; a newer schema or a malformed file is refused with a clear message."""
    path = Path(path)
    from precsearch.config.loader import load_yaml

    data = load_yaml(path)
    if not isinstance(data, dict) or "policy" not in data:
        raise UserError("not a precsearch policy file (no 'policy' section)", file=str(path))
    version = data.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
        raise UserError(f"schema_version {version!r} is not supported; this precsearch reads 1..{SCHEMA_VERSION}",
                        file=str(path), field="schema_version")
    try:
        return Policy.from_dict(data["policy"]), data.get("provenance") or {}
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"malformed policy: {exc}", file=str(path), field="policy") from None
