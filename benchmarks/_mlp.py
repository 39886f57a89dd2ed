"""Shared benchmark fixtures: an MLP with a sow per layer, and an interleaved timer."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

import sowviz

# The two MLPs of DESIGN.md's capture targets: (label, depth, width, batch).
MLP_CASES = [("8x512 MLP, batch 256", 8, 512, 256), ("64x64 MLP, batch 32", 64, 64, 32)]


def mlp_params(depth: int, width: int, seed: int = 0) -> list[dict[str, jax.Array]]:
    keys = jax.random.split(jax.random.PRNGKey(seed), depth)
    return [
        {"w": jax.random.normal(k, (width, width)) / jnp.sqrt(width), "b": jnp.zeros(width)}
        for k in keys
    ]


def mlp_loss(params, x):
    h = x
    for i, layer in enumerate(params):
        h = jnp.tanh(h @ layer["w"] + layer["b"])
        h = sowviz.sow(h, f"layer_{i}")
    return jnp.mean(h**2)


def bare_summary(arrays: list) -> tuple:
    """The least work any summary of `arrays` does: the min, max and sum of each (no
    masks) and one tally scatter per value into a small table (no binning arithmetic).
    sowviz's summaries do more (finite masks, centred sums, a linear and a log bin per
    value, counted in one scatter for large arrays), so ``1 + t(bare) / t(step)`` bounds
    from below what any summary can reach."""
    dims = jax.lax.ScatterDimensionNumbers(
        update_window_dims=(), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,)
    )
    table = jnp.zeros(256, jnp.int32)
    stats = []
    for a in arrays:
        k = jax.lax.bitcast_convert_type(a, jnp.int32).reshape(-1)
        slot = (k & 0x7F) * 2 + 1  # an odd slot, counted as `summary_ops.tally_slots` does
        table = jax.lax.scatter_add(
            table, slot[:, None], slot, dims, mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS
        )
        stats.append((jnp.min(a), jnp.max(a), jnp.sum(a)))
    return stats, table


def summary_floor(n_values: int) -> Callable[[], object]:
    """A run of `bare_summary` on `n_values` random float32 values (arrays of 512K)."""
    parts = [
        jax.random.normal(jax.random.PRNGKey(i), (min(n_values - s, 1 << 19),))
        for i, s in enumerate(range(0, n_values, 1 << 19))
    ]
    bare = jax.jit(bare_summary)
    return lambda: bare(parts)


def block(tree) -> None:
    jax.tree_util.tree_map(
        lambda x: x.block_until_ready() if hasattr(x, "block_until_ready") else x, tree
    )


def interleaved_medians(
    fns: dict[str, Callable[[], object]],
    repeats: int,
    inner: int,
    settle: dict[str, Callable[[], object]] | None = None,
) -> dict[str, float]:
    """Median seconds per call of each thunk, measured in alternation so drift hits all
    alike: `repeats` blocks of `inner` calls each, a block ending when its last output
    is ready and, for a name in `settle`, once that call returns too (a Monitor's
    `flush`: work a call leaves running would otherwise land in the next block)."""
    settle = settle or {}
    for fn in fns.values():  # compile and warm up
        for _ in range(3):
            block(fn())
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                out = fn()
            block(out)
            if name in settle:
                settle[name]()
            samples[name].append((time.perf_counter() - t0) / inner)
    return {k: statistics.median(v) for k, v in samples.items()}
