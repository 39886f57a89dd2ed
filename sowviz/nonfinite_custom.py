"""Which equation inside a `jax.custom_jvp` / `jax.custom_vjp` function, or a solver
(`lax.custom_root`, `lax.custom_linear_solve`), made the NaN/Inf that `locate` found at
its call.

`locate`'s re-run probes the program JAX traced, where a custom function is one
equation. Its rules are Python functions JAX traces only while it differentiates,
and under differentiation its body does not run (the rules do), so no probe can
sit inside either. Once `locate` names such a call, `inside_custom` reads the values
at the call (its operands; their tangents in mode jvp; its outputs' cotangents in
modes grad and vjp: the program run once more with a `sow` before and after the call,
`_values_at`) and evaluates on them, one equation at a time, what ran there:

* a non-finite value: the body (`custom_call_body`), as the primal program runs it;
* a non-finite tangent: `jax.jvp` of the call, which runs the JVP rule;
* a non-finite cotangent: `jax.vjp` of the call, then its pullback on the cotangents:
  a `custom_vjp`'s forward rule (residuals) and backward rule, or a `custom_jvp`'s JVP
  rule linearized and transposed.

A solver's non-finite value is looked for in its solve; a tangent or cotangent in its
derivative, `jax.jvp` / `jax.vjp` of the call traced and replayed (`_in_solver`).

The first equation whose floating inputs are all finite and whose output is not is the
one named, with the user's line that wrote it ("`div` in the backward rule of `my_log`
at model.py:10"): `nonfinite_replay`, which enters a custom function called in there
(the rule calling `f(x)` for its primal), a `jit` (`jnp.clip`), a solver and a loop
(one iteration at a time) to name the primitive inside.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from . import _compat
from .graph.model import ProbePoint
from .nonfinite_replay import Inner, by_function, first_bad, in_solver

#: The capture tag of the sows at the call (sowviz's own: `capture.primitive`).
TAG = "sowviz.locate_custom"
_OPERANDS, _OUTPUTS = "operands", "outputs"
#: The solvers entered like custom calls (as `primitive_label` names them): JAX 0.12's
#: `custom_root` (a custom function before) and `custom_linear_solve`.
SOLVERS = frozenset({"custom_root", _compat.LINEAR_SOLVE})
#: How many loop iterations are searched when the origin's iteration is unknown.
_MAX_ROWS = 64


def inside_custom(
    fn: Callable,
    args: Sequence[Any],
    options: Any,
    traced: Any,
    node: str,
    label: str,
    made: str,
    iteration: tuple[int, ...] = (),
) -> Inner | None:
    """The equation inside custom call `node` (labelled `label`) that made its non-finite
    `made` ("value", "tangent" or "cotangent"), at the loop `iteration` holding it when
    known; None when `node` is no custom call or nothing inside it is found."""
    call = _call_of(traced, node)
    if call is None:
        return None
    path, index, eqn = call
    values = _values_at(fn, args, options, traced, path, index, eqn, made == "cotangent")
    if values is None:
        return None
    stacked = _stacked(traced.graph, node, options)
    for row in _rows(values, stacked, iteration):
        at = {k: [_row(x, row, stacked) for x in xs] for k, xs in values.items()}
        found = _search(eqn, label, made, at)
        if found is not None:
            return found
    return None


# ---------------------------------------------------------------------------
# The call's equation and the values at it.


def _call_of(traced: Any, node: str) -> tuple[tuple, int, Any] | None:
    """(path, index, equation) of the custom call drawn as `node`, or None."""
    point = next((p for p in traced.graph.probe_points if p.node == node), None)
    if point is None or len({i for i, _ in point.values}) != 1:
        return None
    jaxpr, _ = _level(traced.closed, point.path)
    index = point.values[0][0]
    eqn = jaxpr.eqns[index]
    entered = _compat.custom_call_body(eqn) or _compat.solver_body(eqn)
    return (point.path, index, eqn) if entered is not None else None


def _level(closed: Any, path: tuple) -> tuple[Any, list]:
    """The jaxpr (and its consts) a probe point's `path` leads to."""
    j, consts = _compat.jaxpr_and_consts(closed)
    for i, param, index in path:
        val = j.eqns[i].params[param]
        j, consts = _compat.jaxpr_and_consts(val if index is None else val[index])
    return j, list(consts)


def _inexact(x: Any) -> bool:
    dtype = getattr(getattr(x, "aval", x), "dtype", None)
    return dtype is not None and bool(jax.numpy.issubdtype(dtype, jax.numpy.inexact))


