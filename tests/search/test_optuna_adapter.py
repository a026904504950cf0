"""Optuna's private API is reached from :mod:`precsearch.search.optuna_adapter` only, and what it reaches still
works on the installed Optuna.

The walk (as ``tests/readings/test_no_reading_names.py`` walks for reading names) fails on a module outside the
adapter that imports a private Optuna module (``optuna.storages._heartbeat``), reads a private attribute of an
object not its own (``study._storage``, ``trial._trial_id``: any ``_name`` that Optuna's study, trial or
storage classes define, read on anything but ``self``), or names one in a string (a method looked up by name,
a system attribute key such as ``fixed_params``). If it fails, move the reach into the adapter with a line on
the public API that is missing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from precsearch.search import optuna_adapter

PACKAGE = Path(__file__).resolve().parents[2] / "precsearch"
ADAPTER = PACKAGE / "search" / "optuna_adapter.py"
OPTUNA = Path(optuna.__file__).parent
#: Keys Optuna keeps in a trial's system attributes for itself.
INTERNAL_KEYS = {"fixed_params", "constraints"}


def _optuna_private_names() -> set[str]:
    """The ``_name`` attributes and methods of Optuna's study, trial and storage classes."""
    names: set[str] = set()
    for folder in ("study", "trial", "storages"):
        for path in (OPTUNA / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef) and _private(node.name):
                    names.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                        and node.value.id == "self" and _private(node.attr):
                    names.add(node.attr)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _offenders(package: Path, private: set[str], skip: Path | None = None) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == skip:
            continue
        where = lambda node: f"{path.relative_to(package.parent)}:{node.lineno}"  # noqa: E731
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("optuna") \
                    and any(_private(part) for part in node.module.split(".")):
                found.append(f"{where(node)}: from {node.module} import ...")
            elif isinstance(node, ast.Import):
                found += [f"{where(node)}: import {a.name}" for a in node.names
                          if a.name.startswith("optuna") and any(_private(p) for p in a.name.split("."))]
            elif isinstance(node, ast.Attribute) and node.attr in private \
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{where(node)}: .{node.attr}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value in private | INTERNAL_KEYS:
                found.append(f"{where(node)}: {node.value!r}")
    return found


def test_no_module_but_the_adapter_reaches_into_optunas_private_api():
    offenders = _offenders(PACKAGE, _optuna_private_names(), skip=ADAPTER)
    assert not offenders, "Optuna's private API outside precsearch/search/optuna_adapter.py:\n" + "\n".join(offenders)


def test_the_check_sees_each_kind_of_reach(tmp_path):
    """Each kind of reach is found outside the adapter and one's own ``self._storage`` is not (else the test
    above passes on anything, or fails on every class with a private attribute)."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        "from optuna.storages._heartbeat import is_heartbeat_enabled\n"
        "def f(study, trial):\n"
        "    return study._storage.get_trial(trial._trial_id).system_attrs.get('fixed_params')\n"
        "class Mine:\n"
        "    def g(self):\n"
        "        return self._storage\n")
    found = _offenders(tmp_path / "pkg", _optuna_private_names())
    assert sorted(line.split(": ", 1)[1] for line in found) == sorted(
        ["from optuna.storages._heartbeat import ...", "._storage", "._trial_id", "'fixed_params'"]), found


def test_the_adapter_checked_the_installed_optuna():
    """A newer Optuna may have moved what the adapter reaches: re-read the adapter, then bump the version."""
    assert optuna.__version__ == optuna_adapter.CHECKED_AGAINST


@pytest.fixture
def rdb_study(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}", heartbeat_interval=60)
    return optuna.create_study(storage=storage, directions=["minimize"])


def test_the_stored_trial_is_read_back_by_its_id(rdb_study):
    trial = rdb_study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    trial.set_user_attr("worker", "w1")
    stored = optuna_adapter.stored_trial(rdb_study, optuna_adapter.trial_id(trial))
    assert stored.number == trial.number and stored.user_attrs == {"worker": "w1"}
    assert stored.state is TrialState.RUNNING


def test_an_interrupted_trial_is_failed_and_marked(rdb_study):
    trial = rdb_study.ask()
    optuna_adapter.fail_as_interrupted(rdb_study, rdb_study.get_trials(deepcopy=False)[0])
    stored = optuna_adapter.stored_trial(rdb_study, optuna_adapter.trial_id(trial))
    assert stored.state is TrialState.FAIL and stored.user_attrs["interrupted"] is True


def test_a_queued_trials_params_are_read_before_it_is_asked(rdb_study):
    rdb_study.enqueue_trial({"x": 0.25})
    waiting = rdb_study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [optuna_adapter.queued_params(t) for t in waiting] == [{"x": 0.25}]
    rdb_study.ask()
    rdb_study.enqueue_trial({"x": 0.5})
    asked = rdb_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    assert [optuna_adapter.queued_params(t) for t in asked] == [{"x": 0.25}], "an asked queued trial keeps them"


def test_constraint_attrs_are_told_apart_from_a_samplers(rdb_study):
    trial = rdb_study.ask()
    trial.set_constraint("stability", 0.5)
    rdb_study.tell(trial, [1.0])
    attrs = rdb_study.get_trials(deepcopy=False)[0].system_attrs
    assert [k for k in attrs if optuna_adapter.is_constraint_attr(k)], attrs
    assert not optuna_adapter.is_constraint_attr("nsga2:generation")


def test_heartbeats_are_seen_on_an_rdb_storage_only(rdb_study):
    assert optuna_adapter.heartbeat_enabled(optuna_adapter.storage_of(rdb_study))
    assert not optuna_adapter.heartbeat_enabled(optuna_adapter.storage_of(optuna.create_study()))


def test_the_cached_storage_still_calls_the_private_methods_the_retries_wrap():
    """The retry wrapper (runtime/stores.py) wraps these names: each must still be a method of the RDB storage."""
    for name in optuna_adapter.CACHED_STORAGE_CALLS:
        assert callable(getattr(optuna.storages.RDBStorage, name, None)), name


def test_a_trial_is_reread_as_another_process_left_it(rdb_study):
    """A trial failed behind this process's back reads FAIL, not the RUNNING this process's copy says."""
    trial = rdb_study.ask()
    optuna_adapter.fail_as_interrupted(rdb_study, optuna_adapter.reread(rdb_study, trial))
    assert optuna_adapter.reread(rdb_study, trial).state is TrialState.FAIL
