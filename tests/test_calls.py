"""The user's own functions as stages (`sowviz.graph.calls`): a program written as
plain functions, the way JAX's own tutorials write them, reads as its functions."""

from __future__ import annotations

import functools
import itertools
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import sowviz
from sowviz import _compat
from sowviz.graph import build_graph

HERE = Path(__file__)


def line_of(marker: str) -> int:
    """Line number in this file of the line ending with `# <marker>`."""
    for n, line in enumerate(HERE.read_text().splitlines(), start=1):
        if line.rstrip().endswith(f"# {marker}"):
            return n
    raise AssertionError(marker)


def graph_of(fn, *args):
    closed = jax.make_jaxpr(fn)(*args)
    n_in, n_out = len(closed.jaxpr.invars), len(closed.jaxpr.outvars)
    return build_graph(
        closed,
        in_names=[f"in{i}" for i in range(n_in)],
        out_names=[f"out{i}" for i in range(n_out)],
    )


def one(g, label, kind):
    (node,) = [n for n in g.nodes if n.label == label and n.kind == kind]
    return node


def _init(key, sizes):
    params = []
    for a, b in itertools.pairwise(sizes):
        key, k = jax.random.split(key)
        params.append((jax.random.normal(k, (a, b)) / jnp.sqrt(a), jnp.full((b,), 0.1)))
    return params


def _layer_norm(x, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + eps)


def _predict(params, x):
    for w, b in params[:-1]:  # a loop inside the call: still one call
        x = jax.nn.relu(_layer_norm(x @ w + b))  # @call_layer_norm
    w, b = params[-1]
    return x @ w + b


def _cross_entropy(logits, labels):
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


def _loss(params, x, y):
    logits = _predict(params, x)  # @call_predict
    return _cross_entropy(logits, y)  # @call_cross_entropy


PARAMS = _init(jax.random.PRNGKey(0), [8, 32, 32, 4])
XS = jax.random.normal(jax.random.PRNGKey(1), (16, 8))
YS = jnp.arange(16) % 4


def _stages(g, parent):
    return [n for n in g.children(parent.id) if n.label.startswith("_")]


def test_plain_functions_are_stages_named_and_sourced_at_their_calls():
    ins = sowviz.inspect(_loss, PARAMS, XS, YS)
    g = ins.graph
    value, grads = jax.value_and_grad(_loss)(PARAMS, XS, YS)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(ins.result[1]), jax.tree.leaves(grads), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    predict, xent = _stages(g, g.node(g.root))
    assert (predict.label, xent.label) == ("_predict", "_cross_entropy")
    assert predict.source.line == line_of("@call_predict")
    assert xent.source.line == line_of("@call_cross_entropy")
    assert not predict.collapsed  # the model's call starts open, as a module's does
    inner = [n for n in _stages(g, predict) if n.label.startswith("_layer_norm")]
    assert [n.label for n in inner] == ["_layer_norm", "_layer_norm#2"]
    assert {n.source.line for n in inner} == {line_of("@call_layer_norm")}
    assert "log_softmax" in [n.label for n in g.children(xent.id)]

    # Each carries its call's value, and the gradient of the loss with respect to it.
    logits = _predict(PARAMS, XS)
    got = ins.probe("_predict").summaries
    np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(logits), rtol=1e-5)
    np.testing.assert_allclose(got["primal"]["mean"], np.mean(logits), rtol=1e-5, atol=1e-7)
    cot = jax.grad(lambda z: _cross_entropy(z, YS))(logits)
    np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(cot), rtol=1e-5)
    (w0, b0), (w1, b1) = PARAMS[:2]
    h = jax.nn.relu(_layer_norm(XS @ w0 + b0))
    second = _layer_norm(h @ w1 + b1)
    got = ins.probe("_layer_norm#2").summaries

    def tail(z):
        w, b = PARAMS[-1]
        return _cross_entropy(jax.nn.relu(z) @ w + b, YS)

    np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(second), rtol=1e-5)
    np.testing.assert_allclose(
        got["cotangent"]["l2"], np.linalg.norm(jax.grad(tail)(second)), rtol=1e-5
    )


def _twice(x):
    return jnp.sin(x) * 2.0 + 1.0


def _chain(x, w):
    x = x @ w
    for _ in range(3):  # three calls in a row, from one line
        x = _twice(x)  # @call_twice
    return jnp.sum(jax.tree.map(lambda a: a * 3.0, x) ** 2)  # a lambda: no call of its own


def test_calls_from_one_line_in_a_loop_are_told_apart_and_a_lambda_is_no_stage():
    w = jnp.eye(3) * 0.5
    g = graph_of(_chain, XS[:, :3], w)
    # three calls, stacked as identical blocks, each holding its own equations once
    (stacked,) = [n for n in g.nodes if n.label == "_twice (×3)"]
    each = g.children(stacked.id)
    assert [n.label for n in each] == ["_twice", "_twice#2", "_twice#3"]
    assert all(n.source.line == line_of("@call_twice") for n in each)
    assert all([m.label for m in g.children(n.id)] == ["sin", "mul", "add"] for n in each)
    assert not any("lambda" in n.label for n in g.nodes)


