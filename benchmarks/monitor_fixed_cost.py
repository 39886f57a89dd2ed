"""The Monitor's fixed host cost per step, `every=1`, on tiny models (issue 15).

One process with 8 host CPU devices (``--xla_force_host_platform_device_count=8``,
set before JAX starts), two models whose step is well under a millisecond of device
work, so that what the Monitor adds is host work:

* a 3x16 MLP, batch 4, its arguments on one device;
* a 2-D tensor-parallel `shard_map` MLP on a 4x2 mesh (``data``, ``model``): the
  first layer's weight split over ``model`` by columns, the second's by rows (a
  `psum` over ``model``), the batch split over ``data`` (a `psum` of the loss).

Per model, blocks of `BLOCK` steps of the plain `jax.jit(jax.value_and_grad(loss))`
step and of `Monitor.step` (recorded, `every=1`; and unrecorded, `every` larger than
the run) alternate, each step waiting for its gradients (as a loop applying them
does), a Monitor block ending with `flush` (its summaries read); medians over the
blocks. Printed: the ratio to the plain step and the host cost per step over it in
µs. Targets: ≤ 1.2x and ≤ 100 µs per step.

Run it in a process of its own: `python benchmarks/monitor_fixed_cost.py [--quick]`
(`--profile` prints a cProfile of the recorded steps of each model).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import cProfile
import functools
import pstats
from functools import partial

import _bench
import jax
import jax.numpy as jnp
import numpy as np
from _mlp import interleaved_medians
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import sowviz

#: Steps per timed block.
BLOCK = 10


def mlp_loss(params, x):
    h = x
    for i, p in enumerate(params):
        with jax.named_scope(f"layer_{i}"):
            h = jnp.tanh(h @ p["w"] + p["b"])
    return jnp.mean(h**2)


def mlp_case():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = [{"w": jax.random.normal(k, (16, 16)) / 4, "b": jnp.zeros(16)} for k in keys]
    return mlp_loss, (params, jax.random.normal(jax.random.PRNGKey(1), (4, 16)))


def tp_case():
    """The 2-D tensor-parallel `shard_map` MLP, its arguments placed on the mesh."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))

    @partial(
        jax.shard_map,
        mesh=mesh,
        in_specs=(P(None, "model"), P("model", None), P("data")),
        out_specs=P(),
    )
    def tp_loss(w1, w2, x):
        with jax.named_scope("up"):
            h = jnp.tanh(x @ w1)
        with jax.named_scope("down"):
            y = jax.lax.psum(h @ w2, "model")
        return jax.lax.psum(jnp.sum(y**2), "data") / (16 * 8)

    def loss(params, x):
        return tp_loss(params["w1"], params["w2"], x)

    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {
        "w1": jax.device_put(
            jax.random.normal(k1, (8, 16)) / 3, NamedSharding(mesh, P(None, "model"))
        ),
        "w2": jax.device_put(
            jax.random.normal(k2, (16, 8)) / 4, NamedSharding(mesh, P("model", None))
        ),
    }
    x = jax.device_put(jax.random.normal(k3, (16, 8)), NamedSharding(mesh, P("data", None)))
    return loss, (params, x)


CASES = {"3x16 MLP b4, one device": mlp_case, "2-D TP shard_map MLP, 4x2 mesh": tp_case}


def _waited(step, args):
    """One step, waiting for its gradients (as a loop that applies them does)."""
    _, g = step(*args)
    return jax.block_until_ready(g)


def measure(make, steps: int) -> dict[str, float]:
    loss, args = make()
    plain = jax.jit(jax.value_and_grad(loss))
    rec = sowviz.Monitor(loss, every=1, history=8)
    unrec = sowviz.Monitor(loss, every=10**9, history=8)
    fns = {
        name: functools.partial(_waited, step, args)
        for name, step in (("plain", plain), ("recorded", rec.step), ("unrecorded", unrec.step))
    }
    med = interleaved_medians(
        fns,
        max(steps // BLOCK, 1),
        BLOCK,
        settle={"recorded": rec.flush, "unrecorded": unrec.flush},
    )
    rec.close()
    unrec.close()
    return med


def profile(make, steps: int) -> None:
    loss, args = make()
    mon = sowviz.Monitor(loss, every=1, history=8)
    for _ in range(5):
        _waited(mon.step, args)
    mon.flush()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(steps):
        _waited(mon.step, args)
    mon.flush()
    pr.disable()
    pstats.Stats(pr).sort_stats("cumtime").print_stats(30)


def main(quick: bool = False, prof: bool = False) -> list[_bench.Row]:
    print(_bench.platform())
    if jax.device_count() < 8:
        raise RuntimeError(
            "monitor_fixed_cost needs 8 devices: run it in a process of its own (it sets "
            "XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts)."
        )
    rows = _bench.Rows("monitor_fixed_cost")
    steps = 50 if quick else 500
    for label, make in CASES.items():
        if prof:
            print(f"--- cProfile, {label}, every=1")
            profile(make, steps)
        med = measure(make, steps)
        plain = med["plain"]
        for name in ("recorded", "unrecorded"):
            what = "every=1" if name == "recorded" else "unrecorded steps"
            rows.add(
                f"Monitor / plain step, {label}, {what}",
                med[name] / plain,
                target="≤ 1.2x" if name == "recorded" else "",
                detail=f"({med[name] * 1e6:.0f} µs vs plain {plain * 1e6:.0f} µs)",
            )
            rows.add(
                f"host cost per step over plain, {label}, {what}",
                (med[name] - plain) * 1e6,
                "µs",
                target="≤ 100 µs",
            )
    return rows


if __name__ == "__main__":
    ns = _bench.args(
        __doc__, lambda ap: ap.add_argument("--profile", action="store_true", help="cProfile")
    )
    main(ns.quick, ns.profile)
