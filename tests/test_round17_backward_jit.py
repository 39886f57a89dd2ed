"""A jitted function differentiated inside the program (a train step's
`jax.value_and_grad(loss)` of a `@jax.jit` loss): JAX binds its backward pass as a
`jit` of the same name, drawn `loss (backward)` as a call of the user's is (it read
`loss#2`, as if the loss were called twice)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import sowviz


@jax.jit
def _loss(theta, f):
    k = jax.nn.softplus(theta) + 0.1
    return jnp.sum(k * f) + 0.01 * jnp.sum(k**2)


_OPT = optax.sgd(0.1)


@jax.jit
def _train_step(theta, state, f):
    loss, g = jax.value_and_grad(_loss)(theta, f)
    updates, state = _OPT.update(g, state, theta)
    return optax.apply_updates(theta, updates), state, loss


def test_a_jitted_losss_backward_pass_is_named_backward():
    theta = jnp.linspace(-1.0, 1.0, 4)
    f = jnp.arange(1.0, 5.0)
    state = _OPT.init(theta)
    ins = sowviz.inspect(_train_step, theta, state, f, mode="primal")
    want = _train_step(theta, state, f)
    np.testing.assert_allclose(ins.result[0], want[0], rtol=1e-6)
    np.testing.assert_allclose(ins.result[2], want[2], rtol=1e-6)
    d = ins.to_dict()
    (step,) = [n for n in d["nodes"] if n["label"] == "_train_step"]
    inside = [n["label"] for n in d["nodes"] if n["parent"] == step["id"] and n["kind"] == "jit"]
    assert inside == ["_loss", "_loss (backward)"], inside
    # the backward stage makes the gradient
    g = jax.grad(_loss)(theta, f)
    got = ins.probe("_loss (backward)").summaries["primal"]
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(g)), rtol=1e-5)
