"""Round 14 (s39/dist finding 4): with `every=N` a Monitor charts and logs the loss of
every step, not only of the recorded ones. The loss of an unrecorded step is read in
the batched read of the running flag (no device->host read per step), and reaches
`mon.history.losses`, the model's `history.losses`, the run log (`L` records),
TensorBoard's `loss` scalar, W&B and the report's loss chart, in step order."""

from __future__ import annotations

import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
import sowviz.monitor as m
from sowviz.__main__ import main
from sowviz._history import History, LossSeries
from sowviz.runlog import format as fmt
from sowviz.runlog.reader import LogReader

ARTIFACTS = pathlib.Path(__file__).resolve().parents[1] / "artifacts"


def loss(w, x):
    with jax.named_scope("layer"):
        h = jnp.tanh(x @ w)
    return jnp.mean(h**2)


W0 = jax.random.normal(jax.random.PRNGKey(0), (8, 4))
X = jax.random.normal(jax.random.PRNGKey(1), (16, 8))


def train(mon, steps, w=W0):
    """Steps `mon` as a training loop does; returns each step's parameters and the
    loss `mon.step` returned."""
    ws, returned = [], []
    for _ in range(steps):
        ws.append(w)
        value, g = mon.step(w, X)
        returned.append(float(value))
        w = w - 0.5 * g
    return ws, returned


def plain_losses(ws):
    # independently: plain JAX at each step's parameters
    vg = jax.jit(jax.value_and_grad(loss))
    return [float(vg(w, X)[0]) for w in ws]


class Recorder:
    """A listener: the order in which recorded steps and unrecorded losses arrive."""

    def __init__(self):
        self.calls: list[tuple[str, list[int]]] = []

    def write(self, entry):
        self.calls.append(("write", [entry["step"]]))

    def losses(self, steps, losses):
        self.calls.append(("losses", list(steps)))


def test_every_step_s_loss_reaches_the_history_in_order():
    mon = sowviz.Monitor(loss, every=10)
    rec = Recorder()
    mon._listeners.append(rec)
    ws, returned = train(mon, 35)
    hist = mon.history
    assert hist.steps == [0, 10, 20, 30]  # the summaries: recorded steps only
    assert hist.losses.steps == list(range(35))
    # the loss the caller got, bit for bit, and plain JAX's at those parameters
    assert hist.losses.values == returned
    np.testing.assert_allclose(hist.losses.values, plain_losses(ws), rtol=1e-6)
    d = mon.to_dict()["history"]
    assert d["losses"]["steps"] == list(range(35)) and d["losses"]["loss"] == returned
    assert d["steps"] == [0, 10, 20, 30]  # (unchanged: the recorded steps' columns)
    # The listeners get every step once, in step order (TensorBoard drops a tag's later
    # steps when one goes back), the losses a few at a time (one read per batch).
    order = [s for _, steps in rec.calls for s in steps]
    assert order == list(range(35))
    batches = [c for c in rec.calls if c[0] == "losses"]
    assert len(batches) <= math.ceil(31 / m._FLAG_BATCH) + 4  # (4: one per recorded step)


def test_unrecorded_losses_are_read_with_the_flags_not_one_read_per_step(monkeypatch):
    # The loss of an unrecorded step is converted only when the running flag is read
    # (a batch of `_FLAG_BATCH` steps, `_MAX_FLAGS` behind), never at its own step.
    reads = []
    real = m._host_float
    monkeypatch.setattr(m, "_host_float", lambda v: reads.append(mon.steps) or real(v))
    mon = sowviz.Monitor(loss, every=1000)
    for _i in range(12):
        mon.step(W0, X)
        # after each step, the losses of at most `_FLAG_BATCH + _MAX_FLAGS` steps wait
        assert len(mon._losses) < m._FLAG_BATCH + m._MAX_FLAGS
    # read in batches: the steps at which reads happened are few
    assert len(set(reads)) <= 12 // m._FLAG_BATCH
    mon.flush()
    assert mon.history.losses.steps == list(range(12))


