"""Sharded programs read as sharded (round 12): a collective is drawn by the `jax.lax`
function the user called (`psum`, not JAX's `psum_invariant`; `psum_scatter`, not
`reduce_scatter`), and on an Auto mesh, whose types carry no sharding, the inputs show
the mesh axes their arrays lie along and a `with_sharding_constraint` the sharding it
asks for (`float32[64@data,64@model]`), as an Explicit mesh's types do."""

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
from sowviz import _compat

N = 8


def _mesh(shape: tuple[int, ...], names: tuple[str, ...], kind=AxisType.Auto):
    if len(jax.devices()) < N:
        pytest.skip(f"needs {N} devices (XLA_FLAGS=--xla_force_host_platform_device_count)")
    return jax.make_mesh(shape, names, axis_types=(kind,) * len(names))


def _labels(ins) -> set[str]:
    return {n.label for n in ins.graph.nodes}


def _shapes(ins, label: str) -> list[tuple[str, ...]]:
    return [n.shapes for n in ins.graph.nodes if n.label == label]


# --- 1. collectives by the names the user called -----------------------------------


@pytest.mark.parametrize("check_vma", [True, False])
def test_psum_in_shard_map_is_drawn_as_psum(check_vma):
    # under the default check_vma=True, `lax.psum` binds `psum_invariant` (JAX 0.10, 0.12)
    mesh = _mesh((N,), ("i",))

    def total(x):
        return jax.lax.psum(jnp.sum(x**2), "i")

    def loss(x):
        body = jax.shard_map(total, mesh=mesh, in_specs=P("i"), out_specs=P(), check_vma=check_vma)
        return body(x)

    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("i")))
    ins = sowviz.inspect(loss, x)
    labels = _labels(ins)
    assert "psum" in labels and "psum_invariant" not in labels
    (node,) = [n for n in ins.graph.nodes if n.label == "psum"]
    assert node.primitive == "psum"  # (the detail panel's row, and search, say it too)
    np.testing.assert_allclose(float(ins.result[0]), float(jnp.sum(jnp.arange(16.0) ** 2)))


def test_psum_scatter_is_drawn_as_psum_scatter():
    # `lax.psum_scatter` binds `reduce_scatter`, a name no `jax.lax` function has
    mesh = _mesh((N,), ("i",))

    def body(x):
        return jax.lax.psum_scatter(jnp.tile(x, N), "i", tiled=True)

    def f(x):
        return jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x)

    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("i")))
    ins = sowviz.inspect(f, x, mode="primal")
    labels = _labels(ins)
    assert "psum_scatter" in labels and "reduce_scatter" not in labels
    np.testing.assert_allclose(np.asarray(ins.result), np.asarray(jax.jit(f)(x)))
    # device k's block k of the tiled shards, summed over the devices: every shard's sum
    shard_sum = np.arange(16.0).reshape(N, -1).sum(axis=0)
    np.testing.assert_allclose(np.asarray(ins.result), np.tile(shard_sum, N))


def test_every_renamed_collective_is_named_by_a_jax_lax_function():
    for primitive, called in _compat.COLLECTIVE_CALLS.items():
        assert callable(getattr(jax.lax, called)), (primitive, called)


# --- 2. an Auto mesh's shardings ----------------------------------------------------


def _tensor_parallel(mesh):
    def f(w, x):
        h = jax.lax.with_sharding_constraint(x @ w, NamedSharding(mesh, P("data", "model")))
        g = jax.lax.with_sharding_constraint(jnp.tanh(h), NamedSharding(mesh, P(None, "model")))
        return jnp.mean(g**2)

    return f


def _placed(mesh):
    w = jax.device_put(jnp.ones((32, 64)) / 32, NamedSharding(mesh, P(None, "model")))
    x = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("data")))
    return w, x


