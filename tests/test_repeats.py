"""Identical repeated blocks (sowviz/graph/repeats.py): merged into one stacked node
only when they are alike, every block and probe kept inside it, and the front end's
per-block statistics equal each block's own values (NumPy, `jax.vjp`)."""

from __future__ import annotations

import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz.graph import build_graph, frameworks, instrument
from sowviz.graph.repeats import repeat_label

W16 = jax.random.normal(jax.random.PRNGKey(0), (6, 16, 16)) / 4
X = jax.random.normal(jax.random.PRNGKey(1), (4, 16))


def _blocks(ws, x, acts=("tanh",) * 6):
    for i, (w, act) in enumerate(zip(ws, acts, strict=True)):
        with jax.named_scope(f"block_{i}"):
            x = getattr(jnp, act)(x @ w) + x
    with jax.named_scope("head"):
        x = x @ jnp.ones((x.shape[-1], 3))
    return jnp.sum(x**2)


def _graph(fn, *args):
    closed = jax.make_jaxpr(fn)(*args)
    n_in = len(closed.jaxpr.invars)
    return closed, build_graph(closed, in_names=[f"in{i}" for i in range(n_in)], out_names=["y"])


def _groups(g):
    return [n for n in g.nodes if n.repeats]


def _kids(g, node):
    return [n for n in g.nodes if n.parent == node.id]


def test_identical_blocks_become_one_stacked_node_holding_them():
    ws = list(W16)
    closed, g = _graph(_blocks, ws, X)
    (grp,) = _groups(g)
    blocks = _kids(g, grp)
    assert grp.label == "block_0–5 (×6)" and grp.kind == "scope" and grp.repeats == 6
    assert [b.label for b in blocks] == [f"block_{i}" for i in range(6)]
    assert grp.parent == g.root and grp.n_eqns == sum(b.n_eqns for b in blocks) == 18
    assert grp.shapes == blocks[-1].shapes
    # ids stay `n<order>` in walk order, parents first
    assert [n.id for n in g.nodes] == [f"n{k}" for k in range(len(g.nodes))]
    assert all(g.node(n.parent).order < n.order for n in g.nodes if n.parent)
    # edges join siblings; outside nodes meet the group, never a block
    parent = {n.id: n.parent for n in g.nodes}
    assert all(parent[e.source] == parent[e.target] for e in g.edges)
    ids = {b.id for b in blocks}
    assert not [e for e in g.edges if (e.source in ids) != (e.target in ids)]
    assert {(e.source, e.target) for e in g.edges if e.source in ids} == {
        (a.id, b.id) for a, b in itertools.pairwise(blocks)
    }
    # the group is probed on its output (the last block's values); every block keeps its probe
    pts = {p.node: p for p in g.probe_points}
    assert all(b.id in pts for b in blocks)
    last, own = pts[blocks[-1].id], pts[grp.id]
    assert (own.path, own.at, own.values, own.shapes) == (
        last.path,
        last.at,
        last.values,
        last.shapes,
    )
    # the program is unchanged
    fn = instrument(closed, g.probe_points, tag="auto")
    want = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *ws, X)
    np.testing.assert_array_equal(fn(*ws, X)[0], want[0])
    # deterministic
    assert _graph(_blocks, ws, X)[1].to_dict() == g.to_dict()


def test_a_python_loop_slicing_before_each_call_is_one_stacked_node():
    # `for t in range(T): h = cell(x[:, t], h)`: the slice between the calls kept them
    # apart (T boxes and T slices). The calls are the blocks; the slices go in with them,
    # so the level shows one node, and the program and every probe are unchanged.
    def loop(ws, x):
        h = jnp.zeros((x.shape[0], 16))
        for t in range(5):
            xt = x[:, t]
            with jax.named_scope("cell"):
                h = jnp.tanh(xt @ ws[0] + h @ ws[1])
        return jnp.sum(h**2)

    xs = jax.random.normal(jax.random.PRNGKey(2), (4, 5, 16))
    ws = [W16[0], W16[1]]
    closed, g = _graph(loop, ws, xs)
    (grp,) = _groups(g)
    assert grp.label == "cell (×5)" and grp.repeats == 5 and grp.parent == g.root
    kids = _kids(g, grp)
    # slice, squeeze, cell, slice, squeeze, cell#2, ...: the first slice went in too
    assert [k.primitive or k.kind for k in kids] == ["slice", "squeeze", "scope"] * 5
    cells = [k for k in kids if k.kind == "scope"]
    assert [c.label for c in cells] == ["cell"] + [f"cell#{i}" for i in range(2, 6)]
    top = [n for n in g.nodes if n.parent == g.root]
    assert not [n for n in top if n.kind == "eqn" and n.primitive in ("slice", "squeeze")]
    parent = {n.id: n.parent for n in g.nodes}
    assert all(parent[e.source] == parent[e.target] for e in g.edges)
    pts = {p.node for p in g.probe_points}
    assert all(c.id in pts for c in cells)
    fn = instrument(closed, g.probe_points, tag="auto")
    want = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *ws, xs)
    np.testing.assert_array_equal(fn(*ws, xs)[0], want[0])

    def mixed(ws, x):  # a different equation between two of the calls: no run across it
        h = jnp.zeros((x.shape[0], 16))
        for t in range(4):
            xt = x[:, t] if t != 2 else jnp.cos(x[:, t])
            with jax.named_scope("cell"):
                h = jnp.tanh(xt @ ws[0] + h @ ws[1])
        return jnp.sum(h**2)

    _, g = _graph(mixed, ws, xs)
    # (the passes after it are a `cos` line then `cell#3`, and a slice then `cell#4`: not
    # the same work, so no second stack)
    assert [n.repeats for n in _groups(g)] == [2]
    cos = next(n for n in g.nodes if n.primitive == "cos")
    fold = g.node(cos.parent)  # its line's fold, after the run, not in it
    assert fold.parent == g.root and not fold.repeats


