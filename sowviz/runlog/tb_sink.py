"""TensorBoard event files from a Monitor's steps, written by tensorboardX's writer.

Histograms go in as `HistogramProto`s built from sowviz's on-device bins: TensorBoard
reads bucket i as (bucket_limit[i-1], bucket_limit[i]] with `min` the left edge of
the first, so `bucket_limit = edges[1:]`, `bucket = counts`, `min = edges[0]`,
`max = edges[-1]` (the convention of TensorBoard's own `histogram_raw`); a constant
array is one bucket of width zero at its value (`min = max`). Nothing is
re-binned or sampled on the host, and early steps are all kept (no reservoir).

Why tensorboardX and not the `tensorboard` package's writer: every record carries
two CRC-32C checksums, and `tensorboard` (without TensorFlow) computes them in pure
Python, ≈ 2 µs per byte, tens of milliseconds of GIL per step taken from the training
loop's thread. tensorboardX uses the compiled `crc32c` package when it is installed
(the `tensorboard` extra installs both). The files are the same TFRecord event files.
"""

from __future__ import annotations

import itertools
import os
import time
import warnings
from typing import Any

from .._caller import user_stacklevel
from .._files import unlinked
from .naming import Hist, Scalar, probe_tags
from .naming import items as step_items
from .sink import Sink, SinkStopped

_MISSING = (
    "sowviz: `tensorboard=True` needs the `tensorboardX` package (and `crc32c`, so "
    "it is fast): `pip install 'sowviz[tensorboard]'` (or `pip install tensorboardX crc32c`)."
)
_SLOW = (
    "sowviz: the `crc32c` package is not installed, so tensorboardX checksums the "
    "TensorBoard event records in pure Python (milliseconds of GIL per step); "
    "`pip install crc32c` makes it ~1000x cheaper."
)
_REMOVED = (
    "sowviz: the TensorBoard event file {file!r} was deleted while this Monitor wrote it "
    "(its directory {path!r} removed, or the file itself): the TensorBoard writer "
    "stops here (noticed {when}); training goes on. The steps are still in memory "
    "(`mon.history`, thinned): `mon.save_html('run.html')` saves them. To log the rest, "
    "make a new Monitor with a new `log_dir` (or `tensorboard=` directory) and "
    "`start_step=` the next step."
)
# Event files are flushed to the OS this often, so a live TensorBoard sees new steps.
FLUSH_SECS = 5.0
_file_ids = itertools.count()


def require() -> None:
    """Raise the `ImportError` `TensorBoardSink` would, before anything is created."""
    try:
        import tensorboardX.event_file_writer
        import tensorboardX.proto.event_pb2
        import tensorboardX.proto.summary_pb2  # noqa: F401
    except ImportError as err:
        raise ImportError(_MISSING) from err


def _library():
    try:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto import event_pb2
    except ImportError as err:
        raise ImportError(_MISSING) from err
    try:
        import crc32c  # noqa: F401  (tensorboardX picks it up by itself)
    except ImportError:
        warnings.warn(_SLOW, RuntimeWarning, stacklevel=user_stacklevel())
    return event_pb2, EventsWriter


