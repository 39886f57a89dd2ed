"""On-device statistics of one array: counts, moments and two histograms.

`summarize` runs inside the compiled program (it is jittable, vmappable and keeps
sharded inputs distributed), so only a `Summary` of constant size crosses to the
host, whatever the size of the array it describes.

Conventions (reproduced by the tests in NumPy):

* Integer and bool arrays are summarised by value (as float32); bf16/f16 are
  accumulated in float32; float64 (with ``jax_enable_x64``) stays float64;
  complex arrays are summarised by magnitude ``|x|`` (C99: a complex with an
  infinite part has infinite magnitude, even if the other part is NaN).
* Subnormal values count as zeros (backends flush them inconsistently; doing it
  explicitly keeps every statistic consistent with the others).
* ``nan``/``posinf``/``neginf``/``zeros`` are counted over all elements; ``min``,
  ``max``, ``mean``, ``std`` (population, ddof=0), ``l2`` and ``absmax`` are over
  the ``count`` finite elements only. Moments are computed in units of a power of
  two near ``absmax`` (no overflow near the float32 limit) with a two-pass
  variance. Only ``l2`` can exceed the dtype's range (``sqrt(n) * absmax``): it is
  then ``inf`` on the device and the largest finite value in `Summary.to_json`.
* ``hist`` has ``bins + 1`` edges linearly spaced over ``[lo, hi] = [min, max]``
  of the finite values (``edges[0] == lo``, ``edges[-1] == hi``). With ``s`` the
  largest power of two <= ``max(|lo|, |hi|)``, a value's bin is
  ``clip(floor((v/s - lo/s) * (bins / (hi/s - lo/s))), 0, bins - 1)`` in the
  value dtype: the max lands in the last bin, and the counts equal
  ``np.histogram(v, bins=edges)`` except possibly for a value within an ulp of
  an interior edge. ``loghist`` is the same over ``log10|v|`` of the non-zero
  finite values.
* Ranges that cannot be cut into ``bins`` distinct bins are widened so the edges
  strictly increase: ``lo == hi`` (also "no values", where ``lo = hi = 0``)
  becomes ``[lo - p, hi + p]`` with ``p = max(0.5, |lo| / 1024)`` (all values
  then land in one middle bin); a range narrower than ``bins * 8 * eps`` in units
  of ``s`` is widened symmetrically around its midpoint to that width.
* Counts are int32 (arrays of 2**31 or more elements would overflow them).
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

__all__ = ["Summary", "SummaryOptions", "summarize", "summarize_tree", "to_host"]


def _check_bins(bins: Any) -> int:
    # bool is an int subclass; `bins=True` is a mistake, not "one bin".
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1:
        raise ValueError(
            f"bins must be an int >= 1 (the number of histogram bins), got {bins!r}; "
            "pass e.g. bins=64"
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


_DATA_FIELDS = (
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
    "hist_edges",
    "hist_counts",
    "loghist_edges",
    "loghist_counts",
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
    zeros: Any  # int32
    min: Any  # float: over finite elements (0 when count == 0)
    max: Any
    mean: Any
    std: Any  # population standard deviation
    l2: Any  # Euclidean norm
    absmax: Any
    hist_edges: Any  # (bins + 1,)
    hist_counts: Any  # (bins,) int32
    loghist_edges: Any  # (bins + 1,) of log10|x|
    loghist_counts: Any  # (bins,) int32
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

        return {
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
            "loghist": {
                "edges": [_finite_float(e) for e in np.asarray(host.loghist_edges)],
                "counts": [int(c) for c in np.asarray(host.loghist_counts)],
            },
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


def _widen(lo: jax.Array, hi: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Make [lo, hi] non-degenerate (see module docstring) while staying finite."""
    big = jnp.finfo(lo.dtype).max
    pad = jnp.maximum(jnp.asarray(0.5, lo.dtype), jnp.abs(lo) / 1024)
    same = lo == hi
    return (
        jnp.where(same, jnp.maximum(lo - pad, -big), lo),
        jnp.where(same, jnp.minimum(hi + pad, big), hi),
    )


