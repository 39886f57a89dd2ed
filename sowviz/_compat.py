"""Every touch of JAX internals, and nothing else.

sowviz supports JAX 0.10, 0.11 and 0.12; `make test` runs the engine on the
oldest (0.10.2) and the newest (0.12). Public `jax.extend` names are preferred;
the few `jax._src` imports below are the ones with no public equivalent. Each
internal whose layout changed between those versions has one function here,
with a comment naming the version that changed it:

* `scan_layout`: JAX 0.11 replaced scan's `num_consts` / `num_carry` params by
  the flat trees `ft_in` / `ft_out`.
* `jaxpr_and_consts`: JAX 0.11 merged `ClosedJaxpr` into `Jaxpr` (a jaxpr
  carries its consts; `jax.extend.core.ClosedJaxpr` is an alias of `Jaxpr`).
* `CLOSED_CALL`: JAX 0.12 renamed the staged `closed_call` primitive
  `eval_jaxpr` (same `call_jaxpr` param).
* `_patch_scan_zero_ys_cotangents`: up to JAX 0.10 scan's transpose mishandles a
  symbolic-zero cotangent of a stacked output (JAX 0.12 handles it).
* `linear_transpose_call`: up to JAX 0.10 `jax.linear_transpose` refuses a map
  with float0 outputs (the tangents of integer outputs); JAX 0.12 takes them.
* `varying_axes`: JAX 0.9 moved a shard_map value's varying axes from
  `aval.vma` to `aval.mat.varying`.

Unchanged across 0.10–0.12 (checked against both installs): the params of
`jit` (`inline` became an enum in 0.12, passed through untouched), `cond`,
`while`, `remat2`, `custom_jvp_call`, `custom_vjp_call` and `shard_map`.
When JAX moves one of these, this is the only file to change.
"""

from __future__ import annotations

# No public home: effects (to keep tagged values alive through DCE and partial
# evaluation), source locations and name stacks of equations.
import collections
import contextlib
import functools
import inspect
import itertools
import os
import re
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import numpy as np
from jax._src import api_util as _api_util
from jax._src import core as _core
from jax._src import effects as _effects
from jax._src import linear_util as _lu
from jax._src import source_info_util as _source_info
from jax._src import traceback_util as _traceback_util
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import partial_eval as _pe
from jax._src.sharding_impls import UNSPECIFIED as _UNSPECIFIED
from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Primitive, Var
from jax.interpreters import ad, batching, mlir

# Frames inside sowviz are library frames: hidden from user tracebacks, and
# skipped when an equation's source location is reported.
_SOWVIZ_DIR = os.path.dirname(os.path.abspath(__file__))
_traceback_util.register_exclusion(_SOWVIZ_DIR)
_source_info.register_exclusion(_SOWVIZ_DIR)


def varying_axes(x) -> frozenset:
    """Mesh axes a value varies over inside `shard_map` (its 'vma')."""
    aval = _core.typeof(x)
    mat = getattr(aval, "mat", None)
    if mat is not None:
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", ()))  # JAX < 0.9


__all__ = [
    "ClosedJaxpr",
    "Jaxpr",
    "JaxprEqn",
    "Literal",
    "Primitive",
    "Var",
    "ad",
    "batching",
    "mlir",
]


# ---------------------------------------------------------------------------
# Effects. A tagged value must survive dead-code elimination inside `jit`,
# `scan` and `remat` partial evaluation even when nothing downstream uses it;
# an unordered effect registered where jax.debug.print registers its own does
# exactly that, without the token threading an ordered effect would need.


class CaptureEffect(_effects.Effect):
    """The effect of a `sow`: 'this value is observed'."""

    def __str__(self) -> str:
        return "SowCapture"


capture_effect = CaptureEffect()
for _set in (
    _effects.lowerable_effects,
    _effects.control_flow_allowed_effects,
    _effects.custom_derivatives_allowed_effects,
    _effects.remat_allowed_effects,
    _effects.partial_eval_kept_effects,
):
    _set.add_type(CaptureEffect)


# Whether a capture is being traced. Outside a capture a `sow` carries no
# effect, so a user's plain `jax.jit` of code full of sows keeps JAX's C++
# dispatch fast path (an effectful program loses it: ~3x slower dispatch on a
# 64-layer MLP). Being part of the trace context, the flag also keys JAX's
# tracing caches: an inner `jit` traced without it is never reused inside a
# capture, where its sows might have been dead-code eliminated.
from jax._src import config as _config  # noqa: E402

capturing = _config.bool_state(
    "sowviz_capturing",
    False,
    "Internal to sowviz: set while save_intermediates traces a function.",
    include_in_trace_context=True,
)

# A sow's serial number (its `index`) must differ between two calls of one
# function. JAX reuses the program it traced for `jax.jit(f)` or
# `jax.checkpoint(f)` when `f` is called again with like arguments, so three
# calls of a jitted block would share one sow equation and one number, and their
# values would land under one name. This serial is part of the trace context, so
# it keys JAX's tracing caches; every sow traced while capturing moves it on, so
# the next call of a function holding a sow misses those caches and is traced
# again (as a plain Python call is), its sow with a number of its own. Its values
# are never reused, not even by the next capture: a trace cached by an earlier
# capture would be hit without tracing its sow, so without moving the serial on.
_serials = itertools.count(1)
capture_serial = _config.int_state(
    "sowviz_capture_serial",
    0,
    "Internal to sowviz: counts the sows traced by the current capture.",
    include_in_trace_context=True,
)


@contextlib.contextmanager
def capture_tracing() -> Iterator[None]:
    """Trace a capture: sows carry their effect, and each call of a function holding
    a sow is traced anew (see `capture_serial`)."""
    with capturing(True), capture_serial(next(_serials)):
        yield


def sow_traced() -> None:
    """Note that a sow was traced: later calls of cached traces are traced again.
    Only inside `capture_tracing`, which puts the serial back when it ends (a serial
    moved on outside one stayed in this thread's trace context: sowviz's own cache of
    traces, keyed on it, then missed traces made in other threads)."""
    if capturing.value and capture_serial.value:
        capture_serial.set_local(next(_serials))


def is_symbolic_zero(x: Any) -> bool:
    """Whether a tangent or cotangent is JAX's symbolic zero (`ad.Zero`)."""
    return type(x) is ad.Zero


not_mapped = None  # batching's marker for an unbatched operand (0.4.31+: None)


# ---------------------------------------------------------------------------
# Higher-order primitives by name (looking them up by name keeps the import
# surface small). Renames are commented with the JAX version.

JIT = frozenset({"jit", "pjit"})  # "pjit" before JAX 0.7
# A call of a closed jaxpr (`call_jaxpr` param): "closed_call" up to JAX 0.11,
# "eval_jaxpr" from JAX 0.12 (`core.closed_call_p` is `eval_jaxpr_p` there).
CLOSED_CALL = frozenset({"closed_call", "core_call", "call", "eval_jaxpr"})
CALL_NAMES = JIT | CLOSED_CALL
SCAN = "scan"
COND = "cond"
WHILE = "while"
REMAT = frozenset({"checkpoint", "remat", "remat2"})
CUSTOM_JVP = "custom_jvp_call"
CUSTOM_VJP = frozenset({"custom_vjp_call", "custom_vjp_call_jaxpr"})
SHARD_MAP = "shard_map"
TESSERACT = "tesseract_dispatch"


@dataclass(frozen=True)
class ScanLayout:
    """How a `scan` equation's operands split: consts, then carry, then xs."""

    num_consts: int
    num_carry: int


def scan_layout(params: dict[str, Any]) -> ScanLayout:
    """The operand layout of a `scan` equation from its params.

    JAX <= 0.10 has `num_consts` / `num_carry` params; JAX 0.11 replaced them by
    `ft_in` / `ft_out` (flat trees of (consts, carry, xs) and (carry, ys)).
    """
    if "num_consts" in params:  # JAX <= 0.10
        return ScanLayout(params["num_consts"], params["num_carry"])
    consts, carry, _xs = params["ft_in"].unpack()  # JAX >= 0.11
    return ScanLayout(len(consts), len(carry))


def _patch_scan_zero_ys_cotangents() -> None:
    """Instantiate symbolic-zero `ys` cotangents before `scan`'s transpose (JAX < 0.12).

    JAX 0.10's scan transpose passes a symbolic-zero cotangent of a stacked output
    (aval `[length, ...]`) unchanged into the transposed body, where it is added to
    the body's per-iteration output: "Expected cotangent type float32[3] but got
    float32[40,3]" when that output is also the carry (`return s, s`). Plain JAX
    never meets it (an unused `ys` tangent is dead-code eliminated), but a probe on
    the scan's outputs keeps that tangent alive while its cotangent is zero. JAX
    0.12's `_scan_transpose_fancy` maps such zeros to per-iteration avals itself.
    Real zeros are correct under either behaviour, so 0.11 (not tested) is covered.
    """
    if jax.__version_info__ >= (0, 12):
        return
    from jax._src.interpreters import ad as _ad
    from jax._src.lax.control_flow import loops as _loops

    rule = getattr(_ad, "fancy_transposes", {}).get(_loops.scan_p)
    if rule is None or getattr(rule, "_sowviz_zero_ys", False):
        return

    def transpose(cts, *args, **params):
        ncar = scan_layout(params).num_carry
        cts = [*cts[:ncar], *(_ad.instantiate_zeros(ct) for ct in cts[ncar:])]
        return rule(cts, *args, **params)

    transpose._sowviz_zero_ys = True  # type: ignore[attr-defined]
    _ad.fancy_transposes[_loops.scan_p] = transpose


_patch_scan_zero_ys_cotangents()


_HAS_CLOSED_JAXPR = ClosedJaxpr is not Jaxpr  # JAX 0.11 made ClosedJaxpr an alias


def jaxpr_and_consts(j: Any) -> tuple[Jaxpr, list]:
    """(jaxpr, consts) of a sub-program param, closed or open, such that
    `jaxpr.constvars` pair with `consts` and `jaxpr.invars` are the operands.

    Up to JAX 0.10 a param is a `ClosedJaxpr` (jaxpr + consts) or an open `Jaxpr`
    (no consts). From JAX 0.11 there is only `Jaxpr`, which carries its consts
    itself (its `constvars` are the inputs with attached values).
    """
    if _HAS_CLOSED_JAXPR and isinstance(j, ClosedJaxpr):  # JAX <= 0.10
        return j.jaxpr, list(j.consts)
    return j, list(getattr(j, "consts", ()))  # an open jaxpr, or any JAX >= 0.11 jaxpr


def as_closed(jaxpr: Jaxpr) -> Any:
    """An open jaxpr (no consts) as the closed form `jaxpr_and_consts` reads."""
    return ClosedJaxpr(jaxpr, ()) if _HAS_CLOSED_JAXPR else jaxpr  # JAX >= 0.11: one class


def sub_jaxprs(eqn: JaxprEqn) -> Iterator[tuple[str, int | None, Jaxpr]]:
    """(param name, index in a tuple param or None, jaxpr) for every jaxpr in `eqn.params`,
    and in a JAX >= 0.12 "hijax" primitive's own params (`custom_root`'s solver: a `sow`
    in there must be found, captured or refused, never lost)."""
    params = eqn.params
    if eqn.primitive.name == "call_hi_primitive":  # the only case that needs a copy
        params = {**params, **(getattr(params.get("_prim"), "params", None) or {})}
    for key, val in params.items():
        items = val if isinstance(val, (tuple, list)) else (val,)
        for i, item in enumerate(items):
            if isinstance(item, (Jaxpr, ClosedJaxpr)):
                j, _ = jaxpr_and_consts(item)
                yield key, (i if isinstance(val, (tuple, list)) else None), j


def hi_expansion(eqn: JaxprEqn) -> tuple[Jaxpr, int] | None:
    """What a JAX >= 0.12 `custom_root` call computes, undifferentiated: its solver's
    program and how many of the call's operands it takes (the first ones), as
    `CustomRoot.expand` runs it; None for any other equation. (JAX <= 0.11 binds
    `custom_root` as a `custom_jvp` call, whose body sowviz runs the same way.)"""
    if eqn.primitive.name != "call_hi_primitive":
        return None
    prim = eqn.params.get("_prim")
    if type(prim).__name__ != "CustomRoot":
        return None
    solve = (getattr(prim, "params", None) or {}).get("solve_jaxpr")
    if not isinstance(solve, (Jaxpr, ClosedJaxpr)):
        return None
    jaxpr, _ = jaxpr_and_consts(solve)
    return jaxpr, len(jaxpr.invars)


# ---------------------------------------------------------------------------
# Source locations and name stacks.


@dataclass(frozen=True)
class SourceLocation:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function}


#: Primitives that change a value's type only (its varying manual mesh axes), never its
#: numbers: the stage graph draws them as edges.
TYPE_CASTS = frozenset({"pvary", "pcast"})


def user_location(eqn: JaxprEqn) -> SourceLocation | None:
    """The user's frame that created `eqn` (library frames skipped), or None."""
    try:
        frame = _source_info.user_frame(eqn.source_info.traceback)
    except Exception:  # source info is best effort; never fail a capture for it
        return None
    if frame is None:
        return None
    return SourceLocation(frame.file_name, frame.start_line, frame.function_name)


def name_stack_kinds(eqn: JaxprEqn) -> tuple[tuple[str, str], ...]:
    """(kind, name) per name-stack entry: kind is 'scope' or 'transform'."""
    stack = eqn.source_info.name_stack
    out: list[tuple[str, str]] = []
    for entry in getattr(stack, "stack", ()):
        name = getattr(entry, "name", None)
        if isinstance(name, str):
            kind = "transform" if type(entry).__name__ == "Transform" else "scope"
            out.append((kind, name))
    return tuple(out)


def under_jvp(eqn: JaxprEqn) -> bool:
    """Whether JAX's JVP made `eqn` (`jax.jacfwd`, `jax.jvp`, `jax.hessian`): its name
    stack holds the `jvp` transform, as `transpose` marks a backward pass's."""
    return ("transform", "jvp") in name_stack_kinds(eqn)


def new_eqn(invars, outvars, primitive, params, effects, source_info=None) -> JaxprEqn:
    return _core.new_jaxpr_eqn(invars, outvars, primitive, params, effects, source_info)


#: (primitive, params) of the one equation a function of one array traces to, by name
_UNARY: dict[str, tuple[Primitive, dict]] = {}


def _unary_eqn(fn: Callable, x: Var, source_info: Any) -> tuple[JaxprEqn, Var]:
    """An equation `y = fn(x)` and its output `y`: the primitive `fn` binds, found once
    by tracing it (so no primitive's name is assumed, JAX 0.10-0.12)."""
    key = fn.__qualname__
    if key not in _UNARY:
        closed = jax.make_jaxpr(fn)(jax.ShapeDtypeStruct((), "float32"))
        (eqn,) = closed.jaxpr.eqns
        _UNARY[key] = (eqn.primitive, dict(eqn.params))
    prim, params = _UNARY[key]
    y = new_var(x.aval)
    return new_eqn([x], [y], prim, params, set(), source_info), y


def stop_gradient_eqn(x: Var, source_info=None) -> tuple[JaxprEqn, Var]:
    """An equation `y = stop_gradient(x)` and its output `y` (`stop_gradient`)."""
    return _unary_eqn(jax.lax.stop_gradient, x, source_info)


def copy_eqn(x: Var, source_info=None) -> tuple[JaxprEqn, Var]:
    """An equation `y = copy(x)` and its output `y` (`jnp.copy` binds `copy`). A value
    sown through a copy that one equation alone reads gets that equation's cotangent
    alone: a `sow` hands its result to every read of its operand (`read_on_through`),
    the copy's has none."""
    return _unary_eqn(jax.numpy.copy, x, source_info)


def closed_call_eqn(closed: ClosedJaxpr, invars: list, source_info=None) -> JaxprEqn:
    """An equation calling `closed` on `invars` (`core.closed_call_p`: "closed_call" up
    to JAX 0.11, "eval_jaxpr" in 0.12), with fresh output variables."""
    outs = [new_var(aval) for aval in closed.out_avals]
    return new_eqn(
        invars, outs, _core.closed_call_p, {"call_jaxpr": closed}, closed.effects, source_info
    )


def zero_derivative(primitive: Any) -> bool:
    """Whether `primitive`'s derivative is zero by definition: `stop_gradient`, and
    those JAX registers with `ad.defjvp_zero` (floor, round, sign, ...), whose JVP rule
    is a `functools.partial` of `zero_jvp` in JAX 0.10-0.12."""
    if primitive.name == "stop_gradient":
        return True
    from jax._src.interpreters import ad as _ad

    rule = _ad.primitive_jvps.get(primitive)
    zero = getattr(_ad, "zero_jvp", None)
    return zero is not None and getattr(rule, "func", None) is zero


def is_ref(aval: Any) -> bool:
    """Whether `aval` is a mutable array reference's (`jax.new_ref`): a value that
    equations change in place, beside their outputs."""
    return type(aval).__name__ == "AbstractRef"


def touches_ref(eqn: Any) -> bool:
    """Whether `eqn` makes, reads, writes or freezes a mutable array reference: its
    values are the reference's, which a probe beside it cannot take (JAX's `vjp`
    refused the program)."""
    return any(is_ref(getattr(v, "aval", None)) for v in (*eqn.invars, *eqn.outvars))


def eval_jaxpr(jaxpr: Jaxpr, consts, *args):
    return _core.eval_jaxpr(jaxpr, consts, *args)


# ---------------------------------------------------------------------------
# Re-binding equations (the capture engine's interpreter).


def eqn_context(eqn: JaxprEqn):
    """Bind inside `eqn`'s own source location and name stack, as `core.eval_jaxpr` does."""
    stack = _source_info.current_name_stack() + eqn.source_info.name_stack
    return contextlib.ExitStack() if eqn.source_info is None else _EqnContext(eqn, stack)


class _EqnContext:
    def __init__(self, eqn: JaxprEqn, stack):
        self._user = _source_info.user_context(eqn.source_info.traceback, name_stack=stack)
        self._ctx = eqn.ctx.manager

    def __enter__(self):
        self._user.__enter__()
        self._ctx.__enter__()

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        return self._user.__exit__(*exc)


def bind_eqn(eqn: JaxprEqn, invals: list) -> list:
    """Evaluate one equation on `invals` (tracers or arrays); always returns a list."""
    bind_params = eqn.primitive.get_bind_params(eqn.params)
    with eqn_context(eqn):
        out = eqn.primitive.bind(*invals, **bind_params)
    return list(out) if eqn.primitive.multiple_results else [out]


def trace_closed(fn, in_avals, name: str = "sowviz") -> ClosedJaxpr:
    """Trace `fn(*flat_args) -> list` at `in_avals` into a ClosedJaxpr (avals kept exactly,
    weak types and shardings included, which `jax.make_jaxpr` would not guarantee)."""
    dbg = _api_util.debug_info(name, fn, tuple(in_avals), {})
    wrapped = _lu.wrap_init(lambda *a: list(fn(*a)), debug_info=dbg)
    jaxpr, _, consts = _pe.trace_to_jaxpr_dynamic(wrapped, list(in_avals))
    return ClosedJaxpr(jaxpr, consts)