class TensorBoardSink(Sink):
    """Writes `loss` (every step's, recorded or not), per-probe `l2` / `nonfinite`
    scalars and histograms per stage and mode (recorded steps) into `logdir` (default
    `log_dir/tensorboard`)."""

    name = "TensorBoard writer"

    def __init__(self, logdir: str | os.PathLike) -> None:
        self._event_pb2, writer_cls = _library()
        self.logdir = str(logdir)
        try:
            os.makedirs(self.logdir, exist_ok=True)
            # tensorboardX's synchronous `EventsWriter` (its `FileWriter` adds a second
            # thread and a multiprocessing queue that pickles every event): this sink's
            # own thread already keeps the writing off the training step. The suffix
            # keeps two writers started in the same second from sharing a file name.
            suffix = f".{os.getpid()}.{next(_file_ids)}"
            self._writer = writer_cls(os.path.join(self.logdir, "events"), suffix)
            self.file = _event_file(self.logdir, suffix)
            # tensorboardX's own file object is its writer's: this descriptor of the same
            # file tells, with no read, whether it is deleted (`_check_still_there`).
            self._watch: int | None = os.open(self.file, os.O_RDONLY)
        except OSError as err:
            raise ValueError(
                f"sowviz: the TensorBoard directory {self.logdir!r} is not writable ({err}); "
                "pass a `log_dir` (or `tensorboard=` directory) you can write to."
            ) from err
        self._tags: dict[str, str] = {}
        self._flushed = time.monotonic()
        super().__init__()

    def _open(self, model: dict[str, Any]) -> None:
        self._tags = probe_tags(model)

    def _check_still_there(self, when: str) -> None:
        """Stop (with the warning that says what to do) once the event file is deleted:
        its writer would go on writing into a file no name reaches. One `fstat`."""
        if self._watch is not None and unlinked(self._watch):
            raise SinkStopped(_REMOVED.format(file=self.file, path=self.logdir, when=when))

    def _write(self, entry: dict[str, Any]) -> None:
        self._check_still_there(f"at step {entry.get('step')}")
        event = self._event_pb2.Event(wall_time=time.time(), step=int(entry["step"]))
        _add_values(event.summary.value, list(step_items(entry, self._tags)))
        self._writer.write_event(event)
        if time.monotonic() - self._flushed >= FLUSH_SECS:
            self._flush_file()

    def _losses(self, steps: list[int], losses: list[float | None]) -> None:
        # Unrecorded steps' `loss` (`every=N`): one event per step, in step order
        # before the next recorded step's (TensorBoard drops a tag's later steps when
        # a step goes back).
        self._check_still_there(f"at step {steps[-1]}")
        now = time.time()
        for step, loss in zip(steps, losses, strict=True):
            if loss is None:
                continue
            event = self._event_pb2.Event(wall_time=now, step=int(step))
            event.summary.value.add(tag="loss", simple_value=float(loss))
            self._writer.write_event(event)
        if time.monotonic() - self._flushed >= FLUSH_SECS:
            self._flush_file()

    def _flush_file(self) -> None:
        self._writer.flush()
        self._flushed = time.monotonic()

    def _close(self) -> None:
        self._writer.close()
        try:
            self._check_still_there("at close")
        finally:
            self._unwatch()

    def _abort(self) -> None:
        try:
            self._writer.close()
        except Exception:
            pass
        self._unwatch()

    def _unwatch(self) -> None:
        if self._watch is not None:
            fd, self._watch = self._watch, None
            os.close(fd)

    def flush(self) -> None:
        super().flush()  # the queue is drained: the worker thread is idle
        if not self.disabled and not self.closed:
            self._flush_file()


def _event_file(logdir: str, suffix: str) -> str:
    """The event file the writer just created: the one whose name ends with `suffix`
    (this process's id and writer count, unique here)."""
    (name,) = [n for n in os.listdir(logdir) if n.startswith("events.") and n.endswith(suffix)]
    return os.path.join(logdir, name)


def _add_values(values, items: list[Hist | Scalar]) -> None:
    """Each item as a `Summary.Value` added to `values` and filled in place (a message
    built apart, then added, is copied once more at each level)."""
    for item in items:
        if type(item) is Hist:
            value = values.add()
            value.tag = item.tag
            _fill_histogram(value.histo, item)
        else:
            values.add(tag=item.tag, simple_value=item.value)


def _fill_histogram(proto, h: Hist) -> None:
    """`proto` (a `HistogramProto`) from sowviz's bins: `num = sum(counts)`,
    `sum = mean·num`, `sum_squares = (std² + mean²)·num`, the rest as the module
    docstring says. The bins go in whole (`extend` converts them in C): a Python loop
    over a step's ~50 histograms of ~65 numbers was most of the time of its write, and
    counts handed over as ints take protobuf's slow path, so they become floats first.
    """
    s, edges, counts = h.summary, h.edges, h.counts
    num = sum(counts)
    lo, hi = s.get("min"), s.get("max")
    if num and lo is not None and lo == hi:
        # A constant array (a zero-initialised bias, a scalar loss): sowviz's bins are
        # widened around it (`summary`'s docstring), which TensorBoard would read as a
        # range of values; one bucket of width zero at the value says what it is.
        edges, counts = [float(lo), float(lo)], [num]
    mean = float(s.get("mean") or 0.0)
    std = float(s.get("std") or 0.0)
    proto.min, proto.max = edges[0], edges[-1]
    proto.num = num
    proto.sum = mean * num
    proto.sum_squares = (std * std + mean * mean) * num
    proto.bucket_limit.extend(edges[1:])
    proto.bucket.extend(map(float, counts))
