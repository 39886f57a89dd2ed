"""Output leaves that are not JAX values, returned beside the program.

An Equinox train step returns its updated model, and a model holds fields that are
neither arrays nor static (`eqx.nn.BatchNorm.axis_name`, a string); a function may
return a label beside its loss. `jax.jit` refuses such an output; `eqx.filter_jit`
returns the arrays from the program and the other leaves as they were when traced.
sowviz does what `eqx.filter_jit` does: `strip` (under the trace) puts None where
such a leaf was and keeps it in a `StaticLeaves`, and `StaticLeaves.restore` (on the
host) puts it back. Python numbers and booleans are such leaves too, as in
`eqx.filter_jit`: an Equinox module's `inference: bool` field must come back a bool,
not a traced array that a later `if self.inference:` under `jax.jit` cannot read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

_JAX_VALUES = (jax.Array, jax.core.Tracer, np.ndarray, np.generic)


def _is_none(x: Any) -> bool:
    return x is None


def not_jax(x: Any) -> bool:
    """A leaf a compiled program cannot return (None is no leaf: an empty subtree)."""
    return x is not None and not isinstance(x, _JAX_VALUES)


@dataclass(frozen=True)
class StaticLeaves:
    """The non-JAX leaves of one traced output: their positions in the output's leaves
    (None counted as a leaf) and their values; `treedef` rebuilds the output."""

    positions: tuple[int, ...] = ()
    values: tuple = ()
    treedef: Any = None

    def restore(self, tree: Any) -> Any:
        """`tree` (a stripped output, as the program returned it) with the leaves back."""
        if not self.positions:
            return tree
        leaves = jax.tree_util.tree_leaves(tree, is_leaf=_is_none)
        for p, v in zip(self.positions, self.values, strict=True):
            leaves[p] = v
        return jax.tree_util.tree_unflatten(self.treedef, leaves)


def number_as_array(out: Any) -> Any:
    """A function's whole output that is a Python number (a constant loss, `return 0.0`)
    as an array, as `jax.grad` and `jax.jit` take it: it is the value differentiated, so
    it cannot be a static leaf (stripped, the loss was None and `grad` said "Output was
    None"). A number inside a tree (an Equinox `Dropout.p`) stays static."""
    if isinstance(out, (int, float, complex)) and not isinstance(out, bool):
        return jax.numpy.asarray(out)
    return out


def strip(out: Any) -> tuple[Any, StaticLeaves]:
    """`out` with None at each leaf that is not a JAX value, and those leaves."""
    leaves, treedef = jax.tree_util.tree_flatten(out, is_leaf=_is_none)
    positions = tuple(i for i, x in enumerate(leaves) if not_jax(x))
    if not positions:
        return out, StaticLeaves()
    values = tuple(leaves[i] for i in positions)
    for i in positions:
        leaves[i] = None
    return jax.tree_util.tree_unflatten(treedef, leaves), StaticLeaves(positions, values, treedef)


def first_static_path(out: Any) -> tuple[str, str] | None:
    """The pytree path and type name of `out`'s first leaf that is not a JAX value."""
    for path, x in jax.tree_util.tree_flatten_with_path(out)[0]:
        if not_jax(x):
            return jax.tree_util.keystr(path), type(x).__name__
    return None
