"""A stacked summary whose counts are still one table, as the segmented summary
(`summary_ops.segment_stats`) leaves them.

Sliced into the summary's count fields inside the program, the table cost a
kernel per field on XLA:CPU (eight) and one more copy of every count into the
packed output; the finish program compiled those eight kernels and ran them at
every recorded step of a Monitor. So the table leaves the program whole, and
`Tallied.summary` slices it where it is read: NumPy views on the host, after the
one transfer (`Regroup.apply`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax

from .. import summary_ops as _ops
from ..summary_data import STAT_KEYS, Summary

#: The statistics that stay in the table (`nan` is kept apart, its padding taken off).
_IN_TABLE = ("posinf", "neginf", "zeros")
_DATA = (
    *(k for k in STAT_KEYS if k not in _IN_TABLE),
    "hist_edges",
    "loghist_start",
    "table",
)


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=_DATA, meta_fields=("dtype", "bins")
)
@dataclasses.dataclass(frozen=True)
class Tallied:
    """Stacked statistics of like-dtype members (leading axis) with their counts in
    `table` (`summary_ops.table_fields`), except `nan`, kept apart with the layout's
    padding taken off. NumPy or traced leaves."""

    count: Any
    nan: Any
    min: Any
    max: Any
    mean: Any
    std: Any
    l2: Any
    absmax: Any
    hist_edges: Any
    loghist_start: Any
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
        plain = {k: getattr(self, k) for k in _DATA if k not in ("table", "nan")}
        return Summary(
            **plain,
            **fields,
            per_iteration=None,
            shape=(),
            dtype=self.dtype,
            is_complex=False,
            bins=self.bins,
        )
