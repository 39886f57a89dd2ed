"""Apply an inspection mode to the traced program's flat array inputs.

`inspect`, `show` and `Monitor` take the user's plain `fn` and differentiate it
themselves, so automatic stage probes (inserted before this step) see tangents
and cotangents too. Only floating-point array leaves are differentiated (of a
Flax NNX model, its `nnx.Param`s: `Layout.floating`); integer/bool arrays
(labels, indices), static leaves and NNX state are closed over, so no `float0`
ever meets a transpose.

Results (`transform`):

* primal: `fn(*args)`
* grad: `(value, grads)` as `jax.value_and_grad(fn, argnums)`; `grads` has the
  structure of the selected argument(s) with `None` where a leaf is not a
  floating-point array (static leaves, integer/bool arrays) — what
  `equinox.filter_grad` gives, and exactly `jax.grad`'s result wherever
  `jax.grad` accepts the arguments.
* jvp: `(value, tangent_out)` along `tangents` (a tuple with one tangent per
  argument; default: a fixed-seed standard-normal direction for every floating leaf)
* vjp: `(value, input_cotangents)`: a tuple with one tree per argument (None at
  non-floating leaves), pulled back from `cotangents` (default: ones)
* all: `(value, tangent_out, input_cotangents)` from one linearization

`argnums` picks the differentiated arguments: argument 0 by default in grad (as
`jax.grad`), every argument by default in jvp, vjp and all (as `jax.jvp` and
`jax.vjp`). Given there, only those arguments get tangents (the others none:
`None` or zeros in `tangents`), and their cotangents come back as grad's do (one
tree for an int, a tuple for a tuple).
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _compat
from ._args import ARRAY_TYPES
from ._model import Mode

if TYPE_CHECKING:
    from ._program import Layout

_NO_FLOAT = (
    "sowviz: `argnums`={argnums!r} selects argument {i}, which has no floating-point array "
    "leaves to differentiate (its leaves: {kinds}). Pass the parameters as arrays "
    "(jnp.asarray(...)), or choose another `argnums`."
)
_NO_FLOAT_OBJECT = (
    "sowviz: `argnums`={argnums!r} selects argument {i}, whose `{name}` object JAX cannot "
    "see into: `{name}` is not a pytree, so JAX takes the whole object as one opaque leaf, "
    "and the arrays in its attributes are no inputs to differentiate (`jax.grad` refuses "
    "it too). Make the class a pytree: subclass `equinox.Module` or `flax.nnx.Module`, "
    "decorate it with `@jax.tree_util.register_pytree_node_class` (with `tree_flatten` "
    "and `tree_unflatten` methods) or, for a dataclass, register it with "
    "`jax.tree_util.register_dataclass`; or pass its arrays (a dict of them) as the "
    "argument. Or choose another `argnums`."
)
_NO_FLOAT_FUNCTION = (
    "sowviz: `argnums`={argnums!r} selects argument {i}, which is a function (`{name}`): "
    "a function is not a differentiable input; JAX differentiates arrays and pytrees of "
    "them. Pass the arrays to differentiate as that argument (`fn(params, x)`) and call "
    "the function inside `fn` (or close over it), or choose another `argnums`."
)
_COTANGENTS = (
    "sowviz: `cotangents` must have the structure and shapes of the function's output "
    "({want}); got {got}. Pass e.g. cotangents=jax.tree.map(jnp.ones_like, fn(*args)), "
    "or leave it out for ones."
)


def _no_float(argnums: Any, i: int, layout: Layout) -> str:
    """Why argument `i` has nothing to differentiate, and the fix: a plain class's
    object or a function hides no float arrays JAX could see, so "pass arrays" would
    be the wrong advice for them."""
    what, name = layout.opaque(i)
    if what == "object":
        return _NO_FLOAT_OBJECT.format(argnums=argnums, i=i, name=name)
    if what == "function":
        return _NO_FLOAT_FUNCTION.format(argnums=argnums, i=i, name=name)
    return _NO_FLOAT.format(argnums=argnums, i=i, kinds=layout.describe_arg(i))


_NO_FLOAT_ANY = (
    "sowviz: mode '{mode}' differentiates every argument (`argnums` not given), and none "
    "has a floating-point array leaf to differentiate ({kinds}): its tangent would be "
    "zero and its gradients None. Pass the parameters as arrays (jnp.asarray(...)), "
    "or use mode='primal' to see the values alone."
)


def _no_float_any(mode: Mode, layout: Layout) -> str:
    """Why modes jvp, vjp and all have nothing to differentiate in any argument (as
    grad's `_no_float` says of its one), and the fix; a plain class's object or a
    function in argument i gets `_no_float`'s advice for it."""
    for i in range(layout.n_args):
        if layout.opaque(i)[0]:
            return _no_float(i, i, layout).replace(
                f"`argnums`={i!r} selects argument {i}",
                f"mode '{mode.value}' differentiates every argument; argument {i}",
                1,
            )
    kinds = "; ".join(f"argument {i}: {layout.describe_arg(i)}" for i in range(layout.n_args))
    return _NO_FLOAT_ANY.format(mode=mode.value, kinds=kinds or "no arguments")


def _is_float(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


_NOT_SCALAR = (
    "Gradient only defined for scalar-output functions. Output {what}. sowviz's mode "
    "'grad' differentiates a real scalar loss (as `jax.grad` does); for a function with "
    "other outputs use mode='vjp' (ones as cotangents, or your `cotangents=`), 'jvp' or "
    "'primal'."
)


_PAIR = (
    " It returned a pair: if that is `(loss, aux)`, pass `has_aux=True`, as to "
    "`jax.value_and_grad`; if `fn` is already `jax.value_and_grad(loss)`, pass `loss` "
    "itself (mode 'grad' takes its value and gradients)."
)
_NONE = (
    "was None: `fn` returned None, or a value that is not a JAX array (a string, a "
    "Python object), which sowviz, as `jax.jit`, passes through as a constant"
)


_REFS_ALL = (
    "sowviz: mode='all' takes one linearization of `fn` and transposes it, and `fn` makes "
    "or writes a mutable array (`jax.new_ref`): JAX cannot transpose such a "
    "linearization (`jax.linear_transpose` of `jax.linearize(fn)` fails the same way). "
    "Use mode='grad' or 'vjp' (cotangents) and mode='jvp' (tangents) one at a time."
)


def _check_scalar(y: Any) -> None:
    """`jax.grad`'s checks of the value (its first sentence, then what to do instead)."""
    if not isinstance(y, (*ARRAY_TYPES, float, int)):
        msg = _NOT_SCALAR.format(what=_NONE if y is None else f"was {y}")
        if isinstance(y, (tuple, list)) and len(y) == 2:
            msg += _PAIR
        raise TypeError(msg)
    if jnp.shape(y) != ():
        raise TypeError(_NOT_SCALAR.format(what=f"had shape: {jnp.shape(y)}"))
    dtype = jnp.result_type(y)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            "grad requires real-valued outputs (output dtype that is a sub-dtype of "
            f"np.floating), but got {dtype.name}. Return a real floating-point loss, or "
            "use mode='vjp' (complex or integer outputs) or 'primal'."
        )


def _seed_like(y: Any) -> Any:
    """Ones for floating outputs, placed like them (`_placed_seed`); float0 zeros for
    integer/bool outputs."""
    return jax.tree_util.tree_map(
        lambda v: (
            _placed_seed(jnp.ones_like(v), v, "cotangent", "output")
            if _is_float(v)
            else np.zeros(jnp.shape(v), jax.dtypes.float0)
        ),
        y,
    )


_SEED_PLACEMENT = (
    "sowviz: the {kind} of {what} `{path}` ({got}) could not be placed like that "
    "{primal} ({want}), which a `shard_map` splitting it needs: {err}. Pass a {kind} "
    "placed like it, e.g. `jax.reshard(c, jax.typeof(v).sharding)` or "
    "`jnp.ones_like(v)`."
)


def _placed_seed(seed: Any, like: Any, kind: str, what: str, path: str = "") -> Any:
    """`seed` (a tangent or cotangent) placed like its primal `like` on an Explicit mesh
    (`_compat.explicitly_placed_like`), as `jax.jvp` and `jax.vjp` of a jitted `fn`
    take it: a replicated seed (`jnp.ones(y.shape)`, a NumPy array, sowviz's default
    ones) met a `shard_map` whose specs split that value, which refused it with an
    error about the user's `in_specs`. A ValueError naming the seed if it cannot be."""
    try:
        return _compat.explicitly_placed_like(seed, like)
    except (ValueError, TypeError) as err:
        raise ValueError(
            _SEED_PLACEMENT.format(
                kind=kind,
                what=what,
                path=path or what,
                got=getattr(jax.typeof(seed), "sharding", None),
                want=jax.typeof(like).sharding,
                primal="argument" if kind == "tangent" else "output",
                err=err,
            )
        ) from err


def _user_seed(ct: Any, y: Any) -> Any:
    want = jax.tree_util.tree_structure(y)
    got = jax.tree_util.tree_structure(ct)

    def shapes(t):
        return [tuple(jnp.shape(v)) for v in jax.tree_util.tree_leaves(t)]

    if got != want or shapes(ct) != shapes(y):
        raise ValueError(_COTANGENTS.format(want=f"{want} {shapes(y)}", got=f"{got} {shapes(ct)}"))
    for (path, c), v in zip(
        jax.tree_util.tree_leaves_with_path(ct), jax.tree_util.tree_leaves(y), strict=True
    ):
        _check_seed_dtype(jax.tree_util.keystr(path), c, v)
    return jax.tree_util.tree_map_with_path(
        lambda path, c, v: (
            _placed_seed(
                jnp.asarray(c, jnp.result_type(v)),
                v,
                "cotangent",
                "output leaf",
                jax.tree_util.keystr(path),
            )
            if _is_float(v)
            else np.zeros(jnp.shape(v), jax.dtypes.float0)
        ),
        ct,
        y,
    )


def _check_seed_dtype(path: str, c: Any, v: Any) -> None:
    """A ValueError for a cotangent that casting to its output's dtype would change in
    kind: an integer or boolean one for a floating-point output, a complex one for a
    real output (its imaginary part dropped). `jax.vjp`'s pullback refuses them too."""
    if not _is_float(v):
        return
    got, want = jnp.result_type(c), jnp.result_type(v)
    drops_imaginary = jnp.issubdtype(got, jnp.complexfloating) and not jnp.issubdtype(
        want, jnp.complexfloating
    )
    if jnp.issubdtype(got, jnp.inexact) and not drops_imaginary:
        return  # another float width: cast, as `jax.vjp` takes NumPy's float64
    why = (
        "a real output's cotangent must be real (its imaginary part would be dropped)"
        if drops_imaginary
        else "a floating-point output's cotangent must be floating point too"
    )
    raise ValueError(
        f"sowviz: the cotangent of output leaf `{path or 'output'}` is {got}, but that "
        f"output is {want}: {why} (`jax.vjp`'s pullback refuses it as well). Pass e.g. "
        f"`jnp.ones_like(out)` or `c.astype(jnp.{want})`."
    )


def default_tangents(layout: Layout, dyn: list, seed: int = 0) -> tuple[Any, ...]:
    """A fixed-seed standard-normal direction for every floating leaf, keyed by its
    pytree path (so it does not depend on the other leaves): `normal_draws` of the
    key ``crc32(path) ^ seed``, in float32, then in the leaf's dtype.

    Call it outside the program and pass the result in as tangents (`tangent_inputs`):
    generated inside, each leaf's tangent is a kernel of its own (its key, or its
    slice of a stacked draw, differs), and XLA:CPU compiles each one (a 250-leaf
    program's JVP: 64 s with `jax.random`, 9 s with slices; 1.6 s as inputs). Here it
    is drawn in NumPy for small kinds of leaf (`HOST_DRAW_MAX`), else by one compiled
    draw per kind (shape and dtype), keys as an argument."""
    kinds: dict[tuple, list[int]] = {}
    for n, j in enumerate(layout.floating):
        kinds.setdefault((jnp.shape(dyn[j]), np.dtype(jnp.result_type(dyn[j]))), []).append(n)
    out: list[Any] = [None] * len(layout.floating)
    for (shape, dtype), members in kinds.items():
        keys = np.array(
            [zlib.crc32(layout.paths[layout.floating[n]].encode()) ^ seed for n in members],
            np.uint32,
        )
        host = len(keys) * math.prod(shape) <= HOST_DRAW_MAX
        draws = (
            _host_draws(tuple(keys.tolist()), shape, dtype)
            if host
            else _draws(keys, shape, dtype, jnp)
        )
        for n, t in zip(members, list(draws), strict=True):
            x = dyn[layout.floating[n]]
            # placed like its primal, as a tangent made inside the program would be; an
            # uncommitted primal (`jax.random.normal(...)` beside a batch sharded over 8
            # devices) goes where jit puts it, and so does its tangent: pinned to the
            # primal's one device, `jit` would refuse the two placements.
            sharding = None if isinstance(x, jax.core.Tracer) else getattr(x, "sharding", None)
            if sharding is None or not getattr(x, "committed", True):
                out[n] = jnp.asarray(t) if host else t
            else:
                out[n] = (
                    t if sharding == getattr(t, "sharding", None) else jax.device_put(t, sharding)
                )
    return tuple(out)


def tangent_inputs(
    mode: Mode | str, user: tuple | None, layout_of: Callable[[], Layout], dyn: list
) -> tuple | None:
    """The tangents a program of `mode` takes as its input: the user's, else (modes that
    push tangents: jvp, all) `default_tangents` of the `layout_of()` layout, else None
    (`layout_of` is only called then: a lookup that a hot path should not pay)."""
    if user is not None or Mode(mode) not in (Mode.JVP, Mode.ALL):
        return user
    return default_tangents(layout_of(), dyn)


def _mix(x: Any) -> Any:
    """An avalanching uint32 hash (C. Wellons' "lowbias32")."""
    x = x ^ (x >> 16)
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> 16)


