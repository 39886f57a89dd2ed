"""Summaries of every captured array, grouped, computed and packed in the program.

Models repeat shapes (an activation per layer): small arrays of one shape and
dtype are stacked and summarised in one batched computation, so the number of
XLA operations does not grow with the number of probes (a 250-layer model
compiles in seconds, not a minute). On a CPU, arrays of more than
`STACK_MAX_ELEMENTS` are summarised one by one instead: stacking copies its
members into one new buffer, a full pass over them that measured slower than
one summary each (on a GPU the opposite: one launch per op dominates, and a
stack of 16 arrays of 128K elements summarised 5x faster than 16 summaries);
on any backend a stack holds at most `STACK_MAX_BYTES`, which bounds the extra
memory the copy takes. The summaries leave the program packed into one
buffer per dtype; the host splits them per array after the one transfer
(`Regroup.apply`, NumPy indexing).

A capture stacked by an enclosing scan or while loop (outermost of its
`Site.axes` is ``"scan"`` or ``"while"``) also gets per-iteration statistics
over that axis (`Summary.per_iteration`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from .. import summary as _summary
from .packing import Packed, pack

#: On a CPU, arrays larger than this are summarised alone, never copied into a stack.
STACK_MAX_ELEMENTS = 1 << 16
#: A stack never holds more than this (larger groups are cut into several stacks).
STACK_MAX_BYTES = 1 << 28
#: Outermost `Site.axes` entries that are iterations (per-iteration statistics).
ITERATION_AXES = ("scan", "while")


@dataclass(frozen=True)
class Regroup:
    """Static: which (group, row) of the summaries each array leaf is (row None: alone)."""

    treedef: Any  # of the values tree (None leaves kept)
    where: tuple[tuple[int, int | None] | None, ...]

    def apply(self, tree: dict) -> Any:
        groups = tree["groups"]
        leaves = [
            None
            if w is None
            else groups[w[0]]
            if w[1] is None
            else jax.tree_util.tree_map(lambda a, j=w[1]: a[j], groups[w[0]])
            for w in self.where
        ]
        values = jax.tree_util.tree_unflatten(self.treedef, leaves)
        return values, tree["meta"]


def _per_iteration(path: tuple, axes: dict) -> bool:
    """Whether the leaf at `path` (``(DictKey(entry), DictKey(mode), ...)``) is stacked
    by an iteration construct, per `axes` (`api.assemble`'s record)."""
    if len(path) < 2:
        return False
    entry, mode = getattr(path[0], "key", None), getattr(path[1], "key", None)
    site_axes = axes.get(entry, {}).get(mode, ())
    return bool(site_axes) and site_axes[0] in ITERATION_AXES


def summarize_packed(values: Any, meta: Any, bins: int, axes: dict | None = None) -> Packed:
    """Summarise every array leaf of `values` (`{entry: {mode: tree}}`, None leaves stay
    None), pack them with the raw `meta` arrays; `Packed.unpack()` returns
    `(summaries, meta)`. `axes` maps entry → mode → `Site.axes`."""
    axes = axes or {}
    cpu = jax.default_backend() == "cpu"
    flat, treedef = jax.tree_util.tree_flatten_with_path(values, is_leaf=lambda x: x is None)
    groups: dict[tuple, list[int]] = {}
    rows: dict[int, bool] = {}
    filled: dict[tuple, int] = {}  # bytes in the open stack of each shape and dtype
    opened: dict[tuple, int] = {}  # which leaf opened that stack (names it)
    for i, (path, leaf) in enumerate(flat):
        if leaf is None:
            continue
        rows[i] = _per_iteration(path, axes) and jnp.ndim(leaf) >= 1
        dtype = jnp.result_type(leaf)
        nbytes = jnp.size(leaf) * dtype.itemsize
        if (cpu and jnp.size(leaf) > STACK_MAX_ELEMENTS) or nbytes > STACK_MAX_BYTES:
            groups[("alone", i)] = [i]
            continue
        kind = (jnp.shape(leaf), dtype, rows[i])
        if kind not in filled or filled[kind] + nbytes > STACK_MAX_BYTES:
            filled[kind], opened[kind] = 0, i
        filled[kind] += nbytes
        groups.setdefault((*kind, opened[kind]), []).append(i)
    where: list[tuple[int, int | None] | None] = [None] * len(flat)
    out = []
    for g, (key, idx) in enumerate(groups.items()):
        per_it = rows[idx[0]]
        if key[0] == "alone":
            out.append(_summary.summarize(flat[idx[0]][1], bins=bins, per_iteration=per_it))
            where[idx[0]] = (g, None)
            continue
        stack = jnp.stack([flat[i][1] for i in idx])
        out.append(_summary.summarize_stack(stack, bins=bins, per_iteration=per_it))
        for j, i in enumerate(idx):
            where[i] = (g, j)
    packed = pack({"groups": out, "meta": meta})
    return Packed(packed.buffers, packed.layout, Regroup(treedef, tuple(where)))
