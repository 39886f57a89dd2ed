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

    def summary(self) -> Summary:
        """The stacked `Summary` (static fields the stack's; `Regroup` gives each
        member its own shape and dtype)."""
        fields = _ops.table_fields(self.table, self.bins)
        fields["nan"] = self.nan
        data, xp = _on_host((self.count, self.min, self.max, self.c1, self.c2, self.shift))
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

    def summary(self) -> Summary:
        """The stacked `Summary`, per-iteration statistics included."""
        (pooled, rows, pads), xp = _on_host((self.pooled, self.rows, self.pads))
        with np.errstate(all="ignore"):  # an empty member's 0 / 0, discarded by `where`
            fields = _ops.pooled_fields(pooled, self.bins, xp)
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
