"""`summary_ops.stats` of large arrays, computed in fixed-size blocks (CPU).

XLA:CPU (its YNNPACK reductions, in JAX 0.12) reduces an array in place, but
writes out the input of a masked reduction as a full-size array first (a
``sum(where(isfinite(x), x, 0))`` allocates one; four such sums of 2M values
took 9 ms, against 0.3 ms for the plain min, max and sum). So:

* the first pass reads every array whole, unmasked: its min, max and sum
  (`_raw_firsts`). When every sum is finite, so is every value, and these are
  the finite statistics `stats` needs;
* the second pass (which needs the mean, the scale and the histogram range)
  walks the flattened arrays in blocks of `BLOCK` elements (a `lax.fori_loop`
  of `lax.dynamic_slice`, no padded copy of the whole array): the centred
  moments and both histogram tallies. With every value finite it needs no mask;
* otherwise (a NaN or an infinity somewhere: a `lax.cond`, cheap on a CPU)
  both passes walk the blocks with `stats`' masks.

Temporaries are bounded by the block, whatever the array's size. The
arithmetic per element is `stats`'; only the float sums are combined across
blocks, by compensated (Kahan) addition, so the cross-block rounding stays
below an ulp or two. An array's last block starts at ``n - block`` (it fits);
the part it shares with the block before is left out (the masked walk counts it
as NaN and takes it off ``nan``).

The loops serve a whole group of arrays at once (`grouped_stats`: a
`lax.switch` reads the block of the member whose turn it is), so a program that
summarises many large arrays compiles the summary once, not once per array. In
`inspect`'s capture program, 27 arrays of 1-2M elements compiled in 4.6 s one
summary each and 0.9-1.5 s grouped (`sowviz.capture.summaries.GROUP_MAX_BYTES`).

`inspect`'s groups take `sowviz.summary_chunks` instead (the same passes, walked from
the host by programs keyed by a chunk size, not by the members' shapes).

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
    """`raw_stats(flat[None, None], bins, None)[0]` (pooled, one member ``(1, ...)``)
    in blocks of `block` elements of the 1-d `flat` (accumulation dtype)."""
    if flat.shape[0] < block:  # one piece: a block would not fit
        return _ops.raw_stats(flat[None, None], bins, None)[0]
    return grouped_stats([flat], bins, block)


def grouped_stats(flats: Sequence[jax.Array], bins: int, block: int) -> dict:
    """`raw_stats` pooled per member (leading axis ``K = len(flats)``) of the 1-d
    arrays `flats` (one accumulation dtype, each at least `block` long), in blocks of
    `block` elements: sums and tallies (`summary_ops.pooled_fields` finishes them, in
    the program or on the host).

    One loop walks every member's blocks in turn (a `lax.switch` picks the member
    whose block is read, `_Walk`), so a program summarising many large arrays
    compiles the summary once per group instead of once per array: XLA:CPU's passes
    and kernels grow with every copy (27 arrays of 1-2M elements: 4.6 s of compile).

    The first pass reads the arrays whole, unmasked (`_raw_firsts`): XLA:CPU reduces
    an array in place, but writes a masked one out first. When every value is finite
    (every member's sum is), that pass is the finite one and the second needs no
    masks; otherwise (a `lax.cond`: this runs on a CPU only) both passes are walked
    in blocks with the masks. On the 16 arrays of 131K values of an 8x512 MLP's
    capture: 3.0-3.6 ms with masks throughout, against 1.55-1.7 ms now, and 2.8 ms
    with a NaN in one of them."""
    walk = _Walk(flats, block)
    raw = _raw_firsts(flats)
    finite = jnp.all(jnp.isfinite(raw[3]))
    # Only the walks are branches: what comes before and after them is compiled once
    # (its many small kernels were 0.15-0.2 s of each group's compile, twice).
    firsts = jax.lax.cond(finite, lambda: raw, lambda: _masked_firsts(walk))
    return _second(walk, firsts, bins, finite)


class _Walk:
    """The blocks of a group, member after member: a member's blocks start every
    `block` elements, its last at ``n - block`` (so it fits), the part that overlaps
    the block before left out (``keep``)."""

    def __init__(self, flats: Sequence[jax.Array], block: int) -> None:
        self.k, self.block, self.dtype = len(flats), block, flats[0].dtype
        sched = [
            (j, s, min(s, f.shape[0] - block))
            for j, f in enumerate(flats)
            for s in range(0, f.shape[0], block)
        ]
        self.steps = len(sched)
        self.overlap = np.zeros(self.k, np.int32)
        for j, s, c in sched:
            self.overlap[j] += s - c
        self.table = jnp.asarray(np.asarray(sched, np.int32))
        self.branches = [functools.partial(_block_of, f, block) for f in flats]

    def piece(self, t: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        """Member, values ``(block,)`` and kept mask (None: all kept) of block `t`."""
        j, s, c = self.table[t, 0], self.table[t, 1], self.table[t, 2]
        v = self.branches[0](c) if self.k == 1 else jax.lax.switch(j, self.branches, c)
        keep = jnp.arange(self.block, dtype=jnp.int32) >= s - c if self.overlap.any() else None
        return j, v, keep

    def loop(self, body: Any, init: Any) -> Any:
        """``body(j, v, keep, carry) -> carry`` over every block."""
        return jax.lax.fori_loop(0, self.steps, lambda t, c: body(*self.piece(t), c), init)


def _raw_firsts(flats: Sequence[jax.Array]) -> tuple:
    """Per member: the min and max (subnormals flushed: the flush is monotone, so it
    commutes with them), count and sum of every value, reduced straight from the
    arrays. They are the finite ones when every sum is finite: a NaN or an infinity
    makes its sum NaN or infinite (XLA:CPU's min and max skip NaN)."""
    mn, mx, total = (jnp.stack([r(f) for f in flats]) for r in (jnp.min, jnp.max, jnp.sum))
    cnt = jnp.asarray([f.shape[0] for f in flats], jnp.int32)
    return _ops.flushed(mn)[0], _ops.flushed(mx)[0], cnt, total


def _masked_firsts(walk: _Walk) -> tuple:
    """`_raw_firsts` of the finite values, in blocks (sums compensated across them)."""
    acc, k = walk.dtype, walk.k

    def first(j, v, keep, carry):
        mn, mx, cnt, s, sc = carry
        if keep is not None:
            v = jnp.where(keep, v, jnp.nan)
        _, _, (min_b, max_b, sum_b, cnt_b) = _ops._first_pass(v, (0,))
        (s_j,), (sc_j,) = _kahan((s[j],), (sc[j],), (sum_b,))
        return (
            mn.at[j].min(min_b),
            mx.at[j].max(max_b),
            cnt.at[j].add(cnt_b),
            s.at[j].set(s_j),
            sc.at[j].set(sc_j),
        )

    zk = jnp.zeros(k, acc)
    init = (jnp.full(k, jnp.inf, acc), jnp.full(k, -jnp.inf, acc), jnp.zeros(k, jnp.int32))
    mn, mx, cnt, s, sc = walk.loop(first, (*init, zk, zk))
    return mn, mx, cnt, _total(s, sc)


def _second(walk: _Walk, firsts: tuple, bins: int, finite: jax.Array) -> dict:
    """The summary from the first pass `firsts` and a second walk over the blocks: the
    centred sums (compensated across blocks) and both tallies, counted in one joint
    table. Where `finite` (every value is), the walk needs no masks but the overlaps'."""
    vmin, vmax, cnt, total = firsts
    acc, k = walk.dtype, walk.k
    zero = jnp.zeros((), acc)
    have = vmin <= vmax
    vmin, vmax = jnp.where(have, vmin, zero), jnp.where(have, vmax, zero)
    absmax = jnp.maximum(jnp.abs(vmin), jnp.abs(vmax))
    nf = jnp.maximum(cnt, 1).astype(acc)
    shift = jnp.clip(jnp.where(jnp.isfinite(total), total / nf, zero), vmin, vmax)
    scale = _ops.pow2_scale(absmax)
    ms = _ops._div_pow2(shift, scale)
    b_scale, b_lo, b_ratio = _ops.bin_params(vmin, vmax, bins)
    start = _ops.log_window_start(absmax)
    n_lin, n_log = bins + 3, 2 * _ops.LOG_SLOTS
    width = n_lin * n_log
    dump = k * width  # the unmasked walk's overlapped values

    def second(masked, j, v, keep, carry):
        sums, comp, table = carry
        if masked:
            if keep is not None:
                v = jnp.where(keep, v, jnp.nan)
            v, ok = _ops.flushed(v)
        else:  # XLA:CPU computes with subnormals as zeros (DAZ): no flush needed
            ok = keep
        c = _ops._div_pow2(v, scale[j]) - ms[j]
        if ok is not None:
            c = jnp.where(ok, c, zero)
        sums_j, comp_j = _kahan(
            tuple(a[j] for a in sums), tuple(a[j] for a in comp), (jnp.sum(c), jnp.sum(c * c))
        )
        idx = _ops.bin_of(v, b_scale[j], b_lo[j], b_ratio[j], bins)
        if masked:
            special = jnp.where(jnp.isnan(v), bins, jnp.where(v > 0, bins + 1, bins + 2))
            idx = jnp.where(ok, idx, special)
        joint = j * width + idx * n_log + _ops.log_slot(v, start[j], ok if masked else None)
        if not masked and keep is not None:
            joint = jnp.where(keep, joint, dump)
        return (
            tuple(a.at[j].set(x) for a, x in zip(sums, sums_j, strict=True)),
            tuple(a.at[j].set(x) for a, x in zip(comp, comp_j, strict=True)),
            _ops.tally_add(table, [joint]),
        )

    zs = (jnp.zeros(k, acc),) * 2
    init = (zs, zs, jnp.zeros(2 * (dump + 1), jnp.int32))
    sums, comp, table = jax.lax.cond(
        finite,
        lambda: walk.loop(functools.partial(second, False), init),
        lambda: walk.loop(functools.partial(second, True), init),
    )
    c1, c2 = (_total(t, c) for t, c in zip(sums, comp, strict=True))
    joint = _ops.untally(table, dump + 1)[:dump].reshape(k, n_lin, n_log)
    lin = jnp.sum(joint, 2, dtype=jnp.int32)
    # The masked walk counted the overlaps as NaN.
    lin = lin.at[:, bins].add(jnp.where(finite, 0, -jnp.asarray(walk.overlap)))
    log = jnp.sum(joint, 1, dtype=jnp.int32)
    return dict(count=cnt, min=vmin, max=vmax, c1=c1, c2=c2, shift=ms, lin=lin, log=log)


def _block_of(flat: jax.Array, block: int, start: jax.Array) -> jax.Array:
    return jax.lax.dynamic_slice(flat, (start,), (block,))
