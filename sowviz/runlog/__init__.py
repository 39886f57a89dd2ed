"""The Monitor outside the notebook: a crash-safe run log, TensorBoard, W&B, a live view.

`make_sinks(log_dir, tensorboard=..., wandb=...)` builds the sinks a Monitor hands its
model (`open`) and every recorded step (`write`) to; `load(log_dir)` reads a log back
as a live view. The byte format is in docs/log-format.md.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

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

    Under `jax.distributed`, only process 0 writes: other processes get no sinks, and
    raise what process 0 raised (`_agreed`), so that no process steps on alone. Every
    process must call it (`Monitor` does, in a job of several processes, whatever its
    arguments), with or without a `log_dir` of its own.
    """

    def build() -> list[Sink]:
        # `~/runs/exp1` is the user's home, as a shell and `save_html` read it (it made a
        # directory named `~` under the working directory)
        where, tb = log_dir, tensorboard
        if where is not None:
            check_log_dir(where)
            where = os.path.expanduser(where)
        if isinstance(tb, (str, os.PathLike)):
            tb = os.path.expanduser(tb)
        if where is None and not tb and wandb is False:
            return []
        if tb is True and where is None:
            raise ValueError(
                "sowviz: `tensorboard=True` writes beside the run log, and `log_dir` is "
                "None: pass `log_dir='runs/exp1'`, or a directory as `tensorboard='runs/tb'`."
            )
        return _writer_sinks(where, tb, wandb, overwrite)

    # Every process of a job takes part, whatever it was given: `log_dir=... if
    # jax.process_index() == 0 else None` left process 0 waiting for the others forever.
    return _agreed(build) if _process_count() > 1 else build()


def _writer_sinks(
    log_dir: str | os.PathLike | None,
    tensorboard: bool | str | os.PathLike,
    wandb: Any,
    overwrite: bool,
) -> list[Sink]:
    """`make_sinks`'s sinks on the process that writes, none on the others."""
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


# Process 0's outcome, as every process of a `jax.distributed` job learns it: an error
# class (by its index here; 0: none) and its message, in UTF-8, cut to `_SAID_BYTES`.
_SAID_CLASSES: tuple[type[Exception], ...] = (
    FileExistsError,
    ValueError,
    ImportError,
    TypeError,
    RuntimeError,
)
_SAID_BYTES = 4096
_SAID_BY_0 = (
    " (said by process 0 of this `jax.distributed` job, which writes the run log and "
    "loggers for every process: every process refuses alike)"
)


def _agreed(build: Any) -> list[Sink]:
    """`build()` on every process of a `jax.distributed` job, where process 0 alone opens
    the files: the others learn its outcome (one broadcast from process 0) and raise
    its error too. Alone, process 0 refused a `log_dir` holding an old log while the
    others stepped into the training's first collective and died there 30 s later of
    an unrelated Gloo timeout."""
    try:
        sinks, error = build(), None
    except Exception as err:
        sinks, error = [], err
    code, message = _broadcast_outcome(error)
    if error is not None:  # process 0: its own error, traceback and all
        raise error
    if code:
        cls = _SAID_CLASSES[code - 1] if code <= len(_SAID_CLASSES) else RuntimeError
        raise cls(message + _SAID_BY_0)
    return sinks


def _broadcast_outcome(error: Exception | None) -> tuple[int, str]:
    """Process 0's (error class code, message) on every process (0, "": it succeeded)."""
    from jax.experimental import multihost_utils

    code = 0
    text = b""
    if error is not None:
        found = [k for k, c in enumerate(_SAID_CLASSES) if isinstance(error, c)]
        code = found[0] + 1 if found else len(_SAID_CLASSES) + 1
        text = str(error).encode("utf-8")[:_SAID_BYTES]
    buf = np.zeros(_SAID_BYTES + 2, np.int32)
    buf[0], buf[1] = code, len(text)
    buf[2 : 2 + len(text)] = np.frombuffer(text, np.uint8)
    got = np.asarray(multihost_utils.broadcast_one_to_all(buf))
    said = bytes(got[2 : 2 + int(got[1])].astype(np.uint8))
    return int(got[0]), said.decode("utf-8", errors="ignore")


def _process_count() -> int:
    import jax

    return jax.process_count()


def _is_writer_process() -> bool:
    """True on the process that writes: process 0 of a `jax.distributed` job (or the
    only process)."""
    import jax

    return jax.process_index() == 0
