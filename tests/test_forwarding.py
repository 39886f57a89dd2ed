"""`_forwarding.forwarded_inputs`: which outputs of a program are an input returned
unchanged, through calls, conds and loops; checked against the program's own values."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sowviz._forwarding import forwarded_inputs


def _swap_carry(a, b):
    (a, b), _ = jax.lax.scan(lambda c, _: ((c[1], c[0]), None), (a, b), None, length=3)
    return a, b


@jax.custom_vjp
def _identity(x):
    return x


_identity.defvjp(lambda x: (x, None), lambda _, g: (g,))

CASES = {
    # fn(a, b) -> outputs; the expected input position of each output, None: computed
    "jit": (jax.jit(lambda a, b: (b, a + 1, a)), [1, None, 0]),
    "cond, same operand in both branches": (
        lambda a, b: jax.lax.cond(a[0] > 0, lambda a, b: (a, b * 2), lambda a, b: (a, b + 1), a, b),
        [0, None],
    ),
    "cond, branches returning different operands": (
        lambda a, b: jax.lax.cond(a[0] > 0, lambda a, b: a, lambda a, b: b, a, b),
        [None],
    ),
    "fori_loop leaving one carry alone": (
        lambda a, b: jax.lax.fori_loop(0, 3, lambda i, c: (c[0] * 2, c[1]), (a, b)),
        [None, 1],
    ),
    "while_loop leaving one carry alone": (
        lambda a, b: jax.lax.while_loop(
            lambda c: c[2] < 3, lambda c: (c[0], jnp.sin(c[1]), c[2] + 1), (a, b, 0)
        )[:2],
        [0, None],
    ),
    "scan swapping its carries": (_swap_carry, [None, None]),
    "scan returning its slices as they came": (
        lambda a, b: jax.lax.scan(lambda c, v: (c + v[0], (v[1], v[0] * 2)), 0.0, (a, b))[1],
        [1, None],
    ),
    "reversed scan returning its slices": (
        lambda a, b: jax.lax.scan(lambda c, v: (c, v), a, b, reverse=True),
        [0, 1],
    ),
    "checkpoint": (jax.checkpoint(lambda a, b: (a, jnp.sin(b))), [0, None]),
    "custom_vjp returning its input": (lambda a, b: (_identity(b), jax.nn.relu(a)), [1, None]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_forwarded_outputs_are_the_inputs_and_only_they(name):
    fn, expected = CASES[name]
    a = jnp.asarray([0.5, -1.0, 2.0], jnp.float32)
    b = jnp.asarray([3.0, 0.25, -0.75], jnp.float32)
    closed = jax.make_jaxpr(fn)(a, b)
    found = forwarded_inputs(closed)
    assert found == expected
    # What it says is what the program computes: a forwarded output is its input.
    outs = jax.tree_util.tree_leaves(fn(a, b))
    for out, k in zip(outs, found, strict=True):
        if k is not None:
            np.testing.assert_array_equal(out, (a, b)[k])
