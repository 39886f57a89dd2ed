"""The driver: evaluate a jaxpr, turning tagged values into captures.

`evaluate` walks the equations once, at trace time (the caller runs it inside
`jax.jit`, so the walk is paid once per compilation, never per call). A `sow`
equation whose tag is being collected becomes an identity plus a capture.
Equations whose sub-programs contain such sows go to the rule registered for
their construct (`sowviz.primitives`; the rules are in `rules.py`) and receive
the equation's parameters by name; every other equation is re-bound unchanged,
so sub-programs without captures are never rewritten. A sow inside a primitive
with no rule is an error that names the primitive, never a silent drop; the one
exception is a library's linear solve that evaluates only derivatives of the sown
function (lineax's `linear_solve`, `DERIVATIVE_SOLVES`), left out with a note.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import jax
import jax.numpy as jnp

from .. import _compat
from ..primitives import Construct, construct_of
from .primitive import RESERVED_TAG_PREFIX, mode_key, sow_p
from .record import Recorder, Site

# rule(eqn, invals, recorder, **eqn.params) -> the equation's outputs
Rule = Callable[..., list]
RULES: dict[Construct, Rule] = {}


class CaptureError(ValueError):
    """A tagged value cannot be captured where it is."""


def register(*constructs: Construct) -> Callable[[Rule], Rule]:
    """Register the capture rule of `constructs` (each with one rule, at most)."""

    def deco(rule: Rule) -> Rule:
        for c in constructs:
            if c in RULES:
                raise ValueError(f"sowviz: two capture rules registered for {c}")
            RULES[c] = rule
        return rule

    return deco


def rule_for(primitive_name: str) -> Rule | None:
    """The capture rule of the primitive named `primitive_name`, or None."""
    construct = construct_of(primitive_name)
    return None if construct is None else RULES.get(construct)


def _is_foreign_sow(eqn) -> bool:
    # tesseract_jax.sow: a primitive also named "sow", with a string `mode`.
    return (
        eqn.primitive is not sow_p
        and eqn.primitive.name == "sow"
        and isinstance(eqn.params.get("mode"), str)
        and "name" in eqn.params
    )


def _captured_here(eqn, tags: frozenset[str]) -> bool:
    if eqn.primitive is sow_p or _is_foreign_sow(eqn):
        return eqn.params["tag"] in tags
    return False


@functools.lru_cache(maxsize=4096)
def contains_capture(jaxpr, tags: frozenset[str]) -> bool:
    """Whether `jaxpr` (or any sub-program of it) holds a sow collected under `tags`."""
    for eqn in jaxpr.eqns:
        if _captured_here(eqn, tags):
            return True
        for _, _, sub in _compat.sub_jaxprs(eqn):
            if contains_capture(sub, tags):
                return True
    return False


def captured(eqn, invals: list) -> tuple[Site, list]:
    """The site of a collected sow equation and the values it records.

    Leaves the sow carries as symbolic zeros (its `zeros` param) are recorded as
    arrays of zeros, materialised here so enclosing constructs stack them like
    any other value."""
    site = site_of(eqn)
    zeros = eqn.params.get("zeros", ()) if eqn.primitive is sow_p else ()
    if not zeros:
        return site, invals
    by_leaf = dict(zip(site.leaves, invals, strict=True))
    # sowviz's own probes: a cotangent never computed (no derivative reached the value:
    # `cast((w, x))` differentiated in `w` only) is none, as a stage holding only such
    # values has none, not a gradient of zeros
    own = "cotangent" in site.mode.split(".") and str(site.tag).startswith(RESERVED_TAG_PREFIX)
    for leaf, shape, dtype, untangent in zeros:
        if not (own and untangent):
            by_leaf[leaf] = jnp.zeros(shape, dtype)
    order = tuple(sorted(by_leaf))
    return replace(site, leaves=order), [by_leaf[i] for i in order]


def site_of(eqn) -> Site:
    p = eqn.params
    if eqn.primitive is sow_p:
        return Site(
            name=p["name"],
            tag=p["tag"],
            mode=mode_key(p["mode"]),
            treedef=p["treedef"],
            leaves=p["leaves"],
            call=p["index"],
            location=sow_location(eqn),
            vmapped=p.get("vmapped", ()),
            evaluation=p.get("evaluation", 0),
        )
    import jax  # tesseract_jax.sow: one leaf per operand, its treedef recorded aside

    n = len(eqn.invars)
    treedef = _compat.foreign_sow_treedef(p["name"], n)
    if treedef is None:  # not seen while tracing: a bare array, or a list of leaves
        treedef = jax.tree_util.tree_structure(list(range(n)) if n != 1 else 0)
    return Site(
        name=p["name"],
        tag=p["tag"],
        mode=p["mode"],
        treedef=treedef,
        leaves=tuple(range(n)),
        call=-1,
        location=sow_location(eqn),
    )


#: Where installed packages live (as `_compat` tells a library's frame from a user's).
_LIBRARY_DIRS = ("site-packages", "dist-packages")


def sow_location(eqn) -> _compat.SourceLocation | None:
    """The line a sow is reported at: its own; or, where a library traced the function
    holding it and binds that trace again (Equinox's `filter_custom_vjp`: diffrax's
    `BacksolveAdjoint`), so that the innermost frame outside JAX is the library's, the
    user's line that called into the library; or None: a library's line means nothing
    to the user (the traceback JAX keeps there may start inside the library)."""
    loc = _compat.user_location(eqn)
    if loc is None or not any(d in loc.file for d in _LIBRARY_DIRS):
        return loc
    return _compat.user_location_outside_libraries(eqn, fallback=False)


#: Whether captured values pass through `_through_barrier` (`with_barriers` sets it for
#: one trace). Only `locate`'s count re-run turns them off (`nonfinite_counts`): there a
#: value is reduced to its kinds of NaN/Inf, never written out, and XLA may fuse across
#: it as in the plain program, skipping the roundings the plain program skips.
_BARRIERS: contextvars.ContextVar[bool] = contextvars.ContextVar("sowviz_barriers", default=True)


@contextlib.contextmanager
def with_barriers(on: bool) -> Iterator[None]:
    """Trace the captures evaluated inside with (`on`) or without optimization barriers."""
    token = _BARRIERS.set(on)
    try:
        yield
    finally:
        _BARRIERS.reset(token)


def evaluate(jaxpr, consts: Sequence[Any], args: Sequence[Any], rec: Recorder) -> list:
    """Evaluate `jaxpr` on `args` under the current trace, recording captures in `rec`."""
    env: dict[Any, Any] = {}

    def read(v):
        return v.val if isinstance(v, _compat.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts, strict=True):
        env[v] = x
    for v, x in zip(jaxpr.invars, args, strict=True):
        env[v] = x
    tags = rec.options.tags
    sealed = {id(x) for x in args}  # values that need no barrier (`_through_barrier`)
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        if _captured_here(eqn, tags):
            outs = _through_barrier(invals, sealed) if _BARRIERS.get() else invals
            # A value recorded again (a scope's output that is its last stage's) is
            # that barrier's output already: it passes as it is, one value, not two
            # that XLA would find equal and copy.
            sealed.update(id(x) for x in outs)
            rec.add(*captured(eqn, outs))
        elif any(contains_capture(sub, tags) for _, _, sub in _compat.sub_jaxprs(eqn)):
            rule = rule_for(eqn.primitive.name)
            expansion = _compat.hi_expansion(eqn)
            if rule is None and expansion is not None:
                # As a custom rule's body (`rules._custom`): the program is never
                # differentiated any more, so the solver itself computes the call.
                body, n = expansion
                outs = evaluate(body, [], invals[:n], rec)
            elif rule is None and _derivative_solve(eqn, tags):
                outs = _skip_derivative_solve(eqn, invals, rec)
            elif rule is None:
                outs = _unsupported(eqn, invals, rec)
            else:
                with _compat.eqn_context(eqn):
                    outs = rule(eqn, invals, rec, **eqn.params)
        else:
            outs = _compat.bind_eqn(eqn, invals)
        for v, x in zip(eqn.outvars, outs, strict=True):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _through_barrier(values: list, sealed: set[int]) -> list:
    """`values` through one `optimization_barrier`: the program reads the recorded
    buffer itself. Otherwise XLA fuses a probed value's producer into each consumer
    and computes it again to write the recorded copy, one more kernel per probe
    (about 8 ms of XLA:CPU compile each). The program's `inputs` (by `id`) are
    computed nowhere and stay as they are, so a caller can see a recorded input for
    what it is (`_program.Shared`: not an output of the program, which XLA would copy);
    so do an earlier barrier's outputs. Both are `sealed` (by `id`). `locate`'s count
    re-run may go without (`with_barriers`): it writes no copy, only a NaN/Inf mask."""
    arrays = [
        i
        for i, v in enumerate(values)
        if isinstance(v, (jax.Array, jax.core.Tracer))
        and v.dtype != jax.dtypes.float0
        and id(v) not in sealed
    ]
    if not arrays:
        return values
    out = list(values)
    for i, v in zip(arrays, jax.lax.optimization_barrier([values[i] for i in arrays]), strict=True):
        out[i] = v
    return out


def evaluate_closed(closed, args: Sequence[Any], rec: Recorder) -> list:
    """`evaluate` for a sub-program param (closed or open: see `_compat.jaxpr_and_consts`)."""
    jaxpr, consts = _compat.jaxpr_and_consts(closed)
    return evaluate(jaxpr, consts, args, rec)


def _sow_names(jaxpr, tags: frozenset[str]) -> list[str]:
    names: list[str] = []
    for eqn in jaxpr.eqns:
        if _captured_here(eqn, tags):
            names.append(eqn.params["name"])
        for _, _, sub in _compat.sub_jaxprs(eqn):
            names.extend(_sow_names(sub, tags))
    return names


def sow_eqns(jaxpr, tags: frozenset[str]) -> list:
    """The collected sow equations of `jaxpr` and its sub-programs."""
    found = [eqn for eqn in jaxpr.eqns if _captured_here(eqn, tags)]
    for eqn in jaxpr.eqns:
        for _, _, sub in _compat.sub_jaxprs(eqn):
            found.extend(sow_eqns(sub, tags))
    return found


def sows_by_tag(jaxpr, found: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Every sow of `jaxpr` and its sub-programs, whatever its tag: `{tag: {name}}`."""
    found = {} if found is None else found
    for eqn in jaxpr.eqns:
        if eqn.primitive is sow_p or _is_foreign_sow(eqn):
            found.setdefault(eqn.params["tag"], set()).add(eqn.params["name"])
        for _, _, sub in _compat.sub_jaxprs(eqn):
            sows_by_tag(sub, found)
    return found


