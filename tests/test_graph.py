"""Stage graph: nodes, nesting, edges, probe points, determinism; instrumentation."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

import sowviz
from sowviz import _compat, sow
from sowviz.graph import build_graph, frameworks, instrument, instrument_jaxpr
from sowviz.graph.build import _count_eqns

HERE = Path(__file__)
TESSERACTS = HERE.parent / "fixtures" / "tesseracts"


def line_of(marker: str) -> int:
    """Line number in this file of the line ending with `# <marker>`."""
    for n, line in enumerate(HERE.read_text().splitlines(), start=1):
        if line.rstrip().endswith(f"# {marker}"):
            return n
    raise AssertionError(marker)


def graph_of(fn, *args, capture="stages", **kw):
    closed = jax.make_jaxpr(fn)(*args)
    n_in, n_out = len(closed.jaxpr.invars), len(closed.jaxpr.outvars)
    g = build_graph(
        closed,
        in_names=[f"in{i}" for i in range(n_in)],
        out_names=[f"out{i}" for i in range(n_out)],
        capture=capture,
        **kw,
    )
    return closed, g


def by_label(g, label, kind=None):
    found = [n for n in g.nodes if n.label == label and (kind is None or n.kind == kind)]
    assert found, f"no node {label!r} ({kind}) in {[(n.label, n.kind) for n in g.nodes]}"
    return found


def one(g, label, kind=None):
    (node,) = by_label(g, label, kind)
    return node


def stage_points(g):
    """Probe points of stages (not of the program's inputs and outputs, nor of a small
    program's top-level equations)."""
    return tuple(p for p in g.probe_points if p.kind not in ("input", "output", "eqn"))


def edge_set(g):
    return {(e.source, e.target) for e in g.edges}


def sows_in(closed):
    """(name, mode) of every sow equation, recursively."""
    out = []

    def walk(j):
        for e in j.eqns:
            if e.primitive.name == "sow":
                out.append((e.params["name"], tuple(e.params["mode"])))
            for _, _, sub in _compat.sub_jaxprs(e):
                walk(sub)

    walk(closed.jaxpr)
    return out


def modes_by_name(closed):
    d: dict[str, set] = {}
    for name, mode in sows_in(closed):
        d.setdefault(name, set()).add(mode)
    return d


X = jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(3, 4)
W = jnp.linspace(-0.5, 0.7, 16, dtype=jnp.float32).reshape(4, 4)


# ---------------------------------------------------------------------------
# Programs


@jax.jit
def leaf_fn(x):
    return jnp.sin(x) * 2.0  # @leaf_body


@jax.jit
def middle_fn(x):
    y = leaf_fn(x)  # @call_leaf
    return jnp.cos(y) + x


def nested_jits(x):
    return middle_fn(x) * 3.0  # @call_middle


def scoped(x, w):
    with jax.named_scope("encoder"):
        h = x @ w  # @encoder_dot
        with jax.named_scope("act"):
            h = jnp.tanh(h)
        skip = h * 0.5
    with jax.named_scope("decoder"):
        y = h @ w.T + skip  # @decoder
    return jnp.sum(y), y


def nested_scans(x):
    def inner(c, row):
        c = c * 0.9 + jnp.sin(row)  # @inner_scan
        return c, c

    def outer(c, block):
        c, ys = lax.scan(inner, c, block)
        return c + 1.0, ys.sum(0)

    blocks = x.reshape(3, 1, 4)
    c, ys = lax.scan(outer, jnp.zeros(4), blocks)
    return jnp.sum(c) + jnp.sum(ys)


def with_cond(x):
    def pos(a):
        return jnp.sin(a) * 2.0  # @branch_pos

    def neg(a):
        return jnp.cos(a) - 1.0

    y = lax.cond(jnp.sum(x) > 0, pos, neg, x)
    return jnp.sum(y * y)


def with_while(x):
    def body(carry):
        i, a = carry
        return i + 1, a * 1.5 + 0.1  # @while_body

    _, a = lax.while_loop(lambda c: c[0] < 3, body, (0, x))
    return jnp.sum(a)


def with_checkpoint(x):
    @jax.checkpoint
    def block(a):
        return jnp.sin(a) * jnp.cos(a)  # @remat_body

    return jnp.sum(block(x) ** 2)


@jax.custom_jvp
def softclip(a):
    return jnp.tanh(a) * 3.0


softclip.defjvp(lambda p, t: (softclip(p[0]), t[0] * (1 - jnp.tanh(p[0]) ** 2) * 3.0))


def with_custom(x):
    return jnp.sum(softclip(x * 2.0) ** 2)  # @custom_call


# ---------------------------------------------------------------------------
# Structure


def test_nested_named_jits_and_sources():
    _, g = graph_of(nested_jits, X)
    root = g.node(g.root)
    assert root.kind == "jit" and root.parent is None and root.label == "program"
    middle = one(g, "middle_fn", "jit")
    leaf = one(g, "leaf_fn", "jit")
    assert middle.parent == root.id
    assert leaf.parent == middle.id
    assert {n.label for n in g.children(leaf.id)} == {"sin", "mul"}
    # n_eqns: a stage's own equation plus every equation inside it, recursively.
    assert leaf.n_eqns == 1 + 2  # the jit eqn, sin, mul
    assert middle.n_eqns == 1 + leaf.n_eqns + 2  # + cos, add
    assert root.n_eqns == _count_eqns(jax.make_jaxpr(nested_jits)(X).jaxpr)
    assert middle.source is not None and middle.source.line == line_of("@call_middle")
    assert Path(middle.source.file).name == HERE.name
    assert leaf.source.line == line_of("@call_leaf")
    sin = one(g, "sin")
    assert sin.source.line == line_of("@leaf_body") and sin.source.function == "leaf_fn"
    assert middle.collapsed and leaf.collapsed and not root.collapsed
    assert middle.shapes == ("float32[3,4]",)


def test_named_scopes_group_nest_and_lift_edges():
    _, g = graph_of(scoped, X, W)
    enc, dec, act = one(g, "encoder", "scope"), one(g, "decoder", "scope"), one(g, "act", "scope")
    root = g.root
    assert enc.parent == root and dec.parent == root and act.parent == enc.id
    assert enc.source.line == line_of("@encoder_dot")
    inputs = [n for n in g.nodes if n.kind == "input"]
    outputs = [n for n in g.nodes if n.kind == "output"]
    assert [n.label for n in inputs] == ["in0", "in1"]
    edges = edge_set(g)
    # x and w feed the encoder; w also feeds the decoder (w.T is inside it).
    assert (inputs[0].id, enc.id) in edges and (inputs[1].id, enc.id) in edges
    assert (inputs[1].id, dec.id) in edges
    # h and skip both cross encoder -> decoder: one lifted, deduplicated edge.
    assert [e for e in g.edges if (e.source, e.target) == (enc.id, dec.id)] == [
        next(e for e in g.edges if (e.source, e.target) == (enc.id, dec.id))
    ]
    e = next(e for e in g.edges if (e.source, e.target) == (enc.id, dec.id))
    assert e.shape == (3, 4) and e.dtype == "float32"
    # Inside the encoder: dot -> act scope -> mul.
    dot = by_label(g, "dot_general")[0]
    assert dot.parent == enc.id
    assert (dot.id, act.id) in edges
    # Every edge joins siblings.
    parent = {n.id: n.parent for n in g.nodes}
    assert all(parent[s] == parent[t] for s, t in edges)
    # The decoder produces both outputs (sum and y).
    assert {s for s, t in edges if t in {o.id for o in outputs}} == {
        one(g, "reduce_sum").id,
        dec.id,
    }
    # Encoder's probe: the values leaving it (h and skip), in program order.
    (pe,) = [p for p in g.probe_points if p.node == enc.id]
    assert pe.path == () and pe.shapes == ("float32[3,4]", "float32[3,4]")
    assert pe.at == max(i for i, _ in pe.values)
    assert enc.shapes == pe.shapes


def test_nested_scans():
    closed, g = graph_of(nested_scans, X)
    outer, inner = by_label(g, "scan(outer)", "scan")[0], one(g, "scan(inner)", "scan")
    assert inner.parent == outer.id and outer.parent == g.root
    sin = one(g, "sin")
    assert sin.parent == inner.id and sin.source.line == line_of("@inner_scan")
    (pi,) = [p for p in g.probe_points if p.node == inner.id]
    i_outer = next(i for i, e in enumerate(closed.jaxpr.eqns) if e.primitive.name == "scan")
    assert pi.path == ((i_outer, "jaxpr", None),)
    assert len(pi.values) == 2  # carry and stacked ys


def test_cond_branches():
    _, g = graph_of(with_cond, X)
    cond = one(g, "cond", "cond")
    branches = g.children(cond.id)
    assert [b.label for b in branches] == ["branch 0: neg", "branch 1: pos"]
    assert all(b.kind == "scope" for b in branches)
    sin = one(g, "sin")
    assert sin.parent == branches[1].id and sin.source.line == line_of("@branch_pos")
    assert [p.node for p in stage_points(g)] == [cond.id]


def test_while_loop():
    _, g = graph_of(with_while, X)
    w = one(g, "while(body)", "while")  # by its body function, as `scan(body)`
    cond, body = g.children(w.id)
    assert (cond.label, body.label) == ("condition", "body")  # not a `lax.cond`
    assert one(g, "lt").parent == cond.id
    mul = one(g, "mul")
    assert mul.parent == body.id and mul.source.line == line_of("@while_body")
    # Only the float output of the loop is probed (the counter is int32).
    (p,) = stage_points(g)
    assert p.node == w.id and p.shapes == ("float32[3,4]",) and p.values == ((0, 1),)


def test_checkpoint():
    # named by the function it wraps, as `scan(body)`; a lambda's is `checkpoint`
    _, g = graph_of(with_checkpoint, X)
    r = one(g, "checkpoint(block)", "remat")
    _, g2 = graph_of(lambda x: jnp.sum(jax.checkpoint(lambda a: jnp.sin(a) * 2.0)(x)), X)
    one(g2, "checkpoint", "remat")
    # a lambda holding one named scope is named by it; a named function keeps its name

    def scoped_block(a):
        with jax.named_scope("attn"):
            return jnp.sin(a) * 2.0

    _, g3 = graph_of(lambda x: jnp.sum(jax.checkpoint(lambda a: scoped_block(a))(x)), X)
    one(g3, "checkpoint(attn)", "remat")
    _, g4 = graph_of(lambda x: jnp.sum(jax.checkpoint(scoped_block)(x)), X)
    one(g4, "checkpoint(scoped_block)", "remat")
    assert {n.label for n in g.children(r.id)} == {"sin", "cos", "mul"}
    assert one(g, "sin").source.line == line_of("@remat_body")
    assert [p.node for p in stage_points(g)] == [r.id]


class _AttnHolder(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.attn = nnx.Linear(3, 3, rngs=rngs)

    def __call__(self, x):
        return self.attn(x)


def test_module_scopes_of_one_program_are_not_module_scopes_of_the_next():
    # An NNX module named `attn`, inspected first, made every later `named_scope("attn")`
    # a module stage (a process-wide set): the checkpoint of a function holding one was
    # named by the scope, as a module's call is, not by the function.
    sowviz.inspect(lambda m, x: jnp.sum(m(x)), _AttnHolder(nnx.Rngs(0)), jnp.ones((2, 3)))

    def scoped_block(a):
        with jax.named_scope("attn"):
            return jnp.sin(a) * 2.0

    _, g = graph_of(lambda x: jnp.sum(jax.checkpoint(scoped_block)(x)), X)
    one(g, "checkpoint(scoped_block)", "remat")


def test_a_jit_that_only_repeats_its_custom_rule_is_no_box_of_its_own():
    # `jax.nn.relu` is a custom_jvp of a jit `relu`: one `relu` box holding `max`,
    # not a `relu` inside a `relu`
    _, g = graph_of(lambda x: jnp.sum(jax.nn.relu(jax.nn.relu(x) - 1.0) ** 2), X)
    for label in ("relu", "relu#2"):  # the second numbered, its body's jit not
        relu = one(g, label, "custom")
        assert [(n.label, n.kind) for n in g.children(relu.id)] == [("max", "eqn")]
    assert all(g.node(e.source) and g.node(e.target) for e in g.edges)
    # a jit named otherwise, or beside other equations, stays
    _, g2 = graph_of(lambda x: jnp.sum(jax.nn.softplus(x) * jax.nn.relu(x)), X)
    assert one(g2, "relu", "custom").kind == "custom"


def test_custom_jvp_probed_on_outputs_with_note():
    _, g = graph_of(with_custom, X, capture="all")
    c = one(g, "softclip", "custom")
    assert c.source.line == line_of("@custom_call")
    inside = {n.id for n in g.nodes if n.parent == c.id}
    assert {g.node(i).label for i in inside} == {"tanh", "mul"}
    probed = {p.node for p in g.probe_points}
    assert c.id in probed and not (probed & inside)
    (note,) = [n for n in g.notes if n.node == c.id]
    assert "softclip" in note.message and "custom rule" in note.message
    assert note.to_dict()["probe"] == c.id


def test_equinox_mlp():
    mlp = eqx.nn.MLP(4, 2, 8, 2, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(mlp, eqx.is_array)

    @eqx.filter_jit
    def loss(m, x):
        return jnp.sum(jax.vmap(m)(x) ** 2)  # @eqx_call

    closed = jax.make_jaxpr(lambda p, x: loss(eqx.combine(p, static), x))(params, X)
    names = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    g = build_graph(closed, in_names=[*names, "x"], out_names=["loss"])
    assert next(n.label for n in g.nodes if n.kind == "input") == ".layers[0].weight"
    jit = one(g, "loss", "jit")
    (mlp_scope,) = [n for n in g.children(jit.id) if n.label == "eqx.nn.MLP"]
    linears = [n for n in g.children(mlp_scope.id) if n.label.startswith("eqx.nn.Linear")]
    assert all(n.kind == "scope" for n in linears)
    # The same label again among siblings gets an index.
    assert [n.label for n in linears] == ["eqx.nn.Linear", "eqx.nn.Linear#2", "eqx.nn.Linear#3"]
    relus = [n for n in g.children(mlp_scope.id) if n.kind == "custom"]
    assert len(relus) == 2
    # Layer sources point at the user's call, not into equinox.
    assert linears[0].source.line == line_of("@eqx_call")
    # Consecutive layers chain: Linear -> relu -> Linear -> relu -> Linear.
    chain = [linears[0], relus[0], linears[1], relus[1], linears[2]]
    edges = edge_set(g)
    assert all((a.id, b.id) in edges for a, b in itertools.pairwise(chain))
    assert {p.node for p in g.probe_points} >= {n.id for n in chain}


def test_ids_orders_and_dicts_are_deterministic():
    _, g1 = graph_of(scoped, X, W, capture="all")
    _, g2 = graph_of(scoped, X, W, capture="all")
    assert g1.to_dict() == g2.to_dict()
    assert g1.probe_points == g2.probe_points
    assert [n.order for n in g1.nodes] == list(range(len(g1.nodes)))
    assert all(n.id == f"n{n.order}" for n in g1.nodes)
    ids = {n.id for n in g1.nodes}
    assert all(n.parent is None or n.parent in ids for n in g1.nodes)
    pos = {n.id: n.order for n in g1.nodes}
    assert all(pos[n.parent] < n.order for n in g1.nodes if n.parent)


def test_same_model_in_another_process():
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import test_graph as t;"
        "_, g = t.graph_of(t.scoped, t.X, t.W, capture='all');"
        "print(json.dumps(g.to_dict()))"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(HERE.parent)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=os.getcwd(),
    ).stdout
    _, g = graph_of(scoped, X, W, capture="all")
    assert json.loads(out) == json.loads(json.dumps(g.to_dict()))


def test_model_json_shape():
    _, g = graph_of(scoped, X, W)
    d = json.loads(json.dumps(g.to_dict()))
    assert d["root"] == "n0"
    node = next(n for n in d["nodes"] if n["label"] == "encoder")
    # the optional `reads`: the encoder's own equations read the inputs `x` and `w`
    label = {n["id"]: n["label"] for n in d["nodes"]}
    assert [label[r] for r in node.pop("reads")] == ["in0", "in1"]
    # and per read, the order of the equation making it: one of the encoder's own
    assert [label[f"n{at}"] for at in node.pop("read_at")] == ["dot_general"] * 2
    assert set(node) == {
        "id",
        "label",
        "kind",
        "parent",
        "order",
        "source",
        "shapes",
        "primitive",
        "n_eqns",
        "collapsed",
    }
    assert node["source"]["line"] == line_of("@encoder_dot") and node["collapsed"] is True
    eqn = next(n for n in d["nodes"] if n["kind"] == "eqn")
    assert eqn["primitive"] == eqn["label"] and eqn["n_eqns"] == 1 and eqn["collapsed"] is False
    assert set(d["edges"][0]) - {"ends"} == {"source", "target", "shape", "dtype"}  # optional
    small = g.to_dict(compact=True)
    ceqn = next(n for n in small["nodes"] if n["kind"] == "eqn")
    assert "n_eqns" not in ceqn and "collapsed" not in ceqn and "primitive" not in ceqn
    assert len(json.dumps(small)) < len(json.dumps(d))


def test_capture_modes_and_float_only():
    def f(x, n):
        y = jnp.sin(x) * n  # int n is promoted
        k = n + 1  # integer: never probed
        return jnp.sum(y) + k

    _closed, g_all = graph_of(f, X, 3, capture="all")
    probed = {p.node for p in g_all.probe_points}
    int_add = next(n for n in g_all.nodes if n.shapes == ("int32[]",) and n.label == "add")
    assert one(g_all, "sin").id in probed and int_add.id not in probed
    assert all(s.startswith("float") for p in g_all.probe_points for s in p.shapes)
    _, g_sows = graph_of(f, X, 3, capture="sows")
    assert g_sows.probe_points == ()
    assert [n.to_dict() for n in g_sows.nodes] == [n.to_dict() for n in g_all.nodes]


def test_sow_nodes():
    def f(x):
        a = sow(jnp.sin(x), "h")  # @sow_h
        b = sow(a * 2.0, "h")
        return jnp.sum(sow({"z": b, "w": a}, "pair")["z"])

    _, g = graph_of(f, X)
    hs = by_label(g, "h", "sow")
    assert g.sow_nodes == {"h": hs[0].id, "pair": one(g, "pair", "sow").id}
    assert g.sow_nodes_all["h"] == (hs[0].id, hs[1].id)
    assert hs[0].source.line == line_of("@sow_h")
    assert (hs[0].id, one(g, "mul").id) in edge_set(g)


def test_errors_name_the_argument():
    closed = jax.make_jaxpr(jnp.sin)(X)
    with pytest.raises(ValueError, match="`capture` must be one of"):
        build_graph(closed, in_names=["x"], out_names=["y"], capture="everything")
    with pytest.raises(ValueError, match="`in_names` has 2 names but the program has 1 inputs"):
        build_graph(closed, in_names=["x", "y"], out_names=["y"])


# ---------------------------------------------------------------------------
# instrument


def _run_plain(closed):
    return lambda *a: jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *a)


def _assert_same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
        assert np.asarray(u).tobytes() == np.asarray(v).tobytes()


def full_program(x, w):
    with jax.named_scope("block"):
        h = leaf_fn(x @ w)
    c = nested_scans(h)
    return with_cond(h) + c + with_checkpoint(h) + with_custom(h)


def test_instrument_outputs_bit_identical():
    closed, g = graph_of(full_program, X, W, capture="all")
    fn = instrument(closed, g.probe_points, tag="auto")
    _assert_same(jax.jit(fn)(X, W), jax.jit(_run_plain(closed))(X, W))
    _assert_same(fn(X, W), _run_plain(closed)(X, W))
    plain = instrument_jaxpr(closed, g.probe_points, tag="auto")
    _compat.check_jaxpr(plain.jaxpr)
    assert {n for n, _ in sows_in(plain)} == {p.node for p in g.probe_points}
    assert not plain.effects  # outside a capture a sow has no effect (fast dispatch)
    with _compat.capturing(True):  # inside one, every enclosing jaxpr carries its effect
        captured = instrument_jaxpr(closed, g.probe_points, tag="auto")
        _compat.check_jaxpr(captured.jaxpr)
        assert captured.effects
        _assert_same(jax.jit(fn)(X, W), jax.jit(_run_plain(closed))(X, W))


def test_instrument_grad_sees_cotangents_in_jit_scan_cond():
    closed, g = graph_of(full_program, X, W, capture="all")
    fn = instrument(closed, g.probe_points, tag="auto")
    grad = jax.grad(lambda x, w: fn(x, w)[0], argnums=(0, 1))
    modes = modes_by_name(jax.make_jaxpr(grad)(X, W))
    in_jit = by_label(g, "sin")[0]  # the first sin is leaf_fn's
    assert g.node(in_jit.parent).label == "leaf_fn"
    in_scan = next(n for n in by_label(g, "sin") if g.node(n.parent).kind == "scan")
    in_branch = next(n for n in by_label(g, "sin") if g.node(n.parent).label.startswith("branch"))
    for node in (in_jit, in_scan, in_branch, one(g, "block", "scope"), one(g, "leaf_fn")):
        assert ("C",) in modes[node.id], (node, modes.get(node.id))
        assert () in modes[node.id] or ("P",) in modes[node.id]
    # Gradients are those of the original program.
    g_plain = jax.grad(lambda x, w: _run_plain(closed)(x, w)[0], argnums=(0, 1))(X, W)
    g_inst = jax.jit(grad)(X, W)
    for a, b in zip(g_plain, g_inst, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_instrument_jvp_and_vjp_and_while():
    closed, g = graph_of(with_while, X, capture="all")
    fn = instrument(closed, g.probe_points, tag="auto")
    body_mul = one(g, "mul")
    jvp = lambda x, t: jax.jvp(lambda a: fn(a)[0], (x,), (t,))  # noqa: E731
    modes = modes_by_name(jax.make_jaxpr(jvp)(X, X))
    assert ("P",) in modes[body_mul.id] and ("T",) in modes[body_mul.id]
    out, tan = jax.jit(jvp)(X, X)
    ref = jax.jvp(lambda a: _run_plain(closed)(a)[0], (X,), (X,))
    _assert_same([out, tan], list(ref))
    closed2, g2 = graph_of(with_checkpoint, X)
    fn2 = instrument(closed2, g2.probe_points, tag="auto")
    _, pullback = jax.vjp(lambda a: fn2(a)[0], X)
    modes2 = modes_by_name(jax.make_jaxpr(pullback)(jnp.float32(1.0)))
    assert ("C",) in modes2[one(g2, "checkpoint(block)").id]


def test_a_solver_inside_a_custom_vjp_is_probed_beside_the_program():
    """A custom rule's body (here a 30-step fixed-point solve, as diffrax's and
    optimistix's adjoints wrap theirs) never runs under differentiation: its stages
    are evaluated a second time beside the program, primal values only, while the
    rule still makes the gradient (its clipping shows in it)."""

    @jax.custom_vjp
    def solve(a):
        def body(i, y):
            with jax.named_scope("update"):
                return 0.5 * (y + a / y)

        return lax.fori_loop(0, 30, body, jnp.ones_like(a))

    def fwd(a):
        y = solve(a)
        return y, y

    def bwd(y, g):
        return (jnp.clip(g / (2 * y), -0.05, 0.05),)  # a rule the body does not follow

    solve.defvjp(fwd, bwd)

    def loss(a):
        return jnp.sum(solve(a) ** 2)

    a = jnp.array([2.0, 9.0, 16.0])
    ins = sowviz.inspect(loss, a, mode="grad")
    value, grad = jax.value_and_grad(loss)(a)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-6)
    assert np.all(np.abs(np.asarray(grad)) <= 0.05)  # the rule's, not the body's
    update = ins.probe("update").summaries  # every iterate of Heron's method
    iterates, y = [], np.ones(3)
    for _ in range(30):
        y = 0.5 * (y + np.asarray(a, np.float64) / y)
        iterates.append(y)
    assert sorted(update) == ["primal"]
    assert list(update["primal"]["shape"]) == [30, 3]
    np.testing.assert_allclose(update["primal"]["l2"], np.linalg.norm(iterates), rtol=1e-5)
    assert "cotangent" in ins.probe("solve").summaries  # the call's outputs carry it
    (note,) = [n.message for n in ins.graph.notes if "custom_vjp" in n.message]
    assert "primal values only" in note
    # an activation's small rule is not evaluated twice: nothing probed inside relu
    relu = sowviz.inspect(lambda x: jnp.sum(jax.nn.relu(x) ** 2), a)
    assert not [p for p in relu.probes if relu.graph.node(p.node).parent != relu.graph.root]


def test_instrument_without_points_is_the_program():
    closed, _ = graph_of(scoped, X, W)
    fn = instrument(closed, [], tag="auto")
    _assert_same(fn(X, W), _run_plain(closed)(X, W))


def test_shard_map_stage():
    mesh = jax.make_mesh((4,), ("d",))
    spec = jax.sharding.PartitionSpec("d")

    def f(x):
        def local(a):
            return lax.psum(jnp.sin(a), "d")

        return jnp.sum(jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=jax.P())(x))

    x = jax.device_put(jnp.arange(8.0), jax.NamedSharding(mesh, spec))
    closed, g = graph_of(f, x, capture="all")
    sm = one(g, "shard_map(local)", "shard_map")
    # (`lax.psum` as called, not the `psum_invariant` it binds under check_vma)
    assert {n.label for n in g.children(sm.id)} == {"sin", "psum"}
    fn = instrument(closed, g.probe_points, tag="auto")
    _assert_same(jax.jit(fn)(x), jax.jit(_run_plain(closed))(x))
    modes = modes_by_name(jax.make_jaxpr(jax.grad(lambda a: fn(a)[0]))(x))
    assert ("C",) in modes[one(g, "sin").id]


