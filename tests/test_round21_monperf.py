"""The Monitor's per-structure caches (session 46, issue 15) are keyed correctly.

A recorded step on a CPU mesh decides once per key how its summaries reach one
device (`capture.summaries._one_device_plan`: the tree, each leaf's shape, dtype and
sharding, the default device), and `Runner._as_plain` keeps, per argument layout,
where the plain program puts its results (also "nowhere": arguments on one device).
Checked here: a Monitor whose batch changes shape, whose parameter tree changes
structure, or whose arguments are placed otherwise, decides anew (a plan is reused
only for the same key) and still returns plain JAX's values and records NumPy's
statistics, before, after and back again. Gap: the caches' speed itself is measured
in `benchmarks/monitor_fixed_cost.py`, not here (no timing asserts)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tp_model import BATCH, FEATURES, tp_mesh, tp_model
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import sowviz
from sowviz.capture import summaries

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 host devices")


def _np_tp(params, x):
    """`tp_model`'s loss, gradients and hidden layer in float64 NumPy, for any batch."""
    w1, w2, x = (np.asarray(a, np.float64) for a in (params["w1"], params["w2"], x))
    h = np.tanh(x @ w1)
    y = h @ w2
    n = BATCH * FEATURES  # (the model's fixed denominator)
    dy = 2 * y / n
    dz = (dy @ w2.T) * (1 - h * h)
    return (y**2).sum() / n, {"w1": x.T @ dz, "w2": h.T @ dy}, h


def _recorded(mon, shape, kind="primal"):
    """The latest recorded step's `kind` summaries of the probes of `shape`."""
    probes = [
        p["id"]
        for p in mon.to_dict(with_history=False)["probes"]
        if p["summaries"].get(kind, {}).get("shape") == list(shape)
    ]
    assert probes, shape
    return [list(mon.history)[-1]["probes"][p][kind] for p in probes]


