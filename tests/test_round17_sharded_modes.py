"""Sharded programs in every differentiating mode (round 17): a `shard_map` whose
output is split over an Explicit mesh takes sowviz's default cotangent and a user's
replicated cotangent or tangents (placed like their output or argument, as `jax.vjp`
and `jax.jvp` of the jitted function take them); modes vjp and all return each
gradient placed like its argument, as mode grad does; and a `jax.jit` whose
`in_shardings` split an argument passed as a host array draws that input split."""

from __future__ import annotations

import os
import zlib

# Must be set before JAX initialises its backends (conftest sets it too).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import sowviz
from sowviz import _compat

RTOL, ATOL = 1e-5, 1e-6


def _need_devices(n: int = 8) -> None:
    if jax.device_count() < n:
        pytest.skip(f"needs {n} devices (XLA_FLAGS=--xla_force_host_platform_device_count)")


def _explicit_mesh() -> Mesh:
    _need_devices()
    kinds = getattr(jax.sharding, "AxisType", None)
    if kinds is None or not hasattr(kinds, "Explicit"):
        pytest.skip("this JAX has no Explicit mesh axes (jax.sharding.AxisType.Explicit)")
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(kinds.Explicit,) * 2)


def _auto_mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    _need_devices()
    # `Mesh` of devices: Auto axes in JAX 0.10 and 0.12 alike
    return Mesh(np.array(jax.devices()).reshape(shape), names)


def _tp_layer(mesh: Mesh):
    """The report's tensor-parallel layer: its output split over both mesh axes."""

    @jax.jit
    @partial(
        jax.shard_map,
        mesh=mesh,
        in_specs=(P(None, "model"), P("data")),
        out_specs=P("data", "model"),
    )
    def tp_layer(w, x):
        return jnp.tanh(x @ w)

    return tp_layer


def _tp_args(mesh: Mesh) -> tuple[jax.Array, jax.Array]:
    x = jax.random.normal(jax.random.PRNGKey(0), (16, 8))
    w = jax.random.normal(jax.random.PRNGKey(1), (8, 8)) / 3
    return (
        jax.device_put(w, NamedSharding(mesh, P(None, "model"))),
        jax.device_put(x, NamedSharding(mesh, P("data", None))),
    )


def _close(got, want) -> None:
    for g, v in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(v), rtol=RTOL, atol=ATOL)


# --- finding 1: seeds of a sharded shard_map's output and arguments ------------------


@pytest.mark.parametrize("mode", ["vjp", "all"])
@pytest.mark.parametrize("seed", ["default", "ones_of_shape", "numpy"])
def test_cotangent_of_a_split_shard_map_output(mode, seed):
    mesh = _explicit_mesh()
    tp_layer = _tp_layer(mesh)
    w, x = _tp_args(mesh)
    ct = {
        "default": None,
        "ones_of_shape": jnp.ones((16, 8)),  # replicated, as `jnp.ones(out.shape)` is
        "numpy": np.random.RandomState(2).randn(16, 8).astype(np.float32),
    }[seed]
    out, pull = jax.vjp(tp_layer, w, x)
    want = pull(jnp.ones_like(out) if ct is None else jax.device_put(ct, out.sharding))

    kw = {} if ct is None else {"cotangents": ct}
    result = sowviz.inspect(tp_layer, w, x, mode=mode, **kw).result
    grads = result[1] if mode == "vjp" else result[2]
    _close(result[0], out)
    _close(grads, want)
    for g, arg in zip(grads, (w, x), strict=True):
        assert g.sharding.spec == arg.sharding.spec == jax.typeof(arg).sharding.spec


@pytest.mark.parametrize("mode", ["jvp", "all"])
def test_replicated_user_tangents_of_split_arguments(mode):
    mesh = _explicit_mesh()
    tp_layer = _tp_layer(mesh)
    w, x = _tp_args(mesh)
    rng = np.random.RandomState(3)
    # a NumPy tangent for `w` and a replicated one for `x`: `jax.jvp` takes both
    tw = rng.randn(8, 8).astype(np.float32)
    tx = jnp.asarray(rng.randn(16, 8).astype(np.float32))
    out, want = jax.jvp(tp_layer, (w, x), (tw, tx))

    result = sowviz.inspect(tp_layer, w, x, mode=mode, tangents=(tw, tx)).result
    _close(result[0], out)
    _close(result[1], want)
    assert result[1].sharding.spec == P("data", "model")


