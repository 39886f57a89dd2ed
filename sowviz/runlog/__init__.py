"""The Monitor outside the notebook: a crash-safe run log, TensorBoard, W&B, a live view.

`make_sinks(log_dir, tensorboard=..., wandb=...)` builds the sinks a Monitor hands its
model (`open`) and every recorded step (`write`) to; `load(log_dir)` reads a log back
as a live view. The byte format is in docs/log-format.md.
"""

from __future__ import annotations

import os
from typing import Any

from .reader import LogReader as LogReader
from .reader import LogWarning as LogWarning
from .sink import Sink as Sink
from .sink import SinkWarning as SinkWarning
from .view import RunLogView as RunLogView
from .view import load as load
from .writer import LogSink as LogSink
from .writer import check_log_dir

__all__ = [
    "LogReader",
    "LogSink",
    "LogWarning",
    "RunLogView",
    "Sink",
    "SinkWarning",
    "load",
    "make_sinks",
]

TENSORBOARD_SUBDIR = "tensorboard"


def make_sinks(
    log_dir: str | os.PathLike | None,
    *,
    tensorboard: bool | str | os.PathLike = False,
    wandb: Any = False,
    overwrite: bool = False,
) -> list[Sink]:
    """The sinks for `Monitor(..., log_dir=, tensorboard=, wandb=)`; errors come now.

    - `log_dir`: a directory for the run log (`model.json`, `steps.log`), created if
      needed; an unwritable one (or `""`) raises `ValueError`, one holding an earlier
      run's log raises `FileExistsError` (unless `overwrite=True`).
    - `tensorboard`: True writes event files to `log_dir/tensorboard`; a path writes
      them there (no `log_dir` needed).
    - `wandb`: True logs to the active W&B run (`wandb.init()` first); or a run object.

    Under `jax.distributed`, only process 0 writes: other processes get no sinks.
    """
    if log_dir is not None:
        check_log_dir(log_dir)
    if log_dir is None and not tensorboard and wandb is False:
        return []
    if tensorboard is True and log_dir is None:
        raise ValueError(
            "sowviz: `tensorboard=True` writes beside the run log, and `log_dir` is None: "
            "pass `log_dir='runs/exp1'`, or a directory as `tensorboard='runs/tb'`."
        )
    if not _is_writer_process():
        return []
    sinks: list[Sink] = []
    try:
        # What can fail for want of a package or a run is checked first, so a failure
        # leaves no half-begun run log behind; then the run log, which refuses a
        # `log_dir` holding another run's log (or being written): before any other
        # sink creates a file there (TensorBoard's event file in `log_dir/tensorboard`).
        if tensorboard:
            from .tb_sink import TensorBoardSink, require

            require()
        if wandb is not False and wandb is not None:
            from .wandb_sink import WandbSink

            sinks.append(WandbSink(wandb))
        if log_dir is not None:
            sinks.insert(0, LogSink(log_dir, overwrite=overwrite))
        if tensorboard:
            tb_dir = (
                os.path.join(os.fspath(log_dir), TENSORBOARD_SUBDIR)  # type: ignore[arg-type]
                if tensorboard is True
                else tensorboard
            )
            sinks.append(TensorBoardSink(tb_dir))
    except BaseException:
        for s in sinks:
            s.close()
        raise
    for s in sinks:  # a newer Monitor that takes the run log retires them all
        s.group = tuple(sinks)
    return sinks


def _is_writer_process() -> bool:
    """True on the process that writes: process 0 of a `jax.distributed` job (or the
    only process)."""
    import jax

    return jax.process_index() == 0
