"""Sinks: where a Monitor's recorded steps go besides the widget.

A sink has `open(model)` (the sowviz/1 graph model, once; a later call replaces it),
`write(entry)` (one recorded step: the dict the Monitor appends to its history),
`losses(steps, losses)` (unrecorded steps' losses, in step order, each batch before
the next recorded step's `write`) and `close()`. The training loop only hands an
entry to a queue: the encoding and the writing happen on the sink's own thread, off
the step's critical path. A failure there (a full disk, a closed run) never raises
into the training step: the sink warns once, on the caller's thread at its next
call, and turns itself off.

A sink may also be retired from outside (`retire`): a newer Monitor given the same
`log_dir` takes the log of one whose first step failed (it holds no step), or of one
that is gone (`writer.LogSink`); the retired sink closes, and says why at its next
step.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import warnings
import weakref
from typing import Any

from .._caller import user_stacklevel

# Steps waiting for the writer thread; past this `write` blocks (the log keeps every
# step, so a writer that falls behind slows the loop rather than drop steps).
QUEUE_STEPS = 256
# Steps handed over and not yet written, at most: once this many wait, `write` waits
# until the writer is down to `LAG_STEPS // 2` (one wake-up), then hands its step over.
# A killed process loses what waits here (and the few steps its Monitor has not read
# yet), so a writer slower than the loop slows the loop: with the queue's 256 steps
# of slack, a 1 ms step killed at step 300 left a log ending at step 43-190 (building
# and encoding a step took its thread 0.5-1.5 ms, sharing the GIL with the loop). A
# Monitor's read hands 5 recorded steps over at once: a writer that keeps up never
# makes the loop wait.
LAG_STEPS = 8

_OPEN, _WRITE, _CLOSE, _NONFINITE, _LOSSES = "open", "write", "close", "nonfinite", "losses"
_live: weakref.WeakSet[Sink] = weakref.WeakSet()


class SinkWarning(RuntimeWarning):
    """A sink failed (e.g. the disk is full) and stopped; training goes on."""


class SinkStopped(Exception):
    """Why a sink stopped, in words whole enough to be the warning itself (a removed
    log directory: what was lost and what to do), rather than an `OSError` quoted."""


class Retired(SinkStopped):
    """The sink was closed from outside (`Sink.retire`): said when its Monitor next
    hands it a step, not at `flush()`/`close()` (nothing was lost there)."""


class Sink:
    """Base class: subclasses implement `_open`, `_write` and `_close`, run on a worker
    thread in call order."""

    name = "sink"
    lazy_entries = True  # a Monitor may hand lazy entries: converted on the worker thread

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=QUEUE_STEPS)
        # `write`s handed over and not yet done (`LAG_STEPS`), and the writer's signal
        # that there is room again
        self._backlog = 0
        self._room = threading.Condition()
        self._error: BaseException | None = None
        self._reported = False
        self.disabled = False
        self.closed = False
        #: Whether a newer writer of the same log may take this one's place: set by the
        #: Monitor while none of its steps has run (its first one failed), or once it
        #: is gone; never while it may still write a step.
        self.takeable = False
        #: The sinks made together for one Monitor (`make_sinks`): retired together.
        self.group: tuple[Sink, ...] = (self,)
        #: CPU seconds of this sink's thread, over every step so far: building the
        #: Monitor's lazy entries into dicts (each is built once, by whichever sink
        #: reads it first; the others find it built) and encoding and writing them.
        #: What the sink costs the process besides the training loop's thread.
        self.cpu_entries = 0.0
        self.cpu_writing = 0.0
        self._thread = threading.Thread(target=self._work, name=f"sowviz-{self.name}", daemon=True)
        self._thread.start()
        _live.add(self)

    # -- the caller's side (the training loop) ---------------------------------------

    def open(self, model: dict[str, Any]) -> None:
        self._put(_OPEN, model)

    def write(self, entry: dict[str, Any]) -> None:
        self._put(_WRITE, entry)

    def nonfinite_steps(self, steps: list[int]) -> None:
        """Unrecorded steps found non-finite (`Monitor(every=N)` checks every step), as
        one read of its running flag names them: a few at a time."""
        self._put(_NONFINITE, list(steps))

    def losses(self, steps: list[int], losses: list[float | None]) -> None:
        """Unrecorded steps' losses (`Monitor(every=N)` computes one at every step), a
        few at a time as one read takes them, in step order with the `write`s."""
        self._put(_LOSSES, (list(steps), list(losses)))

    def flush(self) -> None:
        """Wait until everything handed over so far is written."""
        if not self.disabled and self._thread.is_alive():
            self._queue.join()
        self._report()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._thread.is_alive():
            self._queue.put((_CLOSE, None))
            self._thread.join()
        self._report()

    def retire(self, notice: str | None = None) -> None:
        """Close now (from any thread but this sink's own), and drop every later step;
        `notice`, if any, is warned (`SinkWarning`) when the Monitor next hands over a
        step."""
        self.close()
        if self._error is None and notice is not None:
            self._error = Retired(notice)
        self.disabled = True

    def _put(self, op: str, item: Any) -> None:
        self._report(handing=True)
        if self.disabled or self.closed:
            return
        if op == _WRITE:
            # Waits before handing over, not after: a Ctrl-C in the wait hands nothing
            # over, and the Monitor's next attempt writes the step once.
            self._wait_for_room()
            with self._room:
                self._backlog += 1
        self._queue.put((op, item))

    def _wait_for_room(self) -> None:
        """Back-pressure (`LAG_STEPS`): the loop waits while the writer trails."""
        with self._room:
            if self._backlog < LAG_STEPS:
                return
            # (the timeout: a writer thread that ended is noticed)
            while self._backlog > LAG_STEPS // 2 and not self.disabled and self._thread.is_alive():
                self._room.wait(0.5)

    def _report(self, *, handing: bool = False) -> None:
        err = self._error
        if err is None or self._reported or (isinstance(err, Retired) and not handing):
            return
        self._reported = True
        if isinstance(err, SinkStopped):
            text = str(err)
        else:
            text = (
                f"sowviz: the {self.name} stopped and records no more steps "
                f"({type(err).__name__}: {err}); training goes on."
            )
        warnings.warn(text, SinkWarning, stacklevel=user_stacklevel())  # the `mon.step` line

    # -- the worker thread -------------------------------------------------------------

    def _work(self) -> None:
        while True:
            op, item = self._queue.get()
            try:
                if self._error is None:
                    if op == _OPEN:
                        self._open(item)
                    elif op == _WRITE:
                        self._write_timed(item)
                    elif op == _NONFINITE:
                        self._nonfinite_steps(item)
                    elif op == _LOSSES:
                        self._losses(*item)
                    else:
                        self._close()
            except Exception as err:  # reported on the caller's thread
                self._error = err
                self.disabled = True
                try:
                    self._abort()
                except Exception:
                    pass
            finally:
                if op == _WRITE or self.disabled:
                    with self._room:
                        self._backlog -= op == _WRITE
                        # one wake-up for a waiting loop, once it may hand over again
                        if self._backlog <= LAG_STEPS // 2 or self.disabled:
                            self._room.notify_all()
                self._queue.task_done()
            if op == _CLOSE:
                return

    def _write_timed(self, item: Any) -> None:
        start = time.thread_time()
        entry = item.materialize() if hasattr(item, "materialize") else item  # a lazy entry
        built = time.thread_time()
        self.cpu_entries += built - start
        self._write(entry)
        self.cpu_writing += time.thread_time() - built

    def _open(self, model: dict[str, Any]) -> None:
        pass

    def _write(self, entry: dict[str, Any]) -> None:
        raise NotImplementedError

    def _nonfinite_steps(self, steps: list[int]) -> None:
        pass  # (a sink that logs only recorded steps)

    def _losses(self, steps: list[int], losses: list[float | None]) -> None:
        pass  # (a sink that logs only recorded steps)

    def _close(self) -> None:
        pass

    def _abort(self) -> None:
        """Release resources after a failure."""


@atexit.register
def _close_all() -> None:
    # Steps still queued at interpreter exit are written (daemon threads would die).
    for sink in list(_live):
        try:
            sink.close()
        except Exception:
            pass
