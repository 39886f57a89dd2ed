"""Round 16, Flax Linen: a `nn.BatchNorm` in training (`mutable=["batch_stats"]`) draws
Flax's running-statistics update as one box per statement, named after the variable it
assigns (`mean (new)`, `var (new)`) and holding the new statistics, and its stage names
those outputs by their Linen paths (`batch_stats.mean (new)`), not `[1]`, `[2]`; and
`nn.RNN(nn.OptimizedLSTMCell(...))` draws no boxes for the dummy key Flax makes and
splits for `initialize_carry` (`random_seed`, `random_split`, `unstack`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

nn = pytest.importorskip("flax.linen")

X = jax.random.normal(jax.random.PRNGKey(1), (16, 4))


class Net(nn.Module):
    train: bool = True

    @nn.compact
    def __call__(self, x):
        x = nn.Dense(8, name="fc")(x)
        return nn.BatchNorm(use_running_average=not self.train, momentum=0.9, name="bn")(x)


def _children(d: dict, parent: str) -> list[dict]:
    return [n for n in d["nodes"] if n["parent"] == parent]


def _node(d: dict, label: str, parent_label: str) -> str:
    ids = {n["id"]: n for n in d["nodes"]}
    return next(
        n["id"]
        for n in d["nodes"]
        if n["label"] == label and n["parent"] in ids and ids[n["parent"]]["label"] == parent_label
    )


def _primal(p) -> dict:
    return p.summaries["primal"]


def test_a_linen_batchnorm_s_update_is_a_box_per_statistic_with_its_new_value():
    model = Net()
    v = model.init(jax.random.PRNGKey(0), X)

    def loss_fn(params, batch_stats, x):
        y, upd = model.apply(
            {"params": params, "batch_stats": batch_stats}, x, mutable=["batch_stats"]
        )
        return jnp.mean(y**2), upd

    ins = sowviz.inspect(loss_fn, v["params"], v["batch_stats"], X, mode="grad", has_aux=True)
    # what Flax itself computes
    y, upd = model.apply(v, X, mutable=["batch_stats"])
    new = upd["batch_stats"]["bn"]
    d = ins.to_dict()
    bn = _node(d, "bn", "Net")
    kids = _children(d, bn)
    labels = [n["label"] for n in kids]
    assert labels == ["_compute_stats", "mean (new)", "var (new)", "_normalize"], labels
    assert not [n for n in kids if n["kind"] == "eqn"]  # (no loose `mul`, `add`)
    for var in ("mean", "var"):
        box = next(n["id"] for n in kids if n["label"] == f"{var} (new)")
        (p,) = [q for q in ins.probes if q.node == box]  # the box carries data
        want = np.asarray(new[var])
        np.testing.assert_allclose(_primal(p)["l2"], np.linalg.norm(want), rtol=1e-5)
        np.testing.assert_allclose(_primal(p)["mean"], want.mean(), rtol=1e-5, atol=1e-7)
        # the stage's outputs are named by their Linen paths, the model's too
        s = ins.probe("bn", leaf=f"batch_stats.{var} (new)")
        assert s.leaf == f"['batch_stats.{var} (new)']"
        np.testing.assert_allclose(_primal(s)["l2"], np.linalg.norm(want), rtol=1e-5)
        t = ins.probe("Net", leaf=f"batch_stats.bn.{var} (new)")
        np.testing.assert_allclose(_primal(t)["l2"], np.linalg.norm(want), rtol=1e-5)
    leaves = [q.leaf for q in ins.probes if q.node == bn]
    assert leaves == ["['output']", "['batch_stats.mean (new)']", "['batch_stats.var (new)']"]
    # `probe("bn")` is still the activation
    p = ins.probe("bn")
    assert _primal(p)["shape"] == [16, 8]
    np.testing.assert_allclose(_primal(p)["l2"], np.linalg.norm(np.asarray(y)), rtol=1e-5)


def test_eval_mode_writes_nothing_and_draws_no_update():
    model = Net(train=False)
    v = model.init(jax.random.PRNGKey(0), X)
    ins = sowviz.inspect(
        lambda p, x: jnp.mean(model.apply({**v, "params": p}, x) ** 2), v["params"], X
    )
    d = ins.to_dict()
    labels = [n["label"] for n in _children(d, _node(d, "bn", "Net"))]
    assert not [k for k in labels if k.endswith("(new)")], labels
    p = ins.probe("bn")
    assert p.leaf == ""
    np.testing.assert_allclose(
        _primal(p)["l2"], np.linalg.norm(np.asarray(model.apply(v, X))), rtol=1e-5
    )


class Enc(nn.Module):
    @nn.compact
    def __call__(self, x):
        _carry, outs = nn.RNN(nn.OptimizedLSTMCell(8), return_carry=True, name="lstm")(x)
        return outs


def test_an_lstm_rnn_draws_no_boxes_for_flax_s_dummy_carry_key():
    model = Enc()
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 4, 3))
    params = model.init(jax.random.PRNGKey(0), x)["params"]
    ins = sowviz.inspect(lambda p, x: jnp.mean(model.apply({"params": p}, x) ** 2), params, x)
    d = ins.to_dict()
    labels = [n["label"] for n in _children(d, _node(d, "lstm", "Enc"))]
    assert not [k for k in labels if k.startswith("random_") or k == "unstack"], labels
    assert "scan(OptimizedLSTMCell_0)" in labels and "zeros" in labels
    # the values are the model's
    want = np.asarray(model.apply({"params": params}, x))
    p = ins.probe("Enc")
    assert _primal(p)["shape"] == list(want.shape)
    np.testing.assert_allclose(_primal(p)["l2"], np.linalg.norm(want), rtol=1e-5)
    np.testing.assert_allclose(_primal(p)["mean"], want.mean(), rtol=1e-4, atol=1e-7)


def test_a_key_split_that_a_draw_reads_is_still_drawn():
    # only keys nothing reads go: `k2` is unused, but `k1` feeds the draw
    def f(x, key):
        k1, _k2 = jax.random.split(key)
        return jnp.sum(x * jax.random.normal(k1, x.shape))

    ins = sowviz.inspect(f, jnp.ones(3), jax.random.key(0), mode="primal")
    labels = [n["label"] for n in ins.to_dict()["nodes"]]
    assert "random_split" in labels, labels
