"""Repeated blocks that were not stacked (sowviz/graph/repeats.py): a Python loop of
Flax Linen `nn.remat` or Haiku `hk.remat` blocks, and an NNX decode loop whose passes
are the model call and its sampling. Each stack's blocks keep their own values, checked
against plain JAX."""

from __future__ import annotations

import inspect as pyinspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

X = jax.random.normal(jax.random.PRNGKey(1), (4, 8))


def _kids(g, node):
    return [n for n in g.nodes if n.parent == node.id]


def _chain(kernels, biases, x):
    """Each block's output, `x + relu(x @ w + b)`, in plain JAX."""
    outs = []
    for w, b in zip(kernels, biases, strict=True):
        x = x + jax.nn.relu(x @ w + b)
        outs.append(x)
    return outs


def _cotangent_l2(kernels, biases, x, i):
    """|d sum(output) / d (block i's output)|, in plain JAX."""

    def rest(h):
        return (
            jnp.sum(_chain(kernels[i + 1 :], biases[i + 1 :], h)[-1])
            if i + 1 < len(kernels)
            else jnp.sum(h)
        )

    return float(jnp.linalg.norm(jax.grad(rest)(_chain(kernels, biases, x)[i])))


def _check_blocks(ins, labels, kernels, biases):
    want = _chain(kernels, biases, X)
    for i, label in enumerate(labels):
        got = ins.probe(label).summaries
        np.testing.assert_allclose(got["primal"]["mean"], np.mean(want[i]), rtol=1e-5)
        want_ct = _cotangent_l2(kernels, biases, X, i)
        np.testing.assert_allclose(got["cotangent"]["l2"], want_ct, rtol=1e-4)


def test_linen_remat_blocks_in_a_python_loop_are_one_stack():
    # `B = nn.remat(Block)` then `B(name=f"block_{i}")(x)` 13 times: 13 boxes
    # `checkpoint(block_i)` inside a box of Flax's plumbing, `module_class_lift_transform`
    # (the line's library call, grouped as the level was big), where the same loop without
    # remat is one stack `block_0–12 (×13)`.
    nn = pytest.importorskip("flax.linen")
    n = 13

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            return x + nn.relu(nn.Dense(8)(x))

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            remat_block = nn.remat(Block)
            for i in range(n):
                x = remat_block(name=f"block_{i}")(x)
            return jnp.sum(x)

    m = Model()
    params = m.init(jax.random.PRNGKey(0), X)["params"]
    ins = sowviz.inspect(lambda p, x: m.apply({"params": p}, x), params, X)
    g = ins.graph
    assert not [nd.label for nd in g.nodes if "lift_transform" in nd.label]
    (model,) = [nd for nd in g.nodes if nd.label == "Model"]
    top = _kids(g, model)
    assert [nd.label for nd in top] == [f"checkpoint(block_0–{n - 1}) (×{n})", "reduce_sum"]
    assert top[0].repeats == n
    labels = [f"checkpoint(block_{i})" for i in range(n)]
    assert [nd.label for nd in _kids(g, top[0])] == labels
    dense = [params[f"block_{i}"]["Dense_0"] for i in range(n)]
    _check_blocks(ins, labels, [d["kernel"] for d in dense], [d["bias"] for d in dense])
    np.testing.assert_allclose(ins.result[0], m.apply({"params": params}, X), rtol=1e-5)


def test_haiku_remat_blocks_in_a_python_loop_are_one_stack():
    # `hk.remat(Block(name=f"block_{i}"))(x)`: each `checkpoint(block_i)` holds the module
    # scope `block_i`, compared exactly, so no two were alike.
    hk = pytest.importorskip("haiku")
    n = 4

    class Block(hk.Module):
        def __call__(self, x):
            return x + jax.nn.relu(hk.Linear(8)(x))

    def f(x):
        for i in range(n):
            x = hk.remat(Block(name=f"block_{i}"))(x)
        return jnp.sum(x)

    m = hk.without_apply_rng(hk.transform(f))
    params = m.init(jax.random.PRNGKey(0), X)
    ins = sowviz.inspect(lambda p, x: m.apply(p, x), params, X)
    g = ins.graph
    top = [nd.label for nd in g.children(g.root) if nd.kind not in ("input", "output")]
    assert top == ["parameters", f"checkpoint(block_0–{n - 1}) (×{n})", "reduce_sum"], top
    (grp,) = [nd for nd in g.nodes if nd.repeats]
    labels = [f"checkpoint(block_{i})" for i in range(n)]
    assert [nd.label for nd in _kids(g, grp)] == labels
    lin = [params[f"block_{i}/linear"] for i in range(n)]
    _check_blocks(ins, labels, [p["w"] for p in lin], [p["b"] for p in lin])


