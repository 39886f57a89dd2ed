"""Module stages inside framework transforms: `nnx.scan` over stacked layers,
`nnx.vmap` ensembles, `nnx.remat`, and Equinox's scan-over-layers idiom call a *copy*
of a module rebuilt from its state. Its stage is named by the module's path in the
model (`layers` > `linear`), matched by structure; the values drawn there are the
ones a plain Python loop over the layers computes."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import sowviz

from .checks import assert_value_and_grad, probes_carrying

D, N = 8, 3
X = jax.random.normal(jax.random.PRNGKey(7), (2, 4))


def _paths(graph) -> list[str]:
    """The stage nodes' paths of labels, root left out ("Model/scan(forward)/layers")."""
    nodes = {n.id: n for n in graph.nodes}
    out = []
    for n in graph.nodes:
        if n.kind in ("eqn", "input", "output") or n.parent is None:
            continue
        labels, cur = [], n
        while cur.parent is not None:
            labels.append(cur.label)
            cur = nodes[cur.parent]
        out.append("/".join(reversed(labels)))
    return out


def _stage_carrying(ins, value) -> set[str]:
    """Labels of the stages whose probe carries `value` (shape, l2, mean)."""
    return {ins.graph.node(p.node).label for p in probes_carrying(ins, value)}


class NnxBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(D, rngs=rngs)
        self.linear = nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x):
        return x + jnp.tanh(self.linear(self.norm(x)))


class NnxModel(nnx.Module):
    """Flax's scan-over-layers idiom: blocks made by `nnx.vmap`, applied by `nnx.scan`."""

    def __init__(self, rngs: nnx.Rngs):
        self.embed = nnx.Linear(4, D, rngs=rngs)

        @nnx.split_rngs(splits=N)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return NnxBlock(rngs)

        self.layers = make(rngs)
        self.head = nnx.Linear(D, 1, rngs=rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def forward(x, layer):
            return layer(x)

        return self.head(forward(self.embed(x), self.layers))


def _nnx_loss(model, x):
    return jnp.mean(model(x) ** 2)


def test_nnx_scan_over_layers_names_the_stacked_layers():
    model = NnxModel(nnx.Rngs(0))
    ins = sowviz.inspect(_nnx_loss, model, X, mode="grad")
    assert_value_and_grad(ins.result, *nnx.value_and_grad(_nnx_loss)(model, X))
    stages = _paths(ins.graph)
    for path in ("layers", "layers/norm", "layers/linear"):
        assert f"NnxModel/scan(forward)/{path}" in stages, sorted(stages)
    assert not [p for p in stages if p.endswith(("NnxBlock", "/Linear", "/LayerNorm"))]
    # The `layers` stage carries every layer's output, as a loop over the slices gives.
    graphdef, state = nnx.split(model.layers)
    h, outs = model.embed(X), []
    for i in range(N):
        h = nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state))(h)
        outs.append(h)
    assert "layers" in _stage_carrying(ins, np.stack(outs))


