"""The `sow` primitive: an identity that marks values for capture.

One primitive carries every leaf of a sown pytree. Its parameters say what the
value is (`name`, `tag`) and which derivative it is (`mode`, a tuple of roles,
one per differentiation level that reached it, innermost first):

* the JVP rule keeps the primal's roles + ``P`` and gives the tangent roles + ``T``;
* the transpose rule turns the last ``T`` into ``C``: the cotangent at that point;
* the batching rule moves the batch axis to the front and keeps the roles; it adds
  the vmap to `vmapped` (outermost first): "lax.map:chunks" / "lax.map:rest" for the
  vmaps `jax.lax.map(..., batch_size=B)` applies to `f` (`_compat.lax_map_batching`),
  whose rows the capture puts back in `xs` order (`mapped.py`), "vmap" for any other.

Symbolic zeros pass through untouched: JVP and transpose bind only the leaves
whose tangent / cotangent is a real array, return JAX's symbolic `Zero` for the
others (so a `custom_vjp(..., symbolic_zeros=True)` or a Tesseract downstream
still sees a symbolic zero), and list those leaves in the `zeros` parameter as
`(leaf, shape, dtype, untangent)`; the capture fills them with zeros for the user.
`untangent` marks a leaf whose *tangent* was the symbolic zero: no tangent reached the
value (it is no function of what is differentiated, or `inspect` probed it through
a `stop_gradient`, its every use carrying none: `_liveness`), so its cotangent was
never computed. The zeros filled in for it are no gradient: sowviz's own stage
probes leave it out, as they do for a stage all of whose values are such. Under
`vmap` the batching rule adds the batch axis to those shapes.

`mode_key` renders roles as the capture key users see: trailing ``P`` dropped,
``()`` is ``"primal"``, ``("C", "T")`` is ``"cotangent.tangent"`` (the tangent of
a cotangent, as under `jax.hessian`).

The primitive carries an unordered effect (see `_compat.CaptureEffect`) so no
dead-code elimination or partial evaluation inside `jit`, `scan` or `remat` can
drop a tagged value that nothing downstream uses.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat

Roles = tuple[str, ...]
_ROLE_NAMES = {"P": "primal", "T": "tangent", "C": "cotangent"}


class _SowPrimitive(_compat.Primitive):
    """The `sow` primitive, whose result is what the program reads on: after a sow of
    roles `()`, later reads of its operand read its result, as though the program had
    written `h = sow(h, "h")`. A sow written as a statement (`sowviz.sow(h, "h")`, as
    Flax users write `self.sow(...)`) is then on the data flow, and its cotangent is
    dL/dh, not the zeros of a copy nothing reads. Redirected as `sow` is bound: the
    tracers the user holds, and those JAX gives a `jit`, `scan` or `checkpoint` body's
    equations when it evaluates the body to differentiate it
    (`_compat.read_on_through`). Not the binds of sow's own JVP, transpose (roles `P`,
    `T`, `C`): the other readers of their operands are JAX's derivative rules. Reads
    made before the sow keep reading the operand; `READ_BEFORE_SOWN` notes them."""

    def bind(self, *args: Any, **params: Any) -> Any:
        users = not str(params.get("tag")).startswith(RESERVED_TAG_PREFIX)  # (not probes)
        if not params.get("mode") and users and any(map(_compat.read_already, args)):
            READ_BEFORE_SOWN.add(params["index"])
        outs = super().bind(*args, **params)
        if not params.get("mode"):
            for arg, out in zip(args, outs, strict=True):
                _compat.read_on_through(arg, out)
        return outs


sow_p = _SowPrimitive("sow")
sow_p.multiple_results = True


def _impl(*xs: Any, **_: Any) -> tuple[Any, ...]:
    return xs


def _abstract_eval(*avals: Any, **_: Any):
    return avals, ({_compat.capture_effect} if _compat.capturing.value else set())


#: (leaf index, shape, dtype, untangent) of a symbolic zero (see the module docstring)
ZeroLeaf = tuple[int, tuple[int, ...], Any, bool]


def _split_zeros(xs, leaves, untangent: bool = False) -> tuple[list[int], tuple[ZeroLeaf, ...]]:
    """Positions of the real arrays in `xs`, and the symbolic zeros as ZeroLeafs.

    Integer and bool leaves have float0 tangents: nothing to observe there, so
    they are neither carried nor recorded as zeros (the capture gives None)."""
    keep: list[int] = []
    zeros: list[ZeroLeaf] = []
    for i, x in enumerate(xs):
        aval = x.aval if _compat.is_symbolic_zero(x) else None
        dtype = aval.dtype if aval is not None else x.dtype
        if dtype == jax.dtypes.float0:
            continue
        if aval is None:
            keep.append(i)
        else:
            zeros.append((leaves[i], tuple(aval.shape), dtype, untangent))
    return keep, tuple(zeros)


def _bind_part(xs, keep, leaves, zeros, **params) -> list:
    """Bind `sow` on the real arrays `xs[keep]`; symbolic zeros stay as they are."""
    out = list(xs)
    if not keep and not (zeros and _compat.capturing.value):
        return out
    # With only zeros, the operand-less sow exists to tell the capture about them.
    kept = sow_p.bind(
        *(xs[i] for i in keep), leaves=tuple(leaves[i] for i in keep), zeros=zeros, **params
    )
    for i, x in zip(keep, kept, strict=True):
        out[i] = x
    return out


def _jvp(primals, tangents, *, mode, leaves, zeros, evaluation=0, **params):
    # The first JVP to reach this bind numbers the evaluation its primal and tangent
    # (and so the cotangent, which transpose keeps it for) belong to; an outer one
    # keeps it. A traced `sow` a library evaluates again for its derivatives (a
    # `custom_vjp`'s backward rule re-running `jax.vjp` of the function) gets a number
    # of its own there, so `api` never pairs its cotangent with another evaluation's
    # primal.
    evaluation = evaluation or _next_index()
    outs = sow_p.bind(
        *primals, mode=(*mode, "P"), leaves=leaves, zeros=zeros, evaluation=evaluation, **params
    )
    keep, new_zeros = _split_zeros(tangents, leaves, untangent=True)
    if not keep:
        # No leaf is perturbed: JAX itself skips the JVP of such values, so no
        # tangent is recorded (as for a sow of `lax.stop_gradient(x)`).
        return outs, list(tangents)
    tans = _bind_part(
        tangents,
        keep,
        leaves,
        zeros + new_zeros,
        mode=(*mode, "T"),
        evaluation=evaluation,
        **params,
    )
    return outs, tans


#: The `sow` calls (their `index`) whose value the program read before sowing it, as
#: their JVP saw (`_compat.read_already`): reads that bypass the sow. A cotangent that
#: is all zeros there is no gradient of the value (`api.read_before_sown` warns).
READ_BEFORE_SOWN: set[int] = set()


def _transpose(
    cts, *operands, name, tag, mode, treedef, leaves, zeros, index, vmapped, evaluation=0
):
    del operands
    if "T" not in mode:  # a primal sow is not linear; JAX never asks for this
        raise ValueError(f"sow {name!r}: transpose of a non-tangent value (roles {mode})")
    last = len(mode) - 1 - mode[::-1].index("T")
    ct_mode = (*mode[:last], "C", *mode[last + 1 :])
    keep, new_zeros = _split_zeros(cts, leaves)
    return _bind_part(
        cts,
        keep,
        leaves,
        zeros + new_zeros,
        name=name,
        tag=tag,
        mode=ct_mode,
        treedef=treedef,
        index=index,
        vmapped=vmapped,
        evaluation=evaluation,
    )


def _batch(args, dims, *, zeros, vmapped, **params):
    moved = [
        a if d is _compat.not_mapped else jnp.moveaxis(a, d, 0)
        for a, d in zip(args, dims, strict=True)
    ]
    out_dims = [_compat.not_mapped if d is _compat.not_mapped else 0 for d in dims]
    sizes = {a.shape[d] for a, d in zip(args, dims, strict=True) if d is not _compat.not_mapped}
    if sizes:  # the zeros are batched like the arrays they stand beside
        (size,) = sizes
        zeros = tuple((i, (size, *shape), dtype, u) for i, shape, dtype, u in zeros)
        label = _compat.lax_map_batching() or _compat.lax_map_batching_of_traced()
        vmapped = (label or "vmap", *vmapped)
    return sow_p.bind(*moved, zeros=zeros, vmapped=vmapped, **params), out_dims


def _lower(ctx, *xs, **_):
    return xs


def _partial_eval_custom(saveable, unks_in, inst_in, eqn):
    """JAX's default partial evaluation of an equation (`partial_eval_jaxpr_custom`), but
    for a capturing (effectful) sow of known values under a policy that recomputes
    (`jax.checkpoint`'s default): its values leave the forward pass as residuals.

    JAX keeps an effectful equation in the forward pass only and says its outputs are
    *not* available to the backward one, trusting each later reader there to ask for
    them as residuals. `jax.debug.callback`'s (and `debug.print`'s) rule does not ask:
    it stages itself beside recomputed values, so a callback reading a probed value
    inside a `checkpoint` read a variable nothing defined (`KeyError: Var(...)` in mode
    all's transpose). Recomputing the sow in the backward pass instead would capture it
    twice. Residuals nobody reads are dropped by `remat`'s own dead-code elimination."""
    n = len(eqn.outvars)
    if any(unks_in):  # staged, as JAX stages any equation with an unknown input
        res = [v for v, inst in zip(eqn.invars, inst_in, strict=True) if not inst]
        return None, eqn, [True] * n, [True] * n, [v for v in res if isinstance(v, _compat.Var)]
    if not _compat.remat_recomputes(saveable, eqn):
        return eqn, None, [False] * n, [False] * n, []
    if eqn.effects:  # a capturing sow: known, its values handed on as residuals
        return eqn, None, [False] * n, [True] * n, list(eqn.outvars)
    # not capturing: an identity recomputed, as JAX recomputes any pure equation
    res = [v for v, inst in zip(eqn.invars, inst_in, strict=True) if not inst]
    return eqn, eqn, [False] * n, [True] * n, [v for v in res if isinstance(v, _compat.Var)]


sow_p.def_impl(_impl)
sow_p.def_effectful_abstract_eval(_abstract_eval)
_compat.ad.primitive_jvps[sow_p] = _jvp
_compat.ad.primitive_transposes[sow_p] = _transpose
_compat.batching.primitive_batchers[sow_p] = _batch
_compat.mlir.register_lowering(sow_p, _lower)
_compat.register_partial_eval_custom(sow_p, _partial_eval_custom)


def mode_key(roles: Roles) -> str:
    """Render derivative roles as a capture key: ``("C", "T")`` → ``"cotangent.tangent"``."""
    trimmed = list(roles)
    while trimmed and trimmed[-1] == "P":
        trimmed.pop()
    if not trimmed:
        return "primal"
    return ".".join(_ROLE_NAMES[r] for r in trimmed)


# Tags sowviz uses itself (inspect's stage probes are "sowviz.stage"): a user's
# sow or capture under one of them would mix with the engine's own values.
RESERVED_TAG_PREFIX = "sowviz."

RESERVED_TAG = (
    "{where}: the tag {tag!r} is reserved: tags starting with 'sowviz.' are sowviz's "
    "own (inspect's stage probes use 'sowviz.stage'), and values sown under them would "
    "mix with the engine's. Pick another `tag`, e.g. 'intermediates' or 'acts'."
)


def check_user_tag(tag: Any, where: str, many: bool = False) -> None:
    """Refuse a user's `tag` (a string, or with `many` a tuple, list or set of them) of
    another type (`tag=3` failed as "'int' object is not iterable"), or in sowviz's
    own namespace."""
    if isinstance(tag, str):
        tags: tuple = (tag,)
    elif many and isinstance(tag, (tuple, list, set, frozenset)):
        tags = tuple(tag)  # (each a string: `capture.api._check_options` says so)
    else:
        raise TypeError(
            f"{where}: `tag` must be a non-empty string"
            + (" (or a tuple of them, to collect several tags)" if many else "")
            + f", got {tag!r} ({type(tag).__name__}). Pass e.g. tag='intermediates' "
            "(the default) or tag='acts'."
        )
    for t in tags:
        if isinstance(t, str) and t.startswith(RESERVED_TAG_PREFIX):
            raise ValueError(RESERVED_TAG.format(where=where, tag=t))


def _check_str(value: Any, what: str) -> None:
    if not isinstance(value, str) or not value:
        raise TypeError(
            f"sowviz.sow: `{what}` must be a non-empty string, got {value!r} "
            f"({type(value).__name__}). Pass a name such as sow(x, 'layer_1')."
        )


def _as_array(leaf: Any, name: str) -> Any:
    if isinstance(leaf, (jax.Array, np.ndarray, np.generic)) or hasattr(leaf, "aval"):
        return leaf
    if isinstance(leaf, (bool, int, float, complex)):
        return jnp.asarray(leaf)
    raise TypeError(
        f"sowviz.sow({name!r}): leaf of type {type(leaf).__name__} is not an array. "
        "Only arrays and numbers can be sown; sow the array fields of your object instead."
    )


def sow(value: Any, name: str, *, tag: str = "intermediates") -> Any:
    """Tag `value` (any pytree of arrays) for capture and return it unchanged."""
    _check_str(name, "name")
    _check_str(tag, "tag")
    leaves, treedef = jax.tree_util.tree_flatten(value)
    if not leaves:
        return value
    arrays = [_as_array(leaf, name) for leaf in leaves]
    seen = getattr(_SEEN, "names", None)
    if seen is not None:
        seen.add((tag, name))
        client = _compat.tesseract_tracing()
        if client is not None:  # never reaches the program: `capture.api.INSIDE_TESSERACT`
            seen.inside[(tag, name)] = client
    outs = sow_p.bind(
        *arrays,
        name=name,
        tag=tag,
        mode=(),
        treedef=treedef,
        leaves=tuple(range(len(arrays))),
        zeros=(),
        index=_next_index(),
        vmapped=(),
        evaluation=0,  # not differentiated (yet): `_jvp` numbers it
    )
    _compat.sow_traced()
    return jax.tree_util.tree_unflatten(treedef, outs)


#: The (tag, name) of every `sow` called while `sows_called` is open on this thread.
_SEEN = threading.local()


class _Called(set):
    """`sows_called`'s set; `.inside` maps those called inside a Tesseract's own
    program (`_compat.tesseract_tracing`) to its tesseract-jax client."""

    def __init__(self) -> None:
        super().__init__()
        self.inside: dict[tuple[str, str], Any] = {}


@contextlib.contextmanager
def sows_called() -> Iterator[set]:
    """The (tag, name) pairs of the `sow` calls Python makes while tracing. A sow inside
    a `custom_vjp` function whose rule does not call it is traced by Python but never
    reaches the program; comparing this set with what was captured finds it. A nested
    block keeps its calls to itself (sowviz's own template sow, an inner capture)."""
    outer = getattr(_SEEN, "names", None)
    _SEEN.names = names = _Called()
    try:
        yield names
    finally:
        _SEEN.names = outer


# Each `sow` call gets a serial number so two calls with one name stay distinct
# through every transformation (duplicates are then detected, not merged).
_counter = [0]


def _next_index() -> int:
    _counter[0] += 1
    return _counter[0]