def _bin_index(
    v: jax.Array, lo: jax.Array, hi: jax.Array, bins: int
) -> tuple[jax.Array, jax.Array]:
    """Edges of `bins` equal bins over [lo, hi] and the bin index of every `v`.

    `lo <= hi` must be finite. Indices of values outside [lo, hi] (or not finite)
    are clipped into [0, bins); the caller overrides or ignores them.
    """
    # Defensive: a non-finite range would make every edge NaN or infinite.
    lo = jnp.where(jnp.isfinite(lo), lo, 0)
    hi = jnp.where(jnp.isfinite(hi), hi, lo)
    lo, hi = _widen(lo, hi)
    # Work in units of a power of two near max(|lo|, |hi|): scaling by it is
    # exact, and hi - lo can no longer overflow (e.g. lo = -3e38, hi = 3e38).
    scale = _pow2_scale(jnp.maximum(jnp.abs(lo), jnp.abs(hi)))
    lo_s, hi_s = lo / scale, hi / scale
    # A range only a few ulps wide cannot be cut into `bins` distinct bins; give
    # every bin at least 8 ulps (of the scaled values, which lie in [-2, 2)).
    min_width = bins * 8 * jnp.finfo(lo.dtype).eps
    tiny = hi_s - lo_s < min_width
    mid = lo_s / 2 + hi_s / 2
    big = jnp.finfo(lo.dtype).max
    lo = jnp.where(tiny, jnp.clip((mid - min_width / 2) * scale, -big, lo), lo)
    hi = jnp.where(tiny, jnp.clip((mid + min_width / 2) * scale, hi, big), hi)
    lo_s, hi_s = lo / scale, hi / scale
    width = hi_s - lo_s
    t = jnp.arange(bins + 1, dtype=lo.dtype) / bins
    edges = (lo_s + width * t) * scale
    # Pin the ends exactly and keep rounding from stepping outside [lo, hi].
    edges = jnp.clip(edges.at[0].set(lo).at[-1].set(hi), lo, hi)
    # The bin is this arithmetic estimate alone (the rule in the module
    # docstring): correcting values within an ulp of an edge by looking the
    # edges up would cost two gathers per element, more than the rest.
    ratio = bins / width
    pos = jnp.floor((v / scale - lo_s) * ratio)
    idx = jnp.clip(jnp.where(jnp.isnan(pos), 0, pos), 0, bins - 1).astype(jnp.int32)
    return edges, idx


def _tally(idx: jax.Array, length: int, like: jax.Array) -> jax.Array:
    """int32 counts of each value of `idx` in [0, length).

    A scatter-add of ones: memory O(size + length), never O(size * length), and
    a sharded `idx` is counted where it lives (partial counts are summed across
    devices). No ravel: flattening a sharded dimension is not allowed on explicit
    meshes, and an N-d index array scatters just as well.
    """
    return jnp.zeros(length, jnp.int32).at[idx].add(1, **_replicated(like))


def _replicated(v: jax.Array) -> dict[str, Any]:
    """`out_sharding=` for a small replicated result when `v` lives on an explicit mesh.

    With explicit mesh axes JAX asks where a scatter's result goes; the answer is
    "replicated": each device counts its shard and the partial counts are summed.
    """
    mesh = jax.typeof(v).sharding.mesh
    if mesh.empty or jax.sharding.AxisType.Explicit not in mesh.axis_types:
        return {}
    return {"out_sharding": jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())}


def _pow2_scale(m: jax.Array) -> jax.Array:
    """Largest power of two <= m (1 for m == 0): dividing by it is exact, and
    m / scale lies in [1, 2), so squares and sums of the scaled values are small.
    """
    _, e = jnp.frexp(m)  # m = f * 2**e with f in [0.5, 1)
    return jnp.where(m > 0, jnp.ldexp(jnp.ones_like(m), e - 1), jnp.ones_like(m))


def _value_dtype(dtype: np.dtype) -> tuple[Any, bool]:
    """The float dtype statistics are computed in, and whether input is complex."""
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return (jnp.float64 if dtype == jnp.complex128 else jnp.float32), True
    if dtype == jnp.float64:
        return jnp.float64, False
    # bf16/f16 would lose everything to rounding in long sums; ints and bool are
    # summarised by value.
    return jnp.float32, False


