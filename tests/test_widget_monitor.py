"""The Inspector widget's traits and mode switching; the Monitor's step, history,
throttling and NaN hunting."""

from __future__ import annotations

import gzip
import json

import anywidget
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import traitlets
from _nan_program import line_of, nan_in_scope

import sowviz
from sowviz import report
from sowviz.monitor import NonFiniteError


def loss(params, x):
    h = x
    for i, p in enumerate(params):
        with jax.named_scope(f"layer_{i}"):
            h = jnp.tanh(h @ p["w"] + p["b"])
    return jnp.mean(h**2)


PARAMS = [
    {"w": jax.random.normal(jax.random.PRNGKey(i), (4, 4)) / 2, "b": jnp.zeros(4)} for i in range(3)
]
X = jax.random.normal(jax.random.PRNGKey(9), (5, 4))


# --- Inspector ------------------------------------------------------------------


def test_show_returns_a_widget_with_the_model():
    w = sowviz.show(loss, PARAMS, X, mode="grad")
    assert isinstance(w, sowviz.Inspector)
    assert w.model["schema"] == "sowviz/1" and w.mode == "grad"
    assert w.phase == "ready" and w.status == "" and w.can_locate is True
    assert w.inspection is not None and w.model == w.inspection.to_dict()
    state = w.get_state()
    # one synced copy of the model: its serializer sends gzipped JSON (a binary buffer)
    assert {"model", "mode", "phase", "status", "can_locate"} <= set(state)
    assert "model_bytes" not in state and "busy" not in state
    assert isinstance(state["model"], bytes)
    assert json.loads(gzip.decompress(state["model"])) == json.loads(report.model_json(w.model))
    # the widget ships the same bundle the report inlines
    bundle = (sowviz.widget.STATIC / "sowviz.js").read_text(encoding="utf-8")
    assert w._esm == bundle
    assert len(repr(w)) < 120  # the model never lands in the repr


class Wire:
    """The widget's comm, recorded: what ipywidgets would send to the front end."""

    def __init__(self, w):
        self.sent = []
        w.comm.send = lambda data=None, metadata=None, buffers=None: self.sent.append(
            (data, buffers)
        )

    def updates(self, key):
        out = []
        for data, buffers in self.sent:
            if data["method"] == "update" and (
                key in data["state"] or [key] in data["buffer_paths"]
            ):
                out.append((data, buffers))
        return out


def test_a_new_model_is_synced_as_one_gzipped_buffer():
    w = sowviz.show(loss, PARAMS, X, mode="grad")
    wire = Wire(w)
    w.mode = "jvp"  # the kernel re-runs: the new model travels, as one binary buffer
    assert w.model["mode"] == "jvp" and w.model["modes"] == ["primal", "tangent"]
    (data, buffers), *_ = wire.updates("model")
    assert data["buffer_paths"] == [["model"]] and len(buffers) == 1
    assert json.loads(gzip.decompress(buffers[0])) == json.loads(report.model_json(w.model))
    # the status went through the phases and ended ready, each phase with its line
    phases = [d["state"]["phase"] for d, _ in wire.updates("phase")]
    assert phases == ["tracing", "compiling", "running", "ready"]
    assert all("status" in d["state"] for d, _ in wire.updates("phase"))


def test_mode_is_an_enum_of_the_modes():
    w = sowviz.show(loss, PARAMS, X, mode="primal")
    assert sorted(w.traits()["mode"].values) == sorted(m.value for m in sowviz._model.Mode)
    with pytest.raises(traitlets.TraitError):
        w.mode = "hessian"
    assert w.model["mode"] == "primal"


def _recording_display(monkeypatch):
    """Stand in for the kernel's display: what the status line shows, in order, from the
    moment `show()` displays the widget."""
    seen = []

    def display_now(w):
        seen.append(("shown", w.phase, w.status, bool(w.model)))
        w.observe(lambda c: seen.append((c["new"], w.status)), names=["phase"])

    monkeypatch.setattr(sowviz.widget, "display_now", display_now)
    return seen


