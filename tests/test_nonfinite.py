"""NaN origins against an independent oracle: the same program's jaxpr run one equation
at a time in plain JAX (eager), reporting the first equation whose output is non-finite.

sowviz finds origins from on-device summaries of a compiled program and the stage
graph; the oracle shares none of that code. A forward case compares with the oracle
on `jax.make_jaxpr(f)`; a backward case on `jax.make_jaxpr(jax.grad(f))`, where the
first non-finite equation is either the forward op's derivative coefficient or the
transposed op: both carry the source line of the forward op whose backward rule
made the NaN, which is the line sowviz must name.
"""

from __future__ import annotations

import json
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import sowviz
from sowviz import _compat
from sowviz.nonfinite import find
from sowviz.nonfinite_locate import locate
from sowviz.options import InspectOptions

# ---------------------------------------------------------------------------
# The oracle


def _kinds(x) -> set[str]:
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.inexact):
        return set()
    return {
        k
        for k, bad in (("nan", np.isnan(x)), ("posinf", x == np.inf), ("neginf", x == -np.inf))
        if bad.any()
    }


def _sub(eqn, name):
    val = eqn.params[name]
    j = getattr(val, "jaxpr", val)
    consts = list(getattr(val, "consts", ()) or getattr(j, "consts", ()) or ())
    return j, consts


def _eval(jaxpr, consts, args, found, skip, outer=((), None)):
    """Run `jaxpr` eagerly; `outer` is (scopes, source location) of the enclosing call."""
    env = {}

    def read(v):
        return v.val if hasattr(v, "val") and not hasattr(v, "count") else env[v]

    for v, c in zip(jaxpr.constvars, consts, strict=True):
        env[v] = c
    for v, a in zip(jaxpr.invars, args, strict=True):
        env[v] = a
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        scopes = (*outer[0], *(n for k, n in _compat.name_stack_kinds(eqn) if k == "scope"))
        here = (scopes, _compat.user_location_outside_libraries(eqn) or outer[1])
        if name in ("pjit", "jit", "closed_call", "core_call", "remat", "checkpoint"):
            key = "jaxpr" if "jaxpr" in eqn.params else "call_jaxpr"
            outs = _eval(*_sub(eqn, key), ins, found, skip, here)
        elif name in ("custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"):
            key = "call_jaxpr" if "call_jaxpr" in eqn.params else "fun_jaxpr"
            outs = _eval(*_sub(eqn, key), ins, found, skip, here)
        elif name == "cond":
            branches = eqn.params["branches"]
            b = branches[int(np.clip(ins[0], 0, len(branches) - 1))]
            j, c = getattr(b, "jaxpr", b), list(getattr(b, "consts", ()))
            outs = _eval(j, c, ins[1:], found, skip, here)
        elif name == "scan":
            outs = _scan(eqn, ins, found, skip, here)
        elif name == "while":
            outs = _while(eqn, ins, found, skip, here)
        else:
            bound = eqn.primitive.get_bind_params(eqn.params)
            subfuns, params = bound if isinstance(bound, tuple) else ((), bound)  # JAX 0.10
            outs = eqn.primitive.bind(*subfuns, *ins, **params)
            if not eqn.primitive.multiple_results:
                outs = [outs]
            kinds = set().union(*(_kinds(o) for o in outs))
            if any(s in skip for s in scopes):  # expected: what it holds may flow on
                skip["kinds"] = skip.get("kinds", set()) | kinds
            elif kinds - skip.get("kinds", set()):
                loc = here[1]
                found.append((name, None if loc is None else loc.line, loc, scopes, tuple(_AT)))
        for v, o in zip(eqn.outvars, outs, strict=True):
            env[v] = o
    return [read(v) for v in jaxpr.outvars]


def _scan(eqn, ins, found, skip, here):
    p = eqn.params
    body, consts = _sub(eqn, "jaxpr")
    layout = _compat.scan_layout(p)  # num_consts / num_carry moved in JAX 0.11
    nc, ncarry, length = layout.num_consts, layout.num_carry, p["length"]
    c, carry, xs = ins[:nc], ins[nc : nc + ncarry], ins[nc + ncarry :]
    ys = []
    order = range(length - 1, -1, -1) if p.get("reverse") else range(length)
    for i in order:
        _AT.append(i)  # (the index of the slice it reads, as its stacked values are)
        outs = _eval(body, consts, [*c, *carry, *[x[i] for x in xs]], found, skip, here)
        _AT.pop()
        carry, y = outs[:ncarry], outs[ncarry:]
        ys.append(y)
    if p.get("reverse"):
        ys.reverse()
    stacked = [jnp.stack([y[k] for y in ys]) for k in range(len(ys[0]))] if ys else []
    return [*carry, *stacked]


def _while(eqn, ins, found, skip, here):
    p = eqn.params
    cond, cc = _sub(eqn, "cond_jaxpr")
    body, bc = _sub(eqn, "body_jaxpr")
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = ins[:nc], ins[nc : nc + nb], ins[nc + nb :]
    i = 0
    while bool(_eval(cond, cc, [*cconsts, *carry], [], skip, here)[0]):
        _AT.append(i)
        carry = _eval(body, bc, [*bconsts, *carry], found, skip, here)
        _AT.pop()
        i += 1
    return carry


#: The iterations of the loops `_eval` is in, the outermost first.
_AT: list[int] = []


def oracle(f, *args, grad=False, skip=(), scopes=False):
    """(primitive, line, location) of the first equation, in execution order, with a
    non-finite output. Equations under the scopes `skip` may hold non-finite values;
    after them, an output counts only when it holds a kind of non-finite value (NaN,
    +Inf, -Inf) that they did not."""
    g = jax.grad(f) if grad else f
    closed = jax.make_jaxpr(g)(*args)
    found: list = []
    _eval(closed.jaxpr, list(closed.consts), list(args), found, dict.fromkeys(skip))
    if not found:
        return None
    return found[0][:4] if scopes else found[0][:3]  # (..., the named scopes around it)


def oracle_iteration(f, *args) -> tuple[int, ...]:
    """The iterations, per loop holding it (the outermost first), at which the first
    equation with a non-finite output made it."""
    closed = jax.make_jaxpr(f)(*args)
    found: list = []
    _eval(closed.jaxpr, list(closed.consts), list(args), found, {})
    return found[0][4]


# ---------------------------------------------------------------------------
# Cases: each (fn, args) has exactly one origin.


def f_grouped_results(x):
    # The NaN leaves in a dict of results, drawn as one group of outputs: the group is
    # where values go, never a stage that reads them.
    with jax.named_scope("bad"):
        h = jnp.log(x - 1.0)  # the origin (x = 0.5)
    with jax.named_scope("after"):
        g = jnp.tanh(h)
    return {"a": h * 2.0, "b": g, "c": x}


def f_log_negative(x):
    with jax.named_scope("feat"):
        h = jnp.tanh(x)
    with jax.named_scope("bad"):
        h = h * 2.0
        h = jnp.log(h - 3.0)  # the origin
    return jnp.sum(h * h)


def f_zero_over_zero(x):
    with jax.named_scope("ratio"):
        d = x - x
        r = d / d  # the origin
    return jnp.sum(jnp.tanh(r))


def f_exp_overflow(x):
    with jax.named_scope("energy"):
        e = jnp.exp(x * 100.0)  # the origin
        e = e / 2.0
    return jnp.sum(e)


def f_masked_softmax(s, mask):
    with jax.named_scope("mask"):
        s = jnp.where(mask, s, -jnp.inf)
    with jax.named_scope("softmax"):
        m = jnp.max(s, axis=-1, keepdims=True)
        z = s - m  # the origin: -inf - -inf on the fully masked row
        p = jnp.exp(z) / jnp.sum(jnp.exp(z), axis=-1, keepdims=True)
    return jnp.sum(p * p)


def f_sqrt_at_zero(x):
    with jax.named_scope("proj"):
        h = x * 0.0
    with jax.named_scope("root"):
        r = jnp.sqrt(h)  # backward origin: d sqrt/dx = inf at 0
    return jnp.sum(r)


def f_norm_at_zero(w, x):
    with jax.named_scope("data"):
        d = jnp.sum(jnp.tanh(x))
    return d + 1e-3 * jnp.linalg.norm(w)  # backward origin, parameter gradient only


def f_where_trap(x):
    with jax.named_scope("safe_log"):
        y = jnp.where(x > 0, jnp.log(x), 0.0)  # forward -inf masked; backward NaN
    return jnp.sum(y)


def f_scan(x):
    def body(c, xi):
        with jax.named_scope("step"):
            a = c * 1.5
            b = jnp.log(a - 4.0)  # NaN from finite a on the first iteration(s)
        return jnp.where(jnp.isfinite(b), b, b), a

    c, ys = lax.scan(body, x, jnp.arange(3.0))
    return jnp.sum(c) + jnp.sum(ys)


def f_cond(x):
    def yes(h):
        with jax.named_scope("inner"):
            return jnp.log(h - 5.0)  # the origin (taken branch)

    def no(h):
        return h * 2.0

    return jnp.sum(lax.cond(jnp.sum(x) > 0, yes, no, x))


def f_remat(x):
    @jax.checkpoint
    def block(h):
        with jax.named_scope("root"):
            return jnp.sqrt(h)  # backward origin at h == 0

    with jax.named_scope("zero"):
        h = x * 0.0
    return jnp.sum(block(h))


@jax.custom_vjp
def shaky(x):
    return x * 2.0


def _shaky_fwd(x):
    return x * 2.0, x


def _shaky_bwd(x, g):
    return (g / (x - x),)  # backward origin: g / 0 inside the custom rule


shaky.defvjp(_shaky_fwd, _shaky_bwd)


def f_custom_vjp(x):
    with jax.named_scope("pre"):
        h = jnp.tanh(x)
    return jnp.sum(shaky(h))


def f_neg_log(p):
    lp = jnp.log(p)  # the origin: -Inf at p = 0
    return -jnp.sum(lp)  # a sign flip makes +Inf of it, no new value


X = jnp.array([0.5, 1.0, 1.5], jnp.float32)
FORWARD = {
    "neg_log": (f_neg_log, (jnp.array([0.0, 0.5]),)),
    "log_negative": (f_log_negative, (X,)),
    "zero_over_zero": (f_zero_over_zero, (X,)),
    "exp_overflow": (f_exp_overflow, (X * 10.0,)),
    "cond": (f_cond, (X,)),
    "grouped_results": (f_grouped_results, (X,)),
}
BACKWARD = {
    "sqrt_at_zero": (f_sqrt_at_zero, (X,)),
    "remat": (f_remat, (X,)),
}


def _line(origin) -> int | None:
    eq = origin.equation
    return None if eq is None or eq.source is None else eq.source.line


