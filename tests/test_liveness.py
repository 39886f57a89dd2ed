"""`sowviz._liveness`: which values reach a program's outputs, checked against the
gradients plain JAX computes.

For every program here, each input called dead must have an exactly zero
derivative (`jax.jvp`), and each one called live a non-zero one at these random
values. The one exception, a custom rule routing a tangent where its primal
program sends no value, is pinned down below: the probe loses its cotangent, the
gradient stays exact.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sowviz import _liveness

KEY = jax.random.PRNGKey(0)


def _inputs(n, shape=(3,)):
    return [jax.random.normal(k, shape) + 2.0 for k in jax.random.split(KEY, n)]


def _live_inputs(fn, args):
    closed = jax.make_jaxpr(fn)(*args)
    top = _liveness.live_values(closed, [True] * len(closed.out_avals))[()]
    return [v in top for v in closed.jaxpr.invars]


def _grads_nonzero(fn, args):
    """Per input: whether a tangent on it alone moves an output (`jax.jvp`, which a
    `while_loop` allows and `jax.grad` does not)."""
    out = []
    for i, a in enumerate(args):
        tangents = [jnp.zeros_like(b) for b in args]
        tangents[i] = jnp.ones_like(a)
        _, t = jax.jvp(fn, tuple(args), tuple(tangents))
        out.append(any(bool(np.any(np.asarray(x) != 0)) for x in jax.tree_util.tree_leaves(t)))
    return out


def _check(fn, args, expected):
    live = _live_inputs(fn, args)
    assert live == expected
    nonzero = _grads_nonzero(fn, args)
    for i, (on, nz) in enumerate(zip(live, nonzero, strict=True)):
        assert on or not nz, f"input {i} called dead has a non-zero gradient"
        assert nz or not on, f"input {i} called live has a zero gradient"


def test_a_jit_output_nobody_reads_is_dead():
    @jax.jit
    def solve(x, y):
        return jnp.sin(x), y * 2.0  # the second output is never read

    def loss(x, y):
        ys, _state = solve(x, y)
        return jnp.sum(ys**2)

    _check(loss, _inputs(2), [True, False])
    closed = jax.make_jaxpr(loss)(*_inputs(2))
    live = _liveness.live_values(closed, [True])
    body = closed.jaxpr.eqns[0].params["jaxpr"].jaxpr
    assert [v in live[((0, "jaxpr", None),)] for v in body.outvars] == [True, False]


def test_tangents_do_not_cross_comparisons_integers_or_stop_gradient():
    def f(x, y, z, w):
        a = jnp.where(x > 0, y, 0.0)  # x only decides: no tangent
        b = jax.lax.stop_gradient(z) * 3.0
        c = jnp.floor(w).astype(jnp.int32).astype(jnp.float32)
        return a + b + c

    _check(f, _inputs(4), [False, True, False, False])


def test_scan_carries_reach_the_output_through_each_other():
    # c2 feeds the output, c1 feeds c2 one step later, c0 only feeds itself
    def f(c0, c1, c2, xs):
        def body(carry, x):
            a, b, c = carry
            return (a * 1.5, b + x, c + b), None

        (_, _, c), _ = jax.lax.scan(body, (c0, c1, c2), xs)
        return c

    args = [*_inputs(3), jnp.ones((4, 3))]
    _check(f, args, [False, True, True, True])


def test_while_carries_and_its_condition():
    def f(x, limit, y):
        def cond(c):
            i, v, _ = c
            return (i < 5) & (jnp.sum(v) < limit)  # `limit` only decides how often

        def body(c):
            i, v, w = c
            return i + 1, v * 1.1, w + 1.0

        _, v, _ = jax.lax.while_loop(cond, body, (0, x, y))
        return v

    _check(f, [*_inputs(1), jnp.float32(1e6), *_inputs(1)], [True, False, False])


def test_a_cond_operand_used_by_one_branch_is_live():
    def f(p, x, y):
        return jax.lax.cond(p > 0, lambda a, b: a * 2.0, lambda a, b: a + 1.0, x, y)

    _check(f, [jnp.float32(1.0), *_inputs(2)], [False, True, False])


def test_error_if_passes_each_tangent_to_its_own_output():
    """Equinox's `error_if` is a `custom_jvp` whose primal program passes each value
    to its own output, as its rule passes each tangent: followed through."""
    eqx = pytest.importorskip("equinox")

    def f(x, y, z):
        x, y = eqx.error_if((x, y), jnp.any(z < -100.0), "z out of range")
        return x * 2.0

    _check(f, _inputs(3), [True, False, False])


def test_a_custom_rule_routing_a_tangent_its_value_does_not_take():
    """The analysis reads a rule's primal program, so `y` looks dead here though its
    tangent reaches the output: its probe loses its cotangent, and the gradient
    sowviz returns is still plain JAX's (the program reads on `y`, not on the
    `stop_gradient` the probe is given)."""
    import sowviz

    @jax.custom_jvp
    def g(x, y):
        return x * 2.0  # y is not used by the value ...

    @g.defjvp
    def g_jvp(primals, tangents):
        (x, y), (tx, ty) = primals, tangents
        return g(x, y), tx * 2.0 + ty  # ... but its tangent is

    def loss(x, y):
        with jax.named_scope("scaled"):
            y = y * 3.0
        return jnp.sum(g(x, y))

    args = _inputs(2)
    assert _live_inputs(loss, args) == [True, False]
    assert _grads_nonzero(loss, args) == [True, True]
    got = sowviz.inspect(loss, *args, argnums=(0, 1)).result
    value, grads = jax.value_and_grad(loss, argnums=(0, 1))(*args)
    np.testing.assert_allclose(got[0], value, rtol=1e-6)
    for g_got, g_want in zip(got[1], grads, strict=True):
        np.testing.assert_allclose(g_got, g_want, rtol=1e-6)
    assert np.all(np.asarray(grads[1]) == 3.0)


def test_a_program_holding_a_mutable_reference_claims_nothing():
    new_ref = getattr(jax, "new_ref", None)
    if new_ref is None:
        pytest.skip(f"JAX {jax.__version__} has no jax.new_ref")

    def f(x, y):
        r = new_ref(jnp.zeros(3))
        r[...] = y
        return x + r[...]

    closed = jax.make_jaxpr(f)(*_inputs(2))
    assert _liveness.live_values(closed, [True]) is None
