"""jaxpr → stage graph: nodes, lifted edges, probe points.

One depth-first walk over the primal program. Every equation becomes a node;
higher-order equations become stages whose children come from their sub-jaxprs;
runs of equations that share a `jax.named_scope` prefix group into `scope` nodes.
Node ids are `n<order>`, the position in that walk, so they depend only on the
program. See README.md in this folder for the design and its sharp edges.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .. import _compat
from .._forwarding import forwarded_operand
from ..primitives import (
    Body,
    Construct,
    construct_of,
    function_name,
    qualified,
    spec_of,
    unqualified,
)
from . import frameworks, repeats
from .batched_map import joined_maps
from .calls import body_call, group_calls, hoisted_from_bodies, inlined_into
from .copies import renames
from .inputs import InputsMixin, constrained_shapes
from .model import (
    INPUT,
    STAGE_KINDS,
    Capture,
    Edge,
    Node,
    Note,
    ProbePoint,
    StageGraph,
    Step,
)
from .names import (
    BACKWARD,
    CALL,
    CLOSURE,
    FOLD,
    TANGENT,
    _count_eqns,
    call_labels,
    call_places,
    construct_label,
    derivative_site,
    fold_derivative_lines,
    fold_names,
    function_label,
    input_groups,
    is_floating,
    library_loop_body,
    library_step,
    line_passes,
    output_groups,
    restating_body,
    scope_label,
    scope_names,
    scope_opened,
    shape_str,
    short_path,
    split_einsum_calls,
    statement_function,
    user_call_label,
)
from .saved import (
    NEW,
    REUSED,
    SAVED,
    dead_boxes,
    dead_keys,
    folded_constants,
    leaf_names,
    readers,
    saved_for_backward,
    saved_note,
    unravelled_boxes,
    unread_constants,
    written_label,
)
from .source_text import (
    assigned,
    parameters_and_unpackings,
    returned_place,
    statement_line,
    unpacked_arg_names,
)
from .tesseract import (
    differentiable_fields,
    eval_func,
    input_fields,
    output_names,
    tesseract_label,
)

_CAPTURES = ("sows", "stages", "all")
#: A level with more nodes than this folds its runs of unscoped equations (names.py).
FOLD_LIMIT = 40
#: A top level of at most this many nodes probes its unscoped equations in "stages" ...
SMALL_TOP_LEVEL = 12
#: ... those of at most this many values: a loss's tail, not the square of a 2M-value
#: activation, which would be a large probe of its own (an output of the capture
#: program and a member of a block group, whose program is keyed by its shapes).
SMALL_TOP_LEVEL_VALUES = 1 << 16

_BAD_CAPTURE = (
    "build_graph: `capture` must be one of 'sows', 'stages' or 'all', got {!r}. "
    "'stages' probes the outputs of every stage, 'all' also every equation, "
    "'sows' only the values the program already sows."
)
_BAD_NAMES = (
    "build_graph: `{arg}` has {got} names but the program has {want} {what}. "
    "Pass one pytree key path per flat value (e.g. from jax.tree_util.tree_flatten_with_path)."
)

#: a custom-rule call's body is probed (beside the program) from this many equations,
#: or when it holds a loop or a named stage: a solver's (diffrax's adjoint, optimistix's
#: root find), not an activation's (`jax.nn.relu`'s, Equinox's `error_if`), whose
#: call's outputs say all there is
CUSTOM_PROBED_MIN = 24

_CUSTOM_OUTPUTS_NOTE = (
    "{n} call(s) of {prim} `{label}`{where}: its values are probed on the call's outputs only. "
    "Under differentiation the custom rule replaces the body, so values inside it have "
    "no tangents or cotangents."
)
#: A construct's label naming the function it wraps: `scan(step)`, `checkpoint(block)`.
_WRAPS = re.compile(r"^\w+\((\w+)(?:, [^()]+)?\)$")  # (`scan(step, reverse)` too)


def _restated(container: _Rec) -> frozenset[str]:
    """The function names that restate `container`, the construct (a custom rule, a jit,
    a loop) whose body a level is: its label, and the function a `fori_loop(body_fun)`
    wraps; none for a scope (a loop's `body` is no function's name)."""
    if container.kind == "scope":
        return frozenset()
    wraps = _WRAPS.match(container.label)
    return frozenset({container.label, wraps.group(1)} if wraps else {container.label})


def _inside(restated: frozenset[str], path: _compat.CallPath) -> _compat.CallPath:
    """`path` without its leading calls `restated` (`_restated`): `odeint`'s custom rule
    `_odeint`, traced from the function `_odeint`, read `_odeint`, `dyn`, `_odeint#2`,
    ... around each call of the user's `dyn`."""
    names = path.names
    k = 0
    # (and a decorator's wrapper around them: `eqx.filter_jit`'s `fun_wrapped`)
    while k < len(names) and (
        names[k].rpartition(".")[2] in restated or function_label(names[k])[1]
    ):
        k += 1
    if k == 0:
        return path
    # (the package is the first call left's: `hk.max_pool` in `hk.nets.ResNet`, its
    # method passed over, is Haiku's layer, a box of its own as at the user's line;
    # but only when that call goes into another package than the frame passed over:
    # Equinox's `MultiheadAttention._project` from its own `__call__` is the library's
    # inside, read as before, its projections boxes of their own)
    packages = path.packages[k:]
    package = packages[0] if packages and packages[0] != path.packages[k - 1] else None
    return _compat.CallPath(names[k:], path.below_user, package, packages)


def _reads(jaxpr: _compat.Jaxpr) -> dict[Any, list[int]]:
    """The equations of `jaxpr` reading each value, in order."""
    out: dict[Any, list[int]] = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if isinstance(v, _compat.Var):
                out.setdefault(v, []).append(i)
    return out


def _read_before_last(items: Sequence[tuple[Any, tuple[int, int]]], reads: Mapping) -> bool:
    """Whether one of a scope's outputs (`items`: value, where it is made) is read
    before its last output is made: one sow after the last would see only the
    cotangent of later reads (an LSTM cell's `c`, read again for `h`; a router's
    `probs`, read by its own top-k), so the values are sown `apart`."""
    if not items:
        return False
    last = max(at[0] for _, at in items)
    return any(at[0] < j <= last for v, at in items if at[0] < last for j in reads.get(v, ()))


def _echoes(recs: Sequence[_Rec], points: Sequence[ProbePoint]) -> dict[str, str]:
    """Nodes that only repeat their parent, each to that parent: a `jit` that is all of
    a custom rule's body and bears its name (`jax.nn.relu` is a `custom_jvp` of a `jit`
    `relu`: every ReLU of a model opened onto a second `relu` box), with no probe of
    its own. Its children become the custom call's."""
    by_id = {r.id: r for r in recs}
    children: dict[str | None, int] = {}
    for r in recs:
        children[r.parent] = children.get(r.parent, 0) + 1
    probed = {p.node for p in points}
    out = {}
    for r in recs:
        parent = by_id.get(r.parent) if r.parent is not None else None
        if (
            parent is not None
            and r.kind == "jit"
            and parent.kind == "custom"
            and REUSED.sub("", parent.label) == r.label  # `relu#2` holding `relu`
            and children[parent.id] == 1
            and r.id not in probed
        ):
            out[r.id] = parent.id
    return out


def _body_operands(eqn: Any, param: str, body: Any) -> dict[Any, int]:
    """Each input of `eqn`'s body in `param` -> the operand of `eqn` it binds: its last
    operands (a call's, a scan's all; a cond's but the index; a while body's but the
    condition's constants). None for a while's condition (its constants come first)."""
    n, m = len(body.invars), len(eqn.invars)
    if param == "cond_jaxpr" or n > m:
        return {}
    return {v: m - n + k for k, v in enumerate(body.invars)}


def joined_name(a: str | None, b: str) -> str:
    """One name for a value a body takes under two (`fori_loop(body, (h, h))`: `c[0]`,
    `c[1]`): their common pytree prefix (`c`), else both."""
    if a is None or a == b:
        return b
    x, y = a, b
    while x != y:
        longer = x if len(x) >= len(y) else y
        shorter = _PYTREE_TAIL.sub("", longer, count=1)
        if shorter == longer or not shorter:
            return f"{a}, {b}"
        x, y = (shorter, y) if longer is x else (x, shorter)
    return x


#: a pytree path's last key: `[0]`, `['w']`, `.weight`
_PYTREE_TAIL = re.compile(r"(\[[^\[\]]*\]|\.[A-Za-z_][A-Za-z_0-9]*)$")


def _with_ends(
    edges: tuple[Edge, ...], ends: Sequence[tuple[str, str]], parent: Mapping[str, str | None]
) -> tuple[Edge, ...]:
    """`edges`, each with the (producer, reader) pairs `ends` lifted onto it (by the final
    tree `parent`: after `repeats` grouped blocks and `_echoes` dropped nodes), where one
    pair is not the edge's own endpoints."""
    paths: dict[str, tuple[str, ...]] = {}

    def path(node: str) -> tuple[str, ...]:  # root first
        got = paths.get(node)
        if got is None:
            up = parent.get(node)
            got = paths[node] = (*path(up), node) if up is not None else (node,)
        return got

    by_key: dict[tuple[str, str], dict[tuple[str, str], None]] = {
        (e.source, e.target): {} for e in edges
    }
    for s, t in ends:
        if s not in parent or t not in parent:
            continue
        ps, pt = path(s), path(t)
        k = 0
        while k < min(len(ps), len(pt)) and ps[k] == pt[k]:
            k += 1
        pairs = by_key.get((ps[k], pt[k])) if k < min(len(ps), len(pt)) else None
        if pairs is not None:
            pairs[s, t] = None
    out = []
    for e in edges:
        key = (e.source, e.target)
        lifted = any(p != key for p in by_key[key])
        out.append(replace(e, ends=tuple(by_key[key])) if lifted else e)
    return tuple(out)


def _ancestors(recs: Sequence[_Rec], rec: _Rec) -> list[_Rec]:
    out = []
    while rec.parent is not None:
        rec = recs[int(rec.parent[1:])]
        out.append(rec)
    return out


_CUSTOM_NOTE = (
    "{n} call(s) of {prim} `{label}`{where}: under differentiation its custom rule replaces its "
    "body, so the stages inside show primal values only, from a second evaluation of the "
    "body beside the program; the call's outputs carry tangents and cotangents."
)


def build_graph(
    closed_jaxpr: _compat.ClosedJaxpr,
    *,
    in_names: Sequence[str],
    out_names: Sequence[str],
    capture: Capture = "stages",
    title: str = "program",
    tesseract_names: Mapping[Any, str] | Callable[[Any], str | None] | None = None,
    in_args: Sequence[int] | None = None,
    parameters: Collection[int] = (),
    state_inputs: Collection[int] = (),
    calls: frameworks.ModuleCalls | None = None,
    in_types: Sequence[str | None] = (),
    vmapped: Mapping[tuple[int, Any], str] | None = None,
) -> StageGraph:
    """The stage graph of the primal program `closed_jaxpr` (from `jax.make_jaxpr`).

    `in_names` / `out_names` label the flat inputs and outputs. `capture` chooses
    the probe points: `"stages"` one per stage output, `"all"` also one per
    floating-point equation, `"sows"` none. `tesseract_names` renames Tesseract
    stages: a mapping from Tesseract objects (or their default names) to labels,
    or a function of the Tesseract returning a label or None.

    Inputs are grouped per argument (`in_args`: the argument position of each flat
    input; by default runs of `in_names` with the same prefix before the first `[`
    or `.`) when it has several leaves, nested by pytree path; the arguments at
    positions `parameters` (the differentiated ones) form the group labelled
    "parameters", less the flat inputs `state_inputs` (a Flax NNX model's variables
    other than `nnx.Param`: BatchNorm statistics, RNG streams, caches, counters),
    which form a group of their own, `<argument> state` (`model state`), as
    `nnx.split(model, nnx.Param, ...)` parts them. Unless `capture="sows"`, every floating input and
    output is probed too (an input's cotangent is its gradient). `calls`: what
    `frameworks.named` recorded of the program's NNX / Equinox module calls (the scopes
    they pushed, the copies it could not name, `graph.copies`, and the order of each
    call's results); without it, no scope is a module's. `in_types`: per flat input, the
    type of the Flax NNX variable holding it (`LoRAParam`), or None (`Node.var_type`).
    `vmapped`: the parameter of each `jax.vmap`ped function of the user's each variable
    was passed as, by the id of the function's code and the variable
    (`_compat.recording_vmap_params`): its stage's ports are named by them.
    """
    if capture not in _CAPTURES:
        raise ValueError(_BAD_CAPTURE.format(capture))
    jaxpr = closed_jaxpr.jaxpr
    for arg, names, vars_, what in (
        ("in_names", in_names, jaxpr.invars, "inputs"),
        ("out_names", out_names, jaxpr.outvars, "outputs"),
    ):
        if len(names) != len(vars_):
            raise ValueError(_BAD_NAMES.format(arg=arg, got=len(names), want=len(vars_), what=what))
    if in_args is not None and len(in_args) != len(in_names):
        raise ValueError(
            _BAD_NAMES.format(arg="in_args", got=len(in_args), want=len(in_names), what="inputs")
        )
    groups = unpacked_leaves(input_groups(in_names, in_args), _compat.body_source(jaxpr))
    renamed = renames(jaxpr, in_names, calls.copies if calls else {})
    # module stages, the copies' new labels as the labels they replace
    scopes = (calls.scopes if calls else frozenset()) | set(renamed.values())
    with frameworks.drawing(scopes, calls.haiku if calls else (), calls.linen if calls else None):
        builder = _Builder(
            capture,
            tesseract_names,
            renamed,
            calls.returns if calls else None,
            calls.writes if calls else None,
            calls.roots if calls else frozenset(),
            params=calls.params if calls else None,
        )
        builder.in_types = tuple(in_types)
        if calls is not None:
            builder.sited, builder.built_at = calls.numpyro
        for (code, var), param in (vmapped or {}).items():
            builder.vmapped.setdefault(var, {})[code] = param
        return joined_maps(
            builder.build(
                jaxpr,
                _parted(groups, frozenset(parameters), frozenset(state_inputs)),
                list(out_names),
                title,
            )
        )


def _parted(groups: list, parameters: frozenset[int], state: frozenset[int]) -> list:
    """`groups` labelled: `(label, items, nest)`, a differentiated argument "parameters" and
    its `state` items apart as `<argument> state` (a BatchNorm's running mean is no
    parameter, and has no gradient)."""
    differentiated = [g for arg, g in groups if arg in parameters]
    if len(differentiated) > 1 and not any(k in state for g in differentiated for k, _, _ in g):
        # Several differentiated arguments (`argnums=(0, 1)`): one "parameters" group
        # holding each by its name (`parameters > a > v`, `parameters > b > s, v`); they
        # were "parameters" and "parameters#2" of unnamed leaves, or a loose `a.v`.
        first = next(i for i, (arg, _) in enumerate(groups) if arg in parameters)
        merged = [(k, name, [f".{name}", *tokens]) for g in differentiated for k, name, tokens in g]
        rest_groups = [(arg, g) for arg, g in groups if arg not in parameters]
        out = [(g[0][1], g, False) for _, g in rest_groups]
        out.insert(first, ("parameters", merged, True))
        return out
    out = []
    for arg, group in groups:
        name = group[0][1]
        rest = [item for item in group if item[0] in state]
        if arg not in parameters or not rest:
            out.append(("parameters" if arg in parameters else name, group, False))
            continue
        params = [item for item in group if item[0] not in state]
        # parted, each is a group even of one leaf (`model state` > `table`)
        out += [
            (label, g, True) for label, g in (("parameters", params), (f"{name} state", rest)) if g
        ]
    return out