def closed_to_open(closed: ClosedJaxpr) -> tuple[Jaxpr, list]:
    """Turn a ClosedJaxpr's consts into leading inputs: (open jaxpr, consts)."""
    return _pe.convert_constvars_jaxpr(closed.jaxpr), list(closed.consts)


UNSPECIFIED_SHARDING = _UNSPECIFIED


# --- graph builder
# Helpers for sowviz/graph (stage graph and instrumentation).
SOW_NAMES = frozenset({"sow"})  # sowviz's and tesseract_jax's sow primitives
_LIBRARY_DIRS = ("site-packages", "dist-packages")


def _is_user_code(code: Any) -> bool:
    """A frame of the user's own code: not JAX's, sowviz's or an installed package's."""
    return _is_user_file(code.co_filename)


def _is_user_file(fname: str) -> bool:
    return (
        _source_info.is_user_filename(fname)
        and not fname.startswith(_SOWVIZ_DIR + os.sep)
        and not any(d in fname for d in _LIBRARY_DIRS)
    )


def is_user_function(fn: Any) -> bool:
    """Whether `fn` is a plain Python function of the user's own code (not a library's,
    JAX's or sowviz's)."""
    code = getattr(fn, "__code__", None)
    return code is not None and isinstance(fn, types.FunctionType) and _is_user_code(code)


def is_user_class(cls: type) -> bool:
    """Whether `cls` is defined in the user's own code (a notebook's classes are)."""
    module = sys.modules.get(cls.__module__)
    fname = getattr(module, "__file__", None)
    return fname is None or _is_user_file(fname)  # None: `__main__` of a notebook, a REPL


def user_location_outside_libraries(
    eqn: JaxprEqn, *, fallback: bool = True
) -> SourceLocation | None:
    """Like `user_location`, also skipping installed packages and sowviz itself.

    The innermost frame outside JAX, sowviz and site-packages (so an Equinox layer
    points at the line that called it); with none, `user_location` (a library's line),
    or None without `fallback`. An equation of a loop body or a `remat` made by a
    library has no frame of the user's: its traceback starts where the body was traced
    (Flax's `nn.scan(nn.remat(Block))`: in `flax/core/axes_scan.py`).
    """
    tb = eqn.source_info.traceback
    if tb is None:
        return None
    try:
        codes, lastis = tb.raw_frames()
        for code, lasti in zip(codes, lastis, strict=True):
            if not _is_user_code(code) and not _stax_layer(code):
                continue  # a stax layer is drawn as a call of the user's: its lines too
            frame = _source_info.raw_frame_to_frame(code, lasti)
            return SourceLocation(frame.file_name, frame.start_line, frame.function_name)
    except Exception:  # best effort, as user_location
        return None
    return user_location(eqn) if fallback else None


_made_by_user_cache: dict = {}


def made_by_user(eqn: JaxprEqn) -> bool:
    """Whether the user's own code made `eqn`, calling JAX itself (`jnp.concatenate`,
    `jax.nn.sigmoid`), not through another library (Flax's `LayerNorm`, optax's loss):
    the innermost frame of its traceback outside JAX and sowviz is the user's."""
    return bool(_by_traceback(_made_by_user_cache, eqn, _made_by_user))


def _made_by_user(codes: Any, lastis: Any) -> bool:
    for code in codes:
        fname = code.co_filename
        if _source_info.is_user_filename(fname) and not fname.startswith(_SOWVIZ_DIR + os.sep):
            return not any(d in fname for d in _LIBRARY_DIRS)
    return False


def new_var(aval: Any) -> Var:
    return _core.Var(aval)


def staging_now() -> bool:
    """Whether a JAX transformation is tracing the code that asks (inside `jax.jit`,
    `vmap`, `grad`, a `lax.scan` body...): a compiled program called there would be
    staged into that trace, not run, and its results would be tracers. Inside
    `jax.ensure_compile_time_eval()` (JAX 0.10-0.12: `eager_constant_folding`) a call on
    concrete values runs, so that is not staging."""
    if _config.eager_constant_folding.value:
        return False
    return not isinstance(_core.trace_ctx.trace, _core.EvalTrace)


def traced_var(x: Any) -> Var | None:
    """The jaxpr variable a value traced by `jax.make_jaxpr` stands for, through the
    tracers of `vmap` and `jvp` around it (an Equinox module called under `jax.vmap`),
    or None (a constant, a tracer of another kind). The variable is the one the
    traced jaxpr holds: JAX 0.10-0.12 keep a tracer's variable as its `val`."""
    x = _unwrapped_tracer(x)
    if isinstance(x, _pe.DynamicJaxprTracer):
        x = x.val
    return x if isinstance(x, Var) else None


def _unwrapped_tracer(x: Any) -> Any:
    """`x` without the `vmap` and `jvp` tracers around it: the `make_jaxpr` tracer (or
    variable) inside, else None."""
    for _ in range(16):  # tracers nest one per transformation level
        if isinstance(x, Var | _pe.DynamicJaxprTracer):
            return x
        if isinstance(x, _batching.BatchTracer):
            x = x.val
        elif isinstance(x, _ad.JVPTracer):
            x = x.primal
        else:
            return None
    return None


class Origin:
    """Where a traced value was made: its equation's traceback object and output index.
    `jax.vmap` of a `lax.scan` traces the loop's body again to batch it (its batching
    rule re-runs the body's equations): new variables, but each equation keeps the
    traceback object of the one it batches, so this still finds the value. Equal only
    for the same traceback object, never for an equal one (a line run twice)."""

    __slots__ = ("output", "traceback")

    def __init__(self, traceback: Any, output: int) -> None:
        self.traceback, self.output = traceback, output

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Origin)
            and other.traceback is self.traceback
            and other.output == self.output
        )

    def __hash__(self) -> int:
        return hash((id(self.traceback), self.output))


def traced_origin(x: Any) -> Origin | None:
    """The `Origin` of a value traced by `jax.make_jaxpr` (through the tracers of `vmap`
    and `jvp` around it, as `traced_var`), or None. JAX 0.10-0.12 keep the equation
    being traced that made a tracer as its `parent`."""
    x = _unwrapped_tracer(x)
    if not isinstance(x, _pe.DynamicJaxprTracer):
        return None
    eqn = getattr(x, "parent", None)
    outs = getattr(eqn, "outvars", ())
    k = next((j for j, v in enumerate(outs) if v is x.val), None)
    tb = getattr(getattr(eqn, "source_info", None), "traceback", None)
    return None if tb is None or k is None else Origin(tb, k)


def eqn_origin(eqn: JaxprEqn, k: int) -> Origin | None:
    """The `Origin` of output `k` of `eqn` (None without a traceback)."""
    tb = eqn.source_info.traceback
    return None if tb is None else Origin(tb, k)


def replace_eqn(eqn: JaxprEqn, **changes: Any) -> JaxprEqn:
    return eqn.replace(**changes)


def replace_jaxpr(jaxpr: Jaxpr, **changes: Any) -> Jaxpr:
    return jaxpr.replace(**changes)


_JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__)) + os.sep
_STAX_FILE = os.path.join(_JAX_DIR, "example_libraries", "stax.py")


def _traced_from(sub_program: Any) -> str:
    """The file of the function `sub_program` was traced from (its
    `debug_info.func_src_info`, "name at file:line"), or ""."""
    jaxpr, _ = jaxpr_and_consts(sub_program)
    src = getattr(getattr(jaxpr, "debug_info", None), "func_src_info", None) or ""
    file = src.partition(" at ")[2].rpartition(":")[0]
    return os.path.abspath(file) if file else ""


def jax_jitted_file(sub_program: Any) -> str:
    """The file of the function `sub_program` was traced from when it is JAX's own
    (`jax.image.resize`'s `_resize`, in `jax/_src/image/scale.py`), else ""."""
    file = _traced_from(sub_program)
    return file if file.startswith(_JAX_DIR) else ""


#: The primitive that picks `lax.platform_dependent`'s branch when lowered.
PLATFORM_INDEX = frozenset({"platform_index"})


def platform_branch(params: Any) -> int | None:
    """For a `cond` that `lax.platform_dependent` binds (`jnp.diagonal`: `_mosaic_diag`
    when lowered inside a Pallas kernel, else `_default_diag`), the branch that runs on
    this backend; None for any other cond. Its index is the `platform_index` primitive's,
    which lowering fixes: no branch is chosen at run time."""
    platforms = params.get("branches_platforms")  # absent: a plain cond
    if platforms is None:
        return None
    here = {jax.default_backend()}
    try:  # "gpu" is lowered as "cuda" or "rocm"
        from jax._src import xla_bridge

        here.add(xla_bridge.canonicalize_platform(jax.default_backend()))
    except Exception:  # best effort: the default branch
        pass
    default = None
    for k, names in enumerate(platforms):
        if names is None:
            default = k
        elif here & set(names):
            return k
    return default


def defined_in_jax(sub_program: Any) -> bool:
    """Whether the function `sub_program` was traced from is JAX's own."""
    return _traced_from(sub_program).startswith(_JAX_DIR)


_PMAP_FILE = os.path.join(_JAX_DIR, "_src", "pmap.py")


_user_names: dict[tuple, tuple[Any, tuple[str, ...]]] = {}


def _outermost_first(codes: Any, lastis: Any) -> tuple[str, ...]:
    return tuple(c.co_qualname for c in reversed(codes) if _is_user_code(c))


def pmapped_function(sub_program: Any) -> str | None:
    """For the body of the `jit` that `jax.pmap` binds (JAX >= 0.8: a `shard_map` in
    a jit of its own `_fun`), the user's function it maps (the last call all the
    body's equations were made in; "" if none is known); None for any other body."""
    if _traced_from(sub_program) != _PMAP_FILE:
        return None
    common: tuple[str, ...] | None = None

    def visit(jaxpr: Any) -> None:
        nonlocal common
        for eqn in jaxpr.eqns:
            # the user's frames, outermost first (JAX may trace the body on its own
            # stack: then the mapped function is the outermost)
            names = _by_traceback(_user_names, eqn, _outermost_first)
            if names:
                if common is None:
                    common = names
                else:
                    k = 0
                    while k < min(len(common), len(names)) and common[k] == names[k]:
                        k += 1
                    common = common[:k]
            for _, _, sub in sub_jaxprs(eqn):
                visit(sub)

    visit(jaxpr_and_consts(sub_program)[0])
    return common[-1].rpartition(".")[2] if common else ""


def defined_in_library(sub_program: Any) -> bool:
    """Whether the function `sub_program` was traced from is JAX's or an installed
    package's (Equinox's `filter_checkpoint` traces its own `fun_checkpoint`)."""
    file = _traced_from(sub_program)
    return file.startswith(_JAX_DIR) or any(d in file for d in _LIBRARY_DIRS)


def with_outputs(closed: Any, outvars: list) -> Any:
    """`closed` (a program `jax.make_jaxpr` made) returning `outvars` instead, with its
    consts; JAX >= 0.11 keeps them on the one `Jaxpr` class."""
    jaxpr, consts = jaxpr_and_consts(closed)
    jaxpr = jaxpr.replace(outvars=outvars)
    return ClosedJaxpr(jaxpr, consts) if _HAS_CLOSED_JAXPR else jaxpr


def check_jaxpr(jaxpr: Jaxpr) -> None:
    _core.check_jaxpr(jaxpr)


# --- added by graph (H4): module stages' call sites. `Traceback.raw_frames` and
# `raw_frame_to_frame` are unchanged from JAX 0.10.2 to 0.12.
def call_sites(eqn: JaxprEqn, code: Any) -> list[SourceLocation]:
    """Where each active call of the function with code object `code` was made, for
    the equation's traceback, innermost call first (JAX-internal frames skipped)."""

    def is_caller(c: Any) -> bool:
        return _source_info.is_user_filename(c.co_filename) and c is not code

    def sites(codes: Any, lastis: Any) -> list[SourceLocation]:
        found = (_callers(codes, lastis, k, is_caller) for k, c in enumerate(codes) if c is code)
        return [loc for loc in found if loc is not None]

    return _of_traceback(eqn, sites, [])


def tesseract_client(params: dict[str, Any]) -> Any:
    """The `Jaxeract` client of a `tesseract_dispatch` equation, or None.

    tesseract-jax 0.4 passes it as the `client` param; tesseract-jax 0.5 bundles
    every static param into one `params` object whose `.client` it is.
    """
    if "client" in params:  # tesseract-jax <= 0.4
        return params["client"]
    return getattr(params.get("params"), "client", None)  # tesseract-jax >= 0.5


# ---------------------------------------------------------------------------
# tesseract_jax.sow: its primitive carries no tree structure; `tesseract_jax.sow`
# records each name's PyTreeDef in the ContextVar `_sow_treedefs` while its own
# save_intermediates traces (tesseract-jax 0.4 and 0.5). We set that store while
# we trace and keep the last structure seen per name, so a sow inside an inner
# `jit` whose trace JAX reuses (no Python re-run) keeps its structure too.
_foreign_treedefs: dict[str, Any] = {}


@contextlib.contextmanager
def recording_foreign_sow_treedefs() -> Iterator[dict[str, Any]]:
    """While tracing: record the tree structure of every `tesseract_jax.sow`. Yields
    {name: Tesseract client} of those called inside a Tesseract (`tesseract_tracing`)."""
    import sys

    module = sys.modules.get("tesseract_jax.sow")  # never import it ourselves
    store_var = getattr(module, "_sow_treedefs", None)
    if store_var is None:
        yield {}
        return
    store = _SowStore()
    token = store_var.set(store)
    try:
        yield store.inside
    finally:
        store_var.reset(token)
        _foreign_treedefs.update(store)


def foreign_sow_treedef(name: str, num_leaves: int) -> Any | None:
    """The recorded tree structure of the `tesseract_jax.sow` named `name`, if it
    has `num_leaves` leaves (else None: the caller falls back to a flat list)."""
    treedef = _foreign_treedefs.get(name)
    return treedef if treedef is not None and treedef.num_leaves == num_leaves else None


# --- Explicit meshes (JAX >= 0.7): the sharding an input's type carries.
def explicit_sharding(x: Any) -> Any | None:
    """The sharding in `x`'s type when its mesh has Explicit axes (the default of
    `jax.make_mesh` since JAX 0.7), else None. `jax.jit` traces such an argument with
    it (`float32[4@data,3]`); a trace without it sees another type, and a
    `shard_map` in_spec or a `custom_jvp` rule's `select` then refuses the
    mismatch."""
    try:
        sharding = getattr(jax.typeof(x), "sharding", None)
    except Exception:  # not a JAX value, or a JAX without types carrying shardings
        return None
    explicit = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
    types = getattr(getattr(sharding, "mesh", None), "axis_types", None) or ()
    return sharding if explicit is not None and explicit in types else None


_EXPLICIT = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)


def explicit_axes(aval: Any) -> tuple[tuple[str, ...], ...] | None:
    """Per dimension of a type, the Explicit mesh axes that split it (`float32[64@data,
    32]`: `(("data",), ())`); None when none does (Auto axes are no part of a type)."""
    sharding = getattr(aval, "sharding", None)
    spec, mesh = getattr(sharding, "spec", None), getattr(sharding, "mesh", None)
    if (
        spec is None
        or _EXPLICIT is None
        or _EXPLICIT not in (getattr(mesh, "axis_types", ()) or ())
    ):
        return None  # (most types: no mesh, or Auto axes only)
    explicit = _EXPLICIT
    try:
        kinds = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
        out = []
        for entry in tuple(spec) + (None,) * (len(aval.shape) - len(spec)):
            names = () if entry is None else (entry,) if isinstance(entry, str) else entry
            out.append(tuple(n for n in names if isinstance(n, str) and kinds.get(n) == explicit))
    except (TypeError, ValueError, AttributeError):  # a spec of another form: no axes shown
        return None
    return tuple(out) if any(out) else None


# --- added by graph: the library calls below the user's line, to name folded runs of
# equations (`make_causal_mask`, `Optimizer.update` > `scale_by_adam`). Same
# traceback internals as `call_sites`.
@dataclass(frozen=True)
class CallPath:
    """What `call_path` found: the functions' qualified names, outermost first, and
    whether they start below a user's line (else the traceback was cut: a body that
    a library traced)."""

    names: tuple[str, ...] = ()
    below_user: bool = False
    #: the installed package the first of them comes from (`flax` for `nn.avg_pool`,
    #: `jax` for `jnp.mean`), or None when unknown
    package: str | None = None
    #: the package of each of `names` (`haiku` for `hk.max_pool` in `ResNet.__call__`)
    packages: tuple[str | None, ...] = ()
    #: where the library's handed-out closure the equation was made in had got to
    #: (`_handed_out_by`: jraph's `_ApplyGraphNet` at `sent_attributes = ...`), if any
    closure_at: SourceLocation | None = None


def _package(filename: str) -> str | None:
    """The installed top-level package a source file belongs to, or None."""
    parts = filename.split(os.sep)
    for k in range(len(parts) - 2, -1, -1):
        if parts[k] in ("site-packages", "dist-packages"):
            return parts[k + 1]
    return None


_paths: dict[tuple, tuple[Any, CallPath]] = {}
#: JAX's own algorithms, named inside like a library's (`minimize` > `minimize_bfgs` >
#: `line_search` > `_zoom`): one BFGS step is a thousand equations of one user line;
#: `odeint`'s solver (`initial_step_size`, `runge_kutta_step`) was 18 chunks of "op".
_JAX_ALGORITHMS = (
    os.path.join(os.path.dirname(jax.__file__), "_src", "scipy", "optimize") + os.sep,
    os.path.join(os.path.dirname(jax.__file__), "experimental", "ode.py"),
)
_API_BOUNDARY = _traceback_util.__file__
_PASS_ON = (_API_BOUNDARY, _STAX_FILE)
#: NumPy's functions called on a JAX array forward to its methods (`jacfwd` unravels
#: its result with `np.reshape`): they name no call of their own
_NUMPY_DIR = os.path.dirname(os.path.abspath(np.__file__)) + os.sep


def _is_tree_util(code: Any) -> bool:
    # `jax.tree.map` runs a library's function per leaf: the function is the news.
    return os.path.basename(code.co_filename) in ("tree.py", "tree_util.py")


_BATCHING_FILE = os.path.join("interpreters", "batching.py")


def moves_batch_axis(eqn: JaxprEqn) -> bool:
    """Whether `eqn` is the `transpose` that `jax.vmap` binds to move a value's batch
    axis where it is returned (`batching.matchaxis`): a value made under `vmap` with
    its batch axis elsewhere (a bias-free `eqx.nn.Linear`'s `dot_general` puts it
    last) becomes the array the user sees there."""
    if eqn.primitive.name != "transpose":
        return False
    tb = eqn.source_info.traceback
    if tb is None:
        return False
    try:
        codes, _ = tb.raw_frames()
    except Exception:  # best effort: no traceback, no move
        return False
    return any(c.co_name == "matchaxis" and c.co_filename.endswith(_BATCHING_FILE) for c in codes)


