"""`Monitor`: live inspection of a training loop.

`mon.step(*args)` runs ONE compiled program that returns what
`jax.value_and_grad(fn, argnums)(*args)` returns and, packed beside it, the
summaries of every probe. The training step *is* the monitored step.

The loop never waits for the widget: summaries start their device→host copy
asynchronously and are read on a later step once ready (or at `flush()`), and
front-end updates are throttled to a few per second however fast the loop
runs. Each update carries only new steps; the front end keeps the history.
Memory is bounded by `history` steps on both sides.
"""

from __future__ import annotations

import collections
import gzip
import math
import time
from collections.abc import Callable
from typing import Any

import jax

from .capture.api import nest
from .capture.packing import Packed
from .inspection import Inspection, InspectOptions, Pipeline
from .nonfinite import NonFinite
from .nonfinite import message as _nonfinite_message
from .nonfinite import origin as _nonfinite_origin
from .summary import STAT_KEYS
from .widget import Inspector

# Fields kept per step in the history: what the charts over steps draw.
_LITE = (*STAT_KEYS, "hist")


class NonFiniteError(FloatingPointError):
    """Raised by `Monitor.step` with `stop_on_nonfinite=True`: where NaN/Inf first appeared."""


class Monitor(Inspector):
    """Watch a training loop: per-step summaries of every stage's values and gradients.

    Example:
        >>> mon = sowviz.Monitor(loss, every=1, history=200)    # doctest: +SKIP
        >>> mon                                                 # displays the widget
        >>> for batch in data:                                  # doctest: +SKIP
        ...     loss_value, grads = mon.step(params, batch)
        ...     params = update(params, grads)
    """

    def __init__(
        self,
        fn: Callable,
        *,
        mode: str = "grad",
        argnums: int = 0,
        every: int = 1,
        history: int = 200,
        stop_on_nonfinite: bool = False,
        capture: str = "stages",
        throttle: float = 0.25,
        **options: Any,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"sowviz.Monitor: `fn` must be callable, got {type(fn).__name__}.")
        for name, value in (("every", every), ("history", history)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"sowviz.Monitor: `{name}` must be a positive int, got {value!r}.")
        self._options = InspectOptions.from_kwargs(
            "Monitor", mode, capture, {"argnums": argnums, **options}
        )
        self.fn = fn
        self.every = every
        self.stop_on_nonfinite = stop_on_nonfinite
        self.throttle = throttle
        self.history: collections.deque[dict[str, Any]] = collections.deque(maxlen=history)
        self.nonfinite: NonFinite | None = None
        self.steps = 0
        self._pipeline: Pipeline | None = None
        self._pending: collections.deque[tuple[int, Any, Packed]] = collections.deque()
        self._outbox: list[dict[str, Any]] = []
        self._last_send = 0.0
        self._need_model = False  # the model lacks the probe list: send it whole once
        self._inspection: Inspection | None = None
        super().__init__(model={}, mode=mode)

    # -- the training step -------------------------------------------------------

    def step(self, *args: Any) -> Any:
        """One training step: returns `jax.value_and_grad(fn, argnums)(*args)` (for the
        default mode "grad"), with every probe summarised in the same program."""
        if self._pipeline is None:
            self._pipeline = Pipeline(self.fn, args, self._options)
            self.model = self.to_dict()  # the graph, drawn before the first summaries
        step = self.steps
        self.steps += 1
        if step % self.every != 0:
            # Not a recorded step: the plain compiled program, no probes, no summaries.
            result = self._pipeline.run_plain(*args)
            self._drain(block=False)
            return result
        result, packed = self._pipeline.run(*args)
        packed.fetch_async()
        value = result[0] if isinstance(result, tuple) else result
        self._pending.append((step, value, packed))
        # Block only when asked to stop on NaN (the answer is needed now), or when
        # the queue grows: a bounded number of steps in flight.
        self._drain(block=self.stop_on_nonfinite or len(self._pending) > 4)
        return result

    def flush(self) -> None:
        """Read every pending summary and send all updates now (e.g. after the loop)."""
        self._drain(block=True)
        self._push_updates(force=True)

    def _drain(self, *, block: bool) -> None:
        while self._pending:
            step, value, packed = self._pending[0]
            if not block and not all(_ready(b) for b in packed.buffers):
                break
            self._pending.popleft()
            self._record(step, value, nest(*packed.unpack()))
        self._push_updates(force=False)

    def _record(self, step: int, value: Any, summaries: dict) -> None:
        assert self._pipeline is not None
        probes, _ = self._pipeline.probes(summaries)
        try:
            loss = float(jax.device_get(value))
        except (TypeError, ValueError):
            loss = None
        entry = {
            "step": step,
            "loss": loss,
            "probes": {p.id: {m: _lite(s) for m, s in p.summaries.items()} for p in probes},
        }
        origin = _nonfinite_origin(probes, self._pipeline.graph)
        if origin is None and loss is not None and not math.isfinite(loss):
            # No probe saw it (e.g. unscoped top-level code): the output did.
            outputs = [n.id for n in self._pipeline.graph.nodes if n.kind == "output"]
            origin = (outputs[0] if outputs else None, None)
        if origin is not None:
            entry["nonfinite"] = {"forward": origin[0], "backward": origin[1]}
            if self.nonfinite is None:
                self.nonfinite = NonFinite(step, origin[0], origin[1])
        self._need_model = self._need_model or self._inspection is None
        self._inspection = Inspection(
            result=None,
            graph=self._pipeline.graph,
            probes=probes,
            mode=self._options.mode,
            device="",
            title=self._pipeline.graph.title,
        )
        self.history.append(entry)
        self._outbox.append(entry)
        if self.stop_on_nonfinite and origin is not None:
            self.flush()
            raise NonFiniteError(_nonfinite_message(self._pipeline.graph, step, origin))

    # -- the view ---------------------------------------------------------------------

    def _push_updates(self, *, force: bool) -> None:
        now = time.monotonic()
        if not self._outbox or (not force and now - self._last_send < self.throttle):
            return
        self._last_send = now
        if self._need_model:
            # First summaries: the probe list (ids → nodes) travels once, with the
            # history so far; from then on only new steps do.
            self._need_model = False
            self.model = self.to_dict()
        else:
            # New steps only, as one gzipped JSON binary buffer.
            self.send(
                {"type": "steps", "encoding": "gzip-json", "count": len(self._outbox)},
                buffers=[encode_steps(self._outbox)],
            )
        self._outbox.clear()

    def to_dict(self, *, with_history: bool = True) -> dict[str, Any]:
        """The model: the graph, the latest summaries and (by default) the whole history."""
        assert self._pipeline is not None, "call mon.step(...) once before asking for the model"
        ins = self._inspection or Inspection(
            result=None,
            graph=self._pipeline.graph,
            probes=[],
            mode=self._options.mode,
            device="",
            title=self._pipeline.graph.title,
        )
        d = ins.to_dict()
        d["device"] = _device()
        d["history"] = self._history_dict() if with_history else None
        return d

    def _history_dict(self) -> dict[str, Any]:
        steps = list(self.history)
        probes: dict[str, dict[str, list]] = {}
        for i, e in enumerate(steps):
            for pid, by_mode in e["probes"].items():
                for m, s in by_mode.items():
                    probes.setdefault(pid, {}).setdefault(m, [None] * len(steps))[i] = s
        return {
            "steps": [e["step"] for e in steps],
            "loss": [e["loss"] for e in steps],
            "probes": probes,
            "nonfinite": None if self.nonfinite is None else self.nonfinite.to_dict(),
            "limit": self.history.maxlen,
        }

    def save_html(self, path):
        """Write a report with the graph, the latest summaries and the history."""
        from .report import write_html

        self.flush()
        return write_html(self.to_dict(), path)


def encode_steps(steps: list[dict[str, Any]]) -> bytes:
    """Steps as gzipped JSON (NaN/Inf as null), the payload of one front-end update."""
    from .report import model_json

    return gzip.compress(model_json(steps).encode("utf-8"), mtime=0)


def _ready(buf: Any) -> bool:
    is_ready = getattr(buf, "is_ready", None)
    return True if is_ready is None else bool(is_ready())


def _lite(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: summary[k] for k in _LITE if k in summary}


def _device() -> str:
    d = jax.devices()[0]
    return f"{d.platform}:{d.id} ({d.device_kind})"
