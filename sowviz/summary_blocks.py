"""`summary_ops.stats` of large arrays, computed in fixed-size blocks (CPU).

XLA:CPU writes out the input of every reduction as a full-size array (even a
``sum(where(isfinite(x), x, 0))`` allocates one), so summarising an array of N
elements in one piece holds about 5N values of temporaries at once. Here two
loops walk the flattened arrays in blocks of `BLOCK` elements (a `lax.fori_loop`
of `lax.dynamic_slice`, no padded copy of the whole array): the first reduces
the finite min, max, sum and count, the second (which needs the mean, the
scale and the histogram range) the centred moments and both histogram tallies.
Temporaries are then bounded by the block, whatever the array's size. The
arithmetic per element is `stats`'; only the float sums are combined across
blocks, by compensated (Kahan) addition, so the cross-block rounding stays
below an ulp or two. An array's last block starts at ``n - block`` (it fits);
the part it shares with the block before is masked to NaN, whose count is taken
off ``nan``.

The loops serve a whole group of arrays at once (`grouped_stats`: a
`lax.switch` reads the block of the member whose turn it is), so a program that
summarises many large arrays compiles the summary once, not once per array. In
`inspect`'s capture program, 27 arrays of 1-2M elements compiled in 4.6 s one
summary each and 0.9-1.5 s grouped (`sowviz.capture.summaries.GROUP_MAX_BYTES`).

Used on a CPU backend for arrays that are not on a mesh (blocks of a flattened
sharded array would gather it): by `summarize` from `MIN_BLOCKED` elements, by
the capture program's groups from its `MIN_GROUPED`; elsewhere the one-piece
`stats` runs (GPUs fuse a reduction with its input). On 16M float32 elements
the blocks also ran 2x faster than one piece (188 vs 394 ms: the temporaries
stay in cache).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import summary_ops as _ops

#: Elements per block (1 MB of float32; measured fastest of 2**14..2**18 on 16M elements).
BLOCK = 1 << 18
#: Arrays with at least this many elements are summarised in blocks (on a CPU).
MIN_BLOCKED = 1 << 20
#: Elements per block of a group (`grouped_stats`): one size for all its members,
#: so arrays of every size share one loop (2**16: the smallest grouped array fits).
GROUP_BLOCK = 1 << 16


def block_for(x: Any, per_iteration: bool, min_blocked: int | None = None) -> int:
    """The block size to summarise `x` with, or 0 for one piece (see the docstring);
    `min_blocked` is the least size blocked (default `MIN_BLOCKED`)."""
    least = MIN_BLOCKED if min_blocked is None else min_blocked
    if per_iteration or jax.default_backend() != "cpu" or np.size(x) < least:
        return 0
    if isinstance(x, (jax.Array, jax.core.Tracer)):
        # On a mesh (traced: the abstract mesh of its type; concrete: its devices),
        # blocks of the flattened array would gather it: summarise it in one piece.
        if not jax.typeof(x).sharding.mesh.empty:
            return 0
        if not isinstance(x, jax.core.Tracer) and len(x.sharding.device_set) > 1:
            return 0
    return BLOCK


def _kahan(total: tuple, comp: tuple, add: tuple) -> tuple[tuple, tuple]:
    """Compensated ``total + add`` elementwise over tuples (Kahan-Babuska)."""
    out_t, out_c = [], []
    for t, c, a in zip(total, comp, add, strict=True):
        s = t + a
        big = jnp.abs(t) >= jnp.abs(a)
        c = c + jnp.where(big, (t - s) + a, (a - s) + t)
        out_t.append(s)
        out_c.append(c)
    return tuple(out_t), tuple(out_c)


def _total(t: jax.Array, c: jax.Array) -> jax.Array:
    """A compensated sum's value (an overflowed one stays inf, not inf - inf)."""
    return jnp.where(jnp.isfinite(t), t + c, t)


def group_block(least: int) -> int:
    """The block size of `grouped_stats` groups whose members have at least `least`
    elements: the largest power of two <= least, at most `GROUP_BLOCK`."""
    return min(GROUP_BLOCK, 1 << (max(least, 1).bit_length() - 1))


def blocked_stats(flat: jax.Array, bins: int, block: int) -> dict:
    """`stats(flat[None, None], bins, None)[0]` (pooled, one member ``(1, ...)``) in
    blocks of `block` elements of the 1-d `flat` (accumulation dtype)."""
    if flat.shape[0] < block:  # one piece: a block would not fit
        return _ops.stats(flat[None, None], bins, None)[0]
    return grouped_stats([flat], bins, block)


