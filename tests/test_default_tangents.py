"""The default tangents of modes jvp and all: a fixed-seed standard-normal direction per
floating leaf, keyed by its pytree path, made outside the program (`sowviz.modes`)."""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz import modes


def _mix(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def _numpy_normal(key: int, n: int) -> np.ndarray:
    """The documented definition, in NumPy (float64 transcendental functions)."""
    with np.errstate(over="ignore"):
        c = np.arange(n, dtype=np.uint32) * np.uint32(2)
        k = _mix(np.array([key], np.uint32))

        def u(i):
            return ((_mix(_mix(i) ^ k) >> np.uint32(8)).astype(np.float64) + 0.5) * 2.0**-24

        return np.sqrt(-2.0 * np.log(u(c))) * np.cos(2 * np.pi * u(c + np.uint32(1)))


def test_normal_draws_follow_the_documented_definition_and_are_standard_normal() -> None:
    keys = np.array([0, 7, 2**31 + 5], np.uint32)
    got = np.asarray(modes.normal_draws(keys, (512, 256), jnp.float32))
    assert got.shape == (3, 512, 256) and got.dtype == np.float32
    for k, draw in zip(keys, got, strict=True):
        np.testing.assert_allclose(draw.ravel(), _numpy_normal(int(k), draw.size), atol=2e-5)
        assert abs(draw.mean()) < 0.01 and abs(draw.std() - 1) < 0.01
    assert np.corrcoef(got[0].ravel(), got[1].ravel())[0, 1] < 0.01
    z = np.asarray(modes.normal_draws(keys[:1], (4096,), jnp.complex64))[0]
    assert z.dtype == np.complex64
    np.testing.assert_allclose(np.mean(np.abs(z) ** 2), 1.0, rtol=0.05)
    assert abs(np.corrcoef(z.real, z.imag)[0, 1]) < 0.05
    half = np.asarray(modes.normal_draws(keys[:1], (8, 3), jnp.bfloat16))
    assert half.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        half.astype(np.float32), got[0].ravel()[:24].reshape(1, 8, 3), rtol=1e-2
    )


def _args():
    k = jax.random.split(jax.random.PRNGKey(3), 4)
    params = {
        "w1": jax.random.normal(k[0], (3, 5)),
        "b1": jnp.zeros(5),
        "w2": jax.random.normal(k[1], (5, 5)),
        "scale": jnp.asarray(1.5),
    }
    return params, jax.random.normal(k[2], (4, 3)), jnp.arange(4)  # labels: not floating


def _loss(params, x, labels):
    with jax.named_scope("hidden"):
        h = jnp.tanh(x @ params["w1"] + params["b1"])
    with jax.named_scope("mix"):
        y = h @ params["w2"] * params["scale"]
    return jnp.mean(y[jnp.arange(4), labels % 5] ** 2)


def _expected_tangents(args):
    """Per floating leaf, the draw of crc32(its pytree path); float0 zeros elsewhere."""
    flat, tree = jax.tree_util.tree_flatten_with_path(args)
    out = []
    for path, leaf in flat:
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            out.append(np.zeros(leaf.shape, jax.dtypes.float0))
            continue
        key = np.array([zlib.crc32(jax.tree_util.keystr(path).encode())], np.uint32)
        out.append(modes.normal_draws(key, leaf.shape, leaf.dtype)[0])
    return jax.tree_util.tree_unflatten(tree, out)


@pytest.mark.parametrize("mode", ["jvp", "all"])
def test_modes_without_tangents_push_the_path_keyed_default_direction(mode, monkeypatch) -> None:
    args = _args()
    tangents = _expected_tangents(args)
    want = jax.jvp(_loss, args, tangents)
    calls = []
    real = modes.default_tangents

    def spy(layout, dyn, seed=0):
        calls.append(any(isinstance(x, jax.core.Tracer) for x in dyn))
        return real(layout, dyn, seed)

    monkeypatch.setattr(modes, "default_tangents", spy)
    ins = sowviz.inspect(_loss, *args, mode=mode)
    np.testing.assert_allclose(ins.result[0], want[0], rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], want[1], rtol=1e-5)
    # Made outside the program and passed in (inside, each leaf's tangent was a kernel
    # of its own for XLA to compile), and only the tangent modes make them.
    assert calls and not any(calls)
    calls.clear()
    sowviz.inspect(_loss, *args, mode="grad")
    assert calls == []


