"""Where non-finite values (NaN/Inf) are born: one rule, used by the Monitor and `inspect`.

The rule runs once, in Python, on the summaries of one step; its answer is stored
in the model (`"nonfinite"`, see docs/model.md) and the front end and the report
only display it.

Forward pass. Values exist in program order, and a stage's output exists once its
last child ran, so a node's time is its `exit` (the largest order in its subtree);
inside a loop, the first iteration holding a non-finite value comes first (from the
summary's `per_iteration.nonfinite`, when present). The *producer* is the
earliest non-finite node whose values can reach a non-finite result; being the
earliest, every value it read was finite or masked. Every other non-finite node only
passes the values on: a *propagator*. "Reaches" is read off the graph (`_Reach`): a
node's values reach a result through a reader that holds non-finite values (or is
unprobed: it may) up to an output; a node all of whose readers are finite (a
`jnp.where` that masked a `sqrt`'s NaN) was masked, and an overflow after it
(`x * gate` = Inf, then Inf - Inf in `h @ w`) is the origin, the masked value a side
note. When nothing reaches a result (every non-finite value masked; what is
non-finite is a gradient), the earliest is named, as before. A ±Inf that an
equation made from finite values (an overflow) and that a later NaN the results
hold came of stays the origin ("it held +Inf, which led to the NaN first made by
..."); at a ±Inf fill (`jnp.where(mask, s, -jnp.inf)`, `jnp.full(n, jnp.inf)`) the
NaN is the origin, the fill named before it, whether or not the results hold it (a
padded GAT's masked loss is finite, its gradients NaN). No arithmetic makes ±Inf of a NaN: ±Inf
results after a NaN are a fill put in its place (`jnp.where(jnp.isfinite(ll), ll,
-jnp.inf)` after a failed `cholesky`: the NaN is the origin, the fill named after it)
or an overflow apart from it (the origin). Inside a loop, a node holding the
results' kind counts from the first iteration holding that kind (`locate`'s count run
keeps the kinds per iteration): Equinox's `while_loop` selects its whole state every
iteration, so the `select` holding diffrax's +Inf buffer from iteration 0 holds the NaN
`sqrt` made only from the 7th, after that `sqrt`.

Loop fills. When every result is finite and the forward values hold only ±Inf, first
made outside every loop and carried into one (diffrax's output buffer, optimistix's
first `f = inf`, a "best so far"), they are a library's fill values: no origin (the
front end draws no "starts here"), listed in `expected`, said in the message.

Reduction identities. An empty max's -Inf (a min's +Inf) is that reduction's identity,
by design: `jax.ops.segment_max` gives it to a segment no element reaches (a node of
in-degree 0 in every GAT's segment softmax). Like a constant's fill, it is no origin
while nothing non-finite reads it and no result holds it (`_identity_fills`).

Backward pass. Cotangents exist in reverse order: the first non-finite cotangent is
the one of the latest node (the shallower on a tie, a stage's output cotangent
exists before its children's). That node's cotangent is the sum of what its
consumers' backward rules made of their own (finite, since they ran before)
cotangents, so the NaN was *born in the backward of* a consumer and *reaches* the
node. Parameter gradients (the input nodes' cotangents) count too: the caller
passes them as `inputs`.

Expected values. Stages or sows named in `expect_nonfinite` (and everything inside
them) may hold non-finite values without an alarm; values that only they make do
not count as an origin. A non-finite value, forward or backward, that never reaches
a result (masked afterwards: the returned values and the gradients are all finite)
is *removed*: it is reported, with no alarm.

Modules, imports pointing one way: `nonfinite_record` (the typed record) ←
`nonfinite_messages` (its sentences) ← this rule (with `nonfinite_json`, a saved
model seen as live objects) ← `nonfinite_locate` (down to the equation, by the
count-only re-run of `nonfinite_counts`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .nonfinite_casts import cast_message, narrowed_cotangent
from .nonfinite_expect import SKIPPED, gradients_expected
from .nonfinite_json import JsonGraph, json_probes
from .nonfinite_messages import (
    EARLIER,
    FROM_FORWARD,
    IN_TANGENT,
    LED_TO,
    LOOP_CARRIED,
    MASKED,
    NAMES_THE_EQUATION,
    NONFINITE_GRADS,
    TESSERACT_TANGENT,
    at_iteration,
    backward_message,
    backward_sentence,
    devices_said,
    equation_name,
    forward_message,
    grads_sentence,
    input_of,
    input_path,
    loop_fill_message,
    mask_fill_message,
    message,
    on_devices,
    stage_name,
    with_message,
)
from .nonfinite_record import Equation, NonFinite, Origin, Origins

__all__ = [
    "Equation",
    "NonFinite",
    "Origin",
    "Origins",
    "find",
    "is_backward_key",
    "is_bad",
    "message",
    "model_origins",
    "node_flags",
    "with_equations",
]

_INF = math.inf


# ---------------------------------------------------------------------------
# Summaries.


def is_bad(s: Mapping[str, Any] | None) -> bool:
    """Whether a summary counts any NaN, +Inf or -Inf."""
    return bool(s and (s.get("nan") or s.get("posinf") or s.get("neginf")))


def is_backward_key(key: str) -> bool:
    """A capture key holding a cotangent anywhere ("cotangent", "cotangent.tangent")."""
    return "cotangent" in str(key).split(".")


#: An xs index of each loop holding a node -> when it ran (`_Index.times`), per loop the
#: outermost first; the identity where every loop runs forward.
Timing = Callable[[tuple[int, ...]], tuple[int, ...]]


def _bad_iterations(
    s: Mapping[str, Any], bit: int = 0, timing: Timing | None = None
) -> list[tuple[int, ...]]:
    """Iterations holding non-finite values, in order: rows of the outermost stacked axis,
    or (`per_iteration.shape`, `locate`'s count run) of the nested loops' axes, as one
    index per loop, the outermost first. With `bit`, those holding that kind (bit of
    `per_iteration.kinds`, which only `locate`'s count run has). With `timing`, each
    one's time instead (a reverse scan's rows count from its last), in time order."""
    if timing is not None:
        return sorted(timing(it) for it in _bad_iterations(s, bit))
    per = s.get("per_iteration") or {}
    counts = per.get("nonfinite") or []
    if bit:
        counts = [int(k) & bit for k in per.get("kinds") or []]
    rows = per.get("index") or range(len(counts))  # rows kept, when strided
    shape = per.get("shape")
    bad = [int(r) for r, c in zip(rows, counts, strict=True) if c]
    if shape and len(shape) > 1:
        # (row-major, as the count run flattens them)
        return [tuple(int(i) for i in np.unravel_index(r, shape)) for r in bad]
    return [(r,) for r in bad]


_KINDS = ("nan", "posinf", "neginf")
_BITS = {"nan": 1, "posinf": 2, "neginf": 4}  # `per_iteration.kinds` (nonfinite_counts)


def _kinds(s: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(k for k in _KINDS if s.get(k))


def _kind_iterations(
    s: Mapping[str, Any], timing: Timing | None = None
) -> dict[str, tuple[float, ...]]:
    """Per kind the summary holds, the first iteration holding it: from the rows' kinds
    when known, else the first iteration holding any (unknown: after every known one)."""
    per = s.get("per_iteration") or {}
    known = bool(per.get("kinds")) and len(per["kinds"]) == len(per.get("nonfinite") or [])
    anyone = _bad_iterations(s, timing=timing)
    out: dict[str, tuple[float, ...]] = {}
    for k in _kinds(s):
        its = _bad_iterations(s, _BITS[k], timing) if known else anyone
        out[k] = its[0] if its else (_INF,)
    return out


@dataclass
class _Flags:
    fwd: bool = False
    bwd: bool = False
    fwd_kinds: frozenset[str] = frozenset()  # which of NaN, +Inf, -Inf the values hold
    fwd_iter: tuple[float, ...] = (_INF,)  # first iteration with a non-finite forward value
    fwd_value: bool = False  # the value itself (not only its tangent) is non-finite
    bwd_iter: tuple[float, ...] = (-_INF,)  # last iteration with a non-finite cotangent
    # per kind it holds (NaN, +Inf, -Inf), the first iteration holding it: a loop that
    # carries a +Inf fill from iteration 0 holds the NaN it makes only from its 7th
    fwd_kind_iter: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # inside a shard_map (`locate`'s count run): the mesh axes, their sizes and which
    # devices' forward values hold non-finite ones (row-major indices)
    fwd_devices: tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]] | None = None

    def first_kinds(self) -> frozenset[str]:
        """The kinds held at the first iteration holding any: what a loop's equation made
        first, not what the carry brought it later (all of them outside loops)."""
        return frozenset(
            k for k in self.fwd_kinds if self.fwd_kind_iter.get(k, self.fwd_iter) == self.fwd_iter
        )

    def first_of(self, kinds: Iterable[str]) -> tuple[float, ...]:
        """The first iteration holding one of `kinds` (those held: `fwd_iter`)."""
        its = [self.fwd_kind_iter[k] for k in kinds if k in self.fwd_kind_iter]
        return min(its) if its else self.fwd_iter


def node_flags(
    probes: Iterable[Any], timing: Callable[[str], Timing] | None = None
) -> dict[str, _Flags]:
    """Per node: whether its own probes hold non-finite values, by pass. Its iterations
    are times (`timing` of the node: `_Index.times`), the xs indices without it: "first"
    is first in time, and a reverse scan runs its last xs index first."""
    out: dict[str, _Flags] = {}
    for p in probes:
        when = None if timing is None else timing(p.node)
        for key, s in p.summaries.items():
            if not is_bad(s):
                continue
            f = out.setdefault(p.node, _Flags())
            its = _bad_iterations(s, timing=when)
            if is_backward_key(key):
                f.bwd = True
                if its:
                    f.bwd_iter = its[-1] if f.bwd_iter == (-_INF,) else max(f.bwd_iter, its[-1])
            else:
                f.fwd = True
                f.fwd_value = f.fwd_value or "tangent" not in str(key).split(".")
                f.fwd_kinds |= _kinds(s)
                if its:
                    f.fwd_iter = min(f.fwd_iter, its[0])
                for k, it in _kind_iterations(s, when).items():
                    f.fwd_kind_iter[k] = min(f.fwd_kind_iter.get(k, (_INF,)), it)
                per = s.get("per_shard")
                if per and f.fwd_devices is None and any(per.get("kinds") or ()):
                    bad = tuple(i for i, k in enumerate(per["kinds"]) if k)
                    f.fwd_devices = (tuple(per["axes"]), tuple(per["shape"]), bad)
    return out


# ---------------------------------------------------------------------------
# The graph: times, consumers, names.

_STACKED = ("scan", "while")


class _Index:
    def __init__(self, graph: Any, reversed_loops: Mapping[str, int] | None = None) -> None:
        self.graph = graph
        #: reverse scans (`lax.scan(..., reverse=True)`): node id -> length. Their
        #: iterations are named by xs index, as the user indexes the data, and ordered
        #: by when they ran: the last index first.
        self.reversed_loops = dict(reversed_loops or {})
        self.depth: dict[str, int] = {}
        self.exit: dict[str, int] = {}
        self.loop: dict[str, str | None] = {}  # outermost stacked ancestor
        self.nodes = {n.id: n for n in graph.nodes}
        for n in graph.nodes:  # parents come before children
            p = n.parent
            self.depth[n.id] = 0 if p is None else self.depth[p] + 1
            self.exit[n.id] = n.order
            outer = None if p is None else self.loop[p]
            if outer is None and p is not None and self.nodes[p].kind in _STACKED:
                outer = p
            self.loop[n.id] = outer
        for n in reversed(graph.nodes):
            if n.parent is not None:
                self.exit[n.parent] = max(self.exit[n.parent], self.exit[n.id])
        # Outputs, and the groups that hold only outputs (a returned model's leaves).
        self.outputs = {n.id for n in graph.nodes if n.kind == "output"}
        held: dict[str, bool] = {}
        for n in reversed(graph.nodes):  # children come after parents: a group's are done
            if held.get(n.id) and n.kind == "scope":
                self.outputs.add(n.id)
            if n.parent is not None:
                held[n.parent] = held.get(n.parent, True) and n.id in self.outputs
        self.out: dict[str, list[str]] = {}
        self.into: dict[str, list[str]] = {}
        for e in graph.edges:
            self.out.setdefault(e.source, []).append(e.target)
            self.into.setdefault(e.target, []).append(e.source)

    def loops(self, node: str) -> list[str]:
        """The loops (scan, while) holding `node`, the outermost first."""
        return [a for a in reversed(self.ancestors(node)) if self.nodes[a].kind in _STACKED]

    def times(self, node: str) -> Timing:
        """`node`'s xs indices (one per loop holding it, the outermost first) -> when
        those iterations ran: a reverse scan of length n runs index i as its
        (n - 1 - i)th; its own inverse (`indices`)."""
        lengths = [self.reversed_loops.get(lp) for lp in self.loops(node)]
        if not any(lengths):
            return lambda it: it
        return lambda it: tuple(
            i if k >= len(lengths) or lengths[k] is None else lengths[k] - 1 - i
            for k, i in enumerate(it)
        )

    def indices(self, node: str, times: Sequence[float]) -> tuple[int, ...]:
        """The xs indices of `node`'s iterations known at `times` (`_Flags`' iterations),
        the outermost loop first, up to the first unknown one: what messages and
        `Origin.iteration` say."""
        return self.times(node)(_known(times, self.loops(node)))

    def key(self, node: str, iteration: Sequence[float]) -> tuple[tuple[float, float], ...]:
        """When a node's value exists (forward time; the backward runs it in reverse): per
        loop holding it, the outermost first, (the loop's start, the iteration; unknown:
        after every known one), then (its exit, -depth). A node beside a loop compares
        its exit with the loop's start, and within one iteration the body's program
        order decides: the iterations of nested loops order lexicographically."""
        out = []
        for k, loop in enumerate(self.loops(node)):
            it = iteration[k] if k < len(iteration) and math.isfinite(iteration[k]) else _INF
            out.append((float(self.nodes[loop].order), float(it)))
        out.append((float(self.exit[node]), float(-self.depth[node])))
        return tuple(out)

    def ancestors(self, node: str) -> list[str]:
        out, p = [], self.nodes[node].parent
        while p is not None:
            out.append(p)
            p = self.nodes[p].parent
        return out

    def consumers(self, node: str) -> list[str]:
        """The nodes reading `node`'s values: its level's edges, else its parent's."""
        return self._readers(node)[0]

    def _readers(self, node: str) -> tuple[list[str], str | None]:
        """`consumers(node)`, and the node whose edges they are (`node`, or the ancestor
        whose output `node`'s values are)."""
        cur: str | None = node
        while cur is not None:
            targets = [t for t in self.out.get(cur, ()) if t not in self.outputs]
            if targets or cur in self.out:
                return targets, cur
            cur = self.nodes[cur].parent
        return [], None

    def reads_input(self, reader: str, node: str) -> bool:
        """Whether `reader`, one of `consumers(node)`, reads `node` itself when `node` is
        an input: the arguments' edges leave their group (`parameters`), so every stage
        reading a parameter is drawn reading all of them, and only the one reading
        `pos` can have made `pos`'s gradient NaN. From the graph's `input_readers`
        (the equations reading it), else its nodes' `reads`; True when neither says."""
        if self.nodes[node].kind != "input":
            return True
        known = getattr(self.graph, "input_readers", None) or {}
        if known.get(node):
            return any(
                r == reader or (r in self.nodes and reader in self.ancestors(r))
                for r in known[node]
            )
        if not any(n.reads for n in self.graph.nodes if hasattr(n, "reads")):
            return True  # (a model that does not say who reads an input)
        return any(
            node in getattr(n, "reads", ()) and (n.id == reader or reader in self.ancestors(n.id))
            for n in self.graph.nodes
        )

    def unprobed_before(self, node: str, probed: set[str], limit: int = 2) -> list[str]:
        """The unprobed equations whose values `node` reads, directly or through other
        unprobed equations (at most `limit`, the nearest first): one of them may have
        made a value `node` is the first probe to see. Only one that can make NaN/Inf
        is named: an integer one holds none (a loop's `t = S - 1 - i`: nor does what it
        reads pass any on), and a move (`broadcast_in_dim`, `squeeze`) makes none of
        finite values, so the equations before it are looked at in its place."""
        out: list[str] = []
        seen: set[str] = set()
        todo = list(self.into.get(node, ()))
        while todo and len(out) < limit:
            src = todo.pop(0)
            if src in probed or src in seen or self.nodes[src].kind != "eqn":
                continue
            seen.add(src)
            if not _inexact(self.nodes[src]):
                continue
            if self.nodes[src].primitive not in _MAKES_NONE:
                out.append(src)
            todo += self.into.get(src, ())
        return out

    def probed_after(self, node: str, probed: set[str], limit: int = 2) -> list[str]:
        """The probed nodes reading `node`'s values through unprobed equations (at most
        `limit`, the nearest first): an unprobed `node`'s output cotangent is unseen, so
        one of their backward rules may have made the NaN that reaches past `node`."""
        out: list[str] = []
        seen: set[str] = set()

        def readers(n: str) -> list[str]:
            # values that leave a probed stage as its output: that cotangent is seen
            targets, holder = self._readers(n)
            return [] if holder != n and holder in probed else targets

        todo = readers(node)
        while todo and len(out) < limit:
            dst = todo.pop(0)
            if dst in seen:
                continue
            seen.add(dst)
            if dst in probed:
                out.append(dst)
            elif self.nodes[dst].kind == "eqn":
                todo += readers(dst)
        return out

    def path(self, node: str | None) -> tuple[str, ...]:
        """Labels of the stages from the top level down to `node` (the root left out)."""
        if node is None:
            return ()
        chain = [node, *self.ancestors(node)]
        return tuple(self.nodes[n].label for n in reversed(chain) if n != self.graph.root)


