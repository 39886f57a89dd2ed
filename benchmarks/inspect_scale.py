"""`sowviz.inspect` on real 1K- and 10K-equation programs, end to end.

A deep residual MLP of `jax.named_scope` layers (4 equations each). Prints, per
size: equations, inspect time (trace, graph, instrument, grad, compile, run,
summaries; first call), model JSON size, report size, and — when Debian's
chromium is installed — the time from opening the report from disk until the
graph is interactive (target: ≤ 2 s for 10K equations).

    python benchmarks/inspect_scale.py [--quick]
"""

from __future__ import annotations

import json
import pathlib
import tempfile
import time

import _bench
import jax
import jax.numpy as jnp
from frontend_load import ARGS, CHROMIUM, measure, no_browser

import sowviz


def deep_mlp(n_layers: int):
    def loss(ws, x):
        for i, w in enumerate(ws):
            with jax.named_scope(f"layer_{i}"):
                x = x + jnp.tanh(x @ w + 1.0)
        return jnp.sum(x * x) / x.size

    keys = jax.random.split(jax.random.PRNGKey(0), n_layers)
    ws = [jax.random.normal(k, (16, 16)) / 40 for k in keys]
    return loss, ws, jax.random.normal(jax.random.PRNGKey(1), (8, 16))


def main(quick: bool = False) -> list[_bench.Row]:
    out: list[_bench.Row] = []
    rows = []
    tmp = pathlib.Path(tempfile.mkdtemp())
    for target in (1_000,) if quick else (1_000, 10_000):
        loss, ws, x = deep_mlp(target // 4)
        t0 = time.perf_counter()
        ins = sowviz.inspect(loss, ws, x, mode="grad")
        t_inspect = time.perf_counter() - t0
        model = ins.to_dict()
        path = ins.save_html(str(tmp / f"inspect_{target}.html"))
        rows.append((target, t_inspect, len(json.dumps(model)), pathlib.Path(path)))
        out.append(_bench.Row("inspect_scale", f"first inspect, {target} eqns", t_inspect, "s"))
        print(
            f"{target:>6} eqns: inspect {t_inspect:6.2f} s | nodes {len(model['nodes']):>6} | "
            f"probes {len(model['probes']):>5} | model {len(json.dumps(model)) / 1e6:5.2f} MB | "
            f"report {pathlib.Path(path).stat().st_size / 1e6:5.2f} MB"
        )
    if why := no_browser():
        print(f"{why}: skipping the load-time measurement")
        return out
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for target, _, _, path in rows:
            m = measure(browser, path, expand=None)
            print(
                f"{target:>6} eqns: report interactive after {m['ready_ms']:.0f} ms in headless chromium"
            )
            out.append(
                _bench.Row(
                    "inspect_scale",
                    f"report interactive, {target} eqns",
                    m["ready_ms"] / 1e3,
                    "s",
                    target="≤ 2 s" if target == 10_000 else "",
                )
            )
        browser.close()
    return out


if __name__ == "__main__":
    main(_bench.args(__doc__).quick)
