"""Round 16 (a real JupyterLab session): what a widget shows later.

1. A displayed Monitor's synced `model` trait (what a reloaded page, a second view or a
   notebook's saved widget state draws) kept only the first step: the later ones went
   as `steps` messages to the views open then. A reloaded page showed "step 0 (latest)"
   and a one-point loss chart after a 150-step run.
2. A `show()` widget on a Flax NNX model re-ran its inspection, on a mode switch, on the
   model as trained in place since: the same mode showed other gradients.
"""

from __future__ import annotations

import gzip
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_widget_monitor import FakeClock

import sowviz
from sowviz import monitor_view


def loss(w, x):
    with jax.named_scope("layer"):
        h = jnp.tanh(x @ w)
    return jnp.mean(h**2)


W0 = jnp.full((3, 2), 0.5)
X = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
LR = 0.5
STEPS = 12


def plain_run(n=STEPS):
    """The losses of `n` SGD steps, by plain `jax.value_and_grad`."""
    w, out = W0, []
    for _ in range(n):
        value, g = jax.value_and_grad(loss)(w, X)
        out.append(float(value))
        w = w - LR * g
    return out


def train(mon, n=STEPS):
    w = W0
    for _ in range(n):
        _, g = mon.step(w, X)
        w = w - LR * g


def decoded(state_model) -> dict:
    return json.loads(gzip.decompress(bytes(state_model)))


def live_view(clock=None):
    """A displayed Monitor's view, its steps messages recorded (the views open now)."""
    mon = sowviz.Monitor(loss, throttle=0.0)
    view = mon.view()
    if clock is not None:
        view.clock = clock
    sent = []
    view.send = lambda msg, buffers=None: sent.append(msg["type"])
    return mon, view, sent


def assert_whole_run(history, mon):
    want = plain_run()
    assert history["steps"] == [e["step"] for e in mon.history] == list(range(STEPS))
    assert history["loss"] == [e["loss"] for e in mon.history]
    assert history["loss"] == pytest.approx(want, rel=1e-5)


# --- 1. the synced model of a Monitor's view ---------------------------------------


def test_a_front_end_asking_for_the_state_gets_every_step_sent_so_far():
    mon, view, sent = live_view(FakeClock())
    train(mon)
    n = len(mon.history)  # (reads the steps in flight: they go out as steps messages)
    assert n == STEPS and "steps" in sent
    # the live views got the steps as messages; the trait still holds the first ones
    assert len(view.model["history"]["steps"]) < STEPS
    # A reloaded page: JupyterLab's widget manager asks for each widget's whole state
    # (`request_state`, or `request_states` on the control comm: `get_state()`).
    replies = []
    view.comm.send = lambda data=None, metadata=None, buffers=None: replies.append((data, buffers))
    view._handle_msg({"content": {"data": {"method": "request_state"}}, "buffers": []})
    data, buffers = replies[-1]
    assert data["method"] == "update" and ["model"] in data["buffer_paths"]
    state_model = buffers[data["buffer_paths"].index(["model"])]
    assert_whole_run(decoded(state_model)["history"], mon)
    assert_whole_run(decoded(view.get_state()["model"])["history"], mon)
    assert_whole_run(view.model["history"], mon)  # the kernel's trait too


def test_mon_flush_brings_the_synced_model_up_to_date():
    mon, view, sent = live_view(FakeClock())
    train(mon)
    mon.flush()  # the loop's end
    assert "steps" in sent  # the steps went live first, as messages
    assert_whole_run(view.model["history"], mon)
    assert_whole_run(decoded(view.get_state(key="model")["model"])["history"], mon)


def test_the_whole_model_goes_every_so_often_not_at_every_step():
    clock = FakeClock()
    mon, view, sent = live_view(clock)
    models = []
    w = W0
    for k in range(STEPS):
        clock.t = 100.0 + k  # one step a second
        _, g = mon.step(w, X)
        w = w - LR * g
        len(mon.history)  # read at once: the step goes out now, not a few steps later
        if k == 1:  # (the first steps' graph and programs go as whole models)
            view.observe(lambda change: models.append(change["new"]), "model")
            sent.clear()
    # one step a second for 12 s: steps messages only, no whole model (its cost)
    assert models == [] and sent.count("steps") == STEPS - 2
    clock.t = 100.0 + STEPS + monitor_view._REFRESH_EVERY
    _, g = mon.step(w, X)
    len(mon.history)
    assert len(models) == 1 and models[0]["history"]["steps"] == list(range(STEPS + 1))
    assert sent.count("steps") == STEPS - 2  # that step went inside the model


def test_the_synced_model_catches_up_once_the_loop_stops(monkeypatch):
    # No `flush()`: the loop ends, and the steps sent as messages reach the synced model
    # (what a notebook saves as widget state) when the next refresh is due.
    monkeypatch.setattr(monitor_view, "_REFRESH_EVERY", 0.2)
    mon, view, sent = live_view()
    train(mon)
    assert len(mon.history) == STEPS and "steps" in sent
    deadline = time.monotonic() + 10.0
    while len(view.model["history"]["steps"]) < STEPS and time.monotonic() < deadline:
        time.sleep(0.05)
    assert_whole_run(view.model["history"], mon)


