"""Haiku models: parameter names as Haiku prints them, probes by JAX's key paths, and
Haiku's own method dispatch drawn as no stage."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

hk = pytest.importorskip("haiku")


def _children(d: dict, parent: str) -> list[str]:
    return [n["label"] for n in d["nodes"] if n["parent"] == parent]


def _node(d: dict, label: str, parent: str | None = None) -> dict:
    (node,) = [
        n for n in d["nodes"] if n["label"] == label and (parent is None or n["parent"] == parent)
    ]
    return node


#: keys no identifier: Haiku's names (`a/b`, `~`) and others (`a b`, `a.b`)
_KEYS = ["lin", "a/b", "a~b", "a.b", "a b", "~"]


def _keyed_params() -> dict:
    return {k: {"w": jnp.linspace(-1.0, 1.0, 4) * (i + 1)} for i, k in enumerate(_KEYS)}


def _keyed_loss(p, x):
    return sum(jnp.mean(jnp.tanh(x * p[k]["w"]) ** 2) for k in _KEYS)


def test_every_key_path_names_its_parameter_whatever_its_keys():
    p, x = _keyed_params(), jnp.linspace(0.5, 1.5, 8).reshape(2, 4)
    ins = sowviz.inspect(_keyed_loss, p, x)
    grads = jax.grad(_keyed_loss)(p, x)
    for path, leaf in jax.tree_util.tree_leaves_with_path(p):
        probe = ins.probe(jax.tree_util.keystr(path))  # `['a/b']['w']` raised a KeyError
        g = grads
        for k in path:
            g = g[k.key]
        s = probe.summaries["cotangent"]
        np.testing.assert_allclose(s["l2"], np.linalg.norm(np.asarray(g)), rtol=1e-5)
        np.testing.assert_allclose(probe.summaries["primal"]["max"], float(leaf.max()), rtol=1e-6)


def test_keys_no_identifier_are_labelled_bare_unless_they_read_as_a_path():
    p, x = _keyed_params(), jnp.ones((2, 4))
    d = sowviz.inspect(_keyed_loss, p, x).to_dict()
    group = _node(d, "parameters")["id"]
    # a dot or a space in a key would misread as the path's own: quoted as JAX quotes it
    assert _children(d, group) == ["['a b']", "['a.b']", "a/b", "a~b", "lin", "~"]


def _mlp_fn(x):
    return hk.nets.MLP([8, 4], name="mlp")(x)


def test_haiku_parameters_are_named_as_haiku_names_them():
    net = hk.without_apply_rng(hk.transform(_mlp_fn))
    x = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    params = net.init(jax.random.PRNGKey(0), x)

    def loss(params, x):
        return jnp.mean(net.apply(params, x) ** 2)

    ins = sowviz.inspect(loss, params, x)
    d = ins.to_dict()
    group = _node(d, "parameters")["id"]
    assert _children(d, group) == ["mlp/~/linear_0", "mlp/~/linear_1"]
    grads = jax.grad(loss)(params, x)
    for module, leaves in params.items():
        for name in leaves:
            want = np.linalg.norm(np.asarray(grads[module][name]))
            # Haiku's own name, JAX's key path, and the parameter table's name
            for asked in (f"{module}/{name}", f"['{module}']['{name}']", f"{module}.{name}"):
                probe = ins.probe(asked)
                assert ins.probe_path(probe) == f"parameters/{module}/{name}"
                np.testing.assert_allclose(probe.summaries["cotangent"]["l2"], want, rtol=1e-5)


def _lstm_attention_fn(x):
    core = hk.LSTM(8, name="lstm")
    out, _ = core(x, core.initial_state(4))
    q = out[:, None]
    init = hk.initializers.VarianceScaling(1.0)
    return hk.MultiHeadAttention(num_heads=2, key_size=4, w_init=init, name="attn")(q, q, q)


def test_haikus_method_dispatch_is_no_stage():
    net = hk.without_apply_rng(hk.transform(_lstm_attention_fn))
    x = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    params = net.init(jax.random.PRNGKey(0), x)
    d = sowviz.inspect(lambda p, x: jnp.mean(net.apply(p, x) ** 2), params, x).to_dict()
    assert "run_interceptors" not in {n["label"] for n in d["nodes"]}
    (fwd,) = [n for n in d["nodes"] if n["label"] == "_lstm_attention_fn"]
    lstm = [n for n in d["nodes"] if n["label"] == "lstm" and n["parent"] == fwd["id"]][-1]
    # the LSTM's gates are its own equations, in its stage
    assert _children(d, lstm["id"]) == [
        "concatenate",
        "linear",
        "split",
        "add",
        "logistic",
        "mul",
        "logistic",
        "tanh",
        "mul",
        "add",
        "logistic",
        "tanh",
        "mul",
    ]
    attn = _node(d, "attn", fwd["id"])
    kids = _children(d, attn["id"])
    # each head's projection and its reshape, the same for query, key and value
    assert kids[:6] == ["query", "reshape", "key", "reshape", "value", "reshape"]
    assert "softmax" in kids and kids[-1] == "linear"


def _dropped(x):
    return hk.dropout(hk.next_rng_key(), 0.5, hk.Linear(8, name="dense")(x))


def _dropout_fn(x):
    h = _dropped(x)
    return hk.Linear(1, name="out")(h)


def test_a_haiku_dropout_line_is_one_box_with_its_values():
    net, dropped = hk.transform(_dropout_fn), hk.transform(_dropped)
    x = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    params = net.init(jax.random.PRNGKey(0), x)
    rng = jax.random.PRNGKey(1)

    def loss(params, rng, x):
        return jnp.mean(net.apply(params, rng, x) ** 2)

    ins = sowviz.inspect(loss, params, rng, x)
    d = ins.to_dict()
    box = _node(d, "_dropped")
    # `bernoulli`'s jit had parted the line in `dropout`, `bernoulli`, `dropout#2`
    assert _children(d, box["id"]) == ["next_rng_key", "dense", "dropout"]
    drop = _node(d, "dropout", box["id"])
    assert "bernoulli" in _children(d, drop["id"])
    want = np.asarray(dropped.apply({"dense": params["dense"]}, rng, x))  # the same key drawn
    got = ins.probe("_dropped/dropout").summaries["primal"]
    np.testing.assert_allclose(got["l2"], np.linalg.norm(want), rtol=1e-5)
    np.testing.assert_allclose(got["zeros"], np.sum(want == 0))


def test_a_linen_rnn_is_a_scan_of_its_cell_with_no_flax_plumbing():
    # (beside Haiku's: Flax Linen's `nn.RNN` is the other library RNN drawn by its parts)
    nn = pytest.importorskip("flax.linen")

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(1, name="head")(nn.RNN(nn.LSTMCell(16), name="rnn")(x)[:, -1])

    m, x = Model(), jnp.linspace(-1.0, 1.0, 30).reshape(2, 5, 3)
    p = m.init(jax.random.PRNGKey(0), x)["params"]
    ins = sowviz.inspect(lambda p, x: jnp.mean(m.apply({"params": p}, x) ** 2), p, x)
    d = ins.to_dict()
    labels = {n["label"] for n in d["nodes"]}
    assert not labels & {"LSTMCell.initialize_carry", "scan_fn", "body_fn", "LSTMCell_0.scan_fn"}
    rnn = _node(d, "rnn", _node(d, "Model")["id"])
    scan = _node(d, "scan(LSTMCell_0)", rnn["id"])
    cell = _node(d, "LSTMCell_0", scan["id"])
    assert {"ii", "if", "ig", "io", "hi", "hf", "hg", "ho"} <= set(_children(d, cell["id"]))
    # (Linen names the cell `LSTMCell_0` in the model, `cell` in an `nn.RNN` alone)
    want = np.asarray(nn.RNN(nn.LSTMCell(16)).apply({"params": {"cell": p["LSTMCell_0"]}}, x))
    got = ins.probe("Model/rnn").summaries["primal"]
    np.testing.assert_allclose(got["l2"], np.linalg.norm(want), rtol=1e-5)
    np.testing.assert_allclose(got["mean"], want.mean(), rtol=1e-4, atol=1e-7)
