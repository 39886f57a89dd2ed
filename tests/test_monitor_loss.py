"""Which number a Monitor charts and logs as the loss of a whole train step (mode
"primal"), checked against the loss the same step computes under plain `jax.jit`."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import sowviz

X = jnp.linspace(-1.0, 1.0, 16)
Y = 3.0 * X
TX = optax.sgd(0.1)


def _mse(theta):
    return jnp.mean((theta * X - Y) ** 2)


def _charted(step, theta, n=3) -> tuple[list, list]:
    """(charted losses, plain jit's losses) over `n` steps from `theta`."""
    mon = sowviz.Monitor(step, mode="primal")
    plain = jax.jit(step)
    state, charted = (theta, TX.init(theta)), []
    p_state, truth = (theta, TX.init(theta)), []
    for _ in range(n):
        out = mon.step(*state, X, Y)
        state = out[:2]
        p_out = plain(*p_state, X, Y)
        p_state = p_out[:2]
        truth.append(p_out)
    mon.flush()
    charted = [e["loss"] for e in mon.history]
    mon.close()
    return charted, truth


def _update(theta, opt_state):
    loss, g = jax.value_and_grad(_mse)(theta)
    u, opt_state = TX.update(g, opt_state, theta)
    return loss, optax.apply_updates(theta, u), opt_state


def test_a_one_number_parameter_returned_first_is_not_the_loss() -> None:
    def step(theta, opt_state, x, y):
        loss, theta, opt_state = _update(theta, opt_state)
        return theta, opt_state, loss

    charted, truth = _charted(step, jnp.float32(0.0))
    np.testing.assert_allclose(charted, [float(t[2]) for t in truth], rtol=1e-6)
    # (the parameter's values differ from the losses: the test tells them apart)
    assert not np.allclose(charted, [float(t[0]) for t in truth])


def test_a_metrics_dict_names_the_loss() -> None:
    def step(theta, opt_state, x, y):
        loss, theta, opt_state = _update(theta, opt_state)
        return theta, opt_state, {"accuracy": jnp.float32(0.5) + 0 * loss, "loss": loss}

    charted, truth = _charted(step, jnp.ones(1, jnp.float32))
    np.testing.assert_allclose(charted, [float(t[2]["loss"]) for t in truth], rtol=1e-6)


class Metrics(NamedTuple):
    grad_norm: jax.Array
    loss: jax.Array


def test_a_named_tuple_field_names_the_loss() -> None:
    def step(theta, opt_state, x, y):
        loss, theta, opt_state = _update(theta, opt_state)
        return theta, opt_state, Metrics(jnp.linalg.norm(theta), loss)

    charted, truth = _charted(step, jnp.float32(0.0))
    np.testing.assert_allclose(charted, [float(t[2].loss) for t in truth], rtol=1e-6)


def test_loss_then_other_numbers_charts_the_first() -> None:
    def step(theta, opt_state, x, y):
        loss, theta, opt_state = _update(theta, opt_state)
        return theta, opt_state, loss, 2.0 * loss

    charted, truth = _charted(step, jnp.ones(1, jnp.float32))
    np.testing.assert_allclose(charted, [float(t[2]) for t in truth], rtol=1e-6)


@pytest.mark.parametrize("twice", [True, False])
def test_no_guess(twice: bool) -> None:
    """Two numbers named `loss`, or only arguments returned updated: nothing charted."""

    def step(theta, opt_state, x, y):
        loss, theta, opt_state = _update(theta, opt_state)
        if twice:
            return theta, opt_state, {"a": {"loss": loss}, "b": {"loss": 2 * loss}}
        return theta, opt_state

    charted, _ = _charted(step, jnp.float32(0.0))
    assert charted == [None, None, None]