@pytest.mark.browser
def test_a_reloaded_page_draws_the_whole_run(browser):
    from ipywidgets.widgets.widget import _remove_buffers
    from test_widget_browser import BRIDGE, Bridge, b64

    mon = sowviz.Monitor(loss, throttle=0.0)
    mon.step(W0, X)
    mon.flush()
    view = mon.view()
    first = Bridge(browser)
    second = Bridge(browser)
    try:
        first.attach(view)  # displayed after the first step, then the loop runs
        train_rest = plain_run()
        w = W0 - LR * jax.grad(loss)(W0, X)
        for _ in range(STEPS - 1):
            _, g = mon.step(w, X)
            w = w - LR * g
        len(mon.history)  # every step sent, as messages (no flush: no refresh)
        first.deliver()
        step = first.page.locator('[data-role="step"]')
        first.page.wait_for_function(
            f"() => document.querySelector('[data-role=step]')?.textContent"
            f".startsWith('step {STEPS - 1}')"
        )
        assert step.inner_text().split()[:2] == ["step", str(STEPS - 1)]
        # The page reloaded: a new page, its widget manager asks for the whole state.
        second.w = view
        view.comm.send = lambda data=None, metadata=None, buffers=None: second.sent.append(
            (data, buffers or [])
        )
        state, paths, buffers = _remove_buffers(view.get_state())
        second.page.evaluate(
            BRIDGE, {"state": state, "buffer_paths": paths, "buffers": b64(buffers)}
        )
        pg = second.page
        pg.locator('[data-role="step"]').wait_for()
        assert pg.locator('[data-role="step"]').inner_text().split() == [
            "step",
            str(STEPS - 1),
            "(latest)",
        ]
        chart = pg.locator('[data-role="loss"] .js-plotly-plot')
        chart.wait_for()
        assert chart.evaluate("gd => gd.data[0].x") == list(range(STEPS))
        got = chart.evaluate("gd => gd.data[0].y")
        assert got == pytest.approx([e["loss"] for e in mon.history], rel=1e-6)
        assert got == pytest.approx(train_rest, rel=1e-5)
        assert first.p.errors == [] and second.p.errors == []
    finally:
        first.close()
        second.close()


# --- 2. a show() widget's modes describe the arguments as given --------------------


def nnx_setup():
    nnx = pytest.importorskip("flax.nnx")
    optax = pytest.importorskip("optax")

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(4, 8, rngs=rngs)
            self.l2 = nnx.Linear(8, 1, rngs=rngs)

        def __call__(self, x):
            return self.l2(jnp.tanh(self.l1(x)))

    def loss_fn(model, x, y):
        return jnp.mean((model(x) - y) ** 2)

    model = MLP(nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 4))
    y = jnp.ones((16, 1))
    return nnx, optax, model, loss_fn, x, y


def test_an_nnx_model_trained_in_place_does_not_change_the_widget_s_modes():
    nnx, optax, model, loss_fn, x, y = nnx_setup()
    # the values to expect: plain nnx.value_and_grad on the parameters show() is given
    want_loss, want_g = nnx.value_and_grad(loss_fn)(nnx.clone(model), x, y)
    w = sowviz.show(loss_fn, model, x, y, mode="grad", warm=())
    opt = nnx.Optimizer(model, optax.sgd(0.5), wrt=nnx.Param)  # the next cell: training
    for _ in range(3):
        _, g = nnx.value_and_grad(loss_fn)(model, x, y)
        opt.update(model, g)
    trained = float(loss_fn(model, x, y))
    assert abs(trained - float(want_loss)) > 1e-3  # the model did change
    w.mode = "jvp"  # a mode not computed before: it runs on the model as shown too
    assert w.phase == "ready", w.status
    assert float(w.inspection.result[0]) == pytest.approx(float(want_loss), rel=1e-6)
    w.mode = "grad"
    assert w.phase == "ready", w.status
    value, grads = w.inspection.result
    assert float(value) == pytest.approx(float(want_loss), rel=1e-6)
    for layer in ("l1", "l2"):
        for leaf in ("kernel", "bias"):
            got = np.asarray(getattr(getattr(grads, layer), leaf)[...])
            np.testing.assert_allclose(got, want_g[layer][leaf][...], rtol=1e-5, atol=1e-7)
    # the caller's model is left as trained (the widget holds a copy, not the model)
    assert float(loss_fn(model, x, y)) == trained


def test_a_numpy_argument_changed_in_place_does_not_change_the_widget():
    w_np = np.full((3, 2), 0.5, np.float32)
    want = float(loss(jnp.asarray(w_np), X))
    wid = sowviz.show(loss, w_np, X, mode="grad", warm=())
    w_np *= 2.0  # an in-place NumPy update
    wid.mode = "primal"
    assert wid.phase == "ready", wid.status
    assert float(wid.inspection.result) == pytest.approx(want, rel=1e-6)


def test_arguments_deleted_since_show_are_named_in_the_error():
    _nnx, _optax, model, loss_fn, x, y = nnx_setup()
    w = sowviz.show(loss_fn, model, x, y, mode="grad", warm=())
    model.l1.kernel[...].delete()  # what donating the model to a jitted step does
    w.mode = "jvp"
    assert w.phase == "error"
    assert "deleted since" in w.status and "l1" in w.status
    assert "Call `sowviz.show(...)` again" in w.status