def test_off_a_cpu_the_copy_to_the_host_starts_at_the_step(monkeypatch):
    started = []
    cls = type(W0)  # jax's array class
    real = cls.copy_to_host_async
    monkeypatch.setattr(cls, "copy_to_host_async", lambda a: started.append(a) or real(a))
    mon = sowviz.Monitor(loss, every=100)
    mon._copy_losses = True  # (as on a GPU)
    _, returned = train(mon, 5)
    assert len(started) == 4 and all(a.shape == () for a in started)  # as each step returns
    mon.flush()
    assert mon.history.losses.steps == list(range(5))
    assert mon.history.losses.values == returned


def test_a_train_step_s_loss_in_mode_primal_every_step():
    import optax

    opt = optax.adam(0.05)

    def train_step(w, state, x):
        value, g = jax.value_and_grad(loss)(w, x)
        updates, state = opt.update(g, state, w)
        return optax.apply_updates(w, updates), state, {"loss": value, "acc": 2 * value}

    mon = sowviz.Monitor(train_step, mode="primal", every=4)
    w, state, want = W0, opt.init(W0), []
    step = jax.jit(train_step)
    wp, sp = w, state
    for _ in range(10):
        w, state, _metrics = mon.step(w, state, X)
        wp, sp, mp = step(wp, sp, X)
        want.append(float(mp["loss"]))
    assert mon.history.losses.steps == list(range(10))
    np.testing.assert_allclose(mon.history.losses.values, want, rtol=1e-5)
    # found once per program, then read by its path (`_loss_at`), not by flattening
    (at,) = [v for v in mon._loss_of.values()]
    assert callable(at) and at is not m._no_loss


def test_stop_on_nonfinite_logs_every_step_s_loss_too():
    mon = sowviz.Monitor(loss, every=5, stop_on_nonfinite=True)
    _ws, returned = train(mon, 13)
    assert mon.history.losses.steps == list(range(13))
    assert mon.history.losses.values == returned


def test_a_nonfinite_unrecorded_step_is_one_point_and_counted():
    def f(w, x):
        return jnp.sum(jnp.sqrt(w)) + jnp.mean(x)

    mon = sowviz.Monitor(f, every=10)
    for i in range(20):
        mon.step(jnp.full(2, -1.0) if i == 13 else jnp.ones(2), X)
    losses = mon.history.losses
    assert losses.steps == list(range(20))  # step 13 once, though re-run and recorded
    assert math.isnan(losses.values[13])
    assert 13 in mon.history.steps and mon.nonfinite.step == 13
    d = json.loads(sowviz.report.model_json(mon.to_dict()))["history"]["losses"]
    assert d["loss"][13] is None and d["loss"][12] == pytest.approx(2.0 + float(jnp.mean(X)))


def test_the_run_log_and_tensorboard_have_every_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    mon = sowviz.Monitor(loss, every=10, log_dir=tmp_path / "run", tensorboard=True)
    ws, returned = train(mon, 43)
    mon.close()
    want = plain_losses(ws)
    ea = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"scalars": 0})
    ea.Reload()
    tb = ea.Scalars("loss")
    assert [e.step for e in tb] == list(range(43))
    np.testing.assert_allclose([e.value for e in tb], want, rtol=1e-6)
    # the log: L records (format 3) for the unrecorded steps, S for the recorded ones
    data = (tmp_path / "run" / "steps.log").read_bytes()
    kinds = [r.kind for r in fmt.scan(data, 0) if isinstance(r, fmt.Record)]
    assert kinds.count(b"S") == 5 and 0 < kinds.count(b"L") < 38 and kinds[-1] == b"E"
    reader = LogReader(tmp_path / "run")
    assert [e["step"] for e in reader.read()] == [0, 10, 20, 30, 40]
    assert len(reader.losses) == 38
    run = sowviz.load(tmp_path / "run")
    hist = run.model["history"]
    assert hist["steps"] == [0, 10, 20, 30, 40]
    assert hist["losses"]["steps"] == list(range(43))
    assert hist["losses"]["loss"] == returned
    assert run.history.losses.values == returned
    # the report command carries the every-step series into the page
    out = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "run"), "-o", str(out)]) == 0
    assert '"losses":{"steps":[0,1,2,' in out.read_text()


