"""`locate` against `jax_debug_nans` on the same program: both must name the same line.

Run as a script for the cost (first call: compile + run; again: the cached program):

    .venv/bin/python tests/test_nonfinite_cost.py

No timing is asserted here (speed targets live in benchmarks/).
"""

from __future__ import annotations

import pathlib
import re
import sys
import time

import jax
import jax.numpy as jnp

from sowviz.nonfinite_locate import locate
from sowviz.options import InspectOptions


def make(depth: int, width: int):
    def loss(params, x):
        h = x
        for i, w in enumerate(params):
            with jax.named_scope(f"block_{i}"):
                h = jnp.tanh(h @ w)
                if i == depth // 2:
                    v = jnp.mean(h * h, axis=-1, keepdims=True) - 0.5
                    h = h * jax.lax.rsqrt(v)  # NaN where the mean square is below 0.5
        return jnp.mean(h * h)

    keys = jax.random.split(jax.random.PRNGKey(0), depth + 1)
    params = [jax.random.normal(k, (width, width)) * 0.01 for k in keys[:depth]]
    x = jax.random.normal(keys[-1], (64, width))
    return loss, params, x


RSQRT_LINE = next(
    i
    for i, line in enumerate(pathlib.Path(__file__).read_text(encoding="utf-8").splitlines(), 1)
    if "h * jax.lax.rsqrt(v)" in line
)


def debug_nans_line(loss, params, x) -> int | None:
    """Where `jax_debug_nans` stops: the line in this file named by its error."""
    step = jax.jit(jax.value_and_grad(loss))
    jax.config.update("jax_debug_nans", True)
    try:
        jax.block_until_ready(step(params, x))
    except FloatingPointError as err:
        tb = err.__traceback__
        lines = []
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == __file__:
                lines.append(tb.tb_lineno)
            tb = tb.tb_next
        msg = str(err)
        m = re.search(r"test_nonfinite_cost\.py:(\d+)", msg)
        return int(m.group(1)) if m else (lines[-1] if lines else None)
    finally:
        jax.config.update("jax_debug_nans", False)
    return None


def test_locate_and_debug_nans_name_the_same_line():
    loss, params, x = make(depth=4, width=16)
    o = locate(loss, (params, x), InspectOptions())
    assert o.forward.equation.primitive == "rsqrt"
    assert o.forward.equation.source.line == RSQRT_LINE
    assert debug_nans_line(loss, params, x) == RSQRT_LINE


def _time(fn, n=1):
    t0 = time.perf_counter()
    for _ in range(n):
        out = fn()
    return (time.perf_counter() - t0) / n, out


def main(depth: int = 8, width: int = 512) -> None:
    loss, params, x = make(depth, width)
    step = jax.jit(jax.value_and_grad(loss))
    t_first, _ = _time(lambda: jax.block_until_ready(step(params, x)))
    t_step, _ = _time(lambda: jax.block_until_ready(step(params, x)), 20)
    t_nans, line = _time(lambda: debug_nans_line(loss, params, x))
    t_nans2, _ = _time(lambda: debug_nans_line(loss, params, x))
    opts = InspectOptions()
    t_loc, o = _time(lambda: locate(loss, (params, x), opts))
    t_loc2, _ = _time(lambda: locate(loss, (params, x), opts), 3)
    print(f"program: {depth} blocks x {width}, batch 64, {jax.devices()[0].platform}")
    print(f"plain jit value_and_grad: first call {t_first:.3f} s, step {t_step * 1e3:.2f} ms")
    print(f"jax_debug_nans: {t_nans:.3f} s (again {t_nans2:.3f} s) -> line {line}")
    print(
        f"sowviz locate: {t_loc:.3f} s (again {t_loc2:.3f} s) -> "
        f"{o.forward.equation.primitive} at line {o.forward.equation.source.line}"
    )


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