def test_a_small_programs_own_equations_carry_data():
    # A loss's tail (`mean((h - 1) ** 2)`) at the top level drew boxes with no data:
    # in a small program each of its equations is probed as a stage is, its value and
    # gradient those of plain JAX. A top level past `SMALL_TOP_LEVEL` nodes folds its
    # lines into boxes named by what they assign, each with its data.
    w = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)
    x = jnp.linspace(0.0, 2.0, 6).reshape(2, 3)

    def loss(w, x):
        with jax.named_scope("layer"):
            h = jnp.tanh(x @ w)
        return jnp.mean((h - 1.0) ** 2)

    ins = sowviz.inspect(loss, w, x)
    nodes = {n.id: n for n in ins.graph.nodes}
    top = [n.primitive for n in ins.graph.nodes if n.parent == ins.graph.root and n.kind == "eqn"]
    assert top == ["sub", "integer_pow"]
    got = {nodes[p.node].primitive: p.summaries for p in ins.probes if nodes[p.node].kind == "eqn"}
    assert set(got) == set(top)
    # `jnp.mean`'s two equations are one box, `mean`, carrying the loss and its gradient
    (mean,) = [n for n in ins.graph.nodes if n.parent == ins.graph.root and n.label == "mean"]
    got["mean"] = next(p.summaries for p in ins.probes if p.node == mean.id)
    h = jnp.tanh(x @ w)
    d = h - 1.0
    np.testing.assert_allclose(got["sub"]["primal"]["mean"], float(jnp.mean(d)), rtol=1e-5)
    # dloss/d(d**2) = 1/n, dloss/d(d) = 2 d / n
    np.testing.assert_allclose(got["integer_pow"]["cotangent"]["max"], 1 / d.size, rtol=1e-6)
    want = jax.grad(lambda d: jnp.mean(d**2))(d)
    np.testing.assert_allclose(
        got["sub"]["cotangent"]["l2"], float(jnp.linalg.norm(want)), rtol=1e-5
    )
    np.testing.assert_allclose(got["mean"]["cotangent"]["max"], 1.0)
    np.testing.assert_allclose(got["mean"]["primal"]["max"], float(jnp.mean(d**2)), rtol=1e-6)
    # a jitted loss (`@jax.jit`, `eqx.filter_jit`) draws its body as the top level: alike
    jitted = sowviz.inspect(jax.jit(loss), w, x)
    nodes = {n.id: n for n in jitted.graph.nodes}
    again = {nodes[p.node].primitive for p in jitted.probes if nodes[p.node].kind == "eqn"}
    assert again == set(top)

    def wide(w, x):  # a large value's square (90,000 values) is no probe; its mean is
        big = jnp.tile(x @ w, (150, 75))
        return jnp.mean(big**2)

    ins = sowviz.inspect(wide, w, x)
    nodes = {n.id: n for n in ins.graph.nodes}
    got = {nodes[p.node].label for p in ins.probes if nodes[p.node].parent == ins.graph.root}
    assert "integer_pow" not in got and "mean" in got

    def big(w, x):  # 14 top-level equations, one a line: each assigning line a box with data
        y = x @ w
        y = jnp.sin(y)
        y = y * 1.5
        y = jnp.cos(y)
        y = y + 0.5
        y = jnp.tanh(y)
        y = y - 0.25
        y = jnp.exp(y)
        y = y / 3.0
        y = jnp.sin(y)
        y = y * 0.5
        y = jnp.cos(y)
        y = y + 1.0
        return jnp.sum(y)

    _, g = graph_of(big, w, x)
    top = [n for n in g.nodes if n.parent == g.root and n.kind not in ("input", "output")]
    lines = [n for n in top if n.label.split("#")[0] == "y"]
    assert len(lines) == 13 and all(n.kind == "scope" and n.n_eqns == 1 for n in lines)
    assert {n.id for n in lines} <= {p.node for p in g.probe_points}
    assert [n.label for n in top if n.kind == "eqn"] == ["reduce_sum"]


