"""Errors a library raises from inside a compiled program, said as the library says them,
and a library's errors while sowviz traces `fn`, said with their fix (`trace_error`).

Equinox's `error_if` (which diffrax calls when a solve takes more than `max_steps`,
optimistix when a root finder diverges) raises from a host callback while the
program runs; JAX reports that as a `JaxRuntimeError` of a few thousand characters
with the message buried inside. `eqx.filter_jit` re-raises it as an
`EquinoxRuntimeError` holding the message alone; a program sowviz compiled does the
same, through `library_errors()`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import jax

_EQX_MARK = "_EquinoxRuntimeError: "


@contextlib.contextmanager
def library_errors(where: str) -> Iterator[None]:
    """Re-raise an Equinox runtime error from inside the program as Equinox's own
    `EquinoxRuntimeError`, its message first, naming `where` it surfaced."""
    try:
        yield
    except jax.errors.JaxRuntimeError as err:
        said = _equinox_error(err, where)
        if said is None:
            raise
        raise said from None


def _equinox_error(err: Exception, where: str) -> Exception | None:
    text = str(err)
    eqx = sys.modules.get("equinox")
    if _EQX_MARK not in text or eqx is None:
        return None
    msg = text.split(_EQX_MARK, 1)[1].strip()
    info = getattr(sys.modules.get("equinox._jit"), "last_error_info", None)
    if info and isinstance(info[0], str):  # the message alone, as `eqx.filter_jit` reads it
        msg = info[0]
    error_type = getattr(eqx, "EquinoxRuntimeError", RuntimeError)
    return error_type(
        f"{msg}\n\n(raised by an Equinox `error_if` check inside the program sowviz.{where} "
        "ran; `EQX_ON_ERROR=breakpoint` opens a debugger there)"
    )


_NNX_FROM_OUTSIDE = (
    "sowviz: `fn` changes a Flax NNX object that is not one of its arguments (Flax said: "
    "{err}). sowviz traces `fn` inside a jit of its own, as `jax.jit(fn)` does, which "
    "fails the same way: `nnx.cached_partial(train_step, model, optimizer)`, or a "
    "function closing over `model`, hides the objects `fn` updates from the trace. "
    "Pass them as arguments (a train step in mode 'primal'): "
    "`sowviz.Monitor(train_step, mode='primal').step(model, optimizer, x, y)`, "
    "`sowviz.inspect(train_step, model, optimizer, x, y, mode='primal')`; sowviz writes "
    "their new state back, as `nnx.jit` does."
)


def trace_error(err: Exception) -> Exception | None:
    """A library's error raised while sowviz traced `fn`, said with what to do, or None
    (JAX's and the user's own errors pass through unchanged)."""
    if type(err).__name__ == "TraceContextError" and type(err).__module__ == "flax.errors":
        # (`Cannot mutate Param from a different trace level`: an update of a module
        # or optimizer captured from outside the trace)
        return ValueError(_NNX_FROM_OUTSIDE.format(err=str(err).split(" (https://", 1)[0]))
    return None
