"""An RK4 integrator (`lax.scan`) in grad, jvp and all modes, and a Newton solver
(`lax.while_loop`) in primal and jvp modes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import sowviz

from .checks import STAT_RTOL, assert_close, assert_stage, assert_value_and_grad
from .models import ode

# -- RK4 -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rk4():
    return ode.make_rk4()


@pytest.fixture(scope="module")
def rk4_tangents(rk4):
    params, y0 = rk4
    k = jax.random.split(jax.random.PRNGKey(11), 4)
    t_params = {n: jax.random.normal(kk, ()) for n, kk in zip(sorted(params), k, strict=False)}
    return t_params, jax.random.normal(k[3], y0.shape)


@pytest.fixture(scope="module")
def rk4_grad_ins(rk4):
    return sowviz.inspect(ode.rk4_loss, *rk4, mode="grad")


def _terminal(y):
    return jnp.sum((y - ode.TARGET) ** 2)


def test_rk4_grad_equals_value_and_grad(rk4, rk4_grad_ins):
    assert_value_and_grad(rk4_grad_ins.result, *jax.value_and_grad(ode.rk4_loss)(*rk4))


def test_rk4_final_state_cotangent(rk4, rk4_grad_ins):
    yT = ode.final_state(*rk4)
    assert_stage(rk4_grad_ins, yT, key="cotangent", expected=jax.grad(_terminal)(yT))


def test_rk4_jvp_mode_equals_jax_jvp(rk4, rk4_tangents):
    ins = sowviz.inspect(ode.final_state, *rk4, mode="jvp", tangents=rk4_tangents)
    value, tangent = jax.jvp(ode.final_state, rk4, rk4_tangents)
    assert_close(ins.result[0], value, what="value")
    assert_close(ins.result[1], tangent, what="tangent")
    assert_stage(ins, value, key="tangent", expected=tangent)


def test_rk4_all_mode_equals_jvp_and_vjp(rk4, rk4_tangents):
    ins = sowviz.inspect(ode.rk4_loss, *rk4, mode="all", tangents=rk4_tangents)
    value, tangent = jax.jvp(ode.rk4_loss, rk4, rk4_tangents)
    _, pull = jax.vjp(ode.rk4_loss, *rk4)
    assert_close(ins.result[0], value, what="value")
    assert_close(ins.result[1], tangent, what="tangent")
    assert_close(ins.result[2], pull(jnp.ones_like(value)), what="cotangent")


def _sown(monkeypatch):
    """The integrator with a sow on each step's state (stacked by the scan)."""
    step = ode.rk4_step
    monkeypatch.setattr(ode, "rk4_step", lambda s, p: sowviz.sow(step(s, p), "state"))


def test_rk4_sown_states_stack_with_cotangents_and_tangents(rk4, rk4_tangents, monkeypatch):
    params, y0 = rk4
    traj = np.asarray(ode.simulate(params, y0)[1])
    rows = (0, ode.STEPS // 2, ode.STEPS - 1)
    want_cot = {
        i: jax.grad(
            lambda s, n=ode.STEPS - 1 - i: _terminal(
                lax.fori_loop(0, n, lambda _, v: ode.rk4_step(v, params), s)
            )
        )(traj[i])
        for i in rows
    }
    want_tan = {
        i: jax.jvp(lambda p, y, n=i + 1: ode.simulate(p, y, steps=n)[0], rk4, rk4_tangents)[1]
        for i in rows
    }
    _sown(monkeypatch)
    _, inter = sowviz.save_intermediates(jax.grad(ode.rk4_loss))(*rk4)
    assert np.shape(inter["state"]["primal"]) == traj.shape
    np.testing.assert_allclose(inter["state"]["primal"], traj, rtol=STAT_RTOL, atol=1e-5)
    for i in rows:
        np.testing.assert_allclose(
            inter["state"]["cotangent"][i], want_cot[i], rtol=1e-4, atol=1e-3
        )
    (_, _), inter = sowviz.save_intermediates(
        lambda p, y: jax.jvp(ode.final_state, (p, y), rk4_tangents)
    )(*rk4)
    for i in rows:
        np.testing.assert_allclose(inter["state"]["tangent"][i], want_tan[i], rtol=1e-4, atol=1e-4)


@pytest.mark.browser
def test_rk4_report_opens_in_chromium(rk4_grad_ins, report):
    report(rk4_grad_ins)


# -- Newton ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def newton_args():
    return ode.make_newton()


@pytest.fixture(scope="module")
def newton_tangents(newton_args):
    p, x0 = newton_args
    return jax.random.normal(jax.random.PRNGKey(2), p.shape), jnp.zeros_like(x0)


def _implicit_tangent(p, x, tp):
    """dx from the implicit function theorem at the root: -(dr/dp . tp) / (dr/dx)."""
    return -(tp[0] * x - tp[1]) / (3 * x**2 + p[0])


def test_newton_primal_mode(newton_args):
    ins = sowviz.inspect(ode.newton, *newton_args, mode="primal")
    x = ode.newton(*newton_args)
    assert_close(ins.result, x)
    np.testing.assert_allclose(ode.residual(ins.result, newton_args[0]), 0, atol=1e-5)


def test_newton_jvp_mode_equals_jax_jvp_and_the_implicit_function_theorem(
    newton_args, newton_tangents
):
    ins = sowviz.inspect(ode.newton, *newton_args, mode="jvp", tangents=newton_tangents)
    x, dx = jax.jvp(ode.newton, newton_args, newton_tangents)
    assert_close(ins.result[0], x, what="value")
    assert_close(ins.result[1], dx, what="tangent")
    implicit = _implicit_tangent(newton_args[0], x, newton_tangents[0])
    np.testing.assert_allclose(ins.result[1], implicit, rtol=1e-4, atol=1e-5)
    assert_stage(ins, x, key="tangent", expected=implicit)


def test_newton_sown_iterates(newton_args, newton_tangents, monkeypatch):
    """A sow on each iterate: loops="last" gives the root and its tangent; loops=N the
    first N iterates stacked and the iteration count."""
    p, x0 = newton_args
    iterates, x = [], x0
    for _ in range(50):  # the same iteration in Python
        step = ode.residual(x, p) / (3 * x**2 + p[0])
        x = x - step
        iterates.append(x)
        if float(jnp.max(jnp.abs(step))) <= 1e-6:
            break
    res = ode.residual
    monkeypatch.setattr(ode, "residual", lambda x, p: res(sowviz.sow(x, "x"), p))
    # the sow sits on the iterate entering each step; the last entering one is x[n-2]
    jvp = lambda p, x0: jax.jvp(ode.newton, (p, x0), newton_tangents)  # noqa: E731
    _, inter = sowviz.save_intermediates(jvp)(p, x0)
    np.testing.assert_allclose(inter["x"]["primal"], iterates[-2], rtol=1e-5)
    _, inter = sowviz.save_intermediates(jvp, loops=64)(p, x0)
    n = len(iterates)
    assert int(inter["x"]["iterations"]) == n
    stacked = np.asarray(inter["x"]["primal"])
    np.testing.assert_allclose(stacked[0], x0)
    np.testing.assert_allclose(stacked[1:n], np.stack(iterates[: n - 1]), rtol=1e-5, atol=1e-6)