def _scoped_twice(x):
    with jax.named_scope("norm"):  # a `with`: on Python 3.12 its cleanup code jumps back
        x = x / jnp.sqrt(jnp.mean(x**2) + 1e-5)
    return jnp.sin(x) * 2.0


def _scoped_chain(x, w):
    x = x @ w
    for _ in range(3):
        x = _scoped_twice(x)  # @call_scoped_twice
    return jnp.sum(x**2)


def test_calls_of_a_function_holding_a_with_block_are_told_apart():
    # A `with` block is no loop: its calls from one line in a loop are three stages.
    g = graph_of(_scoped_chain, XS[:, :3], jnp.eye(3) * 0.5)
    (stacked,) = [n for n in g.nodes if n.label == "_scoped_twice (×3)"]
    each = g.children(stacked.id)
    assert [n.label for n in each] == ["_scoped_twice", "_scoped_twice#2", "_scoped_twice#3"]
    assert all(n.source.line == line_of("@call_scoped_twice") for n in each)
    assert all("norm" in [m.label for m in g.children(n.id)] for n in each)


def _while_inside(x):
    i = 0
    while i < 2:  # a loop in the callee: its calls in a row cannot be told apart by line
        x = jnp.sin(x)
        i += 1
    return x


def test_a_function_with_a_while_loop_is_known_to_loop():
    assert _compat._has_loop(_while_inside.__code__)
    assert _compat._has_loop(_chain.__code__)
    assert not _compat._has_loop(_scoped_twice.__code__)
    assert not _compat._has_loop(_layer_norm.__code__)


def _smooth(w, h):
    def body(i, h):
        return 0.5 * h + 0.5 * jnp.tanh(h @ w)

    return jax.lax.fori_loop(0, 3, body, h)


def _refine(w, h):
    def body(i, h):
        return h + 0.1 * jnp.sin(h @ w)

    return jax.lax.fori_loop(0, 5, body, h)


def _two_loops(w, x):
    return jnp.sum(_refine(w, _smooth(w, x)) ** 2)


def test_a_call_making_one_loop_is_a_stage_around_it():
    # Both loops' bodies are `body`: the calls say which is which.
    g = graph_of(_two_loops, jnp.eye(3) * 0.5, XS[:, :3])
    for name in ("_smooth", "_refine"):
        call = one(g, name, "scope")
        assert [(n.label, n.kind) for n in g.children(call.id)] == [("fori_loop(body)", "scan")]


