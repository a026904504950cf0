"""Where a study keeps its files, and the manifest that lets later commands find them.

``<output>/precsearch.json`` records the study name, Optuna storage URL,
MLflow tracking URI and experiment, so ``precsearch front``, ``export`` and
``ui`` need only ``--output-dir``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from precsearch.config.space import Space
from precsearch.errors import UserError

MANIFEST = "precsearch.json"
DEFAULT_OUTPUT_ROOT = Path("precsearch-runs")


@dataclass(frozen=True)
class Workspace:
    """A study's output directory and the stores it uses."""

    output_dir: Path
    study_name: str
    storage_url: str
    tracking_uri: str
    experiment: str

    @classmethod
    def for_space(cls, space: Space, output_dir: Path | None) -> "Workspace":
        """Defaults: ``precsearch-runs/<study>``, sqlite stores inside it, ``$MLFLOW_TRACKING_URI`` wins."""
        out = Path(output_dir or DEFAULT_OUTPUT_ROOT / space.study.name).resolve()
        tracking = space.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{out / 'mlflow.db'}"
        return cls(
            output_dir=out,
            study_name=space.study.name,
            storage_url=space.study.storage or f"sqlite:///{out / 'optuna.db'}",
            tracking_uri=tracking,
            experiment=space.tracking.experiment or space.study.name,
        )

    @property
    def artifact_dir(self) -> Path:
        return self.output_dir / "mlartifacts"

    @property
    def references_dir(self) -> Path:
        return self.output_dir / "references"

    def save(self) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        data = {k: str(v) for k, v in asdict(self).items()}
        (self.output_dir / MANIFEST).write_text(json.dumps(data, indent=2) + "\n")

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
            return cls(**data)
        except (ValueError, TypeError, KeyError) as exc:
            raise UserError(f"unreadable manifest: {exc}", file=str(path)) from None
