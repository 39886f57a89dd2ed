"""On-device statistics of one array: counts, moments and two histograms.

`summarize` runs inside the compiled program (it is jittable, vmappable and keeps
sharded inputs distributed), so only a `Summary` of constant size crosses to the
host, whatever the size of the array it describes.

Conventions (reproduced by the tests in NumPy):

* Integer and bool arrays are summarised by value (as float32); bf16/f16 are
  accumulated in float32; float64 (with ``jax_enable_x64``) stays float64;
  complex arrays are summarised by magnitude ``|x|`` (C99: a complex with an
  infinite part has infinite magnitude, even if the other part is NaN).
* 64-bit NumPy input while ``jax_enable_x64`` is off (JAX would wrap int64 and
  turn 1e300 into inf) is converted on the host: int64/uint64 to float32 (by
  value, as 32-bit integers are), float64/complex128 to float32/complex64 when
  every finite value stays finite and is zero or a normal float32; otherwise
  `summarize` raises a ValueError naming ``jax_enable_x64``. ``dtype`` reports
  the input's own dtype.
* Subnormal input values count as zeros (backends flush them inconsistently;
  doing it explicitly keeps every statistic consistent with the others).
  Results below the smallest normal number (a mean of 1e-39, an edge between
  two tiny values) may be flushed to 0 by the backend: compare with an absolute
  tolerance of ``finfo.tiny``.
* ``nan``/``posinf``/``neginf``/``zeros`` are counted over all elements; ``min``,
  ``max``, ``mean``, ``std`` (population, ddof=0), ``l2`` and ``absmax`` are over
  the ``count`` finite elements only (``mean`` is clipped into ``[min, max]``).
  Only ``l2`` can exceed the dtype's range (``sqrt(n) * absmax``): it is then
  ``inf`` on the device and the largest finite value in `Summary.to_json`.
  Accuracy: rtol 1e-5 for mean and l2, 1e-4 for std, against float64.
* ``hist`` has ``bins + 1`` edges linearly spaced over ``[lo, hi] = [min, max]``
  of the finite values (``edges[0] == lo``, ``edges[-1] == hi``, so they always
  cover the values). With ``s`` the largest power of two <= ``max(|lo|, |hi|)``
  but at least ``tiny / eps`` (2**-103 in float32), a value's bin is
  ``clip(floor((v/s - lo/s) * (bins / (hi/s - lo/s))), 0, bins - 1)`` in the
  value dtype: the max lands in the last bin, and the counts equal
  ``np.histogram(v, bins=edges)`` except possibly for a value within an ulp of
  an interior edge.
* Ranges that cannot be cut into ``bins`` distinct bins are widened so the edges
  strictly increase: ``lo == hi`` (also "no values", where ``lo = hi = 0``)
  becomes ``[lo - p, hi + p]`` with ``p = max(0.5, |lo| / 1024)`` (all values
  then land in one middle bin); a range narrower than ``bins * 8 * eps`` in units
  of ``s`` is widened symmetrically around its midpoint to that width (the floor
  on ``s`` keeps every bin at least ``8 * tiny`` wide).
* ``loghist`` counts the non-zero finite values by magnitude on a FIXED grid
  (identical for every array, step, device and host, so histograms merge by
  adding counts): the bin of ``|v|`` is its float bits shifted right to keep
  the exponent and the top 2 mantissa bits, ``key = bits(|v|) >> (nmant - 2)``,
  i.e. 4 bins per octave with lower edges ``2**e * (1, 1.25, 1.5, 1.75)``
  (exact: a value's bin equals ``np.histogram`` over those edges). The
  `LOG_BINS` = 128 bins (32 octaves, about 9.6 decades) ending with the bin of
  ``absmax`` are kept (``loghist_start`` is the key of the first); non-zero
  values below them are counted in ``loghist_under``. In JSON, ``loghist``
  holds the bins from the first to the last non-empty one, with ``edges`` in
  ``log10`` units (``[]`` when no non-zero finite value), plus ``under``.
* Per-iteration statistics (``summarize(x, per_iteration=True)``: axis 0 of ``x``
  is the iteration, as for a capture stacked by scan/fori/while): per row of
  axis 0, ``count``, ``nonfinite`` (NaN and infinities), ``min``, ``max``,
  ``mean``, ``std``, ``l2``, ``absmax`` by the rules above, and ``hist_counts``
  over the pooled ``hist`` edges. Rows kept: all when there are at most
  ``min(MAX_ROWS, MAX_ROW_COUNTS // bins)`` (256 at 64 bins), else that many,
  evenly strided by ``round(linspace(0, rows - 1, cap))`` (first and last
  included); ``index`` lists them. The pooled statistics cover every row.
* Counts are int32 (arrays of 2**31 or more elements would overflow them).
  ``bins`` is an int in [1, `MAX_BINS`] (4096).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import summary_ops as _ops
from .summary_ops import LOG_BINS, LOG_SUB_BITS

__all__ = ["Summary", "SummaryOptions", "summarize", "summarize_tree", "to_host"]

#: Largest accepted number of histogram bins.
MAX_BINS = 4096
#: At most this many iterations get per-iteration statistics (see the docstring).
MAX_ROWS = 256
#: ... and at most this many per-iteration histogram counts in all.
MAX_ROW_COUNTS = 16384


def _check_bins(bins: Any) -> int:
    # bool is an int subclass; `bins=True` is a mistake, not "one bin".
    if (
        isinstance(bins, bool)
        or not isinstance(bins, (int, np.integer))
        or not 1 <= bins <= MAX_BINS
    ):
        raise ValueError(
            f"bins must be an int >= 1 and <= {MAX_BINS} (the number of histogram bins), "
            f"got {bins!r}; pass e.g. bins=64"
        )
    return int(bins)


@dataclasses.dataclass(frozen=True)
class SummaryOptions:
    """How captured arrays are summarised.

    Example:
        >>> SummaryOptions(bins=32).bins
        32
    """

    bins: int = 64

    def __post_init__(self) -> None:
        _check_bins(self.bins)


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


def kept_rows(rows: int, bins: int) -> np.ndarray:
    """The iterations that get per-iteration statistics (see the module docstring)."""
    cap = max(1, min(MAX_ROWS, MAX_ROW_COUNTS // bins))
    if rows <= cap:
        return np.arange(rows)
    return np.unique(np.round(np.linspace(0, rows - 1, cap)).astype(np.int64))


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
        out["l2"] = [_finite_float(x) if c > 0 else 0.0 for x, c in zip(h.l2, cnt, strict=True)]
        out["hist_counts"] = np.asarray(h.hist_counts).astype(int).tolist()
        return out


_DATA_FIELDS = (
    *STAT_KEYS,
    "hist_edges",
    "hist_counts",
    "loghist_start",
    "loghist_under",
    "loghist_counts",
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

        Statistics over finite values are ``None`` when there are none (``l2`` is
        then 0.0); no NaN or infinity ever appears. Fetches the leaves from the
        device if needed (prefer `to_host` on a whole tree first: one transfer).

        Example:
            >>> summarize(jnp.zeros((2, 3)), bins=2).to_json()["hist"]["counts"]
            [0, 6]
        """
        host = jax.device_get(self)
        if np.ndim(host.count) != 0:
            raise ValueError(
                f"to_json needs one summary, but this one is stacked with leading axes "
                f"{np.shape(host.count)} (from vmap/scan); index its leaves first, e.g. "
                "jax.tree.map(lambda leaf: leaf[i], summary)"
            )
        count = int(host.count)

        def stat(v: Any) -> float | None:
            return _finite_float(v) if count > 0 else None

        out = {
            "shape": list(self.shape),
            "dtype": self.dtype,
            "size": self.size,
            "complex": self.is_complex,
            "count": count,
            "nan": int(host.nan),
            "posinf": int(host.posinf),
            "neginf": int(host.neginf),
            "zeros": int(host.zeros),
            "min": stat(host.min),
            "max": stat(host.max),
            "mean": stat(host.mean),
            "std": stat(host.std),
            "l2": _finite_float(host.l2) if count > 0 else 0.0,
            "absmax": stat(host.absmax),
            "hist": {
                "edges": [_finite_float(e) for e in np.asarray(host.hist_edges)],
                "counts": [int(c) for c in np.asarray(host.hist_counts)],
            },
            "loghist": _loghist_json(host),
        }
        if host.per_iteration is not None:
            out["per_iteration"] = host.per_iteration.to_json()
        return out


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
    under = int(host.loghist_under)
    if nz.size == 0:
        return {"edges": [], "counts": [], "under": under}
    first, last = int(nz[0]), int(nz[-1])
    keys = int(host.loghist_start) + np.arange(first, last + 2)
    edges = log10_edge(keys, np.asarray(host.absmax).dtype)
    return {
        "edges": [float(e) for e in edges],
        "counts": [int(c) for c in counts[first : last + 1]],
        "under": under,
    }