def _step(w, x):
    def mlp(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    value, grad = jax.value_and_grad(mlp)(w, x)
    return w - 0.1 * grad, value


def test_a_backward_pass_the_program_takes_is_a_stage_of_its_own():
    # The transposed equations keep tracebacks into `mlp`: `mlp (backward)`, as a named
    # scope's backward is, not a part of `mlp` nor a second call `mlp#2`.
    g = graph_of(_step, jnp.ones((3, 2)) / 3, jnp.ones((4, 3)))
    mlp = one(g, "mlp", "scope")
    inside = [n.primitive for n in g.children(mlp.id)]
    assert inside[:2] == ["dot_general", "tanh"] and "transpose" not in inside, inside
    back = one(g, "mlp (backward)", "scope")
    assert "transpose" in [n.primitive for n in g.children(back.id)]
    assert not any(n.label.startswith("mlp#") for n in g.nodes)


def _seq(p, xs):
    def cell(h, x):
        # `sin(wh)` is loop-invariant: linearizing the scan runs it once, before the loop
        h = jnp.tanh(h @ jnp.sin(p["wh"]) + x @ p["wx"])
        return h, h

    h, _ = jax.lax.scan(cell, jnp.zeros((xs.shape[1], p["wh"].shape[0])), xs)
    return h


def _seq_loss(p, xs):
    return jnp.mean(_seq(p, xs) ** 2)


def _seq_step(p, xs):
    value, grad = jax.value_and_grad(_seq_loss)(p, xs)
    return jax.tree.map(lambda a, g: a - 0.1 * g, p, grad), value


def test_a_train_step_through_a_scan_keeps_one_loss_and_its_backward_pass():
    # Linearizing `lax.scan` moves equations: the body's loop-invariant work before the
    # loop (its traceback starts at `cell`: it stood at the top level, under `h`), and
    # the zero tangent of the initial carry after the whole forward pass, read by
    # nothing (it split the loss into `_seq_loss` and `_seq_loss#2`, the latter with the
    # backward pass). The checks: JAX still moves them, and they are in their stages.
    p = {"wh": jnp.eye(4) * 0.5, "wx": jnp.ones((3, 4)) / 3}
    xs = jnp.ones((5, 2, 3))
    closed = jax.make_jaxpr(_seq_step)(p, xs)
    prims = [e.primitive.name for e in closed.jaxpr.eqns]
    assert prims.index("sin") < prims.index("scan"), prims
    g = graph_of(_seq_step, p, xs)
    top = [n.label for n in g.children(g.root) if n.kind == "scope"]
    assert top[:2] == ["_seq_loss", "_seq_loss (backward)"], top
    assert not any(n.label.startswith("_seq_loss#") for n in g.nodes)
    # (the moved loop-invariant work is not at the top level under `h`; a loop body's
    # line `h = jnp.tanh(...)` is a box of that name)
    assert not any(n.label == "h" for n in g.children(g.root))
    rnn = one(g, "_seq", "scope")
    inside = [n.label for n in g.children(rnn.id)]
    assert "sin" in inside and inside[-1] == "scan(cell)", inside
    back = one(g, "_seq (backward)", "scope")
    assert back.parent == one(g, "_seq_loss (backward)", "scope").id


def _critic(p, x):
    h = jnp.tanh(x @ p["w1"])
    return jnp.sum(h @ p["w2"])


def test_what_a_differentiated_function_keeps_for_its_backward_pass_is_said():
    # A gradient penalty differentiates `critic` inside the loss: `grad` drops its output,
    # and what leaves the stage is what its backward pass reads (1 - tanh(h)**2). The
    # stage says so, and in a train step its output comes first, named, beside the
    # values marked as kept for the backward pass.
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    p = {"w1": jax.random.normal(keys[0], (3, 8)), "w2": jax.random.normal(keys[1], (8,))}
    x = jax.random.normal(keys[2], (5, 3))

    def penalty(p, x):
        return jnp.mean(jax.grad(_critic, argnums=1)(p, x) ** 2)

    ins = sowviz.inspect(penalty, p, x)
    node = one(ins.graph, "_critic", "scope").id
    kept = [pr for pr in ins.probes if pr.node == node]
    # what JAX keeps differs between versions (1 - h**2 on 0.12, two parts of it on
    # 0.10); never the function's scalar output, always one value per hidden unit
    assert kept and all(pr.summaries["primal"]["shape"] == [5, 8] for pr in kept), kept
    assert not any("output" in pr.leaf for pr in kept)
    (note,) = [n for n in ins.to_dict()["notes"] if n["probe"] == node]
    assert "its own output is not used" in note["message"], note

    def step(p, x):
        return jax.value_and_grad(_critic)(p, x)

    ins = sowviz.inspect(step, p, x, mode="primal")
    node = one(ins.graph, "_critic", "scope").id
    leaves = {pr.leaf: pr.summaries["primal"] for pr in ins.probes if pr.node == node}
    assert next(iter(leaves)) == "['output']", list(leaves)
    assert leaves["['output']"]["mean"] == np.float32(_critic(p, x))
    saved = [s for k, s in leaves.items() if k.startswith("['saved for backward")]
    assert saved and all(s["shape"] == [5, 8] for s in saved), saved
    (note,) = [n for n in ins.to_dict()["notes"] if n["probe"] == node]
    assert f"{len(saved)} of its {len(leaves)} values" in note["message"], note
    # the backward pass's stage it names is there
    labels = {n.label for n in ins.graph.nodes}
    assert "(`_critic (backward)`)" in note["message"] and "_critic (backward)" in labels
    # a function's own lines, folded (`loss:9`), have no backward stage: none is named
    ins = sowviz.inspect(jax.jit(jax.value_and_grad(_folded_loss)), p, x, mode="primal")
    for n in ins.to_dict()["notes"]:
        for named in re.findall(r"\(`([^`]*\(backward\))`\)", n["message"]):
            assert named in {m.label for m in ins.graph.nodes}, n["message"]


def _folded_loss(p, x):
    logits = _predict2(p, x)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jnp.ones_like(logits), -1))


def _predict2(p, x):
    return jnp.tanh(x @ p["w1"]) * p["w2"]


def _named(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)

    return wrapper


@_named
def _dense(w, x):
    return jnp.tanh(x @ w)


def _heads(w, v, x):
    def f(h):  # a closure named as generically as optax's `update_fn`
        return jnp.sin(h) * 2.0 + h

    h = f(f(x))
    mu = _dense(w, h)  # @call_mu
    logvar = _dense(v, h)  # @call_logvar
    return jnp.sum(mu**2) + jnp.sum(jnp.exp(logvar))


def test_decorated_functions_closures_and_parallel_heads_read_as_written():
    # A decorator's `wrapper` is no name, a closure is named by itself, and two heads
    # alike called from two lines are two stages side by side, not a stack of blocks.
    w = jnp.eye(3) * 0.3
    g = graph_of(_heads, w, w * 0.5, XS[:, :3])
    labels = [n.label for n in g.nodes if n.kind == "scope"]
    assert "wrapper" not in " ".join(labels) and "_heads" not in labels, labels
    assert [n.label for n in g.children(one(g, "f (×2)", "scope").id)] == ["f", "f#2"]
    heads = [n for n in g.nodes if n.label.startswith("_dense")]
    assert [n.label for n in heads] == ["_dense", "_dense#2"], labels
    assert [n.source.line for n in heads] == [line_of("@call_mu"), line_of("@call_logvar")]
    assert all(n.parent == g.root for n in heads)


def _sgd_step(w, x):
    def loss(w):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    g = jax.grad(loss)(w)
    return w - 0.1 * g  # in the same call as the gradient


def _steps(w, x):
    w = _sgd_step(w, x)  # @call_sgd
    return jnp.sum(w), w


def test_a_call_taking_a_gradient_stays_one_stage_after_its_backward_pass():
    g = graph_of(_steps, jnp.eye(3) * 0.5, XS[:, :3])
    (step,) = [n for n in g.nodes if n.label.startswith("_sgd_step")]
    assert step.label == "_sgd_step" and step.source.line == line_of("@call_sgd")
    inside = [n.label for n in g.children(step.id)]
    assert inside[:2] == ["loss", "loss (backward)"] and inside[-1] == "w - 0.1 * g", (
        inside
    )  # (its return line's box)


