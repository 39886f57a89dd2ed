"""`inspect()`: trace → stage graph → probes → mode → capture → model.

The one-way flow of the product, in one place:

1. `_program` traces the user's (undifferentiated) `fn` at its array leaves
   (everything else is static), once per argument structure and shapes;
2. `graph.build_graph` turns the jaxpr into stages and picks probe points;
3. `graph.instrument` re-runs the program with a `sow` at every probe point;
4. `modes.transform` differentiates that instrumented function (grad, jvp, ...);
5. `save_intermediates(..., summarize=...)` captures every probe and user sow,
   with statistics computed inside the same compiled (and cached) program;
6. `Inspection` joins summaries to nodes: the typed model every view draws.

Nothing here imports a view: `save_html` goes through the writer the report
registers in `_model`.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Any

import jax
import numpy as np

from . import _compat, _model
from ._gc import gc_paused
from ._liveness import Cut, stopped_values
from ._model import KEY_ORDER, SCHEMA, Mode
from ._program import PROBE_TAG, Out, Traced, runner_for
from ._runtime_errors import library_errors
from .capture.api import META_KEYS, nest
from .graph.model import INPUT, StageGraph, operands_of, part_of, sibling_labels
from .graph.names import key_path_label, short_path, sows_named_as_captured
from .graph.saved import NEW
from .modes import check_argnums
from .nonfinite_expect import check_expected
from .options import Capture, InspectOptions
from .primitives import spec_of
from .summary import Summary
from .summary_data import SummaryRow

_KEEP = object()  # `created=_KEEP`: keep the inspection's own timestamp


@dataclass(frozen=True)
class Probe:
    """One captured array: where it is drawn and its summary per capture key.

    `summaries` is the JSON of each summary (`Summary.to_json`), made when first read
    and kept: a 10,000-equation program has 30,000 summaries, a third of a second of
    Python objects to build and to collect, that a script reading a few probes (or
    none: `ins.result`) never needs. `typed_summaries` holds what it is made from."""

    id: str
    name: str
    leaf: str
    node: str
    auto: bool
    #: per capture key: a `Summary`, or a `SummaryRow` (a row of a stacked one)
    typed_summaries: dict[str, Summary | SummaryRow]
    #: why a stage probe has no cotangent in a mode that computes them
    #: (`no_cotangent_reasons`): `"unreached"`, `"independent"`, `"stopped"` or
    #: `"custom_rule"`; None otherwise
    no_cotangent: str | None = None
    #: for `"stopped"`: the equation that cut its tangent, `{"primitive": "stop_gradient",
    #: "source": {"file", "line", "function"} or None}`
    stopped_by: dict[str, Any] | None = None
    #: for `"custom_rule"`: the custom derivative rule around the value, `{"kind":
    #: "custom_vjp" | "custom_jvp", "function", "source": {"file", "line"} or None}`
    custom_rule: dict[str, Any] | None = None
    #: per capture key, the leading axes of its summary's `shape` that enclosing
    #: constructs added (`Site.axes`: ``"mesh:<axis>"`` for a `shard_map`'s mesh axis,
    #: ``"scan"``/``"while"`` for a loop's iterations), outermost first; None: none
    axes: dict[str, tuple[str, ...]] | None = None

    @cached_property
    def summaries(self) -> dict[str, dict[str, Any]]:
        """Per capture key, the summary's JSON (docs/model.md, "summaries")."""
        return {k: s.to_json() for k, s in self.typed_summaries.items()}

    def to_dict(self) -> dict[str, Any]:
        d = {
            "id": self.id,
            "name": self.name,
            "leaf": self.leaf,
            "node": self.node,
            "auto": self.auto,
            "summaries": self.summaries,
        }
        if self.no_cotangent is not None:
            d["no_cotangent"] = self.no_cotangent
        if self.stopped_by is not None:
            d["stopped_by"] = self.stopped_by
        if self.custom_rule is not None:
            d["custom_rule"] = self.custom_rule
        if self.axes:
            d["axes"] = {k: list(v) for k, v in self.axes.items()}
        return d


def join_probes(
    traced: Traced, summaries: dict, options: InspectOptions
) -> tuple[list[Probe], list[Any]]:
    """Join host summaries (`{tag: {name: {mode: tree of Summary}}}`) to graph nodes."""
    graph = traced.graph
    found: list[_Found] = []
    notes: list[Any] = []
    untaken: set[str] = set()
    stacked: dict[tuple[str, str], dict] = {}  # (node, name) -> mode -> `Site.axes`
    entries = dict(summaries.get(PROBE_TAG, {}))
    # a Tesseract's input fields (`ProbePoint.operands`): more leaves of its stage
    for name in [n for n in entries if operands_of(n) is not None]:
        entry, node = entries.pop(name), operands_of(name)
        taken = entry.get("taken")
        if node in graph._by_id() and (taken is None or np.any(np.asarray(taken))):
            found += _probes_of(graph.node(node).label, node, entry, True)
    for node, entry in _whole_points(graph, entries).items():
        taken = entry.get("taken")
        if taken is not None and not np.any(np.asarray(taken)):
            untaken.add(node)  # its zeros are no values: it did not run
            continue
        found += _probes_of(graph.node(node).label, node, entry, True)
        if "axes" in entry:
            stacked[(node, graph.node(node).label)] = entry["axes"]
    notes += _untaken_notes(graph, untaken)
    for name, entry in summaries.get(options.tag, {}).items():
        node = _sow_node(graph, name)
        if node is None:
            notes.append(_undrawn_sow_note(traced, name))
            continue
        if "axes" in entry:
            stacked[(node, name)] = entry["axes"]
        for inner, part in _by_inner_role(entry, Mode(options.mode)):
            leaf = f"['inner {inner}']" if inner != "primal" else ""
            found += [
                (n, leaf + lf, nd, a, s) for n, lf, nd, a, s in _probes_of(name, node, part, False)
            ]
    reached = {f[2] for f in found if not f[3]}
    # a name captured whole though sown at several nodes: one probe holds them all
    # (`duplicates="stack"`, a `cond`'s branches), drawn on the first
    whole = set(summaries.get(options.tag, {}))
    mode = Mode(options.mode)
    own = _own_sow(getattr(traced, "own_sows", frozenset()))
    for name, nodes in graph.sow_nodes_all.items():
        if name in whole and len(nodes) > 1 and reached.intersection(nodes):
            continue
        for node in nodes:
            if node in reached or _same_call(graph, node, reached) or own(name):
                continue
            if not _rows_joined(graph, nodes, node, reached):
                where = graph.node(node).source
                notes.append(
                    f"sow {name!r}{f' at {where}' if where else ''} was not reached under "
                    f"mode {mode.value!r}: a custom_jvp/custom_vjp rule replaced the "
                    "code around it (its rule does not call the function), so nothing "
                    "flowed through it. Sow the custom function's output instead."
                )
    order = {n.id: n.order for n in graph.nodes}
    # (a stage's state writes after what its call returns: the panel opens on its first)
    found.sort(
        key=lambda f: (
            order.get(f[2], 0),
            not f[3],
            f[0],
            _written(f[1]) or _an_input(f[1]),
            _leaf_key(f[1]),
        )
    )
    why = no_cotangent_reasons(traced, found, mode, options.argnums)
    probes = [
        Probe(
            f"p{i}",
            *f,
            *why.get((f[2], f[1]), (None, None, None)),
            axes=_axes_of(f, stacked.get((f[2], f[0]))),
        )
        for i, f in enumerate(found)
    ]
    for p in probes:
        missing = [m for m in mode.keys if not _has_role(p.typed_summaries, m)]
        if missing and not p.auto and not own(p.name) and p.stopped_by is not None:
            notes.append(
                f"{p.name}{p.leaf}: no {', '.join(missing)} — {stopped_text(p.stopped_by)}: "
                "the value depends on the differentiated inputs; its cotangent is cut "
                "by design."
            )
        elif missing and not p.auto and not own(p.name) and p.custom_rule is not None:
            notes.append(
                f"{p.name}{p.leaf}: no {', '.join(missing)} — {custom_rule_text(p.custom_rule)}."
            )
        elif missing and not p.auto and not own(p.name):
            notes.append(
                f"{p.name}{p.leaf}: no {', '.join(missing)} — the value does not depend on "
                "the differentiated inputs, or a custom derivative rule replaced the code "
                "that computes it."
            )
    return probes, notes


