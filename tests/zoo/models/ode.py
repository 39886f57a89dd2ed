"""Scientific-computing loops: an RK4 integrator written with `lax.scan` (the Lorenz
system, parameters to be fitted) and a Newton solver written with `lax.while_loop`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from . import ZooCase

DT, STEPS = 0.01, 40
TARGET = jnp.array([1.0, -2.0, 20.0])


def lorenz(state: jax.Array, params: dict) -> jax.Array:
    x, y, z = state
    return jnp.stack(
        [params["sigma"] * (y - x), x * (params["rho"] - z) - y, x * y - params["beta"] * z]
    )


def rk4_step(state: jax.Array, params: dict, dt: float = DT) -> jax.Array:
    k1 = lorenz(state, params)
    k2 = lorenz(state + 0.5 * dt * k1, params)
    k3 = lorenz(state + 0.5 * dt * k2, params)
    k4 = lorenz(state + dt * k3, params)
    return state + dt / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


def simulate(params: dict, y0: jax.Array, steps: int = STEPS) -> tuple[jax.Array, jax.Array]:
    """Final state and trajectory (one row per step)."""

    def body(state, _):
        state = rk4_step(state, params)
        return state, state

    return lax.scan(body, y0, None, length=steps)


def final_state(params: dict, y0: jax.Array) -> jax.Array:
    return simulate(params, y0)[0]


def rk4_loss(params: dict, y0: jax.Array) -> jax.Array:
    """A final-state misfit."""
    return jnp.sum((final_state(params, y0) - TARGET) ** 2)


def make_rk4():
    params = {"sigma": jnp.float32(10.0), "rho": jnp.float32(28.0), "beta": jnp.float32(8 / 3)}
    return params, jnp.array([1.0, 1.0, 1.0], jnp.float32)


# -- Newton ------------------------------------------------------------------------


def residual(x: jax.Array, p: jax.Array) -> jax.Array:
    """Solve x^3 + p0 x - p1 = 0, elementwise (one real root for p0 > 0)."""
    return x**3 + p[0] * x - p[1]


def newton(p: jax.Array, x0: jax.Array, tol: float = 1e-6, max_iter: int = 50) -> jax.Array:
    def cond(carry):
        _, i, step = carry
        return (i < max_iter) & (jnp.max(jnp.abs(step)) > tol)

    def body(carry):
        x, i, _ = carry
        step = residual(x, p) / (3 * x**2 + p[0])
        return x - step, i + 1, step

    x, _, _ = lax.while_loop(cond, body, (x0, 0, jnp.full_like(x0, jnp.inf)))
    return x


def make_newton():
    p = jnp.stack([jnp.linspace(0.5, 2.0, 5), jnp.linspace(-3.0, 4.0, 5)]).astype(jnp.float32)
    return p, jnp.ones(5, jnp.float32)


def rk4_case() -> ZooCase:
    return ZooCase("rk4-lax-scan", rk4_loss, make_rk4())


def newton_case() -> ZooCase:
    return ZooCase("newton-while-loop", newton, make_newton(), mode="jvp")