class NnxEnsemble(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.pre = nnx.Linear(4, 4, rngs=rngs)

        @nnx.split_rngs(splits=5)
        @nnx.vmap
        def make(rngs):
            return nnx.Linear(4, 1, rngs=rngs)

        self.members = make(rngs)

    def __call__(self, x):
        return nnx.vmap(lambda m, x: m(x), in_axes=(0, None))(self.members, self.pre(x))


def test_nnx_vmap_ensemble_members_are_named():
    model = NnxEnsemble(nnx.Rngs(1))
    ins = sowviz.inspect(lambda m, x: jnp.mean(m(x)), model, X, mode="primal")
    stages = _paths(ins.graph)
    assert "NnxEnsemble/members" in stages and "NnxEnsemble/pre" in stages, sorted(stages)
    assert "members" in _stage_carrying(ins, model(X))


class NnxTwo(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, out: int):
        self.a = nnx.Linear(4, 4, rngs=rngs)
        self.b = nnx.Linear(4, out, rngs=rngs)

    def __call__(self, x):
        return nnx.remat(lambda m, x: m.b(m.a(x)))(self, x)


def test_alike_copies_are_told_apart_by_shapes_or_by_the_parameters_they_read():
    # `nnx.remat` over the whole model: `a` and `b` are both `Linear`s. Shapes that
    # differ tell the copies apart; alike ones, the parameters their stages read.
    for out in (3, 4):
        model = NnxTwo(nnx.Rngs(2), out=out)
        ins = sowviz.inspect(lambda m, x: jnp.sum(m(x)), model, X, mode="primal")
        inside = [p for p in _paths(ins.graph) if p.startswith("NnxTwo/checkpoint/")]
        assert inside == ["NnxTwo/checkpoint/a", "NnxTwo/checkpoint/b"], inside
        assert _stage_carrying(ins, model.a(X)) == {"a"}
        assert "b" in _stage_carrying(ins, model(X))


class NnxRematBlocks(nnx.Module):
    """Identical blocks, each through `nnx.remat` (one traced body for all three)."""

    def __init__(self, rngs: nnx.Rngs):
        self.blocks = nnx.List([NnxBlock(rngs) for _ in range(N)])

    def __call__(self, x):
        @nnx.remat
        def forward(block, x):
            return block(x)

        for block in self.blocks:
            x = forward(block, x)
        return x


def _inspected(model, seed: int):
    """`model`'s loss inspected in grad mode on a fresh input, checked against
    `nnx.value_and_grad`; the inspection and the input."""
    h = jax.random.normal(jax.random.PRNGKey(seed), (2, D))
    ins = sowviz.inspect(_nnx_loss, model, h, mode="grad")
    assert_value_and_grad(ins.result, *nnx.value_and_grad(_nnx_loss)(model, h))
    return ins, h


def test_nnx_remat_per_layer_names_each_layer():
    model = NnxRematBlocks(nnx.Rngs(4))
    ins, h = _inspected(model, 5)
    stages = _paths(ins.graph)
    outs = []
    for i, block in enumerate(model.blocks):
        h = block(h)
        outs.append(h)
        # alike blocks in a row are drawn as one stacked node holding each, and a
        # checkpoint of one module's call says which
        path = f"NnxRematBlocks/checkpoint(blocks[0–2]) (×{N})/checkpoint(blocks[{i}])/blocks[{i}]"
        assert path in stages and f"{path}/linear" in stages, sorted(stages)
    for i, out in enumerate(outs):
        assert f"blocks[{i}]" in _stage_carrying(ins, out)


class EqxBlock(eqx.Module):
    norm: eqx.nn.LayerNorm
    linear: eqx.nn.Linear

    def __init__(self, key):
        self.norm = eqx.nn.LayerNorm(D)
        self.linear = eqx.nn.Linear(D, D, key=key)

    def __call__(self, x):
        return x + jnp.tanh(self.linear(self.norm(x)))


class EqxModel(eqx.Module):
    """Equinox's scan-over-layers idiom: `filter_vmap` to make, `lax.scan` over the
    arrays with `eqx.combine` inside to apply."""

    embed: eqx.nn.Linear
    layers: EqxBlock

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.embed = eqx.nn.Linear(4, D, key=k1)
        self.layers = eqx.filter_vmap(EqxBlock)(jax.random.split(k2, N))

    def __call__(self, x):
        dynamic, static = eqx.partition(self.layers, eqx.is_array)

        def step(h, layer_arrays):
            return eqx.combine(layer_arrays, static)(h), None

        return jax.lax.scan(step, self.embed(x), dynamic)[0]


def test_equinox_scan_over_layers_names_the_stacked_layers():
    model = EqxModel(jax.random.PRNGKey(3))
    x = X[0]
    ins = sowviz.inspect(lambda m, x: jnp.sum(m(x) ** 2), model, x, mode="grad")
    stages = _paths(ins.graph)
    for path in ("layers: EqxBlock", "layers: EqxBlock/norm: LayerNorm"):
        assert f"EqxModel/scan(step)/{path}" in stages, sorted(stages)
    assert "EqxModel/scan(step)/layers: EqxBlock/linear: Linear" in stages
    dynamic, static = eqx.partition(model.layers, eqx.is_array)
    h, outs = model.embed(x), []
    for i in range(N):
        h = eqx.combine(jax.tree.map(lambda a, i=i: a[i], dynamic), static)(h)
        outs.append(h)
    assert "layers: EqxBlock" in _stage_carrying(ins, np.stack(outs))


class EqxCheckpointed(eqx.Module):
    """Equinox's gradient checkpointing per layer, over identical blocks."""

    blocks: list
    act: eqx.nn.Lambda
    act2: eqx.nn.Lambda

    def __init__(self, key):
        self.blocks = [EqxBlock(k) for k in jax.random.split(key, N)]
        self.act, self.act2 = eqx.nn.Lambda(jnp.tanh), eqx.nn.Lambda(jnp.tanh)

    def __call__(self, x):
        for block in self.blocks:
            x = eqx.filter_checkpoint(block)(x)
        # two modules alike with nothing of their own to read: named alike, numbered
        return eqx.filter_checkpoint(self.act)(x) + eqx.filter_checkpoint(self.act2)(x)


def test_equinox_checkpoint_per_layer_names_each_layer():
    model = EqxCheckpointed(jax.random.PRNGKey(6))
    x = X[0] @ jnp.ones((4, D))

    def loss(m, x):
        return jnp.sum(m(x) ** 2)

    ins = sowviz.inspect(loss, model, x, mode="grad")
    assert_value_and_grad(ins.result, *eqx.filter_value_and_grad(loss)(model, x))
    stages = _paths(ins.graph)
    h = x
    for i, block in enumerate(model.blocks):
        h = block(h)
        assert any(p.endswith(f"/blocks[{i}]: EqxBlock") for p in stages), sorted(stages)
        assert f"blocks[{i}]: EqxBlock" in _stage_carrying(ins, h)
    # (an `eqx.nn.Lambda` of a JAX function is named by it)
    lambdas = sorted(p.rsplit("/", 1)[-1] for p in stages if "tanh" in p.rsplit("/", 1)[-1])
    assert lambdas == ["checkpoint(tanh#2)", "checkpoint(tanh)", "tanh", "tanh#2"], lambdas


def test_equinox_checkpointed_blocks_passed_as_a_list_are_named_by_their_argument():
    # `loss(blocks, x)` with a plain list of modules: each is a root named by its
    # argument (`blocks[1]: EqxBlock`); checkpointed, each copy was `EqxBlock#2` and its
    # checkpoint `checkpoint(fun_checkpoint)(EqxBlock#2)`, Equinox's own wrapper named.
    blocks = [EqxBlock(k) for k in jax.random.split(jax.random.PRNGKey(9), 3)]
    x = X[0] @ jnp.ones((4, D))

    def loss(blocks, x):
        for b in blocks:
            x = eqx.filter_checkpoint(b)(x)
        return jnp.sum(x**2)

    ins = sowviz.inspect(loss, blocks, x, mode="grad")
    assert_value_and_grad(ins.result, *eqx.filter_value_and_grad(loss)(blocks, x))
    stages = _paths(ins.graph)
    assert not any("fun_checkpoint" in p or "#" in p for p in stages), stages
    h = x
    for i, block in enumerate(blocks):
        h = block(h)
        name = f"blocks[{i}]: EqxBlock"
        assert any(p.endswith(f"checkpoint({name})/{name}") for p in stages), stages
        assert name in _stage_carrying(ins, h)


class NnxScanBesideOneLike(nnx.Module):
    """A stack of `Linear(D, D)` scanned, beside one unstacked `Linear(D, D)`: a scanned
    layer's shapes are also that module's."""

    def __init__(self, rngs: nnx.Rngs):
        @nnx.split_rngs(splits=N)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return nnx.Linear(D, D, rngs=rngs)

        self.layers = make(rngs)
        self.out = nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
        def forward(x, layer):
            y = jnp.tanh(layer(x))
            return y, y

        x, _ = forward(x, self.layers)
        return self.out(x)


def test_a_scanned_layer_shaped_like_another_module_is_named_by_what_it_reads():
    model = NnxScanBesideOneLike(nnx.Rngs(8))
    ins, h = _inspected(model, 9)
    graphdef, state = nnx.split(model.layers)
    outs = []
    for i in range(N):  # each layer's output, as its stage inside the scan stacks them
        outs.append(nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state))(h))
        h = jnp.tanh(outs[-1])
    assert _stage_carrying(ins, np.stack(outs)) == {"layers"}
    assert _stage_carrying(ins, model.out(h)) >= {"out"}
    stages = _paths(ins.graph)
    assert "NnxScanBesideOneLike/scan(forward)/layers" in stages, sorted(stages)


