"""Round 12 of the graph's names: a line assigning a name is one box named by what it
assigns, at a level of any size, from one equation on (`amplitude = jnp.exp(...)`),
and a `jax.tree.map` lambda's line is one box however many stages its leaves make."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import sowviz


def _top(ins):
    g = ins.graph
    # (not the arguments' groups: `parameters`, `batch`)
    return [n.label for n in g.children(g.root) if n.kind != "output" and n.source is not None]


def _kids(ins, label):
    g = ins.graph
    (parent,) = (n for n in g.nodes if n.label == label)
    return [n.label for n in g.children(parent.id)]


# --- a big top level: every assignment line is a box with data ------------------------


def _long_loss(w, x):
    a = jnp.tanh(x @ w) + 1.0
    b = jnp.sin(a) * 2.0
    c = jnp.cos(b) - a
    d = jnp.exp(-c) * b
    e = jnp.log1p(d**2)
    f = jnp.sqrt(e + 1.0)
    r = lax.reduce_precision(f, exponent_bits=5, mantissa_bits=10)
    g = jnp.abs(r) * c
    topv, _topi = lax.top_k(g, 3)
    k = jnp.maximum(topv, 0.1) * 3.0
    m = jnp.minimum(k, 5.0) + 1.0
    return jnp.sum(m**2) + jnp.mean(g)


def test_a_big_top_level_s_short_lines_are_boxes_with_data():
    # 16 of 20 top-level boxes (`sin`, `mul`, `reduce_precision`, `top_k`, ...) carried
    # no value and no gradient: lines of one or two equations were not folded
    w = jax.random.normal(jax.random.PRNGKey(0), (6, 8))
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 6))
    ins = sowviz.inspect(_long_loss, w, x)
    top = _top(ins)
    assert top[:-1] == ["a", "b", "c", "d", "e", "f", "r", "g", "topv, _topi", "k", "m"], top
    probed = {p.node for p in ins.probes}
    assert all(n.id in probed for n in ins.graph.children(ins.graph.root)), top
    assert _kids(ins, "r") == ["reduce_precision"]
    # values and gradients are plain JAX's
    a = jnp.tanh(x @ w) + 1.0
    b = jnp.sin(a) * 2.0

    def rest(b):
        c = jnp.cos(b) - a
        d = jnp.exp(-c) * b
        e = jnp.log1p(d**2)
        f = jnp.sqrt(e + 1.0)
        r = lax.reduce_precision(f, exponent_bits=5, mantissa_bits=10)
        g = jnp.abs(r) * c
        topv, _ = lax.top_k(g, 3)
        m = jnp.minimum(jnp.maximum(topv, 0.1) * 3.0, 5.0) + 1.0
        return jnp.sum(m**2) + jnp.mean(g)

    got = ins.probe("b").summaries
    np.testing.assert_allclose(got["primal"]["l2"], float(jnp.linalg.norm(b)), rtol=1e-5)
    want = jax.grad(rest)(b)
    np.testing.assert_allclose(got["cotangent"]["l2"], float(jnp.linalg.norm(want)), rtol=1e-4)
    f = jnp.sqrt(jnp.log1p((jnp.exp(-(jnp.cos(b) - a)) * b) ** 2) + 1.0)
    r = lax.reduce_precision(f, exponent_bits=5, mantissa_bits=10)
    got = ins.probe("r").summaries["primal"]
    np.testing.assert_allclose(got["max"], float(r.max()), rtol=1e-6)


# --- one-equation lines at a small level -----------------------------------------------


def _kernel(params, x):
    amplitude = jnp.exp(params["log_amplitude"])
    length_scale = jnp.exp(params["log_length_scale"])
    noise = jnp.exp(params["log_noise"])
    q = jnp.einsum("i,i->i", x, x)
    log_accept = q - noise
    return jnp.sum(amplitude * log_accept / length_scale)


def test_one_equation_assignment_lines_are_named_by_what_they_assign():
    # `amplitude = jnp.exp(...)` was drawn `exp` beside `q = jnp.einsum(...)`'s `q`
    params = {
        "log_amplitude": jnp.float32(0.1),
        "log_length_scale": jnp.float32(0.2),
        "log_noise": jnp.float32(0.3),
    }
    x = jnp.arange(3.0)
    ins = sowviz.inspect(_kernel, params, x)
    top = _top(ins)
    assert top[:5] == ["amplitude", "length_scale", "noise", "q", "log_accept"], top
    assert _kids(ins, "amplitude") == ["exp"] and _kids(ins, "log_accept") == ["sub"]
    got = ins.probe("amplitude").summaries
    np.testing.assert_allclose(got["primal"]["max"], float(np.exp(0.1)), rtol=1e-6)
    q = x * x
    want = jnp.sum((q - np.exp(0.3)) / np.exp(0.2))  # d loss / d amplitude
    np.testing.assert_allclose(got["cotangent"]["max"], float(want), rtol=1e-5)


def _fold_in_line(w, key):
    k = jax.random.fold_in(key, 3)
    return jnp.sum((w * jax.random.normal(k, (3,))) ** 2)


def test_a_key_s_one_equation_line_keeps_its_primitive():
    # no value to show: a key's line is no box of its own (raw key or typed alike)
    for make in (jax.random.PRNGKey, jax.random.key):
        ins = sowviz.inspect(_fold_in_line, jnp.ones(3), make(0))
        assert _top(ins)[0] == "random_fold_in", _top(ins)


# --- a tree.map lambda's line -------------------------------------------------------------


def _shuffle(batch, perm):
    shuffled = jax.tree.map(lambda x: jnp.take(x, perm, axis=0), batch)
    return sum(jnp.sum(v * v) for v in jax.tree.leaves(shuffled))


def _reset(done, fresh, current):
    state = jax.tree.map(lambda r, s: jnp.where(done, r, s), fresh, current)
    return sum(jnp.sum(v) for v in jax.tree.leaves(state))


def test_a_tree_map_lambda_line_is_one_box_named_by_its_line():
    # `jnp.take` per leaf was `take (×3)`, `take#4`, `take#5`: boxes reading just `take`
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    batch = {
        "obs": jax.random.normal(k[0], (16, 4)),
        "logp": jax.random.normal(k[1], (16,)),
        "value": jax.random.normal(k[2], (16, 1)),
    }
    perm = jax.random.permutation(k[3], 16)
    ins = sowviz.inspect(_shuffle, batch, perm, mode="primal")
    assert _top(ins)[0] == "shuffled", _top(ins)
    assert sorted(_kids(ins, "shuffled")) == ["take", "take#2", "take#3"]
    leaves = jax.tree.leaves(jax.tree.map(lambda x: x[perm], batch))
    got = [ins.probe("shuffled", leaf=f"[{k}]").summaries for k in range(len(leaves))]
    got_l2 = sorted(s["primal"]["l2"] for s in got)
    want = sorted(float(jnp.linalg.norm(v)) for v in leaves)
    np.testing.assert_allclose(got_l2, want, rtol=1e-5)
    # `jnp.where` per leaf: `where` (4 blocks) and `where#5` before
    state = tuple(jnp.full((8,), float(i)) for i in range(5))
    fresh = tuple(jnp.zeros(8) for _ in range(5))
    done = jnp.arange(8) % 2 == 0
    ins = sowviz.inspect(_reset, done, fresh, state, mode="primal")
    assert _top(ins)[0] == "state", _top(ins)


# --- a small loop body's lines --------------------------------------------------------


def _gae(values, rewards, dones, last_val):
    def step(carry, x):
        gae, next_value = carry
        value, reward, done = x
        delta = reward + 0.99 * next_value * (1 - done) - value
        gae = delta + 0.99 * 0.95 * (1 - done) * gae
        return (gae, value), gae

    init = (jnp.zeros_like(last_val), last_val)
    _, adv = lax.scan(step, init, (values, rewards, dones), reverse=True)
    return adv


def test_a_small_scan_body_s_lines_are_named_by_what_they_assign():
    # drawn `sub, mul, mul, add, sub, add`, where a bigger program drew `delta`, `gae`
    t, n = 16, 8
    values = jax.random.normal(jax.random.PRNGKey(0), (t, n))
    rewards, dones, last_val = jnp.ones((t, n)), jnp.zeros((t, n)), jnp.ones(n)
    ins = sowviz.inspect(_gae, values, rewards, dones, last_val, mode="primal")
    (scan,) = (n for n in ins.graph.nodes if n.kind == "scan")
    assert [c.label for c in ins.graph.children(scan.id)] == ["delta", "gae"]
    adv = _gae(values, rewards, dones, last_val)
    got = ins.probe("gae").summaries["primal"]  # every iteration's rows: `adv`
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(adv)), rtol=1e-5)


def _reinforce(w, returns):
    logp = jnp.tanh(returns @ w)
    baseline = lax.stop_gradient(returns.mean(axis=1, keepdims=True))
    advantages = lax.stop_gradient(returns - baseline)
    return -jnp.mean(logp * advantages)


def test_a_stop_gradient_line_is_named_by_what_it_assigns():
    # `mean`, `stop_gradient`, `sub`, `stop_gradient` before
    returns = jax.random.normal(jax.random.PRNGKey(0), (16, 8))
    w = jnp.eye(8) * 0.5
    ins = sowviz.inspect(_reinforce, w, returns)
    assert _top(ins)[:3] == ["logp", "baseline", "advantages"], _top(ins)
    got = ins.probe("advantages").summaries["primal"]
    want = returns - returns.mean(axis=1, keepdims=True)
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(want)), rtol=1e-5)
