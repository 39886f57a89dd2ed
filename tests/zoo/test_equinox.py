"""Equinox `eqx.nn.MLP` and the MNIST-tutorial CNN, passed as modules."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

from .checks import STAT_RTOL, assert_close, assert_stage, assert_value_and_grad, node_paths
from .models import eqx_models as em


@pytest.fixture(scope="module")
def mlp():
    return em.make_mlp()


@pytest.fixture(scope="module")
def cnn():
    return em.make_cnn()


@pytest.fixture(scope="module")
def cnn_ins(cnn):
    return sowviz.inspect(em.cnn_loss, *cnn, mode="grad")


def test_mlp_grad_equals_filter_value_and_grad(mlp):
    ins = sowviz.inspect(em.mlp_loss, *mlp, mode="grad")
    value, grads = eqx.filter_value_and_grad(em.mlp_loss)(*mlp)
    assert_value_and_grad(ins.result, value, grads)


def test_mlp_vjp_mode_equals_filter_vjp(mlp):
    ins = sowviz.inspect(em.mlp_loss, *mlp, mode="vjp")
    value, pull = eqx.filter_vjp(em.mlp_loss, *mlp)
    assert_close(ins.result[0], value, what="value")
    assert_close(ins.result[1], pull(jnp.ones_like(value)), what="cotangent")


def test_mlp_jvp_mode_equals_filter_jvp(mlp):
    model, x, y = mlp
    t_model = jax.tree.map(
        lambda a: (
            jax.random.normal(jax.random.PRNGKey(5), a.shape, a.dtype) if eqx.is_array(a) else None
        ),
        model,
    )
    tangents = (t_model, jnp.ones_like(x), jnp.zeros_like(y))
    ins = sowviz.inspect(em.mlp_loss, *mlp, mode="jvp", tangents=tangents)
    value, tangent = eqx.filter_jvp(em.mlp_loss, mlp, tangents)
    assert_close(ins.result[0], value, what="value")
    assert_close(ins.result[1], tangent, what="tangent")


def test_cnn_grad_equals_filter_value_and_grad(cnn, cnn_ins):
    value, grads = eqx.filter_value_and_grad(em.cnn_loss)(*cnn)
    assert_value_and_grad(cnn_ins.result, value, grads)


def _split(model, x, y, i):
    """Layer `i`'s (batched) output and the loss as a function of it."""
    head = lambda v: [v := layer(v) for layer in model.layers[: i + 1]][-1]  # noqa: E731

    def rest(v):
        for layer in model.layers[i + 1 :]:
            v = layer(v)
        return v

    h = jax.vmap(head)(x)
    return h, lambda h: em.cross_entropy(y, jax.vmap(rest)(h))


def test_cnn_stage_cotangents_equal_grad_of_the_downstream_model(cnn, cnn_ins):
    # every layer: the modules, and the plain functions between them (`jax.nn.relu`,
    # `jnp.ravel`, `jax.nn.sigmoid`, `jax.nn.log_softmax`) carry data as they do
    model, x, y = cnn
    for i in range(len(model.layers)):
        h, tail = _split(model, x, y, i)
        assert_stage(cnn_ins, h, key="cotangent", expected=jax.grad(tail)(h))


def test_cnn_loss_tail_is_the_stage_of_its_function(cnn_ins):
    # `cross_entropy(y, pred_y)`, a plain function of the tutorial's: one stage, sourced
    # at its call, not five primitives at the top level
    g = cnn_ins.graph
    top = [n.label for n in g.children(g.root) if n.kind not in ("input", "output")]
    assert top == ["parameters", "CNN", "cross_entropy"], top
    (xent,) = [n for n in g.nodes if n.label == "cross_entropy"]
    assert xent.source.function == "cnn_loss" and xent.kind == "scope"
    # each layer's source is the model's line that called it, MaxPool2d's too (its
    # `__call__` calls `Pool.__call__`: a second wrapper frame that pushes no scope)
    layers = [n for n in g.nodes if n.label.startswith("layers[") and ": " in n.label]
    assert len(layers) == 4 and {n.source.function for n in layers} == {"CNN.__call__"}, [
        (n.label, str(n.source)) for n in layers
    ]


class Tap(eqx.Module):
    inner: eqx.Module
    name: str = eqx.field(static=True)

    def __call__(self, x, *, key=None):
        return sowviz.sow(self.inner(x), self.name)


