"""Graph fixes of session 35 around devices and library wrappers: a `jax.shard_map`
body's own equations carry data as a `jax.jit` body's do; `jax.pmap(f)` is drawn as
one device map of `f`, without JAX's pmap-to-shard_map plumbing; a tuple
`jax.lax.pcast` is no empty box; and Haiku's residual `add` after `hk.remat` or
`hk.layer_stack` carries data as it does unwrapped."""

from __future__ import annotations

import os

# Must be set before JAX initialises its backends (conftest sets it too).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import sowviz

N = 8
W = jax.random.normal(jax.random.PRNGKey(0), (16, 4)) / 4
X = jax.random.normal(jax.random.PRNGKey(1), (64, 16))
Y = jax.random.normal(jax.random.PRNGKey(2), (64, 4))


def _mesh(n: int = N) -> Mesh:
    if len(jax.devices()) < n:
        pytest.skip(f"needs {n} devices (XLA_FLAGS=--xla_force_host_platform_device_count)")
    return Mesh(np.array(jax.devices()[:n]), ("i",))


def _nodes(d: dict, label: str, parent_label: str | None = None) -> list[dict]:
    by_id = {n["id"]: n for n in d["nodes"]}
    return [
        n
        for n in d["nodes"]
        if n["label"] == label
        and (parent_label is None or by_id.get(n["parent"], {}).get("label") == parent_label)
    ]


def _summary(ins, node_id: str, role: str) -> dict:
    (probe,) = [p for p in ins.probes if p.node == node_id]
    return probe.summaries[role]


