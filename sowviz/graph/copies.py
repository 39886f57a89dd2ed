"""Names for module copies that matched several modules, from the parameters they read.

A transform that rebuilds a module from its state (`eqx.filter_checkpoint(block)`
in a loop over identical blocks, `nnx.remat` per layer) calls a copy that
`frameworks` cannot tell apart from its siblings by structure and shapes: it
pushes the class (`Block#2`) and keeps the paths it could be (`frameworks.Copy`).
The traced program can: the copy's stage reads its own parameters, which arrive
from the arguments' leaves (through `checkpoint`, `scan`, `cond`, `jit` ...
operands, and outputs that hand an operand back unchanged: `_forwarding`), and
those leaves' names hold the module's path (`m.blocks[1].lin.weight` holds
`blocks[1]`). When exactly one candidate's path is in the names of the leaves the
stage reads, that is the module: `blocks[1]: Block`. Otherwise the class stays.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .. import _compat
from .._forwarding import forwarded_operand
from ..primitives import Construct, construct_of
from .frameworks import Copy, Path, _Root
from .names import _TOKEN

#: Where a sub-program sits: the steps from the top, (equation index, param, index),
#: as the graph builder walks (`build._Builder.walk`'s `path`).
Where = tuple[tuple[int, str, int | None], ...]


def renames(
    jaxpr: Any, in_names: Sequence[str], copies: Mapping[str, Copy]
) -> dict[tuple[Where, str], str]:
    """New labels for the copies' stages, by where the scope was pushed and its label
    (one traced body serves several calls: `jax.checkpoint` of one function caches
    it), for those the leaves they read name; the others are not in the result."""
    if not copies:
        return {}
    reads: dict[tuple[Where, str], set[int]] = {}
    _read(jaxpr, (), {v: k for k, v in enumerate(jaxpr.invars)}, copies, reads, {})
    tokens = [_tokens(n) for n in in_names]
    out = {}
    for (where, label), ins in reads.items():
        copy, read = copies[label], [tokens[k] for k in ins]
        hits = [c for c in copy.candidates if any(_holds(t, _path_tokens(c)) for t in read)]
        if len(hits) == 1:
            out[where, label] = copy.label(hits[0])
    return out


def _read(
    jaxpr: Any,
    where: Where,
    origin: dict[Any, int],
    copies: Mapping[str, Copy],
    reads: dict[tuple[Where, str], set[int]],
    memo: dict,
) -> None:
    """Add to `reads[where, label]` the inputs (positions in the program's) that the
    equations inside a copy's scope `label` read, at every depth; `origin`: this
    jaxpr's variables that are program inputs."""
    for i, eqn in enumerate(jaxpr.eqns):
        ins = [origin[v] for v in eqn.invars if isinstance(v, _compat.Var) and v in origin]
        # A value handed back unchanged is still the input (an `nnx.remat` returns the
        # module's state: the next call of that module reads it from there).
        for k, out in enumerate(eqn.outvars):
            j = forwarded_operand(eqn, k, memo) if ins else None
            if j is not None and eqn.invars[j] in origin:
                origin[out] = origin[eqn.invars[j]]
        for kind, name in _compat.name_stack_kinds(eqn):
            if kind == "scope" and name in copies:
                reads.setdefault((where, name), set()).update(ins)
        if not ins:
            continue  # no input reaches its sub-programs
        for param, index, sub, operands in _bodies(eqn):
            inner = {
                iv: origin[ov]
                for iv, ov in zip(sub.invars, operands, strict=True)
                if isinstance(ov, _compat.Var) and ov in origin
            }
            _read(sub, (*where, (i, param, index)), inner, copies, reads, memo)


def _bodies(eqn: Any) -> Iterator[tuple[str, int | None, Any, list]]:
    """Each sub-program of `eqn` (its param, index in it, and itself) with the
    operands its inputs receive, in order."""
    construct = construct_of(eqn.primitive.name)
    params, operands = eqn.params, list(eqn.invars)
    for param, index, sub in _compat.sub_jaxprs(eqn):
        if construct is Construct.COND and param == "branches":
            mine = operands[1:]  # after the branch index
        elif construct is Construct.WHILE:
            c, b = params["cond_nconsts"], params["body_nconsts"]
            carry = operands[c + b :]
            mine = operands[:c] + carry if param == "cond_jaxpr" else operands[c : c + b] + carry
        else:
            mine = operands
        if len(mine) == len(sub.invars):
            yield param, index, sub, mine


def _tokens(name: str) -> list[Any]:
    """A leaf name's path as keys: `m.blocks[1]['w']` gives `m`, `blocks`, 1, `w`."""
    cut = min((i for i in (name.find("["), name.find(".")) if i >= 0), default=len(name))
    out: list[Any] = [name[:cut]] if cut else []
    for m in _TOKEN.finditer(name[cut:]):
        key, idx, attr, other = m.groups()
        out.append(key if key is not None else int(idx) if idx is not None else attr or other)
    return out


def _path_tokens(path: Path) -> list[Any]:
    # Equinox's dict keys are kept as 1-tuples (`frameworks._eqx_modules`); a root of
    # several models is named by its argument (`bs[0]`, a list of blocks passed in).
    out: list[Any] = []
    for p in path:
        out += _tokens(p) if isinstance(p, _Root) else [p[0] if isinstance(p, tuple) else p]
    return out


def _holds(tokens: list[Any], part: list[Any]) -> bool:
    """Whether `part` is a run of `tokens`."""
    n = len(part)
    return any(tokens[i : i + n] == part for i in range(len(tokens) - n + 1))
