"""The front end in a real browser: HTML reports opened from disk and the anywidget
entry point driven with a stand-in model, in Debian's headless chromium.

Every page runs with all network requests intercepted: report pages must make none.
"""

from __future__ import annotations

import gzip
import json
import math
import pathlib
import re

import pytest
from _helpers import frontend_models
from conftest import Page

from sowviz import report
from sowviz.summary import STAT_KEYS

ROOT = pathlib.Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"


fm = frontend_models()


# ---------------------------------------------------------------- without a browser


def test_model_json_cannot_break_out_of_its_script():
    model = fm.small_model()
    model["title"] = "</script><script>alert(1)</script><!-- x"
    text = report.model_json(model)
    assert "</" not in text and "<!--" not in text and "<" not in text
    assert json.loads(text) == json.loads(json.dumps(model))


def test_model_json_turns_nonfinite_floats_into_null():
    model = fm.small_model()
    model["probes"][0]["summaries"]["primal"]["min"] = float("nan")
    model["probes"][0]["summaries"]["primal"]["max"] = float("inf")
    data = json.loads(report.model_json(model))
    assert data["probes"][0]["summaries"]["primal"]["min"] is None
    assert data["probes"][0]["summaries"]["primal"]["max"] is None


def test_report_inlines_the_bundle_and_escapes_the_header(tmp_path):
    model = fm.small_model()
    page = report.render_html(model)
    bundle = (ROOT / "sowviz" / "static" / "sowviz.js").read_text(encoding="utf-8")
    assert len(page) > len(bundle)
    assert "<script src" not in page and "<link" not in page
    assert "<h1>fixture &lt;mlp&gt; &amp; friends</h1>" in page
    assert fm.INJECTION not in page  # neither in the header nor in the JSON
    assert page.count("</script>") == 2  # the model and the bundle, nothing else
    assert "Content-Security-Policy" in page
    out = report.write_html(model, tmp_path / "r.html", title="custom")
    assert out == tmp_path / "r.html"
    assert "<title>custom</title>" in out.read_text(encoding="utf-8")


def test_render_html_rejects_a_non_dict():
    with pytest.raises(TypeError, match="`model` must be a sowviz/1 dict"):
        report.render_html("not a model")  # type: ignore[arg-type]


# ---------------------------------------------------------------- in chromium


@pytest.fixture(scope="module")
def small_report(tmp_path_factory):
    return report.write_html(fm.small_model(), tmp_path_factory.mktemp("r") / "small.html")


def node(pg, nid):
    return pg.locator(f'[data-node-id="{nid}"]')


@pytest.mark.browser
def test_report_draws_the_top_level_offline(page, small_report):
    pg = page.open_report(small_report)
    ids = pg.eval_on_selector_all("[data-node-id]", "els => els.map(e => e.dataset.nodeId)")
    assert sorted(ids) == ["n1", "n11", "n2", "n6"]  # one level: the root's children
    kinds = pg.eval_on_selector_all("[data-node-id]", "els => els.map(e => e.dataset.kind)")
    assert sorted(kinds) == ["input", "output", "scope", "scope"]
    # probes: on x, on the stages (their own and inside), on the loss
    assert pg.locator('[data-has-probe="true"]').count() == 4
    assert node(pg, "n6").get_attribute("data-nonfinite") == "true"
    assert node(pg, "n2").get_attribute("data-nonfinite") is None
    assert pg.locator(".sv-edge").count() == 3
    assert page.requests == []
    assert page.errors == []


@pytest.mark.browser
def test_clicking_a_node_opens_charts_and_statistics(page, small_report):
    pg = page.open_report(small_report)
    detail = pg.locator('[data-role="detail"]')
    assert detail.is_hidden()
    node(pg, "n1").click()
    detail.wait_for(state="visible")
    assert detail.locator(".js-plotly-plot").count() == 3  # primal, tangent, cotangent
    modes = detail.locator(".js-plotly-plot").evaluate_all("els => els.map(e => e.dataset.mode)")
    assert modes == ["primal", "tangent", "cotangent"]
    table = detail.locator('[data-role="stats"]')
    stats = table.locator("tbody tr").evaluate_all("rs => rs.map(r => r.dataset.stat)")
    assert stats == list(STAT_KEYS)  # every statistic of the model, in its order
    assert table.locator('tr[data-stat="count"] td').all_inner_texts() == ["128", "128", "128"]
    assert "float32" in detail.inner_text() and "model.py" not in detail.inner_text()
    # the log-magnitude view redraws the same charts from `loghist`
    detail.locator('[data-scale="log"]').click()
    assert detail.locator(".js-plotly-plot").count() == 3
    assert "log₁₀|primal|" in detail.locator(".js-plotly-plot").first.inner_text()
    detail.locator(".sv-close").click()
    assert detail.is_hidden()
    assert page.errors == [] and page.requests == []


@pytest.mark.browser
def test_the_legend_says_what_the_sparklines_show(page, small_report):
    # a face's sparkline is the histogram of the colouring's mode: the legend says which
    pg = page.open_report(small_report)
    key = pg.locator('[data-role="legend-spark"]')
    stat = pg.locator('[data-role="stat"]')
    mode = stat.input_value().split("\x00")[0]
    assert key.inner_text() == f"{mode} histogram"
    other = next(
        v
        for v in stat.locator("option").evaluate_all("os => os.map(o => o.value)")
        if v.split("\x00")[0] != mode
    )
    stat.select_option(other)
    assert key.inner_text() == f"{other.split(chr(0))[0]} histogram"
    assert page.errors == []


@pytest.mark.browser
def test_expand_and_collapse_a_stage(page, small_report):
    pg = page.open_report(small_report)
    assert node(pg, "n7").count() == 0
    node(pg, "n6").locator('[data-role="toggle"]').click()
    assert node(pg, "n6").get_attribute("data-expanded") == "true"
    # layer_1 holds one stage, its scan: one click opens both
    assert node(pg, "n7").get_attribute("data-expanded") == "true"
    assert node(pg, "n8").count() == 1 and node(pg, "n10").count() == 1
    node(pg, "n7").locator('[data-role="toggle"]').first.click()  # closes the scan alone
    assert node(pg, "n8").count() == 0 and node(pg, "n6").get_attribute("data-expanded") == "true"
    node(pg, "n7").locator('[data-role="toggle"]').first.click()
    assert node(pg, "n8").count() == 1 and node(pg, "n10").count() == 1
    # the stage's source line shows in its detail
    node(pg, "n9").click()
    assert "model.py:23" in pg.locator('[data-role="detail"]').inner_text()
    node(pg, "n6").locator('[data-role="toggle"]').first.click()
    assert node(pg, "n6").get_attribute("data-expanded") == "false"
    assert node(pg, "n7").count() == 0 and node(pg, "n8").count() == 0
    pg.locator('[data-role="fit"]').click()
    assert page.errors == []


@pytest.mark.browser
def test_search_highlights_and_reveals(page, small_report):
    pg = page.open_report(small_report)
    search = pg.locator('[data-role="search"]')
    search.fill("layer")
    pg.wait_for_selector('[data-node-id="n2"][data-match="true"]')
    assert node(pg, "n6").get_attribute("data-match") == "true"
    assert "sv-dim" in node(pg, "n1").get_attribute("class")
    search.fill("kind:eqn mul")
    pg.wait_for_selector('[data-node-id="n6"][data-match="descendant"]')
    assert "1 match" in pg.locator('[data-role="search-count"]').inner_text()
    search.press("Enter")  # reveals the first match: opens layer_1 and its scan
    pg.wait_for_selector('[data-node-id="n8"][data-match="true"]')
    assert "sv-selected" in node(pg, "n8").get_attribute("class")
    search.fill("")
    pg.wait_for_function("() => !document.querySelector('[data-match]')")
    assert page.errors == []


@pytest.mark.browser
def test_nonfinite_nodes_and_origins(page, small_report):
    pg = page.open_report(small_report)
    # collapsed: the stage hiding both origins carries both marks
    assert node(pg, "n6").get_attribute("data-nonfinite-origin") == "forward backward"
    banner = pg.locator('[data-role="nonfinite-banner"]')
    assert banner.is_visible()
    # the backward pass's sentence is set off from the forward pass's "show" link
    assert re.search(r"show \S+ · Backward pass: ", banner.inner_text()), banner.inner_text()
    banner.locator('[data-origin="forward"]').click()  # reveals `log`
    pg.wait_for_selector('[data-node-id="n9"]')
    assert node(pg, "n9").get_attribute("data-nonfinite") == "true"
    assert node(pg, "n9").get_attribute("data-nonfinite-origin") == "forward"
    # backward runs in reverse: the stage's output cotangent is the first one broken
    assert node(pg, "n6").get_attribute("data-nonfinite-origin") == "backward"
    assert node(pg, "n8").get_attribute("data-nonfinite") is None
    assert "3 NaN" in pg.locator('[data-role="detail"] .sv-alert').inner_text()
    assert page.errors == []


@pytest.mark.browser
def test_injection_strings_are_text(page, small_report):
    pg = page.open_report(small_report)
    pg.locator('[data-role="search"]').fill("onerror")
    pg.wait_for_selector('[data-node-id="n6"][data-match="descendant"]')
    pg.locator('[data-role="search-results"] button').first.click()
    pg.wait_for_selector('[data-node-id="n10"]')
    label = node(pg, "n10").locator(".sv-label").text_content()
    assert label.startswith("<img src=x")
    assert fm.INJECTION in pg.locator('[data-role="detail"] .sv-detail-title').text_content()
    pg.locator('[data-role="notes-toggle"]').click()
    assert fm.INJECTION in pg.locator('[data-role="notes"]').inner_text()
    assert pg.locator("img").count() == 0
    assert pg.locator("h1").inner_text() == "fixture <mlp> & friends"
    assert page.dialogs == [] and page.errors == []
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "frontend_report.png"))


@pytest.mark.browser
def test_monitor_history_charts(page, tmp_path):
    path = report.write_html(fm.with_history(fm.small_model(), steps=15), tmp_path / "h.html")
    pg = page.open_report(path)
    assert pg.locator('[data-role="loss"] .js-plotly-plot').count() == 1
    node(pg, "n1").click()
    hist = pg.locator('[data-role="detail"] [data-role="history"]')
    hist.wait_for()
    assert hist.locator('[data-history="heatmap"].js-plotly-plot').count() == 3
    assert hist.locator('[data-history="norms"].js-plotly-plot').count() == 3
    assert "15 steps" in hist.text_content()
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "frontend_history.png"))
    assert page.errors == [] and page.requests == []