def _opts(**kw):
    return InspectOptions(**kw)


@pytest.mark.parametrize("case", sorted(FORWARD))
def test_forward_origin_matches_the_oracle(case):
    f, args = FORWARD[case]
    prim, line, _ = oracle(f, *args)
    o = locate(f, args, _opts(mode="primal"))
    assert o is not None and o.forward is not None, case
    assert (o.forward.equation.primitive, _line(o.forward)) == (prim, line)
    assert o.alarm and not o.removed
    assert f"`{prim}`" in o.forward.message and f":{line}" in o.forward.message
    # stages that only pass the value on are propagators, never the producer
    assert o.forward.node not in o.propagators


def test_scan_origin_by_iteration():
    # `b` is NaN from the first iteration; `a`, earlier in the body, only from the next
    # one (it reads the NaN carry): the producer is `b`, found by iteration, not order.
    prim, line, _ = oracle(f_scan, X)
    assert prim == "log"
    o = locate(f_scan, (X,), _opts(mode="primal"))
    assert (o.forward.equation.primitive, _line(o.forward)) == (prim, line)


@pytest.mark.parametrize("case", sorted(BACKWARD))
def test_backward_only_origin_matches_the_oracle(case):
    f, args = BACKWARD[case]
    assert oracle(f, *args) is None  # the forward pass is finite
    _, line, _ = oracle(f, *args, grad=True)
    o = locate(f, args, _opts())
    assert o is not None and o.forward is None and o.backward is not None
    assert _line(o.backward) == line
    assert "born in the backward of" in o.backward.message


def test_masked_softmax_row_the_producer_is_the_subtraction_not_the_mask():
    s = jnp.arange(6.0).reshape(2, 3)
    mask = jnp.array([[True, False, True], [False, False, False]])
    prim, line, _ = oracle(f_masked_softmax, s, mask, skip=("mask",))
    assert prim == "sub"  # -inf - -inf: the first NaN; the row's max (-inf) passes -inf on
    o = locate(f_masked_softmax, (s, mask), _opts(mode="primal"), expect_nonfinite=("mask",))
    assert (o.forward.equation.primitive, _line(o.forward)) == (prim, line)
    # the mask is recognised as expected, not as a propagator or the producer
    assert o.expected and not set(o.expected) & set(o.propagators)
    # without the option, the mask's -inf comes first, but the result holds only NaN,
    # which the mask does not: the producer is still the subtraction, and the message
    # names the mask's earlier -Inf
    first = oracle(f_masked_softmax, s, mask, scopes=True)
    assert "mask" in first[3]  # the mask's -inf is the first non-finite value
    plain = locate(f_masked_softmax, (s, mask), _opts(mode="primal"))
    assert (plain.forward.equation.primitive, _line(plain.forward)) == (prim, line)
    msg = sowviz.inspect(f_masked_softmax, s, mask, mode="primal").nonfinite.forward.message
    assert "before it, `where`" in msg and "held -Inf" in msg, msg  # the mask's `jnp.where`


def f_partly_masked(s, mask):
    with jax.named_scope("mask"):
        s = jnp.where(mask, s, -jnp.inf)
    with jax.named_scope("softmax"):
        p = jax.nn.softmax(s, axis=-1)
    return jnp.sum(p * p)


PARTLY_MASKED = (
    jnp.arange(6.0).reshape(2, 3),
    jnp.array([[True, False, True], [False, True, True]]),
)


def test_masked_inf_that_never_reaches_a_result_is_removed():
    f, (s, mask) = f_partly_masked, PARTLY_MASKED
    assert np.isfinite(f(s, mask)) and np.all(np.isfinite(jax.grad(f)(s, mask)))
    o = locate(f, (s, mask), _opts())
    assert o.forward is not None and o.removed and not o.alarm
    assert "masked afterwards" in o.message


def test_inspect_finds_a_masked_inf_though_every_result_is_finite():
    # Value and gradient are finite: only the probes' own flag tells that one counted -inf.
    ins = sowviz.inspect(f_partly_masked, *PARTLY_MASKED)
    o = ins.nonfinite
    assert o is not None and o.removed and not o.alarm
    born = ins.graph.node(o.forward.node)  # jnp.where's own jit, inside the scope
    assert (born.label, ins.graph.node(born.parent).label) == ("where", "mask")
    assert ins.probe("mask").summaries["primal"]["neginf"] == 2


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e5m2"])
def test_a_nan_gradient_in_low_precision_is_an_alarm_not_removed(dtype):
    # NumPy counts bfloat16 and the float8 types (ml_dtypes) as no floats: their NaN
    # gradients were skipped, and the result called "masked afterwards", no alarm.
    def loss(w, x):
        h = x @ w
        return jnp.mean(jnp.where(h > 0, jnp.sqrt(h), 0.0))

    w = (jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)).astype(dtype)
    x = jnp.ones((2, 4), dtype)
    plain = np.asarray(jax.grad(loss)(w, x)).astype(np.float32)
    assert np.isnan(plain).any()
    ins = sowviz.inspect(loss, w, x)
    o = ins.locate_nonfinite()
    assert o.alarm and not o.removed, o.message
    assert "non-finite gradient of `w`" in o.message, o.message


def _two_origins(params, x, safe_norm=False, safe_sqrt=False):
    h = x @ params["w"]
    with jax.named_scope("guard"):
        inner = jnp.where(h > 0, h, 1.0) if safe_sqrt else h
        y = jnp.where(h > 0, jnp.sqrt(inner), 0.0)
    b = params["b"]
    norm = jnp.sqrt(jnp.sum(b**2) + 1e-12) if safe_norm else jnp.linalg.norm(b)
    return jnp.mean(y) + norm


def test_two_independent_nan_gradient_origins_are_said_apart():
    # The where-guarded sqrt breaks only w's gradient, norm at zero only b's: the
    # message named one origin, then both gradients after it, as if it broke both.
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(4, 6)), jnp.float32), "b": jnp.zeros(3)}
    x = jnp.asarray(rng.normal(size=(8, 4)), jnp.float32)
    nan = lambda g: {k: bool(jnp.isnan(v).any()) for k, v in g.items()}  # noqa: E731
    assert nan(jax.grad(_two_origins)(params, x)) == {"w": True, "b": True}
    # each origin alone breaks the gradient its message names
    assert nan(jax.grad(lambda p, x: _two_origins(p, x, safe_norm=True))(params, x)) == {
        "w": True,
        "b": False,
    }
    assert nan(jax.grad(lambda p, x: _two_origins(p, x, safe_sqrt=True))(params, x)) == {
        "w": False,
        "b": True,
    }
    ins = sowviz.inspect(_two_origins, params, x)
    said = {
        "guard": "gradient of `parameters/w`; another origin made the non-finite gradient of "
        "`parameters/b`",
        "norm": "gradient of `parameters/b`; another origin made the non-finite gradient of "
        "`parameters/w`",
    }
    for o in (ins.nonfinite, ins.locate_nonfinite()):
        origin = ins.graph.node(o.backward.node).label
        assert said[origin] in o.backward.message, o.backward.message


def test_where_trap_forward_removed_and_backward_born_in_log():
    x = jnp.array([0.0, 1.0, 2.0])
    prim, line, _ = oracle(f_where_trap, x)
    _, gline, _ = oracle(f_where_trap, x, grad=True)
    o = locate(f_where_trap, (x,), _opts())
    assert (o.forward.equation.primitive, _line(o.forward)) == (prim, line) == ("log", line)
    assert o.removed is False  # the gradient is NaN: a result is non-finite
    assert _line(o.backward) == gline == line
    assert o.backward.equation.primitive == "log"
    # the value is finite, the gradient is not: the message names the trap and its way out
    assert "the value is finite" in o.backward.message and "double-where" in o.backward.message
    assert "`log`" in o.message.split("the value is finite")[1]
    # a NaN that reaches the value is no masked branch
    o = locate(f_log_negative, (X,), _opts())
    assert o.backward is not None and "double-where" not in o.message


def test_parameter_gradient_only():
    w = jnp.zeros((3,))
    x = jnp.ones((2,))
    assert np.isfinite(f_norm_at_zero(w, x))
    g = jax.grad(f_norm_at_zero)(w, x)
    assert not np.all(np.isfinite(g))  # only the parameter gradient is bad
    _, line, _ = oracle(f_norm_at_zero, w, x, grad=True)
    o = locate(f_norm_at_zero, (w, x), _opts())
    assert o is not None and o.forward is None and o.alarm
    assert _line(o.backward) == line
    assert "norm" in o.backward.message
    # the one gradient an update would apply NaN from, by the name the graph shows
    assert o.backward.message.endswith("; non-finite gradient of `w`"), o.backward.message


def test_custom_vjp_rule_is_named_as_the_stage():
    assert oracle(f_custom_vjp, X) is None
    _, line, _ = oracle(f_custom_vjp, X, grad=True)
    o = locate(f_custom_vjp, (X,), _opts())
    # the oracle's transposed equations point at the call (`line`); locate looks inside
    # the rule and names its own line, `g / (x - x)` (`nonfinite_custom`)
    assert o.forward is None and _line(o.backward) == _shaky_bwd.__code__.co_firstlineno + 1
    assert o.backward.equation.primitive == "div" and line != _line(o.backward)
    assert "in the backward rule of `shaky`" in o.backward.message


def test_summary_rule_on_stage_probes_agrees():
    # the stage-level rule (what inspect and the Monitor store) names the stage that
    # holds the oracle's equation; every other non-finite stage is a propagator
    from sowviz._program import runner_for
    from sowviz.inspection import inspection_of

    opts = _opts(mode="primal")
    out = runner_for(f_log_negative, opts).run((X,), where="test")
    ins = inspection_of(out, opts)
    o = find(ins.probes, ins.graph)
    _, line, _ = oracle(f_log_negative, X)
    node = ins.graph.node(o.forward.node)
    assert node.label == "bad" and node.source.line <= line
    bad = {p.node for p in ins.probes if any(s["nan"] for s in p.summaries.values())}
    assert o.forward.node in bad and set(o.propagators) == bad - {o.forward.node}


TESSERACTS = pathlib.Path(__file__).parent / "fixtures" / "tesseracts"


