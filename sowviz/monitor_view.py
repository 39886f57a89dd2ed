"""`MonitorView`: the live widget of a `Monitor` (what displaying `mon` shows).

It listens to the headless recorder through `_Listener` (the sink protocol:
`open(model)` when a graph exists or changes, `write(entry)` per recorded step,
`flush()`; a widget's own `open` is its comm, so the view does not implement the
protocol itself). Updates are throttled to
one per `throttle` seconds however fast the loop runs; each carries only new
steps (one gzipped JSON binary buffer), and the outbox is bounded: if the front
end falls further behind than that, the next update sends the whole model
(which holds the thinned history) instead.

The steps messages reach only the views open now: a new one (a reloaded page, a second
view of the output, a notebook's saved widget state) draws the synced `model` trait.
So the trait catches up with the steps sent since (the whole model again): when a front
end asks for the widget's state, on the user's `mon.flush()`, and at most every
`_REFRESH_EVERY` seconds while steps keep coming (or once they stop), never spending
more than 1/`_REFRESH_COST` of the time on it: no step pays for a whole model.
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
#: Seconds between two whole models while steps travel as messages (and after the last:
#: the synced `model`, what a new view draws, then holds the whole run).
_REFRESH_EVERY = 30.0
#: ... and at least this many times as long as building and sending the last one took
#: (a 10,000-equation model takes about a second): refreshes stay a few % of the time.
_REFRESH_COST = 20.0


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
        # Steps sent as messages since the last whole model: the synced `model` lacks
        # them. With when (`clock`) that model went and how long it took (seconds).
        self._stale = False
        self._model_at: float | None = None
        self._model_cost = 0.0
        self._refresh_timer: threading.Timer | None = None
        self._refresh_when = 0.0  # (`clock` seconds) when it fires
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
        self._stale = False  # (the Monitor's model holds every step written)

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

    def settle(self) -> None:
        """The user's `mon.flush()`: the synced model takes the steps sent as messages
        (a page reloaded after the loop draws them all); if the last whole model was
        too recent for its cost (a `flush()` at every step), once that time is over."""
        now = self.clock()
        if self._stale and self._refresh_due(now, every=0.0):
            self._need_model = True
        self._push(force=True)
        if self._stale:
            self._arm_refresh(now, every=0.0)

    def get_state(self, key: Any = None, drop_defaults: bool = False) -> dict[str, Any]:
        """ipywidgets' state, asked for whole (`key=None`) when a front end opens the
        widget: a reloaded page, or a new one. Its `model` then holds every step sent
        so far, not the first few: the steps messages went only to the views open then."""
        if key is None and getattr(self, "_stale", False):
            with self._locked():
                self._need_model = True
                self._push(force=True)
        return super().get_state(key=key, drop_defaults=drop_defaults)

    def renew(self) -> None:
        """Send the whole model on the next update (what only it carries changed)."""
        self._need_model = True
        self._push(force=False)

    def _push(self, *, force: bool) -> None:
        now = self.clock()
        if self._quiet() != self._quiet_sent:
            self._need_model = True  # the record only the whole model carries changed
        if self._stale and self._refresh_due(now):
            self._need_model = True  # the synced model (what a new view draws) catches up
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
            self._model_at = self.clock()  # (assigning it built and sent it)
            self._model_cost = max(self._model_at - now, 0.0)
            self._stale = False
        else:
            self.send(
                {"type": "steps", "encoding": "gzip-json", "count": len(self._outbox)},
                buffers=[_model.encode_model([_as_dict(e) for e in self._outbox])],
            )
            self._stale = True
            self._arm_refresh(now)
        self._outbox.clear()

    def _refresh_due(self, now: float, every: float | None = None) -> bool:
        """Whether a whole model may go now: `every` seconds (`_REFRESH_EVERY`) after the
        last, and never sooner than `_REFRESH_COST` times what the last one took."""
        if self._model_at is None:
            return True
        every = _REFRESH_EVERY if every is None else every
        return now - self._model_at >= max(every, _REFRESH_COST * self._model_cost)

    def _arm_refresh(self, now: float, every: float | None = None) -> None:
        """A whole model once it is due, should no step send one by then: the loop that
        ended leaves the synced model holding the whole run. One timer at a time (the
        sooner one); none on a test's clock."""
        if self.clock is not time.monotonic:
            return
        every = _REFRESH_EVERY if every is None else every
        since = 0.0 if self._model_at is None else now - self._model_at
        delay = max(max(every, _REFRESH_COST * self._model_cost) - since, self._throttle, 0.01)
        timer = self._refresh_timer
        if timer is not None:
            if self._refresh_when <= now + delay:
                return
            timer.cancel()
        self._refresh_when = now + delay
        timer = threading.Timer(delay, self._deferred_refresh)
        timer.daemon = True  # (never keeps the interpreter alive)
        self._refresh_timer = timer
        timer.start()

    def _deferred_refresh(self) -> None:
        with self._locked():
            self._refresh_timer = None
            if self._stale:
                self._need_model = True
                with contextlib.suppress(Exception):  # a closed widget: nobody to send to
                    self._push(force=True)

    def _locked(self) -> Any:
        # The Monitor's lock, which every step holds while it writes to this view: an
        # update from another thread never interleaves with a step's.
        return getattr(self._monitor, "_lock", None) or contextlib.nullcontext()

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

    def settle(self) -> None:
        self.view.settle()

    def losses(self, steps: list[int], losses: list[float | None]) -> None:
        self.view.add_losses(steps, losses)

    def nonfinite_steps(self, steps: list[int]) -> None:
        # Unrecorded steps found non-finite: only the whole model carries the count
        # (`history.nonfinite_steps`), sent on the next (throttled) update.
        self.view.renew()
