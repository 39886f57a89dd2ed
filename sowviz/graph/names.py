"""Names in the stage graph: input paths, scope names, folds of unscoped runs, files.

Pure functions of names and equations; `build.py` does the walk.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .. import _compat
from .._args import slash_joined, written_bare
from ..primitives import Construct, spec_of
from . import frameworks
from .repeats import MAX_SEPARATORS
from .repeats import pattern as repeat_pattern
from .source_text import (
    Span,
    assigned,
    assigned_by_call,
    assigned_by_transform,
    called_alone,
    calls_from_module,
    derivative_alone,
    is_loop_header,
    is_return,
    names_string,
    operand_text,
    remember_path,
    returned_calls,
    returned_label,
    returned_values,
    returns_expression,
    returns_one_value,
    rule_owner,
    scope_opened_at,
    statement_line,
)

_TOKEN = re.compile(r"\['((?:[^'\\]|\\.)*)'\]|\[(-?\d+)\]|\.([^.\[\]]+)|\[([^\]]*)\]")


Group = list[tuple[int, str, list[str]]]
_INDEX = re.compile(r"^\[\d+\]")


def input_groups(in_names: Sequence[str], in_args: Sequence[int] | None = None):
    """Flat inputs by argument: `(argument position, items)` with items (flat index,
    prefix, path tokens like `.blocks[0]`, `.w`). Without `in_args`, runs of names
    with the same prefix (before the first `[` or `.`) are one argument. NNX's
    `.value` at the end of a Variable's path is dropped."""
    groups: list[tuple[int, Group]] = []
    for k, name in enumerate(in_names):
        arg, tokens = _split(name)
        if in_args is not None:
            same = bool(groups) and groups[-1][0] == in_args[k]
        else:
            same = bool(groups) and bool(arg) and groups[-1][1][0][1] == arg
        if same:
            groups[-1][1].append((k, arg, tokens))
        else:
            groups.append((in_args[k] if in_args is not None else len(groups), [(k, arg, tokens)]))
    return groups


def output_groups(out_names: Sequence[str]) -> list[Group]:
    """Flat outputs as runs of one returned value, items as `input_groups`'. A value
    is what the name starts with, an index included (`output[0]` of a returned tuple,
    `new model`, `aux`), so a train step's `(params, opt_state, loss)` is three
    groups, each nested by path like an argument's inputs."""
    groups: list[Group] = []
    for k, name in enumerate(out_names):
        arg, tokens = _split(name)
        first = _INDEX.match(tokens[0]) if tokens else None
        if first:  # `output[0]` (and its `[1][0]`), not `aux[<flat index 0>]`
            arg += first.group(0)
            tokens = [t for t in (tokens[0][first.end() :], *tokens[1:]) if t]
        if groups and groups[-1][0][1] == arg:
            groups[-1].append((k, arg, tokens))
        else:
            groups.append([(k, arg, tokens)])
    return groups


def _split(name: str) -> tuple[str, list[str]]:
    """`name`'s prefix (before the first `[` or `.`) and its path tokens, an index
    joined to the name before it (`.blocks[0]`), dict keys spelled as attributes."""
    cut = min((i for i in (name.find("["), name.find(".")) if i >= 0), default=len(name))
    arg, rest = name[:cut], name[cut:]
    tokens = []
    for m in _TOKEN.finditer(rest):
        key, idx, attr, _ = m.groups()
        tokens.append(
            f".{key}"
            if key is not None and written_bare(key)
            else f"[{idx}]"
            if idx is not None
            else f".{attr}"
            if attr is not None
            else m.group(0)
        )
    if len(tokens) > 1 and tokens[-1] == ".value":
        tokens.pop()
    tokens = slash_joined(tokens)  # Haiku's `mlp/~/linear_0/w`
    merged: list[str] = []  # an index belongs to the name before it: `.blocks[0]`
    for t in tokens:
        if t.startswith("[") and merged:
            merged[-1] += t
        else:
            merged.append(t)
    return arg, merged


def path_label(tokens: Sequence[str]) -> str:
    """`blocks[0].w` from tokens `.blocks`, `[0]`, `.w` (`w` from Haiku's `/w`)."""
    return "".join(tokens).lstrip(".").removeprefix("/")


def key_path_label(path: str) -> str:
    """A `jax.tree_util.keystr` path as the inputs' labels write it: `[1]['log_nu']` is
    `[1].log_nu`, Haiku's `['mlp/~/linear_0']['w']` is `mlp/~/linear_0/w`."""
    return path_label(_split("_" + path)[1])


#: Appended to the first scope under a `transpose` transform: the backward pass of a
#: `jax.grad` that `fn` takes itself (a train step) is its own stage, `MLP (backward)`,
#: not a second `MLP#2` beside the forward one.
BACKWARD = " (backward)"
#: Appended to a stage whose every value handed on is a tangent of a `jax.jacfwd` that
#: `fn` takes itself (`build._Builder.mark_tangent`): `PINN (tangent)` holds du/dt.
TANGENT = " (tangent)"


#: Ends the scope Flax Linen pushes for a lambda it runs as a module's method
#: (`nn.cond(flag, lambda m, h: m.head_b(h), ...)`: `Model.<lambda>`), which says nothing.
_LAMBDA_METHOD = ".<lambda>"


def scope_names(eqn) -> tuple[str, ...]:
    """The equation's `named_scope` names; Equinox's own `eqx.nn.Linear` scope is
    dropped right inside a module stage `…: Linear` (or `…: Conv2d`, whose scope is
    `eqx.nn.Conv`) that already says it."""
    names_: list[str] = []
    backward = False
    for kind, name in _compat.name_stack_kinds(eqn):
        if kind == "transform":
            backward = backward or name == "transpose"
        elif name.removesuffix(BACKWARD).endswith(_LAMBDA_METHOD):
            continue  # Linen's scope for a lambda it calls as a method (`nn.cond`'s branches)
        elif frameworks.linen_plumbing_scope(name.removesuffix(BACKWARD)):
            continue  # (`nn.RNN`'s `LSTMCell_0.scan_fn`)
        else:
            names_.append(name + BACKWARD if backward else name)
            backward = False
    names = tuple(names_)
    if not any(n.startswith("eqx.nn.") for n in names):
        return names
    out: list[str] = []
    for n in names:
        # `conv1: Conv2d` holds Equinox's `eqx.nn.Conv` (its base class's scope), and
        # the model's own stage (`MLP`, named by its class) holds `eqx.nn.MLP`; so does
        # its backward pass's, `MLP (backward)`
        module = out[-1].removesuffix(BACKWARD) if out else ""
        if n.startswith("eqx.nn.") and out and (": " in module or module in frameworks.pushed()):
            continue
        out.append(n)
    return tuple(out)


_cwd = os.getcwd() + os.sep


def short_path(file: str) -> str:
    """`file` relative to the working directory when it lies under it; an installed
    package's file from its package (`diffrax/_integrate.py`, not the virtualenv's
    `lib/python3.12/site-packages/…`); a notebook cell's temporary file as IPython
    names it (`In [3]`)."""
    short = _shortened_path(file)
    remember_path(short, file)  # (the source is read by the short name too)
    return short


def _shortened_path(file: str) -> str:
    for packages in ("/site-packages/", "/dist-packages/"):
        if packages in file:
            return file.rsplit(packages, 1)[1]
    if file.startswith(_cwd):
        return file[len(_cwd) :]
    ipython = sys.modules.get("IPython")
    if ipython is not None and "ipykernel" in file:
        try:
            shell = ipython.get_ipython()
            _, name = shell.compile.format_code_name(file)  # ("Cell", "In [3]")
            return str(name)
        except Exception:  # not a cell, or an IPython without the name map
            pass
    return file


#: What a `jnp.where`'s line computes for its test, not a value it masks (`masking_where`)
_MASK_TESTS = frozenset(
    {"gt", "ge", "lt", "le", "eq", "ne", "and", "or", "not", "is_finite", "convert_element_type"}
    | {"broadcast_in_dim", "reshape", "squeeze", "expand_dims"}
)

#: Marks a fold's name as a group of one library call's equations (`split_by_calls`).
#: (A byte no name holds: `\x01o` was found in a line's fold of a function `outer`,
#: `\x01outer:10`, whose library calls were then left unsplit, `res = minimize(...)`'s
#: box 19 loose primitives; `\x01s` would be in a function `solve`'s likewise.)
_SPLIT = "\x01\x10"
#: ... and a `_compat.REENTRANT` call's own work between its calls back
_OWN = "\x01\x11"
#: a scope `jnp.einsum` pushes: its subscripts (`BTNH,BSNH->BNTS`)
_EINSUM = re.compile(r"^[A-Za-z.\u2026]+(,[A-Za-z.\u2026]+)*->[A-Za-z.\u2026]*$")
#: ends the name of a scope `graph.calls` made around one pass of a loop (`cell · readout`)
_PASS = re.compile(r"\x01[^\x01]*\.p\d+$")

#: Prefix of the synthetic scope names that fold runs of unscoped equations
#: (never a user's: named_scope names are printable).
FOLD = "\x00fold:"
#: Prefix of the scope names of the user's own function calls (`graph.calls`): stages
#: of the program's own, unlike folds.
CALL = "\x00call:"
#: the key ending a box `_box_run` makes of a line taking a derivative
_DERIVATIVE_BOX = re.compile(r"\x01d\d+$")
#: Ends the name of a call of the user's function that a library called back
#: (`minimize(f, x0)` evaluating `f`: `calls.group_calls`, or in a loop body the library
#: traced, `fold_names`): drawn inside the library call's group, not splitting it.
CALLED_BACK = "\x01b"
#: Ends the name of a call of a library's closure handed out to the user (jraph's
#: `GraphNetwork`: `calls.group_calls`), whose own work `fold_names` splits by its calls.
CLOSURE = "\x01h"


def call_label(qualname: str) -> str:
    """A user function's label: its name, a method's with its class (`Model.encode`);
    a closure by its own name, however generic (`f` in `encoder`), unlike a library's
    (`function_label` names optax's `update_fn` by the function that made it)."""
    parts = qualname.split(".")
    if len(parts) > 1 and parts[-2] != "<locals>":
        return parts[-2] if parts[-1].startswith("__") else f"{parts[-2]}.{parts[-1]}"
    return parts[-1]


def user_call_label(call: _compat.UserCall) -> str:
    """`call_label` of a call of the user's function, or of the function it is a rule
    of when JAX called it in that function's place (`row_scale`, not its batching
    rule `_rs_rule`: `source_text.rule_owner`); one a library's closure called back is
    said as what it was given as (`update_edge_fn: edge_mlp` in jraph's `GraphNetwork`:
    `_compat.called_as`)."""
    here = call.here()
    name = call.function.rsplit(".", 1)[-1]
    owner = rule_owner(here.file, here.line, name) if here is not None else None
    label = owner or call_label(call.function)
    return f"{call.via}: {label}" if call.via and call.via != label else label


def _top_count(names: Sequence[tuple[str, ...]]) -> int:
    """Nodes at this level: each unscoped equation, plus each run of one scope. A run of
    calls of one user function (`graph.calls`) counts once: `repeats` stacks them
    (`_step (×60)`)."""
    n, prev = 0, None
    for t in names:
        top = t[0] if t else None
        if top is not None and top.startswith(CALL):
            top = fold_label(top)
        if top is None or top != prev:
            n += 1
        prev = top
    return n


#: Closures named for what they do in the function that made them (optax's
#: `scale_by_adam.<locals>.update_fn`): labelled by that function.
_GENERIC = frozenset(
    {
        "update_fn",
        "init_fn",
        "update",
        "init",
        "fn",
        "f",
        "inner",
        "impl",
        "_impl",
        # the transformation `optax.inject_hyperparams(adamw)` returns makes the closures
        "wrapped_transform",
    }
)
#: ... of which these make a state (optax's `chain.<locals>.init_fn`): labelled
#: `chain.init`, told from the update the same function made (`chain`)
_INIT = frozenset({"init_fn", "init"})
#: Frames that only pass a call on: decorators' wrappers, optax's extra-args adapter.
_PASS_THROUGH = frozenset(
    {
        "reraise_with_filtered_traceback",
        "cache_miss",
        "wrapper",
        "wrapped",
        "__call__",
        "call_wrapped",
        "with_extra_args_support",
        "fun_wrapped",  # `eqx.filter_jit`'s (diffrax's `diffeqsolve`, its helpers)
        "run_interceptors",  # Haiku's around every module method (`hk.LSTM`'s gates)
        "next_fun",  # (and its closure calling a method interceptor, sowviz's among them)
        # Haiku's mixed-precision interceptor: installed for every module call once any
        # `hk.mixed_precision.set_policy` ran in the process, policy or not
        "_mixed_precision_interceptor",
        # Flax Linen's lifted `nn.scan` (`nn.RNN`): its body, and the function it scans
        "body_fn",
        "scan_fn",
        "initialize_carry",  # (Flax's bookkeeping: `nn.RNN` making its cell's carry)
    }
)


#: Library closures named by the API that made them, where that API's name alone would
#: read as one of JAX's transforms (`_TRANSFORMS`, whose own work a line's name says):
#: Haiku's `hk.vmap` splits the RNG per member in its `mapped_fun`.
_LIBRARY_CLOSURES = {"vmap.<locals>.mapped_fun": "hk.vmap"}
#: `call_labels` of those closures' work, as `fold_names` reads them.
#: Haiku's lifted loops split their per-layer or per-step keys from its `PRNGSequence`
#: before the loop: `hk.layer_stack(4)(block)` in its `wrapped` (kept in the path, so
#: that its keys are told from the user's own `hk.maybe_next_rng_key()`), `hk.scan`,
#: `hk.cond`, `hk.fori_loop`, ... in `reserve_up_to_full_rng_block`. That split is the
#: loop's plumbing, a run of its own named by the API (`hk.layer_stack`, `hk.scan`),
#: as `hk.vmap`'s is: a wrapper box named by the line's `x` held five `random_split`,
#: `unstack` boxes above `scan(block)`, and `hk.scan`'s were loose beside its loop.
_HAIKU_LAYER_STACK = "layer_stack.<locals>.iterate.<locals>.wrapped"
_HAIKU_RESERVE = "reserve_up_to_full_rng_block"
_HAIKU_LOOPS = ("scan", "cond", "switch", "fori_loop", "while_loop")
#: ... the frames of that split (`_get_rng_stack`'s own `jax.random.split` included)
_HAIKU_KEY_SPLIT = frozenset({"PRNGSequence.reserve", "_get_rng_stack"})
_LIBRARY_CLOSURES[_HAIKU_LAYER_STACK] = "hk.layer_stack"
_PLUMBING = frozenset(
    (label,) for label in (*_LIBRARY_CLOSURES.values(), *(f"hk.{f}" for f in _HAIKU_LOOPS))
)


def _haiku_key_plumbing(path: tuple[str, ...]) -> tuple[str, ...] | None:
    """`call_labels` of a Haiku loop's key split (`_HAIKU_LAYER_STACK`): its API's name;
    of the layer stack's other work (its `scan`), the labels without its wrapper,
    which only passes the call on; None for any other path."""
    if path[:1] == (_HAIKU_LAYER_STACK,):
        split = not _HAIKU_KEY_SPLIT.isdisjoint(path)
        return ("hk.layer_stack",) if split else call_labels(path[1:])
    if path[:1] == (_HAIKU_RESERVE,):
        return ("hk.scan",)  # (its `scan` frame left out with the loop's: `_inside`)
    if len(path) > 1 and path[1] == _HAIKU_RESERVE and path[0] in _HAIKU_LOOPS:
        return (f"hk.{path[0]}",)
    return None


