"""Summaries of every captured array, grouped, computed and packed in the program.

Models repeat shapes (an activation per layer): arrays of one shape and dtype
are stacked and summarised in one batched computation, so the number of XLA
operations does not grow with the number of probes (a 250-layer model compiles
in seconds, not a minute). The stacked summaries leave the program as they are,
packed into one buffer per dtype; the host splits them per array after the one
transfer (`Regroup.apply`, NumPy indexing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from .. import summary as _summary
from .packing import Packed, pack


@dataclass(frozen=True)
class Regroup:
    """Static: which (group, row) of the stacked summaries each array leaf is."""

    treedef: Any  # of the values tree (None leaves kept)
    where: tuple[tuple[int, int] | None, ...]

    def apply(self, tree: dict) -> Any:
        groups = tree["groups"]
        leaves = [
            None if w is None else jax.tree_util.tree_map(lambda a, j=w[1]: a[j], groups[w[0]])
            for w in self.where
        ]
        values = jax.tree_util.tree_unflatten(self.treedef, leaves)
        return values, tree["meta"]


def summarize_packed(values: Any, meta: Any, bins: int) -> Packed:
    """Summarise every array leaf of `values` (None leaves stay None), pack them
    with the raw `meta` arrays; `Packed.unpack()` returns `(summaries, meta)`."""
    leaves, treedef = jax.tree_util.tree_flatten(values, is_leaf=lambda x: x is None)
    groups: dict[tuple, list[int]] = {}
    for i, leaf in enumerate(leaves):
        if leaf is not None:
            groups.setdefault((jnp.shape(leaf), jnp.result_type(leaf)), []).append(i)
    where: list[tuple[int, int] | None] = [None] * len(leaves)
    stacked = []
    for g, idx in enumerate(groups.values()):
        stacked.append(_summary.summarize_stack(jnp.stack([leaves[i] for i in idx]), bins=bins))
        for j, i in enumerate(idx):
            where[i] = (g, j)
    packed = pack({"groups": stacked, "meta": meta})
    return Packed(packed.buffers, packed.layout, Regroup(treedef, tuple(where)))
