"""Insert `sow` equations at probe points, inside nested jaxprs where the points live.

The rewrite is jaxpr surgery, not re-tracing: after the equation `at` of the
jaxpr a `ProbePoint.path` leads to, one `sow` equation takes the point's values
and gives fresh variables that every later use reads instead (so the cotangent a
probe sees is the whole cotangent flowing back into the values from after the
point; a user's `sow` is read on likewise). Enclosing equations keep their params except for the rewritten
sub-jaxpr and gain the capture effect. Names, name stacks and source info of
every existing equation are untouched; a `sow` carries the source info of the
equation it follows. A `sow` is an identity, so no aval changes anywhere.

Two exceptions keep a probe out of the data flow, where a tangent through it would
be wrong or lost: a value that cannot reach the differentiated output (`detached`,
from `_liveness`) is sown through a `stop_gradient` and the program reads on the
original; and a custom-rule call's body, which differentiation never runs, is
evaluated a second time beside the call, probed, on its operands through
`stop_gradient` (`_beside_custom`). Both record primal values only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from .. import _compat
from ..capture import primitive as _sow
from ..primitives import spec_of
from .model import ProbePoint, operands_name

#: per sub-program path, the values that reach the differentiated outputs
#: (`_liveness.live_values`); None: every value is sown in the data flow
Detached = dict[tuple, set] | None

_BAD_STEP = "instrument: probe point {node!r}: step {step} does not match the program ({why})."
_BAD_VALUE = (
    "instrument: probe point {node!r}: value {value} is not an output of an equation at "
    "or before eqn {at} of its jaxpr."
)


def instrument(
    closed_jaxpr: _compat.ClosedJaxpr,
    probe_points: Sequence[ProbePoint],
    *,
    tag: str,
    detached: Detached = None,
) -> Callable[..., list]:
    """A function of the flat inputs that runs the program with a `sow` at every point.

    The sow of a point is named by the point's node id and tagged `tag`. The
    function is jittable and differentiable and returns the program's outputs
    as a list, bit for bit. The rewrite happens when the function is traced (and
    is cached): a `sow`'s effects depend on whether a capture is tracing it.

    `detached` (per sub-program path, as `_liveness.live_values` gives: the values
    that reach the differentiated outputs) sows every *other* value through a
    `stop_gradient`, beside the program rather than in its data flow: its primal is
    recorded, and no tangent or cotangent is made for a value that cannot have one.
    """
    points = list(probe_points)
    # Rewrite once now, so bad points fail here rather than at the first call.
    cache: dict[Any, _compat.ClosedJaxpr] = {
        _context_key(): instrument_jaxpr(closed_jaxpr, points, tag=tag, detached=detached)
    }

    def instrumented(*args: Any) -> list:
        key = _context_key()
        closed = cache.get(key)
        if closed is None:
            closed = instrument_jaxpr(closed_jaxpr, points, tag=tag, detached=detached)
            cache[key] = closed
        return _compat.eval_jaxpr(closed.jaxpr, closed.consts, *args)

    instrumented.probe_points = tuple(points)  # type: ignore[attr-defined]
    return instrumented


def instrument_jaxpr(
    closed_jaxpr: _compat.ClosedJaxpr,
    probe_points: Sequence[ProbePoint],
    *,
    tag: str,
    detached: Detached = None,
) -> _compat.ClosedJaxpr:
    """The instrumented program as a ClosedJaxpr with the same signature.

    Its `sow` equations carry the effects a `sow` traced right now would carry.
    """
    if not probe_points:
        return closed_jaxpr
    points = [part for p in probe_points for part in p.parts()]
    jaxpr = _rewrite(closed_jaxpr.jaxpr, points, 0, tag, detached)
    return closed_jaxpr.replace(jaxpr=jaxpr)


def _context_key() -> Any:
    flag = getattr(_compat, "capturing", None)
    return None if flag is None else bool(flag.value)


def _rewrite(
    jaxpr: _compat.Jaxpr, points: list[ProbePoint], depth: int, tag: str, detached: Detached
):
    here: dict[int, list[ProbePoint]] = {}
    below: dict[int, dict[tuple[str, int | None], list[ProbePoint]]] = {}
    before: dict[int, list[ProbePoint]] = {}  # operands, sown right before their reader
    for p in points:
        if len(p.path) == depth:
            (before if p.operands else here).setdefault(p.at, []).append(p)
        else:
            i, param, index = p.path[depth]
            below.setdefault(i, {}).setdefault((param, index), []).append(p)

    eqns = jaxpr.eqns
    subst: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return subst.get(v, v) if isinstance(v, _compat.Var) else v

    new_eqns: list = []
    path = points[0].path[:depth]
    live = None if detached is None else detached.get(path, set())
    for p in here.get(-1, ()):  # inputs, sown before the first equation
        new_eqns += _sow_eqns(p, jaxpr, -1, read, subst, tag, None, live)
    for i, eqn in enumerate(eqns):
        if subst:
            eqn = _compat.replace_eqn(eqn, invars=[read(v) for v in eqn.invars])
        if i in below:
            spec = spec_of(eqn.primitive.name)
            if spec is not None and spec.custom_rule:
                new_eqns += _beside_custom(eqn, below[i], depth, tag)
            else:
                eqn = _rewrite_eqn(eqn, below[i], depth, tag, detached)
        for p in before.get(i, ()):
            made, eqn = _operand_sows(p, eqns[i], eqn, tag, live)
            new_eqns += made
        new_eqns.append(eqn)
        if eqn.primitive is _sow.sow_p and not eqn.params["mode"]:
            # A sow whose value the program reads on unsown (Flax NNX's `self.sow(...,
            # h)` stores the sown copy; the module computes on with `h`): later reads
            # read the sown value, so its cotangent is the whole one flowing into `h`,
            # not the zero of a stored copy. (`sow` is an identity.) Not a sow already
            # differentiated inside `fn` (its `mode` holds roles: a `jax.grad` in `fn`):
            # there the other reads of its input are JAX's derivative rules' (exp's JVP
            # reuses exp's output), and reading them from the sow added the inner
            # backward pass to its cotangent (-1.58 for -1.97).
            for v, out in zip(eqns[i].invars, eqn.outvars, strict=True):
                if isinstance(v, _compat.Var):
                    subst[v] = out
        for p in here.get(i, ()):
            new_eqns += _sow_eqns(p, jaxpr, i, read, subst, tag, eqn.source_info, live)
    if not here and not below and not before and not subst:
        return jaxpr
    return _compat.replace_jaxpr(
        jaxpr,
        eqns=new_eqns,
        outvars=[read(v) for v in jaxpr.outvars],
        # (a level whose only change is reading on a user's sow gains no sow of ours)
        effects=jaxpr.effects | _sow_effects(tag) if here or below or before else jaxpr.effects,
        debug_info=jaxpr.debug_info,
    )


def _beside_custom(eqn, groups, depth: int, tag: str) -> list:
    """Equations evaluating the body of custom-rule call `eqn`, probed, beside it: on
    its operands through `stop_gradient`, its results unread. Under differentiation
    JAX runs the rule (a `custom_vjp`'s forward function, a `custom_jvp`'s JVP), never
    this body, so a probe inside it would see nothing; beside the call it records the
    primal values the body computes (tangents and cotangents it cannot have). The
    body's own custom calls are evaluated beside it the same way."""
    ((param, index), pts), *more = groups.items()
    body = eqn.params.get(param)
    if more or index is not None or not isinstance(body, _compat.ClosedJaxpr):
        step = pts[0].path[depth]
        raise ValueError(
            _BAD_STEP.format(node=pts[0].node, step=step, why="not a custom call's one body")
        )
    probed = body.replace(jaxpr=_rewrite(body.jaxpr, pts, depth + 1, tag, None))
    made, ins = [], []
    for v in eqn.invars:
        dtype = getattr(v.aval, "dtype", None)
        if isinstance(v, _compat.Literal) or dtype is None:
            ins.append(v)
        elif not jax.numpy.issubdtype(dtype, jax.numpy.inexact):
            ins.append(v)
        else:
            stop, held = _compat.stop_gradient_eqn(v, eqn.source_info)
            made.append(stop)
            ins.append(held)
    return [*made, _compat.closed_call_eqn(probed, ins, eqn.source_info)]


