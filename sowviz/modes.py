"""Apply an inspection mode to an undifferentiated function.

`inspect`, `show` and `Monitor` take the user's plain `fn` and differentiate it
themselves, so automatic stage probes (inserted before this step) see tangents
and cotangents too. Each mode maps `fn(*args)` to one function of the same
arguments whose result is documented in `transform`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

Mode = Literal["primal", "grad", "jvp", "vjp", "all"]
MODES: tuple[str, ...] = ("primal", "grad", "jvp", "vjp", "all")


def check_mode(mode: Any) -> Mode:
    if mode not in MODES:
        raise ValueError(
            f"sowviz: unknown `mode` {mode!r}; use one of {', '.join(map(repr, MODES))} "
            "('grad' for value and gradient, 'jvp' for tangents, 'all' for both)."
        )
    return mode


def default_tangents(args: Sequence[Any], seed: int = 0) -> tuple[Any, ...]:
    """A fixed-seed standard-normal direction for every floating input; float0 zeros
    for integer and boolean inputs (they have no tangent space)."""
    key = jax.random.PRNGKey(seed)

    def one(path, leaf):
        leaf = jnp.asarray(leaf)
        if jnp.issubdtype(leaf.dtype, jnp.inexact):
            k = jax.random.fold_in(key, zlib.crc32(jax.tree_util.keystr(path).encode()) % (2**31))
            return jax.random.normal(k, leaf.shape, leaf.dtype)
        return np.zeros(leaf.shape, jax.dtypes.float0)

    return tuple(jax.tree_util.tree_map_with_path(one, tuple(args)))


def _ones_like_output(y: Any) -> Any:
    return jax.tree_util.tree_map(jnp.ones_like, y)


def _argnums(argnums: int | Sequence[int], n: int) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for a in nums:
        if not isinstance(a, int) or not -n <= a < n:
            raise ValueError(
                f"sowviz: `argnums` {argnums!r} does not fit a function called with {n} "
                "positional argument(s)."
            )
    return tuple(a % n for a in nums)


def transform(
    fn: Callable,
    mode: Mode,
    *,
    n_args: int,
    argnums: int | Sequence[int] = 0,
    tangents: Sequence[Any] | None = None,
    cotangents: Any = None,
) -> Callable:
    """`fn` under `mode`. Results:

    * primal: `fn(*args)`
    * grad: `(value, grads)` as `jax.value_and_grad(fn, argnums)` (scalar `fn`)
    * jvp: `(value, tangent_out)` along `tangents` (default: `default_tangents`)
    * vjp: `(value, input_cotangents)` pulled back from `cotangents` (default: ones)
    * all: `(value, tangent_out, input_cotangents)` from one linearization
    """
    check_mode(mode)
    if mode == "primal":
        return fn
    if mode == "grad":
        nums = _argnums(argnums, n_args)
        return jax.value_and_grad(fn, argnums=nums if len(nums) > 1 else nums[0])

    def tangents_for(args):
        return tuple(tangents) if tangents is not None else default_tangents(args)

    if mode == "jvp":
        return lambda *args: jax.jvp(fn, args, tangents_for(args))
    if mode == "vjp":

        def vjp(*args):
            y, pull = jax.vjp(fn, *args)
            return y, pull(cotangents if cotangents is not None else _ones_like_output(y))

        return vjp

    def both(*args):
        # One linearization: primal sows once, tangent sows from the linear map,
        # cotangent sows from its transpose; no value is sown twice.
        y, lin = jax.linearize(fn, *args)
        t = lin(*tangents_for(args))
        ct_seed = cotangents if cotangents is not None else _ones_like_output(y)
        cts = jax.linear_transpose(lin, *args)(ct_seed)
        return y, t, cts

    return both
