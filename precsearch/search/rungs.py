"""How one trial runs at its rung: the probe length, the leg of the run it continues, its checkpoint.

A trial at rung ``S`` runs the probe for ``S`` steps, as a leg of a run laid out
over the longest rung (:mod:`precsearch.probe.continuation`). A first-rung
trial starts at step 0; a promoted trial continues the checkpoint its
``promoted_from`` trial saved in ``<output>/checkpoints/trial-<n>.pt``. Every
trial below the last rung saves one (it may be promoted); a checkpoint is the
size of the probe model plus its optimizer state (about 30 GB for the 8B-wide
4-block probe with FP32 master weights and moments). Checkpoints nothing will
continue from are deleted as the study goes (:func:`drop_spent`), and a
checkpoint that would leave the disk nearly full is not written
(:func:`precsearch.probe.continuation.save`). A worker that does not find
the checkpoint (skipped, or workers on several machines, each with its own
output directory) runs the rung from step 0: the same run, only slower.
"""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from precsearch.config.space import ProbeSection, Space
from precsearch.probe.continuation import Leg
from precsearch.search import promotion

CHECKPOINTS = "checkpoints"


def checkpoint_path(output_dir: Path, trial: int) -> Path:
    """Where trial ``trial`` saves its state at the end of its rung."""
    return Path(output_dir) / CHECKPOINTS / f"trial-{trial}.pt"


def drop_spent(output_dir: Path, study: optuna.Study, space: Space, objectives: list[str]) -> list[int]:
    """Delete the checkpoints of :func:`~precsearch.search.promotion.spent` trials; return their numbers.

    A trial that reused a twin's result (``duplicate_of``) continues from the twin's checkpoint,
    so a checkpoint stays while a trial that may still be promoted points at it.
    """
    fidelity = space.study.fidelity
    if fidelity is None:
        return []
    trials = study.get_trials(deepcopy=False)
    gone = promotion.spent(trials, fidelity, objectives)
    needed = {int(t.user_attrs.get("duplicate_of", t.number)) for t in trials if t.number not in gone}
    dropped = []
    for number in sorted(gone - needed):
        path = checkpoint_path(output_dir, number)
        if path.exists():
            path.unlink(missing_ok=True)
            dropped.append(number)
    return dropped


def rung_probe(space: Space, rung: int) -> ProbeSection:
    """The space's probe section, ``rung`` steps long."""
    return space.probe if rung == space.probe.steps else space.probe.model_copy(update={"steps": rung})


def trial_leg(space: Space, output_dir: Path, number: int, rung: int, source: FrozenTrial | None) -> Leg | None:
    """The leg trial ``number`` runs at ``rung``, continuing ``source`` (None for a first-rung trial).

    None for a study without rungs.
    """
    fidelity = space.study.fidelity
    if fidelity is None:
        return None
    resume = None
    if source is not None:
        # a trial that reused a twin's result ran nothing and saved nothing: its twin did
        path = checkpoint_path(output_dir, int(source.user_attrs.get("duplicate_of", source.number)))
        resume = str(path) if path.exists() else None
    save = str(checkpoint_path(output_dir, number)) if rung < fidelity.horizon else None
    return Leg(horizon=fidelity.horizon, resume_from=resume, save_to=save)


def trial_rung(study: optuna.Study, space: Space, trial: optuna.Trial) -> tuple[int, FrozenTrial | None]:
    """The rung ``trial`` runs at and, for a promoted trial, the trial of the previous rung it continues.

    A first-rung trial of a study with rungs is labelled with its rung (user attr ``fidelity_steps``).
    """
    fidelity = space.study.fidelity
    if fidelity is None:
        return space.probe.steps, None
    attrs = trial.user_attrs
    if promotion.FIDELITY not in attrs:
        trial.set_user_attr(promotion.FIDELITY, fidelity.rungs[0])
    rung = int(attrs.get(promotion.FIDELITY, fidelity.rungs[0]))
    if promotion.PROMOTED_FROM not in attrs:
        return rung, None
    source = attrs[promotion.PROMOTED_FROM]
    return rung, next(t for t in study.get_trials(deepcopy=False) if t.number == source)


def unneeded(study: optuna.Study, space: Space, number: int, promoted_only: bool) -> str | None:
    """Why trial ``number``, just asked for, should not run, or None to run it.

    Not run: a fresh trial asked for after the study's ``n_trials`` (``promoted_only``: another worker
    took the queued promotion first), or a second copy of a promotion
    (:func:`~precsearch.search.promotion.superseded_copy`).
    """
    if space.study.fidelity is None:
        return None
    trials = study.get_trials(deepcopy=False)
    asked = next(t for t in trials if t.number == number)
    older = promotion.superseded_copy(asked, trials)
    if older is not None:
        return f"a copy of trial {older.number}"
    if promoted_only and not promotion.is_promoted(asked):
        return "asked for after n_trials"
    return None
