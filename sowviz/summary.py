"""On-device statistics of one array: counts, moments and two histograms.

`summarize` runs inside the compiled program (it is jittable, vmappable and keeps
sharded inputs distributed), so only a `Summary` of constant size crosses to the
host, whatever the size of the array it describes. On a CPU, large arrays are
summarised in fixed-size blocks (`sowviz.summary_blocks`), so the temporaries of
a summary stay bounded whatever the array's size.
Every pass over the values runs there. `inspect`, `Monitor` and
`save_intermediates` leave what follows from a few sums per array (mean, std, l2,
the histogram's edges, the log window) to the host after the one transfer
(`sowviz.capture.tallied`): the same arithmetic (`summary_ops.moment_fields`),
with NumPy instead of XLA kernels, which the first call of their programs would
compile.

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
* Values subnormal in the dtype they are summarised in count as zeros: below
  ``finfo(float32).tiny`` (1.2e-38) for float32 and bfloat16 (which has float32's
  exponent range) and complex64 magnitudes, below 2.2e-308 in float64. Backends
  flush them inconsistently (XLA:CPU's sums drop 1e-40, its elementwise operations
  may keep it); doing it explicitly keeps every statistic consistent with the
  others. float16 subnormals (6e-8 <= |v| < 6.1e-5, where float16 gradients
  underflow without loss scaling) are normal in float32: they count as the
  non-zero values they are (in ``min``, ``max``, the moments and both histograms,
  ``loghist`` at their own magnitudes), and a float16 array's ``zeros`` are its
  exact zeros.
  Results below the smallest normal number (a mean of 1e-39, an edge between
  two tiny values) may be flushed to 0 by the backend: compare with an absolute
  tolerance of ``finfo.tiny``.
* ``nan``/``posinf``/``neginf``/``zeros`` are counted over all elements; ``min``,
  ``max``, ``mean``, ``std`` (population, ddof=0), ``l2`` and ``absmax`` are over
  the ``count`` finite elements only (``mean`` is clipped into ``[min, max]``).
  Only ``l2`` can exceed the dtype's range (``sqrt(n) * absmax``): it is then
  ``inf`` on the device (as ``jnp.linalg.norm``), and in `Summary.to_json` the
  float64 ``sqrt(count * (mean**2 + std**2))`` (`summary_data.norm_json`; the
  largest finite float64 only past float64's range, as JSON has no infinity).
  Accuracy: rtol 1e-5 for mean and l2, 1e-4 for std and for such an l2, against
  float64.
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
  values below them are counted in ``loghist_under``. Signed: ``loghist_neg``
  counts, per bin, the values in it that are negative (``loghist_under_neg``
  likewise for ``loghist_under``); the positives are the difference. Zeros
  (``-0.0`` and subnormals included) are never negative. In JSON, ``loghist``
  holds the bins from the first to the last non-empty one, with ``edges`` in
  ``log10`` units (``[]`` when no non-zero finite value), ``counts`` and
  ``neg`` of equal length, plus ``under`` and ``under_neg``.
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
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import summary_blocks as _blocks
from . import summary_ops as _ops
from .summary_data import STAT_KEYS as STAT_KEYS  # re-exported: the model's stat keys
from .summary_data import IterationStats, Summary
from .summary_data import log10_edge as log10_edge

__all__ = ["Summary", "SummaryOptions", "summarize", "summarize_tree", "to_host"]
# The results' public home is this module (their reprs, docs and doctests say so).
Summary.__module__ = IterationStats.__module__ = __name__

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


def row_cap(bins: int) -> int:
    """The most iterations that all get statistics of their own (`kept_rows`)."""
    return max(1, min(MAX_ROWS, MAX_ROW_COUNTS // bins))


def kept_rows(rows: int, bins: int) -> np.ndarray:
    """The iterations that get per-iteration statistics (see the module docstring)."""
    cap = row_cap(bins)
    if rows <= cap:
        return np.arange(rows)
    return np.unique(np.round(np.linspace(0, rows - 1, cap)).astype(np.int64))


def to_host(tree: Any) -> Any:
    """Fetch a whole pytree of `Summary` objects in ONE `jax.device_get`.

    Returns the same structure with NumPy leaves.

    Example:
        >>> host = to_host({"w": summarize(jnp.ones(3))})
        >>> type(host["w"].count).__name__
        'ndarray'
    """
    return jax.device_get(tree)


def all_clean(sums: list) -> jax.Array:
    """On the device: no summary in `sums` counts a NaN or ±Inf. One reduction for all
    of them (three `any` per summary were a kernel each on XLA:CPU)."""
    if not sums:
        return jnp.ones((), bool)
    counts = [jnp.ravel(s.nan | s.posinf | s.neginf) for s in sums]  # > 0 iff any is
    return jnp.max(jnp.concatenate(counts), initial=0) == 0


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


def _summaries(
    x: jax.Array, bins: int, lead: int, per_iteration: bool, dtype: str, block: int = 0
) -> Any:
    """`Summary` of `x` (lead == 0) or of each ``x[i]`` (lead == 1, stacked); a `block`
    (lead == 0 only) computes it in blocks of that many elements (`summary_blocks`)."""
    v = _values(x)
    if block:
        pooled = _ops.pooled_fields(_blocks.blocked_stats(jnp.ravel(v), bins, block), bins)
        return Summary(
            **{k: a[0] for k, a in pooled.items()},
            per_iteration=None,
            shape=tuple(x.shape),
            dtype=dtype,
            is_complex=_value_dtype(x.dtype)[1],
            bins=bins,
        )
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


_jitted = jax.jit(_summaries, static_argnames=("bins", "lead", "per_iteration", "dtype", "block"))


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
    per_iteration = bool(per_iteration)
    block = _blocks.block_for(x, per_iteration)
    return _jitted(x, bins=bins, lead=0, per_iteration=per_iteration, dtype=dtype, block=block)


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
