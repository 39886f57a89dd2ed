"""What TensorBoard and W&B receive from one step: tags, histograms and scalars.

Tags follow the stage graph: `<probe>/<mode>` for a histogram (the probe's path in
the graph, or a sow's name, and its pytree leaf path if any, e.g. `block_3/cotangent`,
`parameters/block_3/w/cotangent`), `<probe>/<mode>/l2` and
`<probe>/<mode>/nonfinite` (NaN + ±Inf count) for scalars, and `loss`. The histogram
is sowviz's own, computed on the device: its bin edges and counts, unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Hist:
    tag: str
    edges: list[float]  # bins + 1
    counts: list[int]  # bins
    summary: dict[str, Any]  # the step's summary (count, min, max, mean, std)


@dataclass(frozen=True)
class Scalar:
    tag: str
    value: float


def probe_tags(model: dict[str, Any] | None) -> dict[str, str]:
    """Probe id → a unique tag: a stage's path in the graph (`parameters/l0/w`,
    `TransformerLM/layers[0]/attn`; a parameter's leaf name alone says nothing when
    every layer has a `w`), a sow's name, then the leaf path if any; spaces become
    underscores."""
    nodes = {n["id"]: n for n in (model or {}).get("nodes", [])}
    root = (model or {}).get("root")

    def path(node: Any) -> str | None:
        labels, cur = [], nodes.get(node)
        while cur is not None and cur["id"] != root:
            if not cur.get("repeats"):  # `layers[0–23] (×24)` would change with the depth
                labels.append(str(cur["label"]))
            cur = nodes.get(cur.get("parent"))
        return "/".join(reversed(labels)) or None

    tags: dict[str, str] = {}
    used: set[str] = set()
    for p in (model or {}).get("probes", []):
        leaf = p.get("leaf") or ""
        name = (path(p.get("node")) if p.get("auto", True) else None) or p.get("name") or p["id"]
        tag = (str(name) + (f"/{leaf}" if leaf else "")).replace(" ", "_")
        if tag in used:
            tag = f"{tag}_{p['id']}"
        used.add(tag)
        tags[p["id"]] = tag
    return tags


def items(entry: dict[str, Any], tags: dict[str, str]) -> Iterator[Hist | Scalar]:
    """The histograms and scalars of one step (a Monitor history entry)."""
    loss = entry.get("loss")
    if loss is not None:
        yield Scalar("loss", float(loss))
    for pid, by_mode in entry.get("probes", {}).items():
        base = tags.get(pid, pid)
        for mode, s in by_mode.items():
            tag = f"{base}/{mode}"
            hist = s.get("hist") or {}
            edges, counts = hist.get("edges"), hist.get("counts")
            if edges and counts and len(edges) == len(counts) + 1 and sum(counts) > 0:
                yield Hist(tag, list(edges), list(counts), s)
            if s.get("l2") is not None:
                yield Scalar(f"{tag}/l2", float(s["l2"]))
            bad = sum(int(s.get(k) or 0) for k in ("nan", "posinf", "neginf"))
            yield Scalar(f"{tag}/nonfinite", float(bad))
