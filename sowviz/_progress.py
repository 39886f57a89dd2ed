"""What a long call is doing right now, for the widget's status line.

`phases(report)` listens to JAX's own compile events (`jax.monitoring`, public in
every supported JAX) while a call runs on this thread and reports `Phase.COMPILING`
once a program has been lowered (XLA compiles next) and `Phase.RUNNING` once XLA has
compiled it. Events of other threads are ignored, so two widgets (or a training
loop beside a notebook) do not mix their phases. Phases only move forward: a small
eager program compiled while the user's function is traced does not send the
status back to "tracing".
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any

import jax.monitoring

# The names JAX gives the events (jax/_src/dispatch.py, the same in JAX 0.10 to 0.12).
# They are plain strings: a renamed event only stops the status from advancing.
LOWERED = "/jax/core/compile/jaxpr_to_mlir_module_duration"
COMPILED = "/jax/core/compile/backend_compile_duration"


class Phase(str, Enum):
    """The widget's `phase` trait (str-valued: it crosses to the front end by name)."""

    READY = "ready"
    TRACING = "tracing"
    COMPILING = "compiling"
    RUNNING = "running"
    LOCATING = "locating"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value


_ORDER = {Phase.TRACING: 0, Phase.LOCATING: 0, Phase.COMPILING: 1, Phase.RUNNING: 2}


@contextlib.contextmanager
def phases(report: Callable[[Phase], None], start: Phase = Phase.TRACING) -> Iterator[None]:
    """Calls `report(phase)` as this thread's JAX compile advances (see the module
    docstring). `report` runs on this thread, inside JAX's compile path: keep it short."""
    me = threading.get_ident()
    state = {"at": _ORDER.get(start, 0)}

    def listener(event: str, duration: float, **kwargs: Any) -> None:
        if threading.get_ident() != me:
            return
        phase = {LOWERED: Phase.COMPILING, COMPILED: Phase.RUNNING}.get(event)
        if phase is not None and _ORDER[phase] > state["at"]:
            state["at"] = _ORDER[phase]
            report(phase)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
