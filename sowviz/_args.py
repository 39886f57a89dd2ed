"""Arguments split as `equinox.filter_jit` splits them, and where each array sits.

Array leaves (`jax.Array`, NumPy arrays and scalars) are traced; every other leaf
(functions, strings, Python numbers, Equinox module fields) is static. The static
part and the tree structure form an `ArgSpec`: hashable, it is a static argument of
`jax.jit`, so the compiled-program cache keys on it. `Layout` says which argument
and path each array input has, and rebuilds per-argument trees of gradients.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _compat, _state

ARRAY_TYPES = (jax.Array, np.ndarray, np.generic)

_TRACER = (
    "sowviz.{where} was called on traced values (argument leaf `{path}` is a JAX tracer): "
    "it runs inside `jax.jit`, `vmap` or another transformation. sowviz compiles the "
    "program itself; call it outside the transformation (e.g. call `mon.step(params, "
    "batch)` in place of your jitted value-and-grad, and jit only the update)."
)
CLOSED_TRACER = (
    "sowviz: a value your function closes over is traced (a JAX tracer, {kind}): "
    "`inspect`, `show` or `Monitor.step` runs inside `jax.jit`, `vmap`, `grad` or another "
    "transformation, and the function uses one of that transformation's values. sowviz "
    "compiles the program itself; call it outside the transformation, and pass that value "
    "as an argument (e.g. `inspect(lambda w, s: loss(w * s), w, s)`, not a lambda "
    "closing over `s`)."
)
_UNHASHABLE = (
    "sowviz.{where}: the argument leaf `{path}` (a {type}) is neither an array nor "
    "hashable, so it can be neither traced nor used as a static cache key. Mark it "
    "static (make it hashable, or an `eqx.field(static=True)`), turn it into an array, "
    "or split it off with `eqx.partition` and close over it (functools.partial)."
)

_HI = (
    "sowviz.{where}: the argument leaf `{path}` is a {type}, a value JAX traces through "
    "a type of its own (Flax NNX makes one per variable under "
    "`nnx.var_defaults(hijax=True)`). sowviz splits arguments into arrays and static "
    "leaves, and would cache this one as static: your in-place updates would go unseen. "
    "Make the model with plain variables (`with nnx.var_defaults(hijax=False): model = "
    "...`), or pass the arrays themselves."
)
_SHARED = (
    "sowviz.{where}: `{a}` and `{b}` are one `nnx.Variable`, reached by two paths of a "
    "Flax NNX model (a shared module or tied weights). sowviz splits its arguments as "
    "`jax.jit` does, as a pytree, where each path would be a copy of its own: shared "
    "state would run apart and a tied parameter would get one partial gradient per "
    "path (`nnx.jit` and `nnx.value_and_grad` keep the sharing). Give sowviz the "
    "model's split state, which holds each variable once, and a function of it:\n"
    "    graphdef, state = nnx.split(model)\n"
    "    def loss_of_state(state, *args):\n"
    "        return loss(nnx.merge(graphdef, state), *args)\n"
    "then pass `loss_of_state` and `state` where you passed your function and model."
)


def _paths(args: Any) -> list[str]:
    """Per leaf of `args`, its path (`[0]['w']`). The leaves of an Equinox
    `eqx.nn.State` are named by the layer that owns them (`[1].bn1.ema_state_index[0]`),
    not by their flat position in it (`[1][<flat index 1>][0]`), which JAX gives; so
    are the children of any other node that gives JAX no keys, by the attributes
    holding them (`_Named`: a sparse `BCOO`'s `.data` and `.indices`)."""
    state = _eqx_state()
    named = _Named(args)
    if state is None:
        return [named(p) for p, _ in jax.tree_util.tree_flatten_with_path(args)[0]]
    out = []
    flat, _ = jax.tree_util.tree_flatten_with_path(args, is_leaf=lambda x: isinstance(x, state))
    for p, x in flat:
        if not isinstance(x, state):
            out.append(named(p))
            continue
        values, treedef = jax.tree_util.tree_flatten(x, is_leaf=functools.partial(_is_not, x))
        markers = treedef.node_data()[1]  # the State's keys: `make_with_state` names them
        for k, (value, marker) in enumerate(zip(values, markers, strict=True)):
            at = _OWNER.sub("", marker, count=1) if isinstance(marker, str) else f"[{k}]"
            at = at if at.startswith((".", "[")) else "." + at
            out += [named(p) + at + q for q in _paths(value)]
    return out


class _Named:
    """`jax.tree_util.keystr` of paths in `root`, but a child that its node's flatten
    gives JAX by position only (`FlattenedIndexKey`, printed `[<flat index 0>]`: a
    class registered with a plain `tree_flatten`, such as `jax.experimental.sparse.
    BCOO`) is named by the one attribute of the node that holds it (`.data`), else
    by its position (`[0]`)."""

    def __init__(self, root: Any):
        self.root = root
        self._children: dict[int, tuple[Any, list[tuple[Any, Any]]]] = {}

    def __call__(self, path: tuple) -> str:
        if not any(isinstance(k, jax.tree_util.FlattenedIndexKey) for k in path):
            return jax.tree_util.keystr(path)  # (nearly always: no walk)
        out, node = "", self.root
        for key in path:
            child = dict(self.children(node)).get(key)
            if isinstance(key, jax.tree_util.FlattenedIndexKey):
                out += _attribute_holding(node, child) or f"[{key.key}]"
            else:
                out += jax.tree_util.keystr((key,))
            node = child
        return out

    def children(self, node: Any) -> list[tuple[Any, Any]]:
        """`node`'s own children, one level down, with their keys."""
        hit = self._children.get(id(node))
        if hit is None or hit[0] is not node:
            flat, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
            hit = self._children[id(node)] = (node, [(p[0], x) for p, x in flat if p])
        return hit[1]


def _attribute_holding(node: Any, child: Any) -> str | None:
    """`.name` of the one attribute of `node` that is `child` itself; None when none
    or several are (a skeleton of small integers, where `0 is 0`: the position then)."""
    if child is None:
        return None
    attributes = dict(getattr(node, "__dict__", {}))
    for cls in type(node).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if isinstance(slot, str) and slot not in attributes and hasattr(node, slot):
                attributes[slot] = getattr(node, slot)
    names = [name for name, value in attributes.items() if value is child]
    return f".{names[0]}" if len(names) == 1 and names[0].isidentifier() else None


#: `make_with_state` names a state `CNN.bn1.ema_state_index`: the model's class, then
#: the path to the layer's `StateIndex`.
_OWNER = re.compile(r"^[A-Za-z_]\w*")


def _is_not(x: Any, v: Any) -> bool:
    return v is not x  # the State's own values are its leaves here


def _eqx_state() -> type | None:
    eqx = sys.modules.get("equinox")
    return getattr(getattr(eqx, "nn", None), "State", None) if eqx is not None else None


class ArgSpec:
    """The static part of a call: tree structure, static leaves, array positions."""

    __slots__ = ("_hash", "dynamic", "static", "treedef")

    def __init__(self, treedef: Any, static: tuple, dynamic: tuple[int, ...]):
        self.treedef, self.static, self.dynamic = treedef, static, dynamic
        self._hash = hash((treedef, static))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ArgSpec)
            and self._hash == other._hash
            and self.treedef == other.treedef
            and self.static == other.static
        )

    def merge(self, dyn: Any) -> tuple:
        leaves: list[Any] = [None] * self.treedef.num_leaves
        for i, leaf in self.static:
            leaves[i] = leaf
        for i, x in zip(self.dynamic, dyn, strict=True):
            leaves[i] = x
        return jax.tree_util.tree_unflatten(self.treedef, leaves)


