"""A sowviz/1 model dict (a saved report, a run log, a test fixture) seen as the live
objects the non-finite rule reads: a graph with `nodes`, `edges`, `root`,
`sow_nodes_all`, and probes with `node` and `summaries`. `nonfinite.model_origins`
runs the same rule on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JsonSource:
    file: str
    line: int


@dataclass(frozen=True)
class JsonNode:
    id: str
    label: str
    kind: str
    parent: str | None
    order: int
    source: JsonSource | None
    primitive: str | None = None


@dataclass(frozen=True)
class JsonEdge:
    source: str
    target: str


@dataclass(frozen=True)
class JsonProbe:
    node: str
    summaries: dict


class JsonGraph:
    """The graph of a model dict: its nodes (in program order), edges and sow nodes."""

    def __init__(self, model: Mapping[str, Any]) -> None:
        def src(d: Any) -> JsonSource | None:
            return None if not d else JsonSource(d.get("file", ""), d.get("line", 0))

        self.nodes = tuple(
            JsonNode(
                n["id"],
                n["label"],
                n["kind"],
                n["parent"],
                n["order"],
                src(n.get("source")),
                # a compact model leaves out an equation's primitive when it is its label
                n.get("primitive", n["label"] if n["kind"] == "eqn" else None),
            )
            for n in model["nodes"]
        )
        self.edges = tuple(JsonEdge(e["source"], e["target"]) for e in model.get("edges", ()))
        self.root = model.get("root")
        self.sow_nodes_all: dict[str, tuple[str, ...]] = {}
        for n in self.nodes:
            if n.kind == "sow":
                self.sow_nodes_all[n.label] = (*self.sow_nodes_all.get(n.label, ()), n.id)


def json_probes(model: Mapping[str, Any]) -> list[JsonProbe]:
    """The probes of a model dict (node and summaries per capture key)."""
    return [JsonProbe(p["node"], p.get("summaries") or {}) for p in model.get("probes", ())]