def _finite_float(v: Any) -> float:
    # The only statistic that can leave the dtype's range is l2 (sqrt(n) * absmax
    # near the float32 limit). JSON has no infinity, so it saturates at the
    # largest finite value of its dtype instead.
    a = np.asarray(v)
    if np.isfinite(a):
        return float(a)
    if np.isnan(a):  # unreachable by construction; never emit NaN regardless
        return 0.0
    big = float(np.finfo(a.dtype).max)
    return big if a > 0 else -big


def to_host(tree: Any) -> Any:
    """Fetch a whole pytree of `Summary` objects in ONE `jax.device_get`.

    Returns the same structure with NumPy leaves.

    Example:
        >>> host = to_host({"w": summarize(jnp.ones(3))})
        >>> type(host["w"].count).__name__
        'ndarray'
    """
    return jax.device_get(tree)


def _value_dtype(dtype: np.dtype) -> tuple[Any, bool]:
    """The float dtype statistics are computed in, and whether input is complex."""
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return (jnp.float64 if dtype == jnp.complex128 else jnp.float32), True
    if dtype == jnp.float64:
        return jnp.float64, False
    # bf16/f16 would lose everything to rounding in long sums; ints and bool are
    # summarised by value.
    return jnp.float32, False


def _values(x: jax.Array) -> jax.Array:
    """The values summarised, in the accumulation dtype."""
    acc, is_complex = _value_dtype(x.dtype)
    if is_complex:
        # C99/NumPy: a complex number with an infinite part has infinite
        # magnitude, even if the other part is NaN (XLA's abs gives NaN).
        return jnp.where(jnp.isinf(x.real) | jnp.isinf(x.imag), jnp.inf, jnp.abs(x)).astype(acc)
    return x.astype(acc)


