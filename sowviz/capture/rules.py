"""One capture rule per higher-order construct (`sowviz.primitives.Construct`),
registered in `interpret.RULES`; a rule takes the equation's parameters by name.

Each rule re-evaluates its sub-program(s) with `evaluate`, returns the captured
values from the sub-program as extra outputs, and lifts them into the parent
recorder. Policy (what a loop or branch keeps) lives here; walking lives in
`interpret.py`. Rules run only for equations whose sub-programs hold a sow being
collected: everything else is re-bound untouched.

Semantics (see the README's table):
* jit / closed_call: values pass out unchanged.
* scan (and fori_loop with a static trip count): stacked, one row per iteration.
* cond / switch: the taken branch's value. A name sown in only some branches is
  zeros when another branch runs, with a boolean `taken` alongside it.
* while_loop (and dynamic fori_loop): `loops="last"` keeps the last iteration's
  value, `loops=N` the first N stacked; `iterations` counts them (the innermost
  while loop's count, stacked by the loops around it, as the values are).
  A `vmap`ped loop whose condition depends on the mapped values (one predicate per
  lane) runs while any lane does, as JAX runs it: its rows and `iterations` are
  those steps, and every lane has a value in each. A lane that finished early (or
  never ran) keeps its carry frozen, and the body runs again on that final carry, its
  result discarded: that lane's values in the later rows (and under `loops="last"`)
  are what its next step would compute from the state it stopped in, repeated, not
  values of its own run. A NaN such a step makes is counted, as the program computes
  it too, and `locate_nonfinite` reports it masked afterwards when no result is NaN.
  The backward loop of Equinox's checkpointed while loop (diffrax's default adjoint)
  runs the forward steps last first, recomputing some: it keeps only cotangents, row
  i step i's.
* checkpoint / remat: re-bound as checkpoint with the values as extra outputs.
* custom_jvp / custom_vjp calls: we only execute (never differentiate) the
  rewritten program, so the call is inlined: its body is what runs.
* shard_map: values stacked along one new leading axis per manual mesh axis the
  value varies over; a value every device holds alike along an axis is kept once.
"""

from __future__ import annotations

from dataclasses import replace

import jax
import jax.numpy as jnp
from jax import lax

from .. import _compat
from ..primitives import Construct
from .interpret import CaptureError, contains_capture, evaluate_closed, register
from .packing import Carried, Passed, Template
from .record import Recorder


def _avals(eqn) -> list:
    return [v.aval for v in eqn.invars]


def _traced_body(eqn, closed, rec: Recorder) -> tuple[object, Recorder, Passed]:
    """Trace `closed` (the eqn's sub-program) with captures as extra outputs, as
    `Passed` lays them out (`Passed.of`: a loop's buffer once, not its cuts)."""
    child = rec.child()
    passed: list[Passed] = []  # the layout, found while the body is traced

    def body(*args):
        child.reset()
        outs = evaluate_closed(closed, args, child)
        passed[:] = [Passed.of(child.flat())]
        return [*outs, *passed[0].outputs]

    new = _compat.trace_closed(body, _avals(eqn), name=str(eqn.primitive))
    return new, child, passed[0]


def _discover(closed, in_avals, rec: Recorder, packs: bool) -> Recorder:
    """Trace `closed` once to learn what it captures; values become `Template`s.
    `packs`: as the child recorder that traces it for real (`Recorder.packs`)."""
    child = rec.child(packs)
    _compat.trace_closed(lambda *a: evaluate_closed(closed, a, child), in_avals)
    # One template per traced value: a value captured twice stays one (`Carried`).
    specs: dict[int, Template] = {}

    def spec(v):
        if id(v) not in specs:
            specs[id(v)] = Template.of(v)
        return specs[id(v)]

    for c in child.captures:
        c.values = [spec(v) for v in c.values]
        c.meta = {k: spec(v) for k, v in c.meta.items()}
    return child


def _zeros(v):
    return jnp.zeros(v.shape, v.dtype)


@register(Construct.JIT)
def _jit(eqn, invals, rec, *, jaxpr, out_shardings, out_layouts, **params):
    new, child, passed = _traced_body(eqn, jaxpr, rec)
    n_out, n_new = len(eqn.outvars), len(new.out_avals)
    extra = n_new - n_out
    params = dict(
        params,
        jaxpr=new,
        out_shardings=(*out_shardings, *[_compat.UNSPECIFIED_SHARDING] * extra),
        out_layouts=(*out_layouts, *[None] * extra),
    )
    outs = eqn.primitive.bind(*invals, **params)
    rec.lift(child, passed.values(outs[n_out:]))
    return list(outs[:n_out])


