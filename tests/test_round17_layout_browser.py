"""Round 17 (a visual check in JupyterLab): the widget's height follows the graph and a
stacked panel, Fit stops at readable text, the pan hint is off the drawing, and the dark
theme's NaN flags are readable."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from conftest import Page

import sowviz


def _mlp_loss(params, x, y):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def _mlp_args():
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {
        "w1": jax.random.normal(k1, (8, 32)) * 0.3,
        "b1": jnp.zeros(32),
        "w2": jax.random.normal(k2, (32, 1)) * 0.3,
        "b2": jnp.zeros(1),
    }
    x = jax.random.normal(k3, (64, 8))
    return params, x, jnp.sin(x[:, :1])


def _as_widget(pg):
    """A report drawn as the notebook widget: its own height, not the window's."""
    pg.evaluate(
        "() => { document.querySelector('.sv-report-header').remove();"
        " document.querySelector('.sowviz').classList.remove('sv-standalone');"
        " document.body.style.height = 'auto'; }"
    )
    pg.wait_for_timeout(300)


def _scale(pg) -> float:
    t = pg.locator(".sv-viewport").get_attribute("transform")
    return float(re.search(r"scale\(([\d.e-]+)", t).group(1))


def _click_output(pg):
    pg.evaluate(
        "() => document.querySelector('[data-node-id][data-kind=output] .sv-node-bg')"
        ".dispatchEvent(new MouseEvent('click', {bubbles: true}))"
    )
    pg.wait_for_timeout(400)


@pytest.fixture(scope="module")
def mlp_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("r17") / "mlp.html"
    return sowviz.inspect(_mlp_loss, *_mlp_args()).save_html(path)


@pytest.mark.browser
def test_a_narrow_widget_grows_to_give_the_stacked_panel_room(page, mlp_report):
    # JupyterLab at 700 px with its file browser open: the widget 332 px wide. The panel
    # went under the graph inside the fixed 620 px: ~85 px of it showed.
    page.page.set_viewport_size({"width": 340, "height": 900})
    pg = page.open_report(mlp_report)
    _as_widget(pg)
    root = pg.locator(".sowviz")
    assert root.bounding_box()["height"] >= 620
    _click_output(pg)
    box, rb = pg.locator('[data-role="detail"]').bounding_box(), root.bounding_box()
    canvas = pg.locator(".sv-canvas").bounding_box()
    visible = min(box["y"] + box["height"], rb["y"] + rb["height"]) - box["y"]
    assert visible >= 320, (box, rb)
    assert box["y"] >= canvas["y"] + canvas["height"] - 1  # under the graph
    assert pg.locator(".sv-graph").bounding_box()["height"] >= 380  # the graph kept its room
    # closed: the widget gives the panel's room back
    pg.locator(".sv-close").click()
    pg.wait_for_timeout(300)
    assert root.bounding_box()["height"] < rb["height"] - 200
    assert page.errors == []


@pytest.mark.browser
def test_the_widget_follows_a_tall_graph_and_fit_keeps_labels_readable(page, mlp_report):
    # A 2-layer MLP is ~1150 graph units tall: in a fixed 620 px the first picture cut it
    # and Fit drew it at 5 px text beside the panel.
    page.page.set_viewport_size({"width": 1000, "height": 1000})
    pg = page.open_report(mlp_report)
    _as_widget(pg)
    height = pg.locator(".sowviz").bounding_box()["height"]
    assert 620 < height <= 0.85 * 1000 + 1
    _click_output(pg)
    pg.locator('[data-role="fit"]').click()
    pg.wait_for_timeout(300)
    k = _scale(pg)
    assert k >= 0.72 - 1e-6  # node labels (12.5 px) ≥ 9 px
    label = pg.locator(".sv-label").first.bounding_box()["height"]
    assert label >= 9 * 0.95
    # a user's own height (the resize handle) is kept
    pg.evaluate("() => { document.querySelector('.sowviz').style.height = '700px'; }")
    pg.locator(".sv-close").click()
    pg.wait_for_timeout(300)
    assert pg.locator(".sowviz").bounding_box()["height"] == pytest.approx(700, abs=1)
    assert page.errors == []


def _long_chain(x):
    for i in range(30):
        x = jnp.sin(x) * (1.0 + i)
    return jnp.sum(x)


@pytest.mark.browser
def test_the_pan_hint_is_under_the_drawing_not_over_its_nodes(page, tmp_path):
    pg = page.open_report(
        sowviz.inspect(_long_chain, jnp.ones(4), mode="primal").save_html(tmp_path / "c.html")
    )
    _as_widget(pg)
    more = pg.locator('[data-role="more-hint"]')
    assert more.is_visible() and more.inner_text() == "more below · drag to pan"
    canvas = pg.locator(".sv-canvas").bounding_box()
    hint = more.bounding_box()
    assert hint["y"] >= canvas["y"] + canvas["height"] - 0.5  # in the strip under it
    assert page.errors == []


def _luminance(rgb: str) -> float:
    def lin(v: float) -> float:
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

    r, g, b = (int(v) / 255 for v in re.findall(r"\d+", rgb)[:3])
    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


def _contrast(a: str, b: str) -> float:
    hi, lo = sorted([_luminance(a), _luminance(b)], reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _nan_loss(w, x):
    with jax.named_scope("logfeat"):
        f = jnp.log(x @ w)
    return jnp.mean(f**2)


@pytest.mark.browser
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_nan_flags_text_is_readable_in_both_themes(browser, tmp_path, scheme):
    # dark: white on the light red (#f87171) was 2.8:1
    w = jax.random.normal(jax.random.PRNGKey(0), (4, 8))
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 4))
    path = sowviz.inspect(_nan_loss, w, x).save_html(tmp_path / "nan.html")
    p = Page(browser, color_scheme=scheme)
    try:
        pg = p.open_report(path)
        pairs = pg.evaluate(
            """() => [...document.querySelectorAll('.sv-origin-flag, .sv-nan-icon')].map(g => {
              const t = g.querySelector('text'), bg = g.querySelector('rect, circle');
              return [t.textContent, getComputedStyle(t).fill, getComputedStyle(bg).fill]; })"""
        )
        assert any("starts here" in t for t, _, _ in pairs) and any(t == "!" for t, _, _ in pairs)
        for text, fg, bg in pairs:
            assert _contrast(fg, bg) >= 4.5, (scheme, text, fg, bg)
        assert p.errors == []
    finally:
        p.close()
