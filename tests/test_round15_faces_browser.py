"""Round 15: a stage of several outputs whose first has no value in the mode shown (an
optax chain's injected learning rate has no gradient) names on its face the output it
describes (`[1]`), and a click opens the panel on that output."""

from __future__ import annotations

import os

import pytest
from test_round15_api import optax_program

import sowviz


def _optax_step_inspection():
    step, args, _ = optax_program()
    return sowviz.inspect(step, *args, mode="all")


@pytest.mark.browser
def test_a_chain_s_face_names_the_output_it_shows_and_the_panel_opens_on_it(page, tmp_path):
    ins = _optax_step_inspection()
    chain = [p for p in ins.probes if ins.probe_path(p) == "chain"]
    first = ins.probe("chain", leaf="[0]")
    assert "cotangent" not in first.summaries  # the learning rate: no gradient
    # the first output with a gradient, as the face picks it: its l2, computed here
    shown = next(p for p in chain if "cotangent" in p.summaries)
    assert shown.leaf == "[1]"
    l2 = shown.summaries["cotangent"]["l2"]
    node = shown.node
    pg = page.open_report(ins.save_html(tmp_path / "step.html"))
    face = pg.locator(f'[data-node-id="{node}"] .sv-value').text_content()
    # the face names `[1]` (its number shortened beside "+ N eqns", never the name dropped)
    assert face.startswith("[1] ‖grad‖₂ = "), face
    number = float(face.split(" = ")[1])
    assert number == pytest.approx(l2, rel=0.05)
    pg.locator(f'[data-node-id="{node}"]').click()
    pg.wait_for_selector('[data-role="detail"]:not([hidden])')
    output = pg.locator('[data-role="detail"] [data-meta="output"]').text_content()
    assert output.startswith("[1] ("), output
    assert pg.locator('[data-role="probe"]').input_value() == shown.id
    # its histograms: the gradient's too, not the learning rate's value alone
    modes = pg.locator('[data-role="detail"] .sv-chart[data-mode]').evaluate_all(
        "els => els.map(e => e.dataset.mode)"
    )
    assert "cotangent" in modes
    shot = os.environ.get("SOWVIZ_SHOT")
    if shot:
        pg.screenshot(path=shot)
    assert page.errors == []