def test_a_loop_adding_up_after_each_call_stacks_every_pass_whole():
    # A flow's `logdet = logdet + ld` after each layer: the add after the last block goes
    # in with the others (it stood outside, so `(×3)` held 2 adds, and 3 probes shared
    # the path `layer (×3)/add`).
    def flow(ws, x):
        logdet = jnp.zeros(())
        for w in ws:
            with jax.named_scope("layer"):
                x = jnp.tanh(x @ w)
                ld = jnp.sum(jnp.log1p(-(x**2)))
            logdet = logdet + ld
        return logdet + jnp.sum(x)

    _, g = _graph(flow, list(W16[:3]), X)
    (grp,) = _groups(g)
    assert grp.label == "layer (×3)"
    assert [k.primitive or k.kind for k in _kids(g, grp)] == ["scope", "add"] * 3
    # the return line's own add stays at the top
    assert len([n for n in g.nodes if n.parent == g.root and n.primitive == "add"]) == 1


def test_blocks_that_differ_in_ops_shapes_or_names_are_not_merged():
    ws = list(W16)
    acts = ("tanh", "tanh", "sin", "tanh", "tanh", "tanh")
    _, g = _graph(lambda ws, x: _blocks(ws, x, acts), ws, X)
    assert [(n.label, len(_kids(g, n))) for n in _groups(g)] == [
        ("block_0–1 (×2)", 2),
        ("block_3–5 (×3)", 3),
    ]
    assert g.node(next(n for n in g.nodes if n.label == "block_2").parent).id == g.root

    def widths(x):  # block_3 maps 16 -> 8: its shapes differ from its neighbours'
        for i, (a, b) in enumerate([(16, 16), (16, 16), (16, 16), (16, 8), (8, 8), (8, 8)]):
            with jax.named_scope(f"block_{i}"):
                x = jnp.tanh(x @ jnp.full((a, b), 0.1))
        return x

    _, g = _graph(widths, X)
    assert [n.label for n in _groups(g)] == ["block_0–2 (×3)", "block_4–5 (×2)"]

    def widening(ws, x):  # `Block(4, 16)`, then `Block(16, 16)`: one output type, two inputs
        for i, w in enumerate(ws):
            with jax.named_scope(f"block_{i}"):
                x = jnp.tanh(x @ w)
        return x

    ws = [jnp.ones((4, 16)) / 4, W16[0], W16[1]]
    _, g = _graph(widening, ws, X[:, :4])
    assert [n.label for n in _groups(g)] == ["block_1–2 (×2)"]

    def qkv(x, w):  # look-alikes with their own names stay apart
        outs = []
        for name in ("query", "key", "value"):
            with jax.named_scope(name):
                outs.append(x @ w)
        return sum(outs)

    _, g = _graph(qkv, X, W16[0])
    assert not _groups(g)

    def switch(i, x):  # a cond's branches are alternatives, never a stack of blocks
        return jax.lax.switch(i, [lambda v: jnp.tanh(v @ W16[0])] * 3, x)

    _, g = _graph(switch, 1, X)
    assert len([n for n in g.nodes if n.label.startswith("branch")]) == 3 and not _groups(g)


def _norm(x):
    return x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)


def _attn(w, x):
    return jnp.tanh(x @ w)


def _mlp(w, x):
    return jnp.tanh(x @ w.T)


def _pre_norm(ws, x):  # a transformer's pre-norm residual loop over its layers
    for w in ws:
        x = x + _attn(w, _norm(x))
        x = x + _mlp(w, _norm(x))
    return jnp.mean(x**2)


def _written_out(ws, x):  # the same calls for two layers, with no loop
    x = x + _attn(ws[0], _norm(x))
    x = x + _mlp(ws[0], _norm(x))
    x = x + _attn(ws[1], _norm(x))
    x = x + _mlp(ws[1], _norm(x))
    return jnp.mean(x**2)


