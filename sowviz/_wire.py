"""Many small device arrays to the host in ONE transfer.

On a GPU every device→host transfer is a round trip: on an H100 (JAX 0.11) a read
of a few bytes took 170–200 µs, and the reads of several arrays were serialised.
A recorded `Monitor` step used to fetch its summary buffers (one per dtype, from
two programs), its finite flags, its clean flag and its loss: 5–7 round trips.
`gather` bitcasts them all to uint32 words and concatenates them in one small
compiled program; `split` takes the host copy apart again with NumPy views, so
the step costs one round trip whatever it carries.

Every dtype travels bit for bit: 4-byte types are bitcast, 8-byte types are
bitcast to word pairs, and narrower types (bool, int8/16, float16, bfloat16) to
their unsigned integer of the same width, widened to a word.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _compat


@dataclass(frozen=True)
class Slot:
    offset: int  # in words
    words: int
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class WireLayout:
    treedef: Any  # of the gathered tree (None leaves kept)
    slots: tuple[Slot | None, ...]
    words: int


_UINT = {1: jnp.uint8, 2: jnp.uint16}


def words(x: jax.Array) -> jax.Array:
    """`x` as a flat uint32 vector, bit for bit (see the module docstring)."""
    size = np.dtype(x.dtype).itemsize
    if x.dtype == jnp.bool_:
        w = x.astype(jnp.uint32)
    elif size == 4:
        w = jax.lax.bitcast_convert_type(x, jnp.uint32)
    elif size == 8:  # a trailing axis of two words per element (memory order)
        w = jax.lax.bitcast_convert_type(x, jnp.uint32)
    else:
        w = jax.lax.bitcast_convert_type(x, _UINT[size]).astype(jnp.uint32)
    return jnp.ravel(w)


def _leaves(tree: Any) -> tuple[list[Any], Any]:
    return jax.tree_util.tree_flatten(tree, is_leaf=lambda v: v is None)


def _by_dtype(dtypes: list[Any]) -> dict[np.dtype, list[int]]:
    """Indices of the leaves of each dtype (None: no leaf), dtypes in first-seen order:
    the order of the words in a buffer (leaves of one dtype are concatenated before
    one bitcast; a bitcast per leaf was a kernel per leaf on XLA:CPU)."""
    groups: dict[np.dtype, list[int]] = {}
    for i, dtype in enumerate(dtypes):
        if dtype is not None:
            groups.setdefault(np.dtype(dtype), []).append(i)
    return groups


def offsets(avals: list[tuple[tuple[int, ...], Any] | None]) -> tuple[list[int | None], int]:
    """Where each ``(shape, dtype)`` (None: no leaf) starts in `concat_words`' buffer,
    in words, and the buffer's length."""
    out: list[int | None] = [None] * len(avals)
    offset = 0
    for dtype, idx in _by_dtype([None if a is None else a[1] for a in avals]).items():
        for i in idx:
            out[i] = offset
            offset += word_count(avals[i][0], dtype)  # type: ignore[index]
    return out, offset


def concat_words(leaves: list[Any]) -> jax.Array | None:
    """Traced: the array `leaves` (None: skipped) as one uint32 vector, laid out as
    `offsets` says; None when there is no leaf."""
    arrays = [None if v is None else jnp.asarray(v) for v in leaves]
    parts = []
    for idx in _by_dtype([None if a is None else a.dtype for a in arrays]).values():
        flat = [jax.lax.reshape(arrays[i], (arrays[i].size,)) for i in idx]
        parts.append(words(flat[0] if len(flat) == 1 else jax.lax.concatenate(flat, 0)))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else jax.lax.concatenate(parts, 0)


@jax.jit
def _gather(tree: Any) -> jax.Array:
    buf = concat_words(_leaves(tree)[0])
    return jnp.zeros((0,), jnp.uint32) if buf is None else buf