@pytest.mark.browser
def test_monitor_charts_mark_nonfinite_steps(page, tmp_path):
    model = fm.with_nonfinite_history(fm.small_model(), steps=12, grad_only=(6,), diverge_at=9)
    h = model["history"]
    # expected from the fixture's own data: a step is bad when its flag says so
    bad = [t for t, ok in zip(h["steps"], h["finite"], strict=True) if not ok]
    assert bad == [6, 9, 10, 11] and all(math.isnan(v) for v in h["loss"][9:])
    pg = page.open_report(report.write_html(model, tmp_path / "nf.html"))
    loss = pg.locator('[data-role="loss"] .js-plotly-plot')
    assert loss.get_attribute("data-nonfinite-steps") == ",".join(map(str, bad))
    title = pg.locator('[data-role="loss-title"]')
    assert title.text_content() == "loss · 4 non-finite steps (first: 6)"
    # red bands over runs of bad steps (halfway to the neighbours), red × at each bad step
    shapes = loss.evaluate(
        "e => e.layout.shapes.filter(s => s.type === 'rect').map(s => [s.x0, s.x1])"
    )
    assert shapes == [[5.5, 6.5], [8.5, 11.5]]
    marks = loss.evaluate("e => e.data.filter(t => t.name === 'non-finite').map(t => t.x)")
    assert marks == [bad]
    # the loss line itself: finite values drawn, NaN steps as gaps (null)
    line = loss.evaluate("e => e.data[0].y")
    assert line[:9] == pytest.approx(h["loss"][:9]) and line[9:] == [None] * 3

    node(pg, "n1").click()
    hist = pg.locator('[data-role="detail"] [data-role="history"]')
    hist.wait_for()
    probe = next(p for p in model["probes"] if p["node"] == "n1")
    for mode in probe["summaries"]:
        series = h["probes"][probe["id"]][mode]
        want = [
            t
            for t, s in zip(h["steps"], series, strict=True)
            if s["nan"] + s["posinf"] + s["neginf"]
        ]
        chart = hist.locator(f'[data-history="norms"][data-mode="{mode}"]')
        assert chart.get_attribute("data-nonfinite-steps") == ",".join(map(str, want)), mode
    assert (
        hist.locator('[data-history="norms"][data-mode="cotangent"]').get_attribute(
            "data-nonfinite-steps"
        )
        == "9,10,11"
    )
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "frontend_nonfinite_steps.png"))
    cot = hist.locator('[data-history="norms"][data-mode="cotangent"]')
    cot.scroll_into_view_if_needed()
    cot.screenshot(path=str(ARTIFACTS / "frontend_nonfinite_norms.png"))
    assert page.errors == [] and page.requests == []


def _log_layer_loss(w, x):
    """NaN wherever `x @ w` < 0, made by `log` in the stage `layer`."""
    import jax
    import jax.numpy as jnp

    with jax.named_scope("layer"):
        h = jnp.log(x @ w)
    return jnp.mean(h**2)


@pytest.mark.browser
def test_a_monitor_report_draws_the_step_its_banner_names(page, tmp_path):
    # The graph draws the latest recorded step; the NaN banner's step (7, unrecorded,
    # re-run by the Monitor) was out of reach, and nothing said which step was drawn.
    import jax.numpy as jnp

    import sowviz

    mon = sowviz.Monitor(_log_layer_loss, every=5)
    w = jnp.full((3, 2), 0.5)
    for step in range(12):
        x = jnp.full((4, 3), -1.0 if step == 7 else 1.0 + step)
        mon.step(w, x)
    mon.flush()
    history = mon.to_dict()["history"]
    assert history["steps"] == [0, 5, 7, 10] and mon.nonfinite.step == 7
    pid = next(p["id"] for p in mon.to_dict()["probes"] if p["name"] == "layer")
    pg = page.open_report(mon.save_html(tmp_path / "steps.html"))
    step = pg.locator('[data-role="step"]')
    chart = pg.locator('[data-role="loss"] .js-plotly-plot')
    layer = pg.locator(".sv-node", has_text="layer").first
    assert step.inner_text().split() == ["step", "10", "(latest)"]
    assert chart.get_attribute("data-marker") == "10"
    assert layer.get_attribute("data-nonfinite") is None  # step 10 is finite

    pg.locator('[data-role="show-step"]').click()
    assert step.locator('[data-role="step-shown"]').inner_text() == "step 7"
    assert chart.get_attribute("data-marker") == "7"
    assert layer.get_attribute("data-nonfinite") == "true"
    layer.click()
    table = pg.locator('[data-role="detail"] [data-role="stats"]')
    nan = table.locator('tr[data-stat="nan"] td').all_inner_texts()
    want = history["probes"][pid]
    i = history["steps"].index(7)
    assert nan == [str(want[m][i]["nan"]) for m in ("primal", "cotangent")]
    assert nan == ["8", "8"]
    # with no finite value, l2 says so as the other statistics do
    assert table.locator('tr[data-stat="l2"] td').all_inner_texts() == ["—", "—"]
    assert table.locator('tr[data-stat="count"] th').inner_text() == "finite"
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "frontend_monitor_past_step.png"))

    flags = pg.locator(".sv-origin-flag")
    assert flags.count() >= 1  # "NaN/Inf starts here" at step 7
    # a click on the loss chart draws the step clicked
    chart.evaluate("gd => gd.emit('plotly_click', {points: [{x: 5}]})")
    assert step.locator('[data-role="step-shown"]').inner_text() == "step 5"
    # step 5 came before the first NaN: nothing starts there (the banner still links it)
    assert flags.count() == 0
    assert pg.locator('[data-role="show-step"]').inner_text() == "show step 7"
    l2 = table.locator('tr[data-stat="l2"] td').all_inner_texts()
    j = history["steps"].index(5)
    assert [float(v) for v in l2] == pytest.approx(
        [want[m][j]["l2"] for m in ("primal", "cotangent")], rel=1e-3
    )
    pg.locator('[data-role="step-latest"]').click()
    assert step.inner_text().split() == ["step", "10", "(latest)"]
    assert layer.get_attribute("data-nonfinite") is None
    assert page.errors == [] and page.requests == []


@pytest.mark.browser
def test_a_past_step_of_another_batch_size_is_drawn_with_its_own_shapes(page, tmp_path):
    # A ragged last batch ran another program: the graph is the last one's, and a step
    # of 16 rows was described as "float32[4,32] · 128 values" (its table: 512 finite).
    import jax
    import jax.numpy as jnp

    import sowviz

    def loss(w, x):
        with jax.named_scope("hidden"):
            h = jnp.tanh(x @ w)
        return jnp.mean(h**2)

    mon = sowviz.Monitor(loss)
    w = jnp.full((8, 32), 0.1)
    for n in (16, 16, 4):
        mon.step(w, jnp.ones((n, 8)))
    model = mon.to_dict()
    ids = {n["label"]: n["id"] for n in model["nodes"] if n["kind"] in ("scope", "input")}
    pg = page.open_report(mon.save_html(tmp_path / "ragged.html"))
    step = pg.locator('[data-role="step"]')
    chart = pg.locator('[data-role="loss"] .js-plotly-plot')
    hidden = pg.locator(f'.sv-node[data-node-id="{ids["hidden"]}"]')
    x = pg.locator(f'.sv-node[data-node-id="{ids["x"]}"]')
    meta = pg.locator('[data-role="detail"] .sv-meta')

    def panel():
        return {
            k: meta.locator(f'[data-meta="{k}"]').inner_text() for k in ("shape", "captured")
        } | {
            "finite": pg.locator('[data-role="stats"] tr[data-stat="count"] td').first.inner_text()
        }

    hidden.click()
    assert "f32[4,32]" in hidden.text_content() and "f32[4,8]" in x.text_content()
    assert panel() == {
        "shape": "float32[4,32]",
        "captured": "[4, 32] · 128 values",
        "finite": "128",
    }
    chart.evaluate("gd => gd.emit('plotly_click', {points: [{x: 1}]})")
    assert step.locator('[data-role="step-shown"]').inner_text() == "step 1"
    assert "f32[16,32]" in hidden.text_content() and "f32[16,8]" in x.text_content()
    assert panel() == {
        "shape": "float32[16,32]",
        "captured": "[16, 32] · 512 values",
        "finite": "512",
    }
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "frontend_monitor_past_step_shapes.png"))
    pg.locator('[data-role="step-latest"]').click()
    assert "f32[4,32]" in hidden.text_content() and "f32[4,8]" in x.text_content()
    assert panel()["captured"] == "[4, 32] · 128 values"
    assert page.errors == [] and page.requests == []


@pytest.mark.browser
def test_dark_theme_follows_the_system(browser, small_report):
    p = Page(browser, color_scheme="dark")
    try:
        pg = p.open_report(small_report)
        assert pg.locator(".sowviz").get_attribute("data-sv-theme") == "dark"
        bg = pg.locator(".sowviz").evaluate("e => getComputedStyle(e).backgroundColor")
        r, g, b = (int(v) for v in re.findall(r"\d+", bg)[:3])
        assert r + g + b < 150
        ARTIFACTS.mkdir(exist_ok=True)
        node(pg, "n6").click()
        pg.screenshot(path=str(ARTIFACTS / "frontend_dark.png"))
        assert p.errors == []
    finally:
        p.close()


