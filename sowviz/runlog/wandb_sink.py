"""Weights & Biases: the same histograms and scalars, logged to an active run.

Each recorded step becomes one `run.log({...}, step=step)` with a
`wandb.Histogram(np_histogram=(counts, edges))` per probe and mode (sowviz's own
on-device bins, not re-binned on the host) and the `loss`, `…/l2` and
`…/nonfinite` scalars, under the tags TensorBoard gets (see `naming.py`). sowviz logs
at the Monitor's step numbers: log your own metrics with `step=` the same numbers.
"""

from __future__ import annotations

from typing import Any

from .naming import Hist, probe_tags
from .naming import items as step_items
from .sink import Sink

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
        super().__init__()

    def _open(self, model: dict[str, Any]) -> None:
        self._tags = probe_tags(model)

    def _write(self, entry: dict[str, Any]) -> None:
        data: dict[str, Any] = {}
        for item in step_items(entry, self._tags):
            if isinstance(item, Hist):
                data[item.tag] = self._wandb.Histogram(np_histogram=(item.counts, item.edges))
            else:
                data[item.tag] = item.value
        self.run.log(data, step=int(entry["step"]))
