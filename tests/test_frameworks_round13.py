"""Round 13 of framework names: an Equinox model holding `eqx.nn.Shared`, passed as the
halves of `eqx.partition` and `eqx.combine`d inside the loss (Equinox's freezing idiom),
keeps its module paths; a diffrax vector field draws no second stage of its own class
inside its MLP; Flax Linen's `nn.remat_scan` says its name on every level."""

from __future__ import annotations

import diffrax
import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz


class Block(eqx.Module):
    lin: eqx.nn.Linear

    def __call__(self, x):
        return x + jnp.tanh(self.lin(x))


class TiedLM(eqx.Module):
    """Equinox's tied embedding / unembedding (`eqx.nn.Shared`, as in its docs)."""

    shared: eqx.nn.Shared
    blocks: list
    checkpointed: bool = eqx.field(static=True)

    def __init__(self, key, checkpointed=False):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        emb = eqx.nn.Embedding(20, 8, key=k1)
        head = eqx.nn.Linear(8, 20, use_bias=False, key=k2)
        self.shared = eqx.nn.Shared((emb, head), lambda p: p[1].weight, lambda p: p[0].weight)
        self.blocks = [Block(eqx.nn.Linear(8, 8, key=k)) for k in (k3, k4)]
        self.checkpointed = checkpointed

    def __call__(self, tok):
        emb, head = self.shared()
        x = emb(tok)
        for b in self.blocks:
            x = eqx.filter_checkpoint(b)(x) if self.checkpointed else b(x)
        return head(x)


TOKENS = jnp.arange(16) % 20


def _loss(model, tok):
    return jnp.mean(jax.vmap(model)(tok) ** 2)


def _loss_combined(d, s, tok):
    return _loss(eqx.combine(d, s), tok)


def _stages(ins: sowviz.Inspection, depth: int) -> set[str]:
    """The paths of the stages `depth` levels deep or less, no parameters."""
    paths = (ins.probe_path(p) for p in ins.probes)
    return {p for p in paths if p.count("/") < depth and not p.startswith("parameters")}


def _head_output(model: TiedLM) -> np.ndarray:
    """The tied unembedding's output per token, in plain JAX."""
    emb = model.shared.pytree[0].weight
    x = emb[TOKENS]
    for b in model.blocks:
        x = x + jnp.tanh(x @ b.lin.weight.T + b.lin.bias)
    return np.asarray(x @ emb.T)


@pytest.mark.parametrize("checkpointed", [False, True])
def test_a_shared_model_partitioned_and_combined_keeps_its_module_paths(checkpointed):
    model = TiedLM(jax.random.PRNGKey(0), checkpointed)
    whole = sowviz.inspect(_loss, model, TOKENS)
    combined = sowviz.inspect(_loss_combined, *eqx.partition(model, eqx.is_array), TOKENS)

    blocks = "checkpoint(blocks[0–1]: Block) (×2)" if checkpointed else "blocks[0–1]: Block (×2)"
    inner = ("shared[0]: Embedding", "shared[1]: Linear", blocks)
    assert {f"TiedLM/{x}" for x in inner} <= _stages(whole, 2)
    # the combined model is the array half's, named by its argument as without Shared
    assert {"d: TiedLM", *(f"d: TiedLM/{x}" for x in inner)} <= _stages(combined, 2)
    assert not {"Embedding", "Linear", "Block", "Block#2"} & {
        p.rpartition("/")[2].removeprefix("checkpoint(").removesuffix(")")
        for p in _stages(combined, 4)
    }
    block = "checkpoint(blocks[{}]: Block)" if checkpointed else "blocks[{}]: Block"
    for k in range(2):
        assert f"d: TiedLM/{blocks}/{block.format(k)}" in _stages(combined, 3)

    # the head is the tied unembedding: its stage carries its values, per token
    want = _head_output(model)
    got = combined.probe("d: TiedLM/shared[1]: Linear").summaries["primal"]
    np.testing.assert_allclose(got["max"], want.max(), rtol=1e-5)
    np.testing.assert_allclose(got["l2"], np.linalg.norm(want), rtol=1e-5)


