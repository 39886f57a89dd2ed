"""What a function the program differentiates itself keeps for its backward pass.

A train step's `jax.value_and_grad(loss)`, or a gradient penalty's
`jax.grad(critic)`, puts the function's forward pass and its backward pass in one
program. The forward pass's stage then hands the backward pass what that needs
(`h` and `1 - tanh(h)**2` for a `tanh` layer), beside its output, and often no
output at all (`grad` drops the value). Shown as the stage's outputs, such values
read as the function's result: they are named `saved for backward` instead, after
the real outputs, and a note on the outermost such stage says so.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from .. import _compat
from .names import BACKWARD, FOLD, fold_named_by_call

#: The leaf name of a stage's value that only a backward pass reads.
SAVED = "saved for backward"
#: After the path of the module variable a stage's value is the new value of (a
#: BatchNorm's `mean (new)`): state it writes, not what its call returns.
NEW = " (new)"

_NOTE = (
    "`{label}` is differentiated inside the program{unused}: {what} what its forward pass "
    "keeps for its backward pass{backward}. Such values are marked "
    "'{saved}', here and in its stages."
)
#: The index of a label used again among its siblings (`critic#2`).
REUSED = re.compile(r"#\d+$")


def saved_for_backward(
    jaxpr: _compat.Jaxpr,
    backward: Sequence[bool],
    chains: Sequence[tuple[str, ...]],
    loc: Mapping[Any, tuple[int, int]],
) -> dict[str, frozenset]:
    """Per scope (its id) of `jaxpr`'s level, its outputs that, outside it, only
    equations of a backward pass read (`backward`: per equation; `chains`: the scopes
    around each; `loc`: where each value is made). One pass over the level's reads (a
    loop per scope was 100 scopes of a 10,000-equation level: a million steps)."""
    only: dict[tuple[str, Any], bool] = {}  # (scope, value) -> read outside by backward only
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            at = loc.get(v) if isinstance(v, _compat.Var) else None
            if at is None or not _compat.under_jvp(jaxpr.eqns[at[0]]):
                continue  # (no residual: a pullback's seed, `jnp.ones_like(y)`, is an input)
            for scope in chains[at[0]]:
                if scope not in chains[i]:
                    key = (scope, v)
                    only[key] = only.get(key, True) and backward[i]
    returned = {v for v in jaxpr.outvars if isinstance(v, _compat.Var)}
    out: dict[str, set] = {}
    for (scope, v), ok in only.items():
        if ok and v not in returned:
            out.setdefault(scope, set()).add(v)
    return {scope: frozenset(vs) for scope, vs in out.items()}


def unread_constants(jaxpr: _compat.Jaxpr, used: Collection[Any]) -> list[int]:
    """The equations of `jaxpr`'s level that make a constant nobody reads (no operand
    but literals, no effect, no output in `used`): linearizing a `lax.scan` leaves the
    zero tangent of its initial carry, which its transpose drops, after the whole
    forward pass, under the scan's scope: drawn there, it split the loss's stage in
    two, `loss` and `loss#2` (the constant, then the whole backward pass)."""
    return [
        i
        for i, e in enumerate(jaxpr.eqns)
        if not e.effects
        and not any(isinstance(v, _compat.Var) for v in e.invars)
        and not any(v in used for v in e.outvars)
    ]


#: primitives that make a constant array of literals alone (`jnp.zeros_like(h)`,
#: `jnp.full(shape, 2.0)`, `jnp.ones(n)`, an `arange`), or reshape or cast one
_CONSTANT_MAKERS = frozenset(
    {"broadcast_in_dim", "iota", "convert_element_type", "reshape", "squeeze", "expand_dims"}
)


def folded_constants(jaxpr: _compat.Jaxpr) -> list[int]:
    """The equations of `jaxpr`'s level that make a constant the level's equations read
    (`_CONSTANT_MAKERS`, from literals and such constants alone, no effect), none of
    them the level's result: `jnp.zeros_like(h) + ...`, `jnp.maximum(x, 0.0)`'s
    broadcast zero, a `fori_loop`'s `jnp.zeros(4)` carry. They are part of the box
    reading them, as a literal is: drawn, they were loose `broadcast_in_dim` boxes
    with no data beside the user's stages (a constant's stage carries none)."""
    results = {v for v in jaxpr.outvars if isinstance(v, _compat.Var)}
    made: set[Any] = set()
    found = []
    for i, e in enumerate(jaxpr.eqns):
        if e.effects or e.primitive.name not in _CONSTANT_MAKERS:
            continue
        if not all(not isinstance(v, _compat.Var) or v in made for v in e.invars):
            continue
        if any(v in results for v in e.outvars):
            continue
        made.update(e.outvars)
        found.append(i)
    return found


def dead_keys(jaxpr: _compat.Jaxpr) -> list[int]:
    """The equations of `jaxpr`'s level that only make, split or reshape PRNG keys that
    nothing reads (`_compat.handles_keys`), however many steps before the value no one
    reads: Flax's `nn.RNN` makes `jax.random.key(0)` for its cell's `initialize_carry`,
    which an LSTM splits in two for two carries that start at zeros. Its
    `random_seed`, `random_split`, `unstack` were boxes beside `zeros` and the cell's
    `scan` (a GRU's one `random_seed` is an `unread_constants` constant). A key read
    by anything else (a draw, a loop's operand) keeps every step that made it."""
    keyed: set[Any] = set()  # the results of key plumbing, in program order
    plumbing = []
    for i, e in enumerate(jaxpr.eqns):
        if _compat.handles_keys(e, keyed):
            keyed.update(e.outvars)
            plumbing.append(i)
    if not plumbing:
        return []
    ours = set(plumbing)
    # what anything that stays reads (its body's reads are its operands), and the results
    needed = {v for v in jaxpr.outvars if isinstance(v, _compat.Var)}
    for i, e in enumerate(jaxpr.eqns):
        if i not in ours:
            needed.update(v for v in e.invars if isinstance(v, _compat.Var))
    dead = []
    for i in reversed(plumbing):  # (last first: a split is dead once its readers are)
        e = jaxpr.eqns[i]
        if any(v in needed for v in e.outvars):
            needed.update(v for v in e.invars if isinstance(v, _compat.Var))
        else:
            dead.append(i)
    return sorted(dead)


def _writes_state(fold: str) -> bool:
    """Whether the fold `fold` is a module's state write (`cache (new)`, `mean (new)`):
    drawn even when the program drops it (a module broadcast into `nnx.scan`, whose
    cache write its ports are named by)."""
    return fold[len(FOLD) :].partition("\x01")[0].endswith(NEW)


def dead_boxes(jaxpr: _compat.Jaxpr, level_names: Sequence[tuple[str, ...]]) -> set[int]:
    """The equations of `jaxpr`'s level in a box named by a line (a fold, `FOLD`, named
    by what the line assigns, not by a call: `fold_named_by_call`) all of whose
    equations are dead: their results reach neither the level's outputs nor an
    equation with an effect, and each is one primitive (no sub-program). XLA drops them;
    drawn, the box had no data and was named as if it made the line's value: `pred, _ =
    jax.vmap(model)(x, state)` broadcast the discarded state (`vmap`'s `out_axes=0`), a
    box `pred, _` beside the model. Dead work in any other box is drawn as it was (the
    `hk.vmap` box of an RNG split that nothing draws from, a decode loop's last pass)."""
    live = {v for v in jaxpr.outvars if isinstance(v, _compat.Var)}
    dead = set()
    for i in reversed(range(len(jaxpr.eqns))):
        e = jaxpr.eqns[i]
        if e.effects or any(v in live for v in e.outvars) or next(_compat.sub_jaxprs(e), None):
            live.update(v for v in e.invars if isinstance(v, _compat.Var))
        else:
            dead.add(i)
    if not dead:
        return dead
    alive = {
        names[: k + 1]
        for i, names in enumerate(level_names)
        if i not in dead
        for k in range(len(names))
    }
    out = set()
    for i in dead:
        names = level_names[i]
        if any(
            n.startswith(FOLD)
            and not fold_named_by_call(n)
            and not _writes_state(n)
            and names[: k + 1] not in alive
            for k, n in enumerate(names)
        ):
            out.add(i)
    return out


#: What a derivative transform's own code does to a result it unravels
_UNRAVELLING = frozenset(
    {"split", "reshape", "squeeze", "expand_dims", "transpose", "concatenate", "slice"}
)
#: The transforms that unravel what they compute (`jax.hessian` is `jacfwd` of `jacrev`)
_UNRAVELLED_BY = frozenset({"jacfwd", "jacrev", "jacobian", "hessian"})


def unravelled_boxes(
    jaxpr: _compat.Jaxpr, level_names: Sequence[tuple[str, ...]], skip: Iterable[int] = ()
) -> set[int]:
    """The equations of `jaxpr`'s level in a box named by a line (a fold, not named by a
    call) whose work there is only a derivative transform's unravelling of its result:
    `u_xx = jax.hessian(u, argnums=2)(params, t, x)` of a scalar `x` made `split` and
    `reshape` boxes with no data in `u_xx` (two of them dead ends), while the box holds
    the line's value and `u`, `u (backward)` beside it (or inside it) do the work. Drawn
    as the box's own work (no boxes of their own), the box is the line's value.
    `skip`: the equations drawn nowhere (`dead_boxes`)."""
    skipped = set(skip)
    members: dict[str, list[int]] = {}
    for i, names in enumerate(level_names):
        if i in skipped or not names:
            continue
        for n in names:
            members.setdefault(n, []).append(i)
    out: set[int] = set()
    for n, at in members.items():
        if not n.startswith(FOLD) or fold_named_by_call(n):
            continue
        # (the box may hold the transform's evaluations too, `u`, `u (backward)`, when
        # another line evaluates `u`: its own equations are the unravelling alone)
        own = [i for i in at if level_names[i][-1] == n]
        if own and all(
            jaxpr.eqns[i].primitive.name in _UNRAVELLING
            and not jaxpr.eqns[i].effects
            and _compat.call_path(jaxpr.eqns[i]).names[:1] in {(t,) for t in _UNRAVELLED_BY}
            for i in own
        ):
            out.update(own)
    return out


def leaf_names(
    values: Sequence[Any], saved: frozenset, written: Mapping[Any, str] | None = None
) -> tuple[str, ...]:
    """Probe leaf names for a stage's output `values` (its outputs first) when some are
    `saved` or `written` (the path of the module variable each holds the new value
    of): ``output``/``output[k]``, ``saved for backward``/``saved for backward[k]`` and
    ``mean (new)`` (a sow of a dict sorts them by name: the outputs still come first)."""
    written = written or {}
    kinds = [
        SAVED if v in saved else written[v] + NEW if v in written else "output" for v in values
    ]
    seen: dict[str, int] = {}
    names = []
    for kind in kinds:
        k = seen[kind] = seen.get(kind, -1) + 1
        names.append(kind if kinds.count(kind) == 1 else f"{kind}[{k}]")
    return tuple(names)


def written_label(path: str) -> str:
    """The label of the box of the statement making the new value of the module
    variable at `path` in the module (`mean (new)` for Linen's `batch_stats.mean`, NNX's
    `mean`): the variable's own name, the module's stage around it says whose."""
    return re.split(r"[./]", path)[-1] + NEW


def saved_note(label: str, n_saved: int, n_values: int, labels: Collection[str] = ()) -> str:
    """The note on the outermost stage `label` whose `n_saved` of `n_values` values are
    kept for a backward pass; it names the backward pass's stage when `labels` hold one
    stage named as its backward pass (`backward_stage`). Give the labels of the stages
    that read its values (`readers`): the graph's labels name none where several calls
    of one function each have a backward pass (`u_net#3`'s is `u_net (backward)#2`)."""
    every = n_saved == n_values
    backward = backward_stage(label, labels)
    return _NOTE.format(
        label=label,
        backward=f" (`{backward}`)" if backward is not None else "",
        unused=", and its own output is not used" if every else "",
        what="the values shown for it are" if every else f"{n_saved} of its {n_values} values are",
        saved=SAVED,
    )


def backward_stage(label: str, labels: Collection[str]) -> str | None:
    """The one of `labels` named as the backward pass of the stage `label` (`u_net
    (backward)` or `u_net (backward)#2` for `u_net#3`: the `#k` of a reused label counts
    the calls and the backward passes apart); None when there is none, or several (a
    line's fold, `loss:9`, has none)."""
    function = REUSED.sub("", label)
    named = [x for x in labels if REUSED.sub("", x) == function + BACKWARD]
    return named[0] if len(named) == 1 else None


def readers(node: str, edges: Iterable[tuple[str, str]], labels: Mapping[str, str]) -> set[str]:
    """The labels (`labels`: by node id) of the nodes that the `edges` (source and
    target ids) from `node` go to: where its values, those kept for a backward pass
    among them, are read."""
    return {labels[t] for s, t in edges if s == node and t in labels}
