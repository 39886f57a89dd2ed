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

import math
import weakref
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat, _wire


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
    summarised 64x64 MLP step's summaries on a CPU. One read already (a Monitor's
    step, fetched on the training thread) is taken as it is: `jax.device_get` of a
    NumPy array gives it back, for 10 µs."""
    if isinstance(buf, np.ndarray):
        return buf
    return np.asarray(buf) if isinstance(buf, jax.Array) else jax.device_get(buf)


def _unflatten(layout: Layout, bufs: Any) -> Any:
    words = bufs[0] if bufs else None
    if isinstance(words, np.ndarray):
        return _unflatten_host(layout, words.view(np.uint32))
    leaves = []
    for slot in layout.slots:
        if slot is None:
            leaves.append(None)
            continue
        off, shape, dtype = slot
        n = _wire.word_count(shape, dtype)
        leaves.append(_wire.from_words(words[off : off + n], shape, dtype))
    return jax.tree_util.tree_unflatten(layout.treedef, leaves)


def _unflatten_host(layout: Layout, words: np.ndarray) -> Any:
    """`_unflatten` of host words: each dtype's words converted once (`_host_plan`), each
    leaf a view of them. A size (`_wire.word_count`, an `np.prod`) and a conversion per
    leaf made this 72 µs of CPU for a recorded Monitor step of 23 probes (now 17 µs)."""
    leaves: list[Any] = [None] * len(layout.slots)
    for start, end, dtype, pieces in _host_plan(layout):
        flat = _wire.from_words(words[start:end], (-1,), dtype)
        for i, lo, hi, shape in pieces:
            leaves[i] = flat[lo:hi].reshape(shape)
    return jax.tree_util.tree_unflatten(layout.treedef, leaves)


#: A layout's `_host_plan` by its id, while it lives: a compiled program's layout is one
#: object, unpacked at every recorded step (hashing it would hash all its slots).
_PLANS: dict[int, tuple[Any, tuple]] = {}


def _host_plan(layout: Layout) -> tuple:
    """How to cut host words laid out by `layout`: per run of words converted at once
    (`_wire.from_words`), ``(start, end, dtype, pieces)``, and per leaf of it,
    ``(leaf index, start, end, shape)`` in elements of the converted run."""
    key = id(layout)
    got = _PLANS.get(key)
    if got is not None and got[0]() is layout:
        return got[1]
    plan = _make_host_plan(layout)
    # (the dict bound now: at interpreter exit the module's globals are gone)
    _PLANS[key] = (weakref.ref(layout, lambda _, plans=_PLANS: plans.pop(key, None)), plan)
    return plan


def _make_host_plan(layout: Layout) -> tuple:
    by_dtype: dict[str, list[tuple]] = {}
    for i, slot in enumerate(layout.slots):
        if slot is not None:
            off, shape, dtype = slot
            by_dtype.setdefault(dtype, []).append((i, off, _wire.word_count(shape, dtype), shape))
    runs = []
    for name, slots in by_dtype.items():
        dtype = np.dtype(name)
        per = 2 if dtype.itemsize == 8 else 1  # words per element
        start = min(off for _, off, _, _ in slots)
        end = max(off + n for _, off, n, _ in slots)
        if (end - start) % per or any((off - start) % per for _, off, _, _ in slots):
            # not one run (`pack` lays a dtype's leaves side by side): a run per leaf
            runs += [
                (off, off + n, dtype, ((i, 0, n // per, shape),)) for i, off, n, shape in slots
            ]
            continue
        pieces = tuple(
            (i, (off - start) // per, (off - start + n) // per, shape) for i, off, n, shape in slots
        )
        runs.append((start, end, dtype, pieces))
    return tuple(runs)


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


def pack_host(tree: Any) -> Packed:
    """`pack` of a tree of NumPy leaves, with NumPy (the same layout and words): the
    summaries the host combined (`summary_chunks`), joined to a program's."""
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=lambda x: x is None)
    leaves = [None if v is None else np.asarray(v) for v in leaves]
    avals = [None if v is None else (tuple(v.shape), v.dtype) for v in leaves]
    starts, total = _wire.offsets(avals)
    slots = tuple(
        None if a is None else (start, a[0], a[1].name)
        for a, start in zip(avals, starts, strict=True)
    )
    buf = np.empty(total, np.uint32)
    for v, start in zip(leaves, starts, strict=True):
        if v is not None:
            n = _wire.word_count(v.shape, v.dtype)
            buf[start : start + n] = _host_words(v)
    return Packed((buf,) if total else (), Layout(treedef, slots, total))


def _host_words(v: np.ndarray) -> np.ndarray:
    """`_wire.words` of a NumPy array (what `_wire.from_words` reads back)."""
    v = np.ascontiguousarray(v).reshape(-1)
    if v.dtype == np.bool_ or v.dtype.itemsize < 4:
        return v.view(np.dtype(f"u{v.dtype.itemsize}")).astype(np.uint32)
    return v.view(np.uint32)


