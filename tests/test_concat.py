"""`sowviz._concat`: the concatenations XLA compiles fast give jnp.concatenate's values."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sowviz import _concat


def _parts(n: int) -> tuple[list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(n)
    return [rng.normal(size=(int(k),)).astype(np.float32) for k in rng.integers(1, 40, n)], (
        rng.normal(size=(3, 4)).astype(np.float32)
    )


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("n", [1, 5, 9, 150])
def test_concatenate_and_stack_give_jnp_values_on_every_path(backend: str, n: int) -> None:
    # cpu: one concatenation up to CPU_CHUNK parts, then chunks; gpu (traced here on the
    # CPU): the operands through one barrier beyond SEAL_OVER parts, the fills outside it.
    values, block = _parts(n)

    def laid_out(vs):
        fill = jax.lax.full((7,), jnp.nan, jnp.float32)
        parts = [p for v in vs for p in (v, fill)]
        return _concat.concatenate(parts, fills=[fill], backend=backend)

    want = np.concatenate([p for v in values for p in (v, np.full(7, np.nan, np.float32))])
    np.testing.assert_array_equal(np.asarray(jax.jit(laid_out)(values)), want)
    blocks = [block * i for i in range(n)]
    got = jax.jit(lambda bs: _concat.stack(bs, backend=backend))(blocks)
    np.testing.assert_array_equal(np.asarray(got), np.stack(blocks))


def _barrier_and_concatenation(values: list, backend: str) -> tuple:
    """The one barrier and the one concatenation of `values` (each through `sin`) laid
    out with a NaN fill after each, on `backend`; and the jaxpr."""

    def laid_out(*vs):
        fill = jax.lax.full((7,), jnp.nan, jnp.float32)
        parts = [p for v in vs for p in (jnp.sin(v), fill)]
        return _concat.concatenate(parts, fills=[fill], backend=backend)

    jaxpr = jax.make_jaxpr(laid_out)(*values).jaxpr
    (barrier,) = [e for e in jaxpr.eqns if e.primitive.name == "optimization_barrier"]
    (concat,) = [e for e in jaxpr.eqns if e.primitive.name == "concatenate"]
    return barrier, concat, jaxpr


def test_many_operands_reach_the_gpu_concatenation_through_one_barrier() -> None:
    # What makes XLA:GPU's fusion linear: every non-fill operand of the concatenation is
    # an output of one optimization_barrier (nothing left to merge one by one), and the
    # constant fill stays outside it (written by the concatenation, not read).
    values, _ = _parts(20)
    barrier, concat, jaxpr = _barrier_and_concatenation(values, "gpu")
    assert len(barrier.invars) == len(values)
    sealed = set(map(id, barrier.outvars))
    assert sum(id(v) in sealed for v in concat.invars) == len(values)
    assert len(concat.invars) == 2 * len(values)
    assert sum(str(e.primitive) == "sin" for e in jaxpr.eqns) == len(values)


def test_on_a_cpu_every_part_reaches_the_concatenation_through_a_barrier() -> None:
    # Fused with its operands, XLA:CPU runs a concatenation as a loop choosing the
    # operand of every element; sealed (fills too), it copies each part whole.
    values, _ = _parts(20)
    barrier, concat, _ = _barrier_and_concatenation(values, "cpu")
    assert len(barrier.invars) == 2 * len(values)
    assert [id(v) for v in concat.invars] == [id(v) for v in barrier.outvars]
