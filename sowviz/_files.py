"""Files: atomic writes (a reader, or a crash, sees the old file or the new, never half),
and whether a file a writer holds open still has a name."""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import tempfile
from collections.abc import Callable


def atomic_write(
    path: str | os.PathLike,
    data: bytes,
    *,
    what: str = "the file",
    may_replace: Callable[[pathlib.Path], None] | None = None,
) -> pathlib.Path:
    """Write `data` to `path` (`~` expanded) through a temporary file in the same
    directory, fsynced, then renamed over `path` (`os.replace`): a failed write leaves
    any previous file intact and removes the temporary one. Returns `path` (expanded).

    An existing file is replaced only where `open(path, "w")` would write it: a
    write-protected one raises `PermissionError` (a rename needs only the directory's
    permission, and replaced a `chmod 444` file), and a symlink is written through
    (the temporary file beside its target), not replaced. `may_replace(target)`, when
    given, is called with an existing target first and raises to refuse it.

    A failure raises the `OSError` subclass the system gave, with a message naming
    the path (not the temporary file's), why, and the fix: `what` names the file in
    it ("the report"). The system's error is its `__cause__`."""
    out = named = pathlib.Path(path).expanduser()
    if out.is_symlink():  # `open(link, "w")` writes the target; a rename would replace the link
        out = pathlib.Path(os.path.realpath(out))
    if out.is_dir():  # before writing a temporary file beside it
        raise _cannot_write(out, IsADirectoryError(errno.EISDIR, "Is a directory"), what)
    if os.path.lexists(out):
        if not _writable(out):
            raise _cannot_write(out, PermissionError(errno.EACCES, "Permission denied"), what)
        if may_replace is not None:
            may_replace(out)
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
    return named


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
    elif isinstance(err, PermissionError) and os.path.lexists(out) and not _writable(out):
        why = (
            "the file is write-protected, and sowviz does not replace a file you cannot "
            "write (`open(path, 'w')` would fail too): choose another path, or make it "
            f"writable first (`chmod u+w {out}`)"
        )
    elif isinstance(err, PermissionError):
        why = f"permission denied in {parent} (choose a directory you can write to)"
    else:
        why = err.strerror or str(err)
    return type(err)(f"sowviz: cannot write {what} to {out}: {why}")


def _writable(out: pathlib.Path) -> bool:
    """Whether this process may write the existing file `out`, as `open(out, "w")`
    checks it (mode bits, ACLs, root's CAP_DAC_OVERRIDE; effective ids where the system
    can check them)."""
    effective = os.access in os.supports_effective_ids
    return os.access(out, os.W_OK, effective_ids=effective)


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
