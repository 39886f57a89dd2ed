"""Line boxes inside functions called more than once, and inside a module's stage."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import sowviz


def _children(graph, node_id):
    return [n.label for n in sorted(graph.nodes, key=lambda n: n.order) if n.parent == node_id]


def _probe_at(ins, node_id):
    (probe,) = (p for p in ins.probes if p.node == node_id and not p.leaf)
    return probe


# MAML: `forward` runs under `jax.grad` (the inner step), then again on the adapted
# parameters (the query loss)


def _forward(params, x):
    h = x
    for p in params[:-1]:
        h = jnp.tanh(h @ p["w"] + p["b"])
    return h @ params[-1]["w"] + params[-1]["b"]


def _mse(params, x, y):
    return jnp.mean((_forward(params, x) - y) ** 2)


def _adapt(params, xs, ys):
    g = jax.grad(_mse)(params, xs, ys)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, g)


def _maml_loss(params, xs, ys, xq, yq):
    adapted = _adapt(params, xs, ys)
    return _mse(adapted, xq, yq)


def _mlp():
    ks = jax.random.split(jax.random.key(0), 3)
    sizes = [(1, 8), (8, 8), (8, 1)]
    return [
        {"w": jax.random.normal(k, s) / s[0] ** 0.5, "b": 0.1 * jnp.ones(s[1])}
        for k, s in zip(ks, sizes, strict=True)
    ]


def test_a_function_called_again_after_a_grad_of_it_reads_by_line():
    # The query loss's `_forward` was 11 loose primitives: its lines, met again after
    # the inner step's call, were taken for a Python loop's passes (which stack)
    params = _mlp()
    xs = jnp.linspace(-1, 1, 8)[:, None]
    xq = jnp.linspace(-0.5, 1.5, 8)[:, None]
    ins = sowviz.inspect(_maml_loss, params, xs, jnp.sin(xs), xq, jnp.cos(xq))
    g = ins.graph
    top = [n for n in g.nodes if n.parent == "n0" and n.label.startswith("_mse")]
    query = top[-1]  # after the inner step's `_mse` and `_mse (backward)`
    (fwd,) = (n for n in g.nodes if n.parent == query.id and n.label == "_forward")
    assert _children(g, fwd.id) == ["h", "h#2", "h @ w + b"], _children(g, fwd.id)

    # the boxes carry the query pass's values: on the adapted parameters
    adapted = jax.jit(_adapt)(params, xs, jnp.sin(xs))
    h1 = jnp.tanh(xq @ adapted[0]["w"] + adapted[0]["b"])
    h2 = jnp.tanh(h1 @ adapted[1]["w"] + adapted[1]["b"])

    def rest(h):
        return jnp.mean((h @ adapted[2]["w"] + adapted[2]["b"] - jnp.cos(xq)) ** 2)

    dh2 = jax.grad(rest)(h2)
    (box,) = (n for n in g.nodes if n.parent == fwd.id and n.label == "h#2")
    got = _probe_at(ins, box.id).summaries
    np.testing.assert_allclose(got["primal"]["mean"], float(jnp.mean(h2)), rtol=1e-5)
    np.testing.assert_allclose(got["primal"]["l2"], float(jnp.linalg.norm(h2)), rtol=1e-5)
    np.testing.assert_allclose(got["cotangent"]["l2"], float(jnp.linalg.norm(dh2)), rtol=1e-4)


# A helper each layer of a Python loop over layers calls (an S5 stack's ZOH step)


def _discretize(lam, b, step):
    lam_bar = jnp.exp(lam * step)
    b_bar = ((lam_bar - 1.0) / lam)[:, None] * b
    return lam_bar, b_bar


class _Layer(eqx.Module):
    log_lam: jax.Array
    b: jax.Array

    def __call__(self, u):
        lam = -jnp.exp(self.log_lam)
        lam_bar, b_bar = _discretize(lam, self.b, 0.1)
        return jnp.tanh(u @ b_bar.T * lam_bar)


class _Stack(eqx.Module):
    layers: list

    def __call__(self, u):
        for layer in self.layers:
            u = u + layer(u)
        return u


def _stack_loss(m, u):
    return jnp.sum(m(u) ** 2)


def _layer(key):
    return _Layer(jax.random.normal(key, (3,)), 0.3 * jax.random.normal(key, (3, 3)))


def test_a_helper_every_layer_calls_keeps_its_line_names():
    # `lam_bar`, `b_bar` read `mul`, `exp`, `div`, `sub`, ... once the layer ran twice:
    # each call's lines were taken for a loop's passes over them
    keys = jax.random.split(jax.random.key(1), 2)
    u = jax.random.normal(keys[0], (5, 3))
    for n in (1, 2):
        g = sowviz.inspect(_stack_loss, _Stack([_layer(k) for k in keys[:n]]), u).graph
        helpers = [x.id for x in g.nodes if x.label.startswith("_discretize")]
        assert len(helpers) == n, [x.label for x in g.nodes]
        for h in helpers:
            assert _children(g, h) == ["lam_bar", "b_bar"], (n, _children(g, h))


def _looped(params, x):
    # one call of `_looped`, its line run per pass: each pass's line is a box
    for p in params:
        x = jnp.tanh(x @ p["w"] + p["b"])
    return jnp.sum(x)


def _twice(params, x):
    return _looped(params, x) + _looped(params, 2.0 * x)


def test_a_loop_of_lines_in_a_function_called_twice_reads_per_pass_in_each_call():
    params = [{"w": jnp.eye(4) * 0.5, "b": jnp.ones(4) * 0.1}] * 2
    g = sowviz.inspect(_twice, params, jnp.ones((3, 4))).graph
    calls = [n.id for n in g.nodes if n.label.startswith("_looped")]
    assert len(calls) == 2, [n.label for n in g.nodes]
    for c in calls:
        assert _children(g, c)[:2] == ["x", "x#2"], _children(g, c)