def _axes_of(found: _Found, per_mode: dict | None) -> dict[str, tuple[str, ...]] | None:
    """A probe's `Probe.axes`: its entry's stacking axes (`Regroup.axes`) per capture
    key it shows, where they lead its summary's shape (keys renamed for an inner role
    do not match, and keep none)."""
    if not per_mode:
        return None
    out = {}
    for key, s in found[4].items():
        axes = tuple(per_mode.get(key, ()))
        if axes and len(getattr(s, "shape", ())) >= len(axes):
            out[key] = axes
    return out or None


def _has_role(summaries: dict, role: str) -> bool:
    """Whether capture keys hold the mode's `role` ("cotangent"): as a key, or as the
    last part of one. A sow under differentiation `fn` takes itself (an HVP's
    `jax.jvp(jax.grad(f))`) keeps its inner levels in its keys, innermost first, so
    its value's outer gradient is `primal.cotangent` (and its tangent's
    `tangent.cotangent`); the note said it had no cotangent, that it did not depend
    on the differentiated inputs, for a value the loss reads."""
    return any(k == role or k.endswith(f".{role}") for k in summaries)


def no_cotangent_reasons(
    traced: Traced, found: Sequence[_Found], mode: Mode, argnums: Any = None
) -> dict:
    """Why each stage probe of `found` that has no cotangent in `mode` has none, by
    (node, leaf), as `(reason, stopped_by, custom_rule)`: `"unreached"`, its value does not reach the
    differentiated output (an aux the loss never reads: its gradient is zero, and it is
    probed beside the data flow, `Traced.probed_for`); `"stopped"`, it does, and it
    depends on the differentiated arguments (`argnums`) through the primal data flow,
    but an equation of zero derivative cut every path (`jax.lax.stop_gradient` around a
    TD target; `stopped_by` names it, `_liveness.stopped_values`); `"custom_rule"`, it
    is computed inside a `jax.custom_vjp`/`custom_jvp` function, whose derivative is its
    rule's, not this code's (`custom_rule` names the function: diffrax's vector field
    inside Equinox's checkpointed `while`); or `"independent"` (no tangent reaches it:
    it does not depend on the differentiated arguments). The panel said the latter of
    all: a Flax Linen encoder's sown outputs, which depend on every parameter, read as
    detached, so did a `stop_gradient`'ed target of the critic, and so did a neural
    ODE's vector field, which every gradient flows through."""
    if "cotangent" not in mode.keys:
        return {}
    lacking = {(f[2], f[1]) for f in found if f[3] and "cotangent" not in f[4]}
    live = traced.live if lacking else None
    if live is None:  # (none lacks one, or a program of mutable references: not known)
        return {}
    points = {p.node: p for p in traced.graph.probe_points}
    levels: dict[tuple, Any] = {}
    stopped: dict | None = None
    out = {}
    for node, leaf in lacking:
        p = points.get(node)
        leaves = _point_leaves(p) if p is not None else []
        if leaf not in leaves:
            continue
        i, k = p.values[leaves.index(leaf)]
        if p.path not in levels:
            levels[p.path] = _level(traced.closed, p.path)
        j = levels[p.path]
        made = j.invars if i == -1 else j.eqns[i].outvars
        if made[k] not in live.get(p.path, ()):
            out[(node, leaf)] = ("unreached", None, None)
            continue
        rule = _custom_rule(traced.closed, p.path)
        if rule is not None:
            out[(node, leaf)] = ("custom_rule", None, rule)
            continue
        if stopped is None:
            stopped = _stopped(traced, mode, argnums)
        cut = stopped.get(p.path, {}).get(made[k])
        out[(node, leaf)] = (
            ("independent", None, None) if cut is None else ("stopped", _cut_dict(cut), None)
        )
    return out


def _custom_rule(closed: Any, path: tuple) -> dict[str, Any] | None:
    """The outermost custom derivative call on a probe point's `path`, as the model's
    `custom_rule` (docs/model.md); None when the point is in no custom function's body.
    (The outermost: its rule is the one the gradient of the whole program takes.)"""
    j = _compat.jaxpr_and_consts(closed)[0]
    for i, param, index in path:
        eqn = j.eqns[i]
        rule = _compat.custom_rule_of(eqn)
        if rule is not None:
            kind, fn, file, line = rule
            source = None if file is None else {"file": short_path(file), "line": line}
            return {"kind": kind, "function": fn, "source": source}
        val = eqn.params[param]
        j = _compat.jaxpr_and_consts(val if index is None else val[index])[0]
    return None


def custom_rule_text(rule: dict[str, Any]) -> str:
    """`computed inside the `jax.custom_vjp` function `fn_wrapped` (equinox/_ad.py:1001):
    its gradient is the rule's, not this code's`: a `custom_rule`'s words."""
    fn = rule.get("function")
    src = rule.get("source")
    where = f" ({src['file']}:{src['line']})" if src else ""
    what = f"the `jax.{rule['kind']}` function" + (f" `{fn}`{where}" if fn else where)
    return f"computed inside {what}: its gradient is that rule's, not this code's"


def _stopped(traced: Traced, mode: Mode, argnums: Any) -> dict:
    """`_liveness.stopped_values` from the inputs `mode` differentiates (`modes.transform`:
    argument 0 by default in grad, every floating leaf otherwise, `argnums` if given)."""
    layout = traced.layout
    pos = set(layout.floating)
    if mode is Mode.GRAD:
        nums = set(check_argnums(0 if argnums is None else argnums, layout.n_args))
        pos = {j for j in pos if layout.arg_of[j] in nums}
    n = len(_compat.jaxpr_and_consts(traced.closed)[0].invars)
    return stopped_values(traced.closed, [j in pos for j in range(n)]) or {}


def _cut_dict(cut: Cut) -> dict[str, Any]:
    """A `_liveness.Cut` as the model's `stopped_by` (docs/model.md)."""
    loc = _compat.user_location_outside_libraries(cut.eqn)
    source = None if loc is None else replace(loc, file=short_path(loc.file)).to_dict()
    return {"primitive": cut.name, "source": source}


