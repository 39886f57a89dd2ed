"""Monitored training step vs the same unmonitored `jax.jit(jax.value_and_grad(loss))` step.

Median step time over blocks of `BLOCK` steps, the two alternating block by block in
one run, each block ending with all its work done (`Monitor.flush`), on an MLP
(named-scope layers, so every layer is a probed stage), with `every=1` and with
`every=10`; the fixed host cost per step on a tiny model whose step is
microseconds of work; and the host memory a Monitor's history holds (`tracemalloc`:
Python objects and NumPy arrays).
Targets (issue 15): ≤ 1.2× with every=1 on CPU (≤ 1.05× on a GPU); fixed host
cost ≤ 100 µs per step.
Run: `python benchmarks/monitor_overhead.py [--quick]`.
"""

from __future__ import annotations

import gc
import tracemalloc

import _bench
import jax
import jax.numpy as jnp
from _mlp import interleaved_medians, summary_floor

import sowviz


def loss(params, x):
    h = x
    for i, p in enumerate(params):
        with jax.named_scope(f"layer_{i}"):
            h = jnp.tanh(h @ p["w"] + p["b"])
    return jnp.mean(h**2)


def sgd(params, grads):
    return jax.tree_util.tree_map(lambda p, g: p - 1e-3 * g, params, grads)


#: Steps per timed block: with every=10, each block records one step.
BLOCK = 10


def mlp(depth: int, width: int, batch: int) -> tuple[list, jax.Array]:
    keys = jax.random.split(jax.random.PRNGKey(0), depth)
    params = [
        {"w": jax.random.normal(k, (width, width)) / width**0.5, "b": jnp.zeros(width)}
        for k in keys
    ]
    return params, jax.random.normal(jax.random.PRNGKey(1), (batch, width))


def run(
    depth: int, width: int, batch: int, steps: int, every: int, exact: bool | None = None
) -> dict[str, float]:
    params, x = mlp(depth, width, batch)
    plain = jax.jit(jax.value_and_grad(loss))
    mon = sowviz.Monitor(loss, every=every, history=steps, exact=exact)
    fns = {"plain": plain, "monitored": mon.step}
    p = {k: params for k in fns}

    def train(name, step):
        def one():
            _, g = step(p[name], x)
            p[name] = sgd(p[name], g)
            return jax.block_until_ready(p[name])  # each step waits, as a loop applying it

        return one

    # Blocks of BLOCK steps of one kind, alternating, each ending with all its work
    # done: a recorded step's summaries run on after its gradients are ready, and timed
    # step by step they landed in the plain step that came next.
    thunks = {name: train(name, step) for name, step in fns.items()}
    if every == 1:  # the least work any summary of a step's recorded values does
        recorded = 2 * depth * batch * width + 2 * depth * (width * width + width)
        thunks["floor"] = summary_floor(recorded)
    return interleaved_medians(
        thunks, max(steps // BLOCK, 1), BLOCK, settle={"monitored": mon.flush}
    )


def history_bytes(depth: int, width: int, batch: int, steps: int) -> int:
    """Host bytes held after `steps` recorded steps, every entry read (as a view reads
    them) and the model drawn now and then."""
    params, x = mlp(depth, width, batch)
    mon = sowviz.Monitor(loss, history=steps)
    mon.step(params, x)
    mon.flush()
    gc.collect()
    tracemalloc.start()
    try:
        for i in range(steps):
            mon.step(params, x)
            if i % 10 == 0:
                mon.to_dict(with_history=False)
        mon.flush()
        for entry in mon.history:
            entry["probes"]
        gc.collect()
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def main(quick: bool = False) -> list[_bench.Row]:
    print(_bench.platform())
    gpu = jax.devices()[0].platform != "cpu"
    rows: list[_bench.Row] = []
    steps = 20 if quick else 200
    for every in (1, 10):
        med = run(8, 256, 128, steps, every)
        _bench.emit(
            rows,
            _bench.Row(
                "monitor_overhead",
                f"monitored / plain step, 8x256 MLP b128, every={every}",
                med["monitored"] / med["plain"],
                target=("≤ 1.05x" if gpu else "≤ 1.2x") if every == 1 else "",
                detail=f"({med['monitored'] * 1e3:.2f} ms vs {med['plain'] * 1e3:.2f} ms)",
            ),
        )
        if every == 1:
            _bench.emit(
                rows,
                _bench.Row(
                    "monitor_overhead",
                    "floor: any summary's least work on a step's recorded values "
                    "(min/max/sum, one tally scatter) / plain step, 8x256 MLP b128",
                    1 + med["floor"] / med["plain"],
                    detail=f"({med['floor'] * 1e3:.2f} ms per step)",
                ),
            )
        # `exact=True`: a recorded step also runs the plain program, for its results
        med = run(8, 256, 128, steps, every, exact=True)
        _bench.emit(
            rows,
            _bench.Row(
                "monitor_overhead",
                f"monitored with exact=True / plain step, 8x256 MLP b128, every={every}",
                med["monitored"] / med["plain"],
                detail=f"({med['monitored'] * 1e3:.2f} ms vs {med['plain'] * 1e3:.2f} ms)",
            ),
        )
    med = run(3, 16, 4, 20 if quick else 500, 1)
    _bench.emit(
        rows,
        _bench.Row(
            "monitor_overhead",
            "fixed host cost per recorded step, 3x16 MLP b4",
            (med["monitored"] - med["plain"]) * 1e6,
            "µs",
            target="≤ 100 µs",
            detail=f"(plain step {med['plain'] * 1e6:.0f} µs)",
        ),
    )
    steps = 20 if quick else 200
    held = history_bytes(8, 256, 128, steps)
    _bench.emit(
        rows,
        _bench.Row(
            "monitor_overhead",
            f"host memory of the history, {steps} recorded steps, 8x256 MLP b128",
            held / 1e6,
            "MB",
            detail=f"({held / steps / 1e3:.0f} KB per recorded step)",
        ),
    )
    return rows


if __name__ == "__main__":
    main(_bench.args(__doc__).quick)
