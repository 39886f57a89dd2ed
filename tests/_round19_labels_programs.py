"""A stand-in for BlackJAX's HMC and NUTS kernels, written as BlackJAX writes them
(`blackjax/mcmc/integrators.py`, `trajectory.py`, `hmc.py`): closures made by
`build_kernel`, a velocity Verlet `one_step` updating momentum and position around the
user's `logdensity_fn`, a `fori_loop` of it for HMC, a `while_loop` adding one state at
a time for NUTS, and a `lax.cond` that is all of a closure's work. The tests install it
as a package file (under a `site-packages` folder), so sowviz reads it as a library."""

FAKE_MCMC = """
from typing import NamedTuple

import jax
import jax.numpy as jnp


class IntegratorState(NamedTuple):
    position: jax.Array
    momentum: jax.Array
    logdensity: jax.Array
    logdensity_grad: jax.Array


def velocity_verlet(logdensity_fn):
    logdensity_and_grad_fn = jax.value_and_grad(logdensity_fn)

    def one_step(state, step_size):
        position, momentum, _, logdensity_grad = state
        momentum = jax.tree.map(lambda m, g: m + 0.5 * step_size * g, momentum, logdensity_grad)
        position = jax.tree.map(lambda x, m: x + step_size * m, position, momentum)
        logdensity, logdensity_grad = logdensity_and_grad_fn(position)
        momentum = jax.tree.map(lambda m, g: m + 0.5 * step_size * g, momentum, logdensity_grad)
        return IntegratorState(position, momentum, logdensity, logdensity_grad)

    return one_step


def static_integration(integrator):
    def integrate(initial_state, step_size, num_integration_steps):
        def one_step(_, state):
            return integrator(state, step_size)

        return jax.lax.fori_loop(0, num_integration_steps, one_step, initial_state)

    return integrate


def hmc_build_kernel(num_integration_steps):
    def kernel(rng_key, state, logdensity_fn, step_size):
        integrate = static_integration(velocity_verlet(logdensity_fn))
        key_momentum, key_accept = jax.random.split(rng_key)
        momentum = jax.random.normal(key_momentum, state.position.shape)
        start = state._replace(momentum=momentum)
        end = integrate(start, step_size, num_integration_steps)
        energy0 = -start.logdensity + 0.5 * jnp.sum(start.momentum**2)
        energy1 = -end.logdensity + 0.5 * jnp.sum(end.momentum**2)
        p_accept = jnp.clip(jnp.exp(energy0 - energy1), max=1.0)
        do_accept = jax.random.bernoulli(key_accept, p_accept)
        return jax.lax.cond(do_accept, lambda _: end, lambda _: start, operand=None)

    return kernel


def nuts_build_kernel(max_steps, max_expansions):
    def kernel(rng_key, state, logdensity_fn, step_size):
        integrator = velocity_verlet(logdensity_fn)

        def add_one_state(loop_state):
            step, key, proposal = loop_state
            key, key_accept = jax.random.split(key)
            new = integrator(proposal, step_size)
            do_accept = jax.random.bernoulli(key_accept, 0.5)
            proposal = jax.lax.cond(do_accept, lambda _: new, lambda _: proposal, None)
            return step + 1, key, proposal

        def expand_once(loop_state):
            n, key, state = loop_state
            key, key_integrate = jax.random.split(key)
            _, _, proposal = jax.lax.while_loop(
                lambda s: s[0] < max_steps, add_one_state, (0, key_integrate, state)
            )
            better = proposal.logdensity > state.logdensity - 10.0
            state = jax.lax.cond(better, lambda _: proposal, lambda _: state, None)
            return n + 1, key, state

        momentum = jax.random.normal(rng_key, state.position.shape)
        start = (0, rng_key, state._replace(momentum=momentum))
        _, _, state = jax.lax.while_loop(lambda s: s[0] < max_expansions, expand_once, start)
        return state

    return kernel


def init(position, logdensity_fn):
    logdensity, logdensity_grad = jax.value_and_grad(logdensity_fn)(position)
    return IntegratorState(position, jnp.zeros_like(position), logdensity, logdensity_grad)
"""