def stopped_text(stopped_by: dict[str, Any]) -> str:
    """`gradient stopped by `jax.lax.stop_gradient` at dqn.py:17`: a `stopped_by`'s words."""
    name = stopped_by["primitive"]
    what = "`jax.lax.stop_gradient`" if name == "stop_gradient" else f"`{name}`"
    src = stopped_by.get("source")
    return f"gradient stopped by {what}" + (f" at {src['file']}:{src['line']}" if src else "")


def _point_leaves(p: Any) -> list[str]:
    """The leaf paths of a probe point's values, in order, as its probes name them: a
    bare array's `""`, a list's `[k]`, a dict's `['name']` (`graph.instrument`'s sow;
    `_whole_points` for a point sown `apart`)."""
    if p.names:
        return [jax.tree_util.keystr((jax.tree_util.DictKey(n),)) for n in p.names]
    return [""] if len(p.values) == 1 else [f"[{k}]" for k in range(len(p.values))]


def _level(closed: Any, path: tuple) -> Any:
    """The jaxpr a probe point's `path` leads to."""
    j = _compat.jaxpr_and_consts(closed)[0]
    for i, param, index in path:
        val = j.eqns[i].params[param]
        j = _compat.jaxpr_and_consts(val if index is None else val[index])[0]
    return j


def _own_sow(names: frozenset[str]) -> Callable[[str], bool]:
    """Whether a sow's name (`log|J| (tau)`, or a call of it: `log|J| (tau)_1`) is one
    of sowviz's own captures (`Traced.own_sows`), which the user wrote no `sow` for."""

    def own(name: str) -> bool:
        base, _, idx = name.rpartition("_")
        return name in names or (idx.isdigit() and base in names)

    return own


def _written(leaf: str) -> bool:
    """Whether a stage's output `leaf` is the new value of a module's variable, which
    its call wrote and does not return (a BatchNorm's `['mean (new)']`, `saved.NEW`)."""
    return leaf.endswith(f"{NEW}']")


def _an_input(leaf: str) -> bool:
    """Whether a stage's `leaf` is one of its inputs (a Tesseract's `['x (input)']`,
    `ProbePoint.operands`): listed after what the stage makes, which its panel opens on."""
    return leaf.endswith(f"{INPUT}']")


def _natural(leaf: str) -> tuple:
    """A leaf path's sort key with its numbers as numbers: `[2]` before `[10]` (a while
    loop's carry of 17 leaves was listed `[0]`, `[10]`, `[11]`, …, `[1]`)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", leaf))


#: `_natural`, kept per leaf path: a Monitor joins the same leaves every step (a third
#: of `join_probes`' time was their `re.split`).
_leaf_key = lru_cache(maxsize=1 << 14)(_natural)


_UNTAKEN = (
    "`{label}` is in a branch of a `cond` that did not run in this call: it has no values "
    "(the stages inside neither)."
)
_UNTAKEN_BRANCH = "`{label}` of `{cond}` did not run in this call: its {stages} {have} no values."
#: How many of an untaken branch's stages its note names before "and N more".
_UNTAKEN_NAMED = 3


def _untaken_notes(graph: StageGraph, untaken: set[str]) -> list[tuple[str, str]]:
    """One note per `cond` branch that did not run, on the branch, naming its stages
    (optax's line search: 14 notes, one per stage of two branches, became 2). A stage
    outside any branch (none is known) keeps a note of its own."""
    innermost = {n: _branch_of(graph, n) for n in untaken}
    down = set(innermost.values()) - {None}
    by_branch: dict[str | None, list[str]] = {}
    for node in sorted(untaken, key=lambda n: graph.node(n).order):
        branch = innermost[node]
        # a branch inside a branch that did not run is said with the outer one
        at = branch
        while at is not None:
            if at in down:
                branch = at
            at = _branch_of(graph, at)
        by_branch.setdefault(branch, []).append(node)
    notes = []
    for branch, nodes in by_branch.items():
        outer = [n for n in nodes if not _inside(graph, n, untaken)]
        if branch is None:
            notes += [(n, _UNTAKEN.format(label=graph.node(n).label)) for n in outer]
            continue
        labels = [f"`{graph.node(n).label}`" for n in outer]
        named = ", ".join(labels[:_UNTAKEN_NAMED])
        if len(labels) > _UNTAKEN_NAMED:
            named += f" and {len(labels) - _UNTAKEN_NAMED} more"
        stages = f"stage {named}" if len(labels) == 1 else f"{len(labels)} stages ({named})"
        node = graph.node(branch)
        cond = graph.node(node.parent).label if node.parent else "cond"
        have = "has" if len(labels) == 1 else "have"
        notes.append(
            (branch, _UNTAKEN_BRANCH.format(label=node.label, cond=cond, stages=stages, have=have))
        )
    return notes


def _branch_of(graph: StageGraph, node: str) -> str | None:
    """The `cond` branch scope `node` is in, the innermost (None: none)."""
    at = graph.node(node).parent
    while at is not None:
        parent = graph.node(at).parent
        if parent is not None and graph.node(parent).kind == "cond":
            return at
        at = parent
    return None


def _inside(graph: StageGraph, node: str, among: set[str]) -> bool:
    """Whether a node around `node` is one of `among` (then its note says it)."""
    at = graph.node(node).parent
    while at is not None:
        if at in among:
            return True
        at = graph.node(at).parent
    return False


def _whole_points(graph: StageGraph, entries: dict[str, dict]) -> dict[str, dict]:
    """The stage probes' entries by node: the values of a point sown `apart` (one sow
    each, `part_name`) put back together, keyed as one sow of them all would be (by
    position, or by the point's `names`)."""
    out: dict[str, dict] = {}
    points = None
    for name, entry in entries.items():
        node, k = part_of(name)
        if k is None:
            out[name] = entry
            continue
        if points is None:
            points = {p.node: p for p in graph.probe_points}
        names = points[node].names if node in points else ()
        key = names[k] if names else k
        whole = out.setdefault(node, {})
        for mode, tree in entry.items():
            if mode in META_KEYS:
                whole.setdefault(mode, tree)
            else:
                whole.setdefault(mode, {})[key] = tree
    return out


def _rows_joined(graph: StageGraph, nodes: tuple[str, ...], node: str, reached: set) -> bool:
    """Whether unreached sow `node` is a call of one `sow` line whose values another of
    `nodes` holds: `lax.map(f, xs, batch_size=B)` calls `f` for its chunks and again for
    the remainder, and the capture joins the two as one row per element
    (`capture.mapped`), which the chunks' node shows."""
    src = graph.node(node).source
    return src is not None and any(
        n != node and n in reached and graph.node(n).source == src for n in nodes
    )


def _undrawn_sow_note(traced: Traced, name: str) -> str:
    """The note for sow `name`, captured but with no node: where it is and why not
    drawn. A JAX >= 0.12 `lax.custom_root` is one box whose solver the graph does not
    open; "no node in the primal program" said neither that nor where the values are."""
    base, _, idx = name.rpartition("_")  # (`dup_1`: the second sow named `dup`)
    holder = _undrawn_holder(traced.closed.jaxpr, *((name, base) if idx.isdigit() else (name,)))
    if holder is None:
        return (
            f"sow {name!r} was captured, but the program's graph has no node for it, so it "
            "is not drawn. `sowviz.save_intermediates` returns its values."
        )
    return (
        f"sow {name!r} is inside `{holder}`, which the graph draws as one box without "
        "opening the programs it holds (a solver's loop), so the sow has no node and is "
        "not drawn. Its values are still captured: `sowviz.save_intermediates` returns "
        "them."
    )


def _undrawn_holder(jaxpr: Any, *names: str) -> str | None:
    """The primitive (as `_compat.primitive_label` names it) of the equation holding a
    sow of one of `names` in a sub-program the graph does not draw, or None."""
    for eqn in jaxpr.eqns:
        spec = spec_of(eqn.primitive.name)
        drawn = {b.param for b in spec.bodies} if spec is not None else set()
        for param, _, sub in _compat.sub_jaxprs(eqn):
            if not _holds_sow(sub, names):
                continue
            if param not in drawn:
                return _compat.primitive_label(eqn)
            inner = _undrawn_holder(sub, *names)
            if inner is not None:
                return inner
    return None


def _holds_sow(jaxpr: Any, names: Sequence[str]) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _compat.SOW_NAMES and eqn.params.get("name") in names:
            return True
        if any(_holds_sow(sub, names) for _, _, sub in _compat.sub_jaxprs(eqn)):
            return True
    return False


def _sow_node(graph: StageGraph, name: str) -> str | None:
    if name in graph.sow_nodes:
        return graph.sow_nodes[name]
    base, _, idx = name.rpartition("_")
    if idx.isdigit() and base in graph.sow_nodes_all:
        nodes = _first_of_calls(graph, graph.sow_nodes_all[base])
        return nodes[int(idx)] if int(idx) < len(nodes) else None
    return None


def _first_of_calls(graph: StageGraph, nodes: tuple[str, ...]) -> tuple[str, ...]:
    """The first node of each `sow` call among `nodes`, in the order of the calls: the
    capture's `name_0`, `name_1`. A sow under a `jax.grad` that `fn` takes is drawn in
    the forward and the backward pass, one call: counting nodes put `name_1` (the
    function called again) on the backward pass's copy, and said the second call was
    "not reached". Sows with no call number (`tesseract_jax.sow`) count as nodes."""
    calls = [graph.sow_calls.get(n, -1) for n in nodes]
    if -1 in calls:
        return nodes
    first: dict[int, str] = {}
    for call, node in zip(calls, nodes, strict=True):
        first.setdefault(call, node)
    return tuple(first[c] for c in sorted(first))


def _same_call(graph: StageGraph, node: str, reached: set[str]) -> bool:
    """Whether sow `node` is a copy of a reached one's call (its backward pass's)."""
    call = graph.sow_calls.get(node, -1)
    return call >= 0 and any(graph.sow_calls.get(n) == call for n in reached)


#: A probe before its id: name, leaf, node, auto, typed summaries per capture key.
_Found = tuple[str, str, str, bool, dict[str, Any]]


def _is_summary(x: Any) -> bool:
    return isinstance(x, (Summary, SummaryRow))


def _by_inner_role(entry: dict, mode: Mode) -> list[tuple[str, dict]]:
    """A user's sow's capture keys as `mode` shows them: per role the value has inside
    `fn` ("primal"; "cotangent" for a sow under a `jax.grad` that `fn` takes itself),
    its keys renamed to the outer mode's (`primal.cotangent` is the sown value's
    gradient in mode grad: its `cotangent`). The value's gradient read the inner
    pass's `cotangent` (dL/dscale inside `fn`, "‖grad‖₂ = 3.92" for 1.97), and a
    primal-mode report was coloured by it."""
    outer = set(mode.keys) - {"primal"}
    keys = [k for k in entry if k not in META_KEYS]
    inner_roles = {k.split(".", 1)[0] for k in keys if "." in k} - {"primal"}
    inner_roles |= {k for k in keys if "." not in k and k != "primal" and k not in outer}
    inner_roles |= {k for k in keys if "." not in k and f"primal.{k}" in entry}
    if not inner_roles:
        return [("primal", entry)]
    parts: dict[str, dict] = {}
    for k, tree in entry.items():
        if k in META_KEYS:
            for part in ("primal", *sorted(inner_roles)):
                parts.setdefault(part, {})[k] = tree
            continue
        first, _, rest = k.partition(".")
        role, as_key = (
            (first, rest or "primal") if (rest or first in inner_roles) else ("primal", first)
        )
        parts.setdefault(role, {})[as_key] = tree
    return [(r, parts[r]) for r in ("primal", *sorted(inner_roles)) if r in parts]


def _probes_of(name: str, node: str, entry: dict, auto: bool) -> list[_Found]:
    per_leaf: dict[str, dict[str, Any]] = {}
    for key, tree in entry.items():
        if key in META_KEYS:
            continue
        if _is_summary(tree):  # one array (most stages): its leaf path is ""
            per_leaf.setdefault("", {})[key] = tree
            continue
        for path, s in jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_summary)[0]:
            if _is_summary(s):
                per_leaf.setdefault(jax.tree_util.keystr(path), {})[key] = s
    return [(name, leaf, node, auto, sums) for leaf, sums in per_leaf.items()]


