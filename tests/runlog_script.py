"""A small training script for the run-log tests (run as a subprocess, or imported).

    python tests/runlog_script.py LOG_DIR STEPS [--sleep S] [--tensorboard]

Trains a 4-layer MLP with `sowviz.Monitor` and hands every recorded step to the sinks
of `sowviz.runlog.make_sinks` (as the Monitor's `log_dir=` does), then prints
`STEP <n> <sha256 of the entry>` once the step is handed over, so a test that kills
the process knows what the Monitor held.
"""

from __future__ import annotations

import hashlib
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp

import sowviz
from sowviz.runlog import make_sinks
from sowviz.runlog.format import canonical

WIDTHS = (8, 16, 16, 16, 1)


def init(seed: int = 0) -> list[dict]:
    keys = jax.random.split(jax.random.PRNGKey(seed), len(WIDTHS) - 1)
    return [
        {"w": jax.random.normal(k, (a, b)) / jnp.sqrt(a), "b": jnp.zeros(b)}
        for k, a, b in zip(keys, WIDTHS[:-1], WIDTHS[1:], strict=True)
    ]


def batch(seed: int = 1) -> tuple[jax.Array, jax.Array]:
    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    return jax.random.normal(kx, (32, WIDTHS[0])), jax.random.normal(ky, (32, 1))


def loss(params: list[dict], x: jax.Array, y: jax.Array) -> jax.Array:
    h = x
    for i, p in enumerate(params):
        with jax.named_scope(f"layer_{i}"):
            h = h @ p["w"] + p["b"]
            if i < len(params) - 1:
                h = jnp.tanh(h)
    return jnp.mean((h - y) ** 2)


def digest(entry: dict) -> str:
    return hashlib.sha256(canonical(entry).encode()).hexdigest()


def train(steps: int, sinks: list, *, sleep: float = 0.0, out=sys.stdout):
    """Yields (model, entry) per step after handing the entry to `sinks`."""
    import time

    params = init()
    x, y = batch()
    mon = sowviz.Monitor(loss, history=10_000)
    opened = False
    for _ in range(steps):
        _, grads = mon.step(params, x, y)
        params = jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)
        mon.flush()
        entry = list(mon.history)[-1]
        if not opened:
            model = mon.to_dict(with_history=False)
            for s in sinks:
                s.open(model)
            opened = True
        for s in sinks:
            s.write(entry)
        print(f"STEP {entry['step']} {digest(entry)}", file=out, flush=True)
        if sleep:
            time.sleep(sleep)
    return mon


def main(argv: list[str]) -> int:
    log_dir, steps = argv[0], int(argv[1])
    sleep = float(argv[argv.index("--sleep") + 1]) if "--sleep" in argv else 0.0
    sinks = make_sinks(log_dir, tensorboard="--tensorboard" in argv)
    train(steps, sinks, sleep=sleep)
    for s in sinks:
        s.close()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