def test_tesseract_stage_origin():
    pytest.importorskip("tesseract_jax")
    from tesseract_core import Tesseract
    from tesseract_jax import apply_tesseract

    scale = Tesseract.from_tesseract_api(TESSERACTS / "scale" / "tesseract_api.py")

    def f(x, a):
        y = apply_tesseract(scale, {"x": x, "a": a, "b": jnp.float32(0.5)})["y"]
        return jnp.sum(jnp.tanh(y))

    x = jnp.array([1e30, 1.0], jnp.float32)
    a = jnp.float32(1e30)  # a * x overflows inside the Tesseract
    prim, line, _ = oracle(f, x, a)
    assert prim.startswith("tesseract")
    o = locate(f, (x, a), _opts(mode="primal"))
    eq = o.forward.equation
    assert (eq.primitive, _line(o.forward)) == (prim, line)
    from sowviz.inspection import inspect

    assert inspect(f, x, a, mode="primal").graph.node(eq.node).kind == "tesseract"
    # tanh(inf) is finite: the overflow never reaches the result
    assert o.removed and not o.alarm


def test_no_nonfinite_no_origin():
    assert locate(lambda x: jnp.sum(jnp.sin(x)), (X,), _opts()) is None


def test_inspect_option_expect_nonfinite_and_the_model_field():
    import sowviz

    s = jnp.arange(6.0).reshape(2, 3)
    mask = jnp.array([[True, False, True], [False, False, False]])
    plain = sowviz.inspect(f_masked_softmax, s, mask, mode="primal")
    d = plain.to_dict()["nonfinite"]  # NaN results: the mask's -Inf is only mentioned
    assert _within(plain.graph, d["forward"]["node"], "softmax")
    assert "`where`" in d["forward"]["message"]
    ins = sowviz.inspect(f_masked_softmax, s, mask, mode="primal", expect_nonfinite="mask")
    d = ins.to_dict()["nonfinite"]
    assert _within(ins.graph, d["forward"]["node"], "softmax")
    assert d["expected"] and d["alarm"] and d["step"] is None and d["forward"]["equation"] is None
    found = ins.locate_nonfinite()  # down to the equation, stored in the model
    eq = ins.to_dict()["nonfinite"]["forward"]["equation"]
    assert found.forward.equation.primitive == eq["primitive"] == "sub"
    _, line, _ = oracle(f_masked_softmax, s, mask, skip=("mask",))
    assert eq["source"]["line"] == line
    with pytest.raises(TypeError, match="`expect_nonfinite` must be"):
        sowviz.inspect(f_masked_softmax, s, mask, expect_nonfinite=3)


def _within(graph, node, label) -> bool:
    while node is not None:
        if graph.node(node).label == label:
            return True
        node = graph.node(node).parent
    return False


def f_nested_norm(w, x):
    with jax.named_scope("block_0"):
        h = jnp.tanh(x @ w)
        with jax.named_scope("LayerNorm_0"):
            v = jnp.mean(h * h, axis=-1, keepdims=True) - 0.01
            h = h * lax.rsqrt(v)  # NaN: the mean square is below 0.01
    return jnp.mean(h * h)


def test_locate_nonfinite_stores_what_the_banner_needs_once(monkeypatch):
    import sowviz
    import sowviz.nonfinite_locate

    w, x = jnp.ones((3, 4)) * 0.5, jnp.ones((2, 3)) * 0.001
    prim, line, loc, scopes = oracle(f_nested_norm, w, x, scopes=True)
    ins = sowviz.inspect(f_nested_norm, w, x)
    before = ins.to_dict()["nonfinite"]
    assert before["located"] is False and before["forward"]["equation"] is None
    found = ins.locate_nonfinite()
    rec = json.loads(ins.to_json())["nonfinite"]  # what the widget and the report get
    assert rec["located"] is True and rec["step"] is None
    fwd = rec["forward"]
    assert fwd["path"] == list(scopes) == ["block_0", "LayerNorm_0"]
    assert ins.graph.node(fwd["node"]).label == "LayerNorm_0"
    eq = fwd["equation"]
    assert (eq["primitive"], eq["source"]["line"]) == (prim, line) == ("rsqrt", line)
    where = eq["source"]["file"]  # shown relative to the working directory
    assert pathlib.Path(where).resolve() == pathlib.Path(loc.file).resolve()
    assert ins.graph.node(eq["node"]).parent == fwd["node"]
    assert f"`rsqrt` in `LayerNorm_0` at {where}:{line}" in fwd["message"]
    # a second call (the button pressed again) re-runs nothing and gives the same record
    monkeypatch.setattr(sowviz.nonfinite_locate, "locate", lambda *a, **k: 1 / 0)
    assert ins.locate_nonfinite() is found
    assert json.loads(ins.to_json())["nonfinite"] == rec


def test_locate_nonfinite_takes_numpy_arguments():
    # A NumPy batch (as data loaders hand out) is an argument like any other.
    import sowviz

    w, x = np.ones((3, 4), np.float32) * 0.5, np.ones((2, 3), np.float32) * 0.001
    prim, line, _, _ = oracle(f_nested_norm, jnp.asarray(w), jnp.asarray(x), scopes=True)
    found = sowviz.inspect(f_nested_norm, w, x).locate_nonfinite()
    assert found.located
    eq = found.forward.equation
    assert (eq.primitive, eq.source.line) == (prim, line)


def test_finite_inspection_has_no_record():
    import sowviz

    ins = sowviz.inspect(lambda x: jnp.sum(jnp.sin(x)), X)
    assert ins.to_dict()["nonfinite"] is None and ins.locate_nonfinite() is None


def f_norm_block(w, x):
    with jax.named_scope("embed"):
        h = jnp.tanh(x @ w)
    with jax.named_scope("LayerNorm_0"):
        v = jnp.mean(h * h, axis=-1, keepdims=True) - 0.01
        h = h * lax.rsqrt(v)  # NaN once a batch's mean square drops below 0.01
    return jnp.mean(h * h)


@pytest.mark.parametrize("every", [1, 4])
def test_monitor_stops_at_the_step_and_names_the_equation(every):
    import sowviz

    w = jnp.ones((3, 4)) * 0.5
    batches = [jnp.ones((2, 3)) * (0.001 if i == 5 else 1.0) for i in range(9)]
    prim, line, _ = oracle(f_norm_block, w, batches[5])
    assert prim == "rsqrt" and all(oracle(f_norm_block, w, b) is None for b in batches[:5])
    mon = sowviz.Monitor(f_norm_block, every=every, stop_on_nonfinite=True)
    with pytest.raises(
        sowviz.NonFiniteError, match=rf"step 5.*`rsqrt` in `LayerNorm_0` at .*:{line}"
    ):
        for b in batches:
            mon.step(w, b)
    assert mon.steps == 6  # raised at step 5, before a later step ran
    nf = mon.nonfinite
    assert nf.step == 5 and nf.origins.forward.equation.primitive == "rsqrt"
    assert mon.graph.node(nf.forward).label == "LayerNorm_0"
    assert mon.to_dict()["history"]["nonfinite"]["forward"]["equation"]["source"]["line"] == line


def test_the_rule_on_a_saved_model_gives_the_stored_record():
    import json

    import sowviz
    from sowviz.nonfinite import model_origins

    ins = sowviz.inspect(f_log_negative, X)
    saved = json.loads(ins.to_json())  # what a report or a log holds
    rec = saved["nonfinite"]
    again = model_origins(saved)
    # the same rule, from the JSON model: same producer, backward origin, propagators
    # (`removed` needs the results, which a saved model does not hold)
    for key in ("forward", "backward", "propagators", "expected"):
        assert again[key] == rec[key], key


# ---------------------------------------------------------------------------
# A training loop that diverges at a known step; the Monitor locates it by itself.


def mlp_loss(params, x, y):
    with jax.named_scope("features"):
        h = jnp.log(x)  # NaN once a batch holds a negative feature
    with jax.named_scope("hidden"):
        h = jnp.tanh(h @ params["w1"] + params["b1"])
    with jax.named_scope("head"):
        pred = h @ params["w2"]
    return jnp.mean((pred - y) ** 2)


def mlp_batches(n, bad_step):
    keys = jax.random.split(jax.random.PRNGKey(3), n)
    out = []
    for i, k in enumerate(keys):
        x = jax.random.uniform(k, (8, 4), minval=0.5, maxval=2.0)
        if i == bad_step:
            x = x.at[3, 1].set(-1.0)  # log(-1): the only bad value of the run's data
        out.append((x, jnp.sum(x, axis=1, keepdims=True)))
    return out


def mlp_oracle(params, x, y):
    """The oracle on the flat leaves (it evaluates the jaxpr on its flat inputs)."""
    leaves, tree = jax.tree_util.tree_flatten((params, x, y))
    return oracle(lambda *ls: mlp_loss(*jax.tree_util.tree_unflatten(tree, ls)), *leaves)


@pytest.mark.parametrize(
    ("every", "bad_step", "numpy_batches"),
    # NumPy batches: what a data loader hands out (`jax.jit` takes them as they are)
    [(1, 5, False), (4, 5, False), (4, 8, False), (2, 5, False), (1000, 7, False), (4, 5, True)],
)
def test_monitor_locates_the_first_nonfinite_step_without_stopping(
    every, bad_step, numpy_batches, monkeypatch, tmp_path
):
    import sowviz
    import sowviz.monitor

    calls = []
    real = sowviz.monitor._locate_step
    monkeypatch.setattr(
        sowviz.monitor, "_locate_step", lambda *a: calls.append(a[3].step) or real(*a)
    )
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = {
        "w1": jax.random.normal(k1, (4, 16)) / 2,
        "b1": jnp.zeros(16),
        "w2": jax.random.normal(k2, (16, 1)) / 4,
    }
    batches = mlp_batches(12, bad_step)
    if numpy_batches:
        batches = [(np.asarray(x), np.asarray(y)) for x, y in batches]
    ref = jax.jit(jax.value_and_grad(mlp_loss))
    mon = sowviz.Monitor(mlp_loss, every=every, log_dir=tmp_path / "run")
    at_bad = None
    for step, (x, y) in enumerate(batches):  # plain SGD; NaN from the bad step onwards
        value, grads = mon.step(params, x, y)
        want, _ = ref(params, x, y)
        np.testing.assert_allclose(value, want, rtol=1e-5, equal_nan=True)
        assert np.isfinite(value) == (step < bad_step)
        if step == bad_step:
            at_bad = (params, x, y)
        params = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    # bounded memory: arguments only of the steps in flight (and a re-run), none once
    # the first non-finite step was located
    kept = [s for s, _, a, _ in [*mon._pending, *mon._flags] if a is not None]
    m = sowviz.monitor
    bound = m._MAX_PENDING + m._MAX_FLAGS + m._FLAG_BATCH + 1
    assert kept == [] if calls else len(kept) <= bound
    found = mon.locate_nonfinite()  # the widget's button: the stored record, no re-run
    mon.close()
    assert calls == [bad_step] and found is mon.nonfinite.origins and found.located

    prim, line, _ = mlp_oracle(*at_bad)
    assert prim == "log"
    nf = mon.nonfinite
    assert nf.step == bad_step
    eq = nf.origins.forward.equation
    assert (eq.primitive, eq.source.line) == (prim, line)
    assert mon.graph.node(nf.forward).label == "features"
    assert mon.graph.node(eq.node).parent == nf.forward  # the equation, in its stage
    assert f"`log` in `features` at {eq.source.file}:{line}" in nf.origins.forward.message
    # the model (and so the report's banner) holds the equation with its step
    rec = mon.to_dict()["history"]["nonfinite"]
    assert rec["step"] == bad_step
    assert rec["forward"]["equation"]["primitive"] == "log"
    assert rec["forward"]["equation"]["source"]["line"] == line
    # so does the first non-finite step's entry (the run log's reader takes it there)
    entry = next(e for e in mon.history if e["step"] == bad_step)
    assert entry["finite"] is False
    assert entry["nonfinite"]["forward"]["equation"]["source"]["line"] == line
    # and the run log: its report names the equation too
    logged = sowviz.load(tmp_path / "run").model["history"]["nonfinite"]
    assert logged["step"] == bad_step
    assert logged["forward"]["equation"]["source"]["line"] == line


