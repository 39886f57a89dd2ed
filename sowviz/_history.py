"""The Monitor's in-memory history: the whole run, in bounded memory.

The newest `limit // 2` recorded steps are all kept. Older ones are kept when
their index (their position among recorded steps) is a multiple of a stride that
doubles whenever the older part would exceed its half: every step for the most
recent N, every 2nd, 4th, 8th... before that, spread over the whole run. Index 0
is a multiple of every stride, so the start of the run is never forgotten.
A pinned entry (the first non-finite step) is never dropped. The run log on disk
(`log_dir=`) keeps every step.

Entries are dicts or `_entry.LazyEntry`s (a Monitor's recorded steps, converted to
dicts on first read): reading the history gives dicts; a step thinned away before
anyone read it is never converted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any


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

    def add(self, entry: dict[str, Any], *, pin: bool = False) -> None:
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

    @property
    def steps(self) -> list[int]:
        return [e["step"] for e in self._raw()]

    def to_dict(self, nonfinite: Any) -> dict[str, Any]:
        """Column form for the model: steps, loss, finite flags and per-probe series."""
        entries = self._entries()
        probes: dict[str, dict[str, list]] = {}
        for i, e in enumerate(entries):
            for pid, by_mode in e["probes"].items():
                for m, s in by_mode.items():
                    probes.setdefault(pid, {}).setdefault(m, [None] * len(entries))[i] = s
        return {
            "steps": [e["step"] for e in entries],
            "loss": [e["loss"] for e in entries],
            "finite": [e.get("finite", True) for e in entries],
            # which of the model's `programs` (shapes) each step ran; null: not said
            "program": [e.get("program") for e in entries],
            "probes": probes,
            "nonfinite": nonfinite,
            "limit": self.limit,
        }


def _as_dict(entry: Any) -> dict[str, Any]:
    # A `_entry.LazyEntry` converts itself once; a dict is already one.
    materialize = getattr(entry, "materialize", None)
    return entry if materialize is None else materialize()
