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
