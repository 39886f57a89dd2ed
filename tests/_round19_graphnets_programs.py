"""Graph networks written as jraph's README and examples write them (round 19), run on
jraph itself or on `FAKE_JRAPH`: jraph's idiom copied in plain JAX (a maker returning a
private closure that calls the functions it was given, `jax.ops.segment_sum` and
`jax.tree_util.tree_map`), installed as a library so the tests hold without jraph."""

from __future__ import annotations

import importlib
import pathlib
from types import ModuleType

import haiku as hk
import jax
import jax.numpy as jnp

FAKE_JRAPH = """
import functools
from typing import NamedTuple, Any

import jax
import jax.numpy as jnp
import jax.tree_util as tree


class GraphsTuple(NamedTuple):
    nodes: Any
    edges: Any
    receivers: Any
    senders: Any
    globals: Any
    n_node: Any
    n_edge: Any


def concatenated_args(update):
    @functools.wraps(update)
    def wrapper(*args):
        return update(jnp.concatenate(tree.tree_leaves(args), axis=-1))

    return wrapper


def GraphConvolution(update_node_fn, aggregate_nodes_fn=jax.ops.segment_sum,
                     add_self_edges=False):
    def _ApplyGCN(graph):
        nodes, _, receivers, senders, _, _, _ = graph
        nodes = update_node_fn(nodes)
        total_num_nodes = tree.tree_leaves(nodes)[0].shape[0]
        if add_self_edges:
            conv_receivers = jnp.concatenate((receivers, jnp.arange(total_num_nodes)), axis=0)
            conv_senders = jnp.concatenate((senders, jnp.arange(total_num_nodes)), axis=0)
        else:
            conv_senders, conv_receivers = senders, receivers
        count_edges = lambda x: jax.ops.segment_sum(
            jnp.ones_like(conv_senders), x, total_num_nodes)
        sender_degree = count_edges(conv_senders)
        receiver_degree = count_edges(conv_receivers)
        nodes = tree.tree_map(
            lambda x: x * jax.lax.rsqrt(jnp.maximum(sender_degree, 1.0))[:, None], nodes)
        nodes = tree.tree_map(
            lambda x: aggregate_nodes_fn(x[conv_senders], conv_receivers, total_num_nodes),
            nodes)
        nodes = tree.tree_map(
            lambda x: x * jax.lax.rsqrt(jnp.maximum(receiver_degree, 1.0))[:, None], nodes)
        return graph._replace(nodes=nodes)

    return _ApplyGCN


def GraphNetwork(update_edge_fn, update_node_fn, update_global_fn=None,
                 aggregate_edges_for_nodes_fn=jax.ops.segment_sum,
                 aggregate_nodes_for_globals_fn=jax.ops.segment_sum,
                 aggregate_edges_for_globals_fn=jax.ops.segment_sum):
    def _ApplyGraphNet(graph):
        nodes, edges, receivers, senders, globals_, n_node, n_edge = graph
        sum_n_node = tree.tree_leaves(nodes)[0].shape[0]
        sum_n_edge = senders.shape[0]
        sent_attributes = tree.tree_map(lambda n: n[senders], nodes)
        received_attributes = tree.tree_map(lambda n: n[receivers], nodes)
        global_edge_attributes = tree.tree_map(lambda g: jnp.repeat(
            g, n_edge, axis=0, total_repeat_length=sum_n_edge), globals_)
        if update_edge_fn:
            edges = update_edge_fn(edges, sent_attributes, received_attributes,
                                   global_edge_attributes)
        if update_node_fn:
            sent_attributes = tree.tree_map(
                lambda e: aggregate_edges_for_nodes_fn(e, senders, sum_n_node), edges)
            received_attributes = tree.tree_map(
                lambda e: aggregate_edges_for_nodes_fn(e, receivers, sum_n_node), edges)
            global_attributes = tree.tree_map(lambda g: jnp.repeat(
                g, n_node, axis=0, total_repeat_length=sum_n_node), globals_)
            nodes = update_node_fn(nodes, sent_attributes, received_attributes,
                                   global_attributes)
        if update_global_fn:
            n_graph = n_node.shape[0]
            graph_idx = jnp.arange(n_graph)
            node_gr_idx = jnp.repeat(graph_idx, n_node, axis=0,
                                     total_repeat_length=sum_n_node)
            edge_gr_idx = jnp.repeat(graph_idx, n_edge, axis=0,
                                     total_repeat_length=sum_n_edge)
            node_attributes = tree.tree_map(
                lambda n: aggregate_nodes_for_globals_fn(n, node_gr_idx, n_graph), nodes)
            edge_attributes = tree.tree_map(
                lambda e: aggregate_edges_for_globals_fn(e, edge_gr_idx, n_graph), edges)
            globals_ = update_global_fn(node_attributes, edge_attributes, globals_)
        return GraphsTuple(nodes=nodes, edges=edges, receivers=receivers, senders=senders,
                           globals=globals_, n_node=n_node, n_edge=n_edge)

    return _ApplyGraphNet
"""


