"""Round 13 of the graph's names: a line assigning a random draw is named by what it
assigns, a lambda given to `inspect` is not named by the Inspection it returns, a
`return` line's `jax.tree.map` is one box, and a plain function a Linen module's method
calls carries data on its boxes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz


def _top(g):
    """The labels of the top level's work: not its inputs and outputs, nor their groups."""
    return [n.label for n in g.nodes if n.parent == g.root and n.n_eqns]


def _node(g, label, parent=None):
    (found,) = (n for n in g.nodes if n.label == label and (parent is None or n.parent == parent))
    return found


def _summaries(ins, node):
    """The primal summaries probed on `node`, by leaf."""
    return {p.leaf: p.summaries["primal"] for p in ins.probes if p.node == node.id}


# --- a line assigning a random draw is named by what it assigns -------------------------


def _diffusion(w, x, key):
    kt, kn = jax.random.split(key)
    t = jax.random.randint(kt, (x.shape[0],), 0, 10)
    noise = jax.random.normal(kn, x.shape)
    xt = x + t[:, None] * noise
    return jnp.mean((xt @ w - noise) ** 2)


@pytest.mark.parametrize("make_key", [jax.random.PRNGKey, jax.random.key])
def test_a_random_draw_line_is_named_by_what_it_assigns(make_key):
    # `t = jax.random.randint(...)`, `noise = jax.random.normal(...)` were boxes `randint`
    # and `normal` (the same lines drawing from an `nnx.Rngs` stream: `t`, `noise`)
    w, x, key = jnp.eye(4), jnp.ones((8, 4)), make_key(0)
    ins = sowviz.inspect(_diffusion, w, x, key)
    g = ins.graph
    assert _top(g) == ["kt, kn", "t", "noise", "xt", "mean"]
    # the draw's own stage is inside, saying which distribution
    assert [n.label for n in g.children(_node(g, "noise").id)] == ["normal"]
    assert [n.label for n in g.children(_node(g, "t").id)] == ["randint"]
    split = _node(g, "kt, kn")
    edges = {(e.source, e.target) for e in g.edges}
    assert (split.id, _node(g, "noise").id) in edges and (split.id, _node(g, "t").id) in edges
    want = np.asarray(jax.random.normal(jax.random.split(key)[1], x.shape))
    got = ins.probe("noise").summaries["primal"]
    np.testing.assert_allclose([got["mean"], got["max"]], [want.mean(), want.max()], rtol=1e-5)


# --- a lambda given to inspect is drawn as a function's lines are -----------------------


def _as_def(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2) + jnp.sum(w**2)


def test_a_lambda_given_to_inspect_is_not_named_by_the_inspection():
    # `report = sowviz.inspect(lambda ...)` drew boxes `report`, `report#2`, and the probe
    # paths said `report`: the name of the Inspection, no value of the program
    w, x = jnp.linspace(-1.0, 1.0, 9).reshape(3, 3), jnp.arange(6.0).reshape(2, 3) / 6
    report = sowviz.inspect(lambda w, x: jnp.mean(jnp.tanh(x @ w) ** 2) + jnp.sum(w**2), w, x)
    plain = sowviz.inspect(_as_def, w, x)
    assert _top(report.graph) == _top(plain.graph)
    assert not any("report" in report.probe_path(p) for p in report.probes)
    want = jnp.tanh(x @ w)
    got = report.probe("tanh").summaries["primal"]
    np.testing.assert_allclose(
        [got["mean"], got["l2"]], [want.mean(), jnp.linalg.norm(want)], rtol=1e-5
    )
    # a bare call of sowviz is not its name either (`out.append`)
    out = []
    out.append(sowviz.inspect(lambda w, x: jnp.mean(jnp.tanh(x @ w) ** 2) + jnp.sum(w**2), w, x))
    assert _top(out[0].graph) == _top(plain.graph)


# --- a `return` line's `jax.tree.map` is one box ------------------------------------------


def _returned_update(p, x):
    return jax.tree.map(lambda a: a - 0.1 * jnp.mean(x) * a, p)


