"""Stage names from Flax NNX and Equinox module trees, with no change to user code.

Flax Linen pushes each module's name into `jax.named_scope`; Flax NNX pushes
nothing, and Equinox's layers name their class (`eqx.nn.Linear`) but not their
place in the model. `named(fn)` returns `fn` wrapped so that, while it runs
(the pipeline traces it once with `jax.make_jaxpr`), every call of an NNX or
Equinox module runs inside `jax.named_scope(<its path>)`:

* the paths come from the module trees of the *actual* arguments the wrapper
  receives (NNX and Equinox modules are pytrees, so the pipeline's
  `tree_unflatten` makes new instances: they are only known at call time):
  `nnx.iter_graph` for NNX (`layers[1].attn`), dataclass fields / sequence
  indices / dict keys for Equinox (`layers[0]: Linear`); with several models in
  the arguments, each path starts with its argument's name (`teacher: MLP`);
* a module called inside another gets the path *relative* to its caller
  (`layers[1]` > `attn` > `q_einsum`: nested stages); a module not reachable
  from the arguments (e.g. built by `nnx.merge` inside `fn`) becomes a root
  named by its class when first called, and its submodules are named from it;
* a transform that rebuilds a module from its state (`nnx.scan` over stacked
  layers, `nnx.vmap`, `nnx.remat`, `nnx.cond`; Equinox's `lax.scan` with
  `eqx.combine` inside) calls a *copy*: it is named by the path of the module it
  matches by structure and shapes (`_Context.original_path`); several alike
  (identical blocks, each through `eqx.filter_checkpoint`) are told apart after
  the trace by the parameters the copy's stage reads (`graph.copies`, from the
  `Copy` records `named`'s wrapper keeps in `.sowviz_calls`); else it is named by its
  class, numbered per object (`Linear`, `Linear#2`). A model `eqx.combine`d from
  the halves of `eqx.partition(model, eqx.is_array)` is a copy of the array half,
  whose None stand for the functions of the other (`_leaf_kinds`): `d: Model`;
* a module's other public methods are stages too (`embed.attend`, the tied
  unembedding of Flax's language models; `encoder.encode: Encoder`): on the
  module whose call is running, by the method's name alone (a VAE's `encode`
  inside its `__call__`). Private helpers (`_project`) and Flax's own bookkeeping
  methods (`initialize_carry`, `set_view`, `train`) are not. NNX methods are
  hooked like `__call__`; Equinox's reach the hook through `BoundMethod`, the
  module Equinox makes of `module.encode`;
* a call's stage numbers its outputs in the order the call returns them
  (`_Context.note_returns`: the jaxpr variable of each traced leaf of its result,
  which `build` orders the stage's outputs by), not in the order the program makes
  them (an Equinox `LSTMCell` returns `(h, c)` and computes `c` first);
* the new values an NNX module's call assigns to its variables (a BatchNorm's running
  statistics) are outputs of its stage too, returned by no call: `_Context.note_writes`
  names each after its variable's path in the module (`mean`, `bn1.var`), so the stage
  names them (`mean (new)`) apart from what the call returns;
* the hook is a temporary wrapper of `__call__` (and of NNX modules' public
  methods) on every NNX / Equinox module class that defines one. Installing it
  is reference counted under a lock; the wrapper looks up a `contextvars`
  context and, outside `named`'s call (in another thread, or after it), calls
  the original method untouched. The originals are put back when the last user
  leaves. Nothing happens when neither framework is imported.

* an NNX module's own capture points, `self.sow(nnx.Intermediate, "h", h)` and
  `self.perturb("h", h)`, are `sowviz.sow` points named as the module names them
  (`h`, in the module's stage), with their primal, tangent and cotangent: the value
  NNX stores on the module is lost to `jax.jit`'s copy of the module (`nnx.jit`
  writes it back; a plain function of the split state does not), and was drawn
  nowhere. The method still runs, so code reading the value back works.

`CALL_CODE` is the code object of the function that pushes a module's scope:
`build.py` finds a module stage's call site as the frame just outside the matching
such frame of an equation's traceback (`_compat.call_sites`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import re
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from .. import _compat
from .._args import positional_names
from ..capture.primitive import sow as sow_value
from . import numpyro_sites
from .patches import Patches, Target

_ACTIVE: contextvars.ContextVar[_Context | None] = contextvars.ContextVar(
    "sowviz_framework_names", default=None
)
_PATCHES = Patches()
#: The scope labels that module calls pushed in the program `build_graph` is drawing
#: (`drawing`): what tells module stages from the user's own `jax.named_scope`s. Per
#: drawing, not per process: an NNX model's `attn` module once inspected made a plain
#: program's `jax.named_scope("attn")` a module stage ever after.
_DRAWN: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "sowviz_module_scopes", default=frozenset()
)
#: The scope labels Haiku's module calls pushed (Haiku pushes them itself, as a
#: `jax.named_call` of the module's name), per drawing as `_DRAWN`.
_HAIKU_DRAWN: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "sowviz_haiku_scopes", default=frozenset()
)
#: The scope labels Flax Linen's module calls pushed, each with the lines those calls
#: were made from (`_compat.linen_call_marks`), per drawing as `_DRAWN`.
_LINEN_DRAWN: contextvars.ContextVar[Mapping[str, frozenset]] = contextvars.ContextVar(
    "sowviz_linen_scopes", default=types.MappingProxyType({})
)


def pushed() -> frozenset[str]:
    """The scope labels module calls pushed in the program being drawn (`drawing`)."""
    return _DRAWN.get()


def haiku_pushed() -> frozenset[str]:
    """The scope labels Haiku's module calls pushed in the program being drawn."""
    return _HAIKU_DRAWN.get()


def linen_pushed() -> Mapping[str, frozenset]:
    """The scope labels Flax Linen's module calls pushed in the program being drawn,
    each with the lines its calls were made from (`_compat.SourceLocation`s)."""
    return _LINEN_DRAWN.get()


@contextlib.contextmanager
def drawing(
    scopes: Iterable[str], haiku: Iterable[str] = (), linen: Mapping[str, frozenset] | None = None
) -> Iterator[None]:
    """`pushed()` is `scopes` (and `haiku_pushed()` is `haiku`, `linen_pushed()`
    `linen`) while a graph of the program is built."""
    token = _DRAWN.set(frozenset(scopes))
    haiku_token = _HAIKU_DRAWN.set(frozenset(haiku))
    linen_token = _LINEN_DRAWN.set(types.MappingProxyType(dict(linen or {})))
    try:
        yield
    finally:
        _LINEN_DRAWN.reset(linen_token)
        _HAIKU_DRAWN.reset(haiku_token)
        _DRAWN.reset(token)


