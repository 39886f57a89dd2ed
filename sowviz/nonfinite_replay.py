"""Which equation of a program made a NaN/Inf, found by evaluating it one equation at a
time on values known to make one: `first_bad`.

`locate` probes the program JAX traced, where a custom function, a solver
(`lax.custom_root`, `lax.custom_linear_solve`) or what runs only under
differentiation (their rules) is one equation. `nonfinite_custom` reads the values at
such a call and replays here what ran there. The first equation whose floating inputs
are all finite and whose outputs are not is the origin, with the user's line that wrote
it. A call, a custom function, a solver, a `cond` and a loop are entered to name the
primitive inside: a loop one iteration at a time (the DEQ's `fori_loop` in its
solve), the iteration kept ("iteration 0 of a `scan`").
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import jax
import numpy as np

from . import _compat
from .graph.names import short_path
from .primitives import function_name

#: How many iterations of one loop are replayed looking for the origin: past them the
#: loop itself is named (a replay runs op by op, ~50 µs an equation).
MAX_ITERATIONS = 1000


@dataclass(frozen=True)
class Inner:
    """The equation inside a call (a custom function, its rules, a solver) that made the
    NaN/Inf."""

    primitive: str
    source: Any  # SourceLocation | None
    within: str  # "`my_log`", "the backward rule of `my_log`", "`f`"
    # what holds it, outermost first, where `within` does not say: "the solve of
    # `custom_root`", "iteration 3 of a `while`"
    steps: tuple[str, ...] = ()
    eqn: Any = field(default=None, compare=False, repr=False)  # the equation itself

    def where(self) -> str:
        """What it is in, for a message: "`f` (the solve of `custom_root`, iteration 0
        of a `scan`)"."""
        return f"{self.within} ({', '.join(self.steps)})" if self.steps else self.within


def finite(x: Any) -> bool:
    """Whether `x` holds no NaN/Inf (anything not floating does not)."""
    if isinstance(x, (float, complex)):  # (a literal's value: `jnp.inf` as written)
        x = np.asarray(x)
    dtype = getattr(getattr(x, "aval", x), "dtype", None)
    if dtype is None or not jax.numpy.issubdtype(dtype, jax.numpy.inexact):
        return True
    value = np.asarray(x)
    if not np.issubdtype(value.dtype, np.inexact):
        value = value.astype(np.float32)  # ml_dtypes (bfloat16): NaN and Inf kept
    return bool(np.all(np.isfinite(value)))


def first_bad(jaxpr: Any, consts: list, flat: list, within: str) -> Inner | None:
    """The first equation of `jaxpr` whose floating inputs are all finite and whose
    outputs are not, evaluated on `flat`; `within`: what it is said to be in."""
    found, _ = _replay(jaxpr, consts, flat, within)
    return found


def _replay(jaxpr: Any, consts: list, flat: list, within: str) -> tuple[Inner | None, list]:
    """(`first_bad`, the outputs when it is None)."""
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, flat, strict=True))

    def read(v: Any) -> Any:
        return _compat.literal_value(v) if isinstance(v, _compat.Literal) else env[v]

    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        outs = _compat.bind_eqn(eqn, invals)
        if all(finite(x) for x in invals) and not all(finite(y) for y in outs):
            return _named(eqn, invals, within), []
        env.update(zip(eqn.outvars, outs, strict=True))
    return None, [read(v) for v in jaxpr.outvars]


def _named(eqn: Any, invals: list, within: str) -> Inner:
    """`eqn` as the origin; inside a custom call, the body's equation that made it (a
    function of the user's of its own), inside a `jit`, its primitive, inside a solver
    or a loop, the equation there."""
    here = Inner(_compat.primitive_label(eqn), source(eqn), within, eqn=eqn)
    custom = _compat.custom_call_body(eqn)
    if custom is not None:
        jaxpr, consts = _compat.jaxpr_and_consts(custom[0])
        name = f"`{function_name(custom[0]) or eqn.primitive.name}`"
        return first_bad(jaxpr, consts, invals, name) or here
    name = eqn.primitive.name
    if name in (_compat.SCAN, _compat.WHILE, _compat.COND):
        return _in_control_flow(eqn, invals, within) or here
    if _compat.solver_body(eqn) is not None:
        return in_solver(eqn, invals) or here
    subs = list(_compat.sub_jaxprs(eqn))
    if name in _compat.CALL_NAMES and len(subs) == 1:
        body = eqn.params[subs[0][0]]
        jaxpr, consts = _compat.jaxpr_and_consts(body)
        inner = first_bad(jaxpr, consts, invals, within)
        if (
            inner is not None
            and _compat.defined_in_library(body)
            and not _compat.called_back_from(inner.eqn, body)
        ):
            # (`jnp.clip`'s own lines mean nothing to the user, whose line called it; a
            # function of the user's it called back, `tangent_solve`, says its own)
            inner = replace(inner, source=here.source)
        return inner or here
    return here


