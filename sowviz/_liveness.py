"""Which values of a program reach its outputs: a dead-code analysis by path.

In grad and vjp modes, a probe's tangent exists only to be transposed into its
cotangent. For a value that never reaches the differentiated output (a jit's
second output nobody reads, the final solver state diffrax returns beside its
solution) that cotangent is a symbolic zero, and handing it to the transpose of
the equation that made the value is something plain JAX never does: its partial
evaluation drops the unused tangent first. Some rules break on it (Equinox's
`nondifferentiable_backward`, which diffrax's `BacksolveAdjoint` puts on its
final state, returns the `Zero` class, which JAX 0.12 cannot iterate). So the
instrumented program for those modes probes such values through a
`stop_gradient`, beside the data flow (`graph.instrument`'s `detached`): their
primal is recorded, and no tangent of theirs is kept alive.

Only tangents are followed: a value reaches an output when a tangent can carry
it there. An integer or boolean value carries none, nor does the output of
`stop_gradient` or of a primitive whose derivative is zero (`floor`, `sign`).
Loops are iterated to a fixed point over their carries (a `while` loop's
condition carries no tangent: it only decides how often the body runs). A
custom rule is followed through its primal program: Equinox's `error_if`, which
diffrax calls on its every output, is a `custom_jvp` passing each value to its
own output, as its rule passes each tangent. Inside it, a primitive whose
derivative is zero does not cut the path: a straight-through estimator's
`round` is such a program, and its rule passes the cotangent on (the weight it
rounds lost its gradient's statistics). A rule routing a tangent where its
primal program sends no value at all would make a live value look dead; its
probe then loses its cotangent, never the gradient (the program reads on the
original value, never the `stop_gradient`). A program holding mutable references
(`jax.new_ref`), which carry values beside the outputs, gets no answer: nothing
is detached.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from . import _compat
from .primitives import Construct, construct_of, spec

Step = tuple[int, str, Any]
Path = tuple[Step, ...]

#: constructs whose one sub-program (its param named in `primitives`' table) takes the
#: equation's operands as they are
_CALLS = frozenset(
    {
        Construct.JIT,
        Construct.CALL,
        Construct.REMAT,
        Construct.SHARD_MAP,
        Construct.CUSTOM_JVP,
        Construct.CUSTOM_VJP,
    }
)


class _Refs(Exception):
    """The program holds a mutable reference: no liveness is claimed."""


def live_values(jaxpr: Any, live_outputs: Sequence[bool]) -> dict[Path, set] | None:
    """Per sub-program path (`()` for `jaxpr` itself, then the `(eqn index, param,
    index)` steps of a `ProbePoint.path`), its variables that reach one of `jaxpr`'s
    outputs marked live; None for a program holding mutable references."""
    out: dict[Path, set] = {}
    try:
        _live(jaxpr, list(live_outputs), (), out)
    except _Refs:
        return None
    return out


def _live(
    jaxpr: Any, live_outs: list[bool], path: Path, out: dict[Path, set], custom: bool = False
) -> list[bool]:
    """Marks `jaxpr`'s live variables in `out[path]`; returns which inputs are live.
    `custom`: `jaxpr` is (inside) a custom rule's primal program (`_operands`)."""
    jaxpr, _ = _compat.jaxpr_and_consts(jaxpr)
    live = {v for v, on in zip(jaxpr.outvars, live_outs, strict=True) if on and _carries(v)}
    for i in range(len(jaxpr.eqns) - 1, -1, -1):
        eqn = jaxpr.eqns[i]
        if any(_compat.is_ref(v.aval) for v in (*eqn.invars, *eqn.outvars)):
            raise _Refs
        outs = [_carries(v) and v in live for v in eqn.outvars]
        if any(outs):
            ins = _operands(eqn, i, outs, path, out, custom)
            live.update(v for v, on in zip(eqn.invars, ins, strict=True) if on and _carries(v))
    out[path] = live
    return [v in live for v in jaxpr.invars]


