"""Capture overhead: `save_intermediates(jax.grad(f))` vs `jax.jit(jax.grad(f))`.

Target (DESIGN.md): ≤ 1.05× on both MLPs. For reference, tesseract-jax 0.4.0's
`save_intermediates` measures 5.3× and 31× on the same two cases.
Run: `python benchmarks/capture_overhead.py [--quick]`.
"""

from __future__ import annotations

from functools import partial

import _bench
import jax
from _mlp import MLP_CASES, interleaved_medians, mlp_loss, mlp_params

import sowviz

REPEATS = {"8x512": (30, 5), "64x64": (30, 50)}  # (repeats, calls per repeat)


def main(quick: bool = False) -> list[_bench.Row]:
    rows: list[_bench.Row] = []
    print(_bench.platform())
    for label, depth, width, batch in MLP_CASES:
        repeats, inner = (3, 1) if quick else REPEATS[label.split()[0]]
        params = mlp_params(depth, width)
        x = jax.random.normal(jax.random.PRNGKey(1), (batch, width))
        baseline = jax.jit(jax.grad(mlp_loss))
        captured = sowviz.save_intermediates(jax.grad(mlp_loss))
        t = interleaved_medians(
            {"baseline": partial(baseline, params, x), "captured": partial(captured, params, x)},
            repeats,
            inner,
        )
        _bench.emit(
            rows,
            _bench.Row(
                "capture_overhead",
                f"save_intermediates(grad) / jit(grad), {label}",
                t["captured"] / t["baseline"],
                target="≤ 1.05x",
                detail=f"({t['captured'] * 1e6:.0f} µs vs {t['baseline'] * 1e6:.0f} µs)",
            ),
        )
    return rows


if __name__ == "__main__":
    main(_bench.args(__doc__).quick)
