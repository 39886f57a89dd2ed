"""One row per element for a `sow` inside `jax.lax.map(f, xs, batch_size=B)`.

JAX runs such a map as a `scan` over `n` chunks of `B` rows, `vmap(f)` in its body,
then `vmap(f)` once more on the `r` remaining rows (`_compat.lax_map_batching`). A sow
in `f` is then two `sow` calls: one captured as `(n, B, ...)` (chunk × row), one as
`(r, ...)`. The README promises for `lax.map` one row per element, row `i` for
`xs[i]`, as a map without `batch_size` gives: `rows_in_order` flattens the chunks and
appends the remainder, as `lax.map` concatenates its results.

Strict: only a sow whose one and only vmap is `lax.map`'s (its `Site.vmapped`) is
changed, and a chunk and a remainder are joined only when they are one `sow` line's
consecutive calls with like keys, axes and trailing shapes. Anything else (a user's
vmap too, a `jacrev`, a `cond`'s `taken` flags) is left as the program captured it.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import jax.numpy as jnp

from .record import Capture

CHUNKS = ("lax.map:chunks",)
REST = ("lax.map:rest",)
#: the stacking axis a map's rows get, as a `lax.map` without `batch_size` (a scan)
MAP_AXIS = "scan"


def rows_in_order(captures: list[Capture]) -> list[Capture]:
    """`captures` with each `lax.map` chunk capture flattened to rows and joined by its
    remainder's capture (which leaves the list), in program order otherwise. Decided
    per `sow` call, all its keys together: a call half changed (a `jacrev`'s vmap on
    the cotangents only) would mix layouts, so such a call is left whole."""
    by_call: dict[int, list[Capture]] = {}
    for c in captures:
        if c.site.call >= 0:
            by_call.setdefault(c.site.call, []).append(c)
    chunks = {k for k, caps in by_call.items() if all(_is_chunked(c) for c in caps)}
    rests = {k for k, caps in by_call.items() if all(_is_rest(c) for c in caps)}
    pairs = _pairs(by_call, chunks, rests)  # {chunk call: rest call}
    joined = set(pairs.values())
    out = []
    for c in captures:
        call = c.site.call
        if call in chunks:
            rest = pairs.get(call)
            out.append(_joined(c, None if rest is None else _same_key(by_call[rest], c)))
        elif call in rests and call not in joined:
            out.append(Capture(replace(c.site, axes=(*c.site.axes, MAP_AXIS)), c.values))
        elif call not in joined:
            out.append(c)
    return out


def _is_chunked(c: Capture) -> bool:
    """A chunk capture as the scan stacks it: `lax.map`'s vmap alone, the map's scan
    axis last of the site's axes, the chunk's rows right after it, no metadata (a
    `cond`'s or loop's)."""
    k = len(c.site.axes) - 1
    return (
        c.site.vmapped == CHUNKS
        and k >= 0
        and c.site.axes[-1] == MAP_AXIS
        and not c.meta
        and all(jnp.ndim(v) >= k + 2 for v in c.values)
    )


def _is_rest(c: Capture) -> bool:
    return c.site.vmapped == REST and not c.meta


def _line(caps: list[Capture]) -> tuple:
    s = caps[0].site
    return (s.name, s.tag, s.location)


def _same_key(caps: list[Capture], like: Capture) -> Capture:
    return next(c for c in caps if c.site.mode == like.site.mode)


def _pairs(by_call: dict[int, list[Capture]], chunks: set, rests: set) -> dict[int, int]:
    """{chunk call: its remainder's call}: a remainder joins the call of the same `sow`
    line just before it (`lax.map` traces `f` for the chunks, then at once for the
    remainder), if that is a chunk call with the same keys, axes and trailing shapes."""
    by_line: dict[tuple, list[int]] = {}
    for k in sorted(by_call):
        by_line.setdefault(_line(by_call[k]), []).append(k)
    pairs = {}
    for calls in by_line.values():
        for before, rest in itertools.pairwise(calls):
            if before in chunks and rest in rests and _fits(by_call[before], by_call[rest]):
                pairs[before] = rest
    return pairs


def _fits(chunk: list[Capture], rest: list[Capture]) -> bool:
    modes = {c.site.mode: c for c in rest}
    if sorted(c.site.mode for c in chunk) != sorted(modes):
        return False
    return all(_fits_one(c, modes[c.site.mode]) for c in chunk)


def _fits_one(chunk: Capture, rest: Capture) -> bool:
    a, b = chunk.site, rest.site
    if (a.treedef, a.leaves, a.axes[:-1]) != (b.treedef, b.leaves, b.axes):
        return False
    k = len(b.axes)
    return all(
        jnp.shape(x)[:k] == jnp.shape(y)[:k] and jnp.shape(x)[k + 2 :] == jnp.shape(y)[k + 1 :]
        for x, y in zip(chunk.values, rest.values, strict=True)
    )


def _joined(chunk: Capture, rest: Capture | None) -> Capture:
    """The chunk capture's values as rows (`(n, B, ...)` → `(n*B, ...)` at the map's
    axis), the remainder's rows appended."""
    k = len(chunk.site.axes) - 1
    values = []
    for i, v in enumerate(chunk.values):
        shape = jnp.shape(v)
        rows = jnp.reshape(v, (*shape[:k], shape[k] * shape[k + 1], *shape[k + 2 :]))
        if rest is not None:
            rows = jnp.concatenate([rows, rest.values[i]], axis=k)
        values.append(rows)
    return Capture(chunk.site, values)
