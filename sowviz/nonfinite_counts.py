"""The re-run behind `locate`: every equation probed, only which kinds of non-finite
values each holds computed.

`locate` needs to know, per equation and mode, whether its values hold NaN, +Inf or
-Inf (per iteration inside a loop): nothing else, not even how many. Full summaries
(histograms, moments) of every equation cost far more to compile, so this program
captures the same probes (the `capture="all"` graph, instrumented by
`graph.instrument`) and reduces each captured value to ONE bit mask (NaN 1, +Inf 2,
-Inf 4; one `bitwise_or` reduction per value, per row inside a loop) inside one
compiled program. Counting the three kinds apart took three reductions per value,
and XLA compiles each: on the zoo's NNX LM (~490 probed values) the mask cut the
count program's first call from ~45 s to ~17 s on a 2-core CPU. Only the masks and
the step's result reach the host; the probes' summaries hold presence (0 or 1) under
the Summary's keys `nan`, `posinf`, `neginf`, which is what the rule reads; inside a
loop, `per_iteration` holds per row whether it holds any (`nonfinite`) and which
(`kinds`, the bit mask).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._global import host_tree
from .capture.api import META_KEYS, SaveIntermediates
from .graph.model import part_of

_CACHE: collections.OrderedDict[Any, Any] = collections.OrderedDict()
_MAX = 8


@dataclass(frozen=True)
class CountProbe:
    """One probed node with, per capture key, a summary holding only which kinds of
    non-finite values it has (`nan`, `posinf`, `neginf`: 0 or 1; `per_iteration`)."""

    node: str
    summaries: dict[str, dict[str, Any]]


_BITS = (("nan", 1), ("posinf", 2), ("neginf", 4))


def _inexact(x: Any) -> bool:
    return bool(jnp.issubdtype(jnp.result_type(x), jnp.inexact))


def _mask(x: Any, stacked: int) -> Any:
    """The kinds of non-finite values `x` holds as one int32 bit mask (per iteration of
    the `stacked` loops holding it: its leading axes, the outermost first, flattened to
    one axis in row-major order); None for non-float values."""
    if not _inexact(x):
        return None
    x = jnp.abs(x) if jnp.iscomplexobj(x) else x
    axes: tuple[int, ...] = tuple(range(x.ndim))
    stacked = min(stacked, x.ndim)
    if stacked:
        x = x.reshape(math.prod(x.shape[:stacked]), math.prod(x.shape[stacked:]))
        axes = (1,)
    # One max per kind, not one bitwise-or reduction: over a sharded array XLA turns the
    # reduction into an all-reduce, and its collectives (XLA:CPU's, NCCL's) have no
    # bitwise or ("Unsupported reduction computation"); max they all have.
    kinds = (jnp.isnan(x), x == jnp.inf, x == -jnp.inf)
    maxes = [lax.reduce(k.astype(jnp.int32), np.int32(0), lax.max, axes) for k in kinds]
    return maxes[0] | (maxes[1] << 1) | (maxes[2] << 2)


def _program(traced: Any, options: Any, tag: str, barriers: bool = True) -> Any:
    """The compiled count program; `barriers=False`: its captured values pass through
    no optimization barrier (`interpret.with_barriers`), so XLA fuses across them as
    it fuses the plain program."""
    from .modes import transform

    fn = transform(
        traced.probed_for(options.mode),
        traced.layout,
        options.mode,
        options.argnums,
        refs=traced.refs,
    )
    cap = SaveIntermediates(
        fn,
        tag=(tag, options.tag),
        duplicates=options.duplicates,
        loops=options.loops,
        summarize=None,
        strict=options.strict,
        by_tag=True,
        barriers=barriers,
    )
    looped = _looped(traced.graph, options.loops)
    in_while = _in_while(traced.graph)
    sizes: dict[str, Any] = {"row_bytes": 0}  # filled in when traced
    shapes: dict = sizes.setdefault("shapes", {})

    def run(dyn: list, extra: tuple) -> Any:
        # inlined: raw values never leave the program; the arguments' new state is not kept
        (result, _state), inter = cap.run(dyn, extra)
        counts: dict = {}
        row_bytes = 0
        for t, by_name in inter.items():
            for name, entry in by_name.items():
                stacked = looped.get(part_of(name)[0], 0) if t == tag else 0
                inside = t == tag and part_of(name)[0] in in_while
                if inside and "iterations" in entry:
                    counts[(t, name, "iterations")] = jnp.max(entry["iterations"])
                for key, tree in entry.items():
                    if key in META_KEYS:
                        continue
                    if inside:
                        row_bytes += sum(x.size * x.dtype.itemsize for x in _leaves(tree))
                    arrays = [x for x in _leaves(tree) if _inexact(x)]
                    site = tuple((getattr(cap, "axes", None) or {}).get((t, name), {}).get(key, ()))
                    mesh = [i for i, a in enumerate(site) if a.startswith("mesh:")]
                    if mesh and arrays:
                        # per device (the mesh axes of the shard_maps around it)
                        counts[(t, name, key, "shards")] = [
                            _mask(_first(x, mesh), len(mesh)) for x in arrays
                        ]
                        shapes[(t, name, key, "shards")] = (
                            tuple(site[i][5:] for i in mesh),
                            tuple(int(arrays[0].shape[i]) for i in mesh),
                        )
                        # the loops' axes first: inside a shard_map they follow its mesh axes
                        loops = [i for i, a in enumerate(site) if not a.startswith("mesh:")]
                        if len(loops) == stacked:
                            arrays = [_first(x, loops) for x in arrays]
                    leaves = [_mask(x, stacked) for x in arrays]
                    if leaves:
                        counts[(t, name, key)] = leaves
                        # the loops' axes, for the iteration of a flattened row
                        shapes[(t, name, key)] = [x.shape[: min(stacked, x.ndim)] for x in arrays]
        sizes["row_bytes"] = row_bytes
        return result, counts

    program = jax.jit(run)
    return program, sizes


def _first(x: Any, axes: list[int]) -> Any:
    """`x` with its `axes` moved first, in order (no copy when they are already)."""
    if axes == list(range(len(axes))):
        return x
    return jnp.moveaxis(x, axes, list(range(len(axes))))


def _in_while(graph: Any) -> set[str]:
    """Nodes inside a while loop (at any depth)."""
    out: set[str] = set()
    for n in graph.nodes:  # parents come first
        parent = graph.node(n.parent) if n.parent is not None else None
        if parent is not None and (parent.id in out or parent.kind == "while"):
            out.add(n.id)
    return out


def _leaves(tree: Any) -> list:
    return [x for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "dtype")]


def _looped(graph: Any, loops: Any) -> dict[str, int]:
    """Nodes whose captures are stacked by the iterations of the loops holding them, and
    how many such loops (their leading axes): scans, and while loops unless one keeps
    only its last iteration (`loops="last"`: a [3] vector's rows there are no
    iterations; nothing inside it counts)."""
    kinds = ("scan",) if loops == "last" else ("scan", "while")
    inside: dict[str, int] = {}
    outside: set[str] = set()  # in a while loop that keeps its last iteration
    for n in graph.nodes:  # parents come first
        parent = graph.node(n.parent) if n.parent is not None else None
        if parent is None or parent.id in outside:
            if parent is not None:
                outside.add(n.id)
            continue
        if parent.id in inside or parent.kind in kinds:
            inside[n.id] = inside.get(parent.id, 0) + (parent.kind in kinds)
        elif parent.kind == "while":
            outside.add(n.id)
    return inside


def _add_shards(per_node: dict, node: str, key: str, masks: list, mesh: tuple) -> None:
    """Record in the node's count summary under `key` which devices' values hold
    non-finite ones (`per_shard`: the mesh `axes` and their `shape`, and per device, in
    row-major order, its `kinds` bit mask), for `locate`'s message to name them."""
    names, shape = mesh
    kinds = np.zeros(math.prod(shape), np.int32)
    for m in masks:
        kinds |= np.atleast_1d(np.asarray(m, np.int32)).reshape(-1)[: kinds.size]
    s = per_node.setdefault(node, {}).setdefault(key, {"nan": 0, "posinf": 0, "neginf": 0})
    got = s.get("per_shard")
    if got is not None and got["shape"] == list(shape):
        kinds |= np.asarray(got["kinds"], np.int32)
    s["per_shard"] = {"axes": list(names), "shape": list(shape), "kinds": kinds.tolist()}


