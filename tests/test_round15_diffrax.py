"""Round 15: diffrax's implicit solvers, the adjoint advice per mode, default tangents
on a time grid."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import sowviz

diffrax = pytest.importorskip("diffrax")
optx = pytest.importorskip("optimistix")


# -- an implicit solver's tested NaN is part of the library's fill ----------------------


def _implicit_loss(k, y0):
    # VeryChord's convergence test divides its starting `diffsize = inf` and compares
    # the NaN it gets (masked by `step >= 2`): a NaN that becomes no value.
    solver = diffrax.ImplicitEuler(
        root_finder=diffrax.VeryChord(rtol=1e-5, atol=1e-5, norm=optx.max_norm)
    )
    term = diffrax.ODETerm(lambda t, y, k: -k * y)
    saveat = diffrax.SaveAt(ts=jnp.linspace(0.0, 1.0, 3))
    sol = diffrax.diffeqsolve(term, solver, 0.0, 1.0, 0.25, y0, args=k, saveat=saveat)
    return jnp.sum(sol.ys**2)


def test_an_implicit_solve_is_a_library_fill_not_an_origin():
    k, y0 = jnp.array(0.5), jnp.array([1.0, 2.0])
    ins = sowviz.inspect(_implicit_loss, k, y0, mode="grad")
    value, grad = jax.value_and_grad(_implicit_loss)(k, y0)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-6)
    o = ins.nonfinite
    # It was "NaN/Inf starts here (forward)" on `diffeqsolve`, first made by
    # `_allocate_output`, with a Locate button; Tsit5's solve read as a library fill.
    assert o.forward is None and o.backward is None and not o.alarm and o.removed, o.message
    assert o.message.startswith("Only +Inf fill values, first made by `_allocate_output`")
    assert "a NaN in `VeryChord.terminate:" in o.message, o.message
    rec = ins.to_dict()["nonfinite"]
    assert rec["forward"] is None and not rec["propagators"] and rec["expected"]


def _factor(d, prev):
    rate = d / prev
    return rate * rate / (1.0 - rate)  # inf * inf / -inf = NaN while `d` is the fill


def _solver_like(tested):
    """A scan carrying a +Inf buffer and a +Inf `d`, whose step computes a NaN of `d` at
    step 0: `tested` only compares it (a convergence test); else a `jnp.where` selects
    it away from a float value (a masked NaN)."""

    def f(x):
        def body(c, i):
            buf, d, prev = c
            factor = _factor(d, prev)
            step = x * (i + 1.0)
            if tested:
                new = jnp.where((factor > 0) & (i >= 2), 0.0, step)
            else:
                new = jnp.where(i >= 2, factor, step)
            return (buf.at[i].set(new), jnp.abs(step) + 1.0, d), None

        c0 = (jnp.full((3,), jnp.inf), jnp.float32(jnp.inf), jnp.float32(1.0))
        (buf, _, _), _ = lax.scan(body, c0, jnp.arange(3))
        return jnp.sum(buf**2)

    return f


@pytest.mark.parametrize("tested", [True, False])
def test_a_nan_only_tests_read_is_fill_a_masked_one_keeps_its_flag(tested):
    f = _solver_like(tested)
    x = jnp.float32(0.5)
    ins = sowviz.inspect(f, x, mode="grad")
    value, grad = jax.value_and_grad(f)(x)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-6)
    o = ins.nonfinite
    assert o.removed and not o.alarm, o.message
    if tested:
        assert o.forward is None, o.message
        assert o.message.startswith("Only +Inf fill values, first made by `c0`"), o.message
        assert "a NaN in `_factor`" in o.message and "only comparisons read" in o.message
    else:  # the NaN reaches a float value (masked by the select): not a fill, flagged
        assert o.forward is not None, o.message
        assert "Only +Inf" not in o.message


# -- the adjoint to pass, per mode, and following it works --------------------------------


def _ode_loss(adjoint):
    def loss(k, y0):
        term = diffrax.ODETerm(lambda t, y, k: -k * y)
        saveat = diffrax.SaveAt(ts=jnp.linspace(0.0, 1.0, 3))
        sol = diffrax.diffeqsolve(
            term,
            diffrax.Tsit5(),
            0.0,
            1.0,
            0.25,
            y0,
            args=k,
            saveat=saveat,
            adjoint=adjoint,
            max_steps=16,  # (DirectAdjoint compiles a loop as deep as max_steps allows)
        )
        return jnp.sum(sol.ys**2)

    return loss


_K, _Y0 = jnp.array(0.7), jnp.array([1.0, 2.0])
_TANGENTS = (jnp.array(1.0), jnp.array([0.5, -1.0]))


def test_mode_all_advises_direct_adjoint_and_it_works():
    with pytest.raises(TypeError, match=r"adjoint=diffrax\.DirectAdjoint\(\)") as info:
        sowviz.inspect(_ode_loss(diffrax.RecursiveCheckpointAdjoint()), _K, _Y0, mode="all")
    assert "mode 'all'" in str(info.value)
    # ForwardMode, the advice for mode jvp, fails backward in mode all; its error names
    # DirectAdjoint for mode all too
    with pytest.raises(ValueError, match=r"mode 'all'.*diffrax\.DirectAdjoint\(\)"):
        sowviz.inspect(_ode_loss(diffrax.ForwardMode()), _K, _Y0, mode="all")
    loss = _ode_loss(diffrax.DirectAdjoint())
    ins = sowviz.inspect(loss, _K, _Y0, mode="all", tangents=_TANGENTS)
    # plain JAX: the tangent through ForwardMode, the gradients through the default
    value, tangent = jax.jvp(_ode_loss(diffrax.ForwardMode()), (_K, _Y0), _TANGENTS)
    grads = jax.grad(_ode_loss(diffrax.RecursiveCheckpointAdjoint()), argnums=(0, 1))(_K, _Y0)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-5)
    np.testing.assert_allclose(ins.result[1], tangent, rtol=1e-5)
    for got, want in zip(ins.result[2], grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_mode_jvp_advises_forward_mode_and_it_works():
    with pytest.raises(TypeError, match=r"adjoint=diffrax\.ForwardMode\(\)") as info:
        sowviz.inspect(_ode_loss(diffrax.RecursiveCheckpointAdjoint()), _K, _Y0, mode="jvp")
    assert "DirectAdjoint" not in str(info.value)
    ins = sowviz.inspect(_ode_loss(diffrax.ForwardMode()), _K, _Y0, mode="jvp", tangents=_TANGENTS)
    value, tangent = jax.jvp(_ode_loss(diffrax.DirectAdjoint()), (_K, _Y0), _TANGENTS)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-5)
    np.testing.assert_allclose(ins.result[1], tangent, rtol=1e-5)


# -- default tangents on a time grid ------------------------------------------------------


def _sde_loss(w, ts):
    # diffrax's neural-SDE example passes `ts`; its Brownian path refuses a tangent on t0
    bm = diffrax.VirtualBrownianTree(ts[0], ts[-1], tol=0.05, shape=(2,), key=jax.random.PRNGKey(0))
    terms = diffrax.MultiTerm(
        diffrax.ODETerm(lambda t, y, w: -w * y),
        diffrax.ControlTerm(lambda t, y, w: 0.1 * jnp.eye(2), bm),
    )
    sol = diffrax.diffeqsolve(
        terms,
        diffrax.Euler(),
        ts[0],
        ts[-1],
        0.25,
        jnp.ones(2),
        args=w,
        saveat=diffrax.SaveAt(ts=ts),
        adjoint=diffrax.ForwardMode(),
    )
    return jnp.sum(sol.ys**2)


def test_a_default_tangent_on_the_time_grid_is_named_and_argnums_fixes_it():
    w, ts = jnp.array(0.5), jnp.linspace(0.0, 1.0, 5)
    # It was Equinox's bare "Unexpected tangent. t0 cannot be autodifferentiated."
    with pytest.raises(RuntimeError, match=r"default tangent on argument `ts`") as info:
        sowviz.inspect(_sde_loss, w, ts, mode="jvp")
    msg = str(info.value)
    assert "`argnums=0`" in msg and "`argnums=0, tangents=(t_w, None)`" in msg, msg
    assert msg.endswith("t0 cannot be autodifferentiated."), msg
    # the advice holds, and equals jax.jvp's along w alone
    ins = sowviz.inspect(_sde_loss, w, ts, mode="jvp", argnums=0, tangents=(jnp.array(1.0), None))
    value, tangent = jax.jvp(lambda w: _sde_loss(w, ts), (w,), (jnp.array(1.0),))
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-5)
    np.testing.assert_allclose(ins.result[1], tangent, rtol=1e-5)
    assert np.isfinite(sowviz.inspect(_sde_loss, w, ts, mode="jvp", argnums=0).result[1])