@pytest.mark.browser
def test_monitor_report_banner_names_the_located_equation(page, tmp_path):
    # every=4, NaN from step 5 (unrecorded) on: the saved report's banner names the step,
    # the equation and its line, as the oracle does, with no locate asked for.
    import sowviz

    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = {
        "w1": jax.random.normal(k1, (4, 16)) / 2,
        "b1": jnp.zeros(16),
        "w2": jax.random.normal(k2, (16, 1)) / 4,
    }
    mon = sowviz.Monitor(mlp_loss, every=4)
    for step, (x, y) in enumerate(mlp_batches(10, 5)):
        if step == 5:
            prim, line, _ = mlp_oracle(params, x, y)
        _, grads = mon.step(params, x, y)
        params = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    pg = page.open_report(mon.save_html(tmp_path / "run.html"))
    text = pg.locator('[data-role="nonfinite-banner"]').inner_text()
    assert "step 5" in text and f"{prim} in features" in text and f":{line}" in text
    assert page.errors == []
    artifacts = pathlib.Path(__file__).resolve().parents[1] / "artifacts"
    artifacts.mkdir(exist_ok=True)
    pg.screenshot(path=str(artifacts / "nonfinite_monitor_banner.png"))


def test_origin_of_a_batch_sharded_program_matches_the_oracle():
    # Over sharded arrays the per-probe non-finite masks are reduced across devices;
    # that all-reduce must use an operation every backend's collectives have (a
    # bitwise-or one failed on XLA:CPU: "Unsupported reduction computation").
    mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    x = jax.device_put(jnp.linspace(0.1, 1.6, 16, dtype=jnp.float32), spec)
    prim, line, _ = oracle(f_log_negative, X)
    with jax.set_mesh(mesh):
        o = locate(f_log_negative, (x,), _opts(mode="primal"))
    assert o is not None and o.forward is not None
    assert (o.forward.equation.primitive, _line(o.forward)) == (prim, line)


def test_a_bad_parameter_is_named_by_its_path_not_its_leaf_name():
    def loss(params, x):
        h = x
        for name in ("block_0", "block_1"):
            h = h @ params[name]["dense"]["kernel"]
        return jnp.mean(h**2)

    params = {b: {"dense": {"kernel": jnp.full((3, 3), 0.1)}} for b in ("block_0", "block_1")}
    params["block_1"]["dense"]["kernel"] = (
        params["block_1"]["dense"]["kernel"].at[0, 0].set(jnp.inf)
    )
    ins = sowviz.inspect(loss, params, jnp.ones((2, 3)))
    assert not np.isfinite(float(ins.result[0]))  # plain JAX agrees the loss is bad
    assert not np.isfinite(float(loss(params, jnp.ones((2, 3)))))
    msg = ins.nonfinite.forward.message
    # the parameters group, then the leaf's path, one step a slash (the graph draws
    # `block_1.dense.kernel`, a group holding one leaf, as one box)
    assert "the input `parameters/block_1/dense/kernel` holds non-finite values" in msg, msg


def test_gradient_paths_are_written_one_way():
    # `l1` holds one leaf (drawn as one box, `l1.kernel`), `l2` two (a group): the
    # message wrote `parameters/l1.kernel` beside `parameters/l2/bias`
    def loss(params, x):
        h = x @ params["l1"]["kernel"]
        h = h / jnp.linalg.norm(h, axis=-1, keepdims=True)  # 0/0 on the zero row
        return jnp.mean((h @ params["l2"]["kernel"] + params["l2"]["bias"]) ** 2)

    params = {
        "l1": {"kernel": jnp.full((4, 3), 0.1)},
        "l2": {"bias": jnp.zeros(1), "kernel": jnp.full((3, 1), 0.2)},
    }
    x = jnp.ones((2, 4)).at[1].set(0.0)
    grads = jax.grad(loss)(params, x)
    assert all(not np.all(np.isfinite(g)) for g in jax.tree_util.tree_leaves(grads))
    ins = sowviz.inspect(loss, params, x)
    assert "parameters/l1/kernel" in [ins.probe_path(p) for p in ins.probes]  # as drawn
    msg = ins.nonfinite.backward.message
    said = "`parameters/l1/kernel`, `parameters/l2/bias`, `parameters/l2/kernel`"
    assert msg.endswith(f"non-finite gradient of {said}"), msg


def test_a_group_of_results_is_never_named_as_the_backward_origin():
    # `root`'s values are also returned (an aux dict, drawn as a group of outputs):
    # the group only receives them, so the backward NaN is born in `root`.
    def f(x):
        with jax.named_scope("feat"):
            h = jnp.tanh(x) - jnp.tanh(x[0])  # h[0] == 0
        with jax.named_scope("root"):
            r = jnp.sqrt(h * h)  # the derivative at 0 is inf; times 0: NaN
        return jnp.sum(r), {"r": r, "h": h}

    assert oracle(lambda x: f(x)[0], X) is None  # the forward pass is finite
    _, line, _ = oracle(lambda x: f(x)[0], X, grad=True)
    ins = sowviz.inspect(f, X, mode="grad", has_aux=True)
    o = find(ins.probes, ins.graph)
    assert o is not None and o.forward is None and o.backward is not None
    node = ins.graph.node(o.backward.node)
    assert node.label == "root" and node.source.line == line, o.backward.message
    assert "`aux`" not in o.backward.message


def test_a_gradient_made_non_finite_by_a_nan_input_says_it_follows_from_the_forward_pass():
    # One NaN in the data: the forward verdict names the input; the gradient is NaN only
    # because the forward values are, and the backward verdict must say so first.
    def mse(w, x):
        with jax.named_scope("layer"):
            h = jnp.tanh(x @ w)
        return jnp.mean(h**2)

    w = jnp.ones((3, 2)) * 0.1
    x = jnp.ones((4, 3)).at[1, 2].set(jnp.nan)
    ins = sowviz.inspect(mse, w, x)
    for o in (ins.nonfinite, ins.locate_nonfinite()):
        assert o.forward.message == "the input `x` holds non-finite values"
        assert o.backward.message.startswith("follows from the forward pass: "), o.backward.message
        assert "holds non-finite values, so its backward does too, reaching" in o.backward.message


def test_a_backward_nan_that_no_gradient_receives_is_removed_not_an_alarm():
    # The backward of log at z == 0 makes 0 * inf = NaN; relu's backward masks it where
    # z == 0, so the value and every gradient are finite, as plain jax.grad says.
    def loss(w, x):
        z = jax.nn.relu(x @ w)
        return jnp.mean(jnp.where(z > 0, jnp.log(z), 0.0))

    w = jnp.array([[1.0, -1.0], [0.5, 2.0]])
    x = jnp.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    assert bool(jnp.all(jnp.isfinite(jax.grad(loss)(w, x))))
    ins = sowviz.inspect(loss, w, x)
    for o in (ins.nonfinite, ins.locate_nonfinite()):
        assert o.backward is not None and o.removed and not o.alarm, o.message
        assert o.message.endswith("(masked afterwards: no result is non-finite)")


def test_a_value_made_by_an_unprobed_equation_is_first_seen_by_the_next_stage():
    """`jnp.log` inside a scope is no stage of its own, so the first probe holding its
    NaN is `silu`'s: the message says it was seen there and names the unprobed
    equation before it; `locate_nonfinite` names `log` itself."""

    def f(w, x):
        with jax.named_scope("block"):
            h = jnp.log(x @ w)  # the origin, an equation no probe sees
            h = jax.nn.silu(h)
        return jnp.sum(h)

    ins = sowviz.inspect(f, jnp.eye(3), jnp.array([[1.0, -1.0, 2.0]]))
    msg = ins.nonfinite.forward.message
    assert msg.startswith("first seen at `silu`") and "`log`" in msg, msg
    located = ins.locate_nonfinite().forward
    assert located.equation.primitive == "log"
    assert located.message.startswith("first made by `log`")


def test_monitor_says_when_donated_arguments_keep_it_from_locating(tmp_path):
    # The optimizer update jitted with `donate_argnums` deletes the parameters the
    # Monitor kept to re-run an unrecorded non-finite step: the warning says so, and
    # what to do (it said "Array has been deleted with shape=float32[16]").
    import functools

    import sowviz

    @functools.partial(jax.jit, donate_argnums=0)
    def update(params, grads):
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)

    params = {"w1": jnp.ones((4, 16)) / 8, "b1": jnp.zeros(16), "w2": jnp.ones((16, 1)) / 4}
    mon = sowviz.Monitor(mlp_loss, every=4)
    with pytest.warns(UserWarning, match="donate_argnums") as record:
        for x, y in mlp_batches(8, 5):
            _, grads = mon.step(params, x, y)
            params = update(params, grads)
        mon.flush()
    assert "stop_on_nonfinite=True" in str(record[0].message)
    assert mon.nonfinite.step == 5 and mon.nonfinite.origins is None
    mon.close()


def _tail(a):
    with jax.named_scope("tail"):
        return a * jnp.log(-jnp.abs(a))  # NaN forward, so its backward makes NaN too


def _unprobed_then_nan(w, x):
    # `x @ w`, a call's argument on the return line: a top-level equation no probe sees
    # the cotangent of (a line assigning it, `a = x @ w`, would be a box with data)
    return jnp.sum(_tail(x @ w))