@pytest.mark.parametrize("n", [2, 3])
def test_a_loop_of_several_calls_is_stacked_from_two_passes(n):
    # Two passes of a loop body making several calls are as much a stack as three:
    # `_norm · _attn · _mlp (×2)`, not eight sibling stages `_norm`, `_attn`, …
    # `_norm#4`, `_mlp#2`.
    ws = list(W16[:n])
    ins = sowviz.inspect(_pre_norm, ws, X)
    g = ins.graph
    top = [m.label for m in g.children(g.root) if m.kind == "scope" and m.label != "parameters"]
    assert top == [f"_norm · _attn · _mlp (×{n})", "mean"], top  # (the loss's `jnp.mean`)
    (stack,) = _groups(g)
    passes = g.children(stack.id)
    assert [m.label for m in g.children(passes[-1].id) if m.kind == "scope"] == [
        "_norm",
        "_attn",
        "_norm#2",
        "_mlp",
    ]
    h = X
    for w in ws:  # the stack's value is its last pass's
        h = h + _attn(w, _norm(h))
        h = h + _mlp(w, _norm(h))
    got = ins.probe(stack.label).summaries["primal"]
    np.testing.assert_allclose(got["l2"], np.linalg.norm(h), rtol=1e-5)


def test_calls_written_out_without_a_loop_are_no_passes():
    # the same eight calls, one after the other in the code: no pass goes back to the
    # start of a loop, so nothing says they repeat
    _, g = _graph(_written_out, list(W16[:2]), X)
    assert not _groups(g)
    top = [m.label for m in g.children(g.root) if m.kind == "scope"]
    # (each `x = x + _attn(...)` line's `add` is a box named by what it assigns)
    assert top[:6] == ["_norm", "_attn", "x", "_norm#2", "_mlp", "x#2"], top


def test_repeat_labels():
    assert repeat_label([f"layers[{i}]" for i in range(24)]) == "layers[0–23] (×24)"
    assert repeat_label(["block", "block#2", "block#3"]) == "block (×3)"
    assert repeat_label(["layers[1]: Linear", "layers[2]: Linear"]) == "layers[1–2]: Linear (×2)"
    assert repeat_label(["l0", "l2", "l4"]) == "l0…4 (×3)"
    assert repeat_label(["a1b1", "a2b2"]) == "a1b1 … a2b2 (×2)"


def _named_graph(fn, *args):
    leaves, tree = jax.tree_util.tree_flatten(args)
    named = frameworks.named(fn)
    flat = lambda *f: named(*jax.tree_util.tree_unflatten(tree, f))  # noqa: E731
    closed = jax.make_jaxpr(flat)(*leaves)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(args)[0]]
    in_args = [int(p[1 : p.index("]")]) for p in paths]  # inputs grouped per argument
    names = [f"arg{a}{p[p.index(']') + 1 :]}" for a, p in zip(in_args, paths, strict=True)]
    return build_graph(
        closed, in_names=names, out_names=["y"], in_args=in_args, calls=named.sowviz_calls
    )


def test_24_layer_nnx_model_draws_its_layers_as_one_node():
    from zoo.models import nnx_lm

    small = dict(vocab=16, features=8, heads=2, hidden=16, seq=6, batch=2)
    g = _named_graph(nnx_lm.loss, *nnx_lm.make(nnx_lm.Config(attention=("einsum",) * 24, **small)))
    (grp,) = [n for n in _groups(g) if n.label.startswith("layers")]
    assert grp.label == "layers[0–23] (×24)"
    assert [b.label for b in _kids(g, grp)] == [f"layers[{i}]" for i in range(24)]
    assert g.node(grp.parent).label == "TransformerLM"
    sizes: dict[str | None, int] = {}
    for n in g.nodes:
        sizes[n.parent] = sizes.get(n.parent, 0) + 1
    assert sizes[g.root] <= 60 and sizes[grp.parent] <= 60
    # the first picture opens the model's module, so it shows the stacked node itself
    assert not g.node(grp.parent).collapsed and grp.collapsed
    assert sizes[g.root] - 1 + sizes[grp.parent] <= 60
    # the zoo's own model mixes two attention flavours: its two blocks differ
    g = _named_graph(nnx_lm.loss, *nnx_lm.make(nnx_lm.Config(**small)))
    assert not [n for n in _groups(g) if n.label.startswith("layers")]


_SUP = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")


def _tick(text: str) -> float:
    """A tick label as a number: "0.01", "10⁻⁵", "2×10⁻⁵" (Plotly writes U+2212 minus)."""
    text = text.replace("\u200b", "").replace("\u2212", "-")
    if "10" in text and text.translate(_SUP) != text:
        m, _, e = text.rpartition("10")
        return float(m.rstrip("×") or 1) * 10.0 ** int(e.translate(_SUP))
    return float(text)