@register(Construct.CALL)
def _closed_call(eqn, invals, rec, *, call_jaxpr, **_):
    return evaluate_closed(call_jaxpr, invals, rec)


@register(Construct.CUSTOM_JVP, Construct.CUSTOM_VJP)
def _custom(eqn, invals, rec, *, call_jaxpr, **_):
    # The rewritten program is run, never differentiated (derivatives were taken
    # before we saw it), so the custom rule has no role left: run the body.
    return evaluate_closed(call_jaxpr, invals, rec)


@register(Construct.SCAN)
def _scan(eqn, invals, rec, *, jaxpr, length, reverse, unroll, **layout_params):
    # The operand layout's params changed in JAX 0.11: `_compat.scan_layout` reads them.
    closed = jaxpr
    layout = _compat.scan_layout(layout_params)
    nc, ncar = layout.num_consts, layout.num_carry
    consts, init, xs = invals[:nc], invals[nc : nc + ncar], invals[nc + ncar :]
    child = rec.child(packs=True)
    packed_as: list[Carried] = []  # the captures' layout, found while the body is traced

    def body(carry, x):
        child.reset()
        outs = evaluate_closed(closed, [*consts, *carry, *x], child)
        flat = child.flat()
        packed_as[:] = [Carried.of(flat, pack=rec.packs)]
        return outs[:ncar], (outs[ncar:], packed_as[0].pack(flat))

    carry, (ys, stacked) = lax.scan(
        body, list(init), list(xs), length=length, reverse=reverse, unroll=unroll
    )
    # stacked per buffer, not per value (`Carried`), then cut into the values
    rec.lift(child, packed_as[0].unpack(stacked, lead=1), axis="scan")
    return [*carry, *ys]


@register(Construct.COND)
def _cond(eqn, invals, rec, *, branches, **_):
    index, ops = invals[0], invals[1:]
    in_avals = _avals(eqn)[1:]

    # Discover what each branch captures, then give every branch the union.
    found = [_discover(br, in_avals, rec, packs=False) for br in branches]
    slots: list[tuple] = []  # (key, template capture)
    slot_of: list[list[int]] = []
    for child in found:
        seen: dict[tuple, int] = {}
        mine: list[int] = []
        for c in child.captures:
            avals = tuple((v.shape, v.dtype) for v in c.flat())
            base = (c.site.name, c.site.tag, c.site.mode, c.site.leaves, avals)
            k = (*base, seen.get(base, 0))
            seen[base] = seen.get(base, 0) + 1
            idx = next((i for i, (key, _) in enumerate(slots) if key == k), None)
            if idx is None:
                slots.append((k, c))
                idx = len(slots) - 1
            mine.append(idx)
        slot_of.append(mine)
    # Per slot, the branches that sow it; a slot not sown by every branch has a `taken`
    # flag, one per such pattern: the slots of one branch share theirs (one output of
    # the `cond`, and one mask for their summaries, not one per slot).
    sown = [tuple(i in m for m in slot_of) for i in range(len(slots))]
    patterns = list(dict.fromkeys(p for p in sown if not all(p)))

    def make_branch(b):
        br = branches[b]

        def run(*a):
            child = rec.child(packs=False)
            outs = evaluate_closed(br, a, child)
            vals: list = [None] * len(slots)
            for slot, c in zip(slot_of[b], child.captures, strict=True):
                vals[slot] = c.flat()
            extra = [
                got if got is not None else [_zeros(v) for v in tmpl.flat()]
                for got, (_, tmpl) in zip(vals, slots, strict=True)
            ]
            return outs, (extra, [jnp.asarray(p[b]) for p in patterns])

        return run

    outs, (extra, flags) = lax.switch(index, [make_branch(b) for b in range(len(branches))], *ops)
    for vals, (_, tmpl), p in zip(extra, slots, sown, strict=True):
        cap = tmpl.rebuilt(vals, None)
        if not all(p):
            # A `taken` of a `cond` inside this branch stands too: the sow ran if both did.
            flag, inner = flags[patterns.index(p)], cap.meta.get("taken")
            cap.meta["taken"] = flag if inner is None else flag & inner
        rec.captures.append(cap)
    return list(outs)


