"""The documentation: the MkDocs site builds with warnings as errors, and the README's links resolve.

If a test here fails, a page links a file or heading that does not exist (or moved), a page is
missing from `mkdocs.yml`'s nav, the docs name a module or script that was moved or renamed, or the
README lost the test command that `.ci/run` reads.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# [text](target) and ![alt](target); the target ends at whitespace or ")".
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
# A repository path named in prose, code or a command: precsearch/..., benchmarks/..., search_spaces/..., tests/...
_REPO_PATH = re.compile(r"(?<![\w/.])/?((?:precsearch|benchmarks|search_spaces|tests)/[\w./-]*\w)")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    # Not -q: MkDocs counts the warnings that --strict turns into errors only as they are logged.
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = _build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def _readme_links() -> list[str]:
    text = _FENCE.sub("", README.read_text())  # links inside code blocks are not links
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def _anchors(site: Path, page: str) -> set[str]:
    """The heading ids of a docs page as the built site renders it (docs/x.md -> site/x/index.html)."""
    rel = Path(page).relative_to("docs").with_suffix("")
    folder = rel.parent if rel.name == "index" else rel
    return set(re.findall(r'id="([^"]+)"', (site / folder / "index.html").read_text()))


def test_site_builds_strict(site: Path):
    # Broken links, unknown anchors or a page left out of the nav would have failed the build.
    assert (site / "index.html").is_file()
    assert (site / "results" / "index.html").is_file()


def test_notes_beside_the_code_are_pages(site: Path):
    # backends/te.md and probe/signals.md stay beside the code; the hook must publish every such note.
    notes = sorted(p.relative_to(ROOT) for p in (ROOT / "precsearch").rglob("*.md"))
    assert notes, "no notes beside the code found"
    for note in notes:
        assert (site / note.with_suffix("") / "index.html").is_file(), f"{note} is not in the site"


def test_readme_links_resolve(site: Path):
    links = _readme_links()
    assert any(t.startswith("docs/") for t in links), "the README links no docs page"
    for target in links:
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README.md links {target!r}: no file {path}"
        if anchor and path.startswith("docs/") and path.endswith(".md"):
            assert anchor in _anchors(site, path), f"README.md links {target!r}: no heading #{anchor}"


def test_paths_named_in_the_docs_exist():
    # Code spans and commands are not links, so the build does not check them: a moved module or a
    # renamed script would leave the docs naming a file that is gone. A prefix counts (an --out prefix,
    # `benchmarks/gpu/gpu_*.sh`).
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    missing = []
    for page in pages:
        for path in set(_REPO_PATH.findall(page.read_text())):
            if not any(ROOT.glob(path + "*")):
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert not missing, "files named in the docs do not exist:\n" + "\n".join(sorted(missing))


def test_docs_name_no_folder_that_left_the_tree():
    # The experiments' old folder is gone: a script or result file from it is cited as `name@commit`
    # (docs/results/index.md), never by a path a reader would look for in vain.
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    stale = [f"{page.relative_to(ROOT)}: {m}" for page in pages
             for m in re.findall(r"(?<![\w/.@-])scripts/[\w./*-]*", page.read_text())]
    assert not stale, "docs name the removed scripts/ folder:\n" + "\n".join(stale)


def test_readme_keeps_the_ci_test_command():
    # .ci/run runs the first non-fence line after the marker; without it CI would run nothing.
    lines = README.read_text().splitlines()
    start = lines.index("<!-- test-command -->") + 1
    command = next(line for line in lines[start:] if not line.startswith("```"))
    assert "pytest" in command and ".[test]" in command


def test_a_broken_link_fails_the_build(tmp_path: Path):
    # The control: the same site with one link to a missing result file must not build.
    for name in ("mkdocs.yml", "docs"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    for note in (ROOT / "precsearch").rglob("*.md"):
        (tmp_path / note.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(note, tmp_path / note.relative_to(ROOT))
    shutil.copytree(ROOT / "benchmarks" / "results", tmp_path / "benchmarks" / "results")
    page = tmp_path / "docs" / "index.md"
    page.write_text(page.read_text() + "\n[gone](/benchmarks/results/no-such-result.json)\n")
    done = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-result.json" in done.stdout + done.stderr


def _space_examples() -> list[tuple[str, str]]:
    """Every ```yaml block of the README and the docs that is a whole space file (model: ... study:)."""
    found = []
    for page in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in re.findall(r"^```yaml\n(.*?)^```", page.read_text(), re.S | re.M):
            if re.search(r"^model:", block, re.M) and re.search(r"^study:", block, re.M):
                found.append((str(page.relative_to(ROOT)), block))
    return found


def test_space_examples_in_the_docs_are_valid(tmp_path: Path):
    # A space shown to users must load and pass the checks that do not depend on this machine.
    from precsearch.config.checks import check_space
    from precsearch.config.loader import load_space

    examples = _space_examples()
    assert {page for page, _ in examples} >= {"README.md", "docs/space-file.md"}
    for i, (page, block) in enumerate(examples):
        path = tmp_path / f"example{i}.yaml"
        path.write_text(block)
        check_space(load_space(path), file=f"{page} example {i}")
