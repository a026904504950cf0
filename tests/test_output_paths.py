"""Bad input, class "output paths that cannot be written" (issue 34): refused before any work, naming the flag.

One table over every path a command writes: ``export -o`` (a single-file format, and the Megatron
directory output) and the ``--output-dir`` of ``run`` and ``worker``. Each row is a path that cannot
be written (its parent is a file, it is a file where a directory is meant, it lies under /proc or
/sys, its directory is read-only); each must exit 2 with one line naming the flag. ``export`` runs
on a real stored study, so a failure here is the traceback users got when the write failed after
the export was made; ``worker`` and ``run`` get no readable study or data, so a failure also means
the path was checked only after other work. The last tests keep the writable neighbours working.
"""

from __future__ import annotations

import os

import optuna
import pytest

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main
from precsearch.config.loader import parse_space
from precsearch.policy import Policy
from precsearch.runtime.workspace import Workspace


@pytest.fixture
def study_dir(tmp_path):
    """A stored study with one finished trial, as ``precsearch run`` leaves it."""
    out = tmp_path / "study"
    out.mkdir()
    url = f"sqlite:///{out / 'optuna.db'}"
    Workspace(out, "s", url, f"sqlite:///{out / 'mlflow.db'}", "s").save()
    study = optuna.create_study(study_name="s", storage=url, directions=["maximize", "minimize"])
    study.set_user_attr("objectives", ["memory_saved", "instability"])
    study.set_user_attr("space", parse_space(tiny_space_dict()).model_dump(mode="json"))
    score = {"memory_saved": 0.3, "instability": 0.0, "loss_gap": 0.0, "tokens_per_s": 1.0, "feasible": True,
             "diverged": False}
    study.add_trial(optuna.trial.create_trial(values=[0.3, 0.0], params={}, distributions={},
                                              user_attrs={"policy": Policy().to_dict(), "score": score}))
    (tmp_path / "notes.txt").write_text("a file, not a directory\n")
    return out


#: (id, format, path under tmp_path ("/..." is absolute), fragment of the refusal)
EXPORT_ROWS = [
    ("parent_is_a_file", "policy", "notes.txt/policy.yaml", "is a file"),
    ("ancestor_is_a_file", "policy", "notes.txt/a/b/policy.yaml", "is a file"),
    ("megatron_dir_under_a_file", "megatron", "notes.txt/megatron/", "is a file"),
    ("megatron_dir_is_a_file", "megatron", "notes.txt/", "is a file"),
    ("proc", "policy", "/proc/precsearch-test/policy.yaml", "/proc"),
    ("proc_megatron_dir", "megatron", "/proc/precsearch-test/", "/proc"),
    ("sys", "torchtitan", "/sys/precsearch.toml", "/sys"),
    ("name_too_long", "policy", "n" * 300 + "/policy.yaml", "File name too long"),
]


def _path(tmp_path, rel: str) -> str:
    return rel if rel.startswith("/") else f"{tmp_path}/{rel}"


def _refused(capsys, argv, flag: str, fragment: str) -> None:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, f"exit {code}: {err!r}"
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{flag}: " in err and fragment in err, err


@pytest.mark.parametrize("fmt, rel, fragment", [r[1:] for r in EXPORT_ROWS], ids=[r[0] for r in EXPORT_ROWS])
def test_export_to_an_unwritable_path_exits_2_naming_o(study_dir, tmp_path, capsys, fmt, rel, fragment):
    argv = ["export", "--output-dir", study_dir, "--trial", "0", "--format", fmt, "-o", _path(tmp_path, rel)]
    _refused(capsys, argv, "-o/--output", fragment)


@pytest.mark.parametrize("rel, fragment", [("notes.txt", "is a file"), ("notes.txt/out", "is a file"),
                                           ("/proc/precsearch-test", "/proc"), ("/sys/precsearch-test", "/sys"),
                                           ("n" * 300, "File name too long")],
                         ids=["is_a_file", "under_a_file", "proc", "sys", "name_too_long"])
@pytest.mark.parametrize("command", ["run", "worker"])
def test_output_dir_is_checked_before_anything_else(tmp_path, capsys, command, rel, fragment):
    (tmp_path / "notes.txt").write_text("x\n")
    if command == "run":  # a data file that does not exist: reading the space would fail on it
        space = write_space(tmp_path, tiny_space_dict(data={"source": "tokens", "path": "absent.npy"}))
        argv = ["run", space, "--no-progress"]
    else:  # a study that does not exist: joining it would fail on that
        argv = ["worker", "--study", "absent", "--storage", f"sqlite:///{tmp_path / 'none.db'}"]
    _refused(capsys, [*argv, "--output-dir", _path(tmp_path, rel)], "--output-dir", fragment)


def test_read_only_directory_is_refused(study_dir, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        try:  # root writes into a mode-555 directory: then it is no read-only place to test with
            (ro / "probe").write_text("")
            (ro / "probe").unlink()
            pytest.skip("this user can write into a mode-555 directory (root)")
        except PermissionError:
            pass
        argv = ["export", "--output-dir", study_dir, "--trial", "0", "-o", ro / "policy.yaml"]
        _refused(capsys, argv, "-o/--output", "no file can be created")
    finally:
        ro.chmod(0o755)


def test_a_read_only_filesystem_is_refused_with_the_reason(tmp_path, monkeypatch):
    """Where no read-only mount is at hand: the check tries a file, and reports the error it gets."""
    import errno
    import tempfile

    from precsearch.errors import UserError
    from precsearch.utils.writable import check_writable

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(UserError, match="Read-only file system") as info:
        check_writable(tmp_path / "policy.yaml", "-o/--output")
    assert info.value.field == "-o/--output"


@pytest.mark.parametrize("fmt, rel", [("policy", "new/a/b/policy.yaml"), ("policy", "out/"),
                                      ("megatron", "megatron/"), ("policy", ".")],
                         ids=["nested_new_file", "new_dir_slash", "megatron_dir", "existing_dir"])
def test_writable_paths_still_export(study_dir, tmp_path, capsys, monkeypatch, fmt, rel):
    monkeypatch.chdir(tmp_path)
    argv = ["export", "--output-dir", study_dir, "--trial", "0", "--format", fmt, "-o", rel]
    assert main([str(a) for a in argv]) == 0, capsys.readouterr().err
    assert not list(tmp_path.rglob(".precsearch-write-check-*")), "the write check must leave nothing behind"


def test_dev_stdout_is_writable(tmp_path):
    from precsearch.utils.writable import check_writable

    if not os.access("/dev/stdout", os.W_OK):
        pytest.skip("no writable /dev/stdout here")
    check_writable("/dev/stdout", "-o/--output")
