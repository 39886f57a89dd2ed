"""A padded loss masked with `jnp.where` reads as the multiply version does (`nll`, one box
for the return line); a return line of one value is named by what it returns
(`logits[:, -1]`) when one operation made its several equations; a run computing several arguments of the line's call is named
by them (`next_token[:, None], P + i`), not by the line's target."""

import jax
import jax.numpy as jnp
import numpy as np

import sowviz
from sowviz.graph.source_text import operand_text


def _children(graph, node_id):
    return [n.label for n in sorted(graph.nodes, key=lambda n: n.order) if n.parent == node_id]


def _only(graph, label):
    (node,) = (n for n in graph.nodes if n.label == label)
    return node


def _probe_at(ins, node_id, leaf=""):
    (probe,) = (p for p in ins.probes if p.node == node_id and p.leaf == leaf)
    return probe.summaries


# -- 1. a padded loss masked with `jnp.where` ------------------------------------------

_N, _C = 24, 3
_Y = jnp.asarray(np.random.default_rng(0).integers(0, _C, _N))
_MASK = jnp.arange(_N) < 20
_X = jax.random.normal(jax.random.PRNGKey(0), (_N, 8))
_W = jax.random.normal(jax.random.PRNGKey(1), (8, _C))


def _model(w, x):
    return jnp.tanh(x @ w)


def _loss_mul(w, x, y, mask):
    logp = jax.nn.log_softmax(_model(w, x))
    nll = -jnp.take_along_axis(logp, y[:, None], 1)[:, 0]
    return jnp.sum(nll * mask) / jnp.sum(mask)


def _loss_where(w, x, y, mask):
    logp = jax.nn.log_softmax(_model(w, x))
    nll = -jnp.take_along_axis(logp, y[:, None], 1)[:, 0]
    return jnp.sum(jnp.where(mask, nll, 0.0)) / jnp.sum(mask)


#: the return line's box, named by the calls it makes and its last operator (it read
#: `_loss_where:<line>`, its place: round 16)
_RETURNED = {"_loss_mul": "sum · div", "_loss_where": "where · sum · div"}


def test_a_loss_masked_with_where_reads_as_the_multiply_version():
    # its level, 12 nodes, was small: `nll` read `broadcast_in_dim`, `take_along_axis`,
    # `squeeze`, `neg`, the return line `where`, `sum`, `convert_element_type`, `div`
    tops = {}
    for fn in (_loss_mul, _loss_where):
        ins = sowviz.inspect(fn, _W, _X, _Y, _MASK)
        g = ins.graph
        tops[fn] = top = _children(g, g.root)
        ret_label = _RETURNED[fn.__name__]
        want_top = ["w", "x", "y", "mask", "_model", "log_softmax", "nll", ret_label, "output"]
        assert top == want_top, top
        np.testing.assert_allclose(ins.result[0], jax.jit(fn)(_W, _X, _Y, _MASK), rtol=1e-6)
        np.testing.assert_allclose(ins.result[1], jax.grad(fn)(_W, _X, _Y, _MASK), rtol=1e-5)
        # `nll` holds the line's work, with its value and d loss / d nll
        nll = _only(g, "nll")
        assert [c for c in _children(g, nll.id) if c != "take_along_axis"] == [
            "broadcast_in_dim",
            "squeeze",
            "neg",
        ]
        logp = jax.nn.log_softmax(_model(_W, _X))
        want = -jnp.take_along_axis(logp, _Y[:, None], 1)[:, 0]
        got = _probe_at(ins, nll.id)
        np.testing.assert_allclose(got["primal"]["l2"], float(jnp.linalg.norm(want)), rtol=1e-5)
        # d/dnll of sum(nll * mask) / sum(mask): mask / 20
        dnll = np.where(np.asarray(_MASK), 1.0 / 20, 0.0)
        np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(dnll), rtol=1e-5)
        # the return line's box shows the loss
        ret = _probe_at(ins, _only(g, ret_label).id)
        np.testing.assert_allclose(ret["primal"]["max"], float(ins.result[0]), rtol=1e-6)
    assert "where" not in tops[_loss_where] and "div" not in tops[_loss_where]


# -- 2. a return line of one value ------------------------------------------------------


