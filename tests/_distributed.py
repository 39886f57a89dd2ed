"""Two `jax.distributed` processes on this machine: a worker script run once per process
id, on a loopback coordinator, without the parent's forced device count."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from lab_session import free_port

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_two_processes(worker: pathlib.Path, *args: str, timeout: float) -> list[tuple]:
    """`python worker PORT PROCESS_ID *args` for process ids 0 and 1 at once; their
    (returncode, stdout, stderr), by process id. A process still running past `timeout`
    (its peer died in a collective) is killed, never left behind."""
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = str(ROOT)
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), port, str(i), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return results
