"""Custom gradients users write: a straight-through estimator and a gradient clip.

Both are `jax.custom_vjp`s whose rule sends a cotangent where the primal function's
own derivative is zero (`round`) or hands it on changed (the clip's forward is the
identity). The probes must show what the rule does: the rounded weight's gradient,
and the gradient arriving at the clip (before clipping) as its output's cotangent.
Expected values come from plain `jax.grad`."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

import sowviz

W = jax.random.normal(jax.random.PRNGKey(0), (8, 4))
X = jax.random.normal(jax.random.PRNGKey(1), (16, 8))


@jax.custom_vjp
def ste_round(x):
    return jnp.round(x)


ste_round.defvjp(lambda x: (jnp.round(x), None), lambda _, g: (g,))


def _quantised_loss(params, x):
    wq = ste_round(params["w"] * 4.0) / 4.0
    return jnp.mean((x @ wq) ** 2)


def _assert_summary(s: dict, values) -> None:
    values = np.asarray(values, np.float64)
    assert list(s["shape"]) == list(values.shape)
    np.testing.assert_allclose(s["l2"], np.linalg.norm(values), rtol=1e-4)
    np.testing.assert_allclose(s["max"], values.max(), rtol=1e-5, atol=1e-7)


def test_a_straight_through_weight_keeps_its_gradient():
    params = {"w": W}
    value, grads = jax.value_and_grad(_quantised_loss)(params, X)
    ins = sowviz.inspect(_quantised_loss, params, X, mode="grad")
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1]["w"], grads["w"], rtol=1e-5, atol=1e-8)
    # `round` has a zero derivative; the rule passes the cotangent on to the weight
    _assert_summary(ins.probe("params.w").summaries["cotangent"], grads["w"])


@partial(jax.custom_vjp, nondiff_argnums=(1,))
def clip_gradient(x, max_norm):
    return x


def _clip_fwd(x, max_norm):
    return x, None


def _clip_bwd(max_norm, _, g):
    return (g * jnp.minimum(1.0, max_norm / (jnp.linalg.norm(g) + 1e-6)),)


clip_gradient.defvjp(_clip_fwd, _clip_bwd)


def _clipped_loss(w, x):
    h = clip_gradient(x @ w, 0.01)
    return jnp.mean(jnp.tanh(h) ** 2)


def test_a_gradient_clip_whose_forward_is_the_identity_is_probed():
    ins = sowviz.inspect(_clipped_loss, W, X, mode="grad")
    h = X @ W
    unclipped = jax.grad(lambda h: jnp.mean(jnp.tanh(h) ** 2))(h)
    probe = ins.probe("clip_gradient")
    _assert_summary(probe.summaries["primal"], h)
    _assert_summary(probe.summaries["cotangent"], unclipped)
    # the weight's gradient is the clipped one
    np.testing.assert_allclose(ins.result[1], jax.grad(_clipped_loss)(W, X), rtol=1e-5, atol=1e-8)
    assert float(jnp.linalg.norm(jax.grad(_clipped_loss)(W, X))) < float(
        jnp.linalg.norm(X.T @ unclipped)
    )
