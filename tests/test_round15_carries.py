"""Round 15: the ports of an `nnx.scan` body read the user's names. NNX hands
`lax.scan` its own carry, `(user's carry, modules' states, broadcasts, ...)`, and JAX
names it by the user's parameters, so `model, x, key = carry` used to name `x` by
`model[1]` and the cache by `x[0][0]['cache'].value`. The names are now `x`, `key`,
`i` and `model.cache`; what cannot be told (which of a broadcast module's variables)
is named by its path alone or not at all, never by another input's name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

nnx = pytest.importorskip("flax.nnx")


class Layer(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(4, 4, rngs=rngs)
        self.cache = nnx.Cache(jnp.zeros((8, 4)))

    def __call__(self, x, pos):
        y = self.lin(x)
        self.cache[...] = jax.lax.dynamic_update_slice(self.cache[...], y, (pos, 0))
        return jnp.tanh(y)


X = jnp.linspace(-1.0, 1.0, 4)[None, :]
KEY = jax.random.PRNGKey(0)


def generate(model, x, key, graph_updates=True):
    kw = {} if graph_updates else {"graph_updates": False}

    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0), **kw)
    def step(carry, i):
        model, x, key = carry
        key, sub = jax.random.split(key)
        x = model(x + 0.1 * jax.random.normal(sub, x.shape), i)
        return (model, x, key), x.sum()

    (_, x, _), ys = step((model, x, key), jnp.arange(3))
    return x, ys


def reference(model, x, key):
    """The same steps as a plain Python loop on the module (no NNX transform)."""
    ys = []
    for i in range(3):
        key, sub = jax.random.split(key)
        y = model.lin(x + 0.1 * jax.random.normal(sub, x.shape))
        model.cache[...] = model.cache[...].at[i].set(y[0])
        x = jnp.tanh(y)
        ys.append(x.sum())
    return x, jnp.stack(ys)


def _scan_ports(ins):
    (node,) = [n for n in ins.to_dict()["nodes"] if n["label"] == "scan(step)"]
    return set(node["port_names"].values())


@pytest.mark.parametrize("graph_updates", [True, False])
def test_nnx_scan_ports_read_the_users_carry_names(graph_updates):
    model = Layer(nnx.Rngs(0))
    ref = nnx.clone(model)
    ins = sowviz.inspect(
        lambda m, x, k: generate(m, x, k, graph_updates), model, X, KEY, mode="primal"
    )
    names = _scan_ports(ins)
    assert {"x", "key", "i"} <= names, names
    assert not any(n.startswith(("model[", "carry[", "i[")) for n in names), names
    # the model's variables carried (the cache it writes) are the model's
    assert names - {"x", "key", "i"} <= {"model.cache", "model.lin.kernel", "model.lin.bias"}
    x, ys = ins.result
    want_x, want_ys = reference(ref, X, KEY)
    np.testing.assert_allclose(np.asarray(x), np.asarray(want_x), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ys), np.asarray(want_ys), rtol=1e-5)


class Norm(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(4, 4, rngs=rngs)
        self.bn = nnx.BatchNorm(4, momentum=0.5, rngs=rngs)

    def __call__(self, x):
        return self.bn(self.lin(x))


def train_steps(model, x, scales):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
    def step(carry, scale):
        net, h = carry
        h = jnp.tanh(net(h * scale))
        return (net, h), h.mean()

    (_, h), means = step((model, x), scales)
    return h, means


def test_nnx_scan_names_a_batch_norm_carried_in_a_tuple_by_the_users_names():
    x = jax.random.normal(jax.random.PRNGKey(1), (8, 4))
    model = Norm(nnx.Rngs(0))
    ref = nnx.clone(model)
    ins = sowviz.inspect(train_steps, model, x, jnp.array([1.0, 0.5]), mode="primal")
    names = _scan_ports(ins)
    assert {"h", "scale"} <= names, names  # `h` was `net[1]`
    assert not any("[" in n for n in names), names
    # plain JAX: BatchNorm in train mode by hand (the batch's statistics)
    w, b = ref.lin.kernel[...], ref.lin.bias[...]
    h, means = x, []
    for scale in (1.0, 0.5):
        z = (h * scale) @ w + b
        mu, v = z.mean(0), z.var(0)
        h = jnp.tanh((z - mu) / jnp.sqrt(v + 1e-5) * ref.bn.scale[...] + ref.bn.bias[...])
        means.append(h.mean())
    got_h, got_means = ins.result
    np.testing.assert_allclose(np.asarray(got_h), np.asarray(h), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got_means), np.asarray(means), rtol=1e-4, atol=1e-6)


def test_a_broadcast_module_and_a_carry_that_cannot_be_told_apart_get_no_wrong_name():
    def run(model, x):
        @nnx.scan(in_axes=(0, nnx.Carry, None), out_axes=(0, nnx.Carry))
        def step(i, x, model):
            x = model(x, i)
            return x.sum(), x

        return step(jnp.arange(3), x, model)

    model = Layer(nnx.Rngs(0))
    ref = nnx.clone(model)
    ins = sowviz.inspect(run, model, X, mode="primal")
    names = _scan_ports(ins)
    # `x` and `model` both leave NNX's pure arguments: which is the carry is not known
    assert "i" in names and not any(n.startswith(("args", "model")) for n in names), names
    ys, x = ins.result
    want_ys, want_x = run(ref, X)
    np.testing.assert_allclose(np.asarray(x), np.asarray(want_x), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ys), np.asarray(want_ys), rtol=1e-6)


def test_nnx_scan_names_map_nnx_carry_paths_to_the_users():
    from sowviz.graph.frameworks import nnx_scan_names

    carry = {"carry": ("model", "x", "key")}
    names = (
        "carry[0][2]",
        "carry[1][0][0]['layers'][0]['attn']['cached_key'].value",
        "carry[0][1]",
        "i[1][1]",
    )
    got = nnx_scan_names(names, "graph", ("carry", "i"), carry)
    assert got == ("carry[2]", "carry[0].layers[0].attn.cached_key", "carry[1]", "i")
    # two modules in the carry, in order; one module and a None: neither is told
    two = ("carry[1][0][0]['w'].value", "carry[1][1][0]['w'].value", "carry[0][0]", "i[1][1]")
    got = nnx_scan_names(two, "graph", ("carry", "i"), {"carry": ("x", "a", "b")})
    assert got == ("carry[1].w", "carry[2].w", "carry[0]", "i")
    one = (two[0], *two[2:])
    got = nnx_scan_names(one, "graph", ("carry", "i"), {"carry": ("x", "a", "none")})
    assert got == ("w", "carry[0]", "i")
    # without the user's parameter `i`, which parameter is the carry is not known
    assert nnx_scan_names(two[2:3], "graph", ("carry", "i"), {}) == ("",)
    # graph_updates=False: NNX's `(carry, broadcasts)` and the masked arguments
    simple = ("carry[0][0].__state__['lin']['bias'].value", "carry[1][0].value", "i[1]")
    got = nnx_scan_names(simple, "simple", ("carry", "i"), carry)
    assert got == ("carry[0].lin.bias", "", "i")