def device_of(buffers: Any) -> str:
    """`platform:id (kind)` of the devices holding `buffers` (the default device if none)."""
    for b in buffers:
        devices = getattr(b, "devices", None)
        if devices is not None:
            ds = sorted(devices(), key=lambda d: d.id)
            more = f" +{len(ds) - 1} more" if len(ds) > 1 else ""
            return f"{ds[0].platform}:{ds[0].id}{more} ({ds[0].device_kind})"
    d = jax.devices()[0]
    return f"{d.platform}:{d.id} ({d.device_kind})"


@dataclass
class Inspection:
    """The result of `sowviz.inspect`: the mode's result, the stage graph, and the
    summaries of every probe. `to_dict()`/`to_json()` give the versioned model."""

    result: Any
    graph: StageGraph
    probes: list[Probe]
    mode: Mode
    device: str
    title: str
    #: every note the model shows (`to_dict()["notes"]`, the report's "notes"): the
    #: graph's (what a stage cannot show: a custom rule's body, ...; in mode "primal"
    #: none about differentiation) and then the run's. Notes given to the constructor
    #: are added to the graph's.
    notes: list[dict[str, Any]] = field(default_factory=list)
    created: str | None = field(default_factory=_model.now)
    history: dict[str, Any] | None = None
    #: where non-finite values were born (`sowviz.nonfinite.Origins`), None when all finite
    nonfinite: Any = None
    #: (fn, args, options) for `locate_nonfinite`, set by `inspect`
    _rerun: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # (the graph's notes were the model's alone: `ins.notes` was [] while the
        # report said "1 note")
        primal = Mode(self.mode) is Mode.PRIMAL
        said = [n.to_dict() for n in self.graph.notes if not (primal and n.derivatives)]
        self.notes = merged_notes([*said, *self.notes])

    @property
    def modes(self) -> list[str]:
        seen = {m for p in self.probes for m in p.typed_summaries}
        return sorted(seen, key=lambda m: (KEY_ORDER.index(m) if m in KEY_ORDER else 3, m))

    def __repr__(self) -> str:
        return (
            f"Inspection(title={self.title!r}, mode={Mode(self.mode).value!r}, "
            f"nodes={len(self.graph.nodes)}, probes={len(self.probes)}, device={self.device!r})"
        )

    def to_dict(self, *, created: Any = _KEEP) -> dict[str, Any]:
        """The sowviz/1 model (docs/model.md). `created=None` omits the timestamp (a
        byte-reproducible model), a string pins it."""
        g = self.graph.to_dict()
        with gc_paused():  # the probes' JSON, made here at first: objects by the 100,000
            probes = [p.to_dict() for p in self.probes]
        return {
            "schema": SCHEMA,
            "title": self.title,
            "mode": Mode(self.mode).value,
            "modes": self.modes,
            "device": self.device,
            "versions": {"sowviz": _model.VERSION, "jax": jax.__version__},
            "created": self.created if created is _KEEP else created,
            "root": g["root"],
            "nodes": g["nodes"],
            "edges": g["edges"],
            "probes": probes,
            "notes": copy.deepcopy(self.notes),
            "history": self.history,
            "nonfinite": None if self.nonfinite is None else self.nonfinite.to_dict(),
        }

    def to_json(self, **kwargs: Any) -> str:
        """The sowviz/1 model as JSON, the same values the widget and the report embed
        (NaN/Inf as null, float32 statistics in their shortest float32 form)."""
        return json.dumps(_model.jsonable(self.to_dict()), **kwargs)

    def locate_nonfinite(self) -> Any:
        """Re-run this inspection's step with every equation probed and name the equation
        where NaN/Inf were born (stored in `self.nonfinite` and the model); None when
        every value is finite. A re-run that finds no alarm where this run raised one
        (XLA's fusion made NaN/Inf the probed program's rounding does not) keeps this
        run's record and says so in its message. The inspection's `expect_nonfinite`
        applies: a node it names is no origin, and with `"gradients"` a step whose
        gradients alone are non-finite is skipped (`nonfinite.skipped`, no alarm), not
        located. See `sowviz.nonfinite_locate.locate`."""
        from .nonfinite_locate import locate_inspection

        return locate_inspection(self)

    def probe_path(self, probe: Probe) -> str:
        """Where `probe` sits: the labels of its enclosing stages and its own, joined by
        "/" (`parameters/conv2/weight`, `CNN/conv2: Conv2d`). A label its siblings used
        before gets the next index, as repeated stages have in the graph (`add`,
        `add#2`: two residual additions of one module), so each path is one node's."""
        labels = self._path_labels()
        parts, node = [], self.graph.node(probe.node)
        while node is not None and node.id != self.graph.root:
            parts.append(labels[node.id])
            node = self.graph.node(node.parent) if node.parent is not None else None
        return "/".join(reversed(parts))

    def _plain_path(self, probe: Probe) -> str:
        """`probe_path` without the repeat groups sowviz draws around identical blocks
        (`transformer/block_0–1 (×2)/block_0/fc` is `transformer/block_0/fc`): the path
        as Haiku, Flax and the user's code name the module."""
        labels = self._path_labels()
        parts, node = [], self.graph.node(probe.node)
        while node is not None and node.id != self.graph.root:
            if not node.repeats:
                parts.append(labels[node.id])
            node = self.graph.node(node.parent) if node.parent is not None else None
        return "/".join(reversed(parts))

    def _module_path(self, probe: Probe) -> str | None:
        """The path by which Python reaches the module whose stage holds `probe`, from its
        model (`layers[1].mlp.layers[0]` for `model.layers[1].mlp.layers[0]`;
        `teacher.encoder` for one of several models): the labels of the stages from its
        model's root stage (`StageGraph.module_roots`) down, without repeat groups and
        modules' classes. None when no model's root stage holds it."""
        graph, parts = self.graph, []
        node = graph.node(probe.node)
        while node.id not in graph.module_roots:
            if not node.repeats:
                parts.append(node.label.split(": ", 1)[0])
            if node.parent is None:
                return None
            node = graph.node(node.parent)
        head, sep, _ = node.label.partition(": ")
        if sep:  # one of several models: its argument's name (`teacher: MLP`)
            parts.append(head)
        dotted = ""
        for label in reversed(parts):
            dotted += label if not dotted or label.startswith("[") else "." + label
        return dotted

    def _path_labels(self) -> dict[str, str]:
        """`sibling_labels` of this inspection's graph, made once per graph: `probe`
        asks for the path of every probe (30,000 on a 10,000-equation program)."""
        cached = self.__dict__.get("_path_labels_of")
        if cached is None or cached[0] is not self.graph:
            cached = (self.graph, sibling_labels(self.graph.nodes))
            self.__dict__["_path_labels_of"] = cached
        return cached[1]

    def probe(self, name: str, leaf: str = "", *, input: str = "") -> Probe:
        """The probe called `name` (a sow name, a stage label, a parameter's name) with
        the output leaf `leaf` ("" for a single array, "[1]" for a stage's second
        output), or whose path (`probe_path`) is `name` or ends with "/" + `name`
        ("conv2/weight"). A module's stage answers to its name without its class too
        (`"conv1"` for `conv1: Conv2d`, `"down[1][0]/conv1"`) and to its path as Python
        reaches it (`"blocks[1].attn"`; that whole path from the model wins over the
        modules whose paths end with it), and a parameter to its name in the parameter
        table (`"down[1][0].conv1.weight"`). A stage of several outputs named without
        `leaf` is a KeyError listing its leaves (several such stages: their paths and
        leaves, and a call naming one); but a module's call that writes its variables (a
        BatchNorm's `mean (new)`) and returns one array is that array. A `sow`'s name is the user's: their sow wins over
        stages of that name (`"mean"` beside a `jnp.mean`). A name that several
        probes share is a KeyError listing their paths, never the first of them; a
        stage wins over what it holds of the same name (a scope `cholesky` over the
        `cholesky` inside it). JAX's own key paths are names too:
        `jax.tree_util.keystr(path)` of a parameter, `[1]['log_nu']`, is `[1].log_nu`;
        and so are the run log's TensorBoard tags (`CNN/conv1:_Conv2d`, spaces written
        as underscores).

        `input="x"` names the input field `x` of a Tesseract's stage (`probe("solve",
        input="x")`; a nested field by the schema's path, `input="scale.a"`), in modes
        "grad", "vjp" and "all": its `primal` is the value the call got for the field, its
        `cotangent` what the Tesseract's own VJP handed back for it, the Tesseract's
        part of the gradient, beside the total of a value the program also reads
        elsewhere (the probe of the value itself, `probe("x")`). Its leaf is
        `"['x (input)']"`. Only the schema's differentiable fields that the call gets as
        traced arrays are probed."""
        _check_probe_query(name, leaf)
        if input:
            return self._input_probe(name, leaf, input)
        try:
            return self._probe(name, leaf)
        except KeyError:
            dotted = _dotted_keys(name)
            # (a key path starts at the root: `.bias` is the model's own, not `cell.bias`)
            rooted = (f"parameters/{dotted}",) if name.startswith((".", "[")) else ()
            table = _slash_path(name)  # the table's `mlp/~/linear_0.w` is `mlp/~/linear_0/w`
            for other in dict.fromkeys((*rooted, dotted, table, name.replace(":_", ": "))):
                if other == name:
                    continue
                try:
                    return self._probe(other, leaf)
                except KeyError:
                    pass
            raise

    def _input_probe(self, name: str, leaf: str, field: str) -> Probe:
        """`probe(name, input=field)`: the stage's leaf `['<field> (input)']`."""
        if not isinstance(field, str) or leaf:
            raise TypeError(_PROBE_INPUT.format(value=field, leaf=leaf))
        want = f"['{field}{INPUT}']"
        try:
            return self.probe(name, want)
        except KeyError:
            pass
        stages = [p for p in self.probes if p.name == name and _an_input(p.leaf)]
        fields = sorted({p.leaf[2 : -len(f"{INPUT}']")] for p in stages}, key=_natural)
        if fields:
            raise KeyError(
                f"stage {name!r} has no input field {field!r} probed; it has "
                f"{', '.join(repr(f) for f in fields)} (its schema's differentiable fields "
                "that the call gets as traced arrays)."
            ) from None
        raise KeyError(
            f"no Tesseract stage {name!r} with probed inputs in mode {self.mode.value!r}: "
            "a Tesseract's input fields are probed where cotangents are computed, in modes "
            "'grad', 'vjp' and 'all' (their cotangent is the Tesseract's own VJP). Name the stage "
            "by its label (`tesseract_names=` sets it) or its path."
        ) from None

    def _probe(self, name: str, leaf: str) -> Probe:
        if leaf and not leaf.startswith(("[", ".")):  # `leaf="output"` for "['output']"
            given = {p.leaf for p in self.probes}
            leaf = next((f for f in (f"['{leaf}']", f".{leaf}") if f in given), leaf)
        same = [p for p in self.probes if p.leaf == leaf]
        paths = {p.id: self.probe_path(p) for p in same}
        # (a path without repeat groups is worked out only where the graph has some)
        grouped = any(n.repeats for n in self.graph.nodes)
        plain = {p.id: self._plain_path(p) for p in same} if grouped else paths
        found = [p for p in same if p.name == name]
        sown = [p for p in found if self.graph.node(p.node).kind == "sow"]
        if len(sown) == 1:
            # the name the user gave their `sow` is theirs, whatever the program's stages
            # are called: `probe("mean")` answered with a library's `jnp.mean` stage
            return sown[0]
        if len(found) > 1:
            # the module Python reaches by that whole path (`model.layers[0]`) wins over
            # those whose paths end with it (`model.layers[1].mlp.layers[0]`)
            found = [p for p in found if self._module_path(p) == name] or found
        if len(found) > 1:  # `cholesky` in a scope `cholesky`: the scope is the one
            inner = {
                p.id for p in found for q in found if paths[p.id].startswith(paths[q.id] + "/")
            }
            found = [p for p in found if paths[p.id] == name] or [
                p for p in found if p.id not in inner
            ]
        if not sown and not any(paths[p.id] == name for p in found):
            # the user's sow of that name, sown several times and so numbered, wins over a
            # stage of the bare name (a line `u = ...` beside `sow(u, "u")` in an RK4 `rhs`);
            # a stage's whole path stays its own
            _refuse_numbered_sows(
                name,
                [p for p in same if self.graph.node(p.node).kind == "sow"],
                [paths[p.id] for p in found],
            )
        if not found:
            found = [p for p in same if name in (paths[p.id], plain[p.id])] or [
                p for p in same if name in _path_aliases(paths[p.id], plain[p.id])
            ]
            if len(found) > 1:  # (as above: `layers[0].mlp` beside `layers[1].layers[0].mlp`)
                found = [p for p in found if self._module_path(p) == name] or found
        if found and not leaf and not any(paths[p.id] == name for p in found):
            # (a whole path is one stage's: `energy` beside `forces/energy`'s outputs)
            # A stage of several outputs with that name too: the name is not one probe's
            # (it was the single-output one, silently).
            several = {
                self.probe_path(p)
                for p in self.probes
                if p.leaf and (p.name == name or name in (self.probe_path(p), self._plain_path(p)))
            }
            several -= {paths[p.id] for p in found}
            if several:
                hits = sorted({paths[p.id] for p in found} | several)
                raise KeyError(
                    f"{len(hits)} stages are called {name!r}: "
                    f"{', '.join(repr(h) for h in hits[:8])}{', ...' if len(hits) > 8 else ''} "
                    f"({', '.join(repr(h) for h in sorted(several)[:8])} with several outputs: "
                    "pick one with `leaf=`). Name one by its path, or by the end of it that "
                    f"only it has (e.g. {_unique_end(hits[0], hits[1:])!r})."
                )
        if len(found) == 1:
            return found[0]
        if found:
            hits = [paths[p.id] for p in found]
            raise KeyError(
                f"{len(found)} probes are called {name!r}{leaf}: "
                f"{', '.join(repr(p) for p in hits[:8])}{', ...' if len(hits) > 8 else ''}. "
                "Name one by its path, or by the end of it that only it has (e.g. "
                f"{_unique_end(hits[0], [*hits[1:], name])!r})."
            )
        # the name is right but the leaf is not: a stage of several outputs
        others = [
            p
            for p in self.probes
            if p.leaf
            and p.leaf != leaf
            and (p.name == name or name in _path_aliases(self.probe_path(p), self._plain_path(p)))
        ]
        # a stage's whole path names it beside deeper stages of that name, as for one
        # output above: `chain` is optax's top-level chain, not `inject_hyperparams/chain`
        # (whose path ends with it, so no end of `chain`'s own path told them apart)
        others = [p for p in others if name in (self.probe_path(p), self._plain_path(p))] or others
        stages = sorted({self.probe_path(p) for p in others})
        if len(stages) == 1 and len(others) == 1 and not leaf:
            return others[0]  # a stage of one named output (a Tesseract's field)
        # (nor a Tesseract's inputs, `['x (input)']`: `probe("solve")` is its one output)
        results = [p for p in others if not _written(p.leaf) and not _an_input(p.leaf)]
        results = [p for p in results if self._module_path(p) == name] or results
        if not leaf and results and len({self.probe_path(p) for p in results}) == len(results):
            # A module's call that writes its variables (a BatchNorm's running statistics,
            # `mean (new)`) and returns one array: its name is that array, `bn(x)`.
            if len(results) == 1:
                return results[0]
            hits = [self.probe_path(p) for p in results]
            raise KeyError(
                f"{len(hits)} probes are called {name!r}: "
                f"{', '.join(repr(h) for h in hits[:8])}{', ...' if len(hits) > 8 else ''}. "
                "Name one by its path, or by the end of it that only it has (e.g. "
                f"{_unique_end(hits[-1], [*hits[:-1], name])!r})."
            )
        if len(stages) == 1:
            leaves = sorted({p.leaf for p in others}, key=_natural)
            raise KeyError(
                f"probe {name!r} has several output leaves; pick one with `leaf=`: "
                f"{', '.join(repr(x) for x in leaves[:8])}"
            )
        if stages:
            raise KeyError(_several_stages(name, others, self.probe_path))
        known = sorted({p.name for p in self.probes})
        # the paths as written without repeat groups first: `Net/block_0/fc` is nearer
        # `Net/block_0/fcc` than `Net/block_0–1 (×2)/block_1/fc`
        close = difflib.get_close_matches(
            name, sorted({*known, *paths.values(), *plain.values()}), n=3
        )
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        raise KeyError(f"no probe named {name!r}{leaf}{hint}; probes: {', '.join(known[:20])}")

    @_compat.api_boundary  # a bad input's traceback ends at the user's call
    def save_html(self, path: Any, *, created: Any = _KEEP) -> Any:
        """Write a self-contained, offline HTML report (atomically); returns its path.
        `created=None` leaves the timestamp out, so equal inspections give equal bytes."""
        return _model.write("html", self.to_dict(created=created), path)

    def _repr_html_(self) -> str:
        import html

        return (
            f"<p>sowviz.Inspection of <code>{html.escape(self.title)}</code> "
            f"({Mode(self.mode).value}): {len(self.graph.nodes)} nodes, {len(self.probes)} "
            "probes. Use <code>sowviz.show(...)</code> for the interactive view.</p>"
        )


