"""Python's garbage collector, paused while JAX traces a program."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_LOCK = threading.Lock()
_DEPTH = 0  # blocks open, in every thread
_WAS_ENABLED = False  # the collector's state when the first of them opened


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (then as it was before).

    Tracing a program allocates objects by the hundred thousand, and the collections
    they trigger walk a heap that grows with the program: a 1,000-equation capture
    program traced in 0.46 s instead of 0.80 s (first `inspect` of an edited function:
    1.95 s instead of 2.32 s, medians of 10). Nothing is lost: the next collection
    takes the cycles made meanwhile. Around a call that only dispatches a compiled
    program it costs two C calls and a lock.

    The collector is one switch for the whole process, and blocks overlap across
    threads (a widget compiles its next mode in the background while the kernel
    runs): the first block to open remembers its state and the last to close
    restores it, so an inner block never turns it back on early or leaves it off.
    """
    global _DEPTH, _WAS_ENABLED
    with _LOCK:
        if _DEPTH == 0:
            _WAS_ENABLED = gc.isenabled()
        _DEPTH += 1
        gc.disable()
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0 and _WAS_ENABLED:
                gc.enable()