def _expected_nodes(ix: _Index, expect: Sequence[str]) -> set[str]:
    names = set(expect)
    marked = {n.id for n in ix.graph.nodes if n.label in names or n.id in names}
    for name in names:
        marked.update(getattr(ix.graph, "sow_nodes_all", {}).get(name, ()))
    out = set(marked)
    for n in ix.graph.nodes:  # parents first: a child of an expected node is expected
        if n.parent in out:
            out.add(n.id)
    return out


# ---------------------------------------------------------------------------
# The rule.


def find(
    probes: Iterable[Any],
    graph: Any,
    *,
    step: int | None = None,
    inputs: Mapping[str, tuple[bool, bool]] | None = None,
    results_finite: bool | None = None,
    expect_nonfinite: Sequence[str] = (),
    readers: Callable[[str], Sequence[str]] | None = None,
    fills: frozenset[str] = frozenset(),
    reversed_loops: Mapping[str, int] | None = None,
) -> Origins | None:
    """The origins of non-finite values on one step, or None when every value is finite.

    `inputs` maps input node ids to (value non-finite, gradient non-finite): the
    arguments and parameter gradients, which no probe sees. `results_finite` says
    whether everything the step returned (value and gradients) is finite; with True,
    forward non-finite values were removed before a result. `expect_nonfinite` names
    stages or sows where non-finite values are expected. `readers` (`locate`, which has
    the jaxpr) gives the nodes reading a node's values exactly, where the graph's edges,
    drawn between siblings, show none. `fills` (`locate`, which reads the literals):
    constant nodes whose NaN/Inf was written in the program as a literal (`jnp.clip`'s
    `max=jnp.inf` made a float), never made of finite values. `reversed_loops` (read off
    the jaxpr: `nonfinite_locate.reversed_loops`): the reverse scans' node ids and
    lengths, whose first iteration is their last xs index.
    """
    ix = _Index(graph, reversed_loops)
    probes = list(probes)
    flags = node_flags(probes, ix.times)
    probed = {p.node for p in probes} | set(inputs or ())
    for node, (fwd, bwd) in (inputs or {}).items():
        if fwd or bwd:
            f = flags.setdefault(node, _Flags())
            f.fwd, f.bwd = f.fwd or fwd, f.bwd or bwd
            f.fwd_value = f.fwd_value or fwd
            if fwd and not f.fwd_kinds:
                f.fwd_kinds = frozenset(_KINDS)
    if not flags:
        return None
    expected = _expected_nodes(ix, expect_nonfinite) if expect_nonfinite else set()
    # What the expected stages hold (e.g. -Inf) may flow on; a value holding only those
    # kinds passes them on, one holding another kind (NaN from -Inf - -Inf) is made.
    kinds = frozenset().union(*(f.fwd_kinds for n, f in flags.items() if n in expected))
    if expected:
        expected |= {n for n, f in flags.items() if f.fwd and f.fwd_kinds <= kinds}
    # A constant's non-finite value that no other non-finite value reads (but masked
    # constants: the fill value broadcast) is a fill value its library masks
    # (`jnp.var`'s `where(dof > 0, var, nan)`): never an origin.
    masked = {n for n in getattr(graph, "constant_nodes", ()) if n in flags}
    # So is an empty max's -Inf (min's +Inf), that reduction's identity: a node no edge
    # reaches in `jax.ops.segment_max`, as every GAT's segment softmax has.
    identity = _identity_fills(ix, flags)
    masked |= identity
    while True:
        read = {
            n
            for n in masked
            if any(c in flags and flags[c].fwd and c not in masked for c in ix.consumers(n))
            or (n in identity and _identity_read(ix, flags, probed, n, results_finite))
        }
        if not read:
            break
        masked -= read
    fwd = {n: f for n, f in flags.items() if f.fwd and n not in expected and n not in masked}
    bwd = _without_outputs(ix, {n: f for n, f in flags.items() if f.bwd and n not in expected})
    # Non-finite gradients of finite forward values, declared expected (a guarded
    # update: dynamic loss scaling skips the step): a skipped step, no origin
    skipped = bool(bwd) and not fwd and gradients_expected(expect_nonfinite)
    if skipped:
        expected |= bwd.keys()
        bwd = {}
    if not fwd and not bwd and not expected & flags.keys():
        return None  # only masked fill values
    fwd_origin = bwd_origin = None
    mine: tuple[str, ...] = ()
    other: tuple[str, ...] = ()
    if fwd:
        # Only a non-finite value that can reach a non-finite result is an origin: one
        # whose readers all end finite (`jnp.where` masked it) is not, unless every one
        # is (then what is non-finite is a gradient: the masked branch's backward).
        reaches = _Reach(ix, flags, probed, readers)
        live = {n: f for n, f in fwd.items() if reaches(n)}
        node, earlier, led_to, node_iter = _producer(ix, fwd, live or fwd, fills)
        before = [ix.nodes[b] for b in ix.unprobed_before(node, probed)]
        early = (
            None
            if earlier is None
            else (ix.nodes[earlier], fwd[earlier].fwd_kinds, ix.path(earlier))
        )
        led = None
        if led_to is not None:
            results = _held({n: f for n, f in fwd.items() if n in ix.outputs})
            # (±Inf results after a NaN: the fill that took its place, see `_producer`)
            put = "nan" not in results and _is_fill(ix, led_to)
            fill = fwd[led_to].fwd_kinds if put else frozenset()
            led = (ix.nodes[led_to], fwd[node].first_kinds(), fill, results)
        carried, unseen = _carried(ix, node, fwd, probed, node_iter, fills)
        masked_note = None
        if live:
            first = min(fwd, key=lambda n: ix.key(n, fwd[n].fwd_iter))
            if first not in live:
                by = reaches.masker(first)
                masked_note = (ix.nodes[first], fwd[first].fwd_kinds, by and ix.nodes[by])
        iteration = ix.indices(node, node_iter)
        msg = forward_message(
            ix.nodes[node],
            ix.path(node),
            before,
            early,
            [ix.nodes[c] for c in carried],
            unseen,
            led,
            masked_note,
            at_iteration([ix.nodes[lp] for lp in ix.loops(node)], iteration)
            + on_devices(fwd[node].fwd_devices),
        )
        if not fwd[node].fwd_value:  # jvp: a NaN tangent of a finite value
            msg += IN_TANGENT
            if ix.nodes[node].kind == "tesseract":
                msg += TESSERACT_TANGENT
        fwd_origin = Origin("forward", node, message=msg, path=ix.path(node), iteration=iteration)
    if bwd:
        reach = max(bwd, key=lambda n: ix.key(n, bwd[n].bwd_iter))
        # (a consumer with no floating output, `x > 0`, sends no cotangent back)
        cands = [
            c
            for c in ix.consumers(reach)
            if not cotangent_bad_before(ix, flags, c, reach) and _inexact(ix.nodes[c])
        ]
        # (of an argument, those reading it: its group's edges name every reader of any)
        cands = [c for c in cands if ix.reads_input(c, reach)] or cands
        # the latest runs first backward; an equation whose backward only multiplies
        # and moves finite values (`mul`, `add`, reshapes) comes after those that can
        # make a NaN of them (`norm`'s `sqrt` at 0), unless its own values are not finite
        cands.sort(key=lambda c: backward_suspicion(ix, flags, c))
        if cands and cands[0] not in probed:
            # An unprobed equation's output cotangent is unseen: the stages reading its
            # values may have made the NaN (`associative_scan`'s backward, through the
            # `dot_general` before it), and one holding forward non-finite values
            # explains it (it comes first).
            later = [c for c in ix.probed_after(cands[0], probed) if c not in cands]
            cands += later
            cands.sort(key=lambda c: not (c in later and _value_bad(flags.get(c))))
        made = cands[0] if cands else None
        n = ix.nodes
        # A widening cast's backward (a float16 layer's output cast to float32 by a
        # mixed-precision policy) is no stage: the layer whose output it cast is the origin
        cast = narrowed_cotangent(graph, flags, reach, cands, probed, ix.ancestors)
        if cast is not None:
            made = cands[0] = _holding_stage(ix, cast.producer)
        made_node = n[made] if made is not None else None
        # Its forward values are non-finite: seen, or (an unprobed equation) read from
        # `reach`, whose values are. Values, not tangents: a backward pass never reads a
        # tangent (mode "all": `sqrt` at 0 has a finite value and a NaN tangent, and its
        # backward makes the NaN of finite values, as in mode grad).
        from_forward = made is not None and (
            _value_bad(flags.get(made))
            if made in flags
            else made not in probed
            and (_value_bad(flags.get(reach)) or _enters_bad(ix, flags, made))
        )
        iteration = ix.indices(reach, bwd[reach].bwd_iter)
        at = at_iteration([n[lp] for lp in ix.loops(reach)], iteration)
        msg = backward_message(made_node, n[reach], [n[c] for c in cands[1:]], from_forward, at)
        if cast is not None:
            from_forward, msg = False, cast_message(stage_name(n[made]), cast) + at
        # The origin's backward makes the gradients of what it reads itself as well: the
        # weights of `x = gelu(x @ w)` whose backward made the NaN (parameters get no
        # edge, so nothing upstream of `reach` reads them) were blamed on another origin.
        near = _upstream(ix, reach)
        if made is not None:
            near |= {k for k in ix.nodes if k == made or made in ix.ancestors(k)}
        mine, other = _grads_split(ix, bwd, near)
        msg += grads_sentence(mine, other)
        if cast is not None:  # (reaching the value cast: the stage's, or the equation's)
            reach = cast.producer if cast.producer in probed else made
        bwd_origin = Origin(
            "backward",
            made,
            reach,
            tuple(cands),
            message=msg,
            path=ix.path(made),
            iteration=iteration,
            follows_forward=from_forward,
        )
    fill = ""
    overwritten = False
    if fwd_origin is not None and results_finite is True and _loop_fill(ix, fwd, fwd_origin.node):
        # A library's fill values (diffrax's output buffer, optimistix's first `f = inf`)
        # in a healthy run: no origin of anything, said apart, drawn as expected values.
        tested = _tested_nans(ix, fwd)
        rest = {n: f for n, f in fwd.items() if n not in tested}
        named = [n for n in tested if not set(ix.ancestors(n)) & set(tested)]  # outermost
        fill = loop_fill_message(
            ix.nodes[fwd_origin.node], _held(rest), [ix.nodes[n] for n in named]
        )
        overwritten = not tested and _written_over(ix, fwd)
        fwd_origin, expected = None, expected | fwd.keys()
    elif fwd_origin is not None and results_finite is True and _mask_in_loop(ix, fwd, fwd_origin):
        # A mask made in a loop's step (a KV-cache decoder's causal mask, which depends on
        # the position), masked before any result: as one made outside the loop (a loop
        # fill), no origin and no "starts here" flag; said, drawn as expected values.
        node = fwd_origin.node
        at = at_iteration([ix.nodes[lp] for lp in ix.loops(node)], fwd_origin.iteration)
        fill = mask_fill_message(ix.nodes[node], _held(fwd), at)
        fwd_origin, expected = None, expected | fwd.keys()
    if skipped:
        fill = SKIPPED
    origin_ids = {o.node for o in (fwd_origin, bwd_origin) if o is not None and o.node}
    holders = {a for o in origin_ids for a in ix.ancestors(o)} | origin_ids
    nonfinite = sorted(
        (n for n, f in flags.items() if (f.fwd or f.bwd) and n not in masked),
        key=ix.exit.__getitem__,
    )
    propagators = tuple(n for n in nonfinite if n not in holders and n not in expected)
    # Every result finite (the value and every gradient): whatever was non-finite, in
    # either pass, was masked before it reached one.
    found = fwd_origin is not None or bwd_origin is not None
    removed = (found or bool(fill)) and results_finite is True
    alarm = found and not removed
    out = Origins(
        step=step,
        forward=fwd_origin,
        backward=bwd_origin,
        propagators=propagators,
        expected=tuple(n for n in nonfinite if n in expected),
        removed=removed,
        alarm=alarm,
        nodes=tuple(nonfinite),
        fill=fill,
        grads=mine,
        other_grads=other,
        skipped=skipped,
        overwritten=overwritten and not bwd_origin,
    )
    return with_message(out)


