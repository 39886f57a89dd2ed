"""End to end in a real JupyterLab: the quickstart notebook runs in headless chromium,
its widgets draw their graphs, and clicking a stage opens its charts.

Everything stays on the loopback interface: the server listens on 127.0.0.1 only, the
browser aborts every request that is not to it, and JupyterLab's news and update checks
are switched off.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from conftest import install_kernelspec

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "01_quickstart.ipynb"
ARTIFACTS = ROOT / "artifacts"
N_WIDGETS = 5  # the quickstart shows one widget per mode


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_json(path: pathlib.Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def lab_environment(base: pathlib.Path) -> dict[str, str]:
    """Jupyter's directories under `base`, a `python3` kernelspec for this interpreter,
    settings: no network checks, every notebook cell in the DOM."""
    prefix = base / "prefix"
    install_kernelspec(prefix)
    settings = base / "settings"
    write_json(
        settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings",
        {"fetchNews": "false", "checkForUpdates": False},
    )
    write_json(
        settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings",
        {"windowingMode": "none", "autoStartDefaultKernel": True},
    )
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the kernel gets JAX's default single CPU device
    env.update(
        JUPYTER_PATH=str(prefix / "share" / "jupyter"),
        JUPYTER_CONFIG_DIR=str(base / "config"),
        JUPYTER_DATA_DIR=str(base / "data"),
        JUPYTER_RUNTIME_DIR=str(base / "runtime"),
        JUPYTER_PLATFORM_DIRS="1",
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"),
        IPYTHONDIR=str(base / "ipython"),
        JAX_PLATFORMS="cpu",
        PYDEVD_DISABLE_FILE_VALIDATION="1",
    )
    return env


def wait_until_up(url: str, proc: subprocess.Popen, log: pathlib.Path, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    pytest.fail(
        f"jupyter lab did not answer {url} within {timeout:.0f}s:\n{log.read_text()[-3000:]}"
    )


def stop(proc: subprocess.Popen) -> None:
    """Ends the server's whole process group (the server and its kernels)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextlib.contextmanager
def jupyter_lab(base: pathlib.Path):
    root = base / "root"
    root.mkdir()
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)
    env = lab_environment(base)
    port = free_port()
    log = base / "jupyterlab.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter",
                "lab",
                "--no-browser",
                "--IdentityProvider.token=",
                "--ServerApp.password=",
                "--ServerApp.ip=127.0.0.1",
                f"--port={port}",
                "--ServerApp.port_retries=0",
                f"--ServerApp.root_dir={root}",
                "--LabApp.extension_manager=readonly",  # no PyPI look-ups
                *(["--allow-root"] if os.geteuid() == 0 else []),
            ],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: kernels die with it
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(f"{url}/api/status", proc, log)
        yield url, log
    finally:
        stop(proc)


PROMPTS = (
    "() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent)"
)


def run_all_cells(page, timeout: float = 120.0) -> None:
    """Run > Run All Cells, through the menu bar as a user would, once the first cell has
    run. The menu acts on the current widget, so the notebook is clicked first; should the
    request still be lost (nothing queued or running), it is asked for again."""
    deadline = time.monotonic() + timeout
    clicked_at = -1.0
    while time.monotonic() < deadline:
        prompts = "".join(page.evaluate(PROMPTS))
        if any(ch.isdigit() for ch in prompts):
            return
        if "*" not in prompts and time.monotonic() - clicked_at > 15.0:
            page.locator(".jp-Notebook .jp-Cell").first.click()
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
            clicked_at = time.monotonic()
        page.wait_for_timeout(250)
    raise AssertionError(f"Run All Cells: no cell ran within {timeout:.0f}s")


@pytest.mark.browser
@pytest.mark.slow
def test_quickstart_runs_in_jupyterlab(browser, tmp_path):
    # `browser` is the session's shared chromium (tests/conftest.py): one Playwright
    # driver per process, since a second sync_playwright() cannot start inside the first.
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "jupyterlab_e2e_failure.png").unlink(missing_ok=True)
    blocked: list[str] = []
    errors: list[str] = []
    with jupyter_lab(tmp_path) as (url, log):
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(30_000)
        try:

            def route(r):
                if r.request.url.startswith(url + "/"):
                    r.continue_()
                else:
                    blocked.append(r.request.url)
                    r.abort()

            page.route("**/*", route)
            page.on("pageerror", lambda e: errors.append(str(e)))

            page.goto(f"{url}/lab/tree/{NOTEBOOK.name}", timeout=60_000)
            page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
            # Wait for the kernel before running (the status shows in the toolbar).
            page.wait_for_function(
                """() => [...document.querySelectorAll('.jp-Notebook-ExecutionIndicator')]
                       .some(e => e.getAttribute('data-status') === 'idle')""",
                timeout=90_000,
            )

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
            stage = first.locator('[data-has-probe="true"][data-kind="scope"]', has_text="dense_2")
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
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "jupyterlab_e2e_failure.png"))
            raise AssertionError(
                f"{err}\n--- see artifacts/jupyterlab_e2e_failure.png; jupyter lab's log ends:\n"
                + log.read_text()[-3000:]
            ) from err
        finally:
            context.close()
    assert blocked == []
    assert errors == [], errors