def _is_type_cast(eqn: Any) -> bool:
    """Whether `eqn` changes its operands' types only (`pvary`: a `shard_map` marks
    replicated values device-varying before their use; no number changes). Such a cast
    is no box of its own: a shard_map's body showed one beside every parameter it read;
    an operand made outside the level (a body's parameter) then meets its reader as a
    body's parameters do, at the stage. So is a PRNG key's wrap (`_compat.KEY_CASTS`):
    `jax.random.normal(key, ...)` on a raw key drew an empty `random_wrap` box before
    `normal`. So is a Haiku mixed-precision policy's cast of a module's input or
    parameter to its compute dtype (`_compat.haiku_policy_cast`): the policy's, written
    nowhere in the module, it drew boxes named by Haiku's `get_parameter` (not by `w`,
    `b`), and the first of three identical `hk.remat` blocks, the one casting the f32
    input, a level of its own (`block_0 > Block > fc`) that kept it out of their stack."""
    casts = _compat.TYPE_CASTS | _compat.KEY_CASTS
    if eqn.primitive.name in casts and len(eqn.invars) == len(eqn.outvars):
        return True
    return _compat.haiku_policy_cast(eqn)


def _value_type(v: Any) -> tuple[tuple[int, ...], str]:
    """A value's shape and dtype, as `_Rec.takes` holds them."""
    aval = v.aval
    return tuple(int(d) for d in getattr(aval, "shape", ())), str(getattr(aval, "dtype", ""))


def _jvp_twin(before: Any, eqn: Any) -> bool:
    """Whether `eqn` is the tangent equation JAX's JVP emitted right after the primal
    `before` of a linear or bilinear primitive (`x @ w`, then `v @ w`): the same
    primitive, parameters and output types on other operands."""
    if eqn.primitive is not before.primitive or eqn.invars == before.invars:
        return False
    if [v.aval for v in eqn.outvars] != [v.aval for v in before.outvars]:
        return False
    try:
        return bool(eqn.params == before.params)
    except (TypeError, ValueError):  # (parameters holding arrays: not comparable so)
        return False


def _jvp_tangents(eqns: Sequence[Any]) -> set[Any]:
    """The values of a level that a `jax.jvp` of the user's makes as tangents: those of
    a primitive's tangent equation (`_jvp_twin`), and whatever JVP equations compute
    from them (a `tanh`'s tangent, `mul(t, 1 - y**2)`). JAX records no mark of its own:
    a tangent and its primal, made on one line (`h @ w.T + b`), were ordered by where
    each was made, and `+ b`, which adds nothing to the tangent, made the primal last."""
    out: set[Any] = set()
    before = None
    for eqn in eqns:
        if not _compat.under_jvp(eqn):
            before = None
            continue
        reads = any(isinstance(v, _compat.Var) and v in out for v in eqn.invars)
        if reads or (before is not None and _jvp_twin(before, eqn)):
            out.update(eqn.outvars)
        before = eqn
    return out


def _small(eqn: Any) -> bool:
    """Whether `eqn`'s outputs hold at most `SMALL_TOP_LEVEL_VALUES` values each."""
    return all(
        math.prod(getattr(v.aval, "shape", ())) <= SMALL_TOP_LEVEL_VALUES for v in eqn.outvars
    )


def _library_call(eqn: Any) -> str | None:
    """The function of a library other than JAX's that `eqn`'s user line called
    (`inner_opt.update(...)`: `chain`; `optax.apply_updates`), as a fold names it;
    None for JAX's own (`jnp.tanh`, a `jax.grad`'s seed) or a private helper."""
    path = _compat.call_path(eqn)
    if not path.below_user or path.package in (None, "jax", "jaxlib"):
        return None
    names = call_labels(path.names)
    return names[0] if names and not names[0].startswith("_") else None


def _library_jit(eqn: Any) -> bool:
    """Whether `eqn` is a `jit` of a library's own function (`jnp.argsort`, `jnp.tril`:
    JAX's, or an installed package's), not one of the user's (`fold_names`)."""
    if eqn.primitive.name not in _compat.JIT:
        return False
    if eqn.params.get("name") == "_where":
        # `gate = jnp.where(g > 0, jnp.sqrt(g), 0.0)` keeps its `sqrt` a stage of its
        # own: a NaN masked there is what the NaN messages name ("before it, a NaN in
        # `sqrt`"), the double-where trap's hint with it
        return False
    return _compat.defined_in_library(eqn.params["jaxpr"])


def _user_operation(frames: _compat.UserFrames | None, eqn: Any) -> tuple[Any, bool] | None:
    """The Python operation of the user's that made `eqn`, as its innermost user frame's
    code and instruction (`p["embed"][idx]` makes five equations at one), and whether
    `eqn` makes integers or booleans only (that index's wrap, `lt`, `add`, `select_n`)."""
    if frames is None:
        return None
    at = (frames.calls[-1].key[2], frames.calls[-1].lasti) if frames.calls else frames.root
    return at, not any(is_floating(v.aval) for v in eqn.outvars)


def _members(chains: Sequence[tuple[str, ...]]) -> dict[str, list[int]]:
    """Each scope's equations at a level, from the scopes around each (`chains`)."""
    out: dict[str, list[int]] = {}
    for i, chain in enumerate(chains):
        for scope in chain:
            out.setdefault(scope, []).append(i)
    return out


def _feeding_after(inside: Sequence[Any], scope: str, read_after: set) -> set[Any]:
    """The values of `scope` (its equations `inside`, in order) read inside it by an
    equation whose outputs the program after it reads (`read_after`), or feed one that
    does.
    A state only handed back feeds nothing after the stage (an EMA's `hidden`, read for
    its `average`), and its card type no longer stands for the stage's result."""
    feeding: set[Any] = set()
    for eqn in reversed(inside):
        if any((scope, o) in read_after or o in feeding for o in eqn.outvars):
            feeding.update(v for v in eqn.invars if isinstance(v, _compat.Var))
    return feeding


def _level_size(level_names: Sequence[tuple[str, ...]]) -> int:
    """The nodes a level draws: its top scopes and its unscoped equations."""
    return len({n[0] for n in level_names if n}) + sum(1 for n in level_names if not n)


def _whole_program_jit(jaxpr: Any, title: str) -> Any | None:
    """The body of the one `jit` equation named `title` that is the whole program, else
    None."""
    if len(jaxpr.eqns) != 1:
        return None
    eqn = jaxpr.eqns[0]
    if eqn.primitive.name not in _compat.JIT or str(eqn.params.get("name")) != title:
        return None
    made = {*eqn.outvars, *jaxpr.invars}
    if not all(v in made for v in jaxpr.outvars if isinstance(v, _compat.Var)):
        return None
    return eqn.params["jaxpr"]


def _made_inside(jaxpr: Any, at: tuple[int, int]) -> tuple[tuple[Step, ...], tuple[int, int]]:
    """Where the output `at` of `jaxpr`'s equation is made: through the bodies of calls
    (`jit`, `checkpoint`) and a scan's stacked outputs (per iteration), the path to the
    innermost equation making it and its place there. Probed there, a program's output
    that only its aux returns (Flax Linen's `self.sow` in an `nn.scan`, stacked by the
    scan and read by nothing) carries its gradient: the loss reads the value inside,
    the stacked copy outside has none."""
    path: tuple[Step, ...] = ()
    for _ in range(64):  # (one step per nested call)
        eqn = jaxpr.eqns[at[0]]
        construct = construct_of(eqn.primitive.name)
        if construct not in (*_CALLS, Construct.SCAN):
            break
        if construct is Construct.SCAN and at[1] < _compat.scan_layout(eqn.params).num_carry:
            break  # (a carry: the body's value is each iteration's, not the last one)
        param = spec_of(eqn.primitive.name).bodies[0].param  # type: ignore[union-attr]
        body = eqn.params[param]
        inner = body.jaxpr if isinstance(body, _compat.ClosedJaxpr) else body
        out = inner.outvars[at[1]]
        made = [
            (i, k)
            for i, e in enumerate(inner.eqns)
            for k, o in enumerate(e.outvars)
            if isinstance(out, _compat.Var) and o is out
        ]
        if not made:  # (an operand passed through: made outside)
            break
        path, jaxpr, at = (*path, (at[0], param, None)), inner, made[0]
    return path, at


#: Constructs labelled by the function they run (`scan(step)`), not by their caller.
_NAMED_BY_BODY = frozenset({Construct.SCAN, Construct.WHILE, Construct.COND})

#: Loops, by the param of the body they run.
_LOOPS = {Construct.SCAN: "jaxpr", Construct.WHILE: "body_jaxpr"}
#: ... and their nodes' kinds
_LOOP_KINDS = frozenset({"scan", "while"})

#: JAX's functions that build the seed they differentiate along from constants, by the
#: name `_compat.call_path` gives their equations (`jax.hessian` is `jacfwd` of `jacrev`).
_SEEDING = frozenset({("jacfwd",), ("jacrev",), ("hessian",)})

#: Constructs that call their sub-program once, with their operands as its parameters.
_CALLS = (Construct.JIT, Construct.CALL, Construct.REMAT)


def _body_is_users(eqn: Any, body: Any) -> bool:
    """Whether a loop's body is your code: your function, or JAX's wrapper of it that
    `lax.map` makes (`lambda _, x: ((), f(x))`), not a library's own loop."""
    if not _compat.defined_in_library(body):
        return True
    path = _compat.call_path(eqn)
    return path.names[-1:] == ("map",) and path.package == "jax"


def _only_users_jit(eqns: Sequence[Any]) -> str | None:
    """The name of the `jax.jit` of your function that is all a loop's body holds
    (MAML's `lambda p, _: (inner_update(p, x, y), None)` with a jitted `inner_update`:
    `scan(inner_update)`, not `scan`)."""
    if len(eqns) != 1:
        return None
    (eqn,) = eqns
    spec = spec_of(eqn.primitive.name)
    if spec is None or spec.construct is not Construct.JIT or len(spec.bodies) != 1:
        return None
    if _compat.defined_in_library(eqn.params[spec.bodies[0].param]):
        return None
    return spec.label(eqn.params, eqn.primitive.name)


def _rejitted(eqn: Any, spec: Any) -> Any | None:
    """The jit that is all `eqn`'s body holds when it is `eqn` again (same primitive,
    same `name`): a batching rule re-jits the function it maps (`vmap` of `jnp.fft.rfft`
    is `jit fft` around `jit fft` around the `fft` equation), and the outer one is
    labelled as the inner one is (`rfft`, not `fft`)."""
    if spec.construct is not Construct.JIT or len(spec.bodies) != 1:
        return None
    eqns = _compat.jaxpr_and_consts(eqn.params[spec.bodies[0].param])[0].eqns
    if len(eqns) != 1:
        return None
    (inner,) = eqns
    same = inner.primitive is eqn.primitive and inner.params.get("name") == eqn.params.get("name")
    return inner if same else None


def _sited(names: tuple[str, ...], sited: Mapping[tuple[str, str], str]) -> tuple[str, ...]:
    """A name stack with NumPyro's constructions named by their sites: `model/Normal#2`
    is `model/theta: Normal` (`numpyro_sites`), found by the model scope around it."""
    out = list(names)
    for i, name in enumerate(names):
        for model in reversed(names[:i]):
            new = sited.get((model, name))
            if new is not None:
                out[i] = new
                break
    return tuple(out)


def _line_label(rec: _Rec) -> str | None:
    """A line's box named by its line as well: `h (line 17)`, for a label that boxes of
    several lines share among siblings, a loop running one of them again. Its label says what the line assigns (`h`), so
    a number after it (`h#3`) counted every line assigning `h`; the line says which one
    it is. None for a stage of another kind, or a box named otherwise (by the function
    its line called, `Convolution`, `Convolution#2`, as calls are numbered)."""
    if not (rec.made and (rec.scope or "").startswith(FOLD)) or rec.source is None:
        return None
    if assigned(rec.source.file, rec.source.line) != rec.label:
        return None
    return f"{rec.label} (line {rec.source.line})"


def _name_wrappers(recs: Sequence[_Rec]) -> None:
    """A `jax.checkpoint` whose body is one module's call is labelled by it,
    `checkpoint(blocks[1]: Block)`: a column of `checkpoint`s per layer
    (`eqx.filter_checkpoint`, `nnx.remat`) said nothing until each was opened. So is
    one of a lambda holding one named scope, and a scan whose body a library wrote
    (Flax Linen's `nn.scan(nn.remat(Block), name="blocks")` traces Flax's `body_fn`):
    `scan(blocks)` > `checkpoint(blocks)` > `blocks`; a library's `lax.map` of one
    Tesseract, `map(vectoradd)`."""
    kids: dict[str, list[_Rec]] = {}
    for rec in recs:
        if rec.parent is not None:
            kids.setdefault(rec.parent, []).append(rec)
    by_id = {rec.id: rec for rec in recs}
    for rec in reversed(recs):  # a scan's checkpoint is named before the scan
        only = kids.get(rec.id, [])
        if len(only) == 1 and rec.kind == "jit" and rec.label == _FLAX_JIT:
            if only[0].kind == "scope" and not only[0].made:  # `@nn.jit` `head`: `jit(head)`
                rec.label = f"jit({only[0].label})"
            continue
        if len(only) == 1 and rec.kind == "scope" and rec.made and rec.label.startswith("branch "):
            if only[0].kind == "scope" and not only[0].made and ": " not in rec.label:
                rec.label += f": {only[0].label}"  # Linen's `nn.cond` branch: `branch 0: head_b`
            continue
        if len(only) != 1 or rec.kind not in ("remat", "scan"):
            continue
        inner = only[0]
        if (inner.kind == "scope" and not inner.made) or inner.kind == "tesseract":
            name = inner.label
        elif inner.kind == "remat" and inner.label.endswith(")"):
            # (its function, not its policy: `scan(block)` of `checkpoint(block, save dots)`)
            name = unqualified(inner.label, inner.qualifier).partition("(")[2][:-1]
        elif rec.kind == "remat" and inner.kind == "scan" and inner.label.endswith(")"):
            # (the scan's function, not its `reverse`)
            name = unqualified(inner.label, inner.qualifier).partition("(")[2][:-1]
            name = name.partition(", ")[0]
        else:
            continue
        bare = unqualified(rec.label, rec.qualifier)  # (`scan(reverse)` is a bare scan)
        construct, paren, fn = bare.partition("(")
        # (not the body of a scan named by the same function of yours, which both
        # trace: `nnx.scan(nnx.remat(forward))` read `scan(forward)` > `checkpoint(blocks)`;
        # a checkpoint per layer keeps the layer it calls, `checkpoint(blocks[1])`)
        outer = by_id.get(rec.parent) if paren else None
        same_body = (
            outer is not None
            and outer.kind == "scan"
            and unqualified(outer.label, outer.qualifier).partition("(")[2][:-1].partition(", ")[0]
            == fn[:-1]
        )
        if (
            rec.kind == "remat"
            and inner.kind == "scope"
            and (inner.label in frameworks.pushed() or not paren)
            and not same_body
        ) or (rec.kind == "remat" and inner.kind == "scan" and not paren):
            # (Linen's `nn.remat_scan(Block, lengths=(2, 3))(name="blocks")`: a scan of a
            # checkpoint of a scan: `scan(blocks)` > `checkpoint(blocks)` > `scan(blocks)`)
            rec.label = qualified(f"{construct}({name})", rec.qualifier)
        elif rec.kind == "scan" and bare in ("scan", "map"):
            # (tesseract-jax's `vmap_method="sequential"` maps a Tesseract: `map(vectoradd)`)
            rec.label = qualified(f"{bare}({name})", rec.qualifier)


