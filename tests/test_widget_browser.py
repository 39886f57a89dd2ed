"""The real widget, Python to browser and back: a `sowviz.show` widget's comm messages
(exactly what ipywidgets sends: state, buffer paths, binary buffers) are applied to a
page that runs the bundle as JupyterLab's widget manager would, and the front end's
messages (`save_changes`, `model.send`) go back through `Widget._handle_msg`.

Checks: the model trait syncs (the graph is drawn from it), the status line follows
the kernel's phases while `show()` and a mode switch trace and compile, errors are
shown as text, and the NaN banner's "Locate the equation" button round-trips.
"""

from __future__ import annotations

import base64
import pathlib

import jax
import jax.numpy as jnp
import pytest
from _nan_program import line_of, nan_in_scope
from conftest import Page
from ipywidgets.widgets.widget import _remove_buffers

import sowviz
import sowviz.widget as widget_mod

ROOT = pathlib.Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
TRAITS = ("model", "mode", "phase", "status", "can_locate", "key")

PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><style>{css}</style></head>
<body><div id="out" style="height: 640px"></div></body></html>"""

# The widget manager's part, as @jupyter-widgets/base does it: buffers are put back at
# their paths as DataViews, traits set, then one change event per trait.
BRIDGE = """
async (first) => {
  const mod = await import("/sowviz.js");
  const traits = {};
  const handlers = {};
  const toPython = [];
  let pending = {};
  const fire = (ev, ...args) => (handlers[ev] ?? []).forEach((fn) => fn(...args));
  const bytes = (b64) => Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const apply = ({ state, buffer_paths, buffers }) => {
    buffer_paths.forEach((path, i) => { state[path[0]] = new DataView(bytes(buffers[i]).buffer); });
    Object.assign(traits, state);
    for (const k of Object.keys(state)) fire(`change:${k}`);
  };
  const custom = (content, buffers) => fire("msg:custom", content, buffers.map((b) => new DataView(bytes(b).buffer)));
  const m = {
    get: (k) => traits[k],
    set: (k, v) => { traits[k] = v; pending[k] = v; },
    save_changes: () => { toPython.push({ method: "update", state: pending, buffer_paths: [] }); pending = {}; },
    send: (content) => toPython.push({ method: "custom", content }),
    on: (ev, fn) => { (handlers[ev] ??= []).push(fn); },
    off: (ev, fn) => { handlers[ev] = (handlers[ev] ?? []).filter((f) => f !== fn); },
  };
  apply(first);
  // as anywidget 0.11 does: `initialize` and each `render` get a proxy of their own
  const proxy = () => ({ ...m });
  mod.default.initialize({ model: proxy() });
  await mod.default.render({ model: proxy(), el: document.getElementById("out") });
  window.__bridge = { apply, custom, toPython, traits };
}
"""


def b64(buffers) -> list[str]:
    return [base64.b64encode(bytes(b)).decode("ascii") for b in buffers]


class Bridge:
    """One widget drawn in a page; `deliver()` sends Python's messages to the page,
    `pump()` sends the page's to Python (which may answer) and delivers the answers."""

    def __init__(self, browser, color_scheme="light"):
        self.p = Page(browser, color_scheme=color_scheme)
        static = ROOT / "sowviz" / "static"
        served = {
            "/index.html": (PAGE.format(css=(static / "sowviz.css").read_text()), "text/html"),
            "/sowviz.js": ((static / "sowviz.js").read_text(), "text/javascript"),
        }

        def serve(r):
            body, ctype = served["/" + r.request.url.split("/", 3)[3]]
            r.fulfill(status=200, body=body, content_type=ctype)

        self.page = self.p.page
        self.page.unroute("**/*")
        self.page.route("http://sowviz.test/**", serve)
        self.page.goto("http://sowviz.test/index.html")
        self.w = None
        self.sent: list = []

    def attach(self, w) -> None:
        """What JupyterLab does when the widget is displayed: its full state arrives."""
        self.w = w
        w.comm.send = lambda data=None, metadata=None, buffers=None: self.sent.append(
            (data, buffers or [])
        )
        state, paths, buffers = _remove_buffers(w.get_state(key=list(TRAITS)))
        self.page.evaluate(BRIDGE, {"state": state, "buffer_paths": paths, "buffers": b64(buffers)})

    def deliver(self, until=None) -> None:
        """Python → page, in order; stops after the first message for which `until` holds."""
        while self.sent:
            data, buffers = self.sent.pop(0)
            if data["method"] in ("update", "echo_update"):
                msg = {"state": data["state"], "buffer_paths": data["buffer_paths"]}
                self.page.evaluate(
                    "m => window.__bridge.apply(m)", {**msg, "buffers": b64(buffers)}
                )
            elif data["method"] == "custom":
                self.page.evaluate(
                    "([c, b]) => window.__bridge.custom(c, b)", [data["content"], b64(buffers)]
                )
            if until is not None and until(data):
                return

    def pump(self) -> None:
        for msg in self.page.evaluate("window.__bridge.toPython.splice(0)"):
            self.w._handle_msg({"content": {"data": msg}, "buffers": []})

    def close(self) -> None:
        self.p.close()


