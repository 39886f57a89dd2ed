"""Monitor: exact results for every batch shape, non-finite detection on every step,
threads, sinks, and a whole run held in bounded memory."""

from __future__ import annotations

import functools
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz._history import History
from sowviz.monitor import NonFiniteError

W = {"w1": jax.random.normal(jax.random.PRNGKey(0), (5, 8)) / 2, "w2": jnp.ones((8,)) / 3}


def batch(n, seed=1):
    return jax.random.normal(jax.random.PRNGKey(seed), (n, 5))


def counted():
    calls = []

    def loss(p, x):
        calls.append(x.shape)
        with jax.named_scope("hidden"):
            h = jnp.tanh(x @ p["w1"])
        return jnp.mean((h @ p["w2"]) ** 2)  # the mean divides by the batch size

    return loss, calls


def stepped(xs):
    """A Monitor of `counted()`'s loss after a step on W with each batch, flushed."""
    loss, _ = counted()
    mon = sowviz.Monitor(loss)
    for x in xs:
        mon.step(W, x)
    mon.flush()
    return mon


@pytest.mark.parametrize("every", [1, 2])
def test_each_batch_shape_gets_its_own_program(every):
    loss, calls = counted()
    mon = sowviz.Monitor(loss, every=every)
    for i, n in enumerate((32, 7, 32, 7)):
        x = batch(n, seed=i)
        value, grads = mon.step(W, x)
        ref_value, ref_grads = jax.value_and_grad(loss)(W, x)
        np.testing.assert_allclose(value, ref_value, rtol=1e-6)
        for k in W:
            np.testing.assert_allclose(grads[k], ref_grads[k], rtol=1e-5, atol=1e-8)
    # two shapes, two traces by the Monitor (plus one per reference call)
    assert len([c for c in calls if c is not None]) == 2 + 4
    mon.flush()
    assert [e["step"] for e in mon.history] == list(range(0, 4, every))


def test_one_monitor_stepped_from_two_threads():
    loss, _ = counted()
    mon = sowviz.Monitor(loss)
    x = batch(16)
    ref_value, _ = jax.value_and_grad(loss)(W, x)
    errors, values = [], []

    def work():
        try:
            for _ in range(10):
                values.append(float(mon.step(W, x)[0]))
        except Exception as err:  # pragma: no cover - the assertion below shows it
            errors.append(err)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    mon.flush()
    assert errors == []
    assert values == pytest.approx([float(ref_value)] * 20, rel=1e-6)
    assert mon.steps == 20 and [e["step"] for e in mon.history] == list(range(20))


# --- non-finite values, on every step ---------------------------------------------------


def norm_loss(p, x):
    with jax.named_scope("body"):
        h = jnp.tanh(x @ p["w1"])
    # finite value, NaN gradient of `reg` where it is all zeros (d‖w‖/dw at 0)
    return jnp.mean(h**2) + 1e-3 * jnp.linalg.norm(p["reg"])


def params_at(step, bad_step):
    reg = jnp.zeros(3) if step == bad_step else jnp.ones(3)
    return {"w1": W["w1"], "reg": reg}


@pytest.mark.parametrize("every", [1, 4])
def test_parameter_gradient_only_nan_is_caught_on_an_unrecorded_step(every):
    mon = sowviz.Monitor(norm_loss, every=every)
    for step in range(12):
        p = params_at(step, bad_step=5)
        value, grads = mon.step(p, batch(4))
        assert np.isfinite(value)
        assert np.isfinite(grads["reg"]).all() == (step != 5)
    mon.flush()
    assert mon.nonfinite is not None and mon.nonfinite.step == 5
    assert "backward" in mon.nonfinite.message, mon.nonfinite.message  # as inspect says it
    bad = [e for e in mon.history if e.get("finite") is False]
    assert [e["step"] for e in bad] == [5]  # re-run with the probes when unrecorded


@pytest.mark.parametrize("every", [1, 4])
def test_the_first_nonfinite_step_is_warned_once_where_the_user_steps(every):
    # A script's user sees nothing else (no widget): said once, naming the step and
    # where it was born, at the user's own line.
    mon = sowviz.Monitor(norm_loss, every=every)
    with pytest.warns(sowviz.NonFiniteWarning) as caught:
        for step in range(12):
            mon.step(params_at(step, bad_step=5 if step < 8 else 9), batch(4))
        mon.flush()
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "step 5" in text and "`sqrt`" in text and "stop_on_nonfinite=True" in text
    # which gradient an update would have applied: `reg`'s, not `w1`'s
    assert text.count("non-finite gradient of `parameters/reg`.") == 1 and "w1" not in text
    assert caught[0].filename == __file__


