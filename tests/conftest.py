"""Test configuration: several CPU devices for sharding tests, deterministic JAX and
property tests (a derandomized hypothesis profile, loaded for every run)."""

import os
import tempfile

# Must be set before JAX initialises its backends.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# On a GPU (JAX_PLATFORMS="" or "cuda"): tests that start processes need memory that
# this process would otherwise have preallocated (75% of the GPU).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# sowviz's compiled summary programs are kept on disk (`sowviz._disk_cache`): the
# suite, and the processes it starts, keep theirs in a fresh directory, not in ~/.cache.
os.environ.setdefault("SOWVIZ_CACHE_DIR", tempfile.mkdtemp(prefix="sowviz-test-cache-"))

import pathlib

import jax
import pytest
from hypothesis import HealthCheck, settings

# Property tests are deterministic everywhere (CI sets CI=true; a laptop gets the
# same examples): derandomized, no example database carried between runs, no
# deadline (a first call compiles with XLA, which no deadline can predict).
settings.register_profile(
    "sowviz",
    derandomize=True,
    database=None,
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("sowviz")

# Results are compared with plain JAX's at float32 tolerances; a GPU's default matmul
# precision (TF32 on an H100) differs from one fusion of a program to another.
if jax.default_backend() != "cpu":
    jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture(autouse=True)
def _no_modes_warmed_ahead(monkeypatch):
    """`show()` compiles mode "all" in a background thread once its picture is drawn
    (`sowviz.widget.WARM_MODES`). Off in this process's tests: on CI's two cores
    every `show()` would leave a compile running into the tests after it, some of
    which count compiled programs. The tests of the warm-up turn it back on; notebooks
    and JupyterLab, run in kernels of their own, keep the default."""
    import sowviz.widget

    monkeypatch.setattr(sowviz.widget, "WARM_MODES", ())


CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="session")
def chromium_path() -> str:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run `make test`, which installs Debian's chromium")
    return CHROMIUM


LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session")
def browser(chromium_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path, args=LAUNCH_ARGS)
        yield b
        b.close()


class Page:
    """A page with every request recorded and every non-file request aborted."""

    def __init__(self, browser, color_scheme="light"):
        self.context = browser.new_context(
            viewport={"width": 1400, "height": 900}, color_scheme=color_scheme
        )
        self.page = self.context.new_page()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

        def route(r):
            url = r.request.url
            if url.startswith("file://"):
                r.continue_()
            else:
                self.requests.append(url)
                r.abort()

        self.page.route("**/*", route)
        self.page.on(
            "request",
            lambda req: None if req.url.startswith("file://") else self.requests.append(req.url),
        )

    def open_report(self, path: pathlib.Path):
        self.page.goto(path.as_uri())
        self.page.wait_for_function("() => window.__sowviz_ready === true", timeout=15000)
        return self.page

    def close(self):
        self.context.close()


@pytest.fixture
def page(browser):
    p = Page(browser)
    yield p
    p.close()


def pytest_configure(config):
    # Many tests make NaN/Inf on purpose and read `mon.nonfinite`; the Monitor's
    # one-time warning about it is asserted where it is the subject
    # (test_monitor_steps.py), and would otherwise fail those runs (warnings are errors).
    config.addinivalue_line("filterwarnings", "ignore::sowviz.monitor.NonFiniteWarning")
