"""Identical repeated blocks: a run of sibling stages with one structure becomes one node.

Twenty-four transformer layers `layers[0]` … `layers[23]` are one stacked node
`layers[0–23] (×24)` holding the 24 layer stages, so a level shows the model's
shape instead of a column of look-alikes; expanding it shows every layer and its
own probes, and the front end charts each probe statistic per repeat
(`js/src/repeats.js`).

What counts as a repeat (`merge`):

* consecutive siblings, each a stage (not a scope sowviz made: a fold of unscoped
  equations, a cond branch or a while body; nor a group of inputs or outputs), at least
  `MIN_RUN` of them, or siblings with the same few equations between each two (a
  Python loop slicing its input before each call, `attn(x[:, t:t + 1])`: `_separated`;
  also a library's stage whose values go beside the blocks, a decode loop's
  `log_softmax(logits)` kept per token; a `sow` of each pass's value; a decode loop's
  slice, key split and sampling around each call of the model), those equations
  then going into the group with the blocks; two blocks each with their own (the same
  work in both passes, before the first block or after the last too: a network,
  `max`, then the network again is no two passes);
* named alike: their labels are equal once digits are masked (`layers[0]`,
  `layers[1]`; `layers[2]: Linear`) or once the `#k` index of a reused label is
  dropped (`block`, `block#2`), so parallel look-alikes with their own names
  (`query`, `key`, `value`) stay apart;
* with one structure: the same kinds, primitives, output shapes, types read and
  labels of every node inside (a module stage's alike, as above: a `checkpoint` per layer
  holds `blocks[0]`, the next `blocks[1]`), recursively, and the same edges between them
  (`_Signatures`). Blocks that differ in any shape or operation are not merged.

The group is a `scope` node with `repeats` = the number of blocks, inserted just
before its first block, which makes it the blocks' parent; ids are renumbered in
walk order, so they stay `n<order>` and depend only on the program. Edges between
a block and a node outside the run are lifted to the group. When the blocks form
a chain (each feeds the next), the group is probed on the last block's values,
its output, like any stage.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Sequence
from typing import Any

from . import frameworks
from .model import STAGE_KINDS, Edge

#: The fewest consecutive alike blocks that are merged.
MIN_RUN = 2
#: The most equations between two blocks of a run (`_separated`): a decode loop's
#: `toks[-1][:, None]`, then after the model `[:, 0]`, a `sow` of the logits, the key
#: split and the sampling.
MAX_SEPARATORS = 5
#: The most nodes the first picture draws when the model's module starts open.
FIRST_VIEW = 60

#: How the types of values that are work to see begin: floating (`float32[4]`,
#: `bfloat16[2]`, `complex64[]`) and signed integers (a decode loop's sampled tokens,
#: `int32[2]`), not keys (`uint32[2]`, `key<fry>[]`).
_WORK = ("f", "bf", "c", "int")
#: Stages that are one call of a library's function (`jax.nn.log_softmax`, a `jit`; a
#: `custom_jvp` activation): between two blocks, the pass's own work, as an equation is.
_LIBRARY_STAGES = frozenset({"jit", "custom"})
_DIGITS = re.compile(r"\d+")
#: Loop stages: one holding most of a plain-function program starts open (`open_model`).
_LOOPS = frozenset({"scan", "while"})
_INDEX = re.compile(r"#\d+$")


def pattern(label: str) -> str:
    """What alike labels share: digits masked, a reuse index `#k` dropped."""
    return _DIGITS.sub("#", _INDEX.sub("", label))


def repeat_label(labels: Sequence[str]) -> str:
    """`layers[0–23] (×24)`: the one number that varies as a range; else the shared name."""
    n = len(labels)
    bases = {_INDEX.sub("", x) for x in labels}
    if len(bases) == 1:  # `block`, `block#2`, …
        return f"{bases.pop()} (×{n})"
    parts = [_DIGITS.split(x) for x in labels]
    nums = [_DIGITS.findall(x) for x in labels]
    varying = [k for k in range(len(nums[0])) if len({ns[k] for ns in nums}) > 1]
    if len(varying) == 1 and all(len(ns) == len(nums[0]) for ns in nums):
        k = varying[0]
        vals = [int(ns[k]) for ns in nums]
        step = all(b - a == 1 for a, b in itertools.pairwise(vals))
        span = f"{nums[0][k]}–{nums[-1][k]}" if step else f"{nums[0][k]}…{nums[-1][k]}"
        out = parts[0][0]
        for j, num in enumerate(nums[0]):
            out += (span if j == k else num) + parts[0][j + 1]
        return f"{out} (×{n})"
    return f"{labels[0]} … {labels[-1]} (×{n})"


def _inner_label(label: str, outer: str) -> str:
    """A label inside a block as blocks compare it: a module stage's alike (`pattern`),
    also one named after the trace (`blocks[1].rope: RotaryPositionalEmbedding`, a copy
    `jax.vmap` made inside `blocks[1]`'s attention: its class after its path), and the
    one its parent `outer` is named after (a Linen or Haiku remat `checkpoint(block_0)`
    holding the module scope `block_0`: the next one's `block_1` is the same module of
    the next pass, as the parents' labels, compared alike, say), any other exactly
    (sows and named scopes are the user's own names)."""
    named_after = outer.endswith(f"({label})")
    alike = named_after or label in frameworks.pushed() or ": " in label
    return pattern(label) if alike else label


class _Signatures:
    """Structure ids of subtrees: equal ids ⇔ equal structure (interned tuples)."""

    def __init__(
        self, recs: Sequence[Any], kids: dict[str, list[Any]], edges, names: dict[str, tuple]
    ) -> None:
        self.table: dict[tuple, int] = {}
        self.of: dict[str, int] = {}
        # Alike but for the values leaving a scope (`shapes`, and the names they show): a
        # Python loop's last pass, whose new cache nobody reads, makes what the others
        # make; only what leaves it differs (`_dead_outputs`).
        self.loose: dict[str, int] = {}
        pos = {r.id: i for rs in kids.values() for i, r in enumerate(rs)}
        inner: dict[str, list[tuple]] = {}  # parent id -> edges among its children
        parent = {r.id: r.parent for r in recs}
        for e in edges:
            p = parent.get(e.source)
            inner.setdefault(p, []).append((pos[e.source], pos[e.target], e.shape, e.dtype))
        for r in reversed(recs):  # children come after their parent
            # module stages inside named alike: `checkpoint`s holding `blocks[0]`, `blocks[1]`
            ch = tuple((_inner_label(c.label, r.label), self.of[c.id]) for c in kids.get(r.id, ()))
            # and the names of the values it shows: two calls of one Tesseract reading
            # different outputs (`result`, then `normed_result`) are no repeats
            key = (r.kind, r.primitive, r.shapes, r.n_eqns, ch, tuple(inner.get(r.id, ())))
            # and the types it reads: two blocks making one type from different ones
            # (`Block(4, 16)`, then `Block(16, 16)`) are no repeats
            key += (names.get(r.id, ()), tuple(sorted(r.takes)))
            self.of[r.id] = self.table.setdefault(key, len(self.table))
            inside = kids.get(r.id, ())
            ch = tuple((_inner_label(c.label, r.label), self.loose[c.id]) for c in inside)
            leaving = () if r.kind == "scope" and inside else (r.shapes, names.get(r.id, ()))
            loose = ("loose", r.kind, r.primitive, r.n_eqns, ch, tuple(inner.get(r.id, ())))
            loose += (leaving, tuple(sorted(r.takes)))
            self.loose[r.id] = self.table.setdefault(loose, len(self.table))


def merge(builder: Any) -> list[Any]:
    """Group the repeated blocks of every level of `builder` (a `build._Builder` after
    its walk, labels final): rewrites its `recs`, `edges`, `points`, `sows`,
    `custom_calls` and `notes` in place, and returns the new `recs`."""
    recs = builder.recs
    kids: dict[str, list[Any]] = {}
    for r in recs:
        if r.parent is not None:
            kids.setdefault(r.parent, []).append(r)
    with_inputs = set()
    for r in reversed(recs):
        if r.kind in ("input", "output") and r.parent is not None:
            with_inputs.add(r.parent)
        if r.id in with_inputs and r.parent is not None:
            with_inputs.add(r.parent)
    shown = {p.node: p.names for p in builder.points if p.names}
    signatures = _Signatures(recs, kids, builder.edges.values(), shown)
    sig = signatures.of

    def member(r: Any) -> bool:
        return r.kind in STAGE_KINDS and not r.made and r.id not in with_inputs

    readers: dict[str, list[str]] = {}
    for s, t in builder.edges:
        readers.setdefault(s, []).append(t)
    by_id = {r.id: r for r in recs}

    def on_the_way(r: Any, key: tuple) -> bool:
        # `r`'s values reach a block alike within the few nodes a gap holds
        ids = [r.id]
        for _ in range(MAX_SEPARATORS):
            ids = [t for s in ids for t in readers.get(s, ())]
            if any(member(by_id[t]) and _key(by_id[t], sig) == key for t in ids):
                return True
        return False

    runs: list[list[Any]] = []
    extras: list[list[Any]] = []  # per run, the equations between its blocks
    for siblings in kids.values():
        i = 0
        while i < len(siblings):
            j = i + 1
            if member(siblings[i]):
                key = _key(siblings[i], sig)
                while j < len(siblings) and member(siblings[j]) and _key(siblings[j], sig) == key:
                    j += 1
                if (
                    j < len(siblings)
                    and member(siblings[j])
                    and _dead_outputs(siblings[j], siblings[j - 1], signatures)
                ):
                    j += 1
                if j - i < MIN_RUN:
                    blocks, between, end = _separated(
                        siblings, i, key, signatures, member, builder.edges, on_the_way
                    )
                    if len(blocks) >= MIN_RUN:
                        runs.append(blocks)
                        extras.append(between)
                        i = end
                        continue
            if j - i >= MIN_RUN:
                runs.append(siblings[i:j])
                extras.append([])
            i = j
    if runs:
        _insert(builder, runs, extras)
    return builder.recs


def _dead_outputs(r: Any, prev: Any, signatures: _Signatures) -> bool:
    """Whether block `r`, after `prev`, is a pass like it whose values leave it only in
    part: a Python loop's last pass (`h, cache = step(w, x, cache, i)`, the last new
    cache read by no one) makes what the others make, fewer of its outputs read. Its
    structure is `prev`'s but for the values leaving its scopes, which are `prev`'s less
    some (`float32[4]` of `float32[6,4]`, `float32[4]`)."""
    loose = signatures.loose
    if loose[r.id] != loose[prev.id] or pattern(r.label) != pattern(prev.label):
        return False
    if (r.source if r.called else None) != (prev.source if prev.called else None):
        return False  # (two calls alike from two lines are two stages: `_key`)
    rest = iter(prev.shapes)  # (in order: a sub-sequence of what `prev` hands on)
    return len(r.shapes) < len(prev.shapes) and all(s in rest for s in r.shapes)


def _separated(
    siblings: list,
    i: int,
    key: tuple,
    signatures: _Signatures,
    member: Any,
    edges: dict,
    on_the_way: Any,
) -> tuple:
    """A run of alike blocks from ``siblings[i]`` with the same few equations between
    each two (a Python loop's `x[:, t]` before each call of a layer; a fold of one line,
    alike each time, counts as one; so does a library's stage whose values go beside the
    blocks, not on to the next: `on_the_way(r, key)`): its blocks, those
    equations (with a like run of them just before the first block, unless they read
    a block's output: then just after the last) and the index past the run. Two
    blocks each have their whole gap in the run (passes do the same work). Fewer than
    two blocks when there is no such run. The last block may leave some of its values
    unread (`_dead_outputs`)."""
    sig = signatures.of

    def eqn(r: Any) -> tuple | None:
        if r.kind == "eqn" and not r.made:
            return (sig[r.id], r.label)
        if r.kind in _LIBRARY_STAGES and not r.made and not on_the_way(r, key):
            # a decode loop's `log_softmax(logits)` kept after each call of the model
            # (a `jit`: `log_softmax`, `log_softmax#2`, …); not a `relu` between two
            # layers, a layer of its own (`_affine`, `relu`, `_affine#2`, …)
            return (sig[r.id], pattern(r.label))
        if r.kind == "sow":  # the user's name for a value of each pass (`logits`)
            return (sig[r.id], r.label)
        if r.kind == "scope" and r.made and not r.repeats:
            # a fold of one line in every pass (`total = total + ce(...)` after each call;
            # the first adds to `0.0`, one equation fewer)
            return ("fold", pattern(r.label), r.source)
        return None

    for period in range(2, MAX_SEPARATORS + 2):
        gap = [eqn(r) for r in siblings[i + 1 : i + period]]
        if len(gap) != period - 1 or None in gap:
            continue
        blocks, between, k, last = [siblings[i]], [], i + period, i
        while k < len(siblings) and member(siblings[k]):
            dead = _key(siblings[k], sig) != key
            if dead and not _dead_outputs(siblings[k], blocks[-1], signatures):
                break
            if [eqn(r) for r in siblings[k - period + 1 : k]] != gap:
                break
            between += siblings[k - period + 1 : k]
            blocks.append(siblings[k])
            last, k = k, k + period
            if dead:
                break  # (the pass whose values go no further ends the run)
        if len(blocks) >= MIN_RUN:
            # the like equations around the run: before its first block (a loop slicing
            # before each call), else after its last (`logdet = logdet + ld` after each)
            # (or the part of a pass there: a loop's `x[:, t]` before its first call and
            # the `total` fold after its last, with `total` between two calls; the two
            # parts then make one gap)
            led = 0
            # (work that reads its block's output ends that block's pass, when the last
            # block has it too: an Equinox MLP's `gelu` after each `Linear` goes with the
            # one before it; a loop's `x = gelu(x @ w)` then `x = dropout(k, x)` begins
            # each pass, the last `dropout` ending the loop)
            trail = siblings[last + 1 : last + period]
            after = (siblings[i].id, siblings[i + 1].id) in edges and [eqn(r) for r in trail] == gap
            for n in range(period - 1, 0, -1) if not after else ():
                lead = siblings[i - n : i] if i >= n else []
                if lead and [eqn(r) for r in lead] == gap[-n:]:
                    between, led = lead + between, n
                    break
            if led:  # the rest of the gap, after the last block (none when it was whole)
                sizes = [period - 1 - led] if led < period - 1 else []
            else:
                sizes = list(range(period - 1, 0, -1))
            for n in sizes:
                trail = siblings[last + 1 : last + 1 + n]
                if len(trail) == n and [eqn(r) for r in trail] == gap[:n]:
                    between += trail
                    last += n
                    break
            if len(blocks) == 2 and len(between) != (period - 1) * len(blocks):
                # two blocks with work only between them are no two passes: a DQN loss's
                # target network then `max`, `target = ...`, then the online network is
                # two calls, not `QNetwork · target (×2)` whose second pass is the
                # network alone. (Three or more alike with the same work between each
                # two are passes, the first one's work before it perhaps folded into
                # the loop's line: JAX 0.10's key split.)
                continue
            return blocks, between, last + 1
    return [siblings[i]], [], i + 1


def _key(r: Any, sig: dict) -> tuple:
    """What blocks of one run share: the signature and the label's pattern, and for
    calls of the user's own function the line that made them (a loop's one line, not
    two heads `mu = dense(h)`, `logvar = dense(h)` that only look alike); so for a
    module's calls named by their lines (`z1: dense`, `z2: dense`: `build.name_by_line`)."""
    site = r.source if r.called or getattr(r, "by_line", False) else None
    return (sig[r.id], pattern(r.label), site)


def _group_label(run: list[Any], between: list[Any], leading: frozenset[str] = frozenset()) -> str:
    """`layers[0–23] (×24)`; with named work between the blocks, a pass of a Python
    loop `h = gelu(layer(p, h))`, that too: `layer · gelu (×3)`, in the pass's order
    (`leading`: the ids of the work before the first block, which comes first, `x ·
    dropout`; a decode loop's sampling after its slice and model call comes after,
    `Decoder · categorical`)."""
    label = repeat_label([r.label for r in run])
    # (not a fold of keys: `layer_key, key = split(key)` is bookkeeping, no work to see)
    folds = [
        r
        for r in between
        if ((r.kind == "scope" and r.made) or r.kind in _LIBRARY_STAGES)
        and any(s.startswith(_WORK) for s in r.shapes)
    ]
    if not folds:
        return label
    head, _, count = label.rpartition(" (")
    # each work once, as its first pass names it (`h (line 17)`, not its digits
    # masked: `h (line #)`)
    named: dict[str, str] = {}
    for r in folds:
        named.setdefault(pattern(r.label), _INDEX.sub("", r.label))
    before = [named[pattern(r.label)] for r in folds if r.id in leading]
    after = [named[pattern(r.label)] for r in folds if r.id not in leading]
    return f"{' · '.join(dict.fromkeys([*before, head, *after]))} ({count}"


def _output(run: list[Any], members: list[Any], edges: dict) -> Any | None:
    """The member whose value leaves the group, which the group shows as its own: the
    last block when each feeds the next, else the one member read from outside (a
    loop's `gelu` after each `layer`); None when there is no one such."""
    if all((a.id, b.id) in edges for a, b in itertools.pairwise(run)):
        return run[-1]
    ids = {r.id for r in members}
    leaving = {s for s, t in edges if s in ids and t not in ids}
    if not leaving:  # (its value leaves the stage around it: the last member's)
        return members[-1]
    if len(leaving) != 1:
        return None
    (only,) = leaving
    return next(r for r in members if r.id == only)


def _last_child(recs: Sequence[Any], r: Any) -> Any | None:
    """The last of `r`'s siblings (`r` itself when nothing follows it)."""
    return next((s for s in reversed(recs) if s.parent == r.parent), None)


def _insert(builder: Any, runs: list[list[Any]], extras: list[list[Any]]) -> None:
    edges = builder.edges
    group_of: dict[str, Any] = {}
    before: dict[str, Any] = {}  # first block's id -> its group
    chains: list[tuple[Any, list[Any]]] = []
    pos = {r.id: k for k, r in enumerate(builder.recs)}
    for run, between in zip(runs, extras, strict=True):
        first = run[0]
        members = sorted((*run, *between), key=lambda r: pos[r.id])
        leading = frozenset(r.id for r in members[: members.index(first)])
        label = _group_label(run, between, leading)
        g = builder.new("scope", label, first.parent)
        g.repeats, g.source = len(run), first.source
        before[members[0].id] = g
        for r in members:  # the equations between blocks go in with them
            group_of[r.id] = g
            r.parent = g.id
        if any(r.kind != "eqn" for r in between):  # (stages between: say which are blocks)
            g.blocks = list(run)
        out = _output(run, members, edges)
        g.shapes = (out or run[-1]).shapes
        if out is not None:
            chains.append((g, out))
    # Walk order with each group just before its first block; renumber.
    old = [r for r in builder.recs if r.id not in {g.id for g in before.values()}]
    order: list[Any] = []
    for r in old:
        g = before.get(r.id)
        if g is not None:
            order.append(g)
        order.append(r)
    rename = {}
    for k, r in enumerate(order):
        rename[r.id] = f"n{k}"
    for k, r in enumerate(order):
        r.id, r.order = rename[r.id], k
        if r.parent is not None:
            r.parent = rename[r.parent]
    builder.recs = order

    new_edges: dict[tuple[str, str], Edge] = {}
    for (s, t), e in edges.items():
        gs, gt = group_of.get(s), group_of.get(t)
        if gs is not gt:  # a block and a node outside its run: lift the block to its group
            s = gs.id if gs is not None else rename[s]
            t = gt.id if gt is not None else rename[t]
        else:
            s, t = rename[s], rename[t]
        if (s, t) not in new_edges:  # (replace() is slow: only where an id changed)
            same = s == e.source and t == e.target
            new_edges[s, t] = e if same else dataclasses.replace(e, source=s, target=t)
    builder.edges = new_edges

    points = [
        p if rename[p.node] == p.node else dataclasses.replace(p, node=rename[p.node])
        for p in builder.points
    ]
    by_node = {p.node: p for p in points}
    made: list[tuple[Any, Any]] = []
    for g, out in chains:  # the group's output is the value leaving it
        p = by_node.get(out.id)
        if p is None and out.kind == "eqn":
            made.append((g, out))  # an equation has no probe of its own: one is made
        elif p is None and out is _last_child(builder.recs, out) and g.parent in by_node:
            # the stage around it shows that value already (a loop ending a function)
            p = by_node[g.parent]
        if p is not None:
            points.append(dataclasses.replace(p, node=g.id, kind=g.kind, names=p.names))
    builder.points = points
    for g, out in made:  # a residual loop's `h = h + tanh(layer(p, h))`: its `add`
        if out.site is not None:
            path, i, outvars = out.site
            builder.point(g, path, [(i, k) for k in range(len(outvars))], list(outvars))
    builder.sows = {k: [rename[i] for i in v] for k, v in builder.sows.items()}
    builder.custom_calls = {k: [rename[i] for i in v] for k, v in builder.custom_calls.items()}
    builder.notes = [dataclasses.replace(n, node=rename.get(n.node, n.node)) for n in builder.notes]


def open_model(recs: Sequence[Any], root: Any) -> None:
    """Start the model's module open, so the first picture shows its layers (and their
    stacked node) rather than one box: the one top-level stage named by the framework
    wrappers (`TransformerLM`, `MLP`) or a Flax Linen module (`ResNet`), whatever its
    share of the program, when the top level then draws at most `FIRST_VIEW` nodes; so
    is a call of the user's own function or a loop holding at least half the program's
    equations (`predict`, `graph.calls`; a decoder's `fori_loop(body)` over the model,
    which started as one closed box beside its set-up's primitives). Call with final
    `n_eqns`.

    Both kinds open, the stages holding more equations first, while the top level draws
    at most `FIRST_VIEW` nodes: a PINN's boundary-term `PINN` call (16 equations) opened
    and its `residual` (140 of 164) stayed closed. A top level whose work is one stage
    (`@jax.jit def train_step`, 336 of 336 equations, between its inputs and outputs)
    opens it, and the rule applies inside it as it would to the program unwrapped."""
    top = [r for r in recs if r.parent == root.id]
    sole = _sole_stage(recs, top)
    if sole is not None:
        sole.collapsed = False
        open_model(recs, sole)
        return
    linen = frameworks.linen_module_names()  # Linen pushes its modules' scopes itself
    names = frameworks.pushed() | linen | frameworks.haiku_pushed()  # (and Haiku)
    mods = [r for r in top if r.kind == "scope" and not r.made and r.label in names]
    # (the one model is opened whatever its share: a small CNN's 26 equations beside its
    # loss's 31, `optax`'s cross-entropy, started as one closed box)
    halves = [r for r in top if (r.called or r.kind in _LOOPS) and 2 * r.n_eqns >= root.n_eqns]
    ranked = sorted(
        (mods if len(mods) == 1 else []) + [r for r in halves if r not in mods],
        key=lambda r: -r.n_eqns,
    )
    drawn = len(top)
    for r in ranked:
        inside = sum(1 for c in recs if c.parent == r.id)
        if drawn - 1 + inside <= FIRST_VIEW:
            r.collapsed = False
            drawn += inside - 1
            # a call whose work is one stage (`net_fn` returning jraph's `GraphNetwork`
            # of the graph) opens that too: else the first picture is one closed box
            sole = _sole_stage(recs, [c for c in recs if c.parent == r.id])
            inner = sum(1 for c in recs if sole is not None and c.parent == sole.id)
            if sole is not None and sole.called and drawn - 1 + inner <= FIRST_VIEW:
                sole.collapsed = False
                drawn += inner - 1


def _sole_stage(recs: Sequence[Any], top: Sequence[Any]) -> Any:
    """The one stage among `top` holding equations, when no other does (the rest are the
    program's inputs and outputs) and it holds nodes to show; else None."""
    working = [r for r in top if r.n_eqns > 0]
    if len(working) != 1 or working[0].kind not in STAGE_KINDS:
        return None
    return working[0] if any(r.parent == working[0].id for r in recs) else None
