"""Pack many small arrays into one buffer per dtype, to leave a program cheaply.

A compiled program pays about a microsecond per output buffer; a model with a
few hundred probes, each summarised into 15 arrays, would otherwise return
thousands. Summaries are packed inside the program into one flat buffer per
dtype and unpacked on the host with NumPy after ONE transfer. The layout is
static and rides in the output's pytree structure (`Packed` keeps it as aux
data), so `jax.jit` caches it with the compiled program.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class Layout:
    treedef: Any
    # Per leaf: (buffer key, offset, shape, dtype name); None marks a None leaf.
    slots: tuple[tuple[str, int, tuple[int, ...], str] | None, ...]
    keys: tuple[str, ...]  # buffer keys in output order


@dataclass(frozen=True)
class Joined:
    """The layout of buffers packed by several programs: `parts` are (layout, number of
    buffers) in order; `Packed.unpack` gives `regroup.apply` one tree per part."""

    parts: tuple[tuple[Layout, int], ...]


@jax.tree_util.register_pytree_node_class
class Packed:
    """Flat buffers (children) plus their static layout (aux data).

    `pending` (children too) holds inputs of work left to a second program
    (`summaries.finish`); a `Packed` with pending work cannot be unpacked whole."""

    def __init__(
        self,
        buffers: tuple[Any, ...],
        layout: Layout | Joined,
        regroup: Any = None,
        pending: tuple[Any, ...] = (),
    ):
        self.buffers = buffers
        self.layout = layout
        # Optional static post-processing of the unpacked tree on the host.
        self.regroup = regroup
        self.pending = pending

    def tree_flatten(self):
        return (self.buffers, self.pending), (self.layout, self.regroup)

    @classmethod
    def tree_unflatten(cls, aux, children):
        buffers, pending = children
        return cls(tuple(buffers), *aux, pending=tuple(pending))

    def fetch_async(self) -> None:
        """Start the device→host copy without waiting for it."""
        for b in self.buffers:
            if hasattr(b, "copy_to_host_async"):
                b.copy_to_host_async()

    def unpack(self, regroup: bool = True) -> Any:
        """The original tree: NumPy leaves after one transfer, or traced slices under a
        trace. With `regroup=False`, the packed tree itself (before `regroup.apply`)."""
        traced = any(isinstance(b, jax.core.Tracer) for b in self.buffers)
        bufs = self.buffers if traced else jax.device_get(self.buffers)
        parts = self.layout.parts if isinstance(self.layout, Joined) else ((self.layout, -1),)
        trees, start = [], 0
        for layout, n in parts:
            n = len(bufs) - start if n < 0 else n
            trees.append(_unflatten(layout, bufs[start : start + n]))
            start += n
        if not regroup:
            return trees[0] if len(trees) == 1 else tuple(trees)
        return trees[0] if self.regroup is None else self.regroup.apply(*trees)

    def joined(self, other: Packed) -> Packed:
        """These buffers followed by `other`'s (packed by another program), this regroup."""
        mine = (
            self.layout.parts
            if isinstance(self.layout, Joined)
            else ((self.layout, len(self.buffers)),)
        )
        return Packed(
            self.buffers + other.buffers,
            Joined((*mine, (other.layout, len(other.buffers)))),
            self.regroup,
        )


def _unflatten(layout: Layout, bufs: Any) -> Any:
    by_key = dict(zip(layout.keys, bufs, strict=True))
    leaves = []
    for slot in layout.slots:
        if slot is None:
            leaves.append(None)
            continue
        key, off, shape, _ = slot
        flat = by_key[key][off : off + math.prod(shape)]
        leaves.append(flat.reshape(shape))
    return jax.tree_util.tree_unflatten(layout.treedef, leaves)


def pack(tree: Any) -> Packed:
    """Pack the array leaves of `tree` (traced) into one buffer per dtype."""
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=lambda x: x is None)
    groups: dict[str, list[Any]] = {}
    sizes: dict[str, int] = {}
    slots: list[tuple[str, int, tuple[int, ...], str] | None] = []
    for leaf in leaves:
        if leaf is None:
            slots.append(None)
            continue
        leaf = jnp.asarray(leaf)
        key = np.dtype(leaf.dtype).name
        off = sizes.get(key, 0)
        slots.append((key, off, tuple(leaf.shape), key))
        groups.setdefault(key, []).append(jnp.ravel(leaf))
        sizes[key] = off + leaf.size
    keys = tuple(sorted(groups))
    buffers = tuple(
        jnp.concatenate(groups[k]) if len(groups[k]) > 1 else groups[k][0] for k in keys
    )
    return Packed(buffers, Layout(treedef, tuple(slots), keys))
