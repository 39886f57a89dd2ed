"""Round 15: the live Monitor view's open panel and search follow each step.

Following the latest step, an open detail panel's statistics table is that step's (it
kept the step it was opened at), and a search (`is:nan`) marks and counts the stages of
the step drawn, as a fresh drawing of the step shows them.
"""

from __future__ import annotations

import pytest
from conftest import Page
from test_widget_browser import Bridge
from test_widget_monitor import PARAMS, X
from test_widget_monitor import loss as mlp_loss
from test_widget_round14b_browser import X_NAN, node_id

import sowviz
from sowviz import report

TABLE = "() => document.querySelector('[data-role=stats]')?.innerText ?? null"
SEARCH = """() => ({
  count: document.querySelector('[data-role=search-count]').textContent,
  marked: [...document.querySelectorAll('[data-node-id][data-match]')]
    .map((g) => `${g.dataset.nodeId}=${g.dataset.match}`).sort(),
})"""
QUERY = "is:nan"


def fresh(browser, mon, tmp_path, name, nid):
    """The panel's table of stage `nid` and the search of QUERY, as a saved report of
    the monitor's latest step draws them."""
    p = Page(browser)
    try:
        pg = p.open_report(report.write_html(mon.to_dict(), tmp_path / f"{name}.html"))
        pg.locator(f'[data-node-id="{nid}"]').click()
        pg.fill('[data-role="search"]', QUERY)
        pg.wait_for_function(
            "() => document.querySelector('[data-role=search-count]').textContent !== ''"
        )
        assert p.errors == []
        return pg.evaluate(TABLE), pg.evaluate(SEARCH)
    finally:
        p.close()


@pytest.mark.browser
def test_a_live_panel_and_search_follow_the_latest_step(browser, tmp_path):
    mon = sowviz.Monitor(mlp_loss, throttle=0.0)
    mon.step(PARAMS, X)
    mon.flush()
    view = mon.view()
    bridge = Bridge(browser)
    try:
        bridge.attach(view)
        pg = bridge.page
        pg.locator('[data-role="step"]').wait_for()
        nid = node_id(view.model, "layer_0–2 (×3)")
        pg.locator(f'[data-node-id="{nid}"]').click()
        pg.fill('[data-role="search"]', QUERY)
        pg.wait_for_function(
            "() => document.querySelector('[data-role=search-count]').textContent !== ''"
        )
        first = pg.evaluate(TABLE)
        tables = [first]
        # the first NaN step sends the whole model; the later ones are "steps" messages
        for want_step, x in ((1, X_NAN), (2, X), (3, X_NAN)):
            mon.step(PARAMS, x)
            mon.flush()
            bridge.deliver()
            pg.wait_for_function(
                "() => document.querySelector('[data-role=step]')"
                f"?.textContent.startsWith('step {want_step}')"
            )
            pg.evaluate("() => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)))")
            table, search = fresh(browser, mon, tmp_path, f"s{want_step}", nid)
            assert pg.evaluate(TABLE) == table, want_step
            assert pg.evaluate(SEARCH) == search, want_step
            tables.append(table)
        # the steps differ: a NaN step's table is not the finite one's
        assert "NaN" in tables[1] and tables[1] != tables[2]
        assert bridge.p.errors == []
    finally:
        bridge.close()
        mon.close()