def in_solver(eqn: Any, invals: list) -> Inner | None:
    """The origin inside solver `eqn` (`custom_root`, `custom_linear_solve`): in its
    solve, run on the operands it takes, named by the user's function holding it ("`f`
    (the solve of `custom_root`, …)"); None when that is finite."""
    body, taken = _compat.solver_body(eqn)
    jaxpr, consts = _compat.jaxpr_and_consts(body)
    solve = f"the solve of `{_compat.primitive_label(eqn)}`"
    return by_function(first_bad(jaxpr, consts, [invals[i] for i in taken], solve), solve)


def by_function(found: Inner | None, context: str) -> Inner | None:
    """`found` (said to be in `context`, "the solve of `custom_root`") said to be in the
    user's function holding it, `context` kept as its first step: "`f` (the solve of
    `custom_root`, …)". As it is inside a custom function of its own (which names it)
    or a `lambda`."""
    if found is None or found.within != context:
        return found
    func = (getattr(found.source, "function", None) or "").rsplit(".", 1)[-1]
    if not func or func.startswith("<"):
        return found
    return replace(found, within=f"`{func}`", steps=(context, *found.steps))


def _in_control_flow(eqn: Any, invals: list, within: str) -> Inner | None:
    """The origin inside a `scan`, `while` or `cond` (its branch taken), entered one
    iteration at a time; None when not found within `MAX_ITERATIONS`."""
    name = eqn.primitive.name
    if name == _compat.COND:
        branch = int(np.clip(np.asarray(invals[0]), 0, len(eqn.params["branches"]) - 1))
        jaxpr, consts = _compat.jaxpr_and_consts(eqn.params["branches"][branch])
        return first_bad(jaxpr, consts, invals[1:], within)
    steps = _scan_steps if name == _compat.SCAN else _while_steps
    for k, (found, _) in enumerate(steps(eqn, invals, within)):
        if found is not None:
            return replace(found, steps=(f"iteration {k} of a `{name}`", *found.steps))
    return None


def _scan_steps(eqn: Any, invals: list, within: str):
    """Each iteration of a `scan` replayed: (its origin or None, its outputs)."""
    body, consts = _compat.jaxpr_and_consts(eqn.params["jaxpr"])
    layout = _compat.scan_layout(eqn.params)
    nc, nk = layout.num_consts, layout.num_carry
    fixed, carry, xs = invals[:nc], invals[nc : nc + nk], invals[nc + nk :]
    length = int(eqn.params["length"])
    for step in range(min(length, MAX_ITERATIONS)):
        i = length - 1 - step if eqn.params.get("reverse") else step
        found, outs = _replay(body, consts, [*fixed, *carry, *(x[i] for x in xs)], within)
        yield found, outs
        if found is not None:
            return
        carry = outs[:nk]


def _while_steps(eqn: Any, invals: list, within: str):
    """Each iteration of a `while` replayed: (its origin or None, its carry)."""
    cond, cond_consts = _compat.jaxpr_and_consts(eqn.params["cond_jaxpr"])
    body, body_consts = _compat.jaxpr_and_consts(eqn.params["body_jaxpr"])
    nc, nb = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
    cc, bc, carry = invals[:nc], invals[nc : nc + nb], invals[nc + nb :]
    for _ in range(MAX_ITERATIONS):
        (go,) = _compat.eval_jaxpr(cond, cond_consts, *cc, *carry)
        if not bool(go):
            return
        found, carry = _replay(body, body_consts, [*bc, *carry], within)
        yield found, carry
        if found is not None:
            return


def source(eqn: Any) -> Any:
    """The user's line that made `eqn` (None: none outside a library)."""
    loc = _compat.user_location_outside_libraries(eqn)
    if loc is None:
        return None
    return _compat.SourceLocation(short_path(loc.file), loc.line, loc.function)
