"""The stage graph as frozen dataclasses; `to_dict()` gives the JSON of docs/model.md."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._compat import COLLECTIVE_CALLS, COLLECTIVE_FUNCTIONS, SourceLocation

NodeKind = Literal[
    "input",
    "output",
    "jit",
    "scope",
    "tesseract",
    "scan",
    "cond",
    "while",
    "remat",
    "custom",
    "sow",
    "eqn",
    "shard_map",
]
Capture = Literal["sows", "stages", "all"]

#: Kinds that group other nodes (or, for a Tesseract, an opaque program) and start collapsed.
STAGE_KINDS: frozenset[str] = frozenset(
    {"jit", "scope", "scan", "cond", "while", "remat", "custom", "shard_map", "tesseract"}
)


@dataclass(frozen=True)
class Node:
    """One box of the graph. `id` is `n<order>`: stable for a given program."""

    id: str
    label: str
    kind: NodeKind
    parent: str | None
    order: int
    source: SourceLocation | None = None
    shapes: tuple[str, ...] = ()
    primitive: str | None = None
    n_eqns: int = 1
    collapsed: bool = False
    #: > 0: a group of this many identical blocks, its children (graph/repeats.py)
    repeats: int = 0
    #: a group's blocks, where stages of other work lie between them (a Python loop's
    #: `h = gelu(layer(p, h))`: `layer`s, with a `gelu` after each); else all its
    #: children but equations are
    blocks: tuple[str, ...] = ()
    #: the input nodes (parameters) its own equations read, not its stages' inside it
    reads: tuple[str, ...] = ()
    #: per input in `reads`, the `order` of the equation that first reads it: a stage's
    #: reads and its stages' in program order (a module's own weight read after its
    #: sublayer's comes after the sublayer's)
    read_at: tuple[int, ...] = ()
    #: an input leaf a Flax NNX variable holds: its type (`Param`, `LoRAParam`,
    #: `BatchStat`): a LoRA model's frozen `Param`s and trained `LoRAParam`s read alike
    var_type: str | None = None
    #: (producer outside it, name): what its body calls a value it takes in, where the
    #: user's function named it (a loop's `step(h, x)`: `h` for the carry's initial
    #: value), the producer being an `Edge.ends` source
    port_names: tuple[tuple[str, str], ...] = ()
    #: a Tesseract's static inputs, (schema field, value as Python writes it): not
    #: operands of its call, so no edge shows them (`solver`, `'dense'`)
    static_inputs: tuple[tuple[str, str], ...] = ()

    def to_dict(self, *, compact: bool = False, parent_source: Any = None) -> dict[str, Any]:
        """The node as in docs/model.md.

        With `compact=True`, an `eqn` or `sow` node leaves out what restates its
        kind or its parent: `n_eqns` (1), `collapsed` (false), `primitive` when it
        equals the label, and `source` when it equals `parent_source` (the
        parent's). Readers fill them back in with those defaults.
        """
        d: dict[str, Any] = {
            "id": self.id,
            "label": self.label,
            "kind": self.kind,
            "parent": self.parent,
            "order": self.order,
        }
        leaf = compact and self.kind in ("eqn", "sow")
        if not (leaf and self.source == parent_source):
            d["source"] = None if self.source is None else self.source.to_dict()
        d["shapes"] = list(self.shapes)
        if not (leaf and self.primitive in (None, self.label)):
            d["primitive"] = self.primitive
        if not leaf:
            d["n_eqns"] = self.n_eqns
            d["collapsed"] = self.collapsed
        if self.repeats:
            d["repeats"] = self.repeats
        if self.blocks:
            d["blocks"] = list(self.blocks)
        if self.reads:
            d["reads"] = list(self.reads)
            d["read_at"] = list(self.read_at)
        if self.port_names:
            d["port_names"] = dict(self.port_names)
        if self.static_inputs:
            d["static_inputs"] = dict(self.static_inputs)
        if self.var_type:
            d["var_type"] = self.var_type
        return d


@dataclass(frozen=True)
class Edge:
    """A data dependency between two nodes with the same parent.

    `ends`: the (producer, reader) pairs of the deepest nodes whose values this edge
    stands for, when it was lifted from inside a stage (`stem -> block` holds `stem`'s
    `add` -> `block`'s `conv1` and its residual `add`): an opened stage draws them.
    Empty when the edge joins its endpoints themselves, and for the values of the
    "parameters" (every module reads its own weights: the node's `reads` say which).
    """

    source: str
    target: str
    shape: tuple[int, ...]
    dtype: str
    ends: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "source": self.source,
            "target": self.target,
            "shape": list(self.shape),
            "dtype": self.dtype,
        }
        if self.ends:
            d["ends"] = [list(pair) for pair in self.ends]
        return d


#: One step down into a nested jaxpr: (index of the eqn in the enclosing jaxpr,
#: name of the eqn param holding the sub-jaxpr, index within a tuple param or None).
Step = tuple[int, str, "int | None"]


@dataclass(frozen=True)
class ProbePoint:
    """Where a stage's (or an equation's) values live in the program.

    `path` leads from the top-level jaxpr to the jaxpr holding the values;
    in that jaxpr, `values` are (eqn index, output index) pairs, and `at` is the
    index of the equation after which all of them exist (the largest eqn index):
    `instrument` sows them there, under the name `node` (the node id).
    """

    node: str
    path: tuple[Step, ...]
    at: int
    values: tuple[tuple[int, int], ...]
    shapes: tuple[str, ...]
    kind: str  # kind of `node`
    #: names of the values (a Tesseract's output fields): sown as a dict of them
    names: tuple[str, ...] = ()
    #: each value sown right after the equation that makes it, a sow of its own
    #: (`part_name`): the stage reads one of them after making it, and a sow at `at`
    #: would see only the cotangent of the reads after `at`
    apart: bool = False
    #: "lax.map:chunks" / "lax.map:rest": sown inside a batched `lax.map`'s scan, or in
    #: its remainder under its twin's name (`graph.batched_map`), for the capture to join
    #: as one row per element; "" otherwise
    mapped: str = ""
    #: `values` are (`at`, operand position) pairs: operands of equation `at`, sown
    #: right before it and read on by it alone, under `operands_name(node)`. A
    #: Tesseract's input fields are so probed: the cotangent of such a sown copy is what
    #: the Tesseract's own VJP hands back for the field, not the total gradient of a
    #: value the program reads elsewhere too (`x` also feeding a regulariser).
    operands: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = {
            "node": self.node,
            "path": [list(s) for s in self.path],
            "at": self.at,
            "values": [list(v) for v in self.values],
            "shapes": list(self.shapes),
            "kind": self.kind,
        }
        if self.names:
            d["names"] = list(self.names)
        if self.apart:
            d["apart"] = True
        if self.operands:
            d["operands"] = True
        return d

    def parts(self) -> tuple[ProbePoint, ...]:
        """The points `instrument` sows: this one, or with `apart` one per value, each
        after its own equation and named `part_name(node, k)`."""
        if not self.apart:
            return (self,)
        return tuple(
            ProbePoint(
                part_name(self.node, k),
                self.path,
                i,
                ((i, j),),
                (shape,),
                self.kind,
                mapped=self.mapped,
            )
            for k, ((i, j), shape) in enumerate(zip(self.values, self.shapes, strict=True))
        )


#: Between a node id and a value's position in the sow name of a point sown `apart`.
_PART = "\x00"


def part_name(node: str, k: int) -> str:
    """The sow name of value `k` of a point of `node` sown `apart`."""
    return f"{node}{_PART}{k}"


#: Ends the sow name of a stage's operands (`ProbePoint.operands`): `n5\x01operands`.
_OPERANDS = "\x01operands"
#: Ends the name of each operand a Tesseract's stage probes (`['x (input)']`): its
#: outputs are `['y']`, so an input and an output of one name stay apart.
INPUT = " (input)"


def operands_name(node: str) -> str:
    """The sow name of the operands of `node` (a point with `ProbePoint.operands`)."""
    return node + _OPERANDS


def operands_of(name: str) -> str | None:
    """The node whose operands sow `name` holds (`operands_name`), else None."""
    return name[: -len(_OPERANDS)] if name.endswith(_OPERANDS) else None


def part_of(name: str) -> tuple[str, int | None]:
    """The node and value position a stage probe's sow name says (`part_name`), the
    position None for a point sown whole (or its operands, `operands_name`)."""
    node = operands_of(name)
    if node is not None:
        return node, None
    node, sep, k = name.partition(_PART)
    return (node, int(k)) if sep else (node, None)


@dataclass(frozen=True)
class Note:
    """Something the graph cannot show or probe, and why."""

    level: Literal["info", "warning"]
    node: str
    message: str
    #: it says what differentiation hides (a custom rule's body): a model of mode
    #: "primal", where nothing is differentiated, leaves it out
    derivatives: bool = False

    def to_dict(self) -> dict[str, Any]:
        # `probe` is the model's field name: a stage probe is named by its node id.
        return {"level": self.level, "probe": self.node, "message": self.message}


@dataclass(frozen=True)
class StageGraph:
    """Nodes in program order (parents first), edges, probe points and notes."""

    title: str
    root: str
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    probe_points: tuple[ProbePoint, ...]
    #: user sow name -> id of its first `sow` node
    sow_nodes: dict[str, str] = field(default_factory=dict)
    #: user sow name -> ids of every `sow` node with that name, in program order
    sow_nodes_all: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: a `sow` node's id -> the number of the `sow` call it belongs to (its `index`; -1:
    #: none known). A sow under a `jax.grad` that `fn` takes is drawn twice, in the
    #: forward pass and in the backward one, as one call: the capture numbers a name's
    #: calls (`name_0`, `name_1`), not its nodes. Not saved with a model.
    sow_calls: dict[str, int] = field(default_factory=dict)
    notes: tuple[Note, ...] = ()
    #: equations (and calls) computed from literals alone, whatever the inputs: a
    #: non-finite value there is a library's fill value (`jnp.var`'s `nan`)
    constant_nodes: frozenset[str] = frozenset()
    #: an input's id -> the nodes whose equations read it (the edges leave from its
    #: group): which gradients a backward NaN origin can reach. Not saved with a model.
    input_readers: dict[str, frozenset[str]] = field(default_factory=dict)
    #: the stages of calls of a model's root module (`Net`), where the module paths as
    #: Python reaches them start (`model.layers[0]`: `Inspection.probe`). Not saved with
    #: a model.
    module_roots: frozenset[str] = frozenset()
    #: points sown only where cotangents are computed (modes grad and vjp), each of a
    #: stage's operands (`ProbePoint.operands`): a Tesseract's input fields, whose
    #: cotangent there is the Tesseract's own VJP. Not saved with a model.
    operand_points: tuple[ProbePoint, ...] = ()

    def node(self, node_id: str) -> Node:
        return self._by_id()[node_id]

    def _by_id(self) -> dict[str, Node]:
        cache = self.__dict__.get("_index")
        if cache is None:
            cache = {n.id: n for n in self.nodes}
            object.__setattr__(self, "_index", cache)
        return cache

    def children(self, node_id: str | None) -> list[Node]:
        return [n for n in self.nodes if n.parent == node_id]

    def collectives(self) -> list[tuple[str, ...]]:
        """Per node, the collectives its equations call (`_collectives`)."""
        return _collectives(self)

    def to_dict(self, *, compact: bool = False) -> dict[str, Any]:
        """`title`, `root`, `nodes`, `edges`, `notes` of the inspection model (docs/model.md).

        `compact=True` shortens `eqn`/`sow` nodes (see `Node.to_dict`); the default
        is exactly the documented shape.
        """
        if compact:
            sources = {n.id: n.source for n in self.nodes}
            nodes = [
                n.to_dict(compact=True, parent_source=sources.get(n.parent)) for n in self.nodes
            ]
        else:
            nodes = [n.to_dict() for n in self.nodes]
        for d, calls in zip(nodes, self.collectives(), strict=True):
            if calls:
                d["collectives"] = list(calls)
        return {
            "title": self.title,
            "root": self.root,
            "nodes": nodes,
            "edges": [e.to_dict() for e in self.edges],
            "notes": [n.to_dict() for n in self.notes],
        }


def collective_call(primitive: str | None) -> str | None:
    """The `jax.lax` collective an equation of `primitive` is, by the name a user calls
    (`reduce_scatter`: `psum_scatter`), or None: it moves no data between devices."""
    if primitive is None:
        return None
    name = COLLECTIVE_CALLS.get(primitive, primitive)
    return name if name in COLLECTIVE_FUNCTIONS else None


def _collectives(self: StageGraph) -> list[tuple[str, ...]]:
    """Per node (in `nodes` order), the collectives among its equations, its stages'
    included, by first occurrence in program order: where a sharded program
    communicates, which a collapsed card hides (a line `w = all_gather(w, ...)` is a
    box `w`)."""
    found: dict[str, list[str]] = {}
    parent = {n.id: n.parent for n in self.nodes}
    for n in sorted(self.nodes, key=lambda n: n.order):
        call = collective_call(n.primitive) if n.kind == "eqn" else None
        at: str | None = n.id
        while call is not None and at is not None:
            got = found.setdefault(at, [])
            if call not in got:
                got.append(call)
            at = parent.get(at)
    return [tuple(found.get(n.id, ())) for n in self.nodes]


def sibling_labels(nodes: Sequence[Any]) -> dict[str, str]:
    """Per node id (of `Node`s, or anything with an `id`, `parent` and `label`), its label, or, for a label a sibling before it has (in program
    order), that label with the next index free among the siblings (`add#2`). The
    graph numbers repeated stages so, not equations: two `add`s of one module would
    share one path, and neither could be named."""
    taken: dict[str | None, set[str]] = {}
    for n in nodes:
        taken.setdefault(n.parent, set()).add(n.label)
    next_index: dict[tuple[str | None, str], int] = {}
    out = {}
    for n in nodes:
        key = (n.parent, n.label)
        k = next_index.get(key, 1)
        label = n.label
        if k > 1:
            while f"{n.label}#{k}" in taken[n.parent]:  # a stage `add#2` beside them
                k += 1
            label = f"{n.label}#{k}"
            taken[n.parent].add(label)
        next_index[key] = k + 1
        out[n.id] = label
    return out
