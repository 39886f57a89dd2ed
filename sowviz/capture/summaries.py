"""Summaries of every captured array, grouped, computed and packed in the program.

XLA compile time grows with the number of distinct summary computations (each ~400
ops), so small arrays of ANY shapes and dtypes (per accumulation dtype) are
summarised in one segmented computation (`_segmented`: rows of `row_width` values,
NaN padding taken off ``nan``): on a Flax NNX MLP with 10 distinct probe shapes the
summaries compiled in 3.4 s instead of 21 s. Small per-iteration captures are
stacked by loop length, whatever their shapes (`_iterated`: NaN-padded per iteration
to the widest), and summarised in one batched computation. On a CPU, arrays of more
than `STACK_MAX_ELEMENTS` are not stacked: stacking copies its members into one new
buffer, a full pass over them that measured slower than one summary each (on a GPU
the opposite: one launch per op dominates, and a stack of 16 arrays of 128K elements
summarised 5x faster than 16 summaries). They are summarised in blocks, in place, by
one loop per group of at most `GROUP_MAX_BYTES` (`_blocked`; 27 arrays of 1-2M
elements compiled in 4.6 s one summary each, 0.9-1.5 s in groups of at most 256 MB);
on any backend a stack holds at most `STACK_MAX_BYTES`, which bounds the extra
memory the copy takes. A program run at every step (`Monitor`,
`save_intermediates`) already takes arrays of `MIN_GROUPED` (32K) elements into
the blocks, which run faster than the layout; `inspect` only those past
`STACK_MAX_ELEMENTS` (`MIN_GROUPED_ONCE`), since each group costs compile time
and its first call pays for all of it. The summaries leave the program packed into one
uint32 buffer (`packing`); the host splits them per array after the one
transfer (`Regroup.apply`, NumPy indexing).

`inspect`, `show` and `Monitor` compile the segmented summaries as a SECOND
program (`finish`), fed by the capture program's laid-out rows (`Rows`: the
small arrays, copied once, as the in-program layout copies them). Its inputs
are rounded up to a size class (`bucket`), so one compiled program serves every
mode and every model with like sizes; it compiles in a thread (`precompile`)
while the capture program compiles, and a combined program compiled slower than
the two apart (XLA's passes grow faster than linearly in the program's size).
`inspect` leaves even the layout to a program of its own (`Parts`, laid out by
`_lay_out`, keyed by the arrays' shapes): a capture program compiles again at
every edit of the function, the layout program once per shapes. Its layouts take
coarse size classes (`coarse_bucket`: powers of two, at least `ONCE_MIN_ROWS`
rows and `ONCE_MIN_MEMBERS` members), and on a CPU its arrays of up to
`ONCE_SEGMENT_MAX_ELEMENTS` join them instead of a group of blocks (whose program
is keyed by its members' shapes), so the shared program compiled for one model
serves the next: an Equinox MLP of another width took 4.0-5.9x of its plain first
call at its first `inspect`, compiling the summary program again, and takes
1.3-1.7x. Its per-iteration stacks likewise (`_stacked_iterations`: iterations,
width and members, the padded iterations' statistics cut off by `Regroup`): an RK4
`lax.scan` of another length took 6.1-6.5x, and takes 1.7x. Its members
are the capture program's values themselves, so an output that is also a
result or an input is no copy either (`_program.shared`). On the 1,000-equation
program the capture program then compiled in 0.37-0.49 s instead of 0.56-0.59 s,
and the first `inspect` of an edited function took 1.08x of plain instead of
1.45-1.49x.
On a CPU backend, whose arrays are host memory, NumPy lays out float arrays
instead (`_host_layout`, `HOST_LAYOUT`): the same rows, and no layout program
for a new model's shapes to compile (0.05-0.25 s beside its capture program, on
two cores the capture program's compile slowed by as much).
On a CPU the large arrays' groups go to a third program the same way (`Blocks`:
the arrays themselves, not copied; keyed by their shapes, so it is
kept apart from the shared one), unless they hold more than
`DEFER_BLOCKS_MAX_BYTES` in all: then they are summarised where they are, and
no large activation outlives the capture program for its summary. All are
kept on disk (`sowviz._disk_cache`): the 4x1024 MLP's first `inspect` in a new
process went 3.6-3.9x -> 1.8-2.2x of plain. `inspect`'s groups of float arrays
(`Blocks.chunked`) are not given to that program: `finish` walks them from the host
in chunks of one size (`summary_chunks`, NumPy views of the arrays, no copy), by two
programs keyed by the chunk size, dtype and bins only, so a user's next model of
other widths loads them from disk where it compiled the group program again (the
4x960 MLP after the 4x1024: 1.3 s of its 2.1 s first `inspect`). The per-iteration
stacks go to a program of their own too (`Iterated`, rounded up to a size class of
members and width): in the capture program their summary compiled for 0.5 s, and the
first `inspect` of an edited RK4 `lax.scan` took 0.80 s against 0.24 s with it apart
(plain JAX: 0.13 s).

A capture stacked by an enclosing scan or while loop (outermost of its
`Site.axes` is ``"scan"`` or ``"while"``) also gets per-iteration statistics
over that axis (`Summary.per_iteration`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat, _concat, _disk_cache, _wire
from .. import summary as _summary
from .. import summary_blocks as _blocks
from .. import summary_chunks as _chunks
from .. import summary_ops as _ops
from ..summary_data import StackRows, SummaryRow, stack_rows
from .packing import Packed, View, as_view, pack, pack_host, view_of
from .tallied import Tallied, TalliedRows
from .tallied import finished as finished_stacks

#: On a CPU, arrays larger than this are summarised alone, never copied into a stack.
STACK_MAX_ELEMENTS = 1 << 16
#: A stack never holds more than this (larger groups are cut into several stacks).
STACK_MAX_BYTES = 1 << 28
#: Outermost `Site.axes` entries that are iterations (per-iteration statistics).
ITERATION_AXES = ("scan", "while")
#: On a CPU, larger arrays (not on a mesh, without per-iteration statistics) of one
#: accumulation dtype are summarised in blocks by one loop per group
#: (`summary_blocks.grouped_stats`), a group holding at most this many bytes: the
#: loop needs every member alive at once, so this bounds the memory it adds (as
#: `STACK_MAX_BYTES` bounds a stack's copy).
GROUP_MAX_BYTES = 1 << 28
#: ... from this many elements (smaller ones join the segmented layout), in blocks of
#: 32K or 64K elements (one group per block size). From 32K the blocks' unmasked pass
#: beats the layout (48 arrays of 32K elements: 1.5 ms against 2.4 ms for the segmented
#: summary, before the layout's copy; 96 of 8K: 3.4 against 2.2 ms), so a program that
#: runs at every step (`Monitor`, `save_intermediates`) groups them from here ...
MIN_GROUPED = 1 << 15
#: ... and `inspect`, whose first call pays for every compile, only past 64K: each group
#: is a loop of its own in a program keyed by shapes (with its 32K activations grouped,
#: an 8x256 MLP's first `inspect` took 1.96 s instead of 0.56 s, and 0.29 s instead of
#: 0.18 s in a new process with the programs on disk).
MIN_GROUPED_ONCE = STACK_MAX_ELEMENTS + 1
#: `inspect`/`Monitor` leave such groups to a second program (`finish`, keyed by their
#: shapes, compiled beside the capture program and kept on disk: a group's loop
#: compiled for 0.7-0.8 s inside every capture program) when they hold at most this
#: many bytes in all: their members then outlive the capture program until it runs
#: (`inspect_memory`'s 50M-element case, 400 MB of large arrays, deferred anyway:
#: peak memory 1.26x of plain, against 1.17x with its loop in the program).
DEFER_BLOCKS_MAX_BYTES = GROUP_MAX_BYTES
#: Per-iteration captures of at most this many elements share a computation whatever
#: their widths (`_iteration_class`).
ITERATED_SMALL = 1 << 12
#: Deferred per-iteration stacks of at most this many values (once rounded up) are
#: rounded up to a size class (`_stacked_iterations`); larger ones keep their shape.
ITERATED_SIZED_MAX = 1 << 20
#: Arrays of at most this many elements are summarised in one segmented layout.
SEGMENT_MAX_ELEMENTS = STACK_MAX_ELEMENTS
#: Row width of the segmented layout (`_segmented`): each array pads to whole rows. The
#: widest, which most layouts take; many small arrays take a narrower one (`row_width`).
SEGMENT_ROW = 512
#: The row widths a layout can take, narrowest first.
SEGMENT_ROWS = (128, SEGMENT_ROW)
#: A narrower row is taken when it costs at most 1/this of the wider (`row_width`): a
#: layout of another width is a summary program of its own. (Rows of 256 would never
#: be taken: an array of 129-256 values costs 320 at 256, 576 at 512.)
NARROW_GAIN = 2
#: What a row costs the summary beyond its values, in values (`row_width`): on XLA:CPU,
#: 1.58M values as rows of 128 instead of 512 (9,200 rows more) took 0.5-1.1 ms more, at
#: 1.7 ns per value.
ROW_COST = 64
#: `inspect`'s layouts (`Parts`: its first call pays every compile) take coarse size
#: classes, powers of two of at least this many rows and members (`coarse_bucket`), so
#: that the shared summary program compiled for one model serves the next: with the
#: quarter classes of `bucket` a model of other widths compiled it again (0.45 s of an
#: Equinox MLP's 0.57 s first `inspect`, its plain first call 0.13 s). The padding
#: rows are summarised too: the least class, 1,024 rows of 512 values and 256 members,
#: ran in 1.1 ms on XLA:CPU (0.45 ms at 256 rows and 64 members), once per `inspect`.
#: A Monitor's layouts, summarised at every recorded step, keep the quarter classes.
ONCE_MIN_ROWS = 1024
ONCE_MIN_MEMBERS = 256
#: `inspect`'s per-iteration stacks take coarse classes too (`_stacked_iterations`):
#: iterations (up to `summary.row_cap`), width and members, at least these.
ONCE_MIN_ITERATIONS = 16
ONCE_MIN_ITERATED_WIDTH = 16
ONCE_MIN_ITERATED_MEMBERS = 8
#: `inspect` lays out arrays of up to this many elements with the small ones, where a
#: program run at every step groups them (`Blocks`), when all such arrays have at most
#: this many (`_lays_out_large`) ...
ONCE_SEGMENT_MAX_ELEMENTS = 1 << 20
#: ... and hold at most this many bytes in all (the layout copies them; else they are
#: grouped). A group's program is keyed by its members' shapes: an Equinox MLP of
#: width 300 (four arrays of 90K values) compiled one for 0.75 s at its first
#: `inspect`, against a plain first call of 0.15 s.
ONCE_SEGMENT_MAX_BYTES = 1 << 26
#: `inspect`/`Monitor` summarise the segmented groups in a second program (`finish`).
DEFER_SEGMENTS = True
#: ... compiled in a thread while the capture program compiles (`precompile`).
PRECOMPILE = True
#: On a CPU, `inspect`'s groups of large float arrays are walked in chunks from the host
#: (`Blocks.chunked`, `summary_chunks`), by programs its next model finds on disk.
CHUNKED = True
#: On a CPU, `inspect` lays its small float arrays out with NumPy (`_host_layout`),
#: where a program keyed by their shapes would compile for each new model.
HOST_LAYOUT = True


@dataclass(frozen=True)
class Regroup:
    """Static: which (group, row) of the summaries each array leaf is (row None: alone)."""

    treedef: Any  # of the values tree (None leaves kept)
    where: tuple[tuple[int, int | None] | None, ...]
    # Per leaf summarised in a segmented group: its (shape, dtype, is_complex).
    static: tuple[tuple[tuple[int, ...], str, bool] | None, ...] = ()
    # Groups summarised by the second programs (`finish`), in their output order.
    deferred: tuple[int, ...] = ()
    bins: int = 0  # of the deferred summaries
    # Per deferred group: its iterations when padded to a size class (`Iterated.fill`),
    # else None: the per-iteration statistics are cut back to them (`_trimmed`).
    iterations: tuple[int | None, ...] = ()
    # Leaves whose zeros where nothing ran were summarised as NaN (`_values_mask`): the
    # packed tree's "masked" holds, per leaf, how many, in all and per row of axis 0.
    masked: tuple[int, ...] = ()
    # Leaves summarised with their iteration axis moved first (`_iteration_first`):
    # (leaf, its shape as captured), which their summaries show.
    captured: tuple[tuple[int, tuple[int, ...]], ...] = ()
    # Per entry path whose captures enclosing constructs stacked: ((mode, `Site.axes`),
    # ...), put in the entry's meta as ``"axes"`` for `inspect`'s model (`rows`).
    axes: tuple[tuple[tuple, tuple[tuple[str, tuple[str, ...]], ...]], ...] = ()

    def apply(self, tree: dict, *finished: Any, rows: bool = False) -> Any:
        """`(values, meta)`: each value leaf's `Summary`. With `rows`, a member of a
        stack (with NumPy leaves) is a `SummaryRow` instead, for its JSON only."""
        groups = list(tree["groups"])
        done = [summary for part in finished for summary in part]
        trims = self.iterations or (None,) * len(self.deferred)
        for g, summary in zip(self.deferred, done, strict=True):
            groups[g] = summary
        # every stack finished at once: like stacks share their NumPy calls (`finished`)
        groups = finished_stacks(groups)
        for g, real in zip(self.deferred, trims, strict=True):
            if real is not None:
                groups[g] = _trimmed(groups[g], real)
        fixes: dict[int, list[tuple]] = {}  # group -> its members' masked counts
        for i, counts in zip(self.masked, tree.get("masked", ()), strict=True):
            g, j = self.where[i]  # type: ignore[misc]
            fixes.setdefault(g, []).append((j, *counts))
        for g, fix in fixes.items():
            groups[g] = _unmasked(groups[g], fix)
        # Each stacked group cut once: into rows of its members' values (`_columns`), or
        # else flattened and its members cut by index (a tree_map per member was a
        # third of a repeated `inspect` on 1,000 probes).
        flat: dict[int, Any] = {}
        json_rows: dict[int, tuple | None] = {}
        columns: dict[int, list[tuple] | None] = {}
        n_static = len(self.static)

        def row(i: int, g: int, j: int) -> Any:
            if g not in json_rows:
                json_rows[g] = _json_rows(groups[g])
            got = json_rows[g]
            if got is None:
                return member(i, g, j)
            st = self.static[i] if i < n_static else None
            return _summary_row(got[0], j, st or got[1])

        def member(i: int, g: int, j: int) -> Any:
            st = self.static[i] if i < n_static else None
            if g not in columns:
                columns[g] = _columns(groups[g])
            if columns[g] is not None:
                return _member(groups[g], columns[g], j, st)
            if g not in flat:
                flat[g] = jax.tree_util.tree_flatten(groups[g])
            leaves, treedef = flat[g]
            out = jax.tree_util.tree_unflatten(treedef, [a[j] for a in leaves])
            if st is not None:
                # made here for this leaf alone: its static fields are set in place
                # (`dataclasses.replace` made each anew: 0.1 s for 10,000 summaries)
                for name, value in zip(("shape", "dtype", "is_complex"), st, strict=True):
                    object.__setattr__(out, name, value)
            return out

        cut = row if rows else member
        leaves = [
            None if w is None else groups[w[0]] if w[1] is None else cut(i, *w)
            for i, w in enumerate(self.where)
        ]
        for i, shape in self.captured:
            if leaves[i] is not None:
                leaves[i] = _with_shape(leaves[i], shape)
        values = jax.tree_util.tree_unflatten(self.treedef, leaves)
        meta = tree["meta"]
        if rows and self.axes and isinstance(meta, dict):
            meta = {p: dict(m) for p, m in meta.items()}
            for p, per_mode in self.axes:
                if p in meta:
                    meta[p]["axes"] = dict(per_mode)
        return values, meta


def _with_shape(summary: Any, shape: tuple[int, ...]) -> Any:
    """`summary` (a `Summary` or `SummaryRow`) showing `shape`: a copy, as a group's
    summary may stand for several leaves."""
    out = object.__new__(type(summary))
    object.__setattr__(out, "__dict__", {**summary.__dict__, "shape": shape})
    return out


def _json_rows(stack: Any) -> tuple[StackRows, tuple] | None:
    """A stack's `StackRows` (None: not made for it, `stack_rows`) and its static fields
    ``(shape, dtype, is_complex)``, which members without their own take."""
    got = stack_rows(stack)
    return None if got is None else (got, (stack.shape, stack.dtype, stack.is_complex))


def _summary_row(rows: StackRows, j: int, static: tuple) -> SummaryRow:
    """`SummaryRow(rows, j, *static)`, made as `_member` makes a `Summary`: its frozen
    dataclass `__init__` sets each field through `object.__setattr__`, most of the
    Python a member of a 1,000-probe `inspect` ran."""
    out = object.__new__(SummaryRow)
    shape, dtype, is_complex = static
    object.__setattr__(
        out,
        "__dict__",
        {"rows": rows, "index": j, "shape": shape, "dtype": dtype, "is_complex": is_complex},
    )
    return out


def _trimmed(stack: Any, iterations: int) -> Any:
    """A stacked `Summary` with per-iteration statistics of padded iterations (an
    `Iterated` laid out to a size class) cut back to its real `iterations` (all kept:
    a stack is padded only up to `summary.row_cap`)."""
    per = stack.per_iteration
    cut = {
        f.name: getattr(per, f.name)[:, :iterations]
        for f in dataclasses.fields(per)
        if f.name not in ("index", "iterations")
    }
    per = dataclasses.replace(per, **cut, index=tuple(range(iterations)), iterations=iterations)
    return dataclasses.replace(stack, per_iteration=per)


def _unmasked(summary: Any, fixes: list[tuple]) -> Any:
    """`summary` (of a group) with its members' masked values (`_values_mask`: NaN
    where nothing ran) taken off their ``nan`` and off their rows' ``nonfinite``: they
    were no values, and their rows have none (``count`` 0). `fixes`: per member, its
    row `j` (None: the summary is the leaf's alone) and its counts (`_masked_leaf`); each
    field is copied once per group, however many of its members were masked."""
    per = summary.per_iteration
    index = None if per is None else np.asarray(per.index, np.int32)
    nan = _minus(summary.nan, [(j, total) for j, total, _ in fixes])
    if per is None:
        return dataclasses.replace(summary, nan=nan)
    nonfinite = _minus(per.nonfinite, [(j, per_row[index]) for j, _, per_row in fixes])
    return dataclasses.replace(
        summary, nan=nan, per_iteration=dataclasses.replace(per, nonfinite=nonfinite)
    )


def _minus(a: Any, parts: list[tuple[int | None, Any]]) -> Any:
    """`a` less each `v` of `parts` at its row `j` (None: all of `a`): on the host one
    copy (a host buffer is not ours to write), under a trace `.at[j]`."""
    traced = isinstance(a, (jax.Array, jax.core.Tracer))
    a = a if traced else np.array(a)
    for j, v in parts:
        if j is None:
            a = a - v
        elif traced:
            a = a.at[j].add(-v)
        else:
            a[j] -= v
    return a


def _columns(stack: Any) -> list[tuple] | None:
    """A host-side stacked `Summary`'s members as rows of their `_SUMMARY_DATA` values,
    or None (traced, or with per-iteration statistics: cut by `tree_unflatten`). Made
    once per stack (one `zip` of the columns), so a member costs a `dict(zip(...))`:
    the 128 summaries of a 64x64 MLP's step were cut in 0.9 ms by `tree_unflatten`,
    more than their computation."""
    if not isinstance(stack, _summary.Summary) or stack.per_iteration is not None:
        return None
    fields = [getattr(stack, f) for f in _SUMMARY_DATA]
    if not all(isinstance(v, np.ndarray) for v in fields):
        return None
    return list(zip(*fields, strict=True))


def _member(stack: Any, rows: list[tuple], j: int, static: Any) -> Any:
    """Member `j` of the host-side `stack` from its `_columns`, its static fields
    `static` ``(shape, dtype, is_complex)`` or the stack's: what `tree_unflatten` of
    its leaves' rows makes, without a pass through the tree machinery."""
    out = object.__new__(_summary.Summary)
    shape, dtype, is_complex = static or (stack.shape, stack.dtype, stack.is_complex)
    fields = dict(zip(_SUMMARY_DATA, rows[j], strict=True))
    fields.update(
        per_iteration=None, shape=shape, dtype=dtype, is_complex=is_complex, bins=stack.bins
    )
    object.__setattr__(out, "__dict__", fields)
    return out


#: A `Summary`'s array fields but `per_iteration`.
_SUMMARY_DATA = tuple(
    f.name
    for f in dataclasses.fields(_summary.Summary)
    if f.name not in ("per_iteration", "shape", "dtype", "is_complex", "bins")
)


def _per_iteration(path: tuple, axes: dict) -> bool:
    """Whether the leaf at `path` (``(DictKey(entry), DictKey(mode), ...)``) is stacked
    by an iteration construct, per `axes` (`api.assemble`'s record)."""
    return _iteration_axis(path, axes) is not None


def _iteration_axis(path: tuple, axes: dict) -> int | None:
    """The position of the iteration axis of the leaf at `path`, or None: the first of
    its `Site.axes` past the mesh axes of enclosing `shard_map`s (``"mesh:<name>"``,
    `rules._shard_map`, outermost), when that is a scan's or a loop's. A scan inside a
    `shard_map` body is captured as ``(*mesh, iteration, *local)``: its per-iteration
    statistics pool the shards (`_iteration_first` moves that axis first)."""
    if len(path) < 2:
        return None
    entry, mode = getattr(path[0], "key", None), getattr(path[1], "key", None)
    site_axes = axes.get(entry, {}).get(mode, ())
    k = 0
    while k < len(site_axes) and site_axes[k].startswith("mesh:"):
        k += 1
    return k if k < len(site_axes) and site_axes[k] in ITERATION_AXES else None


def _stacking_axes(axes: dict) -> tuple:
    """`Regroup.axes` of `axes` (entry path -> mode -> `Site.axes`): the entries with any."""
    return tuple(
        (p, tuple((m, tuple(a)) for m, a in per_mode.items() if a))
        for p, per_mode in axes.items()
        if any(per_mode.values())
    )


def _iteration_first(leaf: Any, mask: Any, k: int, memo: dict) -> tuple[Any, Any]:
    """`leaf` (and its `_values_mask`, None or over its leading axes) with axis `k`, the
    iteration axis behind `k` mesh axes, moved first: the per-iteration statistics are
    those of axis 0. The pooled ones do not depend on the order. The moved mask is
    kept in `memo` (masks and counts are memoised by `id`: a temporary's id is reused)."""
    moved = jnp.moveaxis(leaf, k, 0)
    if mask is None:
        return moved, None
    key = ("iteration first", id(mask), k, tuple(jnp.shape(leaf)))
    if key not in memo:
        m = mask
        if m.ndim <= k:  # a mask over the mesh axes only: one value per iteration too
            m = m.reshape(m.shape + (1,) * (k + 1 - m.ndim))
            m = jnp.broadcast_to(m, tuple(jnp.shape(leaf))[: k + 1])
        memo[key] = (mask, jnp.moveaxis(m, k, 0))  # (the original kept alive: its id)
    return moved, memo[key][1]


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Rows:
    """Arrays laid out for `summary_ops.segment_stats`: `flat` ``(R, W)`` (W: `row_width`),
    row r holding values of member ``seg[r]``, NaN-padded to whole rows (``pads[m]`` NaNs of
    member m, taken off its ``nan``). All three are arrays, so the summary program
    depends on their shapes only: one compiled program serves every layout of a size."""

    flat: Any
    seg: Any
    pads: Any


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Blocks:
    """Large arrays of one accumulation dtype left to a second program (`finish`), as
    they are (not even flattened: `Parts`), summarised there by one loop in blocks of
    `block` elements (`_blocked`)."""

    members: tuple[Any, ...]
    block: int = dataclasses.field(metadata={"static": True})
    #: `inspect`'s (CPU): walked in chunks from the host by programs keyed by the chunk
    #: size, not by the members' shapes (`summary_chunks`), when they are concrete then.
    chunked: bool = dataclasses.field(default=False, metadata={"static": True})


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Iterated:
    """Per-iteration captures of one iteration count (`_iteration_class`) left to a
    second program: `stack` ``(members, iterations, width)``, each member NaN-padded
    per iteration by ``pads[m]`` values (taken off its ``nan`` and each iteration's
    ``nonfinite``), and with `fill` (``(members,)``, or None) as many NaNs more, in
    whole iterations of padding (taken off its ``nan``; `Regroup` cuts their
    statistics off)."""

    stack: Any
    pads: Any
    fill: Any = None


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Parts:
    """Small arrays of one accumulation dtype (a segmented group) left to `finish` as
    they are, not even flattened (so that a probe of an input or of a result is seen
    as one: `_program.shared`). A layout program keyed by their shapes (`_lay_out`)
    copies them into sized `Rows` for the shared summary program. `inspect` leaves
    its layout so: a capture program compiles again at every edit of the function,
    a program keyed by shapes once (and it is kept on disk). `shapes` are the
    members' shapes and dtypes, taken where they are traced: `finish` keys the layout
    program on them at every call (for 5,000 members, 50 ms when read from the arrays)."""

    members: tuple[Any, ...]
    shapes: tuple = dataclasses.field(metadata={"static": True})
    #: Per member, None, or the (lead, offset, shape) of a `packing.View`: the member is
    #: then the view's buffer, which leaves the program once, however many values it
    #: holds (one output each was a copy kernel each), cut where it is laid out.
    cuts: tuple = dataclasses.field(default=(), metadata={"static": True})
    #: Laid out in `coarse_bucket`'s classes (`inspect`), or in `bucket`'s (a `Monitor`
    #: on a CPU mesh, `summarize_packed`'s `apart`: its layout runs at every step).
    coarse: bool = dataclasses.field(default=True, metadata={"static": True})

    def values(self, members: Any = None) -> list:
        """The members' values, cut from their buffers (`members`: NumPy views of them,
        on the host; default the members themselves)."""
        members = self.members if members is None else members
        cuts = self.cuts or (None,) * len(members)
        return [
            x if cut is None else View(None, *cut).cut(x)
            for x, cut in zip(members, cuts, strict=True)
        ]


#: The second programs (`finish`), one per kind of deferred work, in their order.
_PROGRAM_KINDS = (Rows, Blocks, Iterated)


def bucket(n: int) -> int:
    """The size class of `n` >= 1: the least ``2**k * (4, 5, 6 or 7) / 4`` >= n (at most
    a quarter wasted), so like-sized layouts share a compiled program."""
    if n <= 4:
        return max(n, 1)
    k = (n - 1).bit_length() - 3
    step = 1 << k
    return -(-n // step) * step


def row_width(sizes: list[int]) -> int:
    """The row width to lay out arrays of `sizes` elements with: the widest of
    `SEGMENT_ROWS`, unless a narrower one costs at most 1/`NARROW_GAIN` of it (the cost:
    the values summarised, padding included, plus `ROW_COST` per row). Many small arrays
    take narrow rows: 1,016 probes of 128 values were four times the values at 512
    (every one padded with 384 NaNs, a part more of the layout each), and the
    1,000-equation program's first `inspect` of an edited function took 1.53-1.55 s
    -> 1.27-1.29 s. Other layouts keep the one width, so like-sized layouts share their
    compiled program."""

    def cost(width: int) -> int:
        return sum(-(-max(n, 1) // width) for n in sizes) * (width + ROW_COST)

    best = SEGMENT_ROWS[-1]
    for width in reversed(SEGMENT_ROWS[:-1]):
        if cost(width) * NARROW_GAIN <= cost(best):
            best = width
    return best


@dataclass(frozen=True)
class _Plan:
    """Where a layout puts each member (`_layout`): its rows and NaN padding (the extra
    member owning a size class's padding rows included), and the layout's shape."""

    width: int
    rows: tuple[int, ...]
    pads: tuple[int, ...]
    members: int  # pads' length: the members, rounded up with `sized`
    total: int  # rows, rounded up with `sized`


def coarse_bucket(n: int, least: int) -> int:
    """The coarse size class of `n`: the least power of two >= n, and at least `least`."""
    return max(least, 1 << max(n - 1, 0).bit_length())


def _plan(sizes: list[int], sized: bool, coarse: bool = False) -> _Plan:
    """The layout of arrays of `sizes` elements (see `_layout`), from their sizes alone:
    a program keyed by the layout's shape learns it without tracing the layout. With
    `coarse` (and `sized`), rows and members take `coarse_bucket`'s classes."""
    width = row_width(sizes)
    pads = [(-n) % width or (width if n == 0 else 0) for n in sizes]
    rows = [(n + pad) // width for n, pad in zip(sizes, pads, strict=True)]
    members, total = len(sizes), sum(rows)
    if sized and coarse:
        members = coarse_bucket(len(sizes) + 1, ONCE_MIN_MEMBERS)
        total = coarse_bucket(total, ONCE_MIN_ROWS)
    elif sized:
        members, total = bucket(len(sizes) + 1), bucket(total)
    if sized:
        pads += [(total - sum(rows)) * width] + [0] * (members - len(sizes) - 1)
    return _Plan(width, tuple(rows), tuple(pads), members, total)


def _layout(leaves: list, sized: bool, coarse: bool = False) -> Rows:
    """`leaves` (any shapes, one accumulation dtype) as `Rows` of `row_width` values.
    With `sized`, rows and members are rounded up to their `bucket` (one extra member
    owns the padding rows, its NaNs all taken off as padding); with `coarse` too, to
    their `coarse_bucket`."""
    # `lax`, not `jnp` (each jnp call is a jit of its own), and one NaN fill per
    # length: 2,000 probes laid out in 0.65 s -> 0.2 s of tracing.
    values = [_flat_values(leaf) for leaf in leaves]
    plan = _plan([v.size for v in values], sized, coarse)
    parts = []
    fills: dict[int, Any] = {}
    for v, pad in zip(values, plan.pads, strict=False):
        if pad and pad not in fills:
            fills[pad] = _nan_fill(pad, v.dtype)
        parts += [v, fills[pad]] if pad else [v]
    seg = np.repeat(np.arange(len(leaves), dtype=np.int32), plan.rows)
    extra = plan.total - len(seg)
    if sized:
        fills[-1] = _nan_fill(extra * plan.width, parts[0].dtype)
        parts.append(fills[-1])
        seg = np.concatenate([seg, np.full(extra, len(leaves), np.int32)])
    flat = _concat.concatenate(parts, fills=list(fills.values()))
    return Rows(flat.reshape(-1, plan.width), jnp.asarray(seg), jnp.asarray(plan.pads, jnp.int32))


def _parts(members: list, coarse: bool = True) -> Parts:
    # a sown literal is a number, not an array
    arrays = tuple(x if isinstance(x, jax.Array) else jnp.asarray(x) for x in members)
    shapes = tuple((x.shape, str(x.dtype)) for x in arrays)
    views = [view_of(x) for x in arrays]
    if not any(views):
        return Parts(arrays, shapes, coarse=coarse)
    return Parts(
        tuple(x if v is None else v.buffer for x, v in zip(arrays, views, strict=True)),
        shapes,
        tuple(None if v is None else (v.lead, v.offset, v.shape) for v in views),
        coarse,
    )


def _rows_spec(parts: Parts) -> Rows:
    """The shapes of `_layout(parts.members, sized=True, coarse=parts.coarse)`, computed
    from the sizes alone."""
    plan = _plan([math.prod(shape) for shape, _ in parts.shapes], sized=True, coarse=parts.coarse)
    acc = _summary._value_dtype(np.dtype(parts.shapes[0][1]))[0]
    return Rows(
        jax.ShapeDtypeStruct((plan.total, plan.width), acc),
        jax.ShapeDtypeStruct((plan.total,), np.int32),
        jax.ShapeDtypeStruct((plan.members,), np.int32),
    )


#: On a CPU, NaN fills of at most this many values are constants in the program (larger
#: ones, rare size-class padding, stay a broadcast: a constant is stored in the program).
CONSTANT_FILL_MAX = 1 << 16


def _nan_fill(n: int, dtype: Any) -> Any:
    """`n` NaNs of `dtype`, a padding part of a layout. On a CPU (up to
    `CONSTANT_FILL_MAX`) a constant whose last NaN has another payload: XLA turns a
    constant of one repeated value into a broadcast, a kernel of its own per length,
    and XLA:CPU compiled each in 10-15 ms (four fills: 60 ms against 18 ms as
    constants). Every NaN is a NaN to the summaries, whatever its payload."""
    if jax.default_backend() != "cpu" or not 0 < n <= CONSTANT_FILL_MAX:
        return jax.lax.full((n,), jnp.nan, dtype)
    fill = np.full(n, np.nan, dtype)
    bits = fill.view(np.dtype(f"u{fill.itemsize}"))
    bits[-1] |= 1  # a quiet NaN still (the quiet bit is the mantissa's highest)
    return fill


def _flat_values(leaf: Any) -> jax.Array:
    """`leaf`'s values (`summary._values`) as one axis."""
    x = _gathered(jnp.asarray(leaf))
    acc, is_complex = _summary._value_dtype(x.dtype)
    v = _summary._values(x) if is_complex or x.dtype != acc else x
    return jax.lax.reshape(v, (v.size,))


def _gatherable(leaf: Any) -> bool:
    """Whether `leaf` may join a layout or a stack of unlike shapes: it is not split over
    Explicit mesh axes, or it is small enough to gather (`_gathered`)."""
    return not _ops.split_explicitly(leaf) or jnp.size(leaf) <= SEGMENT_MAX_ELEMENTS


def _gathered(x: Any) -> Any:
    """`x` replicated if its type is split over Explicit mesh axes, else `x`. A layout
    flattens its members and joins them, which explicit sharding refuses across a split
    dimension. Only small arrays come here (`summarize_packed`): on an Auto mesh XLA
    gathers them for the same layout, and `inspect`'s host layout reads them whole.
    Each such array summarised apart instead compiled a summary of its own into the
    capture program: a data-parallel `shard_map` step's first `inspect` took 4-6x as
    long on an Explicit mesh as on an Auto one, and takes 1.0-1.15x
    (`benchmarks/explicit_mesh.py`)."""
    if not _ops.split_explicitly(x):
        return x
    mesh = jax.typeof(x).sharding.mesh
    return jax.sharding.reshard(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


def _segment_summary(rows: Rows, bins: int) -> Tallied:
    """The stacked statistics of the members of `rows` (`summary_ops.segment_stats`),
    their counts left in one table (`Tallied`; `Regroup.apply` makes the `Summary`)."""
    stats = _ops.segment_stats(rows.flat, rows.seg, rows.pads.shape[0], bins)
    nan = stats["table"][:, bins] - rows.pads
    return Tallied(**stats, nan=nan, dtype=str(rows.flat.dtype), bins=bins)


def _blocked(leaves: list, bins: int, block: int) -> TalliedRows:
    """The stacked statistics of large `leaves` (any shapes, one accumulation dtype), in
    blocks of `block` elements, one loop for all of them (`summary_blocks.grouped_stats`),
    left as sums and tallies (`TalliedRows`; `Regroup.apply` makes the `Summary`).
    Static fields are the stack's; `Regroup` gives each member its own shape and dtype."""
    stats = _blocks.grouped_stats([_flat_values(x) for x in leaves], bins, block)
    acc = _summary._value_dtype(jnp.result_type(leaves[0]))[0]
    nan = stats["lin"][:, bins]
    return TalliedRows(stats, None, nan, None, np.dtype(acc).name, bins, ())


def _iteration_class(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """Per-iteration captures of one class share a computation (`_iterated`): the same
    iteration count, and widths (elements per iteration) within 4x of each other
    (class c: widths up to ``2**(2c + 1)``), or all small, so padding at most
    quadruples what is summarised. Returns the iterations, the class and the
    elements a member of the class takes at most once padded."""
    iterations, width = shape[0], math.prod(shape[1:])
    if iterations * width <= ITERATED_SMALL:
        return iterations, -1, ITERATED_SMALL
    cls = max(width - 1, 1).bit_length() // 2
    return iterations, cls, iterations << (2 * cls + 1)


def _iterated(leaves: list, bins: int) -> Any:
    """A stacked `Summary` with per-iteration statistics of `leaves` (captures stacked by
    a scan or loop: one iteration count, any shapes and dtypes of one accumulation
    dtype), computed in this program (`_stacked_iterations`, `_iterated_summary`)."""
    return _iterated_summary(_stacked_iterations(leaves, sized=False), bins)


def _stacked_iterations(leaves: list, sized: bool, coarse_bins: int = 0) -> Iterated:
    """`leaves` flattened to ``(iterations, width)``, NaN-padded to the widest and
    stacked. With `sized`, the width and the members are rounded up to their `bucket`
    (extra members are all padding), so like-sized groups share a compiled program;
    not past `ITERATED_SIZED_MAX` values (a large stack would grow by up to half).
    With `coarse_bins` too (`inspect`, at that many bins), they take `coarse_bucket`'s
    classes, and so do the iterations, up to `summary.row_cap` (every padded
    iteration then has statistics of its own, which `Regroup` cuts off): a loop of
    another length or width is served by the program compiled for the first."""
    source, starts, widths = _iteration_sources(leaves)
    width, members = max(widths), len(widths)
    iterations = source.shape[0]
    cap = _summary.row_cap(coarse_bins) if coarse_bins else 0
    c_steps = max(iterations, min(cap, coarse_bucket(iterations, ONCE_MIN_ITERATIONS)))
    c_width = coarse_bucket(width, ONCE_MIN_ITERATED_WIDTH)
    c_members = coarse_bucket(members, ONCE_MIN_ITERATED_MEMBERS)
    coarse = sized and iterations <= cap and c_members * c_steps * c_width <= ITERATED_SIZED_MAX
    steps = c_steps if coarse else iterations
    if coarse:
        width, members = c_width, c_members
    elif sized and bucket(members) * iterations * bucket(width) <= ITERATED_SIZED_MAX:
        width, members = bucket(width), bucket(members)
    pads = [width - w for w in widths] + [width] * (members - len(widths))
    more = steps - iterations
    # Every member's columns of the source, its padding (and the extra members') the
    # NaN column at its end: one gather for the whole stack. Padded and stacked one
    # by one, each member was a kernel of the capture program (a scan of NUTS steps:
    # 276 of its 597).
    nan_column = source.shape[1] - 1
    index = np.full((members, width), nan_column, np.int32)
    for m, (start, w) in enumerate(zip(starts, widths, strict=True)):
        index[m, :w] = np.arange(start, start + w)
    stack = jnp.transpose(jnp.take(source, index, axis=1), (1, 0, 2))
    if more:
        stack = jnp.pad(stack, ((0, 0), (0, more), (0, 0)), constant_values=jnp.nan)
    fill = None
    if coarse:  # NumPy, so the program takes it as an input (zeros: one program for all)
        fill = np.asarray([more * (width - p) for p in pads], np.int32)
    # NumPy: in this program, a group without padding skips the correction
    return Iterated(stack, np.asarray(pads, np.int32), fill)


def _iteration_sources(leaves: list) -> tuple[Any, list[int], list[int]]:
    """Per-iteration `leaves` (one iteration count) as columns of one ``(iterations,
    columns)`` source, a NaN column last: each leaf's iterations flattened, or, for a
    cut of a loop's buffer (`packing.View`), that buffer, once for all the leaves cut
    from it. Returns the source and each leaf's first column and width."""
    sources: list = []
    start_of: dict[int, int] = {}  # id of a source -> its first column
    at = 0
    starts, widths = [], []
    for x in leaves:
        view = view_of(x)
        whole = view is not None and view.lead == 1 and not _ops.split_explicitly(view.buffer)
        src = view.buffer if whole else jnp.asarray(x)
        if id(src) not in start_of:
            start_of[id(src)] = at
            flat = _summary._values(_gathered(src)).reshape(jnp.shape(src)[0], -1)
            sources.append(flat)
            at += flat.shape[1]
        starts.append(start_of[id(src)] + (view.offset if whole else 0))
        widths.append(view.size if whole else math.prod(jnp.shape(x)[1:]))
    dtype = sources[0].dtype
    nan = _nan_fill(sources[0].shape[0], dtype).reshape(-1, 1)
    return _concat.concatenate([*sources, nan], 1, fills=[nan]), starts, widths


def _iterated_summary(it: Iterated, bins: int) -> TalliedRows:
    """The stacked statistics of `it`, per-iteration statistics included (one
    computation for the stack; one per shape compiled for about 0.5-0.7 s on
    XLA:CPU), left as sums and tallies (`TalliedRows`; `Regroup.apply` makes the
    `Summary`), its padding taken off ``nan`` (and, there, each iteration's
    ``nonfinite``)."""
    stack = it.stack
    iterations = stack.shape[1]
    keep = _summary.kept_rows(iterations, bins)
    pooled, rows = _ops.raw_stats(stack, bins, keep)
    fill = 0 if it.fill is None else it.fill
    nan = pooled["lin"][:, bins] - it.pads * iterations - fill
    return TalliedRows(
        pooled,
        rows,
        nan,
        jnp.asarray(it.pads),
        str(stack.dtype),
        bins,
        tuple(stack.shape[1:]),
        tuple(int(i) for i in keep),
        iterations,
    )


def _segmented(leaves: list, bins: int) -> Tallied:
    """The stacked statistics (`Tallied`) of `leaves` (any shapes, one accumulation
    dtype), computed in this program over their `Rows`."""
    return _segment_summary(_layout(leaves, sized=False), bins)


def _lays_out_large(flat: list, axes: dict, min_grouped: int) -> bool:
    """Whether `inspect` lays out the arrays of `flat` (path, leaf) that would be groups'
    members (`Blocks`) with the small ones: all of them, or none (with one group left,
    its program is compiled anyway, and the layout only grows), when each has at most
    `ONCE_SEGMENT_MAX_ELEMENTS` and all of them at most `ONCE_SEGMENT_MAX_BYTES`."""
    seen: set[int] = set()
    total = 0
    for path, leaf in flat:
        if leaf is None or id(leaf) in seen:
            continue
        seen.add(id(leaf))
        per_it = _per_iteration(path, axes) and jnp.ndim(leaf) >= 1
        if not _blocks.block_for(leaf, per_it, min_grouped):
            continue
        if jnp.size(leaf) > ONCE_SEGMENT_MAX_ELEMENTS:
            return False
        total += jnp.size(leaf) * jnp.result_type(leaf).itemsize
    return total <= ONCE_SEGMENT_MAX_BYTES


def _values_mask(path: tuple, meta: Any, leaf: Any, axes: dict, memo: dict | None = None) -> Any:
    """Which leading indices of the leaf at `path` hold values (None: all of them).
    A capture records zeros where nothing ran: in a `cond` branch inside a loop that
    ran in some iterations only (its `taken` flags, one per iteration), in a `while`
    loop's rows past its count (`loops=N`: the `iterations` meta, the loop's axis
    found in the site's `axes`), and for a `while` loop that never ran
    (`loops="last"`). A `taken` flag for the whole capture is no mask: `inspect` drops
    a branch that did not run. Only floating leaves (NaN marks the others)."""
    if not jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
        return None
    entry = getattr(path[0], "key", None) if path else None
    mode = getattr(path[1], "key", None) if len(path) > 1 else None
    got = meta.get(entry, {}) if isinstance(meta, dict) else {}
    shape = tuple(jnp.shape(leaf))
    site = axes.get(entry, {}).get(mode, ())
    # One mask per flags, site and shape: the captures of one loop share it (and so
    # their masked buffer, `_masked_leaf`), one traced value (`packing.Carried`).
    key = (id(got.get("taken")), id(got.get("iterations")), site, shape)
    if memo is not None and key in memo:
        return memo[key]
    mask = _mask(got, site, shape)
    if memo is not None:
        memo[key] = mask
    return mask


def _mask(got: dict, site: tuple, shape: tuple) -> Any:
    """`_values_mask` of a leaf of `shape` at `site`, with its entry's meta `got`."""
    mask = None
    taken = got.get("taken")
    if taken is not None and 0 < jnp.ndim(taken) <= len(shape):
        if shape[: jnp.ndim(taken)] == tuple(jnp.shape(taken)):
            mask = jnp.asarray(taken, bool)
    iterations = got.get("iterations")
    # `iterations` counts the innermost while loop's rows, stacked by the axes before it
    # (`rules._while`; an outer while loop's rows that never ran hold a count of 0)
    k = _innermost(site, "while") if iterations is not None else None
    if k is not None and jnp.ndim(iterations) == k < len(shape):
        if shape[:k] == tuple(jnp.shape(iterations)):
            ran = jnp.arange(shape[k]) < jnp.asarray(iterations)[..., None]
            mask = ran if mask is None else _both(mask, ran)
    elif iterations is not None and "while" not in site and jnp.ndim(iterations) <= len(shape):
        if shape[: jnp.ndim(iterations)] == tuple(jnp.shape(iterations)):
            ran = jnp.asarray(iterations) > 0  # `loops="last"`: zeros if it never ran
            mask = ran if mask is None else _both(mask, ran)
    return mask


def _innermost(axes: tuple[str, ...], kind: str) -> int | None:
    """The position of the last (innermost) `kind` among `axes`, or None."""
    return len(axes) - 1 - axes[::-1].index(kind) if kind in axes else None


def _both(a: Any, b: Any) -> Any:
    """`a & b` of two masks over the same leading axes, the shorter broadcast."""
    if a.ndim < b.ndim:
        a, b = b, a
    return a & b.reshape(b.shape + (1,) * (a.ndim - b.ndim))


def _nan_where_not(x: Any, mask: Any) -> Any:
    """`x` with NaN where `mask` (over its leading axes) is False."""
    keep = mask.reshape(mask.shape + (1,) * (jnp.ndim(x) - mask.ndim))
    return jnp.where(keep, x, jnp.asarray(jnp.nan, jnp.result_type(x)))


def _mask_counts(mask: Any, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """How many values of a leaf of `shape` `mask` makes NaN: in all, and per row."""
    gone = (~mask).astype(jnp.int32) * math.prod(shape[mask.ndim :])
    if mask.ndim == 0:
        per_row = jnp.broadcast_to(gone // max(shape[0], 1), shape[:1]) if shape else gone[None]
    else:
        per_row = jnp.sum(gone.reshape(shape[0], -1), axis=1)
    return jnp.sum(gone), per_row


def _masked_leaf(leaf: Any, mask: Any, memo: dict) -> tuple[Any, tuple[Any, Any]]:
    """`leaf` with NaN where `mask` (its leading axes) is False, and how many values
    that made NaN: in all, and per row of axis 0 (an iteration's). The summary then
    goes wherever its shape sends it (a capture alone compiled a summary of its own:
    a scan with a 20-stage `cond` branch took 8.3 s to `inspect`, against 3.2 s).
    Shared where it can be: the counts per mask and shape, and for a cut of a loop's
    buffer (`packing.View`) whose leading axes the mask covers, the whole buffer
    masked once and the leaf cut from it again (a `View` still). Masked one by one, a
    NUTS step's 430 probes were as many kernels of the capture program."""
    shape = tuple(jnp.shape(leaf))
    key = ("counts", id(mask), shape)
    if key not in memo:
        memo[key] = _mask_counts(mask, shape)
    view = view_of(leaf)
    buf = None if view is None else view.buffer
    if view is None or mask.ndim > view.lead or tuple(buf.shape[: mask.ndim]) != mask.shape:
        return _nan_where_not(leaf, mask), memo[key]
    bkey = ("buffer", id(buf), id(mask))
    if bkey not in memo:
        memo[bkey] = (buf, _nan_where_not(buf, mask))  # (the buffer kept alive: its id)
    masked = View(memo[bkey][1], view.lead, view.offset, view.shape)
    return as_view(masked.cut(), masked), memo[key]


def _key_bits(leaf: Any) -> Any:
    """A typed PRNG key (`jax.random.key(0)`, dtype `key<fry>`, which NumPy and the
    statistics cannot read) as its bits (`jax.random.key_data`: `uint32[..., 2]`), so a
    sown key is summarised as a raw `jax.random.PRNGKey` is; any other leaf as it is."""
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return jax.random.key_data(leaf)
    return leaf


def summarize_packed(
    values: Any,
    meta: Any,
    bins: int,
    axes: dict | None = None,
    defer: bool = False,
    once: bool = False,
    apart: bool = False,
) -> Packed:
    """Summarise every array leaf of `values` (`{entry: {mode: tree}}`, None leaves stay
    None), pack them with the raw `meta` arrays; `Packed.unpack()` returns
    `(summaries, meta)`. `axes` maps entry → mode → `Site.axes`.

    Every small array (at most `SEGMENT_MAX_ELEMENTS`; one split over Explicit mesh
    axes is gathered first, `_gathered`) without per-iteration statistics joins one
    segmented group per accumulation dtype (`_segmented`): a program compiles one
    summary for all of them, whatever their shapes (one per shape compiled for
    seconds each). Others are stacked by shape, or summarised alone.

    With `defer`, the segmented groups are only laid out (`Rows`, sized to a
    `bucket`) and left in `Packed.pending` for `finish`: a second program, keyed by
    the layout's size class only, so every mode and every model with like sizes
    shares it, and it compiles (`precompile`, started here while this program is
    traced) beside the capture program instead of inside it. The large arrays'
    groups (CPU) are left likewise (`Blocks`) to a program of their own, up to
    `DEFER_BLOCKS_MAX_BYTES` in all, and so are the per-iteration stacks
    (`Iterated`). On a CPU, arrays of `MIN_GROUPED` elements or more are summarised
    in blocks (`Blocks`).

    `once`: a program compiled for its first call (`inspect`), where one run at every
    step has been the rule: on a CPU only arrays of `MIN_GROUPED_ONCE` elements or
    more are summarised in blocks (each group is a loop to compile), and with `defer`
    the segmented groups are not even laid out here (`Parts`).

    `apart` (with `defer`: a program run at every step on a CPU mesh, `_program`): the
    segmented groups are not laid out here either (`Parts`, in `bucket`'s classes);
    `finish` lays them out (`_on_one_device`). XLA partitioned the layout's
    concatenation over the mesh: every part sliced, then gathered (26 all-gathers in
    an MLP's capture program on 8 host devices, none in plain JAX's; 9.5 ms against
    2.8 ms), and a placement asked of it here spread into the user's computation."""
    axes = axes or {}
    min_grouped = MIN_GROUPED_ONCE if once else MIN_GROUPED
    cpu = jax.default_backend() == "cpu"
    flat, treedef = jax.tree_util.tree_flatten_with_path(values, is_leaf=lambda x: x is None)
    flat = [(path, _key_bits(leaf)) for path, leaf in flat]
    groups: dict[tuple, list[int]] = {}
    rows: dict[int, bool] = {}
    filled: dict[tuple, int] = {}  # bytes in the open stack of each shape and dtype
    opened: dict[tuple, int] = {}  # which leaf opened that stack (names it)
    static: list[tuple[tuple[int, ...], str, bool] | None] = [None] * len(flat)
    # A value recorded twice (a scope's output that is its last stage's: one traced
    # value, `interpret._through_barrier`) is summarised once; its repeats read that
    # summary (an NNX MLP's 145 small probes were 123 values, the 4x1024 MLP's 27
    # large ones 25).
    first: dict[int, int] = {}
    repeats: dict[int, int] = {}
    lay_large = once and defer and cpu and _lays_out_large(flat, axes, min_grouped)
    trims: dict[int, int | None] = {}  # deferred group: its iterations, if padded
    shapes: dict[int, tuple[int, ...]] = {}  # leaf -> its shape as captured, if moved
    masked: dict[int, tuple[Any, Any]] = {}  # leaf -> its masked counts (`_masked_leaf`)
    memo: dict = {}  # masks, counts and masked buffers made once (`_masked_leaf`)
    for i, (path, leaf) in enumerate(flat):
        if leaf is None:
            continue
        at = _iteration_axis(path, axes)
        rows[i] = at is not None and jnp.ndim(leaf) > at
        mask = _values_mask(path, meta, leaf, axes, memo)
        # a value recorded twice in one place has one mask: the repeat reads its summary
        seen = first.setdefault((id(leaf), mask is None), i)
        if seen != i and rows[seen] == rows[i]:
            repeats[i] = seen
            continue
        captured = tuple(jnp.shape(leaf))
        if rows[i] and at:  # behind mesh axes: summarised iteration first, shown as captured
            leaf, mask = _iteration_first(leaf, mask, at, memo)
            flat[i] = (path, leaf)
            shapes[i] = captured
        if mask is not None:  # zeros where nothing ran: NaN, taken off on the host
            leaf, masked[i] = _masked_leaf(leaf, mask, memo)
            flat[i] = (path, leaf)
        dtype = jnp.result_type(leaf)
        nbytes = jnp.size(leaf) * dtype.itemsize
        grouped = cpu and _blocks.block_for(leaf, rows[i], min_grouped)
        # `inspect`: a large array that would be a group's member joins the small ones'
        # layout instead (the shared program serves it; a group's program is keyed by
        # its members' shapes, so a new model compiled one), if they all do.
        laid = bool(grouped and lay_large)
        if grouped and not laid and nbytes <= GROUP_MAX_BYTES:
            acc, is_complex = _summary._value_dtype(dtype)
            static[i] = (tuple(jnp.shape(leaf)), str(dtype), is_complex)
            # a group per dtype and block size: GROUP_BLOCK for arrays at least that
            # large, else the largest power of two <= min_grouped (their members fit it)
            big = jnp.size(leaf) >= _blocks.GROUP_BLOCK
            block = _blocks.GROUP_BLOCK if big else _blocks.group_block(min_grouped)
            kind, budget = ("blocks", np.dtype(acc).name, block), GROUP_MAX_BYTES
        elif not laid and (
            (cpu and jnp.size(leaf) > STACK_MAX_ELEMENTS) or nbytes > STACK_MAX_BYTES
        ):
            groups[("alone", i)] = [i]
            continue
        elif laid or (not rows[i] and jnp.size(leaf) <= SEGMENT_MAX_ELEMENTS):
            acc, is_complex = _summary._value_dtype(dtype)
            static[i] = (tuple(jnp.shape(leaf)), str(dtype), is_complex)
            kind, budget = ("segments", np.dtype(acc).name), STACK_MAX_BYTES
            nbytes = (jnp.size(leaf) + SEGMENT_ROW) * np.dtype(acc).itemsize
        elif rows[i] and jnp.size(leaf) and _gatherable(leaf):
            acc, is_complex = _summary._value_dtype(dtype)
            static[i] = (tuple(jnp.shape(leaf)), str(dtype), is_complex)
            iterations, cls, padded = _iteration_class(jnp.shape(leaf))
            kind, budget = ("iterations", np.dtype(acc).name, iterations, cls), STACK_MAX_BYTES
            nbytes = padded * np.dtype(acc).itemsize  # at most, once padded to the widest
        else:  # split over explicit mesh axes, only like-sharded arrays stack
            placed = jax.typeof(leaf).sharding if _ops.split_explicitly(leaf) else None
            kind, budget = (jnp.shape(leaf), dtype, rows[i], placed), STACK_MAX_BYTES
        if kind not in filled or filled[kind] + nbytes > budget:
            filled[kind], opened[kind] = 0, i
        filled[kind] += nbytes
        groups.setdefault((*kind, opened[kind]), []).append(i)
    where: list[tuple[int, int | None] | None] = [None] * len(flat)
    out: list[Any] = []
    # Deferred work, by second program (`finish`), in `_PROGRAM_KINDS` order.
    pending: dict[type, list[tuple[int, Any]]] = {kind: [] for kind in _PROGRAM_KINDS}
    # Large groups are deferred all or none (some left in the program would compile the
    # loop there anyway).
    blocked = [i for key, idx in groups.items() if key[0] == "blocks" for i in idx]
    defer_blocks = defer and (
        sum(jnp.size(flat[i][1]) * jnp.result_type(flat[i][1]).itemsize for i in blocked)
        <= DEFER_BLOCKS_MAX_BYTES
    )
    for g, (key, idx) in enumerate(groups.items()):
        per_it = rows[idx[0]]
        members = [flat[i][1] for i in idx]
        if key[0] == "alone":
            out.append(_summary.summarize(members[0], bins=bins, per_iteration=per_it))
            where[idx[0]] = (g, None)
            continue
        if key[0] == "segments" and defer:
            laid = _parts(members, coarse=once) if once or apart else _layout(members, sized=True)
            pending[Rows].append((g, laid))  # `Parts` are `Rows` once `finish` lays them out
            out.append(None)
        elif key[0] == "segments":
            out.append(_segmented(members, bins))
        elif key[0] == "blocks" and defer_blocks:
            chunked = once and CHUNKED and all(_chunks.usable(x.shape, x.dtype) for x in members)
            pending[Blocks].append((g, Blocks(tuple(members), key[2], chunked)))
            out.append(None)
        elif key[0] == "blocks":
            out.append(_blocked(members, bins, key[2]))
        elif key[0] == "iterations" and defer:
            stacked = _stacked_iterations(members, sized=True, coarse_bins=bins if once else 0)
            pending[Iterated].append((g, stacked))
            padded = stacked.stack.shape[1] > jnp.shape(members[0])[0]
            trims[g] = jnp.shape(members[0])[0] if padded else None
            out.append(None)
        elif key[0] == "iterations":
            out.append(_iterated(members, bins))
        else:
            stack = jnp.stack([flat[i][1] for i in idx])
            out.append(_summary.summarize_stack(stack, bins=bins, per_iteration=per_it))
        for j, i in enumerate(idx):
            where[i] = (g, j)
    for i, seen in repeats.items():
        where[i], static[i] = where[seen], static[seen]
        if seen in shapes:
            shapes[i] = shapes[seen]
    work = [item for kind in _PROGRAM_KINDS for item in pending[kind]]
    if PRECOMPILE:
        items = tuple(item for _, item in work)
        parts = tuple(p for p in items if isinstance(p, Parts))
        if parts and not _host_laid(parts):
            _precompile_layout(items)
        for part in _programs(tuple(_rows_spec(p) if isinstance(p, Parts) else p for p in items)):
            precompile(part, bins)
    tree = {"groups": out, "meta": meta}
    if masked:
        tree["masked"] = list(masked.values())
    packed = pack(tree)
    deferred = tuple(g for g, _ in work)
    iterations = tuple(trims.get(g) for g in deferred)
    regroup = Regroup(
        treedef,
        tuple(where),
        tuple(static),
        deferred,
        bins,
        iterations,
        tuple(masked),
        tuple(shapes.items()),
        _stacking_axes(axes),
    )
    return Packed(packed.buffers, packed.layout, regroup, tuple(item for _, item in work))


# -- the second program: deferred segmented summaries ----------------------------------


def _programs(pending: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """`pending` cut into the work of each second program, in order: the segmented
    layouts (their shapes are size classes: one program serves every model of like
    sizes) and the large arrays (their program is keyed by their shapes, so it is
    compiled apart, to leave the first one shared)."""
    parts = [tuple(p for p in pending if isinstance(p, kind)) for kind in _PROGRAM_KINDS]
    return [p for p in parts if p]


def _finish_program(pending: tuple[Any, ...], clean: Any, bins: int) -> tuple[Packed, Any]:
    sums = [
        _segment_summary(p, bins)
        if isinstance(p, Rows)
        else _iterated_summary(p, bins)
        if isinstance(p, Iterated)
        else _blocked(list(p.members), bins, p.block)
        for p in pending
    ]
    return pack(sums), clean & _summary.all_clean(sums)


_finish = jax.jit(_finish_program, static_argnames="bins")
_COMPILING: dict[Any, threading.Thread] = {}
_COMPILED: dict[Any, Any] = {}  # `jax.stages.Compiled` of `_finish`, by `_key`
_STARTED: set[Any] = set()
_LOCK = threading.Lock()


def _key(pending: tuple[Any, ...], bins: int) -> tuple:
    # every array of the pending pytree, and whether an optional one is there: a
    # Monitor's `Iterated` has no `fill`, an `inspect`'s one, and a program compiled
    # for one was called with the other (a pytree mismatch)
    return (
        bins,
        *(
            ("rows", *map(_typed, (r.flat, r.seg, r.pads)))
            if isinstance(r, Rows)
            else ("iterated", *map(_typed, (r.stack, r.pads, r.fill)))
            if isinstance(r, Iterated)
            else ("blocks", r.block, r.chunked, *map(_typed, r.members))
            for r in pending
        ),
        ("x64", _compat.x64_enabled()),
    )


def _typed(a: Any) -> tuple | None:
    if a is None:
        return None
    # (the dtype's name looked up: `str(dtype)` cost a Monitor 5 µs per array per step)
    name = _DTYPE_NAMES.get(a.dtype)
    if name is None:
        name = _DTYPE_NAMES[a.dtype] = str(a.dtype)
    return (tuple(a.shape), name)


_DTYPE_NAMES: dict[Any, str] = {}


def precompile(pending: tuple[Any, ...], bins: int) -> None:
    """Start compiling `finish`'s program for `pending`'s shapes in a thread (once per
    shapes): XLA compiles it beside the capture program, on another core. A process
    that compiled it before loads it from disk instead (`sowviz._disk_cache`)."""
    if _all_chunked(pending):
        for k in _chunk_keys(pending, bins):
            _in_thread(k, lambda k=k: _compile_chunks(k))
        return
    key = _key(pending, bins)
    _in_thread(key, lambda: _compile(key, pending, bins))


def _all_chunked(pending: tuple[Any, ...]) -> bool:
    return all(isinstance(p, Blocks) and p.chunked for p in pending)


def _chunk_keys(pending: tuple[Any, ...], bins: int) -> list[tuple]:
    """The `summary_chunks` programs `pending`'s (chunked) `Blocks` take."""
    keys = {
        _chunks.key(kind, _chunks.chunk_for(math.prod(x.shape)), x.dtype, bins)
        for p in pending
        for x in p.members
        for kind in ("first", "second")
    }
    return sorted(keys)


def _compile_chunks(key: tuple) -> Any:
    """A `summary_chunks` program, compiled (or loaded from disk) and kept under `key`."""
    _COMPILED[key] = compiled = _disk_cache.compile_cached(
        lambda: _chunks.lower(key), ("summary_chunks", key, ("x64", _compat.x64_enabled()))
    )
    return compiled


def _on_host(pending: tuple[Any, ...]) -> bool:
    """Whether chunked `Blocks` can be walked from the host: every member a concrete
    array of this process on one CPU device."""
    return _all_chunked(pending) and all(
        isinstance(x, jax.Array)
        and not isinstance(x, jax.core.Tracer)
        and x.is_fully_addressable
        and len(x.sharding.device_set) == 1
        and next(iter(x.sharding.device_set)).platform == "cpu"
        for p in pending
        for x in p.members
    )


def _chunked_finish(pending: tuple[Any, ...], clean: Any, bins: int) -> tuple[Packed, Any]:
    """`_finish_program` of chunked `Blocks` (`summary_chunks`), its result packed on the
    host (`pack_host`)."""
    compiled = lambda k: _compiled(k, lambda: _compile_chunks(k))  # noqa: E731
    sums = []
    for p in pending:
        stats = _chunks.stats(list(p.members), bins, compiled)
        acc = np.dtype(p.members[0].dtype).name
        sums.append(TalliedRows(stats, None, stats["lin"][:, bins], None, acc, bins, ()))
    if any((s.nan | s.posinf | s.neginf).any() for s in sums):
        clean = jnp.logical_and(clean, False)
    return pack_host(sums), clean


def _precompile_layout(pending: tuple[Any, ...]) -> None:
    """`precompile` for the layout program of `pending`'s `Parts` (`_lay_out`)."""
    parts = tuple(p for p in pending if isinstance(p, Parts))
    key = _layout_key(parts)
    _in_thread(key, lambda: _compile_layout(key, parts))


def _in_thread(key: tuple, compile_: Callable[[], Any]) -> None:
    """Run `compile_` in a thread, once per `key`; `_compiled(key)` waits for it. The
    thread lowers under the caller's 64-bit setting: `jax.enable_x64` holds in the
    thread that entered it only (a float64 program was lowered as float32)."""
    with _LOCK:
        if key in _STARTED:
            return
        _STARTED.add(key)
    x64 = _compat.x64_enabled()

    def run() -> None:
        try:
            with _compat.x64(x64):
                compile_()
        except Exception:  # the call in `finish` compiles again and reports the error
            pass

    # Not a daemon: interpreter exit waits for a compile in flight instead of killing it.
    thread = threading.Thread(target=run, name="sowviz-precompile")
    with _LOCK:
        _COMPILING[key] = thread
    thread.start()


def _compiled(key: tuple, compile_: Callable[[], Any]) -> Any:
    """The program compiled under `key`: waited for if a thread compiles it, else
    compiled now by `compile_`."""
    with _LOCK:
        thread = _COMPILING.pop(key, None)
    if thread is not None:
        thread.join()
    return _COMPILED.get(key) or compile_()


def join_precompiles() -> None:
    """Wait for every second program still compiling in a thread (`precompile`)."""
    with _LOCK:
        threads = list(_COMPILING.values())
    for t in threads:
        t.join()


def finish(packed: Packed, clean: Any, *, home: bool = True) -> tuple[Packed, Any]:
    """Run the deferred summaries of `packed` (a dispatch per second program, `_programs`,
    after the layout program's if `Parts` wait); returns the `Packed` of all summaries
    and `clean` (no probe counts a NaN/Inf) updated with theirs.

    On a CPU mesh the second programs run on one of its devices (`_on_one_device`),
    and with `home` their results go back beside `clean` (the capture program's
    placement). A `Monitor` passes ``home=False``: its gather of a step's parts takes
    every replicated part's copy on that one device (`_wire.gather`), where the move
    back cost 0.4 ms of host work per recorded step (`jax.device_put` to 8 devices)."""
    if not packed.pending:
        return packed, clean
    bins = packed.regroup.bins
    pending, placed = packed.pending, None
    one = _on_one_device(pending, clean)
    if one is not None:
        (pending, clean), placed = one, clean.sharding
    seconds = []
    for part in _programs(_laid_out(pending)):
        if _on_host(part):
            second, clean = _chunked_finish(part, clean, bins)
            seconds.append(second)
            continue
        key = _key(part, bins)
        compiled = _compiled(key, lambda: _compile(key, part, bins))  # noqa: B023
        try:
            second, clean = compiled(part, clean)
        except ValueError:  # compiled for the default device; a mesh's arrays take the jit
            second, clean = _finish(part, clean, bins=bins)
        seconds.append(second)
    if placed is not None and home:
        seconds, clean = jax.device_put((seconds, clean), placed)
    done = packed
    for second in seconds:
        done = done.joined(second)
    return done, clean


def _on_one_device(pending: tuple[Any, ...], clean: Any) -> tuple[Any, Any] | None:
    """`(pending, clean)` on the device the second programs were compiled for, when
    they lie on several devices of a CPU backend (a mesh, all of them in this
    process); else None (the programs run where their inputs are, as `jax.jit` puts
    them). A CPU mesh's devices share the host's cores, and a second program run over
    the mesh was partitioned by XLA, its reductions joined by all-reduces (57 for an
    MLP's two programs on 8 host devices: 5.4 ms against 0.84 ms on one device). The
    `Parts` are laid out, and the arrays split over the mesh gathered, by a program of
    their own (`_whole`), not in the capture program: a replicated placement there
    changed how XLA partitioned the user's computation (a gradient's matmul then ran
    whole on every device, 5e-8 away from plain JAX's). Each device then holds them
    whole, and `jax.device_put` to one device takes its copy: no transfer, and no wait
    (a split array is read whole only once the capture program is done).

    Not for `inspect`'s work (coarse `Parts`, laid out on the host, `_laid_out`): a
    program of their own would compile at its first call. Nor for arrays split over
    Explicit mesh axes (`with_sharding_constraint` refuses them).

    What it decides depends only on the tree, shapes, dtypes and placements of its
    inputs (and the default device): decided once per such key (`_one_device_plan`),
    it cost a Monitor's recorded TP step ~0.2 ms of host Python (session 46)."""
    if jax.default_backend() != "cpu" or _one_device():
        return None
    leaves, treedef = jax.tree_util.tree_flatten((pending, clean))
    plan = _one_device_plan(pending, clean, treedef, leaves)
    if plan is None:
        return None
    if plan.whole is not None:
        pending = plan.whole(pending, plan.specs)
        leaves, treedef = jax.tree_util.tree_flatten((pending, clean))
    # (each replicated array's own copy on `device`: `jax.device_put` cost 0.4 ms of
    # host work per call, at every recorded step of a Monitor)
    device = plan.device
    return jax.tree_util.tree_unflatten(treedef, [_compat.copy_on(x, device) for x in leaves])


@functools.cache
def _one_device() -> bool:
    return jax.device_count() == 1


@dataclasses.dataclass(frozen=True)
class _OneDevicePlan:
    """What `_on_one_device` does with inputs of one key: the device, and the program
    laying them out whole (`_whole`, None when none is needed) with its `specs`."""

    device: Any
    whole: Any
    specs: tuple


#: `_on_one_device`'s decisions by (tree, default device, each leaf's type, shape,
#: dtype and sharding): a batch of another shape, or arrays placed otherwise, is
#: another key, never a stale plan. Bounded: a Monitor's shapes are few, but an
#: `inspect` of ever new shapes must not grow it without end.
_PLANS: OrderedDict[tuple, _OneDevicePlan | None] = OrderedDict()
_MAX_PLANS = 64


def _leaf_key(x: Any) -> tuple:
    if isinstance(x, jax.Array):
        return (x.shape, x.dtype, x.sharding)
    return (type(x), getattr(x, "shape", None), getattr(x, "dtype", None))


def _one_device_plan(
    pending: tuple[Any, ...], clean: Any, treedef: Any, leaves: list
) -> _OneDevicePlan | None:
    """`_decide_one_device(pending, clean)`, decided once per key (`_PLANS`); `treedef`
    and `leaves` are those of ``(pending, clean)``."""
    key = (treedef, jax.config.jax_default_device, *map(_leaf_key, leaves))
    try:
        return _PLANS[key]
    except KeyError:
        pass
    plan = _decide_one_device(pending, clean)
    with _LOCK:  # (Monitors stepped from several threads)
        _PLANS[key] = plan
        while len(_PLANS) > _MAX_PLANS:
            _PLANS.popitem(last=False)
    return plan


def _decide_one_device(pending: tuple[Any, ...], clean: Any) -> _OneDevicePlan | None:
    """`_on_one_device`'s decision for inputs like `pending` and `clean` (None: they
    stay where they are)."""
    if any(isinstance(p, Parts) and p.coarse for p in pending):
        return None
    arrays = [x for x in jax.tree_util.tree_leaves((pending, clean)) if isinstance(x, jax.Array)]
    if all(len(x.sharding.device_set) == 1 for x in arrays):
        return None
    device = _default_device()
    mesh = next((getattr(x.sharding, "mesh", None) for x in arrays), None)
    devices = set(mesh.devices.flat) if isinstance(mesh, jax.sharding.Mesh) else set()
    if device not in devices or not all(
        x.is_fully_addressable and x.sharding.device_set == devices for x in arrays
    ):
        return None
    split = [x for x in arrays if not x.sharding.is_fully_replicated]
    if any(_compat.explicit_sharding(x) is not None for x in split):
        return None
    if split or any(isinstance(p, Parts) for p in pending):
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        return _OneDevicePlan(device, _whole(replicated), _gathered_specs(mesh, pending))
    return _OneDevicePlan(device, None, ())


@functools.cache
def _whole(sharding: Any) -> Any:
    """A program of `pending`: its `Parts` laid out, every array placed by `sharding`
    (replicated on the mesh; `_on_one_device`). The arrays split over the mesh are
    gathered first, all in ONE collective (`_gather_once`, for those `specs` names);
    others each by a sharding constraint: left to XLA, the layout's concatenation was
    split over the mesh, every part sliced and then gathered (29 all-gathers for an
    MLP's 20 members), and a constraint per array was an all-gather each (15 for a 2-D
    tensor-parallel step's 19 members: 1.5 ms on 8 host devices, against 0.84-0.96 ms)."""

    def whole(pending: tuple[Any, ...], specs: tuple) -> tuple[Any, ...]:
        leaves, treedef = jax.tree_util.tree_flatten(pending)
        once = [i for i, spec in enumerate(specs) if spec is not None]
        if once:
            got = _gather_once(sharding.mesh, [leaves[i] for i in once], [specs[i] for i in once])
            for i, x in zip(once, got, strict=True):
                leaves[i] = x
        placed = jax.tree_util.tree_unflatten(
            treedef, [jax.lax.with_sharding_constraint(x, sharding) for x in leaves]
        )
        return tuple(
            _layout(p.values(), sized=True, coarse=p.coarse) if isinstance(p, Parts) else p
            for p in placed
        )

    return jax.jit(whole, out_shardings=sharding, static_argnums=1)


#: `_whole` gathers the split arrays of at most this many elements in one collective;
#: larger ones each by a constraint. One all-gather for the 2-D TP step's 15 small
#: arrays (at most 256 elements): 1.5 -> 0.84-0.96 ms; for all of a data-parallel
#: step's 6 arrays of 256-64K elements it was slower (3.9 -> 4.4 ms: copying them into
#: words and back, on every device, costs more than the collectives it saves).
GATHER_ONCE_MAX_ELEMENTS = 1 << 12


def _gathered_specs(mesh: Any, pending: tuple[Any, ...]) -> tuple:
    """Per array leaf of `pending`: its `PartitionSpec`, shape and dtype when it is small
    (`GATHER_ONCE_MAX_ELEMENTS`) and split over `mesh` evenly by a `NamedSharding` of it
    (`_gather_once` gathers it), else None."""

    def spec(x: Any) -> Any:
        s = x.sharding
        if s.is_fully_replicated or not isinstance(s, jax.sharding.NamedSharding):
            return None
        if x.size > GATHER_ONCE_MAX_ELEMENTS:
            return None
        if s.mesh != mesh:
            return None
        block = s.shard_shape(x.shape)
        if any(b == 0 or n % b for n, b in zip(x.shape, block, strict=True)):
            return None  # (uneven or empty blocks: a constraint gathers it)
        return (s.spec, x.shape, np.dtype(x.dtype))

    specs = tuple(spec(x) for x in jax.tree_util.tree_leaves(pending))
    # (one such array: its own constraint is already one collective)
    return specs if sum(s is not None for s in specs) > 1 else (None,) * len(specs)


def _gather_once(mesh: Any, xs: list, specs: list) -> list:
    """Traced: the arrays `xs`, split over `mesh` as `specs` say, whole (replicated), by
    ONE all-gather of every device's blocks as uint32 words (`_wire.words`), each array
    then put together from its blocks (static slices, no collective)."""
    axes = tuple(mesh.axis_names)
    parts = [jax.sharding.PartitionSpec(*spec) for spec, _, _ in specs]

    def local(*blocks: Any) -> Any:
        words = jax.lax.concatenate([_wire.words(b) for b in blocks], 0)
        return jax.lax.all_gather(words, axes)

    gathered = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=tuple(parts),
        out_specs=jax.sharding.PartitionSpec(),
        check_vma=False,  # (an all_gather over every axis is the same on every device)
    )(*xs)
    devices = list(mesh.devices.flat)  # all_gather's order over `axes`: the mesh's
    out, offset = [], 0
    for (_, shape, dtype), part in zip(specs, parts, strict=True):
        placing = jax.sharding.NamedSharding(mesh, part)
        block = placing.shard_shape(shape)
        n = _wire.word_count(block, dtype)
        index = placing.devices_indices_map(shape)
        pieces: dict[tuple[int, ...], Any] = {}
        for k, device in enumerate(devices):
            start = tuple(sl.start or 0 for sl in index[device])
            if start not in pieces:  # (else a copy over an axis it is not split over)
                pieces[start] = _wire.from_words(gathered[k, offset : offset + n], block, dtype)
        out.append(_assembled(pieces, len(shape)))
        offset += n
    return out


def _assembled(pieces: dict[tuple[int, ...], Any], ndim: int, at: tuple = ()) -> Any:
    """The array whose blocks starting at each key of `pieces` are its values: joined
    by concatenations, axis by axis (one fusion; a `dynamic_update_slice` per block was
    a kernel each)."""
    if len(at) == ndim:
        return pieces[at]
    starts = sorted({s[len(at)] for s in pieces if s[: len(at)] == at})
    parts = [_assembled(pieces, ndim, (*at, start)) for start in starts]
    return parts[0] if len(parts) == 1 else jax.lax.concatenate(parts, len(at))


def _default_device() -> Any:
    """The device a program lowered without shardings (`_compile`) runs on."""
    default = jax.config.jax_default_device
    return default if isinstance(default, jax.Device) else jax.devices()[0]


def _compile(key: tuple, pending: tuple[Any, ...], bins: int) -> Any:
    """`_finish` compiled for `pending`'s shapes on the default device (loaded from disk
    if a process compiled it before), kept under `key`."""
    _COMPILED[key] = compiled = _disk_cache.compile_cached(
        lambda: _finish.lower(_specs(pending), jax.ShapeDtypeStruct((), jnp.bool_), bins=bins),
        ("capture.summaries.finish", key),
    )
    return compiled


def _specs(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


# -- the layout program: `Parts` laid out as `Rows` ------------------------------------


def _lay_out_program(parts: tuple[Parts, ...]) -> tuple[Rows, ...]:
    return tuple(_layout(p.values(), sized=True, coarse=p.coarse) for p in parts)


_lay_out = jax.jit(_lay_out_program)


def _layout_key(parts: tuple[Parts, ...]) -> tuple:
    # a member cut from a buffer: the buffer's shape and the cut key it too
    cut = tuple((p.cuts, tuple(jnp.shape(x) for x in p.members)) for p in parts if p.cuts)
    coarse = tuple(p.coarse for p in parts)
    return ("layout", *(p.shapes for p in parts), *cut, coarse, ("x64", _compat.x64_enabled()))


def _compile_layout(key: tuple, parts: tuple[Parts, ...]) -> Any:
    """`_lay_out` compiled for `parts`' shapes, as `_compile` compiles `_finish`."""
    _COMPILED[key] = compiled = _disk_cache.compile_cached(
        lambda: _lay_out.lower(_specs(parts)), ("capture.summaries.layout", key)
    )
    return compiled


def _host_laid(parts: tuple[Parts, ...]) -> bool:
    """Whether `parts` are laid out on the host (`_host_layout`): on a CPU backend,
    whose arrays are host memory already, when every member is a real float (its
    values are its own, `summary._values`, or widen exactly to float32)."""
    return (
        HOST_LAYOUT
        and jax.default_backend() == "cpu"
        and all(
            jnp.issubdtype(np.dtype(dtype), jnp.floating) for p in parts for _, dtype in p.shapes
        )
    )


def _host_layout(parts: Parts) -> Rows | None:
    """`_layout(parts.members, sized=True, coarse=parts.coarse)` with NumPy (the same rows, the
    padding NaN), or None when a member is not in this process's memory whole (a
    multi-process array). No program to compile: on XLA:CPU the layout program of a
    model's shapes compiled for 0.05-0.25 s beside its capture program (a new
    model's first `inspect`), for a copy that NumPy makes in well under 1 ms."""
    concrete = (
        isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) and x.is_fully_addressable
        for x in parts.members
    )
    if not all(concrete):  # traced, or a multi-process array: the layout program
        return None
    plan = _plan([math.prod(shape) for shape, _ in parts.shapes], sized=True, coarse=parts.coarse)
    acc = _summary._value_dtype(np.dtype(parts.shapes[0][1]))[0]
    flat = np.full(plan.total * plan.width, np.nan, acc)
    at = 0
    seen: dict[int, np.ndarray] = {}  # a buffer many members are cut from: viewed once
    for x in parts.members:
        if id(x) not in seen:
            seen[id(x)] = _host_view(x)
    hosted = [seen[id(x)] for x in parts.members]
    for v, rows in zip(parts.values(hosted), plan.rows, strict=False):
        v = v.reshape(-1)
        flat[at : at + v.size] = v  # a float widens exactly to `acc`
        at += rows * plan.width
    n = len(parts.members)
    seg = np.repeat(np.arange(n + 1, dtype=np.int32), [*plan.rows, plan.total - sum(plan.rows)])
    return Rows(flat.reshape(plan.total, plan.width), seg, np.asarray(plan.pads, np.int32))


def _host_view(x: jax.Array) -> np.ndarray:
    """A CPU array's values as NumPy, without a copy: by DLPack (7 us an array, against
    30 us for `np.asarray`'s first view: 60 ms of 2,000 probes), else (a dtype DLPack
    has no code for: bfloat16) `np.asarray`."""
    try:
        return np.from_dlpack(x)
    except (BufferError, TypeError, ValueError, RuntimeError):
        return np.asarray(x)


def _laid_out(pending: tuple[Any, ...]) -> tuple[Any, ...]:
    """`pending` with its `Parts` laid out as `Rows`: on the host (`_host_laid`), else
    by one dispatch of their layout program."""
    parts = tuple(p for p in pending if isinstance(p, Parts))
    if not parts:
        return pending
    if _host_laid(parts):
        laid = [_host_layout(p) for p in parts]
        if all(r is not None for r in laid):
            rows = iter(laid)
            return tuple(next(rows) if isinstance(p, Parts) else p for p in pending)
    key = _layout_key(parts)
    compiled = _compiled(key, lambda: _compile_layout(key, parts))
    try:
        rows = iter(compiled(parts))
    except ValueError:  # compiled for the default device; a mesh's arrays take the jit
        rows = iter(_lay_out(parts))
    return tuple(next(rows) if isinstance(p, Parts) else p for p in pending)
