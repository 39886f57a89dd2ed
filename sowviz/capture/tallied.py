"""Stacked summaries still as their program leaves them: counts in one table (the
segmented summary, `summary_ops.segment_stats`: `Tallied`), sums and tallies
(per-iteration stacks, `summary_ops.raw_stats`, and groups of large arrays,
`summary_blocks.grouped_stats`: `TalliedRows`).

Sliced into the summary's count fields inside the program, the table cost a
kernel per field on XLA:CPU (eight) and one more copy of every count into the
packed output; the finish program compiled those eight kernels and ran them at
every recorded step of a Monitor. So the table leaves the program whole, and
`Tallied.summary` slices it where it is read: NumPy views on the host, after the
one transfer (`Regroup.apply`). The per-member arithmetic after the last pass
(mean, std, l2, the histogram's edges, the log window) is left there too
(`summary_ops.moment_fields`): a few operations on a few hundred values, which
were 8 of the shared summary program's 40 kernels (its XLA:CPU compile, the
critical path of a first `inspect` on a machine: 0.32 -> 0.29-0.30 s).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import summary_ops as _ops
from ..summary_data import IterationStats, Summary

_DATA = ("count", "nan", "min", "max", "c1", "c2", "shift", "table")


def _on_host(tree: Any) -> tuple[Any, Any]:
    """`tree` and the array module to finish it with: NumPy leaves and `numpy` after
    the transfer, or `tree` as it is and `jax.numpy` under a trace (the summaries of
    a program that calls `save_intermediates`)."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree)):
        return tree, jnp
    return jax.tree_util.tree_map(np.asarray, tree), np


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=_DATA, meta_fields=("dtype", "bins")
)
@dataclasses.dataclass(frozen=True)
class Tallied:
    """Stacked statistics of like-dtype members (leading axis) as
    `summary_ops.segment_stats` leaves them: finite count and range, centred sums
    (`moment_fields`), and counts in `table` (`summary_ops.table_fields`) except
    `nan`, kept apart with the layout's padding taken off. NumPy or traced leaves."""

    count: Any
    nan: Any
    min: Any
    max: Any
    c1: Any
    c2: Any
    shift: Any
    table: Any
    dtype: str
    bins: int

    # What `summary.all_clean` reads, beside `nan` (in a program: fused into its reduction).
    @property
    def posinf(self) -> Any:
        return self.table[..., self.bins + 1]

    @property
    def neginf(self) -> Any:
        return self.table[..., self.bins + 2]

    def moments(self) -> tuple[Any, ...]:
        """What `summary_ops.moment_fields` finishes (`finished` joins stacks')."""
        return (self.count, self.min, self.max, self.c1, self.c2, self.shift)

    def summary(self, moments: dict | None = None) -> Summary:
        """The stacked `Summary` (static fields the stack's; `Regroup` gives each
        member its own shape and dtype); `moments`: its `moment_fields`, when made
        already (`finished`)."""
        fields = _ops.table_fields(self.table, self.bins)
        fields["nan"] = self.nan
        if moments is None:
            data, xp = _on_host(self.moments())
            with np.errstate(all="ignore"):  # an empty member's 0 / 0, discarded by `where`
                moments = _ops.moment_fields(*data, self.bins, xp)
        return Summary(
            **moments,
            **fields,
            per_iteration=None,
            shape=(),
            dtype=self.dtype,
            is_complex=False,
            bins=self.bins,
        )


