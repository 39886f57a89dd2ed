"""Stage names a user reads on small real programs (`sowviz.graph.names`, `calls`):
the functions that made the values, never sowviz's or JAX's plumbing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_calls import graph_of

import sowviz


def children(g, label):
    (node,) = [n for n in g.nodes if n.label == label]
    return [n.label for n in g.children(node.id)]


def _upsample(x):
    return jnp.sum(jax.image.resize(x, (1, 16, 16, 1), method="bilinear") ** 2)


def test_a_body_jax_traced_itself_is_named_by_its_functions():
    # `jax.image.resize` jits `_resize`, 61 equations with no frame of the user's: by
    # the functions of JAX's that made them, not 15 chunks `op ×4 (1–4)` … `(57–60)`
    g = graph_of(_upsample, jnp.ones((1, 8, 8, 1)))
    inside = children(g, "resize")
    assert inside == ["compute_weight_mat", "einsum"], inside
    assert not [n.label for n in g.nodes if n.label.startswith("op ")]


def _embed(table, ids):
    return jnp.take(table, ids, axis=0)


def relu(x):
    return jax.nn.relu(x)


def _embed_loss(table, ids):
    return jnp.sum(jnp.tanh(relu(_embed(table, ids))))


def test_a_function_of_one_jitted_call_keeps_its_name():
    # `jnp.take` is a jit of JAX's, `take`: the user's `_embed` making only it is a stage
    # around it, found by `probe`; a `relu` making only `jax.nn.relu` (a stage `relu`)
    # would restate it: no `relu` > `relu`
    table, ids = jnp.arange(40.0).reshape(10, 4) / 40, jnp.array([1, 2, 3])
    ins = sowviz.inspect(_embed_loss, table, ids)
    g = ins.graph
    top = [n.label for n in g.children(g.root) if n.kind != "input"]
    assert top[:2] == ["_embed", "relu"], top
    assert children(g, "_embed") == ["take"]
    got = ins.probe("_embed").summaries
    np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(table[1:4]), rtol=1e-6)
    cot = jax.grad(lambda e: jnp.sum(jnp.tanh(jax.nn.relu(e))))(table[1:4])
    np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(cot), rtol=1e-5)


def _experts():
    return [
        lambda w, h: jnp.tanh(h @ w),
        lambda w, h: jax.nn.relu(h @ w),
        lambda w, h: jnp.sin(h @ w),
    ]


def _route(w, gate, h):
    # one expert for the whole batch, picked by the mean gate logit
    logits = jnp.mean(h @ gate, 0)
    idx = jnp.argmax(logits)
    return jax.lax.switch(idx, _experts(), w, h) * jax.nn.softmax(logits)[idx]


def test_a_group_named_like_the_stage_it_holds_is_not_made():
    # `lax.switch` makes a clamp of its index and a `cond` labelled `switch`: grouped by
    # the call they came from, a `switch` box held the `switch` cond, one level too many
    w, gate, h = jnp.eye(4) * 0.5, jnp.ones((4, 3)), jnp.ones((2, 4))
    g = graph_of(lambda w, gate, h: jnp.sum(_route(w, gate, h)), w, gate, h)
    (switch,) = [n for n in g.nodes if n.label == "switch"]
    assert switch.kind == "cond"
    assert "softmax" in [n.label for n in g.children(switch.parent)]


@jax.custom_jvp
def _softplus(x):
    return jnp.logaddexp(x, 0.0)


@_softplus.defjvp
def _softplus_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _softplus(x), t * jax.nn.sigmoid(x)


def _field(w, xy):
    return jnp.sum(_softplus(xy @ w))


def _laplacian(w, xy):
    return jnp.trace(jax.hessian(_field, argnums=1)(w, xy))


def test_a_custom_rule_jax_runs_again_inside_itself_is_one_call():
    # Differentiated twice, the rule's own call of `_softplus` runs `_softplus_jvp`
    # again inside it: one call of the user's, not `_softplus_jvp` > `_softplus_jvp`
    w, xy = jnp.full((2, 3), 0.5), jnp.array([0.3, -0.2])
    g = graph_of(_laplacian, w, xy)
    rules = [n for n in g.nodes if n.label.startswith("_softplus_jvp")]
    assert rules, [n.label for n in g.nodes]
    for rule in rules:
        inside = [n.label for n in g.children(rule.id)]
        assert not [c for c in inside if c.startswith("_softplus_jvp")], inside
    (forward,) = [n for n in rules if n.label == "_softplus_jvp"]
    assert "_softplus" in [n.label for n in g.children(forward.id)]


def _cell(w, h, x):
    h = jnp.tanh(h @ w + x)
    return h, h


def _step(carry):
    i, h = carry
    return i + 1, jnp.tanh(h) * 0.5


def _loops(w, xs):
    _, hs = jax.lax.scan(lambda h, x: _cell(w, h, x), jnp.zeros(4), xs)
    twice = lambda h, x: _cell(w, _cell(w, h, x)[0], x)  # noqa: E731  (two calls)
    _, gs = jax.lax.scan(twice, jnp.zeros(4), xs)
    _, h = jax.lax.while_loop(lambda c: c[0] < 3, lambda c: _step(c), (0, hs[-1]))
    return jnp.sum(hs) + jnp.sum(gs) + jnp.sum(h)


def test_a_loop_over_a_lambda_calling_one_function_is_named_by_it():
    # `lax.scan(lambda h, x: cell(w, h, x), ...)` reads `scan(_cell)`, not `scan`
    # holding `_cell:3`, `_cell:4`; a lambda making two calls names no one of them
    w, xs = jnp.eye(4) * 0.5, jnp.ones((5, 4))
    g = graph_of(_loops, w, xs)
    loops = [n.label for n in g.nodes if n.kind in ("scan", "while")]
    assert loops == ["scan(_cell)", "scan", "while(_step)"], loops


def _logdet(a):
    return 2 * jnp.sum(jnp.log(jnp.diag(jnp.linalg.cholesky(a))))


def test_a_platform_dependent_choice_shows_the_branch_that_runs():
    # `jnp.diagonal` binds `lax.platform_dependent`: a `cond` between `_mosaic_diag` (in a
    # Pallas kernel) and `_default_diag`, which lowering picks. No `cond` with two
    # branches of which one never runs: the branch that does, by its function
    a = jnp.eye(4) * 2.0 + 0.1
    ins = sowviz.inspect(_logdet, a)
    g = ins.graph
    inside = children(g, "diagonal")  # (its mask: iota, iota, add, eq, convert)
    assert inside[-1] == "default_diag" and "cond" not in inside, inside
    (branch,) = [n for n in g.nodes if n.label == "default_diag"]
    assert {n.kind for n in g.children(branch.id)} == {"eqn"}  # its own, in no branch scope
    labels = [n.label for n in g.nodes]
    assert not [x for x in labels if "mosaic" in x or x.startswith("branch") or x == "cond"]
    assert "platform_index" not in labels
    got = ins.probe("default_diag").summaries["primal"]
    want = jnp.diag(jnp.linalg.cholesky(a))
    np.testing.assert_allclose(got["l2"], np.linalg.norm(want), rtol=1e-5)
    np.testing.assert_allclose(ins.result[1], jax.grad(_logdet)(a), rtol=1e-5)


def _noised(w, x0, key):
    k1, k2 = jax.random.split(key)
    t, eps = jax.random.uniform(k1, (x0.shape[0],)), jax.random.normal(k2, x0.shape)
    ab = jnp.cos(t * jnp.pi / 2)[:, None] ** 2
    xt = jnp.sqrt(ab) * x0 + jnp.sqrt(1 - ab) * eps
    pred = jnp.tanh(xt @ w)
    return jnp.mean((pred - eps) ** 2)


def test_a_line_folded_into_one_stage_is_named_by_what_it_assigns():
    # Named `_noised:5` before: a user had to open the source to learn what it was.
    w, x0, key = jnp.eye(4) * 0.3, jnp.ones((8, 4)), jax.random.PRNGKey(0)
    ins = sowviz.inspect(_noised, w, x0, key, mode="grad")
    folds = [n.label for n in ins.graph.children(ins.graph.root) if n.kind == "scope"]
    # a return line's last work is what the function returns, named by what it computes:
    # `mean` (it was `_noised:176`, then `return`); one followed by a call on its line
    # keeps its place (the call's arguments,
    # `test_a_return_line_s_call_arguments_keep_their_place`)
    assert folds == ["k1, k2", "t, eps", "ab", "xt", "pred", "mean"]
    k1, k2 = jax.random.split(key)
    t = jax.random.uniform(k1, (8,))
    eps = jax.random.normal(k2, x0.shape)
    ab = np.cos(np.asarray(t) * np.pi / 2)[:, None] ** 2
    xt = np.sqrt(ab) * np.asarray(x0) + np.sqrt(1 - ab) * np.asarray(eps)
    got = ins.probe("xt").summaries["primal"]
    assert got["max"] == pytest.approx(float(xt.max()), rel=1e-5)
    assert got["mean"] == pytest.approx(float(xt.mean()), rel=1e-5)


def test_what_a_line_assigns_is_read_from_the_source(tmp_path):
    from sowviz.graph.source_text import assigned

    src = tmp_path / "m.py"
    src.write_text(
        "def f(x, cache):\n"  # 1
        "    a, (b, c) = g(x)\n"  # 2
        "    cache[0] += h(\n"  # 3
        "        x)\n"  # 4
        "    for i in range(3):\n"  # 5
        "        self.h: int = x * i\n"  # 6
        "    g(x)\n"  # 7
        "    return a + b\n"  # 8
        "very_long_name_one, very_long_name_two, very_long_name_three = 1, 2, 3\n"  # 9
    )
    got = {n: assigned(str(src), n) for n in range(1, 11)}
    assert got == {
        1: None,  # a def's header
        2: "a, (b, c)",
        3: "cache[0]",
        4: "cache[0]",  # inside a statement spanning lines
        5: None,  # a loop's header
        6: "self.h",
        7: None,  # a bare call assigns nothing
        8: None,  # a return: its fold may be a call's arguments
        9: "very_long_name_one, …",
        10: None,
    }
    from sowviz.graph.source_text import returned_place

    # `return a + b` names nothing: values made on lines 2 and 3 have no place; one
    # made on the return line is its one element
    assert [returned_place(str(src), n) for n in (2, 3, 8)] == [None, None, 0]
    ret = tmp_path / "r.py"
    ret.write_text(
        "def g(x, kc):\n"  # 1
        "    kc = kc + 1\n"  # 2
        "    y = x * 2\n"  # 3
        "    return y, kc\n"  # 4
        "def h(x, kc):\n"  # 5
        "    kc = kc + 1\n"  # 6
        "    return x + kc, kc\n"  # 7
        "def k(x, kc):\n"  # 8
        "    return x * 2, kc * 3\n"  # 9
    )
    # line 4 makes nothing (names only); line 9 makes two expressions: which is unknown
    assert [returned_place(str(ret), n) for n in (2, 3, 4, 6, 7, 9)] == [1, 0, None, 1, 0, None]
    two = tmp_path / "two.py"
    two.write_text("def f(x, kc, vc):\n    kc = kc + 1; vc = vc + 2\n    return x, kc, vc\n")
    # a line of two statements: the column says which made the value
    assert [returned_place(str(two), 2, c) for c in (None, 9, 22)] == [None, 1, 2]
    bad = tmp_path / "cell.py"
    bad.write_text("%timeit x = 1\n")  # IPython magic: no Python to parse
    assert assigned(str(bad), 1) is None


def _write(out, i, tok):
    return jax.lax.dynamic_update_slice(out, tok[:, None], (0, i))


def test_a_library_call_named_like_its_own_equation_is_not_folded_around_the_rest():
    # `lax.dynamic_update_slice` clamps its index (4 integer equations), then binds the
    # equation of its name: the clamp was a box `dynamic_update_slice` of type int32[]
    # beside the `dynamic_update_slice` equation, the update, as if there were two.
    def body(i, out):
        return _write(out, i, jnp.ones(2) * i)

    g = graph_of(lambda out: jax.lax.fori_loop(0, 3, body, out), jnp.zeros((2, 3)))
    named = [n for n in g.nodes if n.label == "dynamic_update_slice"]
    assert [(n.kind, n.shapes) for n in named] == [("eqn", ("float32[2,3]",))], named


def _dense(w, x):
    return jnp.tanh(x @ w)


def _pool(w, h, graph_ids):
    pooled = jax.ops.segment_sum(h, graph_ids, num_segments=2)
    return _dense(w, pooled)


def test_a_small_function_s_short_library_call_is_one_box_named_by_it():
    # `segment_sum` (3 equations) in a function that also calls one of yours was drawn
    # as `broadcast_in_dim`, `broadcast_in_dim`, `scatter-add`: the function's nodes were
    # miscounted (the call's run left out), so the run seemed all the function held.
    h, gid = jnp.ones((6, 4)), jnp.array([0, 0, 0, 1, 1, 1])
    # (named by what the line assigns, as at a big level, since round 17)
    g = graph_of(lambda w, h, gid: jnp.sum(_pool(w, h, gid)), jnp.eye(4), h, gid)
    assert children(g, "_pool") == ["pooled", "_dense"]
    # (its zeros, a constant, are the `scatter-add`'s work since round 21: no box)
    assert children(g, "pooled") == ["broadcast_in_dim", "scatter-add"]


def _qkv(p, x):
    q = jnp.einsum("btd,dnh->btnh", x, p["wq"])
    k = jnp.einsum("btd,dnh->btnh", x, p["wk"])
    v = jnp.einsum("btd,dnh->btnh", x, p["wv"])
    return jnp.einsum("btnh,btnh->bt", q * k, v)


def _qkv_loss(p, x):
    return jnp.mean(_qkv(p, x) ** 2)


def test_einsums_alike_on_their_own_lines_are_a_box_each_named_by_their_line():
    # `jnp.einsum` pushes a scope named by its subscripts: three calls in a row pushed
    # one name, drawn as one box holding q, k and v
    ks = jax.random.split(jax.random.key(0), 4)
    p = {n: jax.random.normal(k, (8, 2, 4)) for n, k in zip(("wq", "wk", "wv"), ks, strict=False)}
    x = jax.random.normal(ks[3], (2, 3, 8))
    ins = sowviz.inspect(_qkv_loss, p, x)
    (fn,) = (n.id for n in ins.graph.nodes if n.label == "_qkv")
    labels = [n.label for n in ins.graph.nodes if n.parent == fn]
    assert labels == ["q", "k", "v", "mul", "btnh,btnh->bt"], labels  # (one einsum: its subscripts)
    for name in ("q", "k", "v"):
        want = jnp.einsum("btd,dnh->btnh", x, p[f"w{name}"])
        got = ins.probe(f"_qkv/{name}").summaries["primal"]
        np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(want)), rtol=1e-5)


def _unscale(grads):
    grads = jax.tree.map(lambda g: g / 4.0, grads)  # one `div` per leaf, from a lambda
    return sum(jnp.sum(g) for g in jax.tree.leaves(grads))


def test_a_tree_map_line_at_a_small_level_is_one_box_named_by_what_it_assigns():
    grads = {"a": jnp.arange(3.0), "b": jnp.ones((2, 2)), "c": jnp.full(4, 8.0)}
    ins = sowviz.inspect(_unscale, grads, mode="primal")
    top = [n for n in ins.graph.nodes if n.parent == ins.graph.root]
    assert [n.label for n in top].count("div") == 0, [n.label for n in top]
    # (mode primal draws the argument `grads` under its own name: the line's is the next)
    (box,) = (n for n in top if n.label == "grads#2")
    assert box.n_eqns == 3
    got = {p.leaf: p.summaries["primal"]["mean"] for p in ins.probes if p.node == box.id}
    want = sorted(float(jnp.mean(g / 4.0)) for g in grads.values())
    np.testing.assert_allclose(sorted(got.values()), want, rtol=1e-6)


def _chunk(w, x):
    h = jnp.tanh(x @ w)
    return jnp.sum(h * h, axis=-1)


def _mapped(w, xs):
    return jnp.mean(jax.lax.map(lambda x: _chunk(w, x), xs))


def test_a_lax_map_of_your_function_is_named_by_it_and_carries_data_per_iteration():
    # `lax.map` traces JAX's own wrapper of your function as the scan's body: the loop
    # was a bare `map` whose equations held no data
    w = jax.random.normal(jax.random.key(0), (4, 4))
    xs = jax.random.normal(jax.random.key(1), (3, 5, 4))
    ins = sowviz.inspect(_mapped, w, xs)
    (loop,) = (n for n in ins.graph.nodes if n.kind == "scan")
    assert loop.label == "map(_chunk)"
    tanh = ins.probe("map(_chunk)/h").summaries["primal"]  # `h = jnp.tanh(x @ w)`
    want = jnp.tanh(xs @ w)
    np.testing.assert_allclose(tanh["mean"], float(want.mean()), rtol=1e-5)
    np.testing.assert_allclose(tanh["max"], float(want.max()), rtol=1e-6)


def _two_means(w, x):
    p = jnp.tanh(x @ w)
    a = p.mean(0)  # an array's method: JAX forwards it to `jnp.mean`
    b = jnp.mean(p, 0)
    return jnp.sum(a * b)


def test_an_array_method_is_named_as_the_function_it_forwards_to():
    # `p.mean(0)` was drawn as `reduce_sum` and `div`, `jnp.mean(p, 0)` as `mean`; both
    # lines are boxes named by what they assign (round 17: `a`, `b`, as at a big level),
    # each holding the mean's equations
    w, x = jnp.ones((3, 2)), jnp.arange(12.0).reshape(4, 3) / 10
    ins = sowviz.inspect(_two_means, w, x)
    top = [n.label for n in ins.graph.nodes if n.parent == ins.graph.root]
    assert "a" in top and "b" in top and "div" not in top, top
    assert children(ins.graph, "a") == children(ins.graph, "b") == ["reduce_sum", "div"]
    want = jnp.tanh(x @ w).mean(0)
    for name in ("a", "b"):
        np.testing.assert_allclose(
            ins.probe(name).summaries["primal"]["l2"], float(jnp.linalg.norm(want)), rtol=1e-6
        )


def test_an_nnx_cond_is_one_cond_box():
    # `nnx.cond`'s own cast of the predicate was a box `cond` beside the `cond` it makes
    # (`cond`, `cond#2`)
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(4, 4, rngs=rngs)
            self.alt = nnx.Linear(4, 4, rngs=rngs)

        def __call__(self, x, flag):
            h = self.lin(x)
            return nnx.cond(flag, lambda m, h: m.alt(h), lambda m, h: jnp.tanh(h), self, h)

    model, x = Net(nnx.Rngs(0)), jnp.ones((6, 4))
    ins = sowviz.inspect(lambda m, x, f: jnp.mean(m(x, f) ** 2), model, x, jnp.asarray(True))
    conds = [n for n in ins.graph.nodes if n.label.startswith("cond")]
    assert [(n.label, n.kind) for n in conds] == [("cond", "cond")], conds
    want = model.alt(model.lin(x))
    got = ins.probe("Net/cond").summaries["primal"]
    np.testing.assert_allclose(got["mean"], float(want.mean()), rtol=1e-5)


def _jac_u(w, xy):
    return jnp.tanh(xy @ w).sum()


def _jacfwd_laplacian(w, xy):
    hess = jax.jacfwd(jax.grad(_jac_u, argnums=1), argnums=1)(w, xy)
    return jnp.trace(hess)


def test_a_transform_s_own_work_is_named_by_the_line_it_is_on():
    # `jax.jacfwd(f)(x)` runs `jacfwd.<locals>.jacfun`, which makes the basis (iota,
    # iota, add, eq, convert_element_type, split): six bare boxes, then `jacfwd`; the
    # basis is no box now, and what jacfwd makes of its result is the line's: `hess`
    w = jax.random.normal(jax.random.key(0), (2, 8))
    pts = jax.random.uniform(jax.random.key(1), (16, 2))
    loss = lambda w, pts: jnp.mean(jax.vmap(_jacfwd_laplacian, in_axes=(None, 0))(w, pts) ** 2)  # noqa: E731
    ins = sowviz.inspect(loss, w, pts)
    (lap,) = (n.id for n in ins.graph.nodes if n.label == "_jacfwd_laplacian")
    kids = [n for n in ins.graph.nodes if n.parent == lap]
    assert not [n.label for n in kids if n.kind == "eqn" and n.primitive in ("iota", "eq")]
    assert "hess" in [n.label for n in kids], [n.label for n in kids]
    hess = jax.vmap(jax.hessian(_jac_u, argnums=1), in_axes=(None, 0))(w, pts)
    got = ins.probe("_jacfwd_laplacian/hess").summaries["primal"]
    np.testing.assert_allclose(got["l2"], np.linalg.norm(hess), rtol=1e-4)
    value, grad = jax.value_and_grad(loss)(w, pts)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-5)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-4, atol=1e-6)


def _headed(w, v, x):
    h = jnp.tanh(x @ w)
    for _ in range(8):  # (a big level: lines of 3 equations and more fold)
        h = jnp.sin(h) * 0.9
    return _head(v, jnp.concatenate([h, -h], -1) * 2.0 + 1.0)


def _head(v, z):
    return jnp.sum(jnp.tanh(z @ v) ** 2)


def test_a_return_line_s_call_arguments_keep_their_place():
    # the fold of `concatenate`, `mul`, `add` is the arguments of `_head`, not what
    # `_headed` returns: not labelled `return`
    w, v, x = jnp.eye(4) * 0.5, jnp.ones((8, 1)) * 0.1, jnp.ones((3, 4))
    g = graph_of(_headed, w, v, x)
    labels = [n.label for n in g.nodes if n.parent == g.root]
    line = _headed.__code__.co_firstlineno + 4
    assert f"_headed:{line}" in labels and "_head" in labels, labels
    assert "return" not in labels, labels


def _objective(x):
    return jnp.sum(x**2)  # @objective_return


def test_your_function_in_a_body_a_library_traced_is_named_by_it():
    # JAX traces a library's loop body (BFGS's line search) with a traceback of its own:
    # the user's objective called there has no call to name it, and was a fold by its
    # line (`_objective:N`) beside the library's work, `_objective` outside the loop.
    from sowviz import _compat
    from sowviz.graph.names import fold_label, fold_names

    line = _objective.__code__.co_firstlineno + 1
    mine = _compat.SourceLocation(__file__, line, "_objective")
    theirs = _compat.SourceLocation(
        "/site-packages/jax/_src/scipy/optimize/line_search.py", 9, "body"
    )
    library = _compat.CallPath(("line_search.<locals>.body",), False, "jax")
    user = _compat.CallPath((), True, None)
    paths = [library] * 3 + [user] * 5 + [library] * 3
    locs = [theirs] * 3 + [mine] * 5 + [theirs] * 3
    backward = [False] * 6 + [True] * 2 + [False] * 3
    names = [()] * len(paths)

    def labels(out):
        return [tuple(fold_label(n) for n in t) for t in out]

    out = labels(fold_names(list(names), locs, 40, paths.__getitem__, backward=backward))
    # the library's own work stays out of it (folded by its own lines, as before)
    assert not [t for t in out[:3] + out[8:] if any("_objective" in n for n in t)], out
    assert {t[0] for t in out[3:6]} == {"_objective"}, out
    assert {t[0] for t in out[6:8]} == {"_objective (backward)"}, out
    # its return line's run, the last of its forward call, says so, as outside a loop
    assert {t[1:] for t in out[3:6]} <= {("sum",), ()}, out
    # not told which are backward: one stage, its return line's run still `return`
    out = labels(fold_names(list(names), locs, 40, paths.__getitem__))
    assert {t[0] for t in out[3:8]} == {"_objective"}, out
    assert not [t for t in out[3:8] if any(":" in n for n in t)], out


def test_einsums_in_an_nnx_module_are_named_by_what_their_lines_assign():
    # each `jnp.einsum` with subscripts of its own, in a module: boxes `tk,tke->te`,
    # `td,edh->eth`, `te,eth->th`, while a plain function's read `q`, `k`
    nnx = pytest.importorskip("flax.nnx")

    class Mix(nnx.Module):
        def __init__(self, rngs):
            self.w = nnx.Param(jax.random.normal(rngs.params(), (4, 8, 8)) * 0.3)

        def __call__(self, x, gates):
            combine = jnp.einsum(
                "tk,tke->te", gates, jax.nn.one_hot(jnp.arange(16) % 4, 4)[:, None]
            )
            expert_out = jnp.einsum("td,edh->eth", x, self.w[...])
            y = jnp.einsum("te,eth->th", combine, expert_out)
            return y

    model = Mix(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (16, 8))
    gates = jax.nn.softmax(jax.random.normal(jax.random.key(2), (16, 1)), axis=-1)
    ins = sowviz.inspect(lambda m, x, g: jnp.mean(m(x, g) ** 2), model, x, gates)
    (mix,) = (n for n in ins.graph.nodes if n.label == "Mix")
    labels = [n.label for n in ins.graph.children(mix.id) if n.kind == "scope"]
    assert labels == ["combine", "expert_out", "y"], labels
    assert not [n.label for n in ins.graph.nodes if "->" in n.label]
    w = model.w[...]
    combine = jnp.einsum("tk,tke->te", gates, jax.nn.one_hot(jnp.arange(16) % 4, 4)[:, None])
    want = {"expert_out": jnp.einsum("td,edh->eth", x, w)}
    want["y"] = jnp.einsum("te,eth->th", combine, want["expert_out"])
    for name, value in want.items():
        got = ins.probe(f"Mix/{name}").summaries["primal"]
        np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(value)), rtol=1e-5)


def _u_net(params, x):
    h = jnp.tanh(x * params["w1"] + params["b1"])
    return jnp.dot(h, params["w2"])


def _residual(params, x):
    u = _u_net(params, x)
    u_x = jax.jacfwd(_u_net, argnums=1)(params, x)
    return u_x + u


def test_a_line_taking_a_jacobian_is_named_by_what_it_assigns():
    # `u_x = jax.jacfwd(u_net, argnums=1)(params, x)`: jacfwd unravels du/dx with
    # `np.reshape`, whose NumPy frames parted its two equations (a `split` box holding
    # du/dx and a `reshape` box with no data, no `u_x`).
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = {
        "w1": jax.random.normal(k1, (16,)),
        "b1": jnp.zeros(16),
        "w2": jax.random.normal(k2, (16,)) / 4,
    }
    xs = jnp.linspace(-1, 1, 32)

    def loss(params, xs):
        return jnp.mean(jax.vmap(_residual, (None, 0))(params, xs) ** 2)

    ins = sowviz.inspect(loss, params, xs)
    g = ins.graph
    (res,) = [n for n in g.nodes if n.label == "_residual"]
    labels = [n.label for n in g.children(res.id)]
    assert "u_x" in labels and "split" not in labels and "reshape" not in labels, labels
    u = jax.vmap(_u_net, (None, 0))(params, xs)
    u_x = jax.vmap(jax.jacfwd(_u_net, argnums=1), (None, 0))(params, xs)
    got = ins.probe("_residual/u_x").summaries
    np.testing.assert_allclose(got["primal"]["mean"], np.mean(u_x), rtol=1e-5)
    np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(u_x), rtol=1e-5)
    # its gradient: d mean((u_x + u)^2) / d u_x
    want = 2 * (u_x + u) / xs.size
    np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(want), rtol=1e-5)


def _transitions(W, h):
    As = jnp.tanh(jnp.einsum("tn,nij->tij", h, W)) * 0.3
    Bs = jnp.einsum("tn,nij->tij", h, W)
    return jnp.sum(As**2) + jnp.sum(Bs**2)


def test_an_einsum_inside_what_a_line_assigns_keeps_its_subscripts():
    # `As = jnp.tanh(jnp.einsum(...)) * 0.3`: the einsum's box was labelled `As`, and
    # `probe("As")` gave the einsum's value (l2 44.2) for As's (4.0): a wrong number
    # under the name the user looks for. `Bs = jnp.einsum(...)` is the line's value.
    W = jax.random.normal(jax.random.PRNGKey(0), (6, 4, 4))
    h = jax.random.normal(jax.random.PRNGKey(1), (16, 6))
    ins = sowviz.inspect(_transitions, W, h)
    labels = [n.label for n in ins.graph.children(ins.graph.root)]
    assert labels.count("Bs") == 1 and labels.count("As") == 1, labels
    assert "tn,nij->tij" in labels, labels
    e = jnp.einsum("tn,nij->tij", h, W)
    # `As` names a box of the line's own work after the einsum (`tanh`, `* 0.3`): its
    # value is As's
    as_l2 = ins.probe("As").summaries["primal"]["l2"]
    np.testing.assert_allclose(as_l2, float(jnp.linalg.norm(jnp.tanh(e) * 0.3)), rtol=1e-5)
    got = ins.probe("tn,nij->tij").summaries
    np.testing.assert_allclose(got["primal"]["l2"], float(jnp.linalg.norm(e)), rtol=1e-5)
    # d/de of sum((tanh(e) * 0.3)^2) = 2 * 0.09 * tanh(e) * (1 - tanh(e)^2)
    want = 0.18 * jnp.tanh(e) * (1 - jnp.tanh(e) ** 2)
    np.testing.assert_allclose(got["cotangent"]["l2"], float(jnp.linalg.norm(want)), rtol=1e-4)
    bs = ins.probe("Bs").summaries
    np.testing.assert_allclose(bs["primal"]["l2"], float(jnp.linalg.norm(e)), rtol=1e-5)
    np.testing.assert_allclose(bs["cotangent"]["l2"], float(jnp.linalg.norm(2 * e)), rtol=1e-5)


def test_a_line_assigning_a_call_s_result_is_read_from_the_source(tmp_path):
    from sowviz.graph.source_text import assigned_by_call

    src = tmp_path / "m.py"
    src.write_text(
        "def f(x, w):\n"  # 1
        "    q = jnp.einsum('ij,jk->ik', x, w)\n"  # 2
        "    a = jnp.tanh(jnp.einsum('ij,jk->ik', x, w)) * 0.3\n"  # 3
        "    a += einsum('ij,jk->ik', x, w)\n"  # 4
        "    k: Array = einsum(\n"  # 5
        "        'ij,jk->ik', x, w)\n"  # 6
        "    v = jnp.einsum('ij,jk->ik', x, w).astype(x.dtype)\n"  # 7
        "    return jnp.einsum('ij,jk->ik', x, w)\n"  # 8
    )
    got = [assigned_by_call(str(src), n, "einsum") for n in range(1, 9)]
    assert got == [None, "q", None, None, "k", "k", None, None]


def test_a_value_packed_into_a_returned_container_takes_its_place(tmp_path):
    # `return obs, new_state, reward` with `new_state = {"s": s2}`: `s2`'s line assigns
    # no returned name, so the function's outputs fell back to program order
    from sowviz.graph.source_text import returned_place

    src = tmp_path / "env.py"
    src.write_text(
        "def step(s, a):\n"  # 1
        "    s2 = s + a\n"  # 2
        "    reward = -s2\n"  # 3
        "    obs = s2 * 2\n"  # 4
        "    t = a * 3\n"  # 5
        "    new_state = {'s': s2, 'inner': (t, a)}\n"  # 6
        "    return obs, new_state, reward\n"  # 7
        "def step2(s, a):\n"  # 8
        "    s2 = s + a\n"  # 9
        "    st = State(s=s2)\n"  # 10
        "    st = st.replace(t=a)\n"  # 11
        "    return s2 * 2, st\n"  # 12
        "def step3(s, a):\n"  # 13
        "    s2 = s + a\n"  # 14
        "    y = jnp.stack([s2, a])\n"  # 15
        "    return s2 * 2, {'s': s2}, y\n"  # 16
        "def step4(s, a):\n"  # 17
        "    s2 = s + a\n"  # 18
        "    return {'s': s2}, (s2, a)\n"  # 19
    )
    got = {n: returned_place(str(src), n) for n in (2, 3, 4, 5, 9, 14)}
    # a name packed into a dict, a tuple in it, a dataclass, a `.replace`; a name a
    # computed element (`jnp.stack`) reads is no leaf of it
    assert got == {2: 1, 3: 2, 4: 0, 5: 1, 9: 1, 14: 1}
    assert returned_place(str(src), 18) is None  # packed into two elements: unknown


_N_STATE = 16  # an optimiser state's leaves, unbatched until the scan's carry mixes them


def _vmapped_train(rng):
    w = jax.random.normal(rng, (3,))
    state = tuple(jnp.zeros(3) for _ in range(_N_STATE))

    def update(carry, _):
        w, state = carry
        g = jnp.tanh(w)
        state = tuple(s * 0.9 + g for s in state)
        return (w - 0.1 * sum(state), state), jnp.sum(w**2)

    (w, state), losses = jax.lax.scan(update, (w, state), None, 3)
    return losses


def test_a_vmapped_scan_s_carry_broadcasts_are_one_group_beside_it():
    # `jax.vmap(train)` batches the scan's carry: JAX broadcasts each unbatched leaf on
    # the scan's line, made by `lax.scan`; a fold named `scan` would restate the
    # `scan(update)` stage, so they stood loose, 16 boxes (32 in purejaxrl's PPO, whose
    # level then passed 40 nodes and was cut into `train`, `train#2`, `train#3`)
    rngs = jax.random.split(jax.random.PRNGKey(0), 2)
    ins = sowviz.inspect(jax.vmap(_vmapped_train), rngs, mode="primal")
    g = ins.graph
    top = g.children(g.root)
    # (inside the stage of the function `jax.vmap` calls, as for any function of yours
    # under it: the generator making `state` no longer parts its run, round 17)
    stage = [n for n in top if n.kind == "scope" and n.label == "_vmapped_train"]
    top = g.children(stage[0].id) if stage else top
    assert not [n for n in top if n.label == "broadcast_in_dim"], [n.label for n in top]
    (group,) = [n for n in top if n.kind == "scope" and n.label == "scan(update) setup"]
    inside = [n for n in g.children(group.id)]
    assert [n.label for n in inside] == ["broadcast_in_dim"] * _N_STATE
    # each is the state's zeros, batched: (2, 3) zeros
    for k in range(_N_STATE):
        got = ins.probe("scan(update) setup", leaf=f"[{k}]").summaries["primal"]
        assert got["zeros"] == 2 * 3 and got["l2"] == 0.0, got
    np.testing.assert_allclose(
        np.asarray(ins.result), np.asarray(jax.jit(jax.vmap(_vmapped_train))(rngs)), rtol=1e-6
    )
