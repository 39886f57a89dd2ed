"""The on-device computation behind `sowviz.summary` (its docstring states the rules).

Arrays arrive as ``v`` of shape ``(B, R, *E)`` in the accumulation dtype: ``B``
members of a stack of like-shaped arrays, ``R`` rows (iterations of a stacked
capture, or 1), and ``E`` the elements of one row, never reshaped (flattening a
sharded dimension would gather it). Statistics are reduced over ``E`` per row,
then over rows per member, so per-iteration statistics cost no extra pass.

How the work is arranged (measured on XLA:CPU and on an H100): two groups of
sibling reductions of ``v`` (XLA fuses siblings) and one elementwise pass with
one scatter counting both histograms; no `lax.cond` (on a GPU it syncs the host
for its predicate; on a CPU it serialised the summaries and measured slower
than the masked path it was meant to skip). See `stats`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _compat

#: Log-magnitude bins per octave: the top LOG_SUB_BITS bits of the mantissa.
LOG_SUB_BITS = 2
#: Log bins in the window below the largest magnitude (32 octaves, ~9.6 decades).
LOG_BINS = 128
#: Key of the smallest normal number (biased exponent 1).
MIN_NORMAL_KEY = 1 << LOG_SUB_BITS


def log_key(v: Any, xp: Any = jnp) -> Any:
    """int32 log-bin key of |v|: ``biased exponent * 4 + top two mantissa bits``.

    Here and below, `xp` is `jax.numpy` (in a program) or `numpy` (on the host, for
    the statistics finished there: `moment_fields`); both compute alike, bit for bit
    (IEEE arithmetic in the values' dtype)."""
    info = np.finfo(v.dtype)
    ity = np.int64 if v.dtype == np.float64 else np.int32
    bits = jax.lax.bitcast_convert_type(v, ity) if xp is jnp else np.asarray(v).view(ity)
    mask = np.asarray(np.iinfo(ity).max, ity)  # all but the sign bit
    return ((bits & mask) >> (info.nmant - LOG_SUB_BITS)).astype(np.int32)


def _b(a: jax.Array, ndim: int) -> jax.Array:
    """`a` with trailing unit axes up to `ndim` (to broadcast against v)."""
    return a.reshape(a.shape + (1,) * (ndim - a.ndim))


def _widen(lo: Any, hi: Any, xp: Any) -> tuple[Any, Any]:
    big = np.finfo(lo.dtype).max
    pad = xp.maximum(np.asarray(0.5, lo.dtype), xp.abs(lo) / 1024)
    same = lo == hi
    return (
        xp.where(same, xp.maximum(lo - pad, -big), lo),
        xp.where(same, xp.minimum(hi + pad, big), hi),
    )


def pow2_scale(m: Any, xp: Any = jnp) -> Any:
    """Largest power of two <= m (1 for m == 0)."""
    _, e = xp.frexp(m)
    return xp.where(m > 0, xp.ldexp(xp.ones_like(m), e - 1), xp.ones_like(m))


def _div_pow2(v: Any, scale: Any, xp: Any = jnp) -> Any:
    """`v / scale` for a power of two `scale`, bit for bit, by multiplications."""
    limit = np.asarray(2.0 ** (np.finfo(scale.dtype).maxexp - 2), scale.dtype)
    huge = scale > limit
    one = np.ones((), scale.dtype)
    return v * xp.where(huge, one / 2, one) * xp.where(huge, 2 / scale, 1 / scale)


def _bin_range(lo: Any, hi: Any, bins: int, xp: Any) -> tuple[Any, ...]:
    """Per member of ``[lo, hi]``: the histogram's range (widened when empty or too
    narrow to hold `bins` distinct bins), its scale, and its start and width in
    units of the scale."""
    dt = lo.dtype
    info = np.finfo(dt)
    big = info.max
    lo = xp.where(xp.isfinite(lo), lo, np.zeros((), dt))
    hi = xp.where(xp.isfinite(hi), hi, lo)
    lo, hi = _widen(lo, hi, xp)
    # Units of a power of two near max(|lo|, |hi|), but never below tiny/eps: then
    # the narrowest bin (8 eps in these units) is at least 8 * tiny wide, so edges
    # strictly increase even where a backend flushes subnormal results to zero.
    floor_scale = np.asarray(float(info.tiny) / float(info.eps), dt)
    scale = xp.maximum(pow2_scale(xp.maximum(xp.abs(lo), xp.abs(hi)), xp), floor_scale)
    lo_s, hi_s = lo / scale, hi / scale
    min_width = bins * 8 * info.eps
    narrow = hi_s - lo_s < min_width
    mid = lo_s / 2 + hi_s / 2
    lo = xp.where(narrow, xp.clip((mid - min_width / 2) * scale, -big, lo), lo)
    hi = xp.where(narrow, xp.clip((mid + min_width / 2) * scale, hi, big), hi)
    lo_s, hi_s = lo / scale, hi / scale
    return lo, hi, scale, lo_s, hi_s - lo_s


def bin_params(lo: jax.Array, hi: jax.Array, bins: int):
    """Per member ``(B,)`` of ``[lo, hi]``: what `bin_of` needs (scale, lo in units
    of scale, bins per unit)."""
    _, _, scale, lo_s, width = _bin_range(lo, hi, bins, jnp)
    return scale, lo_s, bins / width


def bin_edges(lo: Any, hi: Any, bins: int, xp: Any = jnp) -> Any:
    """The edges ``(..., bins + 1)`` of `bin_of`'s bins over ``[lo, hi]`` ``(...)``."""
    lo, hi, scale, lo_s, width = _bin_range(lo, hi, bins, xp)
    t = xp.arange(bins + 1, dtype=lo.dtype) / bins
    edges = (lo_s[..., None] + width[..., None] * t) * scale[..., None]
    # The end edges exactly lo and hi (a concatenation, not two scatters: XLA:CPU
    # compiled the summary program 5-10% faster).
    edges = xp.concatenate([lo[..., None], edges[..., 1:-1], hi[..., None]], axis=-1)
    return xp.clip(edges, lo[..., None], hi[..., None])


def bin_of(v: jax.Array, scale: jax.Array, lo_s: jax.Array, ratio: jax.Array, bins: int):
    """The linear bin of every element of ``v`` (clipped into [0, bins)), from
    `bin_params` of its member (leading axes of ``v``)."""
    nd = v.ndim
    pos = jnp.floor((_div_pow2(v, _b(scale, nd)) - _b(lo_s, nd)) * _b(ratio, nd))
    return jnp.clip(jnp.where(jnp.isnan(pos), 0, pos), 0, bins - 1).astype(jnp.int32)


def bin_index(v: jax.Array, lo: jax.Array, hi: jax.Array, bins: int):
    """The linear bin of every element of ``v`` (clipped into [0, bins)) over
    per-member ``[lo, hi]`` (shape ``(B,)``)."""
    return bin_of(v, *bin_params(lo, hi, bins), bins)


def log_window_start(absmax: Any, xp: Any = jnp) -> Any:
    """Key of the first bin of the log window: LOG_BINS bins ending at absmax's bin."""
    return xp.maximum(log_key(absmax, xp) - (LOG_BINS - 1), MIN_NORMAL_KEY)


#: Slots of the log tally per sign: zeros, underflow, the LOG_BINS bins, not finite.
LOG_SLOTS = LOG_BINS + 3


def log_slot(v: jax.Array, start: jax.Array, finite: jax.Array | None) -> jax.Array:
    """Slot per element: 0 zero (or subnormal), 1 below the window, 2.. the window,
    LOG_BINS + 2 not finite (only when `finite` is given); plus LOG_SLOTS for a
    negative value (sign bit set and not a zero), so one tally counts both signs."""
    key = log_key(v)
    s = jnp.clip(key - _b(start, v.ndim) + 2, 1, LOG_BINS + 1)
    s = jnp.where(key < MIN_NORMAL_KEY, 0, s)
    s = s if finite is None else jnp.where(finite, s, LOG_BINS + 2)
    return jnp.where(v < 0, s + LOG_SLOTS, s)


# --------------------------------------------------------------------------
# Counting


def split_explicitly(v: Any) -> bool:
    """Whether `v`'s type is split over Explicit mesh axes (`float32[64@data]`). A value
    on such a mesh whose type names no axis (replicated) computes as an unmeshed one:
    its scatters and layouts need nothing more, and it joins the shared summaries."""
    return _compat.explicit_axes(jax.typeof(v)) is not None


def replicated(v: jax.Array) -> dict[str, Any]:
    """`out_sharding=` for a small replicated result when `v` is split over Explicit mesh
    axes (`split_explicitly`), else nothing: only there must JAX be told where a
    scatter of `v`'s slots goes. (Asked of every value on an explicit mesh, it sent
    replicated ones down this path too, and `capture.summaries` gave them a summary
    of their own.)"""
    if not split_explicitly(v):
        return {}
    mesh = jax.typeof(v).sharding.mesh
    return {"out_sharding": jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())}


