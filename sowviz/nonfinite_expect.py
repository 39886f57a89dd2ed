"""`expect_nonfinite`: the names a user declares non-finite values expected at, checked
against the program's graph, and the one reserved name, "gradients".

A stage label or a sow name (`expect_nonfinite=("mask",)`: an attention mask's -inf)
marks that node and everything inside it expected: no origin, no alarm for what it
holds or the kinds of values it passes on. "gradients" declares the update guarded
(dynamic loss scaling: `jmp.DynamicLossScale`, optax's `apply_if_finite`, a
`jnp.where(all_finite, new, old)` of your own): a step whose forward values (the loss
among them) are finite but whose gradients are not is a *skipped step*, counted
(`mon.history.skipped`), not an alarm. A non-finite loss or forward value still is,
and so is a non-finite parameter (it makes the loss non-finite).

A name that is none of these raised no error: a typo (`"mask "`, `"gradient"`) silently
expected nothing and the alarm the user meant to silence stayed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

#: the reserved name: non-finite gradients are expected (a guarded update skips them)
GRADIENTS = "gradients"

#: what a skipped step's record says (`Origins.fill`, the model's `"nonfinite"`)
SKIPPED = (
    "non-finite gradients only, expected (`expect_nonfinite=('gradients',)`): the loss "
    "and every forward value are finite, so a guarded update (dynamic loss scaling) "
    "skips this step (no alarm)"
)

_SHOWN = 12  # valid names listed in the error, at most


def gradients_expected(names: Iterable[str]) -> bool:
    """Whether `names` (an `expect_nonfinite`) declares non-finite gradients expected."""
    return GRADIENTS in tuple(names)


def valid_names(graph: Any) -> list[str]:
    """The names `expect_nonfinite` accepts for `graph`: "gradients", then its stage
    labels and sow names in program order (each once; not its equations' primitives,
    which name no stage of the user's, nor the outputs)."""
    out: dict[str, None] = {GRADIENTS: None}
    for n in graph.nodes:
        if n.id == getattr(graph, "root", None) or n.kind in ("eqn", "output"):
            continue
        out.setdefault(n.label, None)
    for name in getattr(graph, "sow_nodes_all", {}) or {}:
        out.setdefault(name, None)
    return list(out)


def check_expected(where: str, graph: Any, names: Sequence[str]) -> None:
    """A ValueError naming each of `names` that is no name of `graph` (`valid_names`; a
    node id or an equation's label is accepted too, as `sowviz.nonfinite.find` marks
    them), with the valid names listed."""
    if not names:
        return
    known = {GRADIENTS, *(getattr(graph, "sow_nodes_all", {}) or {})}
    known |= {n.label for n in graph.nodes} | {n.id for n in graph.nodes}
    bad = [name for name in names if name not in known]
    if not bad:
        return
    valid = valid_names(graph)
    shown = ", ".join(repr(v) for v in valid[:_SHOWN])
    more = f" and {len(valid) - _SHOWN} more" if len(valid) > _SHOWN else ""
    said = ", ".join(repr(b) for b in bad)
    raise ValueError(
        f"sowviz.{where}: `expect_nonfinite` names {said}, which is no stage label or sow "
        f"name of this program. Valid names: {shown}{more} ('gradients': non-finite "
        f"gradients are expected, the update being guarded, e.g. by dynamic loss scaling). "
        f"Name a stage as the graph labels it, or a sow by its name."
    )


def is_finite_loss(loss: Any) -> bool:
    """Whether a step's loss, as the Monitor read it (a float, or None when the step has
    no one-number loss), is known and finite."""
    return loss is not None and math.isfinite(loss)