#: A Linen module's scope named by default: its class and its index (`Dense_0`).
_LINEN_AUTO_NAME = re.compile(r"(\w+?)_\d+")
#: The function Flax Linen's `nn.jit` jits: a module's stage inside it, named by it.
_FLAX_JIT = "core_fn"


#: Stages of transforms that call a function: a module they call is called there.
_TRANSFORM_KINDS = frozenset({"remat", "scan", "while", "cond", "jit", "custom", "shard_map"})


class _Rec:
    """A node under construction (mutable until the walk ends)."""

    __slots__ = (
        "blocks",
        "by_line",
        "called",
        "collapsed",
        "constant",
        "forward",
        "id",
        "kind",
        "label",
        "made",
        "n_eqns",
        "order",
        "out_vars",
        "parent",
        "primitive",
        "qualifier",
        "read_by",
        "reads",
        "repeats",
        "saved",
        "scope",
        "shapes",
        "site",
        "source",
        "statics",
        "takes",
        "user_body",
        "var_type",
    )

    def __init__(self, order, kind, label, parent, source=None, shapes=(), primitive=None):
        self.id = f"n{order}"
        self.order = order
        self.kind = kind
        self.label = label
        self.parent = parent
        self.source = source
        self.scope: str | None = None  # a scope's name in the program (`shown_first`)
        self.shapes = shapes
        self.primitive = primitive
        self.qualifier: str | None = None  # what its label adds last (`primitives.qualified`)
        # An equation counts itself; stages then add what they hold (see `finish`).
        self.n_eqns = 0 if kind in ("scope", "input", "output") else 1
        self.collapsed = kind in STAGE_KINDS
        self.out_vars: dict[Any, tuple[int, int]] | None = None  # scopes: output var -> loc
        self.var_type: str | None = None  # an input's NNX variable type (`Node.var_type`)
        self.made = False  # a scope sowviz made: a fold (names.fold_names), a branch
        self.called = False  # a call of the user's own function (`calls.group_calls`)
        #: a module's call named by the line that made it (`name_by_line`: `q_tm1: QNet`)
        self.by_line = False
        #: a loop or call whose body is the user's code (`scan(layer)`, `jit(block)`)
        self.user_body = False
        self.repeats = 0  # a group of identical blocks: how many (repeats.py)
        self.blocks: list[_Rec] = []  # its blocks, when other stages lie between them
        #: an equation's place, to probe it later (`repeats`: a group's output): its
        #: level's path, its index there and its output variables
        self.site: tuple[Any, int, Any] | None = None
        self.constant = False  # an equation reading only constants (see `_Builder.const`)
        self.reads: list[_Rec] = []  # the inputs its own equations read (parameters)
        #: per input in `reads`, the equation that first reads it: its `order` places the
        #: read in program order among its stages' (`Node.read_at`)
        self.read_by: list[_Rec] = []
        self.statics: tuple[tuple[str, str], ...] = ()  # a Tesseract's (`Node.static_inputs`)
        #: the types of the values it reads from outside itself (`repeats`: blocks alike)
        self.takes: set[tuple[tuple[int, ...], str]] = set()
        self.forward = False  # a scope holding an equation of no backward pass
        #: a scope's outputs that only a backward pass reads (`saved.saved_for_backward`)
        self.saved: frozenset = frozenset()