def tally_slots(slots: list[jax.Array], length: int, like: jax.Array) -> jax.Array:
    """int32 counts of the values of the (like-shaped) `slots` in [0, length).

    Each slot s is scattered as the odd number k = 2s + 1 into slot k of twice
    as many, adding k itself: slot k ends with k * count mod 2**32, and an odd k
    is invertible mod 2**32, so the count comes back exactly (< 2**31). That
    spares XLA writing a full-size array of ones next to the indices.
    """
    if replicated(like):  # explicit mesh: jnp's scatter knows where the result goes
        counts = jnp.zeros(length, jnp.int32)
        for part in slots:
            counts = counts.at[part].add(1, **replicated(like))
        return counts
    return untally(tally_add(jnp.zeros(2 * length, jnp.int32), slots), length)


def tally_add(summed: jax.Array, slots: list[jax.Array]) -> jax.Array:
    """`tally_slots`' running table ``(2 * length,)`` with `slots` added (tables add up:
    a loop carries one and decodes it once, `untally`)."""
    dims = jax.lax.ScatterDimensionNumbers(
        update_window_dims=(), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,)
    )
    for part in slots:
        k = part * 2 + 1
        summed = jax.lax.scatter_add(
            summed, k[..., None], k, dims, mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS
        )
    return summed


