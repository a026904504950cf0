"""A finished one-trial study on disk, as ``precsearch run`` leaves it, for tests of what reads a study."""

from __future__ import annotations

from pathlib import Path

import optuna

from precsearch.config.space import Space
from precsearch.runtime.workspace import Workspace


def one_trial_study(tmp_path: Path, space: Space, policy: dict, score: dict,
                    values: list[float]) -> tuple[optuna.Study, Workspace]:
    """A study of ``space`` (objectives memory saved and instability) holding one COMPLETE trial with ``policy``
    and ``score`` as its stored attributes and ``values`` as its objectives."""
    ws = Workspace.for_space(space, tmp_path)
    ws.save()
    study = optuna.create_study(study_name=ws.study_name, storage=ws.storage_url,
                                directions=["maximize", "minimize"])
    study.set_user_attr("objectives", ["memory_saved", "instability"])
    study.set_user_attr("space", space.model_dump(mode="json"))
    study.add_trial(optuna.trial.create_trial(
        values=values, params={"x": "a"}, distributions={"x": optuna.distributions.CategoricalDistribution(["a"])},
        user_attrs={"policy": policy, "score": score}))
    return study, ws