#: Where JAX forwards an array's methods (`x.mean(0)`) to `jax.numpy`'s functions.
_ARRAY_METHODS = os.path.join(_JAX_DIR, "_src", "numpy", "array_methods.py")


def call_path(eqn: JaxprEqn, body: str = "") -> CallPath:
    """The qualified names of the functions an equation was made in below the
    innermost user frame outside libraries (`user_location_outside_libraries`),
    outermost first: the library calls that line made, down to the one that bound
    it (`Optimizer.update`, `chain.<locals>.update_fn`, …). JAX's and sowviz's own
    frames are left out, but for the public JAX function called last (`softmax`,
    `einsum`): what the line asked JAX for. Without such a user frame (the body of
    a `lax.cond` that a library traced), the whole traceback's path; then `body`,
    the file of a JAX function whose jit the equation is in (`jax_jitted_file`),
    names that file's functions as a library's are named. Empty when unknown."""
    tb = eqn.source_info.traceback
    if tb is None:
        return CallPath()
    try:
        codes, lastis = tb.raw_frames()
        # Keyed by the code objects' ids (hashing a code object hashes its bytecode:
        # 16 µs an equation); the entry keeps them alive, so no id is reused. (And by
        # the offsets: a handed-out closure's calls are named by where it makes them.)
        key = (*map(id, codes), *lastis, body)
        hit = _paths.get(key)
        path = hit[1] if hit is not None else None
        if path is None:
            user = len(codes)
            for k, code in enumerate(codes):
                if _is_user_code(code) or _stax_layer(code):
                    user = k
                    break
            if len(_paths) > 100_000:  # a long session of many programs
                _paths.clear()
            names: list[str] = []
            packages: list[str | None] = []
            package: str | None = None
            api: str | None = ""  # "": the frame before was not JAX's
            # A body JAX traced itself (`jax.image.resize` jits `_resize`; its traceback
            # starts there): its own file's functions name its parts (`_scale_and_translate`
            # > `compute_weight_mat`), as a library's do, not chunks of bare equations.
            own = (*_JAX_ALGORITHMS, body) if body and user == len(codes) else _JAX_ALGORITHMS
            method = False  # the line called an array's method (`x.mean(0)`)
            # a handed-out closure's locals' prefix, and its maker's
            inside: tuple[str, str] | None = None
            api_at: int | None = None  # the frame of `api`
            closure_at: SourceLocation | None = None
            for k in range(user - 1, -1, -1):
                c = codes[k]
                if (
                    c.co_filename.startswith((_SOWVIZ_DIR + os.sep, _NUMPY_DIR))
                    or c.co_filename in _PASS_ON
                ):
                    # sowviz, the wrapper `@api_boundary` puts on `lax.fori_loop`, and a
                    # stax layer's lambda (`Relu`'s, calling `relu`)
                    continue
                if c.co_filename == _ARRAY_METHODS:
                    # `x.mean(0)` forwards to `jnp.mean`: named as that call is (not an
                    # operator's, `x[:, t]`: its private helpers name nothing, as before)
                    method = method or c.co_qualname.startswith("_forward_method")
                    if method:
                        continue
                if _source_info.is_user_filename(c.co_filename) or c.co_filename.startswith(own):
                    if not names:
                        package = _package(c.co_filename)
                    # (a maker is seen not running only below a user's frame: JAX cuts
                    # long tracebacks, and a loop body's may start in the library)
                    handed = _handed_out_by(c, codes[k + 1 :]) if user < len(codes) else None
                    qualname = c.co_qualname
                    if handed:
                        inside = (f"{qualname}.<locals>.", f"{handed}.<locals>.")
                        closure_at = closure_at or _location(c, lastis[k])
                    elif inside and qualname.startswith(inside[0]):
                        # a lambda in that closure (jraph's `tree_map(lambda g:
                        # jnp.repeat(...))` in `_ApplyGraphNet`) is named by its maker
                        # too, not read as `_ApplyGraphNet` again
                        qualname = inside[1] + qualname[len(inside[0]) :]
                    if inside and not handed and k + 1 < len(codes):
                        # a function the closure's maker was given, called by the closure
                        # (jraph's `aggregate_nodes_fn`, `segment_sum` by default)
                        qualname = via_free_variable(qualname, codes[k + 1], lastis[k + 1], inside)
                    names.append(handed or qualname)
                    packages.append(_package(c.co_filename))
                    api = ""
                elif api == "":  # the JAX function that code called (`softmax`, `norm`)
                    # (or the transform whose function it is: `jax.jacfwd(f)(x)` runs
                    # `jacfwd.<locals>.jacfun`, which makes its basis: `jacfwd`)
                    outer, _, rest = c.co_qualname.partition(".<locals>.")
                    name = outer if rest and "." not in outer else c.co_qualname
                    public = "." not in name and not name.startswith("_")
                    api = name if public and not _is_tree_util(c) else None
                    api_at = k
            if api:
                if not names:
                    package = "jax"
                if inside and api_at is not None and api_at + 1 < len(codes):
                    # (a JAX function the closure's maker was given: `jax.ops.segment_sum`)
                    api = via_free_variable(api, codes[api_at + 1], lastis[api_at + 1], inside)
                names.append(api)
                packages.append("jax")
            path = CallPath(tuple(names), user < len(codes), package, tuple(packages), closure_at)
            _paths[key] = (codes, path)
        return path
    except Exception:  # best effort, as user_location
        return CallPath()


def _handed_out_by(code: Any, outer: Sequence[Any]) -> str | None:
    """The function that made the private closure `code` and handed it out, when it is
    no longer running (none of the `outer` frames): jraph's `GraphConvolution(...)`
    returns `_ApplyGCN` for the user to call, a name the user never wrote. None for a
    closure running inside its maker (diffrax's `_allocate_output` in `diffeqsolve`),
    a public one, a private function's (a decorator's `_check_grads_wrapper`, which
    only passes its call on), or a method's (Equinox's `BatchNorm.__call__.<locals>._norm`)."""
    maker, sep, name = code.co_qualname.rpartition(".<locals>.")
    if not sep or not name.startswith("_") or name.startswith("__") or "." in name:
        return None
    if maker.rpartition(".<locals>.")[2].startswith("_") or "wrap" in name:
        return None
    if "." in maker.rpartition(".<locals>.")[2]:
        return None  # a method's closure
    if any(c.co_qualname == maker and c.co_filename == code.co_filename for c in outer):
        return None
    return maker


#: Library calls that call a user's function back inline, with no sub-program of their
#: own: the user's equations are drawn inside the call (`associative_scan(combine)`),
#: between the call's own work, labelled here.
REENTRANT = {"associative_scan": "slice & interleave"}


@dataclass(frozen=True)
class Reentry:
    """An equation made in a user's function that a `REENTRANT` library call called
    back: the user's line that made the call, the call, and the function called back
    (its `__qualname__`)."""

    caller: SourceLocation
    api: str
    entered: str


_reentries: dict[tuple, tuple[Any, Reentry | None]] = {}


def _by_traceback(cache: dict, eqn: JaxprEqn, compute: Any) -> Any:
    """`compute(codes, lastis)` of the equation's traceback (innermost frame first),
    cached by its frames (the entry keeps the code objects alive, so no id is reused);
    None without a traceback or when reading it fails (best effort, as `call_path`)."""
    tb = eqn.source_info.traceback
    if tb is None:
        return None
    try:
        codes, lastis = tb.raw_frames()
        key = (*map(id, codes), *lastis)
        hit = cache.get(key)
        if hit is not None:
            return hit[1]
        value = compute(codes, lastis)
        if len(cache) > 100_000:  # a long session of many programs
            cache.clear()
        cache[key] = (codes, value)
        return value
    except Exception:
        return None


def _of_traceback(eqn: JaxprEqn, compute: Any, default: Any) -> Any:
    """`compute(codes, lastis)` of the equation's traceback (innermost frame first), not
    cached; `default` without a traceback or when reading it fails (best effort, as
    `user_location`)."""
    tb = eqn.source_info.traceback
    if tb is None:
        return default
    try:
        codes, lastis = tb.raw_frames()
        return compute(codes, lastis)
    except Exception:
        return default


def _callers(codes: Any, lastis: Any, k: int, is_caller: Any) -> SourceLocation | None:
    """Where the frame `codes[k]` was called from: the first frame outside it that
    `is_caller` accepts (a user's line; JAX's own frames in between are skipped)."""
    for outer, lasti in zip(codes[k + 1 :], lastis[k + 1 :], strict=True):
        if is_caller(outer):
            return _location(outer, lasti)
    return None


def reentry(eqn: JaxprEqn) -> Reentry | None:
    """The `REENTRANT` call whose callback made `eqn`, or None: its innermost user
    frames, then library frames, then the user's frame that called one of these."""
    return _by_traceback(_reentries, eqn, _reentry)


def _reentry(codes: Any, lastis: Any) -> Reentry | None:
    n, k = len(codes), 0
    while k < n and not _is_user_code(codes[k]):
        k += 1
    while k < n and _is_user_code(codes[k]):
        k += 1
    entered = k - 1
    while k < n and not _is_user_code(codes[k]):
        k += 1
    if 0 <= entered < k - 1 and k < n:
        j = k - 1  # the function the caller called, past `@api_boundary`'s wrapper
        while j > entered and codes[j].co_filename == _API_BOUNDARY:
            j -= 1
        if j > entered and codes[j].co_qualname in REENTRANT:
            frame = _source_info.raw_frame_to_frame(codes[k], lastis[k])
            return Reentry(
                SourceLocation(frame.file_name, frame.start_line, frame.function_name),
                codes[j].co_qualname,
                codes[entered].co_qualname,
            )
    return None


@dataclass(frozen=True, eq=False)
class UserCall:
    """One call of a user's own function that an equation was made in (below the
    outermost user frame): the function's `__qualname__`, the call site as ids (the
    caller's code object and instruction offset, the callee's code object), where the
    callee has got to (`lasti`), and whether the callee's code holds a loop (so that
    its offset can go back within one call). `site()` is the caller's line, `here()`
    the callee's line that made the equation."""

    function: str
    key: tuple[int, int, int]
    lasti: int
    loops: bool
    _caller: Any
    _caller_lasti: int
    _callee: Any = None
    #: the maker's parameter a library's handed-out closure called this function as
    #: (`update_edge_fn`, for jraph's `GraphNetwork(update_edge_fn=edge_mlp)`), or ""
    via: str = ""

    def site(self) -> SourceLocation | None:
        return _location(self._caller, self._caller_lasti)

    def here(self) -> SourceLocation | None:
        return None if self._callee is None else _location(self._callee, self.lasti)

    def column(self) -> int | None:
        """The column of `here()`: which statement made the equation, on a line of
        several (`kc = ...; vc = ...`)."""
        if self._callee is None:
            return None
        try:
            frame = _source_info.raw_frame_to_frame(self._callee, self.lasti)
        except Exception:  # best effort, as user_location
            return None
        column = getattr(frame, "start_column", None)
        return column if isinstance(column, int) and column >= 0 else None


def _location(code: Any, lasti: int) -> SourceLocation | None:
    try:
        frame = _source_info.raw_frame_to_frame(code, lasti)
    except Exception:  # best effort, as user_location
        return None
    return SourceLocation(frame.file_name, frame.start_line, frame.function_name)


_calls: dict[tuple, tuple[Any, UserFrames]] = {}
_loops: dict[int, tuple[Any, bool]] = {}
#: Bytecodes after which the next instruction does not run (no fall-through).
_NO_FALL_THROUGH = frozenset(
    {
        "RETURN_VALUE",
        "RETURN_CONST",
        "RERAISE",
        "RAISE_VARARGS",
        "JUMP_FORWARD",
        "JUMP_BACKWARD",
        "JUMP_BACKWARD_NO_INTERRUPT",
        "JUMP",
        "JUMP_NO_INTERRUPT",
    }
)


def _has_loop(code: Any) -> bool:
    hit = _loops.get(id(code))
    if hit is None:
        try:
            found = _loop_reached(code)
        except Exception:  # unreadable bytecode: assume a loop (calls merge, never split)
            found = True
        hit = _loops[id(code)] = (code, found)  # the entry keeps the code (and its id) alive
    return hit[1]


def _loop_reached(code: Any) -> bool:
    """Whether `code` can jump back in its normal flow: a loop. Exception handlers are
    not followed: on Python 3.12 a `with` block's cleanup jumps back to the code after
    it, and a layer function holding `with jax.named_scope(...)` counted as a loop (its
    calls in a Python loop were drawn as one stage). Conditional backward jumps count
    (Python 3.11's `while` loops end with `POP_JUMP_BACKWARD_IF_TRUE`)."""
    import dis

    ins = list(dis.get_instructions(code))
    index = {i.offset: k for k, i in enumerate(ins)}
    jumps = {*dis.hasjrel, *dis.hasjabs}
    seen: set[int] = set()
    todo = [0]
    while todo:
        k = todo.pop()
        if k in seen or k >= len(ins):
            continue
        seen.add(k)
        i = ins[k]
        if i.opcode in jumps and i.argval in index:
            if i.argval <= i.offset:
                return True
            todo.append(index[i.argval])
        if i.opname not in _NO_FALL_THROUGH:
            todo.append(k + 1)
    return False


@dataclass(frozen=True, eq=False)
class UserFrames:
    """The user's own frames of an equation's traceback: `calls`, the calls of the
    user's functions it was made in, outermost first, each from the user frame before
    it (library frames between them, `jax.vmap` or `jax.tree.map`, skipped; lambdas,
    comprehensions and a module's top level are no calls of their own: their frames
    only pass the call on), empty for an equation of the outermost user frame; and
    `root`, where that outermost frame has got to, as (its code object's id, its
    instruction offset): the function sowviz traced, when it traces in a thread of
    its own; `by_lambda`: the innermost of those frames, below a call, is a lambda's or
    a comprehension's (a layer list's `lambda p, x: jax.nn.relu(x)`), whose work is
    the user's own, not a library's on the caller's line; `comprehension`: the
    outermost comprehension that Python inlined into the innermost call's code (or the
    root's) that made the equation (`inlined_comprehension`), None outside one."""

    calls: tuple[UserCall, ...]
    root: tuple[int, int] | None
    by_lambda: bool = False
    comprehension: tuple[int, int] | None = None


def user_frames(eqn: JaxprEqn) -> UserFrames | None:
    """`UserFrames` of an equation, read from its traceback as `call_path` reads it;
    None when unknown (no traceback)."""
    return _by_traceback(_calls, eqn, _user_frames)


def _stax_layer(code: Any) -> str | None:
    """The layer a `jax.example_libraries.stax` layer's `apply_fun` belongs to
    (`Dense`, `serial`, `GeneralConv`), or None. stax's layers are closures of one
    file, so they are calls like the user's own (its `elementwise` lambdas, `Relu`,
    pass their call on like the user's lambdas): `serial` opened onto bare
    `dot_general`s and a `relu (×2)` stack out of phase with its layers."""
    if code.co_name != "apply_fun" or code.co_filename != _STAX_FILE:
        return None
    parts = code.co_qualname.split(".<locals>.")
    return parts[-2] if len(parts) >= 2 else None


def _user_frames(codes: Any, lastis: Any) -> UserFrames:
    frames: list[tuple[Any, int]] = []  # outermost first
    through = False  # library frames since the last user frame
    for n, (c, k) in enumerate(zip(reversed(codes), reversed(lastis), strict=True)):
        if not _is_user_code(c) and not (frames and c.co_filename == _STAX_FILE):
            if frames and handed_closure(c, codes[len(codes) - n :]):
                frames.append((c, k))  # (a call of the maker's, `handed_closure`)
                through = False
                continue
            through = True
            continue
        # A function JAX runs again from inside itself is one call: a `custom_jvp` rule
        # calling its own function, differentiated twice (`jax.hessian`), ran
        # `softplus_jvp` inside `softplus_jvp`. (Direct recursion is the user's own.)
        if not (through and frames and frames[-1][0] is c):
            frames.append((c, k))
        through = False
    root = (id(frames[0][0]), frames[0][1]) if frames else None
    by_lambda = len(frames) > 1 and frames[-1][0].co_name.startswith("<")
    # (the frame whose offset `calls[-1].lasti`, else `root`, says: a lambda's or a
    # comprehension's own frame passes the call on)
    inner = [f for f in frames[1:] if not f[0].co_name.startswith("<")] or frames[:1]
    comprehension = inlined_comprehension(*inner[-1]) if inner else None
    return UserFrames(_user_calls(frames), root, by_lambda, comprehension)


def _user_calls(frames: list[tuple[Any, int]]) -> tuple[UserCall, ...]:
    return tuple(
        UserCall(
            _stax_layer(callee) or handed_closure(callee) or callee.co_qualname,
            (id(caller), caller_lasti, id(callee)),
            lasti,
            _has_loop(callee),
            caller,
            caller_lasti,
            callee,
            called_as(caller, caller_lasti) if handed_closure(caller) else "",
        )
        for (caller, caller_lasti), (callee, lasti) in itertools.pairwise(frames)
        if not callee.co_name.startswith("<")
    )


def primitive_label(eqn: JaxprEqn) -> str:
    """An equation's primitive as a user knows it: `fft` by its type (`rfft`), a
    collective by the `jax.lax` function that binds it (`COLLECTIVE_CALLS`), and JAX
    >= 0.12 binds some functions as a `call_hi_primitive` whose `_prim` says which
    (`CustomRoot` is `custom_root`)."""
    name = eqn.primitive.name
    if name == "fft":  # one primitive for all four: `rfft`, `irfft`, `fft`, `ifft`
        kind = getattr(eqn.params.get("fft_type"), "name", None)
        return kind.lower() if isinstance(kind, str) else name
    if name == "call_hi_primitive":
        cls = type(eqn.params.get("_prim")).__name__
        if cls and cls not in ("NoneType", "HiPrim"):
            return re.sub(r"(?<!^)(?=[A-Z])", "_", cls).lower()
    return COLLECTIVE_CALLS.get(name, name)  # `lax.psum` binds `psum_invariant`


def is_hi_value(x: Any) -> bool:
    """Whether `x`, not an array, is still a value JAX traces: a "hijax" type of its own
    aval (Flax NNX's `HijaxVariable`, made under `nnx.var_defaults(hijax=True)`), not a
    Python number or any other static leaf."""
    if isinstance(x, (bool, int, float, complex)):
        return False
    try:
        jax.typeof(x)
    except Exception:  # functions, strings, dtypes: static leaves
        return False
    return True


#: Primitives of JAX's mutable arrays (`jax.new_ref`; `mutable_array` before 0.8).
_REF_PRIMITIVES = frozenset({"new_ref", "mutable_array", "ref_swap", "ref_addupdate", "freeze"})


def _binds_any(jaxpr: Any, primitives: frozenset[str]) -> bool:
    """Whether a program (or one it calls) binds one of `primitives`."""
    jaxpr, _ = jaxpr_and_consts(jaxpr)
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in primitives:
            return True
        if any(_binds_any(sub, primitives) for _, _, sub in sub_jaxprs(eqn)):
            return True
    return False


