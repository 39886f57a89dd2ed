"""Module methods other than `__call__` as stages: the tied unembedding `embed.attend`
of Flax's NNX language models, an autoencoder's `encode`/`decode` (called on itself
in its `__call__`, or on the model from the loss), Equinox modules' methods (reached
through Equinox's `BoundMethod`). Each stage's probe carries what that method returns,
computed here by calling it; private helpers and Flax's own bookkeeping methods
(`initialize_carry`) are no stages."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import sowviz

from .checks import assert_stage, assert_value_and_grad
from .models import nnx_lm
from .test_module_copies import _paths, _stage_carrying

X = jax.random.normal(jax.random.PRNGKey(3), (2, 4))


class NnxAE(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.enc = nnx.Linear(4, 3, rngs=rngs)
        self.dec = nnx.Linear(3, 4, rngs=rngs)
        self.cell = nnx.SimpleCell(3, 3, rngs=rngs)

    def encode(self, x):
        return jnp.tanh(self.enc(x))

    def decode(self, z):
        return self.dec(z)

    def __call__(self, x):
        carry = self.cell.initialize_carry((*x.shape[:-1], 3), nnx.Rngs(0))
        _, z = self.cell(carry, self.encode(x))
        return self.decode(z)


def _ae_loss(model, x):
    return jnp.mean((model(x) - x) ** 2) + jnp.mean(model.encode(x) ** 2)


def test_nnx_methods_are_stages_named_where_they_are_called():
    model = NnxAE(nnx.Rngs(0))
    ins = sowviz.inspect(_ae_loss, model, X, mode="grad")
    assert_value_and_grad(ins.result, *nnx.value_and_grad(_ae_loss)(model, X))
    stages = set(_paths(ins.graph))
    # on the module whose call runs: the method's name; on the model from the loss:
    # the model's class and the method
    assert {"NnxAE/encode", "NnxAE/encode/enc", "NnxAE/decode/dec", "NnxAE.encode"} <= stages
    assert _stage_carrying(ins, model.encode(X)) >= {"encode", "NnxAE.encode"}
    _, z = model.cell(model.cell.initialize_carry((2, 3), nnx.Rngs(0)), model.encode(X))
    assert "decode" in _stage_carrying(ins, model.decode(z))
    # Flax's own bookkeeping method is no stage of its own
    assert not any(s.endswith("initialize_carry") for s in stages if "/cell" in s)
    assert not any("cell.initialize_carry" in s for s in stages)
    # the hooks are gone once inspect returns
    assert NnxAE.__dict__["encode"].__qualname__ == "NnxAE.encode"
    assert not hasattr(NnxAE.__dict__["encode"], "__sowviz_wrapped__")


def test_nnx_tied_unembedding_is_the_embed_attend_stage():
    model, tokens, targets = nnx_lm.make()
    ins = sowviz.inspect(nnx_lm.loss, model, tokens, targets, mode="grad")
    assert_value_and_grad(ins.result, *nnx.value_and_grad(nnx_lm.loss)(model, tokens, targets))
    stages = set(_paths(ins.graph))
    assert {"TransformerLM/unembed/embed.attend", "TransformerLM/embed_tokens/embed"} <= stages
    assert "TransformerLM/make_causal_mask" in stages  # a library call, still one box
    logits = model(tokens)

    def ce(lg):
        return optax.softmax_cross_entropy_with_integer_labels(lg, targets).mean()

    assert_stage(ins, logits, key="cotangent", expected=jax.grad(ce)(logits))
    assert "embed.attend" in _stage_carrying(ins, logits)


class EqxEncoder(eqx.Module):
    lin: eqx.nn.Linear

    def __init__(self, key):
        self.lin = eqx.nn.Linear(4, 3, key=key)

    def encode(self, x):
        return jnp.tanh(self._pre(x))

    def _pre(self, x):  # a private helper: no stage
        return self.lin(x)


class EqxAE(eqx.Module):
    encoder: EqxEncoder
    decoder: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.encoder, self.decoder = EqxEncoder(k1), eqx.nn.Linear(3, 4, key=k2)

    def __call__(self, x):
        return self.decoder(self.encoder.encode(x))


def _eqx_loss(model, x):
    return jnp.mean((jax.vmap(model)(x) - x) ** 2)


def test_equinox_methods_are_stages_and_private_helpers_are_not():
    model = EqxAE(jax.random.PRNGKey(1))
    ins = sowviz.inspect(_eqx_loss, model, X, mode="grad")
    assert_value_and_grad(ins.result, *eqx.filter_value_and_grad(_eqx_loss)(model, X))
    stages = set(_paths(ins.graph))
    assert {"EqxAE/encoder.encode: EqxEncoder", "EqxAE/encoder.encode: EqxEncoder/lin: Linear"} <= (
        stages
    )
    assert not any("_pre" in s for s in stages)
    encoded = jax.vmap(model.encoder.encode)(X)
    assert "encoder.encode: EqxEncoder" in _stage_carrying(ins, encoded)

    def from_code(z):
        return jnp.mean((jax.vmap(model.decoder)(z) - X) ** 2)

    assert_stage(ins, encoded, key="cotangent", expected=jax.grad(from_code)(encoded))
    np.testing.assert_allclose(float(ins.result[0]), float(_eqx_loss(model, X)), rtol=1e-6)