def _yticks(pg, kind, mode):
    sel = f'[data-repeat="{kind}"][data-mode="{mode}"] .ytick text'
    return pg.eval_on_selector_all(sel, "els => els.map((e) => e.textContent)")


@pytest.mark.browser
def test_group_detail_charts_each_blocks_statistics(page, tmp_path):
    ws = list(W16)
    ins = sowviz.inspect(_blocks, ws, X, mode="grad", argnums=1)
    (grp,) = _groups(ins.graph)
    blocks = _kids(ins.graph, grp)
    # each block's output and its cotangent, by plain JAX
    hs, h = [], X
    for w in ws:
        h = jnp.tanh(h @ w) + h
        hs.append(h)

    def tail(k):
        def f(h):
            for w in ws[k + 1 :]:
                h = jnp.tanh(h @ w) + h
            return jnp.sum((h @ jnp.ones((16, 3))) ** 2)

        return f

    gs = [jax.grad(tail(k))(hs[k]) for k in range(6)]
    want = {
        "primal": [np.asarray(v, np.float64) for v in hs],
        "cotangent": [np.asarray(v, np.float64) for v in gs],
    }
    by_node = {p.node: p for p in ins.probes if p.auto}
    pg = page.open_report(ins.save_html(tmp_path / "r.html"))
    pg.locator(f'[data-node-id="{grp.id}"]').click()
    pg.wait_for_selector('[data-role="repeats"] [data-repeat="mean"] .main-svg')
    for mode, arrays in want.items():
        lines, mean = (
            pg.evaluate(
                "([k, m]) => document.querySelector(`[data-repeat='${k}'][data-mode='${m}']`)"
                ".data.map((t) => t.y)",
                [kind, mode],
            )
            for kind in ("lines", "mean")
        )
        l2, absmax = lines[0], lines[1]
        # equal to the blocks' own (float32) summaries: the model writes float32
        # statistics in their shortest float32 form, so compare as float32 ...
        s = [by_node[b.id].summaries[mode] for b in blocks]

        def f32(values):
            return np.asarray(values, np.float32)

        for drawn, key in ((l2, "l2"), (absmax, "absmax"), (mean[0], "mean")):
            np.testing.assert_array_equal(f32(drawn), f32([x[key] for x in s]))
        # ... which are each block's values
        np.testing.assert_allclose(l2, [np.linalg.norm(a) for a in arrays], rtol=1e-5)
        np.testing.assert_allclose(absmax, [np.abs(a).max() for a in arrays], rtol=1e-5)
        scale = max(np.abs(a).max() for a in arrays)
        np.testing.assert_allclose(mean[0], [a.mean() for a in arrays], atol=1e-6 * scale)
        # the norms' log axis reads: a few increasing ticks, powers of ten when the
        # norms span two decades or more
        ticks = [_tick(t) for t in _yticks(pg, "lines", mode)]
        norms = [np.linalg.norm(a) for a in arrays] + [np.abs(a).max() for a in arrays]
        assert 2 <= len(ticks) <= 4 and ticks == sorted(set(ticks)), ticks
        assert min(norms) * (1 - 1e-6) <= ticks[0] and ticks[-1] <= max(norms) * (1 + 1e-6)
        if np.floor(np.log10(max(norms))) - np.ceil(np.log10(min(norms))) >= 1:
            assert all(float(np.log10(t)).is_integer() for t in ticks), ticks
    # the slider picks a block; "show" reveals it
    pg.locator('[data-role="repeat"]').fill("2")
    assert pg.locator('[data-role="repeat-reveal"]').inner_text() == "show block_2"
    # by the blocks' own numbers
    xs = pg.evaluate(
        "() => Array.from(document.querySelector(\"[data-repeat='lines']\").data[0].x)"
    )
    assert xs == [int(b.label.rsplit("_", 1)[1]) for b in blocks]
    assert pg.locator('[data-role="repeat-label"]').inner_text() == f"2 of 0–{len(blocks) - 1}"
    pg.locator('[data-role="repeat-reveal"]').click()
    pg.wait_for_selector(f'[data-node-id="{blocks[2].id}"].sv-selected')
    assert pg.locator(f'[data-node-id="{grp.id}"]').get_attribute("data-expanded") == "true"
    assert not page.errors and not page.requests


@pytest.mark.browser
def test_group_without_captured_blocks_says_so(page, tmp_path):
    ins = sowviz.inspect(_blocks, list(W16), X, mode="grad", capture="sows")
    (grp,) = _groups(ins.graph)
    pg = page.open_report(ins.save_html(tmp_path / "r.html"))
    pg.locator(f'[data-node-id="{grp.id}"]').click()
    assert "No values were captured" in pg.locator('[data-role="repeats-empty"]').inner_text()
    assert pg.locator('[data-role="repeats"] .js-plotly-plot').count() == 0
    assert pg.locator('[data-role="repeat-reveal"]').inner_text() == "show block_5"
    assert not page.errors


