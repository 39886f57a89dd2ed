"""Class attributes swapped for wrappers while sowviz traces, and put back after.

`frameworks` (Flax NNX and Equinox modules' `__call__`) and `numpyro_sites`
(NumPyro's handlers and distributions) each keep one `Patches`: every trace enters
it, installing wrappers for the targets it finds then (a class the user defined
since the last trace is new), and the last to leave puts every original back.
Reference counted under a lock: two threads tracing at once share one install.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

#: (owner, attribute, wrap): `wrap(original)` replaces `owner.attribute`
Target = tuple[type, str, Callable[[Any], Any]]


class Patches:
    """Originals of the attributes swapped for wrappers, while anyone traces."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._saved: dict[tuple[type, str], Any] = {}  # (owner, attribute) -> original

    def enter(self, targets: Callable[[], Iterable[Target]]) -> None:
        """One more user; wraps each target not wrapped yet (nor by sowviz already)."""
        with self._lock:
            self._users += 1
            for owner, name, wrap in targets():
                raw = owner.__dict__.get(name)
                if raw is None or (owner, name) in self._saved:
                    continue
                if getattr(raw, "__sowviz_wrapped__", None) is not None:
                    continue
                self._saved[owner, name] = raw
                type.__setattr__(owner, name, wrap(raw))

    def leave(self) -> None:
        """One user fewer; the last puts every original back."""
        with self._lock:
            self._users -= 1
            if self._users:
                return
            for (owner, name), raw in self._saved.items():
                type.__setattr__(owner, name, raw)
            self._saved.clear()