#: Tables of at most this many slots are decoded with their inverses as a constant of
#: the program; larger ones compute them on the device (`untally`).
CONSTANT_INVERSES_MAX = 1 << 14


def untally(summed: jax.Array, length: int) -> jax.Array:
    """The int32 counts of a `tally_add` table.

    A large table's inverses are computed on the device, not stored: as a constant
    they made the program as large as 4 bytes per slot (the joint tallies of 16
    large arrays: 1.1 MB, twice, of a 3.5 MB program read back from disk in every
    new process), where the few multiplications per slot cost about nothing."""
    odd = jax.lax.bitcast_convert_type(summed[1::2], jnp.uint32)
    if length <= CONSTANT_INVERSES_MAX:
        inv = jnp.asarray(odd_inverses(length))
    else:
        k = jax.lax.iota(jnp.uint32, length) * 2 + 1
        inv = k  # right in its lowest 3 bits (k * k = 1 mod 8 for an odd k)
        for _ in range(4):  # Newton: each step doubles the right bits (3 -> 48)
            inv = inv * (2 - k * inv)
    return jax.lax.bitcast_convert_type(odd * inv, jnp.int32)


@functools.lru_cache(maxsize=64)
def odd_inverses(n: int) -> np.ndarray:
    """Inverses mod 2**32 of 1, 3, 5, ..., 2n - 1 (Newton: each step doubles the bits)."""
    k = np.arange(n, dtype=np.uint64) * 2 + 1
    inv = k.copy()
    mask = np.uint64(2**32 - 1)
    for _ in range(4):
        inv = (inv * ((np.uint64(2) - k * inv) & mask)) & mask
    return inv.astype(np.uint32)


def count(idx, lslot, n_lin: int, n_log: int, rows: np.ndarray | None, like):
    """Linear counts ``(B, R', n_lin)`` (per kept row, or ``R' = 1``) and log counts
    ``(B, n_log)`` of the slots of ``v``-shaped `idx` and `lslot`.

    `rows` maps each row to its kept position (or to R', a dump row), or is None
    (count per member only). Large members without rows scatter the (lin, log)
    pair into a joint 2-d histogram: one index per element instead of two.
    """
    B = idx.shape[0]
    nd = idx.ndim
    member = _b(jnp.arange(B, dtype=jnp.int32), nd)
    if rows is None:
        per_member = idx.size // B if idx.size else 0
        if per_member >= 2 * n_lin * n_log:
            width = n_lin * n_log
            c = tally_slots([member * width + idx * n_log + lslot], B * width, like)
            c = c.reshape(B, n_lin, n_log)
            return jnp.sum(c, 2, dtype=jnp.int32)[:, None, :], jnp.sum(c, 1, dtype=jnp.int32)
        width = n_lin + n_log
        c = tally_slots(
            [member * width + idx, member * width + n_lin + lslot], B * width, like
        ).reshape(B, width)
        return c[:, None, :n_lin], c[:, n_lin:]
    kept = int(rows.max()) + 1 if rows.size else 1  # with the dump row, if rows are dropped
    row = _b(jnp.asarray(rows, jnp.int32)[None, :], nd)
    lin = tally_slots([(member * kept + row) * n_lin + idx], B * kept * n_lin, like)
    log = tally_slots([member * n_log + lslot], B * n_log, like)
    return lin.reshape(B, kept, n_lin), log.reshape(B, n_log)