def has_refs(jaxpr: Any) -> bool:
    """Whether a program (or one it calls) makes or writes a mutable array: JAX cannot
    transpose the linearization of such a program (`jax.linear_transpose` of its JVP
    fails, in plain JAX too), while `jax.vjp` differentiates it."""
    return _binds_any(jaxpr, _REF_PRIMITIVES)


def calls_custom_vjp(jaxpr: Any) -> bool:
    """Whether a program (or one it calls) calls a `jax.custom_vjp` function, which JAX
    cannot take forward."""
    return _binds_any(jaxpr, CUSTOM_VJP)


def vjp_by_jvp(f: Any, primals: tuple, check: Any = None, has_aux: bool = False) -> tuple:
    """`(f(*primals), pullback)` like `jax.vjp`, built as the transpose of `f`'s JVP
    (`jax.linear_transpose`, which partially evaluates the JVP once for the whole
    program). JAX ≥ 0.7 linearises primitive by primitive instead (its
    `fallback_linearize_rule` traces a JVP and a jaxpr per equation); on a program
    re-evaluated equation by equation, as sowviz's instrumented ones are, that traced
    1.6-1.8x slower (1,000 to 3,000 equations). The primal output is read from the
    partial evaluation's known values (`JaxprTracer.pval`, a JAX internal); the
    pullback takes one cotangent per output leaf, like `jax.vjp`'s. `check(y)`, if
    given, sees the output first (to refuse it before JAX's transpose does). With
    `has_aux`, `f` returns `(y, aux)` and this `(y, pullback, aux)`, as `jax.vjp`."""
    seen: list = []

    def tangent_of(*tangents: Any) -> Any:
        if has_aux:
            y, ty, aux = jax.jvp(f, primals, tangents, has_aux=True)
        else:
            (y, ty), aux = jax.jvp(f, primals, tangents), None
        if check is not None:
            check(y)
        seen.append((y, aux))
        return ty

    pull = jax.linear_transpose(tangent_of, *primals)
    y, aux = jax.tree_util.tree_map(_known_value, seen[0])
    return (y, pull, aux) if has_aux else (y, pull)


def _known_value(x: Any) -> Any:
    if isinstance(x, _pe.JaxprTracer):
        known = x.pval.get_known()
        if known is None:
            # A primal output that depends on the tangents: an operation whose JVP is
            # not linear in them (a `pallas_call` has no transpose). `jax.grad` refuses
            # it with JAX's words, so these are JAX's words, and the ways out.
            raise ValueError(
                "Linearization failed to produce known values for all output primals. "
                "This is typically caused by attempting to differentiate a function that "
                "uses an operation that does not support reverse-mode autodiff (plain "
                "`jax.grad` refuses it too; a `pallas_call` without a `jax.custom_vjp`, "
                "for one). Give that operation a `jax.custom_vjp` rule, or inspect the "
                'function with mode="jvp" (forward mode) or mode="primal".'
            )
        return known
    return x


def serialize_compiled(compiled: Any) -> bytes:
    """`compiled`'s executable as bytes (`jax.experimental.serialize_executable`; its
    trees are not kept: `load_compiled` takes them from the lowering)."""
    from jax.experimental import serialize_executable

    payload, _, _ = serialize_executable.serialize(compiled)
    return payload


def load_compiled(payload: bytes, in_tree: Any, out_tree: Any, device: Any) -> Any:
    """The `jax.stages.Compiled` that `serialize_compiled` wrote, for the argument and
    result trees of its lowering (``Lowered.in_tree``/``out_tree``), run on `device`
    (without it JAX would load the executable for every device of the backend)."""
    from jax.experimental import serialize_executable

    return serialize_executable.deserialize_and_load(
        payload, in_tree, out_tree, execution_devices=[device]
    )


def trace_context() -> tuple:
    """The JAX settings tracing reads in this thread, hashable (what `jax.jit` keys its
    traces on); `trace_settings` is their stable text, for keys kept on disk."""
    return _config.trace_context()


def x64_enabled() -> bool:
    """Whether 64-bit types are on in this thread (`jax.enable_x64` sets it per thread)."""
    return bool(_config.enable_x64.value)


def x64(enabled: bool) -> Any:
    """A context setting 64-bit types on or off in this thread, as `jax.enable_x64`."""
    return _config.enable_x64(enabled)


def trace_settings() -> tuple[str, ...]:
    """The JAX settings that tracing and lowering read in this thread (x64, matmul
    precision, dtype and rank promotion, the mesh, ...), as stable strings: what
    `jax.jit` adds to its cache key (`config.trace_context`). Object addresses are
    dropped (they differ between processes, and the objects holding them, like the
    axis environment, print nothing else)."""
    return tuple(re.sub(r" at 0x[0-9a-fA-F]+", "", repr(v)) for v in _config.trace_context())


def default_device() -> Any:
    """The device a program without placed arguments runs on (in this thread)."""
    chosen = jax.config.jax_default_device
    if isinstance(chosen, str):
        return jax.devices(chosen)[0]
    return chosen if chosen is not None else jax.devices()[0]


def compiled_devices(compiled: Any) -> set:
    """Every device `compiled`'s arguments and results are placed on."""
    shardings = jax.tree_util.tree_leaves((compiled.input_shardings, compiled.output_shardings))
    return {d for s in shardings for d in s.device_set}


def backend_identity() -> tuple:
    """What a compiled executable depends on in this process's JAX and backend:
    versions, platform and its version (CUDA's includes the driver), and the devices
    (`Device.client` is not public)."""
    import jaxlib

    devices = jax.devices()
    client = devices[0].client
    return (
        jax.__version__,
        jaxlib.__version__,
        client.platform,
        client.platform_version,
        tuple((d.id, d.device_kind) for d in devices),
    )


# -- tracing errors said of the user's function ---------------------------------------

_FLAT_ARG = re.compile(r"\bflat\[(\d+)\]")


@contextlib.contextmanager
def traced_as(wrapper: Any, fn: Any, arg_names: Any) -> Iterator[None]:
    """JAX's tracing errors (a Python `if` on a traced value, `float()` of a tracer)
    name the function traced and the arguments a value depends on. sowviz traces
    `wrapper(*flat)`, over the leaves of `fn`'s arguments: such a message would say
    `flat_fn at sowviz/_program.py` and `flat[0]`. Said of `fn` and its arguments'
    paths instead (`arg_names()`: one per leaf of `flat`), as `jax.jit(fn)` says it."""
    try:
        yield
    except Exception as err:
        text = err.args[0] if err.args and isinstance(err.args[0], str) else None
        ours = _api_util.fun_sourceinfo(wrapper)
        if text is None or ours not in text:
            raise
        theirs = _api_util.fun_sourceinfo(fn)
        if theirs == "<unknown>" and callable(fn):
            theirs = _api_util.fun_sourceinfo(type(fn).__call__)  # a module: its __call__
        names = arg_names()
        text = text.replace(ours, theirs)
        text = _FLAT_ARG.sub(lambda m: names[int(m[1])] if int(m[1]) < len(names) else m[0], text)
        err.args = (text, *err.args[1:])
        raise


# -- names the user gave values -----------------------------------------------------------

#: `jax.ad_checkpoint.checkpoint_name`'s primitive (`name_p`, `name` in JAX 0.10 to 0.12).
_CHECKPOINT_NAME = "name"


def checkpoint_name_of(eqn: JaxprEqn) -> str | None:
    """The name `jax.ad_checkpoint.checkpoint_name(x, "proj_in")` gives its value
    (`proj_in`, for remat policies such as `save_only_these_names`), or None for any
    other equation. Its primitive is called `name`, which said nothing drawn."""
    if eqn.primitive.name != _CHECKPOINT_NAME:
        return None
    name = eqn.params.get("name")
    return name if isinstance(name, str) and name else None


# -- jax.pmap's shard_map ---------------------------------------------------------------


class PmapBody(NamedTuple):
    """What `jax.pmap(f)` binds, past JAX's plumbing (`pmap_body`): `f`'s program and
    the steps to it."""

    step: tuple[int, str, None]  # from the `jit`'s body to the shard_map's (a probe path's)
    jaxpr: Jaxpr  # the shard_map's body
    plumbing: frozenset[int]  # its equations that add or drop the device axis only
    users: bool  # the mapped function is yours (its equations were made in your code)


def pmap_body(eqn: JaxprEqn) -> PmapBody | None:
    """For the `jit` equation that `jax.pmap` binds (JAX >= 0.8 implements pmap as a
    `jit` of its own `_fun` around one `shard_map`, whose body squeezes each mapped
    operand's device axis of size 1 away and expands each mapped result by one:
    `jax/_src/pmap.py`, `_cached_shard_map`), the shard_map's body and those squeezes
    and expansions; None for any other equation. The plumbing is told by the data flow,
    not by name: a squeeze of a mapped operand of the body (which your function never
    sees), an expansion by one axis that the body returns for a mapped result."""
    if eqn.primitive.name not in JIT:
        return None
    outer = eqn.params.get("jaxpr")
    mapped = None if outer is None else pmapped_function(outer)
    if mapped is None:
        return None
    jit_body = jaxpr_and_consts(outer)[0]
    if len(jit_body.eqns) != 1 or jit_body.eqns[0].primitive.name != SHARD_MAP:
        return None
    shard = jit_body.eqns[0]
    body = jaxpr_and_consts(shard.params["jaxpr"])[0]
    in_specs, out_specs = shard.params["in_specs"], shard.params["out_specs"]
    if list(jit_body.outvars) != list(shard.outvars):
        return None
    if len(in_specs) != len(body.invars) or len(out_specs) != len(body.outvars):
        return None
    mapped_in = {v for v, spec in zip(body.invars, in_specs, strict=True) if _is_mapped(spec)}
    mapped_out = {
        v
        for v, spec in zip(body.outvars, out_specs, strict=True)
        if isinstance(v, Var) and _is_mapped(spec)
    }
    plumbing = frozenset(
        i
        for i, e in enumerate(body.eqns)
        if len(e.invars) == len(e.outvars) == 1
        and (
            (e.primitive.name == "squeeze" and _is_var_in(e.invars[0], mapped_in))
            or (
                e.primitive.name in ("broadcast_in_dim", "reshape", "expand_dims")
                and e.outvars[0] in mapped_out
                and _one_axis_added(e.invars[0], e.outvars[0])
            )
        )
    )
    return PmapBody((0, "jaxpr", None), body, plumbing, bool(mapped))


def _is_var_in(v: Any, variables: set) -> bool:
    return isinstance(v, Var) and v in variables  # (a Literal is unhashable in JAX 0.12)


def _is_mapped(spec: Any) -> bool:
    # a PartitionSpec naming a mesh axis (pmap's in_axes / out_axes not None)
    return spec is not None and any(p is not None for p in spec)


def _one_axis_added(src: Any, dst: Any) -> bool:
    before = tuple(getattr(src.aval, "shape", ()))
    after = tuple(getattr(dst.aval, "shape", ()))
    return len(after) == len(before) + 1 and any(
        after[k] == 1 and after[:k] + after[k + 1 :] == before for k in range(len(after))
    )


# ---------------------------------------------------------------------------
# Partial evaluation of a `sow` inside `remat` (JAX 0.10-0.12: the loop of
# `partial_eval.partial_eval_jaxpr_custom` and `debugging._debug_partial_eval_custom`).


def register_partial_eval_custom(primitive: Primitive, rule: Any) -> None:
    """Give `primitive` its own rule in JAX's jaxpr-level partial evaluation (the one
    `remat`, `scan` and `jit` use): `rule(saveable, unks_in, inst_in, eqn)` returns
    `(known eqn or None, staged eqn or None, unks_out, inst_out, residuals)`."""
    _pe.partial_eval_jaxpr_custom_rules[primitive] = rule


def remat_recomputes(saveable: Any, eqn: JaxprEqn) -> bool:
    """Whether the remat policy `saveable` asks that `eqn`'s outputs be recomputed in
    the backward pass rather than saved (`jax.checkpoint`'s default: nothing saved).
    An offloading policy counts as saving: the value is kept, elsewhere."""
    policy = _pe.ensure_enum(saveable(eqn.primitive, *[v.aval for v in eqn.invars], **eqn.params))
    return isinstance(policy, _pe.RecomputeType)


# ---------------------------------------------------------------------------
# Haiku's module machinery (for graph/frameworks): Haiku runs every module method
# through `haiku/_src/module.py`'s `run_interceptors` (and its `next_fun`, when method
# interceptors are on), inside a `jax.named_call` of the module's name (Haiku 0.0.10
# to 0.0.17). Same traceback internals as `call_path`.
_HAIKU_DISPATCH = frozenset({"run_interceptors", "run_interceptors.<locals>.next_fun"})
_HAIKU_MODULE_FILE = os.path.join("haiku", "_src", "module.py")
_haiku_work: dict = {}


def made_by_library_haiku_module(eqn: JaxprEqn) -> bool:
    """Whether a library's Haiku module (`hk.LSTM`, `hk.MultiHeadAttention`) made `eqn`
    in its own method, called from the user's line: walking out from the equation,
    Haiku's method dispatch comes before any frame of the user's. (A module of the
    user's own makes its equations on the user's lines: False.)"""
    return bool(_by_traceback(_haiku_work, eqn, _made_by_library_haiku_module))


def _made_by_library_haiku_module(codes: Any, lastis: Any) -> bool:
    for code in codes:
        if code.co_filename.endswith(_HAIKU_MODULE_FILE) and code.co_qualname in _HAIKU_DISPATCH:
            return True
        if _is_user_code(code):
            return False
    return False


# ---------------------------------------------------------------------------
# Inside a custom-derivative call (`nonfinite_custom`: which equation of a
# `custom_jvp`/`custom_vjp` function or of its rules made a NaN). JAX 0.10-0.12 name
# the body `call_jaxpr` and its leading closed-over operands `num_consts` alike.


def custom_call_body(eqn: JaxprEqn) -> tuple[Any, int] | None:
    """A `custom_jvp_call` / `custom_vjp_call` equation's body (the function as written,
    a ClosedJaxpr taking every operand) and how many leading operands are its
    closed-over constants (their tangents must be zero); None for any other equation."""
    name = eqn.primitive.name
    if name != CUSTOM_JVP and name not in CUSTOM_VJP:
        return None
    body = eqn.params.get("call_jaxpr")
    if not isinstance(body, (Jaxpr, ClosedJaxpr)):
        return None
    return body, int(eqn.params.get("num_consts", 0))


def literal_value(v: Any) -> Any:
    """The value of a jaxpr literal operand (a Python or NumPy scalar)."""
    return v.val


# -- where a named scope was opened (graph/names) -------------------------------------------
# `Traceback.raw_frames`, `raw_frame_to_frame` and the decorator form of
# `ExtendNameStackContextManager` (`jax.named_call`, `@jax.named_scope(...)`) are
# unchanged from JAX 0.10.2 to 0.12.


def user_frame_locations(eqn: JaxprEqn) -> list[SourceLocation]:
    """The lines of the user's own frames (not JAX's, sowviz's or an installed
    package's) an equation was made in, innermost first; empty when unknown."""

    def locations(codes: Any, lastis: Any) -> list[SourceLocation]:
        pairs = zip(codes, lastis, strict=True)
        return [_location(code, lasti) for code, lasti in pairs if _is_user_code(code)]

    return _of_traceback(eqn, locations, [])


def named_call_sites(eqn: JaxprEqn) -> list[tuple[str, SourceLocation]]:
    """Per call through a function `jax.named_call(f)` or a `@jax.named_scope(...)`
    decorator wrapped, innermost first: the wrapped function's name and the user's line
    that called the wrapper. Such a scope is pushed by JAX's `wrapper`, so its first
    equation's line is inside `f`, not where `f` was called."""

    def sites(codes: Any, lastis: Any) -> list[tuple[str, SourceLocation]]:
        out = []
        for k, code in enumerate(codes):
            if code.co_filename != _source_info.__file__ or code.co_name != "wrapper":
                continue
            loc = _callers(codes, lastis, k, _is_user_code)
            if loc is not None:
                out.append((codes[k - 1].co_name if k else "", loc))
                # the names such a call from here pushed (`recording_named_calls`)
                pushed = named_call_names(codes[k + 1]) if k + 1 < len(codes) else ()
                out.extend((name, loc) for name in sorted(pushed))
        return out

    return _of_traceback(eqn, sites, [])


def is_library_file(fname: str) -> bool:
    """Whether `fname` is an installed package's file (`equinox/_ad.py`), not the
    user's: a module called from there was called by a library's transform."""
    return any(d in fname for d in _LIBRARY_DIRS) or fname.startswith(_SOWVIZ_DIR + os.sep)


def computes_in_low_precision(jaxpr: Any) -> bool:
    """Whether a program (or one it calls) has a floating-point value narrower than
    float32 (bfloat16, float16, the float8 and float4 types) among its inputs or
    equations' results: XLA may keep such values in excess precision inside a fusion,
    so two programs of the same math fused otherwise differ at rounding level."""
    jaxpr, _ = jaxpr_and_consts(jaxpr)
    if any(_is_low_precision(v) for v in (*jaxpr.invars, *jaxpr.constvars)):
        return True
    for eqn in jaxpr.eqns:
        if any(_is_low_precision(v) for v in eqn.outvars):
            return True
        if any(computes_in_low_precision(sub) for _, _, sub in sub_jaxprs(eqn)):
            return True
    return False


def _is_low_precision(var: Any) -> bool:
    dtype = getattr(getattr(var, "aval", None), "dtype", None)
    if dtype is None:  # (a token, a literal's missing aval: no number)
        return False
    try:
        return bool(jax.numpy.issubdtype(dtype, jax.numpy.floating)) and dtype.itemsize < 4
    except (TypeError, AttributeError):  # a dtype NumPy does not know (a PRNG key's)
        return False


def outermost_user_location(eqn: JaxprEqn) -> SourceLocation | None:
    """The outermost of `user_frame_locations`: where the user's code that led to `eqn`
    begins (a body a library traced begins at your function it calls)."""
    found = user_frame_locations(eqn)
    return found[-1] if found else None


def bind_keeping_sources(eqn: JaxprEqn, invals: list) -> list:
    """`bind_eqn` outside `eqn`'s own source context: the equations JAX traces while
    binding it (a custom rule, run when the call is differentiated) keep the
    tracebacks of the lines that wrote them, not the call's."""
    out = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
    return list(out) if eqn.primitive.multiple_results else [out]


# ---------------------------------------------------------------------------
# `jax.lax.map(f, xs, batch_size=B)` (JAX 0.10-0.12, `jax/_src/lax/control_flow/
# loops.py`, `map`): a `scan` over the chunks `xs[:n*B].reshape(n, B, ...)` whose body
# is `vmap(f)` (called from a lambda inside `map`), then `vmap(f)` called from `map`
# itself on the remainder `xs[n*B:]`, the two results concatenated.

_LOOPS_FILE = os.path.join("jax", "_src", "lax", "control_flow", "loops.py")
_VMAP_FILE = os.path.join("jax", "_src", "api.py")
_SOW_FILE = os.path.join("sowviz", "capture", "primitive.py")


