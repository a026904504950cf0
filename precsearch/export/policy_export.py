"""Writing what ``precsearch export`` rendered: one file, or several into a directory.

Choosing the trial and reading it from the study is :mod:`precsearch.runtime.study_export`; this
package only turns a policy into files (:mod:`precsearch.export.registry`) and writes them.
"""

from __future__ import annotations

from pathlib import Path

from precsearch.errors import UserError


def write_export(files: dict[str, str], output: str | Path | None) -> list[Path]:
    """Write the files: one file to ``output`` unless it is a directory; several into the directory ``output``.

    ``output`` is a directory when it exists as one, ends with a path separator (``out/``: give it as
    the user wrote it, since ``Path`` drops the trailing slash), or there are several files.
    Returns the paths written (none when ``output`` is None: the caller prints instead).
    """
    if output is None:
        return []
    try:
        return _write(files, output)
    except OSError as exc:  # the CLI checked the path first (check_writable); it may have changed since
        raise UserError(f"cannot write {exc.filename or output}: {exc.strerror or exc}",
                        field="-o/--output") from None


def _write(files: dict[str, str], output: str | Path) -> list[Path]:
    as_dir = str(output).endswith(("/", "\\")) or Path(output).is_dir() or len(files) > 1
    output = Path(output)
    if not as_dir:
        (name, text), = files.items()
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        return [output]
    if output.exists() and not output.is_dir():
        raise UserError(f"this format writes {len(files)} files ({', '.join(files)}); give a directory, "
                        f"not the file {output}", field="-o/--output")
    output.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        (output / name).write_text(text)
        written.append(output / name)
    return written


__all__ = ["write_export"]