def _values_at(
    fn: Callable,
    args: Sequence[Any],
    options: Any,
    traced: Any,
    path: tuple,
    index: int,
    eqn: Any,
    cotangents: bool,
) -> dict[str, list] | None:
    """The values at the call, per capture key: `"primal"`/`"tangent"` of its operands
    and, with `cotangents`, `"cotangent"` of its outputs (each stacked by the loops
    holding the call). None when an operand cannot be sown (an integer one)."""
    jaxpr, consts = _level(traced.closed, path)
    made: dict[Any, tuple[int, int]] = {v: (-1, k) for k, v in enumerate(jaxpr.invars)}
    for i, e in enumerate(jaxpr.eqns[:index]):
        made.update({v: (i, k) for k, v in enumerate(e.outvars)})
    fixed = dict(zip(jaxpr.constvars, consts, strict=True))
    sown: list[Any] = []
    for v in eqn.invars:
        if isinstance(v, _compat.Literal) or v in fixed or v in sown:
            continue
        if not _inexact(v) or v not in made:
            return None  # (a sow takes floating values only)
        sown.append(v)
    if cotangents and not all(_inexact(v) for v in eqn.outvars):
        return None
    points = [_point(_OPERANDS, path, index - 1, [made[v] for v in sown])] if sown else []
    if cotangents:
        points.append(_point(_OUTPUTS, path, index, [(index, k) for k in range(len(eqn.outvars))]))
    captured = _capture(fn, args, options, traced, points)
    if captured is None:
        return None
    out: dict[str, list] = {}
    for key in ("primal", "tangent"):
        got = captured.get(_OPERANDS, {}).get(key)
        if got is None and sown:
            continue
        by_var = dict(zip(sown, _as_list(got), strict=True)) if sown else {}
        out[key] = [_operand(v, by_var, fixed, key) for v in eqn.invars]
    if cotangents:
        got = captured.get(_OUTPUTS, {}).get("cotangent")
        if got is None:
            return None
        out["cotangent"] = _as_list(got)
    return out if "primal" in out else None


def _point(name: str, path: tuple, at: int, values: list) -> ProbePoint:
    return ProbePoint(name, path, at, tuple(values), tuple("" for _ in values), "eqn")


def _as_list(tree: Any) -> list:
    return list(tree) if isinstance(tree, (list, tuple)) else [tree]


def _operand(v: Any, by_var: dict, fixed: dict, key: str) -> Any:
    """One operand's value (`key` "primal") or tangent ("tangent": zero for a literal or
    a closed-over constant, which no tangent reaches)."""
    if isinstance(v, _compat.Literal):
        value = _compat.literal_value(v)
    elif v in fixed:
        value = fixed[v]
    else:
        return by_var[v]
    return np.zeros_like(np.asarray(value)) if key == "tangent" else value


def _capture(
    fn: Callable, args: Sequence[Any], options: Any, traced: Any, points: list
) -> dict | None:
    """Run the step under `options.mode` with a `sow` at each of `points`; their raw
    values per point name and capture key."""
    from . import _program as P
    from .capture.api import SaveIntermediates
    from .graph.instrument import instrument
    from .modes import tangent_inputs, transform

    spec, dyn = P.split(tuple(args), "locate")
    probed = instrument(traced.closed, points, tag=TAG)
    run = transform(
        lambda d: traced._outputs(probed(*d)),
        traced.layout,
        options.mode,
        options.argnums,
        refs=traced.refs,
    )
    cap = SaveIntermediates(
        run, tag=TAG, duplicates="suffix", loops=options.loops, summarize=None, strict=False
    )
    user = P._user_tangents(spec, dyn, options.tangents, "locate", lambda: traced.layout)
    extra = (tangent_inputs(options.mode, user, lambda: traced.layout, dyn), options.cotangents)
    _, inter = cap(dyn, extra)
    return inter if isinstance(inter, dict) else None


def _stacked(graph: Any, node: str, options: Any) -> int:
    """How many loops stack the values captured at `node` (their leading axes)."""
    from .nonfinite_counts import _looped

    return _looped(graph, options.loops).get(node, 0)


def _rows(values: dict[str, list], stacked: int, iteration: tuple[int, ...]) -> list[tuple]:
    """The loop iterations to search: the origin's when known, else each in order."""
    if not stacked:
        return [()]
    if len(iteration) == stacked:
        return [tuple(iteration)]
    first = next(x for xs in values.values() for x in xs if np.ndim(x) >= stacked)
    shape = np.shape(first)[:stacked]
    return list(itertools.islice(np.ndindex(*shape), _MAX_ROWS))


def _row(x: Any, row: tuple, stacked: int) -> Any:
    """One iteration's value (a literal or constant has no loop axes)."""
    if not row or np.ndim(x) < stacked:
        return x
    return np.asarray(x)[row]


