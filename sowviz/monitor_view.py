"""`MonitorView`: the live widget of a `Monitor` (what displaying `mon` shows).

It listens to the headless recorder through `_Listener` (the sink protocol:
`open(model)` when a graph exists or changes, `write(entry)` per recorded step,
`flush()`; a widget's own `open` is its comm, so the view does not implement the
protocol itself). Updates are throttled to
one per `throttle` seconds however fast the loop runs; each carries only new
steps (one gzipped JSON binary buffer), and the outbox is bounded: if the front
end falls further behind than that, the next update sends the whole model
(which holds the thinned history) instead.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from . import _model
from ._history import _as_dict, losses_item
from ._progress import Phase
from .widget import Inspector

_OUTBOX = 256


class MonitorView(Inspector):
    """The widget view of a `Monitor` (`mon.view()`; Jupyter shows it for `mon`)."""

    def __init__(
        self, monitor: Any, *, throttle: float = 0.25, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._monitor = monitor
        self._throttle = throttle
        self.clock = clock  # seconds; tests pass a fake one to drive the throttle
        self._outbox: deque[dict[str, Any]] = deque()
        self._last_send: float | None = None
        self._need_model = True
        self._timer: threading.Timer | None = None  # the deferred update (`_defer`)
        # whether the model sent says "no alarm" (`Monitor.quiet_nonfinite`): a step
        # whose masked -inf is drawn as a NaN alarm until the next whole model otherwise
        self._quiet_sent = False
        model = monitor.to_dict() if monitor._traced is not None else {}
        super().__init__(
            model=model, mode=str(monitor._options.mode), what="the first non-finite step"
        )
        self.can_locate = True  # `Monitor.locate_nonfinite`

    def locate(self) -> Any:
        """The banner's button: `Monitor.locate_nonfinite()` (it reads the steps in flight;
        the Monitor locates its first non-finite step by itself), then the whole model,
        with the record and the history, goes to the front end."""
        mon = self._monitor

        def job() -> dict[str, Any]:
            mon.locate_nonfinite()
            self._need_model = True
            self._push(force=True)
            return self.model

        self._work(Phase.LOCATING, job, raise_errors=False)
        return None if mon.nonfinite is None else mon.nonfinite.origins

    def listener(self) -> _Listener:
        """What the Monitor calls: the sink protocol, forwarded to this view."""
        return _Listener(self)

    def set_model(self, model: dict[str, Any]) -> None:
        self.model = model
        self._need_model = True

    def add(self, entry: dict[str, Any]) -> None:
        if len(self._outbox) >= _OUTBOX:
            self._outbox.clear()
            self._need_model = True  # too far behind: the model carries the history
        self._outbox.append(entry)
        self._push(force=False)

    def add_losses(self, steps: list[int], losses: list[float | None]) -> None:
        """Unrecorded steps' losses (`every=N`): one outbox item per read (a few steps),
        drawn on the loss chart only."""
        self.add(losses_item(steps, losses))

    def push(self) -> None:
        self._push(force=True)

    def renew(self) -> None:
        """Send the whole model on the next update (what only it carries changed)."""
        self._need_model = True
        self._push(force=False)

    def _push(self, *, force: bool) -> None:
        now = self.clock()
        if self._quiet() != self._quiet_sent:
            self._need_model = True  # the record only the whole model carries changed
        if not self._outbox and not self._need_model:
            return
        if not force and self._last_send is not None and now - self._last_send < self._throttle:
            self._defer(self._throttle - (now - self._last_send))
            return
        self._last_send = now
        if self._need_model:
            # The probe list (ids → nodes) travels with the whole history; from then on
            # only new steps do.
            self._need_model = False
            self._quiet_sent = self._quiet()
            # (as recorded: the steps still waiting come to this listener as written)
            self.model = self._monitor._model()
        else:
            self.send(
                {"type": "steps", "encoding": "gzip-json", "count": len(self._outbox)},
                buffers=[_model.encode_model([_as_dict(e) for e in self._outbox])],
            )
        self._outbox.clear()

    def _defer(self, delay: float) -> None:
        """Send what waits once the throttle has passed, should no later step send it: a
        loop that ended left its last steps in the outbox, the widget reading an old step
        as the latest until `mon.flush()`. One timer at a time; none on a test's clock
        (its seconds are not the timer's)."""
        if self._timer is not None or self.clock is not time.monotonic:
            return
        timer = threading.Timer(max(delay, 0.01), self._deferred_push)
        timer.daemon = True  # (never keeps the interpreter alive)
        self._timer = timer
        timer.start()

    def _deferred_push(self) -> None:
        # Under the Monitor's lock, which every step holds while it writes to this view:
        # the update never interleaves with a step's.
        lock = getattr(self._monitor, "_lock", None) or contextlib.nullcontext()
        with lock:
            self._timer = None
            with contextlib.suppress(Exception):  # a closed widget: nobody to send to
                self._push(force=True)

    def _quiet(self) -> bool:
        quiet = getattr(self._monitor, "quiet_nonfinite", None)  # (a test's stand-in: none)
        return quiet is not None and quiet() is not None


class _Listener:
    lazy_entries = True  # converts `_entry.LazyEntry`s when it sends (throttled)

    def __init__(self, view: MonitorView) -> None:
        self.view = view

    def open(self, model: dict[str, Any]) -> None:
        self.view.set_model(model)

    def write(self, entry: dict[str, Any]) -> None:
        self.view.add(entry)

    def flush(self) -> None:
        self.view.push()

    def losses(self, steps: list[int], losses: list[float | None]) -> None:
        self.view.add_losses(steps, losses)

    def nonfinite_steps(self, steps: list[int]) -> None:
        # Unrecorded steps found non-finite: only the whole model carries the count
        # (`history.nonfinite_steps`), sent on the next (throttled) update.
        self.view.renew()