# -- captures carried by a loop --------------------------------------------------------

#: Captured values of at most this many elements share one carried buffer per dtype
#: (`Carried`); larger ones are carried as they are (joining them would copy them).
CARRY_PACK_MAX_ELEMENTS = 1 << 12


@dataclass(frozen=True)
class Carried:
    """How a loop carries a list of captured values: the small ones of each dtype side
    by side in one flat buffer, every other value as it is, and a value that appears
    twice (one traced value: the `iterations` count every capture of an inner while
    loop shares) once. XLA gives every carried value of a while loop, and every
    stacked output of a scan, a buffer, copies and a kernel of its own: a NUTS step's
    430 probes of one or two elements each, carried per value through its nested while
    loops and stacked per value by a scan, made its capture program compile for 11 s
    against 1.6 s for the plain program.

    `slots`: per value, ("packed", buffer, offset, shape) or ("alone", buffer);
    `buffers`: each buffer's (shape, dtype); `members`: per buffer, the positions of
    the values that fill it (one, alone), in order."""

    slots: tuple[tuple, ...]
    buffers: tuple[tuple[tuple[int, ...], Any], ...]
    members: tuple[tuple[int, ...], ...]

    @staticmethod
    def of(values: list, pack: bool = True) -> Carried:
        """The layout of `values` (arrays, traced, or `Template`s; one object where one
        value appears twice); with `pack` False, each carried alone (`Recorder.packs`)."""
        owner: dict[int, int] = {}  # id of a value -> its first position
        by_dtype: dict[Any, list[int]] = {}
        alone: list[int] = []
        for i, v in enumerate(values):
            if owner.setdefault(id(v), i) != i:
                continue
            if pack and _packable(v):
                # (a value every device of a `shard_map` holds alike stays apart from
                # one that varies: it is kept once, not once per device)
                by_dtype.setdefault((np.dtype(_dtype(v)), _varying(v)), []).append(i)
            else:
                alone.append(i)
        slot: dict[int, tuple] = {}
        buffers, members = [], []
        for (dtype, _), idx in by_dtype.items():
            b, off = len(buffers), 0
            for i in idx:
                shape = tuple(np.shape(values[i]))
                slot[i] = ("packed", b, off, shape)
                off += math.prod(shape)
            buffers.append(((off,), dtype))
            members.append(tuple(idx))
        for i in alone:
            slot[i] = ("alone", len(buffers))
            buffers.append((tuple(np.shape(values[i])), _dtype(values[i])))
            members.append((i,))
        slots = tuple(slot[owner[id(v)]] for v in values)
        return Carried(slots, tuple(buffers), tuple(members))

    def pack(self, values: list) -> list:
        """`values` (traced, laid out as the ones given to `of`) as the loop's buffers.

        By position, not by identity: a while loop's layout is found by tracing its body
        once (`rules._discover`, its operands fresh values each), and the body traced
        again in the loop may hold one value where that trace held two (operands of the
        loop bound to one outer value, each recorded as it is: a diffrax `ForwardMode`
        solve's), which would lay the values out otherwise. A value that appeared twice
        in the first trace is one in any other (it is one computation), and each
        position here takes its slot's place: the layout is what `of` found, whatever
        this trace shares."""
        if len(values) != len(self.slots) or any(  # an engine bug, never a user error
            tuple(np.shape(v)) != self._shape(slot) or _dtype(v) != self._dtype(slot)
            for v, slot in zip(values, self.slots, strict=False)
        ):
            raise RuntimeError(
                "sowviz internal error: a loop body's captures differ from those found "
                "when it was first traced; please report this with the program."
            )
        out = []
        for (_, dtype), idx in zip(self.buffers, self.members, strict=True):
            if self.slots[idx[0]][0] == "alone":
                out.append(values[idx[0]])
            else:
                parts = [jnp.reshape(jnp.asarray(values[i], dtype), (-1,)) for i in idx]
                out.append(jnp.concatenate(parts) if len(parts) > 1 else parts[0])
        return out

    def _shape(self, slot: tuple) -> tuple[int, ...]:
        return slot[3] if slot[0] == "packed" else self.buffers[slot[1]][0]

    def _dtype(self, slot: tuple) -> Any:
        return self.buffers[slot[1]][1]

    def zeros(self, lead: tuple[int, ...] = ()) -> list:
        """Buffers of zeros, with leading axes `lead` (the rows a loop keeps)."""
        return [jnp.zeros((*lead, *shape), dtype) for shape, dtype in self.buffers]

    def unpack(self, buffers: list, lead: int = 0) -> list:
        """The values out of `buffers` (with `lead` leading axes each: stacked rows),
        one traced value per distinct value, as `of` found them; each cut from a buffer
        is recorded as a `View` of it."""
        made: dict[tuple, Any] = {}
        out = []
        for slot in self.slots:
            got = made.get(slot)
            if got is None:
                got = made[slot] = _unpacked(buffers, slot, lead)
            out.append(got)
        return out