def normal_draws(keys: Any, shape: tuple[int, ...], dtype: Any, xp: Any = jnp) -> Any:
    """Standard-normal values of `shape` per uint32 key, stacked (counter-based and
    cheap to compile: a hash and Box-Muller, not threefry, which XLA:CPU takes ~1.8 s
    to compile). Element c of key k uses the uniforms ``u(2c)`` and ``u(2c + 1)``,
    ``u(i) = ((mix(mix(i) ^ mix(k)) >> 8) + 0.5) * 2**-24``:
    ``z = sqrt(-2 log u(2c)) * cos(2 pi u(2c + 1))``. A complex dtype takes two such
    values per element, ``(a + ib) / sqrt(2)`` (unit variance, as `jax.random.normal`).
    `xp` is `jax.numpy` (jittable) or `numpy` (on the host, no compile): the same
    arithmetic in float32, equal to a few ulps (their log and cos round differently)."""
    dtype = np.dtype(dtype)
    per = 2 if jnp.issubdtype(dtype, jnp.complexfloating) else 1
    n = int(np.prod(shape, dtype=np.int64)) * per
    i = xp.broadcast_to(xp.arange(n, dtype=xp.uint32)[None, :] * np.uint32(2), (len(keys), n))
    k = _mix(xp.asarray(keys, xp.uint32))[:, None]

    def uniform(c: Any) -> Any:
        bits = _mix(_mix(c) ^ k) >> np.uint32(8)
        return (bits.astype(xp.float32) + np.float32(0.5)) * np.float32(2.0**-24)

    z = xp.sqrt(np.float32(-2.0) * xp.log(uniform(i))) * xp.cos(
        np.float32(2 * np.pi) * uniform(i + np.uint32(1))
    )
    if per == 2:
        z = (z[:, 0::2] + np.complex64(1j) * z[:, 1::2]) * np.float32(np.sqrt(0.5))
    return z.astype(dtype).reshape(len(keys), *shape)