#: (tree structure, leaf types) -> positions of the array leaves, for `split`. A step
#: of a model with hundreds of parameter leaves re-derived them leaf by leaf in Python
#: (250 leaves: ~100 µs a call on this CPU); the same structure and types split alike.
_DYNAMIC: dict[tuple, tuple[int, ...]] = {}
_DYNAMIC_MAX = 64


#: Python numbers that are traced when a whole argument is one and it is differentiated
#: (`split`'s `numbers`), as `jax.grad(f)(3.0)` traces it.
TRACED_NUMBERS = (float, complex)


def split(args: tuple, where: str, numbers: tuple[int, ...] = ()) -> tuple[ArgSpec, list]:
    """Partition `args` into its static `ArgSpec` and the list of array leaves, and
    the arguments at `numbers` that are a Python float or complex number themselves
    (`traced_numbers`: differentiated, as `jax.grad` differentiates `f(3.0)`), which
    are traced too, as weak-typed scalars. Other Python numbers stay static."""
    leaves, treedef = jax.tree_util.tree_flatten(args)
    number_leaves = _number_leaves(args, treedef, numbers)
    key = (treedef, tuple(map(type, leaves)), number_leaves)
    idx = _DYNAMIC.get(key)
    if idx is None:
        idx = tuple(
            i
            for i, leaf in enumerate(leaves)
            if isinstance(leaf, ARRAY_TYPES)
            or (i in number_leaves and type(leaf) in TRACED_NUMBERS)
        )
        for i in idx:
            if isinstance(leaves[i], jax.core.Tracer):
                raise TypeError(_TRACER.format(where=where, path="args" + _paths(args)[i]))
        for i, leaf in enumerate(leaves):
            if i not in idx and _compat.is_hi_value(leaf):
                path = "args" + _paths(args)[i]
                raise TypeError(_HI.format(where=where, path=path, type=type(leaf).__name__))
        if len(_DYNAMIC) >= _DYNAMIC_MAX:
            _DYNAMIC.clear()
        _DYNAMIC[key] = idx
    shared = _state.shared_variable(args, leaves)
    if shared is not None:
        paths = _paths(args)
        a, b = (f"args{paths[k]}" for k in shared)
        raise ValueError(_SHARED.format(where=where, a=a, b=b))
    if len(idx) == len(leaves):  # the usual case: every leaf an array
        dyn, static = leaves, ()
    else:
        dyn = [leaves[i] for i in idx]
        arrays = set(idx)
        static = tuple((i, leaf) for i, leaf in enumerate(leaves) if i not in arrays)
    try:
        spec = ArgSpec(treedef, static, idx)
    except TypeError:
        paths = _paths(args)
        i, leaf = next((i, v) for i, v in static if not _hashable(v))
        raise TypeError(
            _UNHASHABLE.format(where=where, path="args" + paths[i], type=type(leaf).__name__)
        ) from None
    return spec, dyn


