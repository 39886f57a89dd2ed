"""The `Summary` of one array and its per-iteration statistics: typed pytrees, and
their JSON form (docs/model.md, "Summary").

`sowviz.summary` computes them on the device (its docstring states the rules);
this module only holds the results and turns them into plain Python values on
the host. Both classes are re-exported by `sowviz.summary`, their public home.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from itertools import repeat
from typing import Any

import jax
import numpy as np

from .summary_ops import LOG_BINS, LOG_SUB_BITS

#: The scalar statistics of a summary, in display order (also its JSON keys).
STAT_KEYS = (
    "count",
    "nan",
    "posinf",
    "neginf",
    "zeros",
    "min",
    "max",
    "mean",
    "std",
    "l2",
    "absmax",
)

_ROW_KEYS = ("count", "nonfinite", "min", "max", "mean", "std", "l2", "absmax")


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=[*_ROW_KEYS, "hist_counts"],
    meta_fields=["index", "iterations"],
)
@dataclasses.dataclass(frozen=True)
class IterationStats:
    """Statistics of each kept row of axis 0 (an iteration) of a stacked capture."""

    count: Any  # (rows,) int32: finite elements of the row
    nonfinite: Any  # (rows,) int32
    min: Any
    max: Any
    mean: Any
    std: Any
    l2: Any
    absmax: Any
    hist_counts: Any  # (rows, bins) int32 over the pooled hist edges
    index: tuple[int, ...]  # which iterations the rows are
    iterations: int  # all iterations (rows of axis 0)

    def to_json(self) -> dict[str, Any]:
        h = jax.device_get(self)
        cnt = np.asarray(h.count)

        def col(k: str) -> list[float | None]:
            return [
                _finite_float(x) if c > 0 else None for x, c in zip(getattr(h, k), cnt, strict=True)
            ]

        out: dict[str, Any] = {
            "iterations": self.iterations,
            "index": list(self.index),
            "count": [int(c) for c in cnt],
            "nonfinite": [int(c) for c in np.asarray(h.nonfinite)],
        }
        for k in ("min", "max", "mean", "std", "absmax"):
            out[k] = col(k)
        out["l2"] = [
            norm_json(x, c, m, s) if c > 0 else None
            for x, c, m, s in zip(h.l2, cnt, h.mean, h.std, strict=True)
        ]
        out["hist_counts"] = np.asarray(h.hist_counts).astype(int).tolist()
        return out


class Float32Json(dict):
    """`Summary.to_json()` of a summary whose statistics were float32 on the device (a
    plain dict otherwise). The type is the only record of that once the values are
    Python floats: the model's serialiser (`_model.jsonable`) writes these floats
    (not the host-computed ``loghist`` edges) in the shortest decimal that reads back
    as the same float32, and keeps every digit of float64 ones (``jax_enable_x64``)."""


_DATA_FIELDS = (
    *STAT_KEYS,
    "hist_edges",
    "hist_counts",
    "loghist_start",
    "loghist_under",
    "loghist_counts",
    "loghist_under_neg",
    "loghist_neg",
    "per_iteration",
)
_META_FIELDS = ("shape", "dtype", "is_complex", "bins")


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=_DATA_FIELDS, meta_fields=_META_FIELDS
)
@dataclasses.dataclass(frozen=True)
class Summary:
    """Statistics of one array, computed on the device by `summarize`.

    A pytree: the array fields are leaves (so a `Summary` can be returned from a
    jitted function, or stacked by `vmap`/`scan` along a leading axis); ``shape``,
    ``dtype``, ``is_complex`` and ``bins`` are static metadata describing the
    summarised array (for a stacked `Summary`, one element of the stack).

    Example:
        >>> s = summarize(jnp.array([1.0, 2.0, jnp.nan]), bins=4)
        >>> s.to_json()["count"], s.to_json()["nan"], s.to_json()["max"]
        (2, 1, 2.0)
    """

    count: Any  # int32: finite elements
    nan: Any  # int32
    posinf: Any  # int32
    neginf: Any  # int32
    zeros: Any  # int32 (subnormals included)
    min: Any  # float: over finite elements (0 when count == 0)
    max: Any
    mean: Any
    std: Any  # population standard deviation
    l2: Any  # Euclidean norm
    absmax: Any
    hist_edges: Any  # (bins + 1,)
    hist_counts: Any  # (bins,) int32
    loghist_start: Any  # int32: key of the first log bin (see the module docstring)
    loghist_under: Any  # int32: non-zero finite values below the log window
    loghist_counts: Any  # (LOG_BINS,) int32
    loghist_under_neg: Any  # int32: how many of `loghist_under` are negative
    loghist_neg: Any  # (LOG_BINS,) int32: how many of each bin's values are negative
    per_iteration: IterationStats | None
    shape: tuple[int, ...]
    dtype: str
    is_complex: bool
    bins: int

    @property
    def size(self) -> int:
        """Number of elements of the summarised array."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the array leaves: what one device→host transfer of this summary moves."""
        return sum(int(leaf.nbytes) for leaf in jax.tree_util.tree_leaves(self))

    @property
    def loghist_edges(self) -> np.ndarray:
        """The ``LOG_BINS + 1`` log-bin edges, in ``log10`` units (float64, on the host)."""
        start = np.asarray(jax.device_get(self.loghist_start))
        dtype = np.asarray(jax.device_get(self.absmax)).dtype
        keys = start[..., None] + np.arange(LOG_BINS + 1)
        return log10_edge(keys, dtype)

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready dict of docs/model.md ("Summary"), with plain Python types.

        Statistics over finite values (``l2`` too) are ``None`` when there are none:
        an all-NaN gradient has no norm, not one of 0; no NaN or infinity ever appears. An ``l2`` past the dtype's range
        (``inf`` on the device) is the float64 norm `norm_json` gives; such a summary's
        JSON is a plain dict, not `Float32Json` (its ``l2`` is no float32). Fetches
        the leaves from the device if needed (prefer `to_host` on a whole tree first:
        one transfer).

        Example:
            >>> summarize(jnp.zeros((2, 3)), bins=2).to_json()["hist"]["counts"]
            [0, 6]
        """
        host = self._one_on_host("to_json")
        out = {
            "shape": list(self.shape),
            "dtype": self.dtype,
            "size": self.size,
            "complex": self.is_complex,
            **_stats_json(host),
            "loghist": _loghist_json(host),
        }
        if host.per_iteration is not None:
            out["per_iteration"] = host.per_iteration.to_json()
        float32 = np.asarray(host.absmax).dtype == np.float32
        return Float32Json(out) if float32 and _norms_fit_float32(out) else out

    def stats_json(self) -> dict[str, Any]:
        """`to_json()`'s `STAT_KEYS` and ``hist`` alone (a plain dict): what a Monitor's
        history and sinks keep of each step (not its loghist nor per-iteration JSON)."""
        return _stats_json(self._one_on_host("stats_json"))

    def _one_on_host(self, method: str) -> Summary:
        """This summary with NumPy leaves; an error for a stacked one."""
        # Unpacked summaries are already NumPy: a device_get would still walk and
        # copy-check every leaf (a third of `inspect`'s time on 1,000 probes).
        on_host = all(isinstance(v, (np.ndarray, np.generic)) for v in _arrays(self))
        host = self if on_host else jax.device_get(self)
        if np.ndim(host.count) != 0:
            raise ValueError(
                f"{method} needs one summary, but this one is stacked with leading axes "
                f"{np.shape(host.count)} (from vmap/scan); index its leaves first, e.g. "
                "jax.tree.map(lambda leaf: leaf[i], summary)"
            )
        return host


def _stats_json(host: Summary) -> dict[str, Any]:
    """The `STAT_KEYS` and ``hist`` of `Summary.to_json` for `host` (one, NumPy leaves)."""
    count = int(host.count)

    def stat(v: Any) -> float | None:
        return _finite_float(v) if count > 0 else None

    return {
        "count": count,
        "nan": int(host.nan),
        "posinf": int(host.posinf),
        "neginf": int(host.neginf),
        "zeros": int(host.zeros),
        "min": stat(host.min),
        "max": stat(host.max),
        "mean": stat(host.mean),
        "std": stat(host.std),
        "l2": norm_json(host.l2, count, host.mean, host.std) if count > 0 else None,
        "absmax": stat(host.absmax),
        "hist": {
            "edges": _finite_floats(host.hist_edges),
            "counts": np.asarray(host.hist_counts).tolist(),
        },
    }


def stack_rows(stack: Summary) -> StackRows | None:
    """The JSON rows of `stack` (a `Summary` stacked on a leading axis, NumPy leaves),
    or None for a stack with per-iteration statistics or leaves still on a device."""
    if stack.per_iteration is not None or not all(
        isinstance(v, np.ndarray) for v in _arrays(stack)
    ):
        return None
    return StackRows(stack)


@dataclasses.dataclass(frozen=True)
class SummaryRow:
    """Row `index` of a stacked `Summary`, made for its JSON (`to_json`, what `inspect`
    and a Monitor's history read): no `Summary` object with a NumPy view per field is
    made for it. The 10,000-equation program's 10,000 summaries took 0.39 s to convert
    one by one, and their views as long again to make and drop. A `Summary`'s other
    fields and properties (`l2`, `mean`, `hist_counts`, `bins`, `nbytes`, ...) read
    the row's own `Summary` (`summary()`, made when one is asked for), so a probe's
    `typed_summaries` read alike whether or not they are rows."""

    rows: StackRows
    index: int
    shape: tuple[int, ...]
    dtype: str
    is_complex: bool

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> dict[str, Any]:
        """What `Summary.to_json` gives for this row."""
        return self.rows.member(self.index, self)

    def stats_json(self) -> dict[str, Any]:
        """`to_json()`'s `STAT_KEYS` and ``hist`` alone (a plain dict): what a Monitor's
        history and sinks keep of each step."""
        return self.rows.stats(self.index)

    def summary(self) -> Summary:
        """This row as a `Summary` of its own: the stack's fields at row `index` (as a
        stack's member that is no row is cut), with this row's shape and dtype."""
        one = jax.tree_util.tree_map(lambda a: a[self.index], self.rows._stack)
        return dataclasses.replace(
            one, shape=self.shape, dtype=self.dtype, is_complex=self.is_complex
        )

    def __getattr__(self, name: str) -> Any:
        # only for names not found on the row: a `Summary`'s (a while loop's sow is a
        # row, a scan's a `Summary`: `probe.typed_summaries["primal"].l2` reads both)
        if name in _SUMMARY_NAMES:
            return getattr(self.summary(), name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class StackRows:
    """`Summary.to_json` of every row of a stack, but the static fields, computed
    field by field over the whole stack (one NumPy call per field, not a dozen per
    row) when a row is first asked for."""

    def __init__(self, stack: Summary):
        self._stack = stack
        self._columns: dict[str, Any] | None = None  # all of `member`'s
        self._stat_cols: dict[str, Any] | None = None  # those of `stats`
        self._stat_rows: list[dict[str, Any]] | None = None

    def stats(self, j: int) -> dict[str, Any]:
        """Row j's `STAT_KEYS` and ``hist``, as `member` gives them. All rows are built at
        once, field by field, with no Python per row or value: a Monitor's step reads
        every row, each once, and `member` cost 40 µs a row (its loghist lists and the
        rest of the JSON, thrown away) on a sink's thread that holds the GIL."""
        rows = self._stat_rows if self._stat_rows is not None else self._make_stat_rows()
        return rows[j]

    def _make_stat_rows(self) -> list[dict[str, Any]]:
        c = self._stat_columns()
        seen = np.asarray(self._stack.count) > 0
        hist = zip(
            zip(repeat("edges"), c["hist_edges"].tolist()),
            zip(repeat("counts"), c["hist_counts"].tolist()),
            strict=True,
        )
        fields = {
            **{k: c[k] for k in ("count", "nan", "posinf", "neginf", "zeros")},
            **{k: _where_seen(seen, c[k], None) for k in ("min", "max", "mean", "std", "l2")},
            "absmax": _where_seen(seen, c["absmax"], None),
            "hist": map(dict, hist),
        }
        # `dict` of each row's (key, value) pairs, called by `map`: no Python line per row
        pairs = (zip(repeat(k), v) for k, v in fields.items())
        self._stat_rows = list(map(dict, zip(*pairs, strict=True)))
        return self._stat_rows

    def member(self, j: int, s: Summary | SummaryRow) -> dict[str, Any]:
        """Row j as `s.to_json()` gives it (its shape, dtype and size are `s`'s)."""
        c = self._columns if self._columns is not None else self._convert()
        count = c["count"][j]
        lo, hi = c["log_first"][j], c["log_last"][j]
        out = {
            "shape": list(s.shape),
            "dtype": s.dtype,
            "size": s.size,
            "complex": s.is_complex,
            "count": count,
            **{k: c[k][j] for k in ("nan", "posinf", "neginf", "zeros")},
            **{k: c[k][j] if count > 0 else None for k in ("min", "max", "mean", "std")},
            "l2": c["l2"][j] if count > 0 else None,
            "absmax": c["absmax"][j] if count > 0 else None,
            "hist": {"edges": c["hist_edges"][j].tolist(), "counts": c["hist_counts"][j].tolist()},
            "loghist": {
                "edges": c["log_edges"][j, lo : hi + 2].tolist() if hi >= 0 else [],
                "counts": c["log_counts"][j, lo : hi + 1].tolist() if hi >= 0 else [],
                "neg": c["log_neg"][j, lo : hi + 1].tolist() if hi >= 0 else [],
                "under": c["under"][j],
                "under_neg": c["under_neg"][j],
            },
        }
        return Float32Json(out) if c["float32"] and _norms_fit_float32(out) else out

    def _stat_columns(self) -> dict[str, Any]:
        """The columns of `STAT_KEYS` and ``hist`` (shared by `stats` and `member`)."""
        if self._stat_cols is not None:
            return self._stat_cols
        h = self._stack
        c: dict[str, Any] = {"float32": np.asarray(h.absmax).dtype == np.float32}
        for k in ("count", "nan", "posinf", "neginf", "zeros"):
            c[k] = np.asarray(getattr(h, k)).astype(int).tolist()
        # the five float fields (of one dtype) as one array: a NumPy call each, not five
        floats = ("min", "max", "mean", "std", "absmax")
        c.update(
            zip(floats, _saturated(np.stack([getattr(h, k) for k in floats])).tolist(), strict=True)
        )
        c["l2"] = _norms(h.l2, h.count, h.mean, h.std).tolist()
        # rows of bins stay arrays until a row is asked for (as lists of lists, then
        # copied per row, they were objects by the million to make and to free)
        c["hist_edges"] = _saturated(h.hist_edges)
        c["hist_counts"] = np.asarray(h.hist_counts)
        self._stat_cols = c
        return c

    def _convert(self) -> dict[str, Any]:
        h = self._stack
        absmax = np.asarray(h.absmax)
        c = dict(self._stat_columns())
        counts = np.asarray(h.loghist_counts)
        seen = counts != 0
        any_seen = seen.any(axis=1)
        c["log_first"] = np.where(any_seen, seen.argmax(axis=1), 0).tolist()
        last = counts.shape[1] - 1 - seen[:, ::-1].argmax(axis=1)
        c["log_last"] = np.where(any_seen, last, -1).tolist()
        keys = np.asarray(h.loghist_start)[:, None] + np.arange(counts.shape[1] + 1)
        c["log_edges"] = log10_edge(keys, absmax.dtype)
        c["log_counts"], c["log_neg"] = counts, np.asarray(h.loghist_neg)
        c["under"] = np.asarray(h.loghist_under).astype(int).tolist()
        c["under_neg"] = np.asarray(h.loghist_under_neg).astype(int).tolist()
        self._columns = c
        return c


def _where_seen(seen: np.ndarray, values: list[Any], empty: Any) -> list[Any]:
    """`values` (a column's Python numbers) with `empty` where a row has no finite
    value (`seen` False), as `member` writes them; the numbers stay the same objects."""
    if seen.all():
        return values
    return np.where(seen, np.array(values, dtype=object), empty).tolist()


def _saturated(v: Any) -> np.ndarray:
    """`v` with NaN as 0 and ±inf as the dtype's largest finite values (what
    `_finite_float` makes of each element)."""
    a = np.asarray(v)
    if np.isfinite(a).all():  # nearly always; `nan_to_num` costs 10 µs even then
        return a
    big = np.finfo(a.dtype).max
    return np.nan_to_num(a, nan=0.0, posinf=big, neginf=-big)


def log10_edge(keys: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``log10`` of the lower edge of log-bin `keys` (float64; exact up to rounding)."""
    info = np.finfo(dtype)
    keys = np.asarray(keys, np.int64)
    e = (keys >> LOG_SUB_BITS) - (info.maxexp - 1)
    m = keys & ((1 << LOG_SUB_BITS) - 1)
    return e * np.log10(2.0) + np.log10(1 + m / (1 << LOG_SUB_BITS))


def _loghist_json(host: Summary) -> dict[str, Any]:
    counts = np.asarray(host.loghist_counts)
    nz = np.flatnonzero(counts)
    under, under_neg = int(host.loghist_under), int(host.loghist_under_neg)
    if nz.size == 0:
        return {"edges": [], "counts": [], "neg": [], "under": under, "under_neg": under_neg}
    first, last = int(nz[0]), int(nz[-1])
    keys = int(host.loghist_start) + np.arange(first, last + 2)
    edges = log10_edge(keys, np.asarray(host.absmax).dtype)
    return {
        "edges": edges.tolist(),
        "counts": counts[first : last + 1].tolist(),
        "neg": np.asarray(host.loghist_neg)[first : last + 1].tolist(),
        "under": under,
        "under_neg": under_neg,
    }


def _arrays(summary: Any) -> list[Any]:
    """The statistics' leaves of `summary` (not per-iteration ones)."""
    return [getattr(summary, f) for f in ("count", "min", "hist_edges", "hist_counts", "l2")]


def _finite_floats(v: Any) -> list[float]:
    """`_finite_float` of every element (a flat list of Python floats)."""
    a = np.asarray(v)
    if np.isfinite(a).all():
        return a.tolist()
    big = float(np.finfo(a.dtype).max)
    return np.nan_to_num(a, nan=0.0, posinf=big, neginf=-big).tolist()


_F32_MAX = float(np.finfo(np.float32).max)


def norm_json(l2: Any, count: Any, mean: Any, std: Any) -> float:
    """`l2` of `count` finite values as JSON holds it. The only statistic that can leave
    its dtype's range is l2 (``sqrt(n) * absmax``: a float32 attention mask filled with
    ``-0.7 * finfo.max`` has one of 9.5e38); it is then ``inf`` on the device, and here
    the float64 ``sqrt(count * (mean**2 + std**2))``, the same sum of squares from the
    mean and std (which stay in range), as accurate as they are (rtol 1e-4). A norm
    past float64's range too saturates at its largest finite value (JSON has no
    infinity); 16 values of -0.7 * float32 max gave float32 max, a false value."""
    return float(_norms(l2, count, mean, std))


def _norms(l2: Any, count: Any, mean: Any, std: Any) -> np.ndarray:
    """`norm_json` of every element (float64 where an element left its dtype's range)."""
    a = np.asarray(l2)
    if np.isfinite(a).all():
        return a
    n = np.asarray(count, np.float64)
    m, s = np.asarray(mean, np.float64), np.asarray(std, np.float64)
    with np.errstate(over="ignore"):
        rebuilt = np.sqrt(n) * np.hypot(m, s)
    return _saturated(np.where(np.isinf(a) & (n > 0), rebuilt, a.astype(np.float64)))


def as_float32_row(row: dict[str, Any] | None) -> dict[str, Any] | None:
    """A history row (`SummaryRow` statistics) of a summary that was float32 on the
    device, marked so (`Float32Json`) for a report's JSON: its floats written as the
    shortest decimals that read back as the same float32s. The rows stay plain dicts in
    the Monitor (its view and the run log read them as they are)."""
    if row is None or isinstance(row, Float32Json) or not _norms_fit_float32(row):
        return row
    return Float32Json(row)


def _norms_fit_float32(out: dict[str, Any]) -> bool:
    """Whether every ``l2`` of a summary's JSON `out` (its per-iteration ones too) is a
    float32 value: one past float32's range is a float64 (`norm_json`), which
    `Float32Json` would round back to float32, an infinity."""
    rows = out.get("per_iteration", {}).get("l2", [])
    return all(v is None or abs(v) <= _F32_MAX for v in (out["l2"], *rows))


def _finite_float(v: Any) -> float:
    # JSON has no infinity: a statistic out of range (none is, but l2, `norm_json`)
    # saturates at the largest finite value of its dtype instead.
    a = np.asarray(v)
    if np.isfinite(a):
        return float(a)
    if np.isnan(a):  # unreachable by construction; never emit NaN regardless
        return 0.0
    big = float(np.finfo(a.dtype).max)
    return big if a > 0 else -big


#: What a `SummaryRow` reads from its row's `Summary`: the fields and public members.
_SUMMARY_NAMES = frozenset(
    [f.name for f in dataclasses.fields(Summary)]
    + [n for n in vars(Summary) if not n.startswith("_")]
)