@dataclass(frozen=True, eq=False)
class View:
    """A value that is a cut of a flat buffer (`cut`): ``buffer[..., offset:offset +
    size]`` reshaped to ``(*buffer.shape[:lead], *shape)``. The summaries read many
    such values at once from their buffer (one kernel for all, `summaries`), or on
    the host, instead of one kernel per value."""

    buffer: Any
    lead: int
    offset: int
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def cut(self, buffer: Any = None) -> Any:
        """The value, cut from `buffer` (default: its own; NumPy or traced)."""
        buf = self.buffer if buffer is None else buffer
        head = tuple(buf.shape[: self.lead])
        part = buf[(slice(None),) * self.lead + (slice(self.offset, self.offset + self.size),)]
        return part.reshape((*head, *self.shape))


@dataclass(frozen=True)
class Passed:
    """How captured values leave a sub-program (`rules._jit`, `_remat`) and come back
    as what they were: each distinct value once, and for values cut from one loop's
    buffer (`View`s), that buffer once, cut again outside. Returned as their cuts, a
    jit's (an Equinox `filter_jit`, a diffrax solve) were values of their own outside
    it: each was masked and left the program alone, a slice at an offset of its own
    and so an XLA kernel of its own (a diffrax `ForwardMode` solve: 880 more kernels,
    compile 8.9 -> 22.9 s), where the same values carried one by one share one kernel
    per shape.

    `outputs`: what the sub-program returns; `slots`: per value, ("value", output) or
    ("view", output, lead, offset, shape)."""

    outputs: tuple[Any, ...]
    slots: tuple[tuple, ...]

    @staticmethod
    def of(values: list) -> Passed:
        outputs: list = []
        index: dict[int, int] = {}  # id of an output -> its position

        def output(x: Any) -> int:
            if id(x) not in index:
                index[id(x)] = len(outputs)
                outputs.append(x)
            return index[id(x)]

        slots = []
        for v in values:
            view = view_of(v)
            if view is None:
                slots.append(("value", output(v)))
            else:
                slots.append(("view", output(view.buffer), view.lead, view.offset, view.shape))
        return Passed(tuple(outputs), tuple(slots))

    def values(self, outputs: list) -> list:
        """The values again, out of the sub-program's `outputs`; one traced value per
        distinct slot, a cut recorded as a `View` of its buffer."""
        made: dict[tuple, Any] = {}
        out = []
        for slot in self.slots:
            got = made.get(slot)
            if got is None:
                if slot[0] == "value":
                    got = outputs[slot[1]]
                else:
                    view = View(outputs[slot[1]], *slot[2:])
                    got = as_view(view.cut(), view)
                made[slot] = got
            out.append(got)
        return out


# Views by the id of the value (a tracer), while it lives: trace-time bookkeeping only.
_VIEWS: dict[int, tuple[Any, View]] = {}


def view_of(value: Any) -> View | None:
    """The `View` `value` was cut as (`Carried.unpack`, `as_view`), or None."""
    got = _VIEWS.get(id(value))
    return got[1] if got is not None and got[0]() is value else None


def as_view(value: Any, view: View) -> Any:
    """Record `value` (a traced array) as `view`; returns `value`."""
    key = id(value)
    try:
        # (the dict bound now: at interpreter exit the module's globals are gone)
        ref = weakref.ref(value, lambda _, views=_VIEWS: views.pop(key, None))
    except TypeError:  # not a tracer (a concrete array under no trace): no view
        return value
    _VIEWS[key] = (ref, view)
    return value


@dataclass(frozen=True, eq=False)
class Template:
    """A captured value's type, as a loop's first trace found it (`rules._discover`):
    its shape, dtype and the `shard_map` axes it varies over."""

    shape: tuple[int, ...]
    dtype: Any
    varying: frozenset = frozenset()

    @staticmethod
    def of(v: Any) -> Template:
        return Template(tuple(jnp.shape(v)), jnp.result_type(v), _varying(v))


def _varying(v: Any) -> frozenset:
    if isinstance(v, Template):
        return v.varying
    return _compat.varying_axes(v)


def _dtype(v: Any) -> Any:
    # a sown literal is a Python number, not an array
    return v.dtype if hasattr(v, "dtype") else jnp.result_type(v)


def _packable(v: Any) -> bool:
    """A value of a plain NumPy dtype (not float0, not a PRNG key) and small."""
    dtype = _dtype(v)
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return False
    return np.dtype(dtype).kind in "biufc" and math.prod(np.shape(v)) <= CARRY_PACK_MAX_ELEMENTS


def _unpacked(buffers: list, slot: tuple, lead: int) -> Any:
    if slot[0] == "alone":
        return buffers[slot[1]]
    _, b, off, shape = slot
    view = View(buffers[b], lead, off, shape)
    return as_view(view.cut(), view)