def test_show_displays_at_once_then_reports_each_phase(monkeypatch):
    seen = _recording_display(monkeypatch)

    def fresh_loss(params, x):  # a new function: nothing cached, so it compiles
        return loss(params, x)

    w = sowviz.show(fresh_loss, PARAMS, X, mode="grad")
    # displayed before any work, empty, saying what it does
    assert seen[0] == ("shown", "tracing", "tracing `fresh_loss`…", False)
    assert [s[0] for s in seen[1:]] == ["compiling", "running", "ready"]
    assert "compiling `fresh_loss`" in seen[1][1] and "running" in seen[2][1]
    assert w.phase == "ready" and w.status == "" and w.model["mode"] == "grad"


def test_an_error_is_shown_in_the_status_and_raised(monkeypatch):
    seen = _recording_display(monkeypatch)
    shown = []
    monkeypatch.setattr(
        sowviz.widget, "display_now", lambda w: (shown.append(w), seen.append(w.phase))
    )

    def broken(x):
        raise ValueError("<b>bad</b> input: pass `x` as an array")

    with pytest.raises(ValueError, match="bad"):
        sowviz.show(broken, jnp.ones(3))
    (w,) = shown
    assert w.phase == "error"
    assert w.status == "ValueError: <b>bad</b> input: pass `x` as an array"


def test_mode_switch_error_is_shown_not_raised():
    w = sowviz.show(lambda x: x * 2.0, jnp.ones(3), mode="primal")  # not scalar: grad fails
    w.mode = "grad"
    assert w.phase == "error" and "TypeError" in w.status and "scalar" in w.status
    assert w.model["mode"] == "primal"
    w.mode = "primal"  # back to the mode shown: the error goes away, nothing re-runs
    assert w.phase == "ready" and w.status == ""


def test_widget_save_html(tmp_path):
    w = sowviz.show(loss, PARAMS, X)
    path = w.save_html(tmp_path / "w.html")
    assert path.exists() and "sowviz/1" in path.read_text(encoding="utf-8")


def test_locate_message_names_the_equation():
    w = sowviz.show(nan_in_scope, jnp.ones((3, 4)) * 0.1, jnp.ones((2, 3)), mode="primal")
    rec = w.model["nonfinite"]
    feat = next(n for n in w.model["nodes"] if n["label"] == "feat")
    assert rec["forward"]["node"] == feat["id"] and feat["n_eqns"] > 1
    assert rec["forward"]["equation"] is None  # not located yet: the banner offers the button
    wire = Wire(w)
    # what the button sends, as ipywidgets delivers it from the front end
    w._handle_msg(
        {"content": {"data": {"method": "custom", "content": {"type": "locate"}}}, "buffers": []}
    )
    eq = w.model["nonfinite"]["forward"]["equation"]
    assert eq["primitive"] == "log"
    assert eq["source"]["line"] == line_of(nan_in_scope, "jnp.log(")
    assert f":{eq['source']['line']}" in w.model["nonfinite"]["forward"]["message"]
    phases = [d["state"]["phase"] for d, _ in wire.updates("phase")]
    assert phases[0] == "locating" and phases[-1] == "ready"
    assert wire.updates("model")  # the new model reached the front end


def test_locate_without_a_program_says_why():
    w = sowviz.Inspector(model=sowviz.inspect(loss, PARAMS, X).to_dict())
    assert w.can_locate is False
    assert w.locate() is None
    assert w.phase == "error" and "stored model" in w.status


# --- Monitor ----------------------------------------------------------------------


def sgd(params, grads, lr=0.1):
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)


def test_step_returns_value_and_grad_exactly():
    mon = sowviz.Monitor(loss)
    value, grads = mon.step(PARAMS, X)
    ref_value, ref_grads = jax.jit(jax.value_and_grad(loss))(PARAMS, X)
    np.testing.assert_allclose(value, ref_value, rtol=1e-6)
    for g, r in zip(
        jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads), strict=True
    ):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-7)
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(ref_grads)


def test_a_monitor_view_s_mode_picker_says_the_mode_is_fixed():
    # Choosing "jvp" in a Monitor's view left it "switching to jvp…" forever.
    mon = sowviz.Monitor(loss)
    mon.step(PARAMS, X)
    mon.flush()
    view = mon.view()
    view.mode = "jvp"
    assert view.phase == "error"
    assert "mode it was made with" in view.status and "Choose 'grad' again" in view.status
    view.mode = "grad"
    assert (view.phase, view.status) == ("ready", "")