def test_a_log_without_loss_records_loads_as_before(tmp_path):
    # an older writer's log (format 2: no L records): the loss series is the recorded
    # steps' losses, as the chart drew them before
    mon = sowviz.Monitor(loss, every=10, log_dir=tmp_path / "new")
    train(mon, 25)
    mon.close()
    old = tmp_path / "old"
    old.mkdir()
    (old / "model.json").write_bytes((tmp_path / "new" / "model.json").read_bytes())
    data = (tmp_path / "new" / "steps.log").read_bytes()
    kept = b"".join(
        data[r.offset : r.end]
        for r in fmt.scan(data, 0)
        if isinstance(r, fmt.Record) and r.kind != fmt.LOSSES
    )
    (old / "steps.log").write_bytes(kept)
    hist = sowviz.load(old).model["history"]
    assert hist["steps"] == [0, 10, 20]
    assert hist["losses"]["steps"] == [0, 10, 20]
    assert hist["losses"]["loss"] == hist["loss"]


def test_a_resumed_run_s_losses_join_in_order(tmp_path):
    # the first log's unrecorded losses past the resumed log's first step are replaced
    first = sowviz.Monitor(loss, every=10, log_dir=tmp_path / "a")
    train(first, 27)
    first.close()
    resumed = sowviz.Monitor(loss, every=10, log_dir=tmp_path / "b", start_step=20)
    _, returned = train(resumed, 15)
    resumed.close()
    hist = sowviz.load(tmp_path / "a", tmp_path / "b").model["history"]
    assert hist["losses"]["steps"] == list(range(35))
    assert hist["losses"]["loss"][20:] == returned


def test_wandb_gets_a_loss_row_per_unrecorded_step():
    pytest.importorskip("wandb")
    from sowviz.runlog.wandb_sink import WandbSink

    class Run:
        def __init__(self):
            self.rows = []

        def define_metric(self, *a, **k):
            pass

        def log(self, row):
            self.rows.append(row)

    run = Run()
    sink = WandbSink(run)
    sink.losses([1, 2, 3], [0.5, None, 0.25])
    sink.close()
    assert run.rows == [
        {"sowviz/step": 1, "sowviz/loss": 0.5},
        {"sowviz/step": 3, "sowviz/loss": 0.25},
    ]


def test_the_live_view_sends_the_losses_in_its_steps_messages():
    import gzip

    mon = sowviz.Monitor(loss, every=5, throttle=3600.0)
    view = mon.view()
    sent = []
    view.send = lambda msg, buffers=None: sent.append((msg, buffers))
    train(mon, 3)
    mon.flush()  # the model (with step 0) went whole; steps 1-2 travel as losses
    train(mon, 9, w=W0)
    mon.flush()
    items = [i for _, b in sent for i in json.loads(gzip.decompress(b[0]))]
    seen = sorted(
        s for i in items for s in (i["steps"] if i.get("kind") == "losses" else [i["step"]])
    )
    first = view.model["history"]["losses"]["steps"]
    assert sorted(set(first) | set(seen)) == list(range(12))
    assert all(i["kind"] == "losses" for i in items if "probes" not in i)


def test_the_loss_series_is_thinned_like_the_history():
    s = LossSeries(8)
    for i in range(1000):
        s.add(i, float(i))
    assert len(s) <= 8 and s.steps[0] == 0 and s.steps[-4:] == [996, 997, 998, 999]
    s.add(999, 1.0)  # a step again, or an older one: dropped
    s.add(5, 1.0)
    assert s.steps[-1] == 999 and s.values[-1] == 999.0
    h = History(4)
    assert h.losses.limit == 2000  # at least `LOSS_POINTS`: the chart's, not the entries'


@pytest.mark.browser
def test_the_report_s_loss_chart_draws_every_step(page, tmp_path):
    mon = sowviz.Monitor(loss, every=10)
    _, returned = train(mon, 50)
    path = mon.save_html(tmp_path / "every.html")
    pg = page.open_report(path)
    chart = pg.locator('[data-role="loss"] .sv-chart')
    chart.wait_for()
    xs, ys = chart.evaluate("el => [el.data[0].x, el.data[0].y]")
    assert xs == list(range(50))
    np.testing.assert_allclose(ys, returned, rtol=1e-6)
    # a click on an unrecorded step's point draws the nearest recorded step (20)
    pg.evaluate(
        """() => { const el = document.querySelector('[data-role="loss"] .sv-chart');
        el.emit('plotly_click', {points: [{x: 22}]}); }"""
    )
    pg.wait_for_function(
        "() => document.querySelector('[data-role=\"step-shown\"]').textContent === 'step 20'"
    )
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "loss_every_step.png"))
    assert page.errors == []