def _check_stats(got, want):
    assert got["count"] == want.size and got["nan"] == 0
    np.testing.assert_allclose(got["max"], want.max(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["min"], want.min(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["mean"], want.mean(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["l2"], np.sqrt((want * want).sum()), rtol=1e-5)


def _same_stats(got, want):
    return (
        got["count"] == want.size
        and np.isclose(got["mean"], want.mean(), rtol=1e-4, atol=1e-7)
        and np.isclose(got["max"], want.max(), rtol=1e-5, atol=1e-7)
        and np.isclose(got["l2"], np.sqrt((want * want).sum()), rtol=1e-5)
    )


class _Decisions:
    """Counts `_decide_one_device` calls (a plan decided, not found)."""

    def __init__(self, monkeypatch):
        self.n = 0
        real = summaries._decide_one_device

        def spy(*a):
            self.n += 1
            return real(*a)

        monkeypatch.setattr(summaries, "_decide_one_device", spy)
        summaries._PLANS.clear()


def _tp_step_checked(mon, params, x):
    value, grads = mon.step(params, x)
    mon.flush()
    want_loss, want_grads, h = _np_tp(params, x)
    np.testing.assert_allclose(float(value), want_loss, rtol=1e-5)
    for k, g in want_grads.items():
        np.testing.assert_allclose(np.asarray(grads[k]), g, rtol=1e-4, atol=1e-6)
    # the hidden layer inside the shard_map: per device (data, model) its block, whose
    # statistics over all blocks are the whole layer's
    data, model = tp_mesh().devices.shape
    rows, cols = h.shape
    for got in _recorded(mon, (data, model, rows // data, cols // model)):
        _check_stats(got, h)
    # the batch (at BATCH rows w2 has its shape too): one probe holds its statistics
    xs = np.asarray(x, np.float64)
    assert any(
        np.isclose(got["mean"], xs.mean(), rtol=1e-5) and np.isclose(got["max"], xs.max())
        for got in _recorded(mon, x.shape)
    )
    for k in ("w1", "w2"):  # a weight's cotangent: its gradient
        for got in _recorded(mon, params[k].shape, "cotangent"):
            _check_stats(got, want_grads[k])
    return grads


def test_a_tp_monitor_whose_batch_changes_shape_decides_again_and_matches_numpy(monkeypatch):
    mesh = tp_mesh()
    _, params, x = tp_model(mesh)
    loss = tp_model(mesh)[0]
    big = jax.device_put(
        jax.random.normal(jax.random.PRNGKey(7), (2 * BATCH, FEATURES)),
        NamedSharding(mesh, P("data", None)),
    )
    decided = _Decisions(monkeypatch)
    mon = sowviz.Monitor(loss, every=1, history=64)
    _tp_step_checked(mon, params, x)
    assert decided.n == 1
    _tp_step_checked(mon, params, x)
    assert decided.n == 1  # the same key: the plan is found
    _tp_step_checked(mon, params, big)  # another batch: another key
    assert decided.n == 2
    _tp_step_checked(mon, params, x)  # back: the first plan, still right
    _tp_step_checked(mon, params, big)
    assert decided.n == 2
    assert len(summaries._PLANS) == 2
    mon.close()


def test_a_tp_monitor_whose_weights_are_placed_otherwise_decides_again(monkeypatch):
    mesh = tp_mesh()
    loss, params, x = tp_model(mesh)
    # the same shapes and dtypes, w1 replicated instead of split by columns: the
    # capture program's outputs lie otherwise (and the plain program's gradients too)
    replicated = dict(params, w1=jax.device_put(params["w1"], NamedSharding(mesh, P())))
    decided = _Decisions(monkeypatch)
    plain = jax.jit(jax.value_and_grad(loss))
    mon = sowviz.Monitor(loss, every=1, history=64)
    for p in (params, replicated, params, replicated):
        grads = _tp_step_checked(mon, p, x)
        _, want = plain(p, x)
        for k in ("w1", "w2"):  # placed as plain JAX places them, for each layout
            assert grads[k].sharding.is_equivalent_to(want[k].sharding, 2)
    # one plan per placement (the capture program's outputs lie otherwise), each found
    # again when its placement comes back
    assert decided.n == len(summaries._PLANS) == 2
    mon.close()


def _mlp_loss(params, x):
    h = x
    for p in params:
        h = jnp.tanh(h @ p["w"] + p["b"])
    return jnp.mean(h**2)


def _np_mlp(params, x):
    """`_mlp_loss`'s loss and each layer's output in float64 NumPy."""
    h, hs = np.asarray(x, np.float64), []
    for p in params:
        h = np.tanh(h @ np.asarray(p["w"], np.float64) + np.asarray(p["b"], np.float64))
        hs.append(h)
    return (h**2).mean(), hs


def _mlp(mesh, depth, width=8, batch=16):
    keys = jax.random.split(jax.random.PRNGKey(depth), depth + 1)
    whole, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    params = [
        {"w": jax.random.normal(k, (width, width)) / 3, "b": 0.1 * jnp.ones(width)}
        for k in keys[:-1]
    ]
    x = jax.random.normal(keys[-1], (batch, width))
    return jax.device_put(params, whole), jax.device_put(x, split)


def test_a_data_parallel_monitor_whose_parameter_tree_changes_structure_matches(monkeypatch):
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    decided = _Decisions(monkeypatch)
    plain = jax.jit(jax.value_and_grad(_mlp_loss))
    mon = sowviz.Monitor(_mlp_loss, every=1, history=64)
    seen = set()
    for depth in (2, 3, 2, 3):
        params, x = _mlp(mesh, depth)
        value, grads = mon.step(params, x)
        mon.flush()
        want_value, want_grads = plain(params, x)
        np.testing.assert_allclose(float(value), float(want_value), rtol=1e-6)
        assert len(grads) == depth
        for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-7)
        np_loss, hs = _np_mlp(params, x)
        np.testing.assert_allclose(float(value), np_loss, rtol=1e-5)
        # every layer's output (of one shape, as the batch and pre-activations): one
        # probe of that shape holds its statistics
        recorded = _recorded(mon, hs[0].shape)
        for h in hs:
            assert any(_same_stats(got, h) for got in recorded), (depth, h.mean())
        seen.add(depth)
        assert decided.n == len(seen)  # one plan per tree, found again when it comes back
    mon.close()


def test_a_plan_is_keyed_by_shape_dtype_sharding_and_tree():
    mesh = tp_mesh()
    split = NamedSharding(mesh, P("data"))
    whole = NamedSharding(mesh, P())
    clean = jax.device_put(np.bool_(True), whole)

    def key_of(pending):
        leaves, treedef = jax.tree_util.tree_flatten((pending, clean))
        summaries._PLANS.clear()
        summaries._one_device_plan(pending, clean, treedef, leaves)
        (key,) = summaries._PLANS
        return key

    a = jax.device_put(np.ones((8, 4), np.float32), split)
    base = key_of((a,))
    others = [
        key_of((jax.device_put(np.ones((16, 4), np.float32), split),)),  # shape
        key_of((jax.device_put(np.ones((8, 4), np.int32), split),)),  # dtype
        key_of((jax.device_put(np.ones((8, 4), np.float32), whole),)),  # sharding
        key_of([a]),  # tree
        key_of((a, a)),
    ]
    assert base == key_of((jax.device_put(np.zeros((8, 4), np.float32), split),))
    assert all(k != base for k in others)
    assert len(set(others)) == len(others)
    # what the plan does: the split array gathered whole, each leaf on the one device
    b = jax.device_put(np.arange(32, dtype=np.float32).reshape(8, 4), split)
    (moved,), flag = summaries._on_one_device((b,), clean)
    assert moved.devices() == {summaries._default_device()} == flag.devices()
    np.testing.assert_array_equal(np.asarray(moved), np.arange(32).reshape(8, 4))
    assert bool(flag)


def test_a_monitor_whose_arguments_move_onto_a_mesh_places_gradients_as_plain_jax():
    # `Runner._as_plain` keeps "nothing placed" (arguments on one device) under its key
    # too: the same shapes placed on a mesh must not find it
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    params, x = _mlp(mesh, 2)
    local = (jax.tree.map(jnp.asarray, jax.device_get(params)), jnp.asarray(np.asarray(x)))

    def loss(params, x):  # (its own: programs are cached per function)
        return _mlp_loss(params, x)

    plain = jax.jit(jax.value_and_grad(loss))
    mon = sowviz.Monitor(loss, every=1, history=8)
    for args in (local, (params, x), local, (params, x)):
        value, grads = mon.step(*args)
        want_value, want_grads = plain(*args)
        np.testing.assert_allclose(float(value), float(want_value), rtol=1e-6)
        for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-7)
            assert g.sharding.is_equivalent_to(w.sharding, g.ndim)
    # one layout each: "nothing placed" for the local arguments, and for the mesh's the
    # plain program's own output shardings (as `jax.jit` reports them)
    kept = list(mon._runner._plain_placed.values())
    assert len(kept) == 2 and kept.count(None) == 1
    (found,) = [k for k in kept if k is not None]
    want = jax.tree.leaves(plain(params, x))
    assert len(found) == len(want)
    for got, w in zip(found, want, strict=True):
        assert got.is_equivalent_to(w.sharding, w.ndim)
    mon.close()
