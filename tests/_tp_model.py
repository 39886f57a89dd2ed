"""The 2-D tensor-parallel `shard_map` MLP of the Monitor's fixed-cost work (issue 15),
shared by `tests/test_round18_perf.py` and `benchmarks/monitor_fixed_cost.py` (which
puts this folder on `sys.path`, as its other test-helper imports do).

A 4x2 mesh (``data``, ``model``) of host devices: the first layer's weight split over
``model`` by columns, the second's by rows (a `psum` over ``model``), the batch split
over ``data`` (a `psum` of the loss). Needs 8 devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8`` before JAX starts)."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

#: Batch and feature sizes: x is (BATCH, FEATURES), the hidden layer HIDDEN wide.
BATCH, FEATURES, HIDDEN = 16, 8, 16


def tp_mesh() -> Mesh:
    """The 4x2 (``data``, ``model``) mesh of the first 8 devices."""
    return Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))


def tp_model(mesh: Mesh) -> tuple[Any, dict[str, jax.Array], jax.Array]:
    """``(loss, params, x)``: ``loss(params, x)`` and its arguments placed on `mesh`."""

    @partial(
        jax.shard_map,
        mesh=mesh,
        in_specs=(P(None, "model"), P("model", None), P("data")),
        out_specs=P(),
    )
    def tp_loss(w1, w2, x):
        with jax.named_scope("up"):
            h = jnp.tanh(x @ w1)
        with jax.named_scope("down"):
            y = jax.lax.psum(h @ w2, "model")
        return jax.lax.psum(jnp.sum(y**2), "data") / (BATCH * FEATURES)

    def loss(params, x):
        return tp_loss(params["w1"], params["w2"], x)

    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {
        "w1": jax.device_put(
            jax.random.normal(k1, (FEATURES, HIDDEN)) / 3, NamedSharding(mesh, P(None, "model"))
        ),
        "w2": jax.device_put(
            jax.random.normal(k2, (HIDDEN, FEATURES)) / 4, NamedSharding(mesh, P("model", None))
        ),
    }
    x = jax.device_put(
        jax.random.normal(k3, (BATCH, FEATURES)), NamedSharding(mesh, P("data", None))
    )
    return loss, params, x


def np_loss(params: dict[str, Any], x: Any) -> float:
    """`tp_model`'s loss in float64 NumPy (no mesh, no collective)."""
    w1, w2, x = (np.asarray(a, np.float64) for a in (params["w1"], params["w2"], x))
    y = np.tanh(x @ w1) @ w2
    return float((y**2).sum() / (BATCH * FEATURES))
