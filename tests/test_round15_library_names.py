"""Round 15: library closures and layers named by what the user called (jraph's
`GraphNetwork`, not its `_ApplyGraphNet`; `hk.max_pool` in a library module), one box
for `hk.dropout`, and a panel line saying why a stage has no cotangent."""

from __future__ import annotations

import functools
import importlib

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

# jraph's style (jraph is not installed here): a maker returning a private closure whose
# body maps a lambda over a tree (`GraphNetwork` > `_ApplyGraphNet` > `tree_map(lambda
# g: jnp.repeat(...))`), and a Haiku module of a library calling `hk.max_pool`.
_FAKE_LIBRARY = """
import haiku as hk
import jax
import jax.numpy as jnp


def GraphNetwork(w):
    def _ApplyGraphNet(nodes, globals_, n_node):
        edges = jax.tree.map(lambda g: jnp.repeat(
            g, n_node, axis=0, total_repeat_length=6), globals_)
        h = jnp.tanh(nodes @ w)
        return h * edges["a"] + jnp.sin(h) * edges["b"]
    return _ApplyGraphNet


class PoolNet(hk.Module):
    def __call__(self, x):
        h = hk.Conv2D(4, 3, name="conv")(x)
        h = jax.nn.relu(h)
        h = hk.max_pool(h, window_shape=(1, 2, 2, 1), strides=(1, 2, 2, 1), padding="VALID")
        return hk.Linear(2, name="head")(h.reshape(h.shape[0], -1))
"""


@pytest.fixture
def lib(tmp_path, monkeypatch):
    installed = tmp_path / "site-packages"  # an installed package's file: a library's
    installed.mkdir()
    (installed / "fakegnn15.py").write_text(_FAKE_LIBRARY)
    monkeypatch.syspath_prepend(str(installed))
    return importlib.import_module("fakegnn15")


def _two_steps(w, nodes, globals_, n_node, lib):
    h = lib.GraphNetwork(w)(nodes, globals_, n_node)
    h = lib.GraphNetwork(w.T)(h, globals_, n_node)
    return jnp.sum(h**2)


def test_a_lambda_in_a_library_s_private_closure_is_named_by_the_closure_s_maker(lib):
    # jraph's `GraphNetwork` boxes held a box `_ApplyGraphNet` (its `tree_map` lambda's
    # qualname `GraphNetwork.<locals>._ApplyGraphNet.<locals>.<lambda>`), a name the
    # user never wrote
    w = jax.random.normal(jax.random.PRNGKey(0), (4, 4)) / 2
    nodes = jax.random.normal(jax.random.PRNGKey(1), (6, 4))
    globals_ = {"a": jnp.ones((2, 4)), "b": jnp.full((2, 4), 0.5)}
    n_node = jnp.array([2, 4])
    fn = functools.partial(_two_steps, lib=lib)
    ins = sowviz.inspect(fn, w, nodes, globals_, n_node)
    labels = [n.label for n in ins.graph.nodes]
    assert not [x for x in labels if "_Apply" in x], labels
    top = [n.label for n in ins.graph.children(ins.graph.root)]
    assert "GraphNetwork" in top, top
    # the value is the library call's own
    first = lib.GraphNetwork(w)(nodes, globals_, n_node)
    got = ins.probe("GraphNetwork").summaries["primal"]
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(first)), rtol=1e-5)
    loss, grads = ins.result
    ref_loss, ref_grads = jax.value_and_grad(fn)(w, nodes, globals_, n_node)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grads), np.asarray(ref_grads), rtol=1e-5, atol=1e-6)


def _children(ins, node_id):
    return [n for n in ins.graph.nodes if n.parent == node_id]


def _find(ins, label, parent=None):
    found = [
        n for n in ins.graph.nodes if n.label == label and (parent is None or n.parent == parent)
    ]
    assert found, sorted({n.label for n in ins.graph.nodes})
    return found[0]


def test_hk_max_pool_in_a_library_module_is_a_box_of_its_name(lib):
    # inside `hk.nets.ResNet`, `hk.max_pool` was a loose `reduce_window_max` beside `relu`
    net = hk.without_apply_rng(hk.transform(lambda x: lib.PoolNet()(x)))
    x = jax.random.normal(jax.random.PRNGKey(2), (2, 6, 6, 3))
    params = net.init(jax.random.PRNGKey(3), x)

    def loss(params, x):
        return jnp.sum(net.apply(params, x) ** 2)

    ins = sowviz.inspect(loss, params, x)
    module = _find(ins, "pool_net")
    inside = [n.label for n in _children(ins, module.id)]
    assert "max_pool" in inside and "reduce_window_max" not in inside, inside
    pool = _find(ins, "max_pool", module.id)
    assert [n.primitive for n in _children(ins, pool.id)] == ["reduce_window_max"]
    # its value: the pooled activation, computed apart
    conv = next(v for k, v in params.items() if k.endswith("conv"))
    h = jax.lax.conv_general_dilated(
        x,
        conv["w"],
        (1, 1),
        "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )
    h = jax.nn.relu(h + conv["b"])
    pooled = h.reshape(2, 3, 2, 3, 2, 4).max(axis=(2, 4))
    got = ins.probe("max_pool").summaries["primal"]
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(pooled)), rtol=1e-5)


