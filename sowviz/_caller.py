"""Where a warning points: the user's line, not sowviz's or JAX's internals."""

from __future__ import annotations

import sys

# Frames of these packages are passed over: a capture may run inside JAX's tracing.
_INTERNAL = ("sowviz.", "jax.", "jaxlib.")


def user_stacklevel() -> int:
    """`warnings.warn`'s stacklevel of the first frame outside sowviz and JAX (the
    user's `mon.step`, `inspect(...)`, ... call), seen from the function that warns."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    return level