def _holding_stage(ix: _Index, node: str) -> str:
    """`node`, or the stage holding it when it is an equation (the layer of a bias `add`)."""
    parent = ix.nodes[node].parent
    if ix.nodes[node].kind == "eqn" and parent is not None and parent != ix.graph.root:
        return parent
    return node


def _held(fwd: Mapping[str, _Flags]) -> frozenset[str]:
    return frozenset().union(*(f.fwd_kinds for f in fwd.values()))


def _loop_fill(ix: _Index, fwd: Mapping[str, _Flags], node: str) -> bool:
    """Whether the forward non-finite values of a run whose results are all finite are
    fill values a loop carries in its state (diffrax fills its output buffer with +Inf,
    optimistix starts `f` and the step size at +Inf, a "best so far" starts at +Inf):
    ±Inf only, first made (`node`) outside every loop, and carried into one: a loop
    holds them, or a value holding them is read by a loop or by a stage holding one.
    A masked NaN, or an overflow inside a loop's body, is no fill; but a NaN a loop's
    step makes and only tests (`_tested_nans`) may come with them."""
    rest = {n: f for n, f in fwd.items() if n not in _tested_nans(ix, fwd)}
    if "nan" in _held(rest) or ix.loop[node] is not None or ix.nodes[node].kind in _STACKED:
        return False
    holding_loops = {a for n in ix.nodes.values() if n.kind in _STACKED for a in ix.ancestors(n.id)}
    for n in fwd:
        if ix.nodes[n].kind in _STACKED:
            return True
        reads = ix.out.get(n, ())
        if any(ix.nodes[t].kind in _STACKED or t in holding_loops for t in reads):
            return True
    return False


