"""Files: atomic writes (a reader, or a crash, sees the old file or the new, never half),
and whether a file a writer holds open still has a name."""

from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile


def atomic_write(path: str | os.PathLike, data: bytes) -> pathlib.Path:
    """Write `data` to `path` through a temporary file in the same directory, fsynced,
    then renamed over `path` (`os.replace`): a failed write leaves any previous file
    intact and removes the temporary one. Returns the path."""
    out = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these are ordinary files
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return out


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
