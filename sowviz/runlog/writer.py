"""The run log writer: `model.json` once (atomically), every step appended to `steps.log`."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import threading
import weakref
from typing import Any

try:  # advisory locks: POSIX only (elsewhere two writers of one log are not detected)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

from .._files import atomic_write, file_key, unlinked
from .._model import jsonable
from . import format as fmt
from .sink import Sink, SinkStopped

MODEL_FILE = "model.json"
STEPS_FILE = "steps.log"

_NOT_WRITABLE = (
    "sowviz: `log_dir` {path!r} cannot hold a run log: {why}. Pass a directory this "
    "process can create and write to (e.g. `log_dir='runs/exp1'`)."
)
_EXISTS = (
    "sowviz: `log_dir` {path!r} already holds a run log ({file}, {size} bytes). Pick a new "
    "`log_dir` for a new run, or delete the old log first; sowviz never appends one run "
    "to another's log. Resuming from a checkpoint? Give the resumed part a `log_dir` of "
    "its own beside the first (e.g. '{path}-resumed') and pass `start_step=` the "
    "checkpoint's step: its steps are numbered on from there, and `python -m sowviz "
    "report {path} {path}-resumed` (or `sowviz.load` of both) reads the two as one run."
)
_BUSY = (
    "sowviz: `log_dir` {path!r} is being written by another Monitor (in this process or "
    "another one): close that one first (`mon.close()`), or give each Monitor its own "
    "`log_dir` (e.g. '{path}-eval' for the second). Two writers would "
    "interleave their steps in one log."
)
_EMPTY = (
    "sowviz: `log_dir` is the empty string, which would put the run log in the current "
    "directory. Pass a directory (e.g. `log_dir='runs/exp1'`), or `log_dir=None` for no "
    "run log (e.g. `log_dir=os.environ.get('LOG_DIR') or None`)."
)
_NOT_A_PATH = (
    "sowviz: `log_dir` must be a directory path, a str or an os.PathLike such as "
    "pathlib.Path (e.g. `log_dir='runs/exp1'`), or None for no run log; got {type} "
    "{value!r}."
)
_REMOVED = (
    "sowviz: the run log {file!r} was deleted while this Monitor wrote it (its `log_dir` "
    "{path!r} removed, or the file itself): the steps it held went with it, and no "
    "later step reaches the disk (noticed {when}); training goes on. The steps are still "
    "in memory (`mon.history`, thinned): "
    "`mon.save_html('run.html')` saves them. To log the rest, make a new Monitor with a "
    "new `log_dir` and `start_step=` the next step."
)
_TAKEN = (
    "sowviz: the run log in {path!r} was taken by a newer Monitor given the same "
    "`log_dir`: this Monitor's steps had all failed, so it held no step. This Monitor "
    "records no more steps there, nor to its other loggers (TensorBoard, W&B); "
    "`mon.history` still records. Step the newer Monitor, or give this one a `log_dir` "
    "of its own."
)
# A log longer than this holds steps (a step's record is ~1-100 KB; a run that
# recorded nothing wrote one 26-byte end record): not read to find out.
_READ_AT_MOST = 1 << 20


def model_bytes(model: dict[str, Any]) -> bytes:
    text = json.dumps(jsonable(model), ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8")


def check_log_dir(log_dir: str | os.PathLike) -> None:
    """Refuse `log_dir=""` (`os.environ.get("LOG_DIR", "")` unset): `pathlib.Path("")`
    is the current directory, where the run log would land unasked. Refuse what is no
    path (`log_dir=3`: Python's own error named neither `log_dir` nor sowviz)."""
    if not isinstance(log_dir, (str, os.PathLike)):
        raise TypeError(_NOT_A_PATH.format(type=type(log_dir).__name__, value=log_dir))
    if isinstance(log_dir, (str, bytes)) and not log_dir:
        raise ValueError(_EMPTY)


def prepare_dir(log_dir: str | os.PathLike) -> pathlib.Path:
    """Create `log_dir` and check it is writable now, at construction, with a clear error."""
    check_log_dir(log_dir)
    path = pathlib.Path(log_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(_NOT_WRITABLE.format(path=str(path), why=err)) from err
    if not path.is_dir():
        raise ValueError(_NOT_WRITABLE.format(path=str(path), why="it is not a directory"))
    probe = path / f".sowviz-write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ValueError(_NOT_WRITABLE.format(path=str(path), why=err)) from err
    return path


def holds_steps(steps: pathlib.Path) -> bool:
    """Whether `steps.log` holds a run: a step, or bytes that are not a record. A log
    with no step (a script that stopped before its first recorded step left an end
    record only) holds nothing to keep, so the run that follows may take its place."""
    size = steps.stat().st_size if steps.exists() else 0
    if size == 0:
        return False
    if size > _READ_AT_MOST:
        return True
    for rec in fmt.scan(steps.read_bytes(), 0):
        if isinstance(rec, int):
            return rec != size  # an incomplete record at the end: a writer's step
        if not isinstance(rec, fmt.Record) or rec.kind != fmt.END:
            return True
    return False


# The logs this process writes, by the (device, inode) of their `steps.log`: a writer
# that finds a log locked asks here whether the holder is this process's and may give
# it up (`LogSink.takeable`).
_holders: weakref.WeakValueDictionary[tuple[int, int], LogSink] = weakref.WeakValueDictionary()
_holders_lock = threading.Lock()


def _lock(fd: int, path: pathlib.Path) -> None:
    """Hold an exclusive advisory lock on the open log (released when it is closed, or
    when the process dies): a second writer of the same log fails at construction,
    unless the holder is a sink of this process that may give the log up (`_take`)."""
    if fcntl is None:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if not _take(fd):
            # (`from None`: the lock's BlockingIOError, "Resource temporarily
            # unavailable", says nothing the message does not)
            raise FileExistsError(_BUSY.format(path=str(path))) from None
    except OSError:  # a file system without locks (some network mounts): write unlocked
        pass


def _take(fd: int) -> bool:
    """Take the log open as `fd` from the sink of this process that holds it, when that
    sink's Monitor has failed every step it tried (it wrote no step) or is gone: the
    holder and the sinks made with it are closed first (its file, and so its lock,
    with them), so the log never has two writers. False when the holder must keep it
    (another process's, or a Monitor that ran a step)."""
    with _holders_lock:  # (not held while retiring: the holder's thread takes it to leave)
        holder = _holders.get(file_key(fd))
    if holder is None or holder.closed or not holder.takeable:
        return False
    for sink in holder.group:
        sink.retire(_TAKEN.format(path=str(holder.path)) if sink is holder else None)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # a child process forked by the holder's still has it
        return False
    return True


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
        self.path = prepare_dir(log_dir)
        steps = self.path / STEPS_FILE
        try:
            # Not truncated yet: another writer may hold it (checked under the lock).
            self._fd: int | None = os.open(steps, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as err:
            raise ValueError(_NOT_WRITABLE.format(path=str(self.path), why=err)) from err
        try:
            _lock(self._fd, self.path)
            if not overwrite and holds_steps(steps):
                size = steps.stat().st_size
                raise FileExistsError(
                    _EXISTS.format(path=str(self.path), file=STEPS_FILE, size=size)
                )
            if os.fstat(self._fd).st_size:  # a log of no step, left by a run that stopped
                os.ftruncate(self._fd, 0)
            (self.path / MODEL_FILE).unlink(missing_ok=True)
            self._key = file_key(self._fd)
        except BaseException:
            os.close(self._fd)
            raise
        self.bytes_written = 0
        self.steps_written = 0
        super().__init__()
        with _holders_lock:
            _holders[self._key] = self

    def _check_still_there(self, when: str) -> None:
        """Stop (with the warning that says what to do) once `steps.log` is deleted: a
        removed `log_dir` takes no write error, and every step after would go into a
        file nobody can read. One `fstat`, on this sink's thread."""
        assert self._fd is not None
        if unlinked(self._fd):
            steps = self.path / STEPS_FILE
            raise SinkStopped(_REMOVED.format(file=str(steps), path=str(self.path), when=when))

    def _open(self, model: dict[str, Any]) -> None:
        # The graph and the probe list; the history lives in steps.log.
        self._check_still_there("writing the model")
        atomic_write(self.path / MODEL_FILE, model_bytes({**model, "history": None}))

    def _write(self, entry: dict[str, Any]) -> None:
        self._check_still_there(f"at step {entry.get('step')}")
        self._append(fmt.frame(fmt.STEP, fmt.encode(entry)))
        self.steps_written += 1

    def _nonfinite_steps(self, steps: list[int]) -> None:
        # Unrecorded steps found non-finite, as one read of the Monitor's running flag
        # named them (a few a record: one per read, never one per step).
        self._check_still_there(f"at step {steps[-1]}")
        self._append(fmt.frame(fmt.NONFINITE, fmt.encode({"steps": steps})))

    def _losses(self, steps: list[int], losses: list[float | None]) -> None:
        # Unrecorded steps' losses (`every=N`), as one read of the Monitor took them (a
        # few a record); the recorded steps' are in their own step records.
        self._check_still_there(f"at step {steps[-1]}")
        self._append(fmt.frame(fmt.LOSSES, fmt.encode({"steps": steps, "loss": losses})))

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
        self._check_still_there("at close")
        self._append(fmt.frame(fmt.END, fmt.encode({})))
        os.fsync(self._fd)
        self._abort()

    def _abort(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
        with _holders_lock:
            if _holders.get(self._key) is self:
                del _holders[self._key]


def writing_log_dir(path: pathlib.Path) -> pathlib.Path | None:
    """The `log_dir` of a run log this process is writing that the existing file `path`
    belongs to: its `steps.log` (by any name that reaches it), or any file directly in
    that directory (`model.json`). None when it belongs to none. (`save_html` onto one
    replaced the log under its Monitor.)"""
    try:
        key = os.stat(path)
    except OSError:
        return None
    with _holders_lock:
        holders = list(_holders.items())
    for held, sink in holders:
        if held == (key.st_dev, key.st_ino):
            return sink.path
        with contextlib.suppress(OSError):
            if os.path.samefile(pathlib.Path(path).parent, sink.path):
                return sink.path
    return None