def lax_map_batching() -> str | None:
    """Asked by the `sow` batching rule: "lax.map:chunks" when the vmap now batching is
    the one `jax.lax.map(..., batch_size=B)` applies to `f` inside its scan,
    "lax.map:rest" when it is the one on the remainder; None for any other (a user's vmap, one of `jacrev`, a
    vmap of a program already traced). Recognised by the Python stack, strictly: the
    rule is called straight from `sowviz.sow` (no other transformation between), and
    the innermost `vmap` around that call is called by `lax.map` itself."""
    frame = sys._getframe(2)  # the rule's caller
    while frame is not None and (
        frame.f_code.co_filename.startswith(_JAX_DIR)
        # (`sow_p.bind`, the primitive's own, between JAX's frames and `sow`)
        or (frame.f_code.co_filename.endswith(_SOW_FILE) and frame.f_code.co_name == "bind")
    ):
        frame = frame.f_back
    if frame is None or not (
        frame.f_code.co_filename.endswith(_SOW_FILE) and frame.f_code.co_name == "sow"
    ):
        return None
    while frame is not None and not (
        frame.f_code.co_filename.endswith(_VMAP_FILE) and frame.f_code.co_name == "vmap_f"
    ):
        frame = frame.f_back
    return _lax_map_vmap(frame)


def _lax_map_vmap(frame: Any) -> str | None:
    """Which of `lax.map`'s vmaps the `vmap` at `frame` is ("lax.map:chunks" inside its
    scan, "lax.map:rest" on the remainder): the first frame outside `vmap`'s own and
    JAX's traceback filtering is `lax.map`'s; None when it is anything else."""
    while frame is not None and frame.f_code.co_filename.startswith(_JAX_DIR):
        if frame.f_code.co_filename.endswith(_LOOPS_FILE):
            name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
            return {"map": "lax.map:rest", "map.<locals>.<lambda>": "lax.map:chunks"}.get(name)
        if not frame.f_code.co_filename.endswith((_VMAP_FILE, "traceback_util.py")):
            return None
        frame = frame.f_back
    return None


def _traced_afresh(thunk: Any, *args: Any) -> Any:
    """What a custom call's rule thunk (`jvp_jaxpr_fun`, `fwd_jaxpr_thunk`: a
    `lu.WrappedFun` of `partial_eval._memoize(fn)`, alike in JAX 0.10-0.12) returns,
    traced again now rather than read from its memo. The memo was filled where JAX first
    differentiated the call, inside `core.eval_jaxpr`'s `user_context` of the call's own
    traceback: every equation of the rule then says the call's line, not the rule's.
    Traced here, outside any such context, each keeps the line that wrote it. A thunk of
    another shape is called as it is (its equations may say the call's line)."""
    memoized = getattr(thunk, "f", None)
    code = getattr(memoized, "__code__", None)
    names = getattr(code, "co_freevars", ())
    cells = dict(zip(names, getattr(memoized, "__closure__", None) or (), strict=False))
    if "fn" not in cells or "cells" not in cells:
        return thunk.call_wrapped(*args)
    with _core.set_current_trace(None):  # as `_memoize` calls it
        return cells["fn"].cell_contents(*args)


def custom_jvp_rule(eqn: JaxprEqn, in_zeros: Sequence[bool]) -> tuple[Jaxpr, list]:
    """A `custom_jvp` call's JVP rule traced afresh: a jaxpr of (the operands past its
    `num_consts`, then the tangents of those not `in_zeros`) and its consts."""
    thunk = eqn.params["jvp_jaxpr_fun"]
    jaxpr, consts, _out_zeros = _traced_afresh(thunk, *in_zeros)
    return jaxpr, list(consts)


def custom_vjp_forward(eqn: JaxprEqn, in_nonzeros: Sequence[bool]) -> tuple[Jaxpr, list]:
    """A `custom_vjp` call's forward rule traced afresh: a jaxpr of the operands past its
    `num_consts` returning (its new residuals, then its primal outputs), and its consts."""
    jaxpr, consts = _traced_afresh(eqn.params["fwd_jaxpr_thunk"], *in_nonzeros)
    return jaxpr, list(consts)


def custom_vjp_residuals(eqn: JaxprEqn, operands: Sequence[Any], fwd_outs: Sequence[Any]):
    """The residuals a `custom_vjp`'s backward rule takes: those its forward rule made
    (`fwd_outs`' first ones) and the operands it passed on unchanged, in the rule's order
    (as `ad.JVPTrace.process_custom_vjp_call` assembles them)."""
    _, res_tree, input_fwds = eqn.params["out_trees"]()
    made = iter(fwd_outs[: res_tree.num_leaves - sum(f is not None for f in input_fwds)])
    return [next(made) if f is None else operands[f] for f in input_fwds]


def custom_vjp_backward(eqn: JaxprEqn, residuals: Sequence[Any], cotangents: Sequence[Any]):
    """A `custom_vjp`'s backward rule traced (a ClosedJaxpr of the residuals, then the
    outputs' cotangents, returning the operands' cotangents it makes). Traced here, not
    through `jax.vjp`, whose transpose binds the rule in the `user_context` of the call:
    its equations keep the lines of the rule."""
    bwd = eqn.params["bwd"]

    def rule(res: list, cts: list) -> list:
        out = bwd.call_wrapped(*res, *cts)
        return [c for c in out if c is not None and not is_symbolic_zero(c)]

    return jax.make_jaxpr(rule)(list(residuals), list(cotangents))


# --- for graph/source_text: the span of source an equation's user frame was at.
# `Traceback.raw_frames` and `source_info_util.raw_frame_to_frame` (with the columns
# Python 3.11's code positions give) are alike in JAX 0.10-0.12.


def user_span(eqn: JaxprEqn) -> tuple[int, int, int, int] | None:
    """The source span (start line, start column, end line, end column) of the
    operation that made `eqn` in the frame `user_location_outside_libraries` names:
    `tokens[:, pos]` within the line that passes it to a call. None when unknown."""

    def span(codes: Any, lastis: Any) -> tuple[int, int, int, int] | None:
        for code, lasti in zip(codes, lastis, strict=True):
            if _is_user_code(code) or _stax_layer(code):
                f = _source_info.raw_frame_to_frame(code, lasti)
                at = (f.start_line, f.start_column, f.end_line, f.end_column)
                return at if all(isinstance(x, int) and x >= 0 for x in at) else None
        return None

    return _of_traceback(eqn, span, None)


# -- `lax.fori_loop`'s counter ----------------------------------------------------------
# JAX 0.10-0.12 (`jax/_src/lax/control_flow/loops.py`): with static bounds a fori_loop is
# a `scan` whose body returns `(i + 1, body_fun(i, x))`; else a `while_loop` of
# `(i, upper, x)` doing the same. `scan`'s carry follows its constants (`scan_layout`),
# `while`'s its `body_nconsts`.


def loop_counter_increments(eqn: JaxprEqn) -> list[JaxprEqn]:
    """The equations of a loop's body that only step a counter the loop carries (`i + 1`
    of an integer scalar, from its place in the carry to the same place): what
    `lax.fori_loop` adds around your `body_fun`. Empty for any other equation."""
    if eqn.primitive.name == SCAN:
        body, _ = jaxpr_and_consts(eqn.params["jaxpr"])
        layout = scan_layout(eqn.params)
        start, n = layout.num_consts, layout.num_carry
    elif eqn.primitive.name == WHILE:
        body, _ = jaxpr_and_consts(eqn.params["body_jaxpr"])
        start, n = eqn.params["body_nconsts"], len(body.outvars)
    else:
        return []
    carried = zip(body.outvars[:n], body.invars[start : start + n], strict=False)
    pairs = {out: into for out, into in carried if isinstance(out, Var)}
    carried_out = set(pairs)
    return [
        e
        for e in body.eqns
        if e.primitive.name == "add"
        and len(e.invars) == 2
        and isinstance(e.invars[1], Literal)
        and np.ndim(e.invars[1].val) == 0
        and e.invars[1].val == 1
        and isinstance(e.invars[0], Var)
        and _is_int_scalar(e.outvars[0])
        and _is_var_in(e.outvars[0], carried_out)
        and pairs[e.outvars[0]] is e.invars[0]
    ]


def _is_int_scalar(v: Any) -> bool:
    aval = getattr(v, "aval", None)
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    return shape == () and dtype is not None and np.issubdtype(dtype, np.integer)


#: Primitives that only retype a PRNG key (raw `uint32[2]` <-> typed `key<fry>[]`),
#: never its bits: `jax.random.normal(key, ...)` on a raw key wraps it first. The stage
#: graph draws them as edges, so the call is one box (`normal`), not two.
KEY_CASTS = frozenset({"random_wrap", "random_unwrap"})


def name_trace_after(wrapper: Any, fn: Any) -> None:
    """Make JAX's own messages about a trace of `wrapper` (sowviz's flat function around
    the user's `fn`) name `fn`, as `jax.jit(fn)` would: an `UnexpectedTracerError`,
    raised long after the trace, says "the function being traced when the value
    leaked was `<name> at <file>:<line>`", read from the trace's debug info. JAX
    (0.10 to 0.12, `api_util.fun_sourceinfo`) takes that from the function reached by
    `inspect.unwrap` (`__wrapped__`), and the argument names from
    `inspect.signature`, which stops at a `__signature__`: so `wrapper` keeps its own
    signature (its `flat[i]` leaves, which `traced_as` renames) and points at `fn`'s
    code (a callable instance's `__call__`, a `functools.partial`'s function), named
    `loss (traced by sowviz)`: `modes.leaked_trace_error` tells by "sowviz" that the
    value leaked from sowviz's trace (and `traced_as` says the plain name)."""
    source = _source_function(fn)
    if source is None:
        return
    try:
        wrapper.__signature__ = inspect.signature(wrapper)
    except (TypeError, ValueError):
        return
    name = getattr(source, "__name__", "fn")
    wrapper.__wrapped__ = types.SimpleNamespace(  # all `fun_sourceinfo` reads
        __name__=f"{name} (traced by sowviz)", __code__=source.__code__
    )


def _source_function(fn: Any) -> Any:
    """The Python function whose code `fn` runs, or None."""
    for _ in range(16):  # (a partial of a partial of ...: bounded)
        if isinstance(fn, functools.partial):
            fn = fn.func
            continue
        fn = inspect.unwrap(fn)
        if isinstance(fn, functools.partial):
            continue
        if hasattr(fn, "__code__"):
            return fn
        call = type(fn).__call__ if callable(fn) else None  # a module: its `__call__`
        return call if hasattr(call, "__code__") else None
    return None


# -- what a solver computes (nonfinite_replay) ------------------------------------------
# `custom_linear_solve` (JAX 0.10-0.12): its operands are the consts of its `jaxprs`
# (matvec, vecmat, solve, transpose_solve: `const_lengths` each) then `b`, and it
# computes `jaxprs.solve` on (solve's consts, b) (`_custom_linear_solve_impl`). JAX 0.12
# binds `custom_root` as a "hijax" primitive (`hi_expansion`); JAX <= 0.11 as a
# `custom_jvp` call, a custom function of its own.
LINEAR_SOLVE = "custom_linear_solve"


def solver_body(eqn: JaxprEqn) -> tuple[Any, list[int]] | None:
    """What a solver equation (`custom_linear_solve`, JAX 0.12's `custom_root`) computes
    undifferentiated: the solve's program (for `jaxpr_and_consts`) and the indices of the
    operands it takes; None for any other equation."""
    hi = hi_expansion(eqn)
    if hi is not None:
        jaxpr, n = hi
        return jaxpr, list(range(n))
    if eqn.primitive.name != LINEAR_SOLVE:
        return None
    lengths = eqn.params["const_lengths"]
    start = lengths.matvec + lengths.vecmat
    solve = list(range(start, start + lengths.solve))
    b = list(range(sum(lengths), len(eqn.invars)))
    return eqn.params["jaxprs"].solve, solve + b


def called_back_from(eqn: JaxprEqn, sub_program: Any) -> bool:
    """Whether the user's innermost frame in `eqn`'s traceback ran inside the function
    `sub_program` was traced from (its `debug_info.func_src_info`): a user's function a
    library called back (`lax.custom_root`'s `linearize_and_solve` calling your
    `tangent_solve`), whose lines are the user's, not a library's from the caller's line
    (`jnp.clip`'s equations, traced once, whose user frame is the first caller's)."""
    jaxpr, _ = jaxpr_and_consts(sub_program)
    src = getattr(getattr(jaxpr, "debug_info", None), "func_src_info", None) or ""
    name, _, where = src.partition(" at ")
    file = os.path.abspath(where.rpartition(":")[0]) if where else ""

    def inside(codes: Any, _lastis: Any) -> bool:
        user = next((k for k, c in enumerate(codes) if _is_user_code(c)), None)
        return user is not None and any(
            c.co_name == name and os.path.abspath(c.co_filename) == file for c in codes[user + 1 :]
        )

    return bool(file) and _of_traceback(eqn, inside, False)


def body_arg_names(body: Any) -> tuple[str, ...]:
    """The names the user's function gives its parameters, one per input of `body`, as
    JAX recorded them when tracing it (`debug_info.arg_names`: `step(h, x)`'s `h` and
    `x`, a tuple carry's `c[0]`); "" for an input it did not name (a loop's closed-over
    constants) and every one when JAX recorded none."""
    jaxpr, _ = jaxpr_and_consts(body)
    names = getattr(getattr(jaxpr, "debug_info", None), "arg_names", None)
    if names is None or len(names) != len(jaxpr.invars):
        return ("",) * len(jaxpr.invars)
    return tuple(n if isinstance(n, str) else "" for n in names)


def reverse_scan_length(eqn: JaxprEqn) -> int | None:
    """A `lax.scan(..., reverse=True)` equation's length (its iterations run from the last
    xs index down to 0); None for any other equation, a forward scan included. The
    `reverse` and `length` params are the same from JAX 0.10 to 0.12."""
    if eqn.primitive.name != "scan" or not eqn.params.get("reverse"):
        return None
    return int(eqn.params["length"])


# -- what labels a JAX construct by (graph labels) --------------------------------------

#: `jax.checkpoint_policies` by the name a label says (`checkpoint(block, save dots)`).
_POLICY_LABELS = {
    "dots_saveable": "save dots",
    "dots_with_no_batch_dims_saveable": "save no-batch dots",
    "nothing_saveable": "save nothing",
    "everything_saveable": "save everything",
    "offload_dot_with_no_batch_dims": "offload no-batch dots",
}


def _policy_fields(policy: Any) -> dict[str, Any]:
    """What a parametrised policy holds: JAX 0.10 makes `save_only_these_names` a
    dataclass (`SaveOnlyTheseNames.saveable_names`), JAX 0.12 a closure (its cell
    `names_which_can_be_saved`)."""
    code, cells = getattr(policy, "__code__", None), getattr(policy, "__closure__", None)
    if code is not None and cells:
        return dict(zip(code.co_freevars, (c.cell_contents for c in cells), strict=False))
    return dict(getattr(policy, "__dict__", {}))


def _names(fields: dict[str, Any], *keys: str) -> str:
    for key in keys:
        if isinstance(fields.get(key), set | frozenset | list | tuple):
            return ", ".join(sorted(map(str, fields[key])))
    return "?"


def remat_policy_label(params: Any) -> str | None:
    """The `policy` of a `jax.checkpoint` equation (`remat2`) as a label says it:
    `save dots` for `checkpoint_policies.checkpoint_dots`, `save proj` for
    `save_only_these_names("proj")`, a policy function of yours by its name; None for
    no policy. JAX 0.10 spells the dots and names policies as dataclasses
    (`DotsSaveable`, `SaveOnlyTheseNames`, `SaveAnyNamesButThese`), JAX 0.12 as
    functions and closures."""
    policy = params.get("policy")
    if policy is None:
        return None
    kind = type(policy).__name__
    if kind == "DotsSaveable":  # JAX <= 0.10
        no_batch = getattr(policy, "only_if_no_batch_dims", False)
        return _POLICY_LABELS["dots_with_no_batch_dims_saveable" if no_batch else "dots_saveable"]
    maker = getattr(policy, "__qualname__", kind).split(".<locals>.")[0]
    fields = _policy_fields(policy)
    if maker in ("save_only_these_names", "SaveOnlyTheseNames"):
        return "save " + _names(fields, "names_which_can_be_saved", "saveable_names")
    if maker in ("save_any_names_but_these", "SaveAnyNamesButThese"):
        return "save all but " + _names(fields, "names_not_to_save", "names")
    if maker == "save_and_offload_only_these_names":
        saved = _names(fields, "names_which_can_be_saved")
        return f"save {saved}, offload {_names(fields, 'names_which_can_be_offloaded')}"
    if maker == "save_from_both_policies":
        both = [fields.get("policy_1"), fields.get("policy_2")]
        labels = [remat_policy_label({"policy": p}) for p in both]
        return " + ".join(x or "?" for x in labels)
    if maker in _POLICY_LABELS:
        return _POLICY_LABELS[maker]
    name = getattr(policy, "__name__", "")  # yours; a lambda is a custom policy
    return name if isinstance(name, str) and name.isidentifier() else "custom policy"


def _unwrapped_callable(fn: Any) -> Any:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _callable_name(fn: Any) -> str | None:
    """A user's or a library's function by its name; None for a lambda, an unnamed
    callable, or JAX's own (`jax.debug.print` calls back JAX's formatter)."""
    fn = _unwrapped_callable(fn)
    name = getattr(fn, "__name__", None)
    code = getattr(fn, "__code__", None)
    if not isinstance(name, str) or not name.isidentifier():
        return None  # `<lambda>`, a callable object
    if code is not None and os.path.abspath(code.co_filename).startswith(_JAX_DIR):
        return None
    return name


def _callback_function(eqn: JaxprEqn) -> Any:
    """The function a callback equation calls on the host: `io_callback` and
    `pure_callback` keep it as `_FlatCallback.callback_func` (JAX 0.10 to 0.12);
    `debug_callback` as the `callback` cell of its `_flat_callback` closure."""
    cb = eqn.params.get("callback")
    if hasattr(cb, "callback_func"):
        return cb.callback_func
    return _policy_fields(cb).get("callback") if callable(cb) else None


def _kernel_label(eqn: JaxprEqn) -> str:
    """`pallas_call(matmul_kernel, grid=(2, 2))`: the kernel by the function JAX traced
    it from (`debug_info`; the `name=` given to `pl.pallas_call` wins), and the grid
    (`grid_mapping.grid`, JAX 0.10 to 0.12) when there is one."""
    kernel = eqn.params.get("jaxpr")
    info = getattr(kernel, "debug_info", None)
    src = getattr(info, "func_src_info", None) or ""
    name = src.split(" at ")[0] if " at " in src else getattr(info, "func_name", None)
    name = name if isinstance(name, str) and name.isidentifier() else None
    grid = getattr(eqn.params.get("grid_mapping"), "grid", ())
    parts = [name] if name else []
    if grid and all(isinstance(n, int) for n in grid):
        parts.append(f"grid={tuple(grid)}")
    return f"pallas_call({', '.join(parts)})" if parts else "pallas_call"