def test_a_leafs_default_tangent_does_not_depend_on_the_other_leaves() -> None:
    params, x, labels = _args()

    def probe_tangent(params, x, labels):
        ins = sowviz.inspect(
            lambda p, x, lab: jnp.sum(p["w2"] * 2.0), params, x, labels, mode="jvp"
        )
        return ins.result[1]

    alone = probe_tangent(params, x, labels)
    more = dict(params, extra=jnp.ones((7, 2)), w0=jnp.ones((5, 5)))
    assert float(probe_tangent(more, x, labels)) == float(alone)
    key = np.array([zlib.crc32(b"[0]['w2']")], np.uint32)
    np.testing.assert_allclose(
        alone, 2.0 * np.sum(modes.normal_draws(key, (5, 5), jnp.float32)), rtol=1e-5
    )


@pytest.mark.parametrize("specs", [((None, None), ("d", None)), ((None, "d"), (None, None))])
@pytest.mark.parametrize("axis_type", ["Auto", "Explicit"])
@pytest.mark.parametrize("mode", ["jvp", "all"])
def test_default_tangents_on_a_mesh_are_placed_like_their_primals(axis_type, mode, specs) -> None:
    # On an explicit mesh each tangent is placed like its primal, and like-shaped
    # captures of different shardings are summarised apart (stacked, they failed:
    # "All operands should have the same sharding").
    if jax.device_count() < 8 or not hasattr(jax, "set_mesh"):
        pytest.skip("needs 8 devices and jax.set_mesh")
    kind = getattr(jax.sharding.AxisType, axis_type)
    mesh = jax.make_mesh((8,), ("d",), axis_types=(kind,))

    def placed(x, *spec):
        return jax.device_put(
            x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
        )

    w = placed(jnp.linspace(-1.0, 1.0, 8 * 16).reshape(8, 16), *specs[0])
    x = placed(jnp.linspace(0.0, 2.0, 64).reshape(8, 8), *specs[1])

    def f(w, x):
        with jax.named_scope("layer"):
            y = jnp.tanh(x @ w)
        return jnp.sum(y**2)

    tangents = _expected_tangents((w, x))
    want = jax.jvp(f, (w, x), (placed(tangents[0], *specs[0]), placed(tangents[1], *specs[1])))
    with jax.set_mesh(mesh):
        ins = sowviz.inspect(f, w, x, mode=mode)
    np.testing.assert_allclose(ins.result[1], want[1], rtol=1e-5)


def test_small_default_tangents_are_drawn_on_the_host_and_equal_the_device_draws(
    monkeypatch,
) -> None:
    # Each compiled draw (one per shape and dtype) took 0.05-0.1 s of a small model's
    # first inspect in mode jvp; small kinds of leaf are drawn in NumPy instead.
    args = _args()
    device_draws = []
    real = modes._draws

    def spy(*a):
        device_draws.append(a[1])
        return real(*a)

    monkeypatch.setattr(modes, "_draws", spy)
    host = sowviz.inspect(lambda *a: _loss(*a) * 1.0, *args, mode="jvp")
    assert device_draws == []
    monkeypatch.setattr(modes, "HOST_DRAW_MAX", 0)  # every kind on the device now
    device = sowviz.inspect(lambda *a: _loss(*a) * 2.0, *args, mode="jvp")
    assert sorted(device_draws) == sorted([(3, 5), (5,), (5, 5), (), (4, 3)])
    np.testing.assert_allclose(device.result[1], 2.0 * host.result[1], rtol=1e-5)
    want = jax.jvp(_loss, args, _expected_tangents(args))[1]
    np.testing.assert_allclose(host.result[1], want, rtol=1e-5)


@pytest.mark.parametrize("mode", ["jvp", "all"])
def test_default_tangents_of_uncommitted_parameters_beside_a_sharded_batch(mode) -> None:
    # Data parallelism as usually written: parameters made by `jax.random` (uncommitted,
    # jit places them), a batch put on 8 devices. Pinned to the parameters' one device,
    # their tangents made jit refuse the placements ("incompatible devices").
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    w = jax.random.normal(jax.random.PRNGKey(0), (8, 8)) / 3
    x = jax.device_put(
        jnp.linspace(-1.0, 1.0, 128).reshape(16, 8),
        jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")),
    )
    assert not w.committed

    def f(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    ins = sowviz.inspect(f, w, x, mode=mode)
    want = jax.jvp(f, (w, x), _expected_tangents((w, x)))
    np.testing.assert_allclose(ins.result[1], want[1], rtol=1e-5)
