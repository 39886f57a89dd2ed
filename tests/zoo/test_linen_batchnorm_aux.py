"""Flax Linen's BatchNorm training pattern: the loss returns `(loss, new batch_stats)`
and the step takes `jax.value_and_grad(loss, has_aux=True)`. With `has_aux=True`,
`inspect` and `Monitor` return the aux where JAX's `has_aux` puts it, never
differentiated, and a Monitor-driven loop keeps its statistics like a plain one."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import sowviz

from .checks import assert_close, node_paths


class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Dense(16)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
        return nn.Dense(3)(nn.relu(x))


NET = Net()


def loss(params, batch_stats, x, y):
    logits, updates = NET.apply(
        {"params": params, "batch_stats": batch_stats}, x, train=True, mutable=["batch_stats"]
    )
    value = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return value, updates["batch_stats"]


def setup(steps=4, batch=12):
    key = jax.random.PRNGKey(0)
    xs = jax.random.normal(key, (steps, batch, 5)) * 2.0 + 1.0
    ys = jax.random.randint(jax.random.fold_in(key, 1), (steps, batch), 0, 3)
    variables = NET.init(jax.random.fold_in(key, 2), xs[0], train=False)
    return variables["params"], variables["batch_stats"], list(zip(xs, ys, strict=True))


def test_monitor_with_has_aux_trains_like_value_and_grad_with_has_aux():
    params, stats, batches = setup()
    plain = jax.jit(jax.value_and_grad(loss, has_aux=True))
    mon = sowviz.Monitor(loss, has_aux=True, every=2)  # steps 0, 2 instrumented
    opt = optax.sgd(0.1)
    p_ref, s_ref, o_ref = params, stats, opt.init(params)
    p, s, o = params, stats, opt.init(params)
    for x, y in batches:
        (v_ref, s_ref), g_ref = plain(p_ref, s_ref, x, y)
        (v, s), g = mon.step(p, s, x, y)
        np.testing.assert_allclose(v, v_ref, rtol=1e-5)
        assert_close(g, g_ref, what="grads")
        u_ref, o_ref = opt.update(g_ref, o_ref)
        u, o = opt.update(g, o)
        p_ref, p = optax.apply_updates(p_ref, u_ref), optax.apply_updates(p, u)
    mon.flush()
    assert_close(s, s_ref, what="batch_stats")
    assert_close(p, p_ref, what="params")
    assert np.abs(np.asarray(s["BatchNorm_0"]["mean"])).max() > 0.1  # it moved
    assert [e["step"] for e in mon.history] == [0, 2]
    mon.close()


def test_inspect_places_the_aux_where_jax_has_aux_does():
    params, stats, [(x, y), *_] = setup(1)
    args = (params, stats, x, y)
    (value, aux), grads = jax.value_and_grad(loss, has_aux=True)(*args)
    (v, a), g = sowviz.inspect(loss, *args, has_aux=True).result
    np.testing.assert_allclose(v, value, rtol=1e-5)
    assert_close(a, aux, what="aux")
    assert_close(g, grads, what="grads")
    # forward mode, with the same tangents: `jax.jvp(..., has_aux=True)`'s order
    ones = jax.tree_util.tree_map(jnp.ones_like, args[:3])
    tan = (*ones, np.zeros(y.shape, jax.dtypes.float0))  # labels: no tangent
    y0, t0, aux0 = jax.jvp(loss, args, tan, has_aux=True)
    y1, t1, aux1 = sowviz.inspect(loss, *args, has_aux=True, mode="jvp", tangents=tan).result
    np.testing.assert_allclose(y1, y0, rtol=1e-5)
    np.testing.assert_allclose(t1, t0, rtol=1e-4)
    assert_close(aux1, aux0, what="jvp aux")
    out, a2 = sowviz.inspect(loss, *args, has_aux=True, mode="primal").result
    np.testing.assert_allclose(out, value, rtol=1e-5)
    assert_close(a2, aux, what="primal aux")
    # the aux is drawn as outputs of the program, grouped by path like the arguments
    ins = sowviz.inspect(loss, *args, has_aux=True)
    drawn = node_paths(ins.graph, "output")
    assert {"aux/BatchNorm_0/mean", "aux/BatchNorm_0/var"} <= set(drawn), sorted(drawn)
    probe = next(p for p in ins.probes if p.node == drawn["aux/BatchNorm_0/mean"].id)
    want = np.asarray(aux["BatchNorm_0"]["mean"])
    np.testing.assert_allclose(probe.summaries["primal"]["mean"], want.mean(), rtol=1e-5)


def test_an_aux_output_the_loss_also_reads_carries_dloss_dvalue():
    """A `has_aux` output the loss is computed from (the predictions, returned for
    metrics) shows the gradient of the loss with respect to it, not the zero cotangent
    JAX seeds the aux with; one that is the loss itself shows 1."""

    def mse(params, x, y):
        pred = jnp.tanh(x @ params["w"]) @ params["v"]
        value = jnp.mean((pred - y) ** 2)
        return value, {"mse": value, "pred": pred}

    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {"w": jax.random.normal(keys[0], (4, 8)), "v": jax.random.normal(keys[1], (8, 2))}
    x, y = jax.random.normal(keys[2], (5, 4)), jax.random.normal(keys[3], (5, 2))
    ins = sowviz.inspect(mse, params, x, y, has_aux=True)
    pred = jnp.tanh(x @ params["w"]) @ params["v"]
    want = jax.grad(lambda p: jnp.mean((p - y) ** 2))(pred)  # dloss/dpred
    got = ins.probe("aux/pred").summaries["cotangent"]
    for stat, value in (("min", want.min()), ("max", want.max()), ("mean", want.mean())):
        np.testing.assert_allclose(got[stat], value, rtol=1e-5, atol=1e-7, err_msg=stat)
    assert ins.probe("aux/mse").summaries["cotangent"]["mean"] == 1.0


def test_has_aux_needs_a_pair():
    params, stats, [(x, y), *_] = setup(1)
    with pytest.raises(TypeError, match=r"`has_aux=True`, so `fn` must return a pair"):
        sowviz.inspect(lambda *a: loss(*a)[0], params, stats, x, y, has_aux=True)
    with pytest.raises(TypeError, match="`has_aux` must be True or False"):
        sowviz.Monitor(loss, has_aux="yes")
