"""One table of the primitives sowviz treats specially, keyed by the names `_compat` defines.

Every pass that walks a jaxpr (the capture engine's rules, the graph builder,
instrumentation) asks the same question of an equation: which construct is
this, and where are its sub-programs? Answering it once here keeps one
dispatch instead of an if/elif per pass, and keeps JAX's version-dependent
primitive names in `_compat` alone (`closed_call` became `eval_jaxpr` in JAX
0.12, `pjit` became `jit` in 0.7; both spellings are in the table).

A pass registers its behaviour per `Construct` (the capture rules do so with
`sowviz.capture.interpret.register`), the way JAX's `checkify` keys its
`error_checks` table by primitive: rules take the equation's parameters by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from . import _compat


class Construct(Enum):
    """What a primitive is to sowviz. Values are stable identifiers."""

    SOW = "sow"
    JIT = "jit"
    CALL = "call"  # a call of a closed jaxpr (no compilation boundary)
    SCAN = "scan"
    COND = "cond"
    WHILE = "while"
    REMAT = "remat"
    CUSTOM_JVP = "custom_jvp"
    CUSTOM_VJP = "custom_vjp"
    SHARD_MAP = "shard_map"
    TESSERACT = "tesseract"


@dataclass(frozen=True)
class PrimitiveSpec:
    """One construct: its primitive names across JAX versions, the graph's node kind
    for it, and the params that hold its sub-programs (in the order they run)."""

    construct: Construct
    names: frozenset[str]
    node_kind: str
    bodies: tuple[str, ...]


SPECS: tuple[PrimitiveSpec, ...] = (
    PrimitiveSpec(Construct.SOW, _compat.SOW_NAMES, "sow", ()),
    PrimitiveSpec(Construct.JIT, _compat.JIT, "jit", ("jaxpr",)),
    PrimitiveSpec(Construct.CALL, _compat.CLOSED_CALL, "jit", ("call_jaxpr",)),
    PrimitiveSpec(Construct.SCAN, frozenset({_compat.SCAN}), "scan", ("jaxpr",)),
    PrimitiveSpec(Construct.COND, frozenset({_compat.COND}), "cond", ("branches",)),
    PrimitiveSpec(
        Construct.WHILE, frozenset({_compat.WHILE}), "while", ("cond_jaxpr", "body_jaxpr")
    ),
    PrimitiveSpec(Construct.REMAT, _compat.REMAT, "remat", ("jaxpr",)),
    PrimitiveSpec(Construct.CUSTOM_JVP, frozenset({_compat.CUSTOM_JVP}), "custom", ("call_jaxpr",)),
    PrimitiveSpec(Construct.CUSTOM_VJP, _compat.CUSTOM_VJP, "custom", ("call_jaxpr",)),
    PrimitiveSpec(Construct.SHARD_MAP, frozenset({_compat.SHARD_MAP}), "shard_map", ("jaxpr",)),
    PrimitiveSpec(Construct.TESSERACT, frozenset({_compat.TESSERACT}), "tesseract", ()),
)

_BY_NAME: dict[str, PrimitiveSpec] = {name: spec for spec in SPECS for name in spec.names}
_BY_CONSTRUCT: dict[Construct, PrimitiveSpec] = {spec.construct: spec for spec in SPECS}
if len(_BY_NAME) != sum(len(s.names) for s in SPECS):  # a name in two rows: a table bug
    raise RuntimeError("sowviz.primitives: a primitive name is listed for two constructs")


def spec_of(primitive_name: str) -> PrimitiveSpec | None:
    """The table row of the primitive named `primitive_name`, or None for an ordinary one."""
    return _BY_NAME.get(primitive_name)


def construct_of(primitive_name: str) -> Construct | None:
    """The construct of the primitive named `primitive_name`, or None."""
    spec = _BY_NAME.get(primitive_name)
    return None if spec is None else spec.construct


def spec(construct: Construct) -> PrimitiveSpec:
    """The table row of `construct`."""
    return _BY_CONSTRUCT[construct]