def _summaries(x: jax.Array, bins: int, lead: int, per_iteration: bool, dtype: str) -> Any:
    """`Summary` of `x` (lead == 0) or of each ``x[i]`` (lead == 1, stacked)."""
    v = _values(x)
    v = v[None] if lead == 0 else v
    if not per_iteration:
        v = v[:, None]
    keep = kept_rows(v.shape[1], bins) if per_iteration else None
    pooled, rows = _ops.stats(v, bins, keep)
    if lead == 0:
        pooled = {k: a[0] for k, a in pooled.items()}
        rows = None if rows is None else {k: a[0] for k, a in rows.items()}
    it = None
    if rows is not None:
        it = IterationStats(**rows, index=tuple(int(i) for i in keep), iterations=v.shape[1])
    _, is_complex = _value_dtype(x.dtype)
    return Summary(
        **pooled,
        per_iteration=it,
        shape=tuple(x.shape[lead:]),
        dtype=dtype,
        is_complex=is_complex,
        bins=bins,
    )


_jitted = jax.jit(_summaries, static_argnames=("bins", "lead", "per_iteration", "dtype"))


def _host_input(x: Any) -> tuple[Any, str]:
    """`x` as something JAX takes without loss, and the dtype name to report."""
    if isinstance(x, (jax.Array, jax.core.Tracer)):
        return x, str(x.dtype)
    a = np.asarray(x)
    name = str(a.dtype)
    if (
        a.dtype.kind in "OUSMmV"
        and a.dtype.name not in ("bfloat16",)
        and not (jnp.issubdtype(a.dtype, jnp.floating))
    ):
        raise TypeError(
            f"summarize: `x` must be a numeric array, got dtype {name} "
            f"({type(x).__name__}); pass a NumPy or JAX array of numbers"
        )
    if jax.config.jax_enable_x64 or a.dtype.itemsize < 8 or a.dtype == np.complex64:
        return a, name
    if a.dtype.kind in "iu":
        return a.astype(np.float32), name
    narrow = np.complex64 if a.dtype.kind == "c" else np.float32
    with np.errstate(over="ignore", under="ignore"):
        b = a.astype(narrow)
    mag_a, mag_b = np.abs(a), np.abs(b.astype(a.dtype))
    fin = np.isfinite(mag_a)
    tiny = float(np.finfo(np.float32).tiny)
    bad = fin & (~np.isfinite(mag_b) | ((mag_a != 0) & (np.abs(b) < tiny)))
    if a.dtype.kind == "c":
        parts = np.concatenate([np.abs(a.real).ravel(), np.abs(a.imag).ravel()])
        bad = bad | np.any((parts != 0) & np.isfinite(parts) & (parts < tiny))
    if np.any(bad):
        raise ValueError(
            f"summarize: this {name} array has values outside float32's normal range "
            f"(e.g. {a[bad].ravel()[0]!r}), and `jax_enable_x64` is off, so JAX would turn "
            "them into inf or 0. Enable 64-bit JAX first: "
            "jax.config.update('jax_enable_x64', True) (or JAX_ENABLE_X64=1)"
        )
    return b, name


