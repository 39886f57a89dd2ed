"""A Flax NNX decoder-only transformer language model.

Written like Flax's NNX examples (`examples/gemma`, the NNX toy examples): an
`nnx.Embed` with tied unembedding (`embed.attend`), pre-norm blocks held in an
`nnx.List`, attention either `nnx.MultiHeadAttention` or the gemma example's
hand-written q/k/v einsums over `nnx.Param`s, an MLP of `nnx.Linear`s, RMSNorm and
LayerNorm, and a cross-entropy loss from optax. The model is passed as an argument:
`loss(model, tokens, targets)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from . import ZooCase


@dataclass(frozen=True)
class Config:
    vocab: int = 48
    features: int = 32
    heads: int = 4
    hidden: int = 64
    seq: int = 12
    batch: int = 4
    # One block of each attention flavour: the library layer and gemma's einsums.
    attention: tuple[str, ...] = ("mha", "einsum")


class EinsumAttention(nnx.Module):
    """Causal self-attention as in Flax's gemma example: q/k/v einsums over
    (heads, features, head_dim) kernels, then an output einsum back to features."""

    def __init__(self, features: int, heads: int, *, rngs: nnx.Rngs):
        head_dim = features // heads
        init = nnx.initializers.normal(features**-0.5)
        self.q_einsum = nnx.Param(init(rngs.params(), (heads, features, head_dim)))
        self.kv_einsum = nnx.Param(init(rngs.params(), (2, heads, features, head_dim)))
        self.attn_vec_einsum = nnx.Param(init(rngs.params(), (heads, head_dim, features)))
        self.head_dim = head_dim

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        query = jnp.einsum("BTD,NDH->BTNH", x, self.q_einsum[...])
        key, value = jnp.einsum("BSD,CNDH->CBSNH", x, self.kv_einsum[...])
        query = query * self.head_dim**-0.5
        logits = jnp.einsum("BTNH,BSNH->BTNS", query, key)
        logits = jnp.where(jnp.swapaxes(mask, 1, 2), logits, -1e30)
        probs = jax.nn.softmax(logits, axis=-1)
        encoded = jnp.einsum("BTNS,BSNH->BTNH", probs, value)
        return jnp.einsum("BTNH,NHD->BTD", encoded, self.attn_vec_einsum[...])


class MLP(nnx.Module):
    def __init__(self, features: int, hidden: int, *, rngs: nnx.Rngs):
        self.up = nnx.Linear(features, hidden, rngs=rngs)
        self.down = nnx.Linear(hidden, features, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(nnx.gelu(self.up(x)))


class Block(nnx.Module):
    def __init__(self, cfg: Config, attention: str, *, rngs: nnx.Rngs):
        self.attn_norm = nnx.RMSNorm(cfg.features, rngs=rngs)
        if attention == "mha":
            self.attn = nnx.MultiHeadAttention(
                num_heads=cfg.heads, in_features=cfg.features, decode=False, rngs=rngs
            )
        else:
            self.attn = EinsumAttention(cfg.features, cfg.heads, rngs=rngs)
        self.mlp_norm = nnx.LayerNorm(cfg.features, rngs=rngs)
        self.mlp = MLP(cfg.features, cfg.hidden, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        h = self.attn_norm(x)
        if isinstance(self.attn, nnx.MultiHeadAttention):
            h = self.attn(h, mask=mask)
        else:
            h = self.attn(h, mask)
        x = x + h
        return x + self.mlp(self.mlp_norm(x))


class TransformerLM(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(cfg.vocab, cfg.features, rngs=rngs)
        self.pos_embed = nnx.Param(
            nnx.initializers.normal(0.02)(rngs.params(), (cfg.seq, cfg.features))
        )
        self.layers = nnx.List([Block(cfg, kind, rngs=rngs) for kind in cfg.attention])
        self.final_norm = nnx.RMSNorm(cfg.features, rngs=rngs)

    def embed_tokens(self, tokens: jax.Array) -> jax.Array:
        return self.embed(tokens) + self.pos_embed[: tokens.shape[1]]

    def unembed(self, x: jax.Array) -> jax.Array:
        return self.embed.attend(self.final_norm(x))

    def __call__(self, tokens: jax.Array) -> jax.Array:
        mask = nnx.make_causal_mask(tokens)
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, mask)
        return self.unembed(x)


def loss(model: TransformerLM, tokens: jax.Array, targets: jax.Array) -> jax.Array:
    logits = model(tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def make(cfg: Config = Config(), seed: int = 0):
    model = TransformerLM(cfg, rngs=nnx.Rngs(seed))
    data = jax.random.randint(jax.random.PRNGKey(seed + 1), (cfg.batch, cfg.seq + 1), 0, cfg.vocab)
    return model, data[:, :-1], data[:, 1:]


def case() -> ZooCase:
    return ZooCase("flax-nnx-transformer-lm", loss, make())