@register(Construct.WHILE)
def _while(eqn, invals, rec, *, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts, **_):
    cond_closed, body_closed = cond_jaxpr, body_jaxpr
    cnc, bnc = cond_nconsts, body_nconsts
    if contains_capture(_compat.jaxpr_and_consts(cond_closed)[0], rec.options.tags):
        raise CaptureError(
            "sowviz cannot capture a value sown inside a while_loop's `cond_fun` (at "
            f"{_compat.user_location(eqn) or 'unknown location'}): the condition runs once "
            "more than the body and returns only a boolean. Sow the value in `body_fun` instead."
        )
    cconsts, bconsts, init = invals[:cnc], invals[cnc : cnc + bnc], invals[cnc + bnc :]
    loops = rec.options.loops
    backward = _is_checkpointed_backward(eqn, cnc + bnc)

    # Discover the captured avals so the loop can carry buffers for them.
    probe = _discover(body_closed, _avals(eqn)[cnc:], rec, packs=True)
    if backward:
        probe.captures = _backward_kept(probe.captures)
    # carried per buffer, not per value (`Carried`), where the cuts are packed or passed
    carried = Carried.of([v for c in probe.captures for v in c.flat()], pack=rec.packs)
    rows = () if loops == "last" else (loops,)

    # A `vmap`ped loop whose condition depends on the mapped values has one predicate
    # per lane (`lanes`, its shape), which `lax.while_loop` refuses: see `_lanes_that_ran`.
    lanes = _compat.jaxpr_and_consts(cond_closed)[0].outvars[0].aval.shape

    def running(carry):
        return evaluate_closed(cond_closed, [*cconsts, *carry], rec.child())[0]

    def cond_fn(state):
        carry, _, _ = state
        return jnp.any(running(carry)) if lanes else running(carry)

    def body_fn(state):
        carry, bufs, i = state
        child = rec.child(packs=True)
        new_carry = evaluate_closed(body_closed, [*bconsts, *carry], child)
        if lanes:
            new_carry = _lanes_that_ran(running(carry), new_carry, carry)
        if backward:
            vals = [v for c in _backward_kept(child.captures) for v in c.flat()]
            row, here = _backward_row(carry, new_carry, init, loops)
        else:
            vals = child.flat()
            row, here = i, (True if loops == "last" else i < loops)
        return new_carry, _kept_rows(bufs, carried.pack(vals), row, here, loops), i + 1

    state0 = (list(init), carried.zeros(rows), jnp.zeros((), jnp.int32))
    carry, bufs, count = lax.while_loop(cond_fn, body_fn, state0)
    if backward:  # its rows are the forward loop's steps: as many as that loop ran
        count = jnp.asarray(init[_STEP_GRAD], jnp.int32)
    before = len(rec.captures)
    rec.lift(probe, carried.unpack(bufs, lead=len(rows)), axis=None if rows == () else "while")
    for c in rec.captures[before:]:
        # A while loop nested in this one keeps its own counts, stacked per row of this
        # loop (as a scan stacks them): they tell its zero rows from its values, and
        # this loop's rows that never ran hold a count of 0 there. This loop's count
        # alone would leave the inner padding counted as values.
        c.meta.setdefault("iterations", count)
    return list(carry)


def _lanes_that_ran(pred, new_carry: list, carry: list) -> list:
    """The carry after one step of a loop with a batched predicate (`vmap` of a while
    loop whose condition depends on the mapped values: `pred` is one boolean per lane,
    its shape the leading axes of every carry value). `lax.while_loop` wants a scalar
    predicate, so the loop runs while any lane does (`jnp.any`), and a lane whose
    predicate is false keeps its carry, as JAX's own lowering of such a loop selects it
    (`_while_lowering`, JAX 0.10 to 0.12)."""
    return [
        lax.select(lax.broadcast_in_dim(pred, jnp.shape(c), range(pred.ndim)), n, c)
        for n, c in zip(new_carry, carry, strict=True)
    ]


def _kept_rows(bufs: list, vals: list, row, here, loops) -> list:
    """The loop's buffers with this iteration's `vals` written where `loops` keeps
    them: the latest value (`"last"`) or row `row` of the first `loops`, when `here`."""
    if loops == "last":
        if here is True:
            return list(vals)
        return [jnp.where(here, v, b) for b, v in zip(bufs, vals, strict=True)]
    slot = jnp.clip(row, 0, loops - 1)
    return [
        jnp.where(here, lax.dynamic_update_index_in_dim(b, v, slot, 0), b)
        for b, v in zip(bufs, vals, strict=True)
    ]


# Equinox's checkpointed while loop (`eqxi.while_loop(kind="checkpointed")`: diffrax's
# default `RecursiveCheckpointAdjoint`, optimistix's solvers) differentiates a loop with
# a `custom_vjp` whose backward pass is a second while loop, named in the name stack.
# Checked with Equinox 0.13.8 (`_checkpointed_while_loop_bwd`).
_BACKWARD_SCOPE = "checkpointed-bwd"
# Its carry starts `(step_val, step_grad_val, step_next_checkpoint, index, ...)`, four
# integer scalars: `step_grad_val` counts down from the forward loop's number of steps,
# by one at each "U-turn", the iteration that pulls the cotangent back through step
# `step_grad_val - 1`. The others recompute forward steps from checkpoints.
_STEP_GRAD = 1
_COUNTERS = 4