def test_stop_on_nonfinite_raises_and_does_not_warn():
    mon = sowviz.Monitor(norm_loss, stop_on_nonfinite=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sowviz.NonFiniteWarning)
        with pytest.raises(NonFiniteError, match="step 5"):
            for step in range(8):
                mon.step(params_at(step, bad_step=5), batch(4))


def test_a_closed_monitor_refuses_steps_that_its_logs_would_miss(tmp_path):
    loss, _ = counted()
    mon = sowviz.Monitor(loss, log_dir=tmp_path / "log")
    mon.step(W, batch(3))
    mon.close()
    with pytest.raises(RuntimeError, match="this Monitor is closed"):
        mon.step(W, batch(3))
    assert [e["step"] for e in sowviz.load(tmp_path / "log").history] == [0]


@pytest.mark.parametrize("every", [1, 4])
def test_stop_on_nonfinite_raises_at_the_exact_step(every):
    mon = sowviz.Monitor(norm_loss, every=every, stop_on_nonfinite=True)
    applied = []
    with pytest.raises(NonFiniteError, match="step 5"):
        for step in range(12):
            mon.step(params_at(step, bad_step=5), batch(4))
            applied.append(step)  # the caller's update
    assert applied == [0, 1, 2, 3, 4]  # step 5's update is never applied
    assert mon.nonfinite.step == 5


def test_sqrt_at_zero_in_a_parameter_gradient():
    def f(p, x):
        return jnp.sum(jnp.sqrt(p["s"])) + jnp.mean(x)

    mon = sowviz.Monitor(f, every=3)
    for step in range(6):
        mon.step({"s": jnp.zeros(2) if step == 4 else jnp.ones(2)}, batch(2))
    mon.flush()
    assert mon.nonfinite is not None and mon.nonfinite.step == 4


# --- sinks and memory -------------------------------------------------------------------


class FakeSink:
    def __init__(self, fail=False):
        self.fail, self.opened, self.entries, self.closed = fail, [], [], False

    def open(self, model):
        self.opened.append(model["schema"])

    def write(self, entry):
        if self.fail:
            raise OSError("disk full")
        self.entries.append(entry)

    def close(self):
        self.closed = True


