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
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .. import _compat

#: The leaf name of a stage's value that only a backward pass reads.
SAVED = "saved for backward"

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
            if at is None:
                continue
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


def leaf_names(values: Sequence[Any], saved: frozenset) -> tuple[str, ...]:
    """Probe leaf names for a stage's output `values` (its outputs first) when some are
    `saved`: ``output``/``output[k]`` and ``saved for backward``/``saved for
    backward[k]`` (a sow of a dict sorts them by name: the outputs still come first)."""
    kinds = ["output" if v not in saved else SAVED for v in values]
    seen: dict[str, int] = {}
    names = []
    for kind in kinds:
        k = seen[kind] = seen.get(kind, -1) + 1
        names.append(kind if kinds.count(kind) == 1 else f"{kind}[{k}]")
    return tuple(names)


def saved_note(label: str, n_saved: int, n_values: int, labels: Collection[str] = ()) -> str:
    """The note on the outermost stage `label` whose `n_saved` of `n_values` values are
    kept for a backward pass; it names the backward pass's stage when one of `labels`
    (the graph's) is that stage (a line's fold, `loss:9`, has none)."""
    every = n_saved == n_values
    function = label.rpartition("#")[0] if REUSED.search(label) else label
    backward = f"{function} (backward)"
    return _NOTE.format(
        label=label,
        backward=f" (`{backward}`)" if backward in labels else "",
        unused=", and its own output is not used" if every else "",
        what="the values shown for it are" if every else f"{n_saved} of its {n_values} values are",
        saved=SAVED,
    )