def _cell(p, h, x):
    return jnp.tanh(h @ p["wh"] + x @ p["wx"])


def _readout(p, h):
    return h @ p["wo"]


def _rnn(p, xs):
    h = jnp.ones(4)
    preds = []
    for x in xs:  # a pass: two calls, `_cell` and `_readout`
        h = _cell(p, h, x)  # @call_cell
        preds.append(_readout(p, h))
    return jnp.mean(jnp.stack(preds) ** 2)


def test_alike_passes_of_a_loop_body_of_several_calls_are_stacked():
    # 8 passes of `h = cell(...); readout(h)`: not 16 sibling stages in a cascade,
    # but the passes stacked; each pass holds its two calls. The last pass's `h` is
    # read by nothing, which is no reason to draw it apart: all 8 are one stack.
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    p = {
        "wh": jax.random.normal(k[0], (4, 4)) * 0.3,
        "wx": jax.random.normal(k[1], (3, 4)) * 0.3,
        "wo": jax.random.normal(k[2], (4, 2)) * 0.3,
    }
    xs = jax.random.normal(jax.random.PRNGKey(1), (8, 3))
    ins = sowviz.inspect(_rnn, p, xs)
    value = jax.value_and_grad(_rnn)(p, xs)[0]
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    g = ins.graph
    top = [n.label for n in g.children(g.root)]
    assert "_cell · _readout (×8)" in top and "_cell · _readout#8" not in top, top
    (stack,) = [n for n in g.nodes if n.label == "_cell · _readout (×8)"]
    passes = g.children(stack.id)
    assert len(passes) == 8 and all(n.source.line == line_of("@call_cell") for n in passes)
    for n in passes:  # (JAX 0.10 slices each `x` inside the pass; 0.12 unstacks before)
        calls = [c.label for c in g.children(n.id) if c.kind == "scope"]
        assert calls == ["_cell", "_readout"], [c.label for c in g.children(n.id)]
    # the pass's `_readout`, one equation, is a stage too: its value has a probe
    h = jnp.ones(4)
    for x in xs[:3]:
        h = _cell(p, h, x)
    got = ins.probe("_cell · _readout#3/_readout").summaries["primal"]
    np.testing.assert_allclose(got["l2"], np.linalg.norm(_readout(p, h)), rtol=1e-5)


def _made_then_read(w, x):
    a = jnp.sin(x * w)  # returned, and read again below
    b = 2.0 * a
    return b, a


def test_an_output_the_stage_reads_again_carries_its_whole_gradient():
    # `a` leaves `_made_then_read` and is read inside it after it is made: its probe sees the
    # cotangent of both reads (dloss/da = 2 + 1), not only of the read outside.
    def loss(w, x):
        b, a = _made_then_read(w, x)
        return jnp.sum(b) + jnp.sum(a**2)

    w, x = jnp.float32(0.5), jnp.arange(4.0)
    ins = sowviz.inspect(loss, w, x)
    a = jnp.sin(x * w)
    want = {  # by each output's primal mean
        float(a.mean()): jax.grad(lambda a: jnp.sum(2.0 * a) + jnp.sum(a**2))(a),
        float((2.0 * a).mean()): jnp.ones_like(a),
    }
    leaves = [p for p in ins.probes if p.name == "_made_then_read"]
    assert sorted(p.leaf for p in leaves) == ["[0]", "[1]"], [p.leaf for p in leaves]
    for p in leaves:
        (ct,) = [c for m, c in want.items() if np.isclose(m, p.summaries["primal"]["mean"])]
        got = p.summaries["cotangent"]
        np.testing.assert_allclose(
            [got["mean"], got["l2"]], [ct.mean(), np.linalg.norm(ct)], rtol=1e-5
        )


def _decode_step(w, x, cache):
    cache = cache.at[0].set(x * 3.0)  # made first, returned second
    y = jnp.tanh(x @ w)
    return y, cache


def _decode_sum(w, x, cache):
    total = jnp.sum(cache) + jnp.sum(x)  # made first, returned second
    y = jnp.tanh(x @ w)
    return y * 2, total


def _attend(w, x, kc):
    kc = kc.at[1].set(x @ w)  # made first, returned second
    return x + jnp.tanh(kc[0] @ w), kc  # the one expression: made on this line


def _two_caches(w, x, kc, vc):
    kc = kc.at[0].set(x); vc = vc.at[1].set(x * 2)  # noqa: E702  # fmt: skip
    return jnp.tanh(x @ w), kc, vc


def _decode(w, x):
    y, cache = _decode_step(w, x, jnp.zeros((4, 8)))
    a, b = _decode_sum(w, x, cache)
    h, kc = _attend(w, x, cache)
    o, k2, v2 = _two_caches(w, x, cache, cache)
    out = jnp.sum(y) + jnp.sum(cache) + jnp.sum(a) + b + jnp.sum(h * kc[1])
    return out + jnp.sum(o) + jnp.sum(k2 * v2)


