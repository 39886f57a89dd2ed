"""Round 14: a run log that keeps up with a fast loop (what a killed process leaves), and
`History.to_dict()` called as the public method it is."""

from __future__ import annotations

import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import sowviz
from sowviz.monitor import _MAX_PENDING
from sowviz.runlog import LogSink, SinkWarning
from sowviz.runlog import sink as sink_module


def _mse(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2)


W = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
X = jnp.linspace(0.5, 2.0, 20).reshape(5, 4)


class _Gated(sink_module.Sink):
    """A sink whose writer thread writes only when let through (a slow disk)."""

    name = "gated sink"

    def __init__(self, fail: bool = False) -> None:
        self.gate = threading.Event()
        self.written: list[int] = []
        self.fail = fail
        super().__init__()

    def _write(self, entry):
        self.gate.wait()
        if self.fail:
            raise OSError("disk full")
        self.written.append(entry["step"])


def _hand_over(sink, n):
    """Hands `n` steps to `sink` from another thread (the training loop); how many it
    had handed over, read while it runs."""
    handed = []

    def loop():
        for i in range(n):
            sink.write({"step": i})
            handed.append(i)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread, handed


def test_a_writer_that_trails_makes_the_loop_wait_a_few_steps_behind():
    lag = sink_module.LAG_STEPS
    sink = _Gated()
    thread, handed = _hand_over(sink, 3 * lag)
    try:
        deadline = time.monotonic() + 10  # (a loaded machine: the loop thread may start late)
        while len(handed) < lag and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # time to hand over more, were it not waiting
        # The writer wrote nothing: the loop waits once `LAG_STEPS` steps are unwritten
        # (it used to hand over 256 before waiting: a killed process lost all of them).
        assert len(handed) == lag and thread.is_alive()
    finally:
        sink.gate.set()  # (a failure must not leave the writer stuck at the exit)
    thread.join(10)
    assert not thread.is_alive()
    sink.flush()
    assert sink.written == list(range(3 * lag))  # every step, once, in order
    sink.close()


def test_a_writer_that_fails_while_the_loop_waits_lets_it_go_on():
    sink = _Gated(fail=True)
    thread, handed = _hand_over(sink, 3 * sink_module.LAG_STEPS)
    time.sleep(0.2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sink.gate.set()  # the first write fails: the sink turns itself off
        thread.join(10)
        assert not thread.is_alive()
        sink.flush()
    assert len(handed) == 3 * sink_module.LAG_STEPS and sink.written == []
    assert any(issubclass(w.category, SinkWarning) for w in caught)
    sink.close()


def test_the_run_log_on_disk_trails_a_fast_loop_by_a_few_steps(tmp_path, monkeypatch):
    """What a process killed now would leave: the steps already in `steps.log`. The
    writer is made slower than the loop (30 ms a step, as a big model's entries or a
    busy machine make it); the log must still hold every step but the last few."""
    write = LogSink._write

    def slow_write(self, entry):
        time.sleep(0.03)
        write(self, entry)

    monkeypatch.setattr(LogSink, "_write", slow_write)
    log = tmp_path / "run"
    mon = sowviz.Monitor(_mse, log_dir=log)
    n = 40
    for i in range(n):
        mon.step(W, X * (1 + 0.01 * i))
    on_disk = sowviz.load(log).history.steps  # no flush: as a SIGKILL would leave it
    behind = sink_module.LAG_STEPS + _MAX_PENDING + 1
    assert on_disk == list(range(len(on_disk)))
    assert len(on_disk) >= n - behind, f"{len(on_disk)} of {n} steps on disk"
    mon.close()
    assert sowviz.load(log).history.steps == list(range(n))


def test_a_writer_that_keeps_up_never_makes_the_loop_wait():
    sink = _Gated()
    sink.gate.set()
    waits = []
    wait = sink._room.wait
    sink._room.wait = lambda *a: waits.append(1) or wait(*a)
    for i in range(5 * sink_module.LAG_STEPS):
        sink.write({"step": i})
        if i % 5 == 4:  # a Monitor's read hands over 5 steps; the writer has time between
            sink.flush()
    assert waits == [] and sink.written == list(range(5 * sink_module.LAG_STEPS))
    sink.close()


# -- `History.to_dict()` ------------------------------------------------------------------


def _log_loss(w):
    return jnp.sum(jnp.log(w))


def test_history_to_dict_needs_no_argument(tmp_path):
    mon = sowviz.Monitor(_mse, every=2, log_dir=tmp_path / "run")
    for i in range(6):
        mon.step(W, X * (1 + i))
    d = mon.history.to_dict()
    assert d["steps"] == [0, 2, 4] and d["nonfinite"] is None
    w, x = np.asarray(W, np.float64), np.asarray(X, np.float64)
    want = [float(np.mean(np.tanh(x * (1 + i) @ w) ** 2)) for i in (0, 2, 4)]
    np.testing.assert_allclose(d["loss"], want, rtol=1e-5)
    assert d == mon.to_dict()["history"]
    mon.close()
    run = sowviz.load(tmp_path / "run")
    assert run.history.to_dict()["steps"] == [0, 2, 4]


def test_history_to_dict_finds_the_first_non_finite_step_itself(tmp_path):
    mon = sowviz.Monitor(_log_loss, log_dir=tmp_path / "run")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sowviz.NonFiniteWarning)
        for w in ([1.0, 2.0], [1.0, 3.0], [-1.0, 2.0], [-2.0, 2.0]):
            mon.step(jnp.asarray(w))
        mon.flush()
    d = mon.history.to_dict()
    # as the Monitor's own model says it (the record the first bad step's entry holds)
    assert d["nonfinite"] == mon.to_dict()["history"]["nonfinite"]
    assert d["nonfinite"]["step"] == mon.nonfinite.step == 2
    assert d["nonfinite_steps"] == [[2, 3]]
    mon.close()
    run = sowviz.load(tmp_path / "run")
    assert run.history.to_dict()["nonfinite"] == run.model["history"]["nonfinite"]
    assert run.history.to_dict()["nonfinite"]["step"] == 2
    # a caller's record still wins
    assert mon.history.to_dict({"step": 7})["nonfinite"] == {"step": 7}


def test_a_step_of_a_fast_loop_is_not_slower_when_the_writer_keeps_up(tmp_path):
    """The wait is only for a writer that trails: with a writer 10x faster than the
    step, no `write` waits (the Condition is never waited on)."""
    log = tmp_path / "run"
    mon = sowviz.Monitor(_mse, log_dir=log)
    sink = next(s for s in mon._listeners if isinstance(s, LogSink))
    waits = []
    wait = sink._room.wait
    sink._room.wait = lambda *a: waits.append(1) or wait(*a)
    for _ in range(20):
        _, g = mon.step(W, X)
        jax.block_until_ready(g)
        time.sleep(0.02)  # a slow step: the writer has all the time it needs
    mon.close()
    assert waits == []
    assert sowviz.load(log).history.steps == list(range(20))
