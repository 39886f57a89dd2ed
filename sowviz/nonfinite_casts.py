"""A cotangent that overflowed in the backward of a widening cast (float16 -> float32).

A mixed-precision policy (`jmp`, Haiku's `hk.mixed_precision.set_policy`) computes a
module in float16 and casts its output to float32. The backward pass casts that
output's float32 cotangent back to float16: with a large loss scale it is past
float16's range and becomes ±Inf there. The cast is drawn as an edge, no stage, so the
origin rule of `sowviz.nonfinite` blamed the next stage's backward (`integer_pow` of
`y ** 2`, whose float32 backward is finite) or the bias `add` inside the layer. The
stage whose output was cast (the layer, `linear_2`) is the origin: its float16 output's
cotangent is where the Inf was born.

Read off the graph alone: an edge's dtype is the type its reader reads, a node's
`shapes` the type it made, so a reader reading a wider float than its producer made
reads it through a cast (`Edge.ends` names the deepest producer and reader).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp

#: the marker `nonfinite_locate` reads: this backward origin is a cast's, whose
#: equation is the cast (no other equation to look for)
CAST_BACKWARD = "born in the backward of the cast of "

_DTYPE = re.compile(r"^([a-z0-9_]+)\[")


@dataclass(frozen=True)
class NarrowedCotangent:
    """`producer` (a node) made a `narrow` float value that `readers` read as `wide`: the
    backward pass cast their `wide` cotangent back to `narrow` at `producer`'s output."""

    producer: str
    narrow: str
    wide: str
    readers: tuple[str, ...]


def _float_bits(dtype: str) -> int:
    """A float dtype's width in bits (0: not a float, or unknown)."""
    try:
        dt = jnp.dtype(dtype)  # (JAX's: `bfloat16` and the float8 types too)
    except TypeError:
        return 0
    return dt.itemsize * 8 if jnp.issubdtype(dt, jnp.floating) else 0


def _made_dtype(node: Any) -> str | None:
    """The float dtype `node` makes (its first output's), from `Node.shapes`."""
    for s in getattr(node, "shapes", ()) or ():
        m = _DTYPE.match(s)
        if m and _float_bits(m.group(1)):
            return m.group(1)
    return None


def widened_reads(graph: Any) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """Per producer node read through a widening float cast: (its dtype, the wider dtype
    read, the readers reading it so)."""
    nodes = {n.id: n for n in graph.nodes}
    out: dict[str, tuple[str, str, tuple[str, ...]]] = {}
    for e in graph.edges:
        # (a saved model's edges, `nonfinite_json.JsonEdge`, say no dtype: no cast seen)
        wide_bits = _float_bits(getattr(e, "dtype", ""))
        if not wide_bits:
            continue
        for p, r in getattr(e, "ends", ()) or ((e.source, e.target),):
            narrow = _made_dtype(nodes.get(p)) if p in nodes else None
            if narrow is None or _float_bits(narrow) >= wide_bits:
                continue
            _, _, readers = out.get(p, (narrow, e.dtype, ()))
            if r not in readers:
                readers = (*readers, r)
            out[p] = (narrow, e.dtype, readers)
    return out


def narrowed_cotangent(
    graph: Any,
    flags: Mapping[str, Any],
    reach: str,
    cands: Iterable[str],
    probed: set[str],
    ancestors: Any,
) -> NarrowedCotangent | None:
    """Whether the non-finite cotangent of `reach` was born in a widening cast's backward:
    `reach`'s own value read wider by a candidate (the count re-run of `locate`, every
    equation probed), or the first candidate an unprobed equation (its cotangent unseen:
    the bias `add` of a layer) whose value is read wider by readers whose cotangent is
    finite. Only where the value itself is finite (else the forward pass explains it)."""
    widened = widened_reads(graph)
    cands = list(cands)
    nodes = {n.id: n for n in graph.nodes}

    def seen_finite(p: str, wide: str) -> bool:
        # The stage around `p` whose output is the cast value (Haiku's module, the layer
        # whose probe sits past the policy's cast) holds a finite cotangent: the cast's
        # backward made the Inf, not a reader's (`jnp.log(h.astype(f32))` at 0: its
        # float32 cotangent is the Inf already)
        return any(
            a in probed and _made_dtype(nodes[a]) == wide and not getattr(flags.get(a), "bwd", 0)
            for a in ancestors(p)
        )

    def value_bad(n: str) -> bool:
        f = flags.get(n)
        return bool(f is not None and f.fwd_value)

    def within(r: str, c: str) -> bool:
        return r == c or c in ancestors(r)

    if reach in widened and not value_bad(reach):
        narrow, wide, readers = widened[reach]
        if seen_finite(reach, wide) and any(within(r, c) for r in readers for c in cands):
            return NarrowedCotangent(reach, narrow, wide, readers)
    if cands and cands[0] not in probed and cands[0] in widened and not value_bad(cands[0]):
        narrow, wide, readers = widened[cands[0]]
        if seen_finite(cands[0], wide):
            return NarrowedCotangent(cands[0], narrow, wide, readers)
    return None


def cast_message(stage: str, cast: NarrowedCotangent) -> str:
    """What a backward origin in a widening cast's backward says (`stage`: the quoted
    stage whose output was cast, `stage_name`)."""
    top = float(jnp.finfo(cast.narrow).max)
    return (
        f"{CAST_BACKWARD}the output of {stage}, {cast.narrow} to {cast.wide} (a "
        f"mixed-precision policy's, or an `.astype`): its {cast.wide} cotangent, cast back "
        f"to {cast.narrow}, is past {cast.narrow}'s range (±{top:g}). With loss scaling "
        f"(`jmp.DynamicLossScale`) that is the overflow the scale is lowered for and the "
        f"step skipped; else lower the loss scale, or compute this stage in {cast.wide}"
    )