def _written_over(ix: _Index, fwd: Mapping[str, _Flags]) -> bool:
    """Whether a loop's fill values (`_loop_fill`) never left the loop carrying them:
    every value holding them is made inside a loop's body or before the loop and read
    by it, and no loop's result holds one. A healthy diffrax solve writes every row of
    its +Inf output buffer (`SaveAt(ts=...)`): its `ys` is finite, the fill is gone, and
    there is nothing to tell. A solve that stopped early (`throw=False` past
    `max_steps`) hands its unwritten +Inf rows on: the loop's result holds them."""
    holding_loops = {a for n in ix.nodes.values() if n.kind in _STACKED for a in ix.ancestors(n.id)}
    for n in fwd:
        if n in ix.outputs:
            return False  # (the program's result holds the fill)
        if ix.loop[n] is not None:
            # (inside a body: the buffer while it is written, a nested loop's too, as
            # `DirectAdjoint`'s scans are)
            continue
        if ix.nodes[n].kind in _STACKED:
            return False  # (the loop's result holds the fill: rows never written)
        # Before the loop: read by it, by another value holding the fill (checked here
        # in its turn: diffrax's `_allocate_output`, then Equinox's buffer rewrite), or,
        # with a finite result, by the loop's own machinery beside it (Equinox's check
        # of the loop's state), not by anything outside the stage holding the loop.
        around = {a for a in ix.ancestors(n) if a in holding_loops and a != ix.graph.root}
        reads = ix.out.get(n, ())
        if not reads or not all(
            ix.nodes[t].kind in _STACKED
            or t in holding_loops
            or ix.loop[t] is not None
            or t in fwd
            or around & set(ix.ancestors(t))
            for t in reads
        ):
            return False  # (read after the loop, or by nothing that loops)
    return True


def _tested_nans(ix: _Index, fwd: Mapping[str, _Flags]) -> list[str]:
    """The forward nodes holding NaN that a loop's body makes and only tests: every
    stage reading them returns booleans alone, so the NaN becomes no value (diffrax's
    implicit solvers: `VeryChord.terminate` divides its starting `diffsize = inf` and
    compares the NaN it gets in its convergence test, masked by `step >= 2`). Empty
    unless every NaN held is such: one NaN that reaches a float value keeps them all."""
    nans = [n for n, f in fwd.items() if "nan" in f.fwd_kinds]
    for n in nans:
        readers = _reading_equations(ix, n)
        if ix.loop[n] is None or not readers or not all(_tests(ix.nodes[r]) for r in readers):
            return []
    return nans


def _reading_equations(ix: _Index, n: str) -> list[str]:
    """`ix.consumers(n)`, each edge's lifted readers in its place where it has them (its
    `ends`: the comparison inside a line's box `jnp.where((f > 0) & ok, 0.0, s)`,
    whose own output is a float)."""
    targets, holder = ix._readers(n)
    out: list[str] = []
    for e in ix.graph.edges:
        if e.source == holder and e.target in targets:
            ends = getattr(e, "ends", ())
            out += [r for _, r in ends if r in ix.nodes] if ends else [e.target]
    return out


def _tests(node: Any) -> bool:
    """Whether a node returns booleans only (a comparison, `jnp.isfinite`, a test)."""
    shapes = getattr(node, "shapes", ()) or ()
    return bool(shapes) and all(str(s).startswith("bool") for s in shapes)


def _mask_in_loop(ix: _Index, fwd: Mapping[str, _Flags], origin: Origin) -> bool:
    """Whether the forward non-finite values of a run whose results are all finite are a
    mask's fill made inside a loop's body: ±Inf only, first put by a fill (`_fill_stage`:
    `jnp.where(mask, s, -jnp.inf)`, whose -Inf is the literal's, no overflow's) in a loop.
    An overflow there (`jnp.exp` at +Inf, masked) or a NaN keeps its origin."""
    node = origin.node
    if node is None or "nan" in _held(fwd) or ix.loop[node] is None:
        return False
    return _fill_stage(ix, node)


