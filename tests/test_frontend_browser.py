"""The front end in a real browser: HTML reports opened from disk and the anywidget
entry point driven with a stand-in model, in Debian's headless chromium.

Every page runs with all network requests intercepted: report pages must make none.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re

import pytest
from conftest import Page

from sowviz import report

ROOT = pathlib.Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"


def _load_fixtures():
    spec = importlib.util.spec_from_file_location(
        "frontend_models", pathlib.Path(__file__).parent / "fixtures" / "frontend_models.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fm = _load_fixtures()


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
    assert stats == [
        "count",
        "nan",
        "posinf",
        "neginf",
        "zeros",
        "min",
        "max",
        "mean",
        "std",
        "l2",
        "absmax",
    ]
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
def test_expand_and_collapse_a_stage(page, small_report):
    pg = page.open_report(small_report)
    assert node(pg, "n7").count() == 0
    node(pg, "n6").locator('[data-role="toggle"]').click()
    assert node(pg, "n6").get_attribute("data-expanded") == "true"
    assert node(pg, "n7").count() == 1 and node(pg, "n8").count() == 0
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
FAKE_MODEL = """
async (model) => {
  const mod = await import("/sowviz.js");
  const traits = { model, mode: model.mode, busy: false, error: "" };
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
  const cleanupModel = mod.default.initialize({ model: m });
  const el = document.getElementById("out");
  const cleanupView = mod.default.render({ model: m, el });
  window.__widget = { m, traits, fire, saved, cleanupView, cleanupModel, handlers };
  return Object.keys(mod).sort();
}
"""


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
    """anywidget's contract: traits model/mode/busy/error and {"type": "step"} messages."""
    p = Page(browser)
    pg = serve_widget_page(p)
    try:
        pg.goto("http://sowviz.test/index.html")
        model = fm.small_model()
        model["mode"] = "grad"
        exports = pg.evaluate(FAKE_MODEL, model)
        assert exports == ["autoMount", "default", "modelText", "mount", "widgetModel"]
        assert pg.locator("[data-node-id]").count() == 4
        # the mode dropdown writes the `mode` trait and shows the busy state
        pg.select_option('[data-role="mode"]', "jvp")
        assert pg.evaluate("window.__widget.traits.mode") == "jvp"
        assert pg.evaluate("window.__widget.saved.length") == 1
        assert pg.locator('[data-role="busy"]').is_visible()
        # Python answers with a new model; the view keeps the user's expansions
        node(pg, "n2").locator('[data-role="toggle"]').click()
        model2 = fm.small_model()
        model2["mode"] = "jvp"
        pg.evaluate(
            "m => { window.__widget.traits.model = m; window.__widget.fire('change:model'); }",
            model2,
        )
        assert pg.locator('[data-role="busy"]').is_hidden()
        assert node(pg, "n3").count() == 1
        # errors from Python
        pg.evaluate(
            "() => { window.__widget.traits.error = 'mode jvp failed: <b>x</b>'; window.__widget.fire('change:error'); }"
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
        # cleanup removes the view and the listeners
        pg.evaluate("() => { window.__widget.cleanupView(); window.__widget.cleanupModel(); }")
        assert pg.locator(".sowviz").count() == 0
        assert pg.evaluate("Object.values(window.__widget.handlers).every(h => h.length === 0)")
        assert p.errors == []
    finally:
        p.close()


@pytest.mark.browser
def test_widget_model_arrives_as_gzipped_bytes(browser):
    """What the real Inspector syncs: `model_bytes` (gzipped JSON, a binary buffer)."""
    from sowviz.monitor import encode_steps
    from sowviz.widget import encode_model

    p = Page(browser)
    pg = serve_widget_page(p)
    try:
        pg.goto("http://sowviz.test/index.html")
        pg.evaluate(FAKE_MODEL, {"mode": "grad"})
        assert pg.locator("[data-node-id]").count() == 0
        payload = list(encode_model(fm.small_model()))
        pg.evaluate(
            """bytes => { const u8 = new Uint8Array(bytes);
                 window.__widget.traits.model_bytes = new DataView(u8.buffer);
                 window.__widget.fire('change:model_bytes'); }""",
            payload,
        )
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
            list(encode_steps(steps)),
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
