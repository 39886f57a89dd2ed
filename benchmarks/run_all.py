"""Run every benchmark and print one table of the measured ratios and targets.

    python benchmarks/run_all.py [--quick] [--big] [--only NAME ...]

Each benchmark runs in this process, one after the other (inspect_memory starts
its own child processes); a benchmark that fails is reported and the others
still run. Works from a source checkout (`PYTHONPATH=.` or not) on CPU or GPU.
"""

from __future__ import annotations

import importlib
import time
import traceback

import _bench

BENCHMARKS = [
    "capture_overhead",
    "summary_overhead",
    "monitor_overhead",
    "inspect_memory",
    "inspect_compile",
    "chunked_summaries",
    "widget_switch",
    "show_notebook",
    "graph_scale",
    "inspect_scale",
    "frontend_load",
    "gpu_kernels",
    "runlog_overhead",
    "runlog_load_memory",
    "explicit_mesh",
    "loops_compile",
    "compat_patches",
]


def main() -> None:
    def extra(ap):
        ap.add_argument("--big", action="store_true", help="also the 10k-equation compile case")
        ap.add_argument("--only", nargs="+", choices=BENCHMARKS)

    ns = _bench.args(__doc__, extra)
    print(_bench.platform(), "(quick)" if ns.quick else "")
    rows: list[_bench.Row] = []
    failed: list[str] = []
    for name in ns.only or BENCHMARKS:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            mod = importlib.import_module(name)
            if name == "inspect_compile":
                got = mod.main(ns.quick, ns.big)
            elif name == "frontend_load":
                got = mod.main(ns.quick, argv=[])
            else:
                got = mod.main(ns.quick)
            rows += got or []
        except Exception:
            traceback.print_exc()
            failed.append(name)
        print(f"   ({time.perf_counter() - t0:.0f} s)", flush=True)
    print()
    print("| benchmark | case | measured | target |\n|---|---|---|---|")
    for r in rows:
        v = f"{r.value:.3f}×" if r.unit == "x" else f"{r.value:.4g} {r.unit}"
        print(f"| {r.bench} | {r.case} | {v} {r.detail} | {r.target} |")
    if failed:
        print(f"\nFAILED: {', '.join(failed)}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
