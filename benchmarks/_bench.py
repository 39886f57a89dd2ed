"""Shared benchmark plumbing: `--quick`, result rows, peak memory.

Every benchmark's `main(quick)` returns a list of `Row`s (and prints them as it
goes); `run_all.py` runs them all and prints one table. A quick run
(`--quick` or ``SOWVIZ_BENCH_QUICK=1``) is a smoke test: small sizes, few
repeats, numbers not meant to be quoted.
"""

from __future__ import annotations

import argparse
import gc
import os
import pathlib
import sys
from dataclasses import dataclass

import jax

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a source checkout without installing
    sys.path.insert(0, str(ROOT))


@dataclass
class Row:
    bench: str
    case: str
    value: float  # the measured quantity (a ratio, unless `unit` says otherwise)
    unit: str = "x"
    target: str = ""
    detail: str = ""

    def line(self) -> str:
        v = f"{self.value:.3f}{self.unit}" if self.unit == "x" else f"{self.value:.4g} {self.unit}"
        t = f" (target {self.target})" if self.target else ""
        return f"{self.bench} | {self.case}: {v}{t}  {self.detail}".rstrip()


def args(doc: str, extra=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: small sizes, few repeats")
    if extra:
        extra(ap)
    ns = ap.parse_args()
    ns.quick = ns.quick or os.environ.get("SOWVIZ_BENCH_QUICK") == "1"
    return ns


def platform() -> str:
    d = jax.devices()[0]
    return f"jax {jax.__version__} on {d.platform} ({d.device_kind}, {jax.device_count()} devices)"


def emit(rows: list[Row], row: Row) -> Row:
    print(row.line(), flush=True)
    rows.append(row)
    return row


class Rows(list):
    """One benchmark's rows: `add` makes a row under the benchmark's name and prints it."""

    def __init__(self, bench: str):
        super().__init__()
        self.bench = bench

    def add(
        self, case: str, value: float, unit: str = "x", target: str = "", detail: str = ""
    ) -> Row:
        return emit(self, Row(self.bench, case, value, unit, target, detail))


# --------------------------------------------------------------------------
# Peak memory: device memory stats where the backend has them (GPU), else the
# process' resident set high-water mark (VmHWM), reset through clear_refs.


def _device_peak() -> int | None:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def device_peak_available() -> bool:
    """Whether the backend reports a device memory peak (GPU: yes, CPU: no)."""
    return _device_peak() is not None


def _rss_hwm() -> int | None:
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _rss_now() -> int | None:
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def peak_memory(fn) -> tuple[int, str]:
    """Bytes by which running `fn()` raised the peak above what was live before, and how
    it was measured. Device peaks cannot be reset: measure the smaller thing first."""
    gc.collect()
    if _device_peak() is not None:
        live = jax.devices()[0].memory_stats().get("bytes_in_use", 0)
        before = _device_peak()
        jax.block_until_ready(fn())
        return max(0, _device_peak() - max(before, live)), "device peak_bytes_in_use"
    try:
        pathlib.Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to VmRSS
    except OSError:
        pass
    base = _rss_now() or 0
    jax.block_until_ready(fn())
    return max(0, (_rss_hwm() or 0) - base), "process VmHWM"
