"""Weights & Biases: the same histograms and scalars, logged to an active run.

Each recorded step becomes one `run.log({...})` with a
`wandb.Histogram(np_histogram=(counts, edges))` per probe and mode (sowviz's own
on-device bins, not re-binned on the host) and the `loss`, `…/l2` and
`…/nonfinite` scalars, under the tags TensorBoard gets (see `naming.py`), each
prefixed `sowviz/`. An unrecorded step (`every=N`) is a row of its `loss` alone.

The Monitor's step numbers are the metric `sowviz/step`, every `sowviz/*` metric's
x-axis (`run.define_metric`), not W&B's own `step`: a recorded step reaches the host
a few steps after it ran (summaries are read in batches), and W&B drops, with a
warning, any row logged at a `step=` below one already logged, so `step=` would
lose sowviz's rows behind the user's and the user's behind sowviz's. Log your own
metrics without `step=` as well (or with an x-axis of your own, the same way).
"""

from __future__ import annotations

from typing import Any

from .naming import Hist, probe_tags
from .naming import items as step_items
from .sink import Sink

#: Every key sowviz logs starts with this (its own section in the W&B workspace).
PREFIX = "sowviz/"
#: The Monitor's step number: the x-axis of every `sowviz/*` metric.
STEP = PREFIX + "step"

_MISSING = (
    "sowviz: `wandb=True` needs the `wandb` package: `pip install 'sowviz[wandb]'` "
    "(or `pip install wandb`)."
)
_NO_RUN = (
    "sowviz: `wandb=True` logs to the active W&B run, and there is none: call "
    "`wandb.init(project=...)` before creating the Monitor, or pass the run itself "
    "(`wandb=run`)."
)


class WandbSink(Sink):
    """Logs every recorded step to a W&B run (the active one, or the one given)."""

    name = "W&B logger"

    def __init__(self, run: Any = True) -> None:
        try:
            import wandb
        except ImportError as err:
            raise ImportError(_MISSING) from err
        self._wandb = wandb
        self.run = wandb.run if run is True else run
        if self.run is None:
            raise ValueError(_NO_RUN)
        if not callable(getattr(self.run, "log", None)):
            raise TypeError(
                f"sowviz: `wandb` must be True or a W&B run (from `wandb.init()`), "
                f"got {type(run).__name__}."
            )
        self._tags: dict[str, str] = {}
        self.run.define_metric(STEP)  # the x-axis of every `sowviz/*` metric
        self.run.define_metric(PREFIX + "*", step_metric=STEP)
        super().__init__()

    def _open(self, model: dict[str, Any]) -> None:
        self._tags = probe_tags(model)

    def _write(self, entry: dict[str, Any]) -> None:
        data: dict[str, Any] = {STEP: int(entry["step"])}
        for item in step_items(entry, self._tags):
            if isinstance(item, Hist):
                hist = self._wandb.Histogram(np_histogram=(item.counts, item.edges))
                data[PREFIX + item.tag] = hist
            else:
                data[PREFIX + item.tag] = item.value
        self.run.log(data)

    def _losses(self, steps: list[int], losses: list[float | None]) -> None:
        # Unrecorded steps' `loss` (`every=N`): a row each, at its `sowviz/step`.
        for step, loss in zip(steps, losses, strict=True):
            if loss is not None:
                self.run.log({STEP: int(step), PREFIX + "loss": float(loss)})
