"""The Monitor's in-memory history: the whole run, in bounded memory.

The newest `limit // 2` recorded steps are all kept. Older ones are kept when
their index (their position among recorded steps) is a multiple of a stride that
doubles whenever the older part would exceed its half: every step for the most
recent N, every 2nd, 4th, 8th... before that, spread over the whole run. Index 0
is a multiple of every stride, so the start of the run is never forgotten.
A pinned entry (the first non-finite step) is never dropped. The run log on disk
(`log_dir=`) keeps every step.

Beside the entries, `losses` holds every step's loss, recorded or not (a Monitor with
`every=10` computes the loss at every step: its chart, like the user's own logging,
has them all), thinned by the same rule to `max(limit, LOSS_POINTS)` points.

Entries are dicts or `_entry.LazyEntry`s (a Monitor's recorded steps, converted to
dicts on first read): reading the history gives dicts; a step thinned away before
anyone read it is never converted.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

#: Runs of non-finite steps kept by `NonfiniteSteps` (a run that diverges stays
#: non-finite: one run; a loss that flickers makes one per flicker). Past this many,
#: later steps are counted, not listed.
MAX_RANGES = 10_000
#: Points of the every-step loss series kept at least (`LossSeries`): a loss chart
#: a few hundred pixels wide shows no more, and the model stays small (≈ 50 KB).
LOSS_POINTS = 2000


class NonfiniteSteps:
    """Every step found non-finite, recorded or not, as runs `[first, last]` (inclusive),
    never thinned: a Monitor checks every step (`every=5` records one in five, and its
    running flag names the bad ones in between), so the report can say "8 non-finite
    steps", not the 2 its history holds."""

    def __init__(self) -> None:
        self.ranges: list[list[int]] = []
        self.count = 0  # distinct steps added
        self.unlisted = 0  # of them, those past `MAX_RANGES` runs (counted only)

    def add(self, step: int) -> None:
        r = self.ranges
        i = bisect.bisect_right(r, step, key=lambda run: run[0]) - 1
        if i >= 0 and r[i][1] >= step:
            return  # known (a re-run step, a record an interrupt made twice)
        joins_left = i >= 0 and r[i][1] == step - 1
        joins_right = i + 1 < len(r) and r[i + 1][0] == step + 1
        if joins_left and joins_right:
            r[i][1] = r.pop(i + 1)[1]
        elif joins_left:
            r[i][1] = step
        elif joins_right:
            r[i + 1][0] = step
        elif len(r) < MAX_RANGES:
            r.insert(i + 1, [step, step])
        else:
            self.unlisted += 1
        self.count += 1

    def update(self, steps: Iterable[int]) -> None:
        for s in steps:
            self.add(int(s))

    @property
    def first(self) -> int | None:
        return self.ranges[0][0] if self.ranges else None


