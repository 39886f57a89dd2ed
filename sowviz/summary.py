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

_DATA_FIELDS = (
    *STAT_KEYS,
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
    pos = jnp.floor((_div_pow2(v, scale) - lo_s) * ratio)
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


def _div_pow2(v: jax.Array, scale: jax.Array) -> jax.Array:
    """`v / scale` for a power of two `scale`, bit for bit, by multiplications.

    Both are the correctly rounded value of the same real number as long as the
    inverse is exact and normal: for the two largest powers of two, whose
    inverse would not be, the value is halved first (exactly, or into a range
    where both roundings give 0). A division costs several multiplications.
    """
    limit = np.asarray(2.0 ** (jnp.finfo(scale.dtype).maxexp - 2), scale.dtype)
    huge = scale > limit
    one = jnp.ones((), scale.dtype)
    pre = jnp.where(huge, one / 2, one)
    inv = jnp.where(huge, 2 / scale, 1 / scale)
    return v * pre * inv


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


def _values(x: jax.Array) -> tuple[jax.Array, bool]:
    """The values summarised (in the accumulation dtype) and whether `x` is complex."""
    acc, is_complex = _value_dtype(x.dtype)
    if is_complex:
        # C99/NumPy: a complex number with an infinite part has infinite
        # magnitude, even if the other part is NaN (XLA's abs gives NaN).
        return jnp.where(jnp.isinf(x.real) | jnp.isinf(x.imag), jnp.inf, jnp.abs(x)).astype(
            acc
        ), True
    return x.astype(acc), False


def _plain_check(v: jax.Array, batched: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Whether `v` is "plain" (all finite, no subnormal), its smallest non-zero |v|
    and its sum.

    All come from reductions whose input is arithmetic only (no select, no
    compare), which XLA:CPU computes while reading `v` once, writing nothing: the
    sum is finite iff every element is (it is inf or NaN otherwise, or if it
    overflows: then the general path runs, which is merely slower), and zeros
    are lifted to the largest finite value by `1 - sign|v|` before the min.
    With `batched`, the smallest |v| and the sum are per member of the stack
    (leading axis) and the answer is for the whole stack.
    """
    big = np.asarray(jnp.finfo(v.dtype).max, v.dtype)
    tiny = np.asarray(jnp.finfo(v.dtype).tiny, v.dtype)
    a = jnp.abs(v)
    axes = tuple(range(1, v.ndim)) if batched else None
    smallest = jnp.min(a + (1 - jnp.sign(a)) * big, axis=axes)
    total = jnp.sum(v, axis=axes)
    plain = jnp.all(jnp.isfinite(total)) & jnp.all(smallest >= tiny)
    return plain, smallest, total


# How the statistics are computed on XLA:CPU (measured; the results follow the
# rules of the module docstring whichever path computes them):
#
# * A full-size reduction whose input is elementwise arithmetic of `v` (add,
#   multiply, divide, min, max, abs, sign...) reads `v` once and writes
#   nothing. A select or compare in that input (`where`, `isfinite`), or a
#   subexpression or broadcast constant shared with another consumer, makes
#   XLA write the whole input to memory first.
# * Every full-size array written costs several reads, and beyond 32 MB of
#   temporaries each run maps fresh pages (one page fault per 4 KB).
# * So the common case, a "plain" array (every value finite, no subnormal),
#   takes a path whose only selects are in the one elementwise pass computing
#   both bin indices; the two histograms are one scatter of the (bin, log bin)
#   pairs. Other arrays take the general path (masks everywhere), chosen by a
#   `lax.cond` on two cheap reductions.


def _count(
    idx: jax.Array, lidx: jax.Array, n_lin: int, n_log: int, batch: int | None, like: jax.Array
):
    """Counts of `idx` in [0, n_lin) and of `lidx` in [0, n_log), in one scatter.

    With a `batch` size, the leading axis of `idx` and `lidx` is a stack of that
    many members, counted separately (results have a leading axis too).

    Large arrays scatter the pair (idx, lidx) into a joint 2-d histogram (one
    index per element), small ones both indices into adjacent ranges (two per
    element, but far fewer slots to clear and sum).
    """
    members = 1 if batch is None else batch
    per_member = idx.size // members if idx.size else 0
    joint = per_member >= 2 * n_lin * n_log
    width = n_lin * n_log if joint else n_lin + n_log
    if batch is not None:  # member b counts into slots [b * width, (b + 1) * width)
        offsets = jnp.arange(batch, dtype=jnp.int32) * width
        offsets = offsets.reshape((batch,) + (1,) * (idx.ndim - 1))
    else:
        offsets = 0
    if joint:
        slots = [idx * n_log + lidx + offsets]
    else:
        slots = [idx + offsets, lidx + (offsets + n_lin)]
    counts = _tally_slots(slots, members * width, like).reshape((members, width))
    if joint:
        counts = counts.reshape(members, n_lin, n_log)
        lin, log = jnp.sum(counts, axis=2), jnp.sum(counts, axis=1)
    else:
        lin, log = counts[:, :n_lin], counts[:, n_lin:]
    return (lin[0], log[0]) if batch is None else (lin, log)


def _tally_slots(slots: list[jax.Array], length: int, like: jax.Array) -> jax.Array:
    """int32 counts of the values of the (like-shaped) `slots` in [0, length).

    Each slot s is scattered as the odd number k = 2s + 1 into slot k of twice
    as many, and the scatter adds k itself there (not a 1): slot k ends with
    k * count mod 2**32 (int32 arithmetic wraps), and an odd k is invertible
    mod 2**32, so the count comes back exactly (it is < 2**31). That spares XLA
    writing a full-size array of ones next to the indices: one array is both.
    """
    if _replicated(like):  # explicit mesh: jnp's scatter knows where the result goes
        return _tally(slots[0] if len(slots) == 1 else jnp.stack(slots), length, like)
    dims = jax.lax.ScatterDimensionNumbers(
        update_window_dims=(), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,)
    )
    summed = jnp.zeros(2 * length, jnp.int32)
    # One scatter per part: stacking them would make XLA copy the indices into
    # another layout (and flattening the stack would gather a sharded array).
    for part in slots:
        k = part * 2 + 1
        summed = jax.lax.scatter_add(
            summed, k[..., None], k, dims, mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS
        )
    odd = jax.lax.bitcast_convert_type(summed[1::2], jnp.uint32)
    return jax.lax.bitcast_convert_type(odd * _odd_inverses(length), jnp.int32)


@functools.lru_cache(maxsize=64)
def _odd_inverses(n: int) -> np.ndarray:
    """Inverses mod 2**32 of 1, 3, 5, ..., 2n - 1 (Newton: each step doubles the bits)."""
    k = np.arange(n, dtype=np.uint64) * 2 + 1
    inv = k.copy()  # k * k = 1 mod 8: 3 bits
    mask = np.uint64(2**32 - 1)
    for _ in range(4):  # 6, 12, 24, 48 bits
        inv = (inv * ((np.uint64(2) - k * inv) & mask)) & mask
    return inv.astype(np.uint32)


def _log_range(absmin: jax.Array, absmax: jax.Array, have_log: jax.Array):
    zero = jnp.zeros((), absmin.dtype)
    one = jnp.ones((), absmin.dtype)
    log_lo = jnp.where(have_log, jnp.log10(jnp.where(have_log, absmin, one)), zero)
    log_hi = jnp.where(have_log, jnp.log10(jnp.where(have_log, absmax, one)), zero)
    return log_lo, log_hi


# Each path is in phases: per-member functions (vmapped for a stack) compute
# ranges and bin indices, `_count` counts every member in one scatter, and the
# general path then needs the counts for its moments.


def _plain_phase(v: jax.Array, absmin: jax.Array, total: jax.Array, bins: int):
    """Everything but the counts of a plain `v` (see `_plain_check`; `absmin` is its
    smallest |v| > 0, or the largest finite value if all are zeros; `total` its
    finite sum), by the rules of the general path."""
    dtype = v.dtype
    info = jnp.finfo(dtype)
    n = v.size
    vmin, vmax = jnp.min(v), jnp.max(v)
    absmax = jnp.maximum(-vmin, vmax)
    have_log = absmax > 0  # some non-zero value (no subnormals here)
    # Moments in units of a power of two near absmax, as in the general path;
    # the scale is capped so that its inverse is a normal number too (scaled
    # values stay below 4). The sum did not overflow, so scaling it afterwards is
    # the same as summing scaled values (a power of two commutes with rounding).
    scale = jnp.minimum(_pow2_scale(absmax), np.asarray(2.0 ** (info.maxexp - 2), dtype))
    inv = 1 / scale
    mean_s = total * inv / n
    c = v * inv - mean_s
    ss = jnp.sum(c * c)
    # sum(vs**2) = sum((vs - mean)**2) + n * mean**2, both terms non-negative.
    stats = dict(
        min=vmin,
        max=vmax,
        mean=jnp.clip(mean_s * scale, vmin, vmax),
        std=jnp.sqrt(ss / n) * scale,
        l2=jnp.sqrt(ss + n * (mean_s * mean_s)) * scale,
        absmax=absmax,
    )
    # Both bin indices in one elementwise pass; zeros get the extra log slot.
    stats["hist_edges"], idx = _bin_index(v, vmin, vmax, bins)
    log_lo, log_hi = _log_range(absmin, absmax, have_log)
    nonzero = v != 0
    logs = jnp.log10(jnp.where(nonzero, jnp.abs(v), jnp.ones((), dtype)))
    stats["loghist_edges"], lidx = _bin_index(logs, log_lo, log_hi, bins)
    return stats, idx, jnp.where(nonzero, lidx, bins)


def _plain_counts(stats: dict, lin: jax.Array, log: jax.Array, n: int, bins: int) -> dict:
    zero = jnp.zeros(lin.shape[:-1], jnp.int32)
    return dict(
        stats,
        count=jnp.full(lin.shape[:-1], n, jnp.int32),
        nan=zero,
        posinf=zero,
        neginf=zero,
        zeros=log[..., bins],
        hist_counts=lin,
        loghist_counts=log[..., :bins],
    )


def _general_phase(v: jax.Array, bins: int):
    """Ranges and bin indices of any `v` (NaN and infinities are masked out)."""
    acc = v.dtype
    zero = jnp.zeros((), acc)
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
    stats = dict(min=vmin, max=vmax, absmax=absmax)

    # Histogram of values; non-finite values go to three extra slots, so the
    # counting also gives nan / +inf / -inf (and count = the finite bins' sum).
    stats["hist_edges"], idx = _bin_index(v, vmin, vmax, bins)
    idx = jnp.where(
        finite, idx, jnp.where(jnp.isnan(v), bins, jnp.where(v > 0, bins + 1, bins + 2))
    )
    # Histogram of log10|v| over non-zero finite values, with two extra slots
    # (zeros, non-finite). log10 is monotone, so the range comes from |v|'s.
    log_lo, log_hi = _log_range(absmin, absmax, have_log)
    logs = jnp.log10(jnp.where(nonzero, jnp.abs(v), 1))
    stats["loghist_edges"], lidx = _bin_index(logs, log_lo, log_hi, bins)
    lidx = jnp.where(nonzero, lidx, jnp.where(finite, bins, bins + 1))
    return stats, idx, lidx


def _general_moments(v: jax.Array, stats: dict, count: jax.Array) -> dict:
    """Moments in units of a power of two near absmax: no square or sum can
    overflow (values near 3e38), and the scaling itself is exact. Two passes:
    the mean first, then squares of deviations from it (no cancellation)."""
    acc = v.dtype
    zero = jnp.zeros((), acc)
    v = jnp.where(jnp.abs(v) < jnp.finfo(acc).tiny, zero, v)
    finite = jnp.isfinite(v)
    scale = _pow2_scale(stats["absmax"])
    n = jnp.maximum(count, 1).astype(acc)
    vs = jnp.where(finite, v / scale, zero)
    mean_s = jnp.sum(vs) / n
    c = jnp.where(finite, vs - mean_s, zero)
    return dict(
        mean=jnp.clip(mean_s * scale, stats["min"], stats["max"]),
        std=jnp.sqrt(jnp.sum(c * c) / n) * scale,
        l2=jnp.sqrt(jnp.sum(vs * vs)) * scale,
    )


def _stats(v: jax.Array, bins: int, batch: int | None = None) -> dict[str, jax.Array]:
    """All statistics of `v` (of each of the `batch` members of the stack `v`)."""
    each = (lambda f: f) if batch is None else jax.vmap
    size = v.size // batch if batch else v.size

    def plain(v: jax.Array, absmin: jax.Array, total: jax.Array) -> dict:
        stats, idx, lidx = each(functools.partial(_plain_phase, bins=bins))(v, absmin, total)
        lin, log = _count(idx, lidx, bins, bins + 1, batch, v)
        return _plain_counts(stats, lin, log, size, bins)

    def general(v: jax.Array, *_: jax.Array) -> dict:
        stats, idx, lidx = each(functools.partial(_general_phase, bins=bins))(v)
        lin, log = _count(idx, lidx, bins + 3, bins + 2, batch, v)
        hist_counts = lin[..., :bins]
        count = jnp.sum(hist_counts, axis=-1)
        stats |= each(_general_moments)(v, stats, count)
        return dict(
            stats,
            count=count,
            nan=lin[..., bins],
            posinf=lin[..., bins + 1],
            neginf=lin[..., bins + 2],
            zeros=log[..., bins],
            hist_counts=hist_counts,
            loghist_counts=log[..., :bins],
        )

    if v.size == 0:
        return general(v)
    ok, absmin, total = _plain_check(v, batched=batch is not None)
    return jax.lax.cond(ok, plain, general, v, absmin, total)


def _as_summary(stats: dict[str, jax.Array], x: Any, shape: tuple[int, ...], bins: int) -> Summary:
    _, is_complex = _value_dtype(x.dtype)
    return Summary(
        **stats, shape=tuple(shape), dtype=str(x.dtype), is_complex=is_complex, bins=bins
    )


@functools.partial(jax.jit, static_argnames=("bins",))
def _summarize(x: jax.Array, bins: int) -> Summary:
    v, _ = _values(x)
    return _as_summary(_stats(v, bins), x, x.shape, bins)


@functools.partial(jax.jit, static_argnames=("bins",))
def _summarize_stack(xs: jax.Array, bins: int) -> Summary:
    v, _ = _values(xs)
    return _as_summary(_stats(v, bins, batch=xs.shape[0]), xs, xs.shape[1:], bins)


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


def summarize_stack(xs: Any, *, bins: int = 64) -> Summary:
    """`jax.vmap(summarize)(xs)`: a stacked `Summary` of each ``xs[i]``, faster.

    The same results, but the choice between the fast path (every value finite,
    no subnormal) and the general one is made once for the whole stack, where
    under `vmap` each member's `lax.cond` would become a select running both.

    Example:
        >>> s = summarize_stack(jnp.array([[1.0, 2.0], [0.0, jnp.nan]]), bins=4)
        >>> s.count.tolist(), s.nan.tolist(), s.shape
        ([2, 1], [0, 1], (2,))
    """
    bins = _check_bins(bins)
    if not isinstance(xs, jax.Array):
        xs = jnp.asarray(xs)
    if xs.ndim < 1:
        raise ValueError(f"summarize_stack needs a leading stack axis, got shape {xs.shape}")
    return _summarize_stack(xs, bins=bins)


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
