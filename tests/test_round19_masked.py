"""`locate_nonfinite` on a NUTS-like trajectory builder: a NaN that a `while_loop`
carries out to the results is not "masked" because the program also reads a finite
value of that loop after it (BlackJAX's acceptance rate, `exp` of a -Inf weight).

BlackJAX builds a NUTS trajectory in nested `while_loop`s (expansion, integration),
scores each new state with `jnp.where(jnp.isnan(delta), -jnp.inf, delta)` and returns
the trajectory's states. A leapfrog step to a negative position makes `jnp.log` NaN
there; that NaN reaches the returned state. The located origin was the whole
`while(expand_once)` and the `log` was called "masked afterwards": the loop's values
were followed only to the equations reading the loop's outputs (finite), not to the
results the loop's outputs are. The answers here are computed apart, in NumPy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import sowviz

X0 = np.array([1.0, 2.0], np.float32)
P0 = np.array([1.0, -0.9], np.float32)
EPS = 5.0


def logdensity(x):
    return jnp.sum(-0.5 * jnp.log(x) ** 2 - jnp.log(x))  # NaN at x < 0


LOG_LINE = logdensity.__code__.co_firstlineno + 1


def energy_diff(e0, e1):
    d = e0 - e1
    return jnp.where(jnp.isnan(d), -jnp.inf, d)  # BlackJAX's `safe_energy_diff`


def leapfrog(x, p, g, eps):
    p = p + 0.5 * eps * g
    x = x + eps * p
    logp, g = jax.value_and_grad(logdensity)(x)
    return x, p + 0.5 * eps * g, logp, g


def integrate(x, p, g, e0, eps, n_steps):
    """The inner loop: one leapfrog state at a time, until `n_steps` or a divergence."""

    def cond(c):
        return (c[5] < n_steps) & ~c[6]

    def body(c):
        x, p, logp, g, w, n, _ = c
        x, p, logp, g = leapfrog(x, p, g, eps)
        d = energy_diff(e0, -logp + 0.5 * jnp.sum(p**2))
        return x, p, logp, g, jnp.logaddexp(w, d), n + 1, jnp.abs(d) > 1000.0

    return lax.while_loop(cond, body, (x, p, logdensity(x), g, -jnp.inf, 0, False))


def expand(x0, p0, eps):
    """The outer loop, doubling the trajectory until it diverges (NUTS's expansion);
    the acceptance rate read after it, as BlackJAX's `exp` of the summed weight."""
    logp0, g0 = jax.value_and_grad(logdensity)(x0)
    e0 = -logp0 + 0.5 * jnp.sum(p0**2)

    def cond(c):
        return (c[5] < 4) & ~c[6]

    def body(c):
        x, p, logp, g, w, depth, _ = c
        x, p, logp, g, w_new, _, div = integrate(x, p, g, e0, eps, 2**depth)
        return x, p, logp, g, jnp.logaddexp(w, w_new), depth + 1, div

    init = (x0, p0, logp0, g0, -jnp.inf, 0, False)
    x, p, logp, g, w, _, div = lax.while_loop(cond, body, init)
    return (x, p, logp, g), jnp.exp(jnp.minimum(w, 0.0)), div


def first_leapfrog_position() -> np.ndarray:
    """The first leapfrog step's position, in NumPy (float32): d/dx of
    -log(x)^2 / 2 - log(x) is -(log(x) + 1) / x."""
    g0 = -(np.log(X0) + 1) / X0
    return X0 + np.float32(EPS) * (P0 + np.float32(0.5 * EPS) * g0)


def test_the_mimic_diverges_at_its_first_leapfrog_step():
    # by hand: the first step leaves the support, where `log` is NaN; the results hold
    # that NaN and the acceptance rate read after the loop is finite (0)
    x1 = first_leapfrog_position()
    with np.errstate(invalid="ignore"):
        assert (x1 < 0).any() and np.isnan(np.log(x1)).any()
    (x, _, logp, _), acc, div = jax.jit(expand)(jnp.asarray(X0), jnp.asarray(P0), EPS)
    np.testing.assert_allclose(np.asarray(x), x1, rtol=1e-5)
    assert np.isnan(logp) and float(acc) == 0.0 and bool(div)


def test_a_nan_a_while_loop_returns_is_located_at_its_log_not_at_the_loop():
    # was "first made by `while(body)` ...; before it, a NaN in `log` ... was masked
    # afterwards (not the origin)"
    ins = sowviz.inspect(expand, jnp.asarray(X0), jnp.asarray(P0), EPS, mode="primal")
    o = ins.locate_nonfinite()
    eq = o.forward.equation
    assert (eq.primitive, eq.source.line) == ("log", LOG_LINE), o.forward.message
    assert "was masked" not in o.forward.message, o.forward.message
    assert o.alarm


# ---------------------------------------------------------------------------
# BlackJAX itself (not a test extra)


def test_blackjax_nuts_step_is_located_at_the_log_density_log():
    blackjax = pytest.importorskip("blackjax")

    def logdensity_fn(x):
        return jnp.sum(-0.5 * jnp.log(x["s"]) ** 2 - jnp.log(x["s"]))

    line = logdensity_fn.__code__.co_firstlineno + 1
    nuts = blackjax.nuts(logdensity_fn, step_size=5.0, inverse_mass_matrix=jnp.ones(2))
    state = nuts.init({"s": jnp.asarray(X0)})
    key = jax.random.key(0)
    _, info = jax.jit(nuts.step)(key, state)
    # by hand: the trajectory's left end left the support; NumPy's log is NaN there,
    # and that NaN is the log-density the step returns
    left = np.asarray(info.trajectory_leftmost_state.position["s"])
    with np.errstate(invalid="ignore"):
        assert (left < 0).any() and np.isnan(np.log(left)).any()
    assert np.isnan(info.trajectory_leftmost_state.logdensity)
    assert np.isfinite(logdensity_fn({"s": jnp.asarray(X0)}))
    o = sowviz.inspect(nuts.step, key, state, mode="primal").locate_nonfinite()
    eq = o.forward.equation
    # was "first made by `while(expand_once)` at blackjax/mcmc/termination.py:50;
    # before it, a NaN in `log` (...) was masked afterwards (not the origin)"
    assert (eq.primitive, eq.source.line) == ("log", line), o.forward.message
    assert "was masked" not in o.forward.message, o.forward.message


# ---------------------------------------------------------------------------
# diffrax: dy/dt = y**2 from y(0) = 1 blows up at t = 1. With `dtmin` forced the
# solver steps past it: the vector field overflows (y**2 = +Inf at y ~ 1e37), the
# step's +Inf/NaN is accepted and interpolated into the saved `ys`. Before its +Inf,
# the solve filled its output buffer with +Inf (`_allocate_output`, a literal
# `jnp.inf` times the direction of time): a fill, not where the value went wrong.

diffrax = pytest.importorskip("diffrax")

TS = np.linspace(0.0, 2.0, 9)


def blow_up(t, y, args):
    return y**2


BLOW_UP_LINE = blow_up.__code__.co_firstlineno + 1


def solve(y0, vector_field=blow_up):
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(vector_field),
        diffrax.Tsit5(),
        t0=0.0,
        t1=2.0,
        dt0=0.1,
        y0=y0,
        saveat=diffrax.SaveAt(ts=jnp.asarray(TS)),
        stepsize_controller=diffrax.PIDController(
            rtol=1e-5, atol=1e-5, dtmin=0.05, force_dtmin=True
        ),
        throw=False,
        max_steps=64,
    )
    return jnp.sum(sol.ys)


