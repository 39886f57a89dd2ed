"""One row per element for a `sow` inside `jax.lax.map(f, xs, batch_size=B)`.

JAX runs such a map as a `scan` over `n` chunks of `B` rows, `vmap(f)` in its body,
then `vmap(f)` once more on the `r` remaining rows (`_compat.lax_map_batching`). A sow
in `f` is then two `sow` calls: one captured as `(n, B, ...)` (chunk × row), one as
`(r, ...)`. The README promises for `lax.map` one row per element, row `i` for
`xs[i]`, as a map without `batch_size` gives: `rows_in_order` flattens the chunks and
appends the remainder, as `lax.map` concatenates its results.

Strict: only a sow whose innermost vmap is `lax.map`'s (its `Site.vmapped`) is
changed, the others (a user's `vmap` around the `lax.map`, `m` of them) outside it, alike
for every key of the call; and a chunk and a remainder are joined only when they are one
`sow` line's consecutive calls with like keys, axes and trailing shapes. The outer vmaps'
axes stay where a map without `batch_size` has them, after the rows: chunks come as
`(n, V.., B, ...)` and the remainder as `(V.., r, ...)`, joined `(n*B + r, V.., ...)`.
Anything else (a user's vmap inside `f`, a `jacrev`'s on the cotangents only, a `cond`'s
`taken` flags) is left as the program captured it.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import jax.numpy as jnp

from .primitive import RESERVED_TAG_PREFIX
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
    alike = {k for k, caps in by_call.items() if len({c.site.vmapped for c in caps}) == 1}
    chunks = {k for k in alike if all(_is_chunked(c) for c in by_call[k])}
    rests = {k for k in alike if all(_is_rest(c) for c in by_call[k])}
    pairs = _pairs(by_call, chunks, rests)  # {chunk call: rest call}
    joined = set(pairs.values())
    out = []
    for c in captures:
        call = c.site.call
        if call in chunks:
            rest = pairs.get(call)
            out.append(_joined(c, None if rest is None else _same_key(by_call[rest], c)))
        elif call in rests and call not in joined:
            rows = [_rest_rows(c, v) for v in c.values]
            out.append(Capture(replace(c.site, axes=(*c.site.axes, MAP_AXIS)), rows))
        elif call not in joined:
            out.append(c)
    return out


def _outer(c: Capture, innermost: tuple[str, ...]) -> int | None:
    """How many vmaps batched `c` around `lax.map`'s (`innermost`, its label), when that
    is the innermost and the others are plain vmaps; None otherwise."""
    *outer, inner = c.site.vmapped or ("",)
    return len(outer) if (inner,) == innermost and all(v == "vmap" for v in outer) else None


def _is_chunked(c: Capture) -> bool:
    """A chunk capture as the scan stacks it: `lax.map`'s vmap innermost, the map's scan
    axis last of the site's axes, the outer vmaps' axes and then the chunk's rows right
    after it, no metadata (a `cond`'s or loop's)."""
    k, m = len(c.site.axes) - 1, _outer(c, CHUNKS)
    return (
        m is not None
        and k >= 0
        and c.site.axes[-1] == MAP_AXIS
        and not c.meta
        and all(jnp.ndim(v) >= k + 2 + m for v in c.values)
    )


def _is_rest(c: Capture) -> bool:
    m = _outer(c, REST)
    return (
        m is not None and not c.meta and all(jnp.ndim(v) > len(c.site.axes) + m for v in c.values)
    )


def _rest_rows(rest: Capture, v):
    """A remainder's value with its rows where the map's axis goes (before the outer
    vmaps' axes)."""
    k, m = len(rest.site.axes), _outer(rest, REST) or 0
    return jnp.moveaxis(v, k + m, k)


def _line(caps: list[Capture]) -> tuple:
    s = caps[0].site
    # (a stage's probe is named by its node, one per program: its two halves' equations
    # may say different lines, a jitted `f` the map's inside the scan and none apart)
    own = str(s.tag).startswith(RESERVED_TAG_PREFIX)
    return (s.name, s.tag, None if own else s.location)


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
    k, m = len(b.axes), _outer(chunk, CHUNKS)
    if m != _outer(rest, REST):
        return False
    return all(
        jnp.shape(x)[:k] == jnp.shape(y)[:k]
        and jnp.shape(x)[k + 1 : k + 1 + m] == jnp.shape(y)[k : k + m]
        and jnp.shape(x)[k + 2 + m :] == jnp.shape(y)[k + 1 + m :]
        for x, y in zip(chunk.values, rest.values, strict=True)
    )


def _joined(chunk: Capture, rest: Capture | None) -> Capture:
    """The chunk capture's values as rows (`(n, V.., B, ...)` → `(n*B, V.., ...)` at the
    map's axis), the remainder's rows appended."""
    k, m = len(chunk.site.axes) - 1, _outer(chunk, CHUNKS) or 0
    values = []
    for i, v in enumerate(chunk.values):
        v = jnp.moveaxis(v, k + 1 + m, k + 1)
        shape = jnp.shape(v)
        rows = jnp.reshape(v, (*shape[:k], shape[k] * shape[k + 1], *shape[k + 2 :]))
        if rest is not None:
            rows = jnp.concatenate([rows, _rest_rows(rest, rest.values[i])], axis=k)
        values.append(rows)
    return Capture(chunk.site, values)
