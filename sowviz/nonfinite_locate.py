"""Non-finite values of one run: the inputs and gradients no probe sees, and the
equation inside an origin stage (a re-run of the step with every equation probed).

`analyse(out, options, args)` is the rule of `sowviz.nonfinite` on one compiled
program's output; `locate(fn, args, options)` re-runs the same step with
`capture="all"` and names the equation and its source line, e.g.
"`rsqrt` in `LayerNorm_0` at models.py:112".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import jax
import numpy as np

from ._global import host_value
from .nonfinite import (
    _Index,
    _inexact,
    backward_suspicion,
    cotangent_bad_before,
    find,
    is_backward_key,
    is_bad,
    node_flags,
    with_equations,
)
from .nonfinite_casts import CAST_BACKWARD
from .nonfinite_messages import (
    NONFINITE_GRADS,
    clipped_derivative_hint,
    degenerate_spectrum_hint,
    derivative_times_zero_hint,
    empty_segment_hint,
    fully_masked_row_hint,
    masked_branch_hint,
    masked_derivative_hint,
    not_reproduced,
    with_message,
    with_step_grads,
    zero_derivative_hint,
)
from .nonfinite_record import Equation, NonFinite, Origins
from .nonfinite_replay import finite


def _bad(x: Any) -> bool:
    if x is None or not hasattr(x, "dtype"):
        return False
    # JAX's test, not NumPy's: NumPy counts bfloat16 and the float8 types (ml_dtypes)
    # as no floats, so their NaN gradients were "masked afterwards", with no alarm
    if not jax.dtypes.issubdtype(x.dtype, np.inexact):
        return False
    value = np.asarray(host_value(x))
    if not np.issubdtype(value.dtype, np.inexact):
        value = value.astype(np.float32)  # ml_dtypes: exact in float32, NaN and Inf kept
    return not bool(np.all(np.isfinite(value)))


def _mode(options: Any) -> str:
    return getattr(options.mode, "value", options.mode)


def _argnums(options: Any, n_args: int) -> tuple[tuple[int, ...], bool]:
    nums = options.grad_argnums
    single = isinstance(nums, int)
    seq = (nums,) if single else tuple(nums)
    return tuple(a % n_args for a in seq), single


def input_flags(traced: Any, options: Any, result: Any, args: Sequence[Any] | None):
    """Per input node: (value non-finite, gradient non-finite). Values need `args`;
    gradients are read from a "grad" result `(value, grads)`."""
    inputs = _input_nodes(traced.graph)
    layout = traced.layout
    fwd = [False] * len(inputs)
    bwd = [False] * len(inputs)
    if args is not None:
        leaves = jax.tree_util.tree_leaves(tuple(args))
        for j, leaf in enumerate(layout.leaf_of):
            if j < len(fwd) and leaf < len(leaves):
                fwd[j] = _bad(leaves[leaf])
    if _mode(options) == "grad" and isinstance(result, tuple) and len(result) == 2:
        nums, single = _argnums(options, layout.n_args)
        grads = (result[1],) if single else tuple(result[1])
        per_arg = {
            i: jax.tree_util.tree_leaves(g, is_leaf=lambda x: x is None)
            for i, g in zip(nums, grads, strict=True)
        }
        for j in layout.floating:
            i = layout.arg_of[j]
            if i in per_arg and j < len(bwd):
                k = layout.leaf_of[j] - layout.offsets[i]
                if k < len(per_arg[i]):
                    bwd[j] = _bad(per_arg[i][k])
    return {n: (f, b) for n, f, b in zip(inputs, fwd, bwd, strict=True) if n is not None}


def _input_nodes(graph: Any) -> list[str | None]:
    """Per flat array input of the program: its input node (by the probe point sown on
    it, `values == ((-1, k),)`; else by order)."""
    order = [n.id for n in graph.nodes if n.kind == "input"]
    out: list[str | None] = list(order)
    by_point = {
        p.values[0][1]: p.node
        for p in graph.probe_points
        if p.kind == "input" and p.path == () and p.values and p.values[0][0] == -1
    }
    if by_point:
        out = [by_point.get(k) for k in range(len(order))]
    return out


def results_finite(result: Any) -> bool:
    """Whether every floating leaf the step returned (value, gradients) is finite."""
    return not any(_bad(x) for x in jax.tree_util.tree_leaves(result))


def analyse(
    inspection: Any,
    traced: Any,
    options: Any,
    args: Sequence[Any] | None = None,
    step: int | None = None,
    expect_nonfinite: Sequence[str] | None = None,
    readers: Callable[[str], Sequence[str]] | None = None,
    fills: frozenset[str] = frozenset(),
) -> Origins | None:
    """The origins of one run's non-finite values (None when all are finite); `readers`:
    a node's readers read off the jaxpr (`_Dataflow.reaching`), and `fills`: its
    constants holding a literal's NaN/Inf (`_Dataflow.fills`), for `find`."""
    if expect_nonfinite is None:
        expect_nonfinite = getattr(options, "expect_nonfinite", ()) or ()
    return find(
        inspection.probes,
        inspection.graph,
        step=step,
        inputs=input_flags(traced, options, inspection.result, args),
        results_finite=results_finite(inspection.result),
        expect_nonfinite=tuple(expect_nonfinite),
        readers=readers,
        fills=fills,
        reversed_loops=reversed_loops(traced),
    )


def reversed_loops(traced: Any) -> dict[str, int]:
    """The reverse scans of a traced program (`lax.scan(..., reverse=True)`, the GAE's
    backward recursion): their node ids and lengths, read off the scan equation each
    one's probe point names. A scan none probes (no floating output) counts as forward."""
    from . import _compat

    flow = _Dataflow(traced)
    out: dict[str, int] = {}
    for n in traced.graph.nodes:
        p = flow.points.get(n.id)
        if n.kind != "scan" or p is None or len({i for i, _ in p.values}) != 1:
            continue
        length = _compat.reverse_scan_length(flow._jaxpr(p.path).eqns[p.values[0][0]])
        if length is not None:
            out[n.id] = length
    return out


@dataclass
class _Run:
    """What `analyse` reads of a run: its result, graph and (count-only) probes."""

    result: Any
    graph: Any
    probes: list


#: What keeping every iteration of a while loop (`loops=N`) may take on the device in
#: `locate`'s re-run: the captured values of N iterations.
WHILE_BYTES = 256 * 2**20


