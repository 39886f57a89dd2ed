"""Summaries of every captured array, grouped, computed and packed in the program.

XLA compile time grows with the number of distinct summary computations (each
~400 ops), so small arrays of ANY shapes and dtypes (per accumulation dtype) are
summarised in one segmented computation (`_segmented`: rows of `SEGMENT_ROW`
values, NaN padding taken off ``nan``): on a Flax NNX MLP with 10 distinct probe
shapes the summaries compiled in 3.4 s instead of 21 s. Small per-iteration
captures are stacked by shape and summarised in one batched computation. On a CPU, arrays of more than
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

import dataclasses
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import summary as _summary
from .. import summary_ops as _ops
from .packing import Packed, pack

#: On a CPU, arrays larger than this are summarised alone, never copied into a stack.
STACK_MAX_ELEMENTS = 1 << 16
#: A stack never holds more than this (larger groups are cut into several stacks).
STACK_MAX_BYTES = 1 << 28
#: Outermost `Site.axes` entries that are iterations (per-iteration statistics).
ITERATION_AXES = ("scan", "while")
#: Arrays of at most this many elements are summarised in one segmented layout.
SEGMENT_MAX_ELEMENTS = STACK_MAX_ELEMENTS
#: Row width of the segmented layout (`_segmented`): each array pads to whole rows.
SEGMENT_ROW = 512


@dataclass(frozen=True)
class Regroup:
    """Static: which (group, row) of the summaries each array leaf is (row None: alone)."""

    treedef: Any  # of the values tree (None leaves kept)
    where: tuple[tuple[int, int | None] | None, ...]
    # Per leaf summarised in a segmented group: its (shape, dtype, is_complex).
    static: tuple[tuple[tuple[int, ...], str, bool] | None, ...] = ()

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
        for i, st in enumerate(self.static):
            if st is not None:
                shape, dtype, is_complex = st
                leaves[i] = dataclasses.replace(
                    leaves[i], shape=shape, dtype=dtype, is_complex=is_complex
                )
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


def _segmented(leaves: list, bins: int) -> Any:
    """A stacked `Summary` of `leaves` (any shapes, one accumulation dtype), computed by
    `summary_ops.segment_stats` over their values laid out in rows of `SEGMENT_ROW`
    (NaN padding, whose count is taken off ``nan``). Static fields are the stack's;
    `Regroup` gives each member its own shape and dtype."""
    parts, rows, pads = [], [], []
    for leaf in leaves:
        v = jnp.ravel(_summary._values(jnp.asarray(leaf)))
        pad = (-v.size) % SEGMENT_ROW or (SEGMENT_ROW if v.size == 0 else 0)
        parts += [v, jnp.full(pad, jnp.nan, v.dtype)] if pad else [v]
        rows.append((v.size + pad) // SEGMENT_ROW)
        pads.append(pad)
    flat = jnp.concatenate(parts) if len(parts) > 1 else parts[0]
    seg = np.repeat(np.arange(len(leaves), dtype=np.int32), rows)
    stats = _ops.segment_stats(flat.reshape(-1, SEGMENT_ROW), seg, len(leaves), bins)
    stats["nan"] = stats["nan"] - jnp.asarray(pads, jnp.int32)
    return _summary.Summary(
        **stats,
        per_iteration=None,
        shape=(),
        dtype=str(flat.dtype),
        is_complex=False,
        bins=bins,
    )


def summarize_packed(values: Any, meta: Any, bins: int, axes: dict | None = None) -> Packed:
    """Summarise every array leaf of `values` (`{entry: {mode: tree}}`, None leaves stay
    None), pack them with the raw `meta` arrays; `Packed.unpack()` returns
    `(summaries, meta)`. `axes` maps entry → mode → `Site.axes`.

    Every small array (at most `SEGMENT_MAX_ELEMENTS`, not on an explicit mesh, whose
    layout flattening would change) without per-iteration statistics joins one
    segmented group per accumulation dtype (`_segmented`): a program compiles one
    summary for all of them, whatever their shapes (one per shape compiled for
    seconds each). Others are stacked by shape, or summarised alone."""
    axes = axes or {}
    cpu = jax.default_backend() == "cpu"
    flat, treedef = jax.tree_util.tree_flatten_with_path(values, is_leaf=lambda x: x is None)
    groups: dict[tuple, list[int]] = {}
    rows: dict[int, bool] = {}
    filled: dict[tuple, int] = {}  # bytes in the open stack of each shape and dtype
    opened: dict[tuple, int] = {}  # which leaf opened that stack (names it)
    static: list[tuple[tuple[int, ...], str, bool] | None] = [None] * len(flat)
    for i, (path, leaf) in enumerate(flat):
        if leaf is None:
            continue
        rows[i] = _per_iteration(path, axes) and jnp.ndim(leaf) >= 1
        dtype = jnp.result_type(leaf)
        nbytes = jnp.size(leaf) * dtype.itemsize
        if (cpu and jnp.size(leaf) > STACK_MAX_ELEMENTS) or nbytes > STACK_MAX_BYTES:
            groups[("alone", i)] = [i]
            continue
        if not rows[i] and jnp.size(leaf) <= SEGMENT_MAX_ELEMENTS and not _ops.replicated(leaf):
            acc, is_complex = _summary._value_dtype(dtype)
            static[i] = (tuple(jnp.shape(leaf)), str(dtype), is_complex)
            kind = ("segments", np.dtype(acc).name)
            nbytes = (jnp.size(leaf) + SEGMENT_ROW) * np.dtype(acc).itemsize
        else:
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
        if key[0] == "segments":
            out.append(_segmented([flat[i][1] for i in idx], bins))
        else:
            stack = jnp.stack([flat[i][1] for i in idx])
            out.append(_summary.summarize_stack(stack, bins=bins, per_iteration=per_it))
        for j, i in enumerate(idx):
            where[i] = (g, j)
    packed = pack({"groups": out, "meta": meta})
    return Packed(packed.buffers, packed.layout, Regroup(treedef, tuple(where), tuple(static)))
