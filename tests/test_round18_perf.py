"""The Monitor's fixed cost per recorded step (round 18, issue 15): on a CPU mesh a
recorded step's summaries run on one device of it and stay there (no `jax.device_put`
to one device and back at every step: each cost 0.4 ms of host work), the gather of a
step's parts takes every replicated part's own copy on that device
(`_compat.copy_on`, `_wire.gather`), and a recorded step makes no fresh running flag
(`Monitor._plain_chain`). What the Monitor returns and records is still plain JAX's
and NumPy's. (Speed itself is measured in `benchmarks/monitor_fixed_cost.py`.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tp_model import np_loss as _np_loss
from _tp_model import tp_mesh as _mesh
from _tp_model import tp_model as _tp_model
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import sowviz
from sowviz import _compat, _wire

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 host devices")


def test_copy_on_takes_a_replicated_arrays_own_copy_and_moves_a_split_one():
    mesh = _mesh()
    values = np.arange(32, dtype=np.float32).reshape(8, 4)
    whole = jax.device_put(values, NamedSharding(mesh, P()))
    for device in (jax.devices()[0], jax.devices()[5]):
        got = _compat.copy_on(whole, device)
        assert got.devices() == {device}
        np.testing.assert_array_equal(np.asarray(got), values)
    split = jax.device_put(values, NamedSharding(mesh, P("data", "model")))
    got = _compat.copy_on(split, jax.devices()[3])
    assert got.devices() == {jax.devices()[3]}
    np.testing.assert_array_equal(np.asarray(got), values)


def test_gather_reads_parts_of_a_mesh_and_of_one_of_its_devices_in_one_buffer():
    mesh = _mesh()
    a = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    b = np.array([True, False, True])
    c = np.arange(8, dtype=np.int32)
    tree = [
        jax.device_put(a, NamedSharding(mesh, P())),  # replicated over the mesh
        None,
        jax.device_put(b, jax.devices()[0]),  # one device of it
        jax.device_put(c, NamedSharding(mesh, P("data"))),  # split over the mesh
    ]
    buf, layout = _wire.gather(tree)
    assert buf.devices() == {jax.devices()[0]}
    got = _wire.split(np.asarray(buf), layout)
    assert got[1] is None
    for g, want in zip((got[0], got[2], got[3]), (a, b, c), strict=True):
        assert g.dtype == want.dtype
        np.testing.assert_array_equal(g, want)


def test_a_recorded_tp_mesh_step_moves_nothing_and_returns_and_records_plain_values(
    monkeypatch,
):
    loss, params, x = _tp_model(_mesh())
    plain = jax.jit(jax.value_and_grad(loss))
    mon = sowviz.Monitor(loss, every=1, history=64)
    mon.step(params, x)  # compiles (and places what the plain program places)
    mon.flush()

    puts = []
    real_put = jax.device_put

    def counted(*a, **k):
        puts.append(1)
        return real_put(*a, **k)

    monkeypatch.setattr(jax, "device_put", counted)
    want_losses = []
    p = params
    for _ in range(6):
        value, grads = mon.step(p, x)
        want_value, want_grads = plain(p, x)
        # (the instrumented program's: XLA fuses it otherwise, a float32 loss can differ
        # in its last bits; `exact=True` is bit for bit)
        np.testing.assert_allclose(float(value), float(want_value), rtol=1e-6)
        for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-7)
            assert g.sharding.is_equivalent_to(w.sharding, g.ndim)
        want_losses.append(_np_loss(p, x))
        p = jax.tree.map(lambda w, g: w - 0.1 * g, p, grads)
    mon.flush()
    monkeypatch.setattr(jax, "device_put", real_put)
    assert puts == []  # (were two per recorded step)

    entries = list(mon.history)[1:]
    assert [e["step"] for e in entries] == list(range(1, 7))
    np.testing.assert_allclose([e["loss"] for e in entries], want_losses, rtol=1e-5)
    # the last step's activations, as NumPy computes them: the `up` stage's tanh (its
    # arguments: the 6th step's, the update undone)
    prev = jax.tree.map(lambda w, g: w + 0.1 * g, p, grads)
    h = np.tanh(np.asarray(x, np.float64) @ np.asarray(prev["w1"], np.float64))
    last = entries[-1]["probes"]
    stats = [
        s["primal"]
        for s in last.values()
        if s.get("primal")
        and s["primal"]["count"] == h.size
        and abs(s["primal"]["max"] - h.max()) < 1e-6
    ]
    assert stats
    np.testing.assert_allclose(stats[0]["min"], h.min(), rtol=1e-5)
    np.testing.assert_allclose(stats[0]["mean"], h.mean(), rtol=1e-5)
    np.testing.assert_allclose(stats[0]["l2"], np.sqrt((h * h).sum()), rtol=1e-5)
    mon.close()


def test_a_nan_on_a_tp_mesh_is_found_at_its_step():
    loss, params, x = _tp_model(_mesh())
    mon = sowviz.Monitor(loss, every=1)
    bad = x.at[3, 2].set(jnp.nan)
    with pytest.warns(sowviz.NonFiniteWarning):
        for step in range(5):
            mon.step(params, bad if step == 3 else x)
        mon.flush()
    assert mon.nonfinite is not None and mon.nonfinite.step == 3
    assert mon.history.nonfinite.ranges == [[3, 3]]
    mon.close()


def test_recorded_steps_hand_the_plain_program_one_start_flag():
    mon = sowviz.Monitor(lambda w: jnp.sum(w**2), every=1)
    first = mon._plain_chain()
    mon.step(jnp.ones(3))
    mon.step(jnp.ones(3))
    assert mon._plain_chain() is first
    np.testing.assert_array_equal(np.asarray(first), [0, -1, 0])