@dataclass
class CountRun:
    """What `count_run` found: the step's result, the probes, the traced program, and
    of the values captured inside while loops, the most iterations a loop ran and the
    bytes one iteration's captures take (what keeping `loops=N` iterations costs)."""

    result: Any
    probes: list[CountProbe]
    traced: Any
    while_iterations: int = 0
    while_row_bytes: int = 0


def count_run(
    fn: Any, args: tuple, options: Any, traced: Any = None, barriers: bool = True
) -> CountRun:
    """Run `fn(*args)` under `options.mode` with every probe point of `options.capture`
    reduced to its non-finite counts. `traced`: the program already traced for these
    arguments (a second run with other `loops`, or without `barriers`)."""
    from . import _program as P
    from .inspection import _sow_node
    from .modes import tangent_inputs

    spec, dyn = P.split(args, "locate")
    key = (fn, spec, tuple(P._aval_key(x) for x in dyn), options.program_key(), barriers)
    with P._LOCK:
        hit = _CACHE.get(key)
    if hit is None:
        traced = traced or P.Traced(fn, options, spec, args)
        hit = (traced, *_program(traced, options, P.PROBE_TAG, barriers))
        with P._LOCK:
            _CACHE[key] = hit
            while len(_CACHE) > _MAX:
                _CACHE.popitem(last=False)
    traced, program, sizes = hit
    user = P._user_tangents(spec, dyn, options.tangents, "locate", lambda: traced.layout)
    extra = (tangent_inputs(options.mode, user, lambda: traced.layout, dyn), options.cotangents)
    result, counts = host_tree(program(dyn, extra))
    per_node: dict[str, dict[str, dict[str, Any]]] = {}
    iterations = 0
    for (t, name, key, *shards), leaves in counts.items():
        if shards:
            node = part_of(name)[0] if t == P.PROBE_TAG else _sow_node(traced.graph, name)
            if node is not None:
                _add_shards(per_node, node, key, leaves, sizes["shapes"][(t, name, key, *shards)])
            continue
        if key == "iterations":
            iterations = max(iterations, int(leaves))
            continue
        node = part_of(name)[0] if t == P.PROBE_TAG else _sow_node(traced.graph, name)
        if node is None:
            continue
        loop_shapes = list(sizes["shapes"].get((t, name, key), ()))
        s = per_node.setdefault(node, {}).setdefault(key, {"nan": 0, "posinf": 0, "neginf": 0})
        for mask in leaves:
            rows = np.atleast_1d(np.asarray(mask))
            seen = int(np.bitwise_or.reduce(rows)) if rows.size else 0
            for k, bit in _BITS:
                s[k] = s[k] or int(bool(seen & bit))
            if np.ndim(mask) == 1:  # per iteration: whether that row holds any, and which
                shape = [int(d) for d in loop_shapes.pop(0)] if loop_shapes else [len(rows)]
                per = s.setdefault(
                    "per_iteration", {"nonfinite": [0] * len(rows), "kinds": [0] * len(rows)}
                )
                if len(per["nonfinite"]) == len(rows):
                    # the kinds by row: a loop carrying a +Inf fill from its first
                    # iteration that turns NaN at the 7th holds "NaN" first at the 7th
                    per["kinds"] = [
                        int(a) | int(b) for a, b in zip(per["kinds"], rows, strict=True)
                    ]
                    per["nonfinite"] = [int(bool(k)) for k in per["kinds"]]
                    if len(shape) > 1:
                        per["shape"] = shape
            elif loop_shapes:
                loop_shapes.pop(0)
    probes = [CountProbe(node, sums) for node, sums in per_node.items()]
    return CountRun(result, probes, traced, iterations, sizes["row_bytes"])
