"""Round 14 in a real browser: a complex value's panel says its statistics are of |x|
on the histogram's axis and in the table's heading, as its dtype row does."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz


def _ssm(lam_re, u):
    # an S5 layer's discretised eigenvalues: complex, real parts all negative
    with jax.named_scope("Lambda"):
        lam = lam_re + 1j * jnp.arange(1.0, 5.0)
    return jnp.sum(jnp.real(jnp.exp(lam)[None, :] * u) ** 2)


@pytest.mark.browser
def test_a_complex_values_panel_says_its_statistics_are_of_the_magnitude(page, tmp_path):
    lam_re = jnp.full(4, -0.5)
    u = jnp.linspace(0.1, 1.0, 12).reshape(3, 4).astype(jnp.complex64)
    ins = sowviz.inspect(_ssm, lam_re, u)
    probe = ins.probe("Lambda")
    lam = np.asarray(lam_re) + 1j * np.arange(1.0, 5.0)
    # the table's min is the smallest |x|, not the real part (-0.5) nor min of anything else
    assert probe.summaries["primal"]["min"] == pytest.approx(np.abs(lam).min(), rel=1e-6)
    pg = page.open_report(ins.save_html(tmp_path / "complex.html"))
    pg.get_by_text("Lambda", exact=True).first.click()
    table = pg.locator('[data-role="stats"]')
    heads = table.locator("thead th").all_text_contents()
    assert heads[1:] == ["|primal|", "|cotangent|"], heads
    row = table.locator('tr[data-stat="min"] td').first.text_content()
    assert float(row) == pytest.approx(np.abs(lam).min(), rel=1e-3)
    titles = pg.locator(".sv-detail .xtitle").all_text_contents()
    assert "|primal|" in titles and "|cotangent|" in titles, titles
    # a real value's panel keeps the plain names
    pg.get_by_text("lam_re", exact=True).first.click()
    heads = pg.locator('[data-role="stats"] thead th').all_text_contents()
    assert heads[1:] == ["primal", "cotangent"], heads