#: Primitives of a library's linear solve, which an implicit derivative runs on the
#: Jacobian of the user's function: lineax's `linear_solve` (lineax 0.1), which
#: optimistix's `ImplicitAdjoint` and lineax's own derivative rules bind. JAX's
#: `custom_linear_solve` is not one: the user writes its `matvec`, and a sow there is
#: refused (`UNSUPPORTED`).
DERIVATIVE_SOLVES = frozenset({"linear_solve"})


def _derivative_solve(eqn, tags: frozenset[str]) -> bool:
    """Whether `eqn` is a library's linear solve whose sows are all derivatives (a
    tangent or cotangent key): its operator is the linearized user function, applied to
    the solver's own vectors (matrix-vector products and their transposes), never a
    value the program computes. A primal sow in there (a `lx.FunctionLinearOperator`
    of the user's own function) is a value the solve computes: refused as before."""
    if eqn.primitive.name not in DERIVATIVE_SOLVES:
        return False
    sows = [e for _, _, sub in _compat.sub_jaxprs(eqn) for e in sow_eqns(sub, tags)]
    return bool(sows) and all(site_of(e).mode != "primal" for e in sows)


SKIPPED_SOLVE = (
    "sowviz: {names} not captured inside `{prim}`, a library's linear solve (lineax's, "
    "which optimistix's implicit derivative and implicit solvers' Newton steps run): "
    "there the function holding the sow is linearized and applied to the solver's own "
    "vectors, which are no values of your program. The values the program computes, "
    "and their derivatives, are captured outside it."
)


