"""Flax Linen: one module called from several lines is a stage per call, named by what
each line assigns, as Haiku's, Equinox's and NNX's are (round 17). Linen pushes a
module's scope itself, so calls in a row shared one scope: double DQN's three
`network.apply`s were `QNet`, `QNet#2`, `QNet#3`; a `__call__` using one submodule on
two lines (`h = self.dense(x)`, `y = self.dense(h)`: weight sharing) was ONE stage
`dense` of both calls; a user submodule so called was `block` > `Block`, `Block#2`.
Calls from one line (a Python loop's) stay one stage, a single call is as it was, and
the stages' statistics are those of each call (checked against `jax.grad`)."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

nn = pytest.importorskip("flax.linen")


def _line(fn, marker: str) -> int:
    """The line of `fn`'s source holding `marker`."""
    lines, start = inspect.getsourcelines(fn)
    (k,) = [k for k, text in enumerate(lines) if marker in text]
    return start + k


def _l2(x) -> float:
    return float(jnp.linalg.norm(x))


def _children(nodes: list[dict], parent: dict) -> list[dict]:
    return [n for n in nodes if n.get("parent") == parent["id"]]


def _stages(nodes: list[dict], parent: dict) -> list[str]:
    return [n["label"] for n in _children(nodes, parent) if n["kind"] == "scope"]


def _node(nodes: list[dict], label: str) -> dict:
    (n,) = [n for n in nodes if n["label"] == label]
    return n


# -- double DQN: one network applied on three lines -----------------------------------
class QNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(8)(x))
        return nn.Dense(3)(x)


network = QNet()


def dqn_loss(params, target_params, obs_tm1, a_tm1, r_t, obs_t):
    q_tm1 = network.apply(params, obs_tm1)
    q_t_target = network.apply(target_params, obs_t)
    q_t_online = network.apply(params, obs_t)
    return _double_q(q_tm1, q_t_target, q_t_online, a_tm1, r_t)


def _double_q(q_tm1, q_t_target, q_t_online, a_tm1, r_t):
    a_t = jnp.argmax(q_t_online, -1)
    best = jnp.take_along_axis(q_t_target, a_t[:, None], -1)[:, 0]
    target = jax.lax.stop_gradient(r_t + 0.99 * best)
    q_a = jnp.take_along_axis(q_tm1, a_tm1[:, None], -1)[:, 0]
    return jnp.mean((target - q_a) ** 2)


def single_loss(params, obs):
    q = network.apply(params, obs)
    return jnp.mean(q**2)


def _dqn_args():
    k = jax.random.split(jax.random.PRNGKey(0), 6)
    return (
        network.init(k[0], jnp.zeros((1, 4))),
        network.init(k[1], jnp.zeros((1, 4))),
        jax.random.normal(k[2], (5, 4)),
        jax.random.randint(k[3], (5,), 0, 3),
        jax.random.normal(k[4], (5,)),
        jax.random.normal(k[5], (5, 4)),
    )


def test_three_applies_of_one_linen_network_are_three_stages_named_by_their_lines():
    args = _dqn_args()
    online, target, obs_tm1, a_tm1, r_t, obs_t = args
    ins = sowviz.inspect(dqn_loss, *args)
    nodes = ins.to_dict()["nodes"]
    root = nodes[0]
    names = ("q_tm1", "q_t_target", "q_t_online")
    assert [s for s in _stages(nodes, root) if "QNet" in s] == [f"{v}: QNet" for v in names]
    for var in names:
        stage = _node(nodes, f"{var}: QNet")
        # each sourced at its own line, each holding one pass of the network
        assert stage["source"]["line"] == _line(dqn_loss, f"{var} = network.apply")
        assert _stages(nodes, stage) == ["Dense_0", "Dense_1"]
        assert stage["n_eqns"] == 9
    # each stage's values are its own call's, found by the line's name
    qs = {
        "q_tm1": network.apply(online, obs_tm1),
        "q_t_target": network.apply(target, obs_t),
        "q_t_online": network.apply(online, obs_t),
    }
    cots = jax.grad(_double_q, argnums=(0, 1, 2))(*qs.values(), a_tm1, r_t)
    for (var, q), cot in zip(qs.items(), cots, strict=True):
        got = ins.probe(var).summaries
        np.testing.assert_allclose(got["primal"]["l2"], _l2(q), rtol=1e-5)
        if var == "q_tm1":
            np.testing.assert_allclose(got["cotangent"]["l2"], _l2(cot), rtol=1e-5)
        else:  # (no gradient reaches the target's passes: `stop_gradient`, `argmax`)
            assert _l2(cot) == 0.0 and "cotangent" not in got
    # the online network's gradient: from `q_tm1`'s pass alone (the others' stopped)
    grads = jax.grad(dqn_loss)(*args)
    w = ins.probe("parameters/params/Dense_0/kernel").summaries["cotangent"]["l2"]
    np.testing.assert_allclose(w, _l2(grads["params"]["Dense_0"]["kernel"]), rtol=1e-5)
    value, got_grads = ins.result
    np.testing.assert_allclose(value, dqn_loss(*args), rtol=1e-6)
    np.testing.assert_allclose(
        got_grads["params"]["Dense_1"]["kernel"], grads["params"]["Dense_1"]["kernel"], rtol=1e-5
    )