_PROBE_NAME = (
    "probe() takes a name (str): a sow's name, a stage's label or the end of its path "
    "(`'conv2/weight'`), a parameter's name; `[p.name for p in ins.probes]` lists them. "
    "Got {value!r} ({kind}).{hint}"
)
_PATH_HINT = " A path is one string, its parts joined by '/': `{joined!r}`."
_PROBE_INPUT = (
    "probe()'s `input` is the name of a Tesseract's input field (`input='x'`), given "
    "without `leaf`; got input={value!r}, leaf={leaf!r}."
)
_PROBE_LEAF = (
    "probe()'s `leaf` is a str (`''` for a single array, `'[1]'` for a stage's second "
    "output); got {value!r} ({kind})."
)


def _check_probe_query(name: Any, leaf: Any) -> None:
    """A TypeError saying what `probe` takes, before a non-string fails deep inside it
    (`'int' object is not iterable`)."""
    if not isinstance(name, str):
        hint = ""
        if isinstance(name, (tuple, list)) and all(isinstance(v, str) for v in name):
            hint = _PATH_HINT.format(joined="/".join(name))
        raise TypeError(_PROBE_NAME.format(value=name, kind=type(name).__name__, hint=hint))
    if not isinstance(leaf, str):
        raise TypeError(_PROBE_LEAF.format(value=leaf, kind=type(leaf).__name__))


