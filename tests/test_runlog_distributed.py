"""Several hosts: two `jax.distributed` processes on this machine (loopback coordinator,
CPU devices, one mesh over both), each stepping a Monitor with the same `log_dir`;
only process 0 writes."""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _distributed import run_two_processes

from sowviz.runlog import load

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "runlog_distributed_worker.py"


def plain_losses(steps: int) -> list[float]:
    """The worker's training, single-process with plain `jax.value_and_grad`."""
    rng = np.random.default_rng(0)
    xs, ys = (
        rng.normal(size=(16, 4)).astype(np.float32),
        rng.normal(size=(16, 1)).astype(np.float32),
    )
    p = {
        "w0": rng.normal(size=(4, 8)).astype(np.float32),
        "w1": rng.normal(size=(8, 1)).astype(np.float32),
    }

    def loss(p, x, y):
        return jnp.mean((jnp.tanh(x @ p["w0"]) @ p["w1"] - y) ** 2)

    out = []
    for _ in range(steps):
        v, g = jax.value_and_grad(loss)(p, xs, ys)
        p = jax.tree.map(lambda a, b: a - 0.1 * b, p, g)
        out.append(float(v))
    return out


@pytest.mark.slow
def test_two_processes_step_in_lockstep_and_only_process_0_writes(tmp_path):
    log = tmp_path / "log"
    runs = run_two_processes(WORKER, str(log), timeout=300)
    reports = {}
    for rc, out, err in runs:
        assert rc == 0, out[-3000:] + err[-3000:]
        line = next(ln for ln in out.splitlines() if ln.startswith("REPORT "))
        r = json.loads(line[len("REPORT ") :])
        reports[r["process"]] = r
    assert set(reports) == {0, 1}
    for r in reports.values():
        assert r["devices"] == 4  # one mesh over both processes' devices
        assert r["monitor"] == "ok", r["monitor"]
    # Lockstep: both processes computed the same steps, equal to plain JAX on one host.
    want = plain_losses(4)
    assert reports[0]["losses"] == pytest.approx(want, rel=1e-5)
    assert reports[1]["losses"] == reports[0]["losses"]
    # Only process 0 wrote: each step once, the losses process 0 returned.
    view = load(log)
    assert view.finished
    assert [e["step"] for e in view.history] == [0, 1, 2, 3]
    assert [e["loss"] for e in view.history] == pytest.approx(reports[0]["losses"], rel=1e-6)
    assert {p["name"] for p in view.model["probes"]} >= {"hidden", "head"}
    # A NaN on an unrecorded step is located on every process ("Fetching value for
    # jax.Array that spans non-addressable devices" stopped it), and gradients of
    # replicated parameters come back replicated, as under jit.
    for r in reports.values():
        assert r["nan"] == {"step": 2, "located": True, "primitive": "sqrt"}, r["nan"]
        assert r["grad_specs"] == {"w0": [], "w1": []}  # replicated
    # a `log_dir` given to process 0 alone: both step, process 0 writes
    assert [r["only0"] for r in reports.values()] == ["ok", "ok"]
    assert [e["step"] for e in load(tmp_path / "only0").history] == [0, 1]
    assert reports[0]["direct_sinks"] == 1 and reports[0]["direct_created"]
    assert reports[1]["direct_sinks"] == 0 and not reports[1]["direct_created"]
