"""Round 17, RL tester: a value behind `jax.lax.stop_gradient` (a TD target) that
depends on the differentiated parameters is explained as stopped, not independent."""

import jax
import jax.numpy as jnp
import numpy as np

import sowviz


def td_loss(w, obs_tm1, a_tm1, r_t, obs_t):
    q_tm1 = obs_tm1 @ w
    q_t = obs_t @ w
    target = jax.lax.stop_gradient(r_t + 0.99 * q_t.max(-1))
    q_a = jnp.take_along_axis(q_tm1, a_tm1[:, None], -1)[:, 0]
    return jnp.mean((target - q_a) ** 2)


def _args():
    k = jax.random.split(jax.random.PRNGKey(0), 5)
    w = jax.random.normal(k[0], (4, 3))
    return w, (
        jax.random.normal(k[1], (8, 4)),
        jax.random.randint(k[2], (8,), 0, 3),
        jax.random.normal(k[3], (8,)),
        jax.random.normal(k[4], (8, 4)),
    )


def test_a_stop_gradient_target_is_stopped_and_names_its_line():
    w, args = _args()
    ins = sowviz.inspect(td_loss, w, *args, mode="grad")
    value, grad = jax.value_and_grad(td_loss)(w, *args)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-5, atol=1e-7)
    # the target depends on w (without the stop its derivative is not zero)
    unstopped = jax.jacobian(lambda w: args[2] + 0.99 * (args[3] @ w).max(-1))(w)
    assert float(jnp.abs(unstopped).max()) > 0
    p = ins.probe("target")
    assert "cotangent" not in p.typed_summaries
    assert p.no_cotangent == "stopped"
    line = td_loss.__code__.co_firstlineno + 3
    assert p.stopped_by["primitive"] == "stop_gradient"
    assert p.stopped_by["source"]["line"] == line
    assert p.stopped_by["source"]["file"].endswith("test_round17_rl.py")
    d = next(q for q in ins.to_dict()["probes"] if q["name"] == "target")
    assert d["no_cotangent"] == "stopped" and d["stopped_by"] == p.stopped_by
    # an input the loss reads, not differentiated: independent still
    assert ins.probe("obs_tm1").no_cotangent == "independent"


def test_stop_gradient_of_an_undifferentiated_value_is_independent():
    # `r_t` is not differentiated (argnums=0): its stopped copy depends on no parameter
    def loss(w, r):
        target = jax.lax.stop_gradient(r * 2.0)
        return jnp.sum((w - target) ** 2)

    w, r = jnp.arange(3.0), jnp.ones(3)
    ins = sowviz.inspect(loss, w, r, mode="grad")
    np.testing.assert_allclose(ins.result[1], jax.grad(loss)(w, r))
    assert ins.probe("target").no_cotangent == "independent"
    assert ins.probe("target").stopped_by is None
    # differentiating `r` too: now it depends on it, and the stop cut it
    ins = sowviz.inspect(loss, w, r, mode="vjp")
    assert ins.probe("target").no_cotangent == "stopped"


def test_a_cut_inside_a_scan_is_found_through_the_carry():
    def loss(w, xs):
        def step(c, x):
            t = jax.lax.stop_gradient(c * w)
            return c + x * w, t

        c, ts = jax.lax.scan(step, jnp.zeros(()), xs)
        total = jnp.sum(ts) + c
        return total

    w, xs = jnp.array(0.5), jnp.arange(4.0)
    ins = sowviz.inspect(loss, w, xs, mode="grad")
    np.testing.assert_allclose(ins.result[1], jax.grad(loss)(w, xs), rtol=1e-6)
    stopped = [p for p in ins.probes if p.no_cotangent == "stopped"]
    assert stopped, [(p.name, p.no_cotangent) for p in ins.probes]
    assert all(p.stopped_by["primitive"] == "stop_gradient" for p in stopped)