def _dotted_keys(name: str) -> str:
    """`name` with `jax.tree_util.keystr`'s dict keys as sowviz writes them in a
    parameter's label (`names.key_path_label`): `[1]['log_nu']` is `[1].log_nu`,
    `['w']` is `w`, Haiku's `['mlp/~/linear_0']['w']` is `mlp/~/linear_0/w`."""
    if name.startswith(("[", ".")):  # a whole key path
        return key_path_label(name)
    return _DICT_KEY.sub(r".\1", name).removeprefix(".")


_DICT_KEY = re.compile(r"\['([^'\]]*)'\]")
#: A `.` after a bare key holding a `/` (`linear_0.w` in `mlp/~/linear_0.w`)
_AFTER_SLASH_KEY = re.compile(r"(/[^./\[\]']*)\.")


def _slash_path(name: str) -> str:
    """`name` as the parameters' group labels spell it, from the parameter table's name
    (`mlp/~/linear_0.w`, which joins every label with a `.`): a bare key holding a `/`
    (Haiku's) has its entries joined by `/` (`mlp/~/linear_0/w`; `_args.slash_joined`)."""
    while (joined := _AFTER_SLASH_KEY.sub(r"\1/", name)) != name:
        name = joined
    return name


def _path_aliases(path: str, plain: str) -> set[str]:
    """`_aliases` of a probe's path and of its path without repeat groups
    (`Inspection._plain_path`)."""
    return _aliases(path) if plain == path else _aliases(path) | _aliases(plain)