def _loop_loss(w, x, targets):
    total = 0.0
    for t in range(x.shape[1]):
        with jax.named_scope("Linear"):
            logits = x[:, t] @ w
        total = total + jnp.mean(  # one statement over two lines: one fold, `total`
            (jax.nn.log_softmax(logits) * targets[:, t]).sum(-1)
        )
    return total / x.shape[1]


def test_a_loop_adding_a_per_step_loss_is_one_stacked_node_with_its_folds():
    # per pass: the slice of `x`, the model's call, and the line adding up the loss,
    # written over two lines. It drew 6 × (slice, squeeze, Linear, total) at the top,
    # the folds named `_loop_loss#k` (their lines differ) and never stacked.
    x = jax.random.normal(jax.random.key(1), (2, 6, 4))
    targets = jax.nn.one_hot(jnp.arange(12).reshape(2, 6) % 5, 5)
    w = jax.random.normal(jax.random.key(0), (4, 5))
    ins = sowviz.inspect(_loop_loss, w, x, targets)
    top = [n for n in ins.graph.nodes if n.parent == ins.graph.root]
    (grp,) = (n for n in top if n.repeats)
    # (the pass's other work named too: the blocks are the `Linear`s)
    assert grp.repeats == 6 and grp.label == "Linear · total (×6)", [n.label for n in top]
    assert [ins.graph.node(b).label for b in grp.blocks] == ["Linear"] + [
        f"Linear#{i}" for i in range(2, 7)
    ]
    kids = [n.label for n in ins.graph.nodes if n.parent == grp.id]
    assert [k for k in kids if k.startswith("total")] == ["total"] + [
        f"total#{i}" for i in range(2, 7)
    ]
    assert not [n for n in top if n.primitive in ("slice", "squeeze")]
    # each pass's fold carries its own value: the running total after step t
    run = 0.0
    for t in range(6):
        run = run + jnp.mean((jax.nn.log_softmax(x[:, t] @ w) * targets[:, t]).sum(-1))
        label = "total" if t == 0 else f"total#{t + 1}"
        got = ins.probe(f"Linear · total (×6)/{label}").summaries["primal"]["mean"]
        np.testing.assert_allclose(got, float(run), rtol=1e-5)


def _dropout_layer(w, x, key):
    h = jnp.tanh(x @ w)
    keep = jax.random.bernoulli(key, 0.9, h.shape)
    return jnp.where(keep, h / 0.9, 0.0)


def _keyed_stack(ws, x, key):
    for w in ws:
        layer_key, key = jax.random.split(key)  # as Equinox's BERT example splits them
        x = _dropout_layer(w, x, layer_key)
    return jnp.sum(x**2)


def test_layers_called_with_a_key_split_before_each_are_one_stacked_node():
    # the split line between the calls kept the layers apart: 6 layers and 6 key
    # boxes, drawn as a staircase
    ws = jnp.stack([jnp.eye(8) * (1 + 0.1 * i) for i in range(6)])
    x = jnp.linspace(-1.0, 1.0, 16).reshape(2, 8)
    ins = sowviz.inspect(_keyed_stack, list(ws), x, jax.random.PRNGKey(3))  # (a raw key)
    (grp,) = (n for n in ins.graph.nodes if n.repeats)
    assert grp.repeats == 6 and grp.parent == ins.graph.root, grp
    top = [n.label for n in ins.graph.nodes if n.parent == ins.graph.root]
    assert not [t for t in top if "key" in t and t != "key"], top
    value, grad = jax.value_and_grad(_keyed_stack)(list(ws), x, jax.random.PRNGKey(3))
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-5)
    for got, want in zip(ins.result[1], grad, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def _lru_layer(p, x):
    return x @ p["w"]


def _gelu_after_each_layer(params, x):
    h = x
    for p in params:
        h = jax.nn.gelu(_lru_layer(p, h))
    return jnp.mean(h**2)


@pytest.mark.browser
def test_a_pass_of_a_layer_then_named_work_is_stacked_as_both(page, tmp_path):
    # `h = gelu(layer(p, h))` in a Python loop: the stacked node said `layer (×3)` with no
    # data, and its panel charted 6 "blocks", the layers' and the gelus' outputs in turn.
    params = [{"w": W16[i, :4, :4]} for i in range(3)]
    x = X[:2, :4]
    ins = sowviz.inspect(_gelu_after_each_layer, params, x, mode="grad", argnums=1)
    (grp,) = _groups(ins.graph)
    assert grp.label == "_lru_layer · gelu (×3)", grp.label
    layers = [n for n in _kids(ins.graph, grp) if n.label.startswith("_lru_layer")]
    assert grp.blocks == tuple(n.id for n in layers) and len(layers) == 3
    # its face: the value leaving it, the last gelu's, and that value's gradient
    hs, h = [], x
    for p in params:
        hs.append(h @ p["w"])
        h = jax.nn.gelu(hs[-1])
    (probe,) = [p for p in ins.probes if p.node == grp.id]
    got = probe.summaries
    np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(h), rtol=1e-5)
    np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(2 * h / h.size), rtol=1e-5)
    # the panel charts the three layers, each its own output
    pg = page.open_report(ins.save_html(tmp_path / "r.html"))
    pg.locator(f'[data-node-id="{grp.id}"]').click()
    pg.wait_for_selector('[data-role="repeats"] [data-repeat="lines"] .main-svg')
    l2 = pg.evaluate(
        "() => document.querySelector(\"[data-repeat='lines'][data-mode='primal']\").data[0].y"
    )
    np.testing.assert_allclose(l2, [np.linalg.norm(v) for v in hs], rtol=1e-5)
    assert not page.errors and not page.requests


