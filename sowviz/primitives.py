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
The graph builder reads its per-construct needs from the rows: the node kind,
the label (`PrimitiveSpec.label`), and per sub-program param a `Body` saying
whether it sits in a scope (cond's branches, while's cond and body) and whether
it is probed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

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


def function_name(sub_program: Any) -> str | None:
    """The Python function a sub-program was traced from (`debug_info`), or None
    for lambdas and unnamed programs."""
    jaxpr, _ = _compat.jaxpr_and_consts(sub_program)
    info = getattr(jaxpr, "debug_info", None)
    name = getattr(info, "func_name", None) if info is not None else None
    return None if not name or name.startswith("<") else name


@dataclass(frozen=True)
class Body:
    """One param of a construct that holds sub-programs, and how the graph shows it.

    `scope`: None when the sub-program's equations sit directly under the
    construct's node; else the label of a scope node that holds them. With
    `each`, the param is a tuple of sub-programs (cond's branches), one scope per
    element, labelled `scope.format(i=index)` plus the element's function name.
    `outputs`: the sub-program returns the equation's outputs (its scope shows
    their shapes). `unprobed`: why its values are never probed (None: they are).
    """

    param: str
    scope: str | None = None
    each: bool = False
    outputs: bool = True
    unprobed: str | None = None


# label(params, primitive_name) -> the label of the construct's graph node.
Label = Callable[[Mapping[str, Any], str], str]


def _fixed(text: str) -> Label:
    return lambda params, name: text


def _called(params: Mapping[str, Any], name: str) -> str:  # jit, closed_call
    label = str(params.get("name") or name)
    body = params.get("jaxpr", params.get("call_jaxpr"))
    mapped = _compat.pmapped_function(body) if label == "_fun" and body is not None else None
    if mapped is not None:  # `jax.pmap(shard)`, not the `fun` JAX jits for it
        return f"pmap({mapped})" if mapped else "pmap"
    if label.startswith("_") and body is not None and _compat.defined_in_jax(body):
        # JAX's private jitted helpers (`jnp.var`'s `_var`, `jnp.where`'s `_where`) are
        # named by the public function they implement.
        return label.lstrip("_")
    if label == "fft" and body is not None:  # `jnp.fft.rfft` and `irfft` both jit `fft`
        eqns = _compat.jaxpr_and_consts(body)[0].eqns
        kinds = {_compat.primitive_label(e) for e in eqns if e.primitive.name == "fft"}
        if len(kinds) == 1:
            return kinds.pop()
    return label


def _cond(params: Mapping[str, Any], name: str) -> str:
    # `lax.platform_dependent`'s cond is the branch that runs here (`default_diag` in
    # `jnp.diagonal`), which its lowering picks: no choice the program makes
    k = _compat.platform_branch(params)
    if k is None:
        return "cond"
    branch = params["branches"][k]
    label = function_name(branch) or "cond"
    return label.lstrip("_") if _compat.defined_in_jax(branch) else label


def _sow(params: Mapping[str, Any], name: str) -> str:
    return str(params.get("name", "sow"))


def _scan(params: Mapping[str, Any], name: str) -> str:
    # a body an installed package wrote (Flax Linen's `body_fn`) is no news: the graph
    # names such a scan by what it holds (`scan(blocks)`)
    sub = params["jaxpr"]
    own = _compat.defined_in_library(sub) and not _compat.defined_in_jax(sub)
    body = None if own else function_name(sub)
    return f"scan({body})" if body else "scan"


def _while(params: Mapping[str, Any], name: str) -> str:
    # as `scan(step)`: the loop by the body function it runs (`while(step)`)
    sub = params["body_jaxpr"]
    own = _compat.defined_in_library(sub) and not _compat.defined_in_jax(sub)
    body = None if own else function_name(sub)
    return f"while({body})" if body else "while"


def _named(construct: str) -> Label:
    """`checkpoint(block)`, `shard_map(step)`: the construct and the function it
    wraps, as `scan(body)`; the construct alone for a lambda, or for a library's own
    wrapper (Equinox's `filter_checkpoint` traces its `fun_checkpoint`)."""

    def label(params: Mapping[str, Any], name: str) -> str:
        sub = params["jaxpr"]
        body = None if _compat.defined_in_library(sub) else function_name(sub)
        return f"{construct}({body})" if body else construct

    return label


def _custom(params: Mapping[str, Any], name: str) -> str:
    return str(params.get("name") or function_name(params["call_jaxpr"]) or name)