def test_cnn_sown_copy_under_filter_grad(cnn):
    """`eqx.tree_at` swaps layers for sowing wrappers; the sows sit under `jax.vmap`."""
    model, x, y = cnn
    sown = eqx.tree_at(
        lambda m: (m.layers[0], m.layers[4]),
        model,
        (Tap(model.layers[0], "conv"), Tap(model.layers[4], "linear")),
    )
    grads, inter = sowviz.save_intermediates(eqx.filter_grad(em.cnn_loss))(sown, x, y)
    for name, i in (("conv", 0), ("linear", 4)):
        h, tail = _split(model, x, y, i)
        np.testing.assert_allclose(inter[name]["primal"], h, rtol=STAT_RTOL, atol=1e-5)
        want = jax.grad(tail)(h)
        np.testing.assert_allclose(
            inter[name]["cotangent"], want, rtol=STAT_RTOL, atol=1e-4 * float(jnp.abs(want).max())
        )
    want = eqx.filter_grad(em.cnn_loss)(model, x, y)
    np.testing.assert_allclose(grads.layers[0].inner.weight, want.layers[0].weight, rtol=1e-5)


@pytest.mark.browser
def test_cnn_report_opens_in_chromium(cnn_ins, report):
    report(cnn_ins)


class _BNNet(eqx.Module):
    """Equinox's stateful-layer pattern: `eqx.nn.BatchNorm` (its `axis_name` a string
    field, neither an array nor static) with an `eqx.nn.State`."""

    linear: eqx.nn.Linear
    bn: eqx.nn.BatchNorm

    def __init__(self, key, mode="batch"):
        self.linear = eqx.nn.Linear(4, 8, key=key)
        self.bn = eqx.nn.BatchNorm(8, axis_name="batch", mode=mode)

    def __call__(self, x, state):
        h, state = self.bn(self.linear(x), state)
        return jnp.tanh(h), state


def _train_step(model, state, opt_state, x, y):
    """The Equinox tutorial's step: returns the updated model, state and optimiser state."""
    import optax

    def loss(m):
        pred, new_state = jax.vmap(m, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(
            x, state
        )
        return jnp.mean((pred.sum(-1) - y) ** 2), new_state

    (value, new_state), grads = eqx.filter_value_and_grad(loss, has_aux=True)(model)
    updates, opt_state = optax.sgd(0.1).update(grads, opt_state, model)
    return eqx.apply_updates(model, updates), new_state, opt_state, value


@pytest.mark.parametrize("mode", ["primal", "jvp"])
def test_a_train_step_returning_its_model_gives_it_back_as_filter_jit(mode):
    import optax

    model, state = eqx.nn.make_with_state(_BNNet)(jax.random.PRNGKey(0))
    opt_state = optax.sgd(0.1).init(eqx.filter(model, eqx.is_array))
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 4)) + 2.0
    y = jnp.linspace(-1.0, 1.0, 16)
    args = (model, state, opt_state, x, y)
    want = eqx.filter_jit(_train_step)(*args)
    ins = sowviz.inspect(_train_step, *args, mode=mode)
    got = ins.result if mode == "primal" else ins.result[0]
    # The non-array fields come back as they were (the string, the activation), and
    # the arrays equal eqx.filter_jit's.
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    assert got[0].bn.axis_name == "batch" and got[0].bn.inference is False
    assert_close(eqx.filter(got, eqx.is_array), eqx.filter(want, eqx.is_array), what="step")
    # save_intermediates cannot hand such a leaf back from its program: it says so.
    with pytest.raises(TypeError, match=r"output\[0\]\.bn\.axis_name`, a str"):
        sowviz.save_intermediates(_train_step)(*args)


def test_parameter_probes_are_found_by_their_path_never_by_a_guess(cnn, cnn_ins):
    model = cnn[0]
    # Three Linear/Conv weights share the name: a KeyError naming them, not the first.
    with pytest.raises(KeyError, match=r"3 probes are called 'weight'.*layers\[4\]/weight"):
        cnn_ins.probe("weight")
    p = cnn_ins.probe("layers[4]/weight")
    assert cnn_ins.probe_path(p) == "parameters/layers[4]/weight"
    assert cnn_ins.probe("parameters/layers[4]/weight") is p
    w = np.asarray(model.layers[4].weight)
    np.testing.assert_allclose(p.summaries["primal"]["mean"], w.mean(), rtol=STAT_RTOL)
    g = np.asarray(eqx.filter_grad(em.cnn_loss)(*cnn).layers[4].weight)
    np.testing.assert_allclose(p.summaries["cotangent"]["l2"], np.linalg.norm(g), rtol=STAT_RTOL)