def test_an_equinox_mlps_activation_goes_with_the_layer_before_it():
    # `eqx.nn.MLP`: `x = activation(layer(x))` per hidden layer. Its stack began with the
    # first layer's `gelu` and left the last hidden layer's outside: passes are a
    # layer and the work reading its output.
    eqx = pytest.importorskip("equinox")
    model = eqx.nn.MLP(6, 1, 8, 3, activation=jax.nn.gelu, key=jax.random.key(0))
    x = jnp.linspace(-1.0, 1.0, 12).reshape(2, 6)

    def loss(model, x):
        return jnp.mean(jax.vmap(model)(x) ** 2)

    ins = sowviz.inspect(loss, model, x)
    (grp,) = _groups(ins.graph)
    assert grp.label == "layers[1–2]: Linear · gelu (×2)", grp.label
    kids = [n.label for n in _kids(ins.graph, grp)]
    assert kids == ["layers[1]: Linear", "gelu#2", "layers[2]: Linear", "gelu#3"], kids
    # the stack's face is the last hidden activation: what `layers[3]` reads
    h = x
    for layer in model.layers[:3]:
        h = jax.nn.gelu(h @ layer.weight.T + layer.bias)
    (probe,) = [p for p in ins.probes if p.node == grp.id]
    np.testing.assert_allclose(probe.summaries["primal"]["l2"], np.linalg.norm(h), rtol=1e-5)


