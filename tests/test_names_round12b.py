"""Round 12b of the graph's names: user lines that still drew as primitives. A loop of
lines alone draws a box per pass (`x`, `x#2`), a user function's return line is a box
(`x @ w + b`), a line that is one call named like its own equation is named by what it
assigns (`k_cache`, not `lt`, `add`, `select_n`, `dynamic_update_slice`), two calls of
one function on two lines are two boxes (`repeat`, `repeat#2`), and a loop's two lines
never share a box named after one of them."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import sowviz


def _kids(g, label):
    (parent,) = (n for n in g.nodes if n.label == label and n.kind != "input")
    return [n.label for n in g.children(parent.id)]


def _lines_of(g, node):
    # the source lines of the equations a node holds, however deep
    kids = g.children(node.id)
    if not kids:
        return {node.source.line} if node.source is not None else set()
    return set().union(*(_lines_of(g, k) for k in kids))


# --- the JAX tutorial's MLP: a loop of lines alone, and a return line -----------------


def _predict(params, x):
    for p in params[:-1]:
        x = jax.nn.relu(x @ p["w"] + p["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def _mlp_loss(params, x, y):
    return jnp.mean((_predict(params, x) - y) ** 2)


def _mlp():
    ks = jax.random.split(jax.random.PRNGKey(0), 3)
    sizes = (8, 32, 32, 1)
    params = [
        {"w": jax.random.normal(k, (a, b)) / a**0.5, "b": jnp.linspace(-0.1, 0.1, b)}
        for k, a, b in zip(ks, sizes[:-1], sizes[1:], strict=True)
    ]
    x = jax.random.normal(jax.random.PRNGKey(1), (32, 8))
    return params, x, jnp.ones((32, 1))


def test_each_pass_of_a_loop_of_lines_and_the_return_line_are_boxes():
    # `predict` opened on `dot_general`, `broadcast_in_dim`, `add`, `relu`, twice, then
    # `dot_general`, `broadcast_in_dim`, `add`: the passes differ in shape (8 -> 32,
    # 32 -> 32), so nothing stacked them, and no box carried a layer's value
    params, x, y = _mlp()
    ins = sowviz.inspect(_mlp_loss, params, x, y)
    g = ins.graph
    assert _kids(g, "_predict") == ["x", "x#2", "x @ w + b"], _kids(g, "_predict")
    assert _kids(g, "x") == ["dot_general", "broadcast_in_dim", "add", "relu"]
    # each box shows its layer's value and d loss / d value, as plain JAX computes them
    h1 = jax.nn.relu(x @ params[0]["w"] + params[0]["b"])
    h2 = jax.nn.relu(h1 @ params[1]["w"] + params[1]["b"])

    def rest(h2):
        return jnp.mean((h2 @ params[2]["w"] + params[2]["b"] - y) ** 2)

    got = ins.probe("x#2").summaries
    np.testing.assert_allclose(got["primal"]["l2"], float(jnp.linalg.norm(h2)), rtol=1e-5)
    want = jax.grad(rest)(h2)
    np.testing.assert_allclose(got["cotangent"]["l2"], float(jnp.linalg.norm(want)), rtol=1e-4)
    out = ins.probe("x @ w + b").summaries["primal"]
    np.testing.assert_allclose(out["mean"], float(_predict(params, x).mean()), rtol=1e-5)
    # the bias's gradient, on its input, is plain JAX's
    grads = jax.grad(_mlp_loss)(params, x, y)
    np.testing.assert_allclose(
        np.asarray(ins.result[1][0]["b"]), np.asarray(grads[0]["b"]), rtol=1e-5, atol=1e-7
    )


def _hidden(w, x):
    h = jax.nn.relu(x @ w + 1.0)
    g = jax.nn.relu(h)
    return g * h


def _relu_line(w, x):
    return jnp.sum(_hidden(w, x))


def test_a_line_ending_in_a_library_activation_is_one_box():
    # in a function of yours, `relu` (a custom derivative, no call in its traceback)
    # after the line's own `x @ w + 1`: one box `h`, as a `jnp.tanh` line is (it was
    # `dot_general`, `add`, `relu`); `g = jax.nn.relu(h)`, the one call, keeps its box;
    # so does the return line's one `mul` (the call's stage shows its value)
    w = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)
    x = jnp.linspace(-2.0, 2.0, 6).reshape(2, 3)
    ins = sowviz.inspect(_relu_line, w, x)
    g = ins.graph
    assert _kids(g, "_hidden") == ["h", "relu", "mul"], _kids(g, "_hidden")
    got = ins.probe("h").summaries["primal"]
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(jax.nn.relu(x @ w + 1.0))))


# --- a call named like one of its equations --------------------------------------------


def _kv_step(k_cache, v_cache, k, v, tokens, i):
    tok = lax.dynamic_slice(tokens, (0, i), (2, 1))
    k_cache = lax.dynamic_update_slice(k_cache, k, (0, i, 0, 0))
    v_cache = lax.dynamic_update_slice(v_cache, v, (0, i, 0, 0))
    return k_cache, v_cache, tok


def test_a_cache_update_line_is_named_by_what_it_assigns():
    # `lt`, `add`, `select_n`, `dynamic_update_slice` per line (the index clamp), K's and
    # V's updates alike
    r = [jax.random.normal(jax.random.PRNGKey(s), sh) for s, sh in enumerate([(2, 8, 2, 4)] * 2)]
    k, v = jnp.ones((2, 1, 2, 4)), -jnp.ones((2, 1, 2, 4))
    tokens, i = jnp.arange(16).reshape(2, 8), jnp.int32(3)
    ins = sowviz.inspect(_kv_step, *r, k, v, tokens, i, mode="primal")
    g = ins.graph
    top = [n.label for n in g.children(g.root) if n.source is not None]
    # (numbered after the argument it rebinds, as its probe path is: round 15)
    assert top == ["tok", "k_cache#2", "v_cache#2"], top
    assert _kids(g, "k_cache#2")[-1] == "dynamic_update_slice"
    want = lax.dynamic_update_slice(r[1], v, (0, 3, 0, 0))
    (box,) = (n for n in g.children(g.root) if n.label == "v_cache#2" and n.kind == "scope")
    (probe,) = (p for p in ins.probes if p.node == box.id)
    assert ins.probe_path(probe) == "v_cache#2"
    got = probe.summaries["primal"]
    np.testing.assert_allclose(got["mean"], float(want.mean()), rtol=1e-5)


@jax.jit
def _block(h, p):
    return jnp.tanh(h @ p["w"] + p["b"]), None


def _stack_leaves(params, x):
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *params)
    h, _ = lax.scan(_block, x, stacked)
    return jnp.mean(h**2)


def test_a_tree_map_of_stacks_is_one_box():
    # two boxes `stack` (one per leaf, `jnp.stack` named like its equation) before
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    params = [{"w": jax.random.normal(k, (16, 16)) / 4, "b": jnp.zeros(16)} for k in keys]
    x = jax.random.normal(jax.random.PRNGKey(1), (32, 16))
    ins = sowviz.inspect(_stack_leaves, params, x)
    g = ins.graph
    top = [n.label for n in g.children(g.root) if n.source is not None]
    assert top[0] == "stacked" and "stack" not in top, top
    assert sorted(len(n.shapes) for n in g.children(g.root) if n.label == "stacked") == [2]


# --- two calls of one function on two lines --------------------------------------------


def _gqa(w, x):
    with jax.named_scope("attn"):  # a big level: a stage's own lines are not line boxes
        q = (x @ w["q"]).reshape(2, 8, 4, 8)
        k = (x @ w["k"]).reshape(2, 8, 2, 8)
        v = (x @ w["v"]).reshape(2, 8, 2, 8)
        q = q * jnp.cos(q) + 1.0
        k = k * jnp.sin(k) - 1.0
        k = jnp.repeat(k, 2, axis=2)
        v = jnp.repeat(v, 2, axis=2)
        logits = jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(8.0)
        probs = jax.nn.softmax(logits, axis=-1)
        out = jnp.einsum("bhts,bshd->bthd", probs, v).reshape(2, 8, 32)
    return jnp.mean(out**2)


def test_two_lines_calling_one_function_are_two_boxes():
    # `k = jnp.repeat(...)` and `v = jnp.repeat(...)` were one box `repeat` with both
    # outputs, its card showing k's gradient only
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    w = {
        n: jax.random.normal(k, (16, s)) / 4
        for n, k, s in zip("qkv", ks[:3], (32, 16, 16), strict=True)
    }
    x = jax.random.normal(ks[3], (2, 8, 16))
    ins = sowviz.inspect(_gqa, w, x)
    g = ins.graph
    reps = [n for n in g.nodes if n.label.startswith("repeat")]
    assert [n.label for n in reps] == ["repeat", "repeat#2"], [n.label for n in reps]
    assert [len(n.shapes) for n in reps] == [1, 1]
    assert [_lines_of(g, n) for n in reps] == [{reps[0].source.line}, {reps[0].source.line + 1}]

    def rest(vr):  # d loss / d (v repeated)
        q = (x @ w["q"]).reshape(2, 8, 4, 8)
        k = (x @ w["k"]).reshape(2, 8, 2, 8)
        q, k = q * jnp.cos(q) + 1.0, jnp.repeat(k * jnp.sin(k) - 1.0, 2, axis=2)
        probs = jax.nn.softmax(jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(8.0), axis=-1)
        return jnp.mean(jnp.einsum("bhts,bshd->bthd", probs, vr) ** 2)

    vr = jnp.repeat((x @ w["v"]).reshape(2, 8, 2, 8), 2, axis=2)
    got = ins.probe("repeat#2").summaries["cotangent"]
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(jax.grad(rest)(vr))), rtol=1e-4)


# --- a loop's two lines: never one box named after one of them -------------------------


def _accumulate(x):
    acc = x
    buf = x
    for _ in range(7):
        buf = jnp.roll(buf, 1)
        acc = acc + buf
    return acc


def _ring_loss(x):
    return jnp.sum(_accumulate(jnp.tanh(x)) ** 2)


def test_a_loop_of_two_lines_keeps_each_line_s_work_apart():
    # a box `roll` held the 7 rolls and 6 of the 7 adds, the 7th `add` loose after it
    x = jnp.linspace(-1.0, 1.0, 32)
    ins = sowviz.inspect(_ring_loss, x)
    g = ins.graph
    (accum,) = (n for n in g.nodes if n.label == "_accumulate")
    adds = [n for n in g.nodes if n.label.split("#")[0] == "acc"]
    assert len(adds) == 7, [n.label for n in g.nodes]
    inside, boxes = [accum], []
    while inside:  # the boxes in `_accumulate`, but a stack of passes and its passes
        kids = [k for n in inside for k in g.children(n.id) if k.kind != "eqn"]
        boxes += [k for k in kids if not k.repeats and not g.node(k.parent).repeats]
        inside = kids
    for n in boxes:
        assert len(_lines_of(g, n)) == 1, (n.label, _lines_of(g, n))
    # the last pass's `acc` is the function's value
    want = _accumulate(jnp.tanh(x))
    got = ins.probe("acc#7").summaries["primal"]
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(want)), rtol=1e-5)
