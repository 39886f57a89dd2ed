"""The capture engine through libraries' own derivative rules: diffrax's checkpointed
while loop and adjoints, optimistix's implicit adjoint, against hand-written JAX."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz import save_intermediates, sow

eqx = pytest.importorskip("equinox")
diffrax = pytest.importorskip("diffrax")
optx = pytest.importorskip("optimistix")

DT, STEPS = 0.1, 10
Y0 = jnp.array([1.0, -0.5])


class VectorField(eqx.Module):
    lin: eqx.nn.Linear

    def __call__(self, t, y, args):
        return sow(jnp.tanh(self.lin(y)), "vf_out")


VF = VectorField(eqx.nn.Linear(2, 2, key=jax.random.PRNGKey(0)))


def _euler_loss(adjoint):
    def loss(vf, y0):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(vf), diffrax.Euler(), 0.0, 1.0, DT, y0, adjoint=adjoint
        )
        return jnp.sum(sol.ys[-1] ** 2)

    return loss


def _euler_reference():
    """Each step's vector-field value h_k, and d loss / d h_k: Euler by hand, with a
    perturbation added to each h_k to differentiate by."""

    def run(eps):
        y, hs = Y0, []
        for k in range(STEPS):
            h = jnp.tanh(VF.lin(y))
            hs.append(h)
            y = y + DT * (h + eps[k])
        return jnp.sum(y**2), jnp.stack(hs)

    eps = jnp.zeros((STEPS, 2))
    (_, hs), cts = jax.value_and_grad(run, has_aux=True)(eps)
    return np.asarray(hs), np.asarray(cts)


@pytest.mark.parametrize("checkpoints", [None, 3], ids=["default", "recomputing"])
def test_checkpointed_loop_keeps_forward_steps_in_order_under_grad(checkpoints):
    # diffrax's default adjoint differentiates its while loop with Equinox's checkpointed
    # backward loop, which recomputes steps and pulls cotangents back last step first
    # (with 3 checkpoints, also recomputing steps in between): row k must be step k.
    loss = _euler_loss(diffrax.RecursiveCheckpointAdjoint(checkpoints=checkpoints))
    hs, cts = _euler_reference()
    grad = eqx.filter_grad(loss)

    _, last = save_intermediates(grad)(VF, Y0)
    entry = last["vf_out"]
    assert set(entry) == {"primal", "cotangent", "iterations"}
    assert int(entry["iterations"]) == STEPS
    np.testing.assert_allclose(entry["primal"], hs[-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(entry["cotangent"], cts[-1], rtol=1e-5, atol=1e-6)

    _, rows = save_intermediates(grad, loops=16)(VF, Y0)
    entry = rows["vf_out"]
    assert int(entry["iterations"]) == STEPS
    np.testing.assert_allclose(entry["primal"][:STEPS], hs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(entry["cotangent"][:STEPS], cts, rtol=1e-5, atol=1e-6)
    assert not np.any(entry["primal"][STEPS:]) and not np.any(entry["cotangent"][STEPS:])

    _, first_rows = save_intermediates(grad, loops=4)(VF, Y0)  # fewer rows than steps
    np.testing.assert_allclose(first_rows["vf_out"]["cotangent"], cts[:4], rtol=1e-5, atol=1e-6)


def test_backsolve_duplicate_says_the_library_calls_the_function_again():
    # BacksolveAdjoint traces the vector field again for its backward solve: two calls
    # of one sow, whose lines Equinox's re-bound trace keeps none of: never its frames.
    loss = _euler_loss(diffrax.BacksolveAdjoint(solver=diffrax.Euler()))
    with pytest.raises(ValueError, match="Duplicate sow name 'vf_out'") as err:
        save_intermediates(eqx.filter_grad(loss))(VF, Y0)
    msg = str(err.value)
    assert "duplicates='suffix'" in msg and "adjoint's backward solve" in msg
    assert "equinox" not in msg and "site-packages" not in msg

    _, inter = save_intermediates(eqx.filter_grad(loss), duplicates="suffix", loops=16)(VF, Y0)
    hs, _ = _euler_reference()
    np.testing.assert_allclose(inter["vf_out_0"]["primal"][:STEPS], hs, rtol=1e-5, atol=1e-6)
    assert "cotangent" in inter["vf_out_1"]  # the adjoint solve's own evaluations


def _residual(y, args):
    a, b = args
    return sow(jnp.tanh(y + a) - b * y, "residual")


PARAMS = {"a": jnp.array([0.1, 0.2, 0.3]), "b": jnp.array([0.5, 0.6, 0.7])}


def _root(params):
    solver = optx.Newton(rtol=1e-6, atol=1e-6)
    args = (params["a"], params["b"])
    return optx.root_find(_residual, solver, jnp.zeros(3), args=args).value


def _root_loss(params):
    return jnp.sum(_root(params) ** 2)


def test_optimistix_implicit_adjoint_sow_is_captured_not_refused():
    # The implicit adjoint solves with the residual's Jacobian in lineax's
    # `linear_solve`, evaluating the sow there for derivatives only: no error, and
    # d loss / d residual = -J^-T d loss / d y at the root.
    wrapped = save_intermediates(jax.grad(_root_loss))
    grads, inter = wrapped(PARAMS)
    ref = jax.grad(_root_loss)(PARAMS)
    for k in PARAMS:
        np.testing.assert_allclose(grads[k], ref[k], rtol=1e-5, atol=1e-6)
    root = _root(PARAMS)
    args = (PARAMS["a"], PARAMS["b"])
    jac = jax.jacobian(lambda y: jnp.tanh(y + args[0]) - args[1] * y)(root)
    want = -np.linalg.solve(np.asarray(jac).T, np.asarray(2 * root))
    entry = inter["residual"]
    np.testing.assert_allclose(entry["cotangent"], want, rtol=1e-4, atol=1e-5)
    assert np.max(np.abs(entry["primal"])) < 1e-3  # the forward solve's last residual
    assert any("`linear_solve`" in n for n in wrapped.notes)


def test_optimistix_implicit_adjoint_sow_in_inspect():
    ins = sowviz.inspect(_root_loss, PARAMS, mode="grad")
    ref = jax.grad(_root_loss)(PARAMS)
    for k in PARAMS:
        np.testing.assert_allclose(ins.result[1][k], ref[k], rtol=1e-5, atol=1e-6)


class Robertsonish(eqx.Module):
    k: jax.Array

    def __call__(self, t, y, args):
        return -self.k * y


def _forward_mode_loss(field, y0):
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(field),
        diffrax.Tsit5(),
        0.0,
        1.0,
        0.1,
        y0,
        stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-5),
        adjoint=diffrax.ForwardMode(),
    )
    return jnp.sum(sol.ys[-1])


@pytest.mark.parametrize("mode", ["all", "grad"])
def test_forward_only_loop_in_reverse_mode_says_use_jvp(mode):
    field, y0 = Robertsonish(jnp.array(0.5)), jnp.array([1.0, 2.0])
    with pytest.raises(ValueError, match=rf"mode '{mode}' takes `fn` backward") as err:
        sowviz.inspect(_forward_mode_loss, field, y0, mode=mode)
    msg = str(err.value)
    assert "mode='jvp'" in msg and "diffrax.ForwardMode()" in msg
    # the advice holds: mode jvp runs, and equals eqx.filter_jvp's
    tangents = (Robertsonish(jnp.array(1.0)), jnp.zeros(2))
    ins = sowviz.inspect(_forward_mode_loss, field, y0, mode="jvp", tangents=tangents)
    _, ref = eqx.filter_jvp(_forward_mode_loss, (field, y0), tangents)
    np.testing.assert_allclose(ins.result[1], ref, rtol=1e-5)