_ROW_DATA = ("pooled", "rows", "nan", "pads")


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=_ROW_DATA,
    meta_fields=("dtype", "bins", "shape", "index", "iterations"),
)
@dataclasses.dataclass(frozen=True)
class TalliedRows:
    """A stack's statistics as `summary_ops.raw_stats` leaves them: its members'
    pooled statistics and (a stack of per-iteration captures, `summaries.Iterated`)
    those of each kept iteration, still sums and tallies (`pooled_fields`,
    `row_fields` finish them in `summary`: on the host, where their few operations
    per member or row cost no kernels; finished in the program they were 29 of the
    67 kernels of a scan's per-iteration summary program, 0.2 s of its XLA:CPU
    compile, and 16 of a group of large arrays', 0.08 s). `nan` has the stack's NaN
    padding taken off (what `summary.all_clean` reads in the program); `pads` is
    each member's padding per iteration, taken off its rows' ``nonfinite`` in
    `summary`. `rows` and `pads` are None without per-iteration statistics. NumPy
    or traced leaves."""

    pooled: dict
    rows: dict | None
    nan: Any
    pads: Any
    dtype: str
    bins: int
    shape: tuple[int, ...]
    index: tuple[int, ...] = ()
    iterations: int = 0

    @property
    def posinf(self) -> Any:
        return self.pooled["lin"][..., self.bins + 1]

    @property
    def neginf(self) -> Any:
        return self.pooled["lin"][..., self.bins + 2]

    def moments(self) -> tuple[Any, ...]:
        """What `summary_ops.moment_fields` finishes (`finished` joins stacks')."""
        return tuple(self.pooled[k] for k in _ops.MOMENTS)

    def summary(self, moments: dict | None = None) -> Summary:
        """The stacked `Summary`, per-iteration statistics included; `moments`: its
        `moment_fields`, when made already (`finished`)."""
        (pooled, rows, pads), xp = _on_host((self.pooled, self.rows, self.pads))
        with np.errstate(all="ignore"):  # an empty member's 0 / 0, discarded by `where`
            if moments is None:
                fields = _ops.pooled_fields(pooled, self.bins, xp)
            else:
                fields = dict(moments, **_ops.count_fields(pooled["lin"], pooled["log"], self.bins))
            per_row = None if rows is None else _ops.row_fields(rows, pooled, self.bins, xp)
        fields["nan"] = self.nan
        per = None
        if per_row is not None:
            per_row["nonfinite"] = per_row["nonfinite"] - pads[:, None]
            per = IterationStats(**per_row, index=self.index, iterations=self.iterations)
        return Summary(
            **fields,
            per_iteration=per,
            shape=self.shape,
            dtype=self.dtype,
            is_complex=False,
            bins=self.bins,
        )


def finished(groups: list) -> list:
    """`groups` with each `Tallied` and `TalliedRows` finished into its `Summary`.

    Stacks on the host whose moment inputs share dtypes and bins are finished
    together: `summary_ops.moment_fields` is about sixty NumPy calls whatever the
    members, a few microseconds each on a few dozen values, and a recorded Monitor
    step holds a stack per kind of summary (its segmented layout, its grouped or
    per-iteration arrays); one call over their members joined costs what one stack
    did (a 23-probe MLP's two stacks: 133 µs of CPU a recorded step, finished one by
    one). Elementwise IEEE arithmetic: each member's fields are what its stack alone
    would make, bit for bit."""
    out = list(groups)
    joint: dict[tuple, list[tuple[int, tuple]]] = {}
    for i, group in enumerate(groups):
        if not isinstance(group, (Tallied, TalliedRows)):
            continue
        data = group.moments()
        if all(isinstance(x, np.ndarray) and x.ndim == 1 for x in data):
            key = (tuple(x.dtype for x in data), group.bins)
            joint.setdefault(key, []).append((i, data))
        else:  # traced, or not yet on the host: alone
            out[i] = group.summary()
    for (_, bins), members in joint.items():
        made = _joint_moments([d for _, d in members], bins)
        for (i, _), moments in zip(members, made, strict=True):
            out[i] = groups[i].summary(moments)
    return out


def _joint_moments(stacks: list[tuple], bins: int) -> list[dict]:
    """`summary_ops.moment_fields` of each of `stacks` (NumPy inputs of one dtype each),
    made in one call over their members joined, then cut back per stack (views)."""
    if len(stacks) == 1:
        parts = stacks[0]
    else:
        parts = tuple(np.concatenate(column) for column in zip(*stacks, strict=True))
    with np.errstate(all="ignore"):  # an empty member's 0 / 0, discarded by `where`
        fields = _ops.moment_fields(*parts, bins, np)
    if len(stacks) == 1:
        return [fields]
    ends = np.cumsum([len(s[0]) for s in stacks]).tolist()
    return [
        {name: value[start:end] for name, value in fields.items()}
        for start, end in zip([0, *ends[:-1]], ends, strict=True)
    ]
