"""Front-end load time: synthetic models of 1K and 10K equations, written as HTML
reports, opened from disk in headless chromium.

Prints, per model, the report size and the time from navigation start until the graph
is interactive: `window.__sowviz_ready` is set (after the first draw) and
`[data-node-id]` elements exist. Then it expands the largest stage and times that, and
prints the bundle size. Target (DESIGN.md): 10K equations interactive within 2 s.

Then a real model: the zoo's Flax NNX language model with `--nnx` (24) layers,
inspected in grad mode and written as a report; it must be interactive within
1.5 s (issue 13). Also timed: expanding the model's module (`TransformerLM`, which
holds the stacked `layers[0–23] (×24)` node) and opening that node's detail panel
(its per-block charts).

    .venv/bin/python benchmarks/frontend_load.py [--runs 3] [--sizes 1000 10000] [--nnx 24]
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import pathlib
import statistics
import tempfile
import time

from sowviz import report

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"


def no_browser() -> str | None:
    """Why the browser measurements cannot run here (None when they can). A GPU
    machine carries neither Chromium nor Playwright; the front end's numbers do not
    depend on the accelerator, so they are taken on a machine that has them."""
    missing = [
        what
        for what, here in (
            (CHROMIUM, pathlib.Path(CHROMIUM).exists()),
            ("playwright", importlib.util.find_spec("playwright") is not None),
        )
        if not here
    ]
    return f"{' and '.join(missing)} not installed" if missing else None


ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _fixtures():
    path = ROOT / "tests" / "fixtures" / "frontend_models.py"
    spec = importlib.util.spec_from_file_location("frontend_models", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measure(browser, path: pathlib.Path, expand: str | None) -> dict:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    requests: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("request", lambda r: None if r.url.startswith("file:") else requests.append(r.url))
    page.goto(path.as_uri())
    page.wait_for_function(
        "() => window.__sowviz_ready === true && !!document.querySelector('[data-node-id]')",
        polling="raf",
        timeout=30000,
    )
    ready_ms = page.evaluate("() => performance.now()")
    nodes = page.locator("[data-node-id]").count()
    expand_ms = None
    if expand:
        t = time.perf_counter()
        page.locator(f'[data-node-id="{expand}"] [data-role="toggle"]').first.click()
        page.wait_for_selector(f'[data-node-id="{expand}"][data-expanded="true"]')
        expand_ms = (time.perf_counter() - t) * 1000
    page.close()
    if errors or requests:
        raise RuntimeError(f"console errors {errors} or requests {requests}")
    return {"ready_ms": ready_ms, "drawn": nodes, "expand_ms": expand_ms}


def _click_ms(page, selector: str, wait: str) -> float:
    t = time.perf_counter()
    page.locator(selector).first.click()
    page.wait_for_selector(wait)
    return (time.perf_counter() - t) * 1000


def main_thread_cpu_ms(browser, path: pathlib.Path) -> float:
    """CPU time of the page's main thread from navigation until the graph is interactive
    (sum of the trace's top-level task thread times): unlike the wall time, it does not
    grow when other processes load the machine."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    with tempfile.TemporaryDirectory() as tmp:
        trace = pathlib.Path(tmp) / "trace.json"
        cats = ["devtools.timeline", "disabled-by-default-devtools.timeline"]
        browser.start_tracing(page=page, path=str(trace), categories=cats)
        page.goto(path.as_uri())
        page.wait_for_function(
            "() => window.__sowviz_ready === true && !!document.querySelector('[data-node-id]')",
            polling="raf",
        )
        browser.stop_tracing()
        page.close()
        data = json.loads(trace.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    main = {
        (e["pid"], e["tid"])
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
        if e["args"].get("name") == "CrRendererMain"
    }
    return (
        sum(
            e.get("tdur", 0)
            for e in events
            if e.get("name") == "RunTask" and e.get("ph") == "X" and (e["pid"], e["tid"]) in main
        )
        / 1e3
    )


def measure_nnx(browser, path: pathlib.Path, runs: int) -> dict:
    """Ready time (median of `runs`), then expand the model and open the stacked layers."""
    ready = [measure(browser, path, None)["ready_ms"] for _ in range(runs)]
    cpu = [main_thread_cpu_ms(browser, path) for _ in range(runs)]
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(path.as_uri())
    page.wait_for_function("() => window.__sowviz_ready === true", polling="raf")
    lm = '[data-node-id][data-kind="scope"]:has(.sv-label:text-is("TransformerLM"))'
    expand = 0.0
    if page.locator("[data-repeats]").count() == 0:  # the module starts collapsed
        expand = _click_ms(page, f'{lm} [data-role="toggle"]', "[data-repeats]")
    detail = _click_ms(page, "[data-repeats]", '[data-role="repeats"] .js-plotly-plot')
    drawn = page.locator("[data-node-id]").count()
    page.close()
    return {"ready": ready, "cpu": cpu, "expand_ms": expand, "detail_ms": detail, "drawn": drawn}


def nnx_report(layers: int, tmp: str) -> tuple[pathlib.Path, int]:
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from zoo.models import nnx_lm

    import sowviz

    model, tokens, targets = nnx_lm.make(nnx_lm.Config(attention=("einsum",) * layers))
    ins = sowviz.inspect(nnx_lm.loss, model, tokens, targets, mode="grad")
    path = ins.save_html(pathlib.Path(tmp) / f"nnx{layers}.html", created=None)
    return path, len(ins.graph.nodes)


def main(quick: bool = False, argv: list[str] | None = None) -> list:
    import _bench

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 1K equations, one run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--stages", type=int, default=100, help="stages the equations sit under")
    ap.add_argument("--nnx", type=int, default=24, help="layers of the NNX model (0: skip it)")
    args = ap.parse_args(argv)
    if quick or args.quick:
        args.runs, args.sizes, args.nnx = 1, [1000], 0
    rows: list = []
    if why := no_browser():
        print(f"{why}: skipping the front-end load benchmark")
        return rows
    from playwright.sync_api import sync_playwright

    fm = _fixtures()
    static = ROOT / "sowviz" / "static"
    for name in ("sowviz.js", "sowviz.css"):
        data = (static / name).read_bytes()
        print(
            f"bundle {name}: {len(data) / 1024:.0f} KiB raw, {len(gzip.compress(data)) / 1024:.0f} KiB gzip"
        )
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for n in args.sizes:
            model = fm.large_model(n, n_stages=args.stages)
            path = report.write_html(model, pathlib.Path(tmp) / f"m{n}.html")
            n_nodes = len(model["nodes"])
            runs = [measure(browser, path, expand="s0") for _ in range(args.runs)]
            ready = [r["ready_ms"] for r in runs]
            expand = [r["expand_ms"] for r in runs]
            print(
                f"{n:>6} equations ({n_nodes} nodes, report {path.stat().st_size / 1e6:.1f} MB): "
                f"interactive in {statistics.median(ready):.0f} ms (median of {args.runs}; "
                f"min {min(ready):.0f}, max {max(ready):.0f}), {runs[0]['drawn']} nodes drawn; "
                f"expanding a {n // args.stages}-equation stage: {statistics.median(expand):.0f} ms"
            )
            rows.append(
                _bench.Row(
                    "frontend_load",
                    f"report interactive, {n} equations",
                    statistics.median(ready) / 1e3,
                    "s",
                    target="≤ 2 s" if n == 10000 else "",
                )
            )
        if args.nnx:
            path, n_nodes = nnx_report(args.nnx, tmp)
            r = measure_nnx(browser, path, args.runs)
            print(
                f"NNX LM, {args.nnx} layers ({n_nodes} nodes, report "
                f"{path.stat().st_size / 1e6:.1f} MB): interactive in "
                f"{statistics.median(r['ready']):.0f} ms (median of {args.runs}; min "
                f"{min(r['ready']):.0f}, max {max(r['ready']):.0f}; main-thread CPU "
                f"{statistics.median(r['cpu']):.0f} ms); expanding the model "
                f"{r['expand_ms']:.0f} ms, the stacked layers' detail {r['detail_ms']:.0f} ms, "
                f"{r['drawn']} nodes drawn"
            )
            rows.append(
                _bench.Row(
                    "frontend_load",
                    f"report interactive, NNX LM {args.nnx} layers",
                    statistics.median(r["ready"]) / 1e3,
                    "s",
                    target="≤ 1.5 s",
                )
            )
        browser.close()
    return rows


if __name__ == "__main__":
    main()