def _rewrite_eqn(eqn, groups, depth: int, tag: str, detached: Detached):
    name = eqn.primitive.name
    params = dict(eqn.params)
    for (param, index), pts in groups.items():
        node = pts[0].node
        step = pts[0].path[depth]
        if param not in params:
            raise ValueError(
                _BAD_STEP.format(node=node, step=step, why=f"`{name}` has no `{param}`")
            )
        val = params[param]
        item = val if index is None else val[index]
        is_closed = isinstance(item, _compat.ClosedJaxpr)
        inner = item.jaxpr if is_closed else item
        if not isinstance(inner, _compat.Jaxpr):
            raise ValueError(
                _BAD_STEP.format(node=node, step=step, why=f"`{param}` is not a jaxpr")
            )
        new_inner = _rewrite(inner, pts, depth + 1, tag, detached)
        new_item = item.replace(jaxpr=new_inner) if is_closed else new_inner
        if index is None:
            params[param] = new_item
        else:
            seq = list(val)
            seq[index] = new_item
            params[param] = type(val)(seq)
    return _compat.replace_eqn(eqn, params=params, effects=eqn.effects | _sow_effects(tag))


def _sow_eqns(p: ProbePoint, jaxpr, at: int, read, subst, tag: str, source_info, live):
    """The `sow` of point `p` (after the `stop_gradient`s of its values outside `live`,
    when given: those are sown beside the program, which reads on the originals)."""
    # A value (i, k) is output k of eqn i, or input k of the jaxpr for i == -1.
    eqns = jaxpr.eqns
    olds = []
    for i, k in p.values:
        outs_i = jaxpr.invars if i == -1 else eqns[i].outvars if 0 <= i < len(eqns) else ()
        if i > at or k >= len(outs_i):
            raise ValueError(_BAD_VALUE.format(node=p.node, value=(i, k), at=at))
        olds.append(outs_i[k])
    made, ins, outs = [], [], []
    for old in olds:
        new = _compat.new_var(old.aval)
        if live is not None and old not in live:
            stop, held = _compat.stop_gradient_eqn(read(old), source_info)
            made.append(stop)
            ins.append(held)
        else:
            ins.append(read(old))
            subst[old] = new
        outs.append(new)
    return [*made, _sow_eqn(p, ins, outs, tag, source_info)]