_draws = jax.jit(normal_draws, static_argnums=(1, 2, 3))


@functools.lru_cache(maxsize=32)
def _host_draws(keys: tuple[int, ...], shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """`normal_draws` in NumPy, kept: the same direction is asked for at every call of a
    jvp-mode program (a Monitor step), and computing it is host work (each entry holds
    at most `HOST_DRAW_MAX` elements)."""
    out = normal_draws(np.array(keys, np.uint32), shape, dtype, np)
    out.flags.writeable = False
    return out


#: Default tangents of at most this many elements per kind of leaf are drawn on the
#: host (`normal_draws` in NumPy: no compile, where each compiled draw took 0.05-0.1 s
#: of a small model's first `inspect` in mode jvp or all); larger ones on the device.
HOST_DRAW_MAX = 1 << 20


def check_argnums(argnums: int | tuple[int, ...], n: int) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for a in nums:
        if not -n <= a < n:
            raise ValueError(
                f"sowviz: `argnums` {argnums!r} does not fit a function called with {n} "
                "positional argument(s)."
            )
    return tuple(a % n for a in nums)


_FORWARD_THROUGH_CUSTOM_VJP = (
    "sowviz: mode '{mode}' pushes tangents forward (`jax.jvp`), and `fn` calls a "
    "`jax.custom_vjp` function, which has a reverse-mode rule only: JAX cannot take it "
    "forward. Use mode='grad' or 'vjp', or give that function a `jax.custom_jvp` rule."
)


def forward_error(
    mode: Mode | str, err: Exception, calls_custom_vjp: Callable[[], bool] = lambda: False
) -> Exception | None:
    """JAX's refusal to take a `custom_vjp` forward (raised when the program is traced
    or, in JAX 0.12, lowered), said in sowviz's words; None for any other error. A
    forward mode's other `TypeError` or `RuntimeError` on a program that
    `calls_custom_vjp` is said so too: mode "all" reaches a custom rule's backward
    first, and there a library's rule may fail otherwise (Equinox's under diffrax's
    `BacksolveAdjoint`: "'type' object is not iterable", "Unexpected tangent"). That
    error, from inside the library, names no part of the user's program: the caller
    chains it as the `__cause__`, out of the message."""
    mode = Mode(mode)
    forward = mode in (Mode.JVP, Mode.ALL)
    if not (forward and isinstance(err, TypeError | RuntimeError)):
        return None
    direct = isinstance(err, TypeError) and "custom_vjp" in str(err)
    if not (direct or calls_custom_vjp()):
        return None
    msg = _FORWARD_THROUGH_CUSTOM_VJP.format(mode=mode.value)
    if "diffrax" in sys.modules:  # its default adjoint is a custom_vjp; it has others
        msg += _DIFFRAX_FORWARD[mode.value]
    return TypeError(msg)


# Equinox's `nondifferentiable` (`eqx.internal`; diffrax's Brownian paths mark their
# `t0` and `t1` so) raises "Unexpected tangent. t0 cannot be autodifferentiated." from
# its JVP rule, in every mode that differentiates the value.
_EQX_NOT_DIFFERENTIABLE = "cannot be autodifferentiated"

_REFUSED_TANGENT = (
    "sowviz: mode '{mode}' {how}, and the {kind}tangent on {which} reaches a value that `fn` "
    "marks as not differentiable (Equinox's `nondifferentiable`, as a diffrax Brownian "
    "path marks its `t0` and `t1`: `VirtualBrownianTree(ts[0], ts[-1], ...)` made of a "
    "time grid `ts` given as an argument). {fix} Equinox said: {err}"
)


def refused_tangent(err: Exception) -> bool:
    """Whether `err` is Equinox's refusal of a tangent (`eqxi.nondifferentiable`)."""
    return isinstance(err, RuntimeError) and _EQX_NOT_DIFFERENTIABLE in str(err)


def refused_tangent_error(
    mode: Mode | str,
    err: Exception,
    names: Sequence[str],
    refused: Sequence[int],
    differentiated: Sequence[int],
    default_tangents: bool,
) -> RuntimeError:
    """Equinox's refusal of a tangent said in sowviz's words: which argument's tangent
    (`refused`, by position; `names` per position) reached the value it guards, and the
    `argnums` that differentiates the others (`differentiated`: the arguments the mode
    differentiated). Mode jvp and all put a default tangent on every floating argument,
    a time grid `ts` too, which `jax.jvp` would only do if asked."""
    mode = Mode(mode)

    def name(i: int) -> str:
        return f"`{names[i]}`" if i < len(names) else f"argument {i}"

    default = mode in (Mode.JVP, Mode.ALL) and default_tangents
    if default:
        how = (
            "puts sowviz's default tangent (a fixed-seed normal direction: `tangents` not "
            "given) on every floating-point argument of `fn` (`argnums` not given)"
        )
    else:
        how = f"differentiates `fn` with respect to {', '.join(map(name, differentiated))}"
    keep = [i for i in differentiated if i not in refused]
    if not refused:
        which = "one of its arguments"
        fix = (
            "Pass `argnums` naming only the arguments to differentiate, without the one "
            "that reaches it (a time grid), or wrap it in `jax.lax.stop_gradient` in `fn`."
        )
    elif keep:
        which = ", ".join(f"argument {name(i)}" for i in refused)
        nums = str(keep[0]) if len(keep) == 1 else str(tuple(keep))
        fix = f"Differentiate the other arguments only: `argnums={nums}`"
        if mode in (Mode.JVP, Mode.ALL):
            ts = ", ".join(f"t_{names[i]}" if i in keep else "None" for i in range(len(names)))
            fix += f" (your own tangents then: `argnums={nums}, tangents=({ts})`)"
        fix += "; or wrap it in `jax.lax.stop_gradient` in `fn`."
    else:
        which = ", ".join(f"argument {name(i)}" for i in refused)
        fix = "Wrap it in `jax.lax.stop_gradient` in `fn`, or close over it."
    return RuntimeError(
        _REFUSED_TANGENT.format(
            mode=mode.value,
            how=how,
            kind="default " if default else "",
            which=which,
            fix=fix,
            err=err,
        )
    )


# JAX's refusal to transpose a `while_loop` (JAX 0.10-0.12: `_while_transpose_error`).
_JAX_NO_REVERSE_WHILE = "Reverse-mode differentiation does not work for lax.while_loop"

_NO_REVERSE_WHILE = (
    "sowviz: mode '{mode}' takes `fn` backward ({how}), and `fn` runs a `lax.while_loop` "
    "(or a `fori_loop` with traced bounds) that JAX can take forward only: it has no "
    "reverse-mode rule. Use mode='jvp' (tangents, pushed forward, as such a loop "
    "allows), or make the loop reverse-differentiable for mode '{mode}': a `lax.scan`, "
    "a `fori_loop` with static bounds, or Equinox's `eqxi.while_loop(..., "
    "kind='checkpointed')`.{library} JAX said: {err}"
)
_HOW_REVERSE = {
    "grad": "a gradient, as `jax.grad`",
    "vjp": "a pullback, as `jax.vjp`",
    "all": "it linearizes `fn` once and transposes that linearization for the cotangents",
}
_DIFFRAX_REVERSE = (
    " With diffrax, `adjoint=diffrax.ForwardMode()` makes a `diffeqsolve` such a loop: "
    "keep it for mode='jvp', and use an adjoint made for reverse mode for modes 'grad' "
    "and 'vjp' (the default `diffrax.RecursiveCheckpointAdjoint()`) and for mode 'all', "
    "which takes the solve forward too, `diffrax.DirectAdjoint()` (the default's "
    "`custom_vjp` cannot be taken forward)."
)


@contextlib.contextmanager
def _reverse_mode(mode: Mode) -> Iterator[None]:
    """Within: `fn` taken backward in `mode`; JAX's refusal of a forward-only
    `while_loop` comes out said in sowviz's words (what needs reverse mode, and
    mode='jvp' instead), JAX's error chained below it."""
    try:
        yield
    except ValueError as err:
        if _JAX_NO_REVERSE_WHILE not in str(err):
            raise
        library = _DIFFRAX_REVERSE if "diffrax" in sys.modules else ""
        msg = _NO_REVERSE_WHILE.format(
            mode=mode.value, how=_HOW_REVERSE[mode.value], library=library, err=err
        )
        raise ValueError(msg) from err


_TESSERACT_NO_ENDPOINT = (
    "sowviz: mode '{mode}' {how}, and {who} has no "
    "`{endpoint}` endpoint, which tesseract-jax needs for {needs} too. {works} {fix} "
    "The Tesseract said: {err}"
)
_TESSERACT_HOW = {
    "jvp": "takes `fn` forward (a JVP, as `jax.jvp`)",
    "all": "takes `fn` forward (it linearizes `fn` once, a JVP) and transposes that "
    "for the cotangents (a VJP)",
    "grad": "takes `fn` backward (a gradient, as `jax.grad`)",
    "vjp": "takes `fn` backward (a pullback, as `jax.vjp`)",
    "primal": "runs `fn`",
}
_TESSERACT_NEEDS = {
    "jacobian_vector_product": "`jax.jvp`",
    "vector_jacobian_product": "`jax.grad` and `jax.vjp`",
}


def _tesseract_modes(endpoints: Sequence[str]) -> list[str]:
    """The modes a Tesseract with these endpoints allows: tesseract-jax takes it
    forward with `jacobian_vector_product` and back with `vector_jacobian_product`
    (never with `jacobian`, which serves only `vmap`); mode "all" needs both."""
    jvp = "jacobian_vector_product" in endpoints
    vjp = "vector_jacobian_product" in endpoints
    return ["primal"] + ["jvp"] * jvp + ["grad", "vjp"] * vjp + ["all"] * (jvp and vjp)


def _either(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def tesseract_endpoint_error(
    mode: Mode | str, err: Exception, label_of: Callable[[Any], str]
) -> Exception | None:
    """tesseract-jax's refusal of a derivative endpoint a Tesseract lacks, said with
    the Tesseract's label (`label_of(client)`), the endpoints it has and the modes
    those allow; None for any other error."""
    found = _compat.tesseract_missing_endpoint(err)
    if found is None:
        return None
    mode = Mode(mode)
    endpoint, client = found
    label = label_of(client) if client is not None else None
    endpoints = _compat.tesseract_endpoints(client) if client is not None else None
    if endpoints is None:
        works = ""
    else:
        modes = [m for m in _tesseract_modes(endpoints) if m != mode.value]
        shown = [e for e in endpoints if e not in ("health", "abstract_eval", "test")]
        works = (
            f"`{label}` has the endpoints {', '.join(shown)}: "
            + ("use mode=" + _either([f"'{m}'" for m in modes]) if modes else "")
            + (
                " (its `jacobian` serves only `jax.vmap`)."
                if "jacobian" in endpoints and "primal" in modes and len(modes) == 1
                else "."
            )
        )
    fix = (
        f"To take mode '{mode.value}', implement `{endpoint}` in its tesseract_api.py "
        "(for an `apply_jit` written in JAX, `tesseract_core.runtime.jax_recipes` has it)."
    )
    return NotImplementedError(
        _TESSERACT_NO_ENDPOINT.format(
            mode=mode.value,
            how=_TESSERACT_HOW.get(mode.value, "differentiates `fn`"),
            who=f"the Tesseract `{label}` that `fn` calls" if label else "a Tesseract `fn` calls",
            endpoint=endpoint,
            needs=_TESSERACT_NEEDS.get(endpoint, f"`{endpoint}`"),
            works=works,
            fix=fix,
            err=err,
        )
    )


# Per forward mode: mode all also takes the solve backward, which `ForwardMode`'s
# `while_loop` cannot be; `DirectAdjoint`'s bounded loop can be taken both ways.
_DIFFRAX_FORWARD = {
    "jvp": (
        " With diffrax, a `diffeqsolve`'s default adjoint is one: pass "
        "`adjoint=diffrax.ForwardMode()` to take the solve forward."
    ),
    "all": (
        " With diffrax, a `diffeqsolve`'s default adjoint is one: pass "
        "`adjoint=diffrax.DirectAdjoint()`, which mode 'all' can take forward and "
        "backward (`diffrax.ForwardMode()` is forward only: mode 'all' would then fail "
        "backward), or run mode 'jvp' with `ForwardMode()` and mode 'grad' apart."
    ),
}

_LEAKED_FROM_TRACE = (
    "sowviz: a value of sowviz's trace of `fn` was used after that trace ended. sowviz "
    "traces `fn` once and differentiates the trace, as `jax.grad(jax.jit(fn))` does; the "
    "usual cause is a `jax.custom_vjp` whose rule closes over a traced value of `fn` (a "
    "function given through `nondiff_argnums` that uses `fn`'s arguments), on which "
    "`jax.grad(jax.jit(fn))` fails too. Make the closed-over values arguments of the "
    "custom_vjp function, or convert that function with `jax.closure_convert`. JAX said:"
    "\n\n{err}"
)


def leaked_trace_error(err: Exception) -> TypeError | None:
    """JAX's `UnexpectedTracerError` for a value leaked from sowviz's own trace of `fn`
    (`_program.Traced`), said in sowviz's words with JAX's below; None otherwise."""
    if not isinstance(err, jax.errors.UnexpectedTracerError) or "sowviz" not in str(err):
        return None
    return jax.errors.UnexpectedTracerError(_LEAKED_FROM_TRACE.format(err=err))


def with_output_leaves(mode: Mode | str, result: Any, restore: Callable[[Any], Any]) -> Any:
    """`transform`'s `result` with `restore` applied to `fn`'s output in it (the value:
    all of a primal result, the first of jvp, vjp and all; grad's is a scalar)."""
    mode = Mode(mode)
    if mode is Mode.PRIMAL:
        return restore(result)
    if mode is Mode.GRAD:
        return result
    return (restore(result[0]), *result[1:])


def with_aux(mode: Mode | str, result: Any, aux: Any) -> Any:
    """`transform`'s `result` with `fn`'s `aux` where JAX's `has_aux` puts it: grad
    `((value, aux), grads)` as `jax.value_and_grad`; primal `(output, aux)`, what `fn`
    returned; jvp, vjp and all the aux last, as `jax.jvp`/`jax.vjp` return it."""
    mode = Mode(mode)
    if mode is Mode.PRIMAL:
        return (result, aux)
    if mode is Mode.GRAD:
        value, grads = result
        return (value, aux), grads
    return (*result, aux)


def transform(
    run: Callable[[list], Any],
    layout: Layout,
    mode: Mode,
    argnums: Any,
    placed: Sequence[Any] | None = None,
    refs: bool = False,
) -> Callable[[list, tuple], Any]:
    """`run` (flat array inputs → `(output pytree, state)`, `state` the arguments' new
    values that `fn` assigned in place, `Traced.state`) under `mode`, as a function of
    `(dyn, extra)` returning `(result, state)`: `extra` is `(tangents, cotangents)`
    (each None for the default; tangents one per floating leaf, in `layout.floating`
    order). `state` is carried as JAX's `has_aux` carries auxiliary outputs: never
    differentiated. `placed` (per dyn leaf, a sharding or None): grad, vjp and all
    return each gradient placed like its argument, as `jax.jit` does for a plain
    program (an instrumented one, with its probes as outputs too, was partitioned
    otherwise: the gradients of replicated parameters came back split over the batch's
    axis; FSDP-split ones, in vjp and all, lost their FSDP axis). `refs`:
    the program makes or writes a mutable array (`_compat.has_refs`), whose linearization
    JAX cannot transpose: grad takes `jax.vjp`, and mode all is refused."""
    mode = Mode(mode)
    if mode is Mode.PRIMAL:
        return lambda dyn, extra: run(dyn)

    def with_values(dyn: list, pos: tuple[int, ...], vals: tuple) -> list:
        merged = list(dyn)
        for j, v in zip(pos, vals, strict=True):
            merged[j] = v
        return merged

    def placed_like_args(pos: Sequence[int], gs: Sequence[Any]) -> tuple:
        # the same in every mode: switching modes (the widget) moved the gradients of
        # FSDP-split parameters to XLA's choice for the instrumented program
        if placed is None:
            return tuple(gs)
        return tuple(
            g if placed[j] is None else jax.lax.with_sharding_constraint(g, placed[j])
            for j, g in zip(pos, gs, strict=True)
        )

    if mode is Mode.GRAD:
        argnums = 0 if argnums is None else argnums  # as `jax.grad`
        nums = check_argnums(argnums, layout.n_args)
        pos = tuple(j for j in layout.floating if layout.arg_of[j] in nums)
        for i in nums:
            if not any(layout.arg_of[j] == i for j in pos):
                raise TypeError(_no_float(argnums, i, layout))

        def grad(dyn: list, extra: tuple) -> Any:
            def f(vals):
                return run(with_values(dyn, pos, vals))

            primals = (tuple(dyn[j] for j in pos),)
            with _reverse_mode(mode):
                if refs:
                    value, pull, state = jax.vjp(f, *primals, has_aux=True)
                    _check_scalar(value)
                else:
                    value, pull, state = _compat.vjp_by_jvp(f, primals, _check_scalar, has_aux=True)
                (gs,) = pull(jax.lax.full_like(value, 1))
            gs = placed_like_args(pos, gs)
            trees = layout.input_trees(nums, dict(zip(pos, gs, strict=True)))
            return (value, (trees[0] if isinstance(argnums, int) else trees)), state

        return grad

    fpos = layout.floating

    def tangents_of(dyn: list, extra: tuple) -> tuple:
        if extra[0] is None:
            return default_tangents(layout, dyn)
        # a user's tangent placed like its argument (`_placed_seed`): `jnp.ones(w.shape)`
        # for a split `w`, which `jax.jvp` takes
        return tuple(
            t if t is None else _placed_seed(t, dyn[j], "tangent", "argument", layout.paths[j])
            for t, j in zip(extra[0], fpos, strict=True)
        )

    def seed_of(y: Any, extra: tuple) -> Any:
        return _seed_like(y) if extra[1] is None else _user_seed(extra[1], y)

    def g_of(dyn: list) -> Callable:
        return lambda *vals: run(with_values(dyn, fpos, vals))

    # `argnums` given: only those arguments are differentiated (`layout.floating` holds
    # their leaves alone), and their cotangents come back as `jax.grad` gives them (one
    # tree for an int); else every argument's, one tree each, as `jax.vjp`
    nums = tuple(range(layout.n_args)) if argnums is None else check_argnums(argnums, layout.n_args)
    for i in nums if argnums is not None else ():
        if not any(layout.arg_of[j] == i for j in fpos):
            raise TypeError(_no_float(argnums, i, layout))
    # every argument, none differentiable: a zero tangent and None gradients, said by
    # no error (a function of no argument is differentiated so, as `jax.jvp(f, (), ())`)
    if not fpos and layout.n_args:
        raise TypeError(_no_float_any(mode, layout))

    def cotangent_trees(cts: tuple) -> Any:
        trees = layout.input_trees(nums, dict(zip(fpos, cts, strict=True)))
        return trees[0] if isinstance(argnums, int) else trees

    if mode is Mode.JVP:

        def jvp(dyn: list, extra: tuple) -> Any:
            primals = tuple(dyn[j] for j in fpos)
            y, t, state = jax.jvp(g_of(dyn), primals, tuple(tangents_of(dyn, extra)), has_aux=True)
            return (y, t), state

        return jvp
    if mode is Mode.VJP:

        def vjp(dyn: list, extra: tuple) -> Any:
            with _reverse_mode(mode):
                y, pull, state = jax.vjp(g_of(dyn), *(dyn[j] for j in fpos), has_aux=True)
                cts = placed_like_args(fpos, pull(seed_of(y, extra)))
            return (y, cotangent_trees(cts)), state

        return vjp

    if refs:
        raise TypeError(_REFS_ALL)

    def both(dyn: list, extra: tuple) -> Any:
        # One linearization: primal sows once, tangent sows from the linear map,
        # cotangent sows from its transpose; no value is sown twice. Only floating
        # leaves are linearised, so the transpose never meets a float0 input.
        primals = tuple(dyn[j] for j in fpos)
        y, lin, state = jax.linearize(g_of(dyn), *primals, has_aux=True)
        t = lin(*tangents_of(dyn, extra))
        with _reverse_mode(mode):
            cts = _compat.linear_transpose_call(lin, primals, seed_of(y, extra))
        cts = placed_like_args(fpos, cts)
        return (y, t, cotangent_trees(cts)), state

    return both
