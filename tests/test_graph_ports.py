"""Where a lifted edge's values start and end inside stages (`Edge.ends`), and the ports
an opened stage draws from them: a residual block's skip (its input read by `conv1`
and by the `add`) is one edge `stem -> block` at the level above, and was not drawn
inside the opened block."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import sowviz
from sowviz.graph.model import Edge, StageGraph


class Block(nnx.Module):
    def __init__(self, rngs):
        self.conv1 = nnx.Conv(4, 4, (3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(4, 4, (3, 3), rngs=rngs)

    def __call__(self, x):
        return nnx.relu(x + self.conv2(nnx.relu(self.conv1(x))))


class Net(nnx.Module):
    def __init__(self, rngs):
        self.stem = nnx.Conv(1, 4, (3, 3), rngs=rngs)
        self.block = Block(rngs)

    def __call__(self, x):
        return self.block(self.stem(x)).mean()


def _resnet() -> sowviz.Inspection:
    return sowviz.inspect(lambda m, x: m(x), Net(nnx.Rngs(0)), jnp.ones((2, 8, 8, 1)))


def _path(g: StageGraph, node_id: str) -> str:
    """A node's labels from the top stage down (`Net/block/conv1/conv_general_dilated`)."""
    out = []
    node = g.node(node_id)
    while node.parent is not None:
        out.append(node.label)
        node = g.node(node.parent)
    return "/".join(reversed(out))


def _edge(g: StageGraph, source: str, target: str) -> Edge:
    (e,) = [e for e in g.edges if (_path(g, e.source), _path(g, e.target)) == (source, target)]
    return e


def _ends(g: StageGraph, e: Edge) -> set[tuple[str, str]]:
    return {(_path(g, s), _path(g, t)) for s, t in e.ends}


@pytest.fixture(scope="module")
def resnet():
    return _resnet()


def test_a_residual_blocks_input_reaches_conv1_and_the_add(resnet):
    g = resnet.graph
    # one edge at Net's level, standing for the stem's output read twice in the block
    e = _edge(g, "Net/stem", "Net/block")
    assert _ends(g, e) == {
        ("Net/stem/add", "Net/block/conv1/conv_general_dilated"),
        ("Net/stem/add", "Net/block/add"),
    }
    # into a custom rule's body (the `relu`'s `max`), out of the block from its last relu
    assert _ends(g, _edge(g, "Net/block/conv1", "Net/block/relu")) == {
        ("Net/block/conv1/add", "Net/block/relu/max")
    }
    assert _ends(g, _edge(g, "Net/block", "Net/mean")) == {
        ("Net/block/relu#2/max", "Net/mean/reduce_sum")
    }
    assert _ends(g, _edge(g, "x", "Net")) == {("x", "Net/stem/conv_general_dilated")}


def test_the_parameters_and_edges_between_their_own_ends_carry_none(resnet):
    g = resnet.graph
    params = [e for e in g.edges if g.node(e.source).label == "parameters"]
    assert params and all(e.ends == () for e in params)  # every module reads its weights
    direct = _edge(g, "Net/stem/conv_general_dilated", "Net/stem/add")
    assert direct.ends == ()
    d = resnet.to_dict()
    assert all("ends" not in e for e in d["edges"] if not _ends(g, _find(g, e)))
    (skip,) = [e for e in d["edges"] if e["target"] == _edge(g, "Net/stem", "Net/block").target]
    assert sorted(map(tuple, skip["ends"])) == sorted(_edge(g, "Net/stem", "Net/block").ends)


def _find(g: StageGraph, d: dict) -> Edge:
    (e,) = [e for e in g.edges if (e.source, e.target) == (d["source"], d["target"])]
    return e


def test_a_scan_body_reads_its_carry_and_slices_from_outside():
    def loss(w, xs):
        def cell(h, x):
            return h + jnp.tanh(h @ w + x), h

        h, ys = jax.lax.scan(cell, jnp.zeros(3), xs)
        return jnp.sum(h) + jnp.sum(ys)

    g = sowviz.inspect(loss, jnp.eye(3), jnp.ones((4, 3))).graph
    (scan,) = [n for n in g.nodes if n.kind == "scan"]
    dot, inner_add, _, carry_add = [n.id for n in g.nodes if n.parent == scan.id]
    into = {(g.node(s).label, t) for e in g.edges if e.target == scan.id for s, t in e.ends}
    # the carry's zeros read by `h @ w` and `h + ...`, the slices by `... + x`; not `w`
    # (an argument differentiated: a weight, as every module reads its own)
    assert into == {("broadcast_in_dim", dot), ("broadcast_in_dim", carry_add), ("xs", inner_add)}
    # the final carry leaves from the body's `h + ...`; `ys` is the carry passed through
    out = {(s, g.node(t).label) for e in g.edges if e.source == scan.id for s, t in e.ends}
    assert out == {(carry_add, "reduce_sum"), (scan.id, "reduce_sum")}


def test_a_while_loops_carry_enters_and_leaves_its_body_not_its_test():
    def fn(x):
        h = jax.lax.while_loop(lambda a: a.sum() < 100, lambda a: a * 2 + x, x)
        return jnp.sum(h)

    g = sowviz.inspect(fn, jnp.ones(3), mode="primal").graph
    (loop,) = [n for n in g.nodes if n.kind == "while"]
    pairs = {
        (g.node(s).label, g.node(t).label)
        for e in g.edges
        if loop.id in (e.source, e.target)
        for s, t in e.ends
    }
    # `x` the initial carry (read by `a * 2`) and the constant `x` (read by `+ x`); the
    # result made by the body's `add`, not the condition's `lt`
    assert pairs == {("x", "mul"), ("x", "add"), ("add", "reduce_sum")}


# ---------------------------------------------------------------- in chromium


@pytest.mark.browser
def test_the_opened_block_draws_both_inputs_of_its_add(page, resnet, tmp_path):
    path = resnet.save_html(tmp_path / "resnet.html")
    pg = page.open_report(path)
    g = resnet.graph
    by_path = {_path(g, n.id): n.id for n in g.nodes}
    block, add = by_path["Net/block"], by_path["Net/block/add"]
    pg.locator(f'[data-node-id="{block}"] [data-role="toggle"]').first.click()
    assert pg.locator(f'[data-node-id="{add}"]').count() == 1
    into_add = pg.locator(f'.sv-edge[data-target="{add}"]').count()
    assert into_add == 2  # conv2's output and the block's input, through its port
    port = pg.locator(f'.sv-port[data-port="in"][data-level="{block}"]')
    assert port.count() == 1 and port.locator("text").text_content() == "stem"
    out = pg.locator(f'.sv-port[data-port="out"][data-level="{block}"]')
    assert out.locator("text").text_content() == "to mean"
    assert page.errors == [] and page.requests == []
