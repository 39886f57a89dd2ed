"""The Monitor's read on a CPU mesh (round 19, issue 15): a read of recorded steps
gathers their parts on ONE device even when its summaries are uncommitted there (they
come out of their program so; the gather, left to `jax.jit`, moved them onto the mesh
and ran over its 8 devices), and the 2-D tensor-parallel model the tests and
`benchmarks/monitor_fixed_cost.py` share (`tests/_tp_model.py`) is the NumPy model.
(Speed itself is measured in `benchmarks/monitor_fixed_cost.py --wire`.)"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tp_model import BATCH, FEATURES, np_loss, tp_mesh, tp_model
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import sowviz
from sowviz import _wire
from sowviz.capture import summaries

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 host devices")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _np_grads(params, x) -> dict[str, np.ndarray]:
    """`tp_model`'s gradients by hand in float64: y = tanh(x w1) w2, L = sum(y**2) / n."""
    w1, w2, x = (np.asarray(a, np.float64) for a in (params["w1"], params["w2"], x))
    h = np.tanh(x @ w1)
    y = h @ w2
    dy = 2 * y / (BATCH * FEATURES)
    dz = (dy @ w2.T) * (1 - h * h)
    return {"w1": x.T @ dz, "w2": h.T @ dy}


def test_the_shared_tp_model_is_the_numpy_model():
    mesh = tp_mesh()
    loss, params, x = tp_model(mesh)
    assert params["w1"].sharding.spec == P(None, "model")
    assert x.sharding.spec == P("data", None)
    value, grads = jax.jit(jax.value_and_grad(loss))(params, x)
    np.testing.assert_allclose(float(value), np_loss(params, x), rtol=1e-5)
    want = _np_grads(params, x)
    for k in ("w1", "w2"):
        np.testing.assert_allclose(np.asarray(grads[k]), want[k], rtol=1e-4, atol=1e-6)


def test_an_uncommitted_part_beside_mesh_parts_is_gathered_on_its_own_device():
    mesh = tp_mesh()
    summary = jnp.arange(12, dtype=jnp.uint32)  # as a second program leaves it
    assert not summary.committed and summary.devices() == {jax.devices()[0]}
    flags = np.array([True, False])
    loss = np.float32(0.75)
    tree = [
        summary,
        None,
        jax.device_put(flags, NamedSharding(mesh, P())),
        jax.device_put(loss, NamedSharding(mesh, P())),
    ]
    assert _wire._one_of(_wire._leaves(tree)[0]) == jax.devices()[0]
    buf, layout = _wire.gather(tree)
    assert buf.devices() == {jax.devices()[0]}  # (was the mesh's 8)
    got = _wire.split(np.asarray(buf), layout)
    assert got[1] is None
    np.testing.assert_array_equal(got[0], np.arange(12, dtype=np.uint32))
    np.testing.assert_array_equal(got[2], flags)
    assert got[3].dtype == np.float32 and got[3] == loss


def test_a_committed_part_still_names_the_device_and_one_placement_needs_none():
    mesh = tp_mesh()
    third = jax.devices()[3]
    on_mesh = jax.device_put(np.ones(4, np.float32), NamedSharding(mesh, P()))
    loose = jnp.zeros(3)  # uncommitted, on the first device
    pinned = jax.device_put(np.arange(3, dtype=np.int32), third)
    assert _wire._one_of([loose, on_mesh, pinned]) == third
    buf, layout = _wire.gather([loose, on_mesh, pinned])
    assert buf.devices() == {third}
    got = _wire.split(np.asarray(buf), layout)
    np.testing.assert_array_equal(got[2], np.arange(3))
    # nothing on several devices: no move (the gather runs where jit puts it)
    assert _wire._one_of([loose, pinned]) is None
    assert _wire._one_of([on_mesh, None]) is None