def function_label(qualname: str) -> tuple[str, bool]:
    """A readable name for a function from its `__qualname__`, and whether it only
    passes the call on (a decorator's wrapper). A lambda or comprehension is named by
    the function it is written in (`tree_update_moment`), a generic closure by the
    one that made it (`scale_by_adam`; its state's maker `scale_by_adam.init`), a
    method by its class (`Optimizer.update`).
    (A private closure its maker handed out is named by the maker already in
    `_compat.call_path`: jraph's `_ApplyGCN` is `GraphConvolution`.)"""
    if qualname in _LIBRARY_CLOSURES:
        return _LIBRARY_CLOSURES[qualname], False
    parts = qualname.split(".")
    init = False
    while (
        len(parts) > 2
        and parts[-2] == "<locals>"
        and (parts[-1].startswith("<") or parts[-1] in _GENERIC)
    ):
        init = init or parts[-1] in _INIT
        parts = parts[:-2]
    name = parts[-1]
    through = name.startswith("<") or name in _PASS_THROUGH or name.endswith("_wrapper")
    if len(parts) > 1 and parts[-2] != "<locals>":
        # a method, by its class; a special one (`__init__`) by its class alone
        name = parts[-2] if name.startswith("__") else f"{parts[-2]}.{name}"
    # (`opt_state = tx.init(params)` and `tx.update(...)` were both `chain`)
    return (f"{name}.init" if init else name), through


#: JAX functions that lower to a `scan`, `cond` or `while` loop, by the name a user
#: called (`lax.fori_loop` with static bounds is a scan, `lax.switch` a cond).
_LOWERED = frozenset({"fori_loop", "map", "switch", "associative_scan"})
#: ... and the control flow a line may call: its box holds its branches or body
#: (`library_call_line`)
_CONTROL = frozenset({*_HAIKU_LOOPS, *_LOWERED})


def construct_label(label: str, path: _compat.CallPath) -> str:
    """A loop's or cond's label (`scan(body)`) by the JAX function that made it, when
    that is not `lax.scan` / `lax.cond` itself: `fori_loop(body)`, `switch`; a library
    method whose one `lax.cond` it is, `MultiSteps.update`."""
    api = path.names[-1] if path.names else ""
    if (
        label == "cond"
        and api == "cond"
        and path.package not in (None, "jax")
        and len(path.names) == 2
    ):
        # a library method whose work is one `lax.cond` (`optax.MultiSteps.update`): a
        # bare `cond` box did not say it was the optimizer's update. Named as a call is:
        # BlackJAX's NUTS closure read `dynamic_multiplicative_expansion.<locals>.expand.
        # <locals>.expand_once`, a qualname no one wrote; it is `expand_once`
        return function_label(path.names[0])[0]
    if api not in _LOWERED:
        return label
    _, paren, body = label.partition("(")
    return f"{api}({body}" if paren else api


_labels: dict[tuple[str, ...], tuple[str, ...]] = {}


def call_labels(path: tuple[str, ...]) -> tuple[str, ...]:
    """`_compat.call_path`'s names as labels, pass-through frames left out and a
    function calling itself (`chain` in `chain`) said once."""
    out = _labels.get(path)
    if out is None:
        if len(_labels) > 100_000:  # a long session of many programs
            _labels.clear()
        haiku = _haiku_key_plumbing(path)
        if haiku is not None:
            _labels[path] = haiku
            return haiku
        labels: list[str] = []
        for q in path:
            name, through = function_label(q)
            if not through and (not labels or labels[-1] != name):
                labels.append(name)
        out = _labels[path] = tuple(labels)
    return out


#: A value's types that are floats (`shape_str`'s): the work a return line is named by
_FLOATS = ("float", "bfloat", "complex")
#: The equation a Python operator ends with, where not named like it (`@`: `matmul`)
_OPERATOR_MAKES = {"matmul": ("dot_general",), "pow": ("pow", "integer_pow")}

#: Packages whose functions called from a user's line are each a box of their own
#: (`fold_names`' `layer_key`): the frameworks' functional layers, such as pooling.
LAYER_PACKAGES = frozenset({"flax", "equinox", "haiku"})

#: A level of at most `line_limit` nodes folds one library call's run of at least this
#: many equations into a box named by the call: `jnp.mean` (2), `jax.ops.segment_sum`
#: (3), `gelu` (8); they were drawn as `reduce_sum`, `div` beside folded neighbours.
SMALL_LEVEL_RUN = 2
#: ... and, before a loop its line's call made, this many of that call's broadcasts
#: (`jax.vmap` batching the loop's carry, per leaf) into one `scan(step) setup` box, as
#: a big level does
LOOP_SETUP_RUN = 3
_BROADCAST = frozenset({"broadcast_in_dim"})
#: Marks the fold key of such a run and its loop: parted even when they are all their
#: scope holds (`jax.vmap(adapt)`, `adapt` only a scan): the setup box is not the scope
_SETUP = "\x08"
#: Marks a fold key of a line assigning names (`fold_names`' `assignment_line`): one box
#: from one drawn equation on, named by what the line assigns
_LINE = "\x06"
#: ... and of a lambda's calls on that line (`jax.tree.map`'s, per leaf): one box even
#: when each call is a stage of its own (`take`)
_LEAVES = "\x07"
#: ... and of a line whose value is one random draw (`_fold`'s `draw_run`): one box even
#: around its one stage (`noise` holding `normal`), kept though its key's wrap is a cast
_DRAW = "\x0e"
#: ... and of a line assigning a library call's value (`fold_names`' `library_call_line`):
#: one box even around the call's one stage (`safe` holding `jnp.where`'s `where`)
_CALLED = "\x12"
#: ... and of a library call's one equation made per leaf (`mapped_call`): one box from
#: that one on, as the call's several leaves are (`optax.apply_updates`)
_MAPPED = "\x0f"
#: Equations that only lay a value out: after a stage on an assignment line (`vmap`'s
#: transposes around `rfft`), the stage still makes the line's value
_LAYOUT = frozenset({"transpose", "reshape", "squeeze", "expand_dims", "broadcast_in_dim"})
#: The equations an index of the user's makes (`ts[0]`: `slice`, `squeeze`;
#: `x[i]`: `dynamic_slice`): several from one operation are its box (`plumbed_line`)
_INDEXING = frozenset({"slice", "squeeze", "dynamic_slice", "gather", "reshape"})
#: JAX transforms whose own equations on a line (`jacfwd` unravelling its result) are
#: named by what the line assigns, not by the transform
_TRANSFORMS = frozenset(
    {"jacfwd", "jacrev", "jacobian", "hessian", "grad", "value_and_grad", "jvp", "vjp", "vmap"}
)
#: `jax.lax` collectives: a line assigning one (`g = jax.lax.pmean(g, "batch")`) is one
#: box named by what it assigns (`g`), not by the call (`pmean`), as `l = psum(l)` of
#: one equation is. The value is the same quantity, reduced or moved across devices;
#: `pmean`'s `psum` and `div` per leaf were a box `pmean`, or loose `psum` and `div`
#: at a level that only JAX's pmap plumbing made big.
_COLLECTIVES = _compat.COLLECTIVE_FUNCTIONS


#: The code objects a comprehension runs in (before Python 3.12 a list's too; a
#: generator's still): `f.<locals>.<genexpr>`.
_COMPREHENSIONS = ("<genexpr>", "<listcomp>", "<setcomp>", "<dictcomp>")


def statement_function(qualname: str) -> str:
    """The function whose statement a comprehension in it belongs to (`grad_norms` for
    `grad_norms.<locals>.<genexpr>`): `norms = jnp.sqrt(sum(jnp.sum(g ** 2) for g in
    leaves))` is one line of `grad_norms`, its generator's work and the `sum`'s adds one
    box `norms`, not a box per leaf and per add (the generator's equations were located
    in a function of their own, parting the line's run at every leaf). A lambda keeps its
    own name (a `jax.tree.map(lambda ...)` line's body is read as a lambda's)."""
    while True:
        head, sep, last = qualname.rpartition(".<locals>.")
        if not sep or last not in _COMPREHENSIONS:
            return qualname
        qualname = head


def line_passes(
    locs: Sequence[_compat.SourceLocation | None], frames: Sequence[_compat.UserFrames | None]
) -> list[int]:
    """Per equation, which pass over its line made it: in a run of equations of one line,
    a new pass starts where the innermost user frame goes back (a loop on that line);
    `frames`: each equation's (`_compat.user_frames`). Not where it goes back within one
    comprehension that Python inlined (3.12: `total = jnp.linalg.norm(jnp.array(
    [jnp.linalg.norm(g) for g in leaves]))` is one statement, one box `total`, as a
    generator's frame of its own makes it in 3.11; it read `total`, `total#2`, ...)."""
    out: list[int] = []
    prev_loc: Any = None
    prev: tuple[int, int] | None = None
    prev_comp: Any = None
    n = 0
    for loc, f in zip(locs, frames, strict=True):
        pos = comp = None
        if f is not None:
            pos = (f.calls[-1].key[2], f.calls[-1].lasti) if f.calls else f.root
            comp = f.comprehension
        if loc is None or loc != prev_loc:
            n = 0
        elif (
            pos is not None
            and prev is not None
            and pos[0] == prev[0]
            and pos[1] < prev[1]
            and (comp is None or comp != prev_comp)
        ):
            n += 1
        out.append(n)
        prev_loc, prev, prev_comp = loc, pos, comp
    return out


def fold_names(
    names: list[tuple[str, ...]],
    locs: Sequence[_compat.SourceLocation | None],
    limit: int,
    call_path: Callable[[int], _compat.CallPath] | None = None,
    line_limit: int = 12,
    at_module_call: Callable[[int], bool] | None = None,
    primitives: Sequence[str] = (),
    reentry: Callable[[int], _compat.Reentry | None] | None = None,
    stages: Sequence[str | None] = (),
    passes: Sequence[int] = (),
    backward: Sequence[bool] = (),
    out_types: Callable[[int], tuple[str, ...]] | None = None,
    operations: Sequence[Any] = (),
    span: Callable[[int], Span | None] | None = None,
    draws: Sequence[bool] = (),
    outside: Sequence[bool] = (),
    library_jits: Sequence[bool] = (),
    writes: Sequence[str | None] = (),
    nn_calls: Sequence[bool] = (),
) -> list[tuple[str, ...]]:
    """Scope names with runs of unscoped equations folded. A level with more than
    `line_limit` nodes folds runs of 3 or more equations from one source line, labelled
    by the function that line called (`make_causal_mask`, else `loss:114`); one with
    more than `limit` then folds runs from one function call (`loss`), then chunks of
    what is left (`step ×4 (5–8)`). A run of more than `line_limit` equations in one
    scope or fold (3 or more at a big level) is then split by the library calls that
    made them (`call_path`, below the user's line): `Optimizer.update` holds `chain`,
    which holds `clip_by_global_norm` and `scale_by_adam`, and so on down. A line that
    is the call of the module whose stage holds the run (`at_module_call`) is not
    folded first: the module's own calls say more. A level of at most `line_limit`
    nodes folds only runs of `SMALL_LEVEL_RUN` or more equations of one library call
    on one line (`gelu`, `make_causal_mask`), unless the call is named like one of its
    equations' `primitives` (`lax.conv_general_dilated` and the reshapes around it).
    First of all, a `_compat.REENTRANT` call (`lax.associative_scan`) is one group with
    the equations of the user's function it called back (`reentry`):
    `associative_scan(combine)`. A line's run of calls that are each a stage of their
    own (`stages`, each equation's label when it is one: twelve `checkpoint(h[i])` from
    one `nnx.remat` line) is not folded by its line: the boxes are named already. Nor
    is a group made that a stage inside would restate (`switch` around the `switch`
    that `lax.switch` makes). `passes`: each equation's pass over its line (`line_passes`):
    a loop on one line (`for p in params: x = gelu(x @ p["w"])`) folds a run per pass,
    `x`, `x#2`, `x#3`, each with its value (one fold held every layer, probed on the
    last).

    A call of the user's function that a library called back (`CALLED_BACK`:
    `minimize(f, x0)` evaluating `f` before its loop) is drawn inside the library
    call's groups (`minimize` > `minimize_bfgs` > `f`), not between two halves of
    them. In a loop body the library traced (BFGS's line search), a run of the user's
    function's equations among the library's is a stage named by it too (`f`; `f
    (backward)` for the transposed ones, when `backward` says which they are), as
    outside the loop (it was a fold `f:7`): `_user_calls_in_body`.

    A level that is big only for a Python loop's passes, each a stage and the same few
    equations (`out_types`: each equation's output types), folds neither per call nor
    in chunks: `repeats` stacks the passes (`_looped`).

    `operations`: each equation's Python operation in the user's code (its innermost
    user frame's code and instruction) and whether its outputs are all integers or
    booleans. A small level folds a line one of whose operations made several equations
    that no call names, integer work among them (`x = p["embed"][idx]`: jnp's wrap of a
    negative index, `lt`, `add`, `select_n`, `broadcast_in_dim`, around the `gather`),
    as a big level does: the line is one box `x`, not the plumbing of an index the user
    wrote once. (A derivative's extra equations, `x ** 2`'s `mul` by 2, are floats.)
    `span`: where on its line each equation was made (`_compat.user_span`): a line's
    run that computes an argument of the call the line assigns is named by that
    argument (`tokens[:, pos]`), not by the call's targets (`logits, caches`).
    `draws`: whether each equation draws from a PRNG key (`_compat.draws_from_key`): a
    line assigning one draw (`noise = jax.random.normal(k, shape)`) is a box named by
    what it assigns, holding the draw's stage (`normal`), as the same line drawing from
    an `nnx.Rngs` stream is. `outside`: whether each equation was made on the line of
    the lambda sowviz traced (`_compat.on_traced_lambda_line`): that line's statement
    (`ins = sowviz.inspect(lambda w, x: ..., w, x)`) ran outside the program, and its
    target (`ins`, or a bare call's `sowviz.show`) names none of the lambda's work, which
    is drawn as a function's own lines are. `library_jits`: whether each equation is a
    `jit` of a library's own function (`jnp.argsort`, `jnp.tril`), not one of the user's:
    a line assigning a name from its own work and such a call (`order =
    jnp.argsort(-scores)`) is one box named by it, not `neg` beside `argsort`.
    `writes`: per equation, the label (`mean (new)`) and key of the run it is in of the
    statement making a value that the module whose scope holds it assigns to its
    variables (`build.write_lines`): Flax's `ra_mean.value = momentum * ra_mean.value +
    ...` is one box with the new running mean, not loose `mul`, `mul`, `add`.
    `nn_calls`: whether each equation is the call of one of `jax.nn`'s functions
    (`_compat.is_jax_nn_call`): a line assigning an activation's value (`logp =
    jax.nn.log_softmax(h)`) keeps the activation's box, named by it."""
    facts = _Facts(
        call_path,
        at_module_call,
        primitives,
        reentry,
        stages,
        passes,
        backward,
        out_types,
        operations,
        span,
        draws,
        outside,
        library_jits,
        writes,
        nn_calls,
    )
    folded = _fold_level(names, locs, limit, line_limit, facts)
    return _without_cast_folds(folded, primitives)


