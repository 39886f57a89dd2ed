"""Monitored training step vs the same unmonitored `jax.jit(jax.value_and_grad(loss))` step.

Median step time, the two interleaved in one run, on an MLP (named-scope layers,
so every layer is a probed stage), with `every=1` and with `every=10`.
Target (DESIGN.md): ≤ 1.05× with every=1.
Run: `.venv/bin/python benchmarks/monitor_overhead.py`.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

import sowviz

DEPTH, WIDTH, BATCH, STEPS = 8, 256, 128, 60


def loss(params, x):
    h = x
    for i, p in enumerate(params):
        with jax.named_scope(f"layer_{i}"):
            h = jnp.tanh(h @ p["w"] + p["b"])
    return jnp.mean(h**2)


def sgd(params, grads):
    return jax.tree_util.tree_map(lambda p, g: p - 1e-3 * g, params, grads)


def main() -> None:
    keys = jax.random.split(jax.random.PRNGKey(0), DEPTH)
    params = [{"w": jax.random.normal(k, (WIDTH, WIDTH)) / 16, "b": jnp.zeros(WIDTH)} for k in keys]
    x = jax.random.normal(jax.random.PRNGKey(1), (BATCH, WIDTH))
    plain = jax.jit(jax.value_and_grad(loss))
    for every in (1, 10):
        mon = sowviz.Monitor(loss, every=every, history=STEPS)
        mon.send = lambda *a, **k: None  # no front end attached: measure the loop itself
        steps = {"plain": plain, "monitored": mon.step}
        p = {k: params for k in steps}
        for name, step in steps.items():  # compile, warm up
            for _ in range(3):
                _, g = step(p[name], x)
                jax.block_until_ready(g)
        times: dict[str, list[float]] = {k: [] for k in steps}
        for _ in range(STEPS):
            for name, step in steps.items():
                t0 = time.perf_counter()
                _, g = step(p[name], x)
                p[name] = sgd(p[name], g)
                jax.block_until_ready(p[name])
                times[name].append(time.perf_counter() - t0)
        mon.flush()
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"{DEPTH}x{WIDTH} MLP, batch {BATCH}, every={every}: plain {med['plain'] * 1e3:.2f} ms | "
            f"monitored {med['monitored'] * 1e3:.2f} ms | ratio {med['monitored'] / med['plain']:.3f}x "
            f"(target ≤ 1.05x with every=1) | history {len(mon.history)} steps"
        )


if __name__ == "__main__":
    main()
