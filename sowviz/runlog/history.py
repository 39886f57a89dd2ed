"""A bounded history of a whole run: recent steps at full resolution, older ones thinned.

The newest `limit // 2` recorded steps are all kept. Older ones are kept when their
index (their position among recorded steps) is a multiple of a stride that doubles
whenever the older part would exceed its half: every step for the most recent N,
every 2nd, 4th, 8th… before that. Index 0 is a multiple of every stride, so the
start of the run is never forgotten, and the memory held stays at most `limit`
entries however long the run.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any


class ThinnedHistory:
    """Append-only, bounded, keeps step 0. Iterates oldest first."""

    def __init__(self, limit: int) -> None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 2:
            raise ValueError(f"`history` must be an int >= 2, got {limit!r}.")
        self.limit = limit
        self._recent_max = limit // 2
        self._older_max = limit - self._recent_max
        self._recent: collections.deque[tuple[int, Any]] = collections.deque()
        self._older: list[tuple[int, Any]] = []
        self.stride = 1
        self.count = 0  # entries ever appended

    def append(self, entry: Any) -> None:
        self._recent.append((self.count, entry))
        self.count += 1
        if len(self._recent) > self._recent_max:
            index, old = self._recent.popleft()
            if index % self.stride == 0:
                self._older.append((index, old))
            while len(self._older) > self._older_max:
                self.stride *= 2
                self._older = [(i, e) for i, e in self._older if i % self.stride == 0]

    def extend(self, entries) -> None:
        for e in entries:
            self.append(e)

    def __iter__(self) -> Iterator[Any]:
        for _, e in self._older:
            yield e
        for _, e in self._recent:
            yield e

    def __len__(self) -> int:
        return len(self._older) + len(self._recent)

    def __getitem__(self, i: int) -> Any:
        return list(self)[i]

    def __repr__(self) -> str:
        return f"ThinnedHistory({len(self)} of {self.count} steps, limit={self.limit})"
