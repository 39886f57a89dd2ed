"""The built-in example: a small MLP with two classic training pathologies.

* `block_3` has a large bias: its tanh saturates, so the gradients reaching
  `block_0` … `block_2` are orders of magnitude smaller (look at the cotangent
  colour scale, and at the log|x| histograms);
* one input row is all zeros, and the `distance` stage takes the Euclidean norm
  of each embedded row: the forward pass is finite (the norm of zeros is 0),
  but the derivative of √u is infinite at 0, so tangents turn NaN at
  `distance` and cotangents turn NaN on their way back into `embed` — the
  report marks both origins.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

DEPTH, WIDTH, BATCH = 6, 32, 16


def init(seed: int = 0) -> dict:
    keys = jax.random.split(jax.random.PRNGKey(seed), DEPTH + 2)
    bias = [0.0] * DEPTH
    bias[3] = 6.0  # saturates block_3: tanh'(6) ≈ 2e-5
    return {
        "embed": jax.random.normal(keys[0], (8, WIDTH)) / jnp.sqrt(8.0),
        "blocks": [
            {
                "w": jax.random.normal(keys[i + 1], (WIDTH, WIDTH)) / jnp.sqrt(WIDTH),
                "b": jnp.full(WIDTH, bias[i]),
            }
            for i in range(DEPTH)
        ],
        "head": jax.random.normal(keys[-1], (WIDTH,)) / jnp.sqrt(WIDTH),
    }


def batch(seed: int = 1) -> jax.Array:
    x = jax.random.normal(jax.random.PRNGKey(seed), (BATCH, 8))
    return x.at[3].set(0.0)  # one all-zero example


def loss(params: dict, x: jax.Array) -> jax.Array:
    with jax.named_scope("embed"):
        e = x @ params["embed"]
    h = e
    for i, p in enumerate(params["blocks"]):
        with jax.named_scope(f"block_{i}"):
            h = jnp.tanh(h @ p["w"] + p["b"])
    with jax.named_scope("distance"):
        d = jnp.sqrt(jnp.sum(e**2, axis=-1))
    with jax.named_scope("head"):
        y = d * jnp.sum(h * params["head"], axis=-1)
    return jnp.mean((y - 1.0) ** 2)