class _Builder(InputsMixin):
    def __init__(
        self,
        capture: str,
        tesseract_names: Any,
        renamed: Mapping[Any, str],
        returns: Mapping[tuple[str, Any], int] | None = None,
        writes: Mapping[tuple[str, Any], str] | None = None,
        roots: frozenset[str] = frozenset(),
        params: Mapping[tuple[str, Any], str] | None = None,
    ) -> None:
        self.capture = capture
        self.renamed = renamed  # scope names given by `copies.renames`, by (path, name)
        self.unrenamed = {new: old for (_, old), new in renamed.items()}
        #: NumPyro's constructions named by their sites, (model, `Normal#2`) ->
        #: `theta: Normal`, and where each was built (`numpyro_sites.relabeled`)
        self.sited: Mapping[tuple[str, str], str] = {}
        self.built_at: Mapping[tuple[str, str], _compat.SourceLocation] = {}
        #: a user call's scope name -> the id of its function's code (`group_calls`)
        self.callees: dict[str, int] = {}
        #: a variable -> {id of a `jax.vmap`ped function's code: the parameter it was
        #: passed as} (`_compat.recording_vmap_params`)
        self.vmapped: dict[Any, dict[int, str]] = {}
        #: a variable -> {scope name: its place in the result of that module call}
        self.returns: dict[Any, dict[str, int]] = {}
        #: an input's id -> the nodes whose equations read it (`StageGraph.input_readers`)
        self.input_readers: dict[str, set[str]] = {}
        #: a user call's stage id -> its outputs' places in what it returns (`call_order`)
        self.call_places: dict[str, dict[Any, int]] = {}
        #: a user call's stage id -> those of its outputs that a module call inside it
        #: left in the module's variables, each with its path there (`call_writes_in`)
        self.call_writes: dict[str, dict[Any, str]] = {}
        #: a scope's output as `vmap` returns it -> the value it moved (`batch_first`)
        self.moved: dict[Any, Any] = {}
        for (name, var), k in (returns or {}).items():
            self.returns.setdefault(var, {})[name] = k
        #: a variable -> {scope name: the path of the module variable that call wrote it
        #: to} (`written_as`)
        self.writes: dict[Any, dict[str, str]] = {}
        for (name, var), path in (writes or {}).items():
            self.writes.setdefault(var, {})[name] = path
        #: a variable -> {scope name: the parameter of that module call it was passed as}
        self.params: dict[Any, dict[str, str]] = {}
        for (name, var), param in (params or {}).items():
            self.params.setdefault(var, {})[name] = param
        self.roots = roots  # the scope labels of root modules' calls (`module_roots`)
        self.forwarding: dict = {}  # `_forwarding`'s memo
        #: Flax Linen's module classes, yours among them (`linen_scope_of`)
        self.linen_modules = frameworks.linen_module_names()
        self.tesseract_names = tesseract_names
        self.recs: list[_Rec] = []
        self.edges: dict[tuple[str, str], Edge] = {}
        #: (producer, reader) of each value an edge carries, the deepest nodes: an opened
        #: stage draws where a value from outside enters it (`Edge.ends`)
        self.ends: list[tuple[_Rec, _Rec]] = []
        #: the inputs of the "parameters" (and state) groups: no `Edge.ends` from them
        self.weights: set[_Rec] = set()
        #: per equation with a body being walked (by `id`, popped by its walk): its
        #: operands' readers and its results' makers inside the body, the deepest nodes
        self.body_reads: dict[int, dict[int, list[_Rec]]] = {}
        self.body_makes: dict[int, dict[int, list[_Rec]]] = {}
        #: per equation with a body (by `id`, popped by its walk): what the body calls
        #: each operand (`step(h, x)`: `h`), for the ports of the stage drawing it
        self.operand_names: dict[int, dict[int, str]] = {}
        #: (stage, deepest producer outside it) -> what the stage's body calls the value
        self.port_names: dict[tuple[_Rec, _Rec], str] = {}
        #: per list of a body operand's readers (`body_reads`, by `id`; the list kept
        #: alive): each reader -> the stages around it inside the body that name the
        #: value themselves (a jitted function of yours called in a loop's body)
        self.inner_names: dict[int, tuple[list[_Rec], dict[_Rec, dict[_Rec, str]]]] = {}
        #: per list of a body operand's readers (`body_reads`, by `id`; the list kept
        #: alive): the type a Haiku policy's cast in the body made of the operand, which
        #: the stage takes (`_Rec.takes`): the first `hk.remat` block cast its f32 input
        #: to bf16, the next ones were given bf16, and the three were no repeats
        self.retyped: dict[int, tuple[list[_Rec], tuple[tuple[int, ...], str]]] = {}
        #: a variable a body's node made -> those nodes (`body_makes`), for `Edge.ends`
        self.leaf_made: dict[Any, list[_Rec]] = {}
        self.points: list[tuple[int, ProbePoint]] = []
        self.operand_points: list[ProbePoint] = []  # (`operand_point`)
        self.sows: dict[str, list[str]] = {}
        #: a sow's record -> its call (`StageGraph.sow_calls`; by record: ids are renumbered)
        self.sow_calls: dict[_Rec, int] = {}
        #: custom-rule calls whose bodies hold probes, by (primitive, label, small: the
        #: body is too small to be probed beside the program)
        self.custom_calls: dict[tuple[str, str, bool], list[str]] = {}
        self.notes: list[Note] = []
        self.sources: dict[tuple[str, int, str], _compat.SourceLocation] = {}
        #: a user call's scope name (`calls.group_calls`) -> the line that made the call
        self.call_sites: dict[str, _compat.SourceLocation | None] = {}
        #: ids of the variables that hold constants: computed from literals alone (the
        #: `nan` that `jnp.var` puts where it would divide by zero, then masks)
        self.const_vars: set[int] = set()
        #: variables that a seed `jax.jacfwd` built reaches (`seeds`): tangents, whatever
        #: the stage that makes them is named
        self.tangents: set[Any] = set()
        self.top_loc: dict[Any, tuple[int, int]] = {}
        #: variables some equation reads (`shown_first`)
        self.read: set[Any] = set()
        #: tangents a `jax.jvp` in the program makes (`_jvp_tangents`): shown after primals
        self.jvp_tangents: set[Any] = set()
        #: (scope id, variable): an equation outside the scope reads the variable
        self.read_after: set[tuple[str, Any]] = set()
        #: per scope of several outputs, its values the program after it reads from
        self.feeding: dict[str, set[Any]] = {}
        self.used: set[Any] = set()  # the variables the level being walked reads
        self.in_types: tuple[str | None, ...] = ()  # `build_graph`'s
        #: ids of equations drawn as edges: `jax.pmap`'s plumbing (`_compat.pmap_body`)
        self.passed: set[int] = set()
        #: a `with_sharding_constraint`'s result -> its type with the sharding it asks
        #: (`constrained_shapes`), which a scope giving it out shows as well
        self.constrained: dict[Any, str] = {}
        #: the last equation `module_call` read the module call sites of, and them
        self.sites_of: tuple[Any, dict[bool, list]] = (None, {})

    # -- nodes -----------------------------------------------------------------
    def new(self, kind, label, parent, source=None, shapes=(), primitive=None) -> _Rec:
        rec = _Rec(len(self.recs), kind, label, parent, source, shapes, primitive)
        self.recs.append(rec)
        return rec

    def build(self, jaxpr, groups, out_names, title) -> StageGraph:
        root = self.new("jit", title, None)
        root.collapsed = False
        root.n_eqns = 0  # the whole program is not an equation
        root.shapes = tuple(shape_str(v.aval) for v in jaxpr.outvars)
        probe = self.capture != "sows"
        inputs = {}
        for label, group, nest in groups:
            weights = label == "parameters" or label.endswith(" state")
            for k, chain in self.leaf_tree(root, group, label, jaxpr.invars, nest=nest):
                v = jaxpr.invars[k]
                inputs[v] = chain
                if k < len(self.in_types):
                    self.recs[int(chain[-1][1:])].var_type = self.in_types[k]
                if weights:
                    self.weights.add(self.recs[int(chain[-1][1:])])
                if probe:  # sown before the first equation: its cotangent is the gradient
                    self.point(self.recs[int(chain[-1][1:])], (), [(-1, k)], [v])
        inner = _whole_program_jit(jaxpr, title)
        if inner is None:
            outs = self.walk(jaxpr, root, (), inputs, probe=True)
        else:
            # `fn` is itself jitted (`eqx.filter_jit`, `nnx.jit`, `jax.jit`): its one
            # stage would restate the root (`step` > `step`); its body is the top level.
            eqn = jaxpr.eqns[0]
            body = inner.jaxpr
            var = _compat.Var
            pairs = zip(body.invars, eqn.invars, strict=True)
            known = {b: inputs[v] for b, v in pairs if isinstance(v, var) and v in inputs}
            prod = self.walk(body, root, ((0, "jaxpr", None),), known, probe=True)
            outs = dict(inputs)  # an argument returned as it came
            for o, b in zip(eqn.outvars, body.outvars, strict=True):
                if isinstance(b, var) and b in prod:
                    outs[o] = prod[b]
            self.top_loc = {o: (0, k) for k, o in enumerate(eqn.outvars)}
        for group in output_groups(out_names):
            for k, dst in self.leaf_tree(root, group, group[0][1], jaxpr.outvars, "output"):
                v, rec = jaxpr.outvars[k], self.recs[int(dst[-1][1:])]
                chain = outs.get(v) if isinstance(v, _compat.Var) else None
                if chain is not None:
                    self.edge(chain, dst, v)
                    at = self.top_loc.get(v)
                    # Sown where the value is made, so its cotangent is dloss/dvalue
                    # whatever else reads it: sown at the end, an aux output the loss
                    # also read (`has_aux`'s predictions) showed the aux's zero cotangent.
                    if probe and at is not None:
                        path, at = _made_inside(jaxpr, at)
                        self.point(rec, path, [at], [v])
        return self.finish(root, title)

    # -- one jaxpr level ---------------------------------------------------------
    def walk(
        self,
        jaxpr: _compat.Jaxpr,
        container: _Rec,
        path: tuple[Step, ...],
        known: dict[Any, tuple[str, ...]],
        *,
        probe: bool,
        in_custom: _Rec | None = None,
        into: Mapping[Any, list[_Rec]] | None = None,
    ) -> dict[Any, tuple[str, ...]]:
        """Add the nodes of `jaxpr` under `container`; return var -> producer chain.

        A chain lists the producer's ancestors below `container`, outermost first,
        ending with the producer: lifting an edge is comparing two chains. `into`: per
        input of a body, the list its readers here are added to (`Edge.ends`).
        """
        into = dict(into or {})  # (more names for its lists: operands passed on)
        prod: dict[Any, tuple[str, ...]] = dict(known)
        loc: dict[Any, tuple[int, int]] = {}
        scopes: list[tuple[str, _Rec]] = []  # open named scopes, outermost first
        opened_by: dict[str, tuple] = {}  # a module scope's id -> `module_call` it opened at
        # (the parent's id, the scope's name) -> the last such module scope and its call
        last_call: dict[tuple[str, str], tuple[_Rec, tuple]] = {}
        chain_here: tuple[str, ...] = ()  # their ids
        level_scopes: list[_Rec] = []
        chains: list[tuple[str, ...]] = []  # the scopes around each equation
        capture_eqns = probe and self.capture == "all"
        capture_stages = probe and self.capture in ("stages", "all")
        used = {v for e in jaxpr.eqns for v in e.invars if isinstance(v, _compat.Var)}
        used.update(v for v in jaxpr.outvars if isinstance(v, _compat.Var))
        self.used = used  # this level's (`eqn_node` orders a call's outputs by it)
        self.jvp_tangents.update(_jvp_tangents(jaxpr.eqns))
        scoped = [scope_names(e) for e in jaxpr.eqns]
        if self.renamed:
            at = tuple(path)
            scoped = [tuple(self.renamed.get((at, n), n) for n in names) for names in scoped]
        if self.sited:
            scoped = [_sited(names, self.sited) for names in scoped]
        locs = [self.source(e) for e in jaxpr.eqns]
        # the user's own functions (`predict` > `layer_norm`), before any fold
        prims = [e.primitive.name for e in jaxpr.eqns]
        is_stage = [self.stage_label(e) for e in jaxpr.eqns]  # (None: an equation)
        # The labels of the stages named by themselves (a `jit`): a call making one alone
        # is a stage around it unless named alike (`embed` > `take`; not `relu` > `relu`).
        # A call making one loop (or `cond`) is a stage around it: the loop is named by
        # its body (`fori_loop(body)`), the call says whose it is (`smooth`).
        named_stage = [
            label if label and spec_of(name).construct not in _NAMED_BY_BODY else None  # type: ignore[union-attr]
            for label, name in zip(is_stage, prims, strict=True)
        ]
        frames = [_compat.user_frames(e) for e in jaxpr.eqns]
        backward = [("transform", "transpose") in _compat.name_stack_kinds(e) for e in jaxpr.eqns]
        transforms = [_compat.name_stack_transforms(e) for e in jaxpr.eqns]
        for i, j in hoisted_from_bodies(jaxpr.eqns, frames).items():
            scoped[i], locs[i], frames[i] = scoped[j], locs[j], frames[j]
            backward[i], transforms[i] = backward[j], transforms[j]
        # Not drawn: constants nobody reads, and the seeds that `jax.jacfwd` / `jax.hessian`
        # build (`seeds`); each takes the place of what follows it.
        unread = sorted({*unread_constants(jaxpr, used), *self.seeds(jaxpr), *dead_keys(jaxpr)})
        stand_in = list(range(len(jaxpr.eqns)))  # whose library calls each one's are
        for i in reversed(unread):
            if i + 1 < len(scoped):
                scoped[i], locs[i], frames[i] = scoped[i + 1], locs[i + 1], frames[i + 1]
                backward[i], stand_in[i] = backward[i + 1], stand_in[i + 1]
                transforms[i] = transforms[i + 1]
        # A Haiku policy's cast (drawn as an edge: `_is_type_cast`) takes the place of
        # what follows it in its module (or, casting the module's result, of what comes
        # before): the cast of a module's f32 input, made on the line that calls the
        # module, was a level of its own around the module's own lines (`block_0 >
        # Block > fc`; the next blocks, given bf16, cast nothing)
        n = len(jaxpr.eqns)
        for i in reversed(range(n)):
            if not _compat.haiku_policy_cast(jaxpr.eqns[i]):
                continue
            at = len(scoped[i])
            for j in (i + 1, i - 1):
                if 0 <= j < n and scoped[j][:at] == scoped[i]:
                    scoped[i], locs[i], frames[i] = scoped[j], locs[j], frames[j]
                    backward[i], stand_in[i] = backward[j], stand_in[j]
                    transforms[i] = transforms[j]
                    break
        for i, j in inlined_into(frames).items():  # (a vmapped switch's branches: its own)
            locs[i], stand_in[i] = locs[j], stand_in[j]
        # (calls of one Linen module from several lines, one scope: apart while the user's
        # calls are found, else each would be a call inside that one scope)
        scoped = split_linen_calls(
            scoped, lambda i, names, j: self.module_call(jaxpr.eqns[stand_in[i]], names, j)
        )
        scoped, call_sites = group_calls(
            scoped,
            [f.calls if f is not None else None for f in frames],
            backward,
            tag=len(self.call_sites),
            primitives=prims,
            roots=[f.root if f is not None else None for f in frames],
            stages=named_stage,
            by_lambda=[f is not None and f.by_lambda for f in frames],
            transforms=transforms,
            # (a loop's body: a function it calls alone is a stage unless it names the loop)
            named_by=_restated(container) if container.kind in _LOOP_KINDS else None,
            library=lambda i: _library_call(jaxpr.eqns[stand_in[i]]),
            callees=self.callees,
        )
        scoped = [tuple(n.split(_LINEN_AGAIN, 1)[0] for n in names) for names in scoped]
        self.call_sites.update(call_sites)
        scoped = split_einsum_calls(scoped, locs)
        layer_call = self.layer_calls(jaxpr, scoped, locs)

        def at_module_call(i: int) -> bool:
            # The user's line is the call of the module whose stage holds the equation:
            # a library module's own code (Equinox's attention reshaping its heads).
            names = scoped[i]
            if names and _compat.made_by_library_haiku_module(jaxpr.eqns[i]):
                return True  # (Haiku pushes its modules' scopes itself: `hk.LSTM`'s gates)
            if names and names[-1].endswith(CLOSURE) and locs[i] is not None:
                # a library's closure called on the line (jraph's `GraphNetwork`,
                # `calls.group_calls`): its own work, not a fold of the line inside it
                return self.location(self.call_sites.get(names[-1])) == locs[i]
            if not names or names[-1] not in frameworks.pushed():
                return False
            return self.scope_source(jaxpr.eqns[i], names, len(names) - 1) == locs[i]

        restated = _restated(container)
        # a jit of JAX's own (`jax.image.resize`'s `_resize`): its file's functions
        body = _compat.jax_jitted_file(jaxpr) if container.kind == "jit" else ""
        level_names = fold_names(
            scoped,
            locs,
            FOLD_LIMIT,
            # (a seed's are those of what follows it: else a `jacfwd` group of nothing drawn)
            call_path=lambda i: _inside(restated, _compat.call_path(jaxpr.eqns[stand_in[i]], body)),
            at_module_call=at_module_call,
            primitives=prims,
            reentry=lambda i: _compat.reentry(jaxpr.eqns[i]),
            stages=is_stage,
            passes=line_passes(locs, frames),
            backward=backward,
            out_types=lambda i: tuple(shape_str(v.aval) for v in jaxpr.eqns[i].outvars),
            operations=[_user_operation(f, e) for f, e in zip(frames, jaxpr.eqns, strict=True)],
            span=lambda i: _compat.user_span(jaxpr.eqns[stand_in[i]]),
            draws=[_compat.draws_from_key(e) for e in jaxpr.eqns],
            outside=[_compat.on_traced_lambda_line(jaxpr.eqns[m]) for m in stand_in],
            library_jits=[_library_jit(e) for e in jaxpr.eqns],
            writes=self.write_lines(jaxpr, scoped),
            nn_calls=[_compat.is_jax_nn_call(e) for e in jaxpr.eqns],
        )
        # (`u_t = jax.grad(model)(t, x)`: one box `u_t` around the calls the grad made)
        level_names = fold_derivative_lines(
            level_names,
            lambda i: (*(c.site() for c in frames[i].calls), locs[i]) if frames[i] else (locs[i],),
        )
        # The top level of a small program: its own equations (a loss's `(y - t) ** 2`,
        # `mean`) carry data as stages do, instead of boxes with none.
        own_lines = container.parent is None and _level_size(level_names) <= SMALL_TOP_LEVEL
        unread_set = set(unread)
        # boxes with no data directly in a module's stage: those of the line making
        # its result get some (`probe_result_lines`)
        module_boxes: dict[int, tuple[_Rec, _Rec]] = {}
        carrying: set[str] = set()  # the stages holding a box with data
        through: dict[Any, Any] = {}  # `jax.pmap`'s expanded results -> the values expanded

        @functools.cache
        def scope_sizes() -> Counter[str | None]:  # each scope's equations, at this level
            # (None: the level's container, which holds them all: Haiku's residual `add`
            # after its `dense` and `gelu` stages in `hk.remat(block)` is no stage alone)
            sizes = Counter(n for names in level_names for n in set(names))
            sizes[None] = len(level_names)
            return sizes

        # A line's box whose equations' results all reach nothing (XLA drops them) is
        # not drawn, nor are they: it had no data, named by the line (`pred, _ =
        # jax.vmap(model)(x, state)`: the discarded state's broadcasts; `dead_boxes`)
        dead = dead_boxes(jaxpr, level_names)
        # Constants made of literals alone, loose in the scope of the box reading them,
        # are its work (`folded`): each one's equations count in its first reader's
        # (`held`, by result)
        folded = set() if capture_eqns else self.folded(jaxpr, level_names, {*unread_set, *dead})
        held: dict[Any, int] = {}
        # A derivative line's box holding only the transform's unravelling of its value
        # (`u_xx = jax.hessian(u, 2)(p, t, x)`'s `split`, `reshape`): those are the box's
        # own work, no boxes of their own (every equation drawn, `capture="all"`, keeps
        # them)
        unravelled = set() if capture_eqns else unravelled_boxes(jaxpr, level_names, dead)
        for i, eqn in enumerate(jaxpr.eqns):
            if i in dead:
                chains.append(chain_here)
                continue
            if i in folded:  # (opens no scope: drawn as part of its reader)
                # (its own equation, and those of the constants it reads)
                count = 1 + sum(held.pop(v, 0) for v in eqn.invars if isinstance(v, _compat.Var))
                held.update((v, count) for v in eqn.outvars[:1])
                self.const_vars.update(id(v) for v in eqn.outvars)
                chains.append(chain_here)
                continue
            names = level_names[i]
            # Close the scopes that end here, open the ones that start.
            keep = 0
            while keep < len(scopes) and keep < len(names) and scopes[keep][0] == names[keep]:
                # A module called again from another line (`q_t_target = net.apply(
                # target, obs)` after `q_tm1 = net.apply(online, obs)`) is another stage,
                # named by each line; calls from one line (a Python loop's) stay one
                # stage, as they were.
                before = opened_by.get(scopes[keep][1].id)
                now = self.module_call(eqn, names, keep) if before is not None else None
                if now is not None and now != before:
                    break
                keep += 1
            as_edge = _is_type_cast(eqn) or id(eqn) in self.passed  # (drawn as edges, below)
            if as_edge:  # opens no scope: one of casts alone (`pcast((a, b))`) held nothing
                names = names[:keep]
            if keep < len(scopes):
                del scopes[keep:]
                chain_here = chain_here[:keep]
            for j in range(keep, len(names)):
                name = names[j]
                parent = scopes[-1][1] if scopes else container
                label = scope_label(name, locs[i], _compat.call_path(eqn).names)
                source = self.scope_source(eqn, names, j, parent)
                rec = self.new("scope", label, parent.id, source=source)
                rec.out_vars = {}
                rec.scope = name
                rec.made = name.startswith(FOLD)
                rec.called = name in self.call_sites
                call = self.module_call(eqn, names, j)
                if call is not None:
                    opened_by[rec.id] = call
                    last = last_call.get((parent.id, name))
                    if last is not None and last[1] != call:
                        # (both: `q_tm1: q_network`, `q_t_target: q_network`)
                        name_by_line(last[0], last[1], call, self.location)
                        name_by_line(rec, call, last[1], self.location)
                    last_call[(parent.id, name)] = (rec, call)
                scopes.append((name, rec))
                level_scopes.append(rec)
                chain_here = (*chain_here, rec.id)
            chains.append(chain_here)
            if not backward[i]:
                for _, open_rec in scopes:
                    open_rec.forward = True
            parent = scopes[-1][1] if scopes else container
            if eqn.primitive.name in _compat.PLATFORM_INDEX:
                continue  # the branch `platform_dependent` lowers: its cond shows only it
            if i in unread_set:
                self.const_vars.update(id(v) for v in eqn.outvars)  # (a seed's readers: constants)
                continue
            if i in unravelled and scopes and self.within_box(eqn, i, chain_here, prod, into, loc):
                continue
            if as_edge:  # drawn as the edges it is, from its operands' producers
                # (a counter's `i + 1` passes its `i`: the operands past the results are
                # literals)
                passed_on = eqn.invars[: len(eqn.outvars)]
                for k, (o, v) in enumerate(zip(passed_on, eqn.outvars, strict=True)):
                    if isinstance(o, _compat.Var) and o in held:  # (a folded constant cast)
                        held[v] = held.pop(o)
                    if isinstance(o, _compat.Var) and o in prod:
                        prod[v] = prod[o]
                    elif isinstance(o, _compat.Var) and o in into:
                        # a body's operand passed on (a loop's key, wrapped): its readers
                        # read the operand (the loop's port for it)
                        into[v] = into[o]
                        if _compat.haiku_policy_cast(eqn):
                            self.retyped[id(into[o])] = (into[o], _value_type(v))
                    loc[v] = (i, k)
                    if id(eqn) in self.passed:
                        through[v] = o
                continue
            rec = self.eqn_node(eqn, i, parent, path, probe, in_custom)
            if held:
                rec.n_eqns += sum(held.pop(v, 0) for v in eqn.invars if isinstance(v, _compat.Var))
            points_before = len(self.points)
            self.used = used  # again: the call's body was walked
            self.carry_tangents(eqn)
            if rec.kind in ("jit", "remat"):
                self.mark_tangent(rec, {v: eqn for v in eqn.outvars if v in used})
            chain = (*chain_here, rec.id)
            reads = self.body_reads.pop(id(eqn), {})
            operand_names = self.operand_names.pop(id(eqn), {})
            if rec.kind == "tesseract":  # its ports are its schema's fields (`conductivity`)
                operand_names, rec.statics = input_fields(eqn.params, len(eqn.invars))
                reads = {p: [rec] for p in operand_names}
            for k, made in self.body_makes.pop(id(eqn), {}).items():
                self.leaf_made[eqn.outvars[k]] = made
            for p, v in enumerate(eqn.invars):
                if isinstance(v, _compat.Var):
                    src = prod.get(v)
                    if src is None and v in into:  # the body's operand: read here
                        into[v].extend(reads.get(p) or [rec])
                        self.name_within(into[v], rec, reads.get(p), operand_names.get(p))
                    if src is not None:
                        made = self.recs[int(src[-1][1:])]
                        holder = parent if rec.kind == "eqn" else rec
                        if made.kind == "input":
                            self.input_readers.setdefault(made.id, set()).add(rec.id)
                            if made not in holder.reads:
                                holder.reads.append(made)  # the stage's own parameters
                                holder.read_by.append(rec)
                        k = self.edge(src, chain, v, reads.get(p), operand_names.get(p))
                        self.leave_scopes(src, k, v, loc)
            for k, v in enumerate(eqn.outvars):
                prod[v] = chain
                loc[v] = (i, k)
            if rec.kind == "tesseract" and capture_stages:
                # Outputs by schema field; those the program never uses are not probed.
                fields = output_names(eqn.params, len(eqn.outvars))
                live = [k for k, v in enumerate(eqn.outvars) if v in used]
                self.point(
                    rec,
                    path,
                    [(i, k) for k in live],
                    [eqn.outvars[k] for k in live],
                    names=tuple(fields[k] for k in live) if fields else (),
                )
                if in_custom is None and eval_func(eqn.params) == "apply":
                    self.operand_point(rec, path, i, eqn, operand_names)
            elif (rec.kind in STAGE_KINDS and capture_stages) or (
                rec.kind == "eqn"
                and not _compat.touches_ref(eqn)
                and (
                    capture_eqns
                    # a plain function among a module's layers carries data as they
                    # do (not inside a fold that carries it: `gelu`)
                    or (capture_stages and not parent.made and layer_call(i))
                    or (capture_stages and own_lines and not names and _small(eqn))
                    # a box your module or function drew carries data: its
                    # `jnp.concatenate`, a `jax.nn.sigmoid` between its layers (not a
                    # library's own work: Flax's `LayerNorm`, JAX's `logsumexp`; a
                    # `jax.named_scope` block is one stage, as a fold is)
                    # (and a loop's body you wrote: `scan(layer)`'s `log`, per layer)
                    or (
                        capture_stages
                        and (
                            parent.called
                            or parent.scope in frameworks.pushed()
                            # (Linen pushes its own: `MLP`'s `nn.tanh` between `Dense`s)
                            or self.linen_scope_of(parent, locs[i], frames[i])
                            or (parent is container and container.user_body)
                            # `jax.named_call(block)`: a scope named as your function
                            # whose code made the equation, which is that call
                            or (
                                parent.scope is not None
                                and locs[i] is not None
                                and locs[i].function == parent.scope
                            )
                        )
                        and not body
                        and scope_sizes()[parent.scope] > 1  # else it is the stage
                        and not rec.constant  # (`jnp.zeros` of a carry: no data to see)
                        and _compat.made_by_user(eqn)
                    )
                )
            ):
                # Not the operands a stage hands back unchanged (an `nnx.remat` returns
                # the module's parameters): the same values, probed where they come from.
                # A `custom_vjp`'s are its own: its rule may change their gradient (a
                # gradient clip's forward is the identity).
                vjp = construct_of(eqn.primitive.name) is Construct.CUSTOM_VJP
                made = [
                    k
                    for k in range(len(eqn.outvars))
                    if vjp or forwarded_operand(eqn, k, self.forwarding) is None
                ]
                # numbered as its type lists them (`eqn_node`: what the program reads
                # first): a scan's panel read "shape float32[4,2], float32[5], …" beside
                # "output [1]", which was its second carry, not the `float32[5]` values
                made.sort(key=lambda k: eqn.outvars[k] not in used)
                if made:
                    self.point(rec, path, [(i, k) for k in made], [eqn.outvars[k] for k in made])
            if rec.kind == "eqn" and len(self.points) > points_before:
                carrying.add(parent.id)
            elif (
                capture_stages
                and rec.kind == "eqn"
                and parent.scope in frameworks.pushed()
                and not at_module_call(i)  # (the line is the module's own, not its call)
                and not rec.constant
                and not _compat.touches_ref(eqn)
            ):
                module_boxes[i] = (rec, parent)
        # Values leaving this level leave every scope around their producer (as made
        # there: not with the device axis `jax.pmap` adds after).
        for v in jaxpr.outvars:
            if isinstance(v, _compat.Var) and through:
                v = through.get(v, v)
            # (not an input handed on by a cast drawn as an edge: no stage made it)
            if isinstance(v, _compat.Var) and v in loc and v in prod:
                self.mark_scope_outputs(prod[v], 0, v, loc[v])
        self.probe_result_lines(jaxpr, module_boxes, carrying, locs, path)
        if not path:
            self.top_loc = loc
        self.read.update(v for e in jaxpr.eqns for v in e.invars if isinstance(v, _compat.Var))
        saved = saved_for_backward(jaxpr, backward, chains, loc) if any(backward) else {}
        reads: dict[Any, list[int]] | None = None  # made when a scope's point needs it
        members: dict[str, list[int]] | None = None  # each scope's equations, when needed
        for rec in level_scopes:
            assert rec.out_vars is not None
            if len(rec.out_vars) > 1:
                if members is None:
                    members = _members(chains)
                inside = [jaxpr.eqns[i] for i in members.get(rec.id, ())]
                self.feeding[rec.id] = _feeding_after(inside, rec.id, self.read_after)
            self.mark_tangent(rec, {v: jaxpr.eqns[at[0]] for v, at in rec.out_vars.items()})
            if rec.forward:
                rec.saved = saved.get(rec.id, frozenset())
            if rec.scope.startswith(CALL) and len(rec.out_vars) > 1:
                self.call_writes_in(rec, chains)
                self.call_order(jaxpr, rec)
            if capture_stages and rec.out_vars:
                if reads is None:
                    reads = _reads(jaxpr)
                rec.out_vars = self.batch_first(jaxpr, reads, rec.out_vars)
            if capture_stages:
                items = sorted(rec.out_vars.items(), key=lambda kv: self.shown_first(kv, rec))
                # (not a mutable reference's value: a line's box `acc[...] += …` reads and
                # writes one, which a probe beside it cannot take: JAX's vjp refused it)
                items = [kv for kv in items if not _compat.touches_ref(jaxpr.eqns[kv[1][0]])]
                if not items:
                    continue
                vars_ = [v for v, _ in items]
                written = self.written(rec, vars_)
                names = leaf_names(vars_, rec.saved, written) if rec.saved or written else ()
                if reads is None:
                    reads = _reads(jaxpr)
                apart = _read_before_last(items, reads)
                self.point(rec, path, [at for _, at in items], vars_, names=names, apart=apart)
        return prod

    def stage_label(self, eqn) -> str | None:
        """The label of the stage `eqn` is (`eqn_node` gives it), or None for a plain
        equation."""
        spec = spec_of(eqn.primitive.name)
        if spec is None:
            return None
        label = spec.label(eqn.params, eqn.primitive.name)
        inner = _rejitted(eqn, spec)
        if inner is not None:  # `vmap` of `jnp.fft.rfft`: the `fft` jit's own label, `rfft`
            return self.stage_label(inner)
        if spec.construct in _LOOPS and label == spec.construct.value:
            # a lambda body that only calls a function of the user's: `scan(cell)`
            sub = eqn.params[_LOOPS[spec.construct]]
            eqns = _compat.jaxpr_and_consts(sub)[0].eqns
            if _body_is_users(eqn, sub):
                body = body_call(_compat.user_frames(eqn), [_compat.user_frames(e) for e in eqns])
                label = f"{label}({body or _only_users_jit(eqns) or ''})".removesuffix("()")
            else:  # a library's body running a function of yours: `hk.layer_stack(3)(block)`
                # (or the library's own step around your function: BlackJAX's leapfrog
                # `one_step` around your `logdensity_fn` is `fori_loop(one_step)`)
                own = function_name(sub)
                body = library_step(eqn, eqns, own) or library_loop_body(eqn, eqns, own)
                if body is None and spec.construct is Construct.WHILE:
                    # else by the body function another library handed the loop's maker
                    # (diffrax's `body_fun`, in Equinox's `lambda x: body_fun(x)`), or
                    # by the library's own one, as JAX's are (`while(body_fun)`): a bare
                    # `while` (a diffrax solve) did not say which loop it was
                    package = _compat.call_path(eqn).package
                    handed = _compat.handed_loop_body(eqns, package)
                    name = function_label(handed)[0] if handed else function_name(sub)
                    body = (name or "").lstrip("_") or None
                label = f"{label}({body})" if body else label
        if spec.construct is Construct.REMAT and "(" not in label:
            # `jax.checkpoint(lambda h, p: (block(p, h), None))`, the scan-over-layers
            # idiom: `checkpoint(block)`, so the scan around it is `scan(block)` too
            # (one holding one named scope is named by it: `_name_wrappers`)
            sub = eqn.params["jaxpr"]
            eqns = _compat.jaxpr_and_consts(sub)[0].eqns
            scopes = {scope_names(e)[:1] for e in eqns}
            if not _compat.defined_in_library(sub) and not (len(scopes) == 1 and () not in scopes):
                body = body_call(_compat.user_frames(eqn), [_compat.user_frames(e) for e in eqns])
                label = f"{label}({body})" if body else label
        if spec.construct in (Construct.SCAN, Construct.COND, Construct.WHILE):
            label = construct_label(label, _compat.call_path(eqn))
        if (
            spec.construct is Construct.JIT
            and ("transform", "transpose") in _compat.name_stack_kinds(eqn)
            and not label.endswith(BACKWARD)
        ):
            # a jitted function's backward pass, which JAX binds as a `jit` of the same
            # name: `loss (backward)`, as a call of the user's is (it read `loss#2`)
            label = f"{label}{BACKWARD}"
        if spec.construct is Construct.TESSERACT:
            label = tesseract_label(_compat.tesseract_client(eqn.params), self.tesseract_names)
            # (a program that differentiates itself calls its derivative endpoints too)
            func = eval_func(eqn.params)
            suffix = {"vector_jacobian_product": "vjp", "jacobian_vector_product": "jvp"}
            label = f"{label} ({suffix[func]})" if func in suffix else label
        # last, as what restates the function (`checkpoint(block)`) matched it bare
        return qualified(label, spec.qualifier(eqn.params) if spec.qualifier else None)

    def eqn_node(self, eqn, i, parent: _Rec, path, probe, in_custom) -> _Rec:
        name = eqn.primitive.name
        # floating outputs first, as probes take them (`diffeqsolve` showed `i32[] +8`),
        # what the stage makes before the operands it hands back unchanged, which are
        # not probed (`nnx.remat(lambda r, v: r(v))(mod.res, h)` inside `nnx.cond`: the
        # card said `f32[1] +2`, a bias, beside its output's histogram), and what the
        # program reads before what it drops (`nnx.remat` hands back the block's
        # parameters before its activation: `f32[192] +12`)
        used = self.used
        vjp = construct_of(name) is Construct.CUSTOM_VJP  # (its own: see `walk`)

        def shown_first(k: int) -> tuple[bool, bool, bool]:
            v = eqn.outvars[k]
            handed_back = not vjp and forwarded_operand(eqn, k, self.forwarding) is not None
            return (not is_floating(v.aval), handed_back, v not in used)

        outs = range(len(eqn.outvars))
        order = sorted(outs, key=shown_first) if len(outs) > 1 else outs
        # ... and not those at all while it makes something: they are its inputs, not
        # its results (`nnx.scan(nnx.remat(forward))` hands each layer's parameters
        # back, which JAX's own scan forwarding drops without the remat: the box said
        # `f32[4,8,32] +16`, the carry and the 16 stacked parameters)
        made = [k for k in order if not shown_first(k)[1]]
        order = made if made and len(made) < len(order) else order
        # (`with_sharding_constraint` by the sharding it asks: `float32[64@data,64@model]`)
        constrained = constrained_shapes(eqn)
        if constrained:
            self.constrained[eqn.outvars[0]] = constrained[0]
        shapes = constrained or tuple(shape_str(eqn.outvars[k].aval) for k in order)
        src = self.source(eqn, parent)
        spec = spec_of(name)
        if spec is None:  # an ordinary equation (its sub-programs, if any, are counted)
            primitive = _compat.primitive_label(eqn)
            # `checkpoint_name(x @ w, "proj_in")` is drawn by the name the user gave it
            # and a callback or a Pallas kernel by the function it runs: `io_callback(record)`
            label = (
                _compat.checkpoint_name_of(eqn) or _compat.called_function_label(eqn) or primitive
            )
            rec = self.new("eqn", label, parent.id, src, shapes, primitive=primitive)
            rec.site = (path, i, eqn.outvars)
            # (a kernel's body is not drawn: its stage opened to one box and said "+ 5 eqns")
            inside = () if _compat.opaque_kernel(eqn) else _compat.sub_jaxprs(eqn)
            rec.n_eqns = 1 + sum(_count_eqns(j) for _, _, j in inside)
            rec.constant = self.const(eqn)
            return rec
        label = self.stage_label(eqn)
        constant = self.const(eqn)
        primitive = name if spec.shows_primitive else None
        # `jax.pmap(f)`: a `jit` around a `shard_map` of `f`, drawn as one device map of f
        pmap = _compat.pmap_body(eqn)
        kind = spec.node_kind if pmap is None else "shard_map"
        rec = self.new(kind, label, parent.id, src, shapes, primitive=primitive)
        rec.qualifier = spec.qualifier(eqn.params) if spec.qualifier else None
        rec.constant = constant
        if pmap is not None:
            rec.user_body = pmap.users
        elif spec.construct in _LOOPS:
            sub = eqn.params[_LOOPS[spec.construct]]
            # (or a library's body doing nothing but call yours: `hk.layer_stack(block)`)
            rec.user_body = (
                _body_is_users(eqn, sub)
                or library_loop_body(eqn, _compat.jaxpr_and_consts(sub)[0].eqns, function_name(sub))
                is not None
            )
        elif spec.construct in (*_CALLS, Construct.SHARD_MAP) and len(spec.bodies) == 1:
            # your function under `jax.jit`, `jax.checkpoint`, `jax.named_call` or
            # `jax.shard_map` carries data as it does unwrapped (its residual `add`s were
            # boxes with none)
            rec.user_body = not _compat.defined_in_library(eqn.params[spec.bodies[0].param])
        if spec.construct is Construct.SOW:
            self.sows.setdefault(label, []).append(rec.id)
            self.sow_calls[rec] = eqn.params.get("index", -1)
        n_before = len(self.points)
        # A custom rule's body is probed beside the program (`graph.instrument`): its
        # stages get primal values only, which the note says once per custom call.
        inner_custom = rec if spec.custom_rule else in_custom
        if pmap is not None:  # its body, past the shard_map; JAX's axis plumbing as edges
            self.passed.update(id(e) for k, e in enumerate(pmap.jaxpr.eqns) if k in pmap.plumbing)
            at = (*path, (i, "jaxpr", None), pmap.step)
            self.walk(pmap.jaxpr, rec, at, {}, probe=probe, in_custom=in_custom)
        if rec.label.startswith("fori_loop"):  # its counter's `i + 1`, an edge, not a box
            self.passed.update(id(e) for e in _compat.loop_counter_increments(eqn))
        # (a jit holding one equation of its name, `jnp.fft.rfft`'s: one box, no level)
        hidden = restating_body(eqn, label) if pmap is None else None
        rec.n_eqns += hidden or 0
        for body in spec.bodies if pmap is None and hidden is None else ():
            self.children(rec, body, eqn, i, tuple(path), probe, inner_custom, shapes)
        if spec.custom_rule and len(self.points) > n_before:
            body_size = sum(_count_eqns(j) for _, _, j in _compat.sub_jaxprs(eqn))
            kinds = {p.kind for p in self.points[n_before:]}
            small = body_size < CUSTOM_PROBED_MIN and not kinds & {"scope", "scan", "while"}
            if small:  # an activation's rule: its outputs say it all
                del self.points[n_before:]
            # (not `jax.nn.relu`'s: the most common activation said so on every model)
            if in_custom is None and not (small and _compat.is_jax_nn_call(eqn)):
                self.custom_calls.setdefault((name, label, small), []).append(rec.id)
        return rec

    def children(self, rec, body: Body, eqn, i, path, probe, in_custom, shapes) -> None:
        """Walk the sub-program(s) in param `body.param` under `rec` (in scopes if `body.scope`)."""
        val = eqn.params[body.param]
        probed = probe and body.unprobed is None
        subs = list(enumerate(val)) if body.each else [(None, val)]
        only = _compat.platform_branch(eqn.params) if body.each else None
        if only is not None:  # `lax.platform_dependent`: the branch that runs, no scope
            subs = [(only, val[only])]
        for index, sub in subs:
            holder = rec
            if body.scope is not None and only is None:
                label = body.scope.format(i=index)
                # (not a wrapper passing the call on: Flax Linen's `branch_wrapper`)
                fn = function_name(sub) if body.each else None
                fn = None if fn and function_label(fn)[1] else fn
                holder = self.new("scope", f"{label}: {fn}" if fn else label, rec.id, rec.source)
                holder.made = True
                if body.outputs:
                    holder.shapes = shapes
            self.descend(holder, eqn, i, body.param, index, path, probed, in_custom)
            if (
                body.unprobed
                and probe
                and self.capture == "all"
                and _compat.jaxpr_and_consts(sub)[0].eqns
            ):
                self.notes.append(Note("info", holder.id, body.unprobed))

    def seeds(self, jaxpr) -> list[int]:
        """The equations of `jaxpr`'s level that build a differentiation's seed from
        constants: `jax.jacfwd`'s one-hot basis (`iota`, `eq`, `convert_element_type`,
        `split`), `jax.jacrev`'s inside `jax.hessian`, and what only reshapes them. Drawn,
        they were a box named by your line (`u_t = jax.jacfwd(model)(x, t)`: `u_t` held
        the basis, 1.0) or `jacfwd`, while the line's value was in a box of its own."""
        seeded: set[Any] = set()
        out = []
        for i, eqn in enumerate(jaxpr.eqns):
            operands = [v for v in eqn.invars if isinstance(v, _compat.Var)]
            if (
                eqn.effects
                or next(_compat.sub_jaxprs(eqn), None)
                or not all(v in seeded or id(v) in self.const_vars for v in operands)
            ):
                continue
            derived = bool(operands) and all(v in seeded for v in operands)
            if derived or _compat.call_path(eqn).names[:1] in _SEEDING:
                seeded.update(eqn.outvars)
                out.append(i)
        self.tangents.update(seeded)
        return out

    def carry_tangents(self, eqn) -> None:
        """Mark `eqn`'s outputs as tangents when it reads one (`self.tangents`); a call
        (`jax.jit`, `jax.checkpoint`) by its body's own data flow, so the primal outputs
        that JAX's JVP of a call hands back beside the tangents stay primal."""
        if not any(isinstance(v, _compat.Var) and v in self.tangents for v in eqn.invars):
            return
        spec = spec_of(eqn.primitive.name)
        if spec is not None and spec.construct in _CALLS and len(spec.bodies) == 1:
            body = _compat.jaxpr_and_consts(eqn.params[spec.bodies[0].param])[0]
            if len(body.invars) == len(eqn.invars) and len(body.outvars) == len(eqn.outvars):
                inside = {
                    b
                    for b, o in zip(body.invars, eqn.invars, strict=True)
                    if isinstance(o, _compat.Var) and o in self.tangents
                }
                for e in body.eqns:
                    if any(isinstance(v, _compat.Var) and v in inside for v in e.invars):
                        inside.update(e.outvars)
                self.tangents.update(
                    o
                    for b, o in zip(body.outvars, eqn.outvars, strict=True)
                    if isinstance(b, _compat.Var) and b in inside
                )
                return
        self.tangents.update(eqn.outvars)

    def mark_tangent(self, rec: _Rec, values: Mapping[Any, Any]) -> None:
        """Say `rec` holds derivatives (`PINN (tangent)`) when every value it hands on is
        a tangent of a `jax.jacfwd` (`u_t = jax.jacfwd(model, argnums=1)(x, t)` evaluates
        `model` along the basis; only du/dt leaves it), as `(backward)` says it of a
        backward pass. `values`: value -> the equation making it, which JAX's JVP made
        (past `jacfwd`'s end, `u_t + u` reads a tangent but is none). A box your line's
        fold made is named by what it assigns (`u_t`): that value is the derivative
        asked for."""
        if rec.made or not values or BACKWARD in rec.label or TANGENT in rec.label:
            return
        if all(v in self.tangents and _compat.under_jvp(e) for v, e in values.items()):
            rec.label += TANGENT

    def folded(
        self, jaxpr: Any, level_names: Sequence[tuple[str, ...]], unread: Collection[int]
    ) -> set[int]:
        """The equations of `jaxpr`'s level making a constant of literals alone
        (`saved.folded_constants`) that are work of the box reading them: each of their
        readers is drawn (no cast drawn as an edge) in the same scope, or is such a
        constant folded too. Not one alone in a box of its own (`init = jnp.zeros(4)`,
        a `vmap`'s `scan(update) setup`), nor one a stage hands on (a value saved for a
        backward pass): those boxes are the user's steps, or carry data."""
        found = folded_constants(jaxpr)
        if not found:
            return set()
        candidates = set(found)
        readers: dict[int, list[int]] = {i: [] for i in found}
        made = {v: i for i in found for v in jaxpr.eqns[i].outvars}
        for j, e in enumerate(jaxpr.eqns):
            for v in e.invars:
                if isinstance(v, _compat.Var) and v in made:
                    readers[made[v]].append(j)
        out: set[int] = set()
        for i in reversed(found):  # (readers first: a cast of a constant is one too)
            ok = bool(readers[i]) and all(
                level_names[j] == level_names[i]
                and j not in unread
                and (j in out or j not in candidates)
                and not (_is_type_cast(jaxpr.eqns[j]) or id(jaxpr.eqns[j]) in self.passed)
                # (nor a loop's carry: its edge is the loop's port, named by the user's
                # carry, `h` of `fori_loop(0, n, body, jnp.zeros(4))`, an NNX scan's `i`)
                and construct_of(jaxpr.eqns[j].primitive.name) not in _LOOPS
                for j in readers[i]
            )
            if ok:
                out.add(i)
        # (nor one reading a constant drawn: its box would hand its value to nothing,
        # `scale = jnp.full(...)` then a cast of it)
        for i in found:
            operands = [made.get(v) for v in jaxpr.eqns[i].invars if isinstance(v, _compat.Var)]
            if any(m is not None and m not in out for m in operands):
                out.discard(i)
        return out

    def const(self, eqn) -> bool:
        """Whether `eqn` reads only constants (then its outputs are constants too)."""
        if not all(isinstance(v, _compat.Literal) or id(v) in self.const_vars for v in eqn.invars):
            return False
        self.const_vars.update(id(v) for v in eqn.outvars)
        return True

    def descend(self, rec, eqn, i, param, index, path, probe, in_custom) -> None:
        val = eqn.params[param]
        if index is not None:
            val = val[index]
        inner = val.jaxpr if isinstance(val, _compat.ClosedJaxpr) else val
        spec = spec_of(eqn.primitive.name)
        if spec is not None and spec.construct in _CALLS and len(inner.invars) == len(eqn.invars):
            # a call's parameters are its operands (a loop's carry is not)
            for v, o in zip(inner.invars, eqn.invars, strict=True):
                if isinstance(o, _compat.Literal) or id(o) in self.const_vars:
                    self.const_vars.add(id(v))
                elif o in self.tangents:
                    self.tangents.add(v)
        reads = self.body_reads.setdefault(id(eqn), {})
        operands = _body_operands(eqn, param, inner)
        into = {v: reads.setdefault(p, []) for v, p in operands.items()}
        if not _compat.defined_in_library(val):  # (a library's names are not yours)
            names = _compat.body_arg_names(val)
            where = _compat.body_source(val)
            kind = _compat.nnx_scan_kind(eqn) if where is not None else None
            found = parameters_and_unpackings(*where) if kind else None
            if found is not None:  # NNX's own carry, named by the user's parameters
                names = frameworks.nnx_scan_names(names, kind, *found)
            if where is not None:  # `h, c = carry` names `carry[0]`, `carry[1]`
                names = unpacked_arg_names(names, *where)
            self.name_operands(eqn, operands, [frameworks.lifted_name(n) for n in names])
        at = (*path, (i, param, index))
        prod = self.walk(inner, rec, at, {}, probe=probe, in_custom=in_custom, into=into)
        # a call's, a loop's, a branch's results (a while's condition makes its test only)
        if param != "cond_jaxpr" and len(inner.outvars) == len(eqn.outvars):
            makes = self.body_makes.setdefault(id(eqn), {})
            for k, v in enumerate(inner.outvars):
                if isinstance(v, _compat.Var) and v in prod:
                    made = self.leaf_made.get(v) or [self.recs[int(prod[v][-1][1:])]]
                    makes.setdefault(k, []).extend(made)

    def name_operands(self, eqn, operands: Mapping[Any, int], names: Sequence[str]) -> None:
        """Record what `eqn`'s body calls each operand it binds (`operands`: body input ->
        operand), the first body's name where branches differ in theirs."""
        if not operands:  # (a while's condition)
            return
        named = self.operand_names.setdefault(id(eqn), {})
        for name, p in zip(names, operands.values(), strict=True):
            if name:
                named.setdefault(p, name)

    def probe_result_lines(
        self, jaxpr, boxes: Mapping[int, tuple[_Rec, _Rec]], carrying: set[str], locs, path
    ) -> None:
        """Probe the boxes with no data (equation -> its box and the module stage holding
        it) that the module's own line making the stage's result made, in a stage whose
        other boxes carry data (`carrying`: each on a line calling a submodule,
        `layer_calls`): `nnx.LSTMCell`'s `new_h = o * tanh(new_c)`, its `tanh` and `mul`,
        alone drew no data, and the hidden state read as "no data" inside the cell. A
        stage none of whose boxes carries data (`nnx.Linear`'s `dot_general`, `add`)
        keeps its data on its own box: probing its inside would cost a probe per box."""
        lines: dict[str, set[Any]] = {}  # module stage -> its result lines
        for m, (_, parent) in boxes.items():
            if parent.id not in carrying:
                continue
            at = {i for i, _ in (parent.out_vars or {}).values()}
            if m in at and locs[m] is not None:
                lines.setdefault(parent.id, set()).add(locs[m])
        for i, (rec, parent) in boxes.items():
            if locs[i] not in lines.get(parent.id, ()):
                continue
            eqn = jaxpr.eqns[i]
            made = [
                k
                for k in range(len(eqn.outvars))
                if forwarded_operand(eqn, k, self.forwarding) is None
            ]
            if made:
                self.point(rec, path, [(i, k) for k in made], [eqn.outvars[k] for k in made])

    def layer_calls(self, jaxpr, scoped, locs) -> Callable[[int], bool]:
        """Whether equation `i` is a plain function in a module's layer list
        (`jax.nn.sigmoid` among an Equinox CNN's layers): directly in a module's stage,
        made on a line that calls that module's modules (`x = layer(x)`)."""
        lines: dict[tuple[str, ...], set[Any]] = {}  # module stage -> its modules' call lines
        for i, names in enumerate(scoped):
            for p, name in enumerate(names):  # once per run of one module's equations
                if name in frameworks.pushed() and (
                    i == 0 or scoped[i - 1][: p + 1] != names[: p + 1]
                ):
                    lines.setdefault(names[:p], set()).add(
                        self.scope_source(jaxpr.eqns[i], names, p)
                    )

        def layer_call(i: int) -> bool:
            names = scoped[i]
            return (
                bool(names) and names[-1] in frameworks.pushed() and locs[i] in lines.get(names, ())
            )

        return layer_call

    def linen_scope_of(
        self,
        scope: _Rec,
        loc: _compat.SourceLocation | None,
        frames: _compat.UserFrames | None = None,
    ) -> bool:
        """Whether `scope` is the one Flax Linen pushed around a call of the module
        whose own method made the equation at `loc` (`MLP` around `MLP.__call__`'s
        `nn.tanh`; `MLP.encode` around `MLP.encode`'s): Linen names it `module.name or
        class` and a method's name after it, no wrapper of ours. Not a scope Linen
        pushed for another module (a callback of yours run inside `Dense_0`). With the
        equation's `frames`, also a plain function of yours that the method called
        (`jraph.GAT`'s closure `_ApplyGAT` in `GATLayer.__call__`): its call, which every
        equation of the stage shares, is no stage of its own, and its `messages =
        sent_attributes * weights` was a `mul` with no data among boxes with some."""
        if scope.scope is None or scope.made or scope.called or loc is None:
            return False
        # (its qualified name: `MLP.__call__`, `train.<locals>.MLP.__call__`, a closure
        # in it `MLP.__call__.<locals>.f`)
        parts = loc.function.split(".")
        owned = [k for k in range(len(parts) - 1) if parts[k] in self.linen_modules]
        if not owned:
            site = frames.calls[-1].site() if frames is not None and frames.calls else None
            return site is not None and site != loc and self.linen_scope_of(scope, site)
        owner, method = parts[owned[-1]], parts[owned[-1] + 1]
        base = scope.scope
        if method != "__call__":
            if not base.endswith(f".{method}"):
                return False
            base = base[: -len(method) - 1]
        auto = _LINEN_AUTO_NAME.fullmatch(base)  # `Dense_0`: a `Dense`'s scope
        other = auto.group(1) if auto else base
        return other == owner or other not in self.linen_modules

    def module_call(self, eqn, names: tuple[str, ...], j: int) -> tuple | None:
        """Where the module call that pushed scope `names[j]` was made: the user's lines
        from its call site outward (`q_t_target = net.apply(...)` in the loss, then the
        `hk.transform`ed function's line calling the module), innermost first; None when
        `names[j]` is no module's scope or its call site is unknown."""
        if names[j] not in frameworks.pushed() and names[j] not in frameworks.haiku_pushed():
            return self.linen_call(eqn, names, j)
        haiku = names[j] not in frameworks.pushed()
        pushed = frameworks.haiku_pushed() if haiku else frameworks.pushed()
        if names[j] not in pushed:
            return None
        r = sum(1 for n in names[j + 1 :] if n in pushed)
        # (read once per equation: asked again for each module scope it is in)
        if self.sites_of[0] is not eqn:
            self.sites_of = (eqn, {})
        sites = self.sites_of[1].get(haiku)
        if sites is None:
            sites = self.sites_of[1][haiku] = (
                _compat.haiku_call_sites(eqn)
                if haiku
                else _compat.call_sites(eqn, frameworks.CALL_CODE)
            )
        if r >= len(sites) or _compat.is_library_file(sites[r].file):
            return None  # (a library module's own call of its layers: one line)
        return _compat.user_lines_from(eqn, sites[r])

    def linen_call(self, eqn, names: tuple[str, ...], j: int) -> tuple | None:
        """`module_call` of a scope Flax Linen pushed (`_linen_label`): the user's lines
        from the line that made its call (`y = self.dense(h)`) outward; None when that
        call was made in a library (`nn.Sequential`'s layers, a lifted `nn.remat`), or
        its frame is not the one that pushed `names[j]` (the scopes and the calls'
        frames not matching one to one)."""
        label = _linen_label(names, j)
        if label is None:
            return None
        # the innermost call frame is the innermost Linen scope's call
        r = sum(1 for k in range(j + 1, len(names)) if _linen_label(names, k) is not None)
        sites = _compat.linen_call_sites(eqn)
        site = sites[r] if r < len(sites) else None
        if site is None or site not in frameworks.linen_pushed()[label]:
            return None
        if _compat.is_library_file(site.file):
            return None  # (a library module's own call of its layers: one line)
        return _compat.user_lines_from(eqn, site)

    def scope_source(
        self, eqn, names: tuple[str, ...], j: int, around: _Rec | None = None
    ) -> _compat.SourceLocation | None:
        """A module stage's or user function's call site (the line that called it);
        else the location of the scope's first equation (`source`)."""
        if names[j] in self.call_sites:
            site = self.call_sites[names[j]]
            if site is not None:
                return self.location(site)
        built = next(
            (self.built_at[m, names[j]] for m in names[:j] if (m, names[j]) in self.built_at),
            None,
        )
        if built is not None:  # (its first equation may be another line's: a plate's
            # `arange`, which JAX stages where it is first read)
            return self.location(built)
        if names[j] in frameworks.pushed():
            # The innermost wrapper frame is the innermost module scope's call.
            r = sum(1 for n in names[j + 1 :] if n in frameworks.pushed())
            sites = _compat.call_sites(eqn, frameworks.CALL_CODE)
            if r < len(sites):
                if _compat.is_library_file(sites[r].file) and around is not None:
                    # called by a library's transform (`eqx.filter_checkpoint(block)(x)`
                    # runs it in `equinox/_ad.py`): the transform's stage is the call
                    if around.kind in _TRANSFORM_KINDS and around.source is not None:
                        return around.source
                return self.location(sites[r])
            # its first equations are a function a library traced before and inlines
            # (optimistix's `BFGS.step` opens with the objective): not the call, whose
            # frame they lack; the stage around it says where it is
            if around is not None and around.source is not None:
                return around.source
        if names[j] in frameworks.haiku_pushed():
            # Haiku pushed it: the frame outside the matching call of Haiku's method
            # wrapper (`self.transformer(x)`, not the line that built the module, nor its
            # first equation's); a call in a library's module (`hk.nets.ResNet`'s
            # blocks) is found as before
            r = sum(1 for n in names[j + 1 :] if n in frameworks.haiku_pushed())
            sites = _compat.haiku_call_sites(eqn)
            if r < len(sites) and not _compat.is_library_file(sites[r].file):
                return self.location(sites[r])
        opened = scope_opened(eqn, names[j]) or derivative_site(eqn, names, j)
        return self.location(opened) if opened is not None else self.source(eqn, around)

    def source(self, eqn, around: _Rec | None = None) -> _compat.SourceLocation | None:
        """Where the user's code made `eqn`; with no line of the user's in its traceback,
        the location of the node `around` it (a library's line when there is none)."""
        if around is not None and around.source is not None:
            loc = _compat.user_location_outside_libraries(eqn, fallback=False)
            return around.source if loc is None else self.location(loc)
        return self.location(_compat.user_location_outside_libraries(eqn))

    def location(self, loc: _compat.SourceLocation | None) -> _compat.SourceLocation | None:
        if loc is None:
            return None
        key = (loc.file, loc.line, loc.function)
        cached = self.sources.get(key)
        if cached is None:  # one object per location; files relative to the cwd
            cached = self.sources[key] = _compat.SourceLocation(
                short_path(loc.file), loc.line, statement_function(loc.function)
            )
        return cached

    # -- edges -----------------------------------------------------------------
    def edge(
        self,
        src: tuple[str, ...],
        dst: tuple[str, ...],
        v: Any,
        readers: list[_Rec] | None = None,
        name: str | None = None,
    ) -> int:
        """Add the edge for `v` lifted to the sibling ancestors; return where the chains part.

        `readers`: the nodes inside `dst`'s body that read `v`, where it has one; `name`:
        what that body calls it (its port's name when the stage is opened)."""
        k = 0
        n = min(len(src), len(dst))
        while k < n and src[k] == dst[k]:
            k += 1
        if k == n:  # one node contains the other: not an edge of any level
            return k
        aval = v.aval
        typ = _value_type(v)
        retyped = self.retyped.get(id(readers))
        if retyped is not None and retyped[0] is readers:
            typ = retyped[1]  # (what the stage's work reads: the policy's cast of `v`)
        for node_id in dst[k:]:  # each reads `v` from outside itself
            self.recs[int(node_id[1:])].takes.add(typ)
        reader = self.recs[int(dst[-1][1:])]
        # the module stages it enters, each calling it by its `__call__`'s parameter
        # (`positions`) where a box made it, which names a primitive (a one-equation
        # line: `broadcast_in_dim`); a stage or an input names it as well as the
        # parameter does, so only a box outside any stage but a line's fold counts:
        # `Net/stem/add` is seen as `stem` from the block it enters, and its port says so
        params = self.params.get(v, {})
        bare = all(
            rec.kind == "eqn" or (rec.kind == "scope" and (rec.scope or "").startswith(FOLD))
            for rec in (self.recs[int(node_id[1:])] for node_id in src[k:])
        )
        entered = [
            (r, p)
            for node_id in (dst[k:] if params and bare else ())
            if (r := self.recs[int(node_id[1:])]).kind == "scope"
            and (p := params.get(r.scope) or params.get(self.unrenamed.get(r.scope)))
        ]
        # the user's `jax.vmap`ped functions it enters, each calling it by its parameter,
        # as a `jit`'s body names what it takes (`jax.vmap(loss)(params, xs)`: `x`)
        passed = self.vmapped.get(v, {})
        vmapped = [
            (r, p)
            for node_id in (dst[k:] if passed else ())
            if (r := self.recs[int(node_id[1:])]).kind == "scope"
            and (p := passed.get(self.callees.get(r.scope or "", -1)))
        ]
        for made in self.leaf_made.get(v) or [self.recs[int(src[-1][1:])]]:
            if made not in self.weights:
                for r, p in entered if made.kind == "eqn" else ():
                    self.port_names.setdefault((r, made), p)
                for r, p in vmapped:
                    self.port_names.setdefault((r, made), p)
                self.ends += [(made, r) for r in readers or [reader]]
                if name and readers:
                    key = (reader, made)
                    self.port_names[key] = joined_name(self.port_names.get(key), name)
                    self.name_ports_inside(reader, readers, made, name)
            elif name and reader.kind == "tesseract":
                # a Tesseract's field fed by a differentiated argument (`x` in `parameters`)
                # is named too: its panel lists the field beside its VJP (`x ← x`)
                self.port_names[(reader, made)] = name
        key = (src[k], dst[k])
        if key not in self.edges:
            self.edges[key] = Edge(
                key[0], key[1], typ[0], str(getattr(aval, "dtype", type(aval).__name__))
            )
        return k

    def name_within(
        self, outer: list[_Rec], stage: _Rec, inner: list[_Rec] | None, name: str | None
    ) -> None:
        """Record, for the readers `inner` of a body's operand inside `stage` (a call or
        loop in a body, reading the body's input whose readers are `outer`), that
        `stage` calls the value `name`, beside what the stages inside it call it."""
        if inner is None:  # (`stage` reads it itself: no stage inside it takes it)
            return
        deeper = self.inner_names.get(id(inner), (inner, {}))[1]
        named = self.inner_names.setdefault(id(outer), (outer, {}))[1]
        for r in inner:
            at = named.setdefault(r, {})
            at.update(deeper.get(r, {}))
            if name:
                at[stage] = joined_name(at.get(stage), name)

    def name_ports_inside(self, stage: _Rec, readers: list[_Rec], made: _Rec, name: str) -> None:
        """Name the ports of the stages inside the body of `stage` through which the
        value `made` made outside reaches its `readers`: by the innermost name it has
        there, a nested call's own parameter (`name_within`), else the name of the body
        around (`name`). Unnamed, a module's stage in a `lax.scan` body read its input
        as `encoder: Linear`, what made the loop's first carry outside the loop."""
        own = self.inner_names.get(id(readers), (readers, {}))[1]
        for r in readers:
            around: list[_Rec] = []  # r's ancestors inside `stage`, innermost first
            up = r.parent
            while up is not None and up != stage.id:
                around.append(self.recs[int(up[1:])])
                up = around[-1].parent
            if up is None:
                continue
            current = name
            for a in reversed(around):
                current = own.get(r, {}).get(a, current)
                key = (a, made)
                self.port_names[key] = joined_name(self.port_names.get(key), current)

    def leave_scopes(self, src: tuple[str, ...], k: int, v: Any, loc: dict) -> None:
        """`v`, made at `src` and read from the edge's `k`-th scope up, leaves the scopes
        below: each marks it an output. A box whose own work made `v` (`within_box`) is
        left too."""
        boxed = self.recs[int(src[-1][1:])].kind == "scope"
        if (k < len(src) - 1 or boxed) and v in loc:
            self.mark_scope_outputs(src, k, v, loc[v])
            self.read_after.update((s, v) for s in src[k:-1])

    def mark_scope_outputs(self, chain: tuple[str, ...], start: int, v: Any, at) -> None:
        """`v` leaves the scopes chain[start:-1] (the producer's enclosing scopes), and
        the producer itself when it is a box whose own work made `v` (`within_box`)."""
        recs = self.recs
        last = recs[int(chain[-1][1:])] if chain else None
        inside = chain[start:] if last is not None and last.kind == "scope" else chain[start:-1]
        for node_id in inside:
            out = recs[int(node_id[1:])].out_vars
            if out is not None and v not in out:
                out[v] = at

    def within_box(
        self, eqn: Any, i: int, chain: tuple[str, ...], prod: dict, into: Mapping, loc: dict
    ) -> bool:
        """Draw `eqn` (the level's `i`-th) as work of the innermost box open around it,
        `chain` (`unravelled_boxes`), not as a box of its own: its operands' edges go
        into the box, and the box makes its results. False, drawing nothing, when it
        reads a body's operand (whose readers are boxes)."""
        operands = [v for v in eqn.invars if isinstance(v, _compat.Var)]
        if any(v not in prod and v in into for v in operands):
            return False
        box = self.recs[int(chain[-1][1:])]
        box.n_eqns += 1
        for v in operands:
            src = prod.get(v)
            if src is None or src == chain:
                continue
            if src[: len(chain)] == chain:  # made inside the box (`u (backward)`): its output
                if v in loc:
                    self.mark_scope_outputs(src, len(chain), v, loc[v])
                continue
            k = self.edge(src, chain, v)
            self.leave_scopes(src, k, v, loc)  # (another such box's)
        for k, v in enumerate(eqn.outvars):
            prod[v] = chain
            loc[v] = (i, k)
        return True

    # -- probes ----------------------------------------------------------------
    def point(
        self, rec: _Rec, path, values, vars_, at: int | None = None, names=(), apart=False
    ) -> None:
        floating = [is_floating(v.aval) for v in vars_]
        chosen = [(ik, v) for ik, v, f in zip(values, vars_, floating, strict=True) if f]
        if not chosen:
            return
        # (apart: only floating values are sown, so it is decided on them)
        apart = apart and len({ik[0] for ik, _ in chosen}) > 1
        names = tuple(n for n, f in zip(names, floating, strict=False) if f) if names else ()
        if len(names) == len(chosen) > 1:  # sown as a dict, whose leaves come sorted by key
            names, chosen = map(tuple, zip(*sorted(zip(names, chosen, strict=True)), strict=True))
        elif not (
            len(names) == len(chosen)
            and (rec.kind == "tesseract" or names == (SAVED,) or names[0].endswith(NEW))
        ):
            # a Tesseract's one output read keeps its field's name (the panel said
            # "captured [3]", never which of its outputs that was); so does a stage's one
            # value kept for its backward pass (`saved.SAVED`), or one written to a
            # module's variable (`mean (new)`): bare, it read as the stage's result
            # (`f32[3]` for a function returning a scalar)
            names = ()
        self.points.append(
            ProbePoint(
                node=rec.id,
                path=tuple(path),
                at=max(ik[0] for ik, _ in chosen) if at is None else at,
                values=tuple(ik for ik, _ in chosen),
                shapes=tuple(shape_str(v.aval) for _, v in chosen),
                kind=rec.kind,
                names=names,
                apart=apart,
            )
        )

    def operand_point(self, rec: _Rec, path, i: int, eqn: Any, fields: dict[int, str]) -> None:
        """The point of a Tesseract's differentiable input fields (`fields`: operand
        position -> field), sown right before its call and read by it alone
        (`ProbePoint.operands`): their cotangent is the Tesseract's own VJP, beside the
        total gradient of a value the program also reads elsewhere. A field the call
        gets as a literal has no cotangent to show."""
        diff = differentiable_fields(eqn.params)
        chosen = sorted(  # (sown as a dict, whose leaves come sorted by key)
            (f"{field}{INPUT}", k)
            for k, field in fields.items()
            if field in diff
            and isinstance(eqn.invars[k], _compat.Var)
            and is_floating(eqn.invars[k].aval)
        )
        if chosen:
            self.operand_points.append(
                ProbePoint(
                    node=rec.id,
                    path=tuple(path),
                    at=i,
                    values=tuple((i, k) for _, k in chosen),
                    shapes=tuple(shape_str(eqn.invars[k].aval) for _, k in chosen),
                    kind=rec.kind,
                    names=tuple(name for name, _ in chosen),
                    operands=True,
                )
            )

    def shown_first(self, kv: tuple, rec: _Rec) -> tuple:
        """The order of a scope's outputs: its outputs before what it keeps for a
        backward pass (`saved.saved_for_backward`), what the program reads on first (a
        BatchNorm's activations, not its new running mean, only handed back as state;
        a Dropout's output, not its RNG counter; `_feeding_after`: Haiku's `hk.BatchNorm`
        reads its EMA's `hidden` only for its `average`, and the card said `f32[1,8]`
        beside the logits' histogram), floating values before others, a `jax.jvp`'s
        primal before its tangent (`_jvp_tangents`), then program order. The card's type
        is then the output its face shows."""
        v, at = kv
        return (
            v in rec.saved,
            self.moved.get(v, v) in self.call_writes.get(rec.id, ()),
            not is_floating(v.aval),
            self.returned_at(rec, v),
            v in self.jvp_tangents,  # (primal first, as `jax.jvp` returns them)
            (rec.id, v) not in self.read_after and v not in self.feeding.get(rec.id, ()),
            v not in self.read,
            at,
        )

    def batch_first(self, jaxpr: Any, reads: Mapping, out_vars: dict) -> dict:
        """A scope's outputs (value -> where made), each made under `jax.vmap` with its
        batch axis elsewhere replaced by the value `vmap` moves it to (read only by that
        `transpose`, `_compat.moves_batch_axis`): the shape the user sees there, the
        statistics the same. A value that no module call's result names (`returns`),
        made in a loop's body that `vmap` batched by tracing it again, takes the place
        its equation's origin had there (`_compat.Origin`): an `LSTMCell` in a
        `lax.scan` under `jax.vmap` numbers `h` first, as it returns it."""
        out = {}
        for v, at in out_vars.items():
            if v not in self.returns and at[0] >= 0:
                origin = _compat.eqn_origin(jaxpr.eqns[at[0]], at[1])
                if origin in self.returns:
                    self.returns[v] = self.returns[origin]
                if v not in self.writes and origin in self.writes:
                    self.writes[v] = self.writes[origin]
            readers = reads.get(v, ())
            if len(readers) == 1 and _compat.moves_batch_axis(move := jaxpr.eqns[readers[0]]):
                self.moved[move.outvars[0]] = v
                v, at = move.outvars[0], (readers[0], 0)
            out[v] = at
        return out

    def returned_at(self, rec: _Rec, v: Any) -> float:
        """Where `v` sits in the result of the module call that `rec` is the stage of
        (`frameworks.named` records it), or after every such place: a stage numbers its
        outputs in the order its call returns them, not in the order the program makes
        them."""
        places = self.returns.get(self.moved.get(v, v))
        if places:
            for name in (rec.scope, self.unrenamed.get(rec.scope)):
                if name in places:
                    return places[name]
        return self.call_places.get(rec.id, {}).get(self.moved.get(v, v), math.inf)

    def written(self, rec: _Rec, values: Sequence[Any]) -> dict[Any, str]:
        """Those of `values` (outputs of `rec`'s stage) that its module call left in the
        module's variables and does not return, each with its variable's path in the
        module (`frameworks.named` records them): a BatchNorm's new running statistics
        (`mean`, `bn1.var` for a block holding it), state, not the call's result."""
        out = {}
        if rec.id in self.call_writes:  # a function of the user's calling the module
            writes = self.call_writes[rec.id]
            return {v: writes[k] for v in values if (k := self.moved.get(v, v)) in writes}
        names = (rec.scope, self.unrenamed.get(rec.scope))
        for v in values:
            key = self.moved.get(v, v)
            if any(n in self.returns.get(key, ()) for n in names):
                continue  # (a value a call assigns and returns too is its result)
            paths = self.writes.get(key, {})
            path = next((paths[n] for n in names if n in paths), None)
            if path is not None:
                out[v] = path
        return out

    def write_lines(self, jaxpr: Any, scoped: Sequence[tuple[str, ...]]) -> list[str | None]:
        """Per equation of `jaxpr`'s level, the run it is in of a module's own statement
        making a value that the module, whose scope holds the statement directly,
        assigns to one of its variables (`frameworks.named` records them): the label of
        that run's box, its variable's name (`mean (new)`: Flax's `ra_mean.value =
        momentum * ra_mean.value + (1 - momentum) * mean`), and the run's key; else None.
        The run ends at the equation making the value and goes back over the equations
        of the same statement in the same scope (`fold_names`' `writes`)."""
        out: list[str | None] = [None] * len(jaxpr.eqns)
        if not self.writes:
            return out

        def statement(m: int) -> tuple[str, int] | None:
            loc = _compat.user_location(jaxpr.eqns[m])  # (the library's own line)
            return None if loc is None else (loc.file, statement_line(loc.file, loc.line))

        for i, eqn in enumerate(jaxpr.eqns):
            scope = scoped[i]
            if not scope or out[i] is not None:
                continue
            names = (scope[-1], self.unrenamed.get(scope[-1]))
            path = None
            for v in eqn.outvars:
                paths = self.writes.get(v, {})
                path = next((paths[n] for n in names if n in paths), None)
                if path is not None and not any(n in self.returns.get(v, ()) for n in names):
                    break  # (a value the call returns too is its result: `written`)
                path = None
            line = statement(i) if path is not None else None
            if path is None or line is None:
                continue
            key = f"{written_label(path)}\x01{i}"
            j = i
            while j >= 0 and out[j] is None and scoped[j] == scope and statement(j) == line:
                out[j] = key
                j -= 1
        return out

    def call_writes_in(self, rec: _Rec, chains: Sequence[tuple[str, ...]]) -> None:
        """Record, into `call_writes`, the outputs of the user's function call `rec` that
        a module call inside it left in its module's variables and did not return: a KV
        cache that `decode_step(model, token, pos)` has `model` write. They are state,
        not what the function returns, so its stage names them as the module's stage
        does, by the path of the outermost module inside the call
        (`layers[0].attn.cached_key (new)`), after what it returns: numbered in program
        order, the cache writes came first and the stage's face showed a mostly unwritten
        cache instead of its logits."""
        recs = self.recs
        out: dict[Any, str] = {}
        for v, (i, _) in rec.out_vars.items():
            paths = self.writes.get(v)
            if not paths or i < 0:
                continue
            chain = chains[i]
            inner = chain[chain.index(rec.id) + 1 :] if rec.id in chain else ()
            for node in inner:  # outermost first: its path names the variable whole
                scope = recs[int(node[1:])].scope
                if any(n in self.returns.get(v, ()) for n in (scope, self.unrenamed.get(scope))):
                    break  # (a value the module call returns is its result, not state)
                path = paths.get(scope) or paths.get(self.unrenamed.get(scope))
                if path is not None:
                    out[v] = path
                    break
        if out:
            self.call_writes[rec.id] = out

    def call_order(self, jaxpr: Any, rec: _Rec) -> None:
        """Where each output of the user's function call `rec` sits in what the function
        returns, read from its source (`return y, cache`, each made on a line assigning
        one of those names), into `call_places`; nothing unless every output is placed:
        the traced program keeps no order of a plain function's results, only the order
        it made them in. Outputs in one place (the leaves of `new_state = {"s": s + 1,
        "t": t + 1}`) keep that order among themselves."""
        site = self.call_sites.get(rec.scope)
        label = rec.scope[len(CALL) :].split("\x01", 1)[0]
        if site is None or label.endswith(BACKWARD):
            return
        places: dict[Any, int] = {}
        for v, (i, _) in rec.out_vars.items():
            if v in rec.saved:  # kept for a backward pass, not returned
                continue
            frames = _compat.user_frames(jaxpr.eqns[i])
            call = next(
                (
                    c
                    for c in (frames.calls if frames else ())
                    if c.site() == site and user_call_label(c) == label
                ),
                None,
            )
            here = call.here() if call is not None else None
            place = (
                returned_place(here.file, here.line, call.column())
                if call is not None and here is not None
                else None
            )
            if place is None:
                return
            places[v] = place
        self.call_places[rec.id] = places

    # -- result ----------------------------------------------------------------
    def finish(self, root: _Rec, title: str) -> StageGraph:
        recs = self.recs
        for rec in recs:
            if rec.out_vars is not None:  # scopes: their outputs as `shown_first` orders them
                items = sorted(rec.out_vars.items(), key=lambda kv: self.shown_first(kv, rec))
                # what a module's call returns, not the state it writes (a BatchNorm's
                # `f32[16,8] +2` said nothing of its new statistics: its probes name them)
                written = self.written(rec, [v for v, _ in items])
                items = [kv for kv in items if kv[0] not in written] or items
                # (a line's box `h = with_sharding_constraint(h, ...)` shows the placement
                # its equation asks: on an Auto mesh no type says it, and the box read
                # `f32[32,64]` where its one equation read `f32[32@data,64@model]`)
                rec.shapes = tuple(self.constrained.get(v) or shape_str(v.aval) for v, _ in items)
        _name_wrappers(recs)
        seen: dict[tuple[str | None, str], int] = {}
        # A line rebinding an argument drawn beside it counts after it: `x = x.astype(...)`
        # was drawn `x` like the argument `x`, its probe path `x#5` (the paths number
        # every sibling: after a loop's passes `x#2`..`x#4`). A scope the user named
        # (`jax.named_scope("mask")`) keeps its name: `expect_nonfinite` names it so.
        args = {(rec.parent, rec.label) for rec in recs if rec.kind == "input"}
        # A stage's label used again among its siblings: `mlp#2`, and `block#2` for a
        # `jax.jit` or `jax.checkpoint` called again (so each can be named, `probe`).
        # Boxes of lines of one label (what the lines assign) from several lines, one of
        # them run again (a loop's), are named by their lines: `h = layer(h)` in a loop
        # with casts between read `h`, `h#2`..`h#4`, a number counting the line before
        # the loop and the loop's passes alike; now `h (line 12)`, `h (line 17)`, `h
        # (line 17)#2` (a line's next pass, so a loop's passes stay alike: `repeats`).
        # Lines each run once keep the index (`h`, `h#2`), as calls do.
        by_line: dict[tuple[str | None, str], Counter[int]] = {}
        for rec in recs:
            if rec.kind in STAGE_KINDS and _line_label(rec) is not None:
                key = (rec.parent, rec.label)
                by_line.setdefault(key, Counter())[rec.source.line] += 1  # type: ignore[union-attr]
        lined_keys = {k for k, c in by_line.items() if len(c) > 1 and max(c.values()) > 1}
        for rec in recs:
            if rec.kind in STAGE_KINDS:
                key = (rec.parent, rec.label)
                lined = _line_label(rec) if key in lined_keys else None
                if lined is not None:
                    key = (rec.parent, lined)
                    k = seen[key] = seen.get(key, 0) + 1
                    rec.label = lined if k == 1 else f"{lined}#{k}"
                    continue
                k = seen[key] = seen.get(key, 1 if rec.made and key in args else 0) + 1
                if k > 1:
                    rec.label = f"{rec.label}#{k}"
        recs = repeats.merge(self)  # identical blocks in a row: one stacked node each
        for rec in reversed(recs):  # children come after parents: sum upwards
            if rec.parent is not None:
                recs[int(rec.parent[1:])].n_eqns += rec.n_eqns
        repeats.open_model(recs, root)
        echoes = _echoes(recs, self.points)
        port_names: dict[str, dict[str, str]] = {}
        for (stage, made), name in self.port_names.items():
            at = port_names.setdefault(echoes.get(stage.id, stage.id), {})
            at.setdefault(echoes.get(made.id, made.id), name)
        nodes = tuple(
            Node(
                id=r.id,
                label=r.label,
                kind=r.kind,
                parent=echoes.get(r.parent, r.parent),
                order=r.order,
                source=r.source,
                shapes=r.shapes,
                primitive=r.primitive,
                n_eqns=r.n_eqns,
                collapsed=r.collapsed,
                repeats=r.repeats,
                blocks=tuple(b.id for b in r.blocks),
                reads=tuple([i.id for i in r.reads]) if r.reads else (),
                # (after `repeats.merge` renumbered every record: final orders)
                read_at=tuple(e.order for e in r.read_by),
                port_names=tuple(port_names.get(r.id, {}).items()),
                static_inputs=r.statics,
                var_type=r.var_type,
            )
            for r in recs
            if r.id not in echoes
        )
        notes = list(self.notes)
        # Said once, on the outermost such stage (a train step's `loss`, not its layers).
        labels = {r.id: r.label for r in recs}
        notes += [
            Note(
                "info",
                r.id,
                # the backward stage its edges reach, not one named alike (`u_net#3`'s
                # is `u_net (backward)#2`)
                saved_note(
                    r.label, len(r.saved), len(r.out_vars or ()), readers(r.id, self.edges, labels)
                ),
            )
            for r in recs
            if r.saved and not any(a.saved for a in _ancestors(recs, r))
        ]
        for (prim, label, small), ids in self.custom_calls.items():
            note = _CUSTOM_OUTPUTS_NOTE if small else _CUSTOM_NOTE
            msg = note.format(n=len(ids), prim=prim, label=label, where=call_places(recs, ids))
            notes.append(Note("info", ids[0], msg, derivatives=True))
        points = sorted(self.points, key=lambda p: int(p.node[1:]))
        edges = tuple(
            replace(e, source=echoes.get(e.source, e.source), target=echoes.get(e.target, e.target))
            if e.source in echoes or e.target in echoes
            else e
            for e in self.edges.values()
        )
        ends = [(echoes.get(s.id, s.id), echoes.get(t.id, t.id)) for s, t in self.ends]
        return StageGraph(
            title=title,
            root=root.id,
            nodes=nodes,
            edges=_with_ends(edges, ends, {n.id: n.parent for n in nodes}),
            probe_points=tuple(points),
            operand_points=tuple(self.operand_points),
            sow_nodes={k: v[0] for k, v in self.sows.items()},
            sow_nodes_all={k: tuple(v) for k, v in self.sows.items()},
            sow_calls={r.id: call for r, call in self.sow_calls.items()},
            notes=tuple(notes),
            constant_nodes=frozenset(r.id for r in recs if r.constant),
            input_readers={
                k: frozenset(echoes.get(r, r) for r in v) for k, v in self.input_readers.items()
            },
            module_roots=frozenset(
                echoes.get(r.id, r.id) for r in recs if r.kind == "scope" and r.scope in self.roots
            ),
        )


