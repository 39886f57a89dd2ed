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


@jax.tree_util.register_pytree_node_class
class Packed:
    """Flat buffers (children) plus their static layout (aux data)."""

    def __init__(self, buffers: tuple[Any, ...], layout: Layout, regroup: Any = None):
        self.buffers = buffers
        self.layout = layout
        # Optional static post-processing of the unpacked tree on the host.
        self.regroup = regroup

    def tree_flatten(self):
        return self.buffers, (self.layout, self.regroup)

    @classmethod
    def tree_unflatten(cls, aux, buffers):
        return cls(tuple(buffers), *aux)

    def fetch_async(self) -> None:
        """Start the device→host copy without waiting for it."""
        for b in self.buffers:
            if hasattr(b, "copy_to_host_async"):
                b.copy_to_host_async()

    def unpack(self) -> Any:
        """The original tree: NumPy leaves after one transfer, or traced slices under a trace."""
        traced = any(isinstance(b, jax.core.Tracer) for b in self.buffers)
        bufs = self.buffers if traced else jax.device_get(self.buffers)
        by_key = dict(zip(self.layout.keys, bufs, strict=True))
        leaves = []
        for slot in self.layout.slots:
            if slot is None:
                leaves.append(None)
                continue
            key, off, shape, _ = slot
            flat = by_key[key][off : off + math.prod(shape)]
            leaves.append(flat.reshape(shape))
        tree = jax.tree_util.tree_unflatten(self.layout.treedef, leaves)
        return tree if self.regroup is None else self.regroup.apply(tree)


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
