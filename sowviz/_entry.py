"""One recorded Monitor step, kept as fetched host arrays until someone reads it.

Turning a step's summaries into the JSON-ready entry (`Summary.to_json`, float by
float) costs milliseconds per step; the training thread only fetches the packed
host buffers and keeps them here. The entry dict is built on first read, once:
by a sink on its own thread, by the view when it sends (throttled), or when
`mon.history` / `to_dict()` is read. Steps the history thins away before anyone
reads them are never converted.
"""

from __future__ import annotations

import threading
from typing import Any

from .capture.api import nest
from .inspection import join_probes


class LazyEntry:
    """A recorded step: `step`, `loss`, `finite` now; the probe summaries on `materialize()`."""

    __slots__ = (
        "_entry",
        "_keep_probes",
        "_lock",
        "_probes",
        "_src",
        "finite",
        "loss",
        "program",
        "skipped",
        "step",
    )

    def __init__(
        self, step: int, loss: float | None, finite: bool, src: tuple, program: int | None = None
    ) -> None:
        self.step, self.loss, self.finite = step, loss, finite
        self.program = program  # which of the Monitor's programs ran it (`programs`)
        # non-finite gradients only, declared expected: a step a guarded update skipped
        # (`nonfinite_expect`), counted apart from the non-finite steps
        self.skipped = False
        self._src: tuple | None = src  # (traced, Packed of host buffers, options)
        self._entry: dict[str, Any] | None = None
        self._probes: list | None = None
        self._keep_probes = True
        self._lock = threading.Lock()

    def __getitem__(self, key: str) -> Any:  # the keys History reads before materializing
        if key == "step":
            return self.step
        return self.materialize()[key]

    def probes(self) -> list | None:
        """The step's `Probe`s (full summaries) while it is the latest step, else None."""
        self.materialize()
        return self._probes

    def forget_probes(self) -> None:
        """A later step is recorded: keep only the entry (what the history charts read).
        The probes hold every summary in full (and its rows on the host)."""
        with self._lock:
            self._keep_probes, self._probes = False, None

    def materialize(self) -> dict[str, Any]:
        """The entry dict (`{"step", "loss", "finite", "probes", ...}`), built once."""
        with self._lock:
            if self._entry is None:
                traced, packed, options = self._src  # type: ignore[misc]
                summaries = nest(*packed.unpack(rows=True))
                probes, _ = join_probes(traced, summaries, options)
                self._probes = probes if self._keep_probes else None
                self._entry = {
                    "step": self.step,
                    "loss": self.loss,
                    "finite": self.finite,
                    "probes": {p.id: lite_summaries(p) for p in probes},
                }
                if self.program is not None:
                    self._entry["program"] = self.program
                self._src = None  # the host buffers are no longer needed
            return self._entry


def program_shapes(graph: Any, probes: list) -> dict[str, Any]:
    """What one program's shapes are (the model's `programs[k]`, docs/model.md): each
    node's `shapes` and each probe's `shape` and `size`. A batch of another shape runs
    another program: a step drawn later is described with its own program's shapes."""
    nodes = {n.id: list(n.shapes) for n in graph.nodes if n.shapes}
    out: dict[str, Any] = {}
    for p in probes:
        s = next(iter(p.typed_summaries.values()), None)
        if s is not None:
            out[p.id] = {"shape": list(s.shape), "size": int(s.size)}
    return {"nodes": nodes, "probes": out}


def lite_summaries(probe: Any) -> dict[str, dict[str, Any]]:
    """Per capture key, what a step's entry keeps of `probe`'s summary JSON: its
    statistics and histogram (`stats_json`: `STAT_KEYS` and ``hist``, what the charts
    over steps draw). A row of a stack (most summaries) has them built for its whole
    stack at once (`StackRows.stats`). Reading the probe's full `summaries` instead made
    each summary's whole JSON (loghist and per-iteration lists too) to throw most of it
    away: 40 µs a summary on the sink's thread, which holds the GIL the training needs."""
    return {key: s.stats_json() for key, s in probe.typed_summaries.items()}