_CALLBACKS = frozenset({"debug_callback", "io_callback", "pure_callback"})


def called_function_label(eqn: JaxprEqn) -> str | None:
    """The label of an equation that runs a function of yours JAX does not trace into a
    graph: `debug_callback(log_fn)`, `io_callback(record)`,
    `pallas_call(matmul_kernel, grid=(2, 2))`; None for any other equation and for a
    callback of a lambda (its primitive's name says as much)."""
    name = eqn.primitive.name
    if name == "pallas_call":
        return _kernel_label(eqn)
    if name not in _CALLBACKS:
        return None
    fn = _callable_name(_callback_function(eqn))
    return f"{name}({fn})" if fn else None


def opaque_kernel(eqn: JaxprEqn) -> bool:
    """A kernel (`pallas_call`) whose body is no jaxpr the graph draws: it is one box,
    so one equation, whatever its body holds."""
    return eqn.primitive.name == "pallas_call"


def name_stack_transforms(eqn: JaxprEqn) -> tuple[str, ...]:
    """The transforms of an equation's name stack, outermost first (`('jvp',)` for the
    work of a `jax.linearize`; a backward pass puts `transpose` outside the transforms
    of the equations it transposes: `('transpose', 'jvp')`)."""
    return tuple(name for kind, name in name_stack_kinds(eqn) if kind == "transform")


def loop_initial_operand(eqn: JaxprEqn, body_param: str, k: int) -> int | None:
    """Which operand of a loop equation (`scan`, `while`) is the initial value of input
    `k` of its body (the sub-jaxpr at `body_param`), when that input is the carry;
    None for a constant, an xs slice, a `while`'s condition or another equation. The
    operands are the body's inputs in order: a scan's consts, carry, xs; a while's
    condition consts, then its body's consts and carry. The params read are the same
    from JAX 0.10 to 0.12 (`scan_layout` reads a scan's layout)."""
    name = eqn.primitive.name
    if name == "scan" and body_param == "jaxpr":
        layout = scan_layout(eqn.params)
        carry = k - layout.num_consts
        return k if 0 <= carry < layout.num_carry else None
    if name == "while" and body_param == "body_jaxpr":
        if k < eqn.params["body_nconsts"]:
            return None
        return eqn.params["cond_nconsts"] + k
    return None


def passed_operand(eqn: JaxprEqn, sub_param: str, k: int, n_inputs: int) -> int | None:
    """Which operand of `eqn` its sub-jaxpr at `sub_param` (of `n_inputs` inputs) reads
    as input `k`, when `eqn` only passes its operands on: a call (`jit`, `closed_call`)
    reads them in order, each branch of a `cond` all but the first (the index); None
    for any other equation (a loop's carry: `loop_initial_operand`)."""
    name = eqn.primitive.name
    if name in CALL_NAMES and n_inputs == len(eqn.invars):
        return k
    if name == "cond" and sub_param == "branches" and n_inputs == len(eqn.invars) - 1:
        return k + 1
    return None


# --- added by sharding labels: collectives by the names users call them, and the mesh
# axes an array lies along, which no type carries on an Auto mesh.

#: JAX's primitives of collectives named otherwise than the `jax.lax` function a user
#: calls (`primitive_label` draws the function): under `shard_map`'s default
#: `check_vma=True`, `lax.psum` of a device-varying value binds `psum_invariant` (JAX
#: 0.10 and 0.12 alike; `psum` with `check_vma=False`); `lax.psum_scatter` binds
#: `reduce_scatter` in every version; `lax.all_gather(..., to="invarying")` and
#: `to="reduced"` bind their own primitives; on an unreduced value (an Explicit mesh's
#: `unreduced` axes) `psum`, `pmax`, `pmin` and `psum_scatter` bind `unreduced_*` ones
#: (`unreduced_pmax`, `unreduced_pmin` from JAX 0.12).
COLLECTIVE_CALLS: dict[str, str] = {
    "psum_invariant": "psum",
    "reduce_scatter": "psum_scatter",
    "all_gather_invariant": "all_gather",
    "all_gather_reduced": "all_gather",
    "unreduced_psum": "psum",
    "unreduced_pmax": "pmax",
    "unreduced_pmin": "pmin",
    "unreduced_reduce_scatter": "psum_scatter",
}

#: `jax.lax`'s collectives by the names users call them (`pmean`, which binds `psum`),
#: and the names `COLLECTIVE_CALLS` gives their primitives.
COLLECTIVE_FUNCTIONS = frozenset(
    {"pmean", "psum", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all"}
    | {"ragged_all_to_all", "ppermute", "pbroadcast", "pshuffle", "pswapaxes"}
)

#: Per dimension of a value, the mesh axes that split it: `(("data",), ())`.
MeshAxes = tuple[tuple[str, ...], ...]


def named_axes(sharding: Any, ndim: int) -> MeshAxes | None:
    """Per dimension of a rank-`ndim` value, the mesh axes `sharding` splits it along,
    Auto and Explicit axes alike (`NamedSharding(mesh, P(None, "model"))`: `((),
    ("model",))`); None when it splits none (replicated, unconstrained, or not a
    `NamedSharding`: a single device, `jax.pmap`'s)."""
    spec = getattr(sharding, "spec", None)
    if spec is None or getattr(sharding, "mesh", None) is None:
        return None
    entries = tuple(spec)[:ndim] + (None,) * (ndim - len(spec))
    out = tuple(_entry_axes(e) for e in entries)
    return out if any(out) else None


def _entry_axes(entry: Any) -> tuple[str, ...]:
    # a name, a tuple of names, or None; `PartitionSpec.UNCONSTRAINED` names none
    if isinstance(entry, str):
        return (entry,)
    if isinstance(entry, tuple):
        return tuple(n for n in entry if isinstance(n, str))
    return ()


def placement_axes(x: Any) -> MeshAxes | None:
    """The mesh axes splitting each dimension of the array `x` as it lies on its devices
    (`jax.device_put(w, NamedSharding(mesh, P(None, "model")))`: `((), ("model",))`).
    On an Auto mesh (`jax.make_mesh(..., axis_types=(AxisType.Auto, ...))`, Flax NNX's
    sharding guide) this is in no type: a trace sees `float32[32,64]`. None for a
    NumPy array, a tracer, or an array on one device or replicated."""
    if not isinstance(x, jax.Array) or isinstance(x, _core.Tracer):
        return None
    try:
        sharding = x.sharding
    except Exception:  # a deleted or donated array: no placement to show
        return None
    try:
        return _named_axes_cached(sharding, x.ndim)
    except TypeError:  # an unhashable sharding: read it uncached
        return named_axes(sharding, x.ndim)


@functools.lru_cache(maxsize=256)
def _named_axes_cached(sharding: Any, ndim: int) -> MeshAxes | None:
    # (a Monitor asks per argument leaf at every step; a model's leaves share a few)
    return named_axes(sharding, ndim)


def constraint_axes(eqn: JaxprEqn) -> MeshAxes | None:
    """What a `jax.lax.with_sharding_constraint` equation asks of its operand: the mesh
    axes per dimension of its `sharding` param (the same param in JAX 0.10 and 0.12),
    which its output's type does not say on an Auto mesh; None for another equation."""
    if eqn.primitive.name != "sharding_constraint" or len(eqn.outvars) != 1:
        return None
    ndim = len(getattr(eqn.outvars[0].aval, "shape", ()))
    return named_axes(eqn.params.get("sharding"), ndim)


def body_source(body: Any) -> tuple[str, int, str] | None:
    """Where the user's function `body` was traced from: its file, the first line of
    its definition (a decorated function's first decorator) and its name, from JAX's
    `debug_info.func_src_info` ("step at /path/file.py:3", JAX 0.10 to 0.12); None when
    JAX recorded none (a lambda's name is `<lambda>`)."""
    jaxpr, _ = jaxpr_and_consts(body)
    src = getattr(getattr(jaxpr, "debug_info", None), "func_src_info", None) or ""
    name, _, where = src.partition(" at ")
    file, _, line = where.rpartition(":")
    return (file, int(line), name) if file and line.isdigit() else None


#: The tracers whose contents `read_on_through` replaces, with the slots it copies:
#: the JVP and linearize tracers of differentiation, the batch tracer of `vmap`
#: (JAX 0.10 to 0.12 name and lay them out alike). A `jit` tracer is never among them:
#: its equations read their operands' `val` only when the jaxpr is built, so a
#: replaced `val` would rewrite reads made *before* the sow too.
_READ_ON_SLOTS = (
    (_ad.JVPTracer, ("primal", "tangent")),
    (_ad.LinearizeTracer, ("primal", "tangent")),
    (_batching.BatchTracer, ("val", "batch_dim")),
)


def read_on_through(tracer: Any, out: Any) -> None:
    """Make every *later* read of `tracer` (an operand of an identity primitive) read
    `out`, the primitive's result of the same trace, by giving `tracer` its contents.

    A `sow` whose result the program drops (`sowviz.sow(h, "h")` as a statement) is
    otherwise off the data flow: the program reads on `h`, so no tangent or cotangent
    reaches the sown copy, and `jax.grad` records zeros for it. Reads already made keep
    what they read. Any other pair (constants, a `jit` tracer) is left as it is."""
    if type(out) is not type(tracer) or getattr(out, "_trace", None) is not getattr(
        tracer, "_trace", None
    ):
        return
    for cls, slots in _READ_ON_SLOTS:
        if type(tracer) is cls:
            for slot in slots:
                setattr(tracer, slot, getattr(out, slot))
            return


def _is_typed_key(v: Any) -> bool:
    """Whether the variable `v` holds a typed PRNG key (`key<fry>[]`)."""
    dtype = getattr(getattr(v, "aval", None), "dtype", None)
    try:
        return dtype is not None and bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))
    except TypeError:  # (a dtype NumPy cannot compare, such as `float0`)
        return False


def draws_from_key(eqn: JaxprEqn) -> bool:
    """Whether `eqn` draws values from a PRNG key: an operand is a typed key
    (`key<fry>[]`; a raw `uint32[2]` key is wrapped into one first) and no result is
    one. `jax.random.normal`'s jit, `randint`'s, `bernoulli`'s, not `split` or
    `fold_in`, which make keys. (`jax.dtypes.prng_key`: JAX 0.4.16 and later.)"""

    return any(map(_is_typed_key, eqn.invars)) and not any(map(_is_typed_key, eqn.outvars))


def read_already(value: Any) -> bool:
    """Whether an equation already reads the tangent of `value` (a tracer of `jvp` or
    `linearize`, about to be sown): the program read the value before sowing it, and
    those reads bypass the sow, whose cotangent leaves them out. The tangent is a `jit`
    tracer of the linearized or JVP program being built; that trace's equations are
    searched from the last back to the one making the tangent (its `parent`): a sow
    right after its value is made looks at one or two. JAX 0.10 to 0.12 keep a trace's
    equations in `frame.tracing_eqns` (weak references to pure ones: a read nothing
    uses is gone), each with its `in_tracers`. (Not from `sow`'s JVP rule: JAX
    linearizes a primitive without a linearization rule in a trace of its own.)"""
    import weakref  # (appended here: the module's imports are others' to edit)

    if not isinstance(value, _ad.JVPTracer | _ad.LinearizeTracer):
        return False
    tangent = value.tangent
    if not isinstance(tangent, _pe.DynamicJaxprTracer):
        return False
    frame = getattr(getattr(tangent, "_trace", None), "frame", None)
    made_by = getattr(tangent, "parent", None)
    for entry in reversed(getattr(frame, "tracing_eqns", ())):
        eqn = entry() if isinstance(entry, weakref.ReferenceType) else entry
        if eqn is None:
            continue
        if eqn is made_by:
            return False
        if any(t is tangent for t in getattr(eqn, "in_tracers", ())):
            return True
    return False


_traced_lambda_cache: dict = {}


def on_traced_lambda_line(eqn: JaxprEqn) -> bool:
    """Whether `eqn` was made on the line of a lambda that is the outermost user frame of
    its traceback: the function sowviz traced is that lambda (`ins =
    sowviz.inspect(lambda w, x: ..., w, x)`), and the statement on its line (which
    assigns `ins`) ran outside the program. A `jax.tree.map` lambda inside your
    function has that function's frame around it; a `def`'s lines are no lambda's."""
    return bool(_by_traceback(_traced_lambda_cache, eqn, _on_traced_lambda_line))


def _on_traced_lambda_line(codes: Any, lastis: Any) -> bool:
    user = [(c, k) for c, k in zip(codes, lastis, strict=True) if _is_user_code(c)]
    if not user or not user[-1][0].co_name.startswith("<lambda"):
        return False
    inner, outer = _location(*user[0]), _location(*user[-1])
    if inner is None or outer is None:
        return False
    return (inner.file, inner.line) == (outer.file, outer.line)


