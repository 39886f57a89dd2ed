"""The inspection model: schema, modes, and the one place it is serialised.

The pipeline (`inspection.py`) and the recorder (`monitor.py`) build typed
objects (`Inspection`, `Probe`, `StageGraph`, `Mode`); the views (`widget.py`,
`report.py`, `monitor_view.py`) receive the dict `to_dict()` makes of them and
encode it with the functions here. Nothing in this module imports a view or
the package root. Field definitions: docs/model.md.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import math
from enum import Enum
from typing import Any

import numpy as np

from ._version import __version__
from .graph.model import STAGE_KINDS, NodeKind
from .summary import STAT_KEYS
from .summary_data import Float32Json

SCHEMA = "sowviz/1"
VERSION = __version__

__all__ = [
    "SCHEMA",
    "STAGE_KINDS",
    "STAT_KEYS",
    "VERSION",
    "Mode",
    "NodeKind",
    "encode_model",
    "model_json",
    "now",
]


class Mode(str, Enum):
    """Which derivative flows through the captured points (str-valued: JSON keeps the names)."""

    PRIMAL = "primal"
    GRAD = "grad"
    JVP = "jvp"
    VJP = "vjp"
    ALL = "all"

    def __str__(self) -> str:
        return self.value

    @property
    def keys(self) -> tuple[str, ...]:
        """The capture keys this mode produces at a probe that depends on the inputs."""
        return _KEYS[self]


_KEYS = {
    Mode.PRIMAL: ("primal",),
    Mode.GRAD: ("primal", "cotangent"),
    Mode.VJP: ("primal", "cotangent"),
    Mode.JVP: ("primal", "tangent"),
    Mode.ALL: ("primal", "tangent", "cotangent"),
}

#: Order in which capture keys are listed (`"modes"` of the model).
KEY_ORDER = ("primal", "tangent", "cotangent")


def now() -> str:
    """The `created` timestamp: UTC, to the second."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def jsonable(x: Any) -> Any:
    """Plain JSON values: NaN/Inf become null (JSON has neither), Enums their value,
    NumPy scalars and arrays Python numbers and lists. Floats that were float32 (NumPy
    float32 values, and the statistics of a float32 summary, `Float32Json`) become the
    shortest decimal that reads back as the same float32: ``0.1`` rather than
    ``0.10000000149011612``, a third of a float32 model's size."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Enum):
        return jsonable(x.value)
    if isinstance(x, Float32Json):
        # the log histogram's edges are log10 values computed on the host in float64
        return {
            str(k): jsonable(v) if k == "loghist" else _shortest32(jsonable(v))
            for k, v in x.items()
        }
    if isinstance(x, (np.ndarray, np.generic)) and x.dtype == np.float32:
        return _shortest32(jsonable(x.tolist()))
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if x is None or isinstance(x, (str, bool, int)):
        return x
    if hasattr(x, "tolist"):  # numpy scalars and arrays
        return jsonable(x.tolist())
    return str(x)


def _shortest32(x: Any) -> Any:
    """Every (finite) float in a jsonable value as the float64 nearest its shortest
    float32 decimal: `json` then writes those few digits. Reads back as the same float32."""
    if type(x) is float:
        return float(str(np.float32(x)))
    if isinstance(x, dict):
        return {k: _shortest32(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_shortest32(v) for v in x]
    return x


def model_json(model: Any) -> str:
    """The model as JSON that is also safe inside an HTML ``<script>`` element
    (``<``, ``>``, ``&`` and the JS line separators escaped)."""
    text = json.dumps(jsonable(model), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def encode_model(model: Any) -> bytes:
    """The model (or a list of steps) as gzipped UTF-8 JSON; byte-identical for equal input."""
    return gzip.compress(model_json(model).encode("utf-8"), compresslevel=6, mtime=0)


# -- report writers ---------------------------------------------------------------------
# The HTML report is a view: `report.py` registers its writer here when the package is
# imported, so the pipeline and the recorder can offer `save_html` without importing it.

_WRITERS: dict[str, Any] = {}


def register_writer(name: str, write: Any) -> None:
    """Register `write(model_dict, path) -> pathlib.Path` under `name` (views call this)."""
    _WRITERS[name] = write


def write(name: str, model: dict[str, Any], path: Any) -> Any:
    """Write `model` with the writer registered as `name` (e.g. "html")."""
    try:
        writer = _WRITERS[name]
    except KeyError:
        raise RuntimeError(
            f"sowviz: no {name!r} writer is registered; `import sowviz` registers the HTML "
            "report writer (sowviz.report)."
        ) from None
    return writer(model, path)
