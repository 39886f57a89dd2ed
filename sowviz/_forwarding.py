"""Which outputs of a jaxpr are one of its inputs, returned unchanged.

A Flax NNX transform (`nnx.jit`, `nnx.cond`, `nnx.fori_loop`, `nnx.remat`)
returns every variable of the modules it was given as a *new* value, even those
its function never assigned: the variable's array went in and came out of a
`jit`, a `cond` or a loop. `_state.compare` sees a new object and reports a
change, so `inspect` drew all of a model's parameters under "new model" and the
Monitor wrote them back at every step. This module follows such a value back
through the constructs that pass it along untouched, so those leaves can be
left out:

* calls (`jit`, `closed_call`, `remat`, `custom_jvp_call`, `custom_vjp_call`):
  the inner program returns its input at the same position;
* `cond`: every branch returns the same operand;
* `scan` and `while`: the body returns a carry as it got it, so the loop's
  result is the carry's initial value; a scan's body returns its slice of a
  stacked input as its slice of a stacked output (`nnx.scan` over layers hands
  each layer's parameters back so), so that output is that input.

Anything else (a copy, a convert to the same dtype) counts as computed: a
leaf reported changed is only written back needlessly, never lost.
"""

from __future__ import annotations

from typing import Any

from . import _compat
from .primitives import Construct, construct_of

_CALLS = {
    Construct.JIT: "jaxpr",
    Construct.CALL: "call_jaxpr",
    Construct.REMAT: "jaxpr",
    Construct.CUSTOM_JVP: "call_jaxpr",
    Construct.CUSTOM_VJP: "call_jaxpr",
}


def forwarded_inputs(jaxpr: Any, _memo: dict | None = None) -> list[int | None]:
    """Per output of `jaxpr` (open or closed): the position of the input it returns
    unchanged, or None for a value computed inside."""
    memo: dict[int, list[int | None]] = {} if _memo is None else _memo
    jaxpr, _ = _compat.jaxpr_and_consts(jaxpr)
    if id(jaxpr) in memo:
        return memo[id(jaxpr)]
    inputs = {v: k for k, v in enumerate(jaxpr.invars)}
    made = {v: (eqn, k) for eqn in jaxpr.eqns for k, v in enumerate(eqn.outvars)}

    def source(v: Any) -> int | None:
        while not isinstance(v, _compat.Literal):
            if v in inputs:
                return inputs[v]
            if v not in made:  # a constant
                return None
            eqn, k = made[v]
            operand = forwarded_operand(eqn, k, memo)
            if operand is None:
                return None
            v = eqn.invars[operand]
        return None

    memo[id(jaxpr)] = out = [source(v) for v in jaxpr.outvars]
    return out


def forwarded_operand(eqn: Any, k: int, memo: dict) -> int | None:
    """The position in `eqn.invars` of the operand that `eqn`'s output `k` is, unchanged
    (None: computed). `memo` caches the sub-programs' answers (start with {})."""
    construct = construct_of(eqn.primitive.name)
    params = eqn.params
    if construct in _CALLS and _CALLS[construct] in params:
        return forwarded_inputs(params[_CALLS[construct]], memo)[k]
    if construct is Construct.COND:  # operands after the branch index
        found = {forwarded_inputs(b, memo)[k] for b in params["branches"]}
        one = found.pop() if len(found) == 1 else None
        return None if one is None else 1 + one
    if construct is Construct.SCAN:
        layout = _compat.scan_layout(params)
        inner = forwarded_inputs(params["jaxpr"], memo)[k]
        if k < layout.num_carry:  # a carry the body returns as it got it
            return inner if inner == layout.num_consts + k else None
        # a stacked output whose every slice is the body's slice of one stacked input
        # (in a reversed scan too: slice i in, slice i out)
        return (
            inner if inner is not None and inner >= layout.num_consts + layout.num_carry else None
        )
    if construct is Construct.WHILE:
        body = params["body_nconsts"] + k
        if forwarded_inputs(params["body_jaxpr"], memo)[k] == body:
            return params["cond_nconsts"] + body
    return None
