"""`locate_nonfinite` inside solvers (`lax.custom_root`, `lax.custom_linear_solve`),
past a literal's ±Inf that a loop reads (`odeint`'s `jnp.clip(dt, max=jnp.inf)`), and
the name it gives an `associative_scan`'s numbered call."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from _helpers import marked_line

import sowviz

HERE = pathlib.Path(__file__)


def _line(marker: str) -> int:
    """The line of this file holding `marker` (a comment beside the origin)."""
    return marked_line(HERE, marker)


def _located(fn, *args, mode="grad"):
    ins = sowviz.inspect(fn, *args, mode=mode)
    return ins, ins.locate_nonfinite()


def _at(eq, primitive: str, marker: str) -> None:
    assert eq is not None
    assert eq.primitive == primitive, eq
    assert eq.source is not None and eq.source.file.endswith(HERE.name), eq
    assert eq.source.line == _line(marker), (eq.source, marker)


# -- lax.custom_root: a DEQ whose fixed-point function makes the NaN --------------------


def deq_f(w, x, z):
    return jnp.sqrt(w @ z + x) * 0.5  # origin: deq f


def deq(w, x):
    def solver(F, z0):
        return jax.lax.fori_loop(0, 20, lambda i, z: deq_f(w, x, z), z0)

    def tangent_solve(g, y):
        return jnp.linalg.solve(jax.jacobian(g)(y), y)

    f = lambda z: deq_f(w, x, z) - z  # noqa: E731
    return jax.lax.custom_root(f, jnp.zeros_like(x), solver, tangent_solve)


def deq_loss(w, x):
    return jnp.sum(deq(w, x) ** 2)


def test_a_nan_in_custom_roots_solve_is_named_at_the_line_of_the_function_it_iterates():
    w, x = 0.1 * jnp.eye(3), jnp.array([1.0, -1.0, 0.5])
    # plain JAX: the first iterate, sqrt(x) * 0.5, is NaN where x < 0; `w @ z` spreads it
    assert np.isnan(np.asarray(deq_f(w, x, jnp.zeros(3)))).tolist() == [False, True, False]
    assert np.isnan(np.asarray(deq(w, x))).all()
    _, loc = _located(deq_loss, w, x)
    _at(loc.forward.equation, "sqrt", "# origin: deq f")
    assert "`sqrt` in `deq_f`" in loc.forward.message, loc.forward.message
    assert f"{HERE.name}:{_line('# origin: deq f')}" in loc.forward.message


# -- lax.custom_root: its implicit derivative (`tangent_solve`) makes the NaN -----------


def cube_root(a):
    f = lambda z: z**3 - a  # noqa: E731

    def solver(F, z0):
        return jax.lax.fori_loop(0, 30, lambda i, z: z - F(z) / (3 * z**2), z0)

    def tangent_solve(g, y):
        return y / jnp.sqrt(-g(jnp.ones_like(y)))  # origin: tangent_solve

    return jax.lax.custom_root(f, jnp.ones_like(a), solver, tangent_solve)


def test_a_nan_in_custom_roots_tangent_solve_is_named_at_its_line():
    a = jnp.array([8.0, 27.0])
    # plain JAX: the root is finite (2, 3), its derivative is not (sqrt of -3 z^2)
    np.testing.assert_allclose(np.asarray(cube_root(a)), [2.0, 3.0], rtol=1e-5)
    assert np.isnan(np.asarray(jax.grad(lambda a: jnp.sum(cube_root(a)))(a))).all()
    _, loc = _located(lambda a: jnp.sum(cube_root(a)), a)
    assert loc.forward is None
    _at(loc.backward.equation, "sqrt", "# origin: tangent_solve")
    _, loc = _located(lambda a: jnp.sum(cube_root(a)), a, mode="jvp")
    _at(loc.forward.equation, "sqrt", "# origin: tangent_solve")


# -- lax.custom_linear_solve: its solve, and its transpose solve --------------------------


def precond_solve(d, b):
    def solve(matvec, r):
        s = jnp.sqrt(d)  # origin: linear solve
        return r / (s * s)

    return jax.lax.custom_linear_solve(lambda v: d * v, b, solve, symmetric=True)


def transposed_solve(d, b):
    def solve(matvec, r):
        return r / d

    def transpose_solve(vecmat, r):
        return r / jnp.sqrt(-d)  # origin: transpose solve

    return jax.lax.custom_linear_solve(lambda v: d * v, b, solve, transpose_solve)


def test_a_nan_in_custom_linear_solves_solve_is_named_at_its_line():
    d, b = jnp.array([2.0, -1.0, 4.0]), jnp.ones(3)
    assert np.isnan(np.asarray(precond_solve(d, b))).tolist() == [False, True, False]
    _, loc = _located(lambda d, b: jnp.sum(precond_solve(d, b) ** 2), d, b)
    _at(loc.forward.equation, "sqrt", "# origin: linear solve")
    assert "`sqrt` in `solve`" in loc.forward.message, loc.forward.message


def test_a_nan_in_custom_linear_solves_transpose_solve_is_named_in_the_backward_pass():
    d, b = jnp.array([2.0, 4.0]), jnp.ones(2)
    loss = lambda d, b: jnp.sum(transposed_solve(d, b))  # noqa: E731
    np.testing.assert_allclose(np.asarray(transposed_solve(d, b)), [0.5, 0.25])
    assert np.isnan(np.asarray(jax.grad(loss)(d, b))).all()
    _, loc = _located(loss, d, b)
    assert loc.forward is None
    _at(loc.backward.equation, "sqrt", "# origin: transpose solve")


# -- a literal's +Inf read by a loop is no origin; overflows of constants are -------------


def drain(k, h0):
    """A step-size loop as `odeint`'s: a trial step may take sqrt of a negative level,
    the step is then rejected (the results stay finite), and the step size is clipped
    with `max=jnp.inf`, a literal made a float every iteration."""

    def body(c):
        i, h, dt = c
        rate = k * jnp.sqrt(h - dt)  # origin: drain
        ok = jnp.all(jnp.isfinite(rate))
        dt_next = jnp.clip(dt * 1.5 + 0.0 * jnp.sum(rate), min=0.0, max=jnp.inf)
        return i + 1, jnp.where(ok, h - dt * rate, h), jnp.where(ok, dt_next, dt / 4)

    _, h, _ = jax.lax.fori_loop(0, 8, lambda i, c: body(c), (0, h0, jnp.asarray(0.1)))
    return jnp.sum(h)


def _first_nan_iteration(k, h0) -> int:
    """Plain NumPy: the iteration whose trial step first takes sqrt of a negative."""
    h, dt = np.asarray(h0, np.float64), 0.1
    for i in range(8):
        with np.errstate(invalid="ignore"):
            rate = k * np.sqrt(h - dt)
        if not np.all(np.isfinite(rate)):
            return i
        h, dt = h - dt * rate, dt * 1.5
    raise AssertionError("no NaN")


def test_a_literal_inf_a_loop_reads_leaves_the_origin_to_the_nan_made_there():
    k, h0 = jnp.asarray(1.0), jnp.array([1.0, 0.2])
    assert np.isfinite(float(drain(k, h0)))  # the rejected steps leave no NaN behind
    _, loc = _located(drain, k, h0)
    eq = loc.forward.equation
    _at(eq, "sqrt", "# origin: drain")
    assert loc.forward.iteration == (_first_nan_iteration(1.0, [1.0, 0.2]),)
    assert "convert_element_type" not in loc.forward.message
    assert "`clip`" not in loc.forward.message


def test_an_overflow_of_finite_constants_stays_the_origin():
    def loss(x):
        big = jnp.exp(jnp.float32(1000.0))  # origin: exp of a literal
        y = x * big
        return jnp.sum(jnp.where(jnp.isfinite(y), y, 0.0))

    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(np.float32(1000.0)))
    _, loc = _located(loss, jnp.ones(3))
    _at(loc.forward.equation, "exp", "# origin: exp of a literal")


def test_a_cast_that_overflows_stays_the_origin_constant_or_not():
    def loss(x):
        y = x.astype(jnp.float16)  # origin: cast of x
        return jnp.sum(jnp.where(jnp.isfinite(y), y, 0.0))

    x = jnp.array([1.0, 70000.0])  # finite in float32
    with np.errstate(over="ignore"):
        assert np.isinf(np.float16(70000.0))
    _, loc = _located(loss, x)
    _at(loc.forward.equation, "convert_element_type", "# origin: cast of x")

    def const_cast(x):
        big = jnp.full((2,), 70000.0, jnp.float32)  # (an equation, not folded at tracing)
        big16 = big.astype(jnp.float16)  # origin: constant cast
        y = x * big16.astype(jnp.float32)
        return jnp.sum(jnp.where(jnp.isfinite(y), y, 0.0))

    _, loc = _located(const_cast, jnp.ones(2))
    _at(loc.forward.equation, "convert_element_type", "# origin: constant cast")


# -- lax.associative_scan: the numbered call that overflowed -----------------------------


def combine(q_i, q_j):
    a_i, b_i = q_i
    a_j, b_j = q_j
    return a_j * a_i, a_j * b_i + b_j  # origin: combine


def ssm_loss(lam, u):
    a = jnp.exp(lam) * jnp.ones((u.shape[0], lam.shape[0]))
    _, xs = jax.lax.associative_scan(combine, (a, u))
    return jnp.mean(xs**2)


def _first_overflowing_call(lam, u) -> int:
    """Plain JAX, eagerly: the 1-based count of the first call of `combine` whose
    operands are finite and whose results are not (`combine`, `combine#2`, …)."""
    calls = []

    def counted(q_i, q_j):
        out = combine(q_i, q_j)
        ok_in = all(np.all(np.isfinite(np.asarray(v))) for v in (*q_i, *q_j))
        ok_out = all(np.all(np.isfinite(np.asarray(v))) for v in out)
        calls.append(ok_in and not ok_out)
        return out

    a = jnp.exp(lam) * jnp.ones((u.shape[0], lam.shape[0]))
    with jax.disable_jit():
        jax.lax.associative_scan(counted, (a, u))
    return calls.index(True) + 1


def test_an_associative_scans_origin_names_the_numbered_call_drawn():
    lam, u = jnp.array([-0.5, 10.0]), jnp.ones((16, 2))
    k = _first_overflowing_call(lam, u)
    _, loc = _located(ssm_loss, lam, u)
    eq = loc.forward.equation
    _at(eq, "mul", "# origin: combine")
    name = "combine" if k == 1 else f"combine#{k}"
    assert f"`mul` in `{name}` at" in loc.forward.message, (k, loc.forward.message)
    assert name in loc.forward.path
