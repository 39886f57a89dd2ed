"""Capture overhead: `save_intermediates(jax.grad(f))` vs `jax.jit(jax.grad(f))`.

Target (DESIGN.md): ≤ 1.05× on both MLPs. For reference, tesseract-jax 0.4.0's
`save_intermediates` measures 5.3× and 31× on the same two cases.
Run: `.venv/bin/python benchmarks/capture_overhead.py`.
"""

from __future__ import annotations

from functools import partial

import jax
from _mlp import MLP_CASES, interleaved_medians, mlp_loss, mlp_params

import sowviz

REPEATS = {"8x512": (30, 5), "64x64": (30, 50)}  # (repeats, calls per repeat)


def main() -> None:
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}")
    for label, depth, width, batch in MLP_CASES:
        repeats, inner = REPEATS[label.split()[0]]
        params = mlp_params(depth, width)
        x = jax.random.normal(jax.random.PRNGKey(1), (batch, width))
        baseline = jax.jit(jax.grad(mlp_loss))
        captured = sowviz.save_intermediates(jax.grad(mlp_loss))
        t = interleaved_medians(
            {"baseline": partial(baseline, params, x), "captured": partial(captured, params, x)},
            repeats,
            inner,
        )
        ratio = t["captured"] / t["baseline"]
        print(
            f"{label}: jit(grad) {t['baseline'] * 1e6:8.1f} µs | save_intermediates(grad) "
            f"{t['captured'] * 1e6:8.1f} µs | ratio {ratio:.3f}x (target ≤ 1.05x)"
        )


if __name__ == "__main__":
    main()