def test_history_is_bounded_thinned_and_keeps_step_0():
    mon = sowviz.Monitor(loss, history=4, every=2)
    params = PARAMS
    for _ in range(15):
        _, g = mon.step(params, X)
        params = sgd(params, g)
    mon.flush()
    steps = [e["step"] for e in mon.history]
    assert len(steps) <= 4 and steps[0] == 0 and steps[-2:] == [12, 14]
    assert steps == sorted(steps) and all(s % 2 == 0 for s in steps)
    d = mon.to_dict()
    assert d["history"]["steps"] == steps
    assert len(d["history"]["loss"]) == len(steps)
    first = next(iter(d["history"]["probes"].values()))
    assert all(len(series) == len(steps) for series in first.values())
    # the recorded loss is the loss of that step
    assert d["history"]["loss"][-1] == pytest.approx(float(loss(params_at(14), X)), rel=1e-5)


def params_at(step):
    params = PARAMS
    for _ in range(step):
        params = sgd(params, jax.grad(loss)(params, X))
    return params


class FakeClock:
    """Seconds that move only when the test says so: the throttle's path does not
    depend on the machine's uptime or speed."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _steps_in(sent):
    steps = []
    for msg, buffers in sent:
        assert msg["type"] == "steps" and msg["encoding"] == "gzip-json"
        decoded = json.loads(gzip.decompress(buffers[0]))
        assert msg["count"] == len(decoded)
        assert all(set(s) >= {"step", "loss", "probes"} for s in decoded)
        steps += [s["step"] for s in decoded]
    return steps


def test_updates_are_throttled_and_only_new_steps_travel():
    mon = sowviz.Monitor(loss, throttle=3600.0)
    view = mon.view()
    assert isinstance(view, sowviz.MonitorView) and mon.view() is view
    view.clock = FakeClock()  # the hour never passes
    sent = []
    view.send = lambda msg, buffers=None: sent.append((msg, buffers))
    for _ in range(20):
        mon.step(PARAMS, X)
    # The first recorded step must reach the front end at once, inside the model (probe
    # ids → nodes); every later one waits for the throttle.
    first = view.model["history"]["steps"]
    assert first and first[0] == 0 and first == list(range(len(first)))
    assert sent == []
    mon.flush()  # forced: one message with every step the model does not hold
    assert len(sent) == 1
    steps = _steps_in(sent)
    assert first + steps == list(range(20))
    mon.flush()  # nothing new: nothing sent
    assert len(sent) == 1


def test_the_live_view_gets_each_step_s_program_and_every_program_s_shapes():
    # A batch of another size runs another program: the widget's model holds the
    # shapes of each, and each step (in the model or a steps message) names its own.
    mon = sowviz.Monitor(loss, throttle=3600.0)
    view = mon.view()
    view.clock = FakeClock()
    sent = []
    view.send = lambda msg, buffers=None: sent.append((msg, buffers))
    for x in (X, X, X[:2], X):
        mon.step(PARAMS, x)
    mon.flush()
    model = view.model
    steps = list(model["history"]["steps"])
    programs = list(model["history"]["program"])
    for _, buffers in sent:
        decoded = json.loads(gzip.decompress(buffers[0]))
        steps += [s["step"] for s in decoded]
        programs += [s["program"] for s in decoded]
    assert steps == [0, 1, 2, 3] and programs == [0, 0, 1, 0]
    (node,) = [n["id"] for n in model["nodes"] if n["label"] == "layer_0"]
    (probe,) = [p["id"] for p in model["probes"] if p["node"] == node]
    assert [model["programs"][k]["nodes"][node] for k in (0, 1)] == [
        ["float32[5,4]"],
        ["float32[2,4]"],
    ]
    assert [model["programs"][k]["probes"][probe] for k in (0, 1)] == [
        {"shape": [5, 4], "size": 20},
        {"shape": [2, 4], "size": 8},
    ]


def test_throttle_sends_exactly_when_the_clock_allows():
    mon = sowviz.Monitor(loss)
    mon.step(PARAMS, X)
    mon.flush()
    clock = FakeClock()
    view = sowviz.MonitorView(mon, throttle=10.0, clock=clock)
    sent = []
    view.send = lambda msg, buffers=None: sent.append((msg, buffers))
    listener = view.listener()
    entry = mon.history[0]

    def write(step, at):
        clock.t = at
        listener.write({**entry, "step": step})

    write(1, 100.0)  # the first update is the model (the history), not a message
    assert sent == [] and view.model["history"]["steps"] == [0]
    write(2, 105.0)
    write(3, 109.999)
    assert sent == []  # within the throttle
    write(4, 110.0)  # 10 s after the last update: steps 2, 3, 4 in one message
    assert _steps_in(sent) == [2, 3, 4]
    write(5, 115.0)
    assert len(sent) == 1
    listener.flush()  # forced, whatever the clock
    assert _steps_in(sent) == [2, 3, 4, 5]
    # Further behind than the outbox holds: the next update is the whole model again.
    for step in range(6, 6 + 300):
        write(step, 116.0)
    assert len(sent) == 2
    write(400, 126.0)
    assert len(sent) == 2 and view.model["history"]["steps"] == [0]


def blowup_loss(params, x):
    with jax.named_scope("body"):
        h = jnp.tanh(x @ params["w"])
    with jax.named_scope("logit"):
        z = jnp.log(params["scale"] - jnp.sum(h**2))  # NaN once scale drops below sum(h²)
    return z


def test_nan_detected_at_the_known_step():
    params = {"w": jnp.eye(4) * 0.1, "scale": jnp.asarray(3.0)}
    x = jnp.ones((1, 4))
    threshold = float(jnp.sum(jnp.tanh(x @ params["w"]) ** 2))
    mon = sowviz.Monitor(blowup_loss)
    expected = None
    for step in range(10):
        p = {**params, "scale": params["scale"] - 0.5 * step}
        if expected is None and float(p["scale"]) < threshold:
            expected = step
        mon.step(p, x)
    mon.flush()
    assert mon.nonfinite is not None and mon.nonfinite.step == expected
    logit = next(n.id for n in mon.graph.nodes if n.label == "logit")
    assert mon.nonfinite.forward == logit
    assert mon.to_dict()["history"]["nonfinite"]["step"] == expected


def test_stop_on_nonfinite_raises_with_the_stage():
    params = {"w": jnp.eye(4) * 0.1, "scale": jnp.asarray(-1.0)}
    mon = sowviz.Monitor(blowup_loss, stop_on_nonfinite=True)
    with pytest.raises(NonFiniteError, match=r"step 0.*logit"):
        mon.step(params, jnp.ones((1, 4)))


def test_works_with_optax_and_any_pytree():
    optax = pytest.importorskip("optax")
    params = {"layers": tuple(PARAMS), "extra": {"gain": jnp.asarray(1.0)}}

    def f(p, x):
        return loss(list(p["layers"]), x) * p["extra"]["gain"]

    opt = optax.adam(1e-2)
    state = opt.init(params)
    mon = sowviz.Monitor(f, history=50)
    values = []
    for _ in range(10):
        value, grads = mon.step(params, X)
        updates, state = opt.update(grads, state)
        params = optax.apply_updates(params, updates)
        values.append(float(value))
    mon.flush()
    assert values[-1] < values[0]
    assert [e["loss"] for e in mon.history] == pytest.approx(values, rel=1e-6)


@pytest.mark.browser
def test_monitor_report_with_history_in_the_browser(browser, tmp_path):
    from conftest import Page

    mon = sowviz.Monitor(loss, history=30)
    params = PARAMS
    for _ in range(12):
        _, g = mon.step(params, X)
        params = sgd(params, g)
    path = mon.save_html(tmp_path / "monitor.html")
    p = Page(browser)
    try:
        pg = p.open_report(path)
        pg.locator("[data-repeats] [data-role=toggle]").first.click()  # the layers' stack
        pg.locator('[data-kind="scope"]', has_text="layer_1").first.click()
        detail = pg.locator('[data-role="detail"]')
        detail.wait_for(state="visible")
        assert detail.locator(".js-plotly-plot").count() >= 3  # histograms + over-steps charts
        assert "step" in detail.inner_text()
        assert p.errors == [] and p.requests == []
    finally:
        p.close()


def test_bad_monitor_arguments():
    with pytest.raises(ValueError, match="`every` must be an int ≥ 1"):
        sowviz.Monitor(loss, every=0)
    with pytest.raises(TypeError, match="`fn` must be callable"):
        sowviz.Monitor(3)
    with pytest.raises(TypeError, match="unknown option"):
        sowviz.Monitor(loss, histroy=3)
    mon = sowviz.Monitor(loss)
    with pytest.raises(TypeError, match=r"keyword argument\(s\) `scale`.*functools.partial"):
        mon.step(jnp.ones((3, 4)), jnp.ones((2, 3)), scale=2.0)
    assert mon.steps == 0


def test_monitor_origin_agrees_with_the_front_end_rule():
    # A scope whose inner `log` makes the NaN: with every equation probed, the origin is
    # the equation (deeper node, same exit order), as the widget marks it.
    def f(w, x):
        with jax.named_scope("feat"):
            h = jnp.tanh(x @ w)
            h = h * jnp.log(jnp.mean(h**2, axis=-1, keepdims=True))
        return jnp.mean(h)

    mon = sowviz.Monitor(f, capture="all")
    mon.step(jnp.ones((3, 4)), jnp.zeros((2, 3)).at[0].set(1.0))
    mon.flush()
    graph = mon.graph
    assert graph.node(mon.nonfinite.forward).kind == "eqn"
    assert graph.node(graph.node(mon.nonfinite.forward).parent).label == "feat"
    assert "Inspection(" in repr(sowviz.inspect(f, jnp.ones((3, 4)), jnp.ones((2, 3))))


def test_typescript_traits_mirror_the_python_traits():
    """js/src/types.d.ts `WidgetTraits` (checked by tsc against the JS) lists exactly the
    Inspector's own synced traits, and its Phase / Mode unions their Enum values."""
    import pathlib
    import re

    ts = (pathlib.Path(__file__).parents[1] / "js" / "src" / "types.d.ts").read_text()
    body = re.search(r"export interface WidgetTraits \{(.*?)\n\}", ts, re.S).group(1)
    ts_keys = set(re.findall(r"^\s+(\w+):", body, re.M))
    base = set(anywidget.AnyWidget.class_trait_names(sync=True))
    py_keys = set(sowviz.Inspector.class_trait_names(sync=True)) - base
    assert ts_keys == py_keys

    def union(name):
        return set(
            re.findall(r'"(\w+)"', re.search(rf"export type {name} = ([^;]+);", ts).group(1))
        )

    assert union("Phase") == set(sowviz.Inspector.class_traits()["phase"].values)
    assert union("Mode") == set(sowviz.Inspector.class_traits()["mode"].values)


