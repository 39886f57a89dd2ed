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
