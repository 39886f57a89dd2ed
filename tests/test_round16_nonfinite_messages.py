"""Round 16: a located backward NaN names the op that masks on its path and the fix for
what the user wrote: `jnp.clip` before a `sqrt` (a PSD matrix square root of a
rank-deficient covariance), not `jnp.trace`'s own `where`; `jnp.linalg.norm` at a zero
distance under `jax.grad`, by the `norm` call, not its `sqrt` and `reduce_sum`."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

HERE = f"tests/{Path(__file__).name}"
EPS = 1e-12


def _line(fn, offset: int) -> int:
    return fn.__code__.co_firstlineno + offset


# -- 1. a clip before `sqrt` -------------------------------------------------------------


def psd_sqrt_clip(C):
    w, v = jnp.linalg.eigh(C)
    w = jnp.clip(w, 0.0)  # masks the value, not sqrt's backward
    return (v * jnp.sqrt(w)) @ v.T


def psd_sqrt_maximum(C):
    w, v = jnp.linalg.eigh(C)
    w = jnp.maximum(w, 0.0)  # masks the value, not sqrt's backward
    return (v * jnp.sqrt(w)) @ v.T


def psd_sqrt_fixed(C):  # the advised fix
    w, v = jnp.linalg.eigh(C)
    return (v * jnp.sqrt(jnp.maximum(w, EPS))) @ v.T


def _cov_loss(psd_sqrt):
    def cov_loss(X):
        C = X.T @ X / X.shape[0]
        return jnp.trace(psd_sqrt(C))  # jnp.trace holds a `where` of its own

    return cov_loss


RANK_2 = jax.random.normal(jax.random.key(1), (2, 4))  # 4x4 covariance: zero eigenvalues
FULL_RANK = jax.random.normal(jax.random.key(2), (8, 4))


@pytest.mark.parametrize(
    "psd_sqrt, called", [(psd_sqrt_clip, "jnp.clip"), (psd_sqrt_maximum, "jnp.maximum")]
)
def test_a_clip_before_sqrt_is_named_as_the_mask_not_a_library_where(psd_sqrt, called):
    loss = _cov_loss(psd_sqrt)
    # plain JAX: the gradient is NaN, made by 0 × Inf in the clip's backward: at an
    # eigenvalue clipped to 0 sqrt' is +Inf, and the clip's derivative there is 0
    assert np.isnan(jax.grad(loss)(RANK_2)).any()
    w = jnp.array([-1e-8, 1.0])
    assert np.isposinf(jax.grad(lambda w: jnp.sum(jnp.sqrt(w)))(jnp.array([0.0, 1.0]))[0])
    assert np.isnan(jax.grad(lambda w: jnp.sum(jnp.sqrt(jnp.maximum(w, 0.0))))(w)[0])
    o = sowviz.inspect(loss, RANK_2, mode="grad").locate_nonfinite()
    assert o.backward.equation.primitive == "sqrt", o.message
    msg = o.backward.message
    clip_line = _line(psd_sqrt, 2)
    # (the box of the line `w = jnp.clip(w, 0.0)`, named by what it assigns)
    assert f"reaching `w` ({HERE}:{clip_line})" in msg or called != "jnp.clip", msg
    assert (
        f"`sqrt`'s derivative 0.5 / sqrt(x) is infinite at x = 0, where `{called}` at "
        f"{HERE}:{clip_line} put the values it clipped, and it masks the value, not its "
        "backward: its derivative is 0 there, and 0 × Inf = NaN. Fix: clip to where the "
        "derivative is finite, `jnp.sqrt(jnp.maximum(x, eps))`"
    ) in msg, msg
    assert "jnp.where" not in msg and "double-where" not in msg, msg


def test_the_clip_fix_gives_finite_gradients_equal_to_plain_jax_where_defined():
    fixed, plain = _cov_loss(psd_sqrt_fixed), _cov_loss(psd_sqrt_clip)
    assert np.all(np.isfinite(jax.grad(fixed)(RANK_2)))
    # a full-rank covariance (every eigenvalue above eps): the same gradient as plain JAX's
    assert np.linalg.eigvalsh(np.asarray(FULL_RANK.T @ FULL_RANK / 8)).min() > 1e-3
    expected = jax.grad(plain)(FULL_RANK)
    assert np.all(np.isfinite(expected))
    np.testing.assert_allclose(jax.grad(fixed)(FULL_RANK), expected, rtol=1e-4, atol=1e-6)


def trace_of_sqrt(x):
    return jnp.trace(jnp.diag(jnp.sqrt(x)))  # jnp.trace's `where` reads sqrt's values


def test_a_library_calls_own_where_on_the_value_path_is_not_blamed():
    x = jnp.array([0.0, 1.0, 4.0])
    g = jax.grad(trace_of_sqrt)(x)
    assert np.isposinf(g[0]) and np.all(np.isfinite(g[1:]))  # +Inf: nothing masks it
    msg = sowviz.inspect(trace_of_sqrt, x, mode="grad").locate_nonfinite().backward.message
    assert "`sqrt`'s derivative 0.5 / sqrt(x) is infinite at x = 0, and only there" in msg, msg
    assert "masks the value" not in msg and "clip" not in msg, msg


# -- 2. `jnp.linalg.norm` at a zero distance under `jax.grad` -----------------------------


def energy_norm(R):
    dr = jnp.linalg.norm(R[:, None] - R[None], axis=-1)
    mask = ~jnp.eye(R.shape[0], dtype=bool)
    return 0.5 * jnp.sum(jnp.where(mask, jnp.exp(-jnp.where(mask, dr, 1.0)), 0.0))


def energy_fixed(R):  # the advised fix
    d = R[:, None] - R[None]
    dr = jnp.sqrt(jnp.maximum(jnp.sum(d**2, axis=-1), EPS))
    mask = ~jnp.eye(R.shape[0], dtype=bool)
    return 0.5 * jnp.sum(jnp.where(mask, jnp.exp(-jnp.where(mask, dr, 1.0)), 0.0))


def energy_pairs(R):  # the same energy over i < j only: no zero distance
    i, j = np.triu_indices(R.shape[0], 1)
    return jnp.sum(jnp.exp(-jnp.linalg.norm(R[i] - R[j], axis=-1)))


POS = jax.random.normal(jax.random.key(0), (8, 2))


def test_a_masked_norm_at_zero_under_grad_gets_the_norm_fix_and_names_the_call():
    # plain JAX: NaN on the diagonal (norm's sqrt' at 0 is +Inf, the where's zero times it)
    assert np.isnan(jax.grad(energy_norm)(POS)).any()
    o = sowviz.inspect(energy_norm, POS, mode="grad").locate_nonfinite()
    msg = o.backward.message
    line = _line(energy_norm, 1)
    assert msg.startswith(
        f"born in the backward of `sqrt` in `norm` at {HERE}:{line}, reaching the input of "
        f"`norm` ({HERE}:{line})"
    ), msg
    assert "reduce_sum" not in msg, msg
    assert (
        "the value of `norm` is finite but its derivative is not at a zero vector (a distance "
        "of 0, as a point's to itself: its `sqrt`'s derivative 0.5 / sqrt(x) is infinite at "
        f"x = 0), and a `jnp.where` at {HERE}:{line + 2} masks the value, not its backward "
        "(0 × Inf = NaN). Fix: `jnp.sqrt(jnp.maximum(jnp.sum(d ** 2, axis=-1), eps))` in "
        "place of `jnp.linalg.norm(d, axis=-1)`, or the double-where trick"
    ) in msg, msg
    assert "Give `sqrt` an input" not in msg, msg


def test_the_norm_fix_gives_finite_gradients_equal_to_plain_jax_where_defined():
    g = jax.grad(energy_fixed)(POS)
    expected = jax.grad(energy_pairs)(POS)  # plain JAX, every distance nonzero
    assert np.all(np.isfinite(expected)) and np.all(np.isfinite(g))
    np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(energy_fixed(POS), energy_pairs(POS), rtol=1e-6)