def phase_is(name):
    return lambda data: data.get("state", {}).get("phase") == name


def loss(params, x):
    h = x
    for i, p in enumerate(params):
        with jax.named_scope(f"layer_{i}"):
            h = jnp.tanh(h @ p["w"] + p["b"])
    return jnp.mean(h**2)


PARAMS = [
    {"w": jax.random.normal(jax.random.PRNGKey(i), (4, 4)) / 2, "b": jnp.zeros(4)} for i in range(2)
]
X = jax.random.normal(jax.random.PRNGKey(9), (5, 4))


@pytest.fixture
def bridge(browser):
    b = Bridge(browser)
    yield b
    b.close()


def shown_by_show(monkeypatch, bridge):
    """`show()` displays its widget before it works: attach the page at that moment."""
    monkeypatch.setattr(widget_mod, "display_now", bridge.attach)


@pytest.mark.browser
def test_show_draws_from_the_synced_model_trait_after_the_status(monkeypatch, bridge):
    shown_by_show(monkeypatch, bridge)

    def fresh_loss(params, x):  # nothing cached: it traces and compiles
        return loss(params, x)

    w = sowviz.show(fresh_loss, PARAMS, X, mode="grad")
    pg = bridge.page
    # What the cell showed at first: no graph, the status line saying what happens.
    status = pg.locator('[data-role="status"]')
    assert status.is_visible() and status.inner_text().strip() == "tracing fresh_loss…"
    assert status.locator("code", has_text="fresh_loss").count() == 1
    assert pg.locator('[data-role="empty"]').inner_text().strip() == "tracing fresh_loss…"
    assert pg.locator("[data-node-id]").count() == 0
    seen = []
    for phase in ("compiling", "running", "ready"):
        bridge.deliver(until=phase_is(phase))
        # ready: the model came just before, and is drawn now ("drawing…", then hidden)
        if phase == "ready":
            status.wait_for(state="hidden")
        seen.append((pg.evaluate("window.__bridge.traits.phase"), status.is_visible()))
        if phase == "compiling":
            assert "compiling fresh_loss with XLA" in status.inner_text()
            ARTIFACTS.mkdir(exist_ok=True)
            pg.locator(".sowviz").screenshot(path=str(ARTIFACTS / "widget_status_compiling.png"))
    assert seen == [("compiling", True), ("running", True), ("ready", False)]
    bridge.deliver()
    # The graph comes from the `model` trait (gzipped JSON in a binary buffer).
    pg.wait_for_selector("[data-node-id]")
    drawn = set(pg.locator("[data-node-id]").evaluate_all("els => els.map(e => e.dataset.nodeId)"))
    top = {n["id"] for n in w.model["nodes"] if n["parent"] == w.model["root"]}
    assert drawn == top
    assert pg.locator('[data-role="empty"]').is_hidden()
    # the first real model is a first picture, as in a report: coloured by the gradient
    # in grad mode, and fitted (every node inside the graph's box)
    stat = pg.locator('[data-role="stat"]').input_value()
    assert stat.split("\u0000") == ["cotangent", "l2"]
    box = pg.locator(".sv-graph").bounding_box()
    for b in pg.locator("[data-node-id]").evaluate_all(
        "els => els.map(e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; })"
    ):
        assert box["x"] - 1 <= b[0] and b[2] <= box["x"] + box["width"] + 1, b
        assert box["y"] - 1 <= b[1] and b[3] <= box["y"] + box["height"] + 1, b
    assert bridge.p.errors == []


@pytest.mark.browser
def test_mode_switch_shows_the_status_then_the_new_model(monkeypatch, browser):
    bridge = Bridge(browser, color_scheme="dark")
    try:
        _mode_switch(monkeypatch, bridge)
    finally:
        bridge.close()