def test_a_calls_outputs_are_numbered_as_it_returns_them():
    # `_decode_step` makes `cache` first and returns `(y, cache)`: its `[0]` was the
    # cache, the order the program made them in.
    w, x = jnp.eye(8) * 0.5, jnp.arange(8.0) / 8
    y, cache = _decode_step(w, x, jnp.zeros((4, 8)))
    h, _ = _attend(w, x, cache)
    for mode in ("primal", "grad"):
        ins = sowviz.inspect(_decode, w, x, mode=mode)
        first, second = ins.probe("_decode_step", "[0]"), ins.probe("_decode_step", "[1]")
        assert first.summaries["primal"]["shape"] == [8]
        np.testing.assert_allclose(first.summaries["primal"]["max"], float(y.max()), rtol=1e-6)
        assert second.summaries["primal"]["shape"] == [4, 8]
        np.testing.assert_allclose(second.summaries["primal"]["max"], float(cache.max()), rtol=1e-6)
        assert one(ins.graph, "_decode_step", "scope").shapes == ("float32[8]", "float32[4,8]")
        assert one(ins.graph, "_attend", "scope").shapes == ("float32[8]", "float32[4,8]")
        got = ins.probe("_attend", "[0]").summaries["primal"]["max"]
        np.testing.assert_allclose(got, float(h.max()), rtol=1e-6)
        # two statements on one line: the column says which made which cache
        assert (
            one(ins.graph, "_two_caches", "scope").shapes == ("float32[8]",) + ("float32[4,8]",) * 2
        )
        k2, v2 = ins.probe("_two_caches", "[1]"), ins.probe("_two_caches", "[2]")
        want_k, want_v = cache.at[0].set(x), cache.at[1].set(x * 2)
        np.testing.assert_allclose(k2.summaries["primal"]["max"], float(want_k.max()), rtol=1e-6)
        np.testing.assert_allclose(v2.summaries["primal"]["mean"], float(want_v.mean()), rtol=1e-6)
        # `return y * 2, total`: the expression made on the return line is [0]
        assert one(ins.graph, "_decode_sum", "scope").shapes == ("float32[8]", "float32[]")


def _residual_block(p, x):
    x = x + jnp.tanh(x @ p["w"])
    return x * 2.0


def test_your_function_under_jit_or_checkpoint_carries_data_as_unwrapped():
    # A transformer block under `jax.checkpoint(policy=...)` (or `jax.jit`, or
    # `jax.named_call`) drew its residual `add`s as boxes with no value and no
    # gradient; unwrapped they had both.
    p = {"w": jnp.linspace(-1.0, 1.0, 9).reshape(3, 3)}
    x = jnp.linspace(-2.0, 2.0, 6).reshape(2, 3)
    e = x + jnp.tanh(x @ p["w"])  # the residual add's value; loss = sum((2e)^2)
    policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    wrappers = {
        "jit": jax.jit(_residual_block),
        "checkpoint": jax.checkpoint(_residual_block, policy=policy),
        "jit(checkpoint)": jax.jit(jax.checkpoint(_residual_block)),
        "named_call": jax.named_call(_residual_block, name="_residual_block"),
    }
    for name, block in wrappers.items():
        ins = sowviz.inspect(lambda p, x, block=block: jnp.sum(block(p, x) ** 2), p, x)
        # (the residual line `x = x + ...` is a box named `x`, its value the add's, in a
        # function's stage; in a named scope's, which draws its equations, the `add`)
        inner = [n for n in ins.graph.nodes if n.parent != ins.graph.root]
        adds = [n for n in inner if n.label == "x"] or [n for n in inner if n.label == "add"]
        assert len(adds) == 1, (name, [n.label for n in ins.graph.nodes])
        (probe,) = [q for q in ins.probes if q.node == adds[0].id]
        got = probe.summaries
        np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(e), rtol=1e-5)
        np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(8 * e), rtol=1e-5)


def _fit_by_bfgs(x0, c):
    def objective(x):
        return jnp.sum((x - c) ** 2) + 0.1 * jnp.sum(x**4)

    from jax.scipy.optimize import minimize

    return minimize(objective, x0, method="BFGS").x  # @bfgs_call


