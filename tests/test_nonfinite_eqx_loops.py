"""NaN origins inside the while loops of Equinox, diffrax and optimistix, which keep
+Inf fill values in their loop state from the first iteration (an output buffer, a
first `f = inf`), against answers computed apart: the same recurrence in NumPy, or the
vector field's calls recorded by `jax.debug.callback` in plain JAX.

A fill carried from iteration 0 is not where the NaN the program returns was born,
and in a run whose results are all finite it starts nothing (no "starts here").
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz.nonfinite_locate import locate
from sowviz.options import InspectOptions

eqxi = pytest.importorskip("equinox.internal")


def vf(y):
    return -jnp.sqrt(y)  # NaN once y < 0


VF_LINE = vf.__code__.co_firstlineno + 1
STEPS, H = 12, 0.25


def euler_first_negative(y0: float) -> int:
    """The iteration at which `sqrt` first reads y < 0 in `euler` (NumPy, float32)."""
    y = np.float32(y0)
    for i in range(STEPS):
        if y < 0:
            return i
        y = np.float32(y + np.float32(H) * -np.sqrt(y))
    raise AssertionError("y never goes below 0")


def euler(y0, loop="eqxi", buffer=False):
    """Euler on dy/dt = -sqrt(y), with an +Inf-filled array in the loop state (diffrax's
    output buffer); `buffer`: written every step, as diffrax's `SaveAt` does."""

    def body(c):
        i, y, buf = c
        y = y + H * vf(y)
        if buffer:
            buf = buf.at[i].set(y[0])
        return i + 1, y, buf

    init = (0, y0, jnp.full((STEPS,), jnp.inf))
    if loop == "lax":
        _, y, buf = jax.lax.while_loop(lambda c: c[0] < STEPS, body, init)
    else:
        buffers = (lambda c: c[2]) if buffer else None
        kind = loop.removeprefix("eqxi-") if loop != "eqxi" else "lax"
        _, y, buf = eqxi.while_loop(
            lambda c: c[0] < STEPS, body, init, max_steps=64, kind=kind, buffers=buffers
        )
    # the buffer's unwritten +Inf is masked, as diffrax's `ys` past the last save
    return jnp.sum(y) + jnp.sum(jnp.where(jnp.isfinite(buf), buf, 0.0))


@pytest.mark.parametrize(
    "loop, buffer",
    [("lax", False), ("eqxi", False), ("eqxi", True), ("eqxi-checkpointed", False)],
)
def test_a_loops_inf_fill_is_not_where_its_nan_was_born(loop, buffer):
    # `equinox.internal.while_loop` selects its whole state every iteration: the +Inf
    # fill is in `unwrap_and_select` (and `maybe_set`) from iteration 0, the NaN from
    # the iteration `sqrt` made it; it was named as "first made by `unwrap_and_select`
    # ... in iteration 0".
    y0 = jnp.array([1.0])
    f = lambda y0: euler(y0, loop, buffer)  # noqa: E731
    assert math.isnan(float(f(y0)))
    o = locate(f, (y0,), InspectOptions(mode="primal"))
    eq = o.forward.equation
    assert (eq.primitive, eq.source.line) == ("sqrt", VF_LINE), o.forward.message
    assert o.forward.iteration[-1] == euler_first_negative(1.0) == 7, o.forward.message
    assert o.alarm


def test_an_equinox_loops_fill_and_nan_in_grad_mode_and_the_monitor():
    # the Monitor locates its first non-finite step with the same rule (a checkpointed
    # loop: reverse-differentiable, as diffrax's)
    def loss(y0):
        return euler(y0, "eqxi-checkpointed", buffer=True)

    y0 = jnp.array([1.0])
    o = locate(loss, (y0,), InspectOptions(mode="grad"))
    assert (o.forward.equation.primitive, o.forward.equation.source.line) == ("sqrt", VF_LINE)
    assert o.forward.iteration == (7,)
    mon = sowviz.Monitor(loss, stop_on_nonfinite=True)
    with pytest.raises(
        sowviz.NonFiniteError, match=rf"`sqrt` in `vf` at [^,]*:{VF_LINE}, in iteration 7 "
    ):
        mon.step(y0)
    assert mon.nonfinite.origins.forward.equation.primitive == "sqrt"
    mon.close()


def test_an_equinox_loops_fill_in_a_finite_run_starts_nothing():
    # y0 = 4 never goes below 0 in 12 steps: every result is finite, the +Inf buffer
    # is the only non-finite value. It was "NaN/Inf starts here (forward)".
    y0 = jnp.array([4.0])
    f = lambda y: euler(y, "eqxi-checkpointed", buffer=True)  # noqa: E731
    assert np.isfinite(f(y0)) and np.isfinite(jax.grad(f)(y0)).all()
    for mode in ("primal", "grad"):
        ins = sowviz.inspect(f, y0, mode=mode)
        for o in (ins.nonfinite, ins.locate_nonfinite()):
            assert o.forward is None and o.backward is None and not o.alarm, o.message
            assert o.removed and o.expected  # still said (and drawn as expected values)
            assert "Only +Inf fill values, first made by `" in o.message
        rec = ins.to_dict()["nonfinite"]
        assert rec["forward"] is None and rec["expected"] and not rec["alarm"]
    # a fill the user masks outside any loop is still reported as before
    masked = sowviz.inspect(lambda s: jnp.sum(jnp.exp(jnp.where(s > 0, s, -jnp.inf))), y0 - 5)
    assert masked.nonfinite.forward is not None and masked.nonfinite.removed


