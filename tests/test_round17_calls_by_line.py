"""One module called from several lines is a stage per call, named by what each line
assigns (double DQN's `q_tm1`, `q_t_target`, `q_t_online` of one Haiku network; an
Equinox or NNX module's `a = m(x)`, `b = m(y)`), while calls from one line (a Python
loop's) stay one stacked stage; and a tuple argument the function unpacks on its top
line (`done, action, value, reward, log_prob, obs = traj`) has its leaves named
`[4] (log_prob)`, found by `probe("log_prob")` and `probe("traj[4]")`."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz


def _line(fn, marker: str) -> int:
    """The line of `fn`'s source holding `marker`."""
    lines, start = inspect.getsourcelines(fn)
    (k,) = [k for k, text in enumerate(lines) if marker in text]
    return start + k


def _l2(x) -> float:
    return float(jnp.linalg.norm(x))


def _dqn_setup():
    hk = pytest.importorskip("haiku")
    net = hk.without_apply_rng(hk.transform(lambda o: hk.nets.MLP([8, 3], name="q_network")(o)))

    def dqn_loss(online, target_params, obs_tm1, a_tm1, r_t, obs_t):
        q_tm1 = net.apply(online, obs_tm1)
        q_t_target = net.apply(target_params, obs_t)
        q_t_online = net.apply(online, obs_t)
        a_t = jnp.argmax(q_t_online, -1)
        best = jnp.take_along_axis(q_t_target, a_t[:, None], -1)[:, 0]
        target = jax.lax.stop_gradient(r_t + 0.99 * best)
        q_a = jnp.take_along_axis(q_tm1, a_tm1[:, None], -1)[:, 0]
        return jnp.mean((target - q_a) ** 2)

    k = jax.random.split(jax.random.PRNGKey(0), 6)
    online = net.init(k[0], jnp.zeros((1, 4)))
    target = net.init(k[1], jnp.zeros((1, 4)))
    args = (
        online,
        target,
        jax.random.normal(k[2], (5, 4)),
        jax.random.randint(k[3], (5,), 0, 3),
        jax.random.normal(k[4], (5,)),
        jax.random.normal(k[5], (5, 4)),
    )
    return net, dqn_loss, args


def test_three_applies_of_one_haiku_network_are_three_stages_named_by_their_lines():
    net, dqn_loss, args = _dqn_setup()
    online, target, obs_tm1, _, _, obs_t = args
    ins = sowviz.inspect(dqn_loss, *args, mode="primal")
    nodes = ins.to_dict()["nodes"]
    root = nodes[0]["id"]
    top = [n for n in nodes if n.get("parent") == root and "q_network" in n["label"]]
    assert [n["label"] for n in top] == [
        "q_tm1: q_network",
        "q_t_target: q_network",
        "q_t_online: q_network",
    ]
    # each sourced at its own line, each holding one pass of the MLP (not `linear_0#2`)
    for n, var in zip(top, ("q_tm1", "q_t_target", "q_t_online"), strict=True):
        assert n["source"]["line"] == _line(dqn_loss, f"{var} = net.apply")
        kids = sorted(c["label"] for c in nodes if c.get("parent") == n["id"])
        assert kids == ["linear_0", "linear_1", "relu"]
    # the target network's pass is the one `probe` finds by the line's name
    for name, params, obs in (
        ("q_t_target", target, obs_t),
        ("q_tm1", online, obs_tm1),
        ("q_t_online", online, obs_t),
    ):
        got = ins.probe(name).summaries["primal"]["l2"]
        np.testing.assert_allclose(got, _l2(net.apply(params, obs)), rtol=1e-5)
    np.testing.assert_allclose(ins.result, dqn_loss(*args), rtol=1e-6)


class _Tiny:
    """An Equinox MLP, called from three lines and three times from one loop line."""

    @staticmethod
    def three_lines(m, x, y, z):
        a = jax.vmap(m)(x)
        b_out = jax.vmap(m)(y)
        c = jax.vmap(m)(z)
        return jnp.sum(a * b_out + c)

    @staticmethod
    def one_line(m, x, y, z):
        h = x[0]
        for _ in range(3):
            h = m(h)
        return jnp.sum(h * y[0] + z[0])


