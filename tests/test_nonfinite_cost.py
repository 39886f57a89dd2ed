"""`locate` against `jax_debug_nans` on the same program: both must name the same line.

Run as a script for the cost (first call: compile + run; again: the cached program):

    .venv/bin/python tests/test_nonfinite_cost.py [depth width]   # an MLP
    .venv/bin/python tests/test_nonfinite_cost.py nnx [blocks]    # the zoo's NNX LM

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


def debug_nans_error(fn, *args) -> str:
    """What `jax_debug_nans` says when the compiled step makes a NaN (its last line). A
    fresh `jit`: an existing one's dispatch cache skips the check."""
    step = jax.jit(jax.value_and_grad(fn))
    jax.config.update("jax_debug_nans", True)
    try:
        jax.block_until_ready(step(*args))
    except FloatingPointError as err:
        return str(err).strip().splitlines()[-1]
    finally:
        jax.config.update("jax_debug_nans", False)
    return "no NaN"


def main_nnx(blocks: int = 2) -> None:
    """The zoo's NNX LM with `blocks` blocks; one MLP kernel scaled to overflow, so the
    `up` projection makes +-Inf and the GELU after it NaN."""
    from flax import nnx

    sys.path.insert(0, str(pathlib.Path(__file__).parent.parent))
    from tests.zoo.models import nnx_lm

    cfg = nnx_lm.Config(attention=("mha", "einsum") * (blocks // 2) + ("mha",) * (blocks % 2))
    model, tokens, targets = nnx_lm.make(cfg)
    kernel = model.layers[blocks - 1].mlp.up.kernel
    kernel[...] = kernel[...] * 1e38
    graphdef, state = nnx.split(model)

    def flat(state, tokens, targets):
        return nnx_lm.loss(nnx.merge(graphdef, state), tokens, targets)

    step = jax.jit(jax.value_and_grad(flat))
    t_first, _ = _time(lambda: jax.block_until_ready(step(state, tokens, targets)))
    t_step, _ = _time(lambda: jax.block_until_ready(step(state, tokens, targets)), 20)
    n_eqns = _count_eqns(jax.make_jaxpr(jax.value_and_grad(flat))(state, tokens, targets).jaxpr)
    t_nans, said = _time(lambda: debug_nans_error(flat, state, tokens, targets))
    t_nans2, _ = _time(lambda: debug_nans_error(flat, state, tokens, targets))
    opts = InspectOptions()
    t_loc, o = _time(lambda: locate(nnx_lm.loss, (model, tokens, targets), opts))
    t_loc2, _ = _time(lambda: locate(nnx_lm.loss, (model, tokens, targets), opts), 3)
    print(f"NNX LM, {blocks} blocks, {n_eqns} equations in value_and_grad, {jax.devices()[0]}")
    print(f"plain jit value_and_grad: first call {t_first:.2f} s, step {t_step * 1e3:.2f} ms")
    print(f"jax_debug_nans: {t_nans:.2f} s (again {t_nans2:.2f} s): {said}")
    print(f"sowviz locate: {t_loc:.2f} s (again {t_loc2:.3f} s): {o.message}")


def _count_eqns(jaxpr) -> int:
    from sowviz import _compat

    return sum(1 + sum(_count_eqns(j) for *_, j in _compat.sub_jaxprs(e)) for e in jaxpr.eqns)


if __name__ == "__main__":
    if sys.argv[1:2] == ["nnx"]:
        main_nnx(*map(int, sys.argv[2:]))
    else:
        main(*map(int, sys.argv[1:]))