def test_a_nan_made_inside_the_loop_in_a_finite_run_keeps_its_origin():
    # a NaN a `jnp.where` masks in the loop body is no fill: it keeps its origin
    def f(y0):
        def body(c):
            i, y = c
            bad = jnp.sqrt(y - 2.0)  # NaN at y < 2, masked below
            return i + 1, y + 0.1 * jnp.where(y > 2.0, bad, 0.0)

        return jnp.sum(
            eqxi.while_loop(lambda c: c[0] < 3, body, (0, y0), max_steps=8, kind="lax")[1]
        )

    o = locate(f, (jnp.array([1.0]),), InspectOptions(mode="primal"))
    assert o.forward is not None and o.forward.equation.primitive == "sqrt", o.message
    assert o.removed and not o.alarm


# ---------------------------------------------------------------------------
# diffrax and optimistix themselves


diffrax = pytest.importorskip("diffrax")
optx = pytest.importorskip("optimistix")
eqx = pytest.importorskip("equinox")


class Tank(eqx.Module):
    k: jax.Array

    def __call__(self, t, y, args):
        return -self.k * jnp.sqrt(y)  # the level overshoots below 0: NaN


TANK_LINE = Tank.__call__.__code__.co_firstlineno + 1
DT0 = 0.25


def level(tank, y0):
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(tank), diffrax.Tsit5(), t0=0.0, t1=3.0, dt0=DT0, y0=y0
    )
    return jnp.sum(sol.ys**2)


def first_negative_step(k: float) -> int:
    """The solver step (iteration of diffrax's loop) whose vector field first reads a
    level below 0, from the times of its calls recorded in plain JAX."""
    calls: list[tuple[float, float]] = []

    class Recorded(Tank):
        def __call__(self, t, y, args):
            jax.debug.callback(lambda t, y: calls.append((float(t), float(y[0]))), t, y)
            return super().__call__(t, y, args)

    jax.block_until_ready(jax.jit(level)(Recorded(jnp.array(k)), jnp.array([1.0])))
    t = next(t for t, y in calls if not y >= 0)
    return int(t // DT0)


@pytest.mark.slow
def test_diffrax_the_located_origin_is_the_vector_fields_sqrt():
    # was "first made by `_fn` at diffrax/_integrate.py:1456, in iteration 0 of `while`"
    tank, y0 = Tank(jnp.array(1.0)), jnp.array([1.0])
    step = first_negative_step(1.0)
    assert step == 7
    o = sowviz.inspect(level, tank, y0, mode="primal").locate_nonfinite()
    eq = o.forward.equation
    assert (eq.primitive, eq.source.line) == ("sqrt", TANK_LINE), o.forward.message
    assert o.forward.iteration[0] == step, o.forward.message
    assert "vector_field: Tank" in o.forward.path


@pytest.mark.slow
def test_diffrax_a_finite_solve_carries_its_inf_buffer_without_a_start():
    ins = sowviz.inspect(level, Tank(jnp.array(0.1)), jnp.array([1.0]), mode="primal")
    assert np.isfinite(ins.result)
    o = ins.nonfinite
    assert o.forward is None and not o.alarm and o.expected, o.message
    assert "fill values, first made by `_allocate_output`" in o.message


def newton(y0, c):
    residual = lambda y, c: jnp.log(y) - c  # noqa: E731
    solver = optx.Newton(rtol=1e-8, atol=1e-8)
    return optx.root_find(residual, solver, y0, args=c, throw=False, max_steps=8).value


def newton_first_negative(y0: float, c: float) -> int:
    """The Newton iteration evaluating log at a negative iterate (NumPy)."""
    y = np.float32(y0)
    for k in range(8):
        if y < 0:
            return k
        y = np.float32(y - (np.log(y) - c) * y)  # y - f(y) / f'(y)
    raise AssertionError("the iterates stay positive")


def test_optimistix_newton_the_located_origin_is_log_at_its_iteration():
    # y0 = 60: the first step jumps to -5.65; was "first made by `array` at
    # optimistix/_iterate.py:353, in iteration 0 of `while`"
    o = locate(newton, (jnp.array(60.0), jnp.array(3.0)), InspectOptions(mode="primal"))
    eq = o.forward.equation
    assert eq.primitive == "log" and eq.source.function.endswith("<lambda>"), o.message
    assert o.forward.iteration == (newton_first_negative(60.0, 3.0),) == (1,)


def test_optimistix_newton_a_finite_solve_starts_nothing():
    ins = sowviz.inspect(newton, jnp.array(25.0), jnp.array(3.0), mode="grad")
    assert np.isfinite(ins.result[0])
    for o in (ins.nonfinite, ins.locate_nonfinite()):
        assert o.forward is None and not o.alarm and o.expected, o.message