WIDGET_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><style>{css}</style></head>
<body><div id="out"></div></body></html>"""

# A stand-in for anywidget's model: get/set/on/off/save_changes and custom messages.
# The model arrives as the real Inspector's serializer sends it: the `model` trait as
# gzipped JSON in a binary buffer (tests/test_widget_browser.py drives the real widget).
FAKE_MODEL = """
async ({bytes, mode}) => {
  const mod = await import("/sowviz.js");
  const traits = { model: new DataView(new Uint8Array(bytes).buffer), mode, phase: "ready", status: "", can_locate: false };
  const handlers = {};
  const saved = [];
  const m = {
    get: (k) => traits[k],
    set: (k, v) => { traits[k] = v; },
    save_changes: () => saved.push({ ...traits, model: undefined }),
    on: (ev, fn) => { (handlers[ev] ??= []).push(fn); },
    off: (ev, fn) => { handlers[ev] = (handlers[ev] ?? []).filter((f) => f !== fn); },
    send: () => {},
  };
  const fire = (ev, ...args) => (handlers[ev] ?? []).forEach((fn) => fn(...args));
  const setModel = (b) => { traits.model = new DataView(new Uint8Array(b).buffer); fire("change:model"); };
  const cleanupModel = mod.default.initialize({ model: m });
  const el = document.getElementById("out");
  const cleanupView = await mod.default.render({ model: m, el });
  window.__widget = { m, traits, fire, saved, cleanupView, cleanupModel, handlers, setModel };
  return Object.keys(mod).sort();
}
"""


def gz(obj) -> list[int]:
    """JSON, gzipped, as a list of byte values (the wire format of the `model` trait and of
    the Monitor's "steps" message, docs/model.md)."""
    return list(gzip.compress(json.dumps(obj).encode("utf-8")))


def serve_widget_page(p):
    """Serve a bare page and the bundle from a fake origin (a module import needs one)."""
    static = ROOT / "sowviz" / "static"
    served = {
        "/index.html": (WIDGET_PAGE.format(css=(static / "sowviz.css").read_text()), "text/html"),
        "/sowviz.js": ((static / "sowviz.js").read_text(), "text/javascript"),
    }

    def serve(r):
        body, ctype = served["/" + r.request.url.split("/", 3)[3]]
        r.fulfill(status=200, body=body, content_type=ctype)

    p.page.unroute("**/*")
    p.page.route("http://sowviz.test/**", serve)
    return p.page


@pytest.mark.browser
def test_widget_entry_point_with_a_stand_in_model(browser):
    """anywidget's contract: traits model/mode/phase/status and {"type": "step"} messages."""
    p = Page(browser)
    pg = serve_widget_page(p)
    try:
        pg.goto("http://sowviz.test/index.html")
        model = fm.small_model()
        model["mode"] = "grad"
        exports = pg.evaluate(FAKE_MODEL, {"bytes": gz(model), "mode": "grad"})
        assert exports == ["autoMount", "default", "modelText", "mount", "widgetModel"]
        assert pg.locator("[data-node-id]").count() == 4
        # the mode dropdown writes the `mode` trait and shows a status at once
        pg.select_option('[data-role="mode"]', "jvp")
        assert pg.evaluate("window.__widget.traits.mode") == "jvp"
        assert pg.evaluate("window.__widget.saved.length") == 1
        assert pg.locator('[data-role="status"]').inner_text().strip() == "switching to jvp…"
        # Python answers with a new model; the view keeps the user's expansions
        node(pg, "n2").locator('[data-role="toggle"]').click()
        model2 = fm.small_model()
        model2["mode"] = "jvp"
        pg.evaluate("b => window.__widget.setModel(b)", gz(model2))
        pg.evaluate(
            "() => { window.__widget.traits.phase = 'ready'; window.__widget.fire('change:phase'); }"
        )
        pg.wait_for_function("() => document.querySelector('[data-role=status]').hidden")
        assert node(pg, "n3").count() == 1
        # errors from Python
        pg.evaluate(
            "() => { Object.assign(window.__widget.traits, {phase: 'error', status: 'mode jvp failed: <b>x</b>'}); window.__widget.fire('change:phase'); }"
        )
        assert pg.locator('[data-role="error"]').inner_text() == "mode jvp failed: <b>x</b>"
        # Monitor steps arrive as custom messages and reach the loss chart and history
        pg.evaluate(
            """() => { for (let i = 0; i < 3; i++) window.__widget.fire('msg:custom', {type: 'step', step: {
                 step: i, loss: 1 / (i + 1), probes: {p0: {primal: {count: 4, nan: 0, posinf: 0, neginf: 0, zeros: 0,
                 min: -1, max: 1, mean: 0, std: 1, l2: 2 + i, absmax: 1, size: 4,
                 hist: {edges: [-1, 0, 1], counts: [2, 2]}}}}}}); }"""
        )
        pg.wait_for_selector('[data-role="loss"] .js-plotly-plot')
        node(pg, "n1").click()
        pg.wait_for_selector('[data-role="history"]')
        assert "3 steps" in pg.locator('[data-role="history"]').text_content()
        # the live view says which step it draws; another step stays drawn while the
        # run goes on, until "back to the latest"
        step = pg.locator('[data-role="step"]')
        assert step.inner_text().split() == ["step", "2", "(latest)"]
        l2 = pg.locator('[data-role="stats"] tr[data-stat="l2"] td').first  # primal's
        assert l2.inner_text() == "4"
        chart = pg.locator('[data-role="loss"] .js-plotly-plot')
        chart.evaluate("gd => gd.emit('plotly_click', {points: [{x: 0}]})")
        assert step.locator('[data-role="step-shown"]').inner_text() == "step 0"
        assert l2.inner_text() == "2"
        pg.evaluate(
            """() => window.__widget.fire('msg:custom', {type: 'step', step: {step: 3, loss: 0.2,
                 probes: {p0: {primal: {count: 4, nan: 0, posinf: 0, neginf: 0, zeros: 0, min: -1,
                 max: 1, mean: 0, std: 1, l2: 5, absmax: 1, size: 4,
                 hist: {edges: [-1, 0, 1], counts: [2, 2]}}}}}})"""
        )
        pg.wait_for_function(
            "() => document.querySelector('[data-role=step-latest]')?.textContent.includes('(3)')"
        )
        assert step.locator('[data-role="step-shown"]').inner_text() == "step 0"
        pg.locator('[data-role="step-latest"]').click()
        assert step.inner_text().split() == ["step", "3", "(latest)"]
        assert l2.inner_text() == "5"
        # cleanup removes the view and the listeners
        pg.evaluate("() => { window.__widget.cleanupView(); window.__widget.cleanupModel(); }")
        assert pg.locator(".sowviz").count() == 0
        assert pg.evaluate("Object.values(window.__widget.handlers).every(h => h.length === 0)")
        assert p.errors == []
    finally:
        p.close()


@pytest.mark.browser
def test_widget_model_arrives_as_gzipped_bytes(browser):
    """What the real Inspector syncs: the `model` trait (gzipped JSON, a binary buffer)."""
    p = Page(browser)
    pg = serve_widget_page(p)
    try:
        pg.goto("http://sowviz.test/index.html")
        pg.evaluate(FAKE_MODEL, {"bytes": [], "mode": "grad"})
        assert pg.locator("[data-node-id]").count() == 0
        pg.evaluate("b => window.__widget.setModel(b)", gz(fm.small_model()))
        pg.wait_for_selector("[data-node-id]")
        assert pg.locator("[data-node-id]").count() == 4
        # Monitor steps: one gzipped JSON buffer per update
        steps = [
            {"step": i, "loss": 1.0 / (i + 1), "probes": {}, "nonfinite": None} for i in range(3)
        ]
        pg.evaluate(
            """bytes => { const u8 = new Uint8Array(bytes);
                 window.__widget.fire('msg:custom', {type: 'steps', encoding: 'gzip-json', count: 3},
                                      [new DataView(u8.buffer)]); }""",
            gz(steps),
        )
        pg.wait_for_selector('[data-role="loss"] .js-plotly-plot')
        assert p.errors == []
    finally:
        p.close()


@pytest.mark.browser
def test_an_empty_model_draws_an_empty_state(page, tmp_path):
    pg = page.open_report(report.write_html({}, tmp_path / "empty.html"))
    assert pg.locator("[data-node-id]").count() == 0
    assert pg.locator('[data-role="empty"]').is_visible()
    assert page.errors == [] and page.requests == []


# ---------------------------------------------------------------- what a person sees

BOXES = """() => [...document.querySelectorAll('[data-node-id]')].map((g) => {
  const bg = g.querySelector(':scope > .sv-node-bg, :scope > .sv-stage-bg');
  const r = bg.getBoundingClientRect();
  const box = (e) => { if (!e) return null; const b = e.getBoundingClientRect();
                       return [b.left, b.top, b.right, b.bottom]; };
  return { id: g.dataset.nodeId, stage: bg.classList.contains('sv-stage-bg'),
           box: [r.left, r.top, r.right, r.bottom],
           label: box(g.querySelector(':scope > .sv-stage-label')),
           head: box(g.querySelector(':scope > .sv-stage-head')),
           kind: box(g.querySelector(':scope > .sv-stage-kind')) };
})"""


def _overlap(a, b, tol=0.5):
    return a[0] < b[2] - tol and b[0] < a[2] - tol and a[1] < b[3] - tol and b[1] < a[3] - tol


def _ancestors(model):
    parent = {n["id"]: n["parent"] for n in model["nodes"]}

    def up(i):
        out = set()
        while parent.get(i) is not None:
            i = parent[i]
            out.add(i)
        return out

    return up


def assert_readable(pg, model):
    """No two drawn boxes intersect unless one holds the other; a stage's header
    (its label and its kind/value text) overlaps neither itself nor its children."""
    boxes = pg.evaluate(BOXES)
    up = _ancestors(model)
    assert boxes
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if a["id"] in up(b["id"]) or b["id"] in up(a["id"]):
                continue
            assert not _overlap(a["box"], b["box"]), (a["id"], b["id"])
    for s in (b for b in boxes if b["stage"]):
        if s["kind"]:
            assert not _overlap(s["label"], s["kind"]), s["id"]
        header = s["head"]
        for c in boxes:
            if s["id"] in up(c["id"]):
                assert not _overlap(header, c["box"]), (s["id"], c["id"])
                assert not _overlap(s["label"], c["box"]), (s["id"], c["id"])


def _by_label(model, label, parent=None):
    found = [n["id"] for n in model["nodes"] if n["label"] == label]
    if parent is not None:
        found = [
            i for i in found if next(n for n in model["nodes"] if n["id"] == i)["parent"] == parent
        ]
    assert found, label
    return found[0]


def _expand(pg, nid):
    """Open stage `nid`, unless it is open already (the model's module starts open)."""
    if node(pg, nid).get_attribute("data-expanded") != "true":
        node(pg, nid).locator('[data-role="toggle"]').first.click()
    pg.wait_for_selector(f'[data-node-id="{nid}"][data-expanded="true"]')


@pytest.fixture(scope="module")
def nnx():
    return fm.nnx_lm_model()


@pytest.fixture(scope="module")
def nnx_report(tmp_path_factory, nnx):
    return report.write_html(nnx, tmp_path_factory.mktemp("nnx") / "nnx.html")


@pytest.mark.browser
def test_nnx_model_reads_like_the_model(page, nnx, nnx_report):
    top = [n for n in nnx["nodes"] if n["parent"] == nnx["root"]]
    assert len(top) <= 60
    pg = page.open_report(nnx_report)
    labels = pg.eval_on_selector_all(
        "[data-node-id] .sv-label", "els => els.map(e => e.textContent)"
    )
    # the model's module starts open, its layers drawn (`repeats.open_model`)
    stages = pg.eval_on_selector_all(
        "[data-node-id] .sv-stage-label",
        "els => els.map(e => [...e.childNodes].filter(c => c.nodeType === 3).map(c => c.nodeValue).join(''))",
    )
    assert "parameters" in labels and stages == ["TransformerLM"]
    assert "layers[0]" in labels and "make_causal_mask" in labels
    assert_readable(pg, nnx)
    lm = _by_label(nnx, "TransformerLM")
    _expand(pg, lm)
    layer = _by_label(nnx, "layers[1]", lm)
    _expand(pg, layer)
    inside = pg.eval_on_selector_all(
        "[data-node-id] .sv-label", "els => els.map(e => e.textContent)"
    )
    assert {"attn", "mlp", "attn_norm", "mlp_norm"} <= set(inside)
    assert_readable(pg, nnx)
    # node values say what they are
    values = pg.eval_on_selector_all(
        '[data-node-id]:not([data-kind="output"]) .sv-value', "els => els.map(e => e.textContent)"
    )
    assert values and all(v.startswith("‖grad‖₂ = ") for v in values)
    # and the output node shows the loss
    out = next(n["id"] for n in nnx["nodes"] if n["kind"] == "output")
    loss = next(p for p in nnx["probes"] if p["node"] == out)["summaries"]["primal"]["mean"]
    text = node(pg, out).locator(".sv-value").text_content()
    assert text.startswith("value = ") and float(text.split("= ")[1]) == pytest.approx(
        loss, rel=1e-3
    )
    ARTIFACTS.mkdir(exist_ok=True)
    pg.locator('[data-role="fit"]').click()
    assert_readable(pg, nnx)
    pg.screenshot(path=str(ARTIFACTS / "nnx_light.png"))
    assert page.errors == [] and page.requests == []


@pytest.mark.browser
def test_first_picture_is_fitted(page, nnx, nnx_report):
    pg = page.open_report(nnx_report)
    view = pg.locator(".sv-graph").bounding_box()
    scale = pg.evaluate(
        "() => Number(/scale\\(([^,)]+)/.exec(document.querySelector('.sv-viewport').getAttribute('transform'))[1])"
    )
    boxes = pg.evaluate(BOXES)
    inside = all(
        b["box"][0] >= view["x"] - 1
        and b["box"][1] >= view["y"] - 1
        and b["box"][2] <= view["x"] + view["width"] + 1
        and b["box"][3] <= view["y"] + view["height"] + 1
        for b in boxes
    )
    assert inside or scale == pytest.approx(0.9)  # fitted, or as small as stays readable
    legend = pg.locator('[data-role="legend"]').bounding_box()
    lb = [legend["x"], legend["y"], legend["x"] + legend["width"], legend["y"] + legend["height"]]
    assert not any(_overlap(b["box"], lb) for b in boxes)


def _scale(pg):
    return pg.evaluate(
        "() => Number(/scale\\(([^,)]+)/.exec(document.querySelector('.sv-viewport').getAttribute('transform'))[1])"
    )


def _smallest_text_px(pg):
    """The smallest font size of the node faces' text as drawn on screen (px)."""
    return pg.evaluate(
        """() => {
        const k = Number(/scale\\(([^,)]+)/.exec(document.querySelector('.sv-viewport').getAttribute('transform'))[1]);
        const sizes = [...document.querySelectorAll('.sv-node text')].map((t) => parseFloat(getComputedStyle(t).fontSize));
        return Math.min(...sizes) * k;
    }"""
    )


@pytest.mark.browser
def test_a_tall_graph_in_a_widget_sized_view_stays_readable(page, nnx, nnx_report):
    """A notebook cell's 620 px: the first picture is not shrunk until its text is
    unreadable; it starts at the top (the inputs) and says there is more below. Fit
    zooms out to 9 px labels; opening a stage from there zooms back to readable
    with the stage's header in view."""
    page.page.set_viewport_size({"width": 1000, "height": 620})
    pg = page.open_report(nnx_report)
    view = pg.locator(".sv-graph").bounding_box()
    assert _smallest_text_px(pg) >= 9
    tokens = node(pg, _by_label(nnx, "tokens", nnx["root"])).bounding_box()
    assert view["y"] <= tokens["y"] <= view["y"] + 60  # the top of the graph shows
    more = pg.locator('[data-role="more-hint"]')
    assert more.is_visible() and "more below" in more.inner_text()
    pg.screenshot(path=str(ARTIFACTS / "nnx_widget_sized_first.png"))
    pg.locator('[data-role="fit"]').click()
    # asked for: as much as stays readable (round 17: node labels 9 px; it showed the
    # whole graph at 3-5 px text), from the top, the rest a drag away
    assert 0.72 <= _scale(pg) < 0.9 and "more below" in more.inner_text()
    lm = _by_label(nnx, "TransformerLM")
    layer = _by_label(nnx, "layers[1]", lm)
    node(pg, layer).locator('[data-role="toggle"]').first.click()
    pg.wait_for_selector(f'[data-node-id="{layer}"][data-expanded="true"]')
    assert _scale(pg) >= 0.9 and _smallest_text_px(pg) >= 9
    view = pg.locator(".sv-graph").bounding_box()
    head = node(pg, layer).locator(":scope > .sv-stage-head").bounding_box()
    assert view["y"] <= head["y"] and head["y"] + head["height"] <= view["y"] + view["height"]
    assert view["x"] <= head["x"] < view["x"] + view["width"] - 40
    # its first child is in view too: the opened contents are not left off-screen
    first = pg.locator(f'[data-node-id="{_by_label(nnx, "attn_norm", layer)}"]').bounding_box()
    assert view["y"] <= first["y"] and first["y"] + first["height"] <= view["y"] + view["height"]
    pg.screenshot(path=str(ARTIFACTS / "nnx_widget_sized_expanded.png"))
    # closed again: the stage's face stays in view
    node(pg, layer).locator(':scope > [data-role="toggle"]').click()
    pg.wait_for_selector(f'[data-node-id="{layer}"][data-expanded="false"]')
    face = node(pg, layer).bounding_box()
    assert view["y"] <= face["y"] and face["y"] + face["height"] <= view["y"] + view["height"]
    assert page.errors == []


@pytest.mark.browser
def test_selected_node_stays_visible_with_the_panel_open(page, nnx, nnx_report):
    pg = page.open_report(nnx_report)
    lm = _by_label(nnx, "TransformerLM")
    _expand(pg, lm)
    _expand(pg, _by_label(nnx, "layers[1]", lm))
    # the right-most and the lowest drawn leaves: the panel and the legend take those sides
    v = pg.locator(".sv-graph").bounding_box()
    boxes = [
        b
        for b in pg.evaluate(BOXES)
        if not b["stage"]
        and b["box"][0] >= v["x"]
        and b["box"][2] <= v["x"] + v["width"]
        and b["box"][1] >= v["y"]
        and b["box"][3] <= v["y"] + v["height"]
    ]
    assert len(boxes) > 5
    for pick in (max(boxes, key=lambda b: b["box"][2]), max(boxes, key=lambda b: b["box"][3])):
        node(pg, pick["id"]).locator(".sv-label").click()
        pg.locator('[data-role="detail"]').wait_for(state="visible")
        view = pg.locator(".sv-graph").bounding_box()
        (b,) = [x for x in pg.evaluate(BOXES) if x["id"] == pick["id"]]
        assert b["box"][0] >= view["x"] and b["box"][2] <= view["x"] + view["width"], pick
        assert b["box"][1] >= view["y"] and b["box"][3] <= view["y"] + view["height"], pick
        legend = pg.locator('[data-role="legend"]').bounding_box()
        lb = [
            legend["x"],
            legend["y"],
            legend["x"] + legend["width"],
            legend["y"] + legend["height"],
        ]
        assert not _overlap(b["box"], lb), pick


def _visible_boxes_under_legend(pg):
    """Drawn nodes whose visible part (clipped to the graph's drawing) meets the legend."""
    svg = pg.locator(".sv-svg").bounding_box()
    clip = [svg["x"], svg["y"], svg["x"] + svg["width"], svg["y"] + svg["height"]]
    legend = pg.locator('[data-role="legend"]').bounding_box()
    lb = [legend["x"], legend["y"], legend["x"] + legend["width"], legend["y"] + legend["height"]]
    hits = []
    for b in pg.evaluate(BOXES):
        if b["stage"]:
            continue  # an open stage's middle belongs to its children
        x0, y0, x1, y1 = b["box"]
        seen = [max(x0, clip[0]), max(y0, clip[1]), min(x1, clip[2]), min(y1, clip[3])]
        if seen[0] < seen[2] and seen[1] < seen[3] and _overlap(seen, lb):
            hits.append(b["id"])
    return hits


@pytest.mark.browser
@pytest.mark.parametrize("width", [600, 900])
def test_the_legend_never_covers_a_node(browser, nnx, width):
    """The widget in a notebook cell (620 px tall): the NNX model does not fit at a
    readable scale and runs past the bottom, where the legend is; no node is under it
    after load, after Fit, or after dragging the lowest nodes up into view."""
    p = Page(browser)
    try:
        p.page.set_viewport_size({"width": width, "height": 800})
        pg = serve_widget_page(p)
        pg.goto("http://sowviz.test/index.html")
        opened = json.loads(json.dumps(nnx))
        lm = _by_label(nnx, "TransformerLM")
        for n in opened["nodes"]:  # the model's module starts open, as inspect() stores it now
            n["collapsed"] = n["collapsed"] and n["id"] != lm
        pg.evaluate(FAKE_MODEL, {"bytes": gz(opened), "mode": "grad"})
        pg.wait_for_selector(f'[data-node-id="{lm}"][data-expanded="true"]')
        assert pg.locator('[data-role="legend"]').is_visible()
        assert _visible_boxes_under_legend(pg) == [], "load"
        pg.locator('[data-role="fit"]').click()
        assert _visible_boxes_under_legend(pg) == [], "fit"
        _expand(pg, _by_label(nnx, "layers[1]", lm))
        svg = pg.locator(".sv-svg").bounding_box()
        for _ in range(6):  # drag the drawing up, over where the legend sits
            pg.mouse.move(svg["x"] + svg["width"] / 2, svg["y"] + svg["height"] - 20)
            pg.mouse.down()
            pg.mouse.move(svg["x"] + svg["width"] / 2, svg["y"] + 40, steps=4)
            pg.mouse.up()
            assert _visible_boxes_under_legend(pg) == [], "dragged"
        pg.locator('[data-role="fit"]').click()
        assert _visible_boxes_under_legend(pg) == [], "fit, expanded"
        ARTIFACTS.mkdir(exist_ok=True)
        pg.screenshot(path=str(ARTIFACTS / f"legend_short_widget_{width}.png"))
        assert p.errors == []
    finally:
        p.close()


@pytest.mark.browser
def test_parameter_table_and_cotangent_charts(page, nnx, nnx_report):
    pg = page.open_report(nnx_report)
    params = _by_label(nnx, "parameters", nnx["root"])
    node(pg, params).locator(".sv-label").click()
    table = pg.locator('[data-role="param-table"]')
    table.wait_for()
    up = _ancestors(nnx)
    leaves = [n for n in nnx["nodes"] if n["kind"] == "input" and params in up(n["id"])]
    rows = table.locator("tbody tr")
    assert rows.count() == len(leaves) > 10
    # sorted by gradient norm, largest first: the first row is the leaf with the largest
    probes = {p["node"]: p for p in nnx["probes"]}
    grads = {n["id"]: probes[n["id"]]["summaries"]["cotangent"]["l2"] for n in leaves}
    table.locator('th[data-sort="grad"]').click()
    assert rows.first.get_attribute("data-node") == max(grads, key=grads.get)
    table.locator('th[data-sort="grad"]').click()
    assert rows.first.get_attribute("data-node") == min(grads, key=grads.get)
    # a leaf shows its value and its gradient
    rows.first.locator("button").click()
    detail = pg.locator('[data-role="detail"]')
    detail.locator(".js-plotly-plot").first.wait_for()
    modes = detail.locator(".sv-chart-block .js-plotly-plot").evaluate_all(
        "els => els.map(e => e.dataset.mode)"
    )
    assert modes == ["primal", "cotangent"]
    ARTIFACTS.mkdir(exist_ok=True)
    pg.locator('[data-role="collapse-all"]').click()
    node(pg, params).locator(".sv-label").click()
    table.wait_for()
    pg.screenshot(path=str(ARTIFACTS / "nnx_params_light.png"))
    assert page.errors == []


@pytest.mark.browser
def test_parameter_gradient_norms_over_monitor_steps(page, nnx, tmp_path):
    model = fm.with_history(nnx, steps=10)
    h = model["history"]
    params = _by_label(model, "parameters", model["root"])
    up = _ancestors(model)
    leaves = {n["id"] for n in model["nodes"] if n["kind"] == "input" and params in up(n["id"])}
    probe_of = {p["node"]: p["id"] for p in model["probes"] if p["node"] in leaves}
    # one leaf's gradient is NaN at step 7 (its l2 over the finite part stays)
    bad_pid = sorted(probe_of.values())[0]
    cot = h["probes"][bad_pid]["cotangent"]
    cot[7] = {**cot[7], "nan": 5}
    path = report.write_html(model, tmp_path / "grads.html")
    pg = page.open_report(path)
    node(pg, params).locator(".sv-label").click()
    chart = pg.locator('[data-role="param-grad-history"].js-plotly-plot')
    chart.wait_for()
    # expected: the 8 leaves with the largest gradient norm at the last step, in order
    last = {nid: h["probes"][pid]["cotangent"][-1]["l2"] for nid, pid in probe_of.items()}
    top = sorted(last, key=lambda nid: -last[nid])[:8]
    keys = pg.locator('[data-role="param-grad-key"] span')
    assert keys.evaluate_all("els => els.map(e => e.dataset.node)") == top
    traces = chart.evaluate("e => e.data.filter(t => t.name !== 'non-finite').map(t => t.y)")
    for nid, y in zip(top, traces, strict=True):
        want = [s["l2"] for s in h["probes"][probe_of[nid]]["cotangent"]]
        assert y == pytest.approx(want), nid
    assert chart.get_attribute("data-nonfinite-steps") == "7"
    title = chart.locator("xpath=..").locator(".sv-section").text_content()
    assert (
        title
        == f"gradient norms over 10 steps: the 8 largest of {len(probe_of)} leaves (at the last step)"
    )
    ARTIFACTS.mkdir(exist_ok=True)
    chart.scroll_into_view_if_needed()
    pg.screenshot(path=str(ARTIFACTS / "nnx_param_grad_history.png"))
    assert page.errors == []


@pytest.mark.browser
def test_the_panel_header_names_the_stage_s_place_never_its_id(page, nnx, nnx_report):
    pg = page.open_report(nnx_report)
    lm = _by_label(nnx, "TransformerLM")
    _expand(pg, lm)
    layer = _by_label(nnx, "layers[1]", lm)
    _expand(pg, layer)
    attn = _by_label(nnx, "attn", layer)
    node(pg, attn).locator(".sv-label").first.click()
    head = pg.locator('[data-role="detail"] .sv-detail-head')
    head.wait_for(state="visible")
    text = head.inner_text()
    assert "attn" in text and "in TransformerLM › layers[1]" in text
    assert not re.search(r"\bn\d+\b", text), text  # internal ids (`n131`) are not for users
    assert attn not in text
    assert page.errors == []


FACE_COLOURS = """() => [...document.querySelectorAll('.sv-node[data-node-id]')].map((g) => {
  const cs = (el) => el ? getComputedStyle(el) : null;
  const bg = cs(g.querySelector(':scope > .sv-node-bg:not(.sv-stacked)'));
  const chip = g.querySelector(':scope > .sv-chip');
  const lift = cs(g.querySelector(':scope > .sv-chip-lift'));
  const spark = cs(g.querySelector('.sv-spark'));
  const badge = g.querySelector('.sv-badge');
  return {
    id: g.dataset.nodeId, bg: bg.fill, chip: chip.getAttribute('fill'),
    lift: lift && lift.display !== 'none' ? [lift.fill, Number(lift.opacity)] : null,
    spark: spark ? [spark.fill, Number(spark.opacity)] : null,
    badge: badge ? [cs(badge.querySelector('text')).fill, cs(badge.querySelector('rect')).fill,
                    Number(cs(badge.querySelector('rect')).opacity)] : null,
  };
})"""


def _rgb(c):
    if c.startswith("#"):
        return tuple(int(c[i : i + 2], 16) for i in (1, 3, 5))
    return tuple(int(float(v)) for v in re.findall(r"[\d.]+", c)[:3])


def _over(fg, alpha, bg):
    return tuple(
        round(f * alpha + b * (1 - alpha)) for f, b in zip(_rgb(fg), _rgb(bg), strict=True)
    )


def _contrast(a, b):
    def lum(c):
        lin = [
            (v / 255) / 12.92 if v / 255 <= 0.03928 else ((v / 255 + 0.055) / 1.055) ** 2.4
            for v in c
        ]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted(
        [lum(_rgb(a) if isinstance(a, str) else a), lum(_rgb(b) if isinstance(b, str) else b)]
    )[::-1]
    return (hi + 0.05) / (lo + 0.05)


def _hex(c):
    return "#{:02x}{:02x}{:02x}".format(*c)


@pytest.mark.browser
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_face_colours_have_contrast(browser, nnx, nnx_report, scheme):
    """Chips of the lowest values (viridis's #440154 was 1.03:1 on a dark node),
    sparklines (2.0-2.3:1) and kind badges stand out from the node: graphics ≥ 3:1,
    badge text ≥ 4.5:1."""
    p = Page(browser, color_scheme=scheme)
    try:
        pg = p.open_report(nnx_report)
        lm = _by_label(nnx, "TransformerLM")
        _expand(pg, _by_label(nnx, "layers[1]", lm))
        faces = pg.evaluate(FACE_COLOURS)
        chips = [f for f in faces if f["chip"] != "none"]
        assert len(chips) > 5 and any(f["spark"] for f in faces)
        for f in faces:
            bg = _rgb(f["bg"])
            # (light: viridis's top, yellow, is pale on white; its dark end is 15:1)
            if f["chip"] != "none" and scheme == "dark":
                chip = (
                    _over(f["lift"][0], f["lift"][1], f["chip"]) if f["lift"] else _rgb(f["chip"])
                )
                assert _contrast(chip, bg) >= 3, (scheme, f)
            if f["spark"]:
                assert _contrast(_over(f["spark"][0], f["spark"][1], _hex(bg)), bg) >= 3, (
                    scheme,
                    f,
                )
            if f["badge"]:
                tint = _over(f["badge"][1], f["badge"][2], _hex(bg))
                assert _contrast(f["badge"][0], tint) >= 4.5, (scheme, f)
        pg.locator(".sv-graph").screenshot(path=str(ARTIFACTS / f"face_contrast_{scheme}.png"))
        assert p.errors == []
    finally:
        p.close()


@pytest.mark.browser
def test_nnx_report_dark(browser, nnx, nnx_report):
    p = Page(browser, color_scheme="dark")
    try:
        pg = p.open_report(nnx_report)
        lm = _by_label(nnx, "TransformerLM")
        _expand(pg, lm)
        _expand(pg, _by_label(nnx, "layers[1]", lm))
        assert_readable(pg, nnx)
        node(pg, _by_label(nnx, "attn", _by_label(nnx, "layers[1]", lm))).locator(
            ".sv-label"
        ).first.click()
        pg.locator('[data-role="detail"] .js-plotly-plot').first.wait_for()
        ARTIFACTS.mkdir(exist_ok=True)
        pg.screenshot(path=str(ARTIFACTS / "nnx_dark.png"))
        assert p.errors == []
    finally:
        p.close()


@pytest.mark.browser
def test_iterations_without_values_are_gaps_in_the_per_iteration_lines(page, tmp_path):
    # An iteration whose values are all NaN has no statistics (count 0); its l2, 0 by
    # definition, drew a dip to zero beside the mean's gap.
    import jax
    import jax.numpy as jnp

    import sowviz

    xs = jax.random.normal(jax.random.PRNGKey(7), (8, 3))

    def f(xs):
        def body(c, x):
            v = sowviz.sow(jnp.where(x[0] > 0, jnp.nan, jnp.tanh(x) + 1.0), "v")
            return c + jnp.nansum(v), None

        return jax.lax.scan(body, 0.0, xs)[0]

    has = [bool(r) for r in xs[:, 0] <= 0]
    assert not all(has) and any(has)
    ins = sowviz.inspect(f, xs, mode="primal", expect_nonfinite=("v",))
    pg = page.open_report(ins.save_html(tmp_path / "gaps.html"))
    pg.locator('[data-role="search"]').fill("kind:sow")
    pg.locator('[data-role="search"]').press("Enter")
    lines = pg.locator('[data-role="detail"] [data-role="per-iteration"] [data-iter="lines"]')
    lines.locator(".main-svg").first.wait_for()
    l2, mean = lines.evaluate("e => [e.data[0].y, e.data[1].y]")
    assert [v is not None for v in l2] == has and [v is not None for v in mean] == has
    assert page.errors == []


@pytest.mark.browser
@pytest.mark.parametrize("keep", [None, [0, 2, 4, 5]], ids=["all", "some"])
def test_per_iteration_charts_and_slider(page, tmp_path, keep):
    # a long loop keeps some iterations' rows (`index` names them, of `iterations`)
    model = fm.with_per_iteration(fm.small_model(), keep=keep)
    index = keep or list(range(6))
    pg = page.open_report(report.write_html(model, tmp_path / "iter.html"))
    pg.locator('[data-role="search"]').fill("steps")
    pg.locator('[data-role="search"]').press("Enter")
    detail = pg.locator('[data-role="detail"]')
    detail.wait_for(state="visible")
    if detail.locator('[data-role="probe"]').count():
        detail.locator('[data-role="probe"]').select_option("p_iter")
    blocks = detail.locator('[data-role="per-iteration"]')
    assert blocks.count() == 2
    want = model["probes"][-1]["summaries"]["primal"]["per_iteration"]
    lines = blocks.first.locator('[data-iter="lines"]')
    lines.locator(".main-svg").first.wait_for()
    l2 = lines.evaluate("e => e.data[0].y")
    assert l2 == pytest.approx(want["l2"])
    assert lines.evaluate("e => Array.from(e.data[0].x)") == index  # by iteration
    title = blocks.first.locator(".sv-chart-title").inner_text()
    assert title == (
        "primal: per iteration (6)" if keep is None else "primal: per iteration (4 of 6 kept)"
    )
    slider = blocks.first.locator('[data-role="iteration"]')
    hist = blocks.first.locator('[data-iter="hist"]')
    assert hist.evaluate("e => e.data[0].y") == want["hist_counts"][-1]
    slider.evaluate("e => { e.value = '2'; e.dispatchEvent(new Event('input')); }")
    assert hist.evaluate("e => e.data[0].y") == want["hist_counts"][2]
    label = blocks.first.locator('[data-role="iteration-label"]').inner_text()
    assert label == f"{index[2]} of 0–5"  # the iteration and the range it is from
    assert page.errors == []


@pytest.mark.browser
def test_histograms_do_not_mislead(page, tmp_path):
    model = fm.small_model()
    s = model["probes"][0]["summaries"]["primal"]
    s["zeros"] = 5
    pg = page.open_report(report.write_html(model, tmp_path / "h.html"))
    node(pg, "n1").click()
    detail = pg.locator('[data-role="detail"]')
    counts = detail.locator('[data-role="special-counts"][data-mode="primal"]')
    assert counts.inner_text().split() == ["NaN", "0", "+Inf", "0", "−Inf", "0", "zeros", "5"]
    ticks = detail.locator('.sv-chart[data-mode="primal"] .ytick text').evaluate_all(
        "els => els.map(e => e.textContent)"
    )
    assert ticks and all(re.fullmatch(r"[\d,]+", t) for t in ticks), ticks
    assert detail.locator('[data-role="zeros-left-out"]').count() == 0
    detail.locator('[data-scale="log"]').click()
    assert "5 zeros not shown" in detail.locator('[data-role="zeros-left-out"]').first.inner_text()
    # NaN/Inf counts of a non-finite probe, drawn beside its histogram
    node(pg, "n6").click()
    nan = model["probes"][3]["summaries"]["primal"]["nan"]
    assert (
        f"NaN {nan}"
        in detail.locator('[data-role="special-counts"][data-mode="primal"]').inner_text()
    )
    assert page.errors == []


@pytest.mark.browser
def test_search_results_show_their_path_and_close_on_enter(page, small_report):
    pg = page.open_report(small_report)
    search = pg.locator('[data-role="search"]')
    search.fill("mul")
    results = pg.locator('[data-role="search-results"]')
    results.wait_for(state="visible")
    assert "in layer_1 › steps" in results.locator('[data-role="result-path"]').first.inner_text()
    search.press("Enter")
    assert results.is_hidden()
    assert node(pg, "n8").count() == 1  # revealed


@pytest.mark.browser
def test_report_mode_picker_says_why_it_is_disabled(page, small_report):
    pg = page.open_report(small_report)
    picker = pg.locator('[data-role="mode"]')
    assert picker.is_disabled()
    assert "cannot re-run" in picker.get_attribute("title")


@pytest.mark.browser
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_signed_log_histogram(browser, tmp_path, scheme):
    """The signed log view: positive magnitudes above, negative ones mirrored below, with
    the counts NumPy gives; offered only where the summary has `loghist.neg`."""
    import numpy as np

    model = fm.with_signed_loghist(fm.small_model())
    x = fm.signed_values()
    lh = model["probes"][0]["summaries"]["primal"]["loghist"]
    edges = np.asarray(lh["edges"])
    nz = x[x != 0]
    want_pos, _ = np.histogram(np.log10(nz[nz > 0]), bins=edges)
    want_neg, _ = np.histogram(np.log10(-nz[nz < 0]), bins=edges)
    p = Page(browser, color_scheme=scheme)
    try:
        pg = p.open_report(report.write_html(model, tmp_path / "signed.html"))
        node(pg, "n1").click()
        detail = pg.locator('[data-role="detail"]')
        seg = detail.locator('[data-scale="signed"]')
        assert seg.count() == 1
        seg.click()
        chart = detail.locator('.sv-chart[data-mode="primal"]')
        assert chart.get_attribute("data-signed") == "true"
        traces = chart.evaluate("e => e.data.map(t => ({name: t.name, y: t.y, axis: t.yaxis}))")
        assert [(t["name"], t["axis"]) for t in traces] == [("positive", "y"), ("negative", "y2")]
        # the first bin's values are "under": the drawn bins equal NumPy's on the rest
        assert traces[0]["y"] == want_pos.tolist()
        assert traces[1]["y"] == want_neg.tolist()
        assert sum(traces[0]["y"]) + sum(traces[1]["y"]) == sum(lh["counts"])
        # mirrored: the negative axis runs downwards on the same scale as the positive one
        rng = chart.evaluate("e => [e.layout.yaxis.range, e.layout.yaxis2.range]")
        assert rng[0] == rng[1][::-1]
        counts = detail.locator('[data-role="special-counts"][data-mode="primal"]')
        assert "7 zeros not shown" in counts.inner_text()
        under = int(np.sum(np.log10(np.abs(nz)) < edges[0]))
        under_neg = int(np.sum((np.log10(np.abs(nz)) < edges[0]) & (nz < 0)))
        assert (
            f"{under} tiny values below the first bin ({under - under_neg} positive, "
            f"{under_neg} negative)" in counts.inner_text()
        )
        pos_total = int(np.sum(nz > 0))
        neg_total = int(np.sum(nz < 0))
        assert f"{pos_total} positive above, {neg_total} negative below" in counts.inner_text()
        # the cotangent summary has no sign counts: drawn as the plain log view
        cot = detail.locator('.sv-chart[data-mode="cotangent"]')
        assert cot.get_attribute("data-signed") == "false"
        pg.wait_for_timeout(300)
        ARTIFACTS.mkdir(exist_ok=True)
        detail.screenshot(path=str(ARTIFACTS / f"signed_loghist_{scheme}.png"))
        # log counts: both halves on one log scale
        detail.locator('[data-role="log-count"]').check()
        assert chart.evaluate("e => [e.layout.yaxis.type, e.layout.yaxis2.type]") == ["log", "log"]
        # a probe without sign counts offers no signed view
        node(pg, "n6").click()
        assert detail.locator('[data-scale="signed"]').count() == 0
        assert p.errors == []
    finally:
        p.close()


@pytest.mark.browser
def test_signed_log_view_of_a_real_inspection(page, tmp_path):
    """As a user meets it: `inspect` computes `loghist.neg` on the device; the signed view
    draws, per magnitude bin, the positive and negative counts NumPy finds."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import sowviz

    pos = jnp.exp(jax.random.normal(jax.random.PRNGKey(0), (300,)))
    neg = -jnp.exp(jax.random.normal(jax.random.PRNGKey(1), (100,)) - 3.0)
    x = jnp.concatenate([pos, neg, jnp.zeros(5)])

    def f(x):
        with jax.named_scope("signed"):
            y = x * 1.0
        return jnp.sum(y**2)

    ins = sowviz.inspect(f, x, mode="primal")
    probe = ins.probe("signed")
    lh = probe.summaries["primal"]["loghist"]
    pg = page.open_report(ins.save_html(tmp_path / "signed_real.html"))
    node(pg, probe.node).click()
    detail = pg.locator('[data-role="detail"]')
    detail.locator('[data-scale="signed"]').click()
    chart = detail.locator('.sv-chart[data-mode="primal"]')
    drawn = chart.evaluate("e => e.data.map(t => t.y)")
    v = np.asarray(x)
    edges = 10.0 ** np.asarray(lh["edges"])
    want_pos, _ = np.histogram(v[v > 0], bins=edges)
    want_neg, _ = np.histogram(-v[v < 0], bins=edges)
    assert drawn == [want_pos.tolist(), want_neg.tolist()]
    assert (
        sum(drawn[0]) == 300 - (lh["under"] - lh["under_neg"])
        and sum(drawn[1]) == 100 - lh["under_neg"]
    )
    text = detail.locator('[data-role="special-counts"][data-mode="primal"]').inner_text()
    assert "5 zeros not shown" in text and "300 positive above, 100 negative below" in text
    assert page.errors == []


@pytest.mark.browser
def test_a_note_names_its_node_by_label_and_shows_it(page, tmp_path):
    # A custom rule's note said "n28: 1 call(s) of custom_jvp_call `relu` …".
    import jax
    import jax.numpy as jnp

    import sowviz

    @jax.custom_jvp
    def relu(x):  # the user's own rule: `jax.nn.relu`'s makes no note (round 17)
        return jnp.maximum(x, 0.0)

    relu.defjvps(lambda t, ans, x: t * (x > 0))

    def f(w, x):
        with jax.named_scope("layer"):
            h = relu(x @ w)
        return jnp.sum(h**2)

    ins = sowviz.inspect(f, jnp.ones((3, 4)), jnp.ones((2, 3)), capture="all")
    (note,) = [n for n in ins.to_dict()["notes"] if "relu" in n["message"]]
    target = ins.graph.node(note["probe"])
    pg = page.open_report(ins.save_html(tmp_path / "notes.html"))
    pg.locator('[data-role="notes-toggle"]').click()
    item = pg.locator('[data-role="notes"] li').first
    assert item.inner_text().startswith(f"{target.label}: 1 call(s)")
    assert not re.match(r"n\d+:", item.inner_text())
    item.locator("button").click()
    pg.wait_for_selector(f'[data-node-id="{target.id}"].sv-selected')
    assert page.errors == []


@pytest.mark.browser
def test_a_revealed_node_stays_in_view_when_the_detail_panel_opens(page, tmp_path):
    # Searching diffrax's `vector_field` (13 levels deep) selected it, and the detail
    # panel opening with it resized the view: its fit put the node 800 px below it.
    import jax
    import jax.numpy as jnp

    import sowviz

    def f(x):
        for i in range(24):  # a tall graph: at its least scale the bottom is out of view
            with jax.named_scope(f"stage{i}"):
                x = jnp.sin(x) * (1.0 + i) if i % 2 else jnp.tanh(x) + i
        with jax.named_scope("outer"), jax.named_scope("middle"), jax.named_scope("deep_target"):
            x = jnp.cos(x)
        return jnp.sum(x)

    pg = page.open_report(sowviz.inspect(f, jnp.ones(3)).save_html(tmp_path / "tall.html"))
    pg.locator('[data-role="search"]').fill("deep_target")
    pg.keyboard.press("Enter")
    target = pg.locator(".sv-selected")
    target.wait_for()
    pg.wait_for_timeout(500)  # the panel's resize, and any fit after it
    view = pg.locator(".sv-canvas svg").first.bounding_box()
    box = target.bounding_box()
    assert "deep_target" in target.text_content()
    assert view["x"] <= box["x"] and box["x"] + box["width"] <= view["x"] + view["width"], box
    assert view["y"] <= box["y"] and box["y"] + box["height"] <= view["y"] + view["height"], box
    assert page.errors == []


@pytest.mark.browser
def test_a_note_said_of_several_stages_links_each(page, tmp_path):
    # optax's line search said the same note of three `sum` stages, three identical lines
    import jax.numpy as jnp
    from _notes_program import energy_twice

    import sowviz

    ins = sowviz.inspect(energy_twice, jnp.linspace(0.1, 1.0, 4))
    (note,) = [n for n in ins.to_dict()["notes"] if "differentiated inside" in n["message"]]
    pg = page.open_report(ins.save_html(tmp_path / "notes.html"))
    pg.locator('[data-role="notes-toggle"]').click()
    item = pg.locator('[data-role="notes"] li', has_text="differentiated inside")
    assert item.count() == 1
    assert item.inner_text().startswith("energy (2 places: 1 2): energy is differentiated")
    assert item.locator("code").first.inner_text() == "energy"  # backticks: code, not text
    places = item.locator('[data-role="note-places"] button')
    assert places.nth(1).get_attribute("title") == "show it in second"
    places.nth(1).click()
    pg.wait_for_selector(f'[data-node-id="{note["nodes"][1]}"].sv-selected')
    detail = pg.locator('[data-role="detail"]').inner_text()
    assert "differentiated inside" in detail
    assert page.errors == []


@pytest.mark.browser
@pytest.mark.parametrize("steps", [1, 2])
def test_a_short_run_s_loss_chart_has_whole_steps_and_distinct_ticks(page, tmp_path, steps):
    # One step was a dot on a -1…1 axis; two close losses had two y ticks both "0.356".
    import jax
    import jax.numpy as jnp

    import sowviz

    def loss(p, x):
        with jax.named_scope("h"):
            h = jnp.tanh(x @ p["w"])
        return jnp.mean(h**2)

    p, mon = {"w": jnp.ones((3, 4)) * 0.3}, sowviz.Monitor(loss)
    for s in range(steps):
        _, g = mon.step(p, jnp.ones((2, 3)) * (1 + 0.001 * s))
        p = {"w": p["w"] - 0.01 * g["w"]}
    pg = page.open_report(mon.save_html(tmp_path / "run.html"))
    mon.close()
    box = pg.locator('[data-role="loss"]')
    pg.wait_for_function("() => document.querySelectorAll('[data-role=\"loss\"] .xtick').length")
    xs = box.locator(".xtick text").evaluate_all("els => els.map(e => e.textContent)")
    ys = box.locator(".ytick text").evaluate_all("els => els.map(e => e.textContent)")
    assert xs == [str(s) for s in range(steps)], xs
    assert len(set(ys)) == len(ys) and ys, ys
    assert page.errors == []


@pytest.mark.browser
def test_a_scan_s_two_outputs_face_and_panel(page, tmp_path):
    """A scan returns its carry and its stacked ys. Its face describes the carry (its
    first output, as its shape "f32[4] +1" does) and says so; the panel's rows about
    the values (output, captured) follow the output picked, not the first one."""
    import jax
    import jax.numpy as jnp

    import sowviz

    def f(w, xs):
        def step(c, x):
            c = jnp.tanh(c @ w + x)
            return c, c * 2.0

        c, ys = jax.lax.scan(step, jnp.zeros(4), xs)
        return jnp.sum(c**2) + jnp.mean(ys**2)

    w = jax.random.normal(jax.random.PRNGKey(0), (4, 4)) / 2
    xs = jax.random.normal(jax.random.PRNGKey(1), (6, 4))
    ins = sowviz.inspect(f, w, xs, mode="grad")
    model = ins.to_dict()
    scan = next(n["id"] for n in model["nodes"] if n["kind"] == "scan")
    carry, ys = (p for p in model["probes"] if p["node"] == scan)
    pg = page.open_report(ins.save_html(tmp_path / "scan.html"))
    if not next(n for n in model["nodes"] if n["id"] == scan)["collapsed"]:
        # (the scan holds most of the program's work, its carry's zeros folded in: the
        # first view opens it; closed, its face shows)
        node(pg, scan).locator('[data-role="toggle"]').first.click()
    value = node(pg, scan).locator(".sv-value").text_content()
    # the carry's value, named by its statistic (the output it is, when the face is
    # wide enough: the tooltip says it), never over the "+ 5 eqns" button
    assert "‖grad‖₂ = " in value and value.endswith(
        f"= {carry['summaries']['cotangent']['l2']:.4g}"
    ), value
    node(pg, scan).locator(".sv-label").click()
    detail = pg.locator('[data-role="detail"]')
    captured = detail.locator('[data-meta="captured"]')
    assert captured.inner_text() == "[4] · 4 values"
    assert detail.locator('[data-meta="output"]').inner_text() == "[0] (1 of 2)"
    detail.locator('[data-role="probe"]').select_option(ys["id"])
    assert captured.inner_text() == "[6, 4] · 24 values"
    assert detail.locator('[data-meta="output"]').inner_text() == "[1] (2 of 2)"
    cell = detail.locator('[data-role="stats"] tr[data-stat="l2"] td').last
    assert float(cell.inner_text()) == pytest.approx(ys["summaries"]["cotangent"]["l2"], rel=1e-3)
    pg.screenshot(path=str(ARTIFACTS / "scan_two_outputs.png"))
    assert page.errors == []


@pytest.mark.browser
def test_a_long_probe_name_keeps_the_picker_inside_the_panel(page, tmp_path):
    # The picker of a stage's outputs ran past the panel's right edge (its options
    # name the stage, the output and its type).
    import jax
    import jax.numpy as jnp

    import sowviz

    def a_recurrent_block_step_with_a_long_descriptive_name(c, x):
        c = jnp.tanh(c + x)
        return c, c * 2.0

    def f(xs):
        c, ys = jax.lax.scan(a_recurrent_block_step_with_a_long_descriptive_name, xs[0], xs)
        return jnp.sum(c**2) + jnp.mean(ys**2)

    ins = sowviz.inspect(f, jnp.ones((6, 4, 3, 2)), mode="grad")
    scan = next(n["id"] for n in ins.to_dict()["nodes"] if n["kind"] == "scan")
    pg = page.open_report(ins.save_html(tmp_path / "long.html"))
    node(pg, scan).locator(".sv-label").click()
    detail = pg.locator('[data-role="detail"]')
    picker = detail.locator('[data-role="probe"]').bounding_box()
    panel = detail.bounding_box()
    assert picker["x"] + picker["width"] <= panel["x"] + panel["width"], (picker, panel)
    assert page.errors == []


@pytest.mark.browser
def test_the_iteration_slider_names_the_iteration_and_its_range(page, tmp_path):
    # A 3-iteration lax.map's slider read "2 of 2" (two iterations, one too few) while
    # the stacked-blocks slider read "3 of 0–3": both now say "i of first–last", in the
    # numbers their charts' x axes use.
    import jax
    import jax.numpy as jnp
    import numpy as np

    import sowviz

    def f(w, xs):
        def body(x):
            with jax.named_scope("act"):
                return jnp.tanh(x @ w) * 2.0

        return jnp.sum(jax.lax.map(body, xs) ** 2)

    w = jax.random.normal(jax.random.PRNGKey(0), (4, 4))
    xs = jax.random.normal(jax.random.PRNGKey(1), (3, 5, 4))
    ins = sowviz.inspect(f, w, xs)
    pg = page.open_report(ins.save_html(tmp_path / "map.html"))
    # (the loop is `map(act)`, named by the one stage its body holds: the scope itself)
    pg.locator('[data-role="search"]').fill("kind:scope act")
    pg.locator('[data-role="search"]').press("Enter")  # reveals and selects the stage
    block = pg.locator('[data-role="per-iteration"][data-mode="primal"]')
    lines = block.locator('[data-iter="lines"]')
    lines.locator(".main-svg").first.wait_for()
    # each iteration's value by NumPy: three of them, numbered 0, 1, 2 on the chart
    ys = [2.0 * np.tanh(np.asarray(x, np.float64) @ np.asarray(w, np.float64)) for x in xs]
    assert block.locator(".sv-chart-title").inner_text() == "primal: per iteration (3)"
    assert lines.evaluate("e => Array.from(e.data[0].x)") == [0, 1, 2]
    np.testing.assert_allclose(
        lines.evaluate("e => e.data[0].y"), [np.linalg.norm(y) for y in ys], rtol=1e-5
    )
    label = block.locator('[data-role="iteration-label"]')
    assert label.inner_text() == "2 of 0–2"  # the last of the three
    slider = block.locator('[data-role="iteration"]')
    slider.evaluate("e => { e.value = '0'; e.dispatchEvent(new Event('input')); }")
    assert label.inner_text() == "0 of 0–2"
    assert sum(block.locator('[data-iter="hist"]').evaluate("e => e.data[0].y")) == ys[0].size
    assert page.errors == []


@pytest.mark.browser
def test_fill_values_never_set_the_colour_scale(page, tmp_path):
    # Masked attention logits, jnp.where(mask, s, finfo.min), have an l2 at float32's
    # max: the legend ran from 0.02 to 3.403e+38 and every other stage took one colour
    # (the percentile cut missed them when they were more than 2% of the stages).
    import jax
    import jax.numpy as jnp
    import numpy as np

    import sowviz

    def attend(q, k):
        with jax.named_scope("scores"):
            s = q @ k.T
        with jax.named_scope("masked"):
            s = jnp.where(jnp.tril(jnp.ones(s.shape, bool)), s, jnp.finfo(s.dtype).min)
        with jax.named_scope("probs"):
            p = jax.nn.softmax(s, axis=-1)
        with jax.named_scope("scaled"):
            return 100.0 * (p @ k)

    q = jax.random.normal(jax.random.PRNGKey(0), (6, 4))
    k = jax.random.normal(jax.random.PRNGKey(1), (6, 4))
    ins = sowviz.inspect(attend, q, k, mode="primal")
    pg = page.open_report(ins.save_html(tmp_path / "masked.html"))
    pg.locator(".sv-legend-tick").first.wait_for()
    # the largest l2 that is no fill value: the scaled output's, by NumPy
    qn, kn = np.asarray(q, np.float64), np.asarray(k, np.float64)
    s = np.where(np.tril(np.ones((6, 6), bool)), qn @ kn.T, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    top = np.linalg.norm(100.0 * (p @ kn))
    hi = pg.locator(".sv-legend-tick").nth(1).inner_text()
    assert hi.startswith("≥ ")  # the masked stage lies past the top, in its colour
    assert float(hi[2:]) == pytest.approx(top, rel=1e-3)

    def chip(label):
        nid = next(n.id for n in ins.graph.nodes if n.label == label)
        return pg.locator(f'[data-node-id="{nid}"] > .sv-chip').get_attribute("fill")

    assert chip("masked") == chip("scaled") == "#fde725"  # viridis's top
    assert len({chip("scores"), chip("probs"), chip("scaled")}) == 3  # spread, not one colour
    assert page.errors == []


@pytest.mark.browser
def test_a_monitor_s_nan_flags_stay_on_the_step_that_had_the_nan(page, tmp_path):
    # The latest step (7) is finite, the NaN was at step 3: its "NaN/Inf starts here"
    # flags marked the boxes of step 7. They belong to step 3; step 7 shows the banner
    # naming step 3 and the way to it.
    import jax.numpy as jnp
    import numpy as np

    import sowviz

    mon = sowviz.Monitor(_log_layer_loss, every=1)
    w = jnp.full((3, 2), 0.5)
    xs = [jnp.full((4, 3), -1.0 if step == 3 else 1.0 + step) for step in range(8)]
    for x in xs:
        mon.step(w, x)
    mon.flush()
    # which steps hold NaN, by NumPy: log of a negative x @ w at step 3 only
    with np.errstate(invalid="ignore"):
        finite = [bool(np.isfinite(np.log(np.asarray(x) @ np.asarray(w))).all()) for x in xs]
    assert [s for s, ok in enumerate(finite) if not ok] == [3] and mon.nonfinite.step == 3
    pg = page.open_report(mon.save_html(tmp_path / "monitor.html"))
    layer = pg.locator(".sv-node", has_text="layer").first
    flags = pg.locator(".sv-origin-flag")
    banner = pg.locator('[data-role="nonfinite-banner"]')
    assert pg.locator('[data-role="step"]').inner_text().split() == ["step", "7", "(latest)"]
    assert layer.get_attribute("data-nonfinite") is None  # step 7 is finite
    assert flags.count() == 0
    assert pg.locator("[data-nonfinite-origin], [data-nonfinite-role]").count() == 0
    assert banner.locator("strong").inner_text() == "NaN/Inf detected at step 3."
    assert pg.locator('[data-role="show-step"]').inner_text() == "show step 3"

    pg.locator('[data-role="show-step"]').click()  # the step that had the NaN: flagged
    assert pg.locator('[data-role="step-shown"]').inner_text() == "step 3"
    assert layer.get_attribute("data-nonfinite") == "true"
    assert "forward" in (layer.get_attribute("data-nonfinite-origin") or "")
    assert flags.count() >= 1
    pg.locator('[data-role="step-latest"]').click()
    assert flags.count() == 0
    assert page.errors == [] and page.requests == []


@pytest.mark.browser
def test_a_primal_report_colours_by_primal_values_beside_a_sow_under_an_inner_grad(page, tmp_path):
    # An HMC-style step: its log density's `sow` sits under an inner jax.grad, so in a
    # primal run that sow holds a cotangent too. The report was coloured by cotangent
    # (the first picture's default whenever a probe had one): every stage but the sow
    # had no value. A primal run colours by primal values, whatever the model files the
    # sow's inner cotangent under (a `cotangent` key or the sow's `['inner cotangent']`
    # leaf: the next test holds the first case whatever Python does).
    import jax
    import jax.numpy as jnp
    import numpy as np

    import sowviz

    def logdensity(x):
        return -0.5 * jnp.sum(sowviz.sow(jnp.tanh(x), "h") ** 2)

    def leapfrog(x):
        p = jnp.ones_like(x)
        for _ in range(3):
            p = p + 0.05 * jax.grad(logdensity)(x)
            x = x + 0.1 * p
        return jnp.sum(x)

    x = jnp.linspace(-1.0, 1.0, 8)
    ins = sowviz.inspect(leapfrog, x, mode="primal")
    assert ins.to_dict()["mode"] == "primal"
    pg = page.open_report(ins.save_html(tmp_path / "leapfrog.html"))
    assert pg.locator('[data-role="stat"]').input_value() == "primal\x00l2"
    title = pg.locator('[data-role="legend"] .sv-legend-title').inner_text()
    assert title.startswith("primal ")
    # the input's face: ‖x‖₂ by NumPy
    x_id = next(n.id for n in ins.graph.nodes if n.kind == "input" and n.label == "x")
    want = float(np.linalg.norm(np.linspace(-1.0, 1.0, 8)))
    face = pg.locator(f'[data-node-id="{x_id}"] .sv-value').text_content()
    assert face.startswith("‖x‖₂ = ") and float(face.split("= ")[1]) == pytest.approx(want, 1e-3)
    # every drawn stage but the output (which shows its value) has a primal value
    faces = pg.locator(".sv-node:not([data-kind='output']) .sv-value").all_text_contents()
    assert len(faces) >= 4 and all("‖x‖₂ = " in f for f in faces), faces
    assert page.errors == [] and page.requests == []


@pytest.mark.browser
def test_jax_s_masked_attention_fill_never_sets_the_colour_scale(page, tmp_path):
    # jax.nn.dot_product_attention fills masked logits with -0.7 * finfo.max (2.38e38 in
    # float32), not finfo.min: a greedy decoder's masked cache slots set the legend's top
    # to 3.403e+38 and every box took one colour.
    import jax
    import jax.numpy as jnp
    import numpy as np

    import sowviz

    T, D, FILLED = 6, 4, 3

    def decode(q, k, v):
        valid = jnp.arange(T) < FILLED  # the cache slots filled so far
        with jax.named_scope("attention"):
            o = jax.nn.dot_product_attention(q, k, v, mask=valid[None, None, None, :])
        with jax.named_scope("scaled"):
            return 100.0 * o

    q, k, v = (
        jax.random.normal(jax.random.PRNGKey(i), s)
        for i, s in enumerate([(1, 1, 1, D), (1, T, 1, D), (1, T, 1, D)])
    )
    ins = sowviz.inspect(decode, q, k, v, mode="primal")
    fills = [p for p in ins.to_dict()["probes"] if p["summaries"]["primal"]["absmax"] > 1e38]
    assert fills, "the masked logits are a stage of their own"
    pg = page.open_report(ins.save_html(tmp_path / "decode.html"))
    pg.locator(".sv-legend-tick").first.wait_for()
    # the largest l2 that is no fill value: the scaled output's, by NumPy
    qn, kn, vn = (np.asarray(a, np.float64)[0, :, 0] for a in (q, k, v))
    s = (qn @ kn[:FILLED].T) / np.sqrt(D)
    p = np.exp(s - s.max())
    p /= p.sum()
    top = np.linalg.norm(100.0 * (p @ vn[:FILLED]))
    hi = pg.locator(".sv-legend-tick").nth(1).inner_text()
    assert hi.startswith("≥ ")  # the masked logits lie past the top, in its colour
    assert float(hi[2:]) == pytest.approx(top, rel=1e-3)

    def chip(label):
        nid = next(n.id for n in ins.graph.nodes if n.label == label)
        return pg.locator(f'[data-node-id="{nid}"] > .sv-chip').get_attribute("fill")

    assert chip("scaled") == "#fde725"  # viridis's top
    assert len({chip("q"), chip("k"), chip("scaled")}) == 3  # spread, not one colour
    assert page.errors == []


@pytest.mark.browser
def test_the_loss_chart_never_covers_a_node_however_the_view_moves(page, tmp_path):
    # The Monitor's loss chart floated over the graph's bottom right: fits kept clear of
    # it, but a click, a search or a drag put boxes under it (a scan model's `add` with
    # its ‖grad‖₂, and `head`). It sits in the strip under the graph now.
    import jax
    import jax.numpy as jnp

    import sowviz

    def loss(params, x):
        for i, w in enumerate(params):
            with jax.named_scope(f"layer_{i}"):
                x = jnp.tanh(x @ w)
        return jnp.mean(x**2)

    keys = jax.random.split(jax.random.PRNGKey(0), 8)
    params = [jax.random.normal(k, (8, 8)) / 3 for k in keys]
    mon = sowviz.Monitor(loss, every=1)
    for _ in range(4):
        _, grads = mon.step(params, jnp.ones((4, 8)))
        params = [p - 0.1 * g for p, g in zip(params, grads, strict=True)]
    pg = page.open_report(mon.save_html(tmp_path / "monitor.html"))
    loss_box = pg.locator('[data-role="loss"]')
    loss_box.locator(".js-plotly-plot").wait_for()
    pg.locator(".sv-node").first.click()  # the detail panel narrows the view
    pg.locator('[data-role="detail"]').wait_for(state="visible")
    pg.wait_for_timeout(300)

    def covered():
        """Drawn nodes whose visible part (clipped to the drawing) meets the chart."""
        svg = pg.locator(".sv-svg").bounding_box()
        c = loss_box.bounding_box()
        cx0, cy0, cx1, cy1 = c["x"], c["y"], c["x"] + c["width"], c["y"] + c["height"]
        hits = []
        for nid, x0, y0, x1, y1 in pg.locator(".sv-node").evaluate_all(
            "els => els.map(e => { const r = e.getBoundingClientRect();"
            " return [e.dataset.nodeId, r.left, r.top, r.right, r.bottom]; })"
        ):
            x0, y0 = max(x0, svg["x"]), max(y0, svg["y"])
            x1 = min(x1, svg["x"] + svg["width"])
            y1 = min(y1, svg["y"] + svg["height"])
            if x0 < x1 and y0 < y1 and x0 < cx1 and x1 > cx0 and y0 < cy1 and y1 > cy0:
                hits.append(nid)
        return hits

    assert covered() == []
    # drag each node in turn into the view's bottom-right corner, where the chart was
    svg = pg.locator(".sv-svg").bounding_box()
    corner = (svg["x"] + svg["width"] - 60, svg["y"] + svg["height"] - 25)
    for i in range(3):
        b = pg.locator(".sv-node").nth(i).bounding_box()
        start = (svg["x"] + 8, svg["y"] + 8)  # the background: a drag pans
        pg.mouse.move(*start)
        pg.mouse.down()
        dx, dy = corner[0] - (b["x"] + b["width"] / 2), corner[1] - (b["y"] + b["height"] / 2)
        pg.mouse.move(start[0] + dx, start[1] + dy, steps=5)
        pg.mouse.up()
        assert covered() == [], i
    assert loss_box.is_visible()
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "frontend_monitor_loss_dragged.png"))
    assert page.errors == [] and page.requests == []


@pytest.mark.browser
def test_the_widget_s_default_colouring_follows_its_mode_and_a_pick_stays(browser):
    # Switched from grad to primal, the widget kept colouring by cotangent (the model
    # still held one: a sow under an inner jax.grad), so a primal picture showed
    # gradients. A default follows the mode; a statistic the user picked stays.
    p = Page(browser)
    pg = serve_widget_page(p)
    try:
        pg.goto("http://sowviz.test/index.html")
        stat = pg.locator('[data-role="stat"]')

        def send(mode):
            model = fm.small_model()  # primal, tangent and cotangent values
            model["mode"] = mode
            pg.evaluate("b => window.__widget.setModel(b)", gz(model))
            # the model arrives gzipped, drawn once unzipped: the mode picker then shows it
            pg.wait_for_function(
                "m => document.querySelector('[data-role=mode]').value === m", arg=mode
            )

        first = fm.small_model()
        first["mode"] = "grad"
        pg.evaluate(FAKE_MODEL, {"bytes": gz(first), "mode": "grad"})
        assert stat.input_value() == "cotangent\x00l2"
        send("primal")
        assert stat.input_value() == "primal\x00l2"
        send("jvp")
        assert stat.input_value() == "tangent\x00l2"
        pg.select_option('[data-role="stat"]', "primal\x00absmax")  # the user's pick
        send("grad")
        assert stat.input_value() == "primal\x00absmax"
        legend = pg.locator('[data-role="legend"] .sv-legend-title').inner_text()
        assert legend.startswith("primal max |x|")
        assert p.errors == []
    finally:
        p.close()


@pytest.mark.browser
def test_a_primal_report_of_probes_holding_cotangents_colours_by_primal(page, tmp_path):
    # The model of a primal run whose probes hold tangents and cotangents too (a sow's
    # values inside an inner jax.grad or jax.jvp): coloured by primal, the run's own
    # values, not by the cotangent most probes lack.
    model = fm.small_model()
    model["mode"] = "primal"
    assert set(model["modes"]) == {"primal", "tangent", "cotangent"}
    pg = page.open_report(report.write_html(model, tmp_path / "primal.html"))
    assert pg.locator('[data-role="stat"]').input_value() == "primal\x00l2"
    assert pg.locator('[data-role="legend-spark"]').inner_text() == "primal histogram"
    # x's face: its primal l2, by NumPy in the fixture
    want = next(p for p in model["probes"] if p["node"] == "n1")["summaries"]["primal"]["l2"]
    face = node(pg, "n1").locator(".sv-value").text_content()
    assert face.startswith("‖x‖₂ = ") and float(face.split("= ")[1]) == pytest.approx(want, 1e-3)
    assert page.errors == [] and page.requests == []
