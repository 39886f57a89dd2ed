"""Atomic file writes: a reader (or a crash) sees the old file or the new, never half."""

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