class NnxRematReordered(nnx.Module):
    """Alike blocks through `nnx.remat`, in another order, one of them twice: each
    call after the first reads the block's parameters as the last `nnx.remat` of it
    handed them back."""

    def __init__(self, rngs: nnx.Rngs):
        self.blocks = nnx.List([NnxBlock(rngs) for _ in range(N)])

    def __call__(self, x):
        for i in (2, 1, 0, 0):
            x = nnx.remat(lambda block, x: block(x))(self.blocks[i], x)
        return x


def test_nnx_remat_in_any_order_names_each_call_and_probes_its_output_only():
    model = NnxRematReordered(nnx.Rngs(10))
    ins, h = _inspected(model, 11)
    remats = [n for n in ins.graph.nodes if n.kind == "remat"]
    assert [ins.graph.children(n.id)[0].label for n in remats] == [
        "blocks[2]",
        "blocks[1]",
        "blocks[0]",
        "blocks[0]",
    ]
    for node, i in zip(remats, (2, 1, 0, 0), strict=True):
        h = model.blocks[i](h)
        # the checkpoint hands the block's parameters back too: those are not its news
        (probe,) = [p for p in ins.probes if p.node == node.id]
        assert probe.leaf == "" and probe.summaries["primal"]["shape"] == [2, D]
        np.testing.assert_allclose(
            probe.summaries["primal"]["l2"], np.linalg.norm(np.asarray(h)), rtol=1e-4
        )


