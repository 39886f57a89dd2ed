"""The input and output nodes of the stage graph: one group per argument (per
returned value), nested by pytree path.

A mixin of `build._Builder` (it needs `new`): `leaf_tree` yields, per flat input or
output, its chain of group nodes, which the edge lifting compares like any other
chain.

An input is drawn with the mesh axes its argument lies along (`placed_inputs`), as an
Explicit mesh writes them into the type (`float32[32,64@model]`): on an Auto mesh no
type says them, and a tensor-parallel program looked single-device. Inside the program
an Auto mesh's shardings are XLA's choice, unknown at trace time; only what the program
asks (`with_sharding_constraint`: `constrained_shapes`) is drawn.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

from .. import _compat
from .names import path_label, shape_str, typed

#: Per flat input of the program being drawn, the mesh axes its argument lies along
#: (`_compat.placement_axes`), or None; set by `placed_inputs`.
_PLACED: contextvars.ContextVar[tuple[_compat.MeshAxes | None, ...]] = contextvars.ContextVar(
    "sowviz_placed_inputs", default=()
)


@contextlib.contextmanager
def placed_inputs(axes: Sequence[_compat.MeshAxes | None]) -> Iterator[None]:
    """Within: `build_graph` draws flat input `k` as lying along the mesh axes
    `axes[k]` (`float32[32,64@model]`; None: its type alone)."""
    token = _PLACED.set(tuple(axes))
    try:
        yield
    finally:
        _PLACED.reset(token)


def placed_shape(aval: Any, axes: _compat.MeshAxes | None) -> str:
    """`aval`'s type with `axes` (per dimension, the mesh axes that split it) written
    in as an Explicit mesh's are (`float32[64@data,64@model]`); its type alone
    (`shape_str`) without axes, or when its type carries some already."""
    shape = getattr(aval, "shape", None)
    if not axes or shape is None or len(axes) != len(shape) or _compat.explicit_axes(aval):
        return shape_str(aval)
    return typed(aval.dtype, shape, axes)


def constrained_shapes(eqn: Any) -> tuple[str, ...] | None:
    """A `with_sharding_constraint` equation's output type with the sharding it asks
    for (`float32[64@data,64@model]`: two constraints of one shape read alike on an
    Auto mesh, whose types carry no axes), or None for another equation."""
    axes = _compat.constraint_axes(eqn)
    return None if axes is None else (placed_shape(eqn.outvars[0].aval, axes),)


class InputsMixin:
    new: Any

    def leaf_tree(self, root, group, label, vars_, kind="input", nest=False):
        """`kind` nodes (input or output) of one argument or returned value (`group`:
        (flat index, name, path tokens)), nested by path under a group node when there
        are several or `nest`; yields (flat index, chain)."""
        if len(group) == 1 and not nest:
            k, name, tokens = group[0]
            rec = self.new(kind, name + "".join(tokens), root.id)
            rec.shapes = (_leaf_shape(vars_, k, kind),)
            yield k, (rec.id,)
            return
        top = self.new("scope", label, root.id)
        top.shapes = tuple(_leaf_shape(vars_, k, kind) for k, _, _ in group)
        yield from self._level(top, (top.id,), [(k, t) for k, _, t in group], vars_, kind)

    def _level(self, parent, chain, items, vars_, kind):
        # Children by first token, in order; a chain of single children is one label (but
        # a lone leaf's last token: `FourierEmbs_0` > `kernel`, below).
        firsts: dict[str, list[tuple[int, list[str]]]] = {}
        for k, tokens in items:
            firsts.setdefault(tokens[0] if tokens else "", []).append((k, tokens))
        for first, sub in firsts.items():
            prefix = [first]
            while len(sub) > 1 and all(len(t) > len(prefix) for _, t in sub):
                nxt = {t[len(prefix)] for _, t in sub}
                if len(nxt) != 1:
                    break
                prefix.append(nxt.pop())
            label = path_label(prefix)
            if not first:  # paths that end here (names alike): each its own leaf
                for k, _ in sub:
                    rec = self.new(kind, label or "value", parent.id)
                    rec.shapes = (_leaf_shape(vars_, k, kind),)
                    yield k, (*chain, rec.id)
                continue
            if len(sub) == 1:
                k, tokens = sub[0]
                holder, here = parent, chain
                if len(tokens) > 1:
                    # A module's lone parameter is drawn in its module's group, as a
                    # module's several are: `FourierEmbs_0` > `kernel` beside `Dense_0` >
                    # `kernel`, so `probe("FourierEmbs_0/kernel")` finds it (it read
                    # `FourierEmbs_0.kernel`, a path of its own). An output alike: the
                    # step's new `ln/scale` is spelled as its input is (it read `ln.scale`).
                    group = self.new("scope", path_label(tokens[:-1]), parent.id)
                    group.shapes = (_leaf_shape(vars_, k, kind),)
                    holder, here, tokens = group, (*chain, group.id), tokens[-1:]
                rec = self.new(kind, path_label(tokens) or label, holder.id)
                rec.shapes = (_leaf_shape(vars_, k, kind),)
                yield k, (*here, rec.id)
                continue
            rec = self.new("scope", label, parent.id)
            rec.shapes = tuple(_leaf_shape(vars_, k, kind) for k, _ in sub)
            rest = [(k, t[len(prefix) :]) for k, t in sub]
            yield from self._level(rec, (*chain, rec.id), rest, vars_, kind)


def _leaf_shape(vars_: Sequence[Any], k: int, kind: str) -> str:
    # an input as its argument lies (`placed_inputs`); an output by its type alone: where
    # an Auto mesh puts it is XLA's choice
    placed = _PLACED.get() if kind == "input" else ()
    return placed_shape(vars_[k].aval, placed[k] if k < len(placed) else None)