def test_a_frozen_part_of_a_combined_model_is_still_named_from_the_model():
    """`eqx.partition` by a filter that leaves arrays in the static half (freezing the
    blocks): the combined model is neither half; it is named from itself, as before."""
    model = TiedLM(jax.random.PRNGKey(0))
    spec = jax.tree_util.tree_map(lambda _: False, model)
    spec = eqx.tree_at(lambda m: m.blocks, spec, replace=[True, True])
    ins = sowviz.inspect(_loss_combined, *eqx.partition(model, spec), TOKENS)
    stages = _stages(ins, 2)
    assert {"TiedLM/shared[0]: Embedding", "TiedLM/shared[1]: Linear"} <= stages
    assert not any(p.startswith(("d: ", "s: ")) for p in stages)


class Func(eqx.Module):
    mlp: eqx.nn.MLP

    def __call__(self, t, y, args):
        return self.mlp(y)


@pytest.mark.parametrize("adjoint", ["recursive", "backsolve"])
def test_a_diffrax_vector_field_draws_no_second_stage_of_its_class(adjoint):
    key = jax.random.PRNGKey(0)
    func = Func(eqx.nn.MLP(2, 2, 8, depth=2, activation=jax.nn.softplus, key=key))
    ts = jnp.linspace(0.0, 1.0, 5)
    adj = {
        "recursive": diffrax.RecursiveCheckpointAdjoint(),
        "backsolve": diffrax.BacksolveAdjoint(),
    }[adjoint]

    def loss(func, y0):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(func), diffrax.Euler(), ts[0], ts[-1], 0.25, y0,
            saveat=diffrax.SaveAt(ts=ts), adjoint=adj, max_steps=4,
        )  # fmt: skip
        return jnp.mean(sol.ys**2)

    ins = sowviz.inspect(loss, func, jnp.array([0.5, -0.3]))
    tails = {
        p.partition("vector_field: Func/")[2]
        for p in map(ins.probe_path, ins.probes)
        if "vector_field: Func/" in p
    }
    assert {"mlp: MLP", "mlp: MLP/layers[0]: Linear", "mlp: MLP/softplus"} <= tails
    assert not any("/Func" in t for t in tails), sorted(tails)


class RematBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x + jnp.tanh(nn.Dense(8, name="fc")(x))


class RematNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.remat_scan(RematBlock, lengths=(2, 3))(name="blocks")(x)


def test_linen_remat_scan_says_its_name_on_every_level():
    net, x = RematNet(), jnp.linspace(-1.0, 1.0, 32).reshape(4, 8)
    params = net.init(jax.random.PRNGKey(0), x)["params"]
    ins = sowviz.inspect(lambda p, x: jnp.mean(net.apply({"params": p}, x) ** 2), params, x)
    d = ins.to_dict()
    nodes = {n["id"]: n for n in d["nodes"]}
    (top,) = [n for n in d["nodes"] if n["label"] == "RematNet"]
    chain = []
    node = top
    for _ in range(4):
        (node,) = [n for n in nodes.values() if n["parent"] == node["id"]]
        chain.append((node["label"], node["kind"]))
    assert chain == [
        ("scan(blocks)", "scan"),
        ("checkpoint(blocks)", "remat"),
        ("scan(blocks)", "scan"),
        ("blocks", "scope"),
    ]
    # the outer scan's output is the network's: 6 residual blocks, in plain JAX
    h = x
    for i in range(2):
        for j in range(3):
            fc = jax.tree_util.tree_map(lambda a, i=i, j=j: a[i, j], params["blocks"]["fc"])
            h = h + jnp.tanh(h @ fc["kernel"] + fc["bias"])
    got = ins.probe("RematNet/scan(blocks)").summaries["primal"]
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(h)), rtol=1e-5)