class Small(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(4, D, rngs=rngs)
        self.l2 = nnx.Linear(D, 2, rngs=rngs)

    def __call__(self, x):
        return self.l2(jnp.tanh(self.l1(x)))


def _distill(student, teacher, x):
    t = nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(teacher, x[None])[0]
    return jnp.mean((nnx.remat(lambda m, x: m(x))(student, x) - jax.lax.stop_gradient(t)) ** 2)


def test_several_models_are_named_by_their_arguments():
    # A student and its teacher of one class: each model's stage says which it is,
    # called directly or through a transform (a copy of either).
    student, teacher = Small(nnx.Rngs(12)), Small(nnx.Rngs(13))
    ins = sowviz.inspect(_distill, student, teacher, X, mode="grad")
    assert_value_and_grad(ins.result, *nnx.value_and_grad(_distill)(student, teacher, X))
    assert _stage_carrying(ins, teacher(X)[None]) >= {"teacher: Small"}
    assert _stage_carrying(ins, student(X)) >= {"student: Small"}
    assert _stage_carrying(ins, student.l1(X)) == {"l1"}
    stages = _paths(ins.graph)
    assert {"teacher: Small/l1", "checkpoint(student: Small)/student: Small/l2"} <= set(stages)

    def plain(a, b, x):
        return jnp.sum(a(x) * b(x))

    ins = sowviz.inspect(plain, student, teacher, X, mode="grad")
    assert {"a: Small/l1", "b: Small/l1"} <= set(_paths(ins.graph))
    assert _stage_carrying(ins, teacher.l1(X)) == {"l1"}
    (b_l1,) = [p for p in ins.probes if ins.probe_path(p) == "b: Small/l1"]
    np.testing.assert_allclose(
        b_l1.summaries["primal"]["l2"], np.linalg.norm(np.asarray(teacher.l1(X))), rtol=1e-4
    )


def test_a_module_shared_by_two_paths_is_refused_with_the_split_state_fix():
    # `self.b = self.a`: a pytree (as `jax.jit` sees the model) holds a copy per path,
    # so the gradient would come apart; the error says so and the fix it gives is exact.
    class Twice(nnx.Module):
        def __init__(self, rngs):
            self.a = nnx.Linear(3, 3, rngs=rngs)
            self.b = self.a  # tied

        def __call__(self, x):
            return self.b(jnp.tanh(self.a(x)))

    def loss(m, x):
        return jnp.sum(m(x) ** 2)

    model, x = Twice(nnx.Rngs(0)), jnp.ones((2, 3))
    with pytest.raises(
        ValueError,
        match=r"`args\[0\]\.a\.bias.*` and `args\[0\]\.b\.bias.*` are one `nnx.Variable`",
    ):
        sowviz.inspect(loss, model, x)
    with pytest.raises(ValueError, match=r"nnx\.split"):
        sowviz.Monitor(loss).step(model, x)
    graphdef, state = nnx.split(model)

    def loss_of_state(state, x):
        return loss(nnx.merge(graphdef, state), x)

    ins = sowviz.inspect(loss_of_state, state, x)
    value, grads = nnx.value_and_grad(loss)(model, x)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(
        ins.result[1]["a"]["kernel"][...], grads["a"]["kernel"][...], rtol=1e-5
    )