def _skip_derivative_solve(eqn, invals: list, rec: Recorder) -> list:
    """Re-bind a `_derivative_solve` untouched, noting the user's sows it holds."""
    subs = [sub for _, _, sub in _compat.sub_jaxprs(eqn)]
    sites = [site_of(e) for sub in subs for e in sow_eqns(sub, rec.options.tags)]
    names = sorted({s.name for s in sites if not s.tag.startswith(RESERVED_TAG_PREFIX)})
    if names:
        note = SKIPPED_SOLVE.format(
            names=", ".join(repr(n) for n in names), prim=_compat.primitive_label(eqn)
        )
        if note not in rec.notes:
            rec.notes.append(note)
        rec.dropped.update(names)
    return _compat.bind_eqn(eqn, invals)


UNSUPPORTED = (
    "sowviz cannot capture {names} inside `{prim}` (at {loc}): the engine has no rule "
    "for that primitive, so the values would be lost. Move the `sow` outside the "
    "`{prim}` call, or pass `strict=False` to run without them (they are then listed "
    "in `wrapped.notes`)."
)


def _unsupported(eqn, invals: list, rec: Recorder) -> list:
    names = sorted(
        {n for _, _, sub in _compat.sub_jaxprs(eqn) for n in _sow_names(sub, rec.options.tags)}
    )
    msg = UNSUPPORTED.format(
        names=", ".join(repr(n) for n in names),
        prim=_compat.primitive_label(eqn),
        loc=_compat.user_location(eqn) or "unknown location",
    )
    if rec.options.strict:
        raise CaptureError(msg)
    rec.notes.append(msg)
    rec.dropped.update(names)
    return _compat.bind_eqn(eqn, invals)
