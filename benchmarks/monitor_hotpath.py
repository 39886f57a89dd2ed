"""The Monitor's fixed host cost per step, on a model whose step is microseconds of work.

A 3x16 MLP (batch 4), a 125x4 MLP (250 parameter leaves: host work per leaf
shows there), then a 3x128 MLP (batch 64; 16K-element weights: on a CPU the per-step
finite test's own device work shows there): the plain `jax.jit(jax.value_and_grad(loss))` step against
`Monitor.step` on unrecorded steps (`every` larger than the run) and on recorded
steps (`every=1`): blocks of `BLOCK` steps of one kind, alternating, each ending
with all its work done (`Monitor.flush` reads every pending summary); medians
over the blocks. Each step waits for its gradients (as a loop that applies them
does), so the difference is the host work the Monitor adds (and, recorded, its
summaries' device time). Target (issue 15): ≤ 100 µs per step.

`--profile` prints a cProfile of the unrecorded Monitor step.
Run: `python benchmarks/monitor_hotpath.py [--quick] [--profile]`.
"""

from __future__ import annotations

import cProfile
import functools
import pstats
import time

import _bench
import jax
import jax.numpy as jnp
from _mlp import interleaved_medians

import sowviz


def loss(params, x):
    h = x
    for i, p in enumerate(params):
        with jax.named_scope(f"layer_{i}"):
            h = jnp.tanh(h @ p["w"] + p["b"])
    return jnp.mean(h**2)


def _params(depth: int = 3, width: int = 16):
    keys = jax.random.split(jax.random.PRNGKey(0), depth)
    return [
        {"w": jax.random.normal(k, (width, width)) / width**0.5, "b": jnp.zeros(width)}
        for k in keys
    ]


#: Steps per timed block (see `measure`).
BLOCK = 10


def measure(steps: int, depth: int = 3, width: int = 16, batch: int = 4) -> dict[str, float]:
    params, x = _params(depth, width), jax.random.normal(jax.random.PRNGKey(1), (batch, width))
    plain = jax.jit(jax.value_and_grad(loss))
    unrec = sowviz.Monitor(loss, every=10**9, history=8)
    rec = sowviz.Monitor(loss, every=1, history=8)
    steps_of = {"plain": plain, "unrecorded": unrec.step, "recorded": rec.step}
    # Each step waits for its gradients; a block ends with its summaries read: a
    # recorded step's summaries run on after its gradients are ready, and timed step by
    # step they landed in the next kind's step (the plain step measured 2.4 ms against
    # 0.7 ms alone).
    fns = {k: functools.partial(_waited, step, params, x) for k, step in steps_of.items()}
    med = interleaved_medians(
        fns,
        max(steps // BLOCK, 1),
        BLOCK,
        settle={"unrecorded": unrec.flush, "recorded": rec.flush},
    )
    t0 = time.perf_counter_ns()
    rec.flush()
    flush_ns = time.perf_counter_ns() - t0
    out = {k: v * 1e6 for k, v in med.items()}
    out["flush"] = flush_ns / 1e3
    return out


def _waited(step, params, x):
    """One step, waiting for its gradients (as a loop that applies them does)."""
    _, g = step(params, x)
    return jax.block_until_ready(g)


def profile(steps: int) -> None:
    params, x = _params(), jax.random.normal(jax.random.PRNGKey(1), (4, 16))
    for every in (10**9, 1):
        mon = sowviz.Monitor(loss, every=every, history=8)
        for _ in range(5):
            jax.block_until_ready(mon.step(params, x))
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(steps):
            jax.block_until_ready(mon.step(params, x))
        mon.flush()
        pr.disable()
        print(f"--- every={every}")
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)


def main(quick: bool = False, prof: bool = False) -> list[_bench.Row]:
    print(_bench.platform())
    steps = 50 if quick else 1000
    if prof:
        profile(steps)
    rows: list[_bench.Row] = []
    # the small model, then one with 250 parameter leaves (per-leaf host work shows there)
    models = (
        (3, 16, 4, "3x16 MLP b4"),
        (125, 4, 4, "125x4 MLP b4, 250 leaves"),
        (3, 128, 64, "3x128 MLP b64"),
    )
    for depth, width, batch, label in models:
        med = measure(steps if depth < 10 else steps // 4, depth, width, batch)
        for name in ("unrecorded", "recorded"):
            _bench.emit(
                rows,
                _bench.Row(
                    "monitor_hotpath",
                    f"host cost per {name} step over plain, {label}",
                    med[name] - med["plain"],
                    "µs",
                    target="≤ 100 µs" if name == "unrecorded" else "",
                    detail=f"({med[name]:.0f} µs vs plain {med['plain']:.0f} µs)",
                ),
            )
        print(f"flush after the recorded steps ({label}): {med['flush'] / 1e3:.1f} ms")
    return rows


if __name__ == "__main__":
    ns = _bench.args(
        __doc__, lambda ap: ap.add_argument("--profile", action="store_true", help="cProfile")
    )
    main(ns.quick, ns.profile)