def test_sinks_get_the_model_once_every_recorded_step_and_a_failure_never_stops(monkeypatch):
    import sowviz.runlog

    good, bad = FakeSink(), FakeSink(fail=True)
    seen = {}

    def make_sinks(log_dir, *, tensorboard=False, wandb=False):
        seen.update(log_dir=log_dir, tensorboard=tensorboard, wandb=wandb)
        return [good, bad]

    monkeypatch.setattr(sowviz.runlog, "make_sinks", make_sinks)
    loss, _ = counted()
    mon = sowviz.Monitor(loss, every=2, log_dir="runs/x", tensorboard=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(7):
            mon.step(W, batch(3))
        mon.close()
    assert seen == {"log_dir": "runs/x", "tensorboard": True, "wandb": False}
    assert good.opened == ["sowviz/1"] and good.closed and bad.closed
    assert [e["step"] for e in good.entries] == [0, 2, 4, 6]
    assert good.entries == list(mon.history)
    assert len([w for w in caught if "FakeSink.write failed" in str(w.message)]) == 1


def test_a_batch_of_another_shape_gives_the_sinks_its_model(tmp_path):
    # The run log's model says the shapes of the steps it holds last, as `to_dict()`
    # does (a smaller last batch said "[32, 5]" beside a summary of 4 rows).
    loss, _ = counted()
    mon = sowviz.Monitor(loss, log_dir=tmp_path / "log")
    mon.step(W, batch(32))
    mon.step(W, batch(4))
    mon.close()
    model = sowviz.load(tmp_path / "log").model
    (node,) = [n for n in model["nodes"] if n["label"] == "hidden"]
    assert node["shapes"] == ["float32[4,8]"]
    want = mon.to_dict()
    assert [n["shapes"] for n in model["nodes"]] == [n["shapes"] for n in want["nodes"]]


def test_each_step_says_the_program_whose_shapes_it_ran(tmp_path):
    # A ragged last batch: the model's graph is the last program's, and the steps
    # before it ran another; each step names its own program, whose node shapes and
    # probe shapes and sizes the model keeps (a 32-row step was described as
    # "float32[4,8] · 32 values" beside a table counting 256).
    loss, _ = counted()
    mon = sowviz.Monitor(loss, log_dir=tmp_path / "log")
    for n in (32, 32, 4, 32):
        mon.step(W, batch(n))
    mon.close()
    for model in (mon.to_dict(), sowviz.load(tmp_path / "log").model):
        hist, programs = model["history"], model["programs"]
        assert hist["program"] == [0, 0, 1, 0]  # one program per set of shapes
        assert len(programs) == 2
        (node,) = [n["id"] for n in model["nodes"] if n["label"] == "hidden"]
        (probe,) = [p["id"] for p in model["probes"] if p["node"] == node]
        for i, n in enumerate((32, 32, 4, 32)):
            program = programs[hist["program"][i]]
            assert program["nodes"][node] == [f"float32[{n},8]"]
            assert program["probes"][probe] == {"shape": [n, 8], "size": n * 8}
            assert hist["probes"][probe]["primal"][i]["count"] == n * 8
    entries = sowviz.runlog.LogReader(tmp_path / "log").read()
    assert [e["program"] for e in entries] == [0, 0, 1, 0]


def test_a_history_of_entries_without_a_program_says_none():
    h = History(10)
    h.add({"step": 0, "loss": 1.0, "probes": {}})
    assert h.to_dict(None)["program"] == [None]


def test_a_train_step_in_mode_primal_charts_the_one_number_it_returns():
    def train_step(w, x):
        loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
        return w - 0.1 * g, jnp.int32(7), loss  # (params, a step count, the loss)

    mon = sowviz.Monitor(train_step, mode="primal")
    w, x = jnp.ones((5, 1)), batch(8)
    want = []
    for _ in range(3):
        want.append(float(jnp.mean((x @ w) ** 2)))
        w, _, _ = mon.step(w, x)
    mon.flush()
    np.testing.assert_allclose([e["loss"] for e in mon.history], want, rtol=1e-6)


def test_history_thinning_keeps_the_start_in_bounded_memory():
    h = History(64)
    for step in range(20_000):
        h.add({"step": step, "loss": 0.0, "probes": {}})
        assert len(h) <= 64
    steps = h.steps
    assert steps[0] == 0 and steps[-32:] == list(range(20_000 - 32, 20_000))
    gaps = np.diff(steps[:-32])
    assert (np.diff(gaps) >= 0).all()  # older steps are thinned at least as much


def test_a_long_run_keeps_step_0_in_bounded_memory():
    def tiny(w, x):
        return jnp.sum((x * w) ** 2)

    mon = sowviz.Monitor(tiny, history=32)
    w, x = jnp.ones(2), jnp.ones(2)
    for _ in range(20_000):
        mon.step(w, x)
    mon.flush()
    assert len(mon.history) <= 32 and mon.history[0]["step"] == 0
    assert mon.history[-1]["step"] == 19_999


def test_only_the_latest_step_keeps_its_full_probes():
    # The history keeps each step's chart fields; the full summaries (and their rows
    # on the host) only while the step is the latest, which the model draws.
    xs = [batch(16, seed=s) for s in range(3)]
    mon = stepped(xs)
    model = mon.to_dict()
    lazy = mon.history._raw()  # the recorded steps, as kept
    assert [e.step for e in lazy] == [0, 1, 2]
    assert [e._probes is None for e in lazy] == [True, True, False]
    entries = list(mon.history)
    (probe,) = [p for p in model["probes"] if p["name"] == "hidden"]
    for entry, x in zip(entries, xs, strict=True):
        h = np.tanh(np.asarray(x @ W["w1"], np.float64))
        np.testing.assert_allclose(
            entry["probes"][probe["id"]]["primal"]["mean"], h.mean(), rtol=1e-5
        )
    latest = probe["summaries"]["primal"]
    np.testing.assert_allclose(latest["mean"], h.mean(), rtol=1e-5)
    assert latest["loghist"]["counts"] and sum(latest["hist"]["counts"]) == h.size


def test_flush_reads_every_step_in_flight():
    # Steps wait on the device to be read in batches: flush() must record every
    # pending step and check every pending finite flag.
    loss, _ = counted()
    mon = sowviz.Monitor(loss)
    for _ in range(3):
        mon.step(W, batch(3))
    mon.flush()
    assert [e["step"] for e in mon.history] == [0, 1, 2]

    def f(p, x):
        return jnp.sum(jnp.sqrt(p["s"])) + jnp.mean(x)

    mon = sowviz.Monitor(f, every=10)
    for step in range(4):  # step 2 (unrecorded) has an infinite gradient
        mon.step({"s": jnp.zeros(2) if step == 2 else jnp.ones(2)}, batch(2))
    mon.flush()
    assert mon.nonfinite is not None and mon.nonfinite.step == 2


class _CountingNumpy:
    """numpy, counting `asarray` (the Monitor's device→host reads of flags). An
    unrecorded step's loss, a scalar, is not counted: its copy to the host starts at
    its step (`Monitor._keep_loss`, off a CPU), and it is taken with the flag's read."""

    def __init__(self):
        self.reads = 0

    def asarray(self, *a, **k):
        self.reads += np.ndim(a[0]) > 0
        return np.asarray(*a, **k)

    def __getattr__(self, name):
        return getattr(np, name)


@pytest.mark.parametrize("bad", [None, 13])
def test_unrecorded_steps_share_one_read_of_the_running_flag(monkeypatch, bad):
    # A device read is a round trip (~200 µs on a GPU): unrecorded steps must not read
    # one each. The running flag still names the exact first non-finite step.
    import sowviz.monitor as m

    counting = _CountingNumpy()
    monkeypatch.setattr(m, "np", counting)

    def f(p, x):
        return jnp.sum(jnp.sqrt(p["s"])) + jnp.mean(x)

    mon = sowviz.Monitor(f, every=1000)  # step 0 recorded, the rest plain
    steps = 40
    for step in range(steps):
        mon.step({"s": jnp.zeros(2) if step == bad else jnp.ones(2)}, batch(2))
    reads = counting.reads
    mon.flush()
    # one read per _FLAG_BATCH unrecorded steps, not one per step (step 0's record is
    # read at flush)
    assert reads <= -(-(steps - 1) // m._FLAG_BATCH) and reads * 3 <= steps
    if bad is None:
        assert mon.nonfinite is None
    else:
        assert mon.nonfinite is not None and mon.nonfinite.step == bad
        assert mon.nonfinite.origins is not None and mon.nonfinite.origins.located


def test_recorded_steps_share_one_transfer(monkeypatch):
    # Their summary buffers, flags and losses travel together: one read per batch of
    # pending steps (each read is a round trip, ~200 µs on a GPU), not one per array.
    import sowviz.monitor as m

    reads = []
    real = m._wire.split
    monkeypatch.setattr(m._wire, "split", lambda h, lay: reads.append(1) or real(h, lay))
    get, real_get = [], jax.device_get

    def device_get(tree):
        if any(isinstance(v, jax.Array) for v in jax.tree_util.tree_leaves(tree)):
            get.append(tree)
        return real_get(tree)

    monkeypatch.setattr(jax, "device_get", device_get)
    xs = [batch(6, seed=i) for i in range(12)]
    mon = stepped(xs)
    assert get == [] and len(reads) <= -(-12 // (m._MAX_PENDING + 1)) + 1 and len(reads) <= 4
    assert [e["step"] for e in mon.history] == list(range(12))
    loss, _ = counted()
    for e, x in zip(mon.history, xs, strict=True):
        ref_value, _ = jax.value_and_grad(loss)(W, x)
        np.testing.assert_allclose(e["loss"], ref_value, rtol=1e-6)


def test_rare_recorded_steps_reach_the_history_after_throttle_seconds():
    # Batched reads must not hold a rare recorded step back until more arrive: once the
    # oldest has waited `throttle` seconds, the next step reads it.
    loss, _ = counted()
    slow = sowviz.Monitor(loss, every=1000, throttle=0.0)
    batched = sowviz.Monitor(loss, every=1, throttle=3600.0)
    for _ in range(3):
        slow.step(W, batch(4))
        batched.step(W, batch(4))
    assert not slow._pending  # read by the next step, without a flush
    assert [e["step"] for e in slow.history] == [0]
    assert len(batched._pending) == 3  # 3 steps wait for a batch (or a read) ...
    assert [e["step"] for e in batched.history] == [0, 1, 2]  # ... which reading is


def test_a_monitor_summarises_mid_sized_arrays_in_blocks_and_inspect_in_its_layout(monkeypatch):
    # On a CPU a Monitor's program runs at every step: its arrays of 32K-64K elements
    # are summarised in blocks (faster per step). inspect pays every compile at its
    # first call: they stay in the shared layout. Both summaries are NumPy's.
    from sowviz.capture import api, summaries

    if jax.default_backend() != "cpu":
        pytest.skip("blocks are used on a CPU backend")
    n = (summaries.MIN_GROUPED + summaries.MIN_GROUPED_ONCE) // 2
    assert summaries.MIN_GROUPED <= n < summaries.MIN_GROUPED_ONCE
    seen = []
    real = api.summarize_packed

    def spy(*args, **kwargs):
        packed = real(*args, **kwargs)
        seen.append({type(p).__name__ for p in packed.pending})
        return packed

    monkeypatch.setattr(api, "summarize_packed", spy)
    x = jax.random.normal(jax.random.PRNGKey(3), (n,))

    def loss(x):
        return jnp.sum(sowviz.sow(jnp.sin(x), "s") ** 2)

    probe = sowviz.inspect(loss, x).probe("s")
    assert "Blocks" not in seen[-1]
    mon = sowviz.Monitor(loss)
    mon.step(x)
    mon.flush()
    assert "Blocks" in seen[-1]
    s = np.sin(np.asarray(x, np.float64))
    for where, summary in (
        ("inspect", probe.summaries),
        ("Monitor", mon.history[0]["probes"][probe.id]),
    ):
        for mode, ref in (("primal", s), ("cotangent", 2 * s)):
            got = summary[mode]
            assert got["count"] == n, where
            np.testing.assert_allclose([got["min"], got["max"]], [ref.min(), ref.max()], rtol=1e-6)
            np.testing.assert_allclose(
                [got["mean"], got["std"]], [ref.mean(), ref.std()], atol=1e-6
            )
            edges = np.asarray(got["hist"]["edges"], np.float32)
            counts, _ = np.histogram(ref.astype(np.float32), edges)
            np.testing.assert_array_equal(got["hist"]["counts"], counts, err_msg=where)


@pytest.mark.parametrize("every", [1, 3])
def test_gradients_are_placed_like_their_parameters_as_under_jit(every):
    # Data parallelism: replicated parameters, a batch split over 8 devices. jit returns
    # replicated gradients; the instrumented program, partitioned with its probes as
    # outputs too, returned them split over the batch's axis, so an optimiser's update
    # moved the parameters there and every later step compiled again.
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = jax.device_put(
        {"w": jax.random.normal(k1, (4, 16)) / 2, "b": jnp.zeros(16), "v": jnp.ones((16, 1))}, rep
    )
    x = jax.device_put(jax.random.normal(k2, (32, 4)), rows)
    y = jax.device_put(jnp.sum(x, axis=1, keepdims=True), rows)

    def loss(p, x, y):
        with jax.named_scope("hidden"):
            h = jnp.tanh(x @ p["w"] + p["b"])
        return jnp.mean((h @ p["v"] - y) ** 2)

    ref = jax.jit(jax.value_and_grad(loss))
    mon = sowviz.Monitor(loss, every=every)
    for _ in range(4):
        value, grads = mon.step(params, x, y)
        want, want_grads = ref(params, x, y)
        np.testing.assert_allclose(value, want, rtol=1e-6)
        for k, g in grads.items():
            np.testing.assert_allclose(g, want_grads[k], rtol=1e-5, atol=1e-7)
            assert g.sharding.is_equivalent_to(want_grads[k].sharding, g.ndim), k
            assert g.sharding.is_equivalent_to(params[k].sharding, g.ndim), k
        params = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    mon.flush()
    # the report says where the steps ran, as `inspect` says it: all 8 devices
    assert mon.to_dict()["device"] == sowviz.inspect(loss, params, x, y).to_dict()["device"]
    assert "+7 more" in mon.to_dict()["device"]
    mon.close()


def test_unrecorded_steps_are_bit_for_bit_jit_value_and_grad():
    # The README's promise: a Monitor's unrecorded steps run the plain program, equal to
    # `jax.jit(jax.value_and_grad(fn))` to the last bit for a pytree of arrays.
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {
        "w1": jax.random.normal(k1, (8, 64)) / 3,
        "b1": jnp.zeros(64),
        "w2": jax.random.normal(k2, (64, 1)) / 8,
    }

    def loss(p, x, y):
        with jax.named_scope("hidden"):
            h = jax.nn.gelu(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    ref = jax.jit(jax.value_and_grad(loss))
    mon = sowviz.Monitor(loss, every=4)
    for step in range(6):
        x = jax.random.normal(jax.random.fold_in(k3, step), (32, 8))
        y = jnp.sin(x[:, :1])
        value, grads = mon.step(params, x, y)
        want, want_grads = ref(params, x, y)
        if step % 4:  # unrecorded
            np.testing.assert_array_equal(value, want)
            for k in grads:
                np.testing.assert_array_equal(grads[k], want_grads[k], err_msg=k)
        params = jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, params, grads)
    mon.close()


def test_a_resumed_run_numbers_its_steps_from_start_step(tmp_path):
    # A run resumed from a checkpoint at step 5000 logs steps 5000, 5005, ... (they
    # restarted at 0, writing over the first run's numbers in a shared TensorBoard)
    mon = sowviz.Monitor(norm_loss, every=5, start_step=5000, log_dir=tmp_path / "log")
    for k in range(12):
        mon.step(params_at(k, bad_step=7), batch(4))
    mon.close()
    assert [e["step"] for e in mon.history] == [5000, 5005, 5007, 5010]
    assert mon.nonfinite.step == 5007 and mon.steps == 5012
    assert [e["step"] for e in sowviz.load(tmp_path / "log").history] == [5000, 5005, 5007, 5010]
    with pytest.raises(ValueError, match="`start_step` must be an int ≥ 0"):
        sowviz.Monitor(norm_loss, start_step=-1)


# --- Ctrl-C inside a step ------------------------------------------------------------------
# A KeyboardInterrupt can land anywhere in `Monitor.step`; mostly in a device→host read.
# Caught (a notebook cell interrupted, then run again), the same Monitor goes on, and no
# step it ran is lost or recorded twice: an interrupted read or record is completed by
# the next call. Injected by patching (deterministic), as a signal would land.


class _InterruptOnce:
    """Wraps `real`: its `at`-th call raises KeyboardInterrupt instead."""

    def __init__(self, real, at):
        self.real, self.at, self.calls = real, at, 0

    def __call__(self, *a, **k):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return self.real(*a, **k)


def _steps_with_one_interrupt(mon, xs):
    """Step on each batch; the step that raises KeyboardInterrupt ran (its number is
    used) but returned nothing. Returns the step numbers whose results were returned."""
    returned, interrupted = [], []
    for x in xs:
        n = mon.steps
        try:
            mon.step(W, x)
            returned.append(n)
        except KeyboardInterrupt:
            interrupted.append(n)
    assert len(interrupted) == 1
    return returned, interrupted[0]


def test_a_ctrl_c_in_the_summaries_read_loses_no_step(monkeypatch, tmp_path):
    # One read took steps off the queue before reading them: a Ctrl-C in the read
    # lost 5 steps (4 returned to the user) from the history, the run log and TensorBoard.
    import sowviz.monitor as m

    loss, _ = counted()
    xs = [batch(4, seed=i) for i in range(14)]
    mon = sowviz.Monitor(loss, throttle=3600.0, log_dir=tmp_path / "log")
    monkeypatch.setattr(m._wire, "split", _InterruptOnce(m._wire.split, at=2))
    returned, cut = _steps_with_one_interrupt(mon, xs)
    mon.close()
    assert cut == 9 and mon.steps == len(xs)  # the 2nd read: steps 5-9
    want = [float(jax.value_and_grad(loss)(W, x)[0]) for x in xs]
    for entries in (list(mon.history), sowviz.load(tmp_path / "log").history):
        # every step that ran, once, in order (the interrupted one too: it ran)
        assert [e["step"] for e in entries] == list(range(len(xs)))
        np.testing.assert_allclose([e["loss"] for e in entries], want, rtol=1e-6)
    assert set(returned) < {e["step"] for e in mon.history}


def test_a_ctrl_c_while_a_sink_takes_a_step_loses_and_repeats_none():
    # A sink's `write` blocks when its thread is behind: a Ctrl-C there. The step is in
    # the history already; the next drain writes it to the sinks that missed it only.
    loss, _ = counted()
    first, second = FakeSink(), FakeSink()
    second.write = _InterruptOnce(second.write, at=3)
    mon = sowviz.Monitor(loss, throttle=3600.0)
    mon._listeners += [first, second]
    xs = [batch(4, seed=i) for i in range(12)]
    _, cut = _steps_with_one_interrupt(mon, xs)
    mon.flush()
    assert cut == 4  # the first read (steps 0-4), at the sinks' step 2
    steps = list(range(len(xs)))
    assert [e["step"] for e in mon.history] == steps
    assert [e["step"] for e in first.entries] == steps
    assert [e["step"] for e in second.entries] == steps
    assert first.entries == list(mon.history) == second.entries


def test_a_ctrl_c_in_the_running_flag_read_still_finds_the_first_nonfinite_step(monkeypatch):
    # Unrecorded steps' flags were taken off their queue before the read: a Ctrl-C in it
    # dropped them, and a NaN among them was never found.
    import sowviz.monitor as m

    class InterruptingNumpy(_CountingNumpy):
        def asarray(self, *a, **k):
            if self.reads == 0:  # the first read of the running flag
                self.reads += 1
                raise KeyboardInterrupt
            return super().asarray(*a, **k)

    monkeypatch.setattr(m, "np", InterruptingNumpy())

    def f(p, x):
        return jnp.sum(jnp.sqrt(p["s"])) + jnp.mean(x)

    mon = sowviz.Monitor(f, every=1000, throttle=3600.0)  # step 0 recorded, then plain
    cut = None
    for step in range(20):  # step 3's gradient is infinite
        try:
            mon.step({"s": jnp.zeros(2) if step == 3 else jnp.ones(2)}, batch(2))
        except KeyboardInterrupt:
            cut = step
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sowviz.NonFiniteWarning)
        mon.flush()
    assert cut == 6  # the first flag read: steps 1-4
    assert mon.nonfinite is not None and mon.nonfinite.step == 3
    assert mon.nonfinite.origins is not None and mon.nonfinite.origins.located
    assert [e["step"] for e in mon.history] == [0, 3]  # step 3 re-run with its probes


def test_history_and_nonfinite_hold_every_step_taken_without_a_flush():
    # Recorded steps are read a few at a time (or after `throttle` seconds): a Linen
    # ResNet's `mon.history` held none of its first 3 steps until `flush()`, and a
    # NaN two steps back was not yet in `mon.nonfinite`.
    mon = sowviz.Monitor(norm_loss, throttle=3600.0)
    want = []
    for step in range(3):
        p = params_at(step, bad_step=2)
        value, _ = mon.step(p, batch(4))
        want.append(float(jax.jit(norm_loss)(p, batch(4))))
        np.testing.assert_allclose(float(value), want[-1], rtol=1e-6)
    assert mon.nonfinite is not None and mon.nonfinite.step == 2  # no flush() needed
    assert mon.history.steps == [0, 1, 2]
    got = [e["loss"] for e in mon.history]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_monitor_keeps_its_alarm_when_the_located_rerun_is_finite():
    # Attention logits of ~1e18 at step 1: NaN under `jax.jit` (XLA's fused softmax
    # overflows `exp`), finite op by op and, on some XLA versions, in the re-run with
    # every equation probed. `mon.nonfinite.origins` kept the message sending the user
    # to `locate_nonfinite()`, which had nothing more to give: it now says why.
    from sowviz.nonfinite_messages import NAMES_THE_EQUATION, NOT_REPRODUCED

    def attention_loss(q, k, v):
        return jnp.mean(jax.nn.dot_product_attention(q, k, v) ** 2)

    keys = [jax.random.PRNGKey(i) for i in range(3)]
    small = [jax.random.normal(key, (2, 4, 1, 8)) for key in keys]
    large = [a * 1e9 for a in small]
    jitted = [float(jax.jit(attention_loss)(*a)) for a in (small, large)]
    assert np.isfinite(jitted[0]) and np.isfinite(attention_loss(*large))  # op by op
    if np.isfinite(jitted[1]):
        pytest.skip("this XLA computes the fused softmax without overflow")
    mon = sowviz.Monitor(attention_loss)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sowviz.NonFiniteWarning)
        for args, want in zip((small, large), jitted, strict=True):
            value, _ = mon.step(*args)
            np.testing.assert_allclose(float(value), want, rtol=1e-5, equal_nan=True)
        found = mon.locate_nonfinite()
    mon.close()
    nf = mon.nonfinite
    assert nf.step == 1 and found is nf.origins and found.alarm
    if found.located:  # an XLA that rounds alike probed or not (JAX 0.10): the equation
        assert found.forward.equation.primitive == "exp"
        return
    assert NOT_REPRODUCED in found.forward.message and NOT_REPRODUCED in nf.message
    assert NAMES_THE_EQUATION not in nf.message
    rec = mon.to_dict()["history"]["nonfinite"]  # what the widget and the report get
    assert rec["alarm"] is True and NOT_REPRODUCED in rec["forward"]["message"]


def _ctrl_c_in_a_c_callback(*args, **kwargs):
    # What JAX's tracing raises when a Ctrl-C lands in numpy's `__numpy_dtype__`
    # callback: a SystemError whose cause and context are the KeyboardInterrupt.
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as err:
        raise SystemError(
            "<function _ScalarMeta.__numpy_dtype__> returned a result with an exception set"
        ) from err


def test_a_ctrl_c_while_the_first_nonfinite_step_is_located_stops_the_loop(monkeypatch):
    # The locate's `except Exception` turned that SystemError into a RuntimeWarning
    # ("could not locate the non-finite equation of step 28") and training went on
    # to the end, exit status 0: the Ctrl-C was swallowed.
    import sowviz.nonfinite_locate as nl

    monkeypatch.setattr(nl, "locate", _ctrl_c_in_a_c_callback)
    mon = sowviz.Monitor(norm_loss, throttle=3600.0)
    done = []
    with pytest.raises(KeyboardInterrupt) as stopped:
        for step in range(12):
            mon.step(params_at(step, bad_step=2), batch(4))
            done.append(step)
        mon.flush()
    assert isinstance(stopped.value.__cause__, SystemError)
    # (4 steps wait on the device: the read at the 6th step records step 2 and locates)
    assert done == [0, 1, 2, 3]
    # nothing lost: once the user's handler returns, the next flush locates step 2
    monkeypatch.undo()
    with pytest.warns(sowviz.NonFiniteWarning, match="step 2"):
        mon.flush()
    grad = jax.grad(norm_loss)(params_at(2, bad_step=2), batch(4))["reg"]
    assert np.isnan(np.asarray(grad)).all()  # plain JAX: the NaN is `reg`'s gradient
    assert mon.nonfinite.step == 2 and mon.nonfinite.origins.located
    assert mon.nonfinite.origins.backward.equation.primitive == "sqrt"
    assert mon.history.steps == [0, 1, 2, 3, 4]


def _log_loss(params, x):
    return jnp.mean(jnp.log(x @ params["w"]) ** 2)  # NaN where `x @ w` <= 0


@pytest.mark.parametrize("stop", [False, True])
def test_donated_arguments_of_a_recorded_nonfinite_step_are_said_at_the_users_line(stop):
    # every=1: step 3 is recorded, read steps later, after the update donated its
    # arguments: "could not locate ...: RuntimeError('Array has been deleted ...')" at
    # a sowviz line, saying nothing of donation. With `stop_on_nonfinite=True` the step
    # is read before it returns, its arguments intact: located.
    @functools.partial(jax.jit, donate_argnums=(0,))
    def update(params, grads):
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)

    xs = [jnp.full((4, 3), 0.5).at[0, 0].set(-9.0 if i == 3 else 0.5) for i in range(6)]
    params = {"w": jnp.ones((3, 2))}
    assert np.isnan(_log_loss(params, xs[3])) and np.isfinite(_log_loss(params, xs[2]))
    mon = sowviz.Monitor(_log_loss, stop_on_nonfinite=stop, throttle=3600.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for x in xs:
                _, grads = mon.step(params, x)
                params = update(params, grads)
            mon.flush()
        except NonFiniteError:
            assert stop
    assert mon.nonfinite.step == 3
    said = [w for w in caught if "donat" in str(w.message)]
    if stop:
        assert said == [] and mon.nonfinite.origins.located
        assert mon.nonfinite.origins.forward.equation.primitive == "log"
        return
    (w,) = said
    assert w.filename == __file__ and "stop_on_nonfinite=True" in str(w.message)
    assert "step 3" in str(w.message) and "deleted" in str(w.message)
    assert not mon.nonfinite.origins.located  # the stages' record stands
    assert "`log`" in mon.nonfinite.origins.forward.message