def test_a_nan_cotangent_past_an_unprobed_equation_names_the_stage_that_made_it(monkeypatch):
    # The gradient of `w` is NaN, the cotangent `tail`'s output receives is finite, and
    # `a`'s (unprobed) is NaN: `tail`'s backward made it, from its forward NaN. The rule
    # named only the unprobed `dot_general` ("born in the backward of `dot_general`").
    # (A top-level equation is unprobed at a level of more nodes than a small
    # program's: this one is made to count as such.)
    import sowviz
    from sowviz.graph import build

    monkeypatch.setattr(build, "SMALL_TOP_LEVEL", 0)

    w, x = jnp.ones((3, 4)) / 3, jnp.linspace(0.5, 1.5, 6).reshape(2, 3)
    a = x @ w
    assert np.isnan(jax.grad(lambda a: jnp.sum(a * jnp.log(-jnp.abs(a))))(a)).all()
    ins = sowviz.inspect(_unprobed_then_nan, w, x)
    tail = next(p for p in ins.probes if ins.graph.node(p.node).label == "tail")
    assert tail.summaries["primal"]["nan"] > 0 and tail.summaries["cotangent"]["nan"] == 0
    back = ins.nonfinite.backward
    assert ins.graph.node(back.node).label == "tail"
    assert back.message.startswith("follows from the forward pass: `tail`")
    assert "reaching `w`" in back.message and "unless the backward of `dot_general`" in back.message


def f_sqrt_beside_std(x):
    s = jnp.std(x)  # `jnp.var` holds `where(dof > 0, var, nan)`: a NaN it always masks
    return jnp.sqrt(x[0] - 2.0) + s  # the origin


def f_standardise_constant_column(x):
    mu = jnp.mean(x, axis=0)
    return jnp.sum((x - mu) / jnp.sqrt(jnp.var(x, axis=0)))  # 0/0 in the constant column


@pytest.mark.parametrize(
    "f, x, prim, at",
    [
        (f_sqrt_beside_std, jnp.array([1.0, 2.0, 3.0, 4.0]), "sqrt", 2),
        (f_standardise_constant_column, jnp.array([[1.0, 5.0], [2.0, 5.0]]), "div", 2),
    ],
    ids=["sqrt", "div"],
)
def test_a_librarys_masked_fill_value_is_never_the_origin(f, x, prim, at):
    # The fill value is made from literals alone, and what reads it is finite: a NaN
    # born later is not "first made by `convert_element_type` in `where`".
    line = f.__code__.co_firstlineno + at
    o = locate(f, (x,), _opts(mode="grad"))
    assert (o.forward.equation.primitive, _line(o.forward)) == (prim, line), o.forward.message
    ins = sowviz.inspect(f, x, mode="primal", capture="all")
    fwd = ins.graph.node(ins.nonfinite.forward.node)
    assert (fwd.primitive, fwd.source.line) == (prim, line)


def test_a_finite_program_using_jnp_var_reports_nothing():
    # every equation probed: `jnp.var`'s masked NaN fill value alone is no news
    x = jnp.array([1.0, 2.0, 3.0, 4.0])
    ins = sowviz.inspect(lambda x: jnp.var(x) + jnp.std(x), x, mode="grad", capture="all")
    assert ins.nonfinite is None
    # a NaN the user put in a constant, which the result reads, is still found
    ins = sowviz.inspect(lambda x: jnp.sum(x + jnp.full(4, jnp.nan)), x, capture="all")
    assert ins.nonfinite is not None and ins.nonfinite.alarm


def f_while_scalar_then_vector(x):
    def body(c):
        v, i = c
        r = 1.0 / jnp.sum(v * 0.0)  # +Inf, a scalar: the origin
        w = r * jnp.zeros(3)  # Inf * 0: NaN, a [3] vector
        return jnp.where(jnp.isfinite(w), w, v), i + 1

    v, _ = lax.while_loop(lambda c: c[1] < 2, body, (x, 0))
    return jnp.sum(v)


def test_in_a_while_loop_the_first_equation_in_the_body_is_the_origin():
    # A while loop keeps its last iteration (loops="last"): a [3] vector's rows there
    # are no iterations, and they sorted before the scalar that made the +Inf.
    o = locate(f_while_scalar_then_vector, (jnp.ones(3),), _opts(mode="primal"))
    line = f_while_scalar_then_vector.__code__.co_firstlineno + 3
    assert (o.forward.equation.primitive, _line(o.forward)) == ("div", line), o.forward.message


def f_inf_buffer_then_nan(x):
    with jax.named_scope("buffer"):
        b = x * jnp.inf  # +Inf, masked below (as diffrax fills its output buffer)
    with jax.named_scope("solve"):
        r = jnp.sqrt(x - 2.0)  # NaN: what the result holds
    return jnp.sum(jnp.where(jnp.isfinite(b), b, 0.0)) + jnp.sum(r)


def test_located_origin_keeps_what_came_before_it():
    # the stage-level message's "before it, `buffer` held +Inf" survived no locate
    # (the buffer's +Inf is masked by the `where`: said as such, not as what may have
    # led to the NaN)
    ins = sowviz.inspect(f_inf_buffer_then_nan, X, mode="primal")
    assert "before it, a +Inf in `buffer` (" in ins.nonfinite.forward.message
    o = ins.locate_nonfinite()
    assert o.forward.equation.primitive == "sqrt"
    assert "; before it, a +Inf in `mul` (" in o.forward.message, o.forward.message
    where_line = f_inf_buffer_then_nan.__code__.co_firstlineno + 5
    assert re.search(rf"was masked by `where` \([^)]*py:{where_line}\)", o.forward.message)


def test_a_nan_tangent_of_a_finite_value_says_so():
    # mode "jvp": ‖w‖ at w = 0 is 0, its tangent is NaN; the banner said only "first
    # made by `norm`", as for a NaN value
    w, x = jnp.zeros(3), jnp.ones(3)
    ins = sowviz.inspect(f_norm_at_zero, w, x, mode="jvp")
    value, tangent = ins.result
    assert np.isfinite(value) and not np.isfinite(tangent)
    assert ins.nonfinite.forward.message.endswith("(in its tangent: the value is finite)")
    o = ins.locate_nonfinite()
    assert o.forward.equation.primitive == "sqrt"
    assert o.forward.message.endswith("(in its tangent: the value is finite)"), o.message
    # a NaN value is no tangent's
    o = sowviz.inspect(f_log_negative, X, mode="jvp").locate_nonfinite()
    assert "in its tangent" not in o.message


def f_norm_beside_a_product(w, v):
    return jnp.linalg.norm(w) + jnp.sum(v * w)  # both read w; only norm's backward is NaN


def test_the_backward_guess_names_first_a_stage_that_can_make_a_nan():
    # Before locating, the candidates reading `w` are `norm` and `mul`. `mul` runs last
    # but its backward multiplies finite values: `norm` is named first.
    w, v = jnp.zeros(3), jnp.ones(3)
    _, grads = jax.value_and_grad(f_norm_beside_a_product)(w, v)
    assert not np.all(np.isfinite(grads))  # the independent check: the gradient is NaN
    ins = sowviz.inspect(f_norm_beside_a_product, w, v)
    msg = ins.nonfinite.backward.message
    assert msg.startswith("born in the backward of `norm`") and "(or of `mul`" in msg, msg


def _damp(x):
    return x * 0.9


def _damp_then_sqrt(x):
    x = _damp(x)  # reads the carry first: NaN only from the iteration after `sqrt`'s
    return x - jnp.sqrt(x - 0.5)  # the origin: NaN once x < 0.5 (the third iteration)


def f_while_carry(x0):
    body = lambda s: (_damp_then_sqrt(s[0]), s[1] + 1)  # noqa: E731
    return jnp.sum(lax.while_loop(lambda s: s[1] < 6, body, (x0, 0))[0])


def f_scan_carry(x0):
    return jnp.sum(lax.scan(lambda x, _: (_damp_then_sqrt(x), None), x0, None, length=6)[0])


def _sqrt_stage(c):
    v, j = c
    a = v * 0.5  # reads the inner carry first
    return jnp.sqrt(a - 1.0), j + 1  # the origin: NaN at the inner loop's second iteration


def f_nested_while(x):
    # an outer loop of steps, an inner loop of stages (as diffrax's Runge-Kutta step):
    # at the outer loop's first iteration both `mul` and `sqrt` hold NaN, and only the
    # inner loop's iterations tell which came first
    def step(c):
        v, i = c
        v, _ = lax.while_loop(lambda c: c[1] < 3, _sqrt_stage, (v, 0))
        return v + 1.0, i + 1

    return jnp.sum(lax.while_loop(lambda c: c[1] < 2, step, (x, 0))[0])


@pytest.mark.parametrize("f", [f_while_carry, f_scan_carry, f_nested_while])
def test_in_a_loop_the_origin_is_the_first_iteration_holding_nan_not_the_first_reader(f):
    # `_damp` (a `mul`) comes first in the body but holds NaN only from the iteration
    # after the one where `sqrt` made it: a while loop keeps its last iteration, where
    # both hold NaN, so `locate` keeps every iteration
    x0 = jnp.array([2.0, 3.0]) if f is not f_nested_while else jnp.array([4.0, 9.0])
    prim, line, _ = oracle(f, x0)
    assert prim == "sqrt"
    o = locate(f, (x0,), _opts(mode="primal"))
    assert (o.forward.equation.primitive, _line(o.forward)) == (prim, line), o.forward.message
    assert o.forward.message.startswith("first made by `sqrt`"), o.forward.message
    assert "unless" not in o.forward.message  # the iterations decided it


@pytest.mark.parametrize("f", [f_while_carry])
def test_the_stage_level_origin_in_a_loop_names_what_follows_it_in_the_body(f):
    # before locating, `_damp` is the first stage seen holding NaN (`sqrt` is an
    # unprobed equation after it in the body): it may only have read the carry
    x0 = jnp.array([2.0, 3.0])
    ins = sowviz.inspect(f, x0, mode="primal")
    msg = ins.nonfinite.forward.message
    assert msg.startswith("first made by `_damp`"), msg
    line = _damp_then_sqrt.__code__.co_firstlineno + 2
    assert "at an earlier iteration of its loop, what follows it in the body made it" in msg
    assert f"`sqrt` (tests/test_nonfinite.py:{line})" in msg, msg
    # (the body's equations are probed, `_damp_then_sqrt` being a call of yours: no
    # unprobed equation among them for `locate_nonfinite()` to name)


def f_where_sqrt(x):
    return jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))  # finite value; sqrt' = Inf at 0


def test_a_where_guarded_sqrt_at_exactly_zero_gets_the_double_where_fix():
    # at 0 `sqrt` is finite (no forward origin), its derivative is not: the masked
    # branch's cotangent 0 times Inf is NaN
    x = jnp.array([4.0, 0.0])
    g = jax.grad(f_where_sqrt)(x)
    assert np.isfinite(g[0]) and np.isnan(g[1])
    assert oracle(f_where_sqrt, x) is None
    _, gline, _ = oracle(f_where_sqrt, x, grad=True)
    o = locate(f_where_sqrt, (x,), _opts())
    assert o.forward is None
    assert (o.backward.equation.primitive, _line(o.backward)) == ("sqrt", gline)
    msg = o.backward.message
    assert "its derivative is not" in msg and "double-where" in msg, msg
    assert f"a `jnp.where` at tests/test_nonfinite.py:{gline} masks the value" in msg, msg
    # a `norm` at zero has no `jnp.where` to blame
    o = locate(lambda w: jnp.linalg.norm(w), (jnp.zeros(3),), _opts())
    assert o.backward is not None and "masks the value" not in o.message


