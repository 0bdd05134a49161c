"""Whether a path can be written as a file or as a directory, checked before any work starts.

Each check raises one UserError line saying what is wrong with the path and what is expected, instead of the
FileNotFoundError / IsADirectoryError / NotADirectoryError a write would raise after a model has loaded."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from speechrt.errors import UserError


def check_output_file(path, what: str = "output", example: str = "out", make_parents: bool = False) -> Path:
    """`path` as a Path if a file can be written there (made or overwritten), else a UserError naming `what`
    (e.g. '-o/--output') and, for a directory given, a file path in it such as DIR/`example`. `make_parents`: the
    caller makes missing directories, so one that can be made under an existing directory is fine."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise UserError(f"{what} {path}: is a directory; give a file path, such as {p / example}")
    if p.exists():
        problem = _cannot_overwrite(p)
        if problem:
            raise UserError(f"{what} {path}: cannot be overwritten ({problem}); choose another file")
        return p
    parent = p.parent
    if not parent.exists():
        found = _existing_ancestor(parent)
        if not found.is_dir():
            raise UserError(f"{what} {path}: {found} is a file, not a directory; give a path in an existing directory")
        if make_parents:
            return _writable_in(found, p, what, path)
        raise UserError(f"{what} {path}: the directory {parent} does not exist; create it or give another path")
    if not parent.is_dir():
        raise UserError(f"{what} {path}: {parent} is a file, not a directory; give a path in an existing directory")
    return _writable_in(parent, p, what, path)


def check_output_dir(path, what: str = "output directory", empty: bool = False) -> Path:
    """`path` as a Path if it is a directory that can be written in, or one that can be made (its missing
    parents too); with `empty`, an existing one must be empty. Else a UserError naming `what` (e.g. '--out')."""
    p = Path(path).expanduser()
    expected = "a new or empty directory" if empty else "a directory (it is made if missing)"
    if p.exists():
        if not p.is_dir():
            raise UserError(f"{what} {path}: is a file, not a directory; give {expected}")
        if empty and any(p.iterdir()):
            raise UserError(f"{what} {path}: exists and is not empty; give {expected}")
        where = p
    else:
        where = _existing_ancestor(p)
        if not where.is_dir():
            raise UserError(f"{what} {path}: {where} is a file, so no directory can be made under it; give {expected}")
    return _writable_in(where, p, what, path)


def _writable_in(d: Path, p: Path, what: str, path) -> Path:
    """`p` if files can be made in directory `d`, else the UserError saying why (`what` `path`: as given)."""
    problem = _cannot_write_in(d)
    if problem:
        raise UserError(f"{what} {path}: cannot write in {d} ({problem}); choose a directory you can write to")
    return p


def _existing_ancestor(p: Path) -> Path:
    """The nearest of `p`'s parents that exists (or `p` itself)."""
    for a in (p, *p.parents):
        if a.exists() or a.is_symlink():
            return a
    return Path(".")


def _cannot_write_in(d: Path) -> str | None:
    """Why no file can be made in directory `d`, or None. Tried for real with a temporary file, removed at once:
    os.access alone says yes to root where the file system still refuses (/proc, /sys, a read-only mount)."""
    if not os.access(d, os.W_OK | os.X_OK):
        return "permission denied"
    try:
        fd, name = tempfile.mkstemp(dir=d, prefix=".speechrt-write-check-")
    except OSError as e:  # /proc answers ENOENT for a new name in an existing directory
        return "it takes no new files" if e.errno == errno.ENOENT else e.strerror or type(e).__name__
    os.close(fd)
    os.unlink(name)
    return None


def _cannot_overwrite(p: Path) -> str | None:
    """Why the existing `p` cannot be written, or None. A regular file is opened for appending (nothing is
    written); anything else (a device, a pipe, which opening could block on) is asked through os.access."""
    if not p.is_file():
        return None if os.access(p, os.W_OK) else "permission denied"
    try:
        with open(p, "ab"):
            return None
    except OSError as e:
        return e.strerror or type(e).__name__