@dataclasses.dataclass(frozen=True)
class ModuleCalls:
    """What `named`'s wrapper learned of the module calls of its last call, for
    `build_graph`: the copies it could not name (`Copy`, by label), where each variable
    a call returned sits in its result (by scope label and variable), and every scope
    label it pushed."""

    copies: Mapping[str, Copy]
    returns: Mapping[tuple[str, Any], int]
    scopes: frozenset[str]
    #: (scope label, jaxpr variable) -> the path in that call's module of the variable
    #: the call assigned it to (`bn1.mean`: `_Context.note_writes`)
    writes: Mapping[tuple[str, Any], str] = dataclasses.field(default_factory=dict)
    #: the scope labels of calls of a model's root module (`Net`, `teacher: MLP`): where
    #: the paths Python reaches its modules by start (`Inspection.probe`)
    roots: frozenset[str] = frozenset()
    #: the scope labels Haiku's module calls pushed (`linear_1`; `haiku_pushed`)
    haiku: frozenset[str] = frozenset()
    #: (scope label, jaxpr variable) -> the name of the parameter of that call's
    #: `__call__` it was passed as (`positions`: `_Context.note_params`)
    params: Mapping[tuple[str, Any], str] = dataclasses.field(default_factory=dict)
    #: the scope labels Flax Linen's module calls pushed, each with the lines its calls
    #: were made from (`linen_pushed`)
    linen: Mapping[str, frozenset] = dataclasses.field(default_factory=dict)
    #: NumPyro's distributions' construction scopes named by their sites, by (model's
    #: label, construction's label), and the user's lines that built them
    #: (`numpyro_sites.relabeled`)
    numpyro: tuple[Mapping[tuple[str, str], str], Mapping[str, Any]] = ({}, {})


Path = tuple[Any, ...]


def _nnx() -> Any:
    mod = sys.modules.get("flax.nnx")
    return getattr(mod, "Module", None) if mod is not None else None


def _eqx() -> Any:
    mod = sys.modules.get("equinox")
    return getattr(mod, "Module", None) if mod is not None else None


def linen_module_names() -> frozenset[str]:
    """The class names of Flax Linen's modules (the user's subclasses among them): the
    top-level scope a Linen model pushes (`ResNet`) is one of them."""
    mod = sys.modules.get("flax.linen")
    base = getattr(mod, "Module", None) if mod is not None else None
    names: set[str] = set()
    todo, seen = ([base] if base is not None else []), set()
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.add(cls)
            names.add(cls.__name__)
            todo.extend(cls.__subclasses__())
    return frozenset(names)


#: The methods Flax Linen runs on a module that are Flax's own closures, not the module's:
#: `nn.RNN` scans its cell with `nn.scan(scan_fn)`, which Linen calls as the cell's
#: method, scoped `LSTMCell_0.scan_fn`, around the cell's own scope `LSTMCell_0`.
_LINEN_PLUMBING_METHODS = (".scan_fn",)


def linen_plumbing_scope(name: str) -> bool:
    """Whether `name` is the scope Flax Linen pushes for one of Flax's own closures run
    as a module's method (`LSTMCell_0.scan_fn`), which says nothing the module's own
    scope inside it does not."""
    return name.endswith(_LINEN_PLUMBING_METHODS)


def _haiku() -> bool:
    return "haiku" in sys.modules


def _linen() -> Any:
    return sys.modules.get("flax.linen")


def named(fn: Callable) -> Callable:
    """`fn` whose NNX / Equinox module calls run inside named scopes of their paths, and
    whose NumPyro models, sites and distributions inside scopes of their names
    (`numpyro_sites`); Haiku's module calls, which push their scopes themselves, are
    recorded (`_Context.haiku_call`), and so are the results and variable writes of
    Flax Linen's, which push theirs too (`_linen_hooks`)."""
    if (
        _nnx() is None
        and _eqx() is None
        and not numpyro_sites.present()
        and not _haiku()
        and _linen() is None
    ):
        return fn

    names = positional_names(fn)

    @functools.wraps(fn)
    def with_names(*args: Any, **kwargs: Any) -> Any:
        ctx = _Context()
        ctx.add_roots(args, kwargs, names)
        token = _ACTIVE.set(ctx)
        _install()
        run = None
        try:
            with numpyro_sites.tracing() as run, _haiku_hooks(ctx), _linen_hooks(ctx):
                return fn(*args, **kwargs)
        finally:
            _ACTIVE.reset(token)
            _uninstall()
            # the sows NumPyro's hooks made: not the user's (`Traced.own_sows`)
            with_names.sowviz_own_sows = (  # type: ignore[attr-defined]
                numpyro_sites.own_sows(run) if run is not None else frozenset()
            )
            # what `build_graph` needs of this (the last) call
            with_names.sowviz_calls = ModuleCalls(  # type: ignore[attr-defined]
                ctx.copies,
                ctx.returns,
                frozenset(ctx.pushed),
                ctx.writes,
                frozenset(ctx.roots),
                frozenset(ctx.haiku),
                params=ctx.params,
                linen={k: frozenset(v) for k, v in ctx.linen.items()},
                numpyro=numpyro_sites.relabeled(run),
            )

    return with_names


# ---------------------------------------------------------------------------
# Paths of modules.


class _Root(str):
    """The first step of a module's path when the arguments hold several models: the
    name of the argument holding its root (`teacher`, `state.model`)."""


def _argument(path: tuple, names: list[str]) -> str:
    """The argument a leaf of `(args, kwargs)` at `path` sits in, by its parameter's
    name, then the path inside it (`state.model`)."""
    where, key, *rest = path
    if where.idx == 0:  # positional
        i = key.idx
        base = names[i] if i < len(names) else f"arg{i}"
    else:
        base = str(key.key)
    return base + jax.tree_util.keystr(tuple(rest))