def _is_checkpointed_backward(eqn, nconsts: int) -> bool:
    """Whether `eqn` is the backward pass of Equinox's checkpointed while loop, with the
    carry layout read by `_backward_row` (else it is captured as any while loop)."""
    if ("scope", _BACKWARD_SCOPE) not in _compat.name_stack_kinds(eqn):
        return False
    carry = _avals(eqn)[nconsts:]
    return len(carry) > _COUNTERS and all(
        a.shape == () and jnp.issubdtype(a.dtype, jnp.integer) for a in carry[:_COUNTERS]
    )


def _backward_row(carry: list, new_carry: list, init: list, loops):
    """The forward step whose cotangent this backward iteration computed, and whether
    it is kept: a U-turn (`step_grad_val` went down) at step `step_grad_val - 1`; with
    `loops="last"` the forward loop's last step (the first U-turn)."""
    before, after = carry[_STEP_GRAD], new_carry[_STEP_GRAD]
    step = before - 1
    u_turn = after < before
    if loops == "last":
        return step, u_turn & (step == init[_STEP_GRAD] - 1)
    return step, u_turn & (step < loops)


def _backward_kept(captures: list) -> list:
    """What a checkpointed backward pass contributes: the cotangents (and their
    derivatives), one per forward step. Its primal values, and their tangents, are the
    forward steps recomputed from checkpoints: the forward loop recorded those. The
    `taken` flag of Equinox's own U-turn `cond` is dropped: the forward loop's flags
    (a user's `cond`) are the entry's, and hold for these rows, now in forward order."""
    kept = []
    for c in captures:
        if "cotangent" not in c.site.mode.split("."):
            continue
        # row i is the forward loop's step i: one evaluation with the forward loop's
        # rows (a `custom_vjp`'s forward pass, never differentiated), which `api`
        # pairs with these cotangents (`api._first_evaluations`)
        site = replace(c.site, evaluation=0)
        kept.append(replace(c, site=site, meta={k: v for k, v in c.meta.items() if k != "taken"}))
    return kept


@register(Construct.REMAT)
def _remat(eqn, invals, rec, *, jaxpr, **params):
    new, child, passed = _traced_body(eqn, _compat.as_closed(jaxpr), rec)
    open_jaxpr, consts = _compat.closed_to_open(new)
    outs = eqn.primitive.bind(*consts, *invals, **dict(params, jaxpr=open_jaxpr))
    n_out = len(eqn.outvars)
    rec.lift(child, passed.values(outs[n_out:]))
    return list(outs[:n_out])


@register(Construct.SHARD_MAP)
def _shard_map(
    eqn, invals, rec, *, jaxpr, mesh, in_specs, out_specs, newly_manual_axes, check_vma, **_
):
    manual = [a for a in mesh.axis_names if a in newly_manual_axes]
    child = rec.child(packs=False)
    # Per capture, the manual axes it is stacked along: those its values vary over.
    # One that every device holds alike along an axis (a `pmean`'s result, a
    # replicated parameter) leaves that axis out, as the user's own `out_specs`
    # would: one copy, not one per device (which counted it mesh-size times). Only
    # known when JAX checks the values' types (`check_vma`); else every axis stays.
    stacked: list[tuple[str, ...]] = []
    # Filled while the body is traced: `jax.shard_map` matches `out_specs` to the
    # body's outputs after tracing it (it must: they are a prefix of that tree).
    extra_specs: list = []

    def body(*args):
        child.reset()
        stacked.clear()
        extra_specs.clear()
        outs = evaluate_closed(jaxpr, args, child)
        extra = []
        for c in child.captures:
            values = c.flat()
            varying = frozenset().union(*map(_compat.varying_axes, values))
            axes = tuple(a for a in manual if a in varying or not check_vma)
            stacked.append(axes)
            for v in values:
                missing = tuple(a for a in axes if a not in _compat.varying_axes(v))
                if check_vma and missing:
                    v = lax.pcast(v, missing, to="varying")
                extra.append(jnp.reshape(v, (1,) * len(axes) + jnp.shape(v)))
                extra_specs.append(jax.sharding.PartitionSpec(*axes))
        return list(outs), extra

    outs, extra = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=tuple(in_specs),
        out_specs=(list(out_specs), extra_specs),
        axis_names=frozenset(newly_manual_axes),
        check_vma=check_vma,
    )(*invals)
    before = len(rec.captures)
    rec.lift(child, extra)
    for c, axes in zip(rec.captures[before:], stacked, strict=True):
        c.site = replace(c.site, axes=(*(f"mesh:{a}" for a in axes), *c.site.axes))
    return list(outs)
