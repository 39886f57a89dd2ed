"""The engine's public functions with their user-facing docstrings (re-exported by
`sowviz/__init__.py`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _compat
from .capture.api import SaveIntermediates
from .capture.primitive import check_user_tag
from .capture.primitive import sow as _sow
from .summary import Summary, SummaryOptions
from .summary import summarize as _summarize


@_compat.api_boundary  # a bad input's traceback ends at the user's call
def sow(value: Any, name: str, *, tag: str = "intermediates") -> Any:
    """Tag `value` (any pytree of arrays) for capture; returns it unchanged.

    An identity everywhere: eagerly, under `jit`, `vmap`, `grad`, `scan`... Under
    differentiation its tangent and cotangent are tagged too, so
    `save_intermediates` can return them. Outside a capture it costs nothing.

    Example:
        >>> h = sowviz.sow(jnp.ones(3), "h")
        >>> h.tolist()
        [1.0, 1.0, 1.0]
    """
    check_user_tag(tag, "sowviz.sow")
    return _sow(value, name, tag=tag)


@_compat.api_boundary  # a bad input's traceback ends at the user's call
def save_intermediates(
    fn: Callable,
    *,
    tag: str | tuple[str, ...] = "intermediates",
    duplicates: str = "error",
    loops: str | int = "last",
    summarize: bool | int | SummaryOptions | None = None,
    strict: bool = True,
) -> SaveIntermediates:
    """Wrap `fn` so that it also returns every value sown in it.

    `wrapped(*args, **kwargs)` returns `(result, intermediates)` where
    `intermediates[name][key]` has the sown value's pytree structure and `key` says
    which value it is: `"primal"`, `"tangent"` (under jvp/jacfwd/linearize),
    `"cotangent"` (under grad/vjp/jacrev), composed under higher order
    (`"cotangent.tangent"` under `jax.hessian`); see the README's key table.
    `"iterations"` (while loops) and `"taken"` (a name sown in only some branches
    of a `cond`) may appear beside them.

    The rewritten program is compiled with `jax.jit` and cached: a second call with
    like arguments neither retraces `fn` nor recompiles. It composes with an outer
    `jax.jit` and `jax.vmap`.

    Args:
        fn: the function, already transformed if you want derivatives
            (`save_intermediates(jax.grad(loss))`).
        tag: collect only sows with this tag (or any of these tags).
        duplicates: a name sown twice raises (`"error"`, naming both places), becomes
            `name_0`, `name_1`, ... (`"suffix"`) or is stacked (`"stack"`).
        loops: in `while_loop`s keep the `"last"` iteration or the first N stacked.
        summarize: `True`, a number of bins or `SummaryOptions(...)`: return on-device
            `Summary` statistics (fetched in one transfer) instead of arrays.
        strict: raise `CaptureError` for a sow the engine cannot reach (else it is
            skipped and explained in `wrapped.notes`).

    Example:
        >>> def f(x):
        ...     return jnp.sum(sowviz.sow(jnp.sin(x), "s") ** 2)
        >>> g, inter = sowviz.save_intermediates(jax.grad(f))(jnp.zeros(2))
        >>> inter["s"]["cotangent"].tolist()
        [0.0, 0.0]
    """
    check_user_tag(tag, "sowviz.save_intermediates", many=True)
    return SaveIntermediates(
        fn, tag=tag, duplicates=duplicates, loops=loops, summarize=summarize, strict=strict
    )


def summarize(x: Any, *, bins: int = 64) -> Summary:
    """On-device `Summary` of one array: counts of NaN/±Inf/zeros, min, max, mean,
    std, L2 norm, abs-max over finite values, and linear and log10|x| histograms.
    Jittable; its size does not depend on the array's.

    Example:
        >>> s = sowviz.summarize(jnp.array([1.0, -2.0, jnp.nan]))
        >>> s.to_json()["nan"], s.to_json()["absmax"]
        (1, 2.0)
    """
    return _summarize(x, bins=bins)
