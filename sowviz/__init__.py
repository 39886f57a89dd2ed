"""sowviz: see inside JAX programs.

Tag values with `sow`, capture them (and the tangents and cotangents that flow
through them) with `save_intermediates`, or let `inspect` / `show` / `Monitor`
probe every stage of a program automatically and draw it.

    >>> import jax, jax.numpy as jnp, sowviz
    >>> def loss(w, x):
    ...     h = sowviz.sow(jnp.tanh(x @ w), "hidden")
    ...     return jnp.sum(h ** 2)
    >>> w, x = jnp.ones((3, 2)), jnp.ones((4, 3))
    >>> grads, inter = sowviz.save_intermediates(jax.grad(loss))(w, x)
    >>> sorted(inter["hidden"])
    ['cotangent', 'primal']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .capture.api import SaveIntermediates as SaveIntermediates
from .capture.interpret import CaptureError as CaptureError
from .capture.primitive import sow as _sow
from .inspection import Inspection as Inspection
from .inspection import InspectOptions, Pipeline, inspect_with
from .modes import Mode
from .monitor import Monitor as Monitor
from .monitor import NonFiniteError as NonFiniteError
from .summary import Summary as Summary
from .summary import SummaryOptions as SummaryOptions
from .summary import summarize as _summarize
from .widget import Inspector as Inspector

__version__ = "0.1.0"

__all__ = [
    "CaptureError",
    "Inspection",
    "Inspector",
    "Monitor",
    "NonFiniteError",
    "SaveIntermediates",
    "Summary",
    "SummaryOptions",
    "inspect",
    "save_intermediates",
    "show",
    "sow",
    "summarize",
]


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
    return _sow(value, name, tag=tag)


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


def inspect(
    fn: Callable, *args: Any, mode: Mode = "grad", capture: str = "stages", **options: Any
) -> Inspection:
    """Run `fn(*args)` under `mode`, probe it, summarise every probe; return an `Inspection`.

    `fn` is the undifferentiated function: `mode` applies the derivative itself
    (`"primal"`, `"grad"` (scalar `fn`, w.r.t. `argnums`), `"jvp"` (along
    `tangents=`, default a fixed-seed normal direction), `"vjp"` (from
    `cotangents=`, default ones), `"all"`). `capture="stages"` probes every stage's
    outputs and your sows; `"sows"` only your sows; `"all"` every equation.

    Options: argnums, tangents, cotangents, bins, title, tag, duplicates (default
    "suffix"), loops, strict, tesseract_names.

    Example:
        >>> ins = sowviz.inspect(lambda w: jnp.sum(jnp.tanh(w) ** 2), jnp.ones(3))
        >>> ins.to_dict()["schema"], ins.mode
        ('sowviz/1', 'grad')
    """
    opts = InspectOptions.from_kwargs("inspect", mode, capture, options)
    return inspect_with(Pipeline(fn, args, opts), args)


def show(
    fn: Callable, *args: Any, mode: Mode = "grad", capture: str = "stages", **options: Any
) -> Inspector:
    """`inspect`, drawn: an `Inspector` widget that displays itself in Jupyter.

    Click a stage for histograms of its primal values, tangents and cotangents;
    switch the mode in the widget to re-run. `.save_html(path)` exports it.

    Example:
        >>> w = sowviz.show(lambda w: jnp.sum(jnp.tanh(w) ** 2), jnp.ones(3))
        >>> w.model["mode"]
        'grad'
    """
    opts = InspectOptions.from_kwargs("show", mode, capture, options)

    def rerun(new_mode: str) -> dict[str, Any]:
        o = InspectOptions.from_kwargs("show", new_mode, capture, options)
        return inspect_with(Pipeline(fn, args, o), args).to_dict()

    widget = Inspector(inspect_with(Pipeline(fn, args, opts), args).to_dict(), rerun=rerun)
    return widget