def test_a_comparison_is_no_candidate_for_a_backward_origin():
    # `x > 0` reads `x` but sends no cotangent back: only `sqrt` may have made the NaN
    ins = sowviz.inspect(f_where_sqrt, jnp.array([4.0, 0.0]))
    o = ins.nonfinite.backward
    assert o.message.startswith("born in the backward of `sqrt`"), o.message
    assert "`gt`" not in o.message and "or of" not in o.message, o.message
    assert [ins.graph.node(c).label for c in o.candidates] == ["sqrt"]


def f_masked_then_overflow(p, x):
    gate = jnp.where(p["g"] > 0, jnp.sqrt(p["g"]), 0.0)  # g[0] < 0: a NaN, masked
    h = x * gate  # overflows to +Inf
    out = h @ p["w"]  # Inf - Inf: the NaN the loss holds
    return jnp.mean(out**2)


def f_masked_then_overflow_in_a_block(p, x):
    with jax.named_scope("block"):  # the masked NaN and the overflow in one stage
        return f_masked_then_overflow(p, x)


@pytest.mark.parametrize("f", [f_masked_then_overflow, f_masked_then_overflow_in_a_block])
def test_a_nan_that_a_where_masked_is_not_the_origin_of_the_one_that_reaches_the_loss(f):
    p = {"g": jnp.array([-1.0, 1e20, 1e20]), "w": jnp.array([[1.0], [1.0], [-1.0]])}
    x = jnp.full((2, 3), 1e30)
    # plain JAX: the first non-finite equation is the masked `sqrt`; the `where` makes it
    # finite again; `x * gate` is +Inf, and its product with `w` NaN, which the loss holds
    flat = lambda g, w, x: f({"g": g, "w": w}, x)  # noqa: E731  (the oracle takes arrays)
    first, sqrt_line, _ = oracle(flat, p["g"], p["w"], x)
    assert first == "sqrt"
    gate = jnp.where(p["g"] > 0, jnp.sqrt(p["g"]), 0.0)
    assert np.isnan(jnp.sqrt(p["g"])).any() and np.isfinite(gate).all()
    h = x * gate
    assert np.isposinf(h).any() and not np.isnan(h).any() and np.isnan(h @ p["w"]).all()
    assert np.isnan(f(p, x))
    # the same program with nothing to mask: its first non-finite equation is the origin
    prim, line, _ = oracle(flat, p["g"].at[0].set(1.0), p["w"], x)
    assert (prim, line) == ("mul", sqrt_line + 1)

    def check(msg, led_to="dot_general"):
        dot = rf"; it held \+Inf, which led to the NaN first made by `{led_to}` \([^)]*py:{line + 1}\)"
        assert not msg.startswith("first made by `sqrt`"), msg
        assert re.search(dot, msg), msg
        assert "; before it, a NaN in `sqrt` (" in msg and "was masked by `" in msg, msg

    ins = sowviz.inspect(f, p, x)
    stage = ins.nonfinite.forward.message
    if f is f_masked_then_overflow:  # every line is a box, named by what it assigns
        assert stage.startswith("first made by `h` ("), stage
        check(stage, led_to="out")
    else:  # the block's equations are unprobed: told apart once located (the loss's
        # `mean`, a box of its own inside the block, is the first probe to see the NaN)
        assert stage.startswith("first seen at `mean` (") and "sqrt" not in stage, stage
        assert "`dot_general`" in stage, stage
    o = ins.locate_nonfinite()
    assert (o.forward.equation.primitive, _line(o.forward)) == (prim, line), o.forward.message
    check(o.forward.message)
    mon = sowviz.Monitor(f, stop_on_nonfinite=True)
    with pytest.raises(sowviz.NonFiniteError, match=rf"first made by `mul`.* at .*:{line}") as err:
        mon.step(p, x)
    check(mon.nonfinite.origins.forward.message)
    check(str(err.value))
    eq = mon.nonfinite.origins.forward.equation
    assert (eq.primitive, eq.source.line) == (prim, line)


def _layer(x, w):
    return x + 0.1 * jnp.log(x @ w)  # NaN where `x @ w` < 0: only the layer whose w is


def f_scan_layers(ws, x):
    x, _ = lax.scan(lambda x, w: (_layer(x, w), None), x, ws)  # a scan over stacked layers
    return jnp.mean(x**2)


def _layers(bad: int):
    w = jnp.abs(jax.random.normal(jax.random.key(0), (6, 4, 4))) * 0.1
    return w.at[bad].set(-w[bad]), jnp.abs(jax.random.normal(jax.random.key(1), (3, 4))) + 0.5


@pytest.mark.parametrize("bad", [0, 3])
def test_in_a_scan_over_layers_the_message_says_which_layer(bad):
    ws, x = _layers(bad)
    assert oracle_iteration(f_scan_layers, ws, x) == (bad,)
    # before locating: the scan's body is your `_layer`, whose equations carry data
    # per layer as a function of yours does
    ins = sowviz.inspect(f_scan_layers, ws, x)
    fwd = ins.nonfinite.forward
    line = _layer.__code__.co_firstlineno + 1
    want = f"first made by `log` (tests/test_nonfinite.py:{line}), in iteration {bad} of `scan("
    assert fwd.message.startswith(want), fwd.message
    assert fwd.iteration == (bad,)
    o = ins.locate_nonfinite()
    assert o.forward.equation.primitive == "log"
    assert o.forward.iteration == (bad,), o.forward.message
    assert f"in iteration {bad} of `scan(" in o.forward.message, o.forward.message
    assert ins.to_dict()["nonfinite"]["forward"]["iteration"] == [bad]


def test_a_scans_stage_level_origin_is_the_first_iteration_holding_nan():
    # a scan keeps every iteration: with the body's equations probed (it is your
    # function), `sqrt` is named before locating, not `_damp`, which only read the carry
    x0 = jnp.array([2.0, 3.0])
    msg = sowviz.inspect(f_scan_carry, x0, mode="primal").nonfinite.forward.message
    line = _damp_then_sqrt.__code__.co_firstlineno + 2
    want = f"first made by `sqrt` (tests/test_nonfinite.py:{line}), in iteration "
    assert msg.startswith(want + f"{oracle_iteration(f_scan_carry, x0)[0]} of `scan("), msg
    assert "unless" not in msg


@pytest.mark.parametrize("f", [f_while_carry, f_scan_carry, f_nested_while])
def test_in_a_loop_the_located_origin_says_which_iteration(f):
    x0 = jnp.array([2.0, 3.0]) if f is not f_nested_while else jnp.array([4.0, 9.0])
    want = oracle_iteration(f, x0)
    o = locate(f, (x0,), _opts(mode="primal"))
    assert o.forward.iteration == want, o.forward.message
    assert ", in iteration " + " and ".join(f"{i} of `" for i in want) in o.forward.message or (
        len(want) == 2 and f"in iteration {want[0]} of `" in o.forward.message
    ), o.forward.message


def f_sqrt_layers(ws, x):
    # sqrt's derivative at 0 is Inf: layer `bad`, whose weights are 0, makes the NaN
    # gradient (the forward pass is finite)
    def body(x, w):
        return x + jnp.sqrt(x * w), None

    return jnp.sum(lax.scan(body, x, ws)[0])


def test_a_backward_origin_in_a_scan_over_layers_says_which_layer():
    ws = jnp.ones((5, 3)).at[2].set(0.0)
    x = jnp.array([1.0, 2.0, 3.0])
    g = jax.grad(f_sqrt_layers)(ws, x)
    assert np.isfinite(g[3:]).all() and not np.isfinite(g[2]).all()  # the bad layer's own
    ins = sowviz.inspect(f_sqrt_layers, ws, x)
    o = ins.locate_nonfinite()
    bwd = o.backward
    assert bwd.equation.primitive == "sqrt", bwd.message
    assert bwd.iteration == (2,), bwd.message
    assert "in iteration 2 of `scan(" in bwd.message, bwd.message


def _normed_gelu_layer(h, w):
    mu = jnp.mean(h)
    var = jnp.mean(h * h) - mu * mu  # at iteration 2, h ~ 1e37: h * h = +Inf, then Inf - Inf
    h = (h - mu) / jnp.sqrt(var + 1e-5)
    return jax.nn.gelu(h * w), None  # at iteration 1: (h * w) ** 3 = +Inf, tanh saturates it


def f_scan_masked_then_overflow(ws, x):
    return jnp.sum(lax.scan(_normed_gelu_layer, x, ws)[0])


def test_in_a_scan_an_overflow_masked_at_its_iteration_is_not_the_origin():
    # gelu's cube overflows at iteration 1 and `tanh` masks it (the carry stays finite);
    # at iteration 2 that tanh holds NaN too, made of the NaN `var` made: judged at the
    # cube's own iteration, its reader was finite
    ws, x = jnp.array([1.0, 1e37, 1.0]), jnp.array([1.0, 2.0, 3.0, 4.0])
    h = x
    for i in range(2):
        h, _ = _normed_gelu_layer(h, ws[i])
        assert jnp.isfinite(h).all()  # no NaN/Inf leaves iterations 0 and 1
    assert oracle(f_scan_masked_then_overflow, ws, x)[0] == "integer_pow"  # the masked one
    o = sowviz.inspect(f_scan_masked_then_overflow, ws, x).locate_nonfinite()
    line = _normed_gelu_layer.__code__.co_firstlineno + 2
    assert o.forward.equation.primitive == "mul", o.forward.message
    assert o.forward.equation.source.line == line and o.forward.iteration == (2,)
    assert "`integer_pow`" in o.forward.message and "was masked" in o.forward.message


def _mse_of_batch(params, batch):
    x, y = batch
    return jnp.mean((jax.nn.relu(x @ params["w1"]) @ params["w2"] - y) ** 2)


