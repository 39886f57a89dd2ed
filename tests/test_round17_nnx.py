"""Round 17, Flax NNX: `nnx.scan(nnx.remat(f))` shows its carry, not the parameters it
hands back, and is `scan(f) > checkpoint(f)`; input leaves carry their NNX variable
type; `jax.nn.relu`'s custom rule makes no note."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

nnx = pytest.importorskip("flax.nnx")


class Block(nnx.Module):
    def __init__(self, d, rngs):
        self.lin = nnx.Linear(d, d, rngs=rngs)

    def __call__(self, x):
        return x + jnp.tanh(self.lin(x))


class Stack(nnx.Module):
    def __init__(self, d, n, rngs):
        @nnx.split_rngs(splits=n)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def create_block(rngs):
            return Block(d, rngs)

        self.blocks = create_block(rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        @nnx.remat
        def forward(x, block):
            return block(x)

        return forward(x, self.blocks)


def _stack_loss(m, x):
    return jnp.sum(m(x) ** 2)


def test_scan_of_remat_shows_the_carry_and_names_the_users_function():
    model = Stack(8, 3, nnx.Rngs(0))
    x = jnp.linspace(-1.0, 1.0, 16).reshape(2, 8)
    ins = sowviz.inspect(_stack_loss, model, x)
    d = ins.to_dict()
    by_label = {n["label"]: n for n in d["nodes"] if n["kind"] in ("scan", "remat")}
    assert set(by_label) == {"scan(forward)", "checkpoint(forward)"}, sorted(by_label)
    # only the carry: not the 2 stacked parameters nnx.scan hands back unchanged
    assert by_label["scan(forward)"]["shapes"] == ["float32[2,8]"]
    assert by_label["checkpoint(forward)"]["shapes"] == ["float32[2,8]"]
    # the scan's value is the stack's output, by hand
    h = x
    for i in range(3):
        lin = model.blocks.lin
        h = h + jnp.tanh(h @ lin.kernel[...][i] + lin.bias[...][i])
    (p,) = [q for q in ins.probes if q.node == by_label["scan(forward)"]["id"]]
    np.testing.assert_allclose(p.summaries["primal"]["l2"], float(jnp.linalg.norm(h)), rtol=1e-5)
    loss, grads = nnx.value_and_grad(_stack_loss)(model, x)
    np.testing.assert_allclose(ins.result[0], loss, rtol=1e-6)
    np.testing.assert_allclose(
        ins.result[1].blocks.lin.kernel[...], grads["blocks"]["lin"]["kernel"][...], atol=1e-6
    )


class LoRAMLP(nnx.Module):
    def __init__(self, rngs):
        self.fc1 = nnx.LoRALinear(4, 8, lora_rank=2, rngs=rngs)
        self.bn = nnx.BatchNorm(8, rngs=rngs)
        self.out = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.bn(self.fc1(x))))


def _lora_loss(model, x):
    return jnp.mean(model(x) ** 2)


def _model():
    model = LoRAMLP(nnx.Rngs(0))
    lora = model.fc1.lora
    lora.lora_b[...] = jax.random.normal(jax.random.key(7), lora.lora_b[...].shape) * 0.1
    return model


X = jax.random.normal(jax.random.key(1), (16, 4))


def _inputs(d):
    nodes = {n["id"]: n for n in d["nodes"]}

    def path(n):
        out = []
        while n["parent"] is not None:
            out.insert(0, n["label"])
            n = nodes[n["parent"]]
        return "/".join(out)

    return {path(n): n for n in d["nodes"] if n["kind"] == "input"}


def test_input_leaves_carry_their_nnx_variable_type():
    ins = sowviz.inspect(_lora_loss, _model(), X)
    types = {k: n.get("var_type") for k, n in _inputs(ins.to_dict()).items()}
    assert types["parameters/fc1/lora/lora_a"] == "LoRAParam", types
    assert types["parameters/fc1/kernel"] == "Param", types
    assert types["model state/bn/mean"] == "BatchStat", types
    assert types["x"] is None


def test_split_lora_model_frozen_group_has_types_and_no_gradient():
    model = _model()
    graphdef, trained, frozen = nnx.split(model, nnx.LoRAParam, ...)

    def loss_of(trained, frozen, x):
        return _lora_loss(nnx.merge(graphdef, trained, frozen), x)

    ins = sowviz.inspect(loss_of, trained, frozen, X)
    d = ins.to_dict()
    inputs = _inputs(d)
    probes = {p["node"]: p for p in d["probes"]}
    frozen_leaves = {k: n for k, n in inputs.items() if k.startswith("frozen/")}
    assert {n.get("var_type") for n in frozen_leaves.values()} == {"Param", "BatchStat"}
    for n in frozen_leaves.values():  # why the table's ‖grad‖ reads "—"
        assert "cotangent" not in probes[n["id"]]["summaries"]
        ok = "independent" if n["var_type"] == "Param" else ("independent", "unreached")
        assert probes[n["id"]].get("no_cotangent") in ok
    # the trained leaves' gradients are nnx.value_and_grad's with DiffState
    _, want = nnx.value_and_grad(_lora_loss, argnums=nnx.DiffState(0, nnx.LoRAParam))(model, X)
    (a,) = [n for k, n in inputs.items() if k.startswith("parameters/") and k.endswith("lora_a")]
    assert a["var_type"] == "LoRAParam"
    got = probes[a["id"]]["summaries"]["cotangent"]["l2"]
    ref = float(jnp.linalg.norm(want["fc1"]["lora"]["lora_a"][...]))
    np.testing.assert_allclose(got, ref, rtol=1e-5)


@jax.custom_jvp
def _soft_clip(x):
    return jnp.tanh(x) * 2.0


@_soft_clip.defjvp
def _soft_clip_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _soft_clip(x), t


def test_jax_nn_relu_makes_no_custom_rule_note_but_a_users_rule_does():
    model = _model()
    model.eval()
    ins = sowviz.inspect(_lora_loss, model, X)
    assert not [n for n in ins.notes if "custom_jvp_call" in n["message"]], ins.notes

    def own(x):
        return jnp.sum(_soft_clip(jnp.sin(x) * 3.0))

    x = jnp.linspace(-1.0, 1.0, 5)
    ins2 = sowviz.inspect(own, x, capture="all")
    notes = [n for n in ins2.notes if "custom_jvp_call" in n["message"]]
    assert len(notes) == 1 and "_soft_clip" in notes[0]["message"], ins2.notes
    np.testing.assert_allclose(ins2.result[1], jax.grad(own)(x), rtol=1e-6)