def test_a_shard_maps_type_casts_are_no_boxes():
    # A shard_map marks each replicated value it reads device-varying (`pvary`) before
    # use: a type, no number changes. It drew a `pvary` box beside every parameter; the
    # cast is now the edge it is, and the program and the gradient are unchanged.
    mesh = jax.make_mesh((4,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    P = jax.sharding.PartitionSpec

    def loss(w, x):
        def local(w, x):
            with jax.named_scope("hidden"):
                h = jnp.tanh(x @ w)
            return lax.pmean(jnp.mean(h**2), "d")

        return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("d")), out_specs=P())(w, x)

    w = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)
    x = jax.device_put(jnp.arange(24.0).reshape(8, 3) / 10, jax.NamedSharding(mesh, P("d")))
    closed, g = graph_of(loss, w, x, capture="all")
    prims = {e.primitive.name for e in closed.jaxpr.eqns[0].params["jaxpr"].eqns}
    assert "pvary" in prims  # the case is what it says
    assert not [n for n in g.nodes if n.label == "pvary"]
    hidden = one(g, "hidden")
    assert [n.label for n in g.children(hidden.id)] == ["dot_general", "tanh"]
    fn = instrument(closed, g.probe_points, tag="auto")
    _assert_same(jax.jit(fn)(w, x), jax.jit(_run_plain(closed))(w, x))
    value, grad = jax.value_and_grad(loss)(w, x)
    got_value, got_grad = sowviz.inspect(loss, w, x).result
    np.testing.assert_allclose(got_value, value, rtol=1e-6)
    np.testing.assert_allclose(got_grad, grad, rtol=1e-5)


# ---------------------------------------------------------------------------
# Tesseracts

try:
    import tesseract_jax  # noqa: F401
except ImportError:  # pragma: no cover - the test extra installs it
    _TESSERACT_JAX = False
else:
    _TESSERACT_JAX = True

needs_tesseract = pytest.mark.skipif(
    not _TESSERACT_JAX, reason="tesseract_jax is not importable (pip install sowviz[tesseract])"
)


@pytest.fixture(scope="module")
def tesseracts():
    from tesseract_core import Tesseract

    return (
        Tesseract.from_tesseract_api(TESSERACTS / "scale" / "tesseract_api.py"),
        Tesseract.from_tesseract_api(TESSERACTS / "softplus_norm" / "tesseract_api.py"),
    )


def _pipeline(tesseracts):
    from tesseract_jax import apply_tesseract

    scale, norm = tesseracts

    @jax.jit
    def pipeline(x, a):
        y = apply_tesseract(scale, {"x": x, "a": a, "b": jnp.float32(0.5)})["y"]  # @tess_scale
        out = apply_tesseract(norm, {"y": jnp.tanh(y)})
        return out["norm"] + 0.1 * jnp.sum(out["z"])

    return pipeline


@needs_tesseract
def test_tesseract_pipeline_graph(tesseracts):
    pipeline = _pipeline(tesseracts)
    x, a = jnp.arange(4.0, dtype=jnp.float32), jnp.float32(2.0)
    _, g = graph_of(pipeline, x, a)
    t1, t2 = by_label(g, "scale", "tesseract")[0], one(g, "softplus_norm", "tesseract")
    jit = one(g, "pipeline", "jit")
    assert t1.parent == jit.id and t2.parent == jit.id
    assert t1.source.line == line_of("@tess_scale")
    tanh = one(g, "tanh")
    edges = edge_set(g)
    assert (t1.id, tanh.id) in edges and (tanh.id, t2.id) in edges
    assert t2.shapes == ("float32[]", "float32[4]") and t1.collapsed
    assert {p.node for p in g.probe_points} >= {t1.id, t2.id}
    # Outputs by schema field; an output the program never uses is not probed.
    (p2,) = [p for p in g.probe_points if p.node == t2.id]
    assert p2.names == ("norm", "z") and len(p2.values) == 2
    _scale, norm = tesseracts
    from tesseract_jax import apply_tesseract

    _, g_norm = graph_of(lambda y: apply_tesseract(norm, {"y": y})["norm"], x)
    (t,) = [n for n in g_norm.nodes if n.kind == "tesseract"]
    (p,) = [p for p in g_norm.probe_points if p.node == t.id]
    # one output read: still named (the panel says which output it shows)
    assert p.names == ("norm",) and p.shapes == ("float32[]",) and len(p.values) == 1
    # Labels can be overridden by Tesseract object, by default name, or by a function.
    _, g2 = graph_of(
        pipeline, x, a, tesseract_names={tesseracts[0]: "affine", "softplus_norm": "sp"}
    )
    assert [n.label for n in g2.nodes if n.kind == "tesseract"] == ["affine", "sp"]
    _, g3 = graph_of(pipeline, x, a, tesseract_names=lambda t: "T")
    # one name for both: numbered among siblings, as any stage called again
    assert [n.label for n in g3.nodes if n.kind == "tesseract"] == ["T", "T#2"]