def _linen_label(names: tuple[str, ...], j: int) -> str | None:
    """The label of the Flax Linen module call whose scope `names[j]` is
    (`frameworks.linen_pushed`), or None."""
    return names[j] if names[j] in frameworks.linen_pushed() else None


#: Marks a later call's scope of a Linen module called from several lines in a row
#: (`split_linen_calls`), while `group_calls` runs
_LINEN_AGAIN = "\x13"


def split_linen_calls(scoped: list[tuple[str, ...]], call: Callable) -> list[tuple[str, ...]]:
    """`scoped` with the scope of each call of a Flax Linen module named apart from the
    call before it when the two were made from different lines (`call(i, names, j)`:
    `_Builder.module_call` of equation `i`'s scope `names[j]`; None, unknown, continues
    the call): `h = self.dense(x)` then `y = self.dense(h)` push one scope `dense` twice
    in a row, one run, within which `group_calls` would find two calls of yours
    (`Block`, `Block#2` inside one `block`). Calls from one line (a Python loop's) keep
    one scope. Marked with `_LINEN_AGAIN`, which the caller takes off after."""
    if not frameworks.linen_pushed():
        return scoped
    out = list(scoped)
    # depth -> (the run's scope names so far, its call, how many calls it had)
    runs: dict[int, tuple[tuple[str, ...], tuple, int]] = {}
    for i, names in enumerate(scoped):
        new: list[str] = []
        for j, name in enumerate(names):
            now = call(i, names, j) if name in frameworks.linen_pushed() else None
            run = runs.get(j)
            if run is not None and run[0] == names[: j + 1]:
                k = run[2]
                if now is not None and run[1] is not None and now != run[1]:
                    k += 1  # another call, from another line
                    runs = {d: r for d, r in runs.items() if d < j}
                runs[j] = (names[: j + 1], now if now is not None else run[1], k)
            else:
                runs = {d: r for d, r in runs.items() if d < j}
                runs[j] = (names[: j + 1], now, 1)
            k = runs[j][2]
            new.append(name if k == 1 else f"{name}{_LINEN_AGAIN}{k}")
        runs = {d: r for d, r in runs.items() if d < len(names)}
        out[i] = tuple(new)
    return out


