"""Round 16 (a real JupyterLab session): what the widget shows with nothing to colour by."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

import sowviz


@pytest.mark.browser
def test_with_no_values_to_colour_by_the_legend_and_picker_say_so(page, tmp_path):
    # the identity of integers: an input and an output, no statistic to colour by (a
    # displayed Monitor before its first step's values reads the same). The legend read
    # "primal ‖·‖₂ (l2 norm), log scale null" and the colour picker was an empty box.
    ins = sowviz.inspect(lambda x: x, jnp.arange(4), mode="primal")
    pg = page.open_report(ins.save_html(tmp_path / "r.html"))
    legend = pg.locator('[data-role="legend"]')
    assert "null" not in legend.inner_text()
    assert pg.locator('[data-role="legend-empty"]').inner_text() == "no values to colour by"
    stat = pg.locator('[data-role="stat"]')
    assert stat.is_disabled()
    assert stat.locator("option").all_inner_texts() == ["no values"]
    assert page.errors == []


def _mlp_loss(p, x, y):
    for w in p[:-1]:
        x = jnp.tanh(x @ w)
    return jnp.mean((x @ p[-1] - y) ** 2)


@pytest.mark.browser
def test_a_narrow_monitor_keeps_a_usable_graph_and_a_short_hint(page, tmp_path):
    # A Monitor in a notebook beside JupyterLab's file browser (388 px wide, the widget's
    # own 620 px tall): the toolbar wraps, the legend and loss chart stack, and the panel
    # went under the graph in halves: ~100 px of drawing, half covered by the pan hint.
    import jax

    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    p = [
        jax.random.normal(k, s) / 4
        for k, s in zip(keys[:4], [(4, 32), (32, 32), (32, 32), (32, 1)], strict=True)
    ]
    x = jax.random.normal(keys[4], (64, 4))
    mon = sowviz.Monitor(_mlp_loss)
    for _ in range(3):
        _, g = mon.step(p, x, x[:, :1])
        p = jax.tree.map(lambda a, b: a - 0.1 * b, p, g)
    path = mon.save_html(tmp_path / "mon.html")
    page.page.set_viewport_size({"width": 388, "height": 900})
    pg = page.open_report(path)
    # a notebook output: the widget's own height, not the report page's
    pg.evaluate("() => document.querySelector('.sowviz').classList.remove('sv-standalone')")
    pg.get_by_text("parameters", exact=True).first.click()
    pg.wait_for_timeout(300)
    canvas = pg.locator(".sv-canvas").bounding_box()
    detail = pg.locator(".sv-detail").bounding_box()
    assert canvas["height"] >= 240, canvas
    assert detail["y"] >= canvas["y"] + canvas["height"] - 1  # the panel below, not over it
    more = pg.locator('[data-role="more-hint"]')
    assert more.is_visible()
    assert more.inner_text().startswith("more ") and "drag" not in more.inner_text()
    assert more.bounding_box()["width"] <= 140
    # once the user pans, the hint goes (it covered the nodes under it)
    c = canvas["x"] + canvas["width"] / 2, canvas["y"] + 20
    pg.mouse.move(*c)
    pg.mouse.down()
    pg.mouse.move(c[0] - 40, c[1] - 60, steps=5)
    pg.mouse.up()
    pg.wait_for_timeout(200)
    assert more.is_hidden()
    assert page.errors == []