def test_a_function_a_library_calls_back_is_drawn_inside_that_call():
    # `minimize(objective, x0)` evaluates `objective` and its gradient before its loop:
    # the program was drawn `minimize`, `objective`, `objective (backward)`,
    # `minimize#2` (the first evaluation pulled out between two halves of the call);
    # in the line search, inside the loop, the same function was a fold `_fit_by_bfgs:N`.
    x0, c = jnp.array([0.5, -1.0]), jnp.array([1.0, 2.0])
    ins = sowviz.inspect(_fit_by_bfgs, x0, c, mode="primal")
    g = ins.graph
    top = [n.label for n in g.children(g.root) if n.kind not in ("input", "output")]
    assert top == ["minimize"], top
    bfgs = one(g, "minimize_bfgs", "scope")
    assert bfgs.parent == one(g, "minimize", "scope").id
    inside = [n.label for n in g.children(bfgs.id)]
    assert inside.index("objective") < inside.index("objective (backward)"), inside
    assert inside.index("objective (backward)") < inside.index("while(body_fun)"), inside
    assert one(g, "minimize", "scope").source.line == line_of("@bfgs_call")
    # the first evaluation's value and gradient, at x0
    value = ins.probe("minimize_bfgs/objective", leaf="output").summaries["primal"]
    want = jnp.sum((x0 - c) ** 2) + 0.1 * jnp.sum(x0**4)
    np.testing.assert_allclose(value["mean"], float(want), rtol=1e-6)
    grad = ins.probe("minimize_bfgs/objective (backward)").summaries["primal"]
    want_g = np.asarray(2 * (x0 - c) + 0.4 * x0**3)
    np.testing.assert_allclose(grad["l2"], np.linalg.norm(want_g), rtol=1e-6)
    np.testing.assert_allclose(grad["min"], want_g.min(), rtol=1e-6)
    np.testing.assert_allclose(ins.result, jax.jit(_fit_by_bfgs)(x0, c), rtol=1e-6)
    # in the loop the line search's evaluations are named alike, not by a line
    loop = one(g, "while(body_fun)", "while")
    below, todo = [], [loop.id]
    while todo:
        kids = g.children(todo.pop())
        below += [n.label for n in kids]
        todo += [n.id for n in kids]
    assert "objective" in below, below
    assert not [lbl for lbl in below if re.fullmatch(r"\w+:\d+", lbl)], below


@jax.jit
def _inner_update(p, x, y):
    grads = jax.grad(lambda p: jnp.mean((jnp.tanh(x @ p) - y) ** 2))(p)
    return p - 0.05 * grads


def test_a_scan_whose_body_is_your_jitted_function_is_named_by_it():
    # MAML's inner loop: `lax.scan(lambda p, _: (inner_update(p, x, y), None), ...)`
    # with a jitted `inner_update` read `scan`
    x = jnp.linspace(-1.0, 1.0, 8).reshape(4, 2)
    y = jnp.sin(x[:, :1])

    def maml(p, x, y):
        q, _ = jax.lax.scan(lambda q, _: (_inner_update(q, x, y), None), p, None, length=3)
        return jnp.mean((jnp.tanh(x @ q) - y) ** 2)

    p = jnp.full((2, 1), 0.3)
    ins = sowviz.inspect(maml, p, x, y)
    (scan,) = [n for n in ins.graph.nodes if n.kind == "scan"]
    assert scan.label == "scan(_inner_update)", scan.label
    np.testing.assert_allclose(ins.result[1], jax.grad(maml)(p, x, y), rtol=1e-5)


def test_stax_layers_are_stages_named_by_their_layer():
    # `jax.example_libraries.stax` layers are closures in one JAX file: `serial`
    # opened onto bare `dot_general`s and a `relu (×2)` stack out of phase with them.
    from jax.example_libraries import stax

    init, predict = stax.serial(stax.Dense(6), stax.Relu, stax.Dense(3), stax.LogSoftmax)
    _, params = init(jax.random.PRNGKey(0), (-1, 4))
    x = jnp.linspace(-1.0, 1.0, 20).reshape(5, 4)

    def loss(params, x):
        return -jnp.mean(predict(params, x)[:, 0])

    ins = sowviz.inspect(loss, params, x)
    g = ins.graph
    (serial,) = [n for n in g.children(g.root) if n.label == "serial"]
    assert [n.label for n in g.children(serial.id)] == [
        "Dense",
        "relu",
        "Dense#2",
        "log_softmax",
    ]
    # the first Dense's value, and the loss's gradient with respect to it
    (w0, b0), _, (w1, b1), _ = params
    h = x @ w0 + b0
    rest = lambda h: -jnp.mean(jax.nn.log_softmax(jax.nn.relu(h) @ w1 + b1)[:, 0])  # noqa: E731
    got = ins.probe("serial/Dense").summaries
    np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(h), rtol=1e-5)
    np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(jax.grad(rest)(h)), rtol=1e-5)


def _affine(params, x):
    w, b = params
    return x @ w + b


_LAYERS = [_affine, lambda params, x: jax.nn.relu(x)] * 3 + [_affine]


def _sequential(params, x):
    for layer, p in zip(_LAYERS, params, strict=True):
        x = layer(p, x)
    return x


def test_a_layer_list_with_lambdas_between_its_calls_reads_as_its_layers():
    # `for layer, p in zip(layers, params): x = layer(p, x)` with lambdas among the
    # layers: the lambdas' work on the loop's line looked like a library's around each
    # later call, which was drawn as called back by it (`Relu` holding three `_affine`).
    params = [
        (jnp.linspace(-0.5, 0.5, 16).reshape(4, 4) * (k + 1), jnp.full((4,), 0.1))
        if k % 2 == 0
        else ()
        for k in range(len(_LAYERS))
    ]
    x = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)

    def loss(params, x):
        return jnp.sum(_sequential(params, x) ** 2)

    ins = sowviz.inspect(loss, params, x)
    g = ins.graph
    (seq,) = [n for n in g.children(g.root) if n.label == "_sequential"]
    assert [n.label for n in g.children(seq.id)] == [
        "_affine",
        "relu",
        "_affine#2",
        "relu#2",
        "_affine#3",
        "relu#3",
        "_affine#4",
    ]
    # the third dense layer's value and gradient
    h = x
    for layer, p in zip(_LAYERS[:5], params[:5], strict=True):
        h = layer(p, h)
    rest = lambda h: jnp.sum(_affine(params[6], jax.nn.relu(h)) ** 2)  # noqa: E731
    got = ins.probe("_sequential/_affine#3").summaries
    np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(h), rtol=1e-5)
    np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(jax.grad(rest)(h)), rtol=1e-5)