def _fill_stage(ix: _Index, n: str) -> bool:
    """`_is_fill` of a node or, for a call or a line's box (`where`, a `jit`), of every
    equation it holds: it only moves and selects values and constants."""
    if ix.nodes[n].kind == "eqn" or n in getattr(ix.graph, "constant_nodes", ()):
        return _is_fill(ix, n)
    inside = [m.id for m in ix.graph.nodes if m.kind == "eqn" and n in ix.ancestors(m.id)]
    return bool(inside) and all(_is_fill(ix, m) for m in inside)


def cotangent_bad_before(ix: _Index, flags: Mapping[str, _Flags], c: str, reach: str) -> bool:
    """Whether the cotangent of `c`, a reader of `reach`, was non-finite before `reach`'s
    became so (backward time): then `c`'s backward only passed a NaN on. In a loop, a
    reader NaN only at earlier iterations (a scan over layers carries the NaN back to
    the layers before) was finite at the iteration where `reach`'s turned."""
    f = flags.get(c)
    if f is None or not f.bwd:
        return False
    return ix.key(c, f.bwd_iter) > ix.key(reach, flags[reach].bwd_iter)


def _known(iteration: Sequence[float], loops: Sequence[str]) -> tuple[int, ...]:
    """The iterations known of the loops holding a node, the outermost first, up to the
    first unknown one (a while loop that kept its last iteration only)."""
    out: list[int] = []
    for k in range(len(loops)):
        if k >= len(iteration) or not math.isfinite(iteration[k]):
            break
        out.append(int(iteration[k]))
    return tuple(out)


