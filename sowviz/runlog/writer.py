"""The run log writer: `model.json` once (atomically), every step appended to `steps.log`."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from .._files import atomic_write
from .._model import jsonable
from . import format as fmt
from .sink import Sink

MODEL_FILE = "model.json"
STEPS_FILE = "steps.log"

_NOT_WRITABLE = (
    "sowviz: `log_dir` {path!r} cannot hold a run log: {why}. Pass a directory this "
    "process can create and write to (e.g. `log_dir='runs/exp1'`)."
)
_EXISTS = (
    "sowviz: `log_dir` {path!r} already holds a run log ({file}, {size} bytes). Pick a new "
    "`log_dir` for a new run, or delete the old log first; sowviz never appends one run "
    "to another's log."
)


def model_bytes(model: dict[str, Any]) -> bytes:
    text = json.dumps(jsonable(model), ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8")


def prepare_dir(log_dir: str | os.PathLike, *, overwrite: bool = False) -> pathlib.Path:
    """Create `log_dir` and check it is writable now, at construction, with a clear error."""
    path = pathlib.Path(log_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(_NOT_WRITABLE.format(path=str(path), why=err)) from err
    if not path.is_dir():
        raise ValueError(_NOT_WRITABLE.format(path=str(path), why="it is not a directory"))
    steps = path / STEPS_FILE
    if steps.exists() and steps.stat().st_size > 0 and not overwrite:
        raise FileExistsError(
            _EXISTS.format(path=str(path), file=STEPS_FILE, size=steps.stat().st_size)
        )
    probe = path / f".sowviz-write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ValueError(_NOT_WRITABLE.format(path=str(path), why=err)) from err
    return path


class LogSink(Sink):
    """Appends every step to `log_dir/steps.log`; `model.json` holds the graph.

    The file is opened for appending at construction (so an unwritable directory fails
    there); every record is one `os.write` of a framed, checksummed payload. Records
    reach the operating system as they are written, so a killed process loses no
    complete step; `close()` also fsyncs (power loss is the only thing that can cost
    the steps written since the last fsync).
    """

    name = "run log"

    def __init__(self, log_dir: str | os.PathLike, *, overwrite: bool = False) -> None:
        self.path = prepare_dir(log_dir, overwrite=overwrite)
        if overwrite:
            (self.path / MODEL_FILE).unlink(missing_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC
        try:
            self._fd: int | None = os.open(self.path / STEPS_FILE, flags, 0o644)
        except OSError as err:
            raise ValueError(_NOT_WRITABLE.format(path=str(self.path), why=err)) from err
        self.bytes_written = 0
        self.steps_written = 0
        super().__init__()

    def _open(self, model: dict[str, Any]) -> None:
        # The graph and the probe list; the history lives in steps.log.
        atomic_write(self.path / MODEL_FILE, model_bytes({**model, "history": None}))

    def _write(self, entry: dict[str, Any]) -> None:
        self._append(fmt.frame(fmt.STEP, fmt.encode(entry)))
        self.steps_written += 1

    def _append(self, record: bytes) -> None:
        assert self._fd is not None
        view = memoryview(record)
        while view:  # a regular file writes everything at once; loop for the rule's sake
            n = os.write(self._fd, view)
            view = view[n:]
        self.bytes_written += len(record)

    def _close(self) -> None:
        if self._fd is None:
            return
        self._append(fmt.frame(fmt.END, fmt.encode({})))
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None

    def _abort(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
