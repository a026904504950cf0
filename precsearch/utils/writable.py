"""Output paths checked before any work: a command that will write a file says so at once if it cannot.

Every path a command writes (``export -o``, the ``--output-dir`` of ``run`` and ``worker``) goes
through :func:`check_writable` before the command reads a study or trains anything. It refuses, with
the flag named:

* a path under ``/proc`` or ``/sys``: kernel interfaces, where a write changes a setting (as root)
  or fails, never makes a file;
* a path whose nearest existing ancestor is a file (``-o notes.txt/policy.yaml``);
* a directory output that exists as a file, or an existing file that cannot be written;
* a place where no file can be created: the nearest existing directory is read-only (a read-only
  mount, no permission). This is tried, not guessed from mode bits: a temporary file is created there
  and removed, since ``root`` writes into a mode-555 directory and ``os.access`` cannot see every
  read-only mount.

Nothing is created except that temporary file: missing directories are made later by the writer.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from precsearch.errors import UserError

#: Kernel filesystems a file is never written to.
VIRTUAL_ROOTS = (Path("/proc"), Path("/sys"))


def check_writable(path: str | Path, flag: str, *, directory: bool = False) -> None:
    """Refuse ``path`` (given with ``flag``) unless a file, or with ``directory`` a folder, can be made there.

    Raises:
        UserError: naming ``flag`` and what is in the way.
    """
    target = Path(os.path.abspath(Path(path).expanduser()))
    try:
        _check(target, str(path), flag, directory)
    except OSError as exc:  # a name too long (ENAMETOOLONG) is raised by the very first stat
        raise UserError(f"{path} cannot be used: {exc.strerror or exc}", field=flag) from None


def _check(target: Path, path: str, flag: str, directory: bool) -> None:
    virtual = next((root for root in VIRTUAL_ROOTS if target == root or root in target.parents), None)
    if virtual is not None:
        raise UserError(f"{path} is under {virtual}, a kernel filesystem: nothing written there becomes a file; "
                        "give a path on a disk", field=flag)
    if target.exists() and not target.is_dir():
        if directory:
            raise UserError(f"{path} is a file; give a directory (or a new path)", field=flag)
        if not os.access(target, os.W_OK):  # an existing file (or /dev/stdout) is written in place
            raise UserError(f"{path} cannot be written (read-only, or no permission); give a writable path",
                            field=flag)
        return
    base = _nearest_existing(target)
    if not base.is_dir():
        raise UserError(f"{path} cannot be created: {base} is a file, not a directory", field=flag)
    problem = _cannot_create_in(base)
    if problem:
        raise UserError(f"{path} cannot be written: {problem}; give a writable path", field=flag)


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _cannot_create_in(directory: Path) -> str | None:
    """Why no file can be created in ``directory`` (tried with a temporary file), or None."""
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".precsearch-write-check-")
    except OSError as exc:
        return f"no file can be created in {directory} ({exc.strerror or type(exc).__name__})"
    os.close(fd)
    os.unlink(name)
    return None
