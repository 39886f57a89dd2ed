"""Stage-graph build time and model size for 1K- and 10K-equation programs.

A deep MLP of many `jax.named_scope` layers (4 equations each: dot, add, tanh,
and a residual add). Prints, per size: equations, nodes, edges, probe points,
`build_graph` time (best of 3), `instrument_jaxpr` time, and
`len(json.dumps(model))` for the full and the compact node encoding.

A plain-function program of as many equations (a residual layer written as a
function called in a loop): `build_graph` time with and without the user-function
stages (`graph/calls.py`), measured in the same run.

Then the zoo's Flax NNX language model with 24 identical layers (traced with the
framework names, as `inspect` traces it): `build_graph` time with and without the
merging of repeated blocks (`graph/repeats.py`), measured in the same run.

    python benchmarks/graph_scale.py [--quick]
"""

from __future__ import annotations

import json
import time

import _bench
import jax
import jax.numpy as jnp

from sowviz.graph import build, build_graph, frameworks, instrument_jaxpr, repeats
from sowviz.graph.build import _count_eqns


def deep_mlp(n_layers: int):
    def f(ws, x):
        for i, w in enumerate(ws):
            with jax.named_scope(f"layer_{i}"):
                x = x + jnp.tanh(x @ w + 1.0)
        return jnp.sum(x * x)

    ws = [jax.ShapeDtypeStruct((16, 16), jnp.float32)] * n_layers
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    closed = jax.make_jaxpr(f)(ws, x)
    return closed, [f"ws[{i}]" for i in range(n_layers)] + ["x"]


def nnx_lm(layers: int):
    import sys

    sys.path.insert(0, str(_bench.ROOT / "tests"))
    from zoo.models import nnx_lm

    args = nnx_lm.make(nnx_lm.Config(attention=("einsum",) * layers))
    leaves, tree = jax.tree_util.tree_flatten(args)
    flat = lambda *f: frameworks.named(nnx_lm.loss)(*jax.tree_util.tree_unflatten(tree, f))  # noqa: E731
    closed = jax.make_jaxpr(flat)(*leaves)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(args)[0]]
    in_args = [int(p[1 : p.index("]")]) for p in paths]
    return closed, dict(in_names=paths, out_names=["loss"], in_args=in_args, parameters={0})


def _block(x, w):
    return x + jnp.tanh(x @ w + 1.0)


def plain_functions(n_calls: int):
    """The same residual layers written as a plain function called in a loop: each call
    is a stage of the user's own (`graph/calls.py`), no named scope."""

    def f(ws, x):
        for w in ws:
            x = _block(x, w)
        return jnp.sum(x * x)

    ws = [jax.ShapeDtypeStruct((16, 16), jnp.float32)] * n_calls
    closed = jax.make_jaxpr(f)(ws, jax.ShapeDtypeStruct((8, 16), jnp.float32))
    return closed, [f"ws[{i}]" for i in range(n_calls)] + ["x"]


def best_of(n: int, fn) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(quick: bool = False) -> list[_bench.Row]:
    rows: list[_bench.Row] = []
    closed, kw = nnx_lm(24)
    t_with, graph = best_of(5, lambda: build_graph(closed, **kw))
    merge = repeats.merge
    repeats.merge = lambda builder: builder.recs  # the same build without merging
    try:
        t_without, plain = best_of(5, lambda: build_graph(closed, **kw))
    finally:
        repeats.merge = merge
    top = sum(1 for n in graph.nodes if n.parent == graph.root)
    print(
        f"NNX LM 24 layers, {_count_eqns(closed.jaxpr)} eqns: build_graph {t_with * 1e3:.1f} ms "
        f"({t_without * 1e3:.1f} ms without merging repeated blocks; {len(graph.nodes)} vs "
        f"{len(plain.nodes)} nodes), {top} top-level nodes, groups: "
        f"{[n.label for n in graph.nodes if n.repeats]}"
    )
    _bench.emit(rows, _bench.Row("graph_scale", "build_graph, NNX LM 24 layers", t_with, "s"))
    # user-function stages: the same build with and without them, in one run
    closed, in_names = plain_functions(250 if quick else 2_500)
    kw = dict(in_names=in_names, out_names=["loss"])
    t_calls, graph = best_of(3, lambda: build_graph(closed, **kw))
    group = build.group_calls
    build.group_calls = lambda names, *a, **k: (list(names), {})
    try:
        t_none, _ = best_of(3, lambda: build_graph(closed, **kw))
    finally:
        build.group_calls = group
    print(
        f"plain functions, {_count_eqns(closed.jaxpr)} eqns: build_graph {t_calls * 1e3:.1f} ms "
        f"({t_none * 1e3:.1f} ms without user-function stages), top level: "
        f"{[n.label for n in graph.nodes if n.parent == graph.root and n.kind != 'input']}"
    )
    _bench.emit(rows, _bench.Row("graph_scale", "build_graph, plain functions", t_calls, "s"))
    for target in (1_000,) if quick else (1_000, 10_000):
        closed, in_names = deep_mlp(target // 4)
        n_eqns = _count_eqns(closed.jaxpr)
        for capture in ("stages", "all"):
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                graph = build_graph(closed, in_names=in_names, out_names=["loss"], capture=capture)
                best = min(best, time.perf_counter() - t0)
            t0 = time.perf_counter()
            instrument_jaxpr(closed, graph.probe_points, tag="bench")
            t_inst = time.perf_counter() - t0
            _bench.emit(
                rows,
                _bench.Row(
                    "graph_scale", f"build_graph, {n_eqns} eqns, capture={capture}", best, "s"
                ),
            )
            full = len(json.dumps(graph.to_dict()))
            compact = len(json.dumps(graph.to_dict(compact=True)))
            print(
                f"{n_eqns:>6} eqns  capture={capture:<6}  nodes={len(graph.nodes):>6}  "
                f"edges={len(graph.edges):>6}  probes={len(graph.probe_points):>6}  "
                f"build={best * 1e3:7.1f} ms  instrument={t_inst * 1e3:7.1f} ms  "
                f"json={full / 1e3:7.1f} kB  "
                f"compact={compact / 1e3:7.1f} kB"
            )

    return rows


if __name__ == "__main__":
    main(_bench.args(__doc__).quick)