@functools.partial(jax.jit, static_argnames=("bins",))
def _summarize(x: jax.Array, bins: int) -> Summary:
    acc, is_complex = _value_dtype(x.dtype)
    zero = jnp.zeros((), acc)
    if is_complex:
        # C99/NumPy: a complex number with an infinite part has infinite
        # magnitude, even if the other part is NaN (XLA's abs gives NaN).
        v = jnp.where(jnp.isinf(x.real) | jnp.isinf(x.imag), jnp.inf, jnp.abs(x)).astype(acc)
    else:
        v = x.astype(acc)
    # Pass 1: ranges. On XLA:CPU every full-size reduction materialises its
    # input, so the passes are kept few; the counts ride on the histograms.
    # Subnormals are zeros: XLA flushes them in some ops and on some backends
    # but not others (a min can return 0 for one), so flushing them here keeps
    # counts, ranges and log10 consistent, finite and backend-independent.
    v = jnp.where(jnp.abs(v) < jnp.finfo(acc).tiny, zero, v)
    finite = jnp.isfinite(v)
    nonzero = finite & (v != 0)
    vmin = jnp.min(jnp.where(finite, v, jnp.inf), initial=jnp.inf)
    vmax = jnp.max(jnp.where(finite, v, -jnp.inf), initial=-jnp.inf)
    absmin = jnp.min(jnp.where(nonzero, jnp.abs(v), jnp.inf), initial=jnp.inf)
    have = vmin <= vmax  # some finite value
    have_log = absmin < jnp.inf  # some non-zero finite value
    vmin = jnp.where(have, vmin, zero)
    vmax = jnp.where(have, vmax, zero)
    absmax = jnp.maximum(jnp.abs(vmin), jnp.abs(vmax))

    # Histogram of values; non-finite values go to three extra slots, so one
    # scatter also counts nan / +inf / -inf (and count = the finite bins' sum).
    hist_edges, idx = _bin_index(v, vmin, vmax, bins)
    idx = jnp.where(
        finite, idx, jnp.where(jnp.isnan(v), bins, jnp.where(v > 0, bins + 1, bins + 2))
    )
    tallied = _tally(idx, bins + 3, v)
    hist_counts = tallied[:bins]
    nan, posinf, neginf = tallied[bins], tallied[bins + 1], tallied[bins + 2]
    count = jnp.sum(hist_counts)

    # Histogram of log10|v| over non-zero finite values; zeros get their own slot.
    # log10 is monotone, so the range comes from |v|'s range without a pass.
    log_lo = jnp.where(have_log, jnp.log10(jnp.where(have_log, absmin, 1)), zero)
    log_hi = jnp.where(have_log, jnp.log10(jnp.where(have_log, absmax, 1)), zero)
    logs = jnp.log10(jnp.where(nonzero, jnp.abs(v), 1))
    loghist_edges, lidx = _bin_index(logs, log_lo, log_hi, bins)
    lidx = jnp.where(nonzero, lidx, jnp.where(finite, bins, bins + 1))
    ltallied = _tally(lidx, bins + 2, v)
    loghist_counts = ltallied[:bins]
    zeros = ltallied[bins]

    # Moments in units of a power of two near absmax: no square or sum can
    # overflow (values near 3e38), and the scaling itself is exact. Two passes:
    # the mean first, then squares of deviations from it (no cancellation).
    scale = _pow2_scale(absmax)
    n = jnp.maximum(count, 1).astype(acc)
    vs = jnp.where(finite, v / scale, zero)
    mean_s = jnp.sum(vs) / n
    l2 = jnp.sqrt(jnp.sum(vs * vs)) * scale
    c = jnp.where(finite, vs - mean_s, zero)
    std = jnp.sqrt(jnp.sum(c * c) / n) * scale
    mean = jnp.clip(mean_s * scale, vmin, vmax)

    return Summary(
        count=count,
        nan=nan,
        posinf=posinf,
        neginf=neginf,
        zeros=zeros,
        min=vmin,
        max=vmax,
        mean=mean,
        std=std,
        l2=l2,
        absmax=absmax,
        hist_edges=hist_edges,
        hist_counts=hist_counts,
        loghist_edges=loghist_edges,
        loghist_counts=loghist_counts,
        shape=tuple(x.shape),
        dtype=str(x.dtype),
        is_complex=is_complex,
        bins=bins,
    )


def summarize(x: Any, *, bins: int = 64) -> Summary:
    """On-device `Summary` of one array (see the module docstring for the rules).

    Jittable with `bins` static, vmappable (gives a stacked `Summary`), and keeps
    a sharded `x` distributed: only reductions of constant size are combined.

    Example:
        >>> s = summarize(jnp.array([-1.0, 0.0, 3.0, jnp.inf]), bins=8)
        >>> s.count, s.zeros, s.posinf
        (Array(3, dtype=int32), Array(1, dtype=int32), Array(1, dtype=int32))
    """
    bins = _check_bins(bins)
    if not isinstance(x, jax.Array):
        x = jnp.asarray(x)
    return _summarize(x, bins=bins)


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