def summarize(x: Any, *, bins: int = 64, per_iteration: bool = False) -> Summary:
    """On-device `Summary` of one array (see the module docstring for the rules).

    Jittable with `bins` static, vmappable (gives a stacked `Summary`), and keeps
    a sharded `x` distributed: only reductions of constant size are combined.
    With `per_iteration`, axis 0 of `x` is an iteration axis and each of its rows
    also gets statistics of its own (`Summary.per_iteration`).

    Example:
        >>> s = summarize(jnp.array([-1.0, 0.0, 3.0, jnp.inf]), bins=8)
        >>> s.count, s.zeros, s.posinf
        (Array(3, dtype=int32), Array(1, dtype=int32), Array(1, dtype=int32))
    """
    bins = _check_bins(bins)
    x, dtype = _host_input(x)
    if per_iteration and np.ndim(x) < 1:
        raise ValueError(
            f"summarize(per_iteration=True) needs an iteration axis (axis 0), got shape "
            f"{np.shape(x)}; pass per_iteration=False"
        )
    return _jitted(x, bins=bins, lead=0, per_iteration=bool(per_iteration), dtype=dtype)


def summarize_stack(xs: Any, *, bins: int = 64, per_iteration: bool = False) -> Summary:
    """`jax.vmap(summarize)(xs)`: a stacked `Summary` of each ``xs[i]``.

    The same results as one computation over the stack (its reductions keep the
    leading axis), so a program with many like-shaped arrays compiles one.

    Example:
        >>> s = summarize_stack(jnp.array([[1.0, 2.0], [0.0, jnp.nan]]), bins=4)
        >>> s.count.tolist(), s.nan.tolist(), s.shape
        ([2, 1], [0, 1], (2,))
    """
    bins = _check_bins(bins)
    xs, dtype = _host_input(xs)
    if np.ndim(xs) < 1 + bool(per_iteration):
        raise ValueError(f"summarize_stack needs a leading stack axis, got shape {np.shape(xs)}")
    return _jitted(xs, bins=bins, lead=1, per_iteration=bool(per_iteration), dtype=dtype)


def summarize_tree(tree: Any, options: SummaryOptions | None = None) -> Any:
    """Summarise every array leaf of `tree`; returns the same structure of `Summary`.

    Leaves must be arrays or Python/NumPy scalars; anything else raises, so that
    nothing is dropped silently.

    Example:
        >>> out = summarize_tree({"a": jnp.ones(3), "b": [jnp.zeros(2)]}, SummaryOptions(bins=8))
        >>> int(out["b"][0].zeros)
        2
    """
    options = options if options is not None else SummaryOptions()

    def one(path: Sequence[Any], leaf: Any) -> Summary:
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")) and not isinstance(
            leaf, (bool, int, float, complex)
        ):
            raise TypeError(
                f"summarize_tree: leaf at {jax.tree_util.keystr(tuple(path))} is a "
                f"{type(leaf).__name__}, not an array; only arrays and numeric scalars "
                "can be summarised (remove it from the tree or mark it static)"
            )
        return summarize(leaf, bins=options.bins)

    return jax.tree_util.tree_map_with_path(one, tree)