def _grads_split(
    ix: _Index, bwd: Mapping[str, Any], upstream: set[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Which arguments' gradients hold NaN/Inf (an optimizer's update would apply them),
    by path (`parameters/reg`). Those whose values never reach the origin (`upstream`:
    what its values are made from) come second: another origin made theirs (a
    `where`-guarded `sqrt` and a `norm` at zero, each breaking one)."""
    grads = [k for k in sorted(bwd, key=ix.exit.__getitem__) if ix.nodes[k].kind == "input"]
    if not grads:
        return (), ()
    readers = getattr(ix.graph, "input_readers", None) or {}
    known = all(readers.get(k) and readers[k] <= ix.nodes.keys() for k in grads)
    # (a model read back from JSON does not say who reads an input: all are the origin's)
    # read by what the origin's values are made from, or by a call holding it (a
    # `jit` reads its parameters, its body their copies)
    near = upstream | {a for u in upstream for a in ix.ancestors(u)}
    mine = [k for k in grads if readers[k] & near] if known else grads
    mine = mine or grads
    other = [k for k in grads if k not in mine]
    named = {k: input_path(ix.path(k)) for k in grads}
    return tuple(named[k] for k in mine), tuple(named[k] for k in other)


def _upstream(ix: _Index, node: str) -> set[str]:
    """The nodes whose values `node`'s are made from: back along the edges; a value
    entering a scope reaches what it holds, and a scope's values come from what it
    holds."""
    holds: dict[str, list[str]] = {}
    for n in ix.nodes.values():
        if n.parent is not None:
            holds.setdefault(n.parent, []).append(n.id)
    seen: set[str] = set()
    todo = [node]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        todo += ix.into.get(n, ())
        for a in ix.ancestors(n):
            todo += ix.into.get(a, ())
        todo += holds.get(n, ())
    return seen


#: How many equations of a loop's body a forward message names as possible makers.
_CARRIED_NAMED = 3


def _carried(
    ix: _Index,
    node: str,
    fwd: Mapping[str, _Flags],
    probed: set[str],
    its: Sequence[float],
    fills: frozenset[str] = frozenset(),
) -> tuple[list[str], bool]:
    """What may have made the non-finite value the producer `node` (in a loop) reads from
    the loop's carry: the body's nodes after it, at an earlier iteration. None when
    `node` is at the first iteration of every loop holding it (the carry is then the
    loop's initial value, finite since `node` is the earliest). Probed nodes after it
    count when their iteration of that loop is unknown (a while loop keeps its last
    iteration: by then the NaN is everywhere in the body; an inner scan's iterations
    are summarised together, per iteration of the outermost loop only); those at a
    known iteration were finite before `node`'s, else they would come first. Those
    holding a kind what they read does not (`_fresh`: `log`'s -Inf among NaN) are
    named first, then those reading nothing known non-finite: in a scan over
    minibatches inside a scan over epochs, the first layer's `dot_general` holds NaN
    from the second minibatch, read from parameters the first one's `log` (later in
    the body) broke. `its`: `node`'s iteration (per loop). Returns (nodes, whether
    `locate` tells more: one is an unprobed equation, or `node`'s iteration of that
    loop is unknown). A literal's ±Inf (`fills`, as `find`) made none."""
    loops = ix.loops(node)
    at = [its[k] if k < len(its) else _INF for k in range(len(loops))]
    later = [k for k, i in enumerate(at) if i != 0]
    if not later:
        return [], False
    k = later[-1]
    loop = loops[k]  # the innermost loop whose carry it may have read
    body = {n for n in ix.nodes if loop in ix.ancestors(n)}
    mine = set(ix.ancestors(node))
    out: list[str] = []
    for n in sorted(body, key=lambda n: ix.nodes[n].order):
        if n in mine or n in fills or ix.exit[n] <= ix.exit[node]:
            continue
        if _same_code(ix, n, node) or _leaves_exact(ix, n, loop):
            continue  # (the origin's own line again; or its values leave as integers)
        if (
            n not in probed
            and _may_make(ix, n)
            and not _inside_finite(ix, n, loop, fwd, probed, at)
        ):
            out.append(n)
        elif n in fwd and n != node and not _known(fwd[n].fwd_iter, loops)[k:]:
            out.append(n)
    tier = {n: _fresh(ix, fwd, n, loop) if n in fwd else 2 for n in out}
    for n in [n for n in out if tier[n] < 2]:
        for a in ix.ancestors(n):  # (a stage fresh by a node it holds: the node names it)
            if tier.get(a, -1) >= tier[n]:
                tier[a] = 2
    out = sorted(out, key=tier.__getitem__)[:_CARRIED_NAMED]  # (stable: body order)
    # `locate`'s re-run decides: it probes every equation and keeps every iteration
    unknown = not math.isfinite(at[k])
    return out, bool(out) and (unknown or any(n not in probed for n in out))


def _same_code(ix: _Index, n: str, node: str) -> bool:
    """Whether `n` is, or lies in, another call of the producer `node`'s own line (a
    second layer's `where` at the same source; `helper#2` of `helper(helper(x))`):
    naming it names the origin's code again."""
    b = ix.nodes[node]
    if b.source is None:
        return False
    key = (re.sub(r"#\d+$", "", b.label), b.source)
    return any(
        (re.sub(r"#\d+$", "", ix.nodes[a].label), ix.nodes[a].source) == key
        for a in (n, *ix.ancestors(n))
    )


def _leaves_exact(ix: _Index, n: str, loop: str) -> bool:
    """Whether `n`'s values leave a stage of `loop`'s body holding only integers or
    booleans (`jax.random.categorical`'s `add` of its Gumbel noise, read by an
    `argmax`): no NaN/Inf of it reaches the carry."""
    for a in ix.ancestors(n):
        if a == loop:
            return False
        if not _inexact(ix.nodes[a]):
            return True
    return False


def _may_make(ix: _Index, n: str) -> bool:
    """Whether an unprobed node can make NaN/Inf of finite values: a floating equation
    that is no move (a `broadcast_in_dim` of the sampler's noise makes none)."""
    node = ix.nodes[n]
    return node.kind == "eqn" and _inexact(node) and node.primitive not in _MAKES_NONE


def _inside_finite(
    ix: _Index, n: str, loop: str, fwd: Mapping[str, _Flags], probed: set[str], its: Sequence[float]
) -> bool:
    """Whether `n` lies in a stage of `loop`'s body that is probed and was finite at every
    iteration before `its` (the producer's, per loop, the outermost first): its values
    left that stage finite (`jax.random.normal`'s `bitcast_convert_type` inside
    `normal`; a line whose NaN came at the producer's own iteration, read from it), so
    they made nothing the carry brought the producer."""
    depth = len(ix.loops(loop)) + 1  # (the loops up to `loop`, `loop` included)
    for a in ix.ancestors(n):
        if a == loop:
            return False
        if a in probed and _finite_before(fwd.get(a), its[:depth], depth):
            return True
    return False


def _finite_before(f: _Flags | None, its: Sequence[float], depth: int) -> bool:
    """Whether a node whose flags are `f` (None: finite) held only finite values at every
    iteration before `its` of the `depth` outermost loops holding it: nested loops run
    their iterations in lexicographic order. An iteration unknown (a while loop keeps
    its last): it may not have."""
    if f is None or not f.fwd:
        return True
    first = tuple(f.fwd_iter[:depth])
    known = len(first) == depth == len(its) and all(map(math.isfinite, (*first, *its)))
    return known and first >= tuple(its)


def _fresh(ix: _Index, fwd: Mapping[str, _Flags], n: str, loop: str) -> int:
    """How likely `n` made its non-finite values at an iteration of `loop`: 0 when it
    holds a kind none of the non-finite nodes it reads holds (`log` of a 0 probability:
    -Inf, reading a NaN softmax), 1 when it reads none known non-finite (it made them,
    or read them from the loop's carry, as the first layer reads the parameters), 2
    when what it reads explains them. A node with no edge into it at its level reads
    what its stage reads (up to `loop`)."""
    cur = n
    while not ix.into.get(cur) and cur != loop and ix.nodes[cur].parent is not None:
        cur = ix.nodes[cur].parent
    sources = [s for s in ix.into.get(cur, ()) if s in fwd]
    if not sources:
        return 1
    read = frozenset().union(*(fwd[s].fwd_kinds for s in sources))
    return 0 if fwd[n].fwd_kinds - read else 2


def _inexact(node: Any) -> bool:
    """Whether a node may hold floating values (its shapes, "float32[2]", say so; none
    known: it may). An integer `add` (a loop's counter) holds no NaN."""
    shapes = getattr(node, "shapes", ()) or ()
    return not shapes or any(str(s).startswith(("float", "bfloat", "complex")) for s in shapes)


def _without_outputs(ix: _Index, bwd: dict[str, _Flags]) -> dict[str, _Flags]:
    """`bwd` without the outputs, unless only outputs are in it. An output is probed
    where its value is made, so its cotangent is dloss/dvalue and exists when its
    producer's does, not last; that producer's probe, or the gradients the cotangent
    flows back to, see it too. Left in, an aux output the loss also read was taken for
    where a NaN reached, with no consumer to blame."""
    inner = {n: f for n, f in bwd.items() if n not in ix.outputs}
    return inner or bwd


#: Primitives whose backward rule, on finite values and a finite cotangent, gives a
#: finite cotangent (short of overflow): sums, products, moves and selections.
_PLAIN_BACKWARD = frozenset(
    {
        "add", "add_any", "sub", "neg", "mul", "dot_general", "reduce_sum", "broadcast_in_dim",
        "reshape", "transpose", "squeeze", "expand_dims", "convert_element_type", "copy",
        "concatenate", "slice", "dynamic_slice", "dynamic_update_slice", "pad", "select_n",
        "gather", "scatter-add", "rev",
    }
)  # fmt: skip


def _value_bad(flags: _Flags | None) -> bool:
    """Whether a node's forward values themselves (not only their tangents) hold NaN/Inf:
    what its backward rule reads, and so what can make its cotangents non-finite."""
    return flags is not None and flags.fwd and flags.fwd_value


def _enters_bad(ix: _Index, flags: Mapping[str, _Flags], node: str) -> bool:
    """Whether an unprobed equation may read non-finite forward values from outside its
    stage: a value entering the stage holds them. Edges are drawn between siblings, so
    what it reads from outside is drawn as read by its stage (PPO's `ratio * adv` in
    `pg` reads the NaN of `adv = (adv - mean) / std`: its backward makes a NaN of that
    NaN, as `locate` then sees, not of finite values)."""
    parent = ix.nodes[node].parent
    if parent is None or parent == ix.graph.root:
        return False
    return any(_value_bad(flags.get(s)) for s in ix.into.get(parent, ()))


def _plain_backward(node: Any, flags: _Flags | None) -> bool:
    return node.kind == "eqn" and node.primitive in _PLAIN_BACKWARD and not _value_bad(flags)


def backward_suspicion(ix: _Index, flags: Mapping[str, _Flags], c: str) -> tuple[bool, int]:
    """Sort key of the readers that may have made a cotangent non-finite, the likeliest
    first: the latest runs first backward, but an equation whose backward only
    multiplies and moves finite values (`sub`, `mul`, reshapes) comes after one that can
    make a NaN of them (`sqrt` at 0), unless its own values are not finite. A value
    read by both (NumPyro scores a sample site `v` with `(v - loc) / scale` after the
    model's `jnp.sqrt(v)`) is the `sqrt`'s."""
    return _plain_backward(ix.nodes[c], flags.get(c)), -ix.exit[c]


#: Primitives that only move, select or compare values: a non-finite value in their
#: output was in an input (a literal's fill, `jnp.where(mask, s, -jnp.inf)`), never made
#: from finite values as an overflow (`mul`, `exp`, `dot_general`) makes one.
_MOVES = frozenset(
    {
        "select_n", "broadcast_in_dim", "reshape", "transpose", "squeeze", "expand_dims",
        "copy", "copy_p", "concatenate", "slice", "dynamic_slice", "dynamic_update_slice",
        "pad", "gather", "scatter", "rev", "reduce_max", "reduce_min", "max", "min", "neg",
        "abs", "sort", "iota", "stop_gradient", "optimization_barrier",
        # Equinox's conditional `dynamic_update_slice` and `select`: diffrax writes its
        # +Inf-filled output buffer with them
        "maybe_set", "select_if_vmap",
    }
)  # fmt: skip
#: Of those, the ones that make no NaN/Inf of finite values: a `gather` does (`jnp.take`
#: fills an out-of-bounds index with NaN).
_MAKES_NONE = _MOVES - {"gather"}


def _producer(
    ix: _Index,
    fwd: Mapping[str, _Flags],
    among: Mapping[str, _Flags],
    fills: frozenset[str] = frozenset(),
) -> tuple[str, str | None, str | None, tuple[float, ...]]:
    """The forward origin among the non-finite nodes `among` (those of `fwd` whose values
    reach a result), in order of their first non-finite iteration. Kinds: NaN and Inf
    (+Inf and -Inf alike: a sign flip makes no new value); "the results' kind" is any
    kind the results hold. Nodes holding it compare by the first iteration holding it
    (when `locate`'s count run knows it): a loop that carries a +Inf fill from its
    first iteration (Equinox's `while_loop`) and writes the NaN `sqrt` made at the 7th
    came after that `sqrt`, not at iteration 0.

    1. No node but the results holds the results' kind (what is non-finite is a
       gradient, or only the results): the earliest node not in `fills` (a literal's
       ±Inf, `jnp.clip(dt, max=jnp.inf)` in `odeint`'s loop, read by every iteration,
       holds its Inf from the first: no place a problem was born) is the origin; when
       that is a ±Inf fill, the first NaN after it (`_nan_after_fill`).
    2. The earliest node holds the results' kind, no later than any other: it is the
       origin.
    3. Else the earliest node holding the results' kind (`n`: a NaN result after an
       earlier +Inf, as diffrax fills its output buffer with +Inf before the solve
       writes it) is, unless the earliest node made what followed. That maker is the
       earliest node itself or, when it is a fill, the overflow after it
       (`_overflow_after_fill`: the vector field's `y ** 2` at y ~ 1e37); it is the
       origin, with `n` as what it led to, when it computes (an overflow: `mul`,
       `exp`; not a fill that `select_n` or `broadcast_in_dim` moves, nor one made
       from literals alone), held none of the results' kind at its first iteration
       (a `div` in a loop that makes +Inf at iteration 0 holds, from iteration 1, the
       NaN its +Inf led to), and the results hold NaN or `n` is a fill (no arithmetic
       makes ±Inf of a NaN: ±Inf results after a NaN were put in its place, tinygp's
       `jnp.where(jnp.isfinite(ll), ll, -jnp.inf)` after a failed `cholesky`).

    The earlier node passed over is named (`_named_earlier`) beside an origin that is
    not the earliest. Returns (origin, earlier node passed over, later node it led to,
    the origin's first iteration holding what made it the origin)."""
    order = sorted(among, key=lambda n: ix.key(n, among[n].fwd_iter))
    first = order[0]

    def kinds(n: str, first_iteration: bool = False) -> frozenset[str]:
        held = fwd[n].first_kinds() if first_iteration else fwd[n].fwd_kinds
        return frozenset("inf" if k.endswith("inf") else k for k in held)

    results = frozenset().union(*(kinds(n) for n in fwd if n in ix.outputs))
    raw = [k for k in _KINDS if ("inf" if k.endswith("inf") else k) in results]

    def when(n: str) -> tuple[tuple[float, float], ...]:  # first holding the results' kind
        return ix.key(n, fwd[n].first_of(raw))

    holding = sorted((n for n in among if kinds(n) & results and n not in ix.outputs), key=when)
    if not holding:  # 1.
        first = next((n for n in order if n not in fills), first)
        nan = _nan_after_fill(ix, fwd, order, first, kinds)
        if nan is not None:
            return nan, _named_earlier(ix, order, order[0], nan), None, fwd[nan].first_of(["nan"])
        return first, None, None, fwd[first].first_of(raw)
    if kinds(first) & results and when(first) <= when(holding[0]):  # 2.
        return first, None, None, fwd[first].first_of(raw)  # (no `raw`: its first of any)
    n = holding[0]  # 3.
    made = first
    if first in fills or _fill_stage(ix, first):
        overflow = _overflow_after_fill(ix, fwd, order, first, n, fills)
        made = first if overflow is None else overflow
    if _computes(ix, made) and not _is_fill(ix, made) and not kinds(made, True) & results:
        if "nan" in results or _is_fill(ix, n):
            earlier = None if made == first else _named_earlier(ix, order, first, made)
            return made, earlier, n, fwd[made].fwd_iter
    return n, _named_earlier(ix, order, first, n), None, fwd[n].first_of(raw)


def _overflow_after_fill(
    ix: _Index,
    fwd: Mapping[str, _Flags],
    order: Sequence[str],
    fill: str,
    until: str,
    fills: frozenset[str],
) -> str | None:
    """Where the values went wrong after a ±Inf fill, the earliest non-finite node
    (diffrax's output buffer `jnp.full(n, direction * jnp.inf)`, moved into its loop),
    which made nothing: the first node of `order` before `until` (the first holding
    what the results hold) that made its non-finite values from finite ones
    (`_overflow`: it computes, holds no fill, reads no node non-finite before it, so a
    GAT's `segment_max` passing a masked node's -Inf on is none), and is not a stage
    holding the fill (the line box `m = segment_max(x * w, ...)` around an empty
    segment's -Inf computes `x * w`, and made no Inf). None when there is none."""
    before = order[: order.index(until)] if until in order else order
    around = set(ix.ancestors(fill))
    return next((m for m in before if m not in around and _overflow(ix, fwd, m, fills)), None)


def _nan_after_fill(
    ix: _Index,
    fwd: Mapping[str, _Flags],
    order: Sequence[str],
    first: str,
    kinds: Callable[[str], frozenset[str]],
) -> str | None:
    """With no non-finite result to go by (a padded GNN's loss masks its padding nodes:
    finite, its gradients NaN), the first node holding NaN when `first` is a ±Inf fill
    (`jnp.where(edge_mask, s, -jnp.inf)`), not an overflow: the fill made nothing, the
    NaN (`s - segment_max(s)[ids]` at a node with no unmasked edge) is where the value
    went wrong, as when the results hold it. None when `first` holds NaN, computed its
    ±Inf (an overflow stays the origin of the NaN made of it), or no NaN follows but
    those a loop only tests (`_tested_nans`)."""
    if "nan" in kinds(first) or (_computes(ix, first) and not _is_fill(ix, first)):
        return None
    # (NaNs a loop's step makes and only tests become no value: the fill stays first,
    # for `_loop_fill` to call it the library's)
    tested = set(_tested_nans(ix, fwd))
    nans = [n for n in order if "nan" in kinds(n) and n not in ix.outputs and n not in tested]
    return min(nans, key=lambda n: ix.key(n, fwd[n].first_of(["nan"])), default=None)


def _named_earlier(ix: _Index, order: Sequence[str], first: str, origin: str) -> str:
    """The earlier node to name beside the origin: `first`, unless it is a constant (a
    literal's cast, `-jnp.inf` made a float32: `convert_element_type` told the user
    nothing), then the first node after it that is none, before the origin (the
    `where` that put the -Inf into the logits)."""
    constants = getattr(ix.graph, "constant_nodes", ())
    if first not in constants:
        return first
    for n in order:
        if n == origin:
            break
        if n not in constants and ix.nodes[n].kind == "eqn":
            # by the library call holding it, as the user wrote it on that line
            # (`where`, not its `select_n`): a `jit` whose equations carry its call's line
            up = ix.nodes.get(ix.nodes[n].parent)
            called = up is not None and up.kind == "jit" and up.source == ix.nodes[n].source
            return up.id if called else n
    return first


def _computes(ix: _Index, n: str) -> bool:
    """Whether a node is an equation, or a line's box of equations only (`h = x * gate`,
    named by what it assigns), one of which computes (not a fill's move): an overflow
    there is born there, as in the equation it holds."""
    node = ix.nodes[n]
    if node.kind == "eqn":
        return True
    if node.kind != "scope":
        return False
    inside = [c for c in ix.graph.nodes if c.parent == n]
    return (
        bool(inside)
        and all(c.kind == "eqn" for c in inside)
        and any(c.primitive not in _MOVES for c in inside)
    )


def _overflow(ix: _Index, fwd: Mapping[str, _Flags], n: str, fills: frozenset[str]) -> bool:
    """Whether `n` computed its non-finite values from finite ones: it computes, holds no
    fill, and reads no node non-finite before it (a GAT's `segment_max` of a fully
    masked node's -Inf scores passes the fill on)."""
    if not _computes(ix, n) or _filled(ix, n, fills):
        return False
    at = ix.key(n, fwd[n].fwd_iter)
    return not any(s in fwd and ix.key(s, fwd[s].fwd_iter) <= at for s in ix.into.get(n, ()))


def _filled(ix: _Index, n: str, fills: frozenset[str]) -> bool:
    """Whether a node only holds a fill: a literal's (`fills`), a constant's, or what
    floating equations that only move and select put (`_fill_stage`; an index's integer
    arithmetic beside them makes no Inf: diffrax's `_BufferItem.set`)."""
    if n in fills or _fill_stage(ix, n):
        return True
    if ix.nodes[n].kind == "eqn":
        return False
    inside = [m for m in ix.graph.nodes if m.kind == "eqn" and n in ix.ancestors(m.id)]
    floats = [m.id for m in inside if _inexact(m)]
    return bool(floats) and all(m in fills or _is_fill(ix, m) for m in floats)


def _is_fill(ix: _Index, n: str) -> bool:
    """Whether a node's non-finite values are a fill, never made of finite values: a
    constant (`-jnp.inf` made a float32) or an equation that only moves or selects
    (`select_n` of a literal `-inf`)."""
    return ix.nodes[n].primitive in _MOVES or n in getattr(ix.graph, "constant_nodes", ())


#: Reductions whose identity is an Inf, what an empty segment or axis gives by design:
#: -Inf for a max (`jax.ops.segment_max`, `lax.reduce_max`), +Inf for a min.
_IDENTITY = {
    "scatter-max": "neginf",
    "reduce_max": "neginf",
    "scatter-min": "posinf",
    "reduce_min": "posinf",
}


def _identity_kinds(ix: _Index, n: str) -> frozenset[str]:
    """The Inf kinds `n`'s values may hold as an empty max/min reduction's identity: of
    such an equation, or of a stage of such equations and moves only (`segment_max`:
    a broadcast `-inf`, the segment ids, `scatter-max`); none for a stage that computes
    (a `log` beside the max may have made the -Inf)."""
    node = ix.nodes[n]
    eqns = [node] if node.kind == "eqn" else [c for c in ix.graph.nodes if c.parent == n]
    if not eqns or any(c.kind != "eqn" for c in eqns):
        return frozenset()
    if any(
        _inexact(c) and c.primitive not in _MOVES and c.primitive not in _IDENTITY for c in eqns
    ):
        return frozenset()
    return frozenset(_IDENTITY[c.primitive] for c in eqns if c.primitive in _IDENTITY)


def _identity_fills(ix: _Index, flags: Mapping[str, _Flags]) -> set[str]:
    """The nodes whose non-finite values are all an empty reduction's identity
    (`_identity_kinds`) and read no non-finite value but a constant's (the `-inf` the
    reduction starts from): not made of data holding -Inf, a fill, as a constant's. So
    is a stage whose values are such a node's (the line `m = jax.ops.segment_min(x * w,
    ...)` once `locate` probed its `scatter-min`: its `mul` made nothing)."""
    constants = getattr(ix.graph, "constant_nodes", ())
    out: set[str] = set()
    for n in sorted(flags, key=lambda n: -ix.depth[n]):  # (the deepest first)
        f = flags[n]
        if not f.fwd:
            continue
        sources = ix.into.get(n, ())
        if any(s in flags and flags[s].fwd and s not in constants for s in sources):
            continue
        if f.fwd_kinds <= _identity_kinds(ix, n) or _holds_only(ix, flags, n, out):
            out.add(n)
    return out


def _holds_only(ix: _Index, flags: Mapping[str, _Flags], n: str, fills: set[str]) -> bool:
    """Whether stage `n`'s non-finite values are those of `fills` among its children:
    every child holding non-finite values is one, or is read inside `n` by one only."""
    bad = [c.id for c in ix.graph.nodes if c.parent == n and c.id in flags and flags[c.id].fwd]
    read_by_fills = [c for c in bad if ix.out.get(c) and set(ix.out[c]) <= fills]
    if not bad or not all(c in fills or c in read_by_fills for c in bad):
        return False
    return any(c in fills and c not in ix.out for c in bad)  # (one holds its values)


def _identity_read(
    ix: _Index,
    flags: Mapping[str, _Flags],
    probed: set[str],
    n: str,
    results_finite: bool | None,
) -> bool:
    """Whether an identity fill's value (`_identity_fills`) is read on towards a result:
    by an output (the -Inf of an isolated node's features returned), or, the results not
    all finite, by a reader not known finite (unprobed: it may have passed it on)."""
    targets, holder = ix._readers(n)
    if any(t in ix.outputs for t in ix.out.get(holder or n, ())):
        return True
    if results_finite is True:
        return False
    return any(t not in probed and _inexact(ix.nodes[t]) for t in targets)


class _Reach:
    """Whether a non-finite forward value of a node can reach a non-finite result, from
    the graph's edges and which nodes hold non-finite values: through a reader holding
    non-finite values (or unprobed: it may), up to an output. A value every reader of
    which is finite was masked (`jnp.where`). A value with no reader at its level leaves
    its stage: it reaches what the stage's values reach. One with readers may leave it
    too (edges are drawn between siblings): so it does unless another of the stage's
    values, non-finite and read by nothing inside, explains the stage's. Unknown
    (no edges, a cycle): it reaches. Each node is decided once. `readers`, when given,
    names the readers of a value with none at its level exactly: a residual that
    leaves its stage for a later one (`sqrt`'s derivative `0.5 / sqrt(x)`, made in
    `energy` and read by `energy (backward)` under a `jax.grad` in the forward pass)
    reaches through them, not through what its stage's other values reach."""

    def __init__(
        self,
        ix: _Index,
        flags: Mapping[str, _Flags],
        probed: set[str],
        readers: Callable[[str], Sequence[str]] | None = None,
    ) -> None:
        self.ix, self.flags, self.probed, self.readers = ix, flags, probed, readers
        self.memo: dict[str, bool] = {}
        self.children: dict[str, list[str]] = {}
        self.explain: dict[str, list[str]] = {}
        for n in ix.graph.nodes:
            if n.parent is not None:
                self.children.setdefault(n.parent, []).append(n.id)

    def finite(self, n: str) -> bool:
        """Whether `n`'s forward values are known finite (probed, or holding no floats)."""
        bad = n in self.flags and self.flags[n].fwd
        return not bad and (n in self.probed or not _inexact(self.ix.nodes[n]))

    def bad_for(self, t: str, n: str) -> bool:
        """Whether reader `t` may hold non-finite values made of `n`'s: not known finite
        and, in a loop holding both, non-finite at the first iteration `n` is (later,
        what else the loop carries may have made its NaN: a `tanh` that saturated an
        overflow inside `gelu` at iteration 1 is finite there, NaN from iteration 2)."""
        if self.finite(t):
            return False
        f, g = self.flags.get(t), self.flags.get(n)
        if f is None or not f.fwd or g is None:
            return True  # (unprobed: it may)
        shared = 0
        for a, b in zip(self.ix.loops(t), self.ix.loops(n), strict=False):
            if a != b:
                break
            shared += 1
        ti, ni = f.fwd_iter[:shared], g.fwd_iter[:shared]
        if len(ti) < shared or len(ni) < shared or not all(map(math.isfinite, ti + ni)):
            return True  # an iteration unknown: it may
        return ti <= ni

    def __call__(self, n: str) -> bool:
        if n in self.memo:
            return self.memo[n]
        self.memo[n] = True  # a cycle (a loop's carry): it may
        ix = self.ix
        targets = ix.out.get(n, [])
        if not targets and n not in ix.outputs and self.readers is not None:
            exact = list(self.readers(n))
            if exact:  # (its stage's other values then tell nothing of it)
                out = any(self.bad_for(t, n) and self(t) for t in exact)
                self.memo[n] = out
                return out
        out = n in ix.outputs or any(self.bad_for(t, n) and self(t) for t in targets)
        parent = ix.nodes[n].parent
        if not out and parent is not None and parent != ix.graph.root:
            # (in a loop, judged at `n`'s first non-finite iteration: a stage finite then
            # did not pass `n`'s values on, and a sibling non-finite only later does not
            # explain the stage's: a NaN from iteration 1 does not explain the +Inf that a
            # `jax.grad` in the loop's body made at iteration 0, `norm`'s derivative at 0)
            explained = targets and any(
                c != n and self.bad_for(c, n) for c in self.explaining(parent)
            )
            out = self.bad_for(parent, n) and not explained and self(parent)
        elif not out and not targets:
            out = True  # read by nothing we know of at the top level: unknown
        self.memo[n] = out
        return out

    def explaining(self, parent: str) -> list[str]:
        """`parent`'s children holding non-finite values that nothing inside it reads:
        its values, which explain its own being non-finite (in a loop, from each one's
        first non-finite iteration on)."""
        if parent not in self.explain:
            flags, out = self.flags, self.ix.out
            holds = (c for c in self.children.get(parent, ()) if c not in out)
            self.explain[parent] = [c for c in holds if c in flags and flags[c].fwd]
        return self.explain[parent]

    def masker(self, n: str) -> str | None:
        """The first reader, past the non-finite ones, whose values are finite: what masked
        `n`'s (a `jnp.where`); None when none is known. A value read by nothing at its
        level is its stage's: the stage's readers read it."""
        ix = self.ix
        while n not in ix.out and ix.nodes[n].parent not in (None, ix.graph.root):
            n = ix.nodes[n].parent
        todo, seen = list(ix.out.get(n, ())), {n}
        while todo:
            t = todo.pop(0)
            if t in seen:
                continue
            seen.add(t)
            if t in self.probed and self.finite(t):
                return t
            todo += ix.out.get(t, ())
        return None


def with_equations(
    o: Origins,
    graph: Any,
    forward: Equation | None,
    backward: Equation | None,
    into: Any = None,
) -> Origins:
    """`o` with the equations `locate` found, named in the messages ("`rsqrt` in
    `LayerNorm_0` at models.py:112"), each origin's stage path, and `located` set.
    `into`: the library call (`norm`) holding both the backward origin and the equation
    its cotangent reaches, which the message names by the call's input, what the user's
    line passed it, not by that equation (`norm`'s `reduce_sum`)."""
    ix = _Index(graph)

    def stage(origin: Origin) -> Any:
        return _drawn(ix, ix.nodes[origin.node]) if origin.node else None

    fwd, bwd = o.forward, o.backward
    if fwd is not None and forward is not None:
        loops = [ix.nodes[lp] for lp in ix.loops(forward.node)]
        msg = f"first made by {equation_name(stage(fwd), forward)}"
        msg += at_iteration(loops, fwd.iteration)
        msg += devices_said(fwd.message)  # kept: which devices of a shard_map made them
        # kept: what follows the name (the NaN it led to, the loop's carry, what came
        # before it, a masked value, `IN_TANGENT`), from the first of them on
        tails = [fwd.message.find(m) for m in (LED_TO, LOOP_CARRIED, EARLIER, MASKED, IN_TANGENT)]
        tails = [i for i in tails if i >= 0]
        if tails:  # (located: no promise that locating tells more)
            msg += fwd.message[min(tails) :].replace(NAMES_THE_EQUATION, "")
        fwd = replace(fwd, equation=forward, message=msg)
    if bwd is not None and backward is not None:
        target = backward.reaching if bwd.reaching == bwd.node else bwd.reaching
        loops = [ix.nodes[lp] for lp in ix.loops(backward.reaching or target)] if target else []
        at = at_iteration(loops, bwd.iteration)
        reach = f", reaching {stage_name(ix.nodes[target])}{at}" if target else ""
        if target and into is not None:
            reach = f", reaching {input_of(into)}{at}"
        box = stage(bwd)
        inside = bwd.reaching == bwd.node and box is not None and box.id != backward.node
        if inside and box.label == backward.primitive:
            # (the box of a `jnp.linalg.eigh` call, named as its primitive: the equation
            # reached is that call's plumbing, `(a + a.T) / 2`, no line of the program;
            # the gradients named after it say where the NaN lands)
            reach = at
        from_forward = bwd.message.startswith(FROM_FORWARD)
        name = equation_name(box, backward)
        msg = backward_sentence(name, reach, from_forward, in_rule=bool(backward.within))
        _, grads, said = bwd.message.partition(NONFINITE_GRADS)  # kept, as `EARLIER` is
        msg += grads + said
        bwd = replace(bwd, equation=backward, message=msg, follows_forward=from_forward)
    fwd = fwd and replace(fwd, path=ix.path(fwd.node))
    bwd = bwd and replace(bwd, path=ix.path(bwd.node))
    return with_message(replace(o, forward=fwd, backward=bwd, located=True))


def _drawn(ix: _Index, stage: Any) -> Any:
    """The box the picture labels `stage` by: the numbered call (`binary_operator#4`, one
    of `lax.associative_scan`'s calls of your `binary_operator`) whose sole child it is,
    when it is a call of the same function, else `stage` itself."""
    parent = ix.nodes.get(stage.parent) if stage.parent is not None else None
    if parent is None or not re.fullmatch(re.escape(stage.label) + r"#\d+", parent.label):
        return stage
    siblings = [n for n in ix.graph.nodes if n.parent == parent.id]
    return parent if len(siblings) == 1 else stage


# ---------------------------------------------------------------------------
# A model that travelled as JSON (a saved model, a run log, a test fixture).


def model_origins(
    model: Mapping[str, Any], *, step: int | None = None, expect_nonfinite: Sequence[str] = ()
) -> dict[str, Any] | None:
    """The `"nonfinite"` record of a model dict (sowviz/1) from its probes: the same rule
    for a model that was saved or built by hand."""
    found = find(json_probes(model), JsonGraph(model), step=step, expect_nonfinite=expect_nonfinite)
    return None if found is None else found.to_dict()
