"""Capture overhead: `save_intermediates(jax.grad(f))` vs `jax.jit(jax.grad(f))`.

Target (DESIGN.md): ≤ 1.05× on both MLPs. For reference, tesseract-jax 0.4.0's
`save_intermediates` measures 5.3× and 31× on the same two cases.

A second row compares with the same values written out by hand: a `jax.jit` of
`jax.grad` that also returns every layer's activation and its cotangent (taken
as the gradient of a zero added to it). That program returns as many arrays as
the capture, and every output array has a cost of its own (a buffer, an Array
object), which `jit(grad)` alone does not pay: the capture's own cost is its
distance from this floor.
Run: `python benchmarks/capture_overhead.py [--quick]`.
"""

from __future__ import annotations

from functools import partial

import _bench
import jax
import jax.numpy as jnp
from _mlp import MLP_CASES, interleaved_medians, mlp_loss, mlp_params

import sowviz

REPEATS = {"8x512": (30, 5), "64x64": (30, 50)}  # (repeats, calls per repeat)


def by_hand(params, x):
    """`jax.grad(mlp_loss)` plus each layer's activation and its cotangent, written out:
    the cotangents are gradients of zeros added to the activations."""

    def loss(params, zeros):
        h, hs = x, []
        for layer, z in zip(params, zeros, strict=True):
            h = jnp.tanh(h @ layer["w"] + layer["b"]) + z
            hs.append(h)
        return jnp.mean(h**2), hs

    zeros = [jnp.zeros((x.shape[0], layer["b"].shape[0]), x.dtype) for layer in params]
    (grads, cotangents), hs = jax.grad(loss, argnums=(0, 1), has_aux=True)(params, zeros)
    return grads, hs, cotangents


def main(quick: bool = False) -> list[_bench.Row]:
    rows: list[_bench.Row] = []
    print(_bench.platform())
    for label, depth, width, batch in MLP_CASES:
        repeats, inner = (3, 1) if quick else REPEATS[label.split()[0]]
        params = mlp_params(depth, width)
        x = jax.random.normal(jax.random.PRNGKey(1), (batch, width))
        baseline = jax.jit(jax.grad(mlp_loss))
        captured = sowviz.save_intermediates(jax.grad(mlp_loss))
        written = jax.jit(by_hand)
        got, inter = captured(params, x)
        want, hs, cts = written(params, x)
        # the floor computes the same values (so it is one)
        assert len(jax.tree.leaves((got, inter))) == len(jax.tree.leaves((want, hs, cts)))
        for i, (h, ct) in enumerate(zip(hs, cts, strict=True)):
            assert jnp.allclose(inter[f"layer_{i}"]["primal"], h, atol=1e-6)
            assert jnp.allclose(inter[f"layer_{i}"]["cotangent"], ct, atol=1e-6)
        t = interleaved_medians(
            {
                "baseline": partial(baseline, params, x),
                "captured": partial(captured, params, x),
                "by_hand": partial(written, params, x),
            },
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
        _bench.emit(
            rows,
            _bench.Row(
                "capture_overhead",
                f"save_intermediates(grad) / the same outputs by hand, {label}",
                t["captured"] / t["by_hand"],
                detail=f"({t['captured'] * 1e6:.0f} µs vs {t['by_hand'] * 1e6:.0f} µs;"
                f" jit(grad) alone {t['baseline'] * 1e6:.0f} µs)",
            ),
        )
    return rows


if __name__ == "__main__":
    main(_bench.args(__doc__).quick)