def test_an_input_holding_inf_before_the_nan_is_named_by_its_path():
    # the NaN origin named the +Inf before it by its leaf alone (`[0]`), where a NaN in
    # the same leaf is "the input `batch/[0]`"
    # (weights of both signs: the ±Inf of `x @ w1` meet in `... @ w2`, a NaN)
    params = {
        "w1": jax.random.normal(jax.random.key(0), (4, 8)),
        "w2": jax.random.normal(jax.random.key(1), (8, 1)),
    }
    x = np.ones((6, 4), np.float32)
    x[2, 1] = np.inf
    h = jax.nn.relu(jnp.asarray(x) @ params["w1"]) @ params["w2"]
    assert np.isnan(h).any()
    msg = sowviz.inspect(_mse_of_batch, params, (jnp.asarray(x), jnp.zeros((6, 1))))
    msg = msg.nonfinite.forward.message
    # (the leaf named by the line unpacking it, `x, y = batch`)
    assert "before it, the input `batch/[0] (x)` held +Inf" in msg, msg


_Y_OBS = jnp.array([0.5, -0.3, 1.2, 0.1])


def f_sample_site_scored_after_the_model(v):
    # NumPyro's `log_density`: the model runs first (`loc = jnp.sqrt(v)`), then every
    # sample site is scored, the prior's `Normal(0, 1).log_prob(v)` reading `v` again
    loc = jnp.sqrt(v)  # d sqrt / dv = Inf at v = 0
    lik = jnp.sum(-0.5 * (_Y_OBS - loc) ** 2)
    prior = -0.5 * ((v - 0.0) / 1.0) ** 2  # a `sub` reading `v`, later than the `sqrt`
    return -(lik + prior)


def test_a_value_read_by_sqrt_and_later_by_sub_is_made_non_finite_by_the_sqrt():
    # plain JAX: the loss is finite, its gradient -Inf; the prior's part of it is finite
    v = jnp.array(0.0)
    value, g = jax.value_and_grad(f_sample_site_scored_after_the_model)(v)
    assert np.isfinite(value) and np.isneginf(g)
    assert np.isfinite(jax.grad(lambda v: -0.5 * ((v - 0.0) / 1.0) ** 2)(v))
    _, gline, _ = oracle(f_sample_site_scored_after_the_model, v, grad=True)
    sqrt_line = f_sample_site_scored_after_the_model.__code__.co_firstlineno + 3
    assert gline == sqrt_line  # the first non-finite equation of grad: sqrt's derivative
    o = sowviz.inspect(f_sample_site_scored_after_the_model, v).locate_nonfinite()
    assert o.forward is None
    eq = o.backward.equation
    assert (eq.primitive, eq.source.line) == ("sqrt", sqrt_line), o.backward.message
    assert o.backward.message.startswith("born in the backward of `sqrt`"), o.backward.message


def _pair_energy(pos, k):
    dr = pos[:, None, :] - pos[None, :, :]
    r = jnp.sqrt(jnp.sum(dr**2, axis=-1))  # sqrt at r = 0 on the diagonal: d sqrt = +Inf
    e = jnp.where(jnp.eye(pos.shape[0], dtype=bool), 0.0, k * jnp.exp(-r))  # one where
    return 0.5 * jnp.sum(e)


def f_md_forces(k, pos):
    f = -jax.grad(_pair_energy)(pos, k)  # forces in the forward pass, as MD codes do
    return jnp.sum(f**2)


def f_md_forces_in_a_loop(k, pos, vel):
    force = lambda p: -jax.grad(_pair_energy)(p, k)  # noqa: E731

    def step(i, s):
        pos, vel = s
        vel = vel + 0.005 * force(pos)
        return pos + 0.01 * vel, vel

    pos, _ = lax.fori_loop(0, 3, step, (pos, vel))
    return jnp.sum(pos**2)


@pytest.mark.parametrize("looped", [False, True])
def test_an_infinite_derivative_in_the_forward_pass_is_the_origin_with_the_double_where_fix(
    looped,
):
    pos = jax.random.normal(jax.random.key(0), (4, 2))
    args = (jnp.asarray(1.0), pos, jnp.zeros((4, 2))) if looped else (jnp.asarray(1.0), pos)
    f = f_md_forces_in_a_loop if looped else f_md_forces
    sqrt_line = _pair_energy.__code__.co_firstlineno + 2
    # plain JAX: the first non-finite equation is sqrt's derivative `0.5 / sqrt(r)`, +Inf
    # on the diagonal (at the loop's first iteration), which the masked branch's zero
    # cotangent turns into NaN (0 × Inf)
    assert np.isnan(f(*args))
    assert oracle(f, *args) == ("div", sqrt_line, oracle(f, *args)[2])
    assert not looped or oracle_iteration(f, *args) == (0,)
    r = jnp.sqrt(jnp.sum((pos[:, None] - pos[None]) ** 2, axis=-1))
    assert np.isposinf(0.5 / r).sum() == 4 and np.isnan(0.0 * (0.5 / r)).sum() == 4
    o = sowviz.inspect(f, *args).locate_nonfinite()
    eq = o.forward.equation
    assert (eq.primitive, eq.source.line) == ("div", sqrt_line), o.forward.message
    assert o.forward.iteration == ((0,) if looped else ())
    msg = o.forward.message
    assert "; it held +Inf, which led to the NaN first made by `mul`" in msg, msg
    assert "was masked" not in msg and "not the origin" not in msg, msg
    assert "the derivative of `sqrt`" in msg and "double-where" in msg, msg
    assert f"a `jnp.where` at tests/test_nonfinite.py:{sqrt_line + 1} masks the value" in msg, msg


# ---------------------------------------------------------------------------
# A re-run that finds no NaN/Inf where the step's own program did


def attention_loss(q, k, v):
    return jnp.mean(jax.nn.dot_product_attention(q, k, v) ** 2)


