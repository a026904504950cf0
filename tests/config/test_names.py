"""Bad input, class "names" (issue 34): a study name is refused for what the filesystem and MLflow refuse.

Two tables. ``REFUSED``: each name ``validate`` must refuse with one line naming ``study.name`` and
saying what is refused (a failure: a name that would break the run folder or MLflow's search is let
through, or the message does not say why). ``ACCEPTED``: names in other scripts and with punctuation
the old ASCII-only rule refused; each must validate, become its folder, and be found again by the
tracker's own quoted MLflow search (a failure: a valid name refused, or one that MLflow cannot
search for let through). Group names follow the same idea: any script's letters, digits and '_'.
"""

from __future__ import annotations

import pytest

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main

#: (id, study name, fragment of the refusal); 255: POSIX NAME_MAX, in bytes
REFUSED = [
    ("empty", "", "empty"),
    ("dot", ".", "'.' or '..'"),
    ("dotdot", "..", "'.' or '..'"),
    ("slash", "a/b", "path separator"),
    ("backslash", "a\\b", "path separator on Windows"),
    ("single_quote", "it's", "single quote"),
    ("newline", "a\nb", "control character"),
    ("tab", "a\tb", "control character"),
    ("too_many_bytes_cjk", "研" * 86, "at most 255"),  # 86 x 3 = 258 bytes, 86 characters
    ("too_many_bytes_ascii", "a" * 256, "at most 255"),
]

ACCEPTED = ["研究", "исследование", "Ünïcödé-名", "my study", 'say "hi"', "a%b_c", ".hidden", "-dash",
            "研" * 85]  # 255 bytes exactly
ACCEPTED_IDS = ["cjk", "cyrillic", "accents_and_cjk", "space", "double_quote", "percent", "leading_dot",
                "leading_dash", "cjk_255_bytes"]


@pytest.mark.parametrize("name, fragment", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refused_study_name_says_what_is_refused(tmp_path, capsys, name, fragment):
    path = write_space(tmp_path, tiny_space_dict(**{"study.name": name}))
    code = main(["validate", str(path)])
    err = capsys.readouterr().err
    assert code == 2, f"accepted: {err!r}"
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"{path}: study.name: " in err and fragment in err, err


@pytest.mark.parametrize("name", ACCEPTED, ids=ACCEPTED_IDS)
def test_study_name_in_any_script_validates(tmp_path, capsys, name):
    path = write_space(tmp_path, tiny_space_dict(**{"study.name": name}))
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("name", ACCEPTED, ids=ACCEPTED_IDS)
def test_accepted_name_is_a_folder_and_found_by_the_trackers_search(tmp_path, monkeypatch, name):
    """The two things the name must survive: one folder, and MLflow's single-quoted tag filter."""
    from precsearch.config.loader import parse_space
    from precsearch.runtime.workspace import Workspace
    from precsearch.tracking.mlflow_tracker import Tracker

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    ws = Workspace.for_space(parse_space(tiny_space_dict(**{"study.name": name})), None)
    ws.prepare()
    assert ws.output_dir.is_dir() and ws.output_dir.name == name
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = Tracker(uri, name, tmp_path / "art", study_name=name)
    again = Tracker(uri, name, tmp_path / "art", study_name=name)  # finds the parent run by searching its tag
    assert again.parent_id == first.parent_id


@pytest.mark.parametrize("name, ok", [("研究", True), ("données_2", True), ("a-b", False), ("a b", False)],
                         ids=["cjk", "accents", "dash", "space"])
def test_group_names_take_letters_of_any_script(tmp_path, capsys, name, ok):
    data = tiny_space_dict()
    data["search"]["groups"][0]["name"] = name
    code = main(["validate", str(write_space(tmp_path, data))])
    err = capsys.readouterr().err
    assert (code == 0) is ok, err
    if not ok:
        assert "search.groups[0].name" in err and "any script" in err, err


@pytest.mark.parametrize("experiment, ok", [("研究 / runs", True), ("e" * 500, True), ("e" * 501, False)],
                         ids=["cjk_and_slash", "500_chars", "501_chars"])
def test_experiment_name_is_refused_only_past_mlflows_limit(tmp_path, capsys, experiment, ok):
    """An experiment is no folder and is looked up by name, not searched: only MLflow's 500 characters bound it."""
    code = main(["validate", str(write_space(tmp_path, tiny_space_dict(tracking={"experiment": experiment})))])
    err = capsys.readouterr().err
    assert (code == 0) is ok, err
    if not ok:
        assert "tracking.experiment" in err and "at most 500" in err, err
