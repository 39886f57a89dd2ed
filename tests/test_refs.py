"""A loss that accumulates into a `jax.new_ref` it makes: JAX cannot transpose its
linearization, but `jax.vjp` differentiates it, and so does sowviz's grad mode."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz


def _loss(w, x):
    acc = jax.new_ref(jnp.zeros(()))
    h = x
    for _ in range(2):
        with jax.named_scope("layer"):
            h = jnp.tanh(h @ w)
        acc[...] += jnp.mean(h**2)
    return jax.freeze(acc)


W = jax.random.normal(jax.random.PRNGKey(0), (4, 4))
X = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)


def test_grad_of_a_loss_accumulating_into_a_ref_equals_jax():
    value, grad = jax.jit(jax.value_and_grad(_loss))(W, X)
    ins = sowviz.inspect(_loss, W, X, mode="grad")
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-5, atol=1e-7)
    # the stage carries its value and the gradient of the loss with respect to it
    h = jnp.tanh(X @ W)
    got = ins.probe("layer").summaries
    np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(h), rtol=1e-5)

    def tail(h):
        h2 = jnp.tanh(h @ W)
        return jnp.mean(h**2) + jnp.mean(h2**2)

    want = jax.grad(tail)(h)
    np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(want), rtol=1e-5)
    mon = sowviz.Monitor(_loss)
    for _ in range(2):
        v, g = mon.step(W, X)
        np.testing.assert_allclose(v, value, rtol=1e-6)
        np.testing.assert_allclose(g, grad, rtol=1e-5, atol=1e-7)


def test_every_equation_of_such_a_loss_is_probed_but_the_refs_own():
    # capture="all" (and a small program's own equations in "stages") probed the
    # reference's reads and writes too, and JAX's vjp refused the program. Every other
    # equation carries its value and gradient, as plain JAX computes them.
    value, grad = jax.jit(jax.value_and_grad(_loss))(W, X)
    ins = sowviz.inspect(_loss, W, X, capture="all")
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-5, atol=1e-7)
    nodes = {n.id: n for n in ins.graph.nodes}
    probed = {nodes[p.node].primitive for p in ins.probes if nodes[p.node].kind == "eqn"}
    assert {"dot_general", "tanh", "integer_pow", "reduce_sum", "div", "add"} <= probed
    assert not probed & {"new_ref", "get", "swap", "freeze"}
    h = jnp.tanh(X @ W)
    pow_ = next(p for p in ins.probes if nodes[p.node].primitive == "integer_pow")
    np.testing.assert_allclose(pow_.summaries["primal"]["l2"], np.linalg.norm(h**2), rtol=1e-5)


def test_mode_all_of_such_a_loss_says_why_and_what_to_use():
    with pytest.raises(TypeError, match=r"mode='all'.*jax\.new_ref.*mode='jvp'"):
        sowviz.inspect(_loss, W, X, mode="all")
