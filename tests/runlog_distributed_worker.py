"""One process of the two-process run-log test (tests/test_runlog_distributed.py).

    python tests/runlog_distributed_worker.py PORT PROCESS_ID LOG_DIR

Joins a 2-process `jax.distributed` job on 127.0.0.1:PORT (CPU, 2 devices each),
trains a small MLP on a batch sharded over a mesh of all 4 devices with
`sowviz.Monitor(..., log_dir=LOG_DIR)` (both processes pass the same directory), and
prints what it saw.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def main(port: str, pid: int, log_dir: str) -> None:
    try:  # cross-process collectives on CPU (JAX >= 0.4.3x)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except (AttributeError, KeyError, ValueError):
        pass
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid
    )
    import sowviz
    from sowviz.runlog import make_sinks

    mesh = Mesh(np.array(jax.devices()), ("data",))
    data = NamedSharding(mesh, P("data"))
    rep = NamedSharding(mesh, P())
    rng = np.random.default_rng(0)  # the same numbers on both processes
    xs, ys = (
        rng.normal(size=(16, 4)).astype(np.float32),
        rng.normal(size=(16, 1)).astype(np.float32),
    )
    x = jax.make_array_from_callback(xs.shape, data, lambda i: xs[i])
    y = jax.make_array_from_callback(ys.shape, data, lambda i: ys[i])
    w0 = rng.normal(size=(4, 8)).astype(np.float32)
    w1 = rng.normal(size=(8, 1)).astype(np.float32)
    params = {
        "w0": jax.make_array_from_callback(w0.shape, rep, lambda i: w0[i]),
        "w1": jax.make_array_from_callback(w1.shape, rep, lambda i: w1[i]),
    }

    def loss(p, x, y):
        with jax.named_scope("hidden"):
            h = jnp.tanh(x @ p["w0"])
        with jax.named_scope("head"):
            out = h @ p["w1"]
        return jnp.mean((out - y) ** 2)

    report = {"process": jax.process_index(), "devices": len(jax.devices())}
    try:
        mon = sowviz.Monitor(loss, log_dir=log_dir)
        losses = []
        for _ in range(4):
            value, grads = mon.step(params, x, y)
            params = jax.tree.map(lambda a, g: a - 0.1 * g, params, grads)
            losses.append(float(value))
        mon.close()
        report["losses"] = losses
        report["monitor"] = "ok"
    except Exception as err:  # reported to the test, which shows it
        report["monitor"] = f"{type(err).__name__}: {err}"

    def loss_nan(p, x, y, c):  # NaN at the step where c < 0
        with jax.named_scope("hidden"):
            h = jnp.tanh(x @ p["w0"]) * jnp.sqrt(c)
        return jnp.mean((h @ p["w1"] - y) ** 2)

    try:  # a NaN on an unrecorded step: located by a re-run on both processes
        mon = sowviz.Monitor(loss_nan, every=3)
        for step in range(4):
            _, grads = mon.step(params, x, y, jnp.asarray(-1.0 if step == 2 else 1.0))
            report["grad_specs"] = {k: list(g.sharding.spec) for k, g in grads.items()}
        mon.flush()
        nf = mon.nonfinite
        eq = nf.origins.forward.equation if nf.origins and nf.origins.forward else None
        report["nan"] = {
            "step": nf.step,
            "located": bool(nf.origins and nf.origins.located),
            "primitive": eq.primitive if eq else None,
        }
        mon.close()
    except Exception as err:
        report["nan"] = f"{type(err).__name__}: {err}"
    try:  # the "process 0 writes" idiom: a `log_dir` on process 0 alone (it hung)
        only0 = os.path.join(os.path.dirname(log_dir), "only0")
        mon = sowviz.Monitor(loss, log_dir=only0 if pid == 0 else None)
        for _ in range(2):
            mon.step(params, x, y)
        mon.close()
        report["only0"] = "ok"
    except Exception as err:
        report["only0"] = f"{type(err).__name__}: {err}"
    # The process-0 rule itself: another process gets no sinks and creates nothing.
    other = os.path.join(os.path.dirname(log_dir), f"direct-{pid}")
    report["direct_sinks"] = len(make_sinks(other))
    report["direct_created"] = os.path.exists(other)
    print("REPORT " + json.dumps(report), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
