"""State a function changes in its arguments in place, written back after the call.

A Flax NNX module is a pytree whose leaves live in `nnx.Variable`s, and a layer
may assign to them while it runs: BatchNorm its running statistics, Dropout (any
`nnx.Rngs` stream) its counter. sowviz compiles `fn` like `jax.jit`, which
rebuilds the module from its leaves inside the program, so such assignments land
on that copy and are lost: a training loop driven by `Monitor.step` then drew the
same dropout mask at every step and never updated BatchNorm's statistics.
`nnx.jit` and `nnx.value_and_grad` carry them out instead; so does sowviz:

* while tracing, `changed` compares the arguments' leaves before and after `fn`
  ran and keeps those that hold a new value and sit in a variable it can write
  (`holders`);
* the compiled program returns their new values beside its result;
* `write_back` assigns them to the caller's variables (`Monitor.step`).

`inspect` and `show` only look: they leave the caller's model as it was.
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import jax.numpy as jnp


def _variable_type() -> Any:
    """`nnx.Variable` if Flax NNX is loaded (no import: a model of it is already)."""
    mod = sys.modules.get("flax.nnx")
    return getattr(mod, "Variable", None) if mod is not None else None


def holders(args: Any) -> list[Any]:
    """Per leaf of `args` (in `tree_leaves` order): the `nnx.Variable` holding it alone,
    whose `.value` can be assigned, or None."""
    variable = _variable_type()
    if variable is None:
        return [None] * len(jax.tree_util.tree_leaves(args))
    out: list[Any] = []
    for obj in jax.tree_util.tree_leaves(args, is_leaf=lambda x: isinstance(x, variable)):
        n = len(jax.tree_util.tree_leaves(obj)) if isinstance(obj, variable) else 1
        out += [obj] if isinstance(obj, variable) and n == 1 else [None] * n
    return out


def changed(before: list, args: Any) -> tuple[int, ...]:
    """Positions of the leaves of `args` (as `fn` left them) that are not the leaves
    `before` (as `fn` got them) and sit in a writable variable; none if the number of
    leaves changed (a variable added or removed): nothing maps back then."""
    if _variable_type() is None:  # no NNX loaded: no variable to write
        return ()
    after = jax.tree_util.tree_leaves(args)
    if len(after) != len(before):
        return ()
    held = holders(args)
    return tuple(
        k
        for k, (old, new) in enumerate(zip(before, after, strict=True))
        if new is not old and held[k] is not None
    )


def new_value_label(name: str) -> str:
    """The graph's label of the value `fn` writes to the leaf `name` (`model.bn.mean.value`
    gives `new model.bn.mean`): the news first, since a long label is cut at its end."""
    return "new " + name.removesuffix(".value")


def values(args: Any, positions: tuple[int, ...]) -> tuple:
    """The leaves of `args` at `positions`, as arrays (a program's outputs)."""
    leaves = jax.tree_util.tree_leaves(args)
    return tuple(jnp.asarray(leaves[k]) for k in positions)


def snapshot(args: Any) -> Any:
    """`args` as they are now: a new tree over the same (immutable) array leaves, so
    that values written back later do not reach it (new module objects for NNX)."""
    return jax.tree_util.tree_map(lambda x: x, args)


def write_back(args: Any, positions: tuple[int, ...], new: tuple) -> None:
    """Assign `new` to the variables of `args` holding the leaves at `positions`."""
    held = holders(args)
    for k, value in zip(positions, new, strict=True):
        var = held[k]
        if hasattr(var, "set_value"):  # Flax >= 0.12 deprecates assigning `.value`
            var.set_value(value)
        else:
            var.value = value