# --------------------------------------------------------------------------
# Statistics


def _reduce(operands, inits, ops, axes):
    """Reductions of like-shaped `operands` over `axes` (XLA fuses siblings that read
    the same input). Not one variadic `lax.reduce`: that measured less accurate
    (one sequential float32 accumulator) and SPMD gathers sharded inputs for it."""
    red = {jnp.minimum: jnp.min, jnp.maximum: jnp.max, jnp.add: jnp.sum}
    return tuple(
        red[op](x, axis=axes, initial=i) if op is not jnp.add else jnp.sum(x, axis=axes)
        for x, i, op in zip(operands, inits, ops, strict=True)
    )


def _over_rows(x: jax.Array, reduce: Any, **kw: Any) -> jax.Array:
    """`reduce` over axis 1 (the rows); a single row is taken as it is (XLA keeps a
    reduction over one element as a kernel of its own: a launch each on a GPU)."""
    return x[:, 0] if x.shape[1] == 1 else reduce(x, 1, **kw)


def squares(c1: Any, c2: Any, ms: Any, n: Any, xp: Any = jnp) -> Any:
    """The sum of the squared values (in units of the scale, ``vs``; ``l2``'s square)
    from the centred sums ``c1 = sum(c)``, ``c2 = sum(c**2)`` of ``c = vs - ms`` over
    ``n`` values: ``sum((c + ms)**2) = c2 + ms * (2 * c1 + n * ms)``. No reduction of
    its own (one of three over every value: 16% of a segmented layout's summary on
    XLA:CPU). As accurate: ``c1`` is about 0 (``ms`` is the mean up to the first
    pass's rounding), and its rounding, at most ``eps * sqrt(n * c2)``, moves the
    result by at most ``eps * (c2 + n * ms**2)``; the other terms are >= 0."""
    return xp.maximum(c2 + ms * (2 * c1 + n * ms), 0)


def row_map(rows: int, keep: np.ndarray | None) -> np.ndarray | None:
    """Kept position of each row (dropped rows go to a dump row after the kept ones)."""
    if keep is None:
        return None
    out = np.full(rows, len(keep), np.int32)
    out[keep] = np.arange(len(keep), dtype=np.int32)
    return out


def stats(v: jax.Array, bins: int, keep: np.ndarray | None) -> tuple[dict, dict | None]:
    """Pooled statistics per member ``(B, ...)`` and, with `keep` (sorted row indices),
    statistics of those rows ``(B, len(keep), ...)``: `raw_stats`, finished in the
    program (`pooled_fields`, `row_fields`)."""
    pooled, rows = raw_stats(v, bins, keep)
    done = pooled_fields(pooled, bins)
    return done, None if rows is None else row_fields(rows, pooled, bins)