@dataclasses.dataclass(frozen=True)
class _Facts:
    """What `fold_names` knows of each equation of a level besides its names and line
    (see there); every field optional."""

    call_path: Callable[[int], _compat.CallPath] | None = None
    at_module_call: Callable[[int], bool] | None = None
    primitives: Sequence[str] = ()
    reentry: Callable[[int], _compat.Reentry | None] | None = None
    stages: Sequence[str | None] = ()
    passes: Sequence[int] = ()
    backward: Sequence[bool] = ()
    out_types: Callable[[int], tuple[str, ...]] | None = None
    operations: Sequence[Any] = ()
    span: Callable[[int], Span | None] | None = None
    draws: Sequence[bool] = ()
    outside: Sequence[bool] = ()
    library_jits: Sequence[bool] = ()
    writes: Sequence[str | None] = ()
    nn_calls: Sequence[bool] = ()

    def run(self, start: int, stop: int) -> _Facts:
        """The facts of equations `[start, stop)`, as a level of their own numbers them."""
        return _Facts(
            _shifted(self.call_path, start),
            _shifted(self.at_module_call, start),
            self.primitives[start:stop],
            _shifted(self.reentry, start),
            self.stages[start:stop],
            self.passes[start:stop],
            self.backward[start:stop],
            _shifted(self.out_types, start),
            self.operations[start:stop],
            _shifted(self.span, start),
            self.draws[start:stop],
            self.outside[start:stop],
            self.library_jits[start:stop],
            self.writes[start:stop],
            self.nn_calls[start:stop],
        )


def _fold_level(
    names: list[tuple[str, ...]],
    locs: Sequence[_compat.SourceLocation | None],
    limit: int,
    line_limit: int,
    facts: _Facts,
) -> list[tuple[str, ...]]:
    """`fold_names`, its facts bundled."""
    if facts.call_path is not None:
        # (read once here, again by the folds)
        facts = dataclasses.replace(facts, call_path=functools.cache(facts.call_path))
        names = _user_calls_in_body(names, locs, facts.call_path, facts.backward)
    # (a `_compat.REENTRANT` call's own group holds its calls back: `fold_callbacks`)
    reentry = facts.reentry
    cut = [
        None if reentry is not None and reentry(i) is not None else _called_back_at(t)
        for i, t in enumerate(names)
    ]
    if all(c is None for c in cut):
        return _fold(names, locs, limit, line_limit, facts)
    return _fold_around_calls_back(names, cut, locs, limit, line_limit, facts)


def _without_cast_folds(names: list[tuple[str, ...]], primitives: Sequence[str]) -> list:
    """`names` without the folds that hold one drawn equation: the others were a PRNG
    key's retyping (`_compat.KEY_CASTS`), drawn as edges (`build._is_type_cast`). A raw
    key's `k = jax.random.fold_in(key, 3)` line (wrap, `random_fold_in`, unwrap) was
    else a box `k` around its one `random_fold_in`, where a typed key's is that box. A
    line's one random draw (`_DRAW`) keeps its box, a typed key's as a raw key's."""
    casts = [p in _compat.KEY_CASTS for p in primitives]
    if not any(casts):
        return names
    out = list(names)
    depth = max((len(n) for n in names), default=0)
    for d in reversed(range(depth)):  # (inner first: stripping one keeps outer runs)
        i = 0
        while i < len(out):
            j = i + 1
            while j < len(out) and out[j][: d + 1] == out[i][: d + 1]:
                j += 1
            fold = len(out[i]) > d and out[i][d].startswith(FOLD) and _DRAW not in out[i][d]
            if fold and j - i > 1 and sum(not casts[k] for k in range(i, j)) == 1:
                for k in range(i, j):
                    out[k] = out[k][:d] + out[k][d + 1 :]
            i = j
    return out


def _called_back_at(names: tuple[str, ...]) -> int | None:
    """Where the first call back (`CALLED_BACK`) sits in an equation's scope names."""
    return next((d for d, n in enumerate(names) if n.endswith(CALLED_BACK)), None)


def _user_runs(call_path: Callable[[int], _compat.CallPath], n: int) -> list[tuple[int, int]]:
    """Runs `[i, j)` of equations with a frame of the user's (`CallPath.below_user`)
    right after or before one made by a library alone (in a body the library traced
    itself: no frame of the user's)."""
    paths = [call_path(i) for i in range(n)]
    library = [not p.below_user and bool(p.names) for p in paths]
    user = [p.below_user for p in paths]
    runs: list[tuple[int, int]] = []
    i = 0
    while i < n:
        if not user[i]:
            i += 1
            continue
        j = i
        while j < n and user[j]:
            j += 1
        if (i > 0 and library[i - 1]) or (j < n and library[j]):
            runs.append((i, j))
        i = j
    return runs


def _user_calls_in_body(
    names: list[tuple[str, ...]],
    locs: Sequence[_compat.SourceLocation | None],
    call_path: Callable[[int], _compat.CallPath],
    backward: Sequence[bool],
) -> list[tuple[str, ...]]:
    """`names` with each run of the user's function's equations in a body a library
    traced (`_user_runs`) in a scope named by the function (`f`; its transposed
    equations, per `backward`, in `f (backward)`). JAX traces a loop's body with a
    traceback of its own: the library's frames start it, and the user's function
    (BFGS's objective) has no call of its own there to be named by
    `calls.group_calls`. A run of several of the user's functions' frames (none
    known to be the outermost) or of a lambda names nothing: it stays as it was.
    Unlike a call back at the user's level, the scope parts the library's work
    around it (`body`, `f`, `body#2`), as the fold by its line did: a loop body of a
    hundred library calls is no clearer as one run."""
    out = list(names)
    for i, j in _user_runs(call_path, len(names)):
        functions = {loc.function for loc in locs[i:j] if loc is not None}
        if len(functions) != 1 or any(loc is None for loc in locs[i:j]):
            continue
        label = call_label(functions.pop())
        if label.startswith("<"):
            continue
        at = min(len(t) for t in names[i:j])  # the scopes the whole run is in
        while any(t[:at] != names[i][:at] for t in names[i:j]):
            at -= 1
        if any(_says(label, fold_label(scope)) for scope in names[i][:at]):
            # a stage around says it already (optimistix's module `fn: rosenbrock`; a
            # diffrax `vector_field: Func` around its `mlp: MLP`, whose work is all of
            # `Func.__call__`'s line `self.mlp(y)`)
            continue
        inside = CALLED_BACK if _called_from_within(call_path, i, j, len(names)) else ""
        for m in range(i, j):
            back = m < len(backward) and backward[m]
            part = f"{label}{BACKWARD}" if back else label
            name = f"{CALL}{part}\x01body{i}{'b' if back else ''}{inside}"
            out[m] = (*out[m][:at], name, *out[m][at:])
    return out


def _called_from_within(
    call_path: Callable[[int], _compat.CallPath], i: int, j: int, n: int
) -> bool:
    """Whether the user's run `[i, j)` in a body a library traced was called from inside
    one of the library's calls below the body's own function: the library's equations
    right before and right after it share at least two functions. BlackJAX's NUTS body
    `add_one_state` calls its integrator's `one_step`, which evaluates your
    `logdensity_fn` between its momentum and position updates: the call is drawn inside
    `add_one_state` > `one_step` (a call back, `CALLED_BACK`), where it parted
    `add_one_state` in two around a loose `logdensity_fn`. Not in JAX's own algorithms
    (BFGS's line search keeps `body`, `f`, `body#2`: the library's work around `f` is
    hundreds of equations that no call of it names)."""
    if i == 0 or j >= n:
        return False
    before, after = call_path(i - 1), call_path(j)
    if before.below_user or after.below_user or before.package in (None, "jax"):
        return False
    shared = 0
    for a, b in zip(before.names, after.names, strict=False):
        if a != b:
            break
        shared += 1
    return shared >= 2


def _says(label: str, stage: str) -> bool:
    """Whether a stage's label names the function `label`: as its call (`f`, `f
    (backward)`) or its module's class (`fn: rosenbrock`, `vector_field: Func`)."""
    return label in (stage.removesuffix(BACKWARD), stage.rpartition(": ")[2])


def _fold_around_calls_back(
    names: list[tuple[str, ...]],
    cut: Sequence[int | None],
    locs: Sequence[_compat.SourceLocation | None],
    limit: int,
    line_limit: int,
    facts: _Facts,
) -> list[tuple[str, ...]]:
    """`fold_names` of a level holding calls back (`cut`: where each equation's first
    sits in its names, or None). Outside, each called-back equation stands for the
    library's work around it: its scope names end before the call, its line and
    library calls are those of its neighbours outside calls back (their shared
    calls), so the library's group goes around it; inside, each call's equations are
    folded as a level of their own, and the call's scope goes back in below the groups
    made outside."""
    call_path, at_module_call, reentry = facts.call_path, facts.at_module_call, facts.reentry
    n = len(names)
    hidden = [c is not None for c in cut]
    outer = [t[:c] if c is not None else t for t, c in zip(names, cut, strict=True)]

    def neighbour(i: int, step: int) -> int | None:
        m = i + step
        while 0 <= m < n and (hidden[m] or outer[m] != outer[i]):
            if not hidden[m] and outer[m][: len(outer[i])] != outer[i]:
                return None  # left the scope the call is in
            m += step
        return m if 0 <= m < n else None

    around = {i: (neighbour(i, -1), neighbour(i, 1)) for i in range(n) if hidden[i]}

    def outer_loc(i: int) -> _compat.SourceLocation | None:
        if not hidden[i]:
            return locs[i]
        a, b = around[i]
        return locs[a] if a is not None else locs[b] if b is not None else locs[i]

    def outer_path(i: int) -> _compat.CallPath:
        assert call_path is not None
        if not hidden[i]:
            return call_path(i)
        paths = [call_path(m) for m in around[i] if m is not None]
        if not paths:
            return _compat.CallPath()
        shared = list(
            itertools.takewhile(
                lambda ps: len(set(ps)) == 1, zip(*(p.names for p in paths), strict=False)
            )
        )
        names = tuple(ps[0] for ps in shared)
        return dataclasses.replace(paths[0], names=names, packages=paths[0].packages[: len(names)])

    def outer_pass(i: int) -> int:
        a = around[i][0] if hidden[i] else i
        return facts.passes[a] if a is not None and a < len(facts.passes) else 0

    def outer_module_call(i: int) -> bool:
        # A called-back equation is on its neighbours' line (`outer_loc`), so it is at
        # the call of their module when they are: Equinox's `MultiheadAttention` calling
        # the user's `process_heads` back was else folded by the caller's line (`x = x +
        # self.attn(...)`), a box `x` inside `attn` around `process_heads`.
        assert at_module_call is not None
        if not hidden[i]:
            return at_module_call(i)
        a, b = around[i]
        m = a if a is not None else b
        return m is not None and at_module_call(m)

    # outside, a called-back equation is no primitive, re-entry nor stage
    outside = dataclasses.replace(
        facts,
        call_path=outer_path if call_path is not None else None,
        at_module_call=at_module_call and outer_module_call,
        primitives=[("" if hidden[i] else p) for i, p in enumerate(facts.primitives)],
        reentry=reentry and (lambda i: None if hidden[i] else reentry(i)),
        stages=[(None if hidden[i] else s) for i, s in enumerate(facts.stages)],
        passes=[outer_pass(i) for i in range(n)] if facts.passes else (),
        backward=(),
    )
    folded = _fold(outer, [outer_loc(i) for i in range(n)], limit, line_limit, outside)
    out = list(folded)
    i = 0
    while i < n:
        c = cut[i]
        if c is None:
            i += 1
            continue
        j = i  # the run of this call's equations
        while j < n and cut[j] == c and names[j][: c + 1] == names[i][: c + 1]:
            j += 1
        run = range(i, j)
        inner = _fold_level(
            [names[m][c + 1 :] for m in run], locs[i:j], limit, line_limit, facts.run(i, j)
        )
        for k, m in enumerate(run):
            out[m] = (*folded[m], names[m][c], *inner[k])
        i = j
    return out


def _per_leaf(prims: Sequence[str], keys: Sequence[str | None], a: int, b: int) -> bool:
    """Whether the caller's equations between two runs of one call (`a` ends one, `b`
    starts the next; `prims`: each equation's primitive) are work per leaf, as a
    `tree.map` repeats it: the same primitives right before the first run or right after
    the second (`clip(g * 2)`, `clip(g) * 2`). Not other work that sits between two calls
    of one function: a GRU cell's `weight_hh @ hidden` between its two `jnp.split`s (of
    its input's gates and of its hidden state's) was drawn inside a box `split`, the
    recurrence hidden, while the input's matmul stood apart. Without primitives: yes."""
    if not any(prims):
        return True
    gap = list(prims[a + 1 : b])
    lo, hi = a, b
    while lo > 0 and keys[lo - 1] == keys[a]:
        lo -= 1
    while hi + 1 < len(keys) and keys[hi + 1] == keys[b]:
        hi += 1
    before = list(prims[lo - len(gap) : lo]) if lo >= len(gap) else None
    after = list(prims[hi + 1 : hi + 1 + len(gap)])
    return gap in (before, after)


def _shifted(fn: Callable[[int], Any] | None, start: int) -> Callable[[int], Any] | None:
    """`fn` of the equations from `start` on, as a level of their own numbers them."""
    return None if fn is None else lambda k: fn(start + k)