def test_a_single_apply_is_unchanged():
    online, _, obs, *_ = _dqn_args()
    ins = sowviz.inspect(single_loss, online, obs)
    nodes = ins.to_dict()["nodes"]
    (stage,) = [n for n in nodes if "QNet" in n["label"]]
    assert stage["label"] == "QNet"
    assert _stages(nodes, stage) == ["Dense_0", "Dense_1"]
    got = ins.probe("QNet").summaries["primal"]["l2"]
    np.testing.assert_allclose(got, _l2(network.apply(online, obs)), rtol=1e-5)


# -- one submodule called on two lines of a `__call__` ---------------------------------
class Tied(nn.Module):
    """One `Dense` applied twice: its weights shared by the two calls."""

    def setup(self):
        self.dense = nn.Dense(4)

    def __call__(self, x):
        h = self.dense(x)
        y = self.dense(h)
        return y


class TiedCompact(nn.Module):
    @nn.compact
    def __call__(self, x):
        dense = nn.Dense(4)
        h = dense(x)
        y = dense(jnp.tanh(h))
        return y


class Looped(nn.Module):
    @nn.compact
    def __call__(self, x):
        dense = nn.Dense(4)
        for _ in range(3):
            x = dense(x)
        return x


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        return jnp.tanh(nn.Dense(4)(x))


class Outer(nn.Module):
    def setup(self):
        self.block = Block()

    def __call__(self, x):
        h = self.block(x)
        y = self.block(h)
        return y


X = jax.random.normal(jax.random.PRNGKey(1), (5, 4))


def _sum_sq(model):
    def loss(params, x):
        return jnp.sum(model.apply(params, x) ** 2)

    return loss


def test_a_submodule_called_on_two_lines_is_two_stages_with_their_own_statistics():
    model = Tied()
    params = model.init(jax.random.PRNGKey(0), X)
    ins = sowviz.inspect(_sum_sq(model), params, X)
    nodes = ins.to_dict()["nodes"]
    tied = _node(nodes, "Tied")
    assert _stages(nodes, tied) == ["h: dense", "y: dense"]
    for var in ("h", "y"):
        stage = _node(nodes, f"{var}: dense")
        assert stage["source"]["line"] == _line(Tied.__call__, f"{var} = self.dense")
        assert stage["n_eqns"] == 3
    # what each call computes, and the gradient reaching it
    kernel, bias = params["params"]["dense"]["kernel"], params["params"]["dense"]["bias"]

    def from_h(h):
        return jnp.sum((h @ kernel + bias) ** 2)

    h = X @ kernel + bias
    y = h @ kernel + bias
    for var, value, cot in (("h", h, jax.grad(from_h)(h)), ("y", y, 2 * y)):
        got = ins.probe(var).summaries
        np.testing.assert_allclose(got["primal"]["l2"], _l2(value), rtol=1e-5)
        np.testing.assert_allclose(got["cotangent"]["l2"], _l2(cot), rtol=1e-5)
    # the shared kernel's gradient: both calls'
    grads = jax.grad(_sum_sq(model))(params, X)
    w = ins.probe("params.dense.kernel").summaries["cotangent"]["l2"]
    np.testing.assert_allclose(w, _l2(grads["params"]["dense"]["kernel"]), rtol=1e-5)


