"""End to end in a real JupyterLab: the quickstart notebook runs in headless chromium,
its widgets draw their graphs, and clicking a stage opens its charts.

Everything stays on the loopback interface: the server listens on 127.0.0.1 only, the
browser aborts every request that is not to it, and JupyterLab's news and update checks
are switched off.
"""

from __future__ import annotations

import pathlib
import re

import pytest
from lab_session import failed, jupyter_lab, open_notebook, run_all_cells

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "01_quickstart.ipynb"
ARTIFACTS = ROOT / "artifacts"
N_WIDGETS = 5  # the quickstart shows one widget per mode


@pytest.mark.browser
@pytest.mark.slow
def test_quickstart_runs_in_jupyterlab(browser, tmp_path):
    # `browser` is the session's shared chromium (tests/conftest.py): one Playwright
    # driver per process, since a second sync_playwright() cannot start inside the first.
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "jupyterlab_e2e_failure.png").unlink(missing_ok=True)
    blocked: list[str] = []
    errors: list[str] = []
    with jupyter_lab(tmp_path, [NOTEBOOK]) as (url, log):
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(30_000)
        try:
            open_notebook(page, url, NOTEBOOK.name, errors, blocked)

            run_all_cells(page)

            # Every widget draws its graph (the last one comes after ~20 s of JAX work).
            widgets = page.locator(".jp-OutputArea-output .sowviz")
            page.wait_for_function(
                f"""() => [...document.querySelectorAll('.jp-OutputArea-output .sowviz')]
                       .filter(w => w.querySelector('[data-node-id]')).length >= {N_WIDGETS}""",
                timeout=180_000,
            )
            assert widgets.count() == N_WIDGETS
            errors_shown = page.locator(
                '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
            )
            tracebacks = [
                t for t in errors_shown.all_inner_texts() if "Traceback" in t or "Error" in t
            ]
            assert tracebacks == []

            # The first widget (mode "grad"): click a probed stage, see its charts.
            first = widgets.first
            first.scroll_into_view_if_needed()
            kinds = first.locator("[data-node-id]").evaluate_all(
                "els => els.map(e => e.dataset.kind)"
            )
            assert "input" in kinds and "scope" in kinds
            # a layer (the "parameters" group opens its table of leaves, not charts; the
            # two identical hidden layers are one merged node, the output layer is not)
            # (by its card's label: the parameters group's tooltip names `dense_2.w` too)
            label = page.locator("text.sv-label", has_text=re.compile(r"^dense_2$"))
            stage = first.locator('[data-has-probe="true"][data-kind="scope"]').filter(has=label)
            stage = stage.first
            stage.click()
            detail = first.locator('[data-role="detail"]')
            detail.wait_for(state="visible")
            charts = detail.locator(".sv-chart-block > .sv-chart.js-plotly-plot")  # histograms
            charts.first.wait_for(state="visible")
            modes = charts.evaluate_all("els => els.map(e => e.dataset.mode)")
            assert modes == ["primal", "cotangent"]
            assert "dense_2" in detail.inner_text()
            page.wait_for_timeout(500)  # let plotly finish drawing before the picture
            first.screenshot(path=str(ARTIFACTS / "jupyterlab_e2e.png"))
        except Exception as err:
            raise failed(err, page, log, ARTIFACTS / "jupyterlab_e2e_failure.png") from err
        finally:
            context.close()
    assert blocked == []
    assert errors == [], errors


MONITOR_CELL = """import time
import jax, jax.numpy as jnp, sowviz
from IPython.display import display

def loss(w, x):
    with jax.named_scope("layer"):
        h = jnp.tanh(x @ w)
    return jnp.mean(h ** 2)

w, x = jnp.full((3, 2), 0.5), jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
mon = sowviz.Monitor(loss, throttle=0.0)
_, g = mon.step(w, x)
mon.flush()
display(mon)
time.sleep(2)  # the view is drawn; the run goes on
for _ in range(8):
    w = w - 0.5 * g
    _, g = mon.step(w, x)
mon.flush()
print("LOSSES", [round(e["loss"], 6) for e in mon.history])"""


@pytest.mark.browser
@pytest.mark.slow
def test_a_displayed_monitor_follows_the_run_in_jupyterlab(browser, tmp_path):
    # The live view stayed at its first step in JupyterLab: anywidget hands `initialize`
    # and `render` model objects of their own, and the steps were kept per object.
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(MONITOR_CELL)])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    path = tmp_path / "monitor_live.ipynb"
    nbformat.write(nb, path)
    errors: list[str] = []
    with jupyter_lab(tmp_path / "lab", [path]) as (url, log):
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(30_000)
        try:
            open_notebook(page, url, path.name, errors, blocked := [])
            run_all_cells(page)
            page.locator(".jp-OutputArea-output", has_text="LOSSES").wait_for(timeout=180_000)
            text = page.locator(".jp-OutputArea-output", has_text="LOSSES").inner_text()
            want = [float(v) for v in text.split("[", 1)[1].split("]", 1)[0].split(",")]
            assert len(want) == 9
            view = page.locator(".jp-OutputArea-output .sowviz").first
            page.wait_for_function(
                """() => document.querySelector('.jp-OutputArea-output .sowviz [data-role=step]')
                       ?.textContent.startsWith('step 8')""",
                timeout=60_000,
            )
            chart = view.locator('[data-role="loss"] .js-plotly-plot')
            got = chart.evaluate("gd => gd.data[0].y")
            assert got == pytest.approx(want, abs=1e-6)
            view.screenshot(path=str(ARTIFACTS / "jupyterlab_monitor_live.png"))
        except Exception as err:
            raise failed(err, page, log, ARTIFACTS / "jupyterlab_monitor_failure.png") from err
        finally:
            context.close()
    assert blocked == []
    assert errors == [], errors