def _run_all(
    fn: Callable, args: Sequence[Any], options: Any, traced: Any = None, barriers: bool = True
):
    """The count re-run with every equation probed (`traced`: its program traced
    already; `barriers`: as `nonfinite_counts.count_run`)."""
    from .nonfinite_counts import _in_while, count_run

    opts = replace(options, capture="all")
    run = count_run(fn, tuple(args), opts, traced=traced, barriers=barriers)
    inside = _in_while(run.traced.graph)
    if (
        opts.loops == "last"
        and run.while_iterations > 1
        and any(p.node in inside for p in run.probes if node_flags([p]))
    ):
        # A while loop keeps its last iteration: by then a NaN carried round the loop is
        # everywhere in its body, and the equation that made it (`sqrt` after a `mul`
        # that reads the carry) cannot be told from one that only read it. Again, with
        # the iterations kept (as a scan's are): the first iteration holding it decides.
        # Nested loops keep N rows each: N**depth.
        depth = _while_depth(run.traced.graph)
        rows = max(1, WHILE_BYTES // max(1, run.while_row_bytes))
        n = min(run.while_iterations, int(rows ** (1 / depth)))
        if n > 1:
            again = count_run(
                fn, tuple(args), replace(opts, loops=n), traced=run.traced, barriers=barriers
            )
            if any(p.node in inside for p in again.probes if node_flags([p])):
                run = again  # (else made after the first n iterations: the last one tells)
    return _Run(run.result, run.traced.graph, run.probes), run.traced, opts


def _while_depth(graph: Any) -> int:
    """How deep while loops nest (1: none inside another)."""
    depth: dict[str, int] = {}
    for n in graph.nodes:  # parents first
        d = depth.get(n.parent, 0) if n.parent is not None else 0
        depth[n.id] = d + (n.kind == "while")
    return max(depth.values(), default=1) or 1


def _stage_of(graph: Any, node: str) -> str:
    """The stage an equation belongs to (itself when it sits at the top level)."""
    n = graph.node(node)
    if n.kind in ("eqn", "sow") and n.parent is not None and n.parent != graph.root:
        return n.parent
    return node


def _sign_free(kinds: Any) -> frozenset[str]:
    """NaN/+Inf/-Inf kinds with the sign of an Inf dropped: a sign flip makes no new value."""
    return frozenset("inf" if k.endswith("inf") else k for k in kinds)


def _value_kinds(x: Any) -> frozenset[str]:
    """Which of NaN and ±Inf (`_sign_free`) a constant's value holds."""
    if finite(x):
        return frozenset()
    value = np.asarray(x)
    if not np.issubdtype(value.dtype, np.inexact):
        value = value.astype(np.float32)  # ml_dtypes (bfloat16): NaN and Inf kept
    kinds = (("nan", np.isnan(value)), ("inf", np.isinf(value)))
    return frozenset(k for k, held in kinds if held.any())


def _made_by(j: Any, v: Any) -> int | None:
    """The index of the equation of `j` making `v`; None for an input or a literal."""
    return next((e for e, eqn in enumerate(j.eqns) if v in eqn.outvars), None)


class _Dataflow:
    """Which equations read a node's values, from the jaxpr (exact, unlike lifted edges)."""

    def __init__(self, traced: Any) -> None:
        from . import _compat

        self._compat = _compat
        self.closed = traced.closed
        self.points = {p.node: p for p in traced.graph.probe_points}
        self.inputs = _input_nodes(traced.graph)
        self.at: dict[tuple, str] = {}
        for p in traced.graph.probe_points:
            if p.kind in ("scope", "input", "output"):
                continue
            if len({i for i, _ in p.values}) == 1:
                self.at[(p.path, p.values[0][0])] = p.node
        # The program's results, by the variable making them where they are made (an
        # output's probe point): a value a loop carries out to a result reaches it, as
        # surely as one an equation reads (BlackJAX's NUTS returns its `while_loop`'s
        # trajectory state, whose NaN `log` made in the body).
        self.results: dict[tuple, dict[int, list[str]]] = {}
        for p in traced.graph.probe_points:
            if p.kind == "output" and len(p.values) == 1 and p.values[0][0] >= 0:
                (i, k) = p.values[0]
                var = self._jaxpr(p.path).eqns[i].outvars[k]
                self.results.setdefault(p.path, {}).setdefault(id(var), []).append(p.node)

    def _jaxpr(self, path) -> Any:
        return self._level(path)[0]

    def _level(self, path) -> tuple[Any, list]:
        """The jaxpr a probe point's `path` leads to, and its consts."""
        j, consts = self._compat.jaxpr_and_consts(self.closed)
        for i, param, index in path:
            val = j.eqns[i].params[param]
            if index is not None:
                val = val[index]
            j, consts = self._compat.jaxpr_and_consts(val)
        return j, list(consts)

    def consumers(self, node: str, results: bool = False) -> list[str]:
        """Node ids of the equations reading `node`'s values (leaving a sub-program: the
        enclosing equation's readers); with `results`, the output nodes of the program's
        results they are too (`reaching`)."""
        if node in self.inputs:  # an argument: the top-level jaxpr's input
            j = self._jaxpr(())
            return self._readers((), j, {id(j.invars[self.inputs.index(node)])}, 0, results)
        p = self.points.get(node)
        if p is None or p.kind in ("input", "output"):
            return []
        j = self._jaxpr(p.path)
        vs = {id(j.eqns[i].outvars[k]) for i, k in p.values}
        return self._readers(p.path, j, vs, min(i for i, _ in p.values) + 1, results)

    def reaching(self, node: str) -> list[str]:
        """`consumers(node)` and the results its values are: what `find`'s `readers`
        asks, whether a value goes on to a result (out of a `while_loop` too)."""
        return self.consumers(node, results=True)

    def producers(self, node: str) -> list[str]:
        """Node ids of the equations of its own sub-program whose values the equation
        `node` reads (none for a stage, an input, or values from outside it)."""
        p = self.points.get(node)
        if (
            p is None
            or p.kind in ("scope", "input", "output")
            or len({i for i, _ in p.values}) != 1
        ):
            return []
        j, i = self._jaxpr(p.path), p.values[0][0]
        reads = {id(v) for v in j.eqns[i].invars}
        made = (e for e in range(i) if any(id(v) in reads for v in j.eqns[e].outvars))
        return [self.at[(p.path, e)] for e in made if (p.path, e) in self.at]

    def literal_operand(self, node: str, k: int) -> float | None:
        """The value of the equation `node`'s operand `k` when it is a scalar literal or
        constant (`x ** 0.5`'s exponent); None otherwise."""
        p = self.points.get(node)
        if (
            p is None
            or p.kind in ("scope", "input", "output")
            or len({i for i, _ in p.values}) != 1
        ):
            return None
        j, consts = self._level(p.path)
        invars = j.eqns[p.values[0][0]].invars
        if k >= len(invars):
            return None
        v = invars[k]
        if isinstance(v, self._compat.Literal):
            value = np.asarray(self._compat.literal_value(v))
        elif v in j.constvars:
            value = np.asarray(consts[j.constvars.index(v)])
        else:
            return None
        return float(value) if value.size == 1 else None

    def fills(
        self, graph: Any, flags: Mapping[str, Any], ix: _Index | None = None
    ) -> frozenset[str]:
        """The constant nodes (`graph.constant_nodes`) holding non-finite values that
        read a non-finite constant: a literal (`jnp.clip(dt, max=jnp.inf)` converts
        `inf` to a float), a closed-over array, or an earlier constant's NaN/Inf (a
        broadcast of it). An overflow of finite constants (`jnp.exp(1000.0)`) is none.
        Also a loop's equations that read such a constant as the carry's initial value
        at the loop's first iteration (`carry_fills`). `ix` (with the reverse scans):
        the graph's index, made here without."""
        fwd = {n for n, f in flags.items() if f.fwd}
        out = set()
        for node in sorted(set(graph.constant_nodes) & fwd, key=lambda n: graph.node(n).order):
            p = self.points.get(node)
            if p is None or len({i for i, _ in p.values}) != 1:
                continue
            j, consts = self._level(p.path)
            eqn = j.eqns[p.values[0][0]]
            if any(self._nonfinite_constant(p.path, j, consts, v, fwd) for v in eqn.invars):
                out.add(node)
        return frozenset(out) | self.carry_fills(graph, flags, frozenset(out), ix)

    def _nonfinite_constant(self, path, j, consts, v, flagged: set[str]) -> bool:
        """Whether operand `v` of an equation of `j` (at `path`) is a constant holding
        NaN/Inf: a literal, a const, a value made at its level by a flagged node, or a
        call's parameter that its caller passed such a constant."""
        if isinstance(v, self._compat.Literal):
            return not finite(self._compat.literal_value(v))
        if v in j.constvars:
            return not finite(consts[j.constvars.index(v)])
        for e, eqn in enumerate(j.eqns):
            if v in eqn.outvars:
                return self.at.get((path, e)) in flagged
        if not path or v not in j.invars:
            return False
        up, (i, _, _) = path[:-1], path[-1]
        outer, outer_consts = self._level(up)
        call = outer.eqns[i]
        if call.primitive.name not in self._compat.CALL_NAMES or len(j.invars) != len(call.invars):
            return False  # (a loop's carry or a custom call's operands: no constant here)
        operand = call.invars[j.invars.index(v)]
        return self._nonfinite_constant(up, outer, outer_consts, operand, flagged)

    def carry_fills(
        self, graph: Any, flags: Mapping[str, Any], fills: frozenset[str], ix: _Index | None
    ) -> frozenset[str]:
        """The equations whose first non-finite values, at the first iteration of their
        loop, are its carry's initial value, a non-finite constant (a literal, or one of
        `fills`: `lax.scan(body, -jnp.inf, xs)`, BlackJAX's `Proposal(..., -jnp.inf)`
        starting a `while_loop`), and of no other kind (a sign flip aside): the
        `convert_element_type` making the weak-typed `-inf` a float32 holds it from
        iteration 0, before the `log` that made a NaN at iteration 2, and made nothing.
        The equations of the body reading those, alike, hold the fill too."""
        ix = ix or _Index(graph)
        out: set[str] = set()
        for n in graph.nodes:  # (program order: a fill's readers come after it)
            f = flags.get(n.id)
            p = self.points.get(n.id)
            if f is None or not f.fwd or n.id in fills or n.kind != "eqn" or p is None:
                continue
            if len({i for i, _ in p.values}) != 1:
                continue
            j = self._jaxpr(p.path)
            held = _sign_free(f.first_kinds())
            for v in j.eqns[p.values[0][0]].invars:
                maker = self.at.get((p.path, _made_by(j, v)))
                if maker in out and flags[maker].fwd_iter == f.fwd_iter:
                    kinds = _sign_free(flags[maker].first_kinds())  # (the fill, moved on)
                else:
                    kinds = self._initial_carry_kinds(p.path, j, v, fills, flags, ix, n.id)
                if held <= kinds:
                    out.add(n.id)
                    break
        return frozenset(out)

    def _initial_carry_kinds(
        self, path, j, v, fills: frozenset[str], flags: Mapping[str, Any], ix: _Index, node: str
    ) -> frozenset[str]:
        """Which non-finite kinds (`_sign_free`) `node`'s operand `v` holds at `node`'s
        first non-finite iteration when `v` is the carry of the loop whose body `j` (at
        `path`) is (or a call's parameter, a branch's operand, its caller passed that
        carry: `logaddexp` is a `jit`), that iteration is the loop's first, and the carry's initial value is a
        non-finite constant; else none."""
        if not path or v not in j.invars:
            return frozenset()
        up, (i, param, _) = path[:-1], path[-1]
        outer, outer_consts = self._level(up)
        loop_eqn = outer.eqns[i]
        k = j.invars.index(v)
        passed = self._compat.passed_operand(loop_eqn, param, k, len(j.invars))
        if passed is not None:
            operand = loop_eqn.invars[passed]
            return self._initial_carry_kinds(up, outer, operand, fills, flags, ix, node)
        operand = self._compat.loop_initial_operand(loop_eqn, param, k)
        loop = self.at.get((up, i))
        loops = ix.loops(node)
        if operand is None or loop not in loops:
            return frozenset()
        k = loops.index(loop)
        first = flags[node].fwd_iter
        if len(first) <= k or first[k] != 0:  # (later, the body may have made it)
            return frozenset()
        init = loop_eqn.invars[operand]
        return self._constant_kinds(up, outer, outer_consts, init, fills, flags)

    def _constant_kinds(
        self, path, j, consts, v, fills: frozenset[str], flags: Mapping[str, Any]
    ) -> frozenset[str]:
        """The non-finite kinds (`_sign_free`) of operand `v` of an equation of `j` (at
        `path`) when it is a constant: a literal, a const, a fill's value, or a call's
        parameter its caller passed one; none otherwise."""
        if isinstance(v, self._compat.Literal):
            return _value_kinds(self._compat.literal_value(v))
        if v in j.constvars:
            return _value_kinds(consts[j.constvars.index(v)])
        made = _made_by(j, v)
        if made is not None:
            maker = self.at.get((path, made))
            return _sign_free(flags[maker].fwd_kinds) if maker in fills else frozenset()
        if not path or v not in j.invars:
            return frozenset()
        up, (i, _, _) = path[:-1], path[-1]
        outer, outer_consts = self._level(up)
        call = outer.eqns[i]
        if call.primitive.name not in self._compat.CALL_NAMES or len(j.invars) != len(call.invars):
            return frozenset()
        operand = call.invars[j.invars.index(v)]
        return self._constant_kinds(up, outer, outer_consts, operand, fills, flags)

    def _readers(self, path, j, vs: set[int], start: int, results: bool = False) -> list[str]:
        made_here = self.results.get(path, {}) if results else {}
        out = [node for v in vs for node in made_here.get(v, ())]
        for e in range(start, len(j.eqns)):
            if any(id(v) in vs for v in j.eqns[e].invars):
                node = self.at.get((path, e))
                if node is not None:
                    out.append(node)
                elif results:
                    # (an equation with no probe of its own, a call drawn as a stage of
                    # several values: what reads its outputs may read these, as diffrax's
                    # Runge-Kutta stages reach the step's `y1` through one)
                    vs = vs | {id(v) for v in j.eqns[e].outvars}
        if path and any(id(v) in vs for v in j.outvars):
            up, (i, _, _) = path[:-1], path[-1]
            parent = self._jaxpr(up)
            outs = {id(v) for v in parent.eqns[i].outvars}
            out += self._readers(up, parent, outs, i + 1, results)
        return out


def _culprit(ins: Any, traced: Any, reach: str) -> tuple[str, ...]:
    """The equations reading `reach` whose own cotangent is finite, the likeliest maker
    of its NaN first (`backward_suspicion`, as the stage-level rule orders them)."""
    g = ins.graph
    ix = _Index(g, reversed_loops(traced))
    flags = node_flags(ins.probes, ix.times)
    cands = [
        c
        for c in _Dataflow(traced).consumers(reach)
        if not cotangent_bad_before(ix, flags, c, reach) and _inexact(g.node(c))
    ]
    return tuple(sorted(set(cands), key=lambda c: backward_suspicion(ix, flags, c)))


def locate(
    fn: Callable,
    args: Sequence[Any],
    options: Any = None,
    *,
    step: int | None = None,
    expect_nonfinite: Sequence[str] | None = None,
    alarmed: bool = True,
) -> Origins | None:
    """Re-run `fn(*args)` under `options` with every equation probed and return the
    origins down to the equation (None when every value is finite).

    The forward equation is the earliest non-finite equation; the backward one is
    the equation whose backward rule first made a cotangent non-finite. Each origin's
    `node` is the stage holding that equation. `alarmed`: whether the step's own
    program raised an alarm (False: a caller's record says it did not), so that a
    re-run finding none is worth a second one, fused as the step was (`_probed`).
    """
    from .options import InspectOptions

    if options is None:
        options = InspectOptions()
    ins, traced, opts, flow, fine = _probed(fn, args, options, step, expect_nonfinite, alarmed)
    if fine is None:
        return None
    g = ins.graph
    fwd_eq = bwd_eq = None
    fwd, bwd = fine.forward, fine.backward
    if fwd is not None and fwd.node is not None and g.node(fwd.node).kind != "input":
        n = g.node(fwd.node)
        fwd_eq = Equation(n.id, n.primitive or n.label, n.source or _src(g, n), None, n.label)
        made = "value" if node_flags(ins.probes)[n.id].fwd_value else "tangent"
        fwd_eq = _in_custom(fn, args, opts, traced, g, fwd_eq, made, fwd.iteration)
        fwd_eq = _with_call(flow, g, fwd_eq)
        fwd = replace(fwd, node=_stage_of(g, n.id))
    cast_eq = None
    if bwd is not None and bwd.reaching is not None and bwd.message.startswith(CAST_BACKWARD):
        # born in a widening cast's backward (`nonfinite_casts`): that cast is the
        # equation, at the output of the equation `reach` (its stage: the origin)
        n = g.node(bwd.reaching)
        src = n.source or _src(g, n)
        cast_eq = Equation(n.id, "convert_element_type", src, n.id, "convert_element_type")
        bwd = replace(bwd, node=_stage_of(g, n.id), reaching=_stage_of(g, n.id))
    elif bwd is not None and bwd.reaching is not None:
        reach = bwd.reaching
        cands = _culprit(ins, traced, reach) or bwd.candidates
        if cands:
            n = g.node(cands[0])
            bwd_eq = Equation(n.id, n.primitive or n.label, n.source or _src(g, n), reach, n.label)
            bwd_eq = _in_custom(fn, args, opts, traced, g, bwd_eq, "cotangent", bwd.iteration)
            bwd_eq = _with_call(flow, g, bwd_eq)
            bwd = replace(bwd, node=_stage_of(g, n.id), reaching=_stage_of(g, reach))
            bwd = replace(bwd, candidates=tuple(_stage_of(g, c) for c in cands))
    into = None
    if bwd_eq is not None and bwd_eq.reaching is not None:
        into = _library_call(flow, g, bwd_eq.reaching, bwd_eq.node)
    out = with_equations(replace(fine, forward=fwd, backward=bwd), g, fwd_eq, bwd_eq, into)
    flags = node_flags(ins.probes)
    if out.backward is not None and bwd_eq is not None:
        msg = out.backward.message
        hint = _backward_hint(ins, traced, opts, flow, flags, fwd_eq, bwd_eq)
        if hint:
            msg += hint
        elif not out.backward.follows_forward and not bwd_eq.within:
            # `sqrt`'s backward at exactly 0, no `jnp.where` masking it (`jnp.linalg.norm`
            # of a point's distance to itself): why and the fix, before the gradients
            # (`eigh`/`svd` of repeated eigenvalues: their vectors' 1 / (λi − λj))
            why = _zero_derivative(flow, g, bwd_eq, held=False) or degenerate_spectrum_hint(
                bwd_eq.primitive
            )
            head, grads, said = msg.partition(NONFINITE_GRADS)
            msg = head + why + grads + said
        out = with_message(replace(out, backward=replace(out.backward, message=msg)))
    if out.backward is not None and cast_eq is not None:
        out = replace(out, backward=replace(out.backward, equation=cast_eq))
    if out.forward is not None and fwd_eq is not None:
        # A `jax.grad` inside the program (forces as -grad(energy)): the forward values
        # hold the derivative, and a masked `sqrt` at 0 makes the NaN there (0 × Inf);
        # unmasked, the +Inf derivative at 0 times a zero tangent does.
        hint = (
            _derivative_times_zero(flow, g, flags, fwd_eq)
            or _inf_derivative_at_zero(flow, g, flags, fwd_eq)
            or _fully_masked_row(flow, g, flags, fwd_eq)
        )
        if hint:
            fwd_o = replace(out.forward, message=out.forward.message + hint)
            out = with_message(replace(out, forward=fwd_o))
    return out


def _backward_hint(
    ins: Any,
    traced: Any,
    opts: Any,
    flow: _Dataflow,
    flags: Any,
    fwd_eq: Equation | None,
    bwd_eq: Equation,
) -> str:
    """What a located backward origin's message ends with: why, and the fix, where the
    cause is a `jnp.where` trap; "" elsewhere."""
    g = ins.graph
    if (
        fwd_eq is not None
        and fwd_eq.node == bwd_eq.node
        and _mode(opts) == "grad"
        and isinstance(ins.result, tuple)
        and results_finite(ins.result[0])
    ):
        # The classic trap: `jnp.where(x > 0, jnp.sqrt(x), 0.0)` is finite, its gradient
        # is not (the masked branch's backward is 0 × NaN).
        return masked_branch_hint(fwd_eq.primitive)
    value_bad = bwd_eq.node in flags and flags[bwd_eq.node].fwd
    if _mode(opts) == "grad" and not value_bad:
        kinds = _cotangent_kinds(ins.probes, bwd_eq.reaching)
        if kinds and "nan" not in kinds:
            # Its backward made ±Inf only (a nonzero cotangent times sqrt'(0)): no mask
            # after it zeroed its cotangent, so no `jnp.where` reading its value made the
            # NaN (jnp.trace's own `where` reads it too); a clip before it did, whose
            # derivative is 0 where it clipped (0 × Inf): a PSD square root's
            # `jnp.sqrt(jnp.clip(w, 0.0))` of eigenvalues.
            clip = _clipped_by(flow, g, bwd_eq.node) if bwd_eq.primitive in _STEEP else None
            if clip is None:
                return ""
            exponent = flow.literal_operand(bwd_eq.node, 1) if bwd_eq.primitive == "pow" else None
            return clipped_derivative_hint(
                bwd_eq.primitive, _clip_name(clip), clip.source or _src(g, clip), exponent
            )
        # Its value is finite, its derivative is not (`sqrt` at exactly 0) and a
        # `jnp.where` masks the value: the masked branch's backward is 0 × Inf = NaN.
        where = _masked_by(traced, g, bwd_eq.node)
        if where is not None:
            return masked_derivative_hint(
                bwd_eq.primitive, where.source or _src(g, where), _in_norm(g, bwd_eq.node)
            )
    return ""


def _cotangent_kinds(probes: Sequence[Any], node: str | None) -> frozenset[str]:
    """Which of NaN, +Inf and -Inf the cotangents probed at `node` hold."""
    out: set[str] = set()
    for p in probes:
        if p.node != node:
            continue
        for key, s in p.summaries.items():
            if is_backward_key(key) and is_bad(s):
                out |= {k for k in ("nan", "posinf", "neginf") if s.get(k)}
    return frozenset(out)


#: What a clip is made of: `jnp.clip` and `jnp.maximum`/`jnp.minimum` bind `max`/`min`,
#: whose derivative multiplies the cotangent by a 0/1 mask (0 × Inf = NaN); `lax.clamp`
#: and `jax.nn.relu` select instead, which drops the Inf.
_CLIPS = {"max": "jnp.maximum", "min": "jnp.minimum"}


def _clipped_by(flow: _Dataflow, graph: Any, node: str, hops: int = 2) -> Any:
    """The clip (`_CLIPS`, or a call of `jnp.clip` holding one) whose values `node` reads
    directly or through at most `hops` floating equations; None when there is none."""
    todo, seen = [(node, 0)], {node}
    while todo:
        cur, depth = todo.pop(0)
        for c in flow.producers(cur):
            n = graph.node(c)
            if n.primitive in _CLIPS:
                # `jnp.clip`'s own `max`: name the call the user's line made
                parent = graph.node(n.parent) if n.parent is not None else None
                clip = parent is not None and re.sub(r"#\d+$", "", parent.label) == "clip"
                return parent if clip else n
            if n.kind != "eqn" and any(
                m.primitive in _CLIPS and m.parent == c for m in graph.nodes
            ):
                return n  # (a call: `jnp.clip` is a `jit`)
            if c not in seen and depth < hops and n.kind == "eqn" and _inexact(n):
                seen.add(c)
                todo.append((c, depth + 1))
    return None


def _clip_name(clip: Any) -> str:
    """How the user's line called a clip: `jnp.clip`, `jnp.maximum`, or its box's label."""
    label = re.sub(r"#\d+$", "", clip.label)
    if label == "clip":
        return "jnp.clip"
    return _CLIPS.get(clip.primitive or "", label)


def _in_custom(
    fn: Callable,
    args: Sequence[Any],
    opts: Any,
    traced: Any,
    graph: Any,
    eq: Equation,
    made: str,
    iteration: tuple[int, ...],
) -> Equation:
    """`eq`, or when it is a `custom_jvp`/`custom_vjp` call or a solver (`SOLVERS`), the
    equation inside the function, its rules or its solve that made its non-finite `made`
    (`nonfinite_custom`): the call's line says only where it was called."""
    from .nonfinite_custom import SOLVERS, inside_custom

    n = graph.node(eq.node)
    if n.kind != "custom" and n.primitive not in SOLVERS:
        return eq
    try:
        inner = inside_custom(fn, args, opts, traced, n.id, n.label, made, iteration)
    except Exception as err:  # never hide the origin found behind a second error
        import warnings

        from ._caller import user_stacklevel

        warnings.warn(
            f"sowviz: could not look inside `{n.label}` ({n.primitive}) for the equation "
            f"that made its NaN/Inf; the call is named instead: {err!r}",
            RuntimeWarning,
            stacklevel=user_stacklevel(),
        )
        return eq
    if inner is None:
        return eq
    source = inner.source or eq.source
    return replace(eq, primitive=inner.primitive, source=source, label="", within=inner.where())


def _library_call(flow: _Dataflow, graph: Any, reach: str, made: str) -> Any:
    """The call of a JAX function the user's line made (`jnp.linalg.norm`) that holds
    both the equation `reach` and the origin `made`: the cotangent a library's own
    equation (`norm`'s `reduce_sum`) holds is one of no line the user wrote, so the
    message names the input of that call instead; None otherwise."""
    from . import _compat
    from .graph.names import call_labels

    stage = _stage_of(graph, reach)
    p = flow.points.get(reach)
    if stage == reach or stage != _stage_of(graph, made) or p is None:
        return None
    if p.kind in ("scope", "input", "output") or len({i for i, _ in p.values}) != 1:
        return None
    path = _compat.call_path(flow._jaxpr(p.path).eqns[p.values[0][0]])
    labels = call_labels(path.names) if path.package == "jax" else ()
    call = graph.node(stage)
    return call if labels and re.sub(r"#\d+$", "", call.label) == labels[0] else None


def _with_call(flow: _Dataflow, graph: Any, eq: Equation) -> Equation:
    """`eq` with the JAX function the user's line called that bound it (`Equation.call`):
    an fp16 overflow located to "`integer_pow` in `x#5`" said neither `jax.nn.gelu`
    (its `x ** 3`) nor anything the line reads as. Not when a box on its way up is named
    by that call already (a `gelu` box), nor when the call is named as the primitive
    (`jnp.sqrt`), nor for a custom function's equation (`within` says where)."""
    from . import _compat
    from .graph.names import call_labels

    p = flow.points.get(eq.node)
    if eq.within or (eq.label and eq.label != eq.primitive) or p is None:
        return eq
    if p.kind in ("scope", "input", "output") or len({i for i, _ in p.values}) != 1:
        return eq
    path = _compat.call_path(flow._jaxpr(p.path).eqns[p.values[0][0]])
    # (a framework's layer, `nn.LayerNorm`, is a stage named by its module already)
    labels = call_labels(path.names) if path.package == "jax" else ()
    if not labels or labels[0] == eq.primitive:
        return eq
    n = graph.node(eq.node)
    while n is not None:
        if re.sub(r"#\d+$", "", n.label) == labels[0]:
            return eq
        n = graph.node(n.parent) if n.parent is not None else None
    return replace(eq, call=labels[0])


def _probed(
    fn: Callable,
    args: Sequence[Any],
    options: Any,
    step: int | None,
    expect_nonfinite: Sequence[str] | None,
    alarmed: bool,
) -> tuple[_Run, Any, Any, _Dataflow, Origins | None]:
    """The count re-run and what `analyse` finds in it. First with each captured value
    through an optimization barrier (`interpret._through_barrier`): every mask then
    reads the very buffer the next equation reads, so "earliest non-finite" is exact.
    That rounds each value as op-by-op execution does, where XLA's fusion in the
    step's own program may skip a rounding (a softmax's scale and `x - max(x)` fused
    into one multiply-add: ~1e10 left at the row max, and `exp` overflows). So when
    the step raised an alarm and this re-run finds none, once more without barriers:
    XLA fuses it as it fused the step and makes the same NaN (a value's mask may then
    read a recomputation of it, not the buffer the next equation reads: so only where
    the first re-run is blind).
    Not first: without barriers XLA also fuses each value's producer into its mask's
    reduction, which compiled up to 1.6 times as long on the programs of
    tests/test_nonfinite_cost.py (its MLP 0.6 s -> 1.0 s, the 2-block NNX LM 9.6 s ->
    11.5 s on a 2-core CPU), where the retry costs only the steps it rescues."""
    ins, traced, opts = _run_all(fn, args, options)
    # (every equation probed: which read a value is known exactly, past its stage)
    flow = _Dataflow(traced)
    ix = _Index(ins.graph, reversed_loops(traced))
    fills = flow.fills(ins.graph, node_flags(ins.probes, ix.times), ix)
    fine = analyse(ins, traced, opts, args, step, expect_nonfinite, flow.reaching, fills)
    if alarmed and (fine is None or not fine.alarm):
        ins, traced, opts = _run_all(fn, args, options, traced=traced, barriers=False)
        fills = flow.fills(ins.graph, node_flags(ins.probes, ix.times), ix)
        fine = analyse(ins, traced, opts, args, step, expect_nonfinite, flow.reaching, fills)
    return ins, traced, opts, flow, fine


#: Primitives whose derivative is infinite where their value is finite (`sqrt` at 0,
#: `arcsin` at 1): what an infinite derivative is likely the derivative of.
_STEEP = frozenset({"sqrt", "cbrt", "pow", "asin", "acos"})


def _derivative_times_zero(flow: _Dataflow, graph: Any, flags: Any, eq: Equation) -> str:
    """The double-where fix for a forward origin that made ±Inf (first, before any NaN)
    which a `mul` reading it turned into NaN with a zero a `jnp.where` made: the
    derivative of a masked `sqrt` at 0 (`0.5 / sqrt(r)`) times the masked branch's zero
    cotangent, in a `jax.grad` the program calls. "" when that is not the case."""
    f = flags.get(eq.node)
    if f is None or not f.first_kinds() or "nan" in f.first_kinds():
        return ""
    for m in flow.consumers(eq.node):
        if graph.node(m).primitive != "mul":
            continue
        where = _select_before(flow, graph, m, avoid=eq.node)
        if where is not None:
            of = _steep_before(flow, graph, eq)
            return derivative_times_zero_hint(
                eq.primitive, of, eq.source, where.source or _src(graph, where)
            )
    return ""


def _zero_derivative(flow: _Dataflow, graph: Any, eq: Equation, held: bool) -> str:
    """`zero_derivative_hint` for a backward origin at `eq` (`held` False) whose derivative
    is infinite only at 0 (`sqrt`, `cbrt`, `pow` by an exponent in (0, 1)): its forward
    value finite and its cotangent finite, only an input of exactly 0 makes its backward
    non-finite. "" for any other equation."""
    exponent = None
    if eq.primitive == "pow":
        exponent = flow.literal_operand(eq.node, 1)
        if exponent is None or not 0 < exponent < 1:
            return ""
    elif eq.primitive not in ("sqrt", "cbrt"):
        return ""
    return zero_derivative_hint(eq.primitive, exponent, _in_norm(graph, eq.node), held)


def _inf_derivative_at_zero(flow: _Dataflow, graph: Any, flags: Any, eq: Equation) -> str:
    """`zero_derivative_hint` for a forward origin that made +Inf first (before any NaN)
    computing the derivative of a `sqrt` or `cbrt` on its line (`div` reads `sqrt`'s
    value in `0.5 / sqrt(x)`): a `jax.grad` inside the program at an input of 0 (forces
    as -grad(energy) of `jnp.linalg.norm` distances). "" when that is not the case."""
    f = flags.get(eq.node)
    if f is None or f.first_kinds() != frozenset({"posinf"}):
        return ""
    of = _steep_before(flow, graph, eq)
    if of not in ("sqrt", "cbrt"):
        return ""
    return zero_derivative_hint(of, None, _in_norm(graph, eq.node), held=True)


def _fully_masked_row(flow: _Dataflow, graph: Any, flags: Any, eq: Equation) -> str:
    """`fully_masked_row_hint` for a forward origin that made NaN of a `jnp.where`'s
    -Inf in a softmax: the `sub` of `x - max(x)` (-Inf - (-Inf) where every entry of a
    row is masked), or the `div` of `exp(x) / sum(exp(x))` without it (0 / 0);
    `empty_segment_hint` for the `sub` of `s - segment_max(s)[ids]`. "" when that is
    not the case."""
    f = flags.get(eq.node)
    if eq.within or f is None or "nan" not in f.first_kinds():
        return ""
    segment = False
    if eq.primitive == "sub":
        shape = _made_before(flow, graph, eq.node, {"reduce_max"})
        # (a GAT's segment softmax: the max of a node's incoming edges, gathered back)
        segment = not shape and _made_before(flow, graph, eq.node, {"scatter-max"})
        shape = shape or segment
    elif eq.primitive == "div":
        shape = _made_before(flow, graph, eq.node, {"exp"}, hops=1) and _made_before(
            flow, graph, eq.node, {"reduce_sum"}
        )
    else:
        return ""
    where = _select_before(flow, graph, eq.node, avoid="") if shape else None
    if where is None:
        return ""
    held = [flags.get(a) for a in (where.id, *_above(graph, where))]
    if not any(h is not None and "neginf" in h.fwd_kinds for h in held):
        return ""  # (its select held no -Inf: the NaN came of something else)
    if segment:
        return empty_segment_hint(where.source or _src(graph, where))
    return fully_masked_row_hint(eq.primitive, where.source or _src(graph, where))


def _made_before(flow: _Dataflow, graph: Any, node: str, prims: set[str], hops: int = 4) -> bool:
    """Whether `node` reads, through at most `hops` equations (a broadcast, the
    `stop_gradient` of `jax.nn.softmax`'s max), a value one of `prims` made."""
    todo, seen = [(node, 0)], {node}
    while todo:
        cur, depth = todo.pop(0)
        for c in flow.producers(cur):
            if graph.node(c).primitive in prims:
                return True
            if c not in seen and depth + 1 < hops:
                seen.add(c)
                todo.append((c, depth + 1))
    return False


def _in_norm(graph: Any, node: str) -> bool:
    """Whether an equation lies in a call of `jnp.linalg.norm` (its stage `norm`)."""
    return any(graph.node(a).label == "norm" for a in _above(graph, graph.node(node)))


def _select_before(flow: _Dataflow, graph: Any, node: str, avoid: str, hops: int = 6) -> Any:
    """The `select_n` (a `jnp.where`, or its transpose) whose values `node` reads
    through at most `hops` floating equations, not through `avoid`; None if none."""
    todo, seen = [(node, 0)], {node, avoid}
    while todo:
        cur, depth = todo.pop(0)
        for c in flow.producers(cur):
            n = graph.node(c)
            select = n if n.primitive == "select_n" else _select_inside(graph, n)
            if select is not None:
                return select
            if c not in seen and depth < hops and n.kind == "eqn" and _inexact(n):
                seen.add(c)
                todo.append((c, depth + 1))
    return None


def _select_inside(graph: Any, call: Any) -> Any:
    """The `select_n` inside a call (`jnp.where` is a `jit`), or None."""
    if call.kind == "eqn":
        return None
    inner = [m for m in graph.nodes if m.primitive == "select_n" and call.id in _above(graph, m)]
    return inner[0] if inner else None


def _steep_before(flow: _Dataflow, graph: Any, eq: Equation, hops: int = 2) -> str | None:
    """The primitive (`_STEEP`) on `eq`'s line whose derivative `eq` computes: `div`
    reads `sqrt`'s value in `0.5 / sqrt(x)`; None when none is found."""
    todo, seen = [(eq.node, 0)], {eq.node}
    while todo:
        cur, depth = todo.pop(0)
        for c in flow.producers(cur):
            n = graph.node(c)
            if n.primitive in _STEEP and (n.source is None or n.source == eq.source):
                return n.primitive
            if c not in seen and depth < hops:
                seen.add(c)
                todo.append((c, depth + 1))
    return None


def _masked_by(traced: Any, graph: Any, node: str, hops: int = 3) -> Any:
    """The `select_n` (a `jnp.where`) reading `node`'s values, directly or through at most
    `hops` other floating equations (`2 * jnp.sqrt(x)`); None when there is none."""
    flow = _Dataflow(traced)
    todo, seen = [(node, 0)], {node}
    while todo:
        cur, depth = todo.pop(0)
        for c in flow.consumers(cur):
            n = graph.node(c)
            if n.primitive == "select_n":
                return n
            if n.kind != "eqn":  # a call (`jnp.where` is a `jit`): the select inside it
                # (its own, not one of a library call it makes: `jnp.trace` masks the
                # off-diagonal with a `where` that zeroes no cotangent of `node`'s)
                inner = [m for m in graph.nodes if m.primitive == "select_n" and m.parent == c]
                if inner:
                    return inner[0]
            if c not in seen and depth < hops and n.kind == "eqn" and _inexact(n):
                seen.add(c)
                todo.append((c, depth + 1))
    return None


def _above(graph: Any, n: Any) -> set[str]:
    out = set()
    while n.parent is not None:
        out.add(n.parent)
        n = graph.node(n.parent)
    return out


def _src(graph: Any, n: Any) -> Any:
    """An equation inside a library function has no user line: its stage's call site."""
    while n.source is None and n.parent is not None:
        n = graph.node(n.parent)
    return n.source


def origins_of(out: Any, probes: Sequence[Any], options: Any) -> Origins | None:
    """The stage-level origins of one instrumented run (`_program.Out`, its `clean` flag
    set), from its probes."""
    finite = getattr(out, "finite", None)
    all_finite = None if finite is None else bool(np.all(host_value(finite)))
    # The program's own flag (`_program.probes_clean`) answers for every probe without
    # reading their summaries' JSON, which `Probe.summaries` makes only when read.
    probes_clean = bool(np.all(host_value(out.clean)))
    if all_finite and probes_clean:
        return None  # the common case: no rule to run
    return find(
        probes,
        out.traced.graph,
        results_finite=all_finite,
        expect_nonfinite=tuple(getattr(options, "expect_nonfinite", ()) or ()),
        reversed_loops=reversed_loops(out.traced),
    )


#: `Inspection._rerun` once located: the answer is `ins.nonfinite`, the arguments are let go.
LOCATED = "located"


def locate_inspection(ins: Any) -> Origins | None:
    """`Inspection.locate_nonfinite`: `locate` on the inspection's own call, once. The
    answer is stored in `ins.nonfinite` (the model's `"nonfinite"`, with `located`
    true); a second call returns it at no cost. An inspection that found every value
    finite (its results, and every value its probes saw) returns None at once: a re-run
    probing every equation costs minutes on a sampler (BlackJAX's NUTS), and would only
    name what a `jnp.where` masked inside a stage."""
    if ins._rerun is LOCATED:
        return ins.nonfinite
    if ins._rerun is None:
        raise ValueError(
            "locate_nonfinite: this Inspection does not know the call that made it (it "
            "was not made by `sowviz.inspect`); call "
            "`sowviz.nonfinite_locate.locate(fn, args, options)` instead."
        )
    if ins.nonfinite is None and results_finite(ins.result):
        ins._rerun = LOCATED  # (nothing to find: the arguments are let go)
        return None
    fn, args, opts = ins._rerun
    alarmed = ins.nonfinite is not None and ins.nonfinite.alarm
    found = kept_record(ins.nonfinite, locate(fn, args, opts, alarmed=alarmed))
    ins.nonfinite, ins._rerun = found, LOCATED
    return found


def kept_record(stored: Origins | None, found: Origins | None) -> Origins | None:
    """What a step's record becomes once `locate` re-ran it: `found`, unless the re-run
    found no alarm where the step's own program raised one. XLA compiles the probed
    program's arithmetic otherwise (a value each probe reads is rounded before the
    next equation reads it, where a fusion may skip that rounding), and values near
    overflow decide on it: then `stored`, saying so. An alarm is never dropped, nor is
    its record replaced by None; a record without one is, when the re-run finds only
    fills. The gradients it names are the step's (`with_step_grads`)."""
    if stored is not None and stored.alarm and (found is None or not found.alarm):
        return replace(not_reproduced(stored), not_reproduced=True)
    if stored is not None and found is None:
        # (no alarm, and every equation probed found only fills, as an empty
        # `segment_min`'s +Inf the step's stage could not tell from its `mul`'s)
        return None
    return stored if found is None else with_step_grads(stored, found)


def locate_step(fn: Callable, args: Sequence[Any], options: Any, nf: Any) -> Any:
    """The Monitor's first non-finite step (`nonfinite.NonFinite`) located down to the
    equation on that step's arguments; `nf` unchanged when the re-run cannot run (its
    arguments were donated, or it fails), with a warning at the user's line, and its
    record kept, saying so, when the re-run finds no alarm (`kept_record`). A Ctrl-C
    during the re-run is raised as `KeyboardInterrupt`, never turned into a warning."""
    import warnings

    from ._caller import user_stacklevel

    def deleted(x: Any) -> bool:
        return isinstance(x, jax.Array) and x.is_deleted()

    def interrupt_of(err: BaseException) -> BaseException | None:
        # A Ctrl-C landing in a C callback (numpy's `__numpy_dtype__` in JAX's tracing)
        # comes out as a `SystemError` whose cause or context is the KeyboardInterrupt.
        seen: set[int] = set()
        e: BaseException | None = err
        while e is not None and id(e) not in seen:
            if isinstance(e, KeyboardInterrupt):
                return e
            seen.add(id(e))
            e = e.__cause__ or e.__context__
        return None

    if any(deleted(x) for x in jax.tree_util.tree_leaves(tuple(args))):
        warnings.warn(
            f"sowviz.Monitor: could not locate the equation that made the NaN/Inf of step "
            f"{nf.step} (the stages that hold it are known): its arguments were deleted "
            "before the Monitor read the step (donated to a jitted update: "
            "`donate_argnums`). Don't donate them, or pass `stop_on_nonfinite=True` (the "
            "Monitor then checks each step before it returns, and locates and stops "
            "there, its arguments intact).",
            RuntimeWarning,
            stacklevel=user_stacklevel(),
        )
        return nf
    try:
        found = locate(fn, args, options, step=nf.step)
    except Exception as err:  # never hide the non-finite step behind a second error
        if interrupt_of(err) is not None:
            raise KeyboardInterrupt from err  # the user's Ctrl-C: stop, as they asked
        warnings.warn(
            f"sowviz: could not locate the non-finite equation of step {nf.step}: {err!r}",
            RuntimeWarning,
            stacklevel=user_stacklevel(),
        )
        return nf
    kept = kept_record(nf.origins, found)
    if found is None or kept.not_reproduced:  # the step's own record (saying why)
        return replace(nf, origins=kept)
    eqns = getattr(options, "capture", None) == "all"
    return NonFinite(nf.step, _node(kept.forward, eqns), _node(kept.backward, eqns), kept)


def _node(o: Any, eqns: bool) -> str | None:
    """An origin's node at the Monitor's granularity: the equation when it probes every
    equation (`capture="all"`), else the stage holding it (backward, with no stage
    known: the node the NaN reached)."""
    if o is None:
        return None
    if eqns and o.equation is not None:
        return o.equation.node
    return o.node or o.reaching