def test_the_one_model_starts_open_even_when_its_loss_holds_more():
    # Flax's MNIST tutorial shape: a small CNN whose `optax` cross-entropy is the larger
    # part of the program; the first picture was one closed `CNN` box.
    nnx = pytest.importorskip("flax.nnx")
    optax = pytest.importorskip("optax")

    class CNN(nnx.Module):
        def __init__(self, rngs):
            self.conv = nnx.Conv(1, 4, kernel_size=(3, 3), rngs=rngs)
            self.linear = nnx.Linear(4 * 4 * 4, 10, rngs=rngs)

        def __call__(self, x):
            x = nnx.avg_pool(nnx.relu(self.conv(x)), window_shape=(2, 2), strides=(2, 2))
            return self.linear(x.reshape(x.shape[0], -1))

    def loss_fn(model, images, labels):
        logits = model(images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    model = CNN(nnx.Rngs(0))
    images, labels = jnp.ones((2, 8, 8, 1)), jnp.array([1, 2])
    ins = sowviz.inspect(loss_fn, model, images, labels)
    top = {n.label: n for n in ins.graph.nodes if n.parent == ins.graph.root}
    assert 2 * top["CNN"].n_eqns < ins.graph.node(ins.graph.root).n_eqns  # the case
    assert not top["CNN"].collapsed
    inside = [n.label for n in ins.graph.nodes if n.parent == top["CNN"].id]
    assert "conv" in inside and "linear" in inside, inside


def test_equinox_blocks_holding_a_module_copy_named_after_the_trace_stack():
    # Equinox's RoPE attention: `process_heads` maps `self.rope` with `jax.vmap` inside
    # `MultiheadAttention`, a copy named `blocks[1].rope: RotaryPositionalEmbedding`
    # after the trace; that label's index kept the two blocks apart.
    eqx = pytest.importorskip("equinox")

    class Block(eqx.Module):
        attn: Any
        rope: Any

        def __init__(self, key):
            self.attn = eqx.nn.MultiheadAttention(2, 8, key=key)
            self.rope = eqx.nn.RotaryPositionalEmbedding(4)

        def __call__(self, x):
            def process_heads(q, k, v):
                rope = jax.vmap(self.rope, in_axes=1, out_axes=1)
                return rope(q), rope(k), v

            return x + self.attn(x, x, x, process_heads=process_heads)

    blocks = [Block(k) for k in jax.random.split(jax.random.key(0), 2)]
    x = jnp.linspace(-1.0, 1.0, 48).reshape(6, 8)

    def loss(blocks, x):
        for block in blocks:
            x = block(x)
        return jnp.sum(x**2)

    ins = sowviz.inspect(loss, blocks, x)
    top = [n for n in ins.graph.nodes if n.repeats and n.parent == ins.graph.root]
    assert [n.label for n in top] == ["blocks[0–1]: Block (×2)"], [n.label for n in top]
    (probe,) = [p for p in ins.probes if p.node == top[0].id]
    out = blocks[1](blocks[0](x))
    np.testing.assert_allclose(probe.summaries["primal"]["l2"], np.linalg.norm(out), rtol=1e-5)


def _dropout(key, x, rate=0.2):
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def _dropout_passes(params, key, x):
    for p, k in zip(params, jax.random.split(key, len(params)), strict=True):
        x = jax.nn.gelu(x @ p["w"])
        x = _dropout(k, x)
    return jnp.mean(x**2)


def _residual_passes(params, h):
    for p in params:
        h = h + jnp.tanh(_lru_layer(p, h))
    return jnp.mean(h**2)


def _gelu_layers(params, x):
    h = x
    for p in params:
        h = jax.nn.gelu(_lru_layer(p, h))
    return h


def test_passes_stack_whole_and_show_the_value_leaving_them():
    # (a) `x = gelu(x @ w)` then `x = dropout(k, x)`: the stack began with the first
    # `dropout`, the first pass's `x` outside, and no data; (b) a residual pass, whose
    # value leaving it is a bare `add`: no data; (c) the loop ending a function of
    # yours: its value leaves through the function, no data in any mode.
    params = [{"w": W16[i, :8, :8]} for i in range(3)]
    x, key = X[:4, :8], jax.random.key(7)

    def forward(params, key, x):
        for p, k in zip(params, jax.random.split(key, len(params)), strict=True):
            x = _dropout(k, jax.nn.gelu(x @ p["w"]))
        return x

    def residual(params, h):
        for p in params:
            h = h + jnp.tanh(h @ p["w"])
        return h

    cases = [
        (_dropout_passes, (params, key, x), "x · _dropout (×3)", forward(params, key, x)),
        (_residual_passes, (params, x), "_lru_layer (×3)", residual(params, x)),
    ]
    for fn, args, label, out in cases:
        ins = sowviz.inspect(fn, *args)
        (grp,) = _groups(ins.graph)
        assert grp.label == label, (label, [n.label for n in _kids(ins.graph, grp)])
        (probe,) = [p for p in ins.probes if p.node == grp.id]
        got = probe.summaries
        np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(out), rtol=1e-5)
        want = np.linalg.norm(2 * np.asarray(out) / out.size)
        np.testing.assert_allclose(got["cotangent"]["l2"], want, rtol=1e-5)
    tangents = (jax.tree.map(jnp.ones_like, params), jnp.zeros_like(x))
    out, t_out = jax.jvp(_gelu_layers, (params, x), tangents)
    ins = sowviz.inspect(
        lambda p, x: jnp.mean(_gelu_layers(p, x) ** 2), params, x, mode="jvp", tangents=tangents
    )
    (grp,) = _groups(ins.graph)
    assert ins.graph.node(grp.parent).label == "_gelu_layers"
    (probe,) = [p for p in ins.probes if p.node == grp.id]
    np.testing.assert_allclose(probe.summaries["primal"]["l2"], np.linalg.norm(out), rtol=1e-5)
    np.testing.assert_allclose(probe.summaries["tangent"]["l2"], np.linalg.norm(t_out), rtol=1e-5)


def _decode_logp(p, first):
    # a greedy decoder with a cache: each pass calls the model, takes the argmax token
    # and keeps the token's log-probability; the cache goes on (a module's state)
    tok, cache, logps = first, jnp.zeros((first.shape[0], 8)), []
    for _ in range(5):
        with jax.named_scope("Decoder"):
            cache = jnp.tanh(p["emb"][tok] + cache @ p["w"])
            logits = cache @ p["out"]
        tok = jnp.argmax(logits, -1)
        logps.append(jax.nn.log_softmax(logits).max(-1))
    return jnp.sum(jnp.stack(logps, 1)), cache


def _decoded(p, first):
    """Each pass's logits, in plain JAX."""
    tok, cache, out = first, jnp.zeros((first.shape[0], 8)), []
    for _ in range(5):
        cache = jnp.tanh(p["emb"][tok] + cache @ p["w"])
        out.append(cache @ p["out"])
        tok = jnp.argmax(out[-1], -1)
    return out