def name_by_line(rec: _Rec, call: tuple, other: tuple, locate: Callable) -> None:
    """Label a module's stage by what the line calling it assigns (`q_t_target:
    q_network`), its source that line: the outermost of its `call`'s lines that differs
    from `other`'s (the same module's call from another line); unchanged when that line
    assigns nothing (`return net.apply(...)`), or when it is already so named."""
    if ": " in rec.label:
        return
    mine, theirs = call[::-1], other[::-1]  # outermost first
    k = 0
    while k < min(len(mine), len(theirs)) and mine[k] == theirs[k]:
        k += 1
    if k == len(mine):
        return
    target = assigned(mine[k][0], mine[k][1])
    if target:
        rec.label = f"{target}: {rec.label}"
        rec.source = locate(_compat.SourceLocation(*mine[k]))
        rec.by_line = True


_INDEX_TOKEN = re.compile(r"\[(\d+)\]")


def unpacked_leaves(groups: list, where: tuple[str, int, str] | None) -> list:
    """`input_groups`' groups with each element of a tuple argument that the function
    unpacks on its top lines (`done, action, value, reward, log_prob, obs = traj`)
    named by its index and the name it unpacks to: `traj[4] (log_prob)`, as a loop's
    ports are (`unpacked_arg_names`), the index kept (it is the argument's path)."""
    if where is None:
        return groups
    file, line, function = where
    # (JAX records the traced function as `loss_fn (traced by sowviz)`)
    found = parameters_and_unpackings(file, line, function.partition(" (")[0])
    if not found or not found[1]:
        return groups
    out = []
    for arg, items in groups:
        renamed = []
        for k, name, tokens in items:
            targets = found[1].get(name)
            m = _INDEX_TOKEN.fullmatch(tokens[0]) if targets and tokens else None
            if m is not None and int(m.group(1)) < len(targets):
                tokens = [f"{tokens[0]} ({targets[int(m.group(1))]})", *tokens[1:]]
            renamed.append((k, name, tokens))
        out.append((arg, renamed))
    return out
