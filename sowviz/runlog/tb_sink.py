"""TensorBoard event files from a Monitor's steps, written by TensorBoard's own code.

Histograms go in as `HistogramProto`s built from sowviz's on-device bins: TensorBoard
reads bucket i as (bucket_limit[i-1], bucket_limit[i]] with `min` the left edge of
the first, so `bucket_limit = edges[1:]`, `bucket = counts`, `min = edges[0]`,
`max = edges[-1]` (the convention of TensorBoard's own `histogram_raw`). Nothing is
re-binned or sampled on the host, and early steps are all kept (no reservoir).
"""

from __future__ import annotations

import os
import time
from typing import Any

from .naming import Hist, probe_tags
from .naming import items as step_items
from .sink import Sink

_MISSING = (
    "sowviz: `tensorboard=True` needs the `tensorboard` package: "
    "`pip install 'sowviz[tensorboard]'` (or `pip install tensorboard`)."
)


def _protos():
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as err:
        raise ImportError(_MISSING) from err
    return event_pb2, summary_pb2, EventFileWriter


class TensorBoardSink(Sink):
    """Writes `loss`, per-probe `l2` / `nonfinite` scalars and histograms per stage and
    mode into `logdir` (default `log_dir/tensorboard`)."""

    name = "TensorBoard writer"

    def __init__(self, logdir: str | os.PathLike) -> None:
        self._event_pb2, self._summary_pb2, writer_cls = _protos()
        self.logdir = str(logdir)
        try:
            os.makedirs(self.logdir, exist_ok=True)
            self._writer = writer_cls(self.logdir, max_queue_size=64, flush_secs=5)
        except OSError as err:
            raise ValueError(
                f"sowviz: the TensorBoard directory {self.logdir!r} is not writable ({err}); "
                "pass a `log_dir` (or `tensorboard=` directory) you can write to."
            ) from err
        self._tags: dict[str, str] = {}
        super().__init__()

    def _open(self, model: dict[str, Any]) -> None:
        self._tags = probe_tags(model)

    def _write(self, entry: dict[str, Any]) -> None:
        sp = self._summary_pb2
        values = []
        for item in step_items(entry, self._tags):
            if isinstance(item, Hist):
                values.append(sp.Summary.Value(tag=item.tag, histo=_histogram(sp, item)))
            else:
                values.append(sp.Summary.Value(tag=item.tag, simple_value=item.value))
        event = self._event_pb2.Event(
            wall_time=time.time(), step=int(entry["step"]), summary=sp.Summary(value=values)
        )
        self._writer.add_event(event)

    def _close(self) -> None:
        self._writer.close()

    def _abort(self) -> None:
        try:
            self._writer.close()
        except Exception:
            pass

    def flush(self) -> None:
        super().flush()
        if not self.disabled and not self.closed:
            self._writer.flush()


def _histogram(sp, h: Hist):
    s = h.summary
    n = int(sum(h.counts))
    mean = float(s.get("mean") or 0.0)
    std = float(s.get("std") or 0.0)
    return sp.HistogramProto(
        min=float(h.edges[0]),
        max=float(h.edges[-1]),
        num=float(n),
        sum=mean * n,
        sum_squares=(std * std + mean * mean) * n,
        bucket_limit=[float(e) for e in h.edges[1:]],
        bucket=[float(c) for c in h.counts],
    )
