"""How one source line, and a function's outputs, are drawn: an index line in a small
function is one box named by what it assigns, a return line is named by what it
computes, outputs are numbered in return order (a list grown by `append`), a line's
argument run is named by that argument, and a stage's card type is the output its
face shows."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz.graph.source_text import operand_text, returned_label


def _children(g, node):
    return [n.label for n in g.children(node.id)]


def _node(g, label, kind=None):
    (node,) = [n for n in g.nodes if n.label == label and (kind is None or n.kind == kind)]
    return node


def _probe(ins, node):
    (p,) = [p for p in ins.probes if p.node == node.id]
    return p.summaries


# -- 1. an index line at a small level ------------------------------------------------


def _embed_model(p, idx):
    x = p["embed"][idx]
    return jnp.tanh(x @ p["w"])


def _embed_loss(p, idx):
    return jnp.mean(_embed_model(p, idx) ** 2)


EMBED = {
    "embed": jax.random.normal(jax.random.PRNGKey(0), (64, 16)),
    "w": jnp.eye(16) * 0.5,
}
IDX = jnp.arange(32).reshape(4, 8)


def test_an_index_line_in_a_small_function_is_one_box_named_by_what_it_assigns():
    # `p["embed"][idx]` was five boxes inside `_embed_model` (jnp's negative-index wrap
    # `lt`, `add`, `select_n`, `broadcast_in_dim`, then `gather`), none with data
    ins = sowviz.inspect(_embed_loss, EMBED, IDX)
    g = ins.graph
    model = _node(g, "_embed_model", "scope")
    assert _children(g, model) == ["x", "dot_general", "tanh"], _children(g, model)
    x = _node(g, "x", "scope")
    assert "gather" in _children(g, x) and x.shapes == ("float32[4,8,16]",)
    got = _probe(ins, x)
    want = EMBED["embed"][IDX]
    np.testing.assert_allclose(got["primal"]["l2"], float(jnp.linalg.norm(want)), rtol=1e-5)
    # its gradient: d mean(tanh(x @ w) ** 2) / dx
    dx = jax.grad(lambda x: jnp.mean(jnp.tanh(x @ EMBED["w"]) ** 2))(want)
    np.testing.assert_allclose(got["cotangent"]["l2"], float(jnp.linalg.norm(dx)), rtol=1e-5)


def _first_tokens(prompt):
    toks = jnp.zeros((prompt.shape[0], 8), jnp.int32).at[:, 0].set(prompt)
    return toks * 2


def test_an_update_line_at_a_small_level_is_one_box():
    # `jnp.zeros(...).at[:, 0].set(prompt)`: `broadcast_in_dim` x2 and `scatter` were
    # three boxes
    ins = sowviz.inspect(_first_tokens, jnp.arange(4), mode="primal")
    g = ins.graph
    top = _children(g, g.node(g.root))
    assert top == ["prompt", "toks", "mul", "output"], top
    assert _children(g, _node(g, "toks"))[-1] == "scatter"
    np.testing.assert_array_equal(ins.result[:, 0], np.arange(4) * 2)


def _plain_small(y, t):
    return jnp.mean((y - t) ** 2)


def test_a_small_levels_own_arithmetic_stays_one_box_per_equation():
    # the fold is for an operation that made integer plumbing: `(y - t) ** 2` and its
    # derivative's `mul` (floats, one operation each) stay boxes
    y, t = jnp.linspace(0.0, 1.0, 6), jnp.ones(6)
    g = sowviz.inspect(_plain_small, y, t).graph
    top = [n.label for n in g.children(g.root)]
    assert "sub" in top and "integer_pow" in top, top


# -- 2. a return line's stage ---------------------------------------------------------


def _mse(params, x, y):
    h = jax.nn.gelu(x @ params["w1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def test_a_return_line_is_named_by_what_it_computes():
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {"w1": jax.random.normal(k[0], (16, 32)) / 4, "w2": jax.random.normal(k[1], (32, 8))}
    x, y = jax.random.normal(k[2], (64, 16)), jax.random.normal(k[3], (64, 8))
    for fn in (_mse, jax.jit(_mse)):  # (a jitted loss draws its body as the top level)
        ins = sowviz.inspect(fn, params, x, y)
        labels = [n.label for n in ins.graph.nodes]
        assert "return" not in labels, labels
        got = _probe(ins, _node(ins.graph, "mean", "scope"))
        np.testing.assert_allclose(got["primal"]["max"], float(_mse(params, x, y)), rtol=1e-5)
        np.testing.assert_allclose(got["cotangent"]["max"], 1.0)


def test_returned_label_reads_the_source():
    here = __file__
    line = _mse.__code__.co_firstlineno + 2
    assert returned_label(here, line) == "mean"
    assert returned_label(here, line - 1) is None  # an assignment
    line = _first_tokens.__code__.co_firstlineno + 2
    assert returned_label(here, line) == "toks * 2"  # no call: the expression


# -- 3. outputs in return order, and an argument's run --------------------------------


def _layer(w, x, kc, vc, pos):
    kc = jax.lax.dynamic_update_slice(kc, x[:, None], (0, pos, 0))
    vc = jax.lax.dynamic_update_slice(vc, jnp.tanh(x)[:, None], (0, pos, 0))
    return x + jnp.tanh(vc.sum(1) @ w), kc, vc


def _forward_token(p, tok, caches, pos):
    x = p["embed"][tok]
    new = []
    for w, (kc, vc) in zip(p["layers"], caches, strict=True):
        x, kc, vc = _layer(w, x, kc, vc, pos)
        new.append((kc, vc))
    logits = x @ p["embed"].T
    return logits, new


def _caches():
    return [(jnp.zeros((4, 8, 16)), jnp.zeros((4, 8, 16))) for _ in range(2)]


def _generate(p, prompt):
    tokens = jnp.zeros((4, 8), jnp.int32).at[:, 0].set(prompt)

    def body(pos, state):
        tokens, caches = state
        logits, caches = _forward_token(p, tokens[:, pos], caches, pos)  # @argument_line
        return tokens.at[:, pos + 1].set(jnp.argmax(logits, -1).astype(jnp.int32)), caches

    return jax.lax.fori_loop(0, 7, body, (tokens, _caches()))[0]


_K = jax.random.split(jax.random.PRNGKey(0), 3)
DECODER = {
    "embed": jax.random.normal(_K[0], (64, 16)),
    "layers": [jax.random.normal(_K[1], (16, 16)) / 4, jax.random.normal(_K[2], (16, 16)) / 4],
}


def test_outputs_of_a_function_returning_a_grown_list_are_numbered_as_returned():
    # `return logits, new` (`new.append((kc, vc))` per layer) numbered layer 0's caches
    # [0], [1], the logits [2]: the face showed a KV cache
    ins = sowviz.inspect(_generate, DECODER, jnp.arange(4), mode="primal")
    g = ins.graph
    fwd = _node(g, "_forward_token", "scope")
    assert fwd.shapes == ("float32[4,64]",) + ("float32[4,8,16]",) * 4, fwd.shapes
    probes = {p.leaf: p.summaries["primal"] for p in ins.probes if p.node == fwd.id}
    # plain JAX: the logits of every step of the loop
    tokens, caches, steps = ins.result, _caches(), []
    for pos in range(7):
        logits, caches = _forward_token(DECODER, tokens[:, pos], caches, pos)
        steps.append(logits)
    want = jnp.stack(steps)
    assert probes["[0]"]["shape"] == list(want.shape)
    np.testing.assert_allclose(probes["[0]"]["l2"], float(jnp.linalg.norm(want)), rtol=1e-5)
    np.testing.assert_array_equal(ins.result, jax.jit(_generate)(DECODER, jnp.arange(4)))


def _decode_once(p, tok):
    logits, new = _forward_token(p, tok, _caches(), 0)
    return jnp.sum(logits) + sum(jnp.sum(c) for kv in new for c in kv)


def test_return_order_holds_when_the_program_reads_every_output():
    # every output read after the call: only the source says the logits come first
    ins = sowviz.inspect(_decode_once, DECODER, jnp.arange(4), mode="primal")
    fwd = _node(ins.graph, "_forward_token", "scope")
    assert fwd.shapes == ("float32[4,64]",) + ("float32[4,8,16]",) * 4, fwd.shapes
    probes = {p.leaf: p.summaries["primal"] for p in ins.probes if p.node == fwd.id}
    want = _forward_token(DECODER, jnp.arange(4), _caches(), 0)[0]
    np.testing.assert_allclose(probes["[0]"]["l2"], float(jnp.linalg.norm(want)), rtol=1e-5)


def test_a_run_computing_a_calls_argument_is_named_by_it():
    # `tokens[:, pos]` (int32[4]) was labelled `logits, caches`, the call's targets
    ins = sowviz.inspect(_generate, DECODER, jnp.arange(4), mode="primal")
    labels = [n.label for n in ins.graph.nodes]
    assert "logits, caches" not in labels
    arg = _node(ins.graph, "tokens[:, pos]", "scope")
    assert arg.shapes == ("int32[4]",)
    assert arg.source.line == _generate.__code__.co_firstlineno + 5


def test_operand_text_reads_the_innermost_argument():
    here = __file__
    line = _generate.__code__.co_firstlineno + 5
    text = Path(here).read_text().splitlines()[line - 1]
    col = text.index("tokens[:, pos]")
    span = (line, col, line, col + len("tokens[:, pos]"))
    assert operand_text(here, line, span) == "tokens[:, pos]"
    whole = (line, text.index("_forward_token"), line, len(text.split("  #")[0]))
    assert operand_text(here, line, whole) is None  # the call itself: its targets


# -- 4. a stage's card type and its face ----------------------------------------------


def test_a_haiku_stage_card_shows_the_type_of_the_output_its_face_shows():
    hk = pytest.importorskip("haiku")

    def fwd(x):
        class Net(hk.Module):
            def __call__(self, x):
                x = hk.Linear(8)(x)
                x = hk.BatchNorm(True, True, 0.9)(x, is_training=True)
                return hk.Linear(3)(x)

        return Net(name="net")(x)

    m = hk.transform_with_state(fwd)
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 4))
    p, s = m.init(jax.random.PRNGKey(0), x)

    def loss(p, s, x):
        out, s2 = m.apply(p, s, None, x)
        return jnp.mean(out**2), s2

    ins = sowviz.inspect(loss, p, s, x, has_aux=True)
    net = _node(ins.graph, "net")
    # the logits, not an EMA state `f32[1,8]` handed back beside them
    assert net.shapes[0] == "float32[16,3]", net.shapes
    (face,) = [
        q for q in ins.probes if q.node == net.id and q.summaries["primal"]["shape"] == [16, 3]
    ]
    out = m.apply(p, s, None, x)[0]
    dout = jax.grad(lambda o: jnp.mean(o**2))(out)
    np.testing.assert_allclose(
        face.summaries["cotangent"]["l2"], float(jnp.linalg.norm(dout)), rtol=1e-5
    )


def test_an_nnx_remat_card_shows_its_output_not_a_parameter_it_hands_back():
    nnx = pytest.importorskip("flax.nnx")

    class M(nnx.Module):
        def __init__(self, rngs):
            self.res = nnx.Linear(1, 1, rngs=rngs)

        def __call__(self, h, flag):
            def on(mod, h):
                return nnx.remat(lambda r, v: r(v))(mod.res, h) + h

            return nnx.cond(flag, on, lambda mod, h: h, self, h)

    mod = M(nnx.Rngs(0))
    h = jnp.linspace(-1.0, 1.0, 8).reshape(8, 1)
    ins = sowviz.inspect(lambda mod, h, f: jnp.mean(mod(h, f) ** 2), mod, h, jnp.asarray(True))
    (remat,) = [n for n in ins.graph.nodes if n.label.startswith("checkpoint")]
    assert remat.shapes[0] == "float32[8,1]", remat.shapes  # (it said `f32[1] +2`, a bias)
    got = _probe(ins, remat)["primal"]
    want = mod.res(h)
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(want)), rtol=1e-5)


def _fori_body(i, x):
    return jnp.tanh(x * 1.1) + 0.01 * i


@pytest.mark.parametrize("upper", ["static", "traced"])
def test_a_fori_loops_counter_is_no_box(upper):
    # `lax.fori_loop` carries `i` and adds 1 around your body: an `add i32[]` box at the
    # top of the opened loop, joined to nothing, that no line of yours wrote.
    def f(x, n):
        stop = 5 if upper == "static" else n
        return jnp.sum(jax.lax.fori_loop(0, stop, _fori_body, x))

    x, n = jnp.linspace(-1.0, 1.0, 3), jnp.asarray(5)
    # (a traced bound makes a while loop, which reverse mode cannot differentiate)
    mode = "grad" if upper == "static" else "primal"
    ins = sowviz.inspect(f, x, n, mode=mode)  # (argument 0 differentiated in mode grad)
    loop = next(nd for nd in ins.graph.nodes if nd.label.startswith("fori_loop"))
    held = {loop.id}  # the loop's nodes, its while loop's `body` scope's included
    for nd in ins.graph.nodes:
        if nd.parent in held:
            held.add(nd.id)
    inside = [nd for nd in ins.graph.nodes if nd.id in held - {loop.id}]
    assert not any(nd.label == "add" and nd.shapes == ("int32[]",) for nd in inside), [
        (nd.label, nd.shapes) for nd in inside
    ]
    assert any(nd.label == "tanh" for nd in inside)
    want = f(x, n)
    got = ins.result[0] if mode == "grad" else ins.result
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
    if mode == "grad":
        np.testing.assert_allclose(ins.result[1], jax.grad(f)(x, n), rtol=1e-6)


def test_a_counter_your_scan_body_carries_stays_a_box():
    def step(carry, _):
        c, x = carry
        return (c + 1, jnp.tanh(x) + 0.01 * c), None

    def f(x):
        (_, y), _ = jax.lax.scan(step, (jnp.asarray(0), x), None, length=4)
        return jnp.sum(y)

    ins = sowviz.inspect(f, jnp.linspace(-1.0, 1.0, 3))
    loop = next(nd for nd in ins.graph.nodes if nd.kind == "scan")
    assert any(
        nd.label == "add" and nd.shapes == ("int32[]",)
        for nd in ins.graph.nodes
        if nd.parent == loop.id
    )


def test_a_line_that_only_calls_is_named_by_what_it_calls(tmp_path):
    src = tmp_path / "prints.py"
    src.write_text(
        "def f(h, jax):\n"
        "    jax.debug.print('mean {m}', m=h.mean())\n"
        "    y = h * 2\n"
        "    print(y)\n"
        "    return y\n"
    )
    from sowviz.graph.source_text import called_alone

    assert called_alone(str(src), 2) == "jax.debug.print"
    assert called_alone(str(src), 4) == "print"
    assert called_alone(str(src), 3) is None  # it assigns: named by `y`
    assert called_alone(str(src), 5) is None


def test_a_debug_print_lines_run_in_a_big_level_is_named_by_the_call():
    # a big level folds each line; the print line assigns nothing and returns nothing:
    # it was named by its place (`mlp:8`)
    def mlp(ws, x):
        h = x
        for w in ws:
            h = jnp.tanh(h @ w)
            h = h * 1.01 + 0.1
            h = jnp.sin(h) + h
            jax.debug.print("mean {m}", m=h.mean())
        return jnp.sum(h**2)

    ws = [jnp.ones((4, 4)) * 0.1 * (k + 1) + 0.01 * k * jnp.eye(4) for k in range(6)]
    ins = sowviz.inspect(mlp, ws, jnp.ones((3, 4)))
    labels = [nd.label for nd in ins.graph.nodes]
    assert "jax.debug.print" in labels, labels
    assert not any(lb.startswith("mlp:") for lb in labels), labels
    want, grads = jax.value_and_grad(mlp)(ws, jnp.ones((3, 4)))
    np.testing.assert_allclose(float(ins.result[0]), float(want), rtol=1e-6)
    for got, g in zip(ins.result[1], grads, strict=True):
        np.testing.assert_allclose(got, g, rtol=1e-4, atol=1e-8)
