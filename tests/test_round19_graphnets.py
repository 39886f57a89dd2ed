"""Round 19: graph neural networks read as the layers the user wrote. jraph's
`GraphConvolution(update_node_fn)` is one stage holding the user's `hk.Linear` and its
`aggregate_nodes_fn: segment_sum` (the Linear stood outside it, the aggregation was
loose `scatter-add`s); jraph's `GraphNetwork` is one stage (Haiku's MLP scopes cut it
in three: `GraphNetwork`, `GraphNetwork#2`, `GraphNetwork#3`) holding the user's update
functions named by what jraph calls them (`update_edge_fn: edge_mlp`, not a bare
`sequential`), edges → nodes → globals. Each test runs on jraph (when installed) and on
jraph's idiom copied in plain JAX (`_round19_graphnets_programs.FAKE_JRAPH`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _round19_graphnets_programs import fake_jraph, gcn, graph_network

import sowviz


@pytest.fixture(params=["fake", "jraph"])
def lib(request, tmp_path, monkeypatch):
    if request.param == "jraph":
        return pytest.importorskip("jraph")
    return fake_jraph(tmp_path, monkeypatch)


def _children(ins, node_id):
    return [n for n in ins.graph.nodes if n.parent == node_id]


def _labels(ins, node_id):
    return [n.label for n in _children(ins, node_id)]


def _one(ins, label):
    found = [n for n in ins.graph.nodes if n.label == label]
    assert len(found) == 1, (label, sorted({n.label for n in ins.graph.nodes}))
    return found[0]


def _inside(ins, node, ancestor) -> bool:
    while node.parent is not None:
        if node.parent == ancestor.id:
            return True
        node = ins.graph.node(node.parent)
    return False


def test_a_graph_convolution_holds_its_update_and_its_aggregation(lib):
    loss, params, graph = gcn(lib)
    ins = sowviz.inspect(loss, params, graph, mode="grad")
    labels = {n.label for n in ins.graph.nodes}
    assert not [x for x in labels if "_Apply" in x], labels
    conv = _one(ins, "GraphConvolution")
    inside = _labels(ins, conv.id)
    # the user's `update_node_fn` (`hk.Linear(8)`) is the layer's first step
    assert inside[0] == "linear", inside
    # its own steps by what jraph's statements assign
    assert {"conv_receivers", "sender_degree", "receiver_degree"} <= set(inside), inside
    agg = [n for n in _children(ins, conv.id) if n.label == "aggregate_nodes_fn: segment_sum"]
    assert len(agg) == 1, inside
    assert "scatter-add" in [n.primitive for n in _children(ins, agg[0].id)]
    # no loose scatter: the degrees are `segment_sum` stages too
    assert "scatter-add" not in [n.primitive for n in _children(ins, conv.id)], inside
    second = _one(ins, "GraphConvolution#2")
    assert _labels(ins, second.id)[0] == "linear_1"
    assert "aggregate_nodes_fn: segment_sum" in _labels(ins, second.id)

    # the aggregation's value, computed apart in NumPy: the Linear, self edges, the
    # sender-degree normalisation, then the sum into each receiver
    w, b = (np.asarray(params["linear"][k]) for k in ("w", "b"))
    x = np.asarray(graph.nodes) @ w + b
    n = x.shape[0]
    senders = np.concatenate([np.asarray(graph.senders), np.arange(n)])
    receivers = np.concatenate([np.asarray(graph.receivers), np.arange(n)])
    x = x / np.sqrt(np.maximum(np.bincount(senders, minlength=n), 1.0))[:, None]
    want = np.zeros_like(x)
    np.add.at(want, receivers, x[senders])
    got = ins.probe(ins.probe_path(_probe_of(ins, agg[0]))).summaries["primal"]["l2"]
    np.testing.assert_allclose(got, np.linalg.norm(want), rtol=1e-5)

    value, grads = ins.result
    ref_value, ref_grads = jax.value_and_grad(loss)(params, graph)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-6)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-6)


def _probe_of(ins, node):
    found = [p for p in ins.probes if p.node == node.id]
    assert found, node.label
    return found[0]


def test_a_graph_network_is_one_stage_of_the_user_s_update_functions(lib):
    loss, params, graph, net = graph_network(lib)
    ins = sowviz.inspect(loss, params, graph, mode="grad")
    labels = [n.label for n in ins.graph.nodes]
    assert "GraphNetwork" in labels and not [x for x in labels if x.startswith("GraphNetwork#")]
    gn = _one(ins, "GraphNetwork")
    inside = _labels(ins, gn.id)
    updates = [x for x in inside if x.startswith("update_")]
    assert updates == [
        "update_edge_fn: edge_mlp",
        "update_node_fn: node_mlp",
        "update_global_fn: global_mlp",
    ], inside
    # each holds the user's MLP, and the aggregations between them are named by jraph's
    # arguments
    edge = _one(ins, "update_edge_fn: edge_mlp")
    assert _labels(ins, edge.id)[:1] == ["sequential"]  # (then `+ delta`)
    assert "aggregate_edges_for_nodes_fn: segment_sum" in inside
    assert inside[:2] == ["sent_attributes", "received_attributes"], inside
    assert gn.collapsed is False  # (the first picture shows its steps: all the model does)
    # the flow: edges, then nodes, then globals, along the drawn edges of the stage's level
    ids = {n.label: n.id for n in _children(ins, gn.id)}
    succ: dict[str, set[str]] = {}
    for e in ins.graph.edges:
        succ.setdefault(e.source, set()).add(e.target)

    def reaches(a: str, b: str) -> bool:
        seen, todo = set(), [ids[a]]
        while todo:
            x = todo.pop()
            for y in succ.get(x, ()):
                if y == ids[b]:
                    return True
                if y not in seen:
                    seen.add(y)
                    todo.append(y)
        return False

    assert reaches("update_edge_fn: edge_mlp", "update_node_fn: node_mlp")
    assert reaches("update_node_fn: node_mlp", "update_global_fn: global_mlp")
    assert not reaches("update_node_fn: node_mlp", "update_edge_fn: edge_mlp")

    # the edge update's value and cotangent, against the network run apart (`delta`
    # added to what `edge_mlp` makes: d loss / d delta is its cotangent)
    zero = jnp.zeros((5, 4))
    made = net.apply(params, graph, zero)[1]
    cot = jax.grad(lambda d: loss(params, graph, d))(zero)
    probe = ins.probe("update_edge_fn: edge_mlp")
    np.testing.assert_allclose(
        probe.summaries["primal"]["l2"], float(jnp.linalg.norm(made)), rtol=1e-5
    )
    np.testing.assert_allclose(
        probe.summaries["cotangent"]["l2"], float(jnp.linalg.norm(cot)), rtol=1e-5
    )
    value, grads = ins.result
    ref_value, ref_grads = jax.value_and_grad(loss)(params, graph)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-6)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-6)


def test_a_graph_network_s_report_draws_the_one_stage(lib, tmp_path):
    # (the HTML the user opens: the stage's label once, escaped, and no `_Apply` name)
    loss, params, graph, _ = graph_network(lib)
    ins = sowviz.inspect(loss, params, graph, mode="grad")
    path = tmp_path / "gn.html"
    ins.save_html(path)
    model = ins.to_dict()
    labels = [n["label"] for n in model["nodes"]]
    assert labels.count("GraphNetwork") == 1
    assert "update_edge_fn: edge_mlp" in labels
    assert "_ApplyGraphNet" not in path.read_text()


def test_a_flax_nnx_gcn_with_segment_sum_reads_as_its_layers():
    # the same convolution written as a Flax NNX module calling `jax.ops.segment_sum`
    from flax import nnx

    class GCNLayer(nnx.Module):
        def __init__(self, din, dout, rngs):
            self.linear = nnx.Linear(din, dout, rngs=rngs)

        def __call__(self, nodes, senders, receivers):
            n = nodes.shape[0]
            h = self.linear(nodes)
            degree = jax.ops.segment_sum(jnp.ones_like(senders, jnp.float32), receivers, n)
            agg = jax.ops.segment_sum(h[senders], receivers, num_segments=n)
            return agg / jnp.maximum(degree, 1.0)[:, None]

    class GCN(nnx.Module):
        def __init__(self, rngs):
            self.conv1 = GCNLayer(2, 8, rngs)
            self.conv2 = GCNLayer(8, 2, rngs)

        def __call__(self, nodes, senders, receivers):
            h = jax.nn.relu(self.conv1(nodes, senders, receivers))
            return self.conv2(h, senders, receivers)

    model = GCN(nnx.Rngs(0))
    nodes = jnp.array([[0.0, 1.0], [1.0, 0.5], [2.0, -1.0], [0.3, 0.2]])
    senders, receivers = jnp.array([0, 1, 2, 3, 0]), jnp.array([1, 2, 0, 0, 3])

    def loss(model, nodes):
        return jnp.sum(model(nodes, senders, receivers) ** 2)

    ins = sowviz.inspect(loss, model, nodes, mode="grad")
    conv1 = _one(ins, "conv1")
    inside = _labels(ins, conv1.id)
    assert inside[0] == "linear" and "degree" in inside, inside
    assert "scatter-add" not in [n.primitive for n in _children(ins, conv1.id)]
    # the layer's output, computed apart
    w = np.asarray(model.conv1.linear.kernel[...])
    b = np.asarray(model.conv1.linear.bias[...])
    h = np.asarray(nodes) @ w + b
    s, r = np.asarray(senders), np.asarray(receivers)
    agg = np.zeros_like(h)
    np.add.at(agg, r, h[s])
    want = agg / np.maximum(np.bincount(r, minlength=4), 1.0)[:, None]
    got = ins.probe("conv1").summaries["primal"]["l2"]
    np.testing.assert_allclose(got, np.linalg.norm(want), rtol=1e-5)
    _, grads = ins.result
    ref = nnx.grad(loss)(model, nodes)
    for g, r_ in zip(jax.tree.leaves(grads), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r_), rtol=1e-5, atol=1e-6)