def test_default_tangents_of_split_arguments():
    mesh = _explicit_mesh()
    tp_layer = _tp_layer(mesh)
    w, x = _tp_args(mesh)
    # sowviz's documented default direction: per leaf, the draw of crc32(its path)
    tangents = tuple(
        sowviz.modes.normal_draws(np.array([zlib.crc32(path)], np.uint32), a.shape, a.dtype)[0]
        for path, a in ((b"[0]", w), (b"[1]", x))
    )
    result = sowviz.inspect(tp_layer, w, x, mode="jvp").result
    _close(result[1], jax.jvp(tp_layer, (w, x), tangents)[1])
    assert result[1].sharding.spec == P("data", "model")


def test_a_cotangent_that_cannot_be_placed_is_named(monkeypatch):
    mesh = _explicit_mesh()
    tp_layer = _tp_layer(mesh)
    w, x = _tp_args(mesh)

    def refuse(v, like):
        raise ValueError("cannot reshard")

    monkeypatch.setattr(_compat, "explicitly_placed_like", refuse)
    with pytest.raises(ValueError, match=r"cotangent of output leaf `\['h'\]`") as err:
        sowviz.inspect(
            lambda w, x: {"h": tp_layer(w, x)},
            w,
            x,
            mode="vjp",
            cotangents={"h": jnp.ones((16, 8))},
        )
    assert "cannot reshard" in str(err.value) and "jax.reshard" in str(err.value)


# --- finding 4: gradients placed like their arguments in every mode -----------------


def _fsdp_tp():
    mesh = _auto_mesh((4, 2), ("data", "model"))

    def loss(params, x):
        h = jax.nn.gelu(x @ params["w1"])
        h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P("data", "model")))
        return jnp.mean((h @ params["w2"]) ** 2)

    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    spec = {"w1": P("data", "model"), "w2": P("model", "data")}
    raw = {"w1": jax.random.normal(k1, (32, 64)) / 6, "w2": jax.random.normal(k2, (64, 32)) / 8}
    params = {k: jax.device_put(v, NamedSharding(mesh, spec[k])) for k, v in raw.items()}
    x = jax.device_put(jax.random.normal(k3, (64, 32)), NamedSharding(mesh, P("data", None)))
    return loss, params, x, spec


@pytest.mark.parametrize("mode", ["grad", "vjp", "all"])
def test_gradients_placed_like_their_arguments_in_every_mode(mode):
    loss, params, x, spec = _fsdp_tp()
    value, want = jax.value_and_grad(loss)(params, x)
    result = sowviz.inspect(loss, params, x, mode=mode).result
    grads = result[1] if mode == "grad" else result[-1][0]
    np.testing.assert_allclose(result[0], value, rtol=RTOL)
    _close(grads, want)
    assert {k: g.sharding.spec for k, g in grads.items()} == spec
    if mode != "grad":  # the batch's cotangent too
        assert result[-1][1].sharding.is_equivalent_to(x.sharding, x.ndim)


# --- finding 5: a jit's in_shardings place host arrays -------------------------------


def _input_shapes(d: dict) -> dict[str, str]:
    return {n["label"]: n["shapes"][0] for n in d["nodes"] if n["kind"] == "input"}


def test_jit_in_shardings_place_host_arrays_in_the_drawing():
    mesh = _auto_mesh((8,), ("data",))

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    rep, bat = NamedSharding(mesh, P()), NamedSharding(mesh, P("data", None))
    jloss = jax.jit(loss, in_shardings=(rep, bat))
    w = np.random.RandomState(0).randn(32, 16).astype(np.float32) / 6
    x = np.random.RandomState(1).randn(64, 32).astype(np.float32)

    host = sowviz.inspect(jloss, w, x)
    placed = sowviz.inspect(jloss, jax.device_put(w, rep), jax.device_put(x, bat))
    assert _input_shapes(host.to_dict()) == {"w": "float32[32,16]", "x": "float32[64@data,32]"}
    assert _input_shapes(placed.to_dict()) == _input_shapes(host.to_dict())
    value, grads = jax.value_and_grad(jloss)(w, x)
    host_grad = sowviz.inspect(jloss, w, x, mode="grad").result
    np.testing.assert_allclose(host_grad[0], value, rtol=RTOL)
    _close(host_grad[1], grads)