def first_overflow() -> tuple[int, int]:
    """(solver step, Runge-Kutta stage) of the first vector field call returning a
    non-finite value, from the calls recorded in plain JAX: Tsit5 evaluates the field
    once before the first step (first same as last), then at its 6 later stages."""
    calls: list[float] = []

    def recorded(t, y, args):
        out = blow_up(t, y, args)
        jax.debug.callback(lambda o: calls.append(float(o)), out)
        return out

    jax.block_until_ready(jax.jit(lambda y0: solve(y0, recorded))(jnp.array(1.0)))
    k = next(i for i, o in enumerate(calls) if not np.isfinite(o))
    assert np.isfinite(calls[:k]).all() and k > 0
    return divmod(k - 1, 6)


OLD_JAX = tuple(int(x) for x in jax.__version__.split(".")[:2]) < (0, 11)


@pytest.mark.slow
@pytest.mark.skipif(
    OLD_JAX,
    reason="on JAX 0.10 locate still names `_allocate_output`'s `mul` (the vector field's "
    "overflow is not seen to reach a result there): an open gap",
)
def test_diffrax_blow_up_is_located_at_the_vector_field_not_the_output_fill():
    # was "first made by `_fn#2` at diffrax/_integrate.py:373, in iteration 18 of
    # `while(body_fun)`; before it, `copy` ... held +Inf"
    assert not np.isfinite(jax.jit(solve)(jnp.array(1.0)))
    step, stage = first_overflow()
    o = sowviz.inspect(solve, jnp.array(1.0), mode="primal").locate_nonfinite()
    eq = o.forward.equation
    assert (eq.primitive, eq.source.line) == ("integer_pow", BLOW_UP_LINE), o.forward.message
    assert o.forward.iteration[:2] == (step, stage), o.forward.message
    assert "_allocate_output" not in eq.label + eq.within, o.forward.message
