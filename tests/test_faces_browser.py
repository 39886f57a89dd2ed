"""Node faces and the view in a real browser (round 11): an opened stage's neighbours
come into view with it, and values of no size are drawn as no data."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import frontend_models

from sowviz import report

fm = frontend_models()

BRANCHES = 5


def _wide_stage_model(branches: int = BRANCHES) -> dict:
    """`Model` (open) > `rnn` (closed: `branches` parallel `tanh` and their `add`) and
    `head`; beside `Model`, the input `y` and `sub`, which reads `head` and `y`. Opening
    `rnn` widens `Model` past its neighbours, as Flax NNX's `nnx.RNN` did
    (seq/p1_nnx_lstm.py)."""
    rng = np.random.default_rng(0)
    m = fm._header("wide stage", "grad", ["primal", "cotangent"])
    nodes = [
        fm._node("n0", "loss_fn", "jit", None, 0, n_eqns=branches + 4),
        fm._node("n1", "x", "input", "n0", 1),
        fm._node("n2", "y", "input", "n0", 2),
        {**fm._node("n3", "Model", "scope", "n0", 3, n_eqns=branches + 2), "collapsed": False},
        fm._node("n4", "rnn", "scope", "n3", 4, n_eqns=branches + 1),
    ]
    tanhs = [f"t{i}" for i in range(branches)]
    nodes += [
        fm._node(t, "tanh", "eqn", "n4", 5 + i, primitive="tanh") for i, t in enumerate(tanhs)
    ]
    nodes += [
        fm._node("n5", "add", "eqn", "n4", 20, primitive="add"),
        fm._node("n6", "head", "eqn", "n3", 21, primitive="dot_general"),
        fm._node("n7", "sub", "eqn", "n0", 22, primitive="sub"),
        fm._node("n8", "loss", "output", "n0", 23, shapes=("float32[]",)),
    ]
    pairs = [("n1", t) for t in tanhs] + [(t, "n5") for t in tanhs]
    pairs += [("n5", "n6"), ("n6", "n7"), ("n2", "n7"), ("n7", "n8")]
    m["nodes"] = nodes
    m["edges"] = [
        {"source": a, "target": b, "shape": [8, 16], "dtype": "float32"} for a, b in pairs
    ]
    m["probes"] = [
        {
            "id": f"p{n['id']}",
            "name": n["label"],
            "leaf": "",
            "node": n["id"],
            "auto": True,
            "summaries": {
                mode: fm.summarize(rng.normal(0, 1, size=(8, 16)))
                for mode in ("primal", "cotangent")
            },
        }
        for n in nodes
        if n["kind"] in ("eqn", "input", "output")
    ]
    return m


def _screen_boxes(pg) -> list[dict]:
    return pg.eval_on_selector_all(
        "[data-node-id]",
        """els => els.map(e => { const r = e.querySelector('rect').getBoundingClientRect();
          return {id: e.dataset.nodeId, left: r.left, right: r.right, top: r.top, bottom: r.bottom}; })""",
    )


@pytest.mark.browser
def test_an_opened_stage_s_neighbours_are_not_cut_at_the_left(page, tmp_path):
    pg = page.open_report(report.write_html(_wide_stage_model(), tmp_path / "wide.html"))
    pg.locator('[data-node-id="n4"] [data-role="toggle"]').click()
    pg.wait_for_timeout(300)
    view = pg.locator("svg.sv-svg").bounding_box()
    left, right = view["x"], view["x"] + view["width"]
    top, bottom = view["y"], view["y"] + view["height"]
    boxes = {b["id"]: b for b in _screen_boxes(pg)}
    # the rows the view shows: every box overlapping its height
    row = [b for b in boxes.values() if b["bottom"] > top and b["top"] < bottom]
    assert {"n2", "n3", "n4", "n7"} <= {b["id"] for b in row}
    span = max(b["right"] for b in row) - min(b["left"] for b in row)
    assert span <= view["width"] - 32 + 0.5, span  # they fit: all of them are shown
    cut = [b["id"] for b in row if b["left"] < left - 0.5 or b["right"] > right + 0.5]
    # `y` and `sub` were drawn from x = -45 beside the widened `Model`
    assert cut == [], (cut, boxes["n2"])
    # the stage opened is readable and whole
    rnn = boxes["n4"]
    assert rnn["left"] >= left and rnn["right"] <= right
    # at a readable zoom: `y`'s box is 204 graph units wide (layout.NODE_W)
    scale = (boxes["n2"]["right"] - boxes["n2"]["left"]) / 204
    assert scale >= 0.9
    assert pg.locator('[data-role="more-hint"]').text_content().find("left") < 0
    assert page.errors == [] and page.requests == []


def _empty_slice_model() -> dict:
    """A stage whose outputs are of no size (an `associative_scan` combine on an empty
    slice: shape [0, 4]) beside one of real values."""
    m = fm._header("empty", "grad", ["primal", "cotangent"])
    m["nodes"] = [
        fm._node("n0", "loss", "jit", None, 0, n_eqns=8),
        fm._node("n1", "combine#5", "scope", "n0", 1, shapes=("float32[1,4]",), n_eqns=4),
        fm._node("n2", "combine#6", "scope", "n0", 2, shapes=("float32[0,4]",), n_eqns=4),
    ]
    m["edges"] = [{"source": "n1", "target": "n2", "shape": [1, 4], "dtype": "float32"}]
    full = np.array([[0.5, -1.0, 2.0, 0.25]])
    empty = np.zeros((0, 4))

    def probe(node, x):
        s = {mode: fm.summarize(x) for mode in ("primal", "cotangent")}
        if x.size == 0:  # as sowviz.summary writes an empty array: l2 0 over no values
            for v in s.values():
                v["l2"] = 0.0
        return {
            "id": f"p{node}",
            "name": node,
            "leaf": "",
            "node": node,
            "auto": True,
            "summaries": s,
        }

    m["probes"] = [probe("n1", full), probe("n2", empty)]
    return m


@pytest.mark.browser
def test_values_of_no_size_are_drawn_as_no_data(page, tmp_path):
    pg = page.open_report(report.write_html(_empty_slice_model(), tmp_path / "empty.html"))
    face = pg.locator('[data-node-id="n2"] .sv-value').text_content()
    chip = pg.locator('[data-node-id="n2"] .sv-chip').get_attribute("fill")
    # it read "‖grad‖₂ = 0" in the colour scale's lowest colour
    assert face == "0 values" and chip == "none"
    full = pg.locator('[data-node-id="n1"] .sv-value').text_content()
    want = float(np.linalg.norm([0.5, -1.0, 2.0, 0.25]))
    assert full.startswith("‖grad‖₂ = ") and float(full.split("= ")[1]) == pytest.approx(want, 1e-3)
    pg.locator('[data-node-id="n2"] .sv-label').click()
    l2 = pg.locator('[data-role="stats"] tr[data-stat="l2"] td').all_text_contents()
    assert l2 == ["—", "—"]
    assert page.errors == [] and page.requests == []
