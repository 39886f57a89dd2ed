"""Round 15: a plain function of the user's that calls a Flax NNX module writing its
`nnx.Cache` (an LM's `decode_step(model, token, pos)`) shows what it returns first (its
face, `probe("step")`), the cache writes after it, named as the module's stage names them
(`cache (new)`); `nnx.fori_loop`'s ports name a carried model's variables as the user
reaches them (`model.cache`), not by NNX's lifted carry (`model.states[0]['cache'].value`);
and a module stage's port fed by a one-equation line (`positions = jnp.full(...)`) is
named by the module's parameter (`positions`), not by the line's primitive."""

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
        return jnp.tanh(y).sum(0)


def step(model, x, pos):  # the user's function, like an LM's `decode_step`
    out = model(x, pos)
    return out * 2.0


def run(model, x):
    a = step(model, x, 0)
    return step(model, x + a, 1)


X = jnp.linspace(-1.0, 1.0, 4)[None, :]


def _node(d, label):
    (node,) = [n for n in d["nodes"] if n["label"] == label]
    return node


def _l2(p):
    return p.summaries["primal"]["l2"]


def test_a_function_calling_a_module_that_writes_its_cache_shows_what_it_returns():
    model = Layer(nnx.Rngs(0))
    ins = sowviz.inspect(run, model, X, mode="primal")
    d = ins.to_dict()
    for label in ("step", "step#2"):
        node = _node(d, label)
        # its type (the face's) is what it returns, not the mostly unwritten cache
        assert node["shapes"] == ["float32[4]"]
        leaves = [p["leaf"] for p in d["probes"] if p["node"] == node["id"]]
        assert leaves == ["['output']", "['cache (new)']"]
    # independently: the same calls on a copy of the model, outside sowviz
    ref = nnx.clone(model)
    a = ref.lin(X)
    out1 = 2.0 * jnp.tanh(a).sum(0)
    cache1 = jnp.zeros((8, 4)).at[0].set(a[0])
    p = ins.probe("step")  # the function's value, as `step(model, x, 0)` returns it
    assert p.summaries["primal"]["shape"] == [4]
    np.testing.assert_allclose(_l2(p), np.linalg.norm(out1), rtol=1e-5)
    c = ins.probe("step", leaf="cache (new)")
    np.testing.assert_allclose(_l2(c), np.linalg.norm(cache1), rtol=1e-5)
    b = ref.lin(X + out1)
    cache2 = cache1.at[1].set(b[0])
    np.testing.assert_allclose(_l2(ins.probe("step#2", leaf="cache (new)")), np.linalg.norm(cache2))
    np.testing.assert_allclose(np.asarray(ins.result), 2.0 * np.tanh(np.asarray(b)).sum(0))


class Stack(nnx.Module):
    def __init__(self, rngs):
        self.layers = nnx.List([Layer(rngs) for _ in range(2)])

    def __call__(self, x, pos):
        for layer in self.layers:
            x = x + layer(x, pos)
        return x


def prefill(model, x):
    return model(x, 0)[:, -1]


def generate_one(model, x):
    return prefill(model, x) + 1.0


def test_the_writes_of_a_nested_model_are_named_by_their_whole_path():
    model = Stack(nnx.Rngs(0))
    ins = sowviz.inspect(generate_one, model, X, mode="primal")
    d = ins.to_dict()
    node = _node(d, "prefill")
    assert node["shapes"] == ["float32[1]"]
    leaves = [p["leaf"] for p in d["probes"] if p["node"] == node["id"]]
    assert leaves == ["['output']", "['layers[0].cache (new)']", "['layers[1].cache (new)']"]
    ref = nnx.clone(model)
    want = ref(X, 0)[:, -1]
    np.testing.assert_allclose(_l2(ins.probe("prefill")), np.linalg.norm(want), rtol=1e-5)
    for k in range(2):
        w = ins.probe("prefill", leaf=f"layers[{k}].cache (new)")
        want = np.linalg.norm(np.asarray(ref.layers[k].cache[...]))
        np.testing.assert_allclose(_l2(w), want, rtol=1e-5)


def generate(model, x):
    def body(i, carry):
        model, x = carry
        x = model(x, i)[None, :]
        return model, x

    x = model(x, 0)[None, :]  # the prefill writes the cache before the loop
    _, x = nnx.fori_loop(1, 4, body, (model, x))
    return x


def test_nnx_fori_loop_ports_name_the_carried_model_as_the_user_reaches_it():
    model = Layer(nnx.Rngs(0))
    ins = sowviz.inspect(generate, model, X, mode="primal")
    d = ins.to_dict()
    loop = _node(d, "fori_loop(body)")
    names = set(loop["port_names"].values())
    assert names == {"model.cache", "x"}, names
    # the result is the program's own
    ref = nnx.clone(model)
    np.testing.assert_allclose(np.asarray(ins.result), np.asarray(generate(ref, X)), rtol=1e-6)


def test_lifted_names_of_nnx_carries_read_as_python_paths():
    from sowviz.graph.frameworks import lifted_name

    name = "model.states[0]['layers'][0]['attn']['cached_key'].value"
    assert lifted_name(name) == "model.layers[0].attn.cached_key"
    assert lifted_name("carry[0].states[1]['w b'].value") == "carry[0]['w b']"
    assert lifted_name("carry[1]") == "carry[1]"
    assert lifted_name("h['states'].value") == "h['states'].value"


class Net(nnx.Module):
    def __init__(self, rngs):
        self.emb = nnx.Embed(16, 8, rngs=rngs)
        self.out = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, tokens, positions, mask):
        x = self.emb(tokens) * positions[..., None]
        return jnp.where(mask[..., None], self.out(x), 0.0)


def decode_step(model, token, pos):
    b = token.shape[0]
    positions = jnp.full((b, 1), pos)
    mask = jnp.broadcast_to(pos > 0, (b, 1))
    return model(token, positions, mask).sum()


def test_a_module_port_made_by_a_one_equation_line_is_named_by_its_parameter():
    model = Net(nnx.Rngs(0))
    token = jnp.ones((2, 1), jnp.int32)
    ins = sowviz.inspect(decode_step, model, token, jnp.asarray(3), mode="primal")
    d = ins.to_dict()
    net = _node(d, "Net")
    ports = sorted((v, _label(d, k)) for k, v in net["port_names"].items())
    # made by `broadcast_in_dim` boxes: called by Net's parameters; the input `token`
    # keeps its own name (no entry)
    assert ports == [("mask", "broadcast_in_dim"), ("positions", "broadcast_in_dim")]
    # a library's layer names its input `inputs`: its port keeps the box's name, `mul`
    (out,) = [n for n in d["nodes"] if n["label"] == "out" and n["parent"] == net["id"]]
    assert not out.get("port_names"), out["port_names"]
    ref = nnx.clone(model)
    want = ref.out(ref.emb(token) * 3.0).sum()
    np.testing.assert_allclose(float(ins.result), float(want), rtol=1e-5)


def _label(d, node_id):
    return next(n["label"] for n in d["nodes"] if n["id"] == node_id)