def grouped_stats(flats: Sequence[jax.Array], bins: int, block: int) -> dict:
    """`stats` pooled per member (leading axis ``K = len(flats)``) of the 1-d arrays
    `flats` (one accumulation dtype, each at least `block` long), in blocks of
    `block` elements.

    One loop walks every member's blocks in turn (a `lax.switch` picks the member
    whose block is read), so a program summarising many large arrays compiles the
    summary once per group instead of once per array: XLA:CPU's passes and kernels
    grow with every copy (27 arrays of 1-2M elements: 4.6 s of compile). A
    member's last block starts early enough to fit (``n - block``); the part that
    overlaps its previous block is masked to NaN and taken off ``nan``."""
    acc = flats[0].dtype
    k = len(flats)
    sched = [
        (j, s, min(s, f.shape[0] - block))
        for j, f in enumerate(flats)
        for s in range(0, f.shape[0], block)
    ]
    overlap = np.zeros(k, np.int32)
    for j, s, c in sched:
        overlap[j] += s - c
    table = jnp.asarray(np.asarray(sched, np.int32))
    branches = [functools.partial(_block_of, f, block) for f in flats]
    pos = jnp.arange(block, dtype=jnp.int32)
    zero = jnp.zeros((), acc)

    def piece(t):
        """Member and values ``(1, 1, block)`` of the t-th block of the schedule."""
        j, s, c = table[t, 0], table[t, 1], table[t, 2]
        v = branches[0](c) if k == 1 else jax.lax.switch(j, branches, c)
        if overlap.any():
            v = jnp.where(pos >= s - c, v, jnp.nan)
        return j, v[None, None]

    def loop(body, init):
        return jax.lax.fori_loop(0, len(sched), lambda t, carry: body(*piece(t), carry), init)

    # (1) finite min, max, count; sum compensated across blocks.
    def first(j, v, carry):
        mn, mx, cnt, s, sc = carry
        _, _, (min_r, max_r, sum_r, cnt_r) = _ops._first_pass(v, (2,))
        (s_j,), (sc_j,) = _kahan((_get(s, j),), (_get(sc, j),), (sum_r,))
        return (
            _put(mn, j, jnp.minimum(_get(mn, j), min_r)),
            _put(mx, j, jnp.maximum(_get(mx, j), max_r)),
            _put(cnt, j, _get(cnt, j) + cnt_r),
            _put(s, j, s_j),
            _put(sc, j, sc_j),
        )

    zk = jnp.zeros((k, 1), acc)
    min_r, max_r, cnt_r, s, sc = loop(
        first,
        (
            jnp.full((k, 1), jnp.inf, acc),
            jnp.full((k, 1), -jnp.inf, acc),
            jnp.zeros((k, 1), jnp.int32),
            zk,
            zk,
        ),
    )
    sum_r = _total(s, sc)
    vmin, vmax = min_r[:, 0], max_r[:, 0]
    have = vmin <= vmax
    vmin, vmax = jnp.where(have, vmin, zero), jnp.where(have, vmax, zero)
    absmax = jnp.maximum(jnp.abs(vmin), jnp.abs(vmax))
    cnt = cnt_r[:, 0]
    nf = jnp.maximum(cnt, 1).astype(acc)
    total = sum_r[:, 0]
    shift = jnp.clip(jnp.where(jnp.isfinite(total), total / nf, zero), vmin, vmax)
    scale = _ops.pow2_scale(absmax)
    ms = _ops._div_pow2(shift, scale)
    start = _ops.log_window_start(absmax)
    n_lin, n_log = bins + 3, 2 * _ops.LOG_SLOTS

    # (2) centred moments and both tallies, with (1)'s mean, scale and range.
    def second(j, v, carry):
        sums, comp, lin, log = carry
        v, finite = _ops.flushed(v)
        vs = jnp.where(finite, _ops._div_pow2(v, _ops._b(_get(scale, j), 3)), zero)
        c = jnp.where(finite, vs - _ops._b(_get(ms, j), 3), zero)
        add = tuple(jnp.sum(x, (2,)) for x in (c, c * c))
        sums_j, comp_j = _kahan(
            tuple(_get(a, j) for a in sums), tuple(_get(a, j) for a in comp), add
        )
        _, idx = _ops.bin_index(v, _get(vmin, j), _get(vmax, j), bins)
        idx = jnp.where(
            finite, idx, jnp.where(jnp.isnan(v), bins, jnp.where(v > 0, bins + 1, bins + 2))
        )
        slot = _ops.log_slot(v, _get(start, j), finite)
        lin_b, log_b = _ops.count(idx, slot, n_lin, n_log, None, v)
        return (
            tuple(_put(a, j, x) for a, x in zip(sums, sums_j, strict=True)),
            tuple(_put(a, j, x) for a, x in zip(comp, comp_j, strict=True)),
            _put(lin, j, _get(lin, j) + lin_b),
            _put(log, j, _get(log, j) + log_b),
        )

    zs = (zk, zk)
    sums, comp, lin, log = loop(
        second,
        (zs, zs, jnp.zeros((k, 1, n_lin), jnp.int32), jnp.zeros((k, n_log), jnp.int32)),
    )
    c1, c2 = (_total(t, c)[:, 0] for t, c in zip(sums, comp, strict=True))
    sq = _ops.squares(c1, c2, ms, nf)
    d = c1 / nf
    mean = jnp.clip((ms + d) * scale, vmin, vmax)
    std = jnp.sqrt(jnp.maximum(c2 / nf - d * d, 0)) * scale
    edges, _ = _ops.bin_index(jnp.zeros((k, 1, 0), acc), vmin, vmax, bins)
    linp = lin[:, 0]
    linp = linp.at[:, bins].add(-jnp.asarray(overlap))  # the masked overlaps
    return _ops._fields(
        cnt, linp, log, bins, vmin, vmax, mean, std, sq, scale, absmax, edges, start
    )


def _block_of(flat: jax.Array, block: int, start: jax.Array) -> jax.Array:
    return jax.lax.dynamic_slice(flat, (start,), (block,))


def _get(a: jax.Array, j: jax.Array) -> jax.Array:
    """Member `j` of `a` (leading axis kept, size 1)."""
    return jax.lax.dynamic_index_in_dim(a, j, 0, keepdims=True)


def _put(a: jax.Array, j: jax.Array, x: jax.Array) -> jax.Array:
    """`a` with member `j` set to `x` (leading axis of size 1)."""
    return jax.lax.dynamic_update_index_in_dim(a, x, j, 0)