def _decoder():
    nnx = pytest.importorskip("flax.nnx")

    class Decoder(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(16, 8, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(2, 8, decode=True, rngs=rngs)

        def __call__(self, tok):
            x = self.embed(tok)
            return self.embed.attend(x + self.attn(x))

    model = Decoder(nnx.Rngs(0))
    model.attn.init_cache((2, 8, 8))
    return model


def _decode(n):
    def generate(model, prompt, key):
        toks = [prompt]
        for _ in range(n):
            logits = model(toks[-1][:, None])[:, 0]
            logits = sowviz.sow(logits, "logits")
            key, sub = jax.random.split(key)
            toks.append(jax.random.categorical(sub, logits))
        return jnp.stack(toks, 1)

    return generate


def _decoded(n, prompt, key):
    """Each token's logits and the tokens, in plain JAX (a fresh model and cache)."""
    model, toks, logits = _decoder(), [prompt], []
    for _ in range(n):
        logits.append(model(toks[-1][:, None])[:, 0])
        key, sub = jax.random.split(key)
        toks.append(jax.random.categorical(sub, logits[-1]))
    return logits, jnp.stack(toks, 1)


def _line(fn, text):
    lines, first = pyinspect.getsourcelines(fn)
    (k,) = [k for k, s in enumerate(lines) if text in s]
    return first + k


# (5 tokens: 30 nodes; 8: 48, past the 40 a level folds beyond: it was chunked into
# `op … generate (1–2)` boxes, one stack `Decoder (×8)` of the model calls alone)
@pytest.mark.parametrize("n", [5, 8])
def test_an_nnx_decode_loop_is_one_stack_of_token_steps(n):
    generate = _decode(n)
    prompt, key = jnp.array([1, 2]), jax.random.PRNGKey(0)
    ins = sowviz.inspect(generate, _decoder(), prompt, key, mode="primal")
    g = ins.graph
    top = [nd for nd in g.children(g.root) if nd.kind not in ("input", "output")]
    assert [nd.label for nd in top] == [
        "parameters",
        "model state",
        f"Decoder · categorical (×{n})",
        "stack",
        "new model",
    ]
    grp = top[2]
    assert grp.repeats == n
    pass_labels = ["broadcast_in_dim", "Decoder", "squeeze", "logits", "key, sub", "categorical"]
    want = [
        # (a sow by the name `probe` takes: the capture numbers a name sown again)
        f"logits_{t}"
        if lab == "logits"
        else lab
        if t == 0 or lab in ("broadcast_in_dim", "squeeze")
        else f"{lab}#{t + 1}"
        for t in range(n)
        for lab in pass_labels
    ]
    kids = _kids(g, grp)
    assert [nd.label for nd in kids] == want
    # the sampling is named and sourced by its own lines, not the model call's
    split_line = _line(generate, "jax.random.split")
    sample_line = _line(generate, "jax.random.categorical")
    for nd in kids:
        if nd.label.startswith("key, sub"):
            assert nd.source.line == split_line, nd
        if nd.label.startswith("categorical"):
            assert nd.source.line == sample_line, nd
    # every token's sown logits by their names, and the tokens, are plain JAX's
    logits, toks = _decoded(n, prompt, key)
    for t in range(n):
        got = ins.probe(f"logits_{t}").summaries["primal"]
        np.testing.assert_allclose(got["mean"], np.mean(logits[t]), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["l2"], np.linalg.norm(logits[t]), rtol=1e-5)
    np.testing.assert_array_equal(ins.result, toks)


def test_a_decode_loop_whose_shapes_grow_is_no_stack_and_stays_folded():
    # A loop calling the model on all tokens so far: each pass has other shapes, so
    # `repeats` stacks nothing, and the big level still folds per call (passes alike
    # but for their types are no loop that a stack will hold).
    nnx = pytest.importorskip("flax.nnx")

    class Decoder(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(16, 8, rngs=rngs)
            self.lin = nnx.Linear(8, 8, rngs=rngs)

        def __call__(self, tok):
            return self.embed.attend(jnp.tanh(self.lin(self.embed(tok))))

    def generate(model, prompt, key):
        toks = prompt[:, None]
        for _ in range(10):  # the same equations each pass, on one more token
            logits = model(toks)[:, -1]
            key, sub = jax.random.split(key)
            toks = jnp.concatenate([toks, jax.random.categorical(sub, logits)[:, None]], 1)
        return toks

    model, prompt = Decoder(nnx.Rngs(0)), jnp.array([1, 2])
    ins = sowviz.inspect(generate, model, prompt, jax.random.key(0), mode="primal")
    g = ins.graph
    top = g.children(g.root)
    assert not [nd for nd in g.nodes if nd.repeats]
    assert len(top) <= 40, [(nd.label, nd.shapes[:1]) for nd in top]


def test_a_name_sown_in_every_pass_of_a_python_loop_is_asked_for_by_its_number():
    # `sow(h, "h")` per pass is numbered h_0 … h_3: "h" alone answered with h_0
    # (the one node drawn `h`), as if the loop had one such value.
    def f(x):
        for _ in range(4):
            x = sowviz.sow(jnp.tanh(x) * 1.5, "h")
        return jnp.sum(x)

    x = jnp.linspace(-0.5, 1.0, 6)
    ins = sowviz.inspect(f, x)
    with pytest.raises(KeyError, match=r"'h' was sown 4 times.*'h_0'.*the last 'h_3'"):
        ins.probe("h")
    want = x
    for _ in range(3):
        want = jnp.tanh(want) * 1.5
    got = ins.probe("h_2").summaries["primal"]
    np.testing.assert_allclose(got["mean"], float(jnp.mean(want)), rtol=1e-6)
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(want)), rtol=1e-6)