def _operand_sows(p: ProbePoint, original, eqn, tag: str, live) -> tuple[list, Any]:
    """The `sow` of operands `p.values` of `eqn` (equation `p.at`, as `original` read
    them before any rewrite), and `eqn` reading the sown copies (`_compat.copy_eqn`)
    in their place. No other equation reads them, so the cotangent each copy gets is `eqn`'s alone (a
    Tesseract's VJP for that input field). An operand outside `live` is sown beside the
    program (`_sow_eqns`), and `eqn` reads on the original."""
    invars = list(eqn.invars)
    made, ins, outs = [], [], []
    for _, k in p.values:
        old, now = original.invars[k], invars[k]
        new = _compat.new_var(old.aval)
        if live is not None and old not in live:
            stop, held = _compat.stop_gradient_eqn(now, eqn.source_info)
            made.append(stop)
            ins.append(held)
        else:
            # (through a copy: a sow of `now` itself hands its cotangent to every read
            # of `now`, `_compat.read_on_through`, the total gradient again)
            copy, held = _compat.copy_eqn(now, eqn.source_info)
            made.append(copy)
            ins.append(held)
            invars[k] = new
        outs.append(new)
    sow = _sow_eqn(p, ins, outs, tag, eqn.source_info)
    return [*made, sow], _compat.replace_eqn(eqn, invars=invars)


def _sow_eqn(p: ProbePoint, ins: list, outs: list, tag: str, source_info):
    """The `sow` equation of point `p`, of values `ins` made anew as `outs`."""
    template, effects = _template(tag, len(ins), p.names)
    params = dict(template)
    params["name"] = operands_name(p.node) if p.operands else p.node
    if p.mapped:  # (joined with its twin as one row per element: `graph.batched_map`)
        params["vmapped"] = (p.mapped,)
    if "index" in params and hasattr(_sow, "_next_index"):
        params["index"] = _sow._next_index()
    return _compat.new_eqn(ins, outs, _sow.sow_p, params, effects, source_info)


def _sow_effects(tag: str) -> Any:
    return _template(tag, 1)[1]


_templates: dict[Any, tuple[dict[str, Any], Any]] = {}


def _template(tag: str, n: int, names: tuple[str, ...] = ()) -> tuple[dict[str, Any], Any]:
    """Params of a `sow` of `n` float arrays (a bare array for n == 1, a dict keyed
    by `names` when given, else a list).

    Traced once (per tracing context) through the public `sow`, so params and
    effects stay whatever the capture engine's primitive gives; only `name` (and
    the serial `index`) change per point.
    """
    key = (tag, n, names, _context_key())
    found = _templates.get(key)
    if found is None:
        dummy = jax.ShapeDtypeStruct((), jax.numpy.float32)

        def one(*xs):
            tree = dict(zip(names, xs, strict=True)) if names else xs[0] if n == 1 else list(xs)
            return _sow.sow(tree, "template", tag=tag)

        with _sow.sows_called():  # not a sow of the user's
            closed = jax.make_jaxpr(one)(*[dummy] * n)
        (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive is _sow.sow_p]
        found = _templates[key] = (dict(eqn.params), eqn.effects)
    return found