def test_a_tp_monitors_reads_gather_on_one_device_and_record_numpys_values(monkeypatch):
    loss, params, x = tp_model(tp_mesh())
    placed = []
    real = _wire.gather

    def spy(tree):
        buf, layout = real(tree)
        placed.append(len(buf.devices()))
        return buf, layout

    monkeypatch.setattr(_wire, "gather", spy)
    mon = sowviz.Monitor(loss, every=1, history=64)
    p, want = params, []
    for _ in range(7):
        value, grads = mon.step(p, x)
        want.append(np_loss(p, x))
        np.testing.assert_allclose(float(value), want[-1], rtol=1e-5)
        for k, g in _np_grads(p, x).items():
            np.testing.assert_allclose(np.asarray(grads[k]), g, rtol=1e-4, atol=1e-6)
        p = jax.tree.map(lambda w, g: w - 0.1 * g, p, grads)
    mon.flush()
    assert placed and set(placed) == {1}  # every read's buffer on one device
    entries = list(mon.history)
    assert [e["step"] for e in entries] == list(range(7))
    np.testing.assert_allclose([e["loss"] for e in entries], want, rtol=1e-5)
    mon.close()


def test_the_fixed_cost_benchmark_runs_the_tests_tp_model_from_a_checkout():
    # as the README runs benchmarks: `python benchmarks/<name>.py` from the checkout
    code = (
        "import sys, json; sys.argv = ['monitor_fixed_cost.py']; "
        "sys.path.insert(0, 'benchmarks'); import monitor_fixed_cost as m; "
        "loss, (params, x) = m.tp_case(); "
        "print(json.dumps([m.tp_model.__module__, sys.modules[m.tp_model.__module__].__file__, "
        "float(loss(params, x))]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    module, path, value = json.loads(out.stdout.strip().splitlines()[-1])
    assert module == "_tp_model"
    assert pathlib.Path(path).resolve() == ROOT / "tests" / "_tp_model.py"
    _, params, x = tp_model(tp_mesh())  # the same seeds: the same arguments
    np.testing.assert_allclose(value, np_loss(params, x), rtol=1e-5)


def test_arrays_split_every_way_are_gathered_whole_by_one_collective():
    mesh = tp_mesh()
    rng = np.random.default_rng(0)
    cases = [
        (rng.normal(size=(4, 2, 4, 8)).astype(np.float32), P("data", "model")),
        (rng.normal(size=(8, 16)).astype(np.float32), P(None, "model")),
        (rng.normal(size=(2, 6, 4)).astype(np.float32), P("model", None, "data")),
        (np.arange(16, dtype=np.int32), P(("data", "model"))),
        (rng.normal(size=(8, 3)) > 0, P("data")),
        (rng.normal(size=(4, 4)).astype(np.float32), P("model", "data")),
    ]
    xs = [jax.device_put(a, NamedSharding(mesh, spec)) for a, spec in cases]
    pending = (tuple(xs),)
    specs = summaries._gathered_specs(mesh, pending)
    assert all(s is not None for s in specs)
    program = jax.jit(lambda *a: summaries._gather_once(mesh, list(a), list(specs)))
    text = program.lower(*xs).compile().as_text()
    assert text.count("all-gather(") == 1  # (was one per array)
    for got, (want, _) in zip(program(*xs), cases, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got), want)


def test_only_small_evenly_split_arrays_of_the_mesh_are_gathered_at_once():
    mesh = tp_mesh()

    def put(n, spec, on=mesh):
        return jax.device_put(np.ones(n, np.float32), NamedSharding(on, spec))

    whole, split, other_split = put(8, P()), put(8, P("data")), put(16, P("model"))
    big = put(summaries.GATHER_ONCE_MAX_ELEMENTS * 2, P("data"))
    specs = summaries._gathered_specs(mesh, (whole, split, big, other_split))
    assert specs[0] is None and specs[2] is None  # replicated; large (a constraint each)
    assert specs[1] == (P("data"), (8,), np.dtype(np.float32))
    assert specs[3] == (P("model"), (16,), np.dtype(np.float32))
    # one small split array alone: its own constraint is one collective already
    assert summaries._gathered_specs(mesh, (whole, split, big)) == (None,) * 3
    other = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    elsewhere = put(8, P("data"), other)
    assert summaries._gathered_specs(mesh, (elsewhere, split, other_split))[0] is None