def _mode_switch(monkeypatch, bridge):
    shown_by_show(monkeypatch, bridge)
    w = sowviz.show(loss, PARAMS, X, mode="grad")
    bridge.deliver()
    pg = bridge.page
    pg.wait_for_selector("[data-node-id]")
    pg.select_option('[data-role="mode"]', "jvp")
    bridge.pump()  # the kernel re-runs jvp (compiles once)
    assert w.model["mode"] == "jvp"
    bridge.deliver(until=phase_is("compiling"))
    status = pg.locator('[data-role="status"]')
    assert "compiling" in status.inner_text()
    assert pg.locator(".sowviz").get_attribute("data-busy") is not None  # the old graph dims
    ARTIFACTS.mkdir(exist_ok=True)
    pg.locator(".sowviz").screenshot(path=str(ARTIFACTS / "widget_mode_switch_dark.png"))
    bridge.deliver()
    status.wait_for(state="hidden")  # "drawing…" until the new model is drawn
    pg.locator('[data-kind="input"]', has_text="x").first.click()
    detail = pg.locator('[data-role="detail"]')
    detail.wait_for(state="visible")
    modes = detail.locator(".sv-chart[data-mode]").evaluate_all(
        "els => els.map(e => e.dataset.mode)"
    )
    assert modes[:2] == ["primal", "tangent"]  # drawn from the new model
    assert bridge.p.errors == []


@pytest.mark.browser
def test_a_switch_back_to_a_mode_shown_before_says_no_tracing(monkeypatch, bridge):
    """Back to a mode computed before, nothing is traced nor compiled: the kernel says
    "running", never "tracing"; then, while the new model is decoded and drawn, the
    status line says "drawing…", and goes once it is drawn."""
    shown_by_show(monkeypatch, bridge)
    w = sowviz.show(loss, PARAMS, X, mode="grad", warm=())
    bridge.deliver()
    pg = bridge.page
    pg.wait_for_selector("[data-node-id]")
    pg.select_option('[data-role="mode"]', "jvp")
    bridge.pump()  # jvp: traced and compiled the first time
    bridge.deliver()
    pg.wait_for_selector('[data-role="status"]', state="hidden")
    pg.select_option('[data-role="mode"]', "grad")
    bridge.pump()
    assert w.model["mode"] == "grad"
    states = [d["state"] for d, _ in bridge.sent if d.get("method") == "update"]
    said = [(st["phase"], st.get("status", "")) for st in states if "phase" in st]
    assert said[0][0] == "running" and "running" in said[0][1], said
    assert not any(p == "tracing" or "tracing" in t for p, t in said), said
    status = pg.locator('[data-role="status"]')
    bridge.deliver(until=phase_is("running"))
    assert status.inner_text().strip() == "running loss…"
    # the model and "ready" arrive together; the status right after them (the model is
    # still being decoded and drawn), read in the same task
    msgs = []
    while bridge.sent:
        data, buffers = bridge.sent.pop(0)
        msgs.append(
            {"state": data["state"], "buffer_paths": data["buffer_paths"], "buffers": b64(buffers)}
        )
    assert [m["state"].get("phase") for m in msgs][-1] == "ready"
    right_after = pg.evaluate(
        """(msgs) => {
        for (const m of msgs) window.__bridge.apply(m);
        const el = document.querySelector('[data-role="status"]');
        return [el.hidden, el.textContent.trim()];
    }""",
        msgs,
    )
    assert right_after == [False, "drawing…"], right_after
    status.wait_for(state="hidden")
    assert pg.locator('[data-role="stat"]').input_value().startswith("cotangent")
    assert bridge.p.errors == []


@pytest.mark.browser
def test_an_error_is_shown_as_text(monkeypatch, bridge):
    shown_by_show(monkeypatch, bridge)
    evil = "<img src=x onerror=window.__pwned=1> in `x`: pass an array"

    def broken(x):
        raise ValueError(evil)

    with pytest.raises(ValueError):
        sowviz.show(broken, jnp.ones(3))
    bridge.deliver()
    pg = bridge.page
    box = pg.locator('[data-role="error"]')
    assert box.is_visible()
    assert (
        box.inner_text().strip()
        == "ValueError: <img src=x onerror=window.__pwned=1> in x: pass an array"
    )
    assert box.locator("img").count() == 0 and pg.locator(".sowviz img").count() == 0
    assert pg.evaluate("window.__pwned") is None
    assert pg.locator('[data-role="status"]').is_hidden()
    assert bridge.p.errors == []