def _operands(
    eqn: Any, i: int, outs: list[bool], path: Path, out: dict, custom: bool = False
) -> list[bool]:
    """Which of `eqn`'s operands reach its live outputs `outs` (`custom`: the equation
    is inside a custom rule's primal program)."""
    construct = construct_of(eqn.primitive.name)
    params = eqn.params
    n = len(eqn.invars)
    param = spec(construct).bodies[0].param if construct in _CALLS else None
    if param is not None and param in params:
        inside = custom or construct in (Construct.CUSTOM_JVP, Construct.CUSTOM_VJP)
        inner = _live(params[param], outs, (*path, (i, param, None)), out, inside)
        return inner if len(inner) == n else [True] * n
    if construct is Construct.COND:  # operand 0 is the branch index
        ins = [False] * n
        for b, branch in enumerate(params["branches"]):
            got = _live(branch, outs, (*path, (i, "branches", b)), out, custom)
            ins[1:] = [a or g for a, g in zip(ins[1:], got, strict=True)]
        return ins
    if construct is Construct.SCAN:
        layout = _compat.scan_layout(params)
        c0, nc = layout.num_consts, layout.num_carry
        carry = list(outs[:nc])
        while True:  # carries feed the next iteration's carries: iterate to a fixed point
            got = _live(
                params["jaxpr"], carry + list(outs[nc:]), (*path, (i, "jaxpr", None)), out, custom
            )
            grown = [a or b for a, b in zip(carry, got[c0 : c0 + nc], strict=True)]
            if grown == carry:
                return got
            carry = grown
    if construct is Construct.WHILE:
        cn, bn = params["cond_nconsts"], params["body_nconsts"]
        _live(params["cond_jaxpr"], [False], (*path, (i, "cond_jaxpr", None)), out)
        carry = list(outs)
        while True:
            got = _live(params["body_jaxpr"], carry, (*path, (i, "body_jaxpr", None)), out, custom)
            grown = [a or b for a, b in zip(carry, got[bn:], strict=True)]
            if grown == carry:
                return [False] * cn + got[:bn] + carry
            carry = grown
    # Not inside a custom rule's primal program: its rule may send a tangent where the
    # primal's derivative is zero (a straight-through `round`, the rule passing `g` on).
    if construct is None and not custom and _compat.zero_derivative(eqn.primitive):
        return [False] * n
    return [True] * n


def _carries(v: Any) -> bool:
    """Whether `v` is a variable that can carry a tangent (an inexact array)."""
    if not isinstance(v, _compat.Var) or isinstance(v, _compat.Literal):
        return False
    dtype = getattr(v.aval, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.inexact)


# -- why a value that reaches the output has no cotangent -----------------------------
# A value the output reads has no cotangent when no tangent reaches it. Either it does
# not depend on the differentiated arguments at all, or it does through the primal data
# flow but every path is cut by an equation whose derivative is zero by definition: the
# user's `jax.lax.stop_gradient` (a TD or GAE target), `floor`/`round`/`sign`, or an
# integer result (`argmax`'s index). The panel said the former of both, which sent a
# user debugging "why does my critic not learn from the target" the wrong way.


class Cut:
    """The equation nearest a value that cut its arguments' tangent: `name` its
    primitive's, `eqn` it (its source line). Equal by identity: the fixed point of a
    loop compares states, and an equation's own equality walks its params."""

    __slots__ = ("eqn", "name")

    def __init__(self, name: str, eqn: Any):
        self.name, self.eqn = name, eqn


#: a value carries a tangent from the differentiated arguments
_TANGENT = "tangent"


def stopped_values(jaxpr: Any, differentiated: Sequence[bool]) -> dict[Path, dict] | None:
    """Per sub-program path (as `live_values`), the variables that depend on the
    inputs marked `differentiated` through the primal data flow but carry no tangent
    from them, each with the `Cut` nearest it (a `stop_gradient` preferred); None for a
    program holding mutable references."""
    out: dict[Path, dict] = {}
    try:
        _flow(jaxpr, [_TANGENT if d else None for d in differentiated], (), out)
    except _Refs:
        return None
    return {p: {v: s for v, s in got.items() if s is not _TANGENT} for p, got in out.items()}


