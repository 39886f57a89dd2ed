"""`Monitor(every=1)` on a data-parallel mesh vs on one device, each against the plain
`jax.jit(jax.value_and_grad(loss))` step placed alike (round 14, finding 1).

One process with 8 host CPU devices (``--xla_force_host_platform_device_count=8``,
set before JAX starts): the 32-256-256-1 MLP of the finding, batch 256, its
parameters replicated and its batch split over a mesh axis ``data`` of 8 (an Auto
mesh), and the same model with its arguments on one device. Per placement, blocks of
`BLOCK` steps of the plain step and of the Monitor alternate (`_mlp.interleaved_medians`,
a Monitor block ending with `flush`), and the median step is reported as wall time
and as the process's CPU time (`time.process_time`): 8 host devices share this
machine's cores, so the wall time of a loaded machine says less than the work done.

The host devices are a proxy for a mesh: their collectives are thread rendezvous,
and the work of every device runs on the same cores.
Run: `python benchmarks/monitor_sharded.py [--quick]`.
"""

from __future__ import annotations

import itertools
import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import statistics
import time

import _bench
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import sowviz

#: Steps per timed block.
BLOCK = 10
SIZES = (32, 256, 256, 1)
BATCH = 256


def loss(params, x, y):
    h = x
    for p in params[:-1]:
        h = jax.nn.relu(h @ p["w"] + p["b"])
    return jnp.mean((h @ params[-1]["w"] + params[-1]["b"] - y) ** 2)


def arguments(placement: str) -> tuple:
    keys = jax.random.split(jax.random.PRNGKey(0), len(SIZES) - 1)
    params = [
        {"w": jax.random.normal(k, (a, b)) / np.sqrt(a), "b": jnp.zeros(b)}
        for k, (a, b) in zip(keys, itertools.pairwise(SIZES), strict=True)
    ]
    x = jax.random.normal(jax.random.PRNGKey(1), (BATCH, SIZES[0]))
    y = jnp.zeros((BATCH, 1))
    if placement == "one device":
        return params, x, y
    mesh = Mesh(np.array(jax.devices()), ("data",))
    split, whole = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    return jax.device_put(params, whole), jax.device_put(x, split), jax.device_put(y, split)


def timed(fns: dict, settle: dict, repeats: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per call of each thunk, blocks alternating."""
    for name, fn in fns.items():
        for _ in range(3):
            jax.block_until_ready(fn())
        if name in settle:
            settle[name]()
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t, c = time.perf_counter(), time.process_time()
            for _ in range(BLOCK):
                out = fn()
            jax.block_until_ready(out)
            if name in settle:
                settle[name]()
            samples[name].append(
                ((time.perf_counter() - t) / BLOCK, (time.process_time() - c) / BLOCK)
            )
    return {
        k: (statistics.median(s[0] for s in v), statistics.median(s[1] for s in v))
        for k, v in samples.items()
    }


def main(quick: bool = False) -> list[_bench.Row]:
    print(_bench.platform())
    if jax.device_count() < 8:
        raise RuntimeError(
            "monitor_sharded needs 8 devices: run it in a process of its own (it sets "
            "XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts)."
        )
    rows = _bench.Rows("monitor_sharded")
    ratios = {}
    for placement in ("one device", "8-device data-parallel mesh"):
        args = arguments(placement)
        plain = jax.jit(jax.value_and_grad(loss))
        mon = sowviz.Monitor(loss, every=1)
        med = timed(
            {"plain": lambda: plain(*args), "monitored": lambda: mon.step(*args)},  # noqa: B023
            {"monitored": mon.flush},
            3 if quick else 20,
        )
        mon.close()
        (pw, pc), (mw, mc) = med["plain"], med["monitored"]
        ratios[placement] = (mw / pw, mc / pc)
        rows.add(
            f"Monitor(every=1) / plain step, 32-256-256-1 MLP b{BATCH}, {placement}: wall",
            mw / pw,
            detail=f"({mw * 1e3:.2f} ms vs {pw * 1e3:.2f} ms)",
        )
        rows.add(
            f"the same, process CPU time, {placement}",
            mc / pc,
            detail=f"({mc * 1e3:.2f} ms vs {pc * 1e3:.2f} ms)",
        )
    one, mesh = ratios["one device"], ratios["8-device data-parallel mesh"]
    rows.add("mesh ratio / one-device ratio: wall", mesh[0] / one[0], target="≤ 1.5x")
    rows.add("mesh ratio / one-device ratio: CPU", mesh[1] / one[1], target="≤ 1.5x")
    return rows


if __name__ == "__main__":
    main(_bench.args(__doc__).quick)
