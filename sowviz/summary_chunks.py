"""`inspect`'s large arrays summarised by programs keyed by a chunk size, not shapes (CPU).

A group of large arrays (`capture.summaries.Blocks`) was summarised by one program
whose inputs are the arrays themselves, so it was keyed by their shapes: a user's
next model of other widths compiled it again (the 4x960 MLP after the 4x1024, 25
arrays of 1-2M values: 1.3 s of a 2.1 s first `inspect`, against a plain first call
of 0.6 s). Here each array is walked from the host as a sequence of chunks of
`CHUNK_MAX` values, each a NumPy view of the array's own buffer (no copy: XLA:CPU
takes a 64-byte aligned view as it is), by two programs keyed only by the chunk
size, dtype and bins (`key`, `lower`), so one pair is compiled once and then read
from disk (`sowviz._disk_cache`) by every model:

* ``first`` (per chunk): the min, max and sum read straight from the chunk (XLA:CPU
  reduces it in place); when that sum is not finite (a NaN or an infinity in the
  chunk), or the chunk is a short array's, the finite min, max, sum and count by a
  masked walk over blocks of `summary_blocks.GROUP_BLOCK` (`lax.cond`). The host
  combines the chunks: min of mins, max of maxes, counts added (exact), and the
  centring shift as `summary_blocks` takes it (a mean estimate, clipped into
  [min, max]).
* ``second`` (per chunk, given its member's min, max and shift): the centred sums,
  compensated (Kahan) across blocks AND across chunks (the carry goes in and out of
  each call, so a member's blocks are added in one running order), and the joint
  tally of the linear and log histograms (integer counts, added on the host), with
  `stats`' masks only where the chunk holds a NaN or an infinity.

A chunk's own values are ``lo:hi`` (`schedule`): an array's last chunk starts at
``n - chunk`` (it fits; XLA:CPU copies it when that start is not 64-byte aligned),
and the part it shares with the chunk before is left out of every sum and tally (its
whole blocks are not walked; min and max read it twice, which changes neither). An
array shorter than a chunk is copied into a zeroed one, its end left out likewise.

Against `summary_blocks.grouped_stats` (the group program, still used by `Monitor`
and wherever this path does not apply): count, min, max, NaN/±Inf counts, zeros and
both histograms are identical (the histogram's range and log window depend on min and
max only); the shift is a mean of other partial sums, so c1/c2 and the mean, std and
l2 made of them differ by float32 reduction order (a few ulps of the values' scale;
the blocks of an array's last chunk also start elsewhere). Checked against NumPy in
`tests/test_round21_nextmodel.py`. Run time: `benchmarks/chunked_summaries.py`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import summary_blocks as _blocks
from . import summary_ops as _ops

#: The chunk (4 MB of float32): one size for every array, so one pair of programs
#: serves every model. (A chunk size per power of two compiled a pair per class: the
#: 4x960 MLP's 960x960 gradients took 2**19 where the 4x1024's took 2**20.)
CHUNK_MAX = 1 << 20


def chunk_for(n: int) -> int:
    """The chunk size an array of `n` values is walked in."""
    return CHUNK_MAX


def usable(shape: tuple[int, ...], dtype: Any) -> bool:
    """Whether an array of `shape` and `dtype` can be walked in chunks: a real float its
    own accumulation dtype (float32, float64), not empty."""
    return np.dtype(dtype) in (np.float32, np.float64) and int(np.prod(shape)) > 0


def schedule(n: int, chunk: int) -> list[tuple[int, int, int]]:
    """``(start, lo, hi)`` of every chunk of an array of `n` values: the chunk's values
    ``lo:hi`` are its own (before ``lo``: read by the chunk before, only in the last
    chunk; from ``hi``: past the array, only when it is shorter than a chunk, then
    copied into one)."""
    if n < chunk:
        return [(0, 0, n)]
    out = [(s, 0, chunk) for s in range(0, n - chunk + 1, chunk)]
    end = out[-1][0] + chunk
    if end < n:
        out.append((n - chunk, end - (n - chunk), chunk))
    return out


def key(kind: str, chunk: int, dtype: Any, bins: int) -> tuple:
    """The compiled-program key of pass `kind` (``"first"``, ``"second"``)."""
    return ("chunks", kind, chunk, np.dtype(dtype).name, bins)


def lower(k: tuple) -> Any:
    """The lowered program of `key` `k` (`capture.summaries` compiles and caches it)."""
    _, kind, chunk, dtype, bins = k
    spec = jax.ShapeDtypeStruct((chunk,), np.dtype(dtype))
    acc = np.dtype(dtype)
    vec = lambda n, dt: jax.ShapeDtypeStruct((n,), dt)  # noqa: E731
    if kind == "first":
        return _chunk_first.lower(spec, vec(2, np.int32))
    return _chunk_second.lower(spec, vec(3, np.int32), vec(3, acc), vec(4, acc), bins=bins)


def _kept(t: jax.Array, lo: jax.Array, hi: jax.Array, block: int) -> jax.Array:
    at = t * block + jnp.arange(block, dtype=jnp.int32)
    return (at >= lo) & (at < hi)


def _blocks_of(lo: jax.Array, hi: jax.Array, block: int) -> tuple[jax.Array, jax.Array]:
    """The blocks that hold the values ``lo:hi`` (a loop's bounds: a last chunk skips the
    blocks the chunk before read, a short array's chunk walks its own blocks only;
    blocks wholly masked made a last chunk's tally 2x slower)."""
    return lo // block, (hi + block - 1) // block


@jax.jit
def _chunk_first(chunk: jax.Array, bounds: jax.Array) -> jax.Array:
    """``[min, max, sum, weight, count, finite]`` of a chunk's values ``lo:hi``
    (`bounds`; see the module docstring): weight is what the sum is the sum of (the
    unmasked sum reads the shared part too)."""
    n, acc = chunk.shape[0], chunk.dtype
    block = min(n, _blocks.GROUP_BLOCK)
    lo, hi = bounds[0], bounds[1]

    def whole() -> jax.Array:
        total = jnp.sum(chunk)
        return jax.lax.cond(jnp.isfinite(total), lambda: raw(total), masked)

    def raw(total: jax.Array) -> jax.Array:
        mn, mx = _ops.flushed(jnp.min(chunk))[0], _ops.flushed(jnp.max(chunk))[0]
        one = jnp.ones((), acc)
        return jnp.stack([mn, mx, total, jnp.asarray(n, acc), (n - lo).astype(acc), one])

    def masked() -> jax.Array:
        def body(t, carry):
            mn, mx, cnt, s, sc = carry
            v = jax.lax.dynamic_slice(chunk, (t * block,), (block,))
            v = jnp.where(_kept(t, lo, hi, block), v, jnp.nan)
            _, _, (min_b, max_b, sum_b, cnt_b) = _ops._first_pass(v, (0,))
            (s,), (sc,) = _blocks._kahan((s,), (sc,), (sum_b,))
            return jnp.minimum(mn, min_b), jnp.maximum(mx, max_b), cnt + cnt_b, s, sc

        z = jnp.zeros((), acc)
        init = (jnp.asarray(jnp.inf, acc), jnp.asarray(-jnp.inf, acc), jnp.int32(0), z, z)
        mn, mx, cnt, s, sc = jax.lax.fori_loop(*_blocks_of(lo, hi, block), body, init)
        c = cnt.astype(acc)
        every = (c == (hi - lo).astype(acc)).astype(acc)  # every value finite
        return jnp.stack([mn, mx, _blocks._total(s, sc), c, c, every])

    # a whole chunk is read in place; the one chunk of a short array block by block
    return jax.lax.cond(hi == n, whole, masked)


@functools.partial(jax.jit, static_argnames="bins")
def _chunk_second(
    chunk: jax.Array, meta: jax.Array, params: jax.Array, carry: jax.Array, bins: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One chunk's centred sums added to `carry` (``[s1, s2, comp1, comp2]``, Kahan) and
    its joint tally (`summary_blocks._second`'s, one member). `meta`: ``[lo, hi,
    finite]``;
    `params`: its member's ``[min, max, shift]``. Returns (carry, shift in units of the
    scale, tally)."""
    n, acc = chunk.shape[0], chunk.dtype
    block = min(n, _blocks.GROUP_BLOCK)
    lo, hi, finite = meta[0], meta[1], meta[2] > 0
    vmin, vmax, shift = params[0:1], params[1:2], params[2:3]  # one member, as a group's
    zero = jnp.zeros((), acc)
    absmax = jnp.maximum(jnp.abs(vmin), jnp.abs(vmax))
    scale = _ops.pow2_scale(absmax)
    ms = _ops._div_pow2(shift, scale)
    b_scale, b_lo, b_ratio = _ops.bin_params(vmin, vmax, bins)
    start = _ops.log_window_start(absmax)
    n_log = 2 * _ops.LOG_SLOTS
    dump = (bins + 3) * n_log  # the shared part's slot

    def walk(masked: bool) -> tuple:
        def body(t, c):
            sums, comp, table = c
            v = jax.lax.dynamic_slice(chunk, (t * block,), (block,))
            keep = _kept(t, lo, hi, block)
            if masked:
                v, ok = _ops.flushed(jnp.where(keep, v, jnp.nan))
            else:  # XLA:CPU computes with subnormals as zeros (DAZ): no flush needed
                ok = keep
            d = jnp.where(ok, _ops._div_pow2(v, scale[0]) - ms[0], zero)
            sums, comp = _blocks._kahan(sums, comp, (jnp.sum(d), jnp.sum(d * d)))
            idx = _ops.bin_of(v, b_scale[0], b_lo[0], b_ratio[0], bins)
            if masked:
                special = jnp.where(jnp.isnan(v), bins, jnp.where(v > 0, bins + 1, bins + 2))
                idx = jnp.where(ok, idx, special)
            joint = idx * n_log + _ops.log_slot(v, start[0], ok if masked else None)
            return sums, comp, _ops.tally_add(table, [jnp.where(keep, joint, dump)])

        init = ((carry[0], carry[1]), (carry[2], carry[3]), jnp.zeros(2 * (dump + 1), jnp.int32))
        return jax.lax.fori_loop(*_blocks_of(lo, hi, block), body, init)

    sums, comp, table = jax.lax.cond(finite, lambda: walk(False), lambda: walk(True))
    return jnp.stack([*sums, *comp]), ms[0], _ops.untally(table, dump + 1)[:dump]


def host_view(x: Any) -> np.ndarray:
    """A CPU array's values as one NumPy axis, no copy (DLPack)."""
    return np.from_dlpack(x).reshape(-1)


def stats(members: list, bins: int, compiled: Any) -> dict:
    """`summary_blocks.grouped_stats` of `members` (concrete CPU arrays that are `usable`),
    as NumPy (a member per row); `compiled(key)` gives the compiled programs of `key`."""
    views = [host_view(x) for x in members]
    acc = views[0].dtype
    c = chunk_for(0)
    plans = []  # per member: its chunks (views; a short array copied into one) and bounds
    for v in views:
        sched = schedule(v.size, c)
        if v.size < c:
            buf = np.zeros(c, acc)  # (a new buffer each: the programs read it in place)
            buf[: v.size] = v
            plans.append(([buf], [np.asarray([0, v.size], np.int32)]))
        else:
            chunks = [v[s : s + c] for s, _, _ in sched]
            plans.append((chunks, [np.asarray([lo, hi], np.int32) for _, lo, hi in sched]))
    run = compiled(key("first", c, acc, bins))
    firsts = [[run(x, b) for x, b in zip(*plan, strict=True)] for plan in plans]
    k = len(views)
    vmin, vmax, shift = np.zeros(k, acc), np.zeros(k, acc), np.zeros(k, acc)
    cnt = np.zeros(k, np.int32)
    fin: list[list[bool]] = []
    for j, outs in enumerate(firsts):
        f = np.stack([np.asarray(o) for o in outs])
        mn, mx = f[:, 0].min(), f[:, 1].max()
        cnt[j] = int(f[:, 4].astype(np.int64).sum())
        have = mn <= mx
        vmin[j], vmax[j] = (mn, mx) if have else (0, 0)
        total = f[:, 2].sum(dtype=acc)
        mean = total / acc.type(max(f[:, 3].sum(), 1))
        shift[j] = np.clip(mean if np.isfinite(total) else 0, vmin[j], vmax[j])
        fin.append([bool(x) for x in f[:, 5]])
    seconds = []
    run = compiled(key("second", c, acc, bins))
    for j, (chunks, bounds) in enumerate(plans):
        params = np.asarray([vmin[j], vmax[j], shift[j]], acc)
        carry: Any = np.zeros(4, acc)
        tables = []
        for x, b, ok in zip(chunks, bounds, fin[j], strict=True):
            carry, ms, table = run(x, np.asarray([b[0], b[1], ok], np.int32), params, carry)
            tables.append(table)
        seconds.append((carry, ms, tables))
    n_lin, n_log = bins + 3, 2 * _ops.LOG_SLOTS
    c1, c2, ms_all = np.zeros(k, acc), np.zeros(k, acc), np.zeros(k, acc)
    joint = np.zeros((k, n_lin * n_log), np.int64)
    with np.errstate(all="ignore"):
        for j, (carry, ms, tables) in enumerate(seconds):
            t = np.asarray(carry)
            c1[j], c2[j] = (np.where(np.isfinite(t[i]), t[i] + t[i + 2], t[i]) for i in (0, 1))
            ms_all[j] = np.asarray(ms)
            for table in tables:
                joint[j] += np.asarray(table)
    joint = joint.reshape(k, n_lin, n_log)
    lin, log = joint.sum(2).astype(np.int32), joint.sum(1).astype(np.int32)
    return dict(count=cnt, min=vmin, max=vmax, c1=c1, c2=c2, shift=ms_all, lin=lin, log=log)