def api_boundary(fn: Any) -> Any:
    """`fn` (a public entry: `show`, `inspect`) with sowviz's frames taken out of the
    traceback of any error it raises, as JAX takes its own out of `jax.jit`'s: a bad
    input then ends at the user's call, not 8 frames deep in sowviz; the user's own
    frames (their function's line that failed) stay. JAX's machinery, so its setting
    decides (`JAX_TRACEBACK_FILTERING=off` shows every frame): in IPython the frames
    are hidden with `__tracebackhide__` ("[... skipping hidden N frame]"), elsewhere
    cut, with JAX's note saying so. sowviz's directory is excluded at the top of this
    module. `traceback_util.api_boundary`, `_filtering_mode` and `include_frame`: the
    same in JAX 0.10 and 0.12. An error sowviz raises itself reads as sowviz's, without
    JAX's note (`own_errors_marked`)."""
    boundary = _traceback_util.api_boundary(own_errors_marked(fn))

    @functools.wraps(fn)
    def entry(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # read by IPython and pytest
        try:
            return boundary(*args, **kwargs)
        except Exception as err:
            mode = _traceback_util._filtering_mode()
            if mode != "off":
                # the error and the ones it chains (`raise said from err`): JAX filters
                # only the error's own traceback
                seen: set[int] = set()
                link: BaseException | None = err
                while link is not None and id(link) not in seen:
                    seen.add(id(link))
                    link.with_traceback(_filtered(link.__traceback__, mode))
                    link = link.__cause__ or (
                        None if link.__suppress_context__ else link.__context__
                    )
            if getattr(err, _OWN_ERROR, False):
                without_jax_note(err)
            raise  # a bare raise adds no frame of this function

    return entry


def _filtered(tb: types.TracebackType | None, mode: str) -> types.TracebackType | None:
    """`tb` without JAX's and sowviz's frames. IPython ("tracebackhide") hides them
    itself but shows the innermost frame even when hidden: sowviz's `raise` line would
    end the traceback of every bad input, so the traceback ends at the last frame of the
    user's (or of a library's that JAX does not hide); the frames before it are marked.
    None if no frame is left: Python adds the caller's as the error leaves the call."""
    kept = []
    node = tb
    while node is not None:
        if _shown(node.tb_frame):
            kept.append(node)
        elif mode == "tracebackhide":
            node.tb_frame.f_locals["__tracebackhide__"] = True  # as JAX marks its own
        node = node.tb_next
    if not kept:
        return None
    if mode == "tracebackhide":
        kept[-1].tb_next = None  # writable since Python 3.7
        return tb
    out = None
    for node in reversed(kept):
        out = types.TracebackType(out, node.tb_frame, node.tb_lasti, node.tb_lineno)
    return out


def _shown(frame: types.FrameType) -> bool:
    """Whether a frame stays in a public entry's traceback: not JAX's nor sowviz's,
    nor `contextlib`'s `__exit__` that re-raised an error of sowviz's
    `@contextmanager` (`library_errors`)."""
    name = frame.f_code.co_filename
    return _traceback_util.include_frame(frame) and name != contextlib.__file__


# ---------------------------------------------------------------------------
# Haiku's module calls and state writes (graph/frameworks). `hk.intercept_methods`
# pushes onto `haiku._src.module.interceptor_stack` and `hk.custom_setter` onto
# `haiku._src.base.state_setter_stack` (Haiku 0.0.10 to 0.0.17); sowviz pushes onto them
# itself because `hk.custom_setter` must run inside `hk.transform`, and sowviz's hook
# is entered outside it, around the function that calls `apply`. Every Haiku module
# method runs inside the one nested function `wrap_method.<locals>.wrapped`: the frame
# just outside it is the module's call site.


@contextlib.contextmanager
def haiku_hooks(interceptor: Any, setter: Any) -> Iterator[None]:
    """`interceptor` (a method interceptor, `hk.intercept_methods`) and `setter` (a state
    setter, `hk.custom_setter`) active in this thread while the block runs."""
    from haiku._src import base, module

    with module.interceptor_stack(interceptor), base.state_setter_stack(setter):
        yield


@functools.cache
def _haiku_wrapped_code() -> Any:
    try:
        from haiku._src import module
    except ImportError:
        return None
    return module.wrap_method("__call__", lambda self: None, lambda: None).__code__


def haiku_call_sites(eqn: JaxprEqn) -> list[SourceLocation]:
    """Where each Haiku module method call the equation was made in was made, innermost
    first (the line of `self.block(x)`, not where `block` was built)."""
    code = _haiku_wrapped_code()
    return call_sites(eqn, code) if code is not None else []


# ---------------------------------------------------------------------------
# Haiku's mixed precision (for graph/build): a policy set with
# `hk.mixed_precision.set_policy` casts a module's inputs and the parameters it reads
# (`hk.get_parameter`) to its compute dtype in `haiku/_src/mixed_precision.py`'s
# interceptor and getter. Same traceback internals as `call_path`.
_HAIKU_PRECISION_FILE = os.path.join("haiku", "_src", "mixed_precision.py")
_haiku_casts: dict = {}


def haiku_policy_cast(eqn: JaxprEqn) -> bool:
    """Whether `eqn` is a cast a Haiku mixed-precision policy made: a dtype change
    (`convert_element_type`) bound below a frame of Haiku's `mixed_precision.py`."""
    if eqn.primitive.name != "convert_element_type":
        return False
    return bool(_by_traceback(_haiku_casts, eqn, _haiku_policy_cast))


def _haiku_policy_cast(codes: Any, lastis: Any) -> bool:
    for code in codes:
        if code.co_filename.endswith(_HAIKU_PRECISION_FILE):
            return True
        if _is_user_code(code):
            return False
    return False


# ---------------------------------------------------------------------------
# --- added by graph (round 15): an `nnx.scan`'s `lax.scan`. Flax NNX 0.12.8 to 0.12.12
# call `jax.lax.scan` from `scan_wrapper` (graph updates on, the default: the body
# `ScanFn(carry, scan_in)` gets `(pure_carry_arg, carry_deque, broadcast_deque,
# broadcast_arrays)` and `(graphdefs, pure_args)`) or from `simple_scan_wrapper`
# (`graph_updates=False`: `SimpleScanFn((carry, broadcasts), args)`). Both are
# `functools.update_wrapper`ed to the user's function, so JAX names NNX's two
# arguments by the user's first two parameters.
_NNX_ITERATION = os.path.join("flax", "nnx", "transforms", "iteration.py")
_NNX_SCAN_WRAPPERS = {"scan_wrapper": "graph", "simple_scan_wrapper": "simple"}
_nnx_scans: dict[tuple, tuple[Any, str | None]] = {}


def nnx_scan_kind(eqn: JaxprEqn) -> str | None:
    """Which NNX wrapper made the `scan` equation `eqn` ("graph" or "simple", as above),
    or None for any other scan (a `lax.scan` of the user's, another library's)."""
    if eqn.primitive.name != "scan":
        return None
    return _by_traceback(_nnx_scans, eqn, _nnx_scan_kind)


def _nnx_scan_kind(codes: Any, lastis: Any) -> str | None:
    for code in codes:  # the first frame outside JAX called `lax.scan`
        if code.co_filename.startswith(_JAX_DIR):
            continue
        if code.co_filename.endswith(_NNX_ITERATION):
            return _NNX_SCAN_WRAPPERS.get(code.co_name)
        return None
    return None


# ---------------------------------------------------------------------------
# `jax.linear_transpose` of a linear map with integer/bool outputs (mode 'all' of a step
# returning an optimizer state's step count). Their tangents are `float0`; up to JAX
# 0.10 `linear_transpose` refuses any float0 output ("[float or complex] -> [float or
# complex] ... functions"), JAX 0.12 accepts them (as symbolic-zero cotangents).


def linear_transpose_call(lin: Any, primals: tuple, cotangent: Any) -> tuple:
    """`jax.linear_transpose(lin, *primals)(cotangent)` on every supported JAX, where some
    of `lin`'s outputs are float0 tangents (of integer or bool outputs): those outputs
    are left out of the transposed map, and their (float0, necessarily zero) cotangents
    with them, which is what JAX 0.12 does with them (a symbolic zero)."""
    cts = jax.tree_util.tree_leaves(cotangent)
    keep = [getattr(c, "dtype", None) != jax.dtypes.float0 for c in cts]
    if all(keep):
        return jax.linear_transpose(lin, *primals)(cotangent)

    def floating(*xs: Any) -> list:
        outs = jax.tree_util.tree_leaves(lin(*xs))
        return [o for o, k in zip(outs, keep, strict=True) if k]

    return jax.linear_transpose(floating, *primals)(
        [c for c, k in zip(cts, keep, strict=True) if k]
    )


# ---------------------------------------------------------------------------
def handed_loop_body(eqns: Sequence[JaxprEqn], package: str | None) -> str | None:
    """The qualified name of the function that a library's loop body (a lambda of
    `package`'s, which made the loop: Equinox's `lambda x: body_fun(x)`) runs for another
    package, from its equations' tracebacks: the outermost frame that is neither JAX's
    nor `package`'s, the one most of them were made in (diffrax's `loop.<locals>.body_fun`
    for the `while` of a `diffeqsolve`; Equinox's body also runs the `cond_fun` it was
    handed). An equation whose traceback reaches the user's code (not cut at the body)
    says nothing. None without such a function, or for a tie."""
    if not package:
        return None
    own = os.sep + package + os.sep
    found: collections.Counter[str] = collections.Counter()
    for eqn in eqns:
        tb = eqn.source_info.traceback
        if tb is None:
            continue
        try:
            codes, _ = tb.raw_frames()
        except Exception:  # best effort: no traceback, no name
            return None
        for code in reversed(codes):  # outermost first
            file = code.co_filename
            if file.startswith((_JAX_DIR, _SOWVIZ_DIR + os.sep)) or own in file:
                continue
            if not _is_user_file(file):
                found[code.co_qualname] += 1
            break  # (a user's frame: a traceback not cut at the body)
    top = found.most_common(2)
    return top[0][0] if top and (len(top) == 1 or top[0][1] > top[1][1]) else None


# ---------------------------------------------------------------------------
def checkify_wrapped(fn: Any) -> Any | None:
    """The function `jax.experimental.checkify.checkify(f)` wraps (`f`), or None.
    checkify's `checked_fun` (JAX 0.10 to 0.12: a closure over `f`, under
    `traceback_util.api_boundary`, which `functools.wraps` it alone) copies neither
    `f`'s name nor its signature: a report of it read `checked_fun`, its arguments
    `arg0`, `arg1`."""
    inner = getattr(fn, "__wrapped__", fn)
    if getattr(inner, "__qualname__", None) != "checkify.<locals>.checked_fun":
        return None
    code, cells = getattr(inner, "__code__", None), getattr(inner, "__closure__", None)
    if code is None or not cells or "f" not in code.co_freevars:
        return None
    try:
        f = cells[code.co_freevars.index("f")].cell_contents
    except ValueError:  # (an empty cell)
        return None
    return f if callable(f) else None


#: The primitive `checkpoint_name` binds (`checkpoint_name_of`), as `graph.names` reads
#: an equation's primitive.
CHECKPOINT_NAME = _CHECKPOINT_NAME


# ---------------------------------------------------------------------------
@contextlib.contextmanager
def linen_hooks(record: Any) -> Iterator[None]:
    """`record(label, out)` for the result `out` of each Flax Linen module method call
    while the block runs (a method interceptor, `nn.intercept_methods`, in this thread),
    `label` being the scope Linen pushes around the call: the module's name or class,
    and the method's name after it but for `__call__` (Flax 0.10-0.12's
    `_derive_profiling_name`)."""
    from flax import linen

    def interceptor(next_fun: Any, args: tuple, kwargs: dict, context: Any) -> Any:
        out = next_fun(*args, **kwargs)
        method = context.method_name
        if method != "setup":  # (returns nothing; Linen pushes no scope of it either)
            module = context.module
            label = module.name or type(module).__name__
            record(label if method == "__call__" else f"{label}.{method}", out)
        return out

    with linen.intercept_methods(interceptor):
        yield


# ---------------------------------------------------------------------------
# --- added by graph (round 16): PRNG key plumbing nothing reads (graph/saved.py's
# `dead_keys`). Typed keys (`key<fry>[]`, `jax.dtypes.prng_key`: JAX 0.4.16 and later)
# and the primitives that make, split or retype keys.
_KEY_MAKERS = frozenset({"random_seed", "random_split", "random_fold_in", *KEY_CASTS})


def handles_keys(eqn: JaxprEqn, keyed: Any = ()) -> bool:
    """Whether `eqn` only makes, splits, retypes or reshapes PRNG keys: a key primitive
    (`random_seed`, `random_split`, `random_fold_in`, a wrap or unwrap), an equation all
    of whose results are typed keys (`unstack` of a split's keys), or one whose operands
    are all such equations' results (`keyed`: a raw `uint32[2]` key's slices). Not a
    draw (`draws_from_key`), nor anything with an effect or a body."""
    if eqn.effects or next(sub_jaxprs(eqn), None) is not None or draws_from_key(eqn):
        return False
    if eqn.primitive.name in _KEY_MAKERS:
        return True

    if eqn.outvars and all(map(_is_typed_key, eqn.outvars)):
        return True
    operands = [v for v in eqn.invars if isinstance(v, Var)]
    return bool(operands) and all(v in keyed for v in operands)


# ---------------------------------------------------------------------------
# `jax.nn`'s functions (`relu`, a `custom_jvp`; `log_softmax`, `silu`, jits) are traced
# from `jax/_src/nn/`; the sub-program's `debug_info.func_src_info` names that file
# (JAX 0.10-0.12).
_NN_DIR = os.path.join(_JAX_DIR, "_src", "nn") + os.sep


def is_jax_nn_call(eqn: JaxprEqn) -> bool:
    """Whether `eqn` is the call of one of `jax.nn`'s functions (`relu`, `log_softmax`):
    a `jit` or custom-derivative call of a function defined under `jax/_src/nn/`."""
    name = eqn.primitive.name
    if name in JIT:
        sub = eqn.params.get("jaxpr")
    elif name == CUSTOM_JVP or name in CUSTOM_VJP:
        sub = eqn.params.get("call_jaxpr") or eqn.params.get("fun_jaxpr")
    else:
        return False
    return sub is not None and _traced_from(sub).startswith(_NN_DIR)


# ---------------------------------------------------------------------------
def closed_over_tracer(closed: ClosedJaxpr) -> Any | None:
    """The first of `closed`'s constants that is a tracer of an outer transformation
    (the function closes over a value traced by a `jit`, `vmap` or `grad` around the
    call), or None. `jax.make_jaxpr` under such a trace keeps the outer tracer as a
    constant (JAX 0.10 to 0.12); a compiled program then refuses it as an argument,
    with "Cannot apply JAX transformations to a function lowered and compiled"."""
    return next((c for c in closed.consts if isinstance(c, _core.Tracer)), None)


# ---------------------------------------------------------------------------
# tesseract-jax (0.4 and 0.5) refuses a derivative endpoint a Tesseract lacks in
# `_raise_if_unimplemented(eval_func, client)`, from its JVP rule, transpose rule or
# lowering; its message names no Tesseract. The refusing frame's locals do.
_TESSERACT_REFUSAL = re.compile(r"Endpoint '(\w+)' not implemented for this Tesseract")


def tesseract_missing_endpoint(err: BaseException) -> tuple[str, Any] | None:
    """(the endpoint, the `Jaxeract` client or None) when `err` (or an exception it
    was raised from) is tesseract-jax's refusal of an endpoint a Tesseract lacks."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        found = _TESSERACT_REFUSAL.search(str(e))
        if found and isinstance(e, NotImplementedError):
            tb = e.__traceback__
            while tb is not None:
                frame = tb.tb_frame
                if frame.f_code.co_name == "_raise_if_unimplemented":
                    return found.group(1), frame.f_locals.get("client")
                tb = tb.tb_next
            return found.group(1), None
        e = e.__cause__ or e.__context__
    return None


def tesseract_endpoints(client: Any) -> tuple[str, ...] | None:
    """The endpoints a `Jaxeract` client's Tesseract serves, or None when unknown."""
    methods = getattr(client, "available_methods", None)
    if methods is None:
        methods = getattr(getattr(client, "client", None), "available_endpoints", None)
    try:
        return tuple(str(m) for m in methods) if methods is not None else None
    except TypeError:
        return None


# ---------------------------------------------------------------------------
# An in-process Tesseract (`Tesseract.from_tesseract_api`) runs its `apply_jit` in
# a program of its own, through tesseract-jax's host callback; Python calls it while
# the user's program is traced only for the output shapes: tesseract-jax's
# `Jaxeract.abstract_eval` (from `apply_tesseract`, and from the primitive's
# `tesseract_dispatch_abstract_eval`) runs the Tesseract's `abstract_eval` endpoint,
# whose jax_recipes version is `jax.eval_shape(apply_jit)` (tesseract-jax 0.4, 0.5).
# A sow called there never reaches the traced program.
_TESSERACT_EVALS = frozenset({"abstract_eval", "tesseract_dispatch_abstract_eval"})


def tesseract_tracing() -> Any | None:
    """The `Jaxeract` client of the Tesseract whose shapes tesseract-jax is working out
    on this thread right now (the caller runs inside it), else None."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in _TESSERACT_EVALS and str(
            frame.f_globals.get("__name__", "")
        ).startswith("tesseract_jax"):
            local = frame.f_locals
            for client in (
                local.get("self"),
                local.get("client"),
                getattr(local.get("params"), "client", None),
            ):
                if hasattr(client, "available_methods"):
                    return client
        frame = frame.f_back
    return None


class _SowStore(dict):
    """tesseract-jax's store of `tesseract_jax.sow` tree structures, which also notes
    the names sown inside a Tesseract (`tesseract_tracing`): those never reach the
    program."""

    def __init__(self) -> None:
        super().__init__()
        self.inside: dict[str, Any] = {}

    def __setitem__(self, name: str, treedef: Any) -> None:
        client = tesseract_tracing()
        if client is not None:
            self.inside[name] = client
        super().__setitem__(name, treedef)


# ---------------------------------------------------------------------------
# --- sharded seeds and inputs (JAX 0.10-0.12) ------------------------------------------
def explicitly_placed_like(v: Any, like: Any) -> Any:
    """`v` placed as the type of `like` says when that type carries Explicit mesh axes
    (`float32[16@data,8@model]`), else `v` as it is. A differentiation seed made apart
    from its primal (`jnp.ones(y.shape)`, a NumPy array) is replicated, and a
    `shard_map` whose in_spec splits that value refuses it in its transpose or JVP
    (blaming the user's `in_specs`); `jax.jit`'s own rules reshard it, as this does."""
    want = explicit_sharding(like)
    if want is None or getattr(jax.typeof(v), "sharding", None) == want:
        return v
    return jax.sharding.reshard(v, want)


def jit_input_placements(closed: ClosedJaxpr) -> list[MeshAxes | None]:
    """Per input of `closed`, the mesh axes an outermost `jax.jit`'s `in_shardings`
    split it along when the input goes straight into that jit (`jax.jit(loss,
    in_shardings=(rep, NamedSharding(mesh, P("data"))))` called with NumPy arrays: the
    jit places them, and no argument's `.sharding` says so); None elsewhere."""
    jaxpr = closed.jaxpr
    out: dict[Any, MeshAxes | None] = {}
    for eqn in jaxpr.eqns:
        shardings = eqn.params.get("in_shardings") if eqn.primitive.name in JIT else None
        if shardings is None:
            continue
        for v, s in zip(eqn.invars, shardings, strict=False):
            if isinstance(v, Var) and out.get(v) is None:
                out[v] = named_axes(s, len(getattr(v.aval, "shape", ())))
    return [out.get(v) for v in jaxpr.invars]


# ---------------------------------------------------------------------------
# Python >= 3.12 inlines a list, set or dict comprehension into the function that holds
# it (PEP 709): its loop runs in that function's own frame, whose instruction offset
# goes back at every element, as a `for` loop's does. (Before, and for a generator
# still, the comprehension runs in a frame of its own, `<listcomp>`, `<genexpr>`.)
_COMPREHENSION_LOOPS: dict[int, tuple[Any, tuple[tuple[int, int], ...]]] = {}


def inlined_comprehension(code: Any, lasti: int) -> tuple[int, int] | None:
    """The outermost comprehension inlined into `code` whose loop holds the instruction
    at offset `lasti`, as (the code's id, the loop's offset); None when there is none.
    `norms = [jnp.linalg.norm(g) for g in leaves]` is one statement: its loop is no
    Python loop running that line again (`names.line_passes`)."""
    hit = _COMPREHENSION_LOOPS.get(id(code))
    if hit is None:
        try:
            loops = _comprehension_loops(code)
        except Exception:  # unreadable bytecode or source: no comprehension known
            loops = ()
        hit = _COMPREHENSION_LOOPS[id(code)] = (code, loops)  # (keeps the code, its id, alive)
    for start, end in hit[1]:  # (by offset: an outer loop before the loops it holds)
        if start <= lasti < end:
            return id(code), start
    return None


def _comprehension_loops(code: Any) -> tuple[tuple[int, int], ...]:
    """The (start, end) offsets of the `FOR_ITER` loops of `code` that are inlined
    comprehensions: the loop's source position starts at the comprehension's bracket,
    `[` or `{` (a `for` statement's at `for`)."""
    import dis
    import linecache

    out = []
    for ins in dis.get_instructions(code):
        if ins.opname != "FOR_ITER" or not isinstance(ins.argval, int):
            continue
        pos = ins.positions
        if pos is None or pos.lineno is None or pos.col_offset is None:
            continue
        text = linecache.getline(code.co_filename, pos.lineno).encode()
        if text[pos.col_offset : pos.col_offset + 1] in (b"[", b"{"):
            out.append((ins.offset, ins.argval))
    return tuple(out)


# ---------------------------------------------------------------------------
# --- added by graph (round 17): the lines a module's call was made from, to tell
# apart calls of one module from several lines (double DQN's three `net.apply`s).
_user_lines: dict = {}


def user_lines_from(eqn: JaxprEqn, site: SourceLocation) -> tuple | None:
    """The user's frames of the equation's traceback from the one at `site` (a module's
    call site, `haiku_call_sites`/`call_sites`) outward, as (file, line, function),
    innermost first; None when no user frame is there (or no traceback)."""
    lines = _by_traceback(_user_lines, eqn, _user_frame_lines)
    if not lines:
        return None
    at = (site.file, site.line, site.function)
    return lines[lines.index(at) :] if at in lines else None


def _user_frame_lines(codes: Any, lastis: Any) -> tuple:
    pairs = zip(codes, lastis, strict=True)
    found = (_location(code, lasti) for code, lasti in pairs if _is_user_code(code))
    return tuple((loc.file, loc.line, loc.function) for loc in found if loc is not None)


# ---------------------------------------------------------------------------
# --- added by perf (round 18): a replicated array's copy on one of its devices, taken
# without `jax.device_put` (26 µs of host work per array, 0.9 ms per recorded step of a
# Monitor on a CPU mesh, where it moved the summaries' inputs to one device and back).


def copy_on(x: Any, device: Any) -> Any:
    """`x`'s own buffer on `device` as an array of that device alone (no copy, no
    dispatch) when `x` is a fully addressable `jax.Array` replicated over devices that
    include `device`; else `jax.device_put(x, device)`."""
    if isinstance(x, jax.Array) and x.is_fully_addressable and x.sharding.is_fully_replicated:
        # (a replicated array's `addressable_data` is one copy, whatever the index: its
        # first device's, which is the mesh's first, where the summaries run)
        first = x.addressable_data(0)
        if device in first.devices():
            return first
        for shard in x.addressable_shards:
            if shard.device == device:
                return shard.data
    return jax.device_put(x, device)


# --- added by graph (round 18): Flax Linen module calls' own frames. Linen pushes a
# module's scope itself (`jax.named_scope` in `Module._call_wrapped_method`), so calls of
# one module in a row (`h = self.dense(x)` then `y = self.dense(h)`; three
# `network.apply`s) share one scope, which tells nothing of where each call was made.
# `linen_call_marks` runs each call that pushes a scope inside `_in_linen_call`, whose
# frames in an equation's traceback are those calls, innermost first, and
# `linen_call_sites` reads where each was made. Flax 0.10 to 0.12: a call passes through
# `flax/linen/module.py` (`Module.apply`, `wrapped_module_method`,
# `_call_wrapped_method`, `run_interceptors`) and `flax/core/` (`scope.apply`) between
# the caller's line and the method.
_LINEN_CALL_PLUMBING = (
    os.sep + os.path.join("flax", "linen", "module.py"),
    os.sep + os.path.join("flax", "core") + os.sep,
)
_linen_sites: dict = {}


def _in_linen_call(next_fun: Any, args: tuple, kwargs: dict) -> Any:
    # (its code object marks a Linen module call in a traceback: `linen_call_sites`)
    return next_fun(*args, **kwargs)


def _linen_plumbing(code: Any) -> bool:
    """A frame between a Linen module call's line and the method: JAX's, sowviz's (its
    interceptors), or Flax's call machinery (`_LINEN_CALL_PLUMBING`)."""
    file = code.co_filename
    return (
        not _source_info.is_user_filename(file)
        or file.startswith(_SOWVIZ_DIR + os.sep)
        or any(part in file for part in _LINEN_CALL_PLUMBING)
    )


@contextlib.contextmanager
def linen_call_marks(record: Any, unscoped: Any) -> Iterator[None]:
    """While the block runs (a Linen method interceptor, in this thread), run each Linen
    module method call that pushes a scope inside `_in_linen_call`, and
    `record(label, site)` it: the scope's label (as `linen_hooks` gives it) and the line
    that made the call (`linen_call_sites`), or None. Not `setup` (Linen pushes no scope
    around it), nor a method whose label `unscoped(label)` says the graph drops (Flax's
    own `scan_fn`, a lambda run as a method), which would stand for no scope."""
    from flax import linen

    def interceptor(next_fun: Any, args: tuple, kwargs: dict, context: Any) -> Any:
        method = context.method_name
        if method == "setup":
            return next_fun(*args, **kwargs)
        module = context.module
        label = module.name or type(module).__name__
        label = label if method == "__call__" else f"{label}.{method}"
        if unscoped(label):
            return next_fun(*args, **kwargs)
        frame = sys._getframe(1)
        while frame is not None and _linen_plumbing(frame.f_code):
            frame = frame.f_back
        record(label, _location(frame.f_code, frame.f_lasti) if frame is not None else None)
        return _in_linen_call(next_fun, args, kwargs)

    with linen.intercept_methods(interceptor):
        yield


def linen_call_sites(eqn: JaxprEqn) -> tuple[SourceLocation | None, ...]:
    """Where each Linen module call (`linen_call_marks`) the equation was made in was
    made, innermost first: the line calling the module (`y = self.dense(h)`,
    `q_t_target = network.apply(target_params, obs_t)`), past Flax's call machinery; None
    for one with no such frame. Empty without a traceback."""
    return _by_traceback(_linen_sites, eqn, _linen_call_sites) or ()


def _linen_call_sites(codes: Any, lastis: Any) -> tuple[SourceLocation | None, ...]:
    code = _in_linen_call.__code__
    out = []
    for k, c in enumerate(codes):
        if c is code:
            out.append(_callers(codes, lastis, k, lambda c: not _linen_plumbing(c)))
    return tuple(out)


# -- which custom derivative rule encloses a value (inspection.no_cotangent_reasons) --------
# A `custom_jvp_call`/`custom_vjp_call` body's `debug_info.func_src_info` reads
# "fn at /path/file.py:12" on JAX 0.10.2 to 0.12 ("fn_wrapped at .../equinox/_ad.py:1001"
# for Equinox's `filter_custom_vjp`); no debug info: the rule's function is unknown.


def custom_rule_of(eqn: JaxprEqn) -> tuple[str, str | None, str | None, int | None] | None:
    """`("custom_vjp" | "custom_jvp", function, file, line)` of a custom-derivative call
    equation (the function as written, where it was defined; each None when JAX kept
    no debug info); None for any other equation."""
    name = eqn.primitive.name
    if name != CUSTOM_JVP and name not in CUSTOM_VJP:
        return None
    kind = "custom_jvp" if name == CUSTOM_JVP else "custom_vjp"
    body = eqn.params.get("call_jaxpr")
    jaxpr = getattr(body, "jaxpr", body)
    info = getattr(getattr(jaxpr, "debug_info", None), "func_src_info", None)
    if not isinstance(info, str) or " at " not in info:
        return kind, None, None, None
    fn, _, where = info.partition(" at ")
    file, _, line = where.rpartition(":")
    return kind, fn, file or None, int(line) if line.isdigit() else None


# ---------------------------------------------------------------------------
# `jax.lax.map(f, xs, batch_size=B)` of an `f` whose `sow` was traced before `lax.map`'s
# vmap reached it: `f` is a `jax.jit` (`eqx.filter_jit`, `nnx.jit`) function, so the
# vmap batches the jit's program and the `sow`'s batching rule runs from JAX's
# `batch_jaxpr`, not from `sowviz.sow` (`lax_map_batching` above then says None).

_CONTROL_FLOW_DIR = os.path.join(_JAX_DIR, "_src", "lax", "control_flow") + os.sep


def lax_map_batching_of_traced() -> str | None:
    """As `lax_map_batching`, for a `sow` traced earlier (inside a jit) and batched now
    by `lax.map`'s vmap: the innermost `vmap` on the stack is `lax.map`'s and no loop or
    `cond` of JAX's is between it and the rule (their batching rules would add axes, or
    flags, of their own: such a `sow` is left as captured)."""
    frame = sys._getframe(2)  # the rule's caller
    while frame is not None and not (
        frame.f_code.co_filename.endswith(_VMAP_FILE) and frame.f_code.co_name == "vmap_f"
    ):
        if frame.f_code.co_filename.startswith(_CONTROL_FLOW_DIR) or (
            # (another vmap's rule binding the `sow` again: that vmap is the nearer one;
            # `sowviz.sow` itself: a vmap `lax_map_batching` did not recognise)
            frame.f_code.co_filename.endswith(_SOW_FILE) and frame.f_code.co_name != "bind"
        ):
            return None
        frame = frame.f_back
    if frame is None:
        return None
    return _lax_map_vmap(frame)


# --- library closures the user calls (jraph's `GraphNetwork(...)`, `GraphConvolution(...)`)


def handed_closure(code: Any, outer: Sequence[Any] = ()) -> str | None:
    """The maker of a library's private closure handed out to the user (`_handed_out_by`:
    jraph's `GraphNetwork(...)` returns `_ApplyGraphNet`), when `code` is one and its
    maker is not among the `outer` frames; else None. `_user_frames` takes such a
    closure's frame for a call of the user's, named by its maker: the equations of its
    own work and of the functions it calls back (the user's `update_edge_fn`, a Haiku
    MLP) are one stage, `GraphNetwork`, where Haiku's module scopes cut it in three."""
    if _is_user_code(code) or not _source_info.is_user_filename(code.co_filename):
        return None  # (JAX's own closures are JAX's work)
    if code.co_filename.startswith(_SOWVIZ_DIR + os.sep):
        return None
    return _handed_out_by(code, outer)


_called_as: dict[tuple[int, int], tuple[Any, str]] = {}


def called_as(code: Any, lasti: int) -> str:
    """The free variable the call at offset `lasti` of the closure `code` calls: the
    function its maker was given (`update_edge_fn(edges, sent, ...)` in jraph's
    `_ApplyGraphNet`), which names the user's function it calls back; "" for any other
    call (`tree.tree_map(...)`) or when the bytecode says nothing."""
    hit = _called_as.get((id(code), lasti))
    if hit is None:
        try:
            name = _called_free_variable(code, lasti)
        except Exception:  # unreadable bytecode: nothing said
            name = ""
        hit = _called_as[(id(code), lasti)] = (code, name)  # (keeps the code, its id, alive)
    return hit[1]


def _called_free_variable(code: Any, lasti: int) -> str:
    import dis

    ins = list(dis.get_instructions(code))
    # (a traceback's offset may point into the call's inline cache, after its `CALL`)
    at = next((i for i in reversed(ins) if i.offset <= lasti), None)
    if at is None or at.positions is None or at.positions.col_offset is None:
        return ""
    start = (at.positions.lineno, at.positions.col_offset)
    # the callable is loaded at the call expression's start: `update_edge_fn` in
    # `update_edge_fn(edges, ...)` (a method's `obj.f(...)` starts at `obj`: no name)
    for i in ins:
        if i.offset >= lasti:
            break
        pos = i.positions
        if (
            i.opname == "LOAD_DEREF"
            and pos is not None
            and (pos.lineno, pos.col_offset) == start
            and i.argval in code.co_freevars
        ):
            end = (pos.end_lineno, pos.end_col_offset)
            if end[0] == start[0] and end[1] == start[1] + len(i.argval):
                return i.argval
    return ""


def via_free_variable(qualname: str, caller: Any, lasti: int, inside: tuple[str, str]) -> str:
    """`qualname`, said as the free variable it was called as (`aggregate_nodes_fn:
    segment_sum`) when `caller`, the handed-out closure whose locals start `inside[0]` or
    a lambda in it, called it through one (`called_as`); a pass-through (Haiku's method
    wrapper, whose module names its own scope) is left as it is."""
    closure = inside[0][: -len(".<locals>.")]
    if caller.co_qualname != closure and not caller.co_qualname.startswith(inside[0]):
        return qualname
    via = called_as(caller, lasti)
    if not via or qualname.rsplit(".", 1)[-1] in ("wrapped", "wrapper") or "<" in qualname:
        return qualname
    name = qualname.rsplit(".<locals>.", 1)[-1]
    return f"{via}: {name}" if name != via else name


def defined_at(code: Any) -> SourceLocation | None:
    """Where the function of `code` is written: its first line (a decorator's, if any)."""
    if code is None:
        return None
    return SourceLocation(code.co_filename, code.co_firstlineno, code.co_qualname)


# ---------------------------------------------------------------------------
# The names `jax.named_call` wrappers push, by the code that called them.

import contextvars  # noqa: E402
import threading  # noqa: E402
import weakref  # noqa: E402

#: (code object calling a `jax.named_call` / `@jax.named_scope(...)` wrapper) -> the
#: scope names such calls pushed: what `named_call_sites` matches a wrapper frame of a
#: traceback by, when neither the wrapped function's name nor its call's line says the
#: name (`attn = jax.named_call(attention, name="attn")` called as `attn(w, x)`; a
#: decorated `feed_forward`'s `"mlp"`; `name=f"layer{i}"`). Facts about code, kept
#: across traces (one caller's names are the same each time). Weakly keyed: an entry
#: lives as long as its code does, so the names of a trace are there as long as its
#: jaxpr (whose tracebacks hold that code) can be read, and code that is gone
#: (`exec`'d, a reloaded module) takes its entry with it. (A size bound cleared
#: wholesale lost the names of the trace in progress when it struck mid-trace.)
_NAMED_BY_CALLER: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
#: Whether this context (thread, task) is tracing for sowviz: another thread's plain
#: JAX goes through the shared wrapper untouched and records nothing.
_recording_names: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "sowviz_recording_names", default=False
)
_swap_lock = threading.Lock()


class _Swap:
    """One JAX attribute (`owner.name`, a class's method or a module's function)
    swapped for a wrapper while anyone records, the original put back by the last to
    leave. Reference counted under a lock: threads and nested traces share one install.

    The original is kept here, not on the wrapper: another library may have wrapped
    sowviz's wrapper in turn while it was installed (its wrapper has no attribute of
    ours, or copies them with `functools.wraps`). Then the last to leave puts nothing
    back, which would drop that library's patch: ours stays inside its chain, made a
    pass-through (`live` false). A later install that finds such a dead wrapper of
    ours in place (the other library put back what it found) installs over the
    original it held, so the next leave restores JAX's own attribute."""

    def __init__(self, owner: Any, name: str, wrap: Any) -> None:
        self.owner, self.name, self.wrap = owner, name, wrap  # wrap(raw, live) -> wrapper
        self.users = 0
        self.original: Any = None  # what was in `vars(owner)` before the install
        self.installed: Any = None  # the wrapper put there
        self.live: list[bool] = [False]  # the installed wrapper's switch
        #: dead wrappers of ours -> the original each wraps (by identity: another
        #: library's `functools.wraps` copies attributes, not identity)
        self.dead: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def enter(self) -> None:
        with _swap_lock:
            if self.users == 0:
                raw = vars(self.owner)[self.name]
                while raw in self.dead:  # (put back by a library that had wrapped it)
                    raw = self.dead[raw]
                live = [True]
                wrapper = self.wrap(raw, live)
                setattr(self.owner, self.name, wrapper)
                self.original, self.installed, self.live = raw, wrapper, live
            self.users += 1

    def leave(self) -> None:
        with _swap_lock:
            self.users -= 1
            if self.users:
                return
            if vars(self.owner).get(self.name) is self.installed:
                setattr(self.owner, self.name, self.original)
            self.live[0] = False  # (if still in another library's chain: passes through)
            self.dead[self.installed] = self.original
            self.original = self.installed = None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.leave()


def _wrapper_code() -> Any:
    """The code of JAX's wrapper that a `named_call` runs its function in (JAX 0.10 to
    0.12: `source_info_util.ExtendNameStackContextManager.__call__`'s `wrapper`)."""
    return _source_info.extend_name_stack("_")(lambda: None).__code__


_NAMED_CALL_WRAPPER = _wrapper_code()


def _recording_enter(raw: Any, live: list[bool]) -> Any:
    """`ExtendNameStackContextManager.__enter__` that notes, when this context records
    and JAX's `named_call` wrapper called it, the name it pushes by the wrapper's caller."""

    @functools.wraps(raw)
    def __enter__(self: Any) -> Any:
        if live[0] and _recording_names.get():
            frame = sys._getframe(1)
            if frame.f_code is _NAMED_CALL_WRAPPER and frame.f_back is not None:
                _NAMED_BY_CALLER.setdefault(frame.f_back.f_code, set()).add(self.name)
        return raw(self)

    return __enter__


_NAMED_CALLS = _Swap(_source_info.ExtendNameStackContextManager, "__enter__", _recording_enter)


@contextlib.contextmanager
def recording_named_calls() -> Iterator[None]:
    """While open (in this context), each scope a `jax.named_call` wrapper pushes is
    recorded with the code that called the wrapper (`_NAMED_BY_CALLER`). The wrapper
    is installed while anyone records (`_Swap`)."""
    token = _recording_names.set(True)
    try:
        with _NAMED_CALLS.held():
            yield
    finally:
        _recording_names.reset(token)


def named_call_names(code: Any) -> frozenset[str]:
    """The scope names the `jax.named_call` wrappers called from `code` pushed."""
    return frozenset(_NAMED_BY_CALLER.get(code, ()))


def user_call_site(frame: Any, *, direct: bool = False) -> SourceLocation | None:
    """The line of the user's code that `frame` (a live frame) or a frame outside it is
    at: where a library's hook, called from there, was called (`dist.Normal(mu, tau)`
    in the model, past sowviz's own frames). `direct`: `frame` itself or None."""
    while frame is not None and not _is_user_code(frame.f_code):
        frame = None if direct else frame.f_back
    return None if frame is None else _location(frame.f_code, frame.f_lasti)


# ---------------------------------------------------------------------------
# The parameters a `jax.vmap`ped function of the user's was given its values as.

from jax._src import api as _api  # noqa: E402

_vmap_params: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "sowviz_vmap_params", default=None
)


def _noting_vmap_params(raw: Any, live: list[bool]) -> Any:
    """`api.debug_info` that, when this context records, notes a `vmap`'s parameters."""

    @functools.wraps(raw)
    def debug_info(traced_for: str, fun: Any, args: Any, kwargs: Any, *a: Any, **k: Any):
        into = _vmap_params.get()
        if live[0] and into is not None and traced_for == "vmap":
            _note_vmap_params(into, fun, args, kwargs)
        return raw(traced_for, fun, args, kwargs, *a, **k)

    return debug_info


_VMAP_PARAMS = _Swap(_api, "debug_info", _noting_vmap_params)


@contextlib.contextmanager
def recording_vmap_params() -> Iterator[dict[tuple[int, Var], str]]:
    """While open (in this context), each `jax.vmap`ped call records, per traced leaf
    of its arguments, the parameter of the user's function it was passed as, by the id
    of the function's code and the leaf's jaxpr variable: `(id(loss.__code__), x) ->
    "x"`. The function's stage names its ports by them, as a `jit`'s body names its
    operands. JAX 0.10-0.12's `vmap` asks `api.debug_info("vmap", fun, args, kwargs)`
    with the arguments as given (the variables outside), whichever way the user reached
    `vmap` (`jax.vmap`, `from jax import vmap`, Equinox's `filter_vmap`). The wrapper
    is installed while anyone records (`_Swap`)."""
    found: dict[tuple[int, Var], str] = {}
    token = _vmap_params.set(found)
    try:
        with _VMAP_PARAMS.held():
            yield found
    finally:
        _vmap_params.reset(token)


def _note_vmap_params(into: dict, fun: Any, args: Any, kwargs: Any) -> None:
    """`recording_vmap_params`' record of one call of the user's `fun` (through
    `jax.grad`'s and `functools.partial`'s wrappers) with `args` and `kwargs`."""
    inner = fun
    while isinstance(inner, functools.partial):
        inner = inner.func
    inner = inspect.unwrap(inner)
    code = getattr(inner, "__code__", None)
    if code is None or not _is_user_code(code):
        return
    try:
        given = inspect.signature(fun).bind(*args, **kwargs).arguments
    except (TypeError, ValueError):  # (no signature, or a call Python refuses)
        return
    for name, value in given.items():
        for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
            var = traced_var(leaf)
            if var is not None:
                into.setdefault((id(code), var), name + jax.tree_util.keystr(path))


# An error raised by sowviz's own code (a refused overwrite, a bad argument) is marked
# so by `own_errors_marked`; `api_boundary` then takes JAX's note off it.
_OWN_ERROR = "_sowviz_raised"
_JAX_NOTE = "--------------------\n" + getattr(_traceback_util, "_simplified_tb_msg", "")


def own_errors_marked(fn: Any) -> Any:
    """`fn`, marking an error whose innermost frame is sowviz's (raised by sowviz, not
    by the user's function or by JAX) for `api_boundary`. JAX's boundary, which sowviz's
    entries pass through, ends every error it filters with "For simplicity, JAX has
    removed its internal frames ..." (or chains a `jax.errors.UnfilteredStackTrace` under
    `JAX_TRACEBACK_FILTERING=remove_frames`): on `save_html`'s refusal to overwrite a
    file it made sowviz's `FileExistsError` read as a JAX error. Costs a call frame
    (sowviz's, hidden from tracebacks) when nothing is raised."""

    @functools.wraps(fn)
    def marked(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # read by IPython and pytest
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            tb = err.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            if tb is not None and _is_sowviz_file(tb.tb_frame.f_code.co_filename):
                try:
                    setattr(err, _OWN_ERROR, True)
                except (AttributeError, TypeError):  # an error class with __slots__
                    pass
            raise

    return marked


def _is_sowviz_file(filename: str) -> bool:
    return filename.startswith(_SOWVIZ_DIR + os.sep)


def without_jax_note(err: BaseException) -> None:
    """Take off `err` what JAX's boundary added to it: its note, or (mode
    `remove_frames`) the `UnfilteredStackTrace` it put in as the cause, whose own cause
    and context are the error's."""
    notes = getattr(err, "__notes__", None)
    if notes and _JAX_NOTE in notes:
        kept = [n for n in notes if n != _JAX_NOTE]
        if kept:
            err.__notes__ = kept
        else:
            del err.__notes__
    cause = err.__cause__
    if isinstance(cause, _traceback_util.UnfilteredStackTrace):
        err.__cause__ = cause.__cause__
        err.__context__ = cause.__context__
        err.__suppress_context__ = cause.__suppress_context__