def raw_stats(v: jax.Array, bins: int, keep: np.ndarray | None) -> tuple[dict, dict | None]:
    """What `stats` computes over every value, per member ``(B, ...)`` and, with `keep`
    (sorted row indices), per kept row ``(B, len(keep), ...)``: finite count and range,
    centred sums ``c1``, ``c2`` (in units of the member's scale, `pow2_scale` of its
    absmax) around ``shift`` (pooled: in those units; a row's: its own mean, in the
    values' units), the linear (``lin``) and log (``log``, pooled only) tallies. The rest is a few operations per member or row
    (`pooled_fields`, `row_fields`), in the program or on the host (`Iterated`'s
    summaries leave them there: `capture.tallied.TalliedRows`).

    Two groups of reductions and one scatter, with no branch (a `lax.cond` costs a
    device→host sync on GPUs and serialises work on CPUs): (1) per row: min, max,
    sum and count of the finite values; (2) per row, in units of a power of two
    near absmax, sums of the deviations from the mean of (1) and of their squares
    (two-pass variance with the first pass' rounding corrected, no overflow; l2
    follows from them, `squares`); (3) both bin indices, counted in one scatter.
    """
    rows = row_map(v.shape[1], keep)
    acc = v.dtype
    nd = v.ndim
    axes = tuple(range(2, nd))
    zero = jnp.zeros((), acc)
    v, finite, (min_r, max_r, sum_r, cnt_r) = _first_pass(v, axes)
    vmin = _over_rows(min_r, jnp.min, initial=jnp.inf)
    vmax = _over_rows(max_r, jnp.max, initial=-jnp.inf)
    have = vmin <= vmax
    vmin, vmax = jnp.where(have, vmin, zero), jnp.where(have, vmax, zero)
    absmax = jnp.maximum(jnp.abs(vmin), jnp.abs(vmax))
    cnt = _over_rows(cnt_r, jnp.sum, dtype=jnp.int32)
    n = jnp.maximum(cnt, 1).astype(acc)
    total = _over_rows(sum_r, jnp.sum)
    # The shift: the mean from (1), unless its sum overflowed (then 0).
    shift = jnp.clip(jnp.where(jnp.isfinite(total), total / n, zero), vmin, vmax)
    scale = pow2_scale(absmax)
    s_b = _b(scale, nd)
    vs = jnp.where(finite, _div_pow2(v, s_b), zero)
    ms = _div_pow2(shift, scale)
    c = jnp.where(finite, vs - _b(ms, nd), zero)
    operands = [c, c * c]
    if keep is not None:
        n_r = jnp.maximum(cnt_r, 1).astype(acc)
        row_shift = jnp.where(jnp.isfinite(sum_r), sum_r / n_r, zero)
        row_shift = jnp.clip(row_shift, jnp.minimum(min_r, max_r), max_r)
        cr = jnp.where(finite, vs - _b(_div_pow2(row_shift, scale[:, None]), nd), zero)
        operands += [cr, cr * cr]
    sums = _reduce(operands, [0] * len(operands), [jnp.add] * len(operands), axes)
    c1, c2 = (_over_rows(x, jnp.sum) for x in sums[:2])
    idx = bin_index(v, vmin, vmax, bins)
    idx = jnp.where(
        finite, idx, jnp.where(jnp.isnan(v), bins, jnp.where(v > 0, bins + 1, bins + 2))
    )
    start = log_window_start(absmax)
    lin, log = count(idx, log_slot(v, start, finite), bins + 3, 2 * LOG_SLOTS, rows, v)
    linp = _over_rows(lin, jnp.sum, dtype=jnp.int32)
    pooled = dict(count=cnt, min=vmin, max=vmax, c1=c1, c2=c2, shift=ms, lin=linp, log=log)
    if keep is None:
        return pooled, None
    k = len(keep)

    def kept(a: jax.Array) -> jax.Array:
        # every row kept (a loop of at most `summary.row_cap` iterations): no gather
        return a if k == a.shape[1] else a[:, keep]

    rows = dict(
        count=kept(cnt_r),
        min=kept(min_r),
        max=kept(max_r),
        c1=kept(sums[2]),
        c2=kept(sums[3]),
        shift=kept(row_shift),
        lin=lin[:, :k],
    )
    return pooled, rows


def pooled_fields(raw: dict, bins: int, xp: Any = jnp) -> dict:
    """The summary's fields from `raw_stats`' pooled statistics."""
    moments = moment_fields(*(raw[k] for k in MOMENTS), bins, xp)
    return dict(**moments, **count_fields(raw["lin"], raw["log"], bins))


#: `raw_stats`' pooled statistics that `moment_fields` reads, in its order.
MOMENTS = ("count", "min", "max", "c1", "c2", "shift")