def _fold(
    names: list[tuple[str, ...]],
    locs: Sequence[_compat.SourceLocation | None],
    limit: int,
    line_limit: int,
    facts: _Facts,
) -> list[tuple[str, ...]]:
    """`fold_names` of a level holding no call back (`CALLED_BACK`)."""
    call_path, at_module_call, reentry = facts.call_path, facts.at_module_call, facts.reentry
    primitives, stages, passes = facts.primitives, facts.stages, facts.passes
    operations = facts.operations
    if call_path is None and max(_direct(names).values(), default=0) <= line_limit:
        return names
    out = list(names)
    found: dict[int, _compat.CallPath] = {}  # read from tracebacks only where needed

    def path(i: int) -> _compat.CallPath:
        p = found.get(i)
        if p is None:
            p = found[i] = call_path(i) if call_path is not None else _compat.CallPath()
        return p

    def calls(i: int) -> tuple[str, ...]:
        return call_labels(path(i).names)

    # An einsum inside a library call (`jax.nn.dot_product_attention`'s two) pushes its
    # subscripts as a scope of its own (`BTNH,BSNH->BNTS`): its equations stay in the
    # runs of the call's others, and the groups of those runs go around that scope.
    inner = {
        i
        for i, o in enumerate(out)
        if o and _EINSUM.match(o[-1]) and calls(i) and calls(i)[0] != "einsum"
    }

    def scope_of(m: int) -> tuple[str, ...]:
        return out[m][:-1] if m in inner else out[m]

    def levels() -> dict[tuple[str, ...], int]:
        return _direct([scope_of(m) for m in range(len(out))])

    def fold_callbacks() -> None:
        # Runs of one REENTRANT call's equations, its callback's among them, by the
        # caller's line; the group goes in at the scope the run started in.
        def entry(i: int) -> tuple[str, str | None] | None:
            r = entered[i]
            if r is not None:
                lam = r.entered.endswith("<lambda>")
                body = "lambda" if lam else function_label(r.entered)[0]
                return f"{r.caller.function}:{r.caller.line}\x03{r.api}", body
            loc, what = locs[i], path(i).names[-1:]
            if loc is None or not what or what[0] not in _compat.REENTRANT:
                return None
            return f"{loc.function}:{loc.line}\x03{what[0]}", None

        entered = [reentry(i) if reentry is not None else None for i in range(len(out))]
        if not any(entered):
            return  # no call back here: the call paths of every equation are not needed
        keys = [entry(i) for i in range(len(out))]
        i = 0
        while i < len(out):
            if keys[i] is None:
                i += 1
                continue
            j = i
            while j + 1 < len(out) and keys[j + 1] is not None and keys[j + 1][0] == keys[i][0]:
                j += 1
            bodies = {keys[m][1] for m in range(i, j + 1)} - {None, "lambda"}
            api = keys[i][0].rsplit("\x03", 1)[1]
            label = f"{api}({bodies.pop()})" if len(bodies) == 1 else api
            scopes = [scope_of(m) for m in range(i, j + 1)]
            at = min(map(len, scopes))  # the scopes the whole run is in
            while any(sc[:at] != scopes[0][:at] for sc in scopes):
                at -= 1
            name = f"{FOLD}{label}\x01{keys[i][0]}\x01{i}"
            # inside, each call back (`combine`) and the library's work between them
            part = [keys[m][1] for m in range(i, j + 1)]
            starts = [0] + [k for k in range(1, len(part)) if part[k] != part[k - 1]]
            for a, b in zip(starts, [*starts[1:], len(part)], strict=True):
                sub = (
                    f"{FOLD}{part[a]}\x01{i + a}"
                    if part[a]
                    else f"{FOLD}{_compat.REENTRANT[api]}{_OWN}{i + a}"
                )
                for m in range(i + a, i + b):
                    nested = (name, sub) if len(starts) > 1 else (name,)
                    out[m] = (*out[m][:at], *nested, *out[m][at:])
            i = j + 1

    if reentry is not None:
        fold_callbacks()

    def restated(run: Iterable[int], label: str) -> bool:
        # a group named like a stage it holds (`switch` around `lax.switch`'s clamp of
        # its index and its `cond`, labelled `switch`; `fori_loop(body)`) says it twice
        for m in run:
            own = stages[m] if m < len(stages) else None
            if own and (own == label or own.startswith(label + "(")):
                return True
        return False

    def fold_runs(
        key, least: int = 2, label=None, inner: bool = False, whole: bool = True, small=None
    ):
        # `small`: the least run of a small level's key (`\x03` and its call), if its own
        direct = levels()
        i = 0
        while i < len(out):
            k = key(i)
            j = i
            while j + 1 < len(out) and k is not None and key(j + 1) == k:
                j += 1
            need = small if small is not None and k is not None and "\x03" in k else least
            if k is not None and _MAPPED in k:
                need = 1  # (a library call's one equation per leaf: `mapped_call`)
            named = inner and all(m < len(stages) and stages[m] for m in range(i, j + 1))
            named = named and (k is None or not any(c in k for c in (_LEAVES, _DRAW, _CALLED)))
            # (a call's stages with the layout its `axis=` adds around them, `irfft`'s
            # `transpose`, `pad`, `irfft`, `transpose`: one box named by the call too)
            laid = inner and k is not None and _LINE not in k and _laid_out(i, j)
            whole_call = (named or laid) and k is not None and one_call_stages(i, j, k)
            named = named and not whole_call
            # `whole=False`: a run that is all its scope holds would only restate it; not a
            # lambda's calls per leaf, whose leaves are one box, alike, wherever they are;
            # nor a loop's setup, parted from the loop below
            leaves = k is not None and (_LEAVES in k or _SETUP in k)
            if (
                k is not None
                and not named
                and (assignment_box(i, j, k) if _LINE in k else j + 1 - i >= need)
                and (whole or leaves or j + 1 - i < direct.get(scope_of(i), 0))
            ):
                name = FOLD + (f"{label(i, j, k)}\x01{k}" if label else k)
                if whole_call and not named and line_assigns(i):
                    # (`xf = jnp.fft.rfft(x, axis=1)`: `xf` holding `rfft`, not a box
                    # `rfft` around the stage `rfft`, saying it twice)
                    name = f"{FOLD}{line_assigns(i)}\x01{k}"
                again_named = not whole_call and restated(range(i, j + 1), fold_label(name))
                if again_named and library_cond_line(i, j, k):
                    name = f"{FOLD}{line_assigns(i)}\x01{k}"  # (the cond inside it, whole)
                elif again_named:
                    # The stage apart, the line's other work around it is still a group
                    # (`jax.vmap` batching a scan's unbatched carry: a broadcast per
                    # leaf of an optimiser state, 32 loose boxes before `scan(step)`).
                    # Before the stage it is the stage's setup (`scan(step) setup`: named by
                    # what the line assigns, it read as the scan's result); after it,
                    # what the line assigns.
                    a, b = i, j
                    while a <= b and a < len(stages) and stages[a]:
                        a += 1
                    while b >= a and b < len(stages) and stages[b]:
                        b -= 1
                    if (
                        (a, b) != (i, j)
                        and b + 1 - a >= max(least, 3)
                        and not any(m < len(stages) and stages[m] for m in range(a, b + 1))
                    ):
                        line = k.split("\x02", 1)[0]
                        # (before the stage named like the group, though another stage,
                        # `isinf`, comes first: still its setup)
                        before = b < j and restated((b + 1,), fold_label(name))
                        apart = (
                            f"{fold_label(stages[b + 1])} setup"
                            if a == i or before
                            else line_assigns(a) or line
                        )
                        for m in range(a, b + 1):
                            at = len(scope_of(m)) if inner else 0
                            out[m] = (*out[m][:at], f"{FOLD}{apart}\x01{k}\x05", *out[m][at:])
                    i = j + 1
                    continue
                for m in range(i, j + 1):
                    if inner:
                        at = len(scope_of(m))
                        out[m] = (*out[m][:at], name, *out[m][at:])
                    else:
                        out[m] = (name, *out[m])
            i = j + 1

    def _laid_out(i: int, j: int) -> bool:
        # `[i, j]` is stages, one at least, and equations that only lay a value out
        return any(m < len(stages) and stages[m] for m in range(i, j + 1)) and all(
            (m < len(stages) and stages[m]) or (m < len(primitives) and primitives[m] in _LAYOUT)
            for m in range(i, j + 1)
        )

    def library_cond_line(i: int, j: int, key: str) -> bool:
        # The line assigns what a library's `lax.cond` makes, named like the call
        # (optax's `value_and_grad_from_state`: `isinf` and `isnan` of the state's value,
        # then the cond returning `value, grad`): one box named by what the line assigns,
        # holding the predicate's work and the cond. Parted, the box `value, grad` held
        # only the cond's int32 branch index, the value and gradient in the cond beside
        # it and `isinf` loose. (A loop, or JAX's own `lax.switch`, stays apart: a line's
        # box would hide it.)
        last = j
        while last > i and last < len(primitives) and primitives[last] in _LAYOUT:
            last -= 1
        if _SETUP in key or last >= len(stages) or not stages[last]:
            return False
        if last >= len(primitives) or primitives[last] != _compat.COND:
            return False
        return path(last).package not in (None, "jax") and line_assigns(i) is not None

    def one_call_stages(i: int, j: int, key: str) -> bool:
        # The run's stages are one library call's small jits, one of them named like the
        # call (`jnp.fft.irfft(x, n=16)`: JAX's `jnp.pad` jit, then the `fft` jit
        # labelled `irfft`): one box named by the call, holding both, as the call
        # without `n` is one box `irfft` (a `pad` box read as a line of the user's)
        what = key.rpartition("\x03")[2] if "\x03" in key else ""
        if not what or j == i or any(construct_in(m) for m in range(i, j + 1)):
            return False
        return any(stages[m] == what for m in range(i, j + 1))

    def line_label(i: int, j: int, where: str) -> str:
        # The function the line called when it called one (`make_causal_mask`); not
        # the line's own function, first in a path that starts there (a cond branch).
        whats = {(calls(m) or (None,))[0] for m in range(i, j + 1)}
        what = whats.pop() if len(whats) == 1 else None
        own = where.split("\x02", 1)[0]
        # (an assignment's one primitive, `amplitude = jnp.exp(...)`, or its lambda's call
        # per leaf, is the line's, not a call of several equations named by it: `mean`,
        # `make_causal_mask`)
        single = _LINE in where and (len(drawn(i, j)) == 1 or _LEAVES in where)
        # (nor a line assigning a library call's value: `e_atom`, `library_call_line`)
        single = single or _CALLED in where
        # (nor is a call named like one of its equations, `lax.dynamic_update_slice`: the
        # line's name tells K's update from V's)
        single = single or (
            restates_primitive(i, j) and locs[i] is not None and bool(line_assigns(i))
        )
        # (nor a collective's, `g = jax.lax.pmean(g, "batch")`: still `g`, `_COLLECTIVES`)
        single = single or (_LINE in where and what in _COLLECTIVES)
        if what and what != own.rsplit(":", 1)[0] and what not in _TRANSFORMS and not single:
            return what
        # (a transform's own work, `jacfwd` unravelling du/dt, is what the line assigns:
        # `u_t`)
        # else what the line assigns (`t, eps`), which its number (`loss:5`) does not say;
        # a `return` line's run that is the last work of its scope is what the function
        # returns (not the arguments of a call after it: `return head(x * 2)`'s `mul`)
        loc = locs[i]
        if loc is None:
            return own
        operand = argument(i, j, loc)
        if operand:
            return operand
        after = j + 1  # (a Tesseract is never in a line's run: `line_key`)
        if after < len(primitives) and primitives[after] == _compat.TESSERACT:
            if locs[after] == loc and after < len(stages) and stages[after]:
                return f"{stages[after]} inputs"  # not `u`, which the Tesseract makes
        named = line_assigns(i)
        if named:
            return named
        sc = scope_of(i)
        last = not any(
            scope_of(m)[: len(sc)] == sc and not replayed(m, loc) for m in range(j + 1, len(out))
        )
        if last and is_return(loc.file, loc.line):  # what it computes (`mean`), not `return`
            # (of several values, those the run computes: `toks[order], s[order]`)
            spans = [facts.span(m) for m in range(i, j + 1)] if facts.span is not None else []
            known = [s for s in spans if s is not None]
            several = None
            if len(known) == len(spans):
                several = returned_values(loc.file, loc.line, known)
            made, label = returned_work(i, j, loc), returned_label(loc.file, loc.line)
            if len(made) > 1 and (label is None or label in made):
                return " · ".join(made)  # (`mean` alone hid the cross-entropy before it)
            return label or several or " · ".join(made) or own
        if outside_at(i):  # (`sowviz.show(lambda w, x: ...)`: not `sowviz.show`)
            return own
        # a bare call (`jax.debug.print`), or an argument and its call's first work
        return called_alone(loc.file, loc.line) or argument_before_call(i, j, loc) or own

    def returned_work(i: int, j: int, loc: _compat.SourceLocation) -> list[str]:
        # What a return line's run computes, by the library calls written on the line
        # that make its floats, in the order they ran (`log_softmax`, `mean`; not
        # `jnp.arange`'s index), then the operator making the value (`sum`, `div` of
        # `return jnp.sum(nll * mask) / jnp.sum(mask)`): the line's place (`loss:7`) says
        # none of it, its outermost call alone (`mean`) not the call it wraps
        found = returned_calls(loc.file, loc.line)
        if found is None:
            return []
        written, operator = found
        types = facts.out_types
        made: list[str] = []
        for m in range(i, j + 1):
            # (a library's jit is a stage of its own, named: `log_softmax`)
            own = stages[m] if m < len(stages) else None
            call = (own.split("(", 1)[0],) if own else calls(m)[:1]
            if not call or call[0] not in written or call[0] in made:
                continue
            if types is None or any(t.startswith(_FLOATS) for t in types(m)):
                made.append(call[0])
        if operator is not None and j < len(primitives):
            if primitives[j] in _OPERATOR_MAKES.get(operator, (operator,)):
                made.append(operator)
        return made

    def outside_at(m: int) -> bool:
        # made on the line of the lambda sowviz traced, whose statement ran outside the
        # program (`ins = sowviz.inspect(lambda w, x: ...)`: `fold_names`' `outside`)
        return m < len(facts.outside) and facts.outside[m]

    def line_assigns(m: int) -> str | None:
        # what `m`'s line assigns (`source_text.assigned`), when its statement is the
        # program's: not `ins` of `ins = sowviz.inspect(lambda w, x: ...)` (`outside_at`)
        loc = locs[m]
        return None if loc is None or outside_at(m) else assigned(loc.file, loc.line)

    def argument(i: int, j: int, loc: _compat.SourceLocation) -> str | None:
        # the argument of the line's call that the run computes, as written
        spans = [facts.span(m) for m in range(i, j + 1)] if facts.span is not None else []
        if not spans or None in spans:
            return None
        start = min((s[0], s[1]) for s in spans if s is not None)
        end = max((s[2], s[3]) for s in spans if s is not None)
        return operand_text(loc.file, loc.line, (*start, *end))

    def argument_before_call(i: int, j: int, loc: _compat.SourceLocation) -> str | None:
        # A run computing one argument of the line's call, then the first work of that
        # call before its stages (NumPyro's `elbo.loss(key, svi.constrain_fn(params),
        # ...)`: the parameters' `transform_fn`, then the ELBO's key split): named by that
        # argument, as the argument alone is. Together their spans are the whole call,
        # which is no argument, and the box read `loss_fn:14`.
        spans = [facts.span(m) for m in range(i, j + 1)] if facts.span is not None else []
        if not spans or None in spans:
            return None
        texts = {s: operand_text(loc.file, loc.line, s) for s in set(spans)}
        args = {s for s, t in texts.items() if t}
        # (two spans: the argument and the call; more is an expression around the
        # argument, `jnp.concatenate([h, -h], -1) * 2.0 + 1.0`, not the call's first work)
        if len(args) != 1 or len(texts) != 2:
            return None
        (arg,) = args
        # (the rest is the call around the argument, not another argument unnamed)
        around = all(
            (s[0], s[1]) <= (arg[0], arg[1]) and (s[2], s[3]) >= (arg[2], arg[3])
            for s in texts
            if s != arg
        )
        return texts[arg] if around else None

    def replayed(m: int, ret: _compat.SourceLocation) -> bool:
        # An equation of the returning function's lines up to its return, after it: its
        # backward pass, in the call's scope when the scope does not part the passes (a
        # library's loop body calling the user's function's `value_and_grad`).
        loc = locs[m]
        return loc is not None and loc.function == ret.function and loc.line <= ret.line

    def unscoped(i: int) -> bool:
        return not out[i] or out[i][0].startswith(FOLD)

    def long_run(i: int, what: str) -> bool:
        # At least SMALL_LEVEL_RUN equations around `i` from its line and this call, none
        # of them named like the call (`lax.dynamic_update_slice`: its index clamp was a
        # box `dynamic_update_slice` beside the equation of that name). A small level
        # draws few nodes, so the run is short.
        def same(m: int) -> bool:
            return 0 <= m < len(out) and locs[m] == locs[i] and calls(m)[:1] == (what,)

        lo = hi = i
        while same(lo - 1):
            lo -= 1
        while same(hi + 1):
            hi += 1
        named = any(m < len(primitives) and primitives[m] == what for m in range(lo, hi + 1))
        return hi - lo + 1 >= SMALL_LEVEL_RUN and not named

    def mapped_call(i: int) -> bool:
        # `i` is all that a library's call on its line made (not JAX's: `jnp.exp` is its
        # `exp`), made in the library's lambda per leaf (`optax.apply_updates`'s
        # `jax.tree.map`): the call's box, as for several leaves, not a bare `add` for
        # one array, nor a box named by the line (`w = optax.apply_updates(w, updates)`
        # beside the input `w`)
        p, what = path(i), calls(i)[:1]
        if not what or p.package in (None, "jax") or not p.below_user:
            return False
        if (i < len(stages) and stages[i]) or (i < len(primitives) and what[0] == primitives[i]):
            return False
        for m in (i - 1, i + 1):  # (one equation: a longer run is `long_run`'s)
            if 0 <= m < len(out) and locs[m] == locs[i] and calls(m)[:1] == what:
                return False
        return any(q.rsplit(".", 1)[-1] == "<lambda>" for q in p.names[1:])

    def lambda_run(i: int) -> bool:
        # at least 3 equations around `i` from its line, in no library call
        lo = hi = i
        while lo > 0 and locs[lo - 1] == locs[i] and not calls(lo - 1):
            lo -= 1
        while hi + 1 < len(out) and locs[hi + 1] == locs[i] and not calls(hi + 1):
            hi += 1
        return hi - lo + 1 >= 3 and not calls(i)

    def draw_run(lo: int, hi: int) -> bool:
        # The run's one drawn equation draws from a PRNG key (`jax.random.normal`'s jit,
        # after a raw key's wrap): its value is what the line names (`noise`), not the
        # distribution's function (`normal`), which the box holds
        boxes = drawn(lo, hi)
        return len(boxes) == 1 and boxes[0] < len(facts.draws) and facts.draws[boxes[0]]

    def drawn(i: int, j: int) -> list[int]:
        # the equations of `[i, j]` drawn as boxes: not a cast drawn as an edge
        casts = _compat.KEY_CASTS | _compat.TYPE_CASTS
        return [m for m in range(i, j + 1) if m >= len(primitives) or primitives[m] not in casts]

    def assignment_box(i: int, j: int, key: str) -> bool:
        # An assignment line's run is one box from one drawn equation on, when it has a
        # value to show: a key's or an index's one equation keeps its primitive's name
        # (`k = jax.random.fold_in(key, 3)`: `random_fold_in`, raw key or typed alike);
        # a random draw's is its value, integers too (`t = jax.random.randint(...)`).
        # A `checkpoint_name`'s one equation keeps the name it gives (`h =
        # checkpoint_name(h, "pre_act")`: `pre_act`, the name a remat policy saves; the
        # line's box read `h#2`, and `pre_act` was nowhere).
        if _DRAW in key:
            return True
        boxes = drawn(i, j)
        if len(boxes) != 1:
            return len(boxes) > 1
        if boxes[0] < len(primitives) and primitives[boxes[0]] == _compat.CHECKPOINT_NAME:
            return False
        op = operations[boxes[0]] if boxes[0] < len(operations) else None
        return op is not None and not op[1]

    def line_run(i: int) -> tuple[int, int]:
        # `i`'s run on its line, in its scope: one pass, or every pass of a lambda (a
        # `jax.tree.map(lambda x: ..., batch)` calls it once per leaf)
        loc = locs[i]
        lam = loc is not None and loc.function.endswith("<lambda>")

        def same(m: int) -> bool:
            return (
                0 <= m < len(out)
                and locs[m] == loc
                and scope_of(m) == scope_of(i)
                and (
                    lam
                    or (passes[m] if m < len(passes) else 0)
                    == (passes[i] if i < len(passes) else 0)
                )
            )

        lo = hi = i
        while same(lo - 1):
            lo -= 1
        while same(hi + 1):
            hi += 1
        return lo, hi

    @functools.cache
    def line_runs() -> collections.Counter:
        # each line's runs at the level: a line met again after others is a loop's
        return collections.Counter(
            loc for m, loc in enumerate(locs) if loc is not None and (m == 0 or locs[m - 1] != loc)
        )

    def called_again(lo: int, hi: int) -> bool:
        # A lambda's run that is several calls of it (`jax.tree.map`'s, per leaf): its
        # equations all stages (a `take` per leaf; one call would make one), or its
        # operations' primitives the same few again and again (`x.reshape(...)`: a
        # `reshape` each; not `vmap`'s transposes around one `rfft`)
        if all(m < len(stages) and stages[m] for m in range(lo, hi + 1)):
            return hi > lo
        made = [
            (operations[m][0] if m < len(operations) and operations[m] else None, primitives[m])
            for m in range(lo, hi + 1)
            if m < len(primitives)
        ]
        n = len(made)
        return any(n % k == 0 and made == made[:k] * (n // k) for k in range(1, n // 2 + 1))

    def construct_in(m: int) -> bool:
        # A stage that is no library function's small jit or custom rule (`where`,
        # `relu`): a loop, a cond, your own jitted function. The line's box would hide
        # it (`_, ys = lax.scan(step, c, jax.random.split(k, 16))`: `scan(step)` in `_, ys`).
        if m >= len(stages) or not stages[m]:
            return False
        prim = primitives[m] if m < len(primitives) else ""
        small = prim in _compat.JIT or prim == _compat.CUSTOM_JVP or prim in _compat.CUSTOM_VJP
        return not (small and (calls(m) or library_custom(m)))

    def library_jit(m: int) -> bool:
        # a library's jitted function the line calls (`jnp.argsort`, `jnp.tril`), whose
        # traceback names no call (its `jit` binds from JAX's own frames), not yours
        return m < len(facts.library_jits) and facts.library_jits[m]

    def library_custom(m: int) -> bool:
        # a custom-derivative stage the user's line calls from a library (`jax.nn.relu`)
        loc, prim = locs[m], primitives[m] if m < len(primitives) else ""
        custom = prim == _compat.CUSTOM_JVP or prim in _compat.CUSTOM_VJP
        return custom and loc is not None and calls_from_module(loc.file, loc.line, stages[m])

    def loop_with_stages(i: int) -> bool:
        # Whether the Python loop whose passes run `i`'s line again holds a stage of this
        # level (a call of yours, a module, a loop, a named scope), which `repeats`
        # stacks pass by pass, its lines between as the passes' gaps. A loop of lines
        # alone (`for p in params[:-1]: x = jax.nn.relu(x @ p["w"] + p["b"])`) is no
        # stage to stack: each pass's line is a box, `x`, `x#2` (not `dot_general`,
        # `broadcast_in_dim`, `add`, `relu` per pass).
        # (`graph.calls` may have put each pass in a scope of its own: another scope;
        # the scopes as given, before this walk's folds)
        # Only the runs of one call of the line's function count: `forward` called
        # under `jax.grad` and then again (MAML's query loss), or a helper each layer
        # calls, runs its lines again in another call, which no loop of theirs stacks.
        loc, own = locs[i], invocation(i)
        ms = [m for m in range(len(out)) if locs[m] == loc and invocation(m) == own]
        return any(
            names[m] != names[i] or construct_in(m)
            for m in range(ms[0], ms[-1] + 1)
            if names[m][: len(own)] == own
        )

    def invocation(m: int) -> tuple[str, ...]:
        # The scopes down to the one run of the function that made `m`: its innermost
        # scope that is a call of the user's (not a loop's pass, which `graph.calls`
        # wraps inside the call looping) or a module's or named scope's
        scope = names[m]
        k = len(scope)
        while k and (
            scope[k - 1].startswith(FOLD)
            or _PASS.search(scope[k - 1])
            or _EINSUM.match(scope[k - 1].split(_AGAIN, 1)[0])
        ):
            k -= 1
        return scope[:k]

    def activation(lo: int, last: int) -> bool:
        # The stage making the line's value is a library's activation with a custom
        # derivative (`jax.nn.relu`: its traceback names no call, so the line says
        # whose it is), after work of the line's own (`x @ w + b`): the line's
        # elementwise step, as `jnp.tanh` is, not its one call (`probs =
        # jax.nn.softmax(logits)` keeps its box `softmax`); so is a library's jitted
        # function after such work (`order = jnp.argsort(-scores)`: `order`, not `neg`
        # beside `argsort`; `causal = jnp.tril(jnp.ones((T, T), bool))`: `causal`)
        if len(drawn(lo, last)) < 2:
            return False
        return library_custom(last) or library_jit(last)

    def returned_in_call(i: int) -> bool:
        # `i`'s line returns one value from a call of your function (`return x @
        # params[-1]["w"] + params[-1]["b"]` ending `predict`): its work is one box named
        # by what it computes, as an assignment's, not loose `dot_general`, `add`. (At
        # the top level a loss's `(y - t) ** 2` and `mean` stay the boxes they are; a
        # returned call, `return jnp.tanh(x @ w)`, keeps its `tanh` beside the matmul.)
        loc, scope = locs[i], scope_of(i)
        if loc is None or not scope or not scope[-1].startswith(CALL):
            return False
        if fold_label(scope[-1]).endswith(BACKWARD):
            return False  # (a backward pass's last work is no value the line returns)
        if not returns_expression(loc.file, loc.line) or returned_label(loc.file, loc.line) is None:
            return False
        # (the run that is the call's last work: not an argument of a call after it,
        # `return jnp.einsum("btnh,btnh->bt", q * k, v)`'s `mul`; and of several
        # equations: one, `return y * 3.0`'s `mul`, shows the value the call's stage shows)
        lo, hi = line_run(i)
        call = names[i][: len(scope)]
        last = not any(names[m][: len(call)] == call for m in range(hi + 1, len(out)))
        return last and len(drawn(lo, hi)) > 1

    def returned_leaves(i: int) -> bool:
        # `i`'s line returns a lambda's calls per leaf (`return jax.tree.map(lambda a: a -
        # lr * jnp.mean(x) * a, p)`): one box, as the same line assigning a name is. Its
        # `jnp.mean` per leaf had split it: a box `mean` held two leaves' update and the
        # third's mean, that leaf's `mul`, `mul`, `sub` loose after it.
        loc = locs[i]
        if loc is None or not loc.function.endswith("<lambda>") or outside_at(i):
            return False
        return is_return(loc.file, loc.line) and called_again(*line_run(i))

    def returned_line(i: int) -> bool:
        # `i`'s line returns one value as the last work of its level's own equations (not
        # a call's: `returned_in_call`), and reads as one box named by what it returns, as
        # an assignment reads by its target: one operation of the user's made its several
        # equations (`return logits[:, -1]`: `slice`, `squeeze`), or its work counts in
        # integers beside its floats (a padded loss's
        # `jnp.sum(jnp.where(mask, nll, 0.0)) / jnp.sum(mask)`: the mask's count and
        # cast, a row of primitives at a small level, one box at a big one). A small
        # level's own arithmetic (`jnp.mean((y - t) ** 2)`: `sub`, `integer_pow`, `mean`)
        # stays its boxes, each with its data.
        loc, scope = locs[i], scope_of(i)
        if loc is None or scope or outside_at(i) or loc.function.endswith("<lambda>"):
            return False
        if not returns_one_value(loc.file, loc.line):
            return False
        lo, hi = line_run(i)
        if any(scope_of(m) == scope and not replayed(m, loc) for m in range(hi + 1, len(out))):
            return False  # (not the level's last work: an argument of a call after it)
        boxes = drawn(lo, hi)
        ops = [operations[m] if m < len(operations) else None for m in range(lo, hi + 1)]
        if None in ops or not boxes:
            return False
        if len(boxes) < 2:
            return False  # (one equation is its own box already, with its data)
        if boxes[-1] < len(stages) and stages[boxes[-1]]:
            return False  # a stage makes the value, named already (`segment_max`, `mean`)
        if calls(hi)[:1] and calls(hi)[:1] not in _PLUMBING:
            # a library call makes the value (`return jax.ops.segment_max(x * w, ids, n)`):
            # its group names it; a box of the whole line went around it and, the
            # level's only work, was unwrapped with it
            return False
        if len({op[0] for op in ops}) == 1:
            return True
        # (integers, not booleans: a mask's count, not the `isfinite` a `where` reads)
        types = facts.out_types
        counts = types is not None and any(
            all(t.startswith(("int", "uint")) for t in types(m)) for m in boxes
        )
        return counts and not all(ops[m - lo][1] for m in boxes)

    def restates_primitive(lo: int, hi: int) -> bool:
        # The line's one library call is named like one of its equations
        # (`lax.dynamic_update_slice`: its index clamp `lt`, `add`, `select_n`, then the
        # update): no box of the call's is made (`long_run`), so the line's is
        # (`k_cache`, `v_cache`, not loose primitives or two boxes both
        # `dynamic_update_slice`)
        # (a plain equation: not a stage such as `lax.scan`'s, whose box is its own)
        what = calls(lo)[:1]
        return bool(what) and any(
            m < len(primitives) and primitives[m] == what[0] and not (m < len(stages) and stages[m])
            for m in range(lo, hi + 1)
        )

    def assignment_line(i: int, big: bool = False) -> str | None:
        # A line assigning a name (`amplitude = jnp.exp(...)`, `delta = r + g * v - v`,
        # `state = jax.tree.map(lambda r, s: jnp.where(d, r, s), ...)`) is one box named
        # by what it assigns, at a level of any size, as a big level's line folds are:
        # its primitives were loose boxes (`exp`; `sub`, `mul`, `add`; `where` per
        # leaf), and with no data at a big top level. A line that is one library call
        # of several equations keeps its call's box (`mask = make_causal_mask(t)`:
        # `make_causal_mask`), but JAX's own (`m = jnp.mean(x)`: `m`, at any level, as
        # `library_call_line` says). The key's marks: `_LINE`, `_LEAVES` for a lambda's
        # calls, each a stage (`take` per leaf), `_CALLED` for `library_call_line`'s.
        loc, scope = locs[i], scope_of(i)
        if scope and not scope[-1].startswith(CALL):
            return None  # a named scope's or a module's work is its stage's (README)
        if loc is None:
            return None
        if (
            line_assigns(i) is None
            and not returned_in_call(i)
            and not returned_leaves(i)
            and not returned_line(i)
        ):
            return None
        if at_module_call is not None and at_module_call(i):
            return None
        first = statement_line(loc.file, loc.line)  # (a statement over two lines: one run)
        lo, hi = line_run(i)
        last = hi  # (the axes `vmap` moves after it are no work of the line's)
        while last > lo and last < len(primitives) and primitives[last] in _LAYOUT:
            last -= 1
        # (a library's jitted function in the line, `jnp.argsort` of `order =
        # jnp.argsort(-scores)` or `jnp.take_along_axis` of `nll =
        # -jnp.take_along_axis(logp, y[:, None], 1)[:, 0]`, is no construct to keep
        # apart, as a big level's line fold holds it: `activation`)
        if any(
            (construct_in(m) and not library_jit(m)) or calls(m)[:1] in _PLUMBING
            for m in range(lo, hi + 1)
        ):
            return None
        if line_runs()[loc] > 1 and loop_with_stages(i):
            return None  # a Python loop's line, once per pass: `repeats` stacks the passes
        lam = loc.function.endswith("<lambda>")
        per_leaf = lam and called_again(lo, hi)
        draw = not per_leaf and draw_run(lo, hi)
        # (at a small level, not the double-where line `gate = jnp.where(g > 0,
        # jnp.sqrt(g), 0.0)`: the `sqrt` whose NaN the `where` masks stays a stage, which
        # the NaN messages name, "before it, a NaN in `sqrt` ... was masked by `where`")
        target = library_call_line(i, lo, last) and (big or not masking_where(lo, hi))
        if (
            not (per_leaf or draw or target)
            and last < len(stages)
            and stages[last]
            and not activation(lo, last)
        ):
            return None  # a stage makes the line's value (`xf = vmap(rfft)(x * w)`): its box
        whats = {calls(m)[:1] for m in range(lo, hi + 1)}
        call_box = hi > lo or mapped_call(lo)  # (one leaf of a call per leaf: `line_key`)
        if call_box and len(whats) == 1 and whats != {()} and not (per_leaf or draw or target):
            (what,) = whats
            if not restates_primitive(lo, hi) and what[0] not in _COLLECTIVES:
                return None
        own = function_label(loc.function)[0]
        again = f"\x04{passes[i]}" if not lam and i < len(passes) and passes[i] else ""
        mark = _LEAVES if per_leaf else _DRAW if draw else _CALLED if target else ""
        return f"{own}:{first}\x02{'/'.join(scope_of(i))}{again}{_LINE}{mark}"

    def masking_where(lo: int, hi: int) -> bool:
        # a `jnp.where` on the line choosing between a value the line computes (`jnp.sqrt(g)`)
        # and others, beyond its test (`g > 0`)
        run = range(lo, hi + 1)
        if ("where",) not in {calls(m)[:1] for m in run}:
            return False
        return any(
            not calls(m) and m < len(primitives) and primitives[m] not in _MASK_TESTS for m in run
        )

    def library_call_line(i: int, lo: int, last: int) -> bool:
        # `i`'s line assigns a plain name the value of JAX's own call
        # (`safe = jnp.where(mask, dr2, 1.0)`, `dr = jnp.where(mask,
        # jnp.sqrt(safe), 0.0)`, `e_atom = jax.ops.segment_sum(...)`, `dr =
        # jnp.linalg.norm(...)`): one box named by what it assigns, holding the call's
        # stage or equations, as its other lines are (`dr2`). Named by the call
        # (`where`, `sqrt` beside `where#2`, `segment_sum`), the names an MD user probes
        # and clicks were nowhere among them. (A loop or a jit of the user's keeps its
        # box: `construct_in`; a `return` line is named by what it computes.) At a small
        # level too: `x = jnp.mean(r)` read `mean` in a function of few lines and `x` in
        # one of more, the same line named by what the function's other lines did.
        target = line_assigns(i)
        if target is None or not target.isidentifier():
            return False  # (`updates, state = tx.update(...)`, `self.h = ...`: a call's box)
        own = last < len(stages) and stages[last] and construct_in(last) and not library_jit(last)
        # (an activation's custom-derivative stage keeps its box: `logp =
        # jax.nn.log_softmax(h)` is `log_softmax`, `activation`)
        nn_call = last < len(facts.nn_calls) and facts.nn_calls[last]
        own = own or nn_call or (last < len(stages) and bool(stages[last]) and library_custom(last))
        # (JAX's own calls alone, beside the line's own primitives (`jnp.sqrt`'s
        # `sqrt`): another library's function keeps its box, README, `optax.apply_updates`
        # of one array `apply_updates`, `tx.update` `chain`, jraph's `GraphNetwork`, as
        # a function of yours does; and so does control flow, which holds its branches:
        # `y = lax.switch(i, fs, v)`)
        run = range(lo, last + 1)
        if any(calls(m) and (path(m).package != "jax" or calls(m)[0] in _CONTROL) for m in run):
            return False
        return not own and any(calls(m)[:1] or library_jit(m) for m in run)

    def loop_setup(i: int, what: str) -> bool:
        # `i` is the loop stage its line's call made (`lax.scan`'s `scan(step)`), or one
        # of LOOP_SETUP_RUN or more `broadcast_in_dim`s of that call right before it:
        # `jax.vmap` batching the loop's unbatched carry, a broadcast per leaf (the
        # parameters a batched MAML's inner loop starts from), which the user never
        # wrote. A small level drew each as a box of its own in a row beside the loop.
        def same(m: int) -> bool:
            return (
                0 <= m < len(out)
                and locs[m] == locs[i]
                and scope_of(m) == scope_of(i)
                and calls(m)[:1] == (what,)
            )

        def broadcast(m: int) -> bool:
            own = stages[m] if m < len(stages) else None
            return same(m) and not own and m < len(primitives) and primitives[m] in _BROADCAST

        loop = i
        while broadcast(loop):
            loop += 1
        own = stages[loop] if same(loop) and loop < len(stages) else None
        if not own or not (own == what or own.startswith(what + "(")):
            return False
        first = loop
        while broadcast(first - 1):
            first -= 1
        return loop - first >= LOOP_SETUP_RUN

    def feeds_tesseract(i: int) -> bool:
        # `i` is in the run of its line's equations (one scope) that ends right before a
        # Tesseract's call on that line: the call's input arithmetic
        m = i
        while m + 1 < len(out) and locs[m + 1] == locs[i] and scope_of(m + 1) == scope_of(i):
            m += 1
            if m < len(primitives) and primitives[m] == _compat.TESSERACT:
                return True
        return False

    def plumbed_line(i: int) -> bool:
        # `i`'s line (its run there: one scope, one pass) holds an operation of the
        # user's that made SMALL_LEVEL_RUN or more equations no call names, integer work
        # among them: an index (`p["embed"][idx]`) or an update (`.at[:, 0].set(t)`),
        # not a box the user wrote per equation (`(y - t) ** 2`: `sub`, `integer_pow`)
        def same(m: int) -> bool:
            return (
                0 <= m < len(out)
                and locs[m] == locs[i]
                and scope_of(m) == scope_of(i)
                and (passes[m] if m < len(passes) else 0) == (passes[i] if i < len(passes) else 0)
            )

        lo = hi = i
        while same(lo - 1):
            lo -= 1
        while same(hi + 1):
            hi += 1
        made: dict[Any, int] = {}
        integer: set[Any] = set()
        indexing: dict[Any, bool] = {}  # each operation: all its equations index
        staged = False  # the line holds a stage (a loop, a sow)
        for m in range(lo, hi + 1):
            op = operations[m] if m < len(operations) else None
            if m < len(stages) and stages[m]:
                staged = True
            if op is None or calls(m) or (m < len(stages) and stages[m]):
                continue
            made[op[0]] = made.get(op[0], 0) + 1
            if op[1]:
                integer.add(op[0])
            prim = primitives[m] if m < len(primitives) else None
            indexing[op[0]] = indexing.get(op[0], True) and prim in _INDEXING
        # (a float array's static index, `t0=ts[0]` in a call's arguments: `slice`, then
        # `squeeze`, no integer work, were loose boxes beside the call; not on a line
        # holding a stage, which the box would swallow or whose name it would take:
        # `scan(step, xs[0], xs)`, `scale = sow(jnp.exp(x[1]), "scale")`)
        # Nor a Python loop's header (`for x in xs:`, each pass's `slice`, `squeeze` on
        # JAX 0.10): a box per pass there, beside the pass's own calls.
        loc = locs[i]
        return any(made[op] >= SMALL_LEVEL_RUN for op in integer) or (
            not staged
            and any(made[op] >= SMALL_LEVEL_RUN for op, yes in indexing.items() if yes)
            and not (loc is not None and is_loop_header(loc.file, loc.line))
        )

    def line_key(library: bool) -> Callable[[int], str | None]:
        # Runs inside one scope (or none) whose level is big, from one line: a user's
        # line, or (`library`) one a library's body traced without the user's frames.
        direct = levels()

        def key(i: int) -> str | None:
            loc, scope = locs[i], scope_of(i)
            if loc is None or (scope and _OWN in scope[-1]):
                return None
            if i < len(primitives) and primitives[i] == _compat.TESSERACT:
                return None  # a Tesseract, the external solver, is always a stage of its own
            if direct.get(scope, 0) <= line_limit:
                # A small level still folds one library call's run (`make_causal_mask`:
                # seven integer equations beside the model's layers), and a lambda's
                # run on one line (`jax.tree.map(lambda g: g / S, grads)`: a `div` box
                # per leaf), nothing else.
                # (not a lambda that is the program itself, `sowviz.inspect(lambda w, x:
                # ...)`: its work is boxed by its own operations, as a function's is)
                lam = loc.function.endswith("<lambda>") and not outside_at(i)
                line = None if library or not lam else assignment_line(i)
                if line is not None and _LEAVES in line:
                    return line  # (its calls per leaf: one box, not a run per library call)
                if not library and lam and lambda_run(i):
                    own = function_label(loc.function)[0]
                    return f"{own}:{loc.line}\x02{'/'.join(scope)}"
                if not library:
                    line = assignment_line(i)
                    if line is not None:
                        return line
                if not library and feeds_tesseract(i):
                    # (`\x03`: a small level's least run) the arithmetic of a Tesseract's
                    # inputs written in its call (`apply_tesseract(t, {"x": x**2 + 1})`):
                    # one box `<tesseract> inputs`, as at a big level (`line_label`), not
                    # loose `integer_pow`, `add` beside the stage
                    own = function_label(loc.function)[0]
                    again = f"\x04{passes[i]}" if i < len(passes) and passes[i] else ""
                    return f"{own}:{loc.line}\x02{'/'.join(scope)}{again}\x03"
                if not library and plumbed_line(i):  # (`\x03`: a small level's least run)
                    if at_module_call is None or not at_module_call(i):
                        own = function_label(loc.function)[0]
                        again = f"\x04{passes[i]}" if i < len(passes) and passes[i] else ""
                        return f"{own}:{loc.line}\x02{'/'.join(scope)}{again}\x03"
                what = calls(i)[:1]
                if not library and what and loop_setup(i, what[0]):
                    # (one key for the broadcasts and the loop: `fold_runs` parts them
                    # into `scan(step) setup` beside the loop's stage, as a big level does)
                    own = function_label(loc.function)[0]
                    return f"{own}:{loc.line}\x02{'/'.join(scope)}\x03{what[0]}{_SETUP}"
                if library or not what or (i < len(primitives) and what[0] == primitives[i]):
                    return None
                long = not what[0].startswith("_") and long_run(i, what[0])
                mapped = not what[0].startswith("_") and not long and mapped_call(i)
                if not (long or mapped):
                    # a library's private helper (Flax's `_normalize`) names nothing
                    return None
                own = function_label(loc.function)[0]
                one = _MAPPED if mapped else ""
                key = f"{own}:{loc.line}\x02{'/'.join(scope[:-1])}\x03{what[0]}"
                if scope and scope[-1].endswith((f"\x01{key}", f"\x01{key}{one}")):
                    # already in this call's box (`layer_key`'s): `hk.dropout` in a Haiku
                    # module was a box `dropout` holding another `dropout`
                    return None
                return f"{own}:{loc.line}\x02{'/'.join(scope)}\x03{what[0]}{one}"
            lib = bool(path(i).names) and not path(i).below_user
            if lib != library or (library and scope and _SPLIT in scope[-1]):
                return None  # inside a library call's group, its lines are no news
            if not library and at_module_call is not None and at_module_call(i):
                return None  # the module's stage is that line's call: its calls say more
            if not library:
                named = assignment_line(i, big=True)  # (from one equation on, as at a small level)
                if named is not None:
                    return named
            again = f"\x04{passes[i]}" if i < len(passes) and passes[i] else ""
            line = statement_line(loc.file, loc.line)  # (a statement over two lines: one run)
            # a library transform's plumbing (`hk.vmap`'s RNG split) is a run of its own:
            # not the value the line assigns (`preds`, made by the mapped function)
            plumbing = calls(i)[:1] if calls(i)[:1] in _PLUMBING else ()
            apart = "".join(f"\x03{what}" for what in plumbing)
            return f"{function_label(loc.function)[0]}:{line}\x02{'/'.join(scope)}{again}{apart}"

        return key

    def fn_key(i: int) -> str | None:
        loc = locs[i]
        if not unscoped(i) or loc is None:
            return None
        return function_label(loc.function)[0]

    def group(run: list[int], key: str) -> None:
        name = f"{FOLD}{key}{_SPLIT}{run[0]}"
        for m in run:
            at = len(scope_of(m))
            out[m] = (*out[m][:at], name, *out[m][at:])

    def split_by_calls(run: list[int], depth: int, whole: bool) -> None:
        # Runs of the run with one library call at `depth`. A run that is all its scope
        # holds (`whole`) and one call throughout would restate the scope: deeper.
        while True:
            keys = [c[depth] if len(c) > depth else None for c in map(calls, run)]
            # Equations of the caller's own between two runs of one call (per leaf of
            # a `tree.map`) join them; other work between two calls of one function
            # does not (`_per_leaf`).
            known = [k for k in range(len(run)) if keys[k] is not None]
            prims = [primitives[m] if m < len(primitives) else "" for m in run]
            # (directly below your code, a call is also its line's: `k = jnp.repeat(k, 2)`
            # then `v = jnp.repeat(v, 2)` are two calls, not one box `repeat` of both; and
            # a loop's `buf = roll(buf)` then `acc = acc + buf` is no `tree.map` per leaf)
            lines = [locs[m] if depth == 0 and path(m).below_user else None for m in run]
            # (inside a line's box of a lambda's calls per leaf, the box is the `tree.map`:
            # joined, the leaves were a box named by the one call, `mean`, that left the
            # last leaf's own work after that call outside it)
            in_leaves = bool(scope_of(run[0])) and _LEAVES in scope_of(run[0])[-1]
            for a, b in itertools.pairwise(() if in_leaves else known):
                if (
                    b > a + 1
                    and keys[a] == keys[b]
                    and len(set(lines[a : b + 1])) == 1
                    and (lines[a] is None or made_again(run[a], run[b]))
                    and _per_leaf(prims, keys, a, b)
                ):
                    keys[a + 1 : b] = [keys[a]] * (b - a - 1)
            starts = [0] + [
                k
                for k in range(1, len(run))
                if keys[k] != keys[k - 1] or (keys[k] is not None and lines[k] != lines[k - 1])
            ]
            # a group named like the scope or fold around it would restate it too
            around = fold_label(scope_of(run[0])[-1]) if scope_of(run[0]) else None
            if len(starts) == 1 and keys[0] is not None and (whole or keys[0] == around):
                depth += 1
                continue
            # (a library closure's stage, `GraphConvolution`, may still halve its loose
            # equations: its `segment_sum`s are its readable steps)
            closure = around is not None and scope_of(run[0])[-1].endswith(CLOSURE)
            if closure and depth == 1:
                # its own work by what its statement assigns (jraph's `sent_attributes =
                # tree.tree_map(lambda n: n[senders], nodes)`, `sender_degree =
                # count_edges(conv_senders)`), but for the functions it was given
                # (`aggregate_nodes_fn: segment_sum`)
                keys = [
                    k if k is not None and ": " in k else _closure_statement(path(m)) or k
                    for k, m in zip(keys, run, strict=True)
                ]
                starts = [0] + [k for k in range(1, len(run)) if keys[k] != keys[k - 1]]
            if len(starts) > (max(line_limit, len(run) // 2) if closure else line_limit) or (
                len(starts) == 1 and keys[0] is None
            ):
                return  # as many boxes as equations, or no call: no clearer
            for a, b in zip(starts, [*starts[1:], len(run)], strict=True):
                if keys[a] is None or b - a < 2 or keys[a] == around:
                    continue
                if repeated_stage(run[a:b]):
                    continue  # (a loop's `nn.remat` blocks in Flax's lift plumbing: no box)
                if not restated(run[a:b], keys[a]):
                    group(run[a:b], keys[a])
                    if b - a > line_limit:
                        split_by_calls(run[a:b], depth + 1, True)
            return

    def made_again(a: int, b: int) -> bool:
        # Your line's own work between two calls of one function on it is per leaf only
        # when the line runs it again: a lambda (`jax.tree.map(lambda g: clip(g * 2), ...)`),
        # a generator expression, or a loop on the line (a comprehension). One expression
        # calling `jnp.mean` three times (`jnp.mean(r ** 2) + jnp.mean((u0 + s) ** 2) +
        # jnp.mean(bc ** 2)`) had its 2nd and 3rd mean in one box `mean#2`, `+` and
        # `bc ** 2` between them.
        def inner(m: int) -> bool:  # (`<lambda>`, `<genexpr>`, `<listcomp>`)
            loc = locs[m]
            return loc is not None and loc.function.rsplit(".", 1)[-1].startswith("<")

        again = any(inner(m) for m in range(a, b + 1))
        pa, pb = (passes[m] if m < len(passes) else 0 for m in (a, b))
        return again or pa != pb

    def repeated_stage(run: list[int]) -> bool:
        # Each a stage, named alike (`checkpoint(block_0)`, `checkpoint(block_1)`: a Python
        # loop of Linen `nn.remat` blocks, each called through Flax's
        # `module_class_lift_transform`): `repeats` stacks them; a group of the library
        # call they pass through would only hide the stack in a box of Flax's plumbing.
        own = [stages[m] if m < len(stages) else None for m in run]
        return all(own) and len({repeat_pattern(x) for x in own}) == 1

    def layer_key(i: int) -> str | None:
        # A framework's functional layer (`nn.avg_pool`: `reduce_window_sum` and `div`;
        # `nn.max_pool`: one `reduce_window_max`) is a box of its name, with its data,
        # however few equations it makes.
        loc, scope, what = locs[i], scope_of(i), calls(i)[:1]
        if loc is None or not what or path(i).package not in LAYER_PACKAGES:
            return None
        if "." in path(i).names[0]:  # a module's method: its module's stage says it
            return None
        if what[0].startswith("_") or (i < len(primitives) and what[0] == primitives[i]):
            return None
        # (a stage the layer's own calls made is its work: `hk.dropout`'s `bernoulli` jit
        # had parted the layer in two boxes, `dropout`, `dropout#2`)
        stage = stages[i] if i < len(stages) else None
        if (stage and (len(calls(i)) < 2 or stage == what[0])) or (
            scope and (_OWN in scope[-1] or _SPLIT in scope[-1])
        ):
            return None
        if stage_alike(i, what[0]):
            return None  # `nnx.cond`'s predicate cast beside the `cond` it makes: a 2nd `cond`
        own = function_label(loc.function)[0]
        return f"{own}:{loc.line}\x02{'/'.join(scope)}\x03{what[0]}"

    def stage_alike(i: int, what: str) -> bool:
        # a stage named like the call (`cond`, `cond(...)`) among the equations of that
        # call on `i`'s line
        for step in (-1, 1):
            m = i + step
            while 0 <= m < len(out) and locs[m] == locs[i] and calls(m)[:1] == (what,):
                own = stages[m] if m < len(stages) else None
                if own and (own == what or own.startswith(what + "(")):
                    return True
                m += step
        return False

    def written_lines() -> None:
        # A module's own statement assigning one of its variables (a BatchNorm's running
        # mean): one box named after the variable, holding its new value. Its `mul`,
        # `mul`, `add` were loose boxes with no data, the value only the stage's output.
        # (After the library calls' groups: the statement's run is what they left
        # directly in the module's stage; one equation too, as a box with its data.)
        writes = facts.writes

        def key(i: int) -> str | None:
            w = writes[i] if i < len(writes) else None
            return None if w is None else f"{w}\x02{'/'.join(scope_of(i))}"

        if any(writes):
            fold_runs(key, least=1, inner=True, whole=False)

    if call_path is not None:
        fold_runs(layer_key, least=1, label=line_label, inner=True, whole=False)
    before, big = [scope_of(i) for i in range(len(out))], levels()
    fold_runs(line_key(False), 3, line_label, inner=True, whole=False, small=SMALL_LEVEL_RUN)
    # A level those folds made small folds, as a small level does, the runs of one library
    # call they left (`l = pmean(l)`'s `psum`, `div` beside `g = pmean(g)`'s fold: two
    # equations, short of a big level's three, were loose boxes with no values)
    now, again = levels(), line_key(False)

    def left_small(i: int) -> str | None:
        scope = scope_of(i)
        if scope != before[i] or big.get(scope, 0) <= line_limit or now.get(scope, 0) > line_limit:
            return None  # folded just now, small all along (folded above), or still big
        k = again(i)
        return k if k is not None and "\x03" in k else None

    fold_runs(left_small, 3, line_label, inner=True, whole=False, small=SMALL_LEVEL_RUN)
    if call_path is not None:
        runs = [scope_of(i) for i in range(len(out))]  # before any group changes `out`
        direct = _direct(runs)
        i = 0
        while i < len(out):  # runs of equations directly in one scope or fold
            j = i
            while j + 1 < len(out) and runs[j + 1] == runs[i]:
                j += 1
            size, level = j + 1 - i, direct.get(runs[i], 0)
            # at a big level, or a run too long to read
            if runs[i] and _OWN in runs[i][-1]:
                pass  # a REENTRANT call's own work: its calls say nothing more
            elif size > line_limit or (level > line_limit and size >= 3):
                # A level of the user's code restates no call: one library call that is
                # all the program does is a box, `minimize`, not its inner calls loose.
                # (A body the library traced is its call's already: `while(body_fun)`.)
                users = not runs[i] and all(path(m).below_user for m in range(i, j + 1))
                split_by_calls(list(range(i, j + 1)), 0, size == level and not users)
            i = j + 1
        _alike_calls_grouped(out, runs, calls, group)
        own = lambda i, j, where: where.split("\x02", 1)[0]  # noqa: E731  (`_do_update:381`)
        written_lines()
        fold_runs(line_key(True), least=3, label=own, inner=True, whole=False)
    else:
        written_lines()
    # (a Python loop's passes, which `repeats` stacks, are no reason to fold)
    looped = _top_count(out) > limit and _looped(out, locs, facts) <= limit
    if _top_count(out) > limit and not looped:
        # One group per call: a run of one function restarts when its line goes back.
        calls_: list[str | None] = []
        for i in range(len(out)):
            k = fn_key(i)
            prev_line = locs[i - 1].line if i and locs[i - 1] is not None else None
            same = i and k is not None and fn_key(i - 1) == k
            restart = same and prev_line is not None and locs[i].line < prev_line  # type: ignore[union-attr]
            calls_.append(
                None if k is None else f"{k}\x01{i}" if not same or restart else calls_[-1]
            )
        fold_runs(lambda i: calls_[i])  # names stay apart (`step\x01<i>`): labels drop it
    total = _top_count(out)
    if total > limit and not looped:
        size = -(-total // max(limit // 2, 1))
        chunk: list[int | None] = []
        items, prev = 0, None
        for i in range(len(out)):
            top = out[i][0] if out[i] else None
            if top is None or top != prev:
                items += 1
            prev = top
            chunk.append((items - 1) // size if unscoped(i) else None)
        labels: dict[int, list[str]] = {}
        for i, c in enumerate(chunk):
            if c is not None:
                tops = labels.setdefault(c, [])
                top = out[i][0] if out[i] else f"op{i}"
                if not tops or tops[-1] != top:
                    tops.append(top)
        seen = 0
        names_of: dict[int, str] = {}
        for c, raw in labels.items():  # `step ×4 (5–8)`: n items of one function, numbered
            tops = [fold_label(t) if t.startswith(FOLD) else "op" for t in raw]
            n, span = len(tops), f"({seen + 1}–{seen + len(tops)})"
            seen += n
            if len(set(tops)) == 1:
                names_of[c] = tops[0] if n == 1 else f"{tops[0]} ×{n} {span}"
            else:
                names_of[c] = f"{tops[0]} … {tops[-1]} {span}"
        for i, c in enumerate(chunk):
            if c is not None and len(labels[c]) > 1:  # one item needs no chunk
                out[i] = (f"{FOLD}{names_of[c]}\x01c{c}", *out[i])
    return out


def _alike_calls_grouped(
    out: list[tuple[str, ...]],
    runs: Sequence[tuple[str, ...]],
    calls: Callable[[int], tuple[str, ...]],
    group: Callable[[list[int], str], None],
) -> None:
    """Group, as `split_by_calls` grouped one call of a library function out of a long
    run, that function's other calls in the same scope left in runs too short to split
    (`runs`: each equation's scope before): of Equinox's `MultiheadAttention`, the third
    `_project` (in a run with the attention) was a box, the first two, two equations
    each between the projections' stages, loose `transpose` and `reshape`."""
    made = {
        (runs[m], fold_label(out[m][len(runs[m])]))
        for m in range(len(out))
        if len(out[m]) > len(runs[m]) and out[m][len(runs[m])].startswith(FOLD)
    }
    if not made:
        return
    i = 0
    while i < len(out):
        j = i
        while j + 1 < len(out) and runs[j + 1] == runs[i] and out[j + 1] == runs[i]:
            j += 1
        first = calls(i)[:1]
        if (
            j > i
            and out[i] == runs[i]
            and first
            and (runs[i], first[0]) in made
            and all(calls(m)[:1] == first for m in range(i, j + 1))
        ):
            group(list(range(i, j + 1)), first[0])
        i = j + 1


def _looped(
    names: Sequence[tuple[str, ...]], locs: Sequence[_compat.SourceLocation | None], facts: _Facts
) -> int:
    """Nodes at this level once `repeats` stacks a Python loop's passes (a decode loop's
    `model(toks[-1][:, None])`, its `[:, 0]`, the key split and the sampling, 15 times):
    a run of items that repeats with a period of at most `MAX_SEPARATORS + 1`, one of
    them a scope (a module's, a `jax.named_scope`, a call of the user's function), the
    same equations and types in every pass, counts as its one node. (A loop of lines
    alone, a library's `jit` among them, still folds by line and chunks.)"""
    items = _top_items(names, locs, facts)
    least = len(items)
    for period in range(1, MAX_SEPARATORS + 2):
        saved, i = 0, 0
        while i + period < len(items):
            j = i
            while j + period < len(items) and items[j] == items[j + period]:
                j += 1
            passes = (j - i + period) // period
            if passes >= 2 and any(scope for _, scope in items[i : i + period]):
                saved += passes * period - 1
            i = max(j, i + 1)
        least = min(least, len(items) - saved)
    return least


def _top_items(
    names: Sequence[tuple[str, ...]], locs: Sequence[_compat.SourceLocation | None], facts: _Facts
) -> list[tuple[tuple, bool]]:
    """The level's nodes as `_top_count` counts them, each as what two passes of a loop
    share (its label alike, as `repeats.pattern` masks it, or an equation's primitive
    and line; with the primitives and output types of its equations) and whether it is
    a scope that no fold made."""
    items: list[tuple[tuple, bool]] = []
    prev: str | None = None
    for m, t in enumerate(names):
        top = t[0] if t else None
        prim = facts.primitives[m] if m < len(facts.primitives) else None
        typed = (prim, facts.out_types(m) if facts.out_types is not None else None)
        if top is not None and top == prev:
            (label, *eqns), stage = items[-1]
            items[-1] = ((label, *eqns, typed), stage)
            continue
        prev = top
        if top is None:
            loc = locs[m]
            items.append(((("eqn", loc.line if loc is not None else None), typed), False))
        else:
            label = repeat_pattern(fold_label(top))
            items.append(((label, typed), not top.startswith(FOLD)))
    return items


def _direct(names: Sequence[tuple[str, ...]]) -> dict[tuple[str, ...], int]:
    """Nodes directly inside each scope (by its name tuple), as the walk will draw
    them: its own equations and one per run of a scope inside it (one per run of calls
    of one user function, as `_top_count`)."""
    direct: dict[tuple[str, ...], int] = {}
    prev: tuple[str, ...] | None = None
    for t in names:
        new = prev is None  # a scope opened at a shallower depth: every deeper one is new
        for d in range(len(t) + 1):
            if d == len(t):
                direct[t] = direct.get(t, 0) + 1
            elif new or prev[: d + 1] != t[: d + 1]:  # type: ignore[index]
                again = (
                    not new
                    and prev is not None
                    and len(prev) > d
                    and prev[:d] == t[:d]
                    and t[d].startswith(CALL)
                    and fold_label(prev[d]) == fold_label(t[d])
                )
                new = True
                if not again:
                    direct[t[:d]] = direct.get(t[:d], 0) + 1
        prev = t
    return direct


def _closure_statement(path: _compat.CallPath) -> str | None:
    """What the statement of a library's handed-out closure assigns, where it made an
    equation (`sent_attributes`), or None."""
    at = path.closure_at
    if at is None:
        return None
    return assigned(at.file, statement_line(at.file, at.line))


def fold_label(name: str) -> str:
    """The label of a (possibly synthetic) scope name."""
    for prefix in (FOLD, CALL):
        if name.startswith(prefix):
            return name[len(prefix) :].split("\x01", 1)[0]
    return name.split(_AGAIN, 1)[0]


def fold_named_by_call(name: str) -> bool:
    """Whether the fold `name` is labelled by the library call its line made (`hk.vmap`,
    `make_causal_mask`), not by what the line assigns (`pred, _`) or by the line itself."""
    label, _, key = name[len(FOLD) :].partition("\x01")
    what = key.rpartition("\x03")[2] if "\x03" in key else ""
    return bool(what) and what.rstrip("".join(map(chr, range(32)))) == label


#: Marks a later `jnp.einsum` call's scope (`split_einsum_calls`): a name of its own
_AGAIN = "\x05"


def split_einsum_calls(scoped: Sequence[tuple[str, ...]], locs: Sequence[Any]) -> list:
    """`scoped` with each `jnp.einsum` call's scope named apart. `q = jnp.einsum(s, x,
    wq)`, then `k = ...` and `v = ...` with the same subscripts on the next lines push
    one scope name thrice in a row: one run, drawn as one box with three outputs. A
    change of your line (`locs`) within the run starts the next call's scope (labelled
    alike: the siblings are numbered, `btd,dnh->btnh#2`)."""
    out = list(scoped)
    if not any(_EINSUM.match(n) for n in {n for names in scoped for n in names}):
        return out  # (most levels: no einsum's scope)
    runs: dict[int, tuple[str, Any, tuple[str, ...], int]] = {}  # depth -> its run
    first: dict[tuple[int, tuple[str, ...], str], list[int]] = {}  # a run's first call
    for i, names in enumerate(scoped):
        new: list[str] = []
        for d, name in enumerate(names):
            run = runs.get(d)
            if run is not None and run[0] == name and run[2] == tuple(new):  # the scope goes on
                k = run[3]
                if _EINSUM.match(name) and run[1] != locs[i]:
                    k += 1  # ... unless your line changed: another einsum call
                    runs = {e: r for e, r in runs.items() if e < d}
                    for j in first.pop((d, tuple(new), name), ()):  # (and the first's too)
                        out[j] = (*out[j][:d], f"{name}{_AGAIN}1", *out[j][d + 1 :])
                runs[d] = (name, locs[i], tuple(new), k)
                if k == 1 and _EINSUM.match(name):
                    first.setdefault((d, tuple(new), name), []).append(i)
                new.append(name if k == 1 else f"{name}{_AGAIN}{k}")
                continue
            runs = {e: r for e, r in runs.items() if e < d}  # a new scope: deeper runs end
            runs[d] = (name, locs[i], tuple(new), 1)
            first = {key: v for key, v in first.items() if key[0] < d}
            if _EINSUM.match(name):
                first[d, tuple(new), name] = [i]
            new.append(name)
        runs = {e: r for e, r in runs.items() if e < len(names)}
        out[i] = tuple(new)
    return out


def scope_label(name: str, loc: Any, called: Sequence[str] = ()) -> str:
    """A scope's label: `fold_label`'s, but the scope of a `jnp.einsum` that your line
    called (`called`: the library calls that made the scope's first equation,
    `("einsum",)`) is named by what the line assigns (`q`, `k`, `v`; `combine` in an
    NNX module), as any other line's box is, else its subscripts (numbered when
    several alike follow each other: `split_einsum_calls`). An einsum inside a library
    call (`dot_product_attention`'s) keeps its subscripts."""
    if name.startswith((FOLD, CALL)) or loc is None:
        return fold_label(name)
    yours = tuple(called) == ("einsum",) and _EINSUM.match(fold_label(name)) is not None
    if _AGAIN in name or yours:
        # (only when the einsum is what the line assigns: in `As = jnp.tanh(jnp.einsum(
        # ...)) * 0.3` the box named `As` held the einsum's value, not As)
        return assigned_by_call(loc.file, loc.line, "einsum") or fold_label(name)
    return fold_label(name)


# ---------------------------------------------------------------------------
# Helpers with per-process caches (avals repeat a lot in big programs).

_shape_cache: dict[Any, str] = {}
_float_cache: dict[Any, bool] = {}


def shape_str(aval: Any) -> str:
    """A value's type as JAX prints it: `float32[64,32]`, and under explicit sharding
    with the mesh axes splitting each dimension, `float32[64@data,32]` (without them a
    `reshard` read as a no-op)."""
    key = (getattr(aval, "dtype", None), getattr(aval, "shape", None))
    axes = _compat.explicit_axes(aval) if key[1] else None
    s = _shape_cache.get((*key, axes))
    if s is None:
        s = str(aval) if key[0] is None or key[1] is None else typed(key[0], key[1], axes)
        _shape_cache[(*key, axes)] = s
    return s


def typed(dtype: Any, shape: Sequence[int], axes: Sequence[Sequence[str]] | None) -> str:
    """`float32[64@data,32]`: a type with, per dimension, the mesh axes splitting it."""
    dims = [
        f"{d}@{a[0]}" if len(a) == 1 else f"{d}@({','.join(a)})" if a else str(d)
        for d, a in zip(shape, axes or ((),) * len(shape), strict=True)
    ]
    return f"{dtype}[{','.join(dims)}]"


def is_floating(aval: Any) -> bool:
    dtype = getattr(aval, "dtype", None)
    if dtype is None:
        return False
    f = _float_cache.get(dtype)
    if f is None:
        try:
            f = bool(jax.dtypes.issubdtype(dtype, jnp.inexact))
        except TypeError:
            f = False
        _float_cache[dtype] = f
    return f


def _count_eqns(jaxpr: Any) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for _, _, sub in _compat.sub_jaxprs(eqn):
            n += _count_eqns(sub)
    return n


def restating_body(eqn: Any, label: str) -> int | None:
    """The equations inside the call `eqn`, labelled `label`, when its body is one
    equation of that label making its outputs (a plain one, or a call restating it in
    turn), else None. `jnp.fft.rfft` jits one `rfft` equation, and `vmap` jits that jit
    again: three nested boxes `rfft` said one thing; the call's box is all of it."""
    spec = spec_of(eqn.primitive.name)
    if spec is None or spec.construct is not Construct.JIT or len(spec.bodies) != 1:
        return None
    body = _compat.jaxpr_and_consts(eqn.params[spec.bodies[0].param])[0]
    if len(body.eqns) != 1 or list(body.outvars) != list(body.eqns[0].outvars):
        return None
    (inner,) = body.eqns
    inner_spec = spec_of(inner.primitive.name)
    if inner_spec is None:
        plain = not any(True for _ in _compat.sub_jaxprs(inner))
        return 1 if plain and _compat.primitive_label(inner) == label else None
    if inner_spec.label(inner.params, inner.primitive.name) != label:
        return None
    below = restating_body(inner, label)
    return None if below is None else 1 + below


def scope_opened(eqn: Any, name: str) -> _compat.SourceLocation | None:
    """Where the user opened the named scope `name` that `eqn` is in: the call of a
    function `jax.named_call` wrapped (`jax.named_call(attention, name="attn")(w, x)`),
    else the line in the block of the `with jax.named_scope(name):` that made it (`x =
    x + attention(w, norm(x))`, when the equation is deep inside `norm`); None when
    neither is found. Its first equation's own line (inside `attention`, inside `norm`)
    is not where the stage is."""
    for callee, site in _compat.named_call_sites(eqn):
        if callee == name or names_string(site.file, site.line, name):
            return site
    for loc in _compat.user_frame_locations(eqn):
        if scope_opened_at(loc.file, loc.line, name) is not None:
            return loc  # (the block's line that made it: its first line of work)
    return None


def library_loop_body(eqn: Any, body_eqns: Sequence[Any], own: str | None = None) -> str | None:
    """The plain function of yours that a loop body a library traced runs
    (`hk.layer_stack(3)(block)` scans Haiku's own `layer`, which calls `block`): the
    outermost user frame of every equation of the body, when JAX began the body's
    tracebacks there (not at the loop's own frames). None for a method (a Linen
    module's, named by its scope: `scan(blocks)`), a lambda, a body of several, or a
    library's own step around your function (`library_step`; `own`: the body
    function's name)."""
    if library_step(eqn, body_eqns, own) is not None:
        return None
    return _users_body_function(eqn, body_eqns)


#: The names of loop bodies that say nothing of what a step does (JAX's, Equinox's)
_BODY_NAMES = frozenset({"body", "body_fun", "body_fn", "scanned_fun", "loop_body"})


def library_step(eqn: Any, body_eqns: Sequence[Any], own: str | None) -> str | None:
    """`own`, the name of a loop body a library traced, when that body is the library's
    own step calling a plain function of yours amid arithmetic of its own on the loop's
    floats: BlackJAX's leapfrog `one_step` moves momentum and position around your
    `logdensity_fn`, so the loop is `fori_loop(one_step)`, your function a stage inside
    it (it read `fori_loop(logdensity_fn)`, as if that were all it ran). None for a
    body named by no specific function (a lambda, `body_fun`: a diffrax solve's loop
    stays `while(_drift)`, named by your vector field), or one not around yours."""
    own = (own or "").lstrip("_")
    if not own or own in _BODY_NAMES or own.startswith("<"):
        return None
    if _users_body_function(eqn, body_eqns) is None or not _library_arithmetic(body_eqns):
        return None
    return own


def _users_body_function(eqn: Any, body_eqns: Sequence[Any]) -> str | None:
    """The name of the one plain function of yours whose frame is outermost in every
    equation of a library's loop body that has a user frame (`library_loop_body`)."""
    own = _compat.outermost_user_location(eqn)
    loop_root = (own.file, own.function) if own else None
    found: tuple[str, str] | None = None
    for e in body_eqns:
        outer = _compat.outermost_user_location(e)
        if outer is None:
            continue  # the library's own work in the body
        root = (outer.file, outer.function)
        if root == loop_root or (found is not None and root != found):
            return None
        found = root
    parts = found[1].split(".") if found is not None else ["<none>"]
    if parts[-1].startswith("<") or (len(parts) > 1 and parts[-2] != "<locals>"):
        return None  # (a lambda; a method)
    return parts[-1]


#: The primitives of a library's own arithmetic on a loop's floats (`library_step`):
#: they change values, where Haiku's `hk.layer_stack` only splits keys and slices
_ARITHMETIC = frozenset({"add", "sub", "mul", "div", "neg", "dot_general", "exp", "log"})


def _library_arithmetic(body_eqns: Sequence[Any]) -> bool:
    """Whether a loop body holds floating arithmetic (`_ARITHMETIC`) no user frame made."""
    return any(
        e.primitive.name in _ARITHMETIC
        and any(is_floating(v.aval) for v in e.outvars)
        and _compat.outermost_user_location(e) is None
        for e in body_eqns
    )


def sows_named_as_captured(graph: Any, probes: Iterable[Any]) -> Any:
    """`graph` (a `StageGraph`) with each `sow` node that shares its label with another
    beside it (same parent) labelled by the one name its values were captured under
    (`probes`: an inspection's, each with its `node` and `name`; `auto` for those sowviz
    placed). A name sown twice is numbered by the capture (`dup_0`, `dup_1`; a Python
    loop's `logits_0` …): the names `probe` takes, which the boxes and the panel showed
    nowhere (both read `dup`, and so did their paths). Sows apart keep their label,
    which their paths tell apart (`blocks[1]/pre_act`); so does a name the capture keeps
    whole (`duplicates="stack"`, both branches of a `cond`, a `lax.map`'s remainder)."""
    sows = [n for n in graph.nodes if n.kind == "sow"]
    beside = collections.Counter((n.parent, n.label) for n in sows)
    alike = {n.id for n in sows if beside[n.parent, n.label] > 1}
    names: dict[str, set[str]] = {}
    for p in probes:
        if not p.auto and p.node in alike:
            names.setdefault(p.node, set()).add(p.name)
    relabel = {node: got.pop() for node, got in names.items() if len(got) == 1}
    relabel = {k: v for k, v in relabel.items() if graph.node(k).label != v}
    if not relabel:
        return graph
    nodes = tuple(
        dataclasses.replace(n, label=relabel[n.id]) if n.id in relabel else n for n in graph.nodes
    )
    return dataclasses.replace(graph, nodes=nodes)


#: a stage's label used again among its siblings, `mlp#2` (as `saved.REUSED`)
_LABEL_AGAIN = re.compile(r"#\d+$")
#: the places a custom-call note names, at most, before "and N more"
_PLACES_SHOWN = 2


def call_places(recs: Sequence[Any], ids: Sequence[str]) -> str:
    """Where the calls `ids` of one custom function are, for its note: ` (in
    \\`ImplicitAdjoint.apply\\`)`, the last two labels of each call's enclosing stages
    (`recs` by id order; the root left out), or `""` for calls at the top level. An
    optimistix solve calls two functions `fn_wrapper`, the solver's and `error_if`'s:
    their two notes read alike and said opposite things."""
    places: dict[str, None] = {}
    for node in ids:
        chain = []
        at = recs[int(node[1:])].parent
        while at is not None and recs[int(at[1:])].parent is not None and len(chain) < 2:
            chain.append(_LABEL_AGAIN.sub("", recs[int(at[1:])].label))
            at = recs[int(at[1:])].parent
        if chain:
            places[" > ".join(reversed(chain))] = None
    if not places:
        return ""
    shown = ", ".join(f"`{p}`" for p in list(places)[:_PLACES_SHOWN])
    more = len(places) - _PLACES_SHOWN
    return f" (in {shown}{f' and {more} more' if more > 0 else ''})"


def fold_derivative_lines(
    names: list[tuple[str, ...]],
    sites: Callable[[int], Sequence[_compat.SourceLocation | None]],
) -> list[tuple[str, ...]]:
    """`names` with each line that takes a derivative of a function (`u_t =
    jax.grad(model, argnums=0)(t, x)`: `source_text.assigned_by_transform`) one box
    named by what it assigns (`u_t`), around the work the transform made of it
    (`PINN`, `PINN (backward)`) and the line's own equations (`jacfwd`'s unravelling).
    That work is made in the called function's lines, so no fold by line saw the
    line: the calls of `u_t`'s and `u_x`'s lines lay side by side, and the picture did
    not say which was d/dt and which d/dx. `sites(i)`: the user lines equation `i` was
    made from, outermost first (each call's site, then its own line). A line of one
    box's work alone (`y = jax.vmap(f)(x)`, `h = self.layer(x)`) is left as it is: its
    box is named already. Such a line inside such a call is a box inside its box."""
    out = list(names)
    memo: dict[_compat.SourceLocation, tuple[tuple[str, str, int], str, bool] | None] = {}
    lines = [_derivative_lines(sites(i), memo) for i in range(len(names))]
    for rank in range(max(map(len, lines), default=0)):
        i = 0
        while i < len(out):
            if len(lines[i]) <= rank:
                i += 1
                continue
            j = i + 1
            while j < len(out) and lines[j][: rank + 1] == lines[i][: rank + 1]:
                j += 1
            _, label, alone = lines[i][rank]
            _box_run(out, range(i, j), label, i, alone)
            i = j
    return out


def _derivative_lines(
    sites: Sequence[_compat.SourceLocation | None],
    memo: dict[_compat.SourceLocation, tuple[tuple[str, str, int], str, bool] | None],
) -> tuple[tuple[tuple[str, str, int], str, bool], ...]:
    """The lines among `sites` that take a derivative, with what each assigns and
    whether it gets the derivative alone (`source_text.derivative_alone`); `memo`:
    each site's answer so far (a level's equations share a few sites, and reading one
    joins its file's lines)."""
    found = []
    for site in sites:
        if site is None:
            continue
        if site not in memo:
            line = statement_line(site.file, site.line)
            label = assigned_by_transform(site.file, line)
            # (a call's site has the file's full path, an equation's own line may not)
            key = (os.path.basename(site.file), site.function, line)
            alone = label is not None and derivative_alone(site.file, line)
            memo[site] = None if label is None else (key, label, alone)
        if memo[site] is not None:
            found.append(memo[site])
    return tuple(found)


def derivative_site(eqn: Any, names: Sequence[str], j: int) -> _compat.SourceLocation | None:
    """The line that takes the derivative a box `names[j]` of `fold_derivative_lines`
    is named by (`u_t = jax.grad(u, argnums=1)(params, t, x)`), among `eqn`'s user
    frames; None for any other scope. The box was sourced at its first equation's line,
    inside the differentiated function (`u`'s first line), as a fold by line is."""
    name = names[j]
    if not name.startswith(FOLD) or _DERIVATIVE_BOX.search(name) is None:
        return None
    label = fold_label(name)
    # (the same label taken again inside such a line: the k-th box is the k-th line)
    k = sum(
        1
        for n in names[:j]
        if n.startswith(FOLD) and _DERIVATIVE_BOX.search(n) and fold_label(n) == label
    )
    found = [
        loc
        for loc in reversed(_compat.user_frame_locations(eqn))  # (outermost first)
        if assigned_by_transform(loc.file, statement_line(loc.file, loc.line)) == label
    ]
    return found[k] if k < len(found) else None


def _box_run(out: list[tuple[str, ...]], run: range, label: str, tag: int, alone: bool) -> None:
    """Wrap the equations of `run` in one box `label`, below the scopes they all share,
    around the items under them; not when it holds one item alone (the box would
    restate it), nor when no other work there evaluates the functions it calls: a
    train step's `loss`, `loss (backward)` say what they are without a box `loss,
    grads` around them. The line's own fold, labelled alike, is the box itself. A line
    that gets the derivative alone (`alone`: `jax.grad`, not `jax.value_and_grad`)
    and whose own fold has the functions' work after it is always a box
    (`_own_fold_inside`)."""
    prefix = _common_prefix([out[m] for m in run])
    depth = len(prefix)
    items = {out[m][depth] if len(out[m]) > depth else m for m in run}

    def own(t: tuple[str, ...]) -> bool:
        return len(t) > depth and t[depth].startswith(FOLD) and fold_label(t[depth]) == label

    if len(items) < 2:
        return
    inside = alone and _own_fold_inside(out, run, own)
    if not inside and not _called_elsewhere(out, run, prefix):
        return
    box = f"{FOLD}{label}\x01d{tag}"  # (`_DERIVATIVE_BOX`)
    for m in run:
        t = out[m]
        out[m] = (*t[:depth], box, *t[depth + own(t) :])


def _own_fold_inside(
    out: Sequence[tuple[str, ...]], run: range, own: Callable[[tuple[str, ...]], bool]
) -> bool:
    """Whether the line's own fold (`own`) has work of the line's calls after it: it is
    then the differentiated function's own work (a lambda's), not the derivative the
    line assigns. `force = jax.grad(lambda R: -energy(R))` folds the lambda's `neg`
    (and its transpose) by that line, between `energy` and `energy (backward)`: a box
    `force` of the scalar -E stood beside the forces, which came out of `energy
    (backward)`. A Hessian's unravelling (`H = jax.hessian(loss)(...)`) comes last: it
    is the derivative, and its `loss`, `loss (backward)` stay beside it."""
    seen = False
    for m in run:
        if own(out[m]):
            seen = True
        elif seen:
            return True
    return False


def _common_prefix(names: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
    first = names[0]
    n = len(first)
    for t in names[1:]:
        k = 0
        while k < min(n, len(t)) and t[k] == first[k]:
            k += 1
        n = k
    return first[:n]


def _called_elsewhere(out: Sequence[tuple[str, ...]], run: range, prefix: tuple[str, ...]) -> bool:
    """Whether a function the run's calls evaluate is evaluated by other work directly
    under `prefix` too (`u = model(t, x)`, `u_x = jax.grad(model, argnums=1)(t, x)`
    beside `u_t`'s line): then their boxes, `PINN#2` beside `PINN#3`, need the line's
    name."""
    depth = len(prefix)

    def called(m: int) -> str | None:
        t = out[m]
        if len(t) <= depth or t[:depth] != prefix or t[depth].startswith(FOLD):
            return None
        return fold_label(t[depth]).replace(BACKWARD, "").replace(TANGENT, "")

    mine = {c for m in run if (c := called(m)) is not None}
    return any(called(m) in mine for m in range(len(out)) if m not in run)