def _check_stats(summary: dict, values) -> None:
    v = np.asarray(values, np.float64).ravel()
    assert summary["count"] == v.size
    np.testing.assert_allclose(summary["min"], v.min(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(summary["max"], v.max(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(summary["mean"], v.mean(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(summary["l2"], np.linalg.norm(v), rtol=1e-5, atol=1e-7)


# --- 1. a shard_map body's own equations carry data ---------------------------------


def _psum_loss(w, x, y):
    def body(w, x, y):
        pred = jnp.tanh(x @ w)
        return jax.lax.psum(jnp.sum((pred - y) ** 2), "i") / Y.size

    mesh = _mesh()
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("i"), P("i")), out_specs=P())(w, x, y)


def _plain_loss_of_pred(pred, y):
    return jnp.sum((pred - y) ** 2) / Y.size


def test_shard_map_body_equations_carry_per_device_values_and_gradients():
    ins = sowviz.inspect(_psum_loss, W, X, Y, mode="grad")
    loss, grad = ins.result
    ref_loss, ref_grad = jax.value_and_grad(_psum_loss)(W, X, Y)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)
    d = ins.to_dict()
    pred = jnp.tanh(X @ W)
    d_pred = jax.grad(_plain_loss_of_pred)(pred, Y)
    # every device's rows: the body's values over all devices are the whole batch's
    expected = {  # (`pred = jnp.tanh(x @ w)`: its line's box)
        "pred": (pred, d_pred),
        "sub": (pred - Y, d_pred),
        "integer_pow": ((pred - Y) ** 2, np.full(pred.shape, 1 / Y.size)),
    }
    for label, (primal, cotangent) in expected.items():
        (node,) = _nodes(d, label, "shard_map(body)")  # were boxes with no data
        _check_stats(_summary(ins, node["id"], "primal"), primal)
        _check_stats(_summary(ins, node["id"], "cotangent"), cotangent)
        assert _summary(ins, node["id"], "primal")["shape"] == [N, X.shape[0] // N, 4]


def _gather_loss(w, x, y):
    def local_loss(w, x, y):
        feats = jax.lax.all_gather(x, "i", tiled=True)
        pred = jnp.tanh(feats @ w)
        return jax.lax.pmean(jnp.mean((pred - jax.lax.all_gather(y, "i", tiled=True)) ** 2), "i")

    mesh = _mesh()
    return jax.shard_map(local_loss, mesh=mesh, in_specs=(P(), P("i"), P("i")), out_specs=P())(
        w, x, y
    )


def test_shard_map_body_is_probed_as_a_jit_body_is():
    ins = sowviz.inspect(_gather_loss, W, X, Y, mode="grad")
    np.testing.assert_allclose(ins.result[0], _gather_loss(W, X, Y), rtol=1e-6)
    d = ins.to_dict()
    probed = {p.node for p in ins.probes}
    for label in ("feats", "pred", "sub", "integer_pow"):  # (lines' boxes: `pred = …`)
        (node,) = _nodes(d, label, "shard_map(local_loss)")
        assert node["id"] in probed, label
    # each device gathered the whole batch: its tanh is the whole tanh(x @ w), 8 times
    (tanh,) = _nodes(d, "pred", "shard_map(local_loss)")
    _check_stats(_summary(ins, tanh["id"], "primal"), np.tile(np.tanh(X @ W), (N, 1)))


# --- 2. jax.pmap without JAX's plumbing ---------------------------------------------


def _pmap_body(w, x):
    h = jnp.tanh(x @ w)
    return jax.lax.pmean(jnp.mean(h**2), "b")


def _pmap_loss(w, x):
    _mesh()  # (skips without 8 devices)
    per = jax.pmap(_pmap_body, axis_name="b", in_axes=(None, 0))(w, x)
    return per[0]


XP = X.reshape(N, -1, X.shape[1])  # [devices, per-device batch, features]


def test_pmap_is_one_device_map_of_the_users_function_without_plumbing():
    ins = sowviz.inspect(_pmap_loss, W, XP, mode="grad")
    np.testing.assert_allclose(ins.result[0], _pmap_loss(W, XP), rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], jax.grad(_pmap_loss)(W, XP), rtol=1e-5, atol=1e-7)
    d = ins.to_dict()
    (pmap,) = _nodes(d, "pmap(_pmap_body)")
    assert pmap["kind"] == "shard_map"  # a map over devices, not the `jit` JAX binds
    inside = [n["label"] for n in d["nodes"] if n["parent"] == pmap["id"]]
    assert inside == ["h", "integer_pow", "mean", "pmean"]  # (`h = jnp.tanh(x @ w)`)
    labels = {n["label"] for n in d["nodes"]}
    assert "shard_map" not in labels and "broadcast_in_dim" not in labels
    # the body's equations carry every device's values and their gradients
    h = jnp.tanh(X @ W)
    d_h = 2 * h / (h.size // N) / N  # d mean(h_dev**2) / d h_dev, pmean-ed over 8 devices
    (tanh,) = _nodes(d, "h", "pmap(_pmap_body)")
    _check_stats(_summary(ins, tanh["id"], "primal"), h)
    _check_stats(_summary(ins, tanh["id"], "cotangent"), d_h)
    # a scope whose value pmap expands on return shows it as made (no device axis of 1)
    (pmean,) = _nodes(d, "pmean", "pmap(_pmap_body)")
    assert _summary(ins, pmean["id"], "primal")["shape"] == [N]


def _pmap_axes_loss(w, x):
    _mesh()
    h, s = jax.pmap(
        lambda w, x: (jnp.tanh(x @ w), jnp.sum(x)),
        axis_name="b",
        in_axes=(None, 1),
        out_axes=(1, None),
    )(w, x)
    return jnp.mean(h**2) + s


def test_pmap_over_other_axes_draws_no_plumbing_and_matches_jax():
    x = jnp.moveaxis(XP, 0, 1)  # mapped over axis 1
    ins = sowviz.inspect(_pmap_axes_loss, W, x, mode="grad")
    np.testing.assert_allclose(ins.result[0], _pmap_axes_loss(W, x), rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], jax.grad(_pmap_axes_loss)(W, x), rtol=1e-5, atol=1e-7)
    d = ins.to_dict()
    (pmap,) = [n for n in d["nodes"] if n["label"].startswith("pmap")]
    inside = [n["label"] for n in d["nodes"] if n["parent"] == pmap["id"]]
    assert (
        "squeeze" not in inside and "broadcast_in_dim" not in inside and "shard_map" not in inside
    )


# --- 3. a tuple pcast is no box -----------------------------------------------------


def _pcast_loss(w, xs):
    mesh = _mesh(4)
    perm = [(i, (i + 1) % 4) for i in range(4)]

    def body(w, xs):
        def step(carry, x):
            c, acc = carry
            c = jnp.tanh(c @ w[0] + x)
            return (jax.lax.ppermute(c, "i", perm), acc + c), None

        init = jax.lax.pcast((jnp.zeros((2, 8)), jnp.zeros((2, 8))), ("i",), to="varying")
        (_, acc), _ = jax.lax.scan(step, init, xs)
        return jax.lax.psum(jnp.sum(acc**2), "i")

    return jax.shard_map(body, mesh=mesh, in_specs=(P("i"), P()), out_specs=P())(w, xs)


def test_tuple_pcast_is_drawn_as_edges_not_an_empty_box():
    if not hasattr(jax.lax, "pcast"):
        pytest.skip("jax.lax.pcast is newer than this JAX")
    w = jax.random.normal(jax.random.PRNGKey(0), (4, 8, 8)) / 3
    xs = jax.random.normal(jax.random.PRNGKey(1), (5, 2, 8))
    ins = sowviz.inspect(_pcast_loss, w, xs)
    np.testing.assert_allclose(ins.result[0], _pcast_loss(w, xs), rtol=1e-6)
    d = ins.to_dict()
    assert not [n for n in d["nodes"] if n["label"] == "pcast"]
    (body,) = [n for n in d["nodes"] if n["kind"] == "shard_map"]
    # (the line `init = jax.lax.pcast((jnp.zeros(...), ...))` is a box of its zeros)
    assert [n["label"] for n in d["nodes"] if n["parent"] == body["id"]][:2] == [
        "init",
        "scan(step)",
    ]
    parents = {n["parent"] for n in d["nodes"]}
    assert all(n["id"] in parents for n in d["nodes"] if n["kind"] == "scope")  # none empty


# --- 4. Haiku's residual add after hk.remat / hk.layer_stack ------------------------

D = 8
XH = jax.random.normal(jax.random.PRNGKey(3), (4, D))


def _block(x):
    hk = pytest.importorskip("haiku")
    h = hk.Linear(D, name="dense")(x)
    return x + jax.nn.gelu(h)


def _haiku_variants():
    hk = pytest.importorskip("haiku")
    return {
        "layer_stack(remat(block))": lambda x: hk.layer_stack(3, name="layers")(hk.remat(_block))(
            x
        ),
        "layer_stack(block)": lambda x: hk.layer_stack(3, name="layers")(_block)(x),
        "remat(block)": lambda x: hk.remat(_block)(x),
    }


@pytest.mark.parametrize(
    "variant", ["layer_stack(remat(block))", "layer_stack(block)", "remat(block)"]
)
def test_haiku_residual_add_in_a_wrapped_block_carries_data(variant):
    hk = pytest.importorskip("haiku")
    m = hk.without_apply_rng(hk.transform(_haiku_variants()[variant]))
    params = m.init(jax.random.PRNGKey(0), XH)

    def loss(p, x):
        return jnp.mean(m.apply(p, x) ** 2)

    ins = sowviz.inspect(loss, params, XH)
    d = ins.to_dict()
    by_id = {n["id"]: n for n in d["nodes"]}
    (add,) = [
        n
        for n in d["nodes"]
        if n["label"] == "add"
        and n["kind"] == "eqn"
        and by_id[n["parent"]]["label"] not in ("dense", "gelu")
    ]
    primal, cotangent = _residual_outputs(params)
    _check_stats(_summary(ins, add["id"], "primal"), primal)
    _check_stats(_summary(ins, add["id"], "cotangent"), cotangent)


def _residual_outputs(params: dict) -> tuple[np.ndarray, np.ndarray]:
    """Each layer's output `x + gelu(x @ w + b)` in plain JAX, stacked over the layers
    (a loop's probe shows every pass), and d loss / d each of them."""
    layers = next(iter(params.values()))  # `layers/dense` or `dense`
    w, b = layers["w"], layers["b"]
    stacked = w.ndim == 3
    if not stacked:
        w, b = w[None], b[None]

    def loss(bumps):  # a zero added to each layer's output: its gradient is d loss / d it
        x, outs = XH, []
        for k in range(w.shape[0]):
            x = x + jax.nn.gelu(x @ w[k] + b[k]) + bumps[k]
            outs.append(x)
        return jnp.mean(x**2), jnp.stack(outs)

    bumps = jnp.zeros((w.shape[0], *XH.shape))
    grads, outs = jax.grad(loss, has_aux=True)(bumps)
    return (outs, grads) if stacked else (outs[0], grads[0])