def row_fields(rows: dict, pooled: dict, bins: int, xp: Any = jnp) -> dict:
    """The per-iteration statistics (`summary.IterationStats`' fields) from
    `raw_stats`' rows, centred on each row's own shift, in units of its member's
    scale (from `pooled`)."""
    rc, lin = rows["count"], rows["lin"]
    vmin, vmax = pooled["min"], pooled["max"]
    s = pow2_scale(xp.maximum(xp.abs(vmin), xp.abs(vmax)), xp)[..., None]
    zero = np.zeros((), vmin.dtype)
    nr = xp.maximum(rc, 1).astype(vmin.dtype)
    have_r = rc > 0
    rmin = xp.where(have_r, rows["min"], zero)
    rmax = xp.where(have_r, rows["max"], zero)
    cr1, cr2 = rows["c1"], rows["c2"]
    dr = cr1 / nr
    # A row with no finite value has a shift of -inf (clipped into its empty range);
    # 0 instead, so its l2 (`squares`) is 0, not inf * inf.
    mr = xp.where(have_r, _div_pow2(rows["shift"], s, xp), zero)
    return dict(
        count=rc,
        nonfinite=xp.sum(lin[..., bins:], -1, dtype=np.int32),
        min=rmin,
        max=rmax,
        mean=xp.clip((mr + dr) * s, rmin, rmax),
        std=xp.sqrt(xp.maximum(cr2 / nr - dr * dr, 0)) * s,
        l2=xp.sqrt(squares(cr1, cr2, mr, nr, xp)) * s,
        absmax=xp.maximum(xp.abs(rmin), xp.abs(rmax)),
        hist_counts=lin[..., :bins],
    )


# --------------------------------------------------------------------------
# Many arrays of any shapes in one computation


#: On a CPU, `segment_stats` walks layouts of more values than this in blocks: below,
#: one piece's temporaries (about five full-size arrays) stay small enough for the
#: allocator to reuse, and one piece ran faster (1,024 x 512: 1.9-2.0 vs 2.0-2.5 ms).
SEGMENT_BLOCKED_OVER = 1 << 20
#: ... of at most this many rows (the largest power of two dividing the row count).
SEGMENT_BLOCK_ROWS = 512
#: ... and at least this many (else one piece).
SEGMENT_MIN_BLOCK_ROWS = 16


def segment_block_rows(rows: int, width: int) -> int:
    """Rows per block of `segment_stats` for a layout ``(rows, width)``, or 0 for one
    piece: on a CPU only (a GPU fuses each reduction with its input; a loop there is
    a launch per block), a power of two dividing `rows` (no block overlaps another)."""
    if jax.default_backend() != "cpu" or rows * width <= SEGMENT_BLOCKED_OVER:
        return 0
    block = min(SEGMENT_BLOCK_ROWS, rows & -rows)
    return block if SEGMENT_MIN_BLOCK_ROWS <= block < rows else 0


def segment_stats(v: jax.Array, seg: Any, members: int, bins: int) -> dict:
    """`stats` of `members` arrays laid out as rows of `v` ``(R, W)``: row r holds
    elements of member ``seg[r]`` (sorted, int32; NumPy or traced, so one compiled
    program serves every layout of its shape), padded with NaN to whole rows (the
    caller subtracts its padding from ``nan``). One computation, whatever the
    arrays' shapes, so the program compiles one summary instead of one per shape.

    The counts stay in their decoded tally, ``table`` ``(members, width)``, for
    `table_fields` to slice where they are read: on the host, after the transfer,
    they cost no kernel (XLA:CPU made a kernel of each of the eight slices, and
    packing them copied every count once more).

    The same arithmetic as `stats`, row by row: per-row reductions over W (XLA's
    reduce), combined per member by small segment reductions over rows; per-member
    values (shift, scale, histogram range) are gathered back to the rows.

    On a CPU a large layout is walked in blocks of rows (`segment_block_rows`), two
    loops with the same per-row arithmetic: XLA:CPU writes the input of every
    reduction out as a full-size array, and a layout of 1.8M values summarised in
    one piece held five of them (35 MB: past glibc's largest mmap threshold, so a
    fresh mapping per call, faulted in page by page): 14 ms, against 4 ms in blocks.
    """
    acc = v.dtype
    seg_j = jnp.asarray(seg, jnp.int32)
    zero = jnp.zeros((), acc)
    # Not in blocks on an explicit mesh, even replicated: the loop writes each block's
    # rows into unmeshed buffers, which explicit sharding refuses to mix with them.
    block = 0 if _compat.explicit_sharding(v) is not None else segment_block_rows(*v.shape)
    if block:
        (min_r, max_r, sum_r, cnt_r), _ = _over_blocks(
            v, block, lambda b, _: (_row_firsts(b), None)
        )
    else:
        min_r, max_r, sum_r, cnt_r = _row_firsts(v)

    def per_member(columns, op):
        # Like columns share one segment reduction (one scatter: a launch on a GPU).
        out = op(jnp.stack(columns, 1), seg_j, num_segments=members, indices_are_sorted=True)
        return [out[:, i] for i in range(len(columns))]

    # min as the max of the negation (exact), beside the max
    neg_min, vmax = per_member([-min_r, max_r], jax.ops.segment_max)
    vmin = -neg_min
    have = vmin <= vmax
    vmin, vmax = jnp.where(have, vmin, zero), jnp.where(have, vmax, zero)
    absmax = jnp.maximum(jnp.abs(vmin), jnp.abs(vmax))
    # counts as floats beside the sums: exact, members hold far fewer than 2**24 values
    total, cnt_f = per_member([sum_r, cnt_r], jax.ops.segment_sum)
    cnt = cnt_f.astype(jnp.int32)
    n = jnp.maximum(cnt, 1).astype(acc)
    shift = jnp.clip(jnp.where(jnp.isfinite(total), total / n, zero), vmin, vmax)
    scale = pow2_scale(absmax)
    ms = _div_pow2(shift, scale)
    b_scale, b_lo, b_ratio = bin_params(vmin, vmax, bins)
    start = log_window_start(absmax)
    # Every per-member value the rows need, gathered to them at once (one gather, not
    # one kernel each; no search for members' first rows: on a GPU a searchsorted is
    # a while loop, a host round trip per iteration). `start` is a small integer,
    # exact in any float.
    at = jnp.stack([scale, ms, b_scale, b_lo, b_ratio, start.astype(acc)], 1)[seg_j]
    n_lin, n_log = bins + 3, 2 * LOG_SLOTS
    width = n_lin + n_log
    base = seg_j * width
    second = functools.partial(_row_seconds, bins=bins, n_lin=n_lin)
    if block:

        def tallied(vb, atb, bb, tab):
            sums, parts = second(vb, atb, bb)
            return sums, tally_add(tab, parts)

        table = jnp.zeros(2 * members * width, jnp.int32)
        (c1_r, c2_r), table = _over_blocks(v, block, tallied, (at, base), table)
        cts = untally(table, members * width)
    else:
        (c1_r, c2_r), parts = second(v, at, base)
        cts = tally_slots(parts, members * width, v)
    c1, c2 = per_member([c1_r, c2_r], jax.ops.segment_sum)
    return dict(
        count=cnt, min=vmin, max=vmax, c1=c1, c2=c2, shift=ms, table=cts.reshape(members, width)
    )


