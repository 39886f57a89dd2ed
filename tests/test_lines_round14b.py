"""A line assigning a library's jitted call of its own work is one box named by it; a
return line of several values is named by them; a Python loop's last pass, whose new
cache nobody reads, stacks with the others."""

import jax
import jax.numpy as jnp
import numpy as np

import sowviz


def _children(graph, node_id):
    return [n.label for n in sorted(graph.nodes, key=lambda n: n.order) if n.parent == node_id]


def _probe_at(ins, node_id, leaf=""):
    (probe,) = (p for p in ins.probes if p.node == node_id and p.leaf == leaf)
    return probe


def _only(graph, label):
    (node,) = (n for n in graph.nodes if n.label == label)
    return node


# Beam search's last lines: `order = jnp.argsort(-scores)` read `neg`, `argsort`;
# `causal = jnp.tril(jnp.ones(..., bool))` `broadcast_in_dim`, `tril`; the return
# line `rerank:LINE`


def _rerank(scores, toks):
    causal = jnp.tril(jnp.ones((3, 3), bool))
    s = jnp.where(causal, scores[None, :], 0.0).sum(0)
    order = jnp.argsort(-s)
    return toks[order], s[order]


def test_a_line_of_its_own_work_and_a_librarys_jitted_call_is_one_box():
    scores = jnp.array([0.3, -1.0, 2.0])
    toks = jnp.arange(12.0).reshape(3, 4)
    ins = sowviz.inspect(_rerank, scores, toks, mode="primal")
    want = jax.jit(_rerank)(scores, toks)
    for got, ref in zip(ins.result, want, strict=True):
        np.testing.assert_array_equal(got, ref)
    g = ins.graph
    top = _children(g, g.root)
    assert "order" in top and "causal" in top, top
    assert not {"neg", "argsort", "tril", "broadcast_in_dim"} & set(top), top
    # each box holds the line's work: `neg` then JAX's `argsort`; `tril` of the ones
    assert [n for n in _children(g, _only(g, "order").id) if n in ("neg", "argsort")] == [
        "neg",
        "argsort",
    ]
    # (the ones, a constant of literals, are `tril`'s work since round 21: no box)
    assert _children(g, _only(g, "causal").id) == ["tril"]
    # (integer values have no probe; the results are plain JAX's, checked above)
    s = np.where(np.tril(np.ones((3, 3), bool)), np.asarray(scores)[None, :], 0.0).sum(0)
    np.testing.assert_array_equal(ins.result[0], np.asarray(toks)[np.argsort(-s)])


def test_a_return_line_of_several_values_is_named_by_them():
    scores = jnp.array([0.3, -1.0, 2.0])
    toks = jnp.arange(12.0).reshape(3, 4)
    ins = sowviz.inspect(_rerank, scores, toks, mode="primal")
    g = ins.graph
    top = _children(g, g.root)
    assert "toks[order], s[order]" in top, top
    assert not [t for t in top if t.startswith("_rerank:")], top


def _delta(w, x):
    delta = jax.nn.softplus(x @ w)
    return jnp.sum(delta**2)


def test_an_assignment_ending_in_a_jitted_activation_is_its_box_with_its_gradient():
    # `jax.nn.softplus` is a `jit` of JAX's, not a custom rule as `relu` is: the line
    # read `dot_general`, `softplus`
    w = jnp.linspace(-1, 1, 12).reshape(4, 3)
    x = jnp.linspace(0, 2, 8).reshape(2, 4)
    ins = sowviz.inspect(_delta, w, x)
    g = ins.graph
    assert "delta" in _children(g, g.root), _children(g, g.root)
    got = _probe_at(ins, _only(g, "delta").id).summaries
    delta = jax.nn.softplus(x @ w)
    np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(delta), rtol=1e-5)
    # d/d(delta) of sum(delta ** 2) is 2 * delta
    np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(2 * delta), rtol=1e-5)


# A Python-loop KV-cache decoder: its last pass's new cache is read by no one


def _step(w, tok_emb, cache, i):
    cache = cache.at[i].set(tok_emb)
    h = jnp.tanh(cache.sum(0) @ w)
    return h, cache


def _pick(h):
    return jax.nn.one_hot(jnp.argmax(h, -1), h.shape[-1]) + 0.5 * h


def _generate(w, x0):
    cache = jnp.zeros((6, 4))
    x, outs = x0, []
    for i in range(6):
        h, cache = _step(w, x, cache, i)
        x = _pick(h)
        outs.append(x)
    return jnp.stack(outs)


def _reference(w, x0):
    cache = jnp.zeros((6, 4))
    x, xs = x0, []
    for i in range(6):
        h, cache = _step(w, x, cache, i)
        x = _pick(h)
        xs.append(x)
    return xs


def test_a_python_loops_last_pass_with_an_unread_cache_stacks_with_the_others():
    w = jax.random.normal(jax.random.PRNGKey(0), (4, 4))
    x0 = jnp.ones(4)
    ins = sowviz.inspect(_generate, w, x0, mode="primal")
    np.testing.assert_allclose(ins.result, jax.jit(_generate)(w, x0), rtol=1e-6)
    g = ins.graph
    top = _children(g, g.root)
    assert "_step · _pick (×6)" in top, top
    assert not [t for t in top if t.startswith("_step · _pick#")], top
    stack = _only(g, "_step · _pick (×6)")
    passes = _children(g, stack.id)
    assert passes == ["_step · _pick", *(f"_step · _pick#{k}" for k in range(2, 7))], passes
    # the stack shows the value leaving it, the last pass's token; each pass its own
    xs = _reference(w, x0)
    got = _probe_at(ins, stack.id).summaries["primal"]
    np.testing.assert_allclose(got["l2"], np.linalg.norm(xs[-1]), rtol=1e-5)
    third = _probe_at(ins, _only(g, "_step · _pick#3").id, "[1]").summaries["primal"]
    np.testing.assert_allclose(third["l2"], np.linalg.norm(xs[2]), rtol=1e-5)