def fake_jraph(tmp_path: pathlib.Path, monkeypatch) -> ModuleType:
    """`FAKE_JRAPH` as an installed package's module (a library's frames, as jraph's)."""
    installed = tmp_path / "site-packages"
    installed.mkdir(exist_ok=True)
    (installed / "fakejraph19.py").write_text(FAKE_JRAPH)
    monkeypatch.syspath_prepend(str(installed))
    return importlib.import_module("fakejraph19")


def make_graph(lib: ModuleType):
    # jraph's README graph, a few more edges, two feature columns
    node_features = jnp.array([[0.0, 1.0], [1.0, 0.5], [2.0, -1.0], [0.3, 0.2]])
    senders = jnp.array([0, 1, 2, 3, 0])
    receivers = jnp.array([1, 2, 0, 0, 3])
    edges = jnp.array([[5.0], [6.0], [7.0], [1.0], [2.0]]) / 5
    return lib.GraphsTuple(
        nodes=node_features,
        senders=senders,
        receivers=receivers,
        edges=edges,
        n_node=jnp.array([4]),
        n_edge=jnp.array([5]),
        globals=jnp.array([[1.0]]),
    )


def gcn(lib: ModuleType):
    """jraph's karate-club GCN: two `GraphConvolution`s of `hk.Linear`, self edges."""

    def gcn_definition(graph):
        gn = lib.GraphConvolution(update_node_fn=hk.Linear(8), add_self_edges=True)
        graph = gn(graph)
        graph = graph._replace(nodes=jax.nn.relu(graph.nodes))
        gn = lib.GraphConvolution(update_node_fn=hk.Linear(2))
        return gn(graph)

    net = hk.without_apply_rng(hk.transform(gcn_definition))
    graph = make_graph(lib)
    params = net.init(jax.random.PRNGKey(42), graph)

    def loss(params, graph):
        return jnp.sum(net.apply(params, graph).nodes ** 2)

    return loss, params, graph


def graph_network(lib: ModuleType):
    """jraph's ogb example: a `GraphNetwork` of three `@concatenated_args` Haiku MLPs.
    `net.apply(params, graph, delta)` adds `delta` to the edges `edge_mlp` makes and
    returns them beside the graph: `jax.grad` by `delta` is their cotangent."""

    def net_fn(graph, delta):
        made = []

        @lib.concatenated_args
        def edge_mlp(feats):
            out = hk.Sequential([hk.Linear(8), jax.nn.relu, hk.Linear(4)])(feats) + delta
            made.append(out)
            return out

        @lib.concatenated_args
        def node_mlp(feats):
            return hk.Sequential([hk.Linear(8), jax.nn.relu, hk.Linear(4)])(feats)

        @lib.concatenated_args
        def global_mlp(feats):
            return hk.Sequential([hk.Linear(8), jax.nn.relu, hk.Linear(1)])(feats)

        net = lib.GraphNetwork(
            update_edge_fn=edge_mlp, update_node_fn=node_mlp, update_global_fn=global_mlp
        )
        return net(graph), made[0]

    net = hk.without_apply_rng(hk.transform(net_fn))
    graph = make_graph(lib)
    zero = jnp.zeros((5, 4))
    params = net.init(jax.random.PRNGKey(7), graph, zero)

    def loss(params, graph, delta=zero):
        out, _ = net.apply(params, graph, delta)
        return jnp.sum(out.nodes**2) + jnp.sum(out.globals**2)

    return loss, params, graph, net