def table_fields(table: Any, bins: int) -> dict[str, Any]:
    """`count_fields` of `segment_stats`' decoded tally ``table`` (``(..., width)``:
    the linear tally's ``bins + 3`` slots, then the log tally's)."""
    return count_fields(table[..., : bins + 3], table[..., bins + 3 :], bins)


def _row_firsts(v: jax.Array) -> tuple:
    """Per row of ``v`` ``(R, W)``: the finite min, max, sum and count (as floats)."""
    return _first_pass(v, (1,), float_count=True)[2]


def _row_seconds(v, at, base, *, bins: int, n_lin: int):
    """Per row of ``v`` ``(R, W)``, with its member's values `at` ``(R, 6)`` and tally
    offset `base` ``(R,)``: the centred sums ``(c, c**2)``, and the linear and
    log tally slots of its elements."""
    zero = jnp.zeros((), v.dtype)
    v, finite = flushed(v)
    r_scale, r_ms, r_bscale, r_blo, r_bratio = (at[:, i : i + 1] for i in range(5))
    r_start = at[:, 5].astype(jnp.int32)
    vs = jnp.where(finite, _div_pow2(v, r_scale), zero)
    c = jnp.where(finite, vs - r_ms, zero)
    sums = _reduce((c, c * c), (0, 0), (jnp.add,) * 2, (1,))
    idx = bin_of(v, r_bscale[:, 0], r_blo[:, 0], r_bratio[:, 0], bins)
    idx = jnp.where(
        finite, idx, jnp.where(jnp.isnan(v), bins, jnp.where(v > 0, bins + 1, bins + 2))
    )
    lslot = log_slot(v, r_start, finite)
    return sums, [base[:, None] + idx, base[:, None] + n_lin + lslot]