def _energy(w, z):
    # a kinetic term keeps the Hessian in the velocities well conditioned
    return jnp.sum(jnp.tanh(z @ w)) + jnp.sum(z[2:] ** 2)


def _eom(lagrangian, state):
    q, v = jnp.split(state, 2)
    a = jnp.linalg.pinv(jax.hessian(lagrangian, 1)(q, v)) @ (
        jax.grad(lagrangian, 0)(q, v) - jax.jacobian(jax.jacobian(lagrangian, 1), 0)(q, v) @ v
    )
    return jnp.concatenate([v, a])


def _lnn_loss(w, states):
    lagrangian = lambda q, v: _energy(w, jnp.concatenate([q, v]))  # noqa: E731
    return jnp.mean(jax.vmap(lambda s: _eom(lagrangian, s))(states) ** 2)


def test_a_call_differentiating_a_closure_several_times_is_one_stage():
    # A Lagrangian network's `_eom` takes a Hessian, a gradient and a Jacobian of
    # Jacobians of its closure. JAX traces each forward, backward (transposed in reverse
    # order) and forward again, inside the one call: read as calls going back and new
    # passes, they drew `_eom`, `_eom#2` … and `_eom (backward)` (the closure's backward
    # pass), side by side.
    w = jax.random.normal(jax.random.PRNGKey(0), (4, 8)) * 0.5
    states = jax.random.normal(jax.random.PRNGKey(1), (16, 4))
    ins = sowviz.inspect(_lnn_loss, w, states, mode="grad")
    calls = [n for n in ins.graph.nodes if n.label.startswith("_eom")]
    assert [n.label for n in calls] == ["_eom"], [n.label for n in calls]
    # its value and gradient are the vmapped call's
    lagrangian = lambda q, v: _energy(w, jnp.concatenate([q, v]))  # noqa: E731
    preds = jax.vmap(lambda s: _eom(lagrangian, s))(states)
    got = ins.probe("_eom").summaries
    np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(preds), rtol=1e-4)
    np.testing.assert_allclose(got["primal"]["mean"], np.mean(preds), rtol=1e-4, atol=1e-6)
    cot = 2 * preds / preds.size  # d mean(preds ** 2) / d preds
    np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(cot), rtol=1e-4)
    value, grad = jax.value_and_grad(_lnn_loss)(w, states)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-5)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-4, atol=1e-6)


def _u_net(p, x, t):
    return jnp.tanh(p["w"] @ jnp.stack([x, t]) + p["b"]) @ p["v"]


def _residual(p, x, t):
    u = _u_net(p, x, t)
    u_t = jax.grad(_u_net, argnums=2)(p, x, t)
    u_x = jax.grad(_u_net, argnums=1)(p, x, t)
    return u_t + u * u_x


def _pinn_loss(p, xs, ts):
    return jnp.mean(jax.vmap(_residual, (None, 0, 0))(p, xs, ts) ** 2)


def test_a_kept_for_backward_note_names_its_own_calls_backward_pass():
    # Two gradients of `_u_net` in one function, each a box named by its line (`u_t`,
    # `u_x`) holding `_u_net` and its own `_u_net (backward)`; both notes named the first.
    from sowviz.graph.saved import backward_stage, readers

    k = jax.random.split(jax.random.PRNGKey(0), 2)
    p = {
        "w": jax.random.normal(k[0], (16, 2)),
        "b": jnp.zeros(16),
        "v": jax.random.normal(k[1], (16,)) / 4,
    }
    xs, ts = jnp.linspace(-1, 1, 8), jnp.linspace(0, 1, 8)
    ins = sowviz.inspect(_pinn_loss, p, xs, ts, mode="grad")
    g = ins.graph
    label = {n.id: n.label for n in g.nodes}
    backs, said = {}, []
    for node in ("u_t", "u_x"):
        (box,) = [i for i, x in label.items() if x == node]
        (nid,) = [n.id for n in g.nodes if n.parent == box and n.label == "_u_net"]
        backs[node] = backward_stage(
            "_u_net", readers(nid, [(e.source, e.target) for e in g.edges], label)
        )
        # a note names no backward pass but the one its values go to
        for n in ins.to_dict()["notes"]:
            if n["probe"] == nid:
                for named in re.findall(r"\(`([^`]*\(backward\)[^`]*)`\)", n["message"]):
                    assert named == backs[node], (node, n["message"])
                    said.append(named)
    assert said, "the notes name their calls' backward passes"
    assert backs == {"u_t": "_u_net (backward)", "u_x": "_u_net (backward)"}, backs
    # and those are the gradients in t, then in x
    u_t = jax.vmap(jax.grad(_u_net, argnums=2), (None, 0, 0))(p, xs, ts)
    u_x = jax.vmap(jax.grad(_u_net, argnums=1), (None, 0, 0))(p, xs, ts)
    for stage, want in (("u_t/_u_net (backward)", u_t), ("u_x/_u_net (backward)", u_x)):
        got = ins.probe(stage).summaries["primal"]
        np.testing.assert_allclose(got["mean"], np.mean(want), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got["l2"], np.linalg.norm(want), rtol=1e-4)
    # with the graph's labels, two backward passes of `_u_net`: the note names neither
    assert backward_stage("_u_net#3", list(label.values())) is None
    assert (
        backward_stage("_critic", {"_critic", "_critic (backward)", "loss:9"})
        == "_critic (backward)"
    )