def _fmt_nnx(path: Path) -> str:
    """`layers[1].attn`: spelled as the Python that reaches it (`model.layers[1].attn`),
    as the parameters' group and Equinox's paths spell it; an `nnx.Dict` key as an
    attribute (`heads.out`), as the parameters' group spells dict keys."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


#: NNX's lifted-state carry in a body's parameter path: a transform (`nnx.fori_loop`,
#: `nnx.scan`) hands its body a module's state as `NodeStates`, whose `states[k]` are
#: nested dicts of `Variable`s, each read through `.value`
_LIFTED = re.compile(r"\.states\[\d+\]((?:\[(?:'[^'\]]*'|\d+)\])+)\.value$")
_LIFTED_KEY = re.compile(r"\[(?:'([^'\]]*)'|(\d+))\]")


def lifted_name(name: str) -> str:
    """A body parameter's name (`model.states[0]['layers'][0]['attn']['cached_key'].value`,
    as JAX records the path of an NNX transform's carry) spelled as the user reaches the
    variable: `model.layers[0].attn.cached_key`. NNX's own carry structure (`states[0]`,
    `.value`) is no name of the user's; the port of `fori_loop(body)` read it. Any other
    name is returned as it is."""
    m = _LIFTED.search(name)
    if m is None:
        return name
    path = "".join(
        f".{key}" if key.isidentifier() else f"[{key!r}]" if key else f"[{index}]"
        for key, index in _LIFTED_KEY.findall(m.group(1))
    )
    return name[: m.start()] + path


#: One step of a parameter path as JAX records it: `[0]`, `['key']`, `.attr`
_PATH_STEP = re.compile(r"\[(\d+)\]|\['([^'\]]*)'\]|\.(\w+)")
_PATH_HEAD = re.compile(r"^([A-Za-z_]\w*)((?:\[(?:\d+|'[^'\]]*')\]|\.\w+)*)$")


def _path_steps(path: str) -> list[int | str] | None:
    steps: list[int | str] = []
    for m in _PATH_STEP.finditer(path):
        index, key, attr = m.groups()
        steps.append(int(index) if index is not None else key if key is not None else "." + attr)
    return steps if "".join(m.group(0) for m in _PATH_STEP.finditer(path)) == path else None


def _spelled(steps: Sequence[int | str]) -> str:
    """A path's steps as Python reaches them: a module's state (`.__state__`, NNX's
    dicts of variables) by attributes, its variables without `.value`."""
    out, in_state = "", False
    for step in steps:
        if step in (".__state__", ".states"):
            in_state = True
        elif isinstance(step, int):
            out += f"[{step}]"
        elif step.startswith("."):
            out += "" if step == ".value" else step
        else:
            out += f".{step}" if in_state and step.isidentifier() else f"[{step!r}]"
    return out


def nnx_scan_names(
    names: Sequence[str],
    kind: str,
    params: Sequence[str],
    unpacked: Mapping[str, Sequence[str]],
) -> tuple[str, ...]:
    """The names of an `nnx.scan` body's inputs (JAX names NNX's own two arguments by
    the user's first two parameters: `carry[0][1]` is the user's `carry[1]`, `i[1][1]`
    the user's `i`; see `_compat.nnx_scan_kind`) as the user's function reads them,
    `carry[1]`, `i`, a carried module's variable `carry[0].lin.kernel` (`unpacked_arg_names`
    then says `logits`, `model.lin.kernel`). What cannot be told (a variable of which of
    several modules, NNX's broadcasts) is named by its path in its module alone, or
    not at all: never by another input's name. `kind`: "graph" or "simple"."""
    parsed: list[tuple[int, list[int | str]] | None] = []
    for name in names:
        m = _PATH_HEAD.match(name)
        steps = _path_steps(m.group(2)) if m else None
        if not steps or m is None:
            parsed.append(None)
        elif len(params) >= 2 and m.group(1) in params[:2]:
            parsed.append((params.index(m.group(1)), steps))
        elif m.group(1) == "args" and steps[0] in (0, 1):
            parsed.append((int(steps[0]), steps[1:]))
        else:
            parsed.append(None)
    # the user's carry is the parameter that NNX's pure arguments leave out
    # (graph: `i[1][k]` is the user's parameter k; simple: `i[k]`)
    given = {
        p[1][1] if kind == "graph" else p[1][0]
        for p in parsed
        if p and p[0] == 1 and (p[1][0] == 1 and len(p[1]) > 1 if kind == "graph" else True)
    }
    left = [k for k in range(len(params)) if k not in given]
    carry = params[left[0]] if len(left) == 1 else None
    nodes = _scan_nodes(parsed, carry, unpacked) if kind == "graph" else {}
    out = []
    for p in parsed:
        name = ""
        if p is not None:
            arg, steps = p
            head = steps[0] if steps else None
            if arg == 0 and head == 0 and carry is not None:
                name = carry + _spelled(steps[1:])
            elif kind == "graph" and arg == 0 and head in (1, 2) and len(steps) > 3:
                node = nodes.get(steps[1])
                path = _spelled([".__state__", *steps[3:]])
                name = node + path if node else path.lstrip(".")
            elif arg == 1 and kind == "graph" and head == 1 and len(steps) > 1:
                k = steps[1]
                name = (
                    params[k] + _spelled(steps[2:])
                    if isinstance(k, int) and k < len(params)
                    else ""
                )
            elif arg == 1 and kind == "simple" and isinstance(head, int) and head < len(params):
                name = params[head] + _spelled(steps[1:])
        out.append(name)
    return tuple(out)


def _scan_nodes(
    parsed: Sequence[tuple[int, list[int | str]] | None],
    carry: str | None,
    unpacked: Mapping[str, Sequence[str]],
) -> dict[int, str]:
    """Which element of the user's carry each module `j` of NNX's carry deque is
    (`carry[0]`): NNX splits the modules out of the carry in order, leaving no arrays
    at their places, so the elements without arrays of an unpacked carry are the modules
    when there are as many; a carry without arrays of its own is the one module. Empty
    where that cannot be told (a module broadcast or split by `StateAxes`)."""
    if carry is None:
        return {}
    deques = {
        (p[1][0], p[1][1])
        for p in parsed
        if p and p[0] == 0 and p[1][:1] in ([1], [2]) and len(p[1]) > 3
    }
    js = sorted({j for _, j in deques})
    if any(d != 1 for d, _ in deques) or js != list(range(len(js))) or not js:
        return {}
    own = [p[1][1:] for p in parsed if p and p[0] == 0 and p[1][:1] == [0]]
    targets = unpacked.get(carry)
    if targets:
        arrays = {steps[0] for steps in own if steps}
        places = [k for k in range(len(targets)) if k not in arrays]
        if len(places) == len(js):
            return {j: f"{carry}[{k}]" for j, k in zip(js, places, strict=True)}
        return {}
    return {0: carry} if not own and js == [0] else {}


class _Unsaid(str):
    """A step of an Equinox module's path that its stage labels leave out: a library's
    private field (`eqx.nn.Shared`'s `pytree`). It stays in the path, which the leaves'
    names hold (`shared.pytree[0].weight`: `graph.copies` matches paths against them)."""


def _fmt_eqx(path: Path) -> str:
    out = ""
    for p in path:
        if isinstance(p, _Unsaid):
            continue
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, tuple):  # dict key
            out += f"[{p[0]!r}]"
        else:
            out += f".{p}" if out else str(p)
    return out


def _eqx_modules(obj: Any, path: Path, seen: set[int]) -> Iterator[tuple[Path, Any]]:
    eqx_module = _eqx()
    if id(obj) in seen:
        return
    if eqx_module is not None and isinstance(obj, eqx_module):
        seen.add(id(obj))
        yield path, obj
        shared = _is_eqx_shared(obj)
        for f in dataclasses.fields(obj):
            # `eqx.nn.Shared` keeps the layers it ties in its own field `pytree`: the
            # user wrote `embedding, linear = self.shared()`, so its layers are
            # `shared[0]: Embedding`, not `shared.pytree[0]: Embedding` (`_Unsaid`)
            step = _Unsaid(f.name) if shared and f.name == "pytree" else f.name
            yield from _eqx_modules(getattr(obj, f.name, None), (*path, step), seen)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _eqx_modules(v, (*path, i), seen)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _eqx_modules(v, (*path, (k,)), seen)


def _is_eqx_shared(obj: Any) -> bool:
    """Whether `obj` is an `eqx.nn.Shared` (tied layers, its field `pytree` private)."""
    cls = getattr(getattr(sys.modules.get("equinox"), "nn", None), "Shared", None)
    return cls is not None and isinstance(obj, cls)


def _nnx_parts(module: Any) -> list[tuple[Path, Any]]:
    """`module`'s submodules and variables (no plain attributes) with their paths."""
    from flax import nnx

    return [
        (path, v) for path, v in nnx.iter_graph(module) if isinstance(v, (nnx.Module, nnx.Variable))
    ]


