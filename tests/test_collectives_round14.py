"""Library calls and collectives as boxes (round 14): a line assigning a `jax.lax`
collective is one box named by what it assigns (`g = pmean(g)`: `g`, never loose
`psum` and `div`), a `with_sharding_constraint` line's box shows the placement its
equation asks, and one `jnp.fft.irfft(x, n=N)` call is one box `irfft` (JAX's own
`jnp.pad` jit inside it, not a `pad` box beside it)."""

from __future__ import annotations

import os

# Must be set before JAX initialises its backends (conftest sets it too).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import sowviz

N = 8


def _devices(n: int = N) -> None:
    if len(jax.devices()) < n:
        pytest.skip(f"needs {n} devices (XLA_FLAGS=--xla_force_host_platform_device_count)")


def _children(ins, label: str):
    (node,) = [n for n in ins.graph.nodes if n.label == label]
    return ins.graph.children(node.id)


def _primal(ins, node_id: str) -> list[dict]:
    return [p.summaries["primal"] for p in ins.probes if p.node == node_id]


def _check_stats(summary: dict, values) -> None:
    v = np.asarray(values, np.float64).ravel()
    assert summary["count"] == v.size
    np.testing.assert_allclose(summary["min"], v.min(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(summary["max"], v.max(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(summary["l2"], np.linalg.norm(v), rtol=1e-5, atol=1e-7)


# --- 1. a collective's line is named by what it assigns ----------------------------


def _local_loss(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def _train_step(params, x, y):
    loss, g = jax.value_and_grad(_local_loss)(params, x, y)
    g = jax.lax.pmean(g, "batch")
    loss = jax.lax.pmean(loss, "batch")
    params = jax.tree.map(lambda p, d: p - 0.1 * d, params, g)
    return params, loss


def _replicated(tree):
    return jax.tree.map(lambda a: jnp.stack([a] * N), tree)


def test_pmap_steps_collective_lines_are_boxes_named_by_what_they_assign():
    # A legacy pmap train step: JAX's pmap plumbing made the level big, where a line's
    # run of two equations (`l = pmean(l)`: `psum`, `div`) was two loose boxes with no
    # values, and `g = pmean(g)` a box `pmean`; now `g` and `loss`
    _devices()
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {
        "w1": jax.random.normal(k1, (16, 32)) / 4,
        "b1": jnp.zeros(32),
        "w2": jax.random.normal(k2, (32, 1)) / 6,
        "b2": jnp.zeros(1),
    }
    x = jax.random.normal(k3, (N, 8, 16))
    y = jnp.sin(x.sum(-1, keepdims=True))
    step = jax.pmap(_train_step, axis_name="batch")
    ins = sowviz.inspect(step, _replicated(params), x, y, mode="primal")
    new_params, loss = step(_replicated(params), x, y)
    jax.tree.map(np.testing.assert_allclose, ins.result, (new_params, loss))
    labels = [n.label for n in _children(ins, "pmap(_train_step)")]
    assert not {"psum", "div", "pmean"} & set(labels), labels
    assert "g" in labels and "loss" in labels, labels
    (l_box,) = [n for n in _children(ins, "pmap(_train_step)") if n.label == "loss"]
    # the loss averaged over the devices: the mean of the per-device losses, alike on all
    per_device = [_local_loss(params, x[d], y[d]) for d in range(N)]
    (summary,) = _primal(ins, l_box.id)
    np.testing.assert_allclose(
        [summary["min"], summary["max"]], [np.mean(per_device)] * 2, rtol=1e-5
    )
    (g_box,) = [n for n in _children(ins, "pmap(_train_step)") if n.label == "g"]
    grads = [jax.grad(_local_loss)(params, x[d], y[d]) for d in range(N)]
    mean_grad = jax.tree.map(lambda *gs: np.mean(gs, axis=0), *grads)
    # (each leaf averaged over the devices, pmap's device axis in front: N copies of it)
    got = sorted(s["l2"] for s in _primal(ins, g_box.id))
    want = sorted(np.sqrt(N) * np.linalg.norm(g) for g in jax.tree.leaves(mean_grad))
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_a_one_equation_collective_line_and_a_pmean_line_read_alike():
    # `s = psum(s)` (one equation) and `m = pmean(m)` (`psum`, `div`) in a shard_map:
    # both boxes named by the line, not one `s` and one `pmean`
    _devices()
    mesh = jax.make_mesh((N,), ("d",), axis_types=(AxisType.Auto,))

    def local(x):
        s = jnp.sum(jnp.sin(x))
        s = jax.lax.psum(s, "d")
        m = jnp.sum(jnp.cos(x))
        m = jax.lax.pmean(m, "d")
        return s * m

    fn = jax.shard_map(local, mesh=mesh, in_specs=P("d"), out_specs=P())
    x = jax.device_put(jnp.linspace(0.1, 1.3, 32), NamedSharding(mesh, P("d")))
    ins = sowviz.inspect(fn, x, mode="primal")
    np.testing.assert_allclose(ins.result, fn(x), rtol=1e-6)
    sm = next(n for n in ins.graph.nodes if n.kind == "shard_map")
    boxes = {n.label: n for n in ins.graph.children(sm.id)}
    assert "psum" not in boxes and "pmean" not in boxes, list(boxes)
    xs = np.asarray(x).reshape(N, -1)
    (m,) = _primal(ins, boxes["m#2"].id)
    np.testing.assert_allclose(m["max"], np.mean(np.cos(xs).sum(1)), rtol=1e-5)
    (s,) = _primal(ins, boxes["s#2"].id)
    np.testing.assert_allclose(s["max"], np.sin(xs).sum(), rtol=1e-5)


# --- 2. a with_sharding_constraint line's box shows its placement ------------------


def test_a_sharding_constraint_lines_box_shows_the_placement_it_asks():
    _devices()
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    w = jax.device_put(
        jax.random.normal(jax.random.PRNGKey(0), (16, 64)) / 4,
        NamedSharding(mesh, P(None, "model")),
    )
    x = jax.device_put(
        jax.random.normal(jax.random.PRNGKey(2), (32, 16)), NamedSharding(mesh, P("data", None))
    )

    def loss(w, x):
        h = jnp.tanh(x @ w)
        h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P("data", "model")))
        return jnp.mean(h**2)

    ins = sowviz.inspect(loss, w, x)
    value, grad = jax.value_and_grad(loss)(w, x)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-5, atol=1e-7)
    (box,) = [n for n in ins.graph.nodes if n.label == "h#2"]
    assert box.kind == "scope"
    assert box.shapes == ("float32[32@data,64@model]",)
    (eqn,) = [n for n in ins.graph.children(box.id) if n.primitive == "sharding_constraint"]
    assert eqn.shapes == box.shapes
    # the box above it (`h = jnp.tanh(x @ w)`) asks nothing: its type alone
    (h,) = [n for n in ins.graph.nodes if n.label == "h"]
    assert h.shapes == ("float32[32,64]",)
    (summary,) = _primal(ins, box.id)
    _check_stats(summary, jnp.tanh(x @ w))


# --- 3. one library call of several jits is one box named by the call --------------


def _spectral(u):
    u_hat = jnp.fft.rfft(u)
    v = jnp.fft.irfft(0.5 * u_hat, n=u.shape[0])
    return jnp.sum(v**2)


def test_an_irfft_line_with_a_length_is_one_box_holding_its_pad():
    u = jnp.sin(jnp.linspace(0.0, 6.28, 16))
    ins = sowviz.inspect(_spectral, u, mode="grad")
    value, grad = jax.value_and_grad(_spectral)(u)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-5, atol=1e-6)
    top = [n.label for n in ins.graph.children(ins.graph.root)]
    # the line `v = jnp.fft.irfft(0.5 * u_hat, n=...)` is one box named by what it
    # assigns (its own `mul`, then the library's jits), no loose `pad` beside it
    assert "pad" not in top and "irfft" not in top and top.count("v") == 1, top
    (box,) = [n for n in ins.graph.children(ins.graph.root) if n.label == "v"]
    assert [n.label for n in ins.graph.children(box.id)] == ["mul", "pad", "irfft"]
    assert box.shapes == ("float32[16]",)
    v = np.fft.irfft(0.5 * np.fft.rfft(np.asarray(u, np.float64)), n=16)
    (summary,) = _primal(ins, box.id)
    _check_stats(summary, v)
    # its gradient: d sum(v**2) / dv
    (probe,) = [p for p in ins.probes if p.node == box.id]
    _check_stats(probe.summaries["cotangent"], 2 * v)
