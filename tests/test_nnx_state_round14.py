"""Round 14: a Flax NNX module's call that assigns its variables (BatchNorm's running
statistics in train mode) hands the new values on beside what it returns. Its stage
names them after their variables (`mean (new)`, `bn1.var (new)`), `probe("bn")` is what
`bn(x)` returns, and the stage's type is that activation alone. And `probe(name)` with
a module's whole path from its model (`layers[0]`, as Python reaches
`model.layers[0]`) is that module, not also the modules whose paths end with it."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

nnx = pytest.importorskip("flax.nnx")


class Net(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(4, 8, rngs=rngs)
        self.bn = nnx.BatchNorm(8, rngs=rngs)
        self.head = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
        return self.head(nnx.relu(self.bn(self.lin(x))))


class Block(nnx.Module):
    def __init__(self, rngs):
        self.conv1 = nnx.Linear(8, 8, rngs=rngs)
        self.bn1 = nnx.BatchNorm(8, rngs=rngs)

    def __call__(self, x):
        return x + nnx.relu(self.bn1(self.conv1(x)))


class ResNet(nnx.Module):
    def __init__(self, rngs):
        self.stem = nnx.Linear(4, 8, rngs=rngs)
        self.blocks = nnx.List([Block(rngs) for _ in range(2)])

    def __call__(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return jnp.mean(x, axis=-1)


def _loss(m, x):
    return jnp.mean(m(x) ** 2)


X = jax.random.normal(jax.random.PRNGKey(1), (16, 4))


def _l2(p):
    return p.summaries["primal"]["l2"]


def test_a_batchnorm_stage_is_its_activation_and_names_the_statistics_it_writes():
    model = Net(nnx.Rngs(0))
    model.train()
    ins = sowviz.inspect(_loss, model, X)
    # what the same module computes, called directly on a copy (Flax updates its stats)
    ref = nnx.clone(model)
    h = ref.bn(ref.lin(X))
    p = ins.probe("bn")
    assert p.summaries["primal"]["shape"] == [16, 8]
    np.testing.assert_allclose(_l2(p), np.linalg.norm(h), rtol=1e-5)
    for var in ("mean", "var"):
        # named after its variable, in the picker and as `leaf=`
        s = ins.probe("bn", leaf=f"{var} (new)")
        assert s.leaf == f"['{var} (new)']"
        want = np.linalg.norm(np.asarray(getattr(ref.bn, var)[...]))
        np.testing.assert_allclose(_l2(s), want, rtol=1e-5)
        assert ins.probe("bn", leaf=f"['{var} (new)']") is s
    # the stage's type is what the call returns (its face said `f32[16,8] +2`), and its
    # first probe (where the panel opens) the activation
    bn = ins.graph.node(p.node)
    assert bn.shapes == ("float32[16,8]",)
    leaves = [q.leaf for q in ins.probes if q.node == bn.id]
    assert leaves == ["['output']", "['mean (new)']", "['var (new)']"]
    # the model's root stage names them by their path in it; the program's outputs as before
    assert ins.probe("Net", leaf="bn.mean (new)").summaries["primal"]["shape"] == [8]
    np.testing.assert_allclose(
        _l2(ins.probe("new m/bn/mean")), np.linalg.norm(ref.bn.mean[...]), rtol=1e-5
    )


def test_eval_mode_writes_nothing_and_the_stage_keeps_one_bare_output():
    model = Net(nnx.Rngs(0))
    model.eval()
    ins = sowviz.inspect(_loss, model, X)
    p = ins.probe("bn")
    assert p.leaf == ""
    np.testing.assert_allclose(_l2(p), np.linalg.norm(model.bn(model.lin(X))), rtol=1e-5)


def test_a_block_names_its_children_s_writes_by_their_paths():
    model = ResNet(nnx.Rngs(0))
    model.train()
    ins = sowviz.inspect(_loss, model, X)
    ref = nnx.clone(model)
    h0 = ref.blocks[0](ref.stem(X))
    p = ins.probe("blocks[0]")
    np.testing.assert_allclose(_l2(p), np.linalg.norm(h0), rtol=1e-5)
    m = ins.probe("blocks[0]", leaf="bn1.mean (new)")
    np.testing.assert_allclose(_l2(m), np.linalg.norm(ref.blocks[0].bn1.mean[...]), rtol=1e-5)
    assert ins.graph.node(p.node).shapes == ("float32[16,8]",)


def test_two_calls_of_a_batchnorm_are_two_probes_named_by_their_paths():
    model = Net(nnx.Rngs(0))
    model.train()
    x2 = jnp.arange(64.0).reshape(16, 4) / 64

    def loss(m, a, b):
        return _loss(m, a) + _loss(m, b)

    ins = sowviz.inspect(loss, model, X, x2)
    # each call returns one array: two probes of that name, not "each with several
    # outputs" and a `leaf=` to pick
    with pytest.raises(KeyError, match=r"2 probes are called 'bn': '[^']+', '[^']+'\. ") as err:
        ins.probe("bn")
    suggested = re.search(r"e\.g\. '([^']+)'", str(err.value)).group(1)
    ref = nnx.clone(model)
    ref.bn(ref.lin(X))  # the first call's statistics are the second's running ones
    h2 = ref.bn(ref.lin(x2))
    np.testing.assert_allclose(_l2(ins.probe(suggested)), np.linalg.norm(h2), rtol=1e-5)


class MlpBlock(nnx.Module):
    def __init__(self, rngs):
        self.mlp = nnx.Sequential(
            nnx.Linear(8, 16, rngs=rngs), nnx.gelu, nnx.Linear(16, 8, rngs=rngs)
        )

    def __call__(self, x):
        return x + self.mlp(x)


class Stack(nnx.Module):
    def __init__(self, rngs):
        self.layers = nnx.List([MlpBlock(rngs) for _ in range(2)])

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_module_s_whole_python_path_wins_over_paths_ending_with_it():
    model = Stack(nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 8))
    ins = sowviz.inspect(_loss, model, x)
    h0 = model.layers[0](x)
    # `model.layers[0]`, not `model.layers[1].mlp.layers[0]` (an nnx.Sequential's)
    np.testing.assert_allclose(_l2(ins.probe("layers[0]")), np.linalg.norm(h0), rtol=1e-5)
    inner = model.layers[1].mlp.layers[0](h0)
    got = ins.probe("layers[1].mlp.layers[0]")
    np.testing.assert_allclose(_l2(got), np.linalg.norm(inner), rtol=1e-5)
    # a path two modules end with, and neither is reached by, is still refused
    with pytest.raises(KeyError, match=r"2 probes are called 'mlp\.layers\[0\]'"):
        ins.probe("mlp.layers[0]")


def test_with_several_models_a_bare_path_stays_ambiguous():
    a, b = Stack(nnx.Rngs(0)), Stack(nnx.Rngs(1))
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 8))
    ins = sowviz.inspect(lambda s, t, x: _loss(s, x) + _loss(t, x), a, b, x)
    with pytest.raises(KeyError, match="probes are called 'layers\\[0\\]'"):
        ins.probe("layers[0]")
    np.testing.assert_allclose(
        _l2(ins.probe("t.layers[0]")), np.linalg.norm(b.layers[0](x)), rtol=1e-5
    )
