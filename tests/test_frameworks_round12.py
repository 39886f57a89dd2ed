"""A model rebuilt inside the function (`nnx.merge(graphdef, params, rest)`, the
README's pattern for LoRA, tied weights and jmp) names a scanned stack of its layers
as the model passed in does (`layers`, not the class `Block`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import sowviz


class Block(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(8, 8, rngs=rngs)

    def __call__(self, x):
        return x + jnp.tanh(self.lin(x))


class Net(nnx.Module):
    def __init__(self, rngs):
        self.embed = nnx.Linear(4, 8, rngs=rngs)

        @nnx.split_rngs(splits=3)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return Block(rngs)

        self.layers = make(rngs)
        self.head = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def forward(x, layer):
            return layer(x)

        return self.head(forward(self.embed(x), self.layers))


def _inside_loops(ins: sowviz.Inspection) -> list[str]:
    d = ins.to_dict()
    kind = {n["id"]: n["kind"] for n in d["nodes"]}
    return [
        n["label"] for n in d["nodes"] if n["parent"] and kind[n["parent"]] in ("scan", "remat")
    ]


def test_a_model_merged_inside_the_function_names_its_scanned_layers():
    net = Net(nnx.Rngs(0))
    x = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
    graphdef, params, rest = nnx.split(net, nnx.Param, ...)

    def loss_split(params, rest, x):
        return jnp.mean(nnx.merge(graphdef, params, rest)(x) ** 2)

    passed = sowviz.inspect(lambda m, x: jnp.mean(m(x) ** 2), net, x)
    merged = sowviz.inspect(loss_split, params, rest, x)
    assert _inside_loops(passed) == ["layers"]
    assert _inside_loops(merged) == ["layers"]
    want_loss, want_grads = jax.value_and_grad(loss_split)(params, rest, x)
    np.testing.assert_allclose(merged.result[0], want_loss, rtol=1e-6)
    got = jax.tree.leaves(merged.result[1])
    for g, w in zip(got, jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)