_LEAVES = {
    "dense": {"kernel": jnp.ones((3, 4)), "bias": 2.0 * jnp.ones(4)},
    "ln": {"scale": jnp.arange(4.0)},
}


@pytest.mark.parametrize(
    "params", [_LEAVES, {"dense": _LEAVES["dense"]}], ids=["3 leaves", "2 leaves"]
)
def test_a_returned_tree_map_is_one_box_holding_every_leaf_alike(params):
    # a box `mean` held two leaves' update and the third's mean, that leaf's `mul`, `mul`,
    # `sub` loose after it (3 leaves); `mean`, `map`, `mean#2`, `map#2` (2 leaves)
    x = jnp.arange(3.0)
    ins = sowviz.inspect(_returned_update, params, x, mode="primal")
    g = ins.graph
    # (named by what it computes over the tree it maps since round 17, not `map`)
    label = "p - 0.1 * jnp.mean(x) * p"
    assert _top(g) == [label]
    box = _node(g, label)
    inside = [n.label.split("#")[0] for n in g.children(box.id)]
    n = len(jax.tree.leaves(params))
    assert (
        inside == ["reduce_sum", "div", "mul", "mul", "sub"] * n
        or inside
        == [
            "mean",
            "mul",
            "mul",
            "sub",
        ]
        * n
    ), inside
    want = _returned_update(params, x)
    got = _summaries(ins, box)
    assert len(got) == n
    want_means = sorted(float(v.mean()) for v in jax.tree.leaves(want))
    np.testing.assert_allclose(sorted(s["mean"] for s in got.values()), want_means, rtol=1e-6)


def _assigned_update(p, x):
    q = jax.tree.map(lambda a: a - 0.1 * jnp.mean(x) * a, p)
    return q


def test_a_tree_map_line_that_is_all_the_function_does_is_one_box():
    ins = sowviz.inspect(_assigned_update, _LEAVES, jnp.arange(3.0), mode="primal")
    assert _top(ins.graph) == ["q"]


# --- a plain function a Linen module's method calls carries data --------------------------


def _attention(query):
    # as `jraph.GAT` makes its `_ApplyGAT`: a closure the module's method calls, whose
    # call every equation of the module's stage shares (no stage of its own)
    def apply(x, senders, receivers):
        h = query(x)
        sent = h[senders]
        weights = jax.nn.sigmoid(jnp.sum(sent, axis=1, keepdims=True))
        messages = sent * weights
        return jax.ops.segment_sum(messages, receivers, num_segments=x.shape[0])

    return apply


class _GATLayer(nn.Module):
    @nn.compact
    def __call__(self, x, senders, receivers):
        return _attention(lambda n: nn.Dense(4, name="query")(n))(x, senders, receivers)


def test_a_plain_function_a_linen_method_calls_carries_data_on_its_boxes():
    # `messages = sent * weights` was a `mul` with no data between `sent` and
    # `segment_sum`, which carry theirs
    x = jnp.sin(jnp.arange(18.0)).reshape(6, 3)
    s, r = jnp.array([0, 1, 2, 3, 4, 5, 0, 2]), jnp.array([1, 2, 3, 4, 5, 0, 3, 3])
    model = _GATLayer()
    params = model.init(jax.random.PRNGKey(1), x, s, r)
    ins = sowviz.inspect(lambda p, x: jnp.sum(model.apply(p, x, s, r) ** 2), params, x)
    g = ins.graph
    stage = _node(g, "_GATLayer")
    (mul,) = (n for n in g.children(stage.id) if n.label == "mul")
    got = _summaries(ins, mul)
    assert got, "the `mul` box carries no data"
    h = x @ params["params"]["query"]["kernel"] + params["params"]["query"]["bias"]
    sent = h[s]
    want = sent * jax.nn.sigmoid(jnp.sum(sent, axis=1, keepdims=True))
    (summary,) = got.values()
    np.testing.assert_allclose(
        [summary["mean"], summary["l2"]], [want.mean(), jnp.linalg.norm(want)], rtol=1e-5
    )
