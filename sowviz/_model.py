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

from ._gc import gc_paused
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
    batch = _Float32Batch()
    # A model of 1,000 probes is 200,000 new lists and dicts: collections walking the
    # heap meanwhile took 0.07-0.13 s of 0.16 (`gc_paused`).
    with gc_paused():
        out = _plain({"": x}, batch)  # in a container: a float32 `x` has a place to go back
        batch.shorten()
    return out[""]


def _plain(x: Any, batch: _Float32Batch) -> Any:
    """`jsonable` of `x`, its float32 floats left in `batch` to be shortened."""
    t = type(x)
    if t is float:
        return x if math.isfinite(x) else None
    if x is None or t is str or t is int or t is bool:
        return x
    if t is list and _all_ints(x):  # counts, the bulk of a model: JSON already
        return x
    if t is list and set(map(type, x)) == _FLOAT:  # edges: C loops, no call per value
        return list(x) if all(map(math.isfinite, x)) else [_plain(v, batch) for v in x]
    if isinstance(x, Enum):
        return _plain(x.value, batch)
    if isinstance(x, dict):
        # A float32 summary's values, except the log histogram's edges (log10 values
        # computed on the host in float64).
        f32 = isinstance(x, Float32Json)
        out: dict[str, Any] = {}
        for k, v in x.items():
            key = str(k)
            out[key] = _plain(v, batch)
            if (f32 and key != "loghist") or _is_float32(v):
                batch.take(out, key)
        return out
    if isinstance(x, (list, tuple)):
        items = [_plain(v, batch) for v in x]
        for i, v in enumerate(x):
            if _is_float32(v):
                batch.take(items, i)
        return items
    if isinstance(x, (str, bool, int)):
        return x
    if hasattr(x, "tolist"):  # numpy scalars and arrays
        return _plain(x.tolist(), batch)
    return str(x)


def _all_ints(x: list) -> bool:
    return set(map(type, x)) <= _INT  # (C loops: a generator took 0.19 s on 3,000 probes)


_INT = {int}
_FLOAT = {float}
_FLOAT_OR_NONE = {float, type(None)}


def _is_float32(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.generic)) and x.dtype == np.float32


class _Float32Batch:
    """The float32 floats of a whole model, made their shortest decimals by one
    `shortest32_floats` call at the end (`shorten`): a call per histogram cost more in
    NumPy's fixed costs than one value at a time (Dragon4) did."""

    def __init__(self) -> None:
        self.values: list[float | None] = []
        # Where each run of values goes back: (container, key) for one value, or
        # (list, None) for a whole list of floats, in the order they were taken.
        self.places: list[tuple[Any, Any]] = []

    def take(self, container: Any, key: Any) -> None:
        """Every float in ``container[key]`` (jsonable) to be shortened in place."""
        v = container[key]
        if type(v) is float:
            self.places.append((container, key))
            self.values.append(v)
        elif isinstance(v, list):
            if _all_ints(v):
                return
            if set(map(type, v)) <= _FLOAT_OR_NONE:
                self.places.append((v, None))
                self.values.extend(v)
                return
            for i in range(len(v)):
                self.take(v, i)
        elif isinstance(v, dict):
            for k in v:
                self.take(v, k)

    def shorten(self) -> None:
        short = shortest32_floats(self.values) if self.values else []
        at = 0
        for container, key in self.places:
            if key is None:
                n = len(container)
                container[:] = short[at : at + n]
                at += n
            else:
                container[key] = short[at]
                at += 1


#: Powers of ten exact in float64 (10**22 is the last).
_POW10 = np.array([float(10**i) for i in range(23)])


def shortest32_floats(values: list[float | None]) -> list[float | None]:
    """Each float of `values` (None stays None) as the float64 nearest the shortest
    decimal that reads back as the same float32 (`json` then writes those few digits),
    for a whole list at once: 226,000 histogram edges took 0.2 s one by one (NumPy's
    Dragon4 per value), 0.05 s so.

    For k = 1, 2, ... significant digits, each value is rounded to k digits in float64
    as ``round(x * 10**p) / 10**p`` (or ``* 10**-p``): the power of ten is exact (|p| <=
    22) and so is the rounded integer, so the one division (product) gives the float64
    nearest that k-digit decimal; the first k whose decimal reads back as the float32
    is kept. The nearest k-digit decimal reads back whenever any k-digit decimal does
    (the float32's rounding interval is centred on it), so k is the shortest, as
    Dragon4 finds it. Values the table cannot scale (subnormals, |exponent| > 22) go
    one by one."""
    none = [i for i, v in enumerate(values) if v is None]
    f = np.asarray([0.0 if v is None else v for v in values] if none else values, np.float32)
    x = f.astype(np.float64)
    out = x.copy()
    m = np.abs(x)
    todo = (m > 0) & np.isfinite(m)
    e = np.floor(np.log10(np.where(todo, m, 1.0))).astype(np.int64)
    left = todo & (np.abs(e) <= 21)
    for k in range(1, 10):
        if not left.any():
            break
        p = k - 1 - e
        scalable = left & (np.abs(p) <= 22)
        pw = _POW10[np.minimum(np.abs(p), 22)]
        up = p >= 0
        i = np.round(np.where(up, x * pw, x / pw))
        r = np.where(up, i / pw, i * pw)
        hit = scalable & (r.astype(np.float32) == f)
        out[hit] = r[hit]
        left &= ~hit
    for j in np.flatnonzero(left | (todo & (np.abs(e) > 21))):
        out[j] = float(str(f[j]))
    got = out.tolist()
    for i in none:
        got[i] = None
    return got


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
