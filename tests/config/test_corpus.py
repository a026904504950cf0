"""A corpus of malformed space and policy files: each is refused with one clear line, never a traceback.

Every file in ``corpus/space/`` and ``corpus/policy/`` starts with two comment lines::

    # what: what is wrong with this file (and, where a choice was made, what was decided)
    # expect: fragment | fragment | ...   (each must appear in the error; a field name where there is one)

Spaces go through the real CLI (``precsearch validate FILE``, in-process); no command takes a policy
file, so policies go through the public ``precsearch.load_policy``, which must raise :class:`UserError`.
A failure here means a user would see a traceback, a message that does not say which file and field
is wrong, or (for the alias bomb and deep nesting) a hang or a memory blow-up.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import precsearch
from precsearch.cli import main
from precsearch.utils.yaml_io import MAX_FILE_BYTES
from precsearch.errors import UserError

CORPUS = Path(__file__).parent / "corpus"
SPACES = sorted((CORPUS / "space").iterdir())
POLICIES = sorted((CORPUS / "policy").iterdir())


def _header(path: Path) -> tuple[str, list[str]]:
    """The ``# what:`` text and the ``# expect:`` fragments of a corpus file."""
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    what = next(line.removeprefix("# what:").strip() for line in lines if line.startswith("# what:"))
    expect = next(line.removeprefix("# expect:") for line in lines if line.startswith("# expect:"))
    return what, [f.strip() for f in expect.split("|")]


def _assert_one_clear_line(message: str, path: Path, fragments: list[str]) -> None:
    assert "Traceback" not in message, message
    assert len(message.strip().splitlines()) == 1, f"not one line: {message!r}"
    assert str(path) in message, f"the file is not named: {message!r}"
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_corpus_is_documented_and_covers_both_kinds():
    """Each file says what is wrong and what to expect; an empty corpus would make the tests below vacuous."""
    assert len(SPACES) >= 30 and len(POLICIES) >= 20
    for path in SPACES + POLICIES:
        what, expect = _header(path)
        assert what and all(expect), f"{path.name}: header must give '# what:' and '# expect:'"


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.stem)
def test_malformed_space_exits_2_with_one_line(path, capsys):
    started = time.monotonic()
    code = main(["validate", str(path)])
    captured = capsys.readouterr()
    assert code == 2, f"{_header(path)[0]}: exit {code}; out={captured.out!r} err={captured.err!r}"
    assert captured.out == ""
    _assert_one_clear_line(captured.err, path, _header(path)[1])
    assert time.monotonic() - started < 10, "refusing a bad file must not take long (alias bomb, deep nesting)"


@pytest.mark.parametrize("path", POLICIES, ids=lambda p: p.stem)
def test_malformed_policy_raises_user_error(path):
    started = time.monotonic()
    with pytest.raises(UserError) as info:
        precsearch.load_policy(path)
    _assert_one_clear_line(str(info.value), path, _header(path)[1])
    assert time.monotonic() - started < 10


def test_python_tags_are_never_executed(tmp_path, monkeypatch, capsys):
    """The corpus's ``!!python/object/apply:os.system`` would run a shell command under an unsafe loader."""
    import os

    calls = []
    monkeypatch.setattr(os, "system", lambda cmd: calls.append(cmd) or 0)
    main(["validate", str(CORPUS / "space" / "python_object.yaml")])
    with pytest.raises(UserError):
        precsearch.load_policy(CORPUS / "policy" / "python_object.yaml")
    assert calls == []


@pytest.mark.parametrize("kind", ["space", "policy"])
def test_file_over_the_size_limit_is_refused_before_parsing(tmp_path, capsys, kind):
    """A 10 MB file (a log or a data file given by mistake) is refused by size, without reading it as YAML."""
    path = tmp_path / "huge.yaml"
    with path.open("w") as f:
        f.write("# 10 MB of one long comment\n#")
        f.write("x" * (10 * 1024 * 1024))
    assert path.stat().st_size > MAX_FILE_BYTES
    if kind == "space":
        assert main(["validate", str(path)]) == 2
        message = capsys.readouterr().err
    else:
        with pytest.raises(UserError) as info:
            precsearch.load_policy(path)
        message = str(info.value)
    _assert_one_clear_line(message, path, ["bytes", "at most"])


def test_overriding_a_merged_key_is_not_a_duplicate(tmp_path):
    """``<<: *defaults`` then overriding one of its keys is ordinary YAML; refusing it would be a false alarm."""
    from precsearch.utils.yaml_io import load_yaml

    path = tmp_path / "space.yaml"
    path.write_text("base: &d {steps: 8, micro_batch: 2}\nprobe:\n  <<: *d\n  steps: 6\n")
    assert load_yaml(path)["probe"] == {"steps": 6, "micro_batch": 2}
