"""Round 16: NaN origins a physicist meets.

An MD loop whose forces are `-jax.grad(energy)` of `jnp.linalg.norm` distances (r = 0 on
the diagonal): before locating, the banner dismissed `norm`'s +Inf (its `sqrt`'s
derivative, which a 0 turns into the NaN) as "masked afterwards (not the origin)",
judging it by what the loop's body made only at a later iteration. And the backward of a
degenerate `eigh`/`svd` (repeated eigenvalues: 1 / (λi − λj)) said "`eigh` in `eigh`,
reaching `div`" and nothing of why.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import sowviz


def _energy(r):
    dr = jnp.linalg.norm(r[:, None] - r[None], axis=-1)  # 0 on the diagonal
    mask = ~jnp.eye(r.shape[0], dtype=bool)
    return 0.5 * jnp.sum(jnp.where(mask, jnp.exp(-dr), 0.0))


_force = jax.grad(lambda r: -_energy(r))


def _md_step(i, state):
    r, v = state
    v = v + 0.01 * _force(r)
    return r + 0.01 * v, v


def md_run(r0, v0):
    r, _ = lax.fori_loop(0, 3, _md_step, (r0, v0))
    return jnp.sum(r**2)


def test_md_banner_before_locating_points_at_norm_not_masked():
    r0 = jax.random.normal(jax.random.PRNGKey(0), (6, 2))
    v0 = jnp.zeros_like(r0)
    # plain JAX: the forces are NaN at the first step, made of norm's derivative at 0
    assert np.isnan(np.asarray(_force(r0))).any()
    _, tangent = jax.jvp(lambda d: jnp.linalg.norm(d), (jnp.zeros(2),), (jnp.ones(2),))
    assert not np.isfinite(tangent)
    ins = sowviz.inspect(md_run, r0, v0, mode="primal")
    fwd = ins.nonfinite.forward
    assert ins.graph.node(fwd.node).label == "norm", fwd.message
    assert "not the origin" not in fwd.message and "was masked" not in fwd.message
    assert "`norm`" in fwd.message and "iteration 0 of" in fwd.message, fwd.message
    assert "locate_nonfinite()" in fwd.message, fwd.message
    located = ins.locate_nonfinite().forward
    assert located.node == fwd.node  # the box the banner named holds the equation
    assert "`norm`" in located.message and "not the origin" not in located.message


def _eigh_loss(a):
    w, v = jnp.linalg.eigh(0.5 * (a + a.T))
    return jnp.sum(v[:, -1] ** 4) + jnp.sum(w**2)


def _eigvalsh_loss(a):  # the advice: only the eigenvalues
    return jnp.sum(jnp.linalg.eigvalsh(0.5 * (a + a.T)) ** 2)


def _eigh_tie_broken_loss(a):  # the advice: a small distinct diagonal
    eps = 1e-3
    w, v = jnp.linalg.eigh(0.5 * (a + a.T) + jnp.diag(eps * jnp.arange(a.shape[-1])))
    return jnp.sum(v[:, -1] ** 4) + jnp.sum(w**2)


def _grads_equal_plain_jax(fn, x):
    ins = sowviz.inspect(fn, x, mode="grad")
    assert ins.nonfinite is None
    value, grads = jax.value_and_grad(fn)(x)
    got = ins.result[1]
    got = got[0] if isinstance(got, tuple) else got
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_allclose(np.asarray(ins.result[0]), np.asarray(value), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got), np.asarray(grads), rtol=1e-5, atol=1e-6)


def test_degenerate_eigh_says_repeated_eigenvalues_and_its_fixes_work():
    a = jnp.eye(4)
    assert np.isnan(np.asarray(jax.grad(_eigh_loss)(a))).all()  # plain JAX: NaN
    ins = sowviz.inspect(_eigh_loss, a, mode="grad")
    msg = ins.locate_nonfinite().backward.message
    assert msg.startswith("born in the backward of `eigh` at "), msg
    assert "`eigh` in `eigh`" not in msg and "`div`" not in msg, msg
    assert "repeated eigenvalues" in msg and "1 / (λi − λj)" in msg, msg
    assert "`jnp.linalg.eigvalsh(a)`" in msg, msg
    assert msg.endswith("; non-finite gradient of `a`"), msg
    # both fixes it names give finite gradients, equal to plain JAX's
    _grads_equal_plain_jax(_eigvalsh_loss, a)
    _grads_equal_plain_jax(_eigh_tie_broken_loss, a)


def _svd_loss(x):
    u, s, _ = jnp.linalg.svd(x, full_matrices=False)
    return jnp.sum(u[:, 0] ** 4) + jnp.sum(s**2)


def _svdvals_loss(x):
    return jnp.sum(jnp.linalg.svdvals(x) ** 2)


def test_degenerate_svd_says_repeated_singular_values_and_svdvals_works():
    x = jnp.eye(4)
    assert np.isnan(np.asarray(jax.grad(_svd_loss)(x))).all()
    msg = sowviz.inspect(_svd_loss, x, mode="grad").locate_nonfinite().backward.message
    assert msg.startswith("born in the backward of `svd` at "), msg
    assert "`svd` in `svd`" not in msg and "reaching `x`" in msg, msg
    assert "repeated singular values" in msg and "`jnp.linalg.svdvals(x)`" in msg, msg
    _grads_equal_plain_jax(_svdvals_loss, x)