@needs_tesseract
def test_tesseract_pipeline_instrument_and_grad(tesseracts):
    pipeline = _pipeline(tesseracts)
    x, a = jnp.arange(4.0, dtype=jnp.float32), jnp.float32(2.0)
    closed, g = graph_of(pipeline, x, a, capture="all")
    fn = instrument(closed, g.probe_points, tag="auto")
    _assert_same(fn(x, a), _run_plain(closed)(x, a))
    grad = jax.grad(lambda x, a: fn(x, a)[0], argnums=(0, 1))
    modes = modes_by_name(jax.make_jaxpr(grad)(x, a))
    for t in g.nodes:
        if t.kind == "tesseract":
            assert ("C",) in modes[t.id]
    got = grad(x, a)
    want = jax.grad(pipeline, argnums=(0, 1))(x, a)
    for u, v in zip(got, want, strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-6)
    # A Tesseract's outputs are sown by field name.
    from tesseract_jax import apply_tesseract

    from sowviz import save_intermediates

    fn = instrument(closed, g.probe_points, tag="intermediates")
    _, inter = save_intermediates(fn)(x, a)
    t2 = one(g, "softplus_norm", "tesseract")
    y = apply_tesseract(tesseracts[0], {"x": x, "a": a, "b": jnp.float32(0.5)})["y"]
    want_out = apply_tesseract(tesseracts[1], {"y": jnp.tanh(y)})
    assert set(inter[t2.id]["primal"]) == {"norm", "z"}
    for k in ("norm", "z"):
        np.testing.assert_allclose(inter[t2.id]["primal"][k], want_out[k], rtol=1e-6)


def test_instrumented_probes_reach_save_intermediates():
    """End to end with the capture engine: every stage probe comes back with its cotangent."""
    from sowviz import save_intermediates

    closed, g = graph_of(full_program, X, W)
    fn = instrument(closed, g.probe_points, tag="intermediates")
    _, inter = save_intermediates(jax.grad(lambda x, w: fn(x, w)[0], argnums=(0, 1)))(X, W)
    assert set(inter) == {p.node for p in g.probe_points}
    # (but `with_cond`'s predicate, `jnp.sum(x) > 0`, whose value no gradient reaches)
    pred = next(n for n in g.children(one(g, "with_cond").id) if n.primitive == "reduce_sum")
    for p in g.probe_points:
        assert {"primal", "cotangent"} <= set(inter[p.node]) or p.node == pred.id, p
    inner = one(g, "scan(inner)")  # nested scans stack one axis per level
    assert [a.shape for a in inter[inner.id]["primal"]] == [(3, 4), (3, 1, 4)]


# ---------------------------------------------------------------------------
# Framework names, parameters, inputs and outputs


class _NnxBlock(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(4, 4, rngs=rngs)
        self.mlp = nnx.List([nnx.Linear(4, 4, rngs=rngs) for _ in range(2)])

    def __call__(self, x):
        x = self.lin(x)  # @nnx_lin
        for m in self.mlp:
            x = jnp.tanh(m(x))
        return x


class _NnxModel(nnx.Module):
    def __init__(self, rngs):
        self.layers = nnx.List([_NnxBlock(rngs) for _ in range(2)])

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)  # @nnx_layer
        return x


def _nnx_loss(model, x):
    return jnp.sum(model(x) ** 2)  # @nnx_root


def _named_graph(fn, *args, **kw):
    leaves, tree = jax.tree_util.tree_flatten(args)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(args)[0]]
    named = frameworks.named(fn)
    flat = lambda *f: named(*jax.tree_util.tree_unflatten(tree, f))  # noqa: E731
    closed = jax.make_jaxpr(flat)(*leaves)
    in_args = [int(p[1 : p.index("]")]) for p in paths]
    names = [("model", "x")[a] + p[p.index("]") + 1 :] for a, p in zip(in_args, paths, strict=True)]
    g = build_graph(
        closed, in_names=names, out_names=["loss"], in_args=in_args, calls=named.sowviz_calls, **kw
    )
    return closed, g


def _path_of(g, node):
    """The labels of `node` and its ancestors, groups of repeated blocks left out."""
    out = []
    while node.parent is not None:
        if not node.repeats:
            out.append(node.label)
        node = g.node(node.parent)
    return ".".join(reversed(out))


def test_nnx_module_paths_are_nested_stages_at_their_call_sites():
    model = _NnxModel(nnx.Rngs(0))
    original = nnx.Linear.__dict__["__call__"]
    _, g = _named_graph(_nnx_loss, model, X)
    scopes = {_path_of(g, n): n for n in g.nodes if n.kind == "scope" and not n.repeats}
    for path in (
        "_NnxModel.layers[0].lin",
        "_NnxModel.layers[1].mlp[0]",
        "_NnxModel.layers[1].mlp[1]",
    ):
        assert path in scopes, sorted(scopes)
    assert scopes["_NnxModel"].source.line == line_of("@nnx_root")
    assert scopes["_NnxModel.layers[1]"].source.line == line_of("@nnx_layer")
    assert scopes["_NnxModel.layers[0].lin"].source.line == line_of("@nnx_lin")
    dots = [n for n in g.nodes if n.label == "dot_general"]
    assert len(dots) == 6 and all(
        g.node(n.parent).label in ("lin", "mlp[0]", "mlp[1]") for n in dots
    )
    # The wrapper is gone afterwards, and calls outside `named` push no scope.
    assert nnx.Linear.__dict__["__call__"] is original
    plain = jax.make_jaxpr(_nnx_loss)(model, X)
    assert all(not _compat.name_stack_kinds(e) for e in plain.jaxpr.eqns)


def test_named_leaves_other_threads_alone():
    import threading

    model = _NnxModel(nnx.Rngs(0))
    seen = []
    inside = threading.Event()
    done = threading.Event()

    def slow_loss(m, x):
        inside.set()
        done.wait(10)  # another thread traces while this one holds the wrappers
        return _nnx_loss(m, x)

    t = threading.Thread(target=lambda: _named_graph(slow_loss, model, X))
    t.start()
    inside.wait(10)
    try:
        plain = jax.make_jaxpr(_nnx_loss)(model, X)
        seen = [_compat.name_stack_kinds(e) for e in plain.jaxpr.eqns]
    finally:
        done.set()
        t.join()
    assert seen and not any(seen)


class _EqxNet(eqx.Module):
    layers: list
    out: eqx.nn.Linear

    def __init__(self, key):
        k = jax.random.split(key, 3)
        self.layers = [eqx.nn.Linear(4, 4, key=k[0]), eqx.nn.Linear(4, 4, key=k[1])]
        self.out = eqx.nn.Linear(4, 1, key=k[2])

    def __call__(self, x):
        for layer in self.layers:
            x = jnp.tanh(layer(x))  # @eqx_layer
        return self.out(x)


def test_equinox_module_paths_with_class_names():
    net = _EqxNet(jax.random.PRNGKey(0))
    _, g = _named_graph(lambda m, x: jnp.sum(jax.vmap(m)(x) ** 2), net, X)
    scopes = [_path_of(g, n) for n in g.nodes if n.kind == "scope" and n.parent != "n1"]
    assert "_EqxNet.layers[0]: Linear" in scopes and "_EqxNet.out: Linear" in scopes, scopes
    # Equinox's own `eqx.nn.Linear` scope is folded into the stage that names it.
    assert not any("eqx.nn.Linear" in s for s in scopes)
    (l1,) = [n for n in g.nodes if n.label == "layers[1]: Linear"]
    assert l1.source.line == line_of("@eqx_layer")


def test_equinox_private_wrappers_are_no_stages():
    # Equinox's `filter_vmap` returns a `_VmapWrapper` module, and `eqx.nn.MLP` wraps its
    # activation in one: no stage of their own, their calls show where they are made.
    params, static = eqx.partition(eqx.nn.MLP(4, 2, 8, 2, key=jax.random.PRNGKey(0)), eqx.is_array)
    for call in (jax.vmap, eqx.filter_vmap):

        def loss(p, x, call=call):
            return jnp.sum(call(eqx.combine(p, static))(x) ** 2)

        _, g = _named_graph(loss, params, X)
        assert not [n.label for n in g.nodes if n.label.startswith("_")]
        # the model's stage (named by its class) holds the layers, not Equinox's own
        # `eqx.nn.MLP` scope again
        assert not [n for n in g.nodes if n.label.startswith("eqx.nn.")]
        (mlp_scope,) = [n for n in g.nodes if n.label == "MLP"]
        kids = g.children(mlp_scope.id)
        linears = [n for n in kids if n.label.endswith(": Linear")]
        relus = [n for n in kids if n.kind == "custom"]
        assert [n.label for n in linears] == [f"layers[{i}]: Linear" for i in range(3)]
        chain = [linears[0], relus[0], linears[1], relus[1], linears[2]]
        assert all((a.id, b.id) in edge_set(g) for a, b in itertools.pairwise(chain))


def test_parameters_group_nested_by_path_and_probed():
    params = {"blocks": [{"w": W, "b": X[0]}, {"w": W.T, "b": X[1]}], "scale": X[2, 0]}

    def loss(p, x):
        for blk in p["blocks"]:
            x = jnp.tanh(x @ blk["w"] + blk["b"])
        return jnp.sum(x**2) * p["scale"]

    closed, g = _named_graph(loss, params, X, parameters={0})
    (group,) = [n for n in g.nodes if n.label == "parameters"]
    assert group.parent == g.root and group.kind == "scope"
    leaves = [n for n in g.nodes if n.kind == "input"]
    assert [_path_of(g, n) for n in leaves] == [
        "parameters.blocks[0].b",
        "parameters.blocks[0].w",
        "parameters.blocks[1].b",
        "parameters.blocks[1].w",
        "parameters.scale",
        "x",
    ]
    # Every input and the output is probed; a parameter's cotangent is its gradient.
    by_node = {p.node: p for p in g.probe_points}
    out = next(n for n in g.nodes if n.kind == "output")
    assert {n.id for n in leaves} | {out.id} <= set(by_node)
    fn = instrument(closed, g.probe_points, tag="intermediates")
    flat = jax.tree_util.tree_leaves((params, X))
    grads = jax.grad(lambda *a: fn(*a)[0], argnums=tuple(range(len(flat))))
    modes = modes_by_name(jax.make_jaxpr(grads)(*flat))
    for n in leaves:
        assert ("C",) in modes[n.id]
    from sowviz import save_intermediates

    _, inter = save_intermediates(grads)(*flat)
    want = jax.grad(lambda p, x: loss(p, x), argnums=(0, 1))(params, X)
    for n, g_want, v in zip(leaves, jax.tree_util.tree_leaves(want), flat, strict=True):
        np.testing.assert_allclose(inter[n.id]["cotangent"], g_want, rtol=1e-6)
        np.testing.assert_array_equal(inter[n.id]["primal"], v)
    np.testing.assert_allclose(inter[out.id]["primal"], loss(params, X), rtol=1e-6)


