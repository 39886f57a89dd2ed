"""The user's own functions as stages: `predict` > `layer_norm`, `cross_entropy`.

A program written as plain functions (JAX's own tutorials: `predict(params, x)`,
`loss(params, x, y)`) pushes no named scope, so its equations came out as primitives
or as folds by source line (`layer_norm:13`). Their tracebacks say more: each
equation was made inside a chain of calls of the user's functions. Within one scope
of one jaxpr, the calls that all its equations share (the traced function itself,
the `with jax.named_scope` around them) say nothing new; the first call below those
that a run of neighbouring nodes shares (two or more, or one equation: a scope alone
would only be wrapped again) is a stage named by its function (`predict`, a method `Model.encode`, a closure `f`),
sourced at its call site, and the same holds again inside it (`predict` >
`layer_norm`).

One call is told from the next call of the same function from the same line (a
loop calling `layer_norm` once per layer) by where the callee has got to: its
instruction offset goes back only in a new call, unless its own code loops.
Tracebacks hold no frame identities, so nothing else tells two such calls in a row
apart. Lambdas and comprehensions are not calls of their own (`_compat.user_frames`),
a decorator's wrapper passes its call on to the function it wraps, and a library's
functions (JAX's, Equinox's, site-packages') are never calls here: library calls are
named by `names.fold_names` (`gelu`, `make_causal_mask`), which runs after this,
inside the stages made here. The backward pass of a `jax.grad` that the program
takes itself (a train step) keeps the tracebacks of the forward equations it
transposes: a call whose equations all are backward ones is `loss (backward)`. A
gradient the callee takes itself (`jax.hessian(L, 1)(q, v)` in a Lagrangian network's
`lagrangian_eom`) runs forward, backward and forward again on that one line of the
callee: still one call, whose closure's backward pass is a stage inside it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Collection, Sequence

from .. import _compat
from .names import (
    BACKWARD,
    CALL,
    CALLED_BACK,
    CLOSURE,
    TANGENT,
    fold_label,
    function_label,
    user_call_label,
)
from .source_text import applied_map

Chain = tuple[_compat.UserCall, ...] | None
Transforms = tuple[str, ...]  # an equation's transforms, outermost first


def _unwrapped(chain: Chain) -> Chain:
    """`chain` without the calls of decorators' wrappers, which only pass a call on: the
    function a wrapper wraps is the call, made where the wrapper was called."""
    if chain is None or not any(_through(c.function) for c in chain):
        return chain
    out: list[_compat.UserCall] = []
    outer: _compat.UserCall | None = None
    for c in chain:
        if _through(c.function):
            outer = outer or c
            continue
        if outer is not None:
            c = dataclasses.replace(
                c,
                key=(outer.key[0], outer.key[1], c.key[2]),
                _caller=outer._caller,
                _caller_lasti=outer._caller_lasti,
            )
            outer = None
        out.append(c)
    return tuple(out)


def _through(qualname: str) -> bool:
    # a decorator's wrapper (`wrapper`, `wrapped`, `..._wrapper`): `function_label`'s rule
    name = qualname.rsplit(".", 1)[-1]
    return name != "__call__" and function_label(name)[1]


@dataclasses.dataclass
class _Forward:
    """Where a call's forward pass has got to (`lasti`, the callee's offset), and whether
    every backward equation in it since then was made there too (`stayed`): the
    transposed work of a `jax.grad` or `jax.jacobian` the callee takes on that line."""

    lasti: int
    stayed: bool = True
    #: the transforms (`name_stack_kinds`) that the callee's own equations share: the
    #: equations of a transform it takes itself (`jax.linearize`, `jax.vjp`) add some
    transforms: tuple[str, ...] = ()


class _Ids:
    """The call ids `_instances` hands out, and which call a backward pass (or the
    replay of a transform the callee took) belongs to."""

    def __init__(self) -> None:
        self.counter = 0
        self.forward: dict[int, _Forward] = {}  # per call, where its forward pass is
        self.origin: dict[int, int] = {}  # a pass begun as a call -> the call before
        self.replays: set[int] = set()  # those of `origin` begun by going back (`replay_of`)
        self.inner_only: set[int] = set()  # those of `origin` all of whose work is `inner`
        self.alias: dict[int, int] = {}  # a pass found inside its origin -> it

    def new(self) -> int:
        self.counter += 1
        return self.counter

    def inner(self, i: int, transforms: Transforms) -> bool:
        """Whether an equation under `transforms` in call `i` is work of a transform the
        callee takes itself (`jax.linearize`, `jax.vjp`: `jvp`, `transpose` added to
        those of the callee's own equations), not of one taken around the call (a
        train step's `jax.grad`, whose backward pass puts `transpose` outside them)."""
        f = self.forward.get(self.origin.get(i, i))
        if f is None:
            return False
        n = len(f.transforms)
        return len(transforms) > n and transforms[:n] == f.transforms

    def resumes(self, i: int, c: _compat.UserCall) -> bool:
        # After a backward pass in call `i` (or begun as call `i`), the callee goes on
        # from where its forward pass was: the backward pass was of a transform the
        # callee took on that line (`jax.hessian(L)(q, v)`), no backward pass of the
        # callee itself, which JAX transposes from its end back to its start. After a
        # replay (`replay_of`), it goes on past where it was: the replay came from a
        # later line than the one it was at (`f_jvp(t)` after `t = jnp.ones_like(q)`);
        # a new call from a loop starts over, at or before it.
        f = self.forward.get(self.origin.get(i, i))
        if f is None or not f.stayed:
            return False
        if i in self.replays:
            return c.lasti > f.lasti
        return c.lasti >= f.lasti or c.loops

    def saw(self, i: int, c: _compat.UserCall, back: bool, transforms: Transforms = ()) -> int:
        """Records an equation of call `i` made at `c`; returns its call's id."""
        if back:
            if not self.inner(i, transforms):
                self.inner_only.discard(i)
                f = self.forward.get(self.origin.get(i, i))
                if f is not None and c.lasti != f.lasti:
                    f.stayed = False
            return i
        if i in self.origin:  # the first forward equation after a pass begun as a call
            if self.resumes(i, c):
                self.alias[i] = i = self.origin[i]
            elif self.inner(i, transforms):
                return i  # (the transform's own work: not yet known whose)
            else:
                del self.origin[i]
        f = self.forward.get(i)
        if f is None:
            self.forward[i] = _Forward(c.lasti, transforms=transforms)
        else:  # (updated in place: one per equation and call would be a lot of objects)
            f.lasti, f.stayed = c.lasti, True
            if f.transforms != transforms:
                f.transforms = _shared_prefix(f.transforms, transforms)
        return i

    def backward_of(self, i: int, c: _compat.UserCall, transforms: Transforms = ()) -> int:
        """A new call for a backward pass begun after the forward pass of call `i`, at
        `c`; found to be `i`'s own work if `i`'s forward pass then goes on
        (`resumes`), or if all of it is of a transform the callee took (`inner`)."""
        return self.saw(self._begun(i, transforms), c, back=True, transforms=transforms)

    def replay_of(self, i: int, c: _compat.UserCall, transforms: Transforms) -> int:
        """A new call for equations that went back in call `i`'s callee to work of a
        transform it took there (`inner`): JAX replays the linear map of a
        `jax.linearize` (or a `jax.vjp`'s pullback) with the tracebacks of the line
        that took it. Found to be `i`'s own if `i`'s forward pass then goes on past
        where it was (`resumes`), or if the call ends there (`ended`); a loop's next
        call starting with such a line goes on from before where `i` was."""
        new = self._begun(i, transforms)
        self.replays.add(new)
        return self.saw(new, c, back=False, transforms=transforms)

    def _begun(self, i: int, transforms: Transforms) -> int:
        new = self.new()
        self.origin[new] = i
        if self.inner(new, transforms):
            self.inner_only.add(new)
        return new

    def ended(self, i: int) -> None:
        """Call `i` has no more equations: a pass begun as a call that nothing has told
        apart from its origin yet (`origin`), and all of whose work is of a transform
        the callee took (`inner`), was the callee's own: a `jax.vjp`'s pullback
        applied on its last line."""
        if i in self.origin and i not in self.alias and i in self.inner_only:
            self.alias[i] = self.origin[i]


def _shared_prefix(a: Transforms, b: Transforms) -> Transforms:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _instances(
    calls: Sequence[Chain], backward: Sequence[bool], transforms: Sequence[Transforms] = ()
) -> list[tuple[int, ...] | None]:
    """Per equation, one id per call in its chain (None: not known): equal ids are one
    call. A call continues from the equation before while its call site (and every
    call around it) is the same and the callee has not gone back (a loop in the
    caller calling it again), unless the callee's own code loops. Equations of a
    backward pass (`backward`) keep the tracebacks of the forward ones they transpose,
    in reverse order: among them a callee going back is no new call, and a call that
    is the innermost one on both sides of a change between the passes is a new one,
    unless the backward pass stayed on the line where the forward pass was (or was of
    a transform the callee took itself: `_Ids.inner`, by `transforms`, each
    equation's) and the forward pass then goes on from there (`_Ids.resumes`): the
    callee differentiated something itself (`jax.hessian(L, 1)(q, v)` in
    `lagrangian_eom`, which JAX traces forward, backward and forward again; `jax.vjp`
    and its pullback), one call. Likewise a callee going back to a transform's work
    (`jax.linearize`'s linear map, applied lines later) is one call if it then goes
    on or ends there (`_Ids.replay_of`)."""
    out: list[tuple[int, ...] | None] = []
    prev: tuple[_compat.UserCall, ...] = ()
    prev_ids: tuple[int, ...] = ()
    prev_back = False
    state = _Ids()
    for m, (chain, back) in enumerate(zip(calls, backward, strict=True)):
        if chain is None:
            for i in prev_ids:
                state.ended(i)
            prev, prev_ids = (), ()
            out.append(None)
            continue
        t = transforms[m] if m < len(transforms) else ()
        ids: list[int] = []
        same = True
        for d, c in enumerate(chain):
            site = same and d < len(prev) and prev[d].key == c.key  # (the same call so far)
            same = site and (c.lasti >= prev[d].lasti or c.loops or back)
            if site and not same and state.inner(prev_ids[d], t):
                # back to a transform the callee took: maybe its replay (`replay_of`)
                ids.append(state.replay_of(prev_ids[d], c, t))
                continue
            if same and back != prev_back and d == len(chain) - 1 and d == len(prev) - 1:
                # between a forward and a backward pass, the innermost call of both
                # is a new one (`loss`, then `loss (backward)`, then `loss` again),
                # unless the forward pass goes on where it was
                if back:
                    ids.append(state.backward_of(prev_ids[d], c, t))
                    continue
                same = state.resumes(prev_ids[d], c)
            ids.append(state.saw(prev_ids[d] if same else state.new(), c, back, t))
        for i in prev_ids:
            if i not in ids:
                state.ended(i)
        prev, prev_ids, prev_back = chain, tuple(ids), back
        out.append(prev_ids)
    for i in prev_ids:
        state.ended(i)
    return [None if ids is None else tuple(_resolved(state.alias, i) for i in ids) for ids in out]


def _applied_maps(
    ids: Sequence[tuple[int, ...] | None],
    backward: Sequence[bool],
    by_id: dict[int, _compat.UserCall],
) -> dict[int, Callable[[str], str]]:
    """The calls that are a `jax.linearize`'s map (a `jax.vjp`'s pullback) applied lines
    after the call, each with how its label reads: `t: mlp` for `y, f_jvp =
    jax.linearize(lambda q: mlp(q, x), p)` then `t = f_jvp(v)` (`mlp (tangent)` when
    the applying line assigns no name). JAX records the map's equations with the
    tracebacks of the `linearize` line, inside `mlp`'s frames: they made a second call
    of `mlp` from that line, `mlp#2`, which the program never made. Of the forward
    calls made from such a line, in program order, every second one is the map's (the
    line run again in a loop alternates: the call, then its map)."""
    order: dict[tuple, list[int]] = {}  # per call site and function, its calls in order
    seen: set[int] = set()
    for idc, back in zip(ids, backward, strict=True):
        if back:
            continue
        for i in idc or ():
            if i not in seen:
                seen.add(i)
                order.setdefault(by_id[i].key, []).append(i)
    out: dict[int, Callable[[str], str]] = {}
    for found in order.values():
        if len(found) < 2:
            continue
        site = by_id[found[0]].site()
        name = applied_map(site.file, site.line) if site is not None else None
        if name is None:
            continue
        name = name if name.isidentifier() else None
        for i in found[1::2]:
            out[i] = (
                (lambda label, n=name: f"{n}: {label}") if name else (lambda label: label + TANGENT)
            )
    return out


def _resolved(alias: dict[int, int], i: int) -> int:
    while i in alias:
        i = alias[i]
    return i


def _common(chains: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    first = chains[0]
    n = len(first)
    for c in chains[1:]:
        n = min(n, len(c))
        k = 0
        while k < n and c[k] == first[k]:
            k += 1
        n = k
        if n == 0:
            break
    return first[:n]


def _inlined_bodies(
    calls: Sequence[Chain], roots: Sequence[tuple[int, int] | None]
) -> tuple[list[Chain], list[tuple[int, int] | None]]:
    """`calls` and `roots` (per equation, as `group_calls` takes them) with the work of
    a body that JAX traced apart and then inlined here put in the call that made it.
    JAX traces a body with a traceback of its own, starting at the body's function
    (a `lax.switch` branch, `lambda p: p + 1`), and under `jax.vmap` a switch or cond
    on a batched index runs every branch inline and selects among their results: the
    branches' equations stood between the call's own (`env_step` > `move`) with no
    call at all, and cut that call into five (`env_step`, a loose `add`, `env_step#2`
    ...). Such equations are those whose outermost user frame is another function
    than the level's (the one the level's last equation was made in: the selection
    comes after the branches), or that have no user frame at all (a library's function
    as the branch: `lax.switch(i, [jnp.sin, jnp.cos], v)`), between two equations of
    the level's function; they are taken as made in the call of the equation after
    them (the select), their own calls (a branch calling a helper) inside it."""
    calls, roots = list(calls), list(roots)
    for m, after in _inlined(calls, roots).items():
        calls[m] = (*(calls[after] or ()), *(calls[m] or ()))
        roots[m] = roots[after]
    return calls, roots


def inlined_into(frames: Sequence[_compat.UserFrames | None]) -> dict[int, int]:
    """Per equation of a body JAX traced apart and inlined (`_inlined_bodies`; `frames`,
    each equation's), the equation whose call and library calls it is taken as made
    in: the select after a vmapped `lax.switch`'s branches, so that they are in its
    `switch` too (they stood as `switch`, `sin`, `switch#2`, `cos`, `switch#3`)."""
    calls = [f.calls if f is not None else None for f in frames]
    return _inlined(calls, [f.root if f is not None else None for f in frames])


def _inlined(calls: Sequence[Chain], roots: Sequence[tuple[int, int] | None]) -> dict[int, int]:
    # `_inlined_bodies`'s equations -> the equation after them, of the level's function
    codes = [r[0] if r is not None else None for r in roots[: len(calls)]]
    # (equations of no known traceback neither part nor join calls: left out)
    known = [m for m in range(len(codes)) if calls[m] is not None]
    owned = [m for m in known if codes[m] is not None]
    if not owned:
        return {}
    own, last = codes[owned[-1]], known.index(owned[-1])
    out: dict[int, int] = {}
    k = 0
    while k < last:
        if codes[known[k]] == own:
            k += 1
            continue
        j = k  # the run made in another function's traceback or none (up to own's last)
        while codes[known[j]] != own:
            j += 1
        if k > 0:  # (before any of the level's own: a library's call back, left as it was)
            before, after = known[k - 1], known[j]
            # A library's own work (no user frame: a loop body the library traced, BFGS's
            # line search around the objective) only within one call that goes on.
            frameless = _goes_on(calls[before], calls[after])
            out.update((m, after) for m in known[k:j] if codes[m] is not None or frameless)
        k = j
    return out


def _library_closure(call: _compat.UserCall) -> bool:
    # a library's closure handed out to the user (`_compat.handed_closure`), not the
    # user's own function
    return call._callee is not None and _compat.handed_closure(call._callee) is not None


def _goes_on(before: Chain, after: Chain) -> bool:
    # the same call, made from where it was or further on: no new call of the function
    if not before or not after or len(before) != len(after):
        return False
    keys = all(b.key == a.key for b, a in zip(before, after, strict=True))
    return keys and after[-1].lasti >= before[-1].lasti


def group_calls(
    names: Sequence[tuple[str, ...]],
    calls: Sequence[Chain],
    backward: Sequence[bool],
    tag: object = "",
    primitives: Sequence[str] = (),
    roots: Sequence[tuple[int, int] | None] = (),
    stages: Sequence[str | None] = (),
    by_lambda: Sequence[bool] = (),
    transforms: Sequence[Transforms] = (),
    named_by: Collection[str] | None = None,
    library: Callable[[int], str | None] | None = None,
    callees: dict[str, int] | None = None,
) -> tuple[list[tuple[str, ...]], dict[str, _compat.SourceLocation | None]]:
    """`names` (each equation's scope names, outermost first) with the user calls that
    runs of nodes share inserted as scopes (`CALL` names, unique per `tag`), and each
    such scope's call site. `backward`: the equation is of a backward pass the program
    takes itself (a `jax.grad` inside a train step); a call whose equations all are is
    labelled `loss (backward)`, as a named scope's are (`names.BACKWARD`). Passes of a
    loop whose body makes two calls or more are a stage each when two or
    more passes in a row are alike (`primitives`, each equation's, tell equations
    apart): `cell · readout`, which `repeats` stacks as `cell · readout (×12)`; `roots`
    (`_compat.user_frames`) says where the outermost function has got to; `stages`: the
    label of each equation that is a stage of its own (a `jit`; not a loop:
    `fori_loop(body)` is named by its body), which a call of it alone named alike would
    only wrap; `by_lambda` (`_compat.UserFrames.by_lambda`): the equation was made in a
    lambda of the user's, no library's work on its caller's line; `transforms`: each
    equation's (`_compat.name_stack_transforms`), which tell the work of a transform a
    callee takes itself (`jax.linearize`) from a new call (`_instances`); `named_by`: for
    a loop's body, the function names its label gives (`scan(step)`: `step`), and a
    call all of the body's equations share is a stage unless it is one of them
    (`step`'s `p_sample`, which a `fori_loop`'s counter, made in no call, kept a stage
    there and the scan's body flattened); `library`: the library function (not JAX's)
    an equation's line called, if any (`chain`, `apply_updates`), which a pass's label
    names too (`pass_label`); `callees`, when given, receives the id of each call's
    function's code, by its scope name."""
    out = list(names)
    calls, roots = _inlined_bodies(calls, roots)
    if not any(calls):  # no call below the outermost frame (or none known)
        return out, {}
    stages = stages or [None] * len(out)
    seen: dict[int, Chain] = {}  # chains repeat (one tuple per traceback): once each
    calls = [seen[id(c)] if id(c) in seen else seen.setdefault(id(c), _unwrapped(c)) for c in calls]
    ids = _instances(calls, backward, transforms)
    by_id: dict[int, _compat.UserCall] = {}
    for chain, idc in zip(calls, ids, strict=True):
        for c, i in zip(chain or (), idc or (), strict=True):
            by_id.setdefault(i, c)
    applied = _applied_maps(ids, backward, by_id)
    sites: dict[str, _compat.SourceLocation | None] = {}
    made: set[int] = set()  # the calls made stages

    def wrap(members: list[list[int]], name: str, depth: int) -> None:
        # the scope `name` goes in at `depth`, around what these equations were in there
        for ms in members:
            for m in ms:
                out[m] = (*out[m][:depth], name, *out[m][depth:])

    def items_of(eqns: list[int], depth: int) -> list[tuple[list[int], str | None]]:
        # the nodes directly in this scope: an equation, or a run of one scope inside
        items: list[tuple[list[int], str | None]] = []
        for m in eqns:
            child = out[m][depth] if len(out[m]) > depth else None
            if items and child is not None and items[-1][1] == child:
                items[-1][0].append(m)
            else:
                items.append(([m], child))
        return items

    def passes(eqns: list[int], depth: int, shared: int) -> None:
        # A loop in this scope's own function: where that function has got to goes back
        # at each new pass. Alike passes of two calls or more are stages.
        def pos(m: int) -> tuple[int, int] | None:
            chain = calls[m]
            if chain is None or backward[m] or len(chain) < shared:
                return None
            if shared:
                return chain[shared - 1].key[2], chain[shared - 1].lasti
            return roots[m] if m < len(roots) else None  # the traced function itself

        items = items_of(eqns, depth)
        runs = [[items[0]]]
        for before, item in itertools.pairwise(items):
            a, b = pos(before[0][-1]), pos(item[0][0])
            if a is not None and b is not None and a[0] == b[0] and b[1] < a[1]:
                runs.append([item])
            else:
                runs[-1].append(item)

        def shape(run: list[tuple[list[int], str | None]]) -> tuple:
            return tuple(
                fold_label(child) if child is not None else primitives[ms[0]] for ms, child in run
            )

        def two_passes(k: int) -> list[list[tuple[list[int], str | None]]]:
            # Two passes only: the first ends `runs[k]`, after the work before the loop,
            # from the item made where the second pass (`runs[k + 1]`) starts; the
            # second is as long, then the work after the loop. Not alike: none.
            start = pos(runs[k + 1][0][0][0])
            at = [s for s, (ms, _) in enumerate(runs[k]) if pos(ms[0]) == start]
            if start is None or not at:
                return []
            first = runs[k][at[0] :]
            second = runs[k + 1][: len(first)]
            return [first, second] if shape(first) == shape(second) else []

        shapes = [shape(run) for run in runs]
        taken: set[int] = set()  # equations already in a pass (a neighbour's end)
        k = 0
        while k < len(runs):
            j = k
            while j + 1 < len(runs) and shapes[j + 1] == shapes[k]:
                j += 1
            called = [c for _, c in runs[k] if c is not None and c in sites]
            each = runs[k : j + 1]
            if j == k and k + 1 < len(runs):  # no whole pass between the first and last
                each = two_passes(k)
                called = [c for _, c in each[0] if c is not None and c in sites] if each else []
            if len(each) > 1 and len(called) >= 2:  # one call alone would name a pass like itself
                label = pass_label(each[0])
                # the first pass begins, and the last ends, with the work around the loop
                n = len(each[0])
                if j > k and k > 0 and shape(runs[k - 1][-n:]) == shapes[k]:
                    each.insert(0, runs[k - 1][-n:])
                if j > k and j + 1 < len(runs) and shape(runs[j + 1][:n]) == shapes[k]:
                    each.append(runs[j + 1][:n])
                for run in each:
                    if any(m in taken for ms, _ in run for m in ms):
                        continue
                    first = next(c for _, c in run if c is not None and c in sites)
                    name = f"{CALL}{label}\x01{tag}.p{run[0][0][0]}"
                    sites[name] = sites[first]
                    wrap([ms for ms, _ in run], name, depth)
                    taken.update(m for ms, _ in run for m in ms)
            k = j + 1

    def pass_label(run: list[tuple[list[int], str | None]]) -> str:
        # The pass's calls in its order, and the library calls its own lines made
        # (`mse · chain · apply_updates`: an optax step's update and its apply went
        # unnamed). A call's backward pass beside the call is its gradient, which the
        # call says (`mse · mse (backward) · lopt_upda…` was cut off), unless the call
        # would then name the pass alone.
        parts = []
        for ms, child in run:
            if child is not None and child in sites:
                parts.append(fold_label(child))
            elif child is None and library is not None:
                parts.append(library(ms[0]))
        parts = list(dict.fromkeys(p for p in parts if p))
        forward = [p for p in parts if not (p.endswith(BACKWARD) and p[: -len(BACKWARD)] in parts)]
        return " · ".join(forward if len(forward) > 1 else parts)

    def made_at(m: int, shared: int) -> tuple[int, int] | None:
        # Where the function around this scope's calls had got to when it made `m`
        # through no call of the user's (a library's work on its line); else None.
        chain = calls[m]
        if chain is None or len(chain) != shared or (m < len(by_lambda) and by_lambda[m]):
            # (a layer list's lambdas between its calls from one line, `for f in layers:
            # x = f(p, x)`, made each call look called back by a library)
            return None
        if shared:
            return chain[-1].key[2], chain[-1].lasti
        return roots[m] if m < len(roots) else None

    def library_work(eqns: list[int], shared: int) -> dict[tuple[int, int], tuple[int, int]]:
        # per place of the function around this scope's calls, the first and last of the
        # equations a library made there (`made_at`)
        out: dict[tuple[int, int], tuple[int, int]] = {}
        for m in eqns:
            at = made_at(m, shared)
            if at is not None:
                out[at] = (out[at][0], m) if at in out else (m, m)
        return out

    def called_back(
        call: _compat.UserCall,
        members: list[int],
        work: dict[tuple[int, int], tuple[int, int]],
        shared: int,
    ) -> bool:
        # A library called on the line made work of its own before and after the call
        # (`minimize(f, x0)`: `eye`, then `f`'s value and gradient, then the loop): the
        # library called the function back, and the call is part of the library's.
        around = work.get((call.key[0], call.key[1]))
        if around is None and call._caller.co_name.startswith("<"):
            # called from a lambda the library called (`minimize(lambda w: nll(w, X, y),
            # w0)`): the library's work is around the line that passed the lambda, where
            # this scope's function had got to (`made_at`); `nll` stood apart, before
            # the rest of `minimize`
            chain, m = calls[members[0]], members[0]
            if chain is not None and len(chain) > shared:
                outer = (
                    (chain[shared - 1].key[2], chain[shared - 1].lasti)
                    if shared
                    else (roots[m] if m < len(roots) else None)
                )
                around = work.get(outer) if outer is not None else None
        return around is not None and around[0] < min(members) and around[1] > max(members)

    def visit(eqns: list[int], depth: int) -> None:
        items = items_of(eqns, depth)
        # (equations of no known call, a backward pass's, neither share nor break it)
        known = [c for c in (ids[m] for m in eqns) if c is not None]
        shared = len(_common(known)) if known else 0
        if depth == 0 and shared and named_by is not None:
            if user_call_label(by_id[known[0][0]]) not in named_by:
                shared = 0  # (a loop's body calling one function: its label says `step`)
        # A library's closure the user called (jraph's `GraphNetwork`) is a stage even
        # when it is all its caller does (`net_fn` returning `net(graph)`): its name says
        # what the work is, the caller's only where it is.
        shared = next(
            (
                d
                for d in range(shared)
                if known[0][d] not in made and _library_closure(by_id[known[0][d]])
            ),
            shared,
        )
        keys = []
        for members, _ in items:
            chains = [ids[m] for m in members]
            common = _common(chains) if None not in chains else ()  # type: ignore[arg-type]
            keys.append(common[shared] if len(common) > shared else None)
        work: dict[tuple[int, int], tuple[int, int]] | None = None  # made when needed
        k = 0
        while k < len(items):
            j = k
            while keys[k] is not None and j + 1 < len(items) and keys[j + 1] == keys[k]:
                j += 1
            # one equation is a stage of its call too (`relu` holding its `max`, with a
            # probe; `embed` holding the `jit` of its `jnp.take`), unless it is a stage
            # named like the call already (`jax.nn.relu` in a `relu` of the user's); one
            # scope alone would only be wrapped again
            call = by_id[keys[k]] if keys[k] is not None else None
            # (one scope alone is wrapped when the call says what it is for: a Haiku
            # MLP as `update_edge_fn: edge_mlp`)
            one = j == k and (items[k][1] is None or (call is not None and bool(call.via)))
            label = user_call_label(call) if call is not None else ""
            if keys[k] in applied:
                label = applied[keys[k]](label)
            if one and stages[items[k][0][0]] == label:
                one = False
            if call is not None and (j > k or one):
                if all(backward[m] for members, _ in items[k : j + 1] for m in members):
                    label += BACKWARD
                name = f"{CALL}{label}\x01{tag}.{keys[k]}"
                members = [m for ms, _ in items[k : j + 1] for m in ms]
                if work is None:
                    work = library_work(eqns, shared)
                if called_back(call, members, work, shared):
                    name += CALLED_BACK  # (`names.fold_names` draws it in the library's call)
                elif _library_closure(call):
                    name += CLOSURE  # (`names.fold_names` splits its own work by its calls)
                # (a function a library's closure called back is sourced where the user
                # wrote it: its call is a line of the library's)
                sites[name] = _compat.defined_at(call._callee) if call.via else call.site()
                if callees is not None:  # (the id of the function's code: `UserCall.key`)
                    callees[name] = call.key[2]
                made.add(keys[k])
                wrap([ms for ms, _ in items[k : j + 1]], name, depth)
            k = j + 1
        if primitives and (shared or roots):
            passes(eqns, depth, shared)
        # then inside each scope of this one, those just made included
        run: list[int] = []
        for m in eqns:
            if len(out[m]) > depth and run and out[run[-1]][depth] == out[m][depth]:
                run.append(m)
                continue
            if run:
                visit(run, depth + 1)
            run = [m] if len(out[m]) > depth else []
        if run:
            visit(run, depth + 1)

    visit(list(range(len(out))), 0)
    return _without_restating_scopes(out), sites


def hoisted_from_bodies(
    eqns: Sequence[_compat.JaxprEqn], frames: Sequence[_compat.UserFrames | None]
) -> dict[int, int]:
    """The equations (index: the loop's index) that linearizing a loop hoisted out of
    its body, the body's loop-invariant work (`sin(w)` in `cell`), run once right
    before it: their tracebacks start at the body's function (JAX traces a body with
    a traceback of its own) and name no call around it, so they stood at the top
    level under the body's line (`h`), apart from the loop's stage (`loss` > `rnn`).
    They take the loop's place. `frames`: each equation's (`_compat.user_frames`)."""
    out: dict[int, int] = {}
    for j, eqn in enumerate(eqns):
        roots = {
            f.root[0]
            for _, _, body in _compat.sub_jaxprs(eqn)
            for e in body.eqns
            if (f := _compat.user_frames(e)) is not None and f.root is not None
        }
        i = j - 1
        while i >= 0 and i not in out:
            f = frames[i]
            if f is None or f.calls or f.root is None or f.root[0] not in roots:
                break
            out[i] = j
            i -= 1
    return out


def body_call(
    own: _compat.UserFrames | None, body: Sequence[_compat.UserFrames | None]
) -> str | None:
    """The user's function that a loop's body (a lambda: `lax.scan(lambda h, x: cell(p, h,
    x), ...)`) does nothing but call: every equation of the body (`body`, each one's
    frames) made in one call of it, straight from the body's function; else None.
    `own`: the frames of the loop's equation. JAX traces a body with a traceback of its
    own, starting at the body's function; one that is not cut holds `own`'s calls
    first."""
    found: _compat.UserCall | None = None
    outer = _unwrapped(own.calls) if own is not None else None
    for frames in body:
        if frames is None:
            continue
        chain = _unwrapped(frames.calls) or ()
        if own is not None and frames.root == own.root and outer is not None:
            if tuple(c.key for c in chain[: len(outer)]) != tuple(c.key for c in outer):
                return None
            chain = chain[len(outer) :]
        elif chain and frames.root is not None and chain[0].key[0] != frames.root[0]:
            return None  # not called by the body's function itself
        if not chain or (found is not None and chain[0].key != found.key):
            return None
        found = chain[0]
    return user_call_label(found) if found is not None else None


def _without_restating_scopes(out: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """`out` without the named scopes that hold nothing but calls of the function they
    are named after: `jax.named_call(block)` pushes the scope `block` around each call,
    and consecutive calls share it, so three calls read `block` > `block (×3)` > `block`,
    `block#2`, `block#3` (one level too many) instead of `block (×3)` > ..."""
    depth = 0
    while any(len(names) > depth + 1 for names in out):
        m = 0
        while m < len(out):
            names = out[m]
            if len(names) <= depth or names[depth].startswith(CALL):
                m += 1
                continue
            end = m  # the run of equations in this scope
            while end < len(out) and out[end][: depth + 1] == names[: depth + 1]:
                end += 1
            scope = names[depth]
            if all(
                len(out[i]) > depth + 1
                and out[i][depth + 1].startswith(CALL)
                and fold_label(out[i][depth + 1]) == scope
                for i in range(m, end)
            ):
                for i in range(m, end):
                    out[i] = out[i][:depth] + out[i][depth + 1 :]
            m = end
        depth += 1
    return out