def test_a_compact_submodule_called_on_two_lines_is_two_stages():
    model = TiedCompact()
    params = model.init(jax.random.PRNGKey(0), X)
    ins = sowviz.inspect(_sum_sq(model), params, X, mode="primal")
    nodes = ins.to_dict()["nodes"]
    assert _stages(nodes, _node(nodes, "TiedCompact")) == ["h: Dense_0", "y: Dense_0"]
    dense = nn.Dense(4)
    sub = {"params": params["params"]["Dense_0"]}
    h = dense.apply(sub, X)
    np.testing.assert_allclose(ins.probe("h").summaries["primal"]["l2"], _l2(h), rtol=1e-5)
    y = dense.apply(sub, jnp.tanh(h))
    np.testing.assert_allclose(ins.probe("y").summaries["primal"]["l2"], _l2(y), rtol=1e-5)


def test_calls_of_a_submodule_from_one_loop_line_stay_one_stage():
    model = Looped()
    params = model.init(jax.random.PRNGKey(0), X)
    ins = sowviz.inspect(_sum_sq(model), params, X, mode="primal")
    nodes = ins.to_dict()["nodes"]
    looped = _node(nodes, "Looped")
    assert _stages(nodes, looped) == ["Dense_0"]
    assert _node(nodes, "Dense_0")["n_eqns"] == 9
    np.testing.assert_allclose(ins.result, _sum_sq(model)(params, X), rtol=1e-5)


def test_a_user_submodule_called_on_two_lines_is_two_stages_holding_one_pass_each():
    model = Outer()
    params = model.init(jax.random.PRNGKey(0), X)
    ins = sowviz.inspect(_sum_sq(model), params, X, mode="primal")
    nodes = ins.to_dict()["nodes"]
    assert _stages(nodes, _node(nodes, "Outer")) == ["h: block", "y: block"]
    for var in ("h", "y"):
        stage = _node(nodes, f"{var}: block")
        assert _stages(nodes, stage) == ["Dense_0"]  # (not `block` > `Block`, `Block#2`)
        assert stage["n_eqns"] == 4
    block = {"params": params["params"]["block"]}
    h = Block().apply(block, X)
    np.testing.assert_allclose(ins.probe("h").summaries["primal"]["l2"], _l2(h), rtol=1e-5)
    y = Block().apply(block, h)
    np.testing.assert_allclose(ins.probe("y").summaries["primal"]["l2"], _l2(y), rtol=1e-5)


# -- a top-level function applying one model on two lines ------------------------------
dense = nn.Dense(4)


def two_applies(params, x, z):
    a = dense.apply(params, x)
    b = dense.apply(params, z)
    return jnp.sum(a * b)


def test_a_model_applied_on_two_lines_of_a_function_is_two_stages():
    z = jax.random.normal(jax.random.PRNGKey(2), (5, 4))
    params = dense.init(jax.random.PRNGKey(0), X)
    ins = sowviz.inspect(two_applies, params, X, z)
    nodes = ins.to_dict()["nodes"]
    assert _stages(nodes, nodes[0])[-2:] == ["a: Dense", "b: Dense"]
    a, b = dense.apply(params, X), dense.apply(params, z)
    for var, value, cot in (("a", a, b), ("b", b, a)):
        got = ins.probe(var).summaries
        np.testing.assert_allclose(got["primal"]["l2"], _l2(value), rtol=1e-5)
        np.testing.assert_allclose(got["cotangent"]["l2"], _l2(cot), rtol=1e-5)


# -- a module method called on two lines ----------------------------------------------
class AutoEncoder(nn.Module):
    def setup(self):
        self.enc = nn.Dense(4)

    def encode(self, x):
        return self.enc(x)

    def __call__(self, x):
        z1 = self.encode(x)
        z2 = self.encode(z1)
        return z2


def test_a_method_called_on_two_lines_is_two_stages_not_stacked_as_repeats():
    model = AutoEncoder()
    params = model.init(jax.random.PRNGKey(0), X)
    ins = sowviz.inspect(_sum_sq(model), params, X, mode="primal")
    nodes = ins.to_dict()["nodes"]
    # (calls from two lines, each named by its own: no `z1–2: … (×2)` group of them)
    stages = _stages(nodes, _node(nodes, "AutoEncoder"))
    assert stages == ["z1: AutoEncoder.encode", "z2: AutoEncoder.encode"]
    for var in ("z1", "z2"):
        assert _stages(nodes, _node(nodes, f"{var}: AutoEncoder.encode")) == ["enc"]
    z1 = model.apply(params, X, method=AutoEncoder.encode)
    np.testing.assert_allclose(ins.probe("z1").summaries["primal"]["l2"], _l2(z1), rtol=1e-5)
