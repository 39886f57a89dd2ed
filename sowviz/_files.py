"""Files: atomic writes (a reader, or a crash, sees the old file or the new, never half),
and whether a file a writer holds open still has a name."""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import tempfile


def atomic_write(path: str | os.PathLike, data: bytes, *, what: str = "the file") -> pathlib.Path:
    """Write `data` to `path` (`~` expanded) through a temporary file in the same
    directory, fsynced, then renamed over `path` (`os.replace`): a failed write leaves
    any previous file intact and removes the temporary one. Returns the path written.

    A failure raises the `OSError` subclass the system gave, with a message naming
    the path (not the temporary file's), why, and the fix: `what` names the file in
    it ("the report"). The system's error is its `__cause__`."""
    out = pathlib.Path(path).expanduser()
    if out.is_dir():  # before writing a temporary file beside it
        raise _cannot_write(out, IsADirectoryError(errno.EISDIR, "Is a directory"), what)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these are ordinary files
        os.replace(tmp, out)
    except BaseException as err:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(err, OSError):
            raise _cannot_write(out, err, what) from err
        raise
    return out


def _cannot_write(out: pathlib.Path, err: OSError, what: str = "the file") -> OSError:
    """`err` (raised writing `out`) again, as its own type, with a message naming `out`
    rather than a temporary file, why, and what to do."""
    parent = out.parent
    if out.is_dir():
        why = f"{out} is a directory (give a file path, e.g. {out / _example_name(what)})"
    elif not parent.exists():
        why = f"the directory {parent} does not exist (create it first, e.g. `mkdir -p {parent}`)"
    elif not parent.is_dir():
        why = f"{parent} is a file, not a directory (choose another path)"
    elif isinstance(err, PermissionError):
        why = f"permission denied in {parent} (choose a directory you can write to)"
    else:
        why = err.strerror or str(err)
    return type(err)(f"sowviz: cannot write {what} to {out}: {why}")


def _example_name(what: str) -> str:
    """An example file name for `what` ("the report" -> "report.html")."""
    return "report.html" if "report" in what else "out"


def file_key(fd: int) -> tuple[int, int]:
    """The (device, inode) of the file open as `fd`: which file it is, whatever its name."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def unlinked(fd: int) -> bool:
    """Whether the file open as `fd` has lost its last name: deleted, or its directory
    removed. A writer holding it open never notices (its writes go on, into a file no
    name reaches); a file renamed or moved keeps a name, and its writer goes on. One
    `fstat`: about a microsecond."""
    return os.fstat(fd).st_nlink == 0
