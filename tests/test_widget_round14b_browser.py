"""Round 14 (a JupyterLab session): what the live Monitor view and the widget show.

- A live Monitor's faces follow each step as a fresh drawing of it would show them: a
  stage whose values are all NaN at the latest step has no sparkline (it kept the bell
  curve of an earlier finite step), and gets its NaN badge; the elements stay in place.
- An all-NaN face says "value: 20 NaN", not "x: 20 NaN" (read as "the input x").
- Opening a group a little wider than the view (the detail panel open) shows it whole.
"""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from conftest import Page
from test_widget_browser import ARTIFACTS, Bridge
from test_widget_monitor import PARAMS, X, loss

import sowviz
from sowviz import monitor_view, report

X_NAN = jnp.full_like(X, jnp.nan)

# What each drawn face shows, by node id: everything its values decide.
FACES = """() => Object.fromEntries([...document.querySelectorAll('[data-node-id]')].map((g) => {
  const one = (sel) => g.querySelector(':scope > ' + sel);
  return [g.dataset.nodeId, {
    label: one('.sv-label, .sv-stage-label')?.textContent ?? null,
    shape: one('.sv-shape')?.textContent ?? null,
    value: one('.sv-value, .sv-stage-kind')?.textContent ?? null,
    spark: one('.sv-spark')?.getAttribute('d') ?? null,
    chip: one('.sv-chip')?.getAttribute('fill') ?? null,
    tip: one('title')?.textContent ?? null,
    nan: one('.sv-nan-icon') ? one('.sv-nan-icon circle').getAttribute('fill-opacity') : null,
    nonfinite: g.dataset.nonfinite ?? null,
    width: one('.sv-node-bg, .sv-stage-bg').getAttribute('width'),
  }];
}))"""

PRIMAL_L2 = "primal\u0000l2"


def node_id(model, label):
    (n,) = [n["id"] for n in model["nodes"] if n["label"] == label]
    return n


def fresh_faces(browser, mon, tmp_path, name):
    """The faces of the monitor's latest step as a saved report draws them (a whole
    drawing, not an update), coloured by the primal l2 norm."""
    p = Page(browser)
    try:
        pg = p.open_report(report.write_html(mon.to_dict(), tmp_path / f"{name}.html"))
        pg.select_option('[data-role="stat"]', PRIMAL_L2)
        assert p.errors == []
        return pg.evaluate(FACES)
    finally:
        p.close()


@pytest.mark.browser
def test_a_live_monitor_face_follows_an_all_nan_step_and_back(browser, tmp_path, monkeypatch):
    # (no whole model for a new view during the test: a loaded machine's 30 s timer would
    # send one between two steps' checks)
    monkeypatch.setattr(monitor_view, "_REFRESH_EVERY", 1e9)
    mon = sowviz.Monitor(loss, throttle=0.0)
    mon.step(PARAMS, X)
    mon.flush()
    view = mon.view()
    bridge = Bridge(browser)
    try:
        bridge.attach(view)
        pg = bridge.page
        step = pg.locator('[data-role="step"]')
        step.wait_for()
        pg.select_option('[data-role="stat"]', PRIMAL_L2)  # a redraw: before the steps
        layers = node_id(view.model, "layer_0–2 (×3)")
        face = pg.locator(f'[data-node-id="{layers}"]')
        assert face.locator("path.sv-spark").count() == 1  # finite values: a histogram
        face.click()
        # the first NaN step sends the whole model (its NaN record): a fresh drawing;
        # the steps after it arrive as "steps" messages, drawn in place
        for want_step, x in ((1, X_NAN), (2, X), (3, X_NAN)):
            mon.step(PARAMS, x)
            # reads the steps waiting (`mon.flush()` also brings the synced model, what a
            # reloaded page draws, up to date: a whole model besides the steps)
            mon.history  # noqa: B018
            kinds = [d.get("content", {}).get("type", d["method"]) for d, _ in bridge.sent]
            assert kinds == (["update"] if want_step == 1 else ["steps"])
            bridge.deliver()
            pg.wait_for_function(
                f"() => document.querySelector('[data-role=step]')?.textContent.startsWith('step {want_step}')"
            )
            pg.evaluate("() => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)))")
            live = pg.evaluate(FACES)
            fresh = fresh_faces(browser, mon, tmp_path, f"step{want_step}")
            assert set(live) == set(fresh)
            for nid in fresh:
                assert live[nid] == fresh[nid], (want_step, nid)
            sparks = face.locator("path.sv-spark").count()
            assert sparks == (0 if x is X_NAN else 1), (want_step, sparks)
            if want_step > 1:
                # the element stayed (a hover's tooltip and a click in progress are kept),
                # selected
                assert face.evaluate(
                    "g => g.__kept === true && g.classList.contains('sv-selected')"
                )
            face.evaluate("g => { g.__kept = true; }")
            ARTIFACTS.mkdir(exist_ok=True)
            pg.locator(".sowviz").screenshot(
                path=str(ARTIFACTS / f"round14b_live_step{want_step}.png")
            )
        assert bridge.p.errors == []
    finally:
        bridge.close()
        mon.close()


