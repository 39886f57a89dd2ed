"""Round 15, NumPyro: a potential differentiated inside the program (HMC's leapfrog
takes `jax.grad` of it) and SVI's loss of unconstrained parameters. The log-Jacobian
that sowviz's NumPyro hook sows gets none of the advice meant for a user's `sow`, a
sow's second call is drawn where that call is (not on the first call's backward pass),
and the line `elbo.loss(key, svi.constrain_fn(params), ...)` is named by its argument,
not `loss_fn:<line>`. Values are checked against plain `jax.value_and_grad`."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

numpyro = pytest.importorskip("numpyro")
dist = pytest.importorskip("numpyro.distributions")
infer_util = pytest.importorskip("numpyro.infer.util")
infer = pytest.importorskip("numpyro.infer")
autoguide = pytest.importorskip("numpyro.infer.autoguide")


def _half_normal_model():
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    numpyro.sample("obs", dist.Normal(0.0, s), obs=jnp.array([0.5, -1.0]))


def _parent_label(ins, node_id: str) -> str:
    node = ins.graph.node(node_id)
    return ins.graph.node(node.parent).label if node.parent else ""


def test_log_jacobian_under_an_inner_grad_gets_no_user_sow_notes():
    init, potential_fn, _, _ = infer_util.initialize_model(
        jax.random.PRNGKey(0), _half_normal_model
    )

    def leapfrog_like(z):
        g = jax.grad(potential_fn)(z)  # HMC's force
        return potential_fn(z) + 0.5 * sum(jnp.sum(v**2) for v in jax.tree.leaves(g))

    ins = sowviz.inspect(leapfrog_like, init.z, mode="grad")
    value, grads = jax.value_and_grad(leapfrog_like)(init.z)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1]["s"], grads["s"], rtol=1e-5)

    # sowviz's own capture: no "sow the custom function's output", no "no cotangent"
    warnings = [n["message"] for n in ins.notes if n["level"] == "warning"]
    assert not warnings, warnings
    assert not [n for n in ins.notes if "log|J|" in n["message"]], ins.notes

    # two calls of the potential, two captures: the second is drawn in the second
    # call, not on the first call's backward pass
    first, second = ins.probe("log|J| (s)_0"), ins.probe("log|J| (s)_1")
    assert first.node != second.node
    assert not _parent_label(ins, second.node).endswith("(backward)")
    # (s = exp(z_s): the log-Jacobian is z_s; the potential subtracts it, so its
    # gradient in the second, direct call is -1 times d out / d potential = -1)
    np.testing.assert_allclose(second.summaries["primal"]["mean"], init.z["s"], rtol=1e-6)
    np.testing.assert_allclose(second.summaries["cotangent"]["mean"], -1.0, rtol=1e-6)


def test_a_user_sow_called_again_after_an_inner_grad_is_drawn_in_its_call():
    def f(x):
        h = sowviz.sow(jnp.sin(x), "h")
        return jnp.sum(h * h)

    def g(x):
        return jnp.sum(jax.grad(f)(x) ** 2) + f(x)

    x = jnp.array([0.3, 0.5])
    ins = sowviz.inspect(g, x, mode="grad")
    np.testing.assert_allclose(ins.result[1], jax.grad(g)(x), rtol=1e-6)
    assert not [n for n in ins.notes if "not reached" in n["message"]], ins.notes
    second = ins.probe("h_1")
    assert _parent_label(ins, second.node) == "f#2"
    # its cotangent is d g / d h of the second call: 2 h
    np.testing.assert_allclose(
        second.summaries["cotangent"]["mean"], jnp.mean(2 * jnp.sin(x)), rtol=1e-6
    )


def _mvn_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("obs", dist.Normal(mu, s), obs=y)


def test_svi_loss_of_unconstrained_params_is_named_by_the_constrain_call():
    y = jnp.array([0.3, -0.2, 1.1, 0.7])
    guide = autoguide.AutoMultivariateNormal(_mvn_model)
    svi = infer.SVI(_mvn_model, guide, numpyro.optim.Adam(1e-2), loss=infer.Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), y)
    params = svi.optim.get_params(state.optim_state)
    elbo = infer.Trace_ELBO()

    def loss_fn(params, key):
        return elbo.loss(key, svi.constrain_fn(params), _mvn_model, guide, y)

    key = jax.random.PRNGKey(1)
    ins = sowviz.inspect(loss_fn, params, key, mode="grad")
    value, grads = jax.value_and_grad(loss_fn)(params, key)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-5)
    for k in grads:
        np.testing.assert_allclose(ins.result[1][k], grads[k], rtol=1e-4, atol=1e-5)

    labels = {n.label for n in ins.graph.nodes}
    assert not [lab for lab in labels if re.fullmatch(r"loss_fn:\d+", lab)], labels
    (box,) = [n for n in ins.graph.nodes if n.label == "svi.constrain_fn(params)"]
    inside = {n.label for n in ins.graph.nodes if n.parent == box.id}
    # the parameters' constraint, and the ELBO's key split before its guide
    assert {"transform_fn", "ELBO.loss"} <= inside, inside