def _last_logits(w, x):
    logits = jnp.tanh(x @ w)
    return logits[:, -1]


def _summed(w, x):
    h = jnp.tanh(x @ w)
    return h.sum()


def _mean_sq(y, t):
    return jnp.mean((y - t) ** 2)


def test_a_return_line_of_one_value_is_named_by_what_it_returns():
    w, x = jnp.linspace(-1, 1, 12).reshape(4, 3), jnp.linspace(0, 1, 40).reshape(2, 5, 4)
    ins = sowviz.inspect(_last_logits, w, x, mode="primal")
    g = ins.graph
    top = _children(g, g.root)
    # (it read `slice`, `squeeze`: the index's two equations)
    assert top == ["w", "x", "logits", "logits[:, -1]", "output"], top
    assert _children(g, _only(g, "logits[:, -1]").id) == ["slice", "squeeze"]
    want = jnp.tanh(x @ w)[:, -1]
    np.testing.assert_allclose(ins.result, want, rtol=1e-6)
    got = _probe_at(ins, _only(g, "logits[:, -1]").id)["primal"]
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(want)), rtol=1e-5)

    # `.sum()`: one equation is its own box already, with its data (a box `sum` around
    # it would say nothing more): it stays `reduce_sum`, as `return toks * 2` stays `mul`
    x2 = jnp.linspace(0, 1, 8).reshape(2, 4)
    ins = sowviz.inspect(_summed, w, x2)
    g = ins.graph
    assert _children(g, g.root) == ["w", "x", "h", "reduce_sum", "output"]
    got = _probe_at(ins, _only(g, "reduce_sum").id)
    np.testing.assert_allclose(got["primal"]["max"], float(_summed(w, x2)), rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], jax.grad(_summed)(w, x2), rtol=1e-5)

    # a small level's own arithmetic, several operations, stays its boxes
    g = sowviz.inspect(_mean_sq, jnp.linspace(0.0, 1.0, 6), jnp.ones(6)).graph
    top = _children(g, g.root)
    assert "sub" in top and "integer_pow" in top and "mean" in top, top


# -- 3. a run computing two arguments of the line's call --------------------------------


def _decode_step(w, token, pos):
    return jnp.tanh(w[token[:, 0]] * pos)


def _generate(w, first):
    P = 3

    def body(i, carry):
        logits, out = carry
        next_token = jnp.argmax(logits, axis=-1)
        out = out.at[:, i].set(next_token)
        logits = _decode_step(w, next_token[:, None], P + i)  # @two_arguments
        return logits, out

    _, out = jax.lax.fori_loop(0, 4, body, (first, jnp.zeros((2, 4), jnp.int32)))
    return out


def test_a_run_computing_two_arguments_is_named_by_them():
    w = jax.random.normal(jax.random.PRNGKey(0), (8, 8))
    x = jnp.linspace(0, 1, 16).reshape(2, 8)
    ins = sowviz.inspect(_generate, w, x, mode="primal")
    np.testing.assert_array_equal(ins.result, jax.jit(_generate)(w, x))
    g = ins.graph
    labels = [n.label for n in g.nodes]
    # (it was a box `logits` of the two integers, beside `_decode_step`, which makes them)
    assert "logits" not in labels, labels
    args = _only(g, "next_token[:, None], P + i")
    assert args.shapes == ("int32[2,1]", "int32[]"), args.shapes
    body = _children(g, args.parent)
    at = body.index("next_token[:, None], P + i")
    assert body[at + 1] == "_decode_step", body


def test_operand_text_reads_consecutive_arguments():
    here = __file__
    with open(here) as f:
        lines = f.read().splitlines()
    line = next(k for k, t in enumerate(lines, 1) if t.rstrip().endswith("# @two_arguments"))
    text = lines[line - 1]
    a = text.index("next_token[")
    b = text.index("P + i") + len("P + i")
    assert operand_text(here, line, (line, a, line, b)) == "next_token[:, None], P + i"
    # one argument alone still reads as it
    assert operand_text(here, line, (line, b - 5, line, b)) == "P + i"
    # the call itself (from its name on) is no argument
    c = text.index("_decode_step")
    assert operand_text(here, line, (line, c, line, b + 1)) is None
