"""MkDocs hook: repository files that live outside docs/ but belong in the site.

The notes kept beside the code (``precsearch/**/*.md``, e.g. ``backends/te.md``) become pages, and the
measurement files under ``benchmarks/results/`` are copied as they are, each at its repository path. A
docs page links them root-relative (``/benchmarks/results/x.json``); with ``validation.links.absolute_links:
relative_to_docs`` MkDocs checks such a link like any other, so a result file that is moved or renamed
fails ``mkdocs build --strict``.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files, InclusionLevel

# Globs relative to the repository root (the folder of mkdocs.yml).
REPO_GLOBS = ("precsearch/**/*.md", "benchmarks/results/*")


def on_files(files: Files, config) -> Files:
    """Add every file matching ``REPO_GLOBS`` to the site under its repository path."""
    root = Path(config.config_file_path).parent
    for pattern in REPO_GLOBS:
        for path in sorted(root.glob(pattern)):
            if path.is_file():
                rel = path.relative_to(root).as_posix()
                # NOT_IN_NAV: a result file need not be listed in the nav to be linked.
                files.append(File.generated(config, rel, abs_src_path=str(path), inclusion=InclusionLevel.NOT_IN_NAV))
    return files
