"""A Monitor on a data-parallel CPU mesh (round 14, finding 1): its summaries run on one
device of the mesh (`capture.summaries.finish`), and what it records and returns is
what plain JAX and NumPy compute."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import sowviz
from sowviz.capture import summaries as _summaries

# activations of 64 x 512 (32K values: `MIN_GROUPED`) and 64 x 48
SIZES = (16, 512, 48, 1)
BATCH = 64

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 host devices")


def loss(params, x, y):
    h = x
    for p in params[:-1]:
        h = jax.nn.relu(h @ p["w"] + p["b"])
    return jnp.mean((h @ params[-1]["w"] + params[-1]["b"] - y) ** 2)


def _model():
    keys = jax.random.split(jax.random.PRNGKey(0), len(SIZES) + 1)
    params = [
        {"w": jax.random.normal(k, (a, b)) / np.sqrt(a), "b": 0.1 * jnp.ones(b)}
        for k, (a, b) in zip(keys, itertools.pairwise(SIZES), strict=False)
    ]
    x = jax.random.normal(keys[-2], (BATCH, SIZES[0]))
    y = jax.random.normal(keys[-1], (BATCH, 1))
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    split, whole = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    return jax.device_put(params, whole), jax.device_put(x, split), jax.device_put(y, split)


def _primals(mon, shape):
    """The recorded primal summaries of the probes of `shape` (the latest step's: a
    layer's line `h` and the `relu` inside it, one value)."""
    probes = [
        p["id"]
        for p in mon.to_dict(with_history=False)["probes"]
        if p["summaries"].get("primal", {}).get("shape") == list(shape)
    ]
    assert probes
    return [list(mon.history)[-1]["probes"][p]["primal"] for p in probes]


def test_a_mesh_step_is_summarised_on_one_device_and_matches_numpy(monkeypatch):
    params, x, y = _model()
    over_mesh = []  # calls of the second programs' jit, which runs where its inputs lie

    class Spy:
        def __init__(self, jitted):
            self.jitted = jitted
            self.lower = jitted.lower  # the one-device programs are compiled from it

        def __call__(self, *a, **k):
            over_mesh.append(1)
            return self.jitted(*a, **k)

    monkeypatch.setattr(_summaries, "_finish", Spy(_summaries._finish))
    mon = sowviz.Monitor(loss, every=1)
    value, grads = mon.step(params, x, y)
    mon.flush()
    assert over_mesh == []

    # what the step returns: plain JAX's, bit for bit
    want_value, want_grads = jax.jit(jax.value_and_grad(loss))(params, x, y)
    assert float(value) == float(want_value)
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
        assert g.sharding.is_equivalent_to(w.sharding, g.ndim)

    # what it records: the activations' statistics, computed here in float64
    h = np.asarray(x, np.float64)
    for p in params[:-1]:
        h = np.maximum(h @ np.asarray(p["w"], np.float64) + np.asarray(p["b"], np.float64), 0)
        for got in _primals(mon, h.shape):
            assert got["count"] == h.size and got["nan"] == 0
            assert got["zeros"] == np.count_nonzero(h == 0)
            np.testing.assert_allclose(got["max"], h.max(), rtol=1e-6)
            np.testing.assert_allclose(got["mean"], h.mean(), rtol=1e-5)
            np.testing.assert_allclose(got["std"], h.std(), rtol=1e-5)
            np.testing.assert_allclose(got["l2"], np.sqrt((h * h).sum()), rtol=1e-5)
            assert sum(got["hist"]["counts"]) == h.size
    mon.close()