def test_phases_follow_this_threads_compiles_only():
    import threading

    from sowviz._progress import phases

    seen = []

    def elsewhere():
        jax.jit(lambda x: x * 3.0)(jnp.ones(7)).block_until_ready()

    with phases(seen.append):
        other = threading.Thread(target=elsewhere)
        other.start()
        other.join()
        assert seen == []  # another thread's compile is not this call's progress
        jax.jit(lambda x: jnp.cos(x) + 1.5)(jnp.ones(5)).block_until_ready()
        jax.jit(lambda x: jnp.sin(x) - 0.5)(jnp.ones(5)).block_until_ready()
    assert seen == ["compiling", "running"]  # forward only, never back
    jax.jit(lambda x: x - 2.5)(jnp.ones(3)).block_until_ready()
    assert seen == ["compiling", "running"]  # the listener is gone


def test_monitor_view_locate_button():
    params = {"w": jnp.eye(4) * 0.1, "scale": jnp.asarray(-1.0)}  # log of a negative
    mon = sowviz.Monitor(blowup_loss)
    view = mon.view()
    assert view.can_locate is True
    mon.step(params, jnp.ones((1, 4)))
    wire = Wire(view)
    view._handle_msg(
        {"content": {"data": {"method": "custom", "content": {"type": "locate"}}}, "buffers": []}
    )
    rec = view.model["history"]["nonfinite"]
    assert rec["step"] == 0 and rec["forward"]["equation"]["primitive"] == "log"
    assert rec["forward"]["equation"]["source"]["line"] == line_of(blowup_loss, "jnp.log(")
    phases = [d["state"]["phase"] for d, _ in wire.updates("phase")]
    assert phases[0] == "locating" and phases[-1] == "ready"


