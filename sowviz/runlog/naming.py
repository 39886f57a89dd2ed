"""What TensorBoard and W&B receive from one step: tags, histograms and scalars.

Tags follow the stage graph: `<probe>/<mode>` for a histogram (the probe's name, its
pytree leaf path if any, e.g. `block_3/cotangent`), `<probe>/<mode>/l2` and
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
    """Probe id → a unique tag (name, then leaf path); spaces become underscores."""
    tags: dict[str, str] = {}
    used: set[str] = set()
    for p in (model or {}).get("probes", []):
        leaf = p.get("leaf") or ""
        tag = (str(p.get("name") or p["id"]) + (f"/{leaf}" if leaf else "")).replace(" ", "_")
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
