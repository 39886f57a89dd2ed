"""Equinox models passed as modules, as in Equinox's own examples.

`eqx.nn.MLP` (its activation function is a pytree leaf that is not an array), and
the CNN of Equinox's MNIST tutorial at a smaller size: a list of layers mixing
`eqx.nn.Conv2d`, `eqx.nn.MaxPool2d`, `eqx.nn.Linear` and plain functions
(`jax.nn.relu`, `jnp.ravel`), applied per example under `jax.vmap`.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from . import ZooCase

CLASSES = 10


def mlp_loss(model: eqx.nn.MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    pred = jax.vmap(model)(x)
    return jnp.mean((pred - y) ** 2)


def make_mlp(seed: int = 0, batch: int = 16):
    kx, ky, km = jax.random.split(jax.random.PRNGKey(seed), 3)
    model = eqx.nn.MLP(
        in_size=6, out_size=2, width_size=24, depth=3, activation=jax.nn.tanh, key=km
    )
    x = jax.random.normal(kx, (batch, 6))
    y = jnp.stack([jnp.sin(x[:, 0]) + x[:, 1], x[:, 2] * x[:, 3]], axis=1)
    y = y + 0.05 * jax.random.normal(ky, y.shape)
    return model, x, y


class CNN(eqx.Module):
    layers: list

    def __init__(self, key):
        key1, key2, key3 = jax.random.split(key, 3)
        # Standard CNN setup: convolutional layer, followed by flattening,
        # with a small MLP on top.
        self.layers = [
            eqx.nn.Conv2d(1, 4, kernel_size=3, key=key1),
            eqx.nn.MaxPool2d(kernel_size=2),
            jax.nn.relu,
            jnp.ravel,
            eqx.nn.Linear(4 * 9 * 9, 32, key=key2),
            jax.nn.sigmoid,
            eqx.nn.Linear(32, CLASSES, key=key3),
            jax.nn.log_softmax,
        ]

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x)
        return x


def cross_entropy(y: jax.Array, pred_y: jax.Array) -> jax.Array:
    # y are the true targets, of shape (batch,); pred_y the log-softmax'd
    # predictions, of shape (batch, classes).
    pred_y = jnp.take_along_axis(pred_y, jnp.expand_dims(y, 1), axis=1)
    return -jnp.mean(pred_y)


def cnn_loss(model: CNN, x: jax.Array, y: jax.Array) -> jax.Array:
    # Our input has the shape (batch, 1, 12, 12), but our model operates on a
    # single input: vmap over the batch.
    pred_y = jax.vmap(model)(x)
    return cross_entropy(y, pred_y)


def make_cnn(seed: int = 0, batch: int = 8):
    kx, ky, km = jax.random.split(jax.random.PRNGKey(seed), 3)
    x = jax.random.normal(kx, (batch, 1, 12, 12))
    y = jax.random.randint(ky, (batch,), 0, CLASSES)
    return CNN(km), x, y


def mlp_case() -> ZooCase:
    return ZooCase("equinox-mlp", mlp_loss, make_mlp())


def cnn_case() -> ZooCase:
    return ZooCase("equinox-cnn", cnn_loss, make_cnn())
