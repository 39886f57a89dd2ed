"""What TensorBoard and W&B receive from one step: tags, histograms and scalars.

Tags follow the stage graph: `<probe>/<mode>` for a histogram (the probe's path in
the graph, or a sow's name, and its pytree leaf path if any, e.g. `block_3/cotangent`,
`parameters/block_3/w/cotangent`), `<probe>/<mode>/l2` and
`<probe>/<mode>/nonfinite` (NaN + ±Inf count) for scalars, and `loss`. The histogram
is sowviz's own, computed on the device: its bin edges and counts, unchanged. A
library's random-number plumbing gets no tag (`Tags.left_out`); the run log keeps it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ..graph.model import sibling_labels  # the graph's paths, as `Inspection.probe` takes them


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


#: Primitives that draw random bits: the stage holding one is a sampler's core.
_DRAWS = frozenset({"random_bits", "threefry2x32", "rng_bit_generator", "rng_uniform"})


class Tags(dict[str, str]):
    """Probe id → tag (`probe_tags`), with `left_out`: the probes whose histograms and
    scalars TensorBoard and W&B do not get (`items` skips them)."""

    left_out: frozenset[str] = frozenset()


def rng_plumbing(model: dict[str, Any] | None) -> frozenset[str]:
    """The nodes of a library's random sampler, left out of TensorBoard and W&B: the
    stage that draws random bits (holds a `random_bits` equation: `jax.random.uniform`,
    which every sampler calls) and every stage inside it, when that stage is a library's
    own (its source is its parent's: the user's line that called the library, e.g.
    Flax NNX's `Dropout` > `bernoulli` > `uniform`). Their values are fresh uniform
    draws and the constant bounds that scale them (`uniform/convert_element_type/[0]`:
    the scalar 0.0): the same distribution at every step, whatever the training does,
    and a dozen tags per dropout layer. What the user's code sees of them stays tagged
    (the `Dropout` stage's output, a `jax.random.normal` the user called), and the run
    log keeps every probe. Integer and boolean values (keys, masks) get no probe."""
    nodes = {n["id"]: n for n in (model or {}).get("nodes", [])}
    root = (model or {}).get("root")
    drawing = {
        n.get("parent")
        for n in nodes.values()
        if n.get("kind") == "eqn" and n.get("primitive") in _DRAWS
    }

    def library(i: Any) -> bool:
        n, parent = nodes.get(i), nodes.get(nodes.get(i, {}).get("parent"))
        return (
            n is not None
            and i != root
            and parent is not None
            and n.get("source") is not None
            and n.get("source") == parent.get("source")
        )

    samplers = {i for i in drawing if library(i)}
    out = set()
    for i in nodes:
        cur = i
        while cur is not None and cur != root:
            if cur in samplers:
                out.add(i)
                break
            cur = nodes.get(cur, {}).get("parent")
    return frozenset(out)


def probe_tags(model: dict[str, Any] | None) -> Tags:
    """Probe id → a unique tag: a stage's path in the graph (`parameters/l0/w`,
    `TransformerLM/layers[0]/attn`; a parameter's leaf name alone says nothing when
    every layer has a `w`), a sow's name, then the leaf path if any; spaces become
    underscores.

    A path is the one `Inspection.probe` takes: a label that siblings before it share
    gets the graph's next index (`mlp/tanh#2`, the second layer's `tanh` of a Python
    loop), so the tags of a step are distinct, the same at every step, and name their
    stage. A group of repeated blocks (`layers[0–23] (×24)`) is left out of the path
    (its label changes with the depth; its blocks' labels `layers[0]` already differ),
    unless that makes two tags equal (TensorBoard would merge them): then the whole
    paths. Probes that still share a tag (two sows of one name) are numbered after the
    first: `hidden`, `hidden#2`. Every probe gets a tag; those of a library's random
    sampler are in `left_out` (`rng_plumbing`).
    """
    nodes = {n["id"]: n for n in (model or {}).get("nodes", [])}
    root = (model or {}).get("root")
    labels = sibling_labels(
        tuple(
            SimpleNamespace(id=n["id"], parent=n.get("parent"), label=str(n["label"]))
            for n in nodes.values()
        )
    )

    def path(node: Any, *, groups: bool) -> str | None:
        parts, cur = [], nodes.get(node)
        while cur is not None and cur["id"] != root:
            if groups or not cur.get("repeats"):
                parts.append(labels[cur["id"]])
            cur = nodes.get(cur.get("parent"))
        return "/".join(reversed(parts)) or None

    def tag(p: dict[str, Any], *, groups: bool) -> str:
        leaf = p.get("leaf") or ""
        name = (path(p.get("node"), groups=groups) if p.get("auto", True) else None) or (
            p.get("name") or p["id"]
        )
        return (str(name) + (f"/{leaf}" if leaf else "")).replace(" ", "_")

    probes = (model or {}).get("probes", [])
    short = [tag(p, groups=False) for p in probes]
    times = Counter(short)
    wanted = [
        t if times[t] == 1 else tag(p, groups=True) for p, t in zip(probes, short, strict=True)
    ]
    tags = Tags()
    given: set[str] = set()
    used: set[str] = set(wanted)
    for p, t in zip(probes, wanted, strict=True):
        if t in given:  # an earlier probe has it: two sows of one name
            t = _free(t, used)
            used.add(t)
        given.add(t)
        tags[p["id"]] = t
    plumbing = rng_plumbing(model)
    tags.left_out = frozenset(p["id"] for p in probes if p.get("node") in plumbing)
    return tags


def _free(tag: str, used: set[str]) -> str:
    """`tag#2`, `tag#3`, ...: the first that no probe has, in probe order, so every
    step numbers them alike."""
    k = 2
    while f"{tag}#{k}" in used:
        k += 1
    return f"{tag}#{k}"


def items(entry: dict[str, Any], tags: dict[str, str]) -> Iterator[Hist | Scalar]:
    """The histograms and scalars of one step (a Monitor history entry), but those of
    the probes `tags` leaves out (`Tags.left_out`)."""
    loss = entry.get("loss")
    if loss is not None:
        yield Scalar("loss", float(loss))
    left_out = getattr(tags, "left_out", frozenset())
    for pid, by_mode in entry.get("probes", {}).items():
        if pid in left_out:
            continue
        base = tags.get(pid, pid)
        for mode, s in by_mode.items():
            tag = f"{base}/{mode}"
            hist = s.get("hist") or {}
            edges, counts = hist.get("edges"), hist.get("counts")
            if edges and counts and len(edges) == len(counts) + 1 and sum(counts) > 0:
                yield Hist(tag, list(edges), list(counts), s)
            bad = sum(int(s.get(k) or 0) for k in ("nan", "posinf", "neginf"))
            if bad:
                # values with NaN/Inf have no norm (`jnp.linalg.norm` gives NaN or inf):
                # NaN, which TensorBoard marks, not the summary's l2 of the finite ones
                # alone (null with none, 0.0 in logs of older writers; 0 for a gradient
                # NaN wherever ReLU let it through), which the curve dipped to
                yield Scalar(f"{tag}/l2", math.nan)
            elif s.get("l2") is not None:
                yield Scalar(f"{tag}/l2", float(s["l2"]))
            yield Scalar(f"{tag}/nonfinite", float(bad))