@pytest.mark.browser
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_locate_button_round_trip(monkeypatch, browser, scheme):
    bridge = Bridge(browser, color_scheme=scheme)
    try:
        shown_by_show(monkeypatch, bridge)
        w = sowviz.show(nan_in_scope, jnp.ones((3, 4)) * 0.1, jnp.ones((2, 3)), mode="grad")
        bridge.deliver()
        pg = bridge.page
        banner = pg.locator('[data-role="nonfinite-banner"]')
        banner.wait_for(state="visible")
        button = banner.locator('[data-role="locate"]')
        assert button.is_enabled() and button.inner_text() == "Locate the equation"
        assert "log" not in banner.inner_text().split("Forward pass:")[1].split("show")[0]
        button.click()
        assert button.is_disabled() and button.inner_text() == "Locating…"
        bridge.pump()  # Python re-runs with every equation probed
        bridge.deliver(until=phase_is("locating"))
        status = pg.locator('[data-role="status"]')
        assert "locating the equation" in status.inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        pg.locator(".sowviz").screenshot(path=str(ARTIFACTS / f"widget_locating_{scheme}.png"))
        bridge.deliver()
        line = line_of(nan_in_scope, "jnp.log(")
        eq = w.model["nonfinite"]["forward"]["equation"]
        assert eq["primitive"] == "log" and eq["source"]["line"] == line
        pg.wait_for_function(
            "() => !document.querySelector('[data-role=nonfinite-banner] [data-role=locate]')"
        )
        text = banner.inner_text()
        assert "log in feat" in text and f":{line}" in text
        assert banner.locator('[data-origin="forward"]').get_attribute("data-node") == eq["node"]
        assert status.is_hidden()
        pg.locator(".sowviz").screenshot(path=str(ARTIFACTS / f"widget_located_{scheme}.png"))
        assert bridge.p.errors == []
    finally:
        bridge.close()


@pytest.mark.browser
def test_report_locate_button_is_disabled_with_the_reason(page, tmp_path):
    ins = sowviz.inspect(nan_in_scope, jnp.ones((3, 4)) * 0.1, jnp.ones((2, 3)), mode="primal")
    assert ins.to_dict()["nonfinite"]["forward"]["equation"] is None
    pg = page.open_report(ins.save_html(tmp_path / "nan.html"))
    button = pg.locator('[data-role="nonfinite-banner"] [data-role="locate"]')
    assert button.is_disabled()
    assert "cannot re-run" in button.get_attribute("title")
    assert "locate_nonfinite()" in button.get_attribute("title")
    # located before saving: nothing left to locate, no button
    ins.locate_nonfinite()
    pg = page.open_report(ins.save_html(tmp_path / "nan2.html"))
    assert pg.locator('[data-role="locate"]').count() == 0
    assert "log in feat" in pg.locator('[data-role="nonfinite-banner"]').inner_text()
    assert page.errors == []


@pytest.mark.browser
def test_a_displayed_monitor_follows_the_run(bridge):
    # In JupyterLab the view never moved past its first step: anywidget hands
    # `initialize` (which stores the steps) and `render` (which draws them) objects of
    # their own, and the history was kept per object. The bridge does the same now.
    mon = sowviz.Monitor(loss, throttle=0.0)
    params = PARAMS
    _, grads = mon.step(params, X)
    mon.flush()
    view = mon.view()
    bridge.attach(view)  # displayed after the first step
    pg = bridge.page
    step = pg.locator('[data-role="step"]')
    step.wait_for()
    assert step.inner_text().split() == ["step", "0", "(latest)"]
    for _ in range(5):
        params = [{k: p[k] - 0.5 * g[k] for k in p} for p, g in zip(params, grads, strict=True)]
        _, grads = mon.step(params, X)
    mon.flush()
    # the new steps travel as "steps" messages, not as a whole new model
    sent = [d.get("content", {}).get("type") for d, _ in bridge.sent if d["method"] == "custom"]
    assert "steps" in sent and not [d for d, _ in bridge.sent if "model" in d.get("state", {})]
    bridge.deliver()
    pg.wait_for_function(
        "() => document.querySelector('[data-role=step]')?.textContent.startsWith('step 5')"
    )
    chart = pg.locator('[data-role="loss"] .js-plotly-plot')
    got = chart.evaluate("gd => gd.data[0].y")
    want = [e["loss"] for e in mon.history]
    assert len(want) == 6 and got == pytest.approx(want, rel=1e-6)
    assert bridge.p.errors == []
