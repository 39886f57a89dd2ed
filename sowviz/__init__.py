"""sowviz: see inside JAX programs.

Tag values with `sow`, capture them (and the tangents and cotangents that flow
through them) with `save_intermediates`, or let `inspect` / `show` / `Monitor`
probe every stage of a program automatically and draw it.

    >>> import jax, jax.numpy as jnp, sowviz
    >>> def loss(w, x):
    ...     h = sowviz.sow(jnp.tanh(x @ w), "hidden")
    ...     return jnp.sum(h ** 2)
    >>> w, x = jnp.ones((3, 2)), jnp.ones((4, 3))
    >>> grads, inter = sowviz.save_intermediates(jax.grad(loss))(w, x)
    >>> sorted(inter["hidden"])
    ['cotangent', 'primal']
"""

from typing import Any

from . import report as _report  # noqa: F401  (registers the HTML writer)
from ._api import save_intermediates as save_intermediates
from ._api import sow as sow
from ._api import summarize as summarize
from ._model import Mode as Mode
from ._version import __version__ as __version__
from .capture.api import SaveIntermediates as SaveIntermediates
from .capture.interpret import CaptureError as CaptureError
from .inspection import Inspection as Inspection
from .inspection import inspect as inspect
from .monitor import Monitor as Monitor
from .monitor import NonFiniteError as NonFiniteError
from .monitor import NonFiniteWarning as NonFiniteWarning
from .runlog import load as load
from .summary import Summary as Summary
from .summary import SummaryOptions as SummaryOptions

__all__ = [
    "CaptureError",
    "Inspection",
    "Inspector",
    "Mode",
    "Monitor",
    "MonitorView",
    "NonFiniteError",
    "NonFiniteWarning",
    "SaveIntermediates",
    "Summary",
    "SummaryOptions",
    "inspect",
    "load",
    "save_intermediates",
    "show",
    "sow",
    "summarize",
]


# The widget names need anywidget; they load on first use, so scripts (a headless
# Monitor, inspect, reports) run without the notebook stack.
_VIEWS = {"Inspector": "widget", "show": "widget", "MonitorView": "monitor_view"}


def __getattr__(name: str) -> Any:
    if name in _VIEWS:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_VIEWS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sowviz' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_VIEWS])