def gather(tree: Any) -> tuple[jax.Array, WireLayout]:
    """One uint32 device buffer holding every array leaf of `tree` (None leaves stay
    None), and the layout `split` needs. One dispatch; start the copy with
    ``buf.copy_to_host_async()``."""
    leaves, treedef = _leaves(tree)
    device = _one_of(leaves)
    if device is not None:
        tree = jax.tree_util.tree_unflatten(
            treedef, [v if v is None else _compat.copy_on(v, device) for v in leaves]
        )
    key = (
        treedef,
        tuple(None if v is None else (tuple(v.shape), np.dtype(v.dtype)) for v in leaves),
    )
    return _gather(tree), _layout(*key)


def _one_of(leaves: list[Any]) -> Any:
    """The device of the first leaf on one device when others lie on several (a
    Monitor's step on a CPU mesh: its second programs' summaries on one device of it,
    `summaries.finish(..., home=False)`, the capture program's parts replicated over
    it), where the gather runs; None when the leaves need no move.

    A committed leaf's device is preferred; else an uncommitted one's: a Monitor's
    summaries on a CPU mesh come out of their program uncommitted, on the mesh's
    first device, and the gather, left to `jax.jit`, moved them onto the mesh and
    ran partitioned over its 8 devices (0.6-1.0 ms per read of a 2-D tensor-parallel
    step's parts, against 0.09-0.16 ms on one device).

    Not cached on the leaves' placements (as `_layout` is on their shapes): building
    and hashing that key (each leaf's sharding and committed flag) took 3.1-5.7 µs for
    a read's 8 parts against this walk's 3.0-7.2 µs, once per read of `_MAX_PENDING`
    steps (`benchmarks/monitor_fixed_cost.py --wire`): under 0.4 µs per recorded
    step, for a cache that would keep meshes alive."""
    committed = uncommitted = None
    several = False
    for v in leaves:
        if isinstance(v, jax.Array):
            devices = v.sharding.device_set
            if len(devices) > 1:
                if not v.is_fully_addressable:  # (several processes: left to the gather)
                    return None
                several = True
            elif v.committed:
                committed = committed or next(iter(devices))
            else:
                uncommitted = uncommitted or next(iter(devices))
    return (committed or uncommitted) if several else None


@functools.lru_cache(maxsize=256)
def _layout(treedef: Any, avals: tuple) -> WireLayout:
    starts, total = offsets(list(avals))
    slots = tuple(
        None if a is None else Slot(start, word_count(*a), a[0], a[1])
        for a, start in zip(avals, starts, strict=True)
    )
    return WireLayout(treedef, slots, total)


def word_count(shape: tuple[int, ...], dtype: Any) -> int:
    """How many uint32 words `_words` makes of an array of `shape` and `dtype`."""
    n = int(np.prod(shape, dtype=np.int64))
    return 2 * n if np.dtype(dtype).itemsize == 8 else n


def from_words(w: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """The array `_words` made `w` of: NumPy views of host words, or (traced words,
    inside a program) the matching bitcasts."""
    dtype = np.dtype(dtype)
    if isinstance(w, np.ndarray):
        if dtype == np.bool_:
            v = w.astype(np.bool_)
        elif dtype.itemsize in (4, 8):
            v = w.view(dtype)
        else:
            v = w.astype(np.dtype(f"u{dtype.itemsize}")).view(dtype)
        return v.reshape(shape)
    if dtype == np.bool_:
        v = w.astype(jnp.bool_)
    elif dtype.itemsize == 4:
        v = jax.lax.bitcast_convert_type(w, dtype)
    elif dtype.itemsize == 8:
        v = jax.lax.bitcast_convert_type(w.reshape(-1, 2), dtype)
    else:
        v = jax.lax.bitcast_convert_type(w.astype(_UINT[dtype.itemsize]), dtype)
    return v.reshape(shape)


def split(host: np.ndarray, layout: WireLayout) -> Any:
    """The tree `gather` packed, from the host copy of its buffer (NumPy leaves)."""
    words = np.asarray(host, np.uint32)
    if words.size != layout.words:
        raise ValueError(
            f"sowviz: a transfer buffer holds {words.size} words where its layout expects "
            f"{layout.words}; it was gathered from another tree."
        )
    leaves = []
    for s in layout.slots:
        if s is None:
            leaves.append(None)
            continue
        leaves.append(from_words(words[s.offset : s.offset + s.words], s.shape, s.dtype))
    return jax.tree_util.tree_unflatten(layout.treedef, leaves)
