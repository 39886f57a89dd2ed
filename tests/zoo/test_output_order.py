"""A module stage's outputs as its call returns them: in that order, in that shape.

An Equinox `LSTMCell` returns `(h, c)` but computes `c` first (`h = o * tanh(c)`);
the program's order alone numbered `c` as `[0]`. `frameworks.named` records where
each traced leaf sits in a module call's result, and the stage takes that order.
Under `jax.vmap` a bias-free `eqx.nn.Linear` makes its output with the batch axis
last, which `vmap` moves to the front after the call: the stage shows it moved.
Each probe's values are computed here by calling the module itself."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import sowviz

from .checks import STAT_RTOL, assert_value_and_grad


class Recurrent(eqx.Module):
    cell: eqx.nn.LSTMCell
    head: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.cell = eqx.nn.LSTMCell(3, 8, key=k1)
        self.head = eqx.nn.Linear(8, 1, key=k2)

    def __call__(self, xs):
        def step(carry, x):
            h, c = self.cell(x, carry)
            return (h, c), h

        (h, _), _ = jax.lax.scan(step, (jnp.zeros(8), jnp.zeros(8)), xs)
        return self.head(h)[0]


def _recurrent_loss(model, xs):
    return model(xs) ** 2


def _leaf_stats(ins, label: str) -> dict[str, dict]:
    """`{leaf: primal summary}` of the stage labelled `label`."""
    return {p.leaf: p.summaries["primal"] for p in ins.probes if p.name == label}


def _assert_carries(summary: dict, values: np.ndarray) -> None:
    values = np.asarray(values, np.float64)
    assert list(summary["shape"]) == list(values.shape)
    for key, want in (("min", values.min()), ("max", values.max()), ("mean", values.mean())):
        np.testing.assert_allclose(summary[key], want, rtol=STAT_RTOL, atol=1e-7, err_msg=key)


def test_equinox_lstm_cell_outputs_in_return_order():
    model = Recurrent(jax.random.PRNGKey(0))
    xs = jax.random.normal(jax.random.PRNGKey(1), (5, 3))
    ins = sowviz.inspect(_recurrent_loss, model, xs, mode="grad")
    assert_value_and_grad(ins.result, *eqx.filter_value_and_grad(_recurrent_loss)(model, xs))
    hs, cs, carry = [], [], (jnp.zeros(8), jnp.zeros(8))
    for x in xs:
        carry = model.cell(x, carry)
        hs.append(carry[0])
        cs.append(carry[1])
    stats = _leaf_stats(ins, "cell: LSTMCell")
    assert set(stats) == {"[0]", "[1]"}, stats
    _assert_carries(stats["[0]"], np.stack(hs))  # h, returned first
    _assert_carries(stats["[1]"], np.stack(cs))  # c, computed first


class Swapped(nnx.Module):
    """Returns its second value first: `(2 * tanh(u), u)`, `u` computed first."""

    def __init__(self, rngs: nnx.Rngs):
        self.lin = nnx.Linear(4, 4, rngs=rngs)

    def __call__(self, x):
        u = self.lin(x)
        return 2 * jnp.tanh(u), u


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.pair = Swapped(rngs)

    def __call__(self, x):
        squashed, raw = self.pair(x)
        return jnp.sum(squashed**2) + 0.1 * jnp.sum(raw)


def test_nnx_module_outputs_in_return_order_with_their_cotangents():
    model = Net(nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(2), (6, 4))
    ins = sowviz.inspect(lambda m, x: m(x), model, x, mode="grad")
    assert_value_and_grad(ins.result, *nnx.value_and_grad(lambda m, x: m(x))(model, x))
    squashed, raw = model.pair(x)
    stats = _leaf_stats(ins, "pair")
    _assert_carries(stats["[0]"], squashed)
    _assert_carries(stats["[1]"], raw)
    cot = {p.leaf: p.summaries["cotangent"] for p in ins.probes if p.name == "pair"}
    # the loss as a function of each output: `raw` also reaches it through `squashed`
    _assert_carries(cot["[0]"], jax.grad(lambda s: jnp.sum(s**2))(squashed))
    loss_of_raw = lambda u: jnp.sum((2 * jnp.tanh(u)) ** 2) + 0.1 * jnp.sum(u)  # noqa: E731
    _assert_carries(cot["[1]"], jax.grad(loss_of_raw)(raw))


class Projection(eqx.Module):
    proj: eqx.nn.Linear

    def __init__(self, key):
        self.proj = eqx.nn.Linear(16, 3, use_bias=False, key=key)

    def __call__(self, h):
        return self.proj(h)


def _projection_loss(model, h):
    return jnp.mean(jax.vmap(model)(h) ** 2)


def test_a_vmapped_bias_free_linear_has_the_shape_vmap_returns():
    model = Projection(jax.random.PRNGKey(0))
    h = jax.random.normal(jax.random.PRNGKey(1), (8, 16))
    ins = sowviz.inspect(_projection_loss, model, h, mode="grad")
    assert_value_and_grad(ins.result, *eqx.filter_value_and_grad(_projection_loss)(model, h))
    out = jax.vmap(model)(h)  # (8, 3): the batch first
    for name in ("proj: Linear", "Projection"):
        s = ins.probe(name).summaries
        _assert_carries(s["primal"], out)
        _assert_carries(s["cotangent"], jax.grad(lambda y: jnp.mean(y**2))(out))


def _batched_cell_loss(cell, xs):
    """An LSTM cell run by `lax.scan` over time, under `jax.vmap` over the batch."""

    def run(x):
        def step(carry, inp):
            return cell(inp, carry), None

        (h, _), _ = jax.lax.scan(step, (jnp.zeros(8), jnp.zeros(8)), x)
        return jnp.sum(h**2)

    return jnp.sum(jax.vmap(run)(xs))


def _cell_values_and_cotangents(cell, xs):
    """Every step's `h` and `c`, `[batch, time, 8]`, and the loss's derivative by each:
    the cell written out (`eqx.nn.LSTMCell.__call__`) with a zero added to `c` where it
    is made (its cotangent then holds its read for `h` too) and to `h`."""

    def perturbed(dh, dc):
        def run(x, dh, dc):
            def step(carry, inp):
                x_t, dh_t, dc_t = inp
                h, c = carry
                lin = cell.weight_ih @ x_t + cell.weight_hh @ h + cell.bias
                i, f, g, o = jnp.split(lin, 4)
                c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g) + dc_t
                h = jax.nn.sigmoid(o) * jnp.tanh(c) + dh_t
                return (h, c), (h, c)

            (h, _), hc = jax.lax.scan(step, (jnp.zeros(8), jnp.zeros(8)), (x, dh, dc))
            return jnp.sum(h**2), hc

        losses, hc = jax.vmap(run)(xs, dh, dc)
        return jnp.sum(losses), hc

    zeros = jnp.zeros((*xs.shape[:2], 8))
    (dh, dc), (hs, cs) = jax.grad(perturbed, argnums=(0, 1), has_aux=True)(zeros, zeros)
    return hs, cs, dh, dc


def test_equinox_lstm_cell_in_a_vmapped_scan_keeps_its_return_order():
    cell = eqx.nn.LSTMCell(2, 8, key=jax.random.PRNGKey(1))
    xs = jax.random.normal(jax.random.PRNGKey(0), (4, 5, 2))  # [batch, time, features]
    ins = sowviz.inspect(_batched_cell_loss, cell, xs, mode="grad")
    assert_value_and_grad(ins.result, *eqx.filter_value_and_grad(_batched_cell_loss)(cell, xs))
    hs, cs, dh, dc = _cell_values_and_cotangents(cell, xs)
    stats = {p.leaf: p.summaries for p in ins.probes if p.name == "LSTMCell"}
    assert set(stats) == {"[0]", "[1]"}, stats
    # the probe holds the scan's iterations first: [time, batch, 8]
    for leaf, value, cotangent in (("[0]", hs, dh), ("[1]", cs, dc)):
        _assert_carries(stats[leaf]["primal"], np.swapaxes(value, 0, 1))
        _assert_carries(stats[leaf]["cotangent"], np.swapaxes(cotangent, 0, 1))
