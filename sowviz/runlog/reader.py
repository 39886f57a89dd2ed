"""Reading a run log incrementally: every complete record since the last offset.

`LogReader.steps()` decodes the records one at a time as it reaches them, reading the
file in chunks: memory is bounded by a chunk and one step, whatever the log's length
(a 98,633-step log held every decoded step at once: 10 GB). `read()` collects them
into a list (fine for the few steps a live reader finds new)."""

from __future__ import annotations

import json
import os
import pathlib
import time
import warnings
from collections.abc import Generator, Iterator
from typing import Any

from .._caller import user_stacklevel
from . import format as fmt
from .writer import MODEL_FILE, STEPS_FILE

CHUNK = 16 << 20  # bytes read per pass over a large log (a record is ~10 KB; grown for a
# longer one, up to the format's 32 MiB)
# An incomplete record that stays incomplete this long, with the file not growing,
# is a dead writer's tail, not one being written now.
SETTLE_S = 0.1


class LogWarning(UserWarning):
    """Part of a run log could not be read (a corrupt or cut-off record) and was skipped."""


_MISSING = (
    "sowviz.load: `log_dir` {path!r} holds no run log ({what} is missing). Pass the "
    "`log_dir` given to `sowviz.Monitor(..., log_dir=...)`; the log appears with the "
    "first recorded step."
)


class LogReader:
    """Follows `log_dir/steps.log` from byte 0: `steps()` yields the steps appended since
    the last call, one at a time, and `read()` returns them as a list. Corrupt spans and
    a dead writer's cut-off tail are skipped with a `LogWarning` naming their byte
    offset."""

    def __init__(self, log_dir: str | os.PathLike) -> None:
        self.path = pathlib.Path(log_dir).expanduser()  # (`~/runs`: as the shell reads it)
        if not self.path.is_dir():
            raise FileNotFoundError(_MISSING.format(path=str(self.path), what="the directory"))
        self.offset = 0  # where the next unread record starts
        self.finished = False  # the writer closed the log cleanly
        #: Unrecorded steps found non-finite (`N` records) read and not yet taken (a
        #: reader takes them by emptying the list: `RunLogView` counts them): a Monitor
        #: with `every=N` checks every step, and the log says which were bad. Steps
        #: yielded by `steps()` say their own (`"finite"`).
        self.nonfinite_steps: list[int] = []
        #: Unrecorded steps' losses (`L` records: `every=N` computes one at every step),
        #: `(step, loss)` in step order, read and not yet taken (`RunLogView` takes
        #: those before each step it yields, then the rest). A record's losses come
        #: before the next recorded step's own record in the file.
        self.losses: list[tuple[int, float | None]] = []
        self._warned: set[int] = set()
        self._tail = 0  # offset of the last incomplete record seen

    @property
    def steps_path(self) -> pathlib.Path:
        return self.path / STEPS_FILE

    def model(self) -> dict[str, Any] | None:
        """The graph model (`model.json`), or None before the writer wrote it."""
        try:
            return json.loads((self.path / MODEL_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    def read(self, *, settle: bool = True) -> list[dict[str, Any]]:
        """Every complete step appended since the last call, oldest first (all held at
        once: a whole log's are better taken one at a time from `steps()`)."""
        return list(self.steps(settle=settle))

    def steps(self, *, settle: bool = True) -> Iterator[dict[str, Any]]:
        """Every complete step appended since the last call, oldest first, each decoded
        when it is reached: the caller keeps what it wants (`RunLogView` thins them into
        its history), and memory is bounded by one chunk of the file and one step.
        A step counts as read once yielded (`offset` is past it): stopping early, the
        next call goes on after the last one yielded.

        With `settle`, an incomplete record at the end is re-read after `SETTLE_S`:
        if the file has not grown meanwhile, the writer died mid-record, and the tail
        is reported (once) and skipped.
        """
        try:
            f = open(self.steps_path, "rb")
        except FileNotFoundError:
            return
        with f:
            size = os.fstat(f.fileno()).st_size
            want = CHUNK
            while self.offset < size:
                f.seek(self.offset)
                left = size - self.offset
                data = f.read(min(left, want))
                whole = len(data) == left
                before = self.offset
                status = yield from self._consume(data, final=whole)
                del data
                if whole:
                    if status == "incomplete" and settle and self._dead_tail(f):
                        self._warn(
                            self._tail,
                            f"an incomplete record at byte offset {self._tail} of "
                            f"{self.steps_path} (the writer stopped mid-record); skipped",
                        )
                    break
                # No whole record in the chunk (one longer than it, or corrupt bytes
                # with no good record after them yet): read twice as much (rare).
                no_progress = self.offset == before or status == "corrupt"
                want = want * 2 if no_progress else CHUNK

    def _consume(self, data: bytes, *, final: bool) -> Generator[dict[str, Any], None, str]:
        """Scan `data` (the file from `offset`): yield its complete steps, decoded, and
        advance `offset` past each record (before yielding it). Returns "end",
        "incomplete" (a cut-off record at the end, at `self._tail`) or "corrupt"
        (unreadable to the end of a partial chunk)."""
        base = self.offset
        for item in fmt.scan(data, base):
            if isinstance(item, fmt.Record):
                self.offset = item.end
                if item.kind == fmt.END:
                    self.finished = True
                    continue
                if fmt.KINDS.get(item.kind) != item.version:
                    self._warn(
                        -1,  # (said once per log)
                        f"{self.steps_path} holds records of a newer format (version "
                        f"{item.version}, first at byte offset {item.offset}), written "
                        "by a newer sowviz: skipped. Upgrade sowviz to read them",
                    )
                    continue
                try:
                    entry = fmt.decode(item.payload)
                except Exception as err:  # a checksum fine, a payload not: skip it
                    self._warn(
                        item.offset,
                        f"a record at byte offset {item.offset} that does not "
                        f"decode ({type(err).__name__}: {err}); skipped",
                    )
                    continue
                if item.kind == fmt.NONFINITE:
                    self.nonfinite_steps += [int(s) for s in entry.get("steps", [])]
                    continue
                if item.kind == fmt.LOSSES:
                    steps, losses = entry.get("steps", []), entry.get("loss", [])
                    self.losses += [(int(s), v) for s, v in zip(steps, losses, strict=False)]
                    continue
                yield entry
            elif isinstance(item, fmt.Corrupt):
                if item.resumed is None and not final:
                    return "corrupt"
                where = "the end" if item.resumed is None else f"byte offset {item.resumed}"
                self._warn(
                    item.offset,
                    f"corrupt bytes at byte offset {item.offset} of {self.steps_path} "
                    f"(a bad record header or checksum); skipped to {where}",
                )
                self.offset = base + len(data) if item.resumed is None else item.resumed
                if item.resumed is None:
                    return "end"
            else:
                self._tail = item
                return "incomplete" if item < base + len(data) else "end"
        return "end"

    def _dead_tail(self, f) -> bool:
        size = os.fstat(f.fileno()).st_size
        time.sleep(SETTLE_S)
        if os.fstat(f.fileno()).st_size != size:
            return False
        f.seek(self.offset)
        rest = f.read()
        for item in fmt.scan(rest, self.offset):
            if not isinstance(item, int):
                return False  # it completed meanwhile; the next read takes it
        self.offset = size  # skip it for good: later appends start after it
        return True

    def _warn(self, offset: int, message: str) -> None:
        if offset in self._warned:
            return
        self._warned.add(offset)
        warnings.warn(f"sowviz.load: {message}.", LogWarning, stacklevel=user_stacklevel())
