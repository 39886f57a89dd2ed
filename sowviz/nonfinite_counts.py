"""The re-run behind `locate`: every equation probed, only non-finite counts computed.

`locate` needs to know, per equation and mode, how many NaN, +Inf and -Inf its
values hold (per iteration inside a loop): nothing else. Full summaries (histograms,
moments) of every equation cost far more to compile, so this program captures the
same probes (the `capture="all"` graph, instrumented by `graph.instrument`) and
reduces each captured value to its counts inside one compiled program; only the
counts (a few integers per probe) and the step's result reach the host.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .capture.api import META_KEYS, SaveIntermediates

_CACHE: collections.OrderedDict[Any, Any] = collections.OrderedDict()
_MAX = 8


@dataclass(frozen=True)
class CountProbe:
    """One probed node with, per capture key, a summary holding only the counts."""

    node: str
    summaries: dict[str, dict[str, Any]]


def _counts(x: Any, stacked: bool) -> dict[str, Any]:
    if not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
        return {}
    x = jnp.abs(x) if jnp.iscomplexobj(x) else x
    out = {
        "nan": jnp.sum(jnp.isnan(x), dtype=jnp.int32),
        "posinf": jnp.sum(x == jnp.inf, dtype=jnp.int32),
        "neginf": jnp.sum(x == -jnp.inf, dtype=jnp.int32),
    }
    if stacked and x.ndim >= 1:  # axis 0 is the iteration of the outermost loop
        rows = x.reshape(x.shape[0], -1)
        out["rows"] = jnp.sum(~jnp.isfinite(rows), axis=1, dtype=jnp.int32)
    return out


def _program(traced: Any, options: Any, tag: str) -> Any:
    from .modes import transform

    fn = transform(traced.probed, traced.layout, options.mode, options.argnums)
    cap = SaveIntermediates(
        fn,
        tag=(tag, options.tag),
        duplicates=options.duplicates,
        loops=options.loops,
        summarize=None,
        strict=options.strict,
        by_tag=True,
    )
    looped = _looped(traced.graph)

    def run(dyn: list, extra: tuple) -> Any:
        result, inter = cap.run(dyn, extra)  # inlined: raw values never leave the program
        counts: dict = {}
        for t, by_name in inter.items():
            for name, entry in by_name.items():
                stacked = name in looped if t == tag else False
                for key, tree in entry.items():
                    if key in META_KEYS:
                        continue
                    leaves = [c for c in map(lambda x: _counts(x, stacked), _leaves(tree)) if c]
                    if leaves:
                        counts[(t, name, key)] = leaves
        return result, counts

    return jax.jit(run)


def _leaves(tree: Any) -> list:
    return [x for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "dtype")]


def _looped(graph: Any) -> set[str]:
    """Nodes inside a scan or while loop: their captures are stacked by iteration."""
    inside: set[str] = set()
    for n in graph.nodes:  # parents come first
        parent = graph.node(n.parent) if n.parent is not None else None
        if parent is not None and (parent.kind in ("scan", "while") or parent.id in inside):
            inside.add(n.id)
    return inside


def count_run(fn: Any, args: tuple, options: Any) -> tuple[Any, list[CountProbe], Any]:
    """Run `fn(*args)` under `options.mode` with every probe point of `options.capture`
    reduced to its non-finite counts: (result, probes, traced)."""
    from . import _program as P
    from .inspection import _sow_node

    spec, dyn = P.split(args, "locate")
    key = (fn, spec, tuple(P._aval_key(x) for x in dyn), options.program_key())
    with P._LOCK:
        hit = _CACHE.get(key)
    if hit is None:
        traced = P.Traced(fn, options, spec, args)
        hit = (traced, _program(traced, options, P.PROBE_TAG))
        with P._LOCK:
            _CACHE[key] = hit
            while len(_CACHE) > _MAX:
                _CACHE.popitem(last=False)
    traced, program = hit
    extra = (P._user_tangents(spec, dyn, options.tangents, "locate"), options.cotangents)
    result, counts = jax.device_get(program(dyn, extra))
    per_node: dict[str, dict[str, dict[str, Any]]] = {}
    for (t, name, key), leaves in counts.items():
        node = name if t == P.PROBE_TAG else _sow_node(traced.graph, name)
        if node is None:
            continue
        s = per_node.setdefault(node, {}).setdefault(key, {"nan": 0, "posinf": 0, "neginf": 0})
        for c in leaves:
            for k in ("nan", "posinf", "neginf"):
                s[k] += int(c[k])
            if "rows" in c:
                rows = np.asarray(c["rows"])
                old = s.setdefault("per_iteration", {"nonfinite": [0] * len(rows)})["nonfinite"]
                if len(old) == len(rows):
                    s["per_iteration"]["nonfinite"] = [
                        int(a + b) for a, b in zip(old, rows, strict=True)
                    ]
    probes = [CountProbe(node, sums) for node, sums in per_node.items()]
    return result, probes, traced
