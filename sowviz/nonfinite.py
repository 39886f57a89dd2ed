"""Where non-finite values (NaN/Inf) are born: one rule, used by the Monitor and `inspect`.

The front end and the report display what this module computes; they never
recompute it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NonFinite:
    step: int
    forward: str | None  # node id: first stage in program order with a non-finite primal/tangent
    backward: str | None  # node id: last stage in program order with a non-finite cotangent

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "forward": self.forward, "backward": self.backward}


def origin(probes, graph) -> tuple[str | None, str | None] | None:
    """Where non-finite values first appear: nodes compare by `exit`, the largest
    program order in their subtree (a stage's output exists once its last child ran).
    Forward: the smallest exit wins, the deeper node on a tie; backward (it runs in
    reverse): the largest exit wins, the shallower on a tie."""
    fwd = {
        p.node
        for p in probes
        if any(is_bad(s) for m, s in p.summaries.items() if "cotangent" not in m)
    }
    bwd = {
        p.node for p in probes if any(is_bad(s) for m, s in p.summaries.items() if "cotangent" in m)
    }
    if not fwd and not bwd:
        return None
    key = exit_depth(graph)
    first = min(fwd, key=key.__getitem__) if fwd else None
    last = max(bwd, key=key.__getitem__) if bwd else None
    return first, last


def exit_depth(graph) -> dict[str, tuple[int, int]]:
    """Per node: (largest order in its subtree, -depth)."""
    depth: dict[str, int] = {}
    exit_: dict[str, int] = {}
    for n in graph.nodes:  # parents come before children
        depth[n.id] = 0 if n.parent is None else depth[n.parent] + 1
        exit_[n.id] = n.order
    for n in reversed(graph.nodes):
        if n.parent is not None:
            exit_[n.parent] = max(exit_[n.parent], exit_[n.id])
    return {i: (exit_[i], -depth[i]) for i in depth}


def is_bad(s: dict[str, Any]) -> bool:
    """Whether a summary counts any NaN, +Inf or -Inf."""
    return bool(s.get("nan") or s.get("posinf") or s.get("neginf"))


def message(graph, step: int, where: tuple[str | None, str | None]) -> str:
    """The sentence `NonFiniteError` carries: the stages where NaN/Inf first appeared."""
    parts = []
    for label, node in (("forward pass", where[0]), ("backward pass", where[1])):
        if node is not None:
            n = graph.node(node)
            at = f" at {n.source}" if n.source else ""
            parts.append(f"{label}: first in stage {n.label!r} ({n.kind}, {node}){at}")
    return f"non-finite values at step {step}; " + "; ".join(parts)