class LossSeries:
    """Every step's loss, recorded or not, in step order, thinned like `History`'s
    entries: the newest `limit // 2` all kept, older ones every 2nd, 4th, ... point
    (the first point always). A value is a float, or None (no one-number loss)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._recent_max = max(1, limit // 2)
        self._older_max = max(1, limit - self._recent_max)
        self._recent: deque[tuple[int, int, float | None]] = deque()  # (index, step, loss)
        self._older: list[tuple[int, int, float | None]] = []
        self.stride = 1
        self.count = 0  # points ever added
        self.last: int | None = None  # the newest step added

    def add(self, step: int, loss: float | None) -> None:
        # Steps come in order (`Monitor` hands unrecorded steps' losses over before
        # the next recorded step); a step again (a record an interrupt made twice, a
        # re-run non-finite step) or an older one is dropped, not drawn twice.
        if self.last is not None and step <= self.last:
            return
        self.last = step
        self._recent.append((self.count, step, loss))
        self.count += 1
        if len(self._recent) > self._recent_max:
            old = self._recent.popleft()
            if old[0] % self.stride == 0:
                self._older.append(old)
            while len(self._older) > self._older_max:
                self.stride *= 2
                self._older = [p for p in self._older if p[0] % self.stride == 0]

    def __len__(self) -> int:
        return len(self._older) + len(self._recent)

    # The series reads as its losses (`mon.history.losses`, as the README names it):
    # `list(losses)`, `losses[-1]`, `np.asarray(losses)` (None, no one-number loss, is
    # NaN there); `steps` says which step each is.
    def __iter__(self) -> Iterator[float | None]:
        return iter(self.values)

    def __getitem__(self, i: Any) -> Any:
        return self.values[i]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        values = [np.nan if v is None else v for v in self.values]
        return np.asarray(values, dtype=np.float64 if dtype is None else dtype)

    def __repr__(self) -> str:
        steps, values = self.steps, self.values
        if len(values) > 6:  # (2000 points: the ends say enough)
            shown = ", ".join(map(repr, values[:3])) + ", ..., " + ", ".join(map(repr, values[-3:]))
        else:
            shown = ", ".join(map(repr, values))
        span = f"steps {steps[0]}..{steps[-1]}" if steps else "no steps"
        return f"LossSeries({len(values)} losses, {span}: [{shown}])"

    @property
    def steps(self) -> list[int]:
        return [p[1] for p in self._older] + [p[1] for p in self._recent]

    @property
    def values(self) -> list[float | None]:
        return [p[2] for p in self._older] + [p[2] for p in self._recent]

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "loss": self.values, "limit": self.limit}


class History:
    """Entries (dicts with a `"step"`), iterated in step order; at most `limit` + pinned."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._recent_max = max(1, limit // 2)
        self._older_max = max(1, limit - self._recent_max)
        self._recent: deque[tuple[int, dict[str, Any]]] = deque()
        self._older: list[tuple[int, dict[str, Any]]] = []
        self._pinned: list[dict[str, Any]] = []
        self.stride = 1
        self.count = 0  # entries ever added
        #: every non-finite step, recorded or not (`mark_nonfinite`), whatever the thinning
        self.nonfinite = NonfiniteSteps()
        #: every step skipped (non-finite gradients only, declared expected:
        #: `expect_nonfinite=("gradients",)`, a guarded update), recorded or not
        self.skipped = NonfiniteSteps()
        #: every step's loss, recorded (`add`) or not (`add_losses`), thinned
        self.losses = LossSeries(max(limit, LOSS_POINTS))

    def add(self, entry: dict[str, Any], *, pin: bool = False) -> None:
        if not _finite(entry):
            (self.skipped if _skipped(entry) else self.nonfinite).add(entry["step"])
        self.losses.add(entry["step"], _loss(entry))
        if pin:
            self._pinned.append(entry)
            return
        self._recent.append((self.count, entry))
        self.count += 1
        if len(self._recent) > self._recent_max:
            index, old = self._recent.popleft()
            if index % self.stride == 0:
                self._older.append((index, old))
            while len(self._older) > self._older_max:
                self.stride *= 2
                self._older = [(i, e) for i, e in self._older if i % self.stride == 0]

    def _raw(self) -> list[Any]:
        out = [e for _, e in self._older] + [e for _, e in self._recent]
        if self._pinned:
            steps = {e["step"] for e in self._pinned}
            out = sorted(
                [e for e in out if e["step"] not in steps] + self._pinned, key=lambda e: e["step"]
            )
        return out

    def _entries(self) -> list[dict[str, Any]]:
        return [_as_dict(e) for e in self._raw()]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._entries())

    def __len__(self) -> int:
        return len(self._older) + len(self._recent) + len(self._pinned)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self._entries()[i]

    def mark_nonfinite(self, steps: Iterable[int]) -> None:
        """Steps found non-finite that were not recorded (`Monitor(every=N)` checks every
        step; a run log's `N` records): counted with the recorded ones."""
        self.nonfinite.update(steps)

    def mark_skipped(self, steps: Iterable[int]) -> None:
        """Unrecorded steps whose gradients alone were non-finite, declared expected
        (`expect_nonfinite=("gradients",)`): counted as skipped, not as non-finite."""
        self.skipped.update(steps)

    def add_losses(self, steps: Iterable[int], losses: Iterable[float | None]) -> None:
        """Unrecorded steps' losses (`Monitor(every=N)` computes one at every step; a
        run log's `L` records), in step order, before the next recorded step's entry."""
        for step, loss in zip(steps, losses, strict=True):
            self.losses.add(int(step), loss)

    @property
    def steps(self) -> list[int]:
        return [e["step"] for e in self._raw()]

    def to_dict(self, nonfinite: Any = None) -> dict[str, Any]:
        """Column form for the model: steps, loss, finite flags and per-probe series.
        `nonfinite`: the run's first non-finite step's record (its owner's, a
        `Monitor`'s or a run log's, passes it); by default the one the history's own
        entries carry (the first non-finite step's entry holds the whole record), or
        None when no entry does."""
        entries = self._entries()
        if nonfinite is None:
            nonfinite = _first_record(entries)
        probes: dict[str, dict[str, list]] = {}
        for i, e in enumerate(entries):
            for pid, by_mode in e["probes"].items():
                for m, s in by_mode.items():
                    probes.setdefault(pid, {}).setdefault(m, [None] * len(entries))[i] = s
        return {
            "steps": [e["step"] for e in entries],
            "loss": [e["loss"] for e in entries],
            "finite": [e.get("finite", True) for e in entries],
            # a step a guarded update skipped (`expect_nonfinite=("gradients",)`)
            "skipped": [bool(e.get("skipped", False)) for e in entries],
            # which of the model's `programs` (shapes) each step ran; null: not said
            "program": [e.get("program") for e in entries],
            "probes": probes,
            "nonfinite": nonfinite,
            # every step found non-finite, recorded or not, never thinned: runs
            # [first, last]; the count includes steps past the listed runs
            "nonfinite_steps": [list(r) for r in self.nonfinite.ranges],
            "nonfinite_count": self.nonfinite.count,
            # the steps a guarded update skipped (`expect_nonfinite=("gradients",)`)
            "skipped_steps": [list(r) for r in self.skipped.ranges],
            "skipped_count": self.skipped.count,
            # every step's loss, recorded or not (`every=N`), thinned: the loss chart's
            "losses": self.losses.to_dict(),
            "limit": self.limit,
        }