def _ema_loss(model, state, x, y):
    pred, state = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(
        x, state
    )
    return jnp.mean((pred.sum(-1) - y) ** 2), state


def test_the_tutorial_loss_returning_its_batchnorm_state_with_has_aux():
    # Equinox's BatchNorm tutorial: `filter_value_and_grad(loss, has_aux=True)`, the
    # new state as aux. Its `ema` state holds a flag the step sets to a constant
    # (`jnp.array(False)`), which the program returns as a literal.
    model, state = eqx.nn.make_with_state(_BNNet)(jax.random.PRNGKey(0), mode="ema")
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 4)) + 2.0
    y = jnp.linspace(-1.0, 1.0, 16)
    (value, new_state), grads = eqx.filter_value_and_grad(_ema_loss, has_aux=True)(
        model, state, x, y
    )
    ins = sowviz.inspect(_ema_loss, model, state, x, y, mode="grad", has_aux=True)
    (got_value, got_state), got_grads = ins.result
    np.testing.assert_allclose(got_value, value, rtol=1e-5)
    assert_close(eqx.filter(got_grads, eqx.is_array), eqx.filter(grads, eqx.is_array), what="grads")
    assert jax.tree_util.tree_structure(got_state) == jax.tree_util.tree_structure(new_state)
    for got, want in zip(
        jax.tree_util.tree_leaves(got_state), jax.tree_util.tree_leaves(new_state), strict=True
    ):
        assert isinstance(got, jax.Array)
        np.testing.assert_allclose(got, want, rtol=1e-5)
    # The state's leaves are named by the layer that owns them, not by flat index.
    inputs, outputs = node_paths(ins.graph, "input"), node_paths(ins.graph, "output")
    assert {"state/bn/ema_first_time_index", "state/bn/ema_state_index[0]"} <= set(inputs)
    assert {"aux/bn/ema_first_time_index", "aux/bn/ema_state_index[1]"} <= set(outputs)
    assert not any("flat index" in p for p in [*inputs, *outputs])


class _Attn(eqx.Module):
    norm: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention

    def __init__(self, key):
        self.norm = eqx.nn.LayerNorm(8)
        self.attn = eqx.nn.MultiheadAttention(2, 8, key=key)

    def __call__(self, x):
        n = jax.vmap(self.norm)(x)
        return x + self.attn(n, n, n, mask=jnp.tril(jnp.ones((x.shape[0],) * 2, bool)))


def test_multihead_attention_s_projections_are_its_own_stages():
    # MultiheadAttention maps its projections through Equinox's `BoundMethod` wrapper:
    # no stage of its own, and the projections named from the layer that owns them.
    model = _Attn(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (5, 8))

    def loss(m, x):
        return jnp.mean(m(x) ** 2)

    ins = sowviz.inspect(loss, model, x)
    assert_value_and_grad(ins.result, *eqx.filter_value_and_grad(loss)(model, x))
    (attn,) = [n for n in ins.graph.nodes if n.label == "attn: MultiheadAttention"]
    kids = [n.label for n in ins.graph.children(attn.id)]
    for proj in ("query_proj", "key_proj", "value_proj", "output_proj"):
        assert f"{proj}: Linear" in kids, kids
    assert not [n.label for n in ins.graph.nodes if "BoundMethod" in n.label or "attn." in n.label]


def test_a_lambda_of_a_jax_function_is_named_by_it():
    # `eqx.nn.Lambda(jax.nn.relu)` in a layer list was `layers[2]: Lambda`, as was every
    # activation; a function of yours was already named (`layers[1]: swish`)
    def swish(x):
        return x * jax.nn.sigmoid(x)

    model = eqx.nn.Sequential(
        [
            eqx.nn.Linear(4, 8, key=jax.random.PRNGKey(0)),
            eqx.nn.Lambda(swish),
            eqx.nn.Lambda(jax.nn.sigmoid),
            eqx.nn.Linear(8, 1, key=jax.random.PRNGKey(1)),
        ]
    )
    x = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)
    ins = sowviz.inspect(lambda m, x: jnp.mean(jax.vmap(m)(x) ** 2), model, x)
    labels = {n.label for n in ins.graph.nodes}
    assert {"layers[1]: swish", "layers[2]: sigmoid"} <= labels, sorted(labels)
    h = jax.vmap(model.layers[0])(x)
    want = jax.nn.sigmoid(h * jax.nn.sigmoid(h))
    got = ins.probe("layers[2]: sigmoid").summaries["primal"]
    np.testing.assert_allclose(got["mean"], float(want.mean()), rtol=1e-6)
