"""Reading a run log back: peak memory and time of `sowviz.load(log_dir)` over N steps.

`load` keeps the whole run thinned to `history` entries (the Monitor's own rule), so
its memory must not grow with the log's length: records are decoded and handed to
the history one at a time, never all held at once. For each N, a run log of N
recorded steps of a real Monitor run (the 4-layer MLP of `runlog_overhead.py`: 10
probes, 20 summaries per step; its entries renumbered and repeated) is written with
the run log's own sink, then read by `sowviz.load(log_dir, history=200)` in a fresh
child process, which reports how far loading raised its resident set's high-water
mark (VmHWM; the log and the model are written before, so only the read counts) and
how long it took. Target: flat in N. Reading `python -m sowviz report` does is the
same `load`.

Run: `python benchmarks/runlog_load_memory.py [--quick]`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import _bench

HISTORY = 200


def write_log(log_dir: str, n: int) -> int:
    """A run log of `n` steps; returns the size of its steps.log in bytes."""
    import runlog_overhead

    from sowviz.runlog import make_sinks

    model, entries = runlog_overhead.entries(10)
    (sink,) = make_sinks(log_dir)
    sink.open(model)
    for i in range(n):
        sink.write({**entries[i % len(entries)], "step": i})
    sink.close()
    return os.path.getsize(os.path.join(log_dir, "steps.log"))


def read_in_child(log_dir: str) -> dict:
    """Load the log in a fresh process: the VmHWM it added, the time, what it kept."""
    code = f"""
import json, pathlib, sys, time
sys.path.insert(0, {str(_bench.ROOT)!r})
import sowviz

def mem(key):
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024

pathlib.Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
base = mem("VmRSS:")
t = time.perf_counter()
run = sowviz.load({log_dir!r}, history={HISTORY})
t = time.perf_counter() - t
print(json.dumps(dict(peak=mem("VmHWM:") - base, seconds=t, read=run.steps_read,
                      kept=len(run.history))))
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(quick: bool = False) -> list[_bench.Row]:
    print(_bench.platform())
    rows: list[_bench.Row] = []
    sizes = (200, 800) if quick else (1000, 4000, 16000)
    with tempfile.TemporaryDirectory() as root:
        for n in sizes:
            log = os.path.join(root, f"log{n}")
            size = write_log(log, n)
            got = read_in_child(log)
            assert got["read"] == n, got
            detail = f"({size / 1e6:.1f} MB steps.log; {got['kept']} kept; {got['seconds']:.1f} s)"
            _bench.emit(
                rows,
                _bench.Row(
                    "runlog_load_memory",
                    f"load() of {n} steps: peak RSS added",
                    got["peak"] / 2**20,
                    "MiB",
                    target="flat in the number of steps",
                    detail=detail,
                ),
            )
    return rows


if __name__ == "__main__":
    main(_bench.args(__doc__).quick)