def losses_item(steps: list[int], losses: list[float | None]) -> dict[str, Any]:
    """Unrecorded steps' losses as an item of a front-end update's list of steps (a
    Monitor's view, a followed run log): the front end adds them to the loss chart's
    every-step series (`history.losses`), not as recorded steps."""
    return {"kind": "losses", "steps": list(steps), "loss": list(losses)}


def _first_record(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    # As a run log's reader finds it (`runlog.view`): the first entry that says where
    # its NaN/Inf came from; a step's own `nonfinite` says it without its step number.
    for e in entries:
        record = e.get("nonfinite")
        if record:
            return {"step": e["step"], **record}
    return None


def _finite(entry: Any) -> bool:
    # A `_entry.LazyEntry` knows its flag without converting its summaries.
    flag = getattr(entry, "finite", None)
    if flag is None and isinstance(entry, dict):
        flag = entry.get("finite", True)
    return flag is not False


def _skipped(entry: Any) -> bool:
    flag = getattr(entry, "skipped", None)
    if flag is None and isinstance(entry, dict):
        flag = entry.get("skipped", False)
    return bool(flag)


def _loss(entry: Any) -> float | None:
    # A `_entry.LazyEntry` knows its loss without converting its summaries.
    if isinstance(entry, dict):
        return entry.get("loss")
    return getattr(entry, "loss", None)


def _as_dict(entry: Any) -> dict[str, Any]:
    # A `_entry.LazyEntry` converts itself once; a dict is already one.
    materialize = getattr(entry, "materialize", None)
    return entry if materialize is None else materialize()
