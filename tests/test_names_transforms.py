"""Labels and source lines of transformed functions: a scan over `jax.checkpoint` of a
lambda, `checkpoint_name`, named scopes and `jax.named_call` (where the user opened
them), `custom_vmap` (by the function, not its rule), Equinox's `filter_checkpoint`,
Haiku's `layer_stack` and `vmap`, Flax Linen's `nn.cond`."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name
from jax.custom_batching import custom_vmap
from test_calls import graph_of

import sowviz

_SOURCE = pathlib.Path(__file__).read_text().splitlines()


def _line_of(marker: str) -> int:
    """The line of this file that ends with the comment `# <marker>`."""
    (line,) = [k + 1 for k, text in enumerate(_SOURCE) if text.endswith(f"# {marker}")]
    return line


def _path(g, node) -> str:
    out = []
    while node.parent is not None:
        out.append(node.label)
        node = g.node(node.parent)
    return " > ".join(reversed(out))


def _paths(g) -> list[str]:
    return [_path(g, n) for n in g.nodes if n.kind not in ("eqn", "input", "output")]


def _node(g, label):
    (node,) = [n for n in g.nodes if n.label == label]
    return node


# -- scan over jax.checkpoint of a lambda ---------------------------------------------


def _block(p, x):
    return x + jnp.tanh(x @ p)


def _scan_remat_loss(ps, x):
    h, _ = jax.lax.scan(jax.checkpoint(lambda h, p: (_block(p, h), None)), x, ps)
    return jnp.sum(h**2)


def test_a_scan_over_a_checkpointed_lambda_is_named_by_the_function_it_calls():
    # the scan-over-layers idiom with remat drew `scan` > `checkpoint` > bare equations,
    # while the same scan without `jax.checkpoint` is `scan(_block)`
    ps = jnp.stack([jnp.eye(4) * 0.1] * 3)
    x = jnp.ones((2, 4))
    g = graph_of(_scan_remat_loss, ps, x)
    assert "scan(_block) > checkpoint(_block)" in _paths(g), _paths(g)
    assert not [n for n in g.nodes if n.label in ("scan", "checkpoint")]


# -- checkpoint_name ---------------------------------------------------------------


def _named_loss(w, x):
    h = checkpoint_name(x @ w, "proj_in")
    return jnp.sum(jnp.tanh(h) ** 2)


def test_a_checkpoint_name_is_drawn_by_the_name_it_gives():
    w = jnp.arange(12.0).reshape(3, 4) / 10
    x = jnp.ones((2, 3))
    ins = sowviz.inspect(_named_loss, w, x, mode="grad", capture="all")
    node = _node(ins.graph, "proj_in")
    assert node.kind == "eqn" and node.primitive == "name"
    assert not [n for n in ins.graph.nodes if n.label == "name"]
    # its box holds that value and its gradient
    h = np.asarray(x) @ np.asarray(w)
    got = ins.probe("proj_in").summaries
    np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(h), rtol=1e-6)
    dh = 2 * np.tanh(h) * (1 - np.tanh(h) ** 2)
    np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(dh), rtol=1e-5)


# -- where named scopes and named calls are -----------------------------------------


def _norm(x):
    return x / jnp.sqrt(jnp.mean(x**2) + 1e-6)


def _attention(w, x):
    return jnp.tanh(x @ w)


def _scoped_loss(w, x):
    with jax.named_scope("attn"):
        x = x + jax.named_call(_attention, name="self_attention")(w, _norm(x))  # called
    for i in range(2):
        with jax.named_scope(f"layer_{i}"):
            x = _norm(x) * 2.0  # layer line
    return jnp.sum(x**2)


def test_a_named_scope_is_sourced_where_it_is_opened_and_a_named_call_where_called():
    # `attn`'s first equation is in `_norm`, `self_attention`'s in `_attention`: those
    # lines are not where the user named the stages, the `with` block's line is
    g = graph_of(_scoped_loss, jnp.eye(4), jnp.ones((2, 4)))
    assert _node(g, "attn").source.line == _line_of("called")
    assert _node(g, "self_attention").source.line == _line_of("called")
    assert _node(g, "layer_0").source.line == _line_of("layer line")  # (an f-string)
    assert _node(g, "layer_1").source.line == _line_of("layer line")


@custom_vmap
def _row_scale(x):
    return x / (1.0 + jnp.abs(x).sum())


@_row_scale.def_vmap
def _rs_rule(axis_size, in_batched, xs):
    return xs / (1.0 + jnp.abs(xs).sum(-1, keepdims=True)), in_batched[0]


def _vmapped_loss(x):
    return jnp.sum(jax.vmap(_row_scale)(jnp.tanh(x)) ** 2)


def test_a_custom_vmap_stage_is_named_by_its_function_not_its_rule():
    x = jnp.arange(8.0).reshape(2, 4) / 8
    g = graph_of(_vmapped_loss, x)
    labels = [n.label for n in g.nodes]
    assert "_row_scale" in labels and "_rs_rule" not in labels, labels


# -- Equinox ------------------------------------------------------------------------


def test_a_module_under_filter_checkpoint_is_sourced_at_its_call():
    eqx = pytest.importorskip("equinox")

    class Block(eqx.Module):
        lin: eqx.nn.Linear

        def __call__(self, x):
            return x + jax.nn.relu(self.lin(x))

    class Model(eqx.Module):
        blocks: list

        def __call__(self, x):
            for b in self.blocks:
                x = eqx.filter_checkpoint(b)(x)  # checkpointed block
            return x.sum()

    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    model = Model([Block(eqx.nn.Linear(4, 4, key=k)) for k in keys])
    ins = sowviz.inspect(lambda m, x: m(x), model, jnp.ones(4), mode="primal")
    blocks = [n for n in ins.graph.nodes if n.label.endswith(": Block")]
    assert len(blocks) == 2, [n.label for n in ins.graph.nodes]
    for n in blocks:  # was `equinox/_ad.py:1182`, inside Equinox's wrapper
        assert n.source.file.endswith("test_names_transforms.py"), n.source
        assert n.source.line == _line_of("checkpointed block"), n.source


# -- Haiku ---------------------------------------------------------------------------


def test_a_haiku_layer_stack_is_named_by_its_layer_function():
    hk = pytest.importorskip("haiku")

    def block(x):
        return x + jnp.tanh(hk.Linear(8, name="dense")(x))

    m = hk.without_apply_rng(hk.transform(lambda x: hk.layer_stack(3, name="layers")(block)(x)))
    x = jnp.ones((2, 8))
    params = m.init(jax.random.PRNGKey(0), x)
    ins = sowviz.inspect(lambda p, x: jnp.mean(m.apply(p, x) ** 2), params, x, mode="primal")
    (scan,) = [n for n in ins.graph.nodes if n.kind == "scan"]
    assert scan.label == "scan(block)"


def _ensemble(hk, bigger: bool):
    def forward(x):
        def member(x):
            return hk.nets.MLP([8, 1], name="member")(x)

        ens = hk.vmap(member, in_axes=0, split_rng=(not hk.running_init()))
        preds = ens(jnp.broadcast_to(x, (3, *x.shape)))  # preds line
        if bigger:  # a level big enough to fold its lines
            h = x
            for k in range(4):
                h = jnp.tanh(hk.Linear(4, name=f"extra_{k}")(h)) * 0.5 + h
            return preds.mean(0) + h.sum(-1, keepdims=True)
        return preds.mean(0)

    return hk.transform(forward)


@pytest.mark.parametrize("bigger", [False, True])
def test_haiku_vmap_s_rng_split_is_its_box_not_the_line_s_value(bigger):
    # drawn `mapped_fun` (Haiku's closure), or at a bigger level `preds`, the name of
    # the value the line assigns, on a box holding the RNG split and `broadcast_to`'s
    # f32[3,8,4], while the real `preds` is the `member` box
    hk = pytest.importorskip("haiku")
    m = _ensemble(hk, bigger)
    x = jax.random.normal(jax.random.PRNGKey(1), (8, 4))
    params = m.init(jax.random.PRNGKey(0), x)

    def loss(p, x):
        return jnp.mean(m.apply(p, jax.random.PRNGKey(5), x) ** 2)

    ins = sowviz.inspect(loss, params, x, mode="primal")
    labels = [n.label for n in ins.graph.nodes]
    assert "mapped_fun" not in labels and "preds" not in labels, labels
    plumbing = _node(ins.graph, "hk.vmap")
    inside = sorted({c.label for c in ins.graph.children(plumbing.id)})
    assert "random_split" in inside and "broadcast_in_dim" not in inside, inside
    member = _node(ins.graph, "member")
    assert member.shapes == ("float32[3,8,1]",)


# -- Flax Linen ----------------------------------------------------------------------


def test_linen_cond_branches_are_named_by_the_modules_they_call():
    nn = pytest.importorskip("flax.linen")

    class Model(nn.Module):
        def setup(self):
            self.head_a = nn.Dense(1)
            self.head_b = nn.Dense(1)

        def __call__(self, x, flag):
            if self.is_initializing():
                return self.head_a(x) + self.head_b(x)
            return nn.cond(flag, lambda m, h: m.head_a(h), lambda m, h: m.head_b(h), self, x)

    m = Model()
    x = jnp.ones((4, 3))
    params = m.init(jax.random.PRNGKey(0), x, True)["params"]
    ins = sowviz.inspect(
        lambda p, x, f: jnp.mean(m.apply({"params": p}, x, f) ** 2),
        params,
        x,
        jnp.asarray(True),
        mode="primal",
    )
    paths = _paths(ins.graph)
    assert "Model > cond > branch 0: head_b > head_b" in paths, paths
    assert "Model > cond > branch 1: head_a > head_a" in paths, paths
    assert not [p for p in paths if "branch_wrapper" in p or "<lambda>" in p], paths
    want = np.mean((np.asarray(x) @ params["head_a"]["kernel"] + params["head_a"]["bias"]) ** 2)
    np.testing.assert_allclose(ins.result, want, rtol=1e-6)