_FAKE_LIBRARY = '''
import jax.numpy as jnp


def _normalised(h):
    return h / jnp.sqrt(jnp.sum(h * h, axis=-1, keepdims=True) + 1.0)


def Convolution(w):
    """A layer as jraph makes one: a factory returning a private closure."""

    def _ApplyConvolution(x):
        h = jnp.tanh(x @ w)
        return _normalised(h + jnp.mean(h, axis=0))

    return _ApplyConvolution
'''


def _convolved(w, x, lib):
    first, second = lib.Convolution(w), lib.Convolution(w.T)
    h = first(x)
    y = second(h)
    return jnp.sum(y**2)


def test_a_library_s_private_closure_is_named_by_the_function_that_made_it(tmp_path, monkeypatch):
    # jraph's `GraphConvolution(...)` returns its closure `_ApplyGCN`: the boxes read
    # `_ApplyGCN`, `_ApplyGCN#2`, a name the user never wrote, where optax's
    # `scale_by_adam.<locals>.update_fn` reads `scale_by_adam`
    import importlib

    installed = tmp_path / "site-packages"  # an installed package's file: a library's
    installed.mkdir()
    (installed / "fakegnn.py").write_text(_FAKE_LIBRARY)
    monkeypatch.syspath_prepend(str(installed))
    lib = importlib.import_module("fakegnn")
    w = jax.random.normal(jax.random.PRNGKey(0), (4, 4)) / 2
    x = jax.random.normal(jax.random.PRNGKey(1), (6, 4))
    ins = sowviz.inspect(functools.partial(_convolved, lib=lib), w, x)
    labels = [n.label for n in ins.graph.children(ins.graph.root)]
    assert "Convolution" in labels and "Convolution#2" in labels, labels
    assert not [n.label for n in ins.graph.nodes if "_Apply" in n.label]
    first = lib.Convolution(w)(x)
    second = lib.Convolution(w.T)(first)
    for name, value in (("Convolution", first), ("Convolution#2", second)):
        got = ins.probe(name).summaries["primal"]
        np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(value)), rtol=1e-5)
    # the second layer's output's gradient: d sum(y^2) / dy = 2 y
    got = ins.probe("Convolution#2").summaries["cotangent"]
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(2 * second)), rtol=1e-5)
    # named so only once its maker has returned it: a private helper running inside
    # the function that made it (diffrax's `_allocate_output` in `diffeqsolve`) keeps
    # its own name
    handed = lib.Convolution(w).__code__
    assert _compat._handed_out_by(handed, []) == "Convolution"
    assert _compat._handed_out_by(handed, [lib.Convolution.__code__]) is None


def _shift(pos, action):  # batched by `jax.vmap`, the switch runs every branch inline
    return jax.lax.switch(action, [lambda p: p + 1.0, lambda p: p - 1.0, lambda p: p * 2.0], pos)


def _walk(pos, action):
    new = _shift(pos, action)
    hit = jnp.any(jnp.abs(new) > 2.0)
    return jnp.where(hit, pos, new)


def _walks(w, pos, actions):
    return jnp.sum(jax.vmap(_walk)(pos / w, actions) ** 2)


def test_a_switch_batched_by_vmap_stays_in_the_call_that_made_it():
    # Under `jax.vmap` a switch on a batched index runs each branch inline, and JAX
    # traced each branch with a traceback of its own: the branches' `add`, `sub` and
    # `mul` stood between the call's equations with no call, and cut `_walk` into
    # `_walk`, loose boxes, `_walk#2`, `_walk#3`
    w = jnp.float32(0.7)
    pos = jax.random.normal(jax.random.PRNGKey(0), (5, 2))
    actions = jnp.array([0, 1, 2, 1, 0])
    ins = sowviz.inspect(_walks, w, pos, actions)
    g = ins.graph
    assert [n.label for n in g.nodes if re.match(r"_walk\b", n.label)] == ["_walk"]
    walk = one(g, "_walk", "scope")
    shift = one(g, "_shift", "scope")
    assert shift.parent == walk.id
    inside = {walk.id}
    for n in g.nodes:  # (parents come before children)
        if n.parent in inside:
            inside.add(n.id)
    branch_work = [n for n in g.nodes if n.kind == "eqn" and n.label in ("add", "sub", "mul")]
    assert branch_work and all(n.id in inside for n in branch_work), branch_work
    walked = jax.vmap(_walk)(pos / w, actions)
    got = ins.probe("_walk").summaries
    np.testing.assert_allclose(got["primal"]["l2"], float(jnp.linalg.norm(walked)), rtol=1e-5)
    np.testing.assert_allclose(
        got["cotangent"]["l2"], float(jnp.linalg.norm(2 * walked)), rtol=1e-5
    )
    np.testing.assert_allclose(float(ins.result[0]), float(_walks(w, pos, actions)), rtol=1e-6)