def _signature(module: Any) -> Any:
    """What a copy of `module` rebuilt by a transform has in common with it: for NNX
    the types of its submodules and variables at their paths, for Equinox its pytree
    structure (fields and static values) with a None counted as a leaf; never the
    arrays, which a scan slices. `_leaf_kinds` then rules out the halves of
    `eqx.partition` that cannot be the copy."""
    nnx_module = _nnx()
    if nnx_module is not None and isinstance(module, nnx_module):
        return tuple((path, type(v)) for path, v in _nnx_parts(module))
    treedef = jax.tree_util.tree_structure(module, is_leaf=_is_none)
    try:
        hash(treedef)
    except TypeError:  # an unhashable static field (a list): no copy is matched to it
        return None
    return treedef


def _is_none(x: Any) -> bool:
    return x is None


def _is_array(x: Any) -> bool:
    """`eqx.is_array`: what `eqx.partition(model, eqx.is_array)` puts in the array half."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _leaf_kinds(module: Any) -> tuple[str, ...] | None:
    """Per leaf of an Equinox module (a None counted as one): `array`, `none` or
    `other` (a function, `eqx.nn.Shared`'s placeholder); None for NNX.

    Equinox's freezing idiom passes `eqx.partition(model, eqx.is_array)` and calls
    `eqx.combine(diff, static)`: the array half holds None where the model holds a
    function (`eqx.nn.Shared`'s `where` and `get`, an MLP's activation), the other
    half None where it holds an array. The combined model is a copy of the array half
    the arguments name (`_kinds_fit`), never of the other."""
    nnx_module = _nnx()
    if nnx_module is not None and isinstance(module, nnx_module):
        return None
    leaves = jax.tree_util.tree_leaves(module, is_leaf=_is_none)
    return tuple("none" if x is None else "array" if _is_array(x) else "other" for x in leaves)


def _kinds_fit(a: tuple[str, ...] | None, b: tuple[str, ...] | None) -> bool:
    """Whether modules of one `_signature` with leaf kinds `a` and `b` can be a module
    and its copy: never where one holds an array and the other None in its place (the
    other half of `eqx.partition`). A function where the other holds None (the array
    half), or an array where it holds `eqx.nn.Shared`'s placeholder, fits."""
    if a is None or b is None:
        return True
    return all({x, y} != {"array", "none"} for x, y in zip(a, b, strict=True))


def _shapes_fit(copy: list, known: list) -> bool:
    """Whether a copy's array shapes are a module's, whole or without the leading axis
    a scan or vmap slices off."""
    return copy in (known, [x[1:] for x in known])


def _shapes(module: Any) -> list[tuple[int, ...]]:
    """The shapes of `module`'s arrays, in order (its functions and Nones left out: the
    array half of `eqx.partition` has the shapes of the model)."""
    nnx_module = _nnx()
    if nnx_module is not None and isinstance(module, nnx_module):
        leaves = [v for _, v in _nnx_parts(module) if not isinstance(v, nnx_module)]
        return [tuple(getattr(x, "shape", ())) for x in leaves]
    return [tuple(x.shape) for x in jax.tree_util.tree_leaves(module) if _is_array(x)]


@dataclasses.dataclass(frozen=True)
class Copy:
    """A module copy like several modules of the arguments (`_Context.original_path`):
    its framework, class, the path of the module that called it, and the paths it
    could be. `graph.copies` picks one by the parameters the copy's stage reads."""

    framework: str
    cls: str
    parent: Path
    candidates: tuple[Path, ...]

    def label(self, path: Path) -> str:
        """The stage label of this copy as the module at `path`, as `scope_name` gives."""
        return _stage_label(self.framework, self.cls, path, self.parent)


def _stage_label(framework: str, cls: str, path: Path, parent: Path) -> str:
    """A module's stage label: its path relative to its caller's (`parent`), NNX's
    as Python reaches it (`layers[1]`), Equinox's with the class (`layers[1]: Block`); the class
    alone at the caller's own path, and beside its argument's name for one of several
    models (`teacher: MLP`)."""
    rel = path[len(parent) :] if path[: len(parent)] == parent else path
    if not rel:
        return cls
    if len(rel) == 1 and isinstance(rel[0], _Root):
        return f"{rel[0]}: {cls}"
    return _fmt_nnx(rel) if framework == "nnx" else f"{_fmt_eqx(rel)}: {cls}"


class _Context:
    """Paths known for this call, and the stack of module calls in progress."""

    def __init__(self) -> None:
        self.paths: dict[int, tuple[str, Path]] = {}  # id(module) -> (framework, path)
        self.objects: dict[int, Any] = {}  # id -> module; keeps them alive, so ids stay unique
        #: copies like several modules, by label (what `named`'s wrapper hands on)
        self.copies: dict[str, Copy] = {}
        #: copies matching no single module: their labels, and how many per class
        self.unnamed: dict[int, str] = {}
        self.unnamed_count: dict[str, int] = {}
        #: known modules by `_signature`: (path, `_shapes`, `_leaf_kinds`), made when
        #: first needed
        self.index: dict[Any, list[tuple[Path, list, Any]]] | None = None
        self.stack: list[tuple[Any, Path]] = []
        #: (scope label, jaxpr variable) -> the variable's place among the leaves a call
        #: under that label returned (`note_returns`)
        self.returns: dict[tuple[str, Any], int] = {}
        #: (scope label, jaxpr variable) -> the variable's path in the module of the call
        #: under that label that assigned it (`note_writes`)
        self.writes: dict[tuple[str, Any], str] = {}
        #: (scope label, jaxpr variable) -> the parameter of the call under that label it
        #: was passed as (`note_params`)
        self.params: dict[tuple[str, Any], str] = {}
        self.pushed: set[str] = set()  # every scope label a module call pushed
        self.roots: set[str] = set()  # those of calls of a root module (`ModuleCalls.roots`)
        self.haiku: set[str] = set()  # every scope label a Haiku module call pushed
        #: (full name, value) of each `hk.set_state` so far, in order (`haiku_set`)
        self.haiku_sets: list[tuple[str, Any]] = []
        #: every scope label a Linen module call pushed -> the lines the calls were made
        #: from (`note_linen_call`)
        self.linen: dict[str, set[Any]] = {}

    def note_linen_call(self, label: str, site: Any) -> None:
        """Remember that a Linen module call pushed the scope `label`, made at `site`."""
        self.linen.setdefault(label, set()).add(site)

    def note_returns(self, label: str, out: Any) -> None:
        """Remember where each traced leaf of a module call's result `out` sits in it,
        so the stage numbers its outputs in the order the call returns them (an
        `LSTMCell` returns `(h, c)` and computes `c` first: the program's order alone
        numbered `c` first)."""
        for k, leaf in enumerate(jax.tree_util.tree_leaves(out)):
            var = _compat.traced_var(leaf)
            if var is not None and (label, var) not in self.writes:
                # (a value the call wrote as state is named so: `note_state_writes`)
                self.returns.setdefault((label, var), k)
                # a loop's body under `jax.vmap` is traced again, with new variables:
                # where the value was made still finds it (`build.batch_first`)
                origin = _compat.traced_origin(leaf)
                if origin is not None:
                    self.returns.setdefault((label, origin), k)

    def note_params(self, label: str, bound: Any, args: tuple, kwargs: dict) -> None:
        """Remember the parameter of the module call under `label` that each traced leaf
        of its arguments was passed as (`positions`, `cache[0]`): the module stage's
        ports are named by them. Made by a one-equation line (`positions =
        jnp.full((B, 1), pos)`), whose box stays its primitive, a port read
        `broadcast_in_dim`, `broadcast_in_dim #2`. Only a module of the user's: a
        library's layer names what it is given generically (`nnx.Linear`'s `inputs`)."""
        if not _compat.is_user_function(getattr(bound, "__func__", bound)):
            return
        try:
            given = inspect.signature(bound).bind(*args, **kwargs).arguments
        except (TypeError, ValueError):  # (no signature, or a call Python refuses)
            return
        for name, value in given.items():
            for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
                var = _compat.traced_var(leaf)
                if var is not None:
                    self.params.setdefault((label, var), name + jax.tree_util.keystr(path))

    def note_writes(self, label: str, before: list[tuple[Path, Any, Any]]) -> None:
        """Remember the traced values a module call under `label` left in its variables
        (`before`: `_variables` of its module as the call began): a BatchNorm's new
        running statistics, which its stage hands on beside what the call returns, are
        named after their variables (`mean`, `bn1.var`), not numbered as if the call
        returned them."""
        for path, variable, old in before:
            leaves = jax.tree_util.tree_leaves(variable)
            if len(leaves) != 1 or leaves[0] is old:
                continue
            var = _compat.traced_var(leaves[0])
            if var is not None:
                name = _fmt_nnx(path)
                self.writes[(label, var)] = name
                origin = _compat.traced_origin(leaves[0])
                if origin is not None:  # (retraced under `jax.vmap`: `note_returns`)
                    self.writes.setdefault((label, origin), name)

    def note_state_writes(self, label: str, before: _EqxState | None, out: Any) -> None:
        """Remember the values an Equinox module call under `label` set in the
        `eqx.nn.State` it returns (`before`: `_eqx_state` as the call began): a
        BatchNorm's new running statistics, which it returns as `(out, state)`, are named
        after their `StateIndex` in the module (`ema_state_index[0]`, as the `state`
        input group names them), as an NNX module's variables are (`note_writes`), not
        numbered `[1]`, `[2]` as if they were its result."""
        if before is None:
            return
        state_cls, indices, old = before
        states = [
            s
            for s in jax.tree_util.tree_leaves(out, is_leaf=lambda x: isinstance(x, state_cls))
            if isinstance(s, state_cls)
        ]
        for state in states:
            for name, index in indices:
                try:
                    value = state.get(index)
                except (KeyError, ValueError):  # (a substate without it; an old state)
                    continue
                for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
                    var = _compat.traced_var(leaf)
                    if var is None or id(leaf) in old:
                        continue  # (unchanged: the state it was given)
                    at = name + jax.tree_util.keystr(path)
                    self.writes[(label, var)] = at
                    origin = _compat.traced_origin(leaf)
                    if origin is not None:  # (retraced under `jax.vmap`: `note_returns`)
                        self.writes.setdefault((label, origin), at)

    def haiku_call(self, next_f: Callable, args: tuple, kwargs: dict, context: Any) -> Any:
        """Haiku's method interceptor (`hk.intercept_methods`): a Haiku module's method
        call runs inside the scope of its module's name, which Haiku pushes itself; its
        label is a module stage's, and the state the call sets (`hk.BatchNorm`'s EMAs)
        is named after its Haiku path below the module (`mean_ema/average`), as an NNX
        module's variables are (`note_writes`), not numbered `[3]` after the activation."""
        name = getattr(context.module, "module_name", None)
        if not isinstance(name, str) or not name or context.method_name == "__init__":
            return next_f(*args, **kwargs)  # (no scope: Haiku names a module after `__init__`)
        label = name.rpartition("/")[2]  # the name Haiku's `jax.named_call` pushes
        self.haiku.add(label)
        start = len(self.haiku_sets)
        out = next_f(*args, **kwargs)
        last = dict(self.haiku_sets[start:])  # (set twice: the last value is the state)
        # (a value the call returns too is its result: `hk.ExponentialMovingAverage`
        # returns the `average` it sets)
        returned = {_compat.traced_var(leaf) for leaf in jax.tree_util.tree_leaves(out)}
        for full, value in last.items():
            if not full.startswith(name + "/"):
                continue
            path = full[len(name) + 1 :].removeprefix("~/")  # (`bn/~/mean_ema/average`)
            for leaf in jax.tree_util.tree_leaves(value):
                var = _compat.traced_var(leaf)
                if var is not None and var not in returned:
                    self.writes[(label, var)] = path
                    origin = _compat.traced_origin(leaf)
                    if origin is not None:  # (retraced under `jax.vmap`: `note_returns`)
                        self.writes.setdefault((label, origin), path)
        return out

    def linen_call(self, next_fun: Callable, args: tuple, kwargs: dict, context: Any) -> Any:
        """Flax Linen's method interceptor (`nn.intercept_methods`): the values a module's
        method call leaves in its variables (a `BatchNorm`'s new running statistics, in
        `mutable=["batch_stats"]`) are named after their Linen paths below the module
        (`batch_stats.mean`, `batch_stats.bn.mean` from the model's), as an NNX module's
        are (`note_writes`): they were its stage's outputs `[1]`, `[2]`. Linen pushes the
        scope itself, labelled `module.name or class` (`.method` for another method)."""
        module, method = context.module, context.method_name
        if method == "setup":
            return next_fun(*args, **kwargs)
        before = _linen_variables(module)
        out = next_fun(*args, **kwargs)
        if not before:
            return out
        after = _linen_variables(module)
        label = (module.name or type(module).__name__) + (
            "" if method == "__call__" else f".{method}"
        )
        # (a value the call returns too is its result, not state)
        returned = {_compat.traced_var(leaf) for leaf in jax.tree_util.tree_leaves(out)}
        for path, leaf in after.items():
            old = before.get(path)
            if old is None or old is leaf:
                continue  # (made by this call, `init`'s, or unchanged)
            var = _compat.traced_var(leaf)
            if var is not None and var not in returned:
                name = _fmt_linen(path)
                self.writes[(label, var)] = name
                origin = _compat.traced_origin(leaf)
                if origin is not None:  # (retraced under `jax.vmap`: `note_returns`)
                    self.writes.setdefault((label, origin), name)
        return out

    def haiku_set(self, next_setter: Callable, value: Any, context: Any) -> Any:
        """Haiku's state setter (`hk.custom_setter`): remember the value each
        `hk.set_state` stores, by its full name (`bn/~/mean_ema/average`)."""
        value = next_setter(value)
        self.haiku_sets.append((context.full_name, value))
        return value

    def add_roots(self, args: tuple, kwargs: dict, names: list[str]) -> None:
        """Name the modules anywhere in the arguments from their roots: one model's
        paths start at it (`layers[1]`); with several (a student and its teacher) each
        path starts with its argument's name (`teacher.encoder`), and each root's
        stage says it (`teacher: MLP`)."""
        nnx_module, eqx_module = _nnx(), _eqx()
        kinds = tuple(t for t in (nnx_module, eqx_module) if t is not None)
        flat = jax.tree_util.tree_flatten_with_path(
            (args, kwargs), is_leaf=lambda x: isinstance(x, kinds)
        )[0]
        roots = {id(x): (p, x) for p, x in reversed(flat) if isinstance(x, kinds)}
        for p, x in reversed(roots.values()):  # in argument order, each object once
            self.add_module(x, (_Root(_argument(p, names)),) if len(roots) > 1 else ())

    def add_module(self, module: Any, prefix: Path) -> list[int]:
        """Name `module` and its submodules from `prefix`; the ids of those newly named."""
        nnx_module = _nnx()
        if nnx_module is not None and isinstance(module, nnx_module):
            from flax import nnx

            found = [
                ("nnx", (*prefix, *path), value)
                for path, value in nnx.iter_graph(module)
                if isinstance(value, nnx_module)
            ]
        else:
            found = [("eqx", path, value) for path, value in _eqx_modules(module, prefix, set())]
        added = []
        for framework, path, value in found:
            if id(value) not in self.paths:
                self.paths[id(value)] = (framework, path)
                self.objects[id(value)] = value
                added.append(id(value))
        return added

    def add_copy(self, module: Any, original: Path) -> None:
        """Name a copy `module` as the module at `original`, and match the copies made
        of its own submodules against them too: `eqx.nn.Shared` called in an
        `eqx.combine`d model rebuilds its layers from the combined model's, whose
        placeholder of the tied weight the array half of `eqx.partition` lacks."""
        added = self.add_module(module, original)
        if self.index is not None:
            for mid in added:
                self._index_add(mid)

    def _index_add(self, mid: int) -> None:
        obj = self.objects[mid]
        sig = _signature(obj)
        if sig is not None and self.index is not None:
            entry = (self.paths[mid][1], _shapes(obj), _leaf_kinds(obj))
            self.index.setdefault(sig, []).append(entry)

    def original_path(self, module: Any) -> tuple[Path | None, tuple[Path, ...]]:
        """The path of the module in the arguments that `module` is a copy of, or None
        and the paths it could be (several alike) for `copies` to tell apart later.

        `nnx.scan`, `nnx.vmap`, `nnx.cond`, `nnx.remat` and Equinox's scan-over-layers
        idiom (`lax.scan` over the arrays, `eqx.combine` inside) call a *copy* of a
        module, rebuilt from its state inside the transformed function: a new object,
        unknown by identity. It is matched by structure (the types of its submodules and
        variables at their relative paths), among the known modules under the caller's;
        several alike are told apart by their arrays' shapes, whole or without the
        leading axis a scan or vmap slices off; still several (`nnx.cond` choosing
        between two `Linear`s of one shape, a scanned layer shaped like an unstacked
        one), or none: None (the copy is named by its class, and `Copy` keeps the
        candidates for `graph.copies`)."""
        if self.index is None:
            self.index = {}
            for mid in list(self.paths):  # the modules known so far
                self._index_add(mid)
        parent = self.stack[-1][1] if self.stack else ()
        kinds = _leaf_kinds(module)
        found: dict[Path, list[list]] = {}  # path -> the shapes of the modules there
        for path, shapes, known_kinds in self.index.get(_signature(module), []):
            if self._under_caller(path, parent) and _kinds_fit(kinds, known_kinds):
                found.setdefault(path, []).append(shapes)
        if len(found) > 1:
            # Shapes that fit, whole or without the leading axis a scan or vmap slices
            # off. One layer's shapes are also an unstacked module's: then both fit, and
            # the parameters the copy reads decide (`graph.copies`).
            shapes = _shapes(module)
            fits = [p for p, known in found.items() if any(_shapes_fit(shapes, s) for s in known)]
            found = dict.fromkeys(fits) if fits else found
        if len(found) == 1:
            return next(iter(found)), ()
        return None, tuple(found)

    def _under_caller(self, path: Path, parent: Path) -> bool:
        """Whether the module at `path` can be called by the module at `parent`: it is
        under it. A caller at the root path that is a module's, not the top level, is a
        model made inside `fn` (`eqx.combine` of halves neither of which it is) or the
        one model of the arguments: never under one of several models' arguments
        (`s.shared`, the static half of `eqx.partition`, which it would match too)."""
        if path[: len(parent)] != parent:
            return False
        in_arguments_root = bool(path) and isinstance(path[0], _Root)
        return bool(parent) or not self.stack or not in_arguments_root

    def method_scope(self, module: Any, method: str) -> tuple[str, Path] | None:
        """The scope to push for a call of `module`'s public `method` (not `__call__`),
        and its path: `embed.attend`, `encoder.encode: Encoder`; on the module whose
        call is running, the method's name alone (a VAE's `encode` in its `__call__`)."""
        if self.stack and self.stack[-1][0] is module:
            return method, self.stack[-1][1]
        scope = self.scope_name(module)
        if scope is None:
            return None
        name, path = scope
        head, sep, cls = name.partition(": ")
        return f"{head}.{method}{sep}{cls}", path

    def scope_name(self, module: Any) -> tuple[str, Path] | None:
        """The scope to push for a call of `module`, and its path; None: push none."""
        if self.stack and self.stack[-1][0] is module:
            return None  # super().__call__ of the same module
        known = self.paths.get(id(module))
        if _library_wrapper(module):
            # A library's own wrapper (Equinox's `filter_vmap` returns a `_VmapWrapper`;
            # `eqx.nn.MLP` wraps its activation in one; a method under `eqx.filter_jit`
            # is a `Partial` of a `_JitWrapper`; diffrax's `_ControlToODE`): no stage of
            # its own, wherever it sits, and no root of names (the module it wraps is
            # named where it is called); its calls show inside the module that called it,
            # the function it wraps named by its own stage (`evaluate`).
            return None
        alike: tuple[Path, ...] = ()
        if known is None:  # a copy a transform rebuilt (`nnx.scan`, `lax.scan` + `eqx.combine`)
            original, alike = self.original_path(module)
            if original is not None:
                self.add_copy(module, original)
                known = self.paths.get(id(module))
        if known is None and not self.stack and not alike:
            # a root made inside fn (`nnx.merge(graphdef, state)`): name its tree from
            # it, and match the copies a transform makes of its modules against them
            # (the index was built before it, of the modules in the arguments: none)
            self.add_module(module, ())
            self.index = None
            known = self.paths.get(id(module))
        parent = self.stack[-1][1] if self.stack else ()
        if known is None:
            # A copy like several modules (or none): named by its class, and numbered
            # per object, so that two such copies called in a row stay two stages
            # (`Linear`, `Linear#2`); its submodules by their paths in it.
            # `graph.copies` may name it after the trace, by the parameters it reads.
            cls = _class_label(module)
            n = self.unnamed_count[cls] = self.unnamed_count.get(cls, 0) + 1
            label = self.unnamed[id(module)] = cls if n == 1 else f"{cls}#{n}"
            framework = "nnx" if _nnx() is not None and isinstance(module, _nnx()) else "eqx"
            if alike:
                self.copies[label] = Copy(framework, cls, parent, alike)
            self.add_module(module, (*parent, label))
            known = self.paths[id(module)]
        framework, path = known
        if id(module) in self.unnamed:
            return self.unnamed[id(module)], path
        return _stage_label(framework, _class_label(module), path, parent), path


def _class_label(module: Any) -> str:
    """What a module's stage says after its path: its class, or for a library's module
    that wraps one function of the user's (optimistix's `NoneAux(residuals)`, an
    `eqx.nn.Lambda(my_fn)`, a diffrax `ODETerm(vector_field)`) that function's name,
    which the user knows and searches for (`fn: residuals`, not `fn: NoneAux`)."""
    cls = type(module)
    if _compat.is_user_class(cls):
        return cls.__name__
    fields = getattr(module, "__dataclass_fields__", None) or {}
    wrapped = [f for name in fields if _compat.is_user_function(f := getattr(module, name, None))]
    # (a lambda names nothing: `fn: <lambda>` says less than the class)
    named = len(wrapped) == 1 and wrapped[0].__name__ != "<lambda>"
    if named:
        return wrapped[0].__name__
    if cls.__name__ == "Lambda" and cls.__module__.startswith("equinox"):
        # `eqx.nn.Lambda(jax.nn.relu)` in a layer list: `layers[2]: relu`, as a function
        # of yours is named (every activation was `Lambda`)
        name = getattr(getattr(module, "fn", None), "__name__", None)
        if isinstance(name, str) and name.isidentifier():
            return name
    return cls.__name__


#: Public wrapper classes, no layers, by (package, class name): Equinox's `BoundMethod`
#: (a module's method taken as a pytree, as `eqx.nn.MultiheadAttention` maps its
#: projections) and `Partial` (what `eqx.filter_jit` makes of a method:
#: `Partial(_JitWrapper, module)`), and JAX's `tree_util.Partial`.
_WRAPPERS = frozenset({("equinox", "BoundMethod"), ("equinox", "Partial"), ("jax", "Partial")})


def _library_wrapper(module: Any) -> bool:
    """Whether `module`'s class is a private one (``_Name``) of an installed library
    (Equinox's `_JitWrapper`, diffrax's `_ControlToODE`, optimistix's and Equinox's
    `_ClosureConvert`), or one of the public wrappers (`_WRAPPERS`): a class of the
    user's own is never one, however it is named."""
    cls = type(module)
    name, package = cls.__name__, cls.__module__.split(".", 1)[0]
    if (package, name) in _WRAPPERS:
        return True
    return name.startswith("_") and not _compat.is_user_class(cls)


def _bound_method(obj: Any) -> tuple[Any, str] | None:
    """`(module, method name)` of Equinox's `BoundMethod` (what `module.encode` is when
    `encode` is a method of an `eqx.Module`), for a public method other than
    `__call__`; None otherwise (a private helper such as MHA's `_project` is no stage)."""
    if type(obj).__name__ != "BoundMethod" or not type(obj).__module__.startswith("equinox"):
        return None
    name = getattr(getattr(obj, "__func__", None), "__name__", "_")
    if name.startswith("_"):
        return None
    return obj.__self__, name


def _wrap(raw: Any, method: str = "__call__") -> Callable:
    """`raw` (a module class's `method`) run inside the scope of its module's path while
    `named`'s call is in progress; `_in_scope` pushes it (`CALL_CODE`)."""

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = raw.__get__(self, type(self))
        ctx = _ACTIVE.get()
        if ctx is None:
            return bound(*args, **kwargs)
        owner, name = self, method
        if method == "__call__" and (found := _bound_method(self)) is not None:
            owner, name = found  # `self.encoder.encode(x)` on an Equinox module
        scope = ctx.scope_name(owner) if name == "__call__" else ctx.method_scope(owner, name)
        if scope is None:
            return bound(*args, **kwargs)
        path = scope[1]
        if name == "__call__" and (not path or (len(path) == 1 and isinstance(path[0], _Root))):
            ctx.roots.add(scope[0])  # a model's own call: `model.layers[0]` starts below it
        return _in_scope(ctx, owner, scope, bound, args, kwargs)

    __call__.__sowviz_wrapped__ = raw  # type: ignore[attr-defined]
    return __call__


def _in_scope(ctx: _Context, owner: Any, scope: tuple[str, Path], bound, args, kwargs) -> Any:
    """A module's call inside the scope of its path. A function of its own, so that a
    traceback tells the wrapper frames that pushed a scope (`CALL_CODE`) from those
    that did not (`super().__call__` of the same module: `MaxPool2d.__call__` calling
    `Pool.__call__`, whose stage was then sourced inside Equinox)."""
    label, path = scope
    ctx.pushed.add(label)
    before = _variables(owner)
    state = _eqx_state(owner, args, kwargs)
    ctx.note_params(label, bound, args, kwargs)
    ctx.stack.append((owner, path))
    try:
        with jax.named_scope(label):
            out = bound(*args, **kwargs)
    finally:
        ctx.stack.pop()
    ctx.note_state_writes(label, state, out)  # (first: what it writes, it does not return)
    ctx.note_returns(label, out)
    if before:
        ctx.note_writes(label, before)
    return out


def _variables(module: Any) -> list[tuple[Path, Any, Any]]:
    """An NNX module's variables of one array each, with their paths in it and their
    values now (`_Context.note_writes` compares them after the call); none for
    Equinox, whose modules are never assigned to."""
    nnx_module = _nnx()
    if nnx_module is None or not isinstance(module, nnx_module):
        return []
    from flax import nnx

    out = []
    for path, v in nnx.iter_graph(module):
        if isinstance(v, nnx.Variable):
            leaves = jax.tree_util.tree_leaves(v)
            if len(leaves) == 1:
                out.append((path, v, leaves[0]))
    return out


#: Linen collections whose writes are no module state: `self.sow`'s and
#: `capture_intermediates`' values (aux the user asked for, shown as such)
_LINEN_CAPTURES = frozenset({"intermediates"})


def _linen_variables(module: Any) -> dict[Path, Any]:
    """A bound Linen module's variables in its mutable collections (its submodules'
    among them), by path (`("batch_stats", "bn", "mean")`); empty when Linen cannot say
    (an unbound module), or none is mutable (`apply` without `mutable=`)."""
    try:
        scope = module.scope
        variables = module.variables
        mutable = [c for c in variables if c not in _LINEN_CAPTURES]
        mutable = [c for c in mutable if scope.is_mutable_collection(c)]
    except Exception:  # (best effort, as the other names: never fail the user's call)
        return {}
    out: dict[Path, Any] = {}
    for col in mutable:
        for path, leaf in jax.tree_util.tree_flatten_with_path(variables[col])[0]:
            out[(col, *(_linen_key(k) for k in path))] = leaf
    return out


def _linen_key(key: Any) -> Any:
    """A Linen variables tree's key: a dict key's name, a sequence's index."""
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return getattr(key, attr)
    return str(key)


def _fmt_linen(path: Path) -> str:
    """`batch_stats.bn.mean`: a variable's collection, then its path (`variables[...]`'s
    keys, as `apply`'s updated collections hold it)."""
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else f".{k}" if out else str(k)
    return out


#: What `_Context.note_state_writes` compares an Equinox call's returned state with: the
#: `eqx.nn.State` class, the module's `StateIndex`es with their paths in it, and the
#: state values it was given, by id (held: `State.set` lets go of them).
_EqxState = tuple[type, list[tuple[str, Any]], dict[int, Any]]


def _eqx_state(module: Any, args: tuple, kwargs: dict) -> _EqxState | None:
    """For an Equinox module holding `eqx.nn.StateIndex`es (a BatchNorm, a block
    holding one) and called with an `eqx.nn.State`: what `note_state_writes` needs; else
    None. Read before the call: `State.set` makes the state it was given unreadable."""
    nn = getattr(sys.modules.get("equinox"), "nn", None)
    index_cls, state_cls = getattr(nn, "StateIndex", None), getattr(nn, "State", None)
    if index_cls is None or state_cls is None or not isinstance(module, _eqx() or ()):
        return None
    indices = [
        (_fmt_eqx(path), x)
        for path, x in _eqx_modules(module, (), set())
        if isinstance(x, index_cls)
    ]
    if not indices:
        return None
    old: dict[int, Any] = {}
    flat = jax.tree_util.tree_leaves((args, kwargs), is_leaf=lambda x: isinstance(x, state_cls))
    given = [x for x in flat if isinstance(x, state_cls)]
    for state in given:
        for _, index in indices:
            try:
                old.update((id(v), v) for v in jax.tree_util.tree_leaves(state.get(index)))
            except (KeyError, ValueError):  # (a substate without it; an old state)
                continue
    return (state_cls, indices, old) if given else None


CALL_CODE = _in_scope.__code__

#: Flax's own NNX layer methods that compute with the layer's parameters (a stage
#: each: the tied unembedding `embed.attend`). Its other public methods (`train`,
#: `set_view`, `init_cache`, `initialize_carry`, …) are no stages, and a method of that
#: name on a user's class neither.
_FLAX_STAGE_METHODS = frozenset({"attend"})


def _hooked(cls: type, nnx_infra: frozenset[str]) -> Iterator[str]:
    """The methods of `cls` to hook: `__call__`, and for an NNX module its public
    methods (Equinox's reach the hook through `BoundMethod.__call__`)."""
    if "__call__" in cls.__dict__:
        yield "__call__"
    nnx_module = _nnx()
    if nnx_module is None or cls is nnx_module or not issubclass(cls, nnx_module):
        return
    own = cls.__module__.startswith("flax.")
    for name, value in cls.__dict__.items():
        if not isinstance(value, types.FunctionType) or name.startswith("_"):
            continue
        if name in _FLAX_STAGE_METHODS or not (own or name in nnx_infra):
            yield name


def _classes() -> Iterator[tuple[type, str]]:
    """(class, method) pairs to hook, every NNX / Equinox module class searched."""
    found: list[type] = []
    for base in (_nnx(), _eqx()):
        if base is None:
            continue
        todo, seen = [base], set()
        while todo:
            cls = todo.pop()
            if cls in seen:
                continue
            seen.add(cls)
            todo.extend(cls.__subclasses__())
            found.append(cls)
    infra = frozenset(
        name
        for cls in found
        if cls.__module__.startswith("flax.")
        for name, value in cls.__dict__.items()
        if isinstance(value, types.FunctionType) and not name.startswith("_")
    )
    for cls in found:
        for name in _hooked(cls, infra):
            yield cls, name


#: NNX's own capture points (each takes a `name` and a `value`).
_NNX_TAGS = ("sow", "perturb")


def _tagging(raw: Any) -> Callable:
    """`raw` (NNX's `Module.sow` or `perturb`) with the value it stores sown first, while
    `named`'s call is in progress: a capture point of the user's, drawn as one."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _ACTIVE.get() is None:
            return raw(self, *args, **kwargs)
        # as NNX binds them: by position or keyword (`self.sow(nnx.Intermediate, "h", value=h)`)
        bound = signature.bind(self, *args, **kwargs)
        name, value = bound.arguments.get("name"), bound.arguments.get("value")
        leaves = jax.tree_util.tree_leaves(value)
        if isinstance(name, str) and leaves and all(isinstance(x, jax.Array) for x in leaves):
            bound.arguments["value"] = sow_value(value, name)
        return raw(*bound.args, **bound.kwargs)

    signature = inspect.signature(raw)

    method.__sowviz_wrapped__ = raw  # type: ignore[attr-defined]
    return functools.wraps(raw)(method)


def _haiku_hooks(ctx: _Context) -> contextlib.AbstractContextManager:
    """`ctx`'s Haiku interceptor and state setter, active while `fn` runs (Haiku's
    stacks are per thread); nothing without Haiku imported."""
    if not _haiku():
        return contextlib.nullcontext()
    return _compat.haiku_hooks(ctx.haiku_call, ctx.haiku_set)


def _linen_hooks(ctx: _Context) -> contextlib.AbstractContextManager:
    """Flax Linen method interceptors, active while `fn` runs (nothing without Linen
    imported): one noting each module call's result under the scope Linen pushes for it
    (`_Context.note_returns`; with `capture_intermediates=True`, or a `self.sow` in a
    submodule, every submodule's result leaves the module's stage too, made before its
    own: in program order `self_attn`'s output `[0]` was its `query` projection), one
    naming the values a call leaves in its variables (`_Context.linen_call`)."""
    linen = _linen()
    if linen is None or not hasattr(linen, "intercept_methods"):
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(_compat.linen_hooks(ctx.note_returns))
    stack.enter_context(linen.intercept_methods(ctx.linen_call))
    # (each call's own frame, which tells calls sharing one scope apart: `build`)
    stack.enter_context(_compat.linen_call_marks(ctx.note_linen_call, _linen_unscoped))
    return stack


def _linen_unscoped(label: str) -> bool:
    """Whether the scope Linen pushes as `label` is one `names.scope_names` drops: a
    lambda Linen runs as a module's method (`Model.<lambda>`), Flax's own closures
    (`linen_plumbing_scope`)."""
    return label.endswith(".<lambda>") or linen_plumbing_scope(label)


def _install() -> None:
    _PATCHES.enter(_targets)
    numpyro_sites.install()  # (its own lock, always taken after this one)


def _targets() -> Iterator[Target]:
    # NNX's `sow`/`perturb` tagged, every module class's calls named
    nnx_module = _nnx()
    for name in _NNX_TAGS if nnx_module is not None else ():
        yield nnx_module, name, _tagging
    for cls, name in _classes():
        yield cls, name, functools.partial(_wrap, method=name)


def _uninstall() -> None:
    numpyro_sites.uninstall()
    _PATCHES.leave()