def test_auto_mesh_inputs_show_where_their_arrays_lie():
    mesh = _mesh((4, 2), ("data", "model"))
    f = _tensor_parallel(mesh)
    w, x = _placed(mesh)
    ins = sowviz.inspect(f, w, x, mode="grad")
    assert _shapes(ins, "w") == [("float32[32,64@model]",)]
    assert _shapes(ins, "x") == [("float32[64@data,32]",)]
    # inside, an Auto mesh's shardings are XLA's choice: none invented
    assert _shapes(ins, "dot_general") == [("float32[64,64]",)]
    assert _shapes(ins, "tanh") == [("float32[64,64]",)]
    loss, grad = jax.jit(jax.value_and_grad(f))(w, x)
    np.testing.assert_allclose(float(ins.result[0]), float(loss), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ins.result[1]), np.asarray(grad), rtol=1e-5, atol=1e-8)


def test_a_sharding_constraint_says_the_sharding_it_asks_for():
    mesh = _mesh((4, 2), ("data", "model"))
    f = _tensor_parallel(mesh)
    ins = sowviz.inspect(f, *_placed(mesh))
    # two constraints of one shape were two identical `float32[64,64]` boxes
    assert sorted(_shapes(ins, "sharding_constraint")) == [
        ("float32[64,64@model]",),
        ("float32[64@data,64@model]",),
    ]
    np.testing.assert_allclose(float(ins.result[0]), float(jax.jit(f)(*_placed(mesh))), rtol=1e-5)


def test_a_constraint_s_unconstrained_and_combined_axes():
    mesh = _mesh((4, 2), ("data", "model"))

    def f(x):
        y = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(("data", "model"), None)))
        return jax.lax.with_sharding_constraint(
            y * 2, NamedSharding(mesh, P("data", P.UNCONSTRAINED))
        )

    x = jnp.arange(64.0).reshape(16, 4)
    ins = sowviz.inspect(f, x, mode="primal")
    assert sorted(_shapes(ins, "sharding_constraint")) == [
        ("float32[16@(data,model),4]",),
        ("float32[16@data,4]",),
    ]
    assert _shapes(ins, "x") == [("float32[16,4]",)]  # on one device: its type alone
    np.testing.assert_allclose(np.asarray(ins.result), 2 * np.asarray(x))


def test_the_same_program_redrawn_when_its_arguments_lie_elsewhere():
    # the graph is cached per argument type; an Auto mesh's placement is in no type, so
    # a stale graph would have drawn the first call's placement for the second
    mesh = _mesh((4, 2), ("data", "model"))
    f = _tensor_parallel(mesh)
    w, x = _placed(mesh)
    replicated = jax.device_put(w, NamedSharding(mesh, P()))
    first = sowviz.inspect(f, replicated, x)
    second = sowviz.inspect(f, w, x)
    assert _shapes(first, "w") == [("float32[32,64]",)]
    assert _shapes(second, "w") == [("float32[32,64@model]",)]
    np.testing.assert_allclose(float(first.result[0]), float(second.result[0]), rtol=1e-5)


def test_an_explicit_mesh_s_types_are_drawn_as_before():
    mesh = _mesh((4, 2), ("data", "model"), AxisType.Explicit)

    def f(w, x):
        h = jax.sharding.reshard(x @ w, NamedSharding(mesh, P("data", "model")))
        return jnp.mean(jnp.tanh(h) ** 2)

    w, x = _placed(mesh)
    ins = sowviz.inspect(f, w, x)
    assert _shapes(ins, "w") == [("float32[32,64@model]",)]
    assert _shapes(ins, "x") == [("float32[64@data,32]",)]
    assert _shapes(ins, "dot_general") == [("float32[64@data,64@model]",)]
    assert _shapes(ins, "reshard") == [("float32[64@data,64@model]",)]
    # (sharded sums: summed in another order than a plain run's)
    np.testing.assert_allclose(float(ins.result[0]), float(jax.jit(f)(w, x)), rtol=1e-5)