# --- Modes compiled ahead -------------------------------------------------------


class Compiles:
    """XLA compiles in this process while it is open (JAX's own monitoring events)."""

    def __init__(self):
        self.names: list[str] = []
        self._on = False

        def listen(event, secs, **kw):
            if self._on and event == "/jax/core/compile/backend_compile_duration":
                self.names.append(str(kw.get("fun_name", "")))

        self._listen = listen
        jax.monitoring.register_event_duration_secs_listener(listen)

    def __enter__(self):
        self._on = True
        return self

    def __exit__(self, *exc):
        self._on = False
        unregister = getattr(jax.monitoring, "unregister_event_duration_listener", None)
        if unregister is not None:  # (JAX 0.10 has none: the listener stays, switched off)
            unregister(self._listen)


def test_show_compiles_mode_all_in_the_background_so_the_switch_only_runs(monkeypatch):
    monkeypatch.setattr(sowviz.widget, "WARM_MODES", ("all",))

    def warmed_loss(params, x):  # a new function: nothing of it is compiled yet
        return loss(params, x) * 2.0

    w = sowviz.show(warmed_loss, PARAMS, X, mode="grad")
    assert w.model["mode"] == "grad" and set(w._warming) == {"all"}
    assert w._wait_warm("all", timeout=120)
    with Compiles() as during_switch:
        w.mode = "all"
    assert w.phase == "ready" and w.model["mode"] == "all", w.status
    assert during_switch.names == []  # compiled ahead: the switch only ran it
    # ... and it shows what a direct inspect in that mode shows
    direct = sowviz.inspect(warmed_loss, PARAMS, X, mode="all").to_dict(created=None)
    assert w.inspection.to_dict(created=None) == direct
    # a mode not compiled ahead still compiles on the switch
    with Compiles() as cold:
        w.mode = "jvp"
    assert w.model["mode"] == "jvp" and cold.names


