"""Equinox programs as its docs write them: an eval that discards a stateful model's
state draws no box of the dead broadcasts (`pred, _`), `eqx.nn.Shared`'s tied layers
are named without its private field (`shared[0]: Embedding`), and a BatchNorm's new
running statistics are its stage's named outputs (`ema_state_index[0] (new)`), with
`probe("bn")` its activation; values against Equinox's own."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

eqx = pytest.importorskip("equinox")


def _l2(x) -> float:
    return float(jnp.linalg.norm(jnp.ravel(x)))


class _Net(eqx.Module):
    lin: eqx.nn.Linear
    bn: eqx.nn.BatchNorm

    def __init__(self, key, mode="batch"):
        self.lin = eqx.nn.Linear(4, 8, key=key)
        self.bn = eqx.nn.BatchNorm(8, axis_name="batch", mode=mode)

    def __call__(self, x, state):
        return self.bn(self.lin(x), state)


def _eval_loss(model, state, x):
    pred, _ = jax.vmap(lambda xx: model(xx, state), axis_name="batch")(x)
    return jnp.mean(pred**2)


def test_an_eval_discarding_the_state_draws_no_box_of_its_dead_broadcasts():
    model, state = eqx.nn.make_with_state(_Net)(jax.random.PRNGKey(0))
    model = eqx.nn.inference_mode(model)
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 4))
    ins = sowviz.inspect(_eval_loss, model, state, x)
    d = ins.to_dict()
    by_id = {n["id"]: n for n in d["nodes"]}
    # `vmap`'s default `out_axes=0` broadcasts the unmapped state it returns (three
    # `broadcast_in_dim`s nobody reads): they were a box `pred, _` with no data
    assert not [n for n in d["nodes"] if n["label"] == "pred, _"]
    top = [n for n in d["nodes"] if n["parent"] == d["root"]]
    assert "broadcast_in_dim" not in {n["label"] for n in top}
    assert {n["label"] for n in top if n["n_eqns"]} == {"_Net", "integer_pow", "mean"}
    assert by_id[d["root"]]["n_eqns"] == sum(n["n_eqns"] for n in top)
    # the live values are as plain JAX computes them
    pred, _ = jax.vmap(lambda xx: model(xx, state), axis_name="batch")(x)
    np.testing.assert_allclose(float(ins.result[0]), float(jnp.mean(pred**2)), rtol=1e-6)
    np.testing.assert_allclose(ins.probe("_Net").summaries["primal"]["l2"], _l2(pred), rtol=1e-5)
    cot = jax.grad(lambda p: jnp.mean(p**2))(pred)
    np.testing.assert_allclose(ins.probe("_Net").summaries["cotangent"]["l2"], _l2(cot), rtol=1e-5)


def _partly_unused(x):
    y = jnp.sin(x) * 2.0
    unused = jnp.cos(x) * 3.0 + 1.0  # noqa: F841 (read by nothing: XLA drops it)
    return jnp.sum(y**2)


def test_a_line_whose_value_reaches_nothing_is_not_drawn():
    x = jnp.linspace(-1.0, 1.0, 6)
    ins = sowviz.inspect(_partly_unused, x)
    d = ins.to_dict()
    labels = [n["label"] for n in d["nodes"]]
    assert "unused" not in labels and "cos" not in labels
    assert "y" in labels
    np.testing.assert_allclose(float(ins.result[0]), float(_partly_unused(x)), rtol=1e-6)
    want = jax.grad(_partly_unused)(x)
    np.testing.assert_allclose(np.asarray(ins.result[1]), np.asarray(want), rtol=1e-6)
    y = jnp.sin(x) * 2.0
    np.testing.assert_allclose(ins.probe("y").summaries["primal"]["l2"], _l2(y), rtol=1e-5)


class _Tied(eqx.Module):
    shared: eqx.nn.Shared

    def __init__(self):
        embedding = eqx.nn.Embedding(10, 8, key=jax.random.PRNGKey(7))
        linear = eqx.nn.Linear(8, 10, key=jax.random.PRNGKey(8))
        where = lambda embed_and_lin: embed_and_lin[1].weight  # noqa: E731
        get = lambda embed_and_lin: embed_and_lin[0].weight  # noqa: E731
        self.shared = eqx.nn.Shared((embedding, linear), where, get)

    def __call__(self, tok):
        embedding, linear = self.shared()
        return linear(jax.nn.tanh(embedding(tok)))


def _tied_loss(m, toks):
    logits = jax.vmap(m)(toks)
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(10), (toks + 1) % 10])


def test_shared_layers_are_named_as_the_code_unpacks_them():
    m, toks = _Tied(), jnp.arange(10) % 7
    ins = sowviz.inspect(_tied_loss, m, toks)
    stages = [n["label"] for n in ins.to_dict()["nodes"] if n["kind"] == "scope"]
    # `pytree` is Shared's own field: `shared.pytree[0]: Embedding` named it
    assert "shared[0]: Embedding" in stages and "shared[1]: Linear" in stages
    assert not [s for s in stages if ".pytree" in s]
    embedding, linear = m.shared()
    h = jax.vmap(embedding)(toks)
    emb = ins.probe("shared[0]: Embedding").summaries["primal"]["l2"]
    np.testing.assert_allclose(emb, _l2(h), rtol=1e-5)
    logits = jax.vmap(linear)(jax.nn.tanh(h))
    lin = ins.probe("shared[1]: Linear").summaries["primal"]["l2"]
    np.testing.assert_allclose(lin, _l2(logits), rtol=1e-5)
    # the tied weight's gradient is Equinox's
    value, grads = eqx.filter_value_and_grad(_tied_loss)(m, toks)
    np.testing.assert_allclose(float(ins.result[0]), float(value), rtol=1e-6)
    got = ins.result[1].shared.pytree[0].weight
    want = grads.shared.pytree[0].weight
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7)


class _BNModel(eqx.Module):
    lin: eqx.nn.Linear
    bn: eqx.nn.BatchNorm

    def __init__(self, key):
        self.lin = eqx.nn.Linear(4, 8, key=key)
        self.bn = eqx.nn.BatchNorm(8, axis_name="batch", mode="ema")

    def __call__(self, x, state):
        x, state = self.bn(self.lin(x), state)
        return x, state


def _bn_loss(model, state, x):
    out, state = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(x, state)
    return jnp.mean(out**2), state


def test_a_batchnorm_stage_names_its_new_running_statistics():
    model, state = eqx.nn.make_with_state(_BNModel)(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 4))
    ins = sowviz.inspect(_bn_loss, model, state, x, has_aux=True)
    # Equinox's own answer, computed apart (a fresh state: `State.set` spends the old)
    model2, state2 = eqx.nn.make_with_state(_BNModel)(jax.random.PRNGKey(0))
    out, new_state = jax.vmap(model2, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(
        x, state2
    )
    mean, var = new_state.get(model2.bn.ema_state_index)

    written = {"['ema_state_index[0] (new)']", "['ema_state_index[1] (new)']"}
    leaves = {p.leaf for p in ins.probes if p.name == "bn: BatchNorm"}
    assert leaves == {"['output']"} | written  # (were `[0]`, `[1]`, `[2]`)
    # the block holding it names them by their path in it
    block = {p.leaf for p in ins.probes if p.name == "_BNModel"}
    assert block == {
        "['output']",
        "['bn.ema_state_index[0] (new)']",
        "['bn.ema_state_index[1] (new)']",
    }
    # `probe("bn")` is the activation; the state outputs are Equinox's new statistics
    bn = ins.probe("bn")
    np.testing.assert_allclose(bn.summaries["primal"]["l2"], _l2(out), rtol=1e-5)
    cot = jax.grad(lambda y: jnp.mean(y**2))(out)
    np.testing.assert_allclose(bn.summaries["cotangent"]["l2"], _l2(cot), rtol=1e-5)
    for k, want in enumerate((mean, var)):
        got = ins.probe("bn", leaf=f"['ema_state_index[{k}] (new)']").summaries["primal"]
        np.testing.assert_allclose(got["l2"], _l2(want), rtol=1e-5)
        np.testing.assert_allclose(got["mean"], float(jnp.mean(want)), rtol=1e-5, atol=1e-7)
    # the stage's card shows its activation alone
    (node,) = [n for n in ins.to_dict()["nodes"] if n["label"] == "bn: BatchNorm"]
    assert node["shapes"] == ["float32[16,8]"]  # (was `f32[16,8] +2`: its statistics)
    # the state sowviz returns is Equinox's (to float32 rounding: the instrumented
    # program's fusions sum the batch in another order, 1-2 ulp on jax 0.12.0.1)
    aux = ins.result[0][1]
    np.testing.assert_allclose(
        np.asarray(aux.get(model2.bn.ema_state_index)[0]), np.asarray(mean), rtol=1e-6, atol=1e-7
    )