#: an unpacked element's label, `[4] (log_prob)` (`graph.build.unpacked_leaves`)
_UNPACKED = re.compile(r"(\[\d+\]) \(([A-Za-z_]\w*)\)")


def _aliases(path: str) -> set[str]:
    """Other names of the probe at `path`: each "/"-end of it, with modules' classes
    left out (`conv1: Conv2d` is `conv1`), and the parameter table's dotted name of
    what is below its top-level group (`parameters/down[1][0]/conv1/weight` is
    `down[1][0].conv1.weight`)."""
    parts = path.split("/")
    bare = [p.split(": ", 1)[0] if ": " in p and "(" not in p else p for p in parts]
    out = set()
    # an argument's element the function unpacks (`traj[4] (log_prob)`): its index
    # alone (`traj[4]`), and the name the code gives it (`log_prob`)
    unpacked = [_UNPACKED.fullmatch(p) for p in parts]
    if any(unpacked):
        plain = (m.group(1) if m else p for m, p in zip(unpacked, parts, strict=True))
        out |= _aliases("/".join(plain))
        if unpacked[-1]:
            out.add(unpacked[-1].group(2))
    for labels in (parts, bare):
        out.update("/".join(labels[-k:]) for k in range(1, len(labels) + 1))
    # dotted as Python reaches a module (`blocks[0].attn`), every end of the path
    for k in range(1, len(bare) + 1):
        dotted = ""
        for label in bare[-k:]:
            dotted += label if not dotted or label.startswith("[") else "." + label
        out.add(dotted)
    # a dotted label's ends: a lone parameter leaf drawn as the input `params.w` is `w`,
    # as it is in the parameters group when there are several
    last = bare[-1].split(".")
    if len(last) > 1 and all(last):
        out.update(".".join(last[-k:]) for k in range(1, len(last)))
    return out


def _several_stages(name: str, probes: list[Probe], path_of: Callable[[Probe], str]) -> str:
    """The KeyError for a name that several stages of several outputs share (a
    BatchNorm module called twice: `Net/bn` and `Net#2/bn`, each `[0]`, `[1]`, ...):
    their paths, their leaves, and a call that names one."""
    leaves: dict[str, set[str]] = {}
    for p in probes:
        leaves.setdefault(path_of(p), set()).add(p.leaf)
    paths = list(leaves)  # in program order, as the graph numbers them
    listed = ", ".join(
        f"{p!r} ({', '.join(sorted(leaves[p], key=_natural)[:8])})" for p in paths[:8]
    )
    more = ", ..." if len(paths) > 8 else ""
    last = paths[-1]
    example = _unique_end(last, [*paths[:-1], name])
    # (what the call returns before the state it writes: `mean (new)`)
    first_leaf = min(leaves[last], key=lambda x: (_written(x), _natural(x)))
    return (
        f"{len(paths)} stages are called {name!r}, each with several outputs: "
        f"{listed}{more}. Name one by its path (or the end of it that only it has) and "
        f"pick an output with `leaf=`, e.g. `probe({example!r}, leaf={first_leaf!r})`."
    )


def _unique_end(path: str, others: list[str]) -> str:
    """The shortest "/"-separated end of `path` that none of `others` ends with."""
    parts = path.split("/")
    for k in range(1, len(parts) + 1):
        end = "/".join(parts[-k:])
        if not any(o == end or o.endswith("/" + end) for o in others):
            return end
    return path


def inspection_of(out: Out, options: InspectOptions) -> Inspection:
    """The typed model of one instrumented program's output."""
    # Objects by the ten thousand, none of them garbage: on the 10,000-equation program
    # (10,000 summaries) collections made a repeated `inspect` 0.55-0.94 s, not 0.55 s.
    with gc_paused():
        return _inspection_of(out, options)


