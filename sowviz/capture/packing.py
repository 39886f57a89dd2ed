"""Pack many small arrays into one buffer, to leave a program cheaply.

A compiled program pays about a microsecond per output buffer; a model with a
few hundred probes, each summarised into 15 arrays, would otherwise return
thousands. And every buffer read on the host is a round trip (about 200 µs on
a GPU, serialised). Summaries are packed inside the program into ONE flat
uint32 buffer, every dtype bitcast to words (`sowviz._wire`), and unpacked on
the host with NumPy views after one transfer. The layout is static and rides in
the output's pytree structure (`Packed` keeps it as aux data), so `jax.jit`
caches it with the compiled program.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _wire


@dataclass(frozen=True)
class Layout:
    treedef: Any
    # Per leaf: (offset in words, shape, dtype name); None marks a None leaf.
    slots: tuple[tuple[int, tuple[int, ...], str] | None, ...]
    words: int  # the buffer's length (no buffer when 0)


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

    def unpack(self, regroup: bool = True, rows: bool = False) -> Any:
        """The original tree: NumPy leaves after one transfer, or traced slices under a
        trace. With `regroup=False`, the packed tree itself (before `regroup.apply`);
        with `rows`, the members of stacked summaries as `SummaryRow`s, for their JSON
        only (`summaries.Regroup.apply`)."""
        traced = any(isinstance(b, jax.core.Tracer) for b in self.buffers)
        bufs = self.buffers if traced else tuple(_host(b) for b in self.buffers)
        parts = self.layout.parts if isinstance(self.layout, Joined) else ((self.layout, -1),)
        trees, start = [], 0
        for layout, n in parts:
            n = len(bufs) - start if n < 0 else n
            trees.append(_unflatten(layout, bufs[start : start + n]))
            start += n
        if not regroup:
            return trees[0] if len(trees) == 1 else tuple(trees)
        if self.regroup is None:
            return trees[0]
        return self.regroup.apply(*trees, rows=rows)

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


def _host(buf: Any) -> Any:
    """`buf` on the host. A device array is read with `np.asarray`: `jax.device_get`
    costs about 70 µs more per call (its explicit-transfer scope), a tenth of a
    summarised 64x64 MLP step's summaries on a CPU."""
    return np.asarray(buf) if isinstance(buf, jax.Array) else jax.device_get(buf)


def _unflatten(layout: Layout, bufs: Any) -> Any:
    words = bufs[0] if bufs else None
    if isinstance(words, np.ndarray):
        words = words.view(np.uint32)
    leaves = []
    for slot in layout.slots:
        if slot is None:
            leaves.append(None)
            continue
        off, shape, dtype = slot
        n = _wire.word_count(shape, dtype)
        leaves.append(_wire.from_words(words[off : off + n], shape, dtype))
    return jax.tree_util.tree_unflatten(layout.treedef, leaves)


def pack(tree: Any) -> Packed:
    """Pack the array leaves of `tree` (traced) into one uint32 buffer (none if no leaf),
    laid out by `_wire.offsets` (leaves of one dtype together)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=lambda x: x is None)
    leaves = [None if v is None else jnp.asarray(v) for v in leaves]
    avals = [None if v is None else (tuple(v.shape), np.dtype(v.dtype)) for v in leaves]
    starts, total = _wire.offsets(avals)
    slots = tuple(
        None if a is None else (start, a[0], a[1].name)
        for a, start in zip(avals, starts, strict=True)
    )
    buf = _wire.concat_words(leaves)
    return Packed(() if buf is None else (buf,), Layout(treedef, slots, total))