def _fold_step(x, w):
    h = jnp.tanh(x @ w)  # @fold_first
    h = h * 0.5 + jnp.sin(x)  # @fold_mixed
    return jnp.linalg.norm(h, axis=-1, keepdims=True) * h  # @fold_callee


def _fold_big(x, w):
    for _ in range(60):
        x = _fold_step(x, w)  # @fold_call
    return jnp.sum(jnp.exp(-x) ** 2) + jnp.mean(x)


def test_a_user_function_called_in_a_loop_is_one_stage_per_call_stacked():
    # 60 calls of `_fold_step`, each a stage of the user's own function sourced at its
    # call, stacked as identical blocks: one node, however big the program.
    closed, g = graph_of(_fold_big, X, W)
    top = g.children(g.root)
    assert len(closed.jaxpr.eqns) > 400 and len(top) <= 15, [n.label for n in top]
    stack = one(g, "_fold_step (×60)", "scope")
    calls = g.children(stack.id)
    assert [c.label for c in calls[:3]] == ["_fold_step", "_fold_step#2", "_fold_step#3"]
    assert len(calls) == 60 and {c.source.line for c in calls} == {line_of("@fold_call")}
    inside = [n.label for n in g.children(calls[0].id)]
    assert inside == [n.label for n in g.children(calls[-1].id)]
    # each call reads by line, as the call alone does below (its lines, met again in
    # the next call, were taken for a loop's passes: `dot_general`, `tanh`, ...)
    assert inside[:2] == ["h", "h#2"] and "norm" in inside, inside
    # Every equation is still drawn once, inside the calls.
    assert sum(n.kind not in ("scope", "input", "output", "jit") for n in g.nodes) >= 420
    # A call that is the whole program restates it: no stage of it, its lines are boxes.
    _, small = graph_of(lambda x, w: _fold_step(x, w), X, W)
    assert not any(n.label.startswith("_fold_step") for n in small.nodes)
    assert [n.label for n in small.children(small.root)][2:4] == ["h", "h#2"]


def _fold_flat(x, w):
    for _ in range(60):  # the same work written out in one function: no calls
        h = jnp.tanh(x @ w)  # @flat_first
        h = h * 0.5 + jnp.sin(x)  # @flat_mixed
        x = jnp.linalg.norm(h, axis=-1, keepdims=True) * h
    return jnp.sum(jnp.exp(-x) ** 2) + jnp.mean(x)


def test_big_unscoped_program_folds_by_line_function_and_chunks():
    closed, g = graph_of(_fold_flat, X, W)
    top = g.children(g.root)
    assert len(closed.jaxpr.eqns) > 400 and len(top) <= 40, [n.label for n in top]
    chunks = [n for n in top if n.label.startswith("_fold_flat ×")]
    assert chunks and sum(len(g.children(c.id)) for c in chunks) >= 60
    run = g.children(chunks[0].id)[0]  # one pass of the loop: its three lines
    assert run.label == "_fold_flat" and run.source.line == line_of("@flat_first")
    labels = [n.label for n in g.children(run.id)]
    # a line of several calls is labelled by what it assigns, one of a single call by
    # that call
    assert "h" in labels and "norm" in labels, labels
    assert sum(n.kind not in ("scope", "input", "output", "jit") for n in g.nodes) >= 420


def _small_gelu(x):
    return jnp.sum(jax.nn.gelu(x, approximate=True) * 2.0)  # @gelu_line


def _small_conv(x, k):
    img = x.reshape(1, 1, *x.shape)
    return jnp.sum(lax.conv_general_dilated(img, k, (1, 1), "SAME").reshape(x.shape) * x)


def test_small_level_folds_one_library_call_of_several_equations():
    # gelu's eight equations are one box named by the call; the `* 2.0` on its line,
    # and a call named like its one real equation (`conv_general_dilated` with the
    # reshapes around it), are not folded.
    x, k = jnp.linspace(-2.0, 2.0, 12).reshape(3, 4), jnp.ones((1, 1, 2, 2))
    _, g = graph_of(_small_gelu, x)
    gelu = one(g, "gelu", "scope")
    inside = [n.label for n in g.children(gelu.id)]
    assert len(inside) >= 5 and "tanh" in inside and gelu.source.line == line_of("@gelu_line")
    assert [n.label for n in g.children(g.root)].count("mul") == 1  # `* 2.0` stays outside
    _, g = graph_of(_small_conv, x, k)
    # (`img = x.reshape(...)` is a line of its own: a box named by what it assigns)
    assert [n.label for n in g.nodes if n.kind == "scope"] == ["img"], [n.label for n in g.nodes]


_COMBINE_CALLS: list[int] = []


def _combine(a, b):
    _COMBINE_CALLS.append(1)
    (a1, a2), (b1, b2) = a, b
    return a1 * b1, b1 * a2 + b2


def _linear_recurrence(w, x):
    h = jnp.tanh(x @ w)
    decay = jax.nn.sigmoid(h)
    _, states = lax.associative_scan(_combine, (decay, h))  # @assoc_line
    return jnp.mean(states**2)


def test_associative_scan_is_one_stage_holding_its_combine_calls():
    # The user's `combine` re-enters `associative_scan` (no sub-program of its own):
    # one stage for the call, holding each call of `combine` between its own work,
    # not 25 siblings `associative_scan#k`, `combine:6#k` beside the rest.
    w = jax.random.normal(jax.random.key(0), (8, 8)) / 3
    x = jax.random.normal(jax.random.key(1), (64, 8))
    _COMBINE_CALLS.clear()
    ins = sowviz.inspect(_linear_recurrence, w, x)
    calls = len(_COMBINE_CALLS)
    _COMBINE_CALLS.clear()
    _, g = graph_of(_linear_recurrence, w, x)
    assert len(_COMBINE_CALLS) == calls > 2  # traced once more for the graph
    group = one(g, "associative_scan(_combine)", "scope")
    assert group.source.line == line_of("@assoc_line")
    inside = [n.label for n in g.children(group.id)]
    assert sum(lbl.startswith("_combine") for lbl in inside) == calls, inside
    assert all(lbl.startswith(("_combine", "slice & interleave")) for lbl in inside), inside
    assert not any("associative_scan" in n.label for n in g.nodes if n.id != group.id)
    # its probe holds the scan's output, with the loss's cotangent
    states = lax.associative_scan(_combine, (jax.nn.sigmoid(jnp.tanh(x @ w)), jnp.tanh(x @ w)))[1]
    got = ins.probe("associative_scan(_combine)").summaries
    np.testing.assert_allclose(got["primal"]["mean"], np.mean(states), rtol=1e-5)
    np.testing.assert_allclose(got["primal"]["max"], np.max(states), rtol=1e-6)
    cot = jax.grad(lambda s: jnp.mean(s**2))(states)
    np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(cot), rtol=1e-5)
    # a lambda names no call back
    _, g = graph_of(lambda w, x: lax.associative_scan(lambda a, b: a * b, x @ w).sum(), w, x)
    group = one(g, "associative_scan", "scope")
    assert {n.label.split("#")[0] for n in g.children(group.id)} == {"lambda", "slice & interleave"}


def _scan_loss(p, y0, xs):
    """A scan with a const (`p`), a carry and stacked ys the loss never reads."""

    def body(s, x):
        s = s * p["a"] + x * p["b"]
        return s, s  # the ys output is the carry itself

    y, ys = lax.scan(body, y0, xs)
    del ys  # its cotangent is a symbolic zero
    return jnp.sum(y**2)


def test_inspect_grad_of_scan_with_unread_ys_matches_jax():
    # JAX 0.10's scan transpose put a stacked symbolic-zero cotangent of `ys` into
    # the loop body ("Expected cotangent type float32[3] but got float32[5,3]")
    # once a probe on the scan's outputs kept the ys tangent alive.
    p = {"a": jnp.float32(0.9), "b": jnp.array([0.5, -1.0, 2.0], jnp.float32)}
    y0 = jnp.array([1.0, 0.5, -0.25], jnp.float32)
    xs = jnp.linspace(-1.0, 1.0, 15, dtype=jnp.float32).reshape(5, 3)
    ins = sowviz.inspect(_scan_loss, p, y0, xs, mode="grad")
    value, grads = ins.result
    want_value, want_grads = jax.value_and_grad(_scan_loss)(p, y0, xs)
    np.testing.assert_allclose(value, want_value, rtol=1e-6)
    for k in p:
        np.testing.assert_allclose(grads[k], want_grads[k], rtol=1e-5)


def test_a_train_step_draws_its_own_backward_pass_as_a_stage_of_its_own():
    """A step that takes `jax.value_and_grad` itself: JAX names the transposed equations
    `transpose(jvp(MLP))`; they are `MLP (backward)`, not a second `MLP#2`."""

    def mlp(w, x):
        with jax.named_scope("MLP"):
            return jnp.sum(jnp.tanh(x @ w) ** 2)

    def step(w, x):
        value, g = jax.value_and_grad(mlp)(w, x)
        return w - 0.1 * g, value

    w, x = jnp.ones((3, 2)) / 3, jnp.ones((4, 3))
    ins = sowviz.inspect(step, w, x, mode="primal")
    labels = [n.label for n in ins.graph.nodes]
    assert "MLP" in labels and "MLP (backward)" in labels and "MLP#2" not in labels
    np.testing.assert_allclose(ins.result[0], step(w, x)[0], rtol=1e-6)
    # the backward stage holds the transposed matmul; the forward one does not
    (fwd,) = [n for n in ins.graph.nodes if n.label == "MLP"]
    (bwd,) = [n for n in ins.graph.nodes if n.label == "MLP (backward)"]
    inside = {p: [n for n in ins.graph.nodes if n.parent == p.id] for p in (fwd, bwd)}
    assert any(n.primitive == "transpose" for n in inside[bwd])
    assert not any(n.primitive == "transpose" for n in inside[fwd])


@pytest.mark.parametrize(
    "qualname, label, through",
    [
        ("scale_by_adam.<locals>.update_fn", "scale_by_adam", False),  # optax's closures
        (
            "inject_hyperparams.<locals>.wrapped_transform.<locals>.update_fn",
            "inject_hyperparams",
            False,
        ),
        ("tree_update_moment.<locals>.<lambda>", "tree_update_moment", False),
        ("clip_by_global_norm.<locals>.update_fn.<locals>.clip_fn", "clip_fn", False),
        ("Optimizer.update", "Optimizer.update", False),
        ("MultiSteps.__init__.<locals>.<lambda>", "MultiSteps", False),
        ("_check_grads_arg_passed.<locals>._check_grads_wrapper", "_check_grads_wrapper", True),
        ("with_extra_args_support.<locals>.update", "with_extra_args_support", True),
        ("CNN.__call__", "CNN", True),
        ("<lambda>", "<lambda>", True),
    ],
)
def test_function_labels_name_library_closures_by_what_made_them(qualname, label, through):
    from sowviz.graph.names import function_label

    assert function_label(qualname) == (label, through)