def _inspection_of(out: Out, options: InspectOptions) -> Inspection:
    summaries = nest(*out.packed.unpack(rows=True))
    probes, notes = join_probes(out.traced, summaries, options)
    notes.extend(out.notes)
    number = out.traced.python_number_note(options.mode, options.argnums)
    if number is not None:
        notes.append(number)
    from .nonfinite_locate import origins_of

    return Inspection(
        nonfinite=origins_of(out, probes, options),
        result=out.user_result(options.mode),
        graph=sows_named_as_captured(out.traced.graph, probes),
        probes=probes,
        mode=Mode(options.mode),
        device=device_of(out.packed.buffers),
        title=out.traced.graph.title,
        notes=[_note(m) for m in notes],
    )


def merged_notes(notes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model's notes with one note per message: a note said alike of several nodes
    (optax's line search differentiates its `sum` in three places) lists them all in
    `nodes`, its `probe` the first."""
    out: list[dict[str, Any]] = []
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for note in notes:
        key = (note["level"], note["message"])
        same = seen.get(key) if note.get("probe") is not None else None
        if same is None:
            note = dict(note)
            out.append(note)
            if note.get("probe") is not None:
                seen[key] = note
            continue
        # (a note merged before, as `Inspection.notes` holds them, merges alike)
        nodes = list(same.get("nodes", [same["probe"]]))
        nodes += [n for n in note.get("nodes", [note["probe"]]) if n not in nodes]
        if len(nodes) > 1:
            same["nodes"] = nodes
    return out


def _note(note: Any) -> dict[str, Any]:
    """A model note: a string is a warning about the program; a pair `(node, message)`
    says something about that node."""
    if isinstance(note, tuple):
        return {"level": "info", "probe": note[0], "message": note[1]}
    return {"level": "warning", "probe": None, "message": note}


@_compat.api_boundary  # a bad input's traceback ends at the user's call
def inspect(
    fn: Callable, *args: Any, mode: Mode | str = "grad", capture: Capture = "stages", **options: Any
) -> Inspection:
    """Run `fn(*args)` under `mode`, probe it, summarise every probe; return an `Inspection`.

    `fn` is the undifferentiated function: `mode` applies the derivative itself
    (`"primal"`, `"grad"` (scalar `fn`, w.r.t. `argnums`), `"jvp"` (along
    `tangents=`, default a fixed-seed normal direction), `"vjp"` (from
    `cotangents=`, default ones), `"all"`). `capture="stages"` probes every stage's
    outputs and your sows; `"sows"` only your sows; `"all"` every equation.

    Arguments are any pytrees (Equinox and Flax NNX modules included): array leaves
    are traced, every other leaf is static, as in `equinox.filter_jit`. Only
    floating-point array leaves are differentiated; in the returned gradients (and
    input cotangents) every other leaf is None, as `equinox.filter_grad` gives, which
    equals `jax.grad`'s result wherever `jax.grad` accepts the arguments. Of a Flax
    NNX model only the `nnx.Param` leaves are, as `nnx.grad` by default.

    The compiled program is cached on the function and the arguments' structure,
    shapes, dtypes, shardings and static leaves (as `jax.jit` caches): the same
    `inspect` again with new values costs one run. Across sessions, JAX's persistent
    cache helps: `jax.config.update("jax_compilation_cache_dir", "/tmp/jax-cache")`;
    the summary program sowviz shares between models is kept on disk by sowviz
    itself (``SOWVIZ_CACHE_DIR``, default ``~/.cache/sowviz``; "" turns it off).

    Options: argnums, tangents (a tuple, one per argument), cotangents (shaped like
    the output), bins (≤ 4096), title, tag, duplicates (default "suffix"), loops,
    strict, tesseract_names, expect_nonfinite (stage labels or sow names where NaN/Inf
    are expected, e.g. ("mask",): no alarm for what they hold and pass on when it
    reaches no result; or "gradients": non-finite gradients of finite forward values
    are a guarded update's skipped step, `nonfinite.skipped`, no alarm; any other name
    is a ValueError listing the valid ones; see docs/model.md, NonFinite), has_aux (`fn` returns
    `(output, aux)`: the aux is never differentiated and `result` holds it where JAX's
    `has_aux` puts it, e.g. `((value, aux), grads)` in mode grad).

    `inspect` only looks: state that `fn` assigns in its arguments (a Flax NNX model's
    BatchNorm statistics, its RNG counters) is drawn as outputs (`new model.bn.mean`)
    and left unwritten; `Monitor.step` writes it back.

    `inspect` compiles, runs and reads back a program of its own, so call it outside
    `jax.jit`, `vmap`, `grad` and other transformations: inside one it raises a
    TypeError saying so (on concrete values, `with jax.ensure_compile_time_eval():`
    runs it there).

    Example:
        >>> ins = sowviz.inspect(lambda w: jnp.sum(jnp.tanh(w) ** 2), jnp.ones(3))
        >>> ins.to_dict()["schema"], ins.mode.value
        ('sowviz/1', 'grad')
    """
    opts = InspectOptions.from_kwargs("inspect", mode, capture, options)
    with library_errors("inspect"):
        out = runner_for(fn, opts).run(
            args, where="inspect", tangents=opts.tangents, cotangents=opts.cotangents
        )
        check_expected("inspect", out.traced.graph, opts.expect_nonfinite)
        ins = inspection_of(out, opts)
    ins._rerun = (fn, args, opts)
    return ins


def prepare(
    fn: Callable, *args: Any, mode: Mode | str = "grad", capture: Capture = "stages", **options: Any
) -> None:
    """Compile the program `inspect(fn, *args, mode=mode, capture=capture, **options)`
    runs, without running it: that `inspect` then costs one run. (The widget warms the
    modes it may switch to this way, in the background.)"""
    opts = InspectOptions.from_kwargs("inspect", mode, capture, options)
    runner_for(fn, opts).compile(
        args, where="inspect", tangents=opts.tangents, cotangents=opts.cotangents
    )


__all__ = ["Inspection", "Probe", "inspect", "inspection_of", "join_probes", "prepare"]


def _refuse_numbered_sows(name: str, sows: list[Probe], stages: Sequence[str] = ()) -> None:
    """A name sown more than once (a Python decode loop's `sow(logits, "logits")` per
    token) is numbered, `logits_0` … `logits_14`: `probe("logits")` answered with the
    first, whose node alone is drawn `logits`, or with a stage of that name (`stages`,
    their paths: a line `u = ...` beside the numbered sows `u`). Say the numbered names
    instead, and the stages'."""
    numbered = sorted(
        (p.name for p in sows if re.fullmatch(re.escape(name) + r"_\d+", p.name)), key=_natural
    )
    if len(numbered) > 1:
        shown = ", ".join(repr(n) for n in numbered[:4]) + (", ..." if len(numbered) > 4 else "")
        raise KeyError(
            f"{name!r} was sown {len(numbered)} times, so each sow has a number: {shown} "
            f"(the last {numbered[-1]!r}). Name one of them"
            + (
                f"; the stage{'s' if len(stages) > 1 else ''} called {name!r} "
                f"({', '.join(repr(s) for s in stages[:4])}) by {'their' if len(stages) > 1 else 'its'} path."
                if stages
                else "."
            )
        )
