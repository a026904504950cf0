"""The policy file (``policy.yaml``): schema-versioned, human-readable, with provenance.

Layout (checked by the pydantic models of :mod:`precsearch.policy.schema`)::

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
from pydantic import ValidationError

from precsearch.errors import UserError
from precsearch.policy.rules import Policy
from precsearch.policy.schema import PolicyFile, shown
from precsearch.utils.validation import user_error
from precsearch.utils.yaml_io import check_plain_data, load_yaml

SCHEMA_VERSION = 1


def dump_policy(policy: Policy, provenance: dict[str, Any] | None = None) -> str:
    """The YAML text of a policy file."""
    data = {"schema_version": SCHEMA_VERSION, "policy": policy.to_dict(), "provenance": provenance or {}}
    return yaml.safe_dump(data, sort_keys=False)


def save_policy(policy: Policy, path: Path, provenance: dict[str, Any] | None = None) -> None:
    """Write a policy file."""
    Path(path).write_text(dump_policy(policy, provenance))


def load_policy_file(path: Path) -> tuple[Policy, dict[str, Any]]:
    """Read a policy file; a newer schema or a malformed file is refused with a clear message.

    Raises:
        UserError: naming the file and the field (``policy.rules[2].precision``) that is wrong.
    """
    path = Path(path)
    return parse_policy(load_yaml(path), file=str(path))


def parse_policy(data: Any, *, file: str = "<policy>") -> tuple[Policy, dict[str, Any]]:
    """A policy file's data (as YAML gives it) -> the policy and its provenance.

    Raises:
        UserError: naming ``file`` and the field that is wrong; nothing else, whatever ``data`` is.
    """
    if not isinstance(data, dict) or "policy" not in data:
        raise UserError("not a precsearch policy file (no 'policy' section)", file=file)
    check_plain_data(data, file=file)
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
        raise UserError(f"schema_version {shown(version)} is not supported; this precsearch reads "
                        f"1..{SCHEMA_VERSION}", file=file, field="schema_version")
    try:
        PolicyFile.model_validate(data)
    except ValidationError as exc:
        raise user_error(exc, PolicyFile, file, prefix="malformed policy: ") from None
    try:
        return Policy.from_dict(data["policy"]), data.get("provenance") or {}
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"malformed policy: {exc}", file=file, field="policy") from None
