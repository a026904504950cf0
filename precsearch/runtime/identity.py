"""Which study an output directory holds, and whether a space may continue a stored study.

A study's trials are compared with one another (the front, duplicates, promotions), so every
trial must have been scored under the same settings: the probe model, data, probe loop, backend,
searched choices, objectives and rungs (:data:`COMPARED`). A run whose space differs from the
stored study's in any of them is refused, naming the settings that changed; so is a run of
another study into a directory that holds one. Settings that only steer the run (``n_trials``,
sampler, heartbeats, retries, tracking) may change between runs.
"""

from __future__ import annotations

import json
from typing import Any

import optuna

from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.redact import redact_url
from precsearch.runtime.workspace import MANIFEST, Workspace

#: Space settings (dotted prefixes) a trial's score depends on.
COMPARED = ("model.", "data.", "probe.", "backend", "search.", "objectives.", "study.fidelity")

_HOW = "use a new --output-dir for the changed space (its own study), or restore the settings to resume"


def check_directory(ws: Workspace) -> None:
    """Refuse ``ws`` when its directory's manifest names another study or other stores."""
    existing = Workspace.existing(ws.output_dir)
    if existing is None:
        return
    if existing.study_name != ws.study_name:
        raise UserError(f"{ws.output_dir} holds study '{existing.study_name}' ({MANIFEST}); study "
                        f"'{ws.study_name}' needs its own --output-dir", field=ws.dir_field)
    for what, field, old, new in (("Optuna study", "study.storage", existing.storage_url, ws.storage_url),
                                  ("MLflow runs", "tracking.uri", existing.tracking_uri, ws.tracking_uri)):
        if old != new:
            raise UserError(f"{ws.output_dir} keeps its {what} in {redact_url(old)}, this run would use "
                            f"{redact_url(new)} (tracking.uri or $MLFLOW_TRACKING_URI); {_HOW}", field=field)


def check_storage(storage: optuna.storages.BaseStorage, ws: Workspace, space: Space) -> None:
    """Refuse to continue a stored study of the same name scored under other settings, or to add a
    study to this directory's own Optuna file when it holds another one."""
    try:
        study_id = storage.get_study_id_from_name(space.study.name)
    except KeyError:
        study_id = None
    if study_id is None:
        if ws.storage_url == f"sqlite:///{ws.output_dir / 'optuna.db'}":
            others = [s.study_name for s in storage.get_all_studies()]
            if others:
                raise UserError(f"{ws.output_dir / 'optuna.db'} holds study '{others[0]}'; study "
                                f"'{space.study.name}' needs its own --output-dir", field=ws.dir_field)
        return
    stored = storage.get_study_user_attrs(study_id).get("space")
    changes = setting_changes(stored, space) if stored is not None else []
    if changes:
        shown = "; ".join(changes[:4]) + (f"; and {len(changes) - 4} more" if len(changes) > 4 else "")
        raise UserError(f"study '{space.study.name}' in {redact_url(ws.storage_url)} was scored with other "
                        f"settings ({shown}): its trials would not compare with new ones; {_HOW}",
                        field=changes[0].split(":")[0])


def setting_changes(stored: dict, space: Space) -> list[str]:
    """``"probe.steps: 12 -> 30"`` for each compared setting that differs between ``stored`` and ``space``."""
    old, new = _compared(_normalised(stored)), _compared(space.model_dump(mode="json"))
    return [f"{key}: {_short(old.get(key, _ABSENT))} -> {_short(new.get(key, _ABSENT))}"
            for key in sorted(old.keys() | new.keys()) if old.get(key, _ABSENT) != new.get(key, _ABSENT)]


_ABSENT = object()  # a setting on one side only (a group added or removed), told apart from a null value


def _normalised(stored: dict) -> dict:
    """A stored space with today's defaults filled in (fields added since it was stored)."""
    try:
        return Space.model_validate(stored).model_dump(mode="json")
    except ValueError:  # written by an older precsearch whose values no longer validate: compare as stored
        return stored


def _compared(data: dict) -> dict[str, Any]:
    return {k: v for k, v in _flat(data) if k.startswith(COMPARED)}


def _flat(data: dict, prefix: str = ""):
    """Leaf settings by dotted key; a list of sections (``search.groups``) by each item's name or index, so a
    change shows as the one field that changed (``search.groups[mlp].precision.choices``), not as two
    lists cut to the same first characters."""
    for key, value in data.items():
        if isinstance(value, dict) and value:
            yield from _flat(value, f"{prefix}{key}.")
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, item in enumerate(value):
                yield from _flat(item, f"{prefix}{key}[{item.get('name', i)}].")
        else:
            yield f"{prefix}{key}", value


def _short(value: Any) -> str:
    if value is _ABSENT:
        return "(absent)"
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