def _number_leaves(args: tuple, treedef: Any, numbers: tuple[int, ...]) -> frozenset[int]:
    """Positions among `args`' leaves of the arguments at `numbers` that are a bare
    Python float or complex number (not a bool, not in a pytree: a model's `float`
    field stays static, as `equinox.filter_jit` keeps it)."""
    if not numbers:
        return frozenset()
    starts, start = [], 0
    for child in treedef.children():
        starts.append(start)
        start += child.num_leaves
    return frozenset(starts[a] for a in numbers if type(args[a]) in TRACED_NUMBERS)


def traced_numbers(mode: Any, argnums: Any, args: tuple) -> tuple[int, ...]:
    """The arguments that are a Python float or complex number and are differentiated:
    `argnums` (argument 0 by default in mode grad, as `jax.grad`; in modes jvp, vjp and
    all only when `argnums` names them, for by default they take every argument, and a
    number there stays static, as documented). `split` traces them."""
    mode = getattr(mode, "value", mode)
    if mode == "primal" or (argnums is None and mode != "grad"):
        return ()
    nums = (0 if argnums is None else argnums,) if not isinstance(argnums, tuple) else argnums
    n = len(args)
    return tuple(a % n for a in nums if -n <= a < n and type(args[a % n]) in TRACED_NUMBERS)


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def positional_names(fn: Callable) -> list[str]:
    """The names of `fn`'s positional parameters (none when it has no signature): how
    arguments are named in the graph (`params['w']`, `teacher: MLP`). A function that
    `checkify.checkify` wraps is named by its own (`params`, `x`, not `arg0`, `arg1`)."""
    fn = _compat.checkify_wrapped(fn) or fn
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin, or a callable without a signature
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _is_float(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        dtype = jnp.result_type(x)
    return dtype != jax.dtypes.float0 and jnp.issubdtype(dtype, jnp.inexact)


@dataclass(frozen=True)
class Layout:
    """Where each array input (`dyn[j]`) sits among the arguments."""

    n_args: int
    arg_of: tuple[int, ...]  # per array input: its positional argument
    floating: tuple[int, ...]  # array inputs with an inexact dtype (differentiated)
    paths: tuple[str, ...]  # per array input: pytree path inside the argument tuple
    leaf_of: tuple[int, ...]  # per array input: index among all leaves
    kinds: tuple[str, ...]  # per leaf: dtype or type name, for messages
    arg_trees: tuple[Any, ...]  # per argument: its treedef
    offsets: tuple[int, ...]  # per argument: index of its first leaf
    #: the arguments `argnums` selects (None: not given): the others' leaves are not
    #: in `floating` (a jvp pushes no tangent into them)
    selected: tuple[int, ...] | None = None
    #: the static leaves `(index among all leaves, value)` (`ArgSpec.static`), for
    #: messages (`opaque`)
    static: tuple = field(default=(), compare=False, repr=False)

    def input_trees(self, nums: tuple[int, ...], values: dict[int, Any]) -> tuple:
        """One tree per argument in `nums`: `values[j]` at array input j, None elsewhere."""
        by_leaf = {self.leaf_of[j]: v for j, v in values.items()}
        out = []
        for i in nums:
            start, tree = self.offsets[i], self.arg_trees[i]
            leaves = [by_leaf.get(start + k) for k in range(tree.num_leaves)]
            out.append(jax.tree_util.tree_unflatten(tree, leaves))
        return tuple(out)

    def describe_arg(self, i: int) -> str:
        start, n = self.offsets[i], self.arg_trees[i].num_leaves
        kinds = self.kinds[start : start + n]
        return ", ".join(kinds[:6]) + (", ..." if len(kinds) > 6 else "") if kinds else "none"

    def opaque(self, i: int) -> tuple[str, str]:
        """`opaque_leaf` of the first static leaf of argument `i` it names, or ("", "")."""
        start, n = self.offsets[i], self.arg_trees[i].num_leaves
        for k, leaf in self.static:
            if start <= k < start + n and opaque_leaf(leaf)[0]:
                return opaque_leaf(leaf)
        return "", ""


def _layout(
    spec: ArgSpec,
    dyn: list,
    paths: list[str],
    constant: frozenset[int] = frozenset(),
    selected: tuple[int, ...] | None = None,
) -> Layout:
    """Where `dyn` sits among the arguments; the leaves at `constant` (positions among
    all leaves: a Flax NNX model's non-`Param` state, `_state.constant_leaves`) and
    those of arguments outside `selected` (when given) are not differentiated,
    whatever their dtype."""
    arg_trees = tuple(spec.treedef.children())
    offsets, start = [], 0
    for t in arg_trees:
        offsets.append(start)
        start += t.num_leaves
    arg_of = tuple(
        max(k for k, o in enumerate(offsets) if o <= i and arg_trees[k].num_leaves)
        for i in spec.dynamic
    )
    kinds = [type(v).__name__ for _, v in spec.static]
    by_leaf = dict(zip([i for i, _ in spec.static], kinds, strict=True))
    for i, x in zip(spec.dynamic, dyn, strict=True):
        by_leaf[i] = str(jnp.result_type(x))
    return Layout(
        n_args=len(arg_trees),
        arg_of=arg_of,
        floating=tuple(
            j
            for j, x in enumerate(dyn)
            if _is_float(x)
            and spec.dynamic[j] not in constant
            and (selected is None or arg_of[j] in selected)
        ),
        paths=tuple(paths[i] for i in spec.dynamic),
        leaf_of=spec.dynamic,
        kinds=tuple(by_leaf[i] for i in range(spec.treedef.num_leaves)),
        arg_trees=arg_trees,
        offsets=tuple(offsets),
        selected=selected,
        static=spec.static,
    )


def opaque_leaf(leaf: Any) -> tuple[str, str]:
    """What a static leaf is when it is what hides an argument's arrays from JAX:
    ("function", its name) for a function given where arrays belong; ("object", its
    class) for an instance of a class that is not a pytree but holds arrays in its
    attributes (`self.w = jnp.ones(...)`: JAX sees one opaque leaf); else ("", "")."""
    if inspect.isroutine(leaf) or isinstance(leaf, functools.partial):
        name = getattr(leaf, "__name__", None) or type(leaf).__name__
        return "function", name
    return ("object", type(leaf).__name__) if _holds_arrays(leaf) else ("", "")


def _holds_arrays(obj: Any, depth: int = 3) -> bool:
    """Whether `obj`'s attributes (or theirs: `self.layer.w`, `depth` levels) hold an array."""
    attrs = getattr(obj, "__dict__", None)
    if depth == 0 or isinstance(obj, type) or inspect.ismodule(obj) or not isinstance(attrs, dict):
        return False
    for x in jax.tree_util.tree_leaves(list(attrs.values())):
        if isinstance(x, (jax.Array, np.ndarray)) or _holds_arrays(x, depth - 1):
            return True
    return False


def module_tangents(args: tuple, tangents: Any) -> Any:
    """`tangents` with an `nnx.State` given for a Flax NNX model argument (what
    `nnx.state(model, nnx.Param)` and `nnx.value_and_grad` hand an NNX user) made the
    module copy the program takes, the model's other state given zero tangents (its
    integer state, an RNG stream's key and count, kept: it carries none)."""
    nnx = sys.modules.get("flax.nnx")
    if nnx is None or not isinstance(tangents, tuple) or len(tangents) != len(args):
        return tangents
    return tuple(
        _module_tangent(nnx, a, t) if isinstance(a, nnx.Module) and isinstance(t, nnx.State) else t
        for a, t in zip(args, tangents, strict=True)
    )


def _module_tangent(nnx: Any, model: Any, tangent: Any) -> Any:
    graphdef, state = nnx.split(model)
    given = dict(nnx.to_flat_state(tangent))

    def leaf(path: tuple, var: Any) -> Any:
        if path in given:
            return given[path]
        value = var[...]
        return var.replace(jnp.zeros_like(value)) if _is_float(value) else var

    flat = [(path, leaf(path, var)) for path, var in nnx.to_flat_state(state)]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _user_tangents(
    spec: ArgSpec, dyn: list, tangents: Any, where: str, layout_of: Callable[[], Layout]
) -> tuple | None:
    """The user's `tangents` for the differentiated leaves (`layout_of().floating`).
    A floating leaf that is not differentiated (a Flax NNX model's state) may have a
    tangent, as `jax.jvp` wants one for every leaf, but only None or zeros: sowviz
    pushes none into it, and a non-zero one would silently be dropped."""
    if tangents is None:
        return None
    n_args = len(spec.treedef.children())
    bad = (
        f"sowviz.{where}: `tangents` must be a tuple with one tangent per positional argument "
        f"({n_args}), each shaped like its argument"
    )
    if len(tangents) != n_args:
        raise ValueError(f"{bad}; got {len(tangents)} tangent(s).")
    # None for a whole argument: no tangent for any of its leaves
    left_out = tuple(k for k, t in enumerate(tangents) if t is None)
    trees = spec.treedef.children()
    tangents = tuple(
        jax.tree_util.tree_unflatten(tree, [None] * tree.num_leaves) if t is None else t
        for t, tree in zip(tangents, trees, strict=True)
    )
    try:
        flat = spec.treedef.flatten_up_to(tuple(tangents))
    except (ValueError, TypeError) as err:
        said = str(err)  # JAX prints the whole value: a model's state is kilobytes
        said = said if len(said) <= 400 else said[:400] + " ..."
        raise ValueError(f"{bad}; their structure differs: {said}") from None
    layout = layout_of()
    floating = frozenset(layout.floating)
    out = []
    for j, (i, x) in enumerate(zip(spec.dynamic, dyn, strict=True)):
        if not _is_float(x):
            continue
        t = flat[i]
        if j not in floating:
            if t is None or not np.any(np.asarray(t) != 0):
                continue
            if layout.selected is not None and layout.arg_of[j] not in layout.selected:
                raise ValueError(
                    f"sowviz.{where}: the tangent of `args{_paths_of(spec)[i]}` is not zero, "
                    f"but argument {layout.arg_of[j]} is not in `argnums` "
                    f"{layout.selected}: no tangent is pushed into it. Give it zeros or "
                    "None, or add it to `argnums`."
                )
            raise ValueError(
                f"sowviz.{where}: the tangent of `args{_paths_of(spec)[i]}` is not zero, "
                "but that leaf is a Flax NNX model's state (not an `nnx.Param`), which "
                "sowviz does not differentiate, as `nnx.grad` does not by default. Give "
                "it zeros or None; to push a tangent through it, make it an `nnx.Param`."
            )
        if t is None:
            raise ValueError(_none_tangent(where, layout, j, _paths_of(spec)[i], left_out))
        if jnp.shape(t) != jnp.shape(x):
            raise ValueError(
                f"{bad}; the tangent of leaf `args{_paths_of(spec)[i]}` has shape "
                f"{jnp.shape(t)}, its argument {jnp.shape(x)}."
            )
        _check_tangent_dtype(where, _paths_of(spec)[i], t, x)
        out.append(jnp.asarray(t, jnp.result_type(x)))
    return tuple(out)


_TANGENT_DTYPE = (
    "sowviz.{where}: the tangent of leaf `args{path}` is {got}, but that leaf is {want}: "
    "the tangent of a floating-point value must be floating point too{why} (`jax.jvp` "
    "refuses it as well: dtypes must be equal). Give it `t.astype(jnp.{want})`, e.g. "
    "`jnp.ones_like(x)`."
)


def _check_tangent_dtype(where: str, path: str, t: Any, x: Any) -> None:
    """A ValueError for a tangent that casting to its leaf's dtype would change in kind,
    not in width: an integer or boolean one (`jnp.ones(3, jnp.int32)`), or a complex one
    for a real leaf (its imaginary part dropped). Another float width (NumPy's float64
    for a float32 leaf) is cast, as `jax.jvp` takes NumPy's float64 without x64."""
    got, want = jnp.result_type(t), jnp.result_type(x)
    real_for_complex = jnp.issubdtype(got, jnp.complexfloating) and not jnp.issubdtype(
        want, jnp.complexfloating
    )
    if jnp.issubdtype(got, jnp.inexact) and not real_for_complex:
        return
    why = ", and real for a real one" if real_for_complex else ""
    raise ValueError(_TANGENT_DTYPE.format(where=where, path=path, got=got, want=want, why=why))


_NONE_ARGUMENT = (
    'sowviz.{where}: `tangents[{k}]` is None, which means "do not differentiate '
    'argument {k}", but {why}, so it needs a tangent (here for its leaf `args{path}`). '
    "{fix}, or give argument {k} zeros shaped like it "
    "(`jax.tree.map(jnp.zeros_like, <argument {k}>)`)."
)
_NONE_LEAF = (
    "sowviz.{where}: the tangent of leaf `args{path}` is None, but argument {k} is "
    "differentiated ({why}), so each of its floating leaves needs a tangent shaped like "
    "it. Give that leaf zeros (`jnp.zeros_like`); None leaves out a whole argument only, "
    "as `tangents[{k}] = None` with `argnums` naming the others."
)


def _none_tangent(where: str, layout: Layout, j: int, path: str, left_out: tuple) -> str:
    """Why a None tangent for array input `j` is refused, and the fix: None for a
    whole argument (`left_out`) stands for "not differentiated", which `argnums` says."""
    k = layout.arg_of[j]
    if layout.selected is None:
        why = "`argnums` is not given: every argument is differentiated, as by `jax.jvp`"
    else:
        why = f"it is in `argnums` {layout.selected}"
    if k not in left_out:
        return _NONE_LEAF.format(where=where, path=path, k=k, why=why)
    given = [a for a in range(layout.n_args) if a not in left_out]
    if layout.selected is not None:
        given = [a for a in layout.selected if a not in left_out]
    if given:
        nums = given[0] if len(given) == 1 else tuple(given)
        fix = f"Pass `argnums={nums}` to differentiate only the arguments given tangents"
    else:
        fix = "Give a tangent to the arguments to differentiate and name them in `argnums`"
    return _NONE_ARGUMENT.format(where=where, k=k, why=why, path=path, fix=fix)


def _paths_of(spec: ArgSpec) -> list[str]:
    skeleton = jax.tree_util.tree_unflatten(spec.treedef, list(range(spec.treedef.num_leaves)))
    return _paths(skeleton)


#: A dict key that is no identifier but is written bare in a path all the same: a name
#: of Haiku's (`mlp/~/linear_0`, `~`) or the like, holding nothing that reads as the
#: path's own punctuation (`.`, brackets, quotes, spaces) nor starting like an index.
_BARE_KEY = re.compile(r"[A-Za-z_~](?:[\w~\-]|/(?!/))*(?<!/)")


def written_bare(key: str) -> bool:
    """Whether the string dict key `key` (the text `jax.tree_util.keystr` quotes) is
    written like an attribute in a path (`.w`): an identifier, or a key `_BARE_KEY`
    allows (`.mlp/~/linear_0`: Haiku's parameter groups are drawn as Haiku prints them);
    else it stays as JAX writes it (`['a b']`, `['a.b']`: a space or a dot would misread
    as the path's own)."""
    return key.isidentifier() or _BARE_KEY.fullmatch(key) is not None


def slash_joined(tokens: list[str]) -> list[str]:
    """`tokens` with the entries of a bare key holding a `/` (`.mlp/~/linear_0`) joined to
    it by `/`, as Haiku names its parameters (`mlp/~/linear_0/w`), and theirs in turn."""
    out: list[str] = []
    for t in tokens:
        prev = out[-1] if out else ""
        in_slash_path = prev.startswith("/") or (prev.startswith(".") and "/" in prev)
        out.append("/" + t[1:] if in_slash_path and t.startswith(".") else t)
    return out
