"""A real JupyterLab for the browser tests and benchmarks: a server on 127.0.0.1 only,
its directories in a temporary folder, a kernelspec for this interpreter, no network
checks (`jupyter_lab`); and Run All Cells as a user clicks it (`run_all_cells`)."""

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
from collections.abc import Sequence


def install_kernelspec(prefix: pathlib.Path) -> None:
    """A `python3` Jupyter kernelspec for this interpreter (the venv's) under `prefix`."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "ipykernel",
            "install",
            "--prefix",
            str(prefix),
            "--name",
            "python3",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


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
    """Waits until the server answers `url`; a RuntimeError with its log if it does not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise RuntimeError(
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
def jupyter_lab(base: pathlib.Path, notebooks: Sequence[pathlib.Path], env: dict | None = None):
    """A JupyterLab server on 127.0.0.1 serving copies of `notebooks` (in ``base/root``),
    its directories under `base` (`lab_environment`, updated with `env`); yields its URL
    and the path of its log, and ends it with its kernels."""
    root = base / "root"
    root.mkdir(parents=True)
    for nb in notebooks:
        shutil.copy(nb, root / nb.name)
    env = {**lab_environment(base), **(env or {})}
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


def open_notebook(page, url: str, name: str, errors: list[str], blocked: list[str]) -> None:
    """Open notebook `name` of the server at `url` in `page`, as a user would: every
    request not to that server is aborted (its URL added to `blocked`) and page errors
    are added to `errors`; returns once the kernel is idle (the toolbar says so)."""

    def route(r):
        if r.request.url.startswith(url + "/"):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{url}/lab/tree/{name}", timeout=60_000)
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
    page.wait_for_function(
        """() => [...document.querySelectorAll('.jp-Notebook-ExecutionIndicator')]
               .some(e => e.getAttribute('data-status') === 'idle')""",
        timeout=90_000,
    )


def failed(err: Exception, page, log: pathlib.Path, picture: pathlib.Path) -> AssertionError:
    """What a failed JupyterLab test raises: the error, a screenshot of the page at
    `picture` (best effort), and the end of JupyterLab's log."""
    with contextlib.suppress(Exception):
        page.screenshot(path=str(picture))
    return AssertionError(
        f"{err}\n--- see {picture.name}; jupyter lab's log ends:\n{log.read_text()[-3000:]}"
    )