def test_an_equinox_module_called_from_three_lines_is_three_stages():
    eqx = pytest.importorskip("equinox")
    m = eqx.nn.MLP(4, 4, 8, 1, key=jax.random.PRNGKey(0))
    x, y, z = (jax.random.normal(jax.random.PRNGKey(i), (2, 4)) for i in (1, 2, 3))
    ins = sowviz.inspect(_Tiny.three_lines, m, x, y, z)
    nodes = ins.to_dict()["nodes"]
    labels = [n["label"] for n in nodes if n["label"].endswith(": MLP")]
    assert labels == ["a: MLP", "b_out: MLP", "c: MLP"]
    got = ins.probe("b_out").summaries["primal"]["l2"]
    np.testing.assert_allclose(got, _l2(jax.vmap(m)(y)), rtol=1e-5)
    grads = eqx.filter_grad(_Tiny.three_lines)(m, x, y, z)
    w = ins.probe("layers[0].weight").summaries["cotangent"]["l2"]
    np.testing.assert_allclose(w, _l2(grads.layers[0].weight), rtol=1e-5)


def test_calls_of_a_module_from_one_loop_line_stay_one_stacked_stage():
    eqx = pytest.importorskip("equinox")
    m = eqx.nn.Linear(4, 4, key=jax.random.PRNGKey(0))
    x, y, z = (jax.random.normal(jax.random.PRNGKey(i), (2, 4)) for i in (1, 2, 3))
    ins = sowviz.inspect(_Tiny.one_line, m, x, y, z, mode="primal")
    nodes = ins.to_dict()["nodes"]
    linear = [n for n in nodes if "Linear" in n["label"]]
    # (one stage of the three calls, as before: not `h: Linear` per call)
    assert [n["label"] for n in linear] == ["Linear"]
    assert linear[0]["n_eqns"] == 6
    h = m(m(m(x[0])))
    np.testing.assert_allclose(ins.result, jnp.sum(h * y[0] + z[0]), rtol=1e-5)


def test_an_nnx_module_called_from_three_lines_is_three_stages():
    nnx = pytest.importorskip("flax.nnx")
    m = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
    x, y, z = (jax.random.normal(jax.random.PRNGKey(i), (2, 4)) for i in (1, 2, 3))
    ins = sowviz.inspect(_Tiny.three_lines, m, x, y, z, mode="primal")
    labels = [n["label"] for n in ins.to_dict()["nodes"] if n["label"].endswith(": Linear")]
    assert labels == ["a: Linear", "b_out: Linear", "c: Linear"]
    np.testing.assert_allclose(ins.probe("c").summaries["primal"]["l2"], _l2(m(z)), rtol=1e-5)


def _ppo_loss(w, traj, adv):
    _done, action, value, reward, log_prob, obs = traj
    logits = obs @ w
    lp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None], -1)[..., 0]
    ratio = jnp.exp(lp - log_prob)
    return -jnp.mean(ratio * adv) + jnp.mean((value - reward) ** 2)


def test_the_leaves_of_a_tuple_argument_unpacked_on_its_first_line_carry_their_names():
    k = jax.random.split(jax.random.PRNGKey(0), 6)
    traj = (
        jnp.zeros(16, bool),
        jax.random.randint(k[0], (16,), 0, 2),
        jax.random.normal(k[1], (16,)),
        jnp.ones(16),
        jax.random.normal(k[2], (16,)),
        jax.random.normal(k[3], (16, 4)),
    )
    w, adv = jax.random.normal(k[4], (4, 2)), jax.random.normal(k[5], (16,))
    ins = sowviz.inspect(_ppo_loss, w, traj, adv, argnums=(0, 1))
    nodes = ins.to_dict()["nodes"]
    (group,) = [n for n in nodes if n["label"] == "traj"]
    leaves = [n["label"] for n in nodes if n.get("parent") == group["id"]]
    assert "[4] (log_prob)" in leaves and "[5] (obs)" in leaves and "[2] (value)" in leaves

    # (the float leaves' gradients: the bool and int ones have none)
    def of_floats(floats):
        return _ppo_loss(w, (*traj[:2], *floats), adv)

    grads = (None, None, *jax.grad(of_floats)(traj[2:]))
    for name, k_ in (("log_prob", 4), ("traj[4]", 4), ("traj[4] (log_prob)", 4), ("obs", 5)):
        p = ins.probe(name)
        np.testing.assert_allclose(p.summaries["primal"]["l2"], _l2(traj[k_]), rtol=1e-5)
        np.testing.assert_allclose(p.summaries["cotangent"]["l2"], _l2(grads[k_]), rtol=1e-5)