def _over_blocks(v: jax.Array, block: int, fn: Any, rowwise: tuple = (), carry: Any = None):
    """``fn(v_rows, *rowwise_rows, carry) -> (per_row, carry)`` over ``v`` ``(R, W)`` in
    blocks of `block` rows (a `lax.fori_loop`; R a multiple of `block`), with the
    matching rows of each array of `rowwise`: returns the per-row results written back
    in place, as one piece would return them, and the carry after every block."""
    rows = v.shape[0]

    def call(i, c):
        # Sliced through a barrier: a dynamic slice fused into the kernels that read it
        # is recomputed per element and keeps XLA:CPU from vectorising them (the bins
        # of 1.8M values took 3 ms instead of 0.4).
        sliced = (jax.lax.dynamic_slice_in_dim(a, i * block, block, 0) for a in (v, *rowwise))
        return fn(*jax.lax.optimization_barrier(tuple(sliced)), c)

    per_row = jax.eval_shape(lambda: call(0, carry))[0]
    init = jax.tree_util.tree_map(lambda s: jnp.zeros((rows, *s.shape[1:]), s.dtype), per_row)

    def body(i, state):
        out, c = state
        got, c = call(i, c)
        out = jax.tree_util.tree_map(
            lambda o, g: jax.lax.dynamic_update_slice_in_dim(o, g, i * block, 0), out, got
        )
        return out, c

    return jax.lax.fori_loop(0, rows // block, body, (init, carry))


def moment_fields(cnt: Any, vmin: Any, vmax: Any, c1: Any, c2: Any, ms: Any, bins: int, xp=jnp):
    """The summary's fields other than the counts of its tallies, from each member's
    finite count, range (0 where empty) and centred sums ``c1``, ``c2`` around ``ms``
    (in units of ``pow2_scale(absmax)``: `stats`). A few operations per member, in a
    program (`xp` `jax.numpy`) or on the host (`numpy`: `segment_stats` leaves them
    there, where they cost XLA:CPU no kernels to compile)."""
    absmax = xp.maximum(xp.abs(vmin), xp.abs(vmax))
    scale = pow2_scale(absmax, xp)
    n = xp.maximum(cnt, 1).astype(vmin.dtype)
    d = c1 / n
    return dict(
        count=cnt,
        min=vmin,
        max=vmax,
        mean=xp.clip((ms + d) * scale, vmin, vmax),
        std=xp.sqrt(xp.maximum(c2 / n - d * d, 0)) * scale,
        l2=xp.sqrt(squares(c1, c2, ms, n, xp)) * scale,
        absmax=absmax,
        hist_edges=bin_edges(vmin, vmax, bins, xp),
        loghist_start=log_window_start(absmax, xp),
    )


def count_fields(lin: Any, log: Any, bins: int) -> dict[str, Any]:
    """The summary's counts from the two tallies (leading axes kept; NumPy or traced):
    the linear tally has `bins` histogram slots then NaN, +Inf, -Inf; the log tally
    has LOG_SLOTS slots for values >= 0 (zeros, underflow, the LOG_BINS fixed-grid
    bins, not finite), then LOG_SLOTS for negative values."""
    neg = log[..., LOG_SLOTS:]
    log = log[..., :LOG_SLOTS] + neg
    return dict(
        nan=lin[..., bins],
        posinf=lin[..., bins + 1],
        neginf=lin[..., bins + 2],
        zeros=log[..., 0],
        hist_counts=lin[..., :bins],
        loghist_under=log[..., 1],
        loghist_counts=log[..., 2 : 2 + LOG_BINS],
        loghist_under_neg=neg[..., 1],
        loghist_neg=neg[..., 2 : 2 + LOG_BINS],
    )


def flushed(v: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`v` with subnormals as zeros (see sowviz.summary's docstring) and its finite mask."""
    v = jnp.where(jnp.abs(v) < jnp.finfo(v.dtype).tiny, jnp.zeros((), v.dtype), v)
    return v, jnp.isfinite(v)


def _first_pass(v, axes, float_count: bool = False):
    """`flushed` and one reduction over `axes` of the finite min, max, sum and count.
    `float_count` counts in `v`'s dtype (exact below 2**24 values per row): XLA:CPU
    sums an int32 mask with a reduce-window of its own, a float one in the fused
    reduction."""
    zero = jnp.zeros((), v.dtype)
    inf = jnp.asarray(jnp.inf, v.dtype)
    v, finite = flushed(v)
    reduced = _reduce(
        (
            jnp.where(finite, v, inf),
            jnp.where(finite, v, -inf),
            jnp.where(finite, v, zero),
            finite.astype(v.dtype if float_count else jnp.int32),
        ),
        (jnp.inf, -jnp.inf, 0, 0),
        (jnp.minimum, jnp.maximum, jnp.add, jnp.add),
        axes,
    )
    return v, finite, reduced
