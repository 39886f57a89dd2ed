"""Neural ODEs as diffrax's documentation writes them, and the Equinox marker that
diffrax's `BacksolveAdjoint` puts on its final solver state.

`BacksolveAdjoint` returns the solver's final state beside the solution through
`equinox.internal.nondifferentiable_backward`, whose transpose rule cannot take
the symbolic-zero cotangent an unread value has on JAX 0.12. Plain JAX never
hands it one; sowviz used to, through the probe on that value (a crash in grad
mode and in the Monitor). Every result here is checked against Equinox's own
`filter_value_and_grad` / `filter_jit` training step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

from .checks import assert_close, assert_value_and_grad, probes_carrying

eqx = pytest.importorskip("equinox")


def test_a_value_nobody_reads_marked_nondifferentiable():
    """The smallest form of it: a jit's second output marked so, and a jit of
    diagnostics on it (a stage of its own, holding probes) whose result the loss
    does not use."""
    eqxi = pytest.importorskip("equinox.internal")

    @jax.jit
    def solve(x):
        return jnp.sin(x), eqxi.nondifferentiable_backward(x * 2.0, symbolic=False)

    @jax.jit
    def diagnostics(state):
        with jax.named_scope("norms"):
            return jnp.sqrt(jnp.sum(state**2))

    def loss(x):
        ys, state = solve(x)
        diagnostics(state)
        return jnp.sum(ys**2)

    x = jnp.arange(1.0, 4.0)
    ins = sowviz.inspect(loss, x, mode="grad")
    assert_value_and_grad(ins.result, *jax.value_and_grad(loss)(x))
    # the solution's probe carries its cotangent, dloss/dys = 2 sin(x) (the stage's and
    # the `sin` inside it, your function's equation) ...
    found = probes_carrying(ins, np.sin(np.asarray(x)))
    assert sorted(ins.probe_path(p) for p in found) == ["solve", "solve/sin"]
    (sol,) = [p for p in found if p.name == "solve"]
    np.testing.assert_allclose(
        sol.summaries["cotangent"]["l2"], np.linalg.norm(2 * np.sin(np.asarray(x))), rtol=1e-5
    )
    # ... the diagnostics' its primal only: no gradient reaches them
    found = probes_carrying(ins, np.linalg.norm(2 * np.asarray(x)))
    assert {p.name for p in found} == {"diagnostics", "norms"}
    assert all("cotangent" not in p.summaries for p in found)


diffrax = pytest.importorskip("diffrax")


class Func(eqx.Module):
    mlp: eqx.nn.MLP

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(2, 2, 8, depth=1, activation=jax.nn.softplus, key=key)

    def __call__(self, t, y, args):
        return jnp.tanh(self.mlp(y))


class NeuralODE(eqx.Module):
    func: Func
    adjoint: diffrax.AbstractAdjoint = eqx.field(static=True)

    def __call__(self, ts, y0):
        solution = diffrax.diffeqsolve(
            diffrax.ODETerm(self.func),
            diffrax.Tsit5(),
            t0=ts[0],
            t1=ts[-1],
            dt0=ts[1] - ts[0],
            y0=y0,
            stepsize_controller=diffrax.PIDController(rtol=1e-3, atol=1e-6),
            saveat=diffrax.SaveAt(ts=ts),
            adjoint=self.adjoint,
        )
        return solution.ys


def loss(model, ts, ys):
    pred = jax.vmap(model, in_axes=(None, 0))(ts, ys[:, 0])
    return jnp.mean((ys - pred) ** 2)


def _data():
    ts = jnp.linspace(0.0, 1.0, 5)
    y0 = jax.random.normal(jax.random.PRNGKey(1), (4, 2))
    ys = y0[:, None, :] * jnp.exp(-ts)[None, :, None]  # a decaying target
    return ts, ys


@pytest.mark.parametrize(
    "adjoint", [diffrax.BacksolveAdjoint(), diffrax.RecursiveCheckpointAdjoint()], ids=type
)
def test_neural_ode_gradients(adjoint):
    model = NeuralODE(Func(jax.random.PRNGKey(0)), adjoint)
    ts, ys = _data()
    ins = sowviz.inspect(loss, model, ts, ys, mode="grad")
    assert_value_and_grad(ins.result, *eqx.filter_value_and_grad(loss)(model, ts, ys))
    assert ins.nonfinite is None or not ins.nonfinite.alarm
    # `eqx.filter_jit`'s wrapper names nothing: diffrax's own functions are the stages
    # (they were `fun_wrapped`, `fun_wrapped#2`, ... inside `diffeqsolve`)
    labels = {n.label for n in ins.graph.nodes}
    assert not any("fun_wrapped" in x for x in labels), sorted(labels)
    assert "_allocate_output" in labels, sorted(labels)


def test_backsolve_training_with_a_monitor():
    optax = pytest.importorskip("optax")
    model = NeuralODE(Func(jax.random.PRNGKey(0)), diffrax.BacksolveAdjoint())
    ts, ys = _data()
    opt = optax.adam(1e-2)

    @eqx.filter_jit
    def plain_step(model, state):
        value, grads = eqx.filter_value_and_grad(loss)(model, ts, ys)
        updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_inexact_array))
        return value, eqx.apply_updates(model, updates), state

    mon = sowviz.Monitor(loss, every=2)
    ours, theirs = model, model
    s_ours = s_theirs = opt.init(eqx.filter(model, eqx.is_inexact_array))
    for _ in range(3):
        value, grads = mon.step(ours, ts, ys)
        updates, s_ours = opt.update(grads, s_ours, eqx.filter(ours, eqx.is_inexact_array))
        ours = eqx.apply_updates(ours, updates)
        want, theirs, s_theirs = plain_step(theirs, s_theirs)
        np.testing.assert_allclose(value, want, rtol=1e-5)
    assert_close(ours, theirs, what="parameters after 3 steps")
    mon.flush()
    assert len(mon.history) == 2  # steps 0 and 2 recorded (every=2)
    mon.close()


def test_a_solve_past_max_steps_says_so_as_equinox_does():
    """diffrax's `max_steps` check is an Equinox `error_if`: inside a program sowviz
    compiled it is Equinox's `EquinoxRuntimeError` with diffrax's message, not JAX's
    several-thousand-character callback traceback."""

    def loss(y0, k):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, a: -a * y),
            diffrax.Tsit5(),
            0.0,
            10.0,
            0.01,
            y0,
            args=k,
            max_steps=4,
        )
        return jnp.sum(sol.ys)

    y0, k = jnp.array([1.0, 2.0]), jnp.array(0.5)
    with pytest.raises(eqx.EquinoxRuntimeError) as plain:
        eqx.filter_jit(eqx.filter_value_and_grad(loss))(y0, k)
    with pytest.raises(eqx.EquinoxRuntimeError, match="maximum number of solver steps") as ours:
        sowviz.inspect(loss, y0, k)
    assert len(str(ours.value)) < 400, str(ours.value)
    assert "max_steps" in str(plain.value) and "sowviz.inspect" in str(ours.value)
    mon = sowviz.Monitor(loss)
    with pytest.raises(eqx.EquinoxRuntimeError, match="maximum number of solver steps"):
        mon.step(y0, k)
        mon.flush()


def test_optimistix_root_and_lineax_solve_gradients():
    """Implicit differentiation through an optimistix Newton root find and a lineax
    LU solve: gradients equal plain JAX's."""
    optx = pytest.importorskip("optimistix")
    lx = pytest.importorskip("lineax")

    def cubic(y, a):
        return y**3 - a

    def root_loss(k):
        sol = optx.root_find(cubic, optx.Newton(1e-6, 1e-6), jnp.ones(3), args=k)
        return jnp.sum(sol.value**2)

    def solve_loss(a, b):
        return jnp.sum(lx.linear_solve(lx.MatrixLinearOperator(a), b, lx.LU()).value ** 2)

    k = jnp.array([2.0, 3.0, 5.0])
    ins = sowviz.inspect(root_loss, k)
    assert_value_and_grad(ins.result, *jax.value_and_grad(root_loss)(k))
    np.testing.assert_allclose(ins.result[1], 2 / 3 * k ** (-1 / 3), rtol=1e-4)  # d(k^(2/3))/dk
    # the user's function in the solver is a stage named by it, not by optimistix's
    # wrapper (`fn: NoneAux`)
    labels = {n.label for n in ins.graph.nodes}
    assert "fn: cubic" in labels and not any("NoneAux" in x for x in labels), labels
    a = jnp.eye(3) * 3.0 + jax.random.normal(jax.random.PRNGKey(0), (3, 3)) * 0.3
    b = jnp.arange(1.0, 4.0)
    ins = sowviz.inspect(solve_loss, a, b, argnums=(0, 1))
    assert_value_and_grad(ins.result, *jax.value_and_grad(solve_loss, argnums=(0, 1))(a, b))


