"""Where a study keeps its files, and the manifest that lets later commands find them.

``<output>/precsearch.json`` records the study name, Optuna storage URL,
MLflow tracking URI and experiment, so ``precsearch front``, ``export`` and
``ui`` need only ``--output-dir``. A manifest read from a directory that was
moved names its stores under the directory's new path.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from precsearch.config.space import Space
from precsearch.errors import UserError
from precsearch.utils.names import name_problem

MANIFEST = "precsearch.json"
DEFAULT_OUTPUT_ROOT = Path("precsearch-runs")


@dataclass(frozen=True)
class Workspace:
    """A study's output directory and the stores it uses.

    ``dir_field`` names what chose the directory (``--output-dir``, or ``study.name`` for the default
    ``precsearch-runs/<study name>``), for errors about it.
    """

    output_dir: Path
    study_name: str
    storage_url: str
    tracking_uri: str
    experiment: str
    dir_field: str = "--output-dir"

    @classmethod
    def for_space(cls, space: Space, output_dir: Path | None) -> "Workspace":
        """Defaults: ``precsearch-runs/<study>``, sqlite stores inside it, ``$MLFLOW_TRACKING_URI`` wins.

        Raises:
            UserError: a study name that is not one path component (with no ``--output-dir``), or a
                store that keeps nothing after the run (in-memory sqlite).
        """
        if output_dir is None:
            check_dir_name(space.study.name, "study.name")
        out = Path(output_dir or DEFAULT_OUTPUT_ROOT / space.study.name).resolve()
        env_tracking = os.environ.get("MLFLOW_TRACKING_URI")
        tracking = space.tracking.uri or env_tracking or f"sqlite:///{out / 'mlflow.db'}"
        refuse_in_memory(tracking, "tracking.uri" if space.tracking.uri else "$MLFLOW_TRACKING_URI")
        if space.study.storage:
            refuse_in_memory(space.study.storage, "study.storage")
        return cls(
            output_dir=out,
            study_name=space.study.name,
            storage_url=space.study.storage or f"sqlite:///{out / 'optuna.db'}",
            tracking_uri=tracking,
            experiment=space.tracking.experiment or space.study.name,
            dir_field="--output-dir" if output_dir is not None else "study.name",
        )

    @property
    def artifact_dir(self) -> Path:
        return self.output_dir / "mlartifacts"

    @property
    def references_dir(self) -> Path:
        return self.output_dir / "references"

    @property
    def manifest(self) -> Path:
        return self.output_dir / MANIFEST

    def prepare(self) -> None:
        """Create the output directory and check that it takes files.

        Raises:
            UserError: naming ``dir_field``, when the path is a file, under a file, too long, or not writable.
        """
        try:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.output_dir, prefix=".write-check-"):
                pass
        except OSError as exc:
            raise UserError(f"cannot use {self.output_dir} as the output directory: {_os_reason(exc)}",
                            field=self.dir_field) from None

    def save(self) -> None:
        """Write the manifest (atomically: a kill never leaves half of it)."""
        data = {k: str(v) for k, v in asdict(self).items() if k != "dir_field"}
        tmp = self.manifest.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.manifest)

    @classmethod
    def load(cls, output_dir: Path) -> "Workspace":
        """Read the manifest a ``precsearch run`` wrote into ``output_dir``."""
        path = Path(output_dir) / MANIFEST
        if not path.is_file():
            raise UserError(
                f"no study here ({MANIFEST} missing); give the --output-dir that 'precsearch run' used",
                file=str(path),
            )
        try:
            data = json.loads(path.read_text())
            data["output_dir"] = Path(data["output_dir"])
            return cls(**data).moved_to(Path(output_dir).resolve())
        except (ValueError, TypeError, KeyError) as exc:
            raise UserError(f"unreadable manifest: {exc}", file=str(path)) from None

    @staticmethod
    def recorded_dir(output_dir: Path) -> Path | None:
        """The directory the manifest in ``output_dir`` was written for (another one if it was moved)."""
        try:
            return Path(json.loads((Path(output_dir) / MANIFEST).read_text())["output_dir"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def follow_move(self) -> None:
        """After the directory was moved, point its MLflow store's artifact locations here."""
        from precsearch.tracking.relocate import relocate_artifacts

        old = self.recorded_dir(self.output_dir)
        if old is not None and old != self.output_dir:
            relocate_artifacts(self.tracking_uri, old, self.output_dir)

    @classmethod
    def existing(cls, output_dir: Path) -> "Workspace | None":
        """The manifest in ``output_dir``, or None if there is none."""
        return cls.load(output_dir) if (Path(output_dir) / MANIFEST).is_file() else None

    def moved_to(self, output_dir: Path) -> "Workspace":
        """This workspace with its directory, and the sqlite stores inside it, at ``output_dir``."""
        old = Path(self.output_dir)
        if old == output_dir:
            return self
        return Workspace(output_dir, self.study_name, _rebase(self.storage_url, old, output_dir),
                         _rebase(self.tracking_uri, old, output_dir), self.experiment, self.dir_field)


def study_dir(output_dir: Path | None) -> Path:
    """The study directory ``front``, ``export`` and ``ui`` read: ``output_dir`` when given, else the current
    directory if it holds a study, else the one study under ``precsearch-runs/``.

    Raises:
        UserError: naming ``--output-dir``, when no study is found, or when ``precsearch-runs/`` holds
            several (each is named, to pick one).
    """
    if output_dir is not None or (Path.cwd() / MANIFEST).is_file():
        return Path(output_dir or ".")
    studies = sorted(p.parent for p in DEFAULT_OUTPUT_ROOT.glob(f"*/{MANIFEST}"))
    if len(studies) == 1:
        return studies[0]
    if not studies:
        raise UserError(f"no study here ({MANIFEST} missing) nor under {DEFAULT_OUTPUT_ROOT}/; give the "
                        "--output-dir that 'precsearch run' used", field="--output-dir")
    raise UserError(f"{len(studies)} studies under {DEFAULT_OUTPUT_ROOT}/: give one as --output-dir "
                    f"({', '.join(str(s) for s in studies)})", field="--output-dir")


def check_dir_name(name: str, field: str) -> None:
    """Refuse a study name that would not be one folder under ``precsearch-runs``."""
    problem = name_problem(name)
    if problem:
        raise UserError(f"{name!r} cannot name a folder under {DEFAULT_OUTPUT_ROOT}/: it {problem}; rename it "
                        "or give --output-dir", field=field)


def refuse_in_memory(url: str, field: str) -> None:
    """Refuse a store URL that keeps its data in memory only (lost at exit, unseen by other processes)."""
    if in_memory(url):
        raise UserError(f"'{url}' keeps everything in memory: the study would be lost when the run exits and "
                        "other commands could not read it; give a file or server URL, or leave it unset",
                        field=field)


def in_memory(url: str) -> bool:
    """True for sqlite URLs without a file (``sqlite://``, ``:memory:``, ``mode=memory``)."""
    if not url.startswith("sqlite:"):
        return False
    path = url.removeprefix("sqlite:").lstrip("/").partition("?")
    return path[0] in ("", ":memory:") or "mode=memory" in path[2]


def _rebase(url: str, old: Path, new: Path) -> str:
    prefix = f"sqlite:///{old}/"
    return f"sqlite:///{new}/{url.removeprefix(prefix)}" if url.startswith(prefix) else url


def _os_reason(exc: OSError) -> str:
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{exc.strerror or type(exc).__name__}{where}"