# qualifier(params) -> what sets this call of the construct apart from another of the
# same function, or None: `reverse` for `lax.scan(step, reverse=True)`, which ran
# backwards and looked exactly like a forward scan; `save dots` for a `jax.checkpoint`
# policy, under which three calls of one block stacked as identical
Qualifier = Callable[[Mapping[str, Any]], str | None]


def _reverse(params: Mapping[str, Any]) -> str | None:
    return "reverse" if params.get("reverse") else None


def qualified(label: str, qualifier: str | None) -> str:
    """`label` with `qualifier` as its last argument: `scan(step, reverse)`,
    `checkpoint(save dots)` for a lambda's."""
    if not qualifier:
        return label
    if label.endswith(")") and "(" in label:
        return f"{label[:-1]}, {qualifier})"
    return f"{label}({qualifier})"


def unqualified(label: str, qualifier: str | None) -> str:
    """`label` without the `qualifier` `qualified` added: `scan(step)` for
    `scan(step, reverse)`, `checkpoint` for `checkpoint(save dots)`."""
    if not qualifier:
        return label
    for added in (f", {qualifier})", f"({qualifier})"):
        if label.endswith(added):
            return label.removesuffix(added) + (")" if added[0] == "," else "")
    return label


_WHILE_COND = (
    "`while` condition: its equations are shown but not probed (it only decides whether "
    "to continue and is never differentiated)."
)


@dataclass(frozen=True)
class PrimitiveSpec:
    """One construct: its primitive names across JAX versions, the graph's node kind
    and label for it, and the params that hold its sub-programs (in the order they run).

    `custom_rule`: under differentiation a user rule replaces the body, so values
    inside have no tangents or cotangents (the graph probes only the call's outputs,
    and `graph.instrument` refuses a probe point inside).
    `shows_primitive`: the graph node records which primitive it is (custom_jvp or
    custom_vjp; the Tesseract dispatch).
    `qualifier`: what the label adds last (`qualified`): a scan's direction, a
    checkpoint's policy.
    """

    construct: Construct
    names: frozenset[str]
    node_kind: str
    bodies: tuple[Body, ...]
    label: Label
    custom_rule: bool = False
    shows_primitive: bool = False
    qualifier: Qualifier | None = None


_BODY = (Body("jaxpr"),)
_CALL_BODY = (Body("call_jaxpr"),)
SPECS: tuple[PrimitiveSpec, ...] = (
    PrimitiveSpec(Construct.SOW, _compat.SOW_NAMES, "sow", (), _sow),
    PrimitiveSpec(Construct.JIT, _compat.JIT, "jit", _BODY, _called),
    PrimitiveSpec(Construct.CALL, _compat.CLOSED_CALL, "jit", _CALL_BODY, _called),
    PrimitiveSpec(
        Construct.SCAN, frozenset({_compat.SCAN}), "scan", _BODY, _scan, qualifier=_reverse
    ),
    PrimitiveSpec(
        Construct.COND,
        frozenset({_compat.COND}),
        "cond",
        (Body("branches", scope="branch {i}", each=True),),
        _cond,
    ),
    PrimitiveSpec(
        Construct.WHILE,
        frozenset({_compat.WHILE}),
        "while",
        (
            # not `cond`: a `lax.cond` beside the loop is one
            Body("cond_jaxpr", scope="condition", outputs=False, unprobed=_WHILE_COND),
            Body("body_jaxpr", scope="body"),
        ),
        _while,
    ),
    PrimitiveSpec(
        Construct.REMAT,
        _compat.REMAT,
        "remat",
        _BODY,
        _named("checkpoint"),
        qualifier=_compat.remat_policy_label,
    ),
    PrimitiveSpec(
        Construct.CUSTOM_JVP,
        frozenset({_compat.CUSTOM_JVP}),
        "custom",
        _CALL_BODY,
        _custom,
        custom_rule=True,
        shows_primitive=True,
    ),
    PrimitiveSpec(
        Construct.CUSTOM_VJP,
        _compat.CUSTOM_VJP,
        "custom",
        _CALL_BODY,
        _custom,
        custom_rule=True,
        shows_primitive=True,
    ),
    PrimitiveSpec(
        Construct.SHARD_MAP, frozenset({_compat.SHARD_MAP}), "shard_map", _BODY, _named("shard_map")
    ),
    # The graph renames Tesseract stages (`tesseract_names`); "tesseract" is the fallback.
    PrimitiveSpec(
        Construct.TESSERACT,
        frozenset({_compat.TESSERACT}),
        "tesseract",
        (),
        _fixed("tesseract"),
        shows_primitive=True,
    ),
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
