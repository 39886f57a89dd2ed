"""A sow that a library evaluates again to differentiate it: its primal and cotangent
come from one evaluation (round 16: `odeint`'s adjoint solve paired the forward
pass's first primal, shape (2,), with the backward solve's cotangents, (7, 2))."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.ode import odeint

import sowviz
from sowviz import save_intermediates


def _close(a, b, **kw):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **kw)


def _h(x):
    return jnp.sin(sowviz.sow(x * 2.0, "h"))


WEIGHTS = jnp.arange(3.0)
X = jnp.array([0.1, 0.2, 0.3])


def _rerun_loss(shift):
    """A `custom_vjp` whose backward rule runs `jax.vjp` of the very function (one
    trace, as `closure_convert` gives a library) at `x + shift`."""

    def loss(x):
        h, consts = jax.closure_convert(_h, x)
        assert not consts

        @jax.custom_vjp
        def f(x):
            return h(x)

        f.defvjp(lambda x: (h(x), x), lambda x, g: jax.vjp(h, x + shift)[1](g))
        return jnp.sum(f(x) * WEIGHTS)

    return loss


@pytest.mark.parametrize("shift", [0.0, 1.0])
def test_custom_vjp_rerun_pairs_cotangent_with_its_own_primal(shift):
    wrapped = save_intermediates(jax.grad(_rerun_loss(shift)))
    grads, inter = wrapped(X)
    _close(grads, jax.grad(_rerun_loss(shift))(X), rtol=1e-6)
    # the backward rule's evaluation: h = 2 (x + shift), dL/dh = cos(h) * weights
    where = 2.0 * (X + shift)
    _close(inter["h"]["primal"], where, rtol=1e-6)
    _close(inter["h"]["cotangent"], jnp.cos(where) * WEIGHTS, rtol=1e-5, atol=1e-7)
    (note,) = [n for n in wrapped.notes if "'h'" in n]
    assert "not the forward pass's" in note and "left out" in note


def test_two_differentiated_evaluations_of_one_trace_pair_the_first():
    # one traced `sow` evaluated twice, both differentiated: the backward pass visits
    # them last first, so "the first cotangent" is the second evaluation's
    def loss(x):
        h, _ = jax.closure_convert(_h, x)
        return jnp.sum(h(h(x)) * WEIGHTS)

    _, inter = save_intermediates(jax.grad(loss))(X)
    h1 = 2.0 * X
    ct2 = jnp.cos(2.0 * jnp.sin(h1)) * WEIGHTS
    _close(inter["h"]["primal"], h1, rtol=1e-6)
    _close(inter["h"]["cotangent"], 2.0 * ct2 * jnp.cos(h1), rtol=1e-5, atol=1e-7)


def _dyn(y, t, a):
    dy = jnp.stack([a * y[0] - 0.4 * y[0] * y[1], -a * y[1] + 0.4 * y[0] * y[1]])
    return sowviz.sow(dy, "dy")


def _plain_dyn(y, t, a):
    return jnp.stack([a * y[0] - 0.4 * y[0] * y[1], -a * y[1] + 0.4 * y[0] * y[1]])


def _ode_loss(a, y0, ts):
    return jnp.mean(odeint(_dyn, y0, ts, a) ** 2)


A, Y0, TS = jnp.array(1.1), jnp.array([1.0, 0.5]), jnp.linspace(0.0, 3.0, 8)


def test_odeint_adjoint_sow_primal_and_cotangent_are_one_evaluation():
    wrapped = save_intermediates(jax.grad(_ode_loss, argnums=(0, 1)))
    grads, inter = wrapped(A, Y0, TS)
    ref = jax.jit(jax.grad(lambda a, y0: jnp.mean(odeint(_plain_dyn, y0, TS, a) ** 2), (0, 1)))(
        A, Y0
    )
    _close(grads[0], ref[0], rtol=1e-4)
    _close(grads[1], ref[1], rtol=1e-4)
    primal, cot = inter["dy"]["primal"], inter["dy"]["cotangent"]
    assert primal.shape == cot.shape == (7, 2)
    # the adjoint solve starts each interval, last first, at the observed state ys[i]
    ys = odeint(_plain_dyn, Y0, TS, A)
    rows = range(7, 0, -1)
    _close(primal, jnp.stack([_plain_dyn(ys[i], TS[i], A) for i in rows]), rtol=1e-4)

    # ... where its cotangent is the adjoint state: d loss / d y(t_i), the solve restarted
    # at t_i from y (the observations before t_i do not depend on it)
    def rest(y, i):
        return jnp.sum(odeint(_plain_dyn, y, TS[i:], A) ** 2) / ys.size

    # rows 0 and 6: the last interval's (its own observation only) and the first's
    for row, i in ((0, 7), (6, 1)):
        _close(cot[row], jax.jit(jax.grad(rest), static_argnums=1)(ys[i], i), rtol=2e-3, atol=1e-5)
    (note,) = [n for n in wrapped.notes if "'dy'" in n]
    assert "odeint" in note and "not the forward pass's" in note


def test_odeint_without_gradient_keeps_the_forward_pass():
    wrapped = save_intermediates(_ode_loss)
    _, inter = wrapped(A, Y0, TS)
    assert set(inter["dy"]) == {"primal"}
    _close(inter["dy"]["primal"], _plain_dyn(Y0, TS[0], A), rtol=1e-6)  # f0 = dyn(y0, t0)
