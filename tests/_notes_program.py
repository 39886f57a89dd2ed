"""A program whose one note is said alike of two stages (`energy`, differentiated
inside the program in two scopes), shared by the model and the browser tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def energy(w):
    return jnp.sum(jnp.tanh(w) ** 2)


def energy_twice(w):
    with jax.named_scope("first"):
        v1, g1 = jax.value_and_grad(energy)(w)
    with jax.named_scope("second"):
        v2, g2 = jax.value_and_grad(energy)(w * 2)
    return v1 + v2 + jnp.sum(g1 * g2)