def _optax_step():
    import optax

    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    params = {"dense": {"w": jnp.ones((3, 4)) * 0.1, "b": jnp.zeros(4)}, "out": jnp.ones(4)}

    def loss(p, x):
        return jnp.mean((jnp.tanh(x @ p["dense"]["w"] + p["dense"]["b"]) @ p["out"]) ** 2)

    def train_step(params, opt_state, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return train_step, (params, tx.init(params), jnp.ones((5, 3)))


def test_an_optimiser_update_is_drawn_as_the_transformations_it_chains():
    step, args = _optax_step()
    ins = sowviz.inspect(step, *args, mode="primal")
    g = ins.graph
    top = {n.label: n for n in g.children(g.root)}
    # `tx.update(...)`: one stage per transformation, not 140 equations in a row
    chain = top["chain"]
    assert [n.label for n in g.children(chain.id) if n.kind == "scope"] == [
        "clip_by_global_norm",
        "scale_by_adam",
        "add_decayed_weights",
        "scale",
    ]
    adam = by_label(g, "scale_by_adam")[0]
    inner = {n.label for n in g.children(adam.id)}
    assert {"tree_update_moment", "tree_update_moment_per_elem_norm"} <= inner, inner
    assert "apply_updates" in top
    assert max(len(g.children(n.id)) for n in g.nodes) <= 40  # no level is a wall
    # Every equation is still drawn, once: the folds only group them.
    closed = jax.make_jaxpr(step)(*args)
    leaves = [n for n in g.nodes if n.kind not in ("scope", "input", "output", "jit", "root")]
    assert sum(n.n_eqns for n in leaves) + sum(
        1 for n in g.nodes if n.kind == "jit" and n.parent is not None
    ) == _count_eqns(closed.jaxpr)


def test_a_train_step_s_results_are_grouped_like_its_arguments():
    step, args = _optax_step()
    ins = sowviz.inspect(step, *args, mode="primal")
    g = ins.graph
    outputs = {n.label: n for n in g.children(g.root) if n.label.startswith("output")}
    # (params, opt_state, loss): two groups nested by path, and the loss
    assert outputs["output[0]"].kind == "scope" and outputs["output[1]"].kind == "scope"
    assert outputs["output[2]"].kind == "output"
    paths = {ins.probe_path(p): p for p in ins.probes}
    for path, value in (
        ("output[0]/dense/w", ins.result[0]["dense"]["w"]),
        ("output[1]/[1][0]/mu/dense/w", ins.result[1][1][0].mu["dense"]["w"]),
    ):
        got = paths[path].summaries["primal"]["l2"]
        np.testing.assert_allclose(got, np.linalg.norm(np.asarray(value)), rtol=1e-5)
    # the parameters' update reaches each group by one edge from the stage that made it
    into = {e.source for e in g.edges if e.target == outputs["output[0]"].id}
    assert into and all(g.node(s).parent == g.root for s in into)


def test_a_library_traced_cond_branch_is_split_by_its_calls_too():
    # optax.MultiSteps updates inside a `lax.cond` whose branch optax traced: its
    # equations' tracebacks stop at the branch function, with no user frame.
    import optax

    _, (params, _, x) = _optax_step()
    tx = optax.MultiSteps(optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3)), 2)

    def train_step(params, opt_state, x):
        value, grads = jax.value_and_grad(lambda p: jnp.mean((x @ p["dense"]["w"]) ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    ins = sowviz.inspect(train_step, params, tx.init(params), x, mode="primal")
    g = ins.graph
    (branch,) = [n for n in g.nodes if n.label == "branch 0: _do_update"]
    below = {n.label for n in g.nodes if branch.id in _ancestors(g, n)}
    assert {"chain", "clip_by_global_norm", "scale_by_adam", "tree_update_moment"} <= below
    assert not any("<lambda>" in label for label in below), sorted(below)
    assert max(len(g.children(n.id)) for n in g.nodes) <= 40


def _ancestors(g, n):
    out = []
    while n.parent is not None:
        out.append(n.parent)
        n = g.node(n.parent)
    return out


def test_a_jitted_function_s_body_is_the_top_level():
    # `inspect(jax.jit(loss), ...)`, `eqx.filter_jit`, `nnx.jit`: the program is one
    # jit equation named like the root; drawn, it would only restate it (`loss` > `loss`).
    @jax.jit
    def loss(w, x):
        with jax.named_scope("layer"):
            h = jnp.tanh(x @ w)
        return jnp.sum(h**2)

    ins = sowviz.inspect(loss, W, X)
    g = ins.graph
    assert not [n for n in g.children(g.root) if n.kind == "jit"]
    layer = one(g, "layer")
    assert layer.parent == g.root
    (probe,) = [p for p in ins.probes if p.node == layer.id]
    h = np.tanh(np.asarray(X) @ np.asarray(W))
    np.testing.assert_allclose(probe.summaries["primal"]["l2"], np.linalg.norm(h), rtol=1e-5)
    np.testing.assert_allclose(probe.summaries["cotangent"]["l2"], np.linalg.norm(2 * h), rtol=1e-5)
    value, grad = jax.value_and_grad(loss)(W, X)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-5)
    (out,) = [p for p in ins.probes if g.node(p.node).kind == "output"]
    np.testing.assert_allclose(out.summaries["primal"]["mean"], value, rtol=1e-6)


def test_loops_and_branches_named_by_the_jax_function_that_made_them():
    # `lax.fori_loop` with static bounds is a scan, `lax.switch` a cond, `lax.map` a
    # scan: each is drawn by the function the user called.
    def f(x, i):
        def body(k, c):
            return jnp.sin(c) * 1.1

        x = lax.fori_loop(0, 3, body, x)
        x = lax.fori_loop(0, i, body, x)  # a traced bound: a while loop
        x = lax.switch(i, [jnp.sin, jnp.cos, jnp.tanh], x)
        x = lax.map(jnp.exp, x)
        x = lax.cond(i > 0, jnp.sin, jnp.cos, x)
        return lax.scan(lambda c, v: (c + v, None), 0.0, x)[0]

    _, g = graph_of(f, X[0], 1)
    assert [(n.kind, n.label) for n in g.nodes if n.kind in ("scan", "cond", "while")] == [
        ("scan", "fori_loop(body)"),
        ("while", "fori_loop(body)#2"),  # the same body again: numbered
        ("cond", "switch"),
        ("scan", "map"),
        ("cond", "cond"),
        ("scan", "scan"),
    ]


def test_jax_private_helpers_are_named_by_their_public_function():
    # `jnp.var` and `jnp.where` run jitted private helpers (`_var`, `_where`); a user's
    # own jitted `_helper` keeps its name.
    @jax.jit
    def _helper(x):
        return x * 2

    _, g = graph_of(lambda x: _helper(jnp.var(jnp.where(x > 0, x, 0.0))), X)
    jits = {n.label for n in g.nodes if n.kind == "jit" and n.parent is not None}
    assert {"var", "where", "_helper"} <= jits and not {"_var", "_where"} & jits, jits


def test_dot_product_attention_is_one_stage_around_its_einsums():
    """`jax.nn.dot_product_attention` computes its logits and its output with
    `jnp.einsum`, which pushes its subscripts as scopes: those stay inside the one
    `dot_product_attention` stage, whose probe is the attention's output."""
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(key, (2, 5, 4, 8)) for key in (kq, kk, kv))

    def f(q, k, v):
        return jnp.sum(jax.nn.dot_product_attention(q, k, v, is_causal=True) ** 2)

    ins = sowviz.inspect(f, q, k, v, mode="primal")
    g = ins.graph
    (dpa,) = [n for n in g.nodes if n.label == "dot_product_attention"]
    einsums = [n for n in g.nodes if "->" in n.label]
    assert [n.label for n in einsums] == ["BTNH,BSNH->BNTS", "BNTS,BSNH->BTNH"]
    assert all(n.parent == dpa.id for n in einsums)
    want = np.asarray(jax.nn.dot_product_attention(q, k, v, is_causal=True), np.float64)
    got = ins.probe("dot_product_attention").summaries["primal"]
    assert list(got["shape"]) == list(want.shape)
    np.testing.assert_allclose(got["l2"], np.linalg.norm(want), rtol=1e-5)


def test_a_library_file_is_named_from_its_package_and_floats_are_shown_first():
    from sowviz.graph.names import short_path

    venv = "/home/u/proj/.venv/lib/python3.12/site-packages/diffrax/_integrate.py"
    assert short_path(venv) == "diffrax/_integrate.py"
    assert short_path("/usr/lib/python3/dist-packages/numpy/core.py") == "numpy/core.py"

    def loop(x):  # a while loop's int counter comes first among its outputs
        return lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, x))[1]

    _, g = graph_of(lambda x: jnp.sum(loop(x)), X)
    w = one(g, "while", "while")
    assert w.shapes == ("float32[3,4]", "int32[]")