@pytest.mark.browser
def test_an_all_nan_stage_says_value_not_x(browser, tmp_path):
    mon = sowviz.Monitor(loss, throttle=0.0)
    mon.step(PARAMS, X)
    mon.step(PARAMS, X_NAN)
    mon.flush()
    model = mon.to_dict()
    faces = fresh_faces(browser, mon, tmp_path, "nan")
    mon.close()
    # the repeated layers' face is their first layer's: tanh of a (5, 4) product
    layers = faces[node_id(model, "layer_0–2 (×3)")]
    n = X.shape[0] * PARAMS[0]["w"].shape[1]
    assert layers["value"] == f"value: {n} NaN"
    assert layers["spark"] is None and layers["nan"] == "1"
    assert f"statistic: value: {n} NaN" in layers["tip"]
    assert not [f for f in faces.values() if (f["value"] or "").startswith("x:")]


# The widget's size in the lab's notebook (a 968 px wide cell, 620 px tall).
PAGE_SIZE = ("height: 640px", "height: 620px; width: 968px")


@pytest.mark.browser
def test_a_group_opened_after_collapse_all_is_shown_whole(browser, monkeypatch):
    import test_widget_browser as twb

    monkeypatch.setattr(twb, "PAGE", twb.PAGE.replace(*PAGE_SIZE))
    bridge = Bridge(browser)
    try:
        monkeypatch.setattr(sowviz.widget, "display_now", bridge.attach)
        w = sowviz.show(loss, PARAMS, X, mode="grad")
        bridge.deliver()
        pg = bridge.page
        params = node_id(w.model, "parameters")
        group = pg.locator(f'[data-node-id="{params}"]')
        group.click()  # the detail panel opens: the view narrows
        pg.locator('[data-role="collapse-all"]').click()
        group.locator('[data-role="toggle"]').click()
        assert group.get_attribute("data-expanded") == "true"
        canvas = pg.locator(".sv-canvas").bounding_box()
        box = group.locator(":scope > .sv-stage-bg").bounding_box()
        # whole in the view: its last member was cut at the right edge
        assert box["x"] >= canvas["x"] and box["x"] + box["width"] <= canvas["x"] + canvas["width"]
        assert box["y"] >= canvas["y"]
        scale = float(
            pg.locator(".sv-viewport").get_attribute("transform").split("scale(")[1].rstrip(")")
        )
        assert scale >= 0.75  # viewport.ACROSS_SCALE: still legible
        for child in ("[0]", "[1]", "[2]"):
            c = pg.locator(f'[data-node-id="{node_id(w.model, child)}"]').bounding_box()
            assert c["x"] + c["width"] <= canvas["x"] + canvas["width"], child
        ARTIFACTS.mkdir(exist_ok=True)
        pg.locator(".sowviz").screenshot(path=str(ARTIFACTS / "round14b_group_opened.png"))
        assert bridge.p.errors == []
    finally:
        bridge.close()
