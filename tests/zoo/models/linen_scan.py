"""A Flax Linen residual network whose blocks are `nn.scan` over `nn.remat`.

The "scan over layers" idiom of Flax's guides and large Linen models (t5x, the
lm1b-style decoders): one block definition, `nn.remat` so its activations are
recomputed in the backward pass, lifted with `nn.scan` so the parameters of all
layers are stacked along a leading axis (`variable_axes={"params": 0}`). Params come
from `model.init`; the loss calls `model.apply`: `loss(params, x, y)`, `y` integer
class labels.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from . import ZooCase

FEATURES, HIDDEN, LAYERS, CLASSES, BATCH, INPUTS = 16, 32, 4, 5, 8, 12


class Block(nn.Module):
    features: int
    hidden: int

    @nn.compact
    def __call__(self, x, _):
        h = nn.LayerNorm()(x)
        h = nn.Dense(self.hidden)(h)
        h = nn.gelu(h)
        h = nn.Dense(self.features)(h)
        return x + h, None


class ScanModel(nn.Module):
    features: int = FEATURES
    hidden: int = HIDDEN
    layers: int = LAYERS
    classes: int = CLASSES

    @nn.compact
    def __call__(self, x):
        x = nn.Dense(self.features, name="embed")(x)
        Blocks = nn.scan(
            nn.remat(Block),
            variable_axes={"params": 0},
            split_rngs={"params": True},
            length=self.layers,
        )
        x, _ = Blocks(self.features, self.hidden, name="blocks")(x, None)
        x = nn.LayerNorm(name="final_norm")(x)
        return nn.Dense(self.classes, name="head")(x)


model = ScanModel()


def loss(params, x, y):
    logits = model.apply({"params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def make(seed: int = 0, batch: int = BATCH):
    kx, ky, kp = jax.random.split(jax.random.PRNGKey(seed), 3)
    x = jax.random.normal(kx, (batch, INPUTS), jnp.float32)
    y = jax.random.randint(ky, (batch,), 0, CLASSES)
    params = model.init(kp, x)["params"]
    return params, x, y


def case() -> ZooCase:
    return ZooCase("flax-linen-scan-remat", loss, make())
