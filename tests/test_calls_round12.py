"""One call of the user's function is one stage (`sowviz.graph.calls`), even where JAX
puts other frames' equations among its own: a `jax.linearize` or `jax.vjp` the callee
takes itself (the linear map, the pullback, replayed later with the tracebacks of the
line that took it) and a vmapped `lax.switch` or `lax.cond` (every branch inline, traced
with tracebacks of their own, then a select)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from test_calls import graph_of, one

import sowviz


def _top_calls(g):
    # (a test's lambda is no call: its line's fold, `g`, is left out)
    return [n.label for n in g.children(g.root) if n.kind == "scope" and n.label[0] == "_"]


def _labels(g, node):
    return [n.label for n in g.children(node.id)]


# --- a transform the callee takes itself --------------------------------------------


def _lin_term(B, q):
    y, f_jvp = jax.linearize(lambda z: jnp.cos(B @ z), q)
    return jnp.sum(f_jvp(jnp.ones_like(q)) * y)


def _vjp_term(B, q):
    y, pull = jax.vjp(lambda z: jnp.exp(-((B @ z) ** 2)), q)
    (gq,) = pull(jnp.ones_like(y))
    return jnp.sum(gq**2)


def _two_terms(B, q):
    return _lin_term(B, q) + 2.0 * _vjp_term(B, q)


def _operands():
    B = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)
    q = jnp.array([0.3, -0.7, 1.1, 0.2])
    return B, q


def test_a_function_linearizing_or_taking_a_vjp_inside_is_one_stage_with_its_value():
    # The linear map's equations keep the tracebacks of the `jax.linearize` line, so
    # the callee seemed to go back (a second call: `_lin_term`, `_lin_term#2`); the
    # pullback's, transposed, read as a backward pass of the call and a third call
    # after it (`_vjp_term`, `_vjp_term (backward)`, `_vjp_term#2`). The return value
    # was on the last of them; the first's probe held y, sin(B @ q) and ones.
    B, q = _operands()
    ins = sowviz.inspect(_two_terms, B, q)
    assert _top_calls(ins.graph) == ["_lin_term", "_vjp_term"]
    calls = [n.label for n in ins.graph.nodes if n.label.startswith(("_lin", "_vjp"))]
    assert calls == ["_lin_term", "_vjp_term"], calls
    # in JAX terms: the primal -0.0797 of `_lin_term` (by hand: sum(-sin(Bq) * (B @ 1) *
    # cos(Bq))), and dloss/d(stage output) = 1 and 2
    y = B @ q
    by_hand = float(np.sum(-np.sin(y) * B.sum(1) * np.cos(y)))
    for name, fn, weight in (("_lin_term", _lin_term, 1.0), ("_vjp_term", _vjp_term, 2.0)):
        got = ins.probe(name).summaries
        np.testing.assert_allclose(got["primal"]["mean"], float(fn(B, q)), rtol=1e-6)
        np.testing.assert_allclose(got["cotangent"]["l2"], weight, rtol=1e-6)
    np.testing.assert_allclose(
        ins.probe("_lin_term").summaries["primal"]["mean"], by_hand, rtol=1e-5
    )
    lin = one(ins.graph, "_lin_term", "scope")
    assert ins.graph.node(lin.id).shapes == ("float32[]",)
    # the pullback's seed, `jnp.ones_like(y)`, is no value kept for a backward pass
    kept = [ins.graph.node(n.node).label for n in ins.graph.notes if "keeps" in n.message]
    assert len(kept) == 1 and "ones_like" not in kept[0], kept


def _lin_last(B, q):
    _, f_jvp = jax.linearize(lambda z: jnp.cos(B @ z), q)
    t = jnp.ones_like(q) * 2.0
    return f_jvp(t)


def _vjp_last(B, q):
    y, pull = jax.vjp(lambda z: jnp.exp(-((B @ z) ** 2)), q)
    return pull(jnp.ones_like(y) * 3.0)[0]


def test_a_linear_map_or_pullback_applied_on_the_last_line_is_still_the_call():
    # nothing of the callee's own comes after the replay to say the call goes on
    B, q = _operands()
    for fn, out in ((_lin_last, "float32[3]"), (_vjp_last, "float32[4]")):
        g = graph_of(lambda B, q, fn=fn: jnp.sum(fn(B, q)), B, q)
        assert _top_calls(g) == [fn.__name__], (fn.__name__, _top_calls(g))
        # its own output: the linear map's (or the pullback's), not the residuals
        assert one(g, fn.__name__, "scope").shapes == (out,)


def _loop_of_lin(B, q):
    for _ in range(3):
        q = q * _lin_term(B, q)
    return jnp.sum(q)


def test_a_loop_calling_a_function_that_linearizes_keeps_one_stage_per_call():
    # a new call from the loop goes back to the `jax.linearize` line too: it is no
    # replay, since the callee then starts over rather than going on
    B, q = _operands()
    g = graph_of(_loop_of_lin, B, q)
    calls = [n for n in g.nodes if n.kind == "scope" and n.label.startswith("_lin_term")]
    assert [n.label for n in calls] == ["_lin_term (×3)", "_lin_term", "_lin_term#2", "_lin_term#3"]
    for call in calls[1:]:
        assert call.shapes == ("float32[]",)


def _train_step(B, q):
    loss, g = jax.value_and_grad(lambda q: _lin_term(B, q) + jnp.sum(_vjp_last(B, q)))(q)
    return q - 0.1 * g, loss


def test_a_backward_pass_taken_around_such_a_call_is_still_its_own_stage():
    # the train step's `jax.grad` puts `transpose` outside the callee's transforms:
    # its backward pass is no work of the callee's own
    B, q = _operands()
    g = graph_of(_train_step, B, q)
    assert _top_calls(g) == [
        "_lin_term",
        "_vjp_last",
        "_vjp_last (backward)",
        "_lin_term (backward)",
    ], _top_calls(g)


# --- a vmapped switch or cond --------------------------------------------------------


def _branchy(i, v):
    return lax.switch(i, [jnp.sin, jnp.cos, lambda t: t * 2.0], v)


def _switched(v, idx):
    z = jax.vmap(_branchy)(idx, v)
    return jnp.sum(z**2)


def test_a_vmapped_switch_of_library_branches_is_one_stage_with_the_output():
    # `jnp.sin` as a branch has no frame of the user's: it stood between the call's
    # equations at the top level and cut `_branchy` in three, whose first two showed
    # masked intermediate values and only the third dloss/dz
    v = jnp.linspace(-2.0, 2.0, 24).reshape(3, 8)
    idx = jnp.array([0, 1, 2])
    ins = sowviz.inspect(_switched, v, idx)
    assert _top_calls(ins.graph) == ["_branchy"]
    assert not any(n.label in ("sin", "cos") for n in ins.graph.children(ins.graph.root))
    branchy = one(ins.graph, "_branchy", "scope")
    inside = _labels(ins.graph, branchy)
    assert "sin" in inside and "cos" in inside and inside[-1] == "select_n", inside
    z = jax.vmap(_branchy)(idx, v)
    got = ins.probe("_branchy").summaries
    np.testing.assert_allclose(got["primal"]["mean"], float(z.mean()), rtol=1e-6)
    np.testing.assert_allclose(got["primal"]["max"], float(z.max()), rtol=1e-6)
    np.testing.assert_allclose(got["cotangent"]["l2"], float(jnp.linalg.norm(2 * z)), rtol=1e-5)
    np.testing.assert_allclose(ins.result[1], jax.grad(_switched)(v, idx), rtol=1e-6)


def _shifted(t):
    return jnp.tanh(t) + 1.0


def _two_lines(i, v):
    y = lax.switch(i, [jnp.sin, _shifted], v)
    return y * 3.0


def _conditioned(i, v):
    return lax.cond(i > 0, jnp.sin, jnp.cos, v)


def test_a_vmapped_switch_among_other_lines_keeps_its_branches_in_its_switch():
    v = jnp.linspace(-2.0, 2.0, 24).reshape(3, 8)
    idx = jnp.array([0, 1, 0])
    g = graph_of(lambda v, i: jnp.sum(jax.vmap(_two_lines)(i, v)), v, idx)
    assert _top_calls(g) == ["_two_lines"]
    inside = _labels(g, one(g, "_two_lines", "scope"))
    # both branches, a library's and the user's, in the line's `switch`
    assert inside == ["switch", "mul"], inside
    switch = _labels(g, one(g, "switch", "scope"))
    assert "sin" in switch and "tanh" in switch and switch[-1] == "select_n", switch
    g = graph_of(lambda v, i: jnp.sum(jax.vmap(_conditioned)(i - 1, v)), v, idx)
    assert _top_calls(g) == ["_conditioned"]
    inside = _labels(g, one(g, "cond", "scope"))
    assert "sin" in inside and "cos" in inside, inside


def test_a_library_s_frameless_work_joins_a_call_only_within_it():
    # between two equations of one call going on (a vmapped switch's `jnp.sin` branch)
    # it is the call's; between two calls of the function from one line (a library's
    # loop body calling the objective, BFGS's line search) it is the library's
    from sowviz._compat import UserCall
    from sowviz.graph.calls import _inlined

    def call(lasti):
        return (UserCall("f", (1, 10, 2), lasti, False, None, 10),)

    own = (7, 0)
    assert _inlined([call(40), (), call(40)], [own, None, own]) == {1: 2}
    assert _inlined([call(40), (), call(8)], [own, None, own]) == {}
    # a branch of the user's own (another function's traceback) joins it either way
    assert _inlined([call(40), (), call(8)], [own, (9, 0), own]) == {1: 2}
