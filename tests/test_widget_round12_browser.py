"""The widget as JupyterLab hosts it (round 12), in a report page given JupyterLab's
part: its output area's description-list rules, its theme variables and flag, a
notebook 468 px wide (a 900 px window with the file browser open). Checked in real
JupyterLab 4.6 too; these pages keep the checks fast."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import pytest
from conftest import Page

import sowviz

ARTIFACTS = pathlib.Path(__file__).resolve().parents[1] / "artifacts"

# JupyterLab 4.6's outputarea/style/base.css: every dt floats at 20 % of its dl
JUPYTER_OUTPUT_CSS = """
.jp-OutputArea-output dl, .jp-OutputArea-output dt, .jp-OutputArea-output dd { display: block; }
.jp-OutputArea-output dl { width: 100%; overflow: hidden; padding: 0; margin: 0; }
.jp-OutputArea-output dt { font-weight: bold; float: left; width: 20%; padding: 0; margin: 0; }
.jp-OutputArea-output dd { float: left; width: 80%; padding: 0; margin: 0; }
"""

# JupyterLab Dark's variables the widget reads (theme-dark-extension/variables.css)
DARK_VARS = {
    "--jp-layout-color0": "#111",
    "--jp-layout-color1": "#212121",
    "--jp-ui-font-color0": "#fff",
    "--jp-ui-font-color2": "rgba(255,255,255,.54)",
    "--jp-border-color1": "#616161",
    "--jp-border-color2": "#424242",
    "--jp-brand-color1": "#42a5f5",
}


def _layers(params, x):
    h = x
    for i, p in enumerate(params):
        with jax.named_scope(f"layer_{i}"):
            h = jnp.tanh(h @ p["w"] + p["b"])
    return jnp.mean(h**2)


@pytest.fixture(scope="module")
def layers_report(tmp_path_factory):
    """quick.ipynb's program: four like layers, drawn as one group `layer_0–3`."""
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    params = [{"w": jax.random.normal(k, (16, 16)) / 4, "b": jnp.zeros(16)} for k in keys]
    x = jax.random.normal(jax.random.PRNGKey(1), (32, 16))
    ins = sowviz.inspect(_layers, params, x)
    return ins.save_html(tmp_path_factory.mktemp("r12") / "layers.html")


def _group(pg):
    return pg.locator(".sv-node", has=pg.locator(".sv-label", has_text="layer_0")).first


def _box(pg, selector):
    return pg.locator(selector).first.evaluate(
        "e => { const r = e.getBoundingClientRect();"
        " return {left: r.left, right: r.right, top: r.top, bottom: r.bottom,"
        " width: r.width, height: r.height}; }"
    )


@pytest.mark.browser
def test_the_detail_panel_is_readable_in_a_narrow_jupyterlab_output(browser, layers_report):
    p = Page(browser)
    try:
        p.page.set_viewport_size({"width": 468, "height": 700})
        pg = p.open_report(layers_report)
        pg.add_style_tag(content=JUPYTER_OUTPUT_CSS)
        pg.evaluate(
            "() => document.getElementById('sowviz-root').classList.add('jp-OutputArea-output')"
        )
        _group(pg).click()
        pg.wait_for_timeout(400)
        ARTIFACTS.mkdir(exist_ok=True)
        pg.screenshot(path=str(ARTIFACTS / "round12_narrow_panel.png"))
        # every label ends before its value starts, whole ("captur[32, 16]", "equations16")
        rows = pg.eval_on_selector_all(
            ".sv-meta dt",
            """els => els.map(dt => { const a = dt.getBoundingClientRect();
              const b = dt.nextElementSibling.getBoundingClientRect();
              return {label: dt.textContent, gap: b.left - a.right, cut: dt.scrollWidth - dt.clientWidth,
                      value: dt.nextElementSibling.textContent}; })""",
        )
        labels = [r["label"] for r in rows]
        assert {"captured", "equations", "device", "source"} <= set(labels), labels
        assert [r["label"] for r in rows if r["gap"] < 8 or r["cut"] > 0] == [], rows
        captured = next(r for r in rows if r["label"] == "captured")
        assert captured["value"] == "[32, 16] · 512 values"
        # the panel goes under the graph, which keeps the widget's width (was ~210 px)
        root, graph, detail = (_box(pg, s) for s in (".sowviz", ".sv-graph", ".sv-detail"))
        assert detail["top"] >= graph["bottom"] - 1
        assert graph["width"] >= root["width"] - 4 and detail["width"] >= root["width"] - 4
        assert graph["height"] >= 180
        # the legend's keys keep their words (they were cut to bare icons)
        legend = _box(pg, ".sv-legend")
        keys = pg.eval_on_selector_all(
            ".sv-legend .sv-key",
            "els => els.map(e => { const r = e.getBoundingClientRect(); return {t: e.textContent, right: r.right}; })",
        )
        assert keys and all(k["right"] <= legend["right"] + 0.5 for k in keys), (keys, legend)
        # the "more below" hint holds one line (three lines covered the `output` node)
        more = pg.locator('[data-role="more-hint"]')
        if more.is_visible():
            assert more.bounding_box()["height"] <= 24
        assert p.errors == []
    finally:
        p.close()


@pytest.mark.browser
def test_a_wide_widget_keeps_the_panel_beside_the_graph(page, layers_report):
    pg = page.open_report(layers_report)
    _group(pg).click()
    pg.wait_for_timeout(300)
    graph, detail = _box(pg, ".sv-graph"), _box(pg, ".sv-detail")
    assert detail["left"] >= graph["right"] - 1 and abs(detail["top"] - graph["top"]) < 1
    assert detail["width"] == pytest.approx(400, abs=1)


@pytest.mark.browser
def test_a_theme_switch_redraws_the_charts_of_a_group_of_blocks(page, layers_report):
    pg = page.open_report(layers_report)
    _group(pg).click()
    pg.wait_for_timeout(300)
    fonts = """() => [...document.querySelectorAll('.sv-detail .js-plotly-plot')]
                 .map(g => g._fullLayout.font.color)"""
    light = pg.evaluate(fonts)
    assert light and len(set(light)) == 1
    # JupyterLab switches to its dark theme: its variables, then its body's flag
    pg.evaluate(
        """vars => { for (const [k, v] of Object.entries(vars)) document.documentElement.style.setProperty(k, v);
                 document.body.dataset.jpThemeLight = 'false'; }""",
        DARK_VARS,
    )
    pg.wait_for_function("() => document.querySelector('.sowviz').dataset.svTheme === 'dark'")
    pg.wait_for_timeout(300)
    root = pg.locator(".sowviz")
    assert root.get_attribute("data-sv-host") == "jupyter"
    # every chart of the panel is drawn in the dark theme's text colour (they kept the
    # light theme's: dark text on a dark panel, and white on white the other way)
    assert pg.evaluate(fonts) == ["#fff"] * len(light), pg.evaluate(fonts)
    assert root.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(33, 33, 33)"
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "round12_dark_group_panel.png"))
    assert page.errors == []