# ---------------------------------------------------------------------------
# Evaluating what ran at the call, one equation at a time.


def _search(eqn: Any, label: str, made: str, at: dict[str, list]) -> Inner | None:
    """The origin inside call `eqn` of its non-finite `made`, on the values `at` it."""
    if _compat.solver_body(eqn) is not None:
        return _in_solver(eqn, label, made, at)
    vjp = eqn.primitive.name != _compat.CUSTOM_JVP
    if made == "value":
        body, _ = _compat.custom_call_body(eqn)
        jaxpr, consts = _compat.jaxpr_and_consts(body)
        found = first_bad(jaxpr, consts, at["primal"], f"`{label}`")
        if found is not None or not vjp:
            return found
        # the body is finite where the call is not: differentiated, the call ran its
        # forward rule, which computes the value otherwise
        return _in_vjp_rules(eqn, label, at["primal"], None)
    if made == "tangent":
        return _in_jvp_rule(eqn, label, at["primal"], at.get("tangent"))
    if "cotangent" not in at:
        return None
    if not vjp:
        # The backward pass runs the JVP rule linearized and transposed: its equations
        # of the operands only (a derivative factor, `x / x`) as written, the linear
        # ones transposed. Those on a unit tangent break where their transposes break
        # on the cotangent (`t / x` at x = 0 and `g / x`).
        return _in_jvp_rule(eqn, label, at["primal"], None)
    return _in_vjp_rules(eqn, label, at["primal"], at["cotangent"])


def _in_solver(eqn: Any, label: str, made: str, at: dict[str, list]) -> Inner | None:
    """The origin inside a solver (`custom_root`, `custom_linear_solve`): a non-finite
    value in its solve; a tangent or cotangent in what JAX differentiates it into (the
    implicit derivative: `tangent_solve`, or the solve again, transposed), traced here by
    `jax.jvp` / `jax.vjp` of the call and replayed, entering the solvers it binds."""
    primals = at["primal"]
    if made == "value":
        return in_solver(eqn, primals)

    def call(*xs: Any) -> list:
        return _compat.bind_eqn(eqn, list(xs))

    if made == "tangent":
        tangents = at.get("tangent") or [np.ones_like(np.asarray(x)) for x in primals]

        def derivative(ps: list, ts: list) -> Any:
            return jax.jvp(call, ps, ts)

        flat = [*primals, *tangents]
    elif "cotangent" in at:

        def derivative(ps: list, cts: list) -> Any:
            return jax.vjp(call, *ps)[1](cts)

        flat = [*primals, *at["cotangent"]]
    else:
        return None
    closed = jax.make_jaxpr(derivative)(*(flat[: len(primals)], flat[len(primals) :]))
    jaxpr, consts = _compat.jaxpr_and_consts(closed)
    derivative_of = f"the derivative of `{label}`"
    return by_function(first_bad(jaxpr, consts, flat, derivative_of), derivative_of)


def _in_jvp_rule(eqn: Any, label: str, operands: list, tangents: list | None) -> Inner | None:
    """The origin in a `custom_jvp`'s JVP rule, on the operands and their tangents (None:
    a unit tangent for each)."""
    _, n_consts = _compat.custom_call_body(eqn)
    args = operands[n_consts:]
    zeros = [not _inexact(np.asarray(a)) for a in args]
    jaxpr, consts = _compat.custom_jvp_rule(eqn, zeros)
    if tangents is None:
        tangents = [np.ones_like(np.asarray(a)) for a in operands]
    ts = [t for t, z in zip(tangents[n_consts:], zeros, strict=True) if not z]
    return first_bad(jaxpr, consts, [*args, *ts], f"the JVP rule of `{label}`")


def _in_vjp_rules(eqn: Any, label: str, operands: list, cotangents: list | None) -> Inner | None:
    """The origin in a `custom_vjp`'s forward rule (a residual, or its value), else in
    its backward rule on the outputs' `cotangents` (None: the forward rule only)."""
    _, n_consts = _compat.custom_call_body(eqn)
    args = operands[n_consts:]
    jaxpr, consts = _compat.custom_vjp_forward(eqn, [_inexact(np.asarray(a)) for a in args])
    found = first_bad(jaxpr, consts, args, f"the forward rule of `{label}`")
    if found is not None or cotangents is None:
        return found
    outs = _compat.eval_jaxpr(jaxpr, consts, *args)
    residuals = _compat.custom_vjp_residuals(eqn, operands, outs)
    rule = _compat.custom_vjp_backward(eqn, residuals, cotangents)
    jaxpr, consts = _compat.jaxpr_and_consts(rule)
    flat = [*residuals, *cotangents]
    return first_bad(jaxpr, consts, flat, f"the backward rule of `{label}`")