class _RematBlock(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(8, 8, rngs=rngs)

    def __call__(self, x):
        return jnp.tanh(self.lin(x))


class _RematNet(nnx.Module):
    def __init__(self, n, rngs):
        self.h = nnx.List([_RematBlock(rngs) for _ in range(n)])

    def __call__(self, x):
        x = x * 2.0 + 1.0
        for block in self.h:
            x = nnx.remat(lambda b, y: b(y))(block, x)  # one line, n checkpoints
        return jnp.tanh(x)


def test_remat_blocks_in_a_list_read_as_their_blocks():
    # Each block through `nnx.remat` on one line: no fold named by that line around
    # the twelve named checkpoints, and each shows its activation first (it hands
    # back the block's parameters too, which the program drops).
    net = _RematNet(14, nnx.Rngs(0))
    x = jnp.ones((2, 8))
    ins = sowviz.inspect(lambda m, x: jnp.sum(m(x) ** 2), net, x)
    g = ins.graph
    model = one(g, "_RematNet", "scope")
    inside = [n.label for n in g.children(model.id)]
    assert inside == ["mul", "add", "checkpoint(h[0–13]) (×14)", "tanh"], inside
    first = one(g, "checkpoint(h[0])", "remat")
    assert first.shapes[0] == "float32[2,8]", first.shapes
    want = jnp.tanh(net.h[0].lin(x * 2.0 + 1.0))
    got = ins.probe("checkpoint(h[0])").summaries["primal"]
    np.testing.assert_allclose(got["l2"], np.linalg.norm(want), rtol=1e-5)


def _bfgs_loss(c, x0):
    def f(x):
        return jnp.sum((x - c) ** 2) + 0.1 * jnp.sum(x**4)

    from jax.scipy.optimize import minimize

    res = minimize(f, x0, method="BFGS")
    return jnp.sum(res.x**2) + res.fun


def test_jaxs_own_optimiser_is_drawn_by_its_functions():
    # BFGS's loop body is a thousand equations of the user's one `minimize` line: by
    # JAX's function names inside (`line_search`, `_zoom`), not chunks `op ×8 (1–8)`
    c, x0 = jnp.array([1.0, -2.0, 0.5]), jnp.zeros(3)
    _, g = graph_of(_bfgs_loss, c, x0)
    labels = {n.label for n in g.nodes}
    assert {"minimize_bfgs", "line_search", "_zoom"} <= labels
    assert not [lbl for lbl in labels if lbl.startswith("op ")], sorted(labels)
    (search,) = by_label(g, "line_search")
    chain = []
    while search.parent is not None:
        search = g.node(search.parent)
        chain.append(search.label)
    assert "minimize_bfgs" in chain and "while(body_fun)" in chain


def _sqrt_by_custom_root(a):
    def solve(g, x0):
        return lax.fori_loop(0, 10, lambda i, x: x - g(x) / (2 * x), x0)

    def tangent_solve(g, y):
        return y / (2 * jnp.sqrt(a))

    return jnp.sum(lax.custom_root(lambda x: x**2 - a, jnp.ones_like(a), solve, tangent_solve))


def test_a_hi_primitive_is_named_by_the_function_bound():
    # JAX 0.12 binds `lax.custom_root` as `call_hi_primitive`: the box says custom_root
    a = jnp.array([2.0, 3.0])
    closed, g = graph_of(_sqrt_by_custom_root, a)
    labels = [n.label for n in g.nodes]
    assert "call_hi_primitive" not in labels
    if any(e.primitive.name == "call_hi_primitive" for e in closed.jaxpr.eqns):
        assert "custom_root" in labels
    _, grad = sowviz.inspect(_sqrt_by_custom_root, a).result
    np.testing.assert_allclose(grad, 0.5 / np.sqrt(np.asarray(a)), rtol=1e-5)


def test_ffts_are_named_by_their_kind():
    # `jnp.fft.rfft` and `irfft` are one primitive `fft` in a jit named `fft`
    x = jnp.linspace(0.0, 1.0, 8)
    _, g = graph_of(lambda x: jnp.sum(jnp.fft.irfft(jnp.fft.rfft(x) * 2.0)), x)
    labels = [n.label for n in g.nodes if n.kind in ("jit", "eqn")]
    assert "rfft" in labels and "irfft" in labels and "fft" not in labels, labels


def _shard(w, x):
    return jnp.tanh(x @ w)


def _pmapped_loss(w, x):
    return jnp.sum(jax.pmap(_shard, in_axes=(None, 0))(w, x) ** 2)


def test_a_pmap_is_named_by_the_function_it_maps():
    # `jax.pmap` jits a `shard_map` in a function of its own, `_fun`: the box reads
    # `pmap(_shard)`, not `fun`, and the mapped function's values and gradients are right
    w, x = jnp.full((3, 3), 0.1), jnp.ones((1, 2, 3))
    _, g = graph_of(_pmapped_loss, w, x)
    labels = [n.label for n in g.nodes]
    assert "pmap(_shard)" in labels and "fun" not in labels, labels
    (value, grad), (want, want_grad) = (
        sowviz.inspect(_pmapped_loss, w, x).result,
        jax.value_and_grad(_pmapped_loss)(w, x),
    )
    np.testing.assert_allclose(value, want, rtol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5)


def _block(p, h):
    return h + jnp.tanh(h @ p)


@pytest.mark.parametrize(
    "wrap", [jax.checkpoint, jax.jit, jax.named_call], ids=["checkpoint", "jit", "named_call"]
)
def test_a_wrapped_function_called_again_is_numbered_and_each_call_can_be_named(wrap):
    # Three calls of one `jax.checkpoint(block)`: `…#2`, `…#3` as named scopes are, so
    # `probe` finds each (three alike labels could not be told apart, even by path).
    # `jax.named_call(block)` pushes the scope `_block` around each call, and calls in a
    # row share it: no `_block` box around `_block (×3)`.
    blk = wrap(_block)

    def loss(ps, x):
        h = x
        for p in ps:
            h = blk(p, h)
        return jnp.mean(h**2)

    ps = [jax.random.normal(jax.random.PRNGKey(i), (4, 4)) * 0.3 for i in range(3)]
    x = jnp.ones((2, 4))
    ins = sowviz.inspect(loss, ps, x)
    first = "checkpoint(_block)" if wrap is jax.checkpoint else "_block"
    top = [n.label for n in ins.graph.children(ins.graph.root)]
    assert f"{first} (×3)" in top and first not in top, top
    h = x
    for k, p in enumerate(ps):
        h = _block(p, h)
        name = first if k == 0 else f"{first}#{k + 1}"
        got = ins.probe(name).summaries["primal"]
        np.testing.assert_allclose(got["mean"], h.mean(), rtol=1e-5, err_msg=name)


def _decay(y, t, k):
    return -k * y


def _ode_loss(k, y0):
    from jax.experimental.ode import odeint

    return jnp.mean(odeint(_decay, y0, jnp.linspace(0.0, 1.0, 4), k) ** 2)


def test_odeint_is_drawn_by_its_solver_s_functions():
    # `odeint`'s solver is JAX's own code calling the user's `_decay` back: by its
    # functions (`initial_step_size`, `runge_kutta_step`), not chunks `op ×3 (1–3)`,
    # and its body not cut at every call of `_decay` into `_odeint`, `_odeint#2`, …
    k, y0 = jnp.array(0.5), jnp.ones(3)
    _, g = graph_of(_ode_loss, k, y0)
    labels = {n.label for n in g.nodes}
    assert {"initial_step_size", "runge_kutta_step", "optimal_step_size"} <= labels, labels
    assert not [lbl for lbl in labels if lbl.startswith("op ")], sorted(labels)
    (rule,) = [n for n in g.nodes if n.kind == "custom"]
    assert rule.label not in [c.label.partition("#")[0] for c in g.children(rule.id)]
    (_, grad), want = sowviz.inspect(_ode_loss, k, y0).result, jax.grad(_ode_loss)(k, y0)
    np.testing.assert_allclose(grad, want, rtol=1e-5)


def test_several_differentiated_arguments_are_one_parameters_group_by_name():
    # `argnums=(0, 1)` (tesseract-jax's demo): `a`'s one leaf was a loose input `a.v`, and
    # two arguments of several leaves were groups "parameters" and "parameters#2" of
    # leaves `s`, `v` with no argument's name.
    a = {"v": X[0], "s": X[1, 0]}
    b = {"v": X[2], "s": X[3, 0]}
    c = {"v": X[4]}

    def loss(a, x, b, c):
        return jnp.sum(jnp.tanh(a["v"] * a["s"] * b["s"] + b["v"] + c["v"] + x) ** 2)

    args = (a, X[0], b, c)
    leaves, tree = jax.tree_util.tree_flatten(args)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(args)[0]]
    in_args = [int(p[1 : p.index("]")]) for p in paths]
    names = ["axbc"[k] + p[p.index("]") + 1 :] for k, p in zip(in_args, paths, strict=True)]
    closed = jax.make_jaxpr(lambda *f: loss(*jax.tree_util.tree_unflatten(tree, f)))(*leaves)
    g = build_graph(
        closed, in_names=names, out_names=["loss"], in_args=in_args, parameters={0, 2, 3}
    )
    (group,) = [n for n in g.nodes if n.label.startswith("parameters")]
    assert group.parent == g.root
    leaves = [n for n in g.nodes if n.kind == "input"]
    assert [_path_of(g, n) for n in leaves] == [
        "parameters.a.s",
        "parameters.a.v",
        "parameters.b.s",
        "parameters.b.v",
        "parameters.c.v",
        "x",
    ]


def _weighted_sum(x):
    return jnp.sum(x * jnp.arange(3.0))  # its backward pass keeps `arange(3)` alone


def test_one_value_kept_for_a_backward_pass_is_named_so():
    # `jax.grad` drops the function's scalar output: the one value leaving its stage is
    # what the backward pass reads, named as two such values are, never a bare output
    x = jnp.array([1.0, 2.0, 3.0])
    saved = np.arange(3.0)

    def step(x):
        return x - 0.1 * jax.grad(_weighted_sum)(x)

    ins = sowviz.inspect(step, x, mode="primal")
    np.testing.assert_allclose(ins.result, step(x))
    (node,) = [n for n in ins.graph.nodes if n.label == "_weighted_sum"]
    probes = {p.leaf: p.summaries["primal"] for p in ins.probes if p.node == node.id}
    assert list(probes) == ["['saved for backward']"], list(probes)
    kept = probes["['saved for backward']"]
    assert kept["shape"] == [3]
    np.testing.assert_allclose([kept["mean"], kept["l2"]], [saved.mean(), np.linalg.norm(saved)])

    def value_and_step(x):  # its output used too: the output first, then the kept value
        value, g = jax.value_and_grad(_weighted_sum)(x)
        return value, x - 0.1 * g

    ins = sowviz.inspect(value_and_step, x, mode="primal")
    (node,) = [n for n in ins.graph.nodes if n.label == "_weighted_sum"]
    probes = {p.leaf: p.summaries["primal"] for p in ins.probes if p.node == node.id}
    assert list(probes) == ["['output']", "['saved for backward']"], list(probes)
    assert probes["['output']"]["mean"] == np.float32(_weighted_sum(x))
    np.testing.assert_allclose(probes["['saved for backward']"]["l2"], np.linalg.norm(saved))


