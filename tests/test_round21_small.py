"""Round 21: loose primitive boxes in programs written as users write them.

* A `jax.linearize` whose map the function applies lines later (`y, f_jvp =
  jax.linearize(lambda q: mlp(q, x), p)`, then `t = f_jvp(v)`): JAX records the map's
  equations with the tracebacks of the `linearize` line, inside `mlp`'s frames, so
  they read as a second call, `mlp#2`, that the program never made. It is `t: mlp`
  (named by what the applying line assigns; `mlp (tangent)` when it assigns no name),
  holding `mlp`'s own stages, and its value is `jax.jvp`'s tangent.
* A constant made of literals alone (`jnp.zeros(shape)`, `jnp.full(shape, 2.0)`,
  `jnp.ones(n)`, the `0.0` of `jnp.maximum(h, 0.0)`) loose in the scope of the box
  reading it is work of that box, as a literal is: it was a loose `broadcast_in_dim` / `convert_element_type` box with no data. Its
  equations count in the reader's, so every equation is still drawn once; with
  `capture="all"` every equation is its own box, constants included. A line you named
  (`bias = jnp.zeros(...)`, a box of its own), a constant another stage reads (a
  value saved for a backward pass) and a loop's constant carry (`fori_loop(0, 3,
  body, jnp.zeros(4))`: its edge is the loop's port, named `h`) stay as they were.

Each test checks the values the affected stages capture against plain `jax.jvp` /
`jax.grad` / NumPy. Gaps: the applied map's stage is sourced at the `linearize` line
(where JAX records it), not at the line applying the map; a `jax.jvp` seed written in
the call (`jax.jvp(f, (w,), (jnp.ones_like(w),))`) is still a box named by its text
holding one `broadcast_in_dim` (a box of its own, so not folded), and a cast of a
named constant (`scale = jnp.full(shape, 2.0)` read as `scale * h`) stays a loose
`convert_element_type` box.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import sowviz
from sowviz.graph.names import _count_eqns


def _children(ins, node_id):
    return [n for n in ins.graph.nodes if n.parent == node_id]


def _one(ins, label):
    found = [n for n in ins.graph.nodes if n.label == label]
    assert len(found) == 1, (label, sorted({n.label for n in ins.graph.nodes}))
    return found[0]


def _probe(ins, node):
    found = [p for p in ins.probes if p.node == node.id]
    assert found, node.label
    return found[0]


def _grads_close(ins, fn, *args):
    value, grads = ins.result
    ref_value, ref_grads = jax.value_and_grad(fn)(*args)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-6)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-6)


def mlp(p, x):
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return h @ p["w2"]


def _mlp_args():
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    p = {
        "w1": jax.random.normal(k[0], (3, 8)),
        "b1": jnp.zeros(8),
        "w2": jax.random.normal(k[1], (8, 2)),
    }
    v = jax.tree.map(lambda a: jnp.full_like(a, 0.5), p)
    return p, jax.random.normal(k[2], (5, 3)), v


def lin_loss(p, x, v):
    y, f_jvp = jax.linearize(lambda q: mlp(q, x), p)
    t = f_jvp(v)
    return jnp.mean(y**2) + 0.1 * jnp.mean(t**2)


def test_an_applied_linearize_map_is_named_by_what_it_assigns():
    p, x, v = _mlp_args()
    ins = sowviz.inspect(lin_loss, p, x, v, mode="grad")
    labels = [n.label for n in ins.graph.nodes]
    assert "mlp#2" not in labels, labels
    top = [n.label for n in _children(ins, ins.graph.root)]
    at = top.index("mlp")
    assert top[at : at + 2] == ["mlp", "t: mlp"], top
    # the map reads as mlp's stages: its first line's `h`, then the output line's
    tangent = _one(ins, "t: mlp")
    assert "h" in [n.label for n in _children(ins, tangent.id)]
    # its value is the tangent, and the primal call's last output is y
    y, t = jax.jvp(lambda q: mlp(q, x), (p,), (v,))
    got = _probe(ins, tangent).summaries["primal"]
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(t)), rtol=1e-5)
    assert abs(got["l2"] - float(jnp.linalg.norm(y))) > 0.1  # (not y's)
    # its cotangent: d loss / d t = 0.2 t / t.size
    ct = _probe(ins, tangent).summaries["cotangent"]
    np.testing.assert_allclose(ct["l2"], float(jnp.linalg.norm(0.2 * t / t.size)), rtol=1e-5)
    _grads_close(ins, lin_loss, p, x, v)


def lin_loss_unassigned(p, x, v):
    y, f_jvp = jax.linearize(lambda q: mlp(q, x), p)
    return jnp.mean(y**2) + 0.1 * jnp.mean(f_jvp(v) ** 2)


def test_a_map_applied_in_an_expression_is_the_function_s_tangent():
    p, x, v = _mlp_args()
    ins = sowviz.inspect(lin_loss_unassigned, p, x, v, mode="grad")
    tangent = _one(ins, "mlp (tangent)")
    _, t = jax.jvp(lambda q: mlp(q, x), (p,), (v,))
    got = _probe(ins, tangent).summaries["primal"]["l2"]
    np.testing.assert_allclose(got, float(jnp.linalg.norm(t)), rtol=1e-5)
    _grads_close(ins, lin_loss_unassigned, p, x, v)


def test_a_loop_linearizing_each_step_names_each_map():
    p, x, v = _mlp_args()

    def loss(p, x, v):
        total = 0.0
        for k in range(2):
            y, f_jvp = jax.linearize(lambda q, k=k: mlp(q, x * (k + 1)), p)
            t = f_jvp(v)
            total = total + jnp.mean(t**2) + jnp.mean(y)
        return total

    ins = sowviz.inspect(loss, p, x, v, mode="grad")
    calls = [
        n.label.split("#")[0] for n in ins.graph.nodes if n.label.split("#")[0] in ("mlp", "t: mlp")
    ]
    assert calls == ["mlp", "t: mlp", "mlp", "t: mlp"], calls
    _grads_close(ins, loss, p, x, v)


def layer(w, x):
    bias = jnp.zeros((x.shape[0], w.shape[1]))
    scale = jnp.full((x.shape[0], w.shape[1]), 2.0)
    return jnp.maximum(scale * (x @ w) + bias + jnp.ones(w.shape[1]), 0.0)


def const_loss(w, x):
    h = layer(w, x)
    return jnp.mean((h - 1.0) ** 2)


def _eqns_drawn(ins):
    g = ins.graph
    leaves = [n for n in g.nodes if n.kind not in ("scope", "input", "output", "jit", "root")]
    jits = sum(1 for n in g.nodes if n.kind == "jit" and n.parent is not None)
    return sum(n.n_eqns for n in leaves) + jits


def _count(jaxpr):
    return _count_eqns(jaxpr)


def test_constants_fold_into_the_box_reading_them():
    w = jax.random.normal(jax.random.PRNGKey(0), (3, 4))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 3))
    ins = sowviz.inspect(const_loss, w, x, mode="grad")
    box = _one(ins, "layer")
    inside = _children(ins, box.id)
    # the loose constant (`jnp.ones(n)`, broadcast twice) is no box; the lines you
    # named (`bias = jnp.zeros(...)`) stay, and so does the cast of `scale` (it reads a
    # box drawn, whose value it hands on)
    labels = [n.label for n in inside]
    want = ["bias", "scale", "dot_general", "convert_element_type", "mul", "add", "add", "max"]
    assert labels == want, labels
    assert "broadcast_in_dim" not in {n.primitive for n in inside}
    assert [n.n_eqns for n in inside if n.label == "add"] == [1, 3]  # (`+ jnp.ones(n)`)
    # the constants' equations count in their readers': every equation drawn once
    assert _eqns_drawn(ins) == _count(jax.make_jaxpr(const_loss)(w, x).jaxpr)
    # the values read through the folded constants: layer's output and its gradient
    h = np.maximum(2.0 * (np.asarray(x) @ np.asarray(w)) + 1.0, 0.0)
    got = _probe(ins, box).summaries
    np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(h), rtol=1e-5)
    dh = jax.grad(lambda h: jnp.mean((h - 1.0) ** 2))(jnp.asarray(h))
    np.testing.assert_allclose(got["cotangent"]["l2"], float(jnp.linalg.norm(dh)), rtol=1e-5)
    mx = _probe(ins, inside[-1]).summaries["primal"]
    np.testing.assert_allclose(mx["l2"], np.linalg.norm(h), rtol=1e-5)
    _grads_close(ins, const_loss, w, x)


def test_every_equation_drawn_keeps_the_constants():
    w = jax.random.normal(jax.random.PRNGKey(0), (3, 4))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 3))
    ins = sowviz.inspect(const_loss, w, x, mode="grad", capture="all")
    assert "broadcast_in_dim" in {n.primitive for n in ins.graph.nodes}


def fori_loss(w, x):
    def body(i, h):
        return jnp.tanh(h @ w + i.astype(jnp.float32) * 0.1) + x[i]

    h = jax.lax.fori_loop(0, 3, body, jnp.zeros(4))
    return jnp.sum(h**2)


def test_a_loop_s_constant_carry_stays_the_loop_s_named_port():
    """A constant a loop carries is not folded into the loop: its edge is the loop's
    port, named by the user's carry (`h`; NNX scans' `i`, `key`: test_round15_carries),
    which a fold would take away."""
    w = jax.random.normal(jax.random.PRNGKey(0), (4, 4))
    x = jax.random.normal(jax.random.PRNGKey(1), (3, 4))
    ins = sowviz.inspect(fori_loss, w, x, mode="grad")
    top = [n for n in _children(ins, ins.graph.root) if n.kind not in ("input", "output")]
    (loop,) = [n for n in top if n.label == "fori_loop(body)"]
    (zeros,) = [n for n in top if n.primitive == "broadcast_in_dim"]
    port_names = next(n for n in ins.to_dict()["nodes"] if n["id"] == loop.id)["port_names"]
    assert port_names == {zeros.id: "h"}
    every = sowviz.inspect(fori_loss, w, x, mode="grad", capture="all")
    assert loop.n_eqns == _one(every, "fori_loop(body)").n_eqns

    h = np.zeros(4, np.float32)
    for i in range(3):
        h = np.tanh(h @ np.asarray(w) + i * 0.1) + np.asarray(x)[i]
    got = _probe(ins, loop).summaries["primal"]
    np.testing.assert_allclose(got["l2"], np.linalg.norm(h), rtol=1e-5)
    ct = _probe(ins, loop).summaries["cotangent"]
    np.testing.assert_allclose(ct["l2"], np.linalg.norm(2 * h), rtol=1e-5)
    _grads_close(ins, fori_loss, w, x)
