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
`stop_gradient` (`graph.instrument`'s `detached`): their primal is recorded,
and no tangent of theirs is kept alive.

An equation holding probes carries their capture effect, and JAX keeps an
effectful equation whole when it linearises: a tangent going into it stays alive
even where nothing live comes out. So such an equation also reads its operands
that reach none of its live outputs through a `stop_gradient`.

Only tangents are followed: a value reaches an output when a tangent can carry
it there. An integer or boolean value carries none, nor does the output of
`stop_gradient` or of a primitive whose derivative is zero (`floor`, `sign`).
Loops are iterated to a fixed point over their carries (a `while` loop's
condition carries no tangent: it only decides how often the body runs). Two
precisions, for two uses:

* a probe beside the data flow only loses its cotangent (zero anyway) if a value
  is wrongly called dead, so `values` looks into custom rules' primal programs
  (Equinox's `error_if` is a `custom_jvp` whose rule passes each tangent to its
  own output, as its primal program passes each value);
* a `stop_gradient` on an operand would change the gradient if wrongly placed,
  so `operands` counts a custom rule's every operand live when any output is (a
  rule may route tangents as it likes), and nothing is detached at all in a
  program holding mutable references (`jax.new_ref`), which carry values beside
  the outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax.numpy as jnp

from . import _compat
from .primitives import Construct, construct_of

Step = tuple[int, str, Any]
Path = tuple[Step, ...]

_CALLS = {  # constructs whose one sub-program takes the equation's operands as they are
    Construct.JIT: "jaxpr",
    Construct.CALL: "call_jaxpr",
    Construct.REMAT: "jaxpr",
    Construct.SHARD_MAP: "jaxpr",
}
_CUSTOM = {Construct.CUSTOM_JVP: "call_jaxpr", Construct.CUSTOM_VJP: "call_jaxpr"}


@dataclass
class Liveness:
    """`values[path]`: the variables of the sub-program at `path` (`()` for the whole
    program) that reach a live output, custom rules followed through their primal
    programs; `operands[(path, i)]`: which operands of its equation `i` reach one,
    custom rules counted as using every operand (an equation with no live output is
    not listed: none do)."""

    values: dict[Path, set] = field(default_factory=dict)
    operands: dict[tuple[Path, int], list[bool]] = field(default_factory=dict)

    def live_operands(self, path: Path, i: int, n: int) -> list[bool]:
        return self.operands.get((path, i), [False] * n)


class _Refs(Exception):
    """The program holds a mutable reference: no liveness is claimed."""


def live_values(jaxpr: Any, live_outputs: Sequence[bool]) -> Liveness | None:
    """What reaches `jaxpr`'s outputs marked live; None for a program holding mutable
    references (nothing may be detached)."""
    try:
        precise, conservative = _Pass(through_custom=True), _Pass(through_custom=False)
        precise.live(jaxpr, list(live_outputs), ())
        conservative.live(jaxpr, list(live_outputs), ())
    except _Refs:
        return None
    return Liveness(values=precise.values, operands=conservative.operands)


class _Pass:
    def __init__(self, through_custom: bool) -> None:
        self.through_custom = through_custom
        self.values: dict[Path, set] = {}
        self.operands: dict[tuple[Path, int], list[bool]] = {}

    def live(self, jaxpr: Any, live_outs: list[bool], path: Path) -> list[bool]:
        """Marks `jaxpr`'s live variables; returns which of its inputs are live."""
        jaxpr, _ = _compat.jaxpr_and_consts(jaxpr)
        live = {v for v, on in zip(jaxpr.outvars, live_outs, strict=True) if on and _carries(v)}
        for i in range(len(jaxpr.eqns) - 1, -1, -1):
            eqn = jaxpr.eqns[i]
            if any(_compat.is_ref(v.aval) for v in (*eqn.invars, *eqn.outvars)):
                raise _Refs
            outs = [_carries(v) and v in live for v in eqn.outvars]
            if not any(outs):
                self.operands.pop((path, i), None)  # a loop's earlier pass may have listed it
                continue
            ins = self._operands(eqn, i, outs, path)
            self.operands[(path, i)] = ins
            live.update(v for v, on in zip(eqn.invars, ins, strict=True) if on and _carries(v))
        self.values[path] = live
        return [v in live for v in jaxpr.invars]

    def _operands(self, eqn: Any, i: int, outs: list[bool], path: Path) -> list[bool]:
        """Which of `eqn`'s operands reach its live outputs `outs`."""
        construct = construct_of(eqn.primitive.name)
        params = eqn.params
        n = len(eqn.invars)
        calls = {**_CALLS, **_CUSTOM} if self.through_custom else _CALLS
        if construct in calls and calls[construct] in params:
            param = calls[construct]
            inner = self.live(params[param], outs, (*path, (i, param, None)))
            return inner if len(inner) == n else [True] * n
        if construct is Construct.COND:  # operand 0 is the branch index
            ins = [True] + [False] * (n - 1)
            for b, branch in enumerate(params["branches"]):
                got = self.live(branch, outs, (*path, (i, "branches", b)))
                ins[1:] = [a or g for a, g in zip(ins[1:], got, strict=True)]
            return ins
        if construct is Construct.SCAN:
            return self._scan(eqn, i, outs, path)
        if construct is Construct.WHILE:
            return self._while(eqn, i, outs, path)
        if construct is None and _compat.zero_derivative(eqn.primitive):
            return [False] * n
        return [True] * n

    def _scan(self, eqn: Any, i: int, outs: list[bool], path: Path) -> list[bool]:
        layout = _compat.scan_layout(eqn.params)
        c0, nc = layout.num_consts, layout.num_carry
        carry = list(outs[:nc])
        while True:  # carries feed the next iteration's carries: iterate to a fixed point
            got = self.live(
                eqn.params["jaxpr"], carry + list(outs[nc:]), (*path, (i, "jaxpr", None))
            )
            grown = [a or b for a, b in zip(carry, got[c0 : c0 + nc], strict=True)]
            if grown == carry:
                return got
            carry = grown

    def _while(self, eqn: Any, i: int, outs: list[bool], path: Path) -> list[bool]:
        params = eqn.params
        cn, bn = params["cond_nconsts"], params["body_nconsts"]
        cond_in = self.live(params["cond_jaxpr"], [True], (*path, (i, "cond_jaxpr", None)))
        carry = [a or b for a, b in zip(outs, cond_in[cn:], strict=True)]
        while True:
            got = self.live(params["body_jaxpr"], carry, (*path, (i, "body_jaxpr", None)))
            grown = [a or b for a, b in zip(carry, got[bn:], strict=True)]
            if grown == carry:
                return cond_in[:cn] + got[:bn] + carry
            carry = grown


def _carries(v: Any) -> bool:
    """Whether `v` is a variable that can carry a tangent (an inexact array)."""
    if not isinstance(v, _compat.Var) or isinstance(v, _compat.Literal):
        return False
    dtype = getattr(v.aval, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.inexact)