def _mlp(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def _mse(params, x, y):
    return jnp.mean((_mlp(params, x) - y) ** 2)


def test_a_data_parallel_steps_averaged_loss_is_a_stage_with_its_value():
    # `l = pmean(l)` is two equations (`psum`, `div`) beside `g = pmean(g)`'s fold: at a
    # level the folds made small they are a box too, carrying the loss averaged over the
    # devices, never two loose boxes with no values; each named by what its line assigns
    # (round 14: they read `pmean`, `pmean#2`)
    mesh = jax.make_mesh((4,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    P = jax.sharding.PartitionSpec

    def local(params, x, y):
        value, g = jax.value_and_grad(_mse)(params, x, y)
        g = lax.pmean(g, "d")
        value = lax.pmean(value, "d")
        return value, g

    step = jax.shard_map(local, mesh=mesh, in_specs=(P(), P("d"), P("d")), out_specs=(P(), P()))
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    params = [
        (jax.random.normal(keys[0], (3, 8)) / 2, jnp.zeros(8)),
        (jax.random.normal(keys[1], (8, 1)) / 3, jnp.zeros(1)),
    ]
    x = jax.device_put(jax.random.normal(keys[2], (16, 3)), jax.NamedSharding(mesh, P("d")))
    y = jax.device_put(jnp.ones((16, 1)), jax.NamedSharding(mesh, P("d")))
    ins = sowviz.inspect(step, params, x, y, mode="primal")
    value, grads = jax.jit(step)(params, x, y)
    # (the average of the devices' losses is the whole batch's; their summed gradients
    # are not `jax.grad`'s, as `shard_map` transposes its replicated parameters)
    np.testing.assert_allclose(value, _mse(params, x, y), rtol=1e-6)
    sm = next(n for n in ins.graph.nodes if n.kind == "shard_map")
    children = ins.graph.children(sm.id)
    assert not [n.label for n in children if n.kind == "eqn"], [n.label for n in children]
    pmeans = [n for n in children if n.label in ("g", "value")]
    assert [n.label for n in pmeans] == ["g", "value"], [n.label for n in children]
    loss_stage = pmeans[1]
    (probe,) = [p for p in ins.probes if p.node == loss_stage.id]
    primal = probe.summaries["primal"]
    assert primal["shape"] == []  # one copy: every device holds the same average
    np.testing.assert_allclose([primal["min"], primal["max"]], [value, value], rtol=1e-5)
    grads_stage = [p for p in ins.probes if p.node == pmeans[0].id]
    leaves = jax.tree.leaves(grads)
    # the averaged gradient, alike on every device: its norm, not twice it on 4 devices
    assert sorted(p.summaries["primal"]["l2"] for p in grads_stage) == pytest.approx(
        sorted(float(np.linalg.norm(g)) for g in leaves), rel=1e-4
    )


def _net(p, x, t):
    return jnp.tanh(jnp.tanh(x * p["a"] + t * p["b"]) @ p["c"])


def _residual(p, x, t):
    u = _net(p, x, t)
    u_t = jax.jacfwd(_net, argnums=2)(p, x, t)
    return u_t + u


def _pinn_loss(p, xs, ts):
    return jnp.mean(jax.vmap(_residual, (None, 0, 0))(p, xs, ts) ** 2)


def _pinn_inputs():
    k = jax.random.split(jax.random.key(0), 3)
    p = {n: jax.random.normal(key, (8,)) / 2 for n, key in zip("abc", k, strict=True)}
    return p, jnp.linspace(-1, 1, 16), jnp.linspace(0, 1, 16)


def test_a_function_under_jacfwd_says_it_holds_the_tangent_and_the_basis_is_no_box():
    # `u_t = jax.jacfwd(net)(...)`: the second `net` stage held du/dt under the label
    # `net#2`, and a box `jacfwd` held the one-hot basis (1.0) jacfwd builds
    p, xs, ts = _pinn_inputs()
    ins = sowviz.inspect(_pinn_loss, p, xs, ts)
    (res,) = (n for n in ins.graph.nodes if n.label == "_residual")
    labels = [n.label for n in ins.graph.children(res.id)]
    assert labels[:2] == ["_net", "u_t"], labels  # (`u_t`'s line: a box holding its `_net`)
    (box,) = (n for n in ins.graph.children(res.id) if n.label == "u_t")
    assert next(n.label for n in ins.graph.children(box.id)) == "_net (tangent)"
    assert "jacfwd" not in [n.label for n in ins.graph.nodes], labels
    u = jax.vmap(_net, (None, 0, 0))(p, xs, ts)
    u_t = jax.vmap(jax.jacfwd(_net, argnums=2), (None, 0, 0))(p, xs, ts)
    got_u = ins.probe("_residual/_net").summaries["primal"]
    got_t = ins.probe("_residual/u_t/_net (tangent)").summaries["primal"]
    np.testing.assert_allclose(got_u["mean"], float(u.mean()), rtol=1e-5)
    np.testing.assert_allclose(got_t["mean"], float(u_t.mean()), rtol=1e-5)
    np.testing.assert_allclose(got_t["l2"], float(jnp.linalg.norm(u_t)), rtol=1e-5)
    np.testing.assert_allclose(ins.result[1]["a"], jax.grad(_pinn_loss)(p, xs, ts)["a"], rtol=1e-4)


def _u_net(p, x):
    return jnp.tanh(x @ p["w"] + p["b"]) @ p["v"]


def _lap_loss(p, xc, fc):
    u = lambda x: _u_net(p, x)  # noqa: E731
    lap = jax.vmap(lambda x: jnp.trace(jax.hessian(u)(x)))(xc)
    return jnp.mean((-lap - fc) ** 2)


def test_a_hessian_line_s_box_holds_its_value_not_the_seed():
    # `lap = jax.vmap(lambda x: jnp.trace(jax.hessian(u)(x)))(xc)`: the box `lap` held
    # jax.hessian's seed (f32[1], 1.0, "saved for backward"); the Laplacian was `lap#2`
    k = jax.random.split(jax.random.key(0), 2)
    p = {"w": jax.random.normal(k[0], (2, 16)), "b": jnp.zeros(16)}
    p["v"] = jax.random.normal(k[1], (16,)) / 4
    xc, fc = jax.random.uniform(jax.random.key(1), (32, 2)), jnp.ones(32)
    ins = sowviz.inspect(_lap_loss, p, xc, fc)
    top = [n.label for n in ins.graph.children(ins.graph.root)]
    assert "lap" in top and "lap#2" not in top and "jacfwd" not in top, top
    want = jax.vmap(lambda x: jnp.trace(jax.hessian(lambda y: _u_net(p, y))(x)))(xc)
    got = ins.probe("lap")
    assert got.summaries["primal"]["shape"] == [32] and got.leaf == ""
    np.testing.assert_allclose(got.summaries["primal"]["mean"], float(want.mean()), rtol=1e-5)
    # no box holds a constant 1.0 seed
    seeds = [q for q in ins.probes if q.summaries["primal"]["shape"] in ([1], [1, 1])]
    assert not seeds, [ins.probe_path(q) for q in seeds]


def _spectral(w, x):
    xh = jnp.fft.rfft(x)
    return jnp.fft.irfft(jnp.pad(xh[:8] * w, (0, xh.shape[0] - 8)), n=x.shape[0])


def test_a_vmapped_rfft_is_labelled_rfft():
    # `jax.vmap` re-jits `fft` around JAX's `fft` jit: the outer stages read `fft`, `fft#2`
    w = jnp.linspace(0.5, 1.5, 8).astype(jnp.complex64)
    x = jnp.sin(jnp.linspace(0, 6, 64))[None] * jnp.arange(1.0, 5.0)[:, None]
    loss = lambda w, x: jnp.sum(jax.vmap(_spectral, (None, 0))(w, x) ** 2)  # noqa: E731
    ins = sowviz.inspect(loss, w, x, mode="primal")
    (fn,) = (n for n in ins.graph.nodes if n.label == "_spectral")
    # (round 14: `irfft(..., n=...)` is one box `irfft` holding JAX's `pad` jit and its own)
    labels = [n.label for n in ins.graph.children(fn.id) if n.kind in ("jit", "scope")]
    # (round 17: `xh = jnp.fft.rfft(x)` is a box named by what it assigns at any level)
    assert labels[0] == "xh" and labels[-1] == "irfft", labels
    (xh,) = (n for n in ins.graph.children(fn.id) if n.label == "xh")
    assert [n.label for n in ins.graph.children(xh.id)] == ["rfft"]
    assert not [n.label for n in ins.graph.nodes if n.label.startswith("fft")]
    want = jax.vmap(_spectral, (None, 0))(w, x)
    got = ins.probe("_spectral/irfft").summaries["primal"]
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(want)), rtol=1e-5)


def test_a_lone_parameter_of_a_group_is_named_by_its_group_and_its_name():
    # `{"l1": {"kernel"}, "l2": {"bias", "kernel"}}`: `l1`'s lone leaf was one input
    # `l1.kernel`, its path `parameters/l1.kernel` beside `parameters/l2/kernel`
    params = {"l1": {"kernel": jnp.full((4, 3), 0.1)}, "l2": {"b": jnp.zeros(1)}}
    params["l2"]["kernel"] = jnp.arange(3.0)[:, None]
    loss = lambda p, x: jnp.mean((x @ p["l1"]["kernel"] @ p["l2"]["kernel"] + p["l2"]["b"]) ** 2)  # noqa: E731
    x = jnp.ones((2, 4))
    ins = sowviz.inspect(loss, params, x)
    q = ins.probe("l1/kernel")
    assert ins.probe_path(q) == "parameters/l1/kernel"
    assert ins.probe_path(ins.probe("l2/kernel")) == "parameters/l2/kernel"
    assert ins.probe("l1.kernel") is q  # (as Python reaches it)
    grad = jax.grad(loss)(params, x)["l1"]["kernel"]
    np.testing.assert_allclose(q.summaries["primal"]["mean"], 0.1, rtol=1e-6)
    np.testing.assert_allclose(
        q.summaries["cotangent"]["l2"], float(jnp.linalg.norm(grad)), rtol=1e-5
    )


def _env_step(s, a):
    s2 = s + 0.1 * a
    reward = -jnp.sum(s2**2)
    obs = s2 * 2.0
    new_state = {"s": s2 + 1.0, "t": s2 * 3.0}  # two leaves of one returned value
    return obs, new_state, reward


def _env_loss(w, s0):
    obs, state, reward = _env_step(s0, jnp.tanh(s0 @ w))
    return reward + jnp.sum(obs) + jnp.sum(state["s"]) + jnp.sum(state["t"])


def test_a_function_returning_a_dict_numbers_its_outputs_as_it_returns_them():
    # `return obs, new_state, reward` with a dict of two arrays in the middle: both were
    # placed at [1] by the source, and a tie dropped the source's order for program
    # order: [0] was `reward`, [1] `obs`.
    w, s0 = jnp.eye(2) * 0.5, jnp.array([0.3, 0.4])
    ins = sowviz.inspect(_env_loss, w, s0, mode="primal")
    s2 = np.asarray(s0) + 0.1 * np.tanh(np.asarray(s0) @ np.asarray(w))
    want = {"[0]": 2 * s2, "[1]": s2 + 1.0, "[2]": 3 * s2, "[3]": -np.sum(s2**2)}
    _assert_output_means(ins, "_env_step", want)


def _assert_output_means(ins, stage: str, want: dict) -> None:
    """The outputs of the stage `stage` are `want`'s leaves (`[0]`, ...): shapes and means."""
    got = {p.leaf: p for p in ins.probes if ins.probe_path(p).endswith(stage)}
    assert sorted(got) == sorted(want)
    for leaf, value in want.items():
        summary = got[leaf].summaries["primal"]
        assert summary["shape"] == list(np.shape(value)), leaf
        np.testing.assert_allclose(summary["mean"], np.mean(value), rtol=1e-5, err_msg=leaf)


def _env_step_packing(s, a):
    s2 = s + 0.1 * a
    reward = -jnp.sum(s2**2)
    obs = s2 * 2.0
    new_state = {"s": s2}  # no equation: `s2` is the returned state's leaf
    return obs, new_state, reward


def test_a_value_a_function_packs_into_its_result_takes_that_place():
    # `return obs, new_state, reward` with `new_state = {"s": s2}`: [0] was the state,
    # [1] the reward and [2] obs, in program order
    def loss(w, s0):
        obs, state, reward = _env_step_packing(s0, jnp.tanh(s0 @ w))
        return reward + jnp.sum(obs) + jnp.sum(state["s"] ** 2)

    w, s0 = jnp.eye(2) * 0.5, jnp.array([0.3, 0.4])
    ins = sowviz.inspect(loss, w, s0, mode="primal")
    s2 = np.asarray(s0) + 0.1 * np.tanh(np.asarray(s0) @ np.asarray(w))
    want = {"[0]": 2 * s2, "[1]": s2, "[2]": -np.sum(s2**2)}
    _assert_output_means(ins, "_env_step_packing", want)


def _rollout(runner_state, w):
    def step(carry, _):
        env_s, obs = carry
        env_s = env_s + 0.1 * jnp.tanh(obs @ w)
        return (env_s, env_s * 2.0), jnp.sum(env_s**2)

    return jax.lax.scan(step, runner_state, None, length=4)


def test_mode_primal_keeps_every_arguments_name():
    # nothing is differentiated in mode primal: `runner_state` was drawn as `parameters`
    runner_state = (jnp.zeros((3, 2)), jnp.ones((3, 2)))
    w = jnp.eye(2) * 0.5

    def loss(runner_state, w):
        return jnp.sum(_rollout(runner_state, w)[1])

    for fn, mode, first in ((loss, "grad", "parameters"), (_rollout, "primal", "runner_state")):
        ins = sowviz.inspect(fn, runner_state, w, mode=mode)
        top = [n.label for n in ins.graph.children(ins.graph.root) if n.kind != "output"]
        assert top[:2] == [first, "w"], (mode, top)
        obs = ins.probe(f"{first}/[1]").summaries["primal"]
        np.testing.assert_allclose(obs["mean"], 1.0)  # the argument's own values
    # one function in both modes: each its own picture, grad's paths as they were
    both = sowviz.inspect(loss, runner_state, w, mode="primal")
    assert both.probe("runner_state/[0]").summaries["primal"]["mean"] == 0.0
    grad = sowviz.inspect(loss, runner_state, w)
    np.testing.assert_allclose(
        grad.probe("parameters/[1]").summaries["cotangent"]["l2"],
        np.linalg.norm(jax.grad(loss)(runner_state, w)[1]),
        rtol=1e-5,
    )