def attention_loss_f64(q, k, v):
    """`attention_loss` in float64 NumPy: the exact value."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.mean(np.einsum("bnts,bsnh->btnh", w, v) ** 2)


def test_locate_keeps_the_alarm_when_its_rerun_is_finite():
    # Attention logits of ~1e18 (an NNX `MultiHeadAttention` with weights scaled by 3e4):
    # under `jax.jit` XLA's fused softmax leaves ~1e10 in `x - max(x)` where op-by-op
    # arithmetic leaves 0, `exp` overflows and the loss is NaN. The re-run with every
    # equation probed rounds each value as op by op does and was finite, and
    # `locate_nonfinite()` returned None and deleted the alarm.
    from sowviz.nonfinite_messages import NAMES_THE_EQUATION, NOT_REPRODUCED

    q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (2, 4, 1, 8)) * 1e9 for i in range(3))
    exact = attention_loss_f64(q, k, v)
    assert np.isfinite(exact) and np.isfinite(attention_loss(q, k, v))  # op by op: finite
    jitted = float(jax.jit(attention_loss)(q, k, v))
    if np.isfinite(jitted):
        pytest.skip("this XLA computes the fused softmax without overflow")
    ins = sowviz.inspect(attention_loss, q, k, v)
    assert np.isnan(float(ins.result[0])) and np.isnan(jitted)
    before = ins.nonfinite
    assert before.alarm and NAMES_THE_EQUATION in before.message
    found = ins.locate_nonfinite()
    rec = json.loads(ins.to_json())["nonfinite"]  # what the banner and the report get
    assert found is ins.nonfinite and found.alarm and rec["alarm"] is True
    if found.located:  # an XLA that rounds alike probed or not (JAX 0.10): the equation
        assert found.forward.equation.primitive == "exp"
        return
    # the step's own record, saying what happened instead of promising an equation
    assert rec["forward"]["node"] == before.forward.node
    assert rec["forward"]["message"].endswith(NOT_REPRODUCED.removeprefix("; "))
    assert NOT_REPRODUCED in rec["message"] and NAMES_THE_EQUATION not in rec["message"]
    assert ins.locate_nonfinite() is found  # once: the stored record


def test_locate_nonfinite_never_drops_an_alarm_its_rerun_does_not_see():
    # The same on any XLA: the re-run's arguments are finite (`_rerun` replaced), so
    # it finds no NaN/Inf at all; the NaN run's record stays, saying so.
    from sowviz.nonfinite_messages import NOT_REPRODUCED

    w = jnp.ones((3, 4)) * 0.5
    bad, good = jnp.ones((2, 3)) * 0.001, jnp.ones((2, 3))
    assert not np.isfinite(float(f_nested_norm(w, bad)))  # rsqrt of a negative variance
    assert np.isfinite(float(f_nested_norm(w, good)))
    ins = sowviz.inspect(f_nested_norm, w, bad)
    before = ins.nonfinite
    fn, _, opts = ins._rerun
    ins._rerun = (fn, (w, good), opts)
    found = ins.locate_nonfinite()
    assert found is ins.nonfinite and found.alarm and not found.located
    assert found.forward.node == before.forward.node
    assert NOT_REPRODUCED in found.message
    assert json.loads(ins.to_json())["nonfinite"]["alarm"] is True


def _fused_softmax_gaps(q, k):
    """Per attention row, `x * scale - max(x * scale)` at its largest with the product
    left unrounded (as XLA:CPU's fused multiply-add of the scale and `sub` leaves it)
    and rounded to float32 first (as op-by-op arithmetic does), in float64 NumPy."""
    x = np.einsum("btnh,bsnh->bnts", np.asarray(q), np.asarray(k)).astype(np.float32)
    scale = np.float32(1 / np.sqrt(q.shape[-1]))
    rounded = x * scale  # float32
    row_max = rounded.max(-1, keepdims=True).astype(np.float64)
    fused = x.astype(np.float64) * np.float64(scale) - row_max
    return fused.max(-1), (rounded.astype(np.float64) - row_max).max(-1)


def test_locate_names_the_exp_a_fused_softmax_overflows():
    # The step's own program (`jax.jit`) is NaN: XLA fuses the attention scale into the
    # softmax's `x - max(x)`, and at logits of ~1e18 the unrounded product leaves up to
    # ~3e10 there, where the float32 product leaves 0; `exp` overflows, Inf / Inf is
    # NaN. The count re-run with its barriers rounds as op by op and was finite; the
    # one without them is fused as the step was and names `exp`.
    q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (2, 4, 1, 8)) * 1e9 for i in range(3))
    fused_gap, rounded_gap = _fused_softmax_gaps(q, k)
    log_f32_max = np.log(np.finfo(np.float32).max)
    assert np.all(rounded_gap <= 0) and np.any(fused_gap > log_f32_max)  # exp overflows
    assert np.isfinite(attention_loss(q, k, v))  # op by op
    if np.isfinite(float(jax.jit(attention_loss)(q, k, v))):
        pytest.skip("this XLA computes the fused softmax without overflow")
    ins = sowviz.inspect(attention_loss, q, k, v)
    found = ins.locate_nonfinite()
    assert found is ins.nonfinite and found.alarm and found.located
    eq = found.forward.equation
    assert eq.primitive == "exp" and ins.graph.node(found.forward.node).label == (
        "dot_product_attention"
    ), found.message
    assert "it held +Inf, which led to the NaN first made by `div`" in found.forward.message
    rec = json.loads(ins.to_json())["nonfinite"]
    assert rec["located"] is True and rec["not_reproduced"] is False
    assert rec["forward"]["equation"]["primitive"] == "exp"


def test_a_record_its_rerun_could_not_reproduce_is_flagged():
    # What the banner reads to offer no second "Locate the equation": the step's own
    # record, kept because the re-run (arguments made finite here) found no NaN/Inf.
    w = jnp.ones((3, 4)) * 0.5
    bad, good = jnp.ones((2, 3)) * 0.001, jnp.ones((2, 3))
    ins = sowviz.inspect(f_nested_norm, w, bad)
    assert json.loads(ins.to_json())["nonfinite"]["not_reproduced"] is False
    fn, _, opts = ins._rerun
    ins._rerun = (fn, (w, good), opts)
    found = ins.locate_nonfinite()
    rec = json.loads(ins.to_json())["nonfinite"]
    assert found.not_reproduced and rec["not_reproduced"] is True and rec["alarm"] is True
    assert rec["located"] is False and rec["forward"]["equation"] is None
    # a step that does reproduce: located, not flagged
    located = sowviz.inspect(f_nested_norm, w, bad).locate_nonfinite()
    assert located.located and not located.not_reproduced


def test_only_the_count_rerun_captures_without_barriers():
    # The summaries' programs keep their barriers (each probed value computed once and
    # read on from its buffer); `barriers=False` (locate's count re-run) has none, and
    # captures the same values.
    from sowviz.capture.api import SaveIntermediates

    def f(x):
        return jnp.sum(sowviz.sow(jnp.sin(x) * 2.0, "h") ** 2)

    x = jnp.linspace(-1.0, 1.0, 8)
    kw = dict(tag="intermediates", duplicates="error", loops="last", summarize=None, strict=True)
    texts, values = [], []
    for barriers in (True, False):
        cap = SaveIntermediates(f, **kw, barriers=barriers)
        texts.append(jax.jit(cap._traced).lower(x).as_text())
        values.append(np.asarray(cap(x)[1]["h"]["primal"]))
    assert "optimization_barrier" in texts[0] and "optimization_barrier" not in texts[1]
    np.testing.assert_allclose(values[1], np.sin(np.asarray(x)) * 2.0, rtol=1e-6)
    np.testing.assert_array_equal(values[0], values[1])


def f_distances(a, X):
    d2 = jnp.sum((X[:, None] - X[None]) ** 2, -1)
    r = jnp.sqrt(d2)  # 0 on the diagonal: a finite value, an infinite derivative
    return jnp.sum(jnp.exp(-a * r))


def test_mode_all_a_nan_only_in_sqrts_tangent_is_born_in_its_backward():
    # Mode "all" probes tangents too: `sqrt`'s tangent is NaN where its value is finite.
    # A backward pass reads values, never tangents: its NaN is born in the backward of
    # `sqrt`, as mode grad says, not "the forward pass holds non-finite values".
    a, X = jnp.array(1.0), jnp.linspace(0.0, 1.0, 4)[:, None]
    r = lambda X: jnp.sqrt(jnp.sum((X[:, None] - X[None]) ** 2, -1))  # noqa: E731
    _, r_dot = jax.jvp(r, (X,), (jnp.ones_like(X),))
    assert np.isfinite(f_distances(a, X)) and np.all(np.isfinite(r(X)))
    assert not np.all(np.isfinite(r_dot))
    assert not np.all(np.isfinite(jax.grad(f_distances, argnums=1)(a, X)))
    line = f_distances.__code__.co_firstlineno + 2
    grad = sowviz.inspect(f_distances, a, X, mode="grad", argnums=1).locate_nonfinite()
    assert (grad.backward.equation.primitive, _line(grad.backward)) == ("sqrt", line)
    ins = sowviz.inspect(f_distances, a, X, mode="all")
    # (before locating, by the line's box `r = jnp.sqrt(d2)`; located, by its equation)
    for o, made in ((ins.nonfinite, "r"), (ins.locate_nonfinite(), "sqrt")):
        msg = o.backward.message
        assert msg.startswith(f"born in the backward of `{made}`"), msg
        assert "follows from the forward pass" not in o.message, o.message
        assert o.forward.message.endswith("(in its tangent: the value is finite)"), o.message
    assert (o.backward.equation.primitive, _line(o.backward)) == ("sqrt", line)


@jax.jit
def _finite_or_minus_inf(ll):
    return jnp.where(jnp.isfinite(ll), ll, -jnp.inf)  # tinygp's guard: a -Inf fill


def f_failed_cholesky(s, y):
    K = s * jnp.ones((3, 3))  # rank 1, no jitter: the factorisation fails
    L = jnp.linalg.cholesky(K)
    z = jax.scipy.linalg.solve_triangular(L, y, lower=True)
    ll = -0.5 * jnp.sum(z**2) - jnp.sum(jnp.log(jnp.diag(L)))
    return -_finite_or_minus_inf(ll)


def test_an_inf_fill_a_where_put_in_place_of_a_nan_is_no_origin_and_no_nan():
    # The loss is +Inf (a NaN log-likelihood replaced by -Inf, negated), the gradient
    # NaN: the origin is the NaN `cholesky` made, and the +Inf the results hold is the
    # fill, not "the NaN first made by" the constant.
    s, y = jnp.array(1.0), jnp.arange(3.0)
    value, g = jax.value_and_grad(f_failed_cholesky)(s, y)
    assert np.isposinf(value) and np.isnan(g)
    assert np.isnan(jnp.linalg.cholesky(s * jnp.ones((3, 3)))).any()
    prim, line, _ = oracle(f_failed_cholesky, s, y)
    assert prim == "cholesky"
    o = sowviz.inspect(f_failed_cholesky, s, y).locate_nonfinite()
    assert (o.forward.equation.primitive, _line(o.forward)) == (prim, line), o.message
    fill = _finite_or_minus_inf.__wrapped__.__code__.co_firstlineno + 2
    msg = o.forward.message
    assert "; it held NaN; the results' +Inf comes from the -Inf fill value of " in msg, msg
    assert f"(tests/test_nonfinite.py:{fill}), put in its place" in msg, msg
    assert "led to the NaN" not in msg, msg


def _policy_layer(w, x):
    return jnp.tanh(x @ w["l1"])


def _policy_entropy(logits):
    p = jax.nn.softmax(logits)
    logp = jnp.log(p)  # the origin: -Inf where p underflows to 0 (minibatch 0)
    return -jnp.sum(p * logp, axis=-1)


def _policy_loss(w, x):
    return -_policy_entropy(_policy_layer(w, x) @ w["l2"]).mean()


def f_epochs_of_minibatches(w, batches):
    def epoch(w, _):
        def minibatch(w, x):
            loss, g = jax.value_and_grad(_policy_loss)(w, x)
            return jax.tree.map(lambda a, b: a - 0.1 * b, w, g), loss

        return lax.scan(minibatch, w, batches)

    return lax.scan(epoch, w, None, length=2)


def test_in_nested_scans_the_stage_level_candidates_name_the_origin_in_the_inner_loop():
    # The summaries split the iterations of the outer scan only: in epoch 0 the first
    # layer holds NaN (from minibatch 1, reading the parameters minibatch 0 broke) and
    # comes first in the body. `log`, later in the body, made it at minibatch 0: the
    # stage-level record names it among what may have made the carried value.
    k = jax.random.split(jax.random.key(0), 3)
    w = {"l1": jax.random.normal(k[0], (4, 8)), "l2": jax.random.normal(k[1], (8, 3)) * 1e6}
    batches = jax.random.normal(k[2], (2, 16, 4))
    # the independent check: in minibatch 0 the layer is finite and `log` is not
    h = _policy_layer(w, batches[0])
    assert np.all(np.isfinite(h))
    assert np.isneginf(jnp.log(jax.nn.softmax(h @ w["l2"]))).any()
    flat = lambda l1, l2, b: f_epochs_of_minibatches({"l1": l1, "l2": l2}, b)  # noqa: E731
    prim, line, _ = oracle(flat, w["l1"], w["l2"], batches)
    assert prim == "log" and oracle_iteration(flat, w["l1"], w["l2"], batches) == (0, 0)
    ins = sowviz.inspect(f_epochs_of_minibatches, w, batches, mode="primal")
    msg = ins.nonfinite.forward.message
    assert "at an earlier iteration of its loop, what follows it in the body made it (" in msg
    # named first, by its line's box (`logp = jnp.log(p)`, a box since round 14: the
    # function's lines read alike in every call of it)
    assert f"(`logp` (tests/test_nonfinite.py:{line})" in msg, msg
    assert msg.endswith("`locate_nonfinite()` names the equation"), msg
    o = ins.locate_nonfinite()
    assert (o.forward.equation.primitive, _line(o.forward)) == (prim, line), o.message
    assert o.forward.iteration == (0, 0) and "unless" not in o.forward.message


def f_overflow_on_the_return_line(params, x, y):
    h = x
    for p in params[:-1]:
        h = jax.nn.relu(h @ p["w"] + p["b"])
    out = h @ params[-1]["w"] + params[-1]["b"]
    return jnp.mean((out - y) ** 2)  # the origin: the square overflows


def test_a_return_lines_stage_is_named_as_the_line_in_messages():
    # A `return` line's work is drawn as a stage labelled `return`; in a sentence that
    # reads as a function named `return`: "in the `return` line at ..." instead.
    params = [{"w": jnp.full((4, 4), 1e12), "b": jnp.zeros(4)} for _ in range(3)]
    x, y = jnp.ones((2, 4)), jnp.zeros((2, 4))
    assert np.isposinf(f_overflow_on_the_return_line(params, x, y))
    leaves, tree = jax.tree.flatten(params)

    def flat(*a):  # (the oracle takes arrays)
        return f_overflow_on_the_return_line(jax.tree.unflatten(tree, a[:-2]), *a[-2:])

    prim, line, _ = oracle(flat, *leaves, x, y)
    ins = sowviz.inspect(f_overflow_on_the_return_line, params, x, y)
    # (now named by what the line computes, `mean`: no stage is labelled `return`)
    assert [n.label for n in ins.graph.nodes].count("mean") == 1
    assert "return" not in [n.label for n in ins.graph.nodes]
    at = f"(tests/test_nonfinite.py:{line})"
    assert ins.nonfinite.forward.message.startswith(f"first made by `mean` {at}")
    o = ins.locate_nonfinite()
    assert (o.forward.equation.primitive, _line(o.forward)) == (prim, line) == ("integer_pow", line)
    want = f"first made by `integer_pow` in `mean` at tests/test_nonfinite.py:{line}"
    assert o.forward.message.startswith(want), o.forward.message