def test_a_decode_loop_keeping_log_probabilities_is_one_stacked_pass():
    # `logps.append(jax.nn.log_softmax(logits).max(-1))` after each call of the model: the
    # `log_softmax` (a `jit` stage) between the calls kept them apart, five `Decoder`s,
    # each with its `argmax`, `log_softmax#k` and `reduce_max`, in a wide chain.
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    p = {
        "emb": jax.random.normal(k[0], (11, 8)),
        "w": jax.random.normal(k[1], (8, 8)) / 3,
        "out": jax.random.normal(k[2], (8, 11)),
    }
    first = jnp.zeros((2,), jnp.int32)
    ins = sowviz.inspect(_decode_logp, p, first, mode="grad", has_aux=True)
    g = ins.graph
    (grp,) = _groups(g)
    assert grp.label == "Decoder · log_softmax (×5)" and grp.repeats == 5, grp.label
    assert grp.parent == g.root
    kids = _kids(g, grp)
    blocks = [k for k in kids if k.kind == "scope"]
    assert [k.label for k in blocks] == ["Decoder"] + [f"Decoder#{i}" for i in range(2, 6)]
    softmaxes = [k.label for k in kids if k.kind == "jit"]
    assert softmaxes == ["log_softmax"] + [f"log_softmax#{i}" for i in range(2, 6)]
    assert grp.blocks == tuple(k.id for k in blocks)
    top = [n.label for n in g.nodes if n.parent == g.root and n.id != grp.id]
    assert not [t for t in top if t.startswith(("Decoder", "log_softmax", "argmax"))], top
    # each pass's values are its own (the log-probabilities, their gradient: one at each
    # row's greatest), and the loss and its gradient are JAX's
    for t, logits in enumerate(_decoded(p, first)):
        name = "log_softmax" if t == 0 else f"log_softmax#{t + 1}"
        got = ins.probe(f"Decoder · log_softmax (×5)/{name}").summaries
        want = jax.nn.log_softmax(logits)
        np.testing.assert_allclose(got["primal"]["mean"], np.mean(want), rtol=1e-5)
        np.testing.assert_allclose(got["cotangent"]["l2"], np.sqrt(want.shape[0]), rtol=1e-5)
    (value, cache), grad = jax.value_and_grad(_decode_logp, has_aux=True)(p, first)
    np.testing.assert_allclose(ins.result[0][0], value, rtol=1e-5)
    np.testing.assert_allclose(ins.result[0][1], cache, rtol=1e-5)
    for name in p:
        np.testing.assert_allclose(ins.result[1][name], grad[name], rtol=1e-4, atol=1e-6)


def _q_network(p, x):
    with jax.named_scope("QNetwork"):  # as Flax Linen's module scope
        return jnp.tanh(x @ p["w1"]) @ p["w2"]


def _dqn_loss(params, target_params, obs, next_obs, reward):
    q_next = _q_network(target_params, next_obs)
    q_next = jnp.max(q_next, axis=-1)
    target = reward + 0.99 * q_next
    q = _q_network(params, obs)
    return jnp.mean((jnp.max(q, -1) - jax.lax.stop_gradient(target)) ** 2)


def _q_params(key):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (4, 8)) / 2, "w2": jax.random.normal(k2, (8, 3)) / 3}


def test_a_target_and_an_online_network_call_are_no_two_passes():
    # A DQN loss: the target network, its `max` and `target = ...`, then the online
    # network. It was one stack `QNetwork · target (×2)`, whose first "pass" was the
    # target network with its work and the second the online network alone.
    params, tparams = _q_params(jax.random.key(0)), _q_params(jax.random.key(1))
    obs = jax.random.normal(jax.random.key(2), (6, 4))
    next_obs = jax.random.normal(jax.random.key(3), (6, 4))
    reward = jnp.linspace(-1.0, 1.0, 6)
    ins = sowviz.inspect(_dqn_loss, params, tparams, obs, next_obs, reward)
    g = ins.graph
    assert not _groups(g), [n.label for n in _groups(g)]
    nets = [n for n in g.children(g.root) if n.label.startswith("QNetwork")]
    assert [n.label for n in nets] == ["QNetwork", "QNetwork#2"]
    # each network's stage carries its own values: the target's, then the online one's
    q_next, q = _q_network(tparams, next_obs), _q_network(params, obs)
    for net, want in zip(nets, (q_next, q), strict=True):
        got = ins.probe(net.label).summaries["primal"]
        np.testing.assert_allclose(got["mean"], np.mean(want), rtol=1e-5)
    # the online network's gradient: dloss/dq is the mean's, at each row's greatest
    target = reward + 0.99 * jnp.max(q_next, -1)
    dq = jax.grad(lambda q: jnp.mean((jnp.max(q, -1) - target) ** 2))(q)
    got = ins.probe("QNetwork#2").summaries["cotangent"]
    np.testing.assert_allclose(got["l2"], np.linalg.norm(dq), rtol=1e-5)
    # and the target network's is zero (a `stop_gradient`): none reaches it
    assert ins.probe("QNetwork").summaries.get("cotangent", {"l2": 0.0})["l2"] == 0.0