def _merge(states: Sequence[Any]) -> Any:
    """A tangent wins over a cut, a `stop_gradient`'s cut over another's; None: none."""
    found = [s for s in states if s is not None]
    if not found:
        return None
    if _TANGENT in found:
        return _TANGENT
    return next((s for s in found if s.name == "stop_gradient"), found[0])


def _flow(jaxpr: Any, ins: list, path: Path, out: dict[Path, dict], custom: bool = False) -> list:
    """Marks the state of `jaxpr`'s variables (`_TANGENT`, a `Cut`, absent: independent)
    in `out[path]`, given its inputs'; returns its outputs'."""
    jaxpr, _ = _compat.jaxpr_and_consts(jaxpr)
    state: dict = out.setdefault(path, {})
    for v, s in zip(jaxpr.invars, ins, strict=True):
        if s is not None:
            state[v] = _merge([state.get(v), s])

    def of(v: Any) -> Any:
        return state.get(v) if isinstance(v, _compat.Var) else None

    for i, eqn in enumerate(jaxpr.eqns):
        if any(_compat.is_ref(v.aval) for v in (*eqn.invars, *eqn.outvars)):
            raise _Refs
        got = _results(eqn, i, [of(v) for v in eqn.invars], path, out, custom)
        for v, s in zip(eqn.outvars, got, strict=True):
            if s is _TANGENT and not _carries(v):  # an integer result carries none
                s = Cut(eqn.primitive.name, eqn)
            if s is not None:
                state[v] = _merge([state.get(v), s])
    return [of(v) for v in jaxpr.outvars]


def _results(eqn: Any, i: int, ins: list, path: Path, out: dict, custom: bool) -> list:
    """The states of `eqn`'s results, given its operands' `ins`."""
    construct = construct_of(eqn.primitive.name)
    params = eqn.params
    n_out = len(eqn.outvars)
    param = spec(construct).bodies[0].param if construct in _CALLS else None
    if param is not None and param in params:
        inside = custom or construct in (Construct.CUSTOM_JVP, Construct.CUSTOM_VJP)
        body = params[param]
        if len(_compat.jaxpr_and_consts(body)[0].invars) == len(ins):
            return _flow(body, ins, (*path, (i, param, None)), out, inside)
    elif construct is Construct.COND:  # operand 0 is the branch index
        got = [
            _flow(b, ins[1:], (*path, (i, "branches", k)), out, custom)
            for k, b in enumerate(params["branches"])
        ]
        return [_merge([*row, ins[0]]) for row in zip(*got, strict=True)]
    elif construct is Construct.SCAN:
        layout = _compat.scan_layout(params)
        c0, nc = layout.num_consts, layout.num_carry
        carry = list(ins[c0 : c0 + nc])
        while True:  # a carry's state feeds the next iteration's: to a fixed point
            got = _flow(
                params["jaxpr"], [*ins[:c0], *carry, *ins[c0 + nc :]],
                (*path, (i, "jaxpr", None)), out, custom,
            )  # fmt: skip
            grown = [_merge([a, b]) for a, b in zip(carry, got[:nc], strict=True)]
            if grown == carry:
                return got
            carry = grown
    elif construct is Construct.WHILE:
        cn, bn = params["cond_nconsts"], params["body_nconsts"]
        carry = list(ins[cn + bn :])
        while True:
            body_path = (*path, (i, "body_jaxpr", None))
            got = _flow(params["body_jaxpr"], [*ins[cn : cn + bn], *carry], body_path, out, custom)
            grown = [_merge([a, b]) for a, b in zip(carry, got, strict=True)]
            if grown == carry:
                return carry
            carry = grown
    merged = _merge(ins)
    if merged is _TANGENT and construct is None and not custom:
        if _compat.zero_derivative(eqn.primitive):
            merged = Cut(eqn.primitive.name, eqn)
    elif merged is not None and merged is not _TANGENT and construct is None and not custom:
        if eqn.primitive.name == "stop_gradient":  # the user's own cut, nearest the value
            merged = Cut(eqn.primitive.name, eqn)
    return [merged] * n_out
