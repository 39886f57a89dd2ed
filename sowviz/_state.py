"""State a function changes in its arguments in place, written back after the call.

A Flax NNX module is a pytree whose leaves live in `nnx.Variable`s, and a layer
may assign to them while it runs: BatchNorm its running statistics, Dropout (any
`nnx.Rngs` stream) its counter. sowviz compiles `fn` like `jax.jit`, which
rebuilds the module from its leaves inside the program, so such assignments land
on that copy and are lost: a training loop driven by `Monitor.step` then drew the
same dropout mask at every step and never updated BatchNorm's statistics.
`nnx.jit` and `nnx.value_and_grad` carry them out instead; so does sowviz:

* while tracing, `compare` compares the arguments' leaves before and after `fn`
  ran and keeps those that hold a new value and sit in a variable it can write
  (`holders`); `_program.Traced` then leaves out those the traced program
  returns as they came in (`_forwarding`: an `nnx.jit` or `nnx.scan` hands every
  variable back as a new value, changed or not);
* the compiled program returns their new values beside its result;
* `write_back` assigns them to the caller's variables (`Monitor.step`).

`inspect` and `show` only look: they leave the caller's model as it was.
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


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


def shared_variable(args: Any, leaves: list[Any]) -> tuple[int, int] | None:
    """Two positions of `leaves` (`args`' leaves) that one `nnx.Variable` holds: a module
    or parameter reached by two paths of a Flax NNX model (tied weights, a module kept
    in a list and an attribute). As a pytree, as `jax.jit` sees it, each path would be
    a copy of its own. None when there is none; cheap when no array repeats."""
    if _variable_type() is None or len(set(map(id, leaves))) == len(leaves):
        return None
    first: dict[int, int] = {}
    for k, var in enumerate(holders(args)):
        if var is not None:
            if id(var) in first:
                return first[id(var)], k
            first[id(var)] = k
    return None


def constant_leaves(args: Any) -> frozenset[int]:
    """Positions (in `tree_leaves` order) of the leaves an `nnx.Variable` other than an
    `nnx.Param` holds, or an NNX module holds in no variable: a model's state
    (BatchNorm statistics, RNG keys and counts, counters) and fixed tables, which
    `nnx.grad` leaves alone by default and sowviz does too (a power iteration's
    `lax.while_loop` over such state could not be differentiated)."""
    variable = _variable_type()
    if variable is None:
        return frozenset()
    nnx = sys.modules["flax.nnx"]
    held = holders(args)
    out = {k for k, h in enumerate(held) if h is not None and not isinstance(h, nnx.Param)}
    # An array a module holds outside any variable (`self.table = jnp.ones(...)`) is no
    # parameter either: `nnx.grad` leaves it alone too.
    k = 0
    for obj in jax.tree_util.tree_leaves(args, is_leaf=lambda x: isinstance(x, nnx.Module)):
        n = len(jax.tree_util.tree_leaves(obj)) if isinstance(obj, nnx.Module) else 1
        if isinstance(obj, nnx.Module):
            out.update(k + j for j in range(n) if held[k + j] is None)
        k += n
    return frozenset(out)


def leaves(args: Any) -> list[tuple[str, Any]]:
    """`args`' leaves with their paths, to compare before and after `fn` (`compare`);
    none without Flax NNX loaded (no variable to write back)."""
    if _variable_type() is None:
        return []
    return [(jax.tree_util.keystr(p), x) for p, x in jax.tree_util.tree_flatten_with_path(args)[0]]


def compare(
    before: list[tuple[str, Any]], args: Any
) -> tuple[tuple[int, ...], tuple[str, ...], tuple]:
    """What `fn` did to its arguments: the positions in `before` (`leaves` of the
    arguments as `fn` got them) of the leaves it left holding a new value where a
    writable variable holds them (`args` as it left them, matched by path: a variable
    `fn` added with `Module.sow`, or removed, moves the others' positions, not their
    paths), the paths of the leaves it added (no caller's variable holds them, so they
    are not written back), and the new values at those positions, as arrays (a
    program's outputs)."""
    if not before:  # no NNX loaded: no variable to write
        return (), (), ()
    held = holders(args)
    after = {path: (x, held[k]) for k, (path, x) in enumerate(leaves(args))}
    positions = tuple(
        k
        for k, (path, old) in enumerate(before)
        if path in after and after[path][0] is not old and after[path][1] is not None
    )
    old = {path for path, _ in before}
    added = tuple(path for path in after if path not in old)
    return positions, added, tuple(jnp.asarray(after[before[k][0]][0]) for k in positions)


ADDED = (
    "sowviz.Monitor: `fn` added {n} variable(s) to its arguments ({paths}), e.g. with "
    "`Module.sow`; they are not written back to your model (the state it already had "
    "is). Return them instead: `nnx.capture`, or `has_aux=True` with the values as aux."
)


def new_value_label(name: str) -> str:
    """The graph's label of the value `fn` writes to the leaf `name` (`model.bn.mean.value`
    gives `new model.bn.mean`): the news first, since a long label is cut at its end."""
    return "new " + name.removesuffix(".value")


def write_back(args: Any, positions: tuple[int, ...], new: tuple) -> None:
    """Assign `new` to the variables of `args` holding the leaves at `positions`."""
    held = holders(args)
    for k, value in zip(positions, new, strict=True):
        var = held[k]
        if hasattr(var, "set_value"):  # Flax >= 0.12 deprecates assigning `.value`
            var.set_value(value)
        else:
            var.value = value


def snapshot(args: tuple) -> tuple:
    """`args` as they are now, kept apart from the caller's objects: what `show`'s widget
    re-runs on when its mode changes. A Flax NNX module is trained in place
    (`nnx.Optimizer.update` assigns its variables), so a widget re-running on the caller's
    module showed the gradients of parameters trained since, under the same picture: each
    NNX object is cloned (`nnx.clone`: its own variables, holding the same arrays, its
    sharing kept), a NumPy array (which `-=` changes) copied, and every container rebuilt.
    JAX arrays are immutable: they are kept, not copied."""
    nnx = sys.modules.get("flax.nnx")
    is_node = getattr(getattr(nnx, "graph", None), "is_graph_node", None)

    def is_leaf(x: Any) -> bool:
        return is_node is not None and is_node(x)

    def copy(x: Any) -> Any:
        if is_leaf(x):
            return nnx.clone(x)
        return np.array(x, copy=True) if isinstance(x, np.ndarray) else x

    return tuple(jax.tree_util.tree_map(copy, a, is_leaf=is_leaf) for a in args)


DELETED = (
    "The arguments `show()` was given hold an array deleted since (`{path}`): it was "
    "donated to a jitted step (`donate_argnums`, `nnx.jit(..., donate_argnums=...)`) or "
    "deleted by hand, so this widget cannot re-run its inspection in mode '{mode}' on the "
    "arguments it has shown. Call `sowviz.show(...)` again with the current arguments, or "
    "train without donating them."
)


def deleted_leaf(args: tuple) -> str | None:
    """The path of a deleted JAX array among `args`' leaves (`DELETED`), or None."""
    for path, x in jax.tree_util.tree_flatten_with_path(args)[0]:
        is_deleted = getattr(x, "is_deleted", None)
        if isinstance(x, jax.Array) and callable(is_deleted) and is_deleted():
            return jax.tree_util.keystr(path)
    return None