def test_a_switch_to_a_mode_still_compiling_waits_for_it(monkeypatch):
    import threading

    w = sowviz.show(loss, PARAMS, X, mode="grad")
    assert w._warming == {}  # the suite turns the warm-up off (conftest)
    release, order = threading.Event(), []
    w._warm(["grad"], lambda m: order.append(("shown", m)))
    assert w._warming == {}

    def slow_compile(mode):
        release.wait(30)
        order.append(("compiled", mode))

    w._warm(["jvp"], slow_compile)
    phases = []

    def seen(change):
        phases.append(change["new"])
        if change["new"] == "compiling":  # the switch is waiting: let the compile end
            release.set()

    w.observe(seen, names=["phase"])
    orig = w._compute
    monkeypatch.setattr(w, "_compute", lambda m, **kw: (order.append(("ran", m)), orig(m, **kw))[1])
    w.mode = "jvp"
    assert order == [("compiled", "jvp"), ("ran", "jvp")]
    assert phases[0] == "compiling" and phases[-1] == "ready" and w.model["mode"] == "jvp"
    # neither the mode shown nor one warmed before is compiled again
    w._warm(["jvp", "grad", "all"], lambda m: order.append(("again", m)))
    assert w._wait_warm("grad", 30) and w._wait_warm("all", 30)
    assert order[2:] == [("again", "grad"), ("again", "all")]


def test_widgets_compile_ahead_one_at_a_time():
    import threading

    first = sowviz.show(loss, PARAMS, X, mode="grad")
    second = sowviz.show(loss, PARAMS, X, mode="grad")
    started, release, order = threading.Event(), threading.Event(), []

    def slow(mode):
        order.append("first starts")
        started.set()
        release.wait(30)
        order.append("first ends")

    first._warm(["jvp"], slow)
    assert started.wait(30)  # the first compile holds the turn
    second._warm(["jvp"], lambda m: order.append("second"))
    threading.Timer(0.3, release.set).start()
    assert first._wait_warm("jvp", 30) and second._wait_warm("jvp", 30)
    assert order == ["first starts", "first ends", "second"]


def test_warm_takes_mode_names():
    for bad in ("all", ["all", "hessian"], True):
        with pytest.raises(ValueError, match=r"`warm` must be a sequence of mode names.*\(\) for"):
            sowviz.show(loss, PARAMS, X, warm=bad)
