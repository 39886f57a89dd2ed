"""`jax.lax.map(f, xs, batch_size=B)` drawn as one stage when B does not divide the length.

JAX runs such a map as a `scan` over the `n` full chunks of `B` rows (its body
`vmap(f)`) and then `vmap(f)` once more on the `r` remaining rows
(`_compat.lax_map_batching`). Built as traced, the graph held two stages: the scan
(`map`, its statistics over the `n*B` chunk rows, shaped `(n, B)`) and beside it the
remainder (`f`, over the `r` others). Here the remainder's stages leave the graph:
each one's probe point is sown under its twin's name inside the scan, marked as the
remainder's (`ProbePoint.mapped`), and the capture joins the two
(`capture.mapped.rows_in_order`) into one row per element, as a map without
`batch_size` gives. The scan's own probe becomes the `concatenate` that joins the
chunks' results and the remainder's: the map's output, every row in order; those
`reshape`s and `concatenate`s (and the box a big level folds them into, which read
`map#2`) are the map's stage now.

Strict: the twins must match one to one (kind, label, primitive, in order), every
shape with `B` rows in the scan and `r` in the remainder and like trailing dims, and
the map's result must be its `concatenate`s' (one per output) right after; anything
else is left as traced.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..capture.mapped import CHUNKS, REST
from .model import STAGE_KINDS, Edge, Node, Note, ProbePoint, StageGraph

_DIMS = re.compile(r"\[([0-9,]*)\]$")

#: what the map's panel says (its notes)
NOTE = (
    "A batched map: `jax.lax.map(..., batch_size={B})` ran its function on {n} "
    "chunk{s} of {B} rows (a scan) and once more on the {r} remaining row{rs}; "
    "this stage and the stages inside it show all {rows} rows, in order."
)


def _dims(shape: str) -> tuple[int, ...] | None:
    m = _DIMS.search(shape)
    if m is None:
        return None
    return tuple(int(d) for d in m.group(1).split(",")) if m.group(1) else ()


def joined_maps(graph: StageGraph) -> StageGraph:
    """`graph` with each batched `lax.map`'s remainder joined into its scan's stage."""
    kids: dict[str | None, list[Node]] = {}
    for n in graph.nodes:
        kids.setdefault(n.parent, []).append(n)
    for sibs in list(kids.values()):
        for i, scan in enumerate(sibs[:-1]):
            joined = _joined(graph, kids, scan, sibs[i + 1], sibs[i + 2 :])
            if joined is not None:
                return joined_maps(joined)  # (its ids stay: the next map is found alike)
    return graph


#: the equations `lax.map` joins the chunks' results and the remainder's with
_TAIL = frozenset({"reshape", "concatenate"})


def _tail(kids, scan: Node, after: Sequence[Node]) -> list[Node]:
    """The `reshape`s and `concatenate`s of the map's line right after its remainder,
    bare or in one box of their own."""
    out: list[Node] = []
    for m in after:
        inner = kids.get(m.id, [])
        if m.source != scan.source:
            break
        if m.kind == "eqn" and m.primitive in _TAIL:
            out.append(m)
        elif (
            m.kind == "scope"
            and inner
            and all(k.kind == "eqn" and k.primitive in _TAIL for k in inner)
        ):
            out += [m, *inner]
        else:
            break
    return out


def _joined(graph, kids, scan: Node, rest: Node, after: Sequence[Node]) -> StageGraph | None:
    if not (
        scan.kind == "scan"
        and scan.label.partition("(")[0] == "map"
        and rest.kind in STAGE_KINDS
        and rest.source == scan.source
        and not (scan.repeats or rest.repeats)
        and scan.shapes
    ):
        return None
    chunked = [_dims(s) for s in scan.shapes]
    if any(d is None or len(d) < 2 for d in chunked):
        return None
    n, size = chunked[0][:2]
    tail = _tail(kids, scan, after)
    concats = [m for m in tail if m.primitive == "concatenate"]
    joined = [_dims(m.shapes[0]) if len(m.shapes) == 1 else None for m in concats]
    if len(concats) != len(scan.shapes) or any(
        d is None or c is None or d[:1] != (d[0],) or d[1:] != c[2:]
        for c, d in zip(chunked, joined, strict=True)
    ):
        return None
    rows = {d[0] for d in joined if d}
    r = next(iter(rows)) - n * size if len(rows) == 1 else 0
    if not 0 < r < size:
        return None
    points = {p.node: p for p in graph.probe_points}
    for run in (kids.get(rest.id, []), [rest]):
        same: set[str] = set()
        twins = _twins(kids, run, kids.get(scan.id, []), (size, r, points, same))
        if twins is not None:
            break
    else:
        return None
    parts = (rest, twins, same, tail, concats)
    return _rebuilt(graph, scan, parts, _note_args(n, size, r))


def _note_args(n: int, size: int, r: int) -> dict:
    return {
        "B": size,
        "n": n,
        "s": "s" * (n != 1),
        "r": r,
        "rs": "s" * (r != 1),
        "rows": n * size + r,
    }


def _twins(kids, rest: list[Node], chunk: list[Node], rows: tuple) -> dict[str, str] | None:
    """{remainder node id: its twin's in the scan} for the runs `rest` and `chunk` and
    everything inside them, or None where they differ. `rows`: (B, r, the probe points
    by node, `same`): a probed node's values must have their rows first, B in the scan
    and r apart (an equation's drawn inside a stage may not: `vmap` puts a
    `dot_general`'s batch last), or all be alike in both (values `vmap` left unbatched:
    a constant's broadcast), those added to `same`."""
    size, r, points, same = rows
    if len(rest) != len(chunk):
        return None
    out: dict[str, str] = {}
    for a, b in zip(rest, chunk, strict=True):
        if (a.kind, a.label, a.primitive) != (b.kind, b.label, b.primitive):
            return None
        if a.id in points or b.id in points:
            pa, pb = points.get(a.id), points.get(b.id)
            if pa is None or pb is None or len(pa.shapes) != len(pb.shapes):
                return None
            dims = [(_dims(x), _dims(y)) for x, y in zip(pa.shapes, pb.shapes, strict=True)]
            if all(da is not None and da == db for da, db in dims):
                same.add(a.id)  # alike for every row
            elif not all(
                da is not None
                and db is not None
                and da[:1] == (r,)
                and db[:1] == (size,)
                and da[1:] == db[1:]
                for da, db in dims
            ):
                return None
        inner = _twins(kids, kids.get(a.id, []), kids.get(b.id, []), rows)
        if inner is None:
            return None
        out[a.id] = b.id
        out.update(inner)
    return out


def _rebuilt(graph, scan, parts, args) -> StageGraph:
    """The graph without the remainder `rest` (its nodes' probe points sown under their
    `twins`' names, but those of values alike in both, `same`: the scan's tell them)
    and without the `tail` joining the results, the scan's probe the map's result (its
    `concats`)."""
    rest, twins, same, tail, concats = parts
    chunked = {twins[i] for i in twins if i not in same}
    absorbed = {rest.id, *(m.id for m in tail)}
    gone = absorbed | set(twins)

    def lift(i: str) -> str:  # an edge's end beside the map
        return scan.id if i in absorbed else i

    def moved(i: str) -> str:  # a node anywhere
        return twins.get(i, lift(i))

    by_node = {p.node: p for p in graph.probe_points}
    points: list[ProbePoint] = []
    for p in graph.probe_points:
        if p.node == scan.id:
            points.append(_result(p, by_node, concats, tail))
        elif p.node in twins and p.node not in same:
            points.append(dataclasses.replace(p, node=twins[p.node], mapped=REST[0]))
        elif p.node in chunked:
            points.append(dataclasses.replace(p, mapped=CHUNKS[0]))
        elif p.node not in gone:
            points.append(p)
    scan_point = next((p for p in points if p.node == scan.id), None)
    nodes = []
    for node in graph.nodes:
        if node.id in gone:
            continue
        if node.id == scan.id:
            reads = dict(zip(rest.reads, rest.read_at, strict=True))
            reads.update(zip(node.reads, node.read_at, strict=True))
            order = sorted(reads, key=lambda k: reads[k])
            node = dataclasses.replace(
                node,
                shapes=scan_point.shapes if scan_point is not None else node.shapes,
                reads=tuple(order),
                read_at=tuple(reads[k] for k in order),
            )
        nodes.append(node)
    edges, seen = [], set()
    for e in graph.edges:
        if (e.source in gone and e.source not in absorbed) or (
            e.target in gone and e.target not in absorbed
        ):
            continue  # inside the remainder, or the box the tail was in
        ends = tuple(dict.fromkeys((moved(a), moved(b)) for a, b in e.ends))
        e = Edge(lift(e.source), lift(e.target), e.shape, e.dtype, ends)
        key = (e.source, e.target, e.ends)
        if e.source != e.target and key not in seen:
            seen.add(key)
            edges.append(e)
    notes = [dataclasses.replace(n, node=moved(n.node)) for n in graph.notes]
    notes.append(Note("info", scan.id, NOTE.format(**args)))
    return dataclasses.replace(
        graph,
        nodes=tuple(nodes),
        edges=tuple(edges),
        probe_points=tuple(points),
        notes=tuple(notes),
        sow_nodes={k: moved(v) for k, v in graph.sow_nodes.items()},
        sow_nodes_all={
            k: tuple(dict.fromkeys(i for i in v if i not in gone))
            for k, v in graph.sow_nodes_all.items()
        },
        sow_calls={k: v for k, v in graph.sow_calls.items() if k not in gone},
        constant_nodes=frozenset(i for i in graph.constant_nodes if i not in gone),
        input_readers={k: frozenset(map(moved, v)) for k, v in graph.input_readers.items()},
        module_roots=frozenset(map(moved, graph.module_roots)),
    )


def _result(p: ProbePoint, by_node: dict, concats: list[Node], tail: list[Node]) -> ProbePoint:
    """The scan's point `p` sowing the map's result instead: its `concats`' values, or
    those of the box holding them (a big level's), where probed; else `p`."""
    for ends in ([by_node.get(m.id) for m in concats], [by_node.get(m.id) for m in tail]):
        ends = [e for e in ends if e is not None]
        values = tuple(v for e in ends for v in e.values)
        if len(values) == len(concats) and all(e.path == p.path and not e.apart for e in ends):
            shapes = tuple(s for e in ends for s in e.shapes)
            return dataclasses.replace(
                p, at=max(i for i, _ in values), values=values, shapes=shapes
            )
    return p