def test_jvp_through_a_solve_names_diffrax_forward_mode_and_then_matches_jax():
    """The default adjoint is a `custom_vjp`, which JAX cannot push tangents through:
    the refusal names diffrax's own way forward, and with it the tangent is `jax.jvp`'s."""
    ts, ys = _data()
    model = NeuralODE(Func(jax.random.PRNGKey(0)), diffrax.RecursiveCheckpointAdjoint())
    with pytest.raises(TypeError, match=r"diffrax\.ForwardMode\(\)"):
        sowviz.inspect(loss, model, ts, ys, mode="jvp", argnums=0)
    # mode "all" reaches the backward adjoint's own rule first, which fails otherwise
    # ("'type' object is not iterable" inside Equinox): the same words
    backsolve = NeuralODE(Func(jax.random.PRNGKey(0)), diffrax.BacksolveAdjoint())
    with pytest.raises(TypeError, match=r"mode 'all' pushes tangents.*ForwardMode\(\)"):
        sowviz.inspect(loss, backsolve, ts, ys, mode="all", argnums=0)
    model = NeuralODE(Func(jax.random.PRNGKey(0)), diffrax.ForwardMode())
    params, static = eqx.partition(model, eqx.is_inexact_array)
    tangent = jax.tree.map(lambda p: jnp.full_like(p, 0.1), params)
    got = sowviz.inspect(loss, model, ts, ys, mode="jvp", argnums=0, tangents=(tangent, None, None))
    want = jax.jvp(lambda p: loss(eqx.combine(p, static), ts, ys), (params,), (tangent,))
    np.testing.assert_allclose(got.result[0], want[0], rtol=1e-5)
    np.testing.assert_allclose(got.result[1], want[1], rtol=1e-4)