class _Block(hk.Module):
    # a user's transformer layer (haiku/examples/transformer's): its level is big
    def __call__(self, x):
        mask = np.tril(np.ones((1, 1, x.shape[1], x.shape[1])))
        for _ in range(2):
            attn = hk.MultiHeadAttention(
                num_heads=2, key_size=4, w_init=hk.initializers.VarianceScaling(1.0)
            )
            h = hk.LayerNorm(-1, True, True)(x)
            h_attn = attn(h, h, h, mask=mask)
            h_attn = hk.dropout(hk.next_rng_key(), 0.25, h_attn)
            x = x + h_attn
            dense = hk.Sequential([hk.Linear(16), jax.nn.gelu, hk.Linear(8)])
            h_dense = dense(hk.LayerNorm(-1, True, True)(x))
            h_dense = hk.dropout(hk.next_rng_key(), 0.25, h_dense)
            x = x + h_dense
        return x


def test_hk_dropout_in_a_user_s_module_is_one_box():
    # `hk.dropout` was a box `dropout` holding another `dropout`
    net = hk.transform(lambda x: _Block()(x))
    x = jax.random.normal(jax.random.PRNGKey(4), (2, 5, 8))
    params = net.init(jax.random.PRNGKey(5), x)
    key = jax.random.PRNGKey(6)

    def loss(params, x):
        return jnp.sum(net.apply(params, key, x) ** 2)

    ins = sowviz.inspect(loss, params, x)
    drops = [n for n in ins.graph.nodes if n.label.startswith("dropout")]
    assert len(drops) == 4, [(n.label, n.parent) for n in drops]
    ids = {n.id for n in drops}
    assert not [n for n in drops if n.parent in ids]
    ref_loss, ref_grads = jax.value_and_grad(loss)(params, x)
    np.testing.assert_allclose(float(ins.result[0]), float(ref_loss), rtol=1e-6)
    for got, want in zip(jax.tree.leaves(ins.result[1]), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


def _forces_like(params, pos):
    # `dist` and `rbf` depend on the positions only: under a gradient w.r.t. the
    # parameters they get no cotangent
    dist = jnp.sqrt(jnp.sum((pos[:, None] - pos[None]) ** 2, -1) + 1.0)
    rbf = jnp.exp(-((dist[..., None] - jnp.arange(3.0)) ** 2))
    energy = jnp.tanh(rbf @ params["w"])
    return jnp.sum(energy**2)


@pytest.mark.browser
def test_a_stage_the_gradient_does_not_reach_says_why_it_has_no_cotangent(page, tmp_path):
    params = {"w": jnp.array([[0.3], [-0.2], [0.5]])}
    pos = jax.random.normal(jax.random.PRNGKey(7), (4, 3))
    ins = sowviz.inspect(_forces_like, params, pos, mode="grad")
    rbf = ins.probe("rbf")
    assert "cotangent" not in rbf.summaries  # what JAX gives it: nothing
    # (and `energy` has one: jax.grad of the loss w.r.t. it, 2 * energy)
    energy = jnp.tanh(
        jnp.exp(
            -(
                (
                    jnp.sqrt(jnp.sum((pos[:, None] - pos[None]) ** 2, -1) + 1.0)[..., None]
                    - jnp.arange(3.0)
                )
                ** 2
            )
        )
        @ params["w"]
    )
    got = ins.probe("energy").summaries["cotangent"]["l2"]
    np.testing.assert_allclose(got, float(jnp.linalg.norm(2 * energy)), rtol=1e-5)
    path = tmp_path / "forces.html"
    ins.save_html(path)
    pg = page.open_report(path)
    ids = {n.label: n.id for n in ins.graph.nodes}
    for label, says in (("rbf", True), ("energy", False)):
        pg.locator(f'[data-node-id="{ids[label]}"]').first.click()
        pg.wait_for_timeout(200)
        note = pg.locator('[data-role="detail"] [data-role="no-cotangent"]')
        assert note.count() == (1 if says else 0), label
        if says:
            assert "does not depend on the differentiated arguments" in note.text_content()
    pg.screenshot(path=str(tmp_path / "forces.png"))
    assert page.errors == [] and page.requests == []


def test_the_no_cotangent_note_is_said_only_for_a_missing_floating_cotangent():
    # (the panel's rule, as the front end's `noCotangentNote` reads the model)
    ins = sowviz.inspect(_forces_like, {"w": jnp.ones((3, 1))}, jnp.ones((4, 3)), mode="grad")
    model = ins.to_dict()
    assert "cotangent" in model["modes"]
    probes = {p["name"]: p for p in model["probes"]}
    by_label = {n["id"]: n["label"] for n in model["nodes"]}
    without = {
        by_label.get(p["node"]) for p in probes.values() if "cotangent" not in p["summaries"]
    }
    assert {"dist", "rbf"} <= without and "energy" not in without
