"""Ports inside a body (round 13): a stage nested in a loop's body names a value
entering from outside the loop as the body does, or as its own function does; never by
what made the loop's first carry outside it."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from test_port_names import _ports

import sowviz


class _Layer(eqx.Module):
    lin: eqx.nn.Linear

    def __call__(self, h):
        return h + jnp.tanh(jax.vmap(self.lin)(h))


class _Net(eqx.Module):
    encoder: eqx.nn.Linear
    layer: _Layer

    def __call__(self, x):
        h = jax.vmap(self.encoder)(x)
        h, _ = jax.lax.scan(lambda h, _: (self.layer(h), None), h, None, length=3)
        return h


def _net_loss(net, x):
    return jnp.sum(net(x) ** 2)


def test_a_module_in_a_scan_body_names_its_input_as_the_body_does():
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    net = _Net(eqx.nn.Linear(3, 4, key=k[0]), _Layer(eqx.nn.Linear(4, 4, key=k[1])))
    x = jax.random.normal(k[2], (5, 3))
    ins = sowviz.inspect(_net_loss, net, x)
    ports = _ports(ins)
    # the carry's first value is made by `encoder`, outside the loop: the body's `h`
    # names it at the loop and at the layer inside it (it read `encoder: Linear`)
    assert list(ports["scan(_Layer)"].values()) == ["h"]
    assert ports["layer: _Layer"] == ports["scan(_Layer)"]
    loss, grads = eqx.filter_value_and_grad(_net_loss)(net, x)
    np.testing.assert_allclose(ins.result[0], loss, rtol=1e-6)
    want = jax.tree.leaves(eqx.filter(grads, eqx.is_array))
    for got, w in zip(jax.tree.leaves(eqx.filter(ins.result[1], eqx.is_array)), want, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)


def _p_sample(w, x, i):
    h = jnp.tanh(x @ w)
    return x - 0.1 * h + 0.01 * i


def _sample(w, key):
    x = jax.random.normal(key, (4, 3))

    def body(i, x):
        return _p_sample(w, x, i)

    return jnp.mean(jax.lax.fori_loop(0, 5, body, x) ** 2)


def test_a_function_of_yours_in_a_fori_body_takes_the_bodys_name():
    w, key = jnp.eye(3) * 0.5, jax.random.PRNGKey(0)
    ins = sowviz.inspect(_sample, w, key, mode="primal")
    ports = _ports(ins)
    assert list(ports["fori_loop(body)"].values()) == ["x"]
    # the function called in the body, and the line boxes inside it, read `x` too
    # (they read `normal`, the `jax.random.normal` making the loop's first `x`)
    assert ports["_p_sample"] == ports["fori_loop(body)"]
    assert set(ports["h"].values()) == {"x"}
    np.testing.assert_allclose(ins.result, _sample(w, key), rtol=1e-6)


@jax.jit
def _step(y, w):
    return jnp.tanh(y @ w)


def _jitted_in_scan(w, x):
    h0 = jnp.sin(x)
    h, _ = jax.lax.scan(lambda h, _: (_step(h, w), None), h0, None, length=2)
    return jnp.sum(h**2)


def test_a_jitted_function_in_a_body_names_the_value_by_its_own_parameter():
    w, x = jnp.eye(3) * 0.9, jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
    ins = sowviz.inspect(_jitted_in_scan, w, x)
    ports = _ports(ins)
    (loop,) = [k for k in ports if k.startswith("scan")]
    # the loop's body calls the carry `h`; the jitted `_step` inside calls it `y`
    assert ports[loop] == {"sin": "h"}
    assert ports["_step"] == {"sin": "y"}
    loss, grad = jax.value_and_grad(_jitted_in_scan)(w, x)
    np.testing.assert_allclose(ins.result[0], loss, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-5, atol=1e-6)


def _score(w, x, b):
    h = jnp.tanh(x @ w)
    return h @ w.T + b


def _ssm_loss(w, x, v, b):
    s, jv = jax.jvp(lambda x: _score(w, x, b), (x,), (v,))
    return jnp.mean(jnp.sum(v * jv, -1) + 0.5 * jnp.sum(s**2, -1))


def _leaf_l2(ins: sowviz.Inspection, label: str) -> list[float]:
    """The primal L2 norms of the outputs of the node labelled `label`, in leaf order."""
    (node,) = [n.id for n in ins.graph.nodes if n.label == label]
    return [p.summaries["primal"]["l2"] for p in ins.probes if p.node == node]


def test_a_jvp_in_a_function_of_yours_shows_the_primal_first():
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    w, x = jax.random.normal(k[0], (2, 8)), jax.random.normal(k[1], (16, 2))
    v, b = jax.random.normal(k[2], (16, 2)) * 0.01, jnp.ones(2)
    ins = sowviz.inspect(_ssm_loss, w, x, v, b)
    s, jv = jax.jvp(lambda x: _score(w, x, b), (x,), (v,))
    want = [float(jnp.linalg.norm(s)), float(jnp.linalg.norm(jv))]
    # `+ b` adds nothing to the tangent, so JAX makes the primal after it: [0] was the
    # tangent jv (0.37), [1] the primal s (27.4)
    np.testing.assert_allclose(_leaf_l2(ins, "_score"), want, rtol=1e-5)
    np.testing.assert_allclose(_leaf_l2(ins, "h @ w.T + b"), want, rtol=1e-5)
    (node,) = [n for n in ins.graph.nodes if n.label == "_score"]
    assert node.shapes == ("float32[16,2]", "float32[16,2]")
    # the stage's gradient is d loss / d s, as plain JAX computes it
    grad_s = jax.grad(lambda s: jnp.mean(jnp.sum(v * jv, -1) + 0.5 * jnp.sum(s**2, -1)))(s)
    (probe,) = [p for p in ins.probes if p.node == node.id and p.leaf == "[0]"]
    np.testing.assert_allclose(
        probe.summaries["cotangent"]["l2"], float(jnp.linalg.norm(grad_s)), rtol=1e-5
    )


def _denoise(w, x, i):
    h = jnp.tanh(x @ w)
    return x - 0.1 * h * i


def _by_fori(w, x):
    def body(i, x):
        return _denoise(w, x, i)

    return jax.lax.fori_loop(0, 3, body, x)


def _by_scan(w, x):
    def step(x, i):
        x = _denoise(w, x, i)
        return x, x

    return jax.lax.scan(step, x, jnp.arange(3.0))[0]


def _tree(ins: sowviz.Inspection, under: str) -> list[tuple[int, str]]:
    """The labels below the node labelled `under`, each with its depth there."""
    nodes = ins.graph.nodes
    (top,) = [n.id for n in nodes if n.label == under]
    parent = {n.id: n.parent for n in nodes}

    def depth(i: str) -> int | None:
        d = 0
        while i is not None and i != top:
            i, d = parent[i], d + 1
        return d if i == top else None

    return [(d, n.label) for n in nodes if (d := depth(n.id))]


def test_a_function_a_loop_body_calls_alone_is_a_stage_in_a_scan_as_in_a_fori_loop():
    w, x = jnp.eye(3) * 0.5, jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
    fori = _tree(sowviz.inspect(_by_fori, w, x, mode="primal"), "fori_loop(body)")
    by_scan = sowviz.inspect(_by_scan, w, x, mode="primal")
    scan = _tree(by_scan, "scan(step)")
    # `step` only calls `_denoise`, which the label `scan(step)` does not name: the
    # scan's body flattened it, while the fori_loop's counter kept it a stage there
    assert (1, "_denoise") in scan
    assert [t for t in scan if t[0] == 1] == [t for t in fori if t[0] == 1]
    np.testing.assert_allclose(by_scan.result, _by_scan(w, x), rtol=1e-6)


def test_each_of_equinox_attentions_projections_is_a_box_with_its_data():
    mha = eqx.nn.MultiheadAttention(4, 16, key=jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (3, 5, 16))

    def loss(mha, x):
        return jnp.mean(jax.vmap(lambda a: mha(a, a, a))(x) ** 2)

    ins = sowviz.inspect(loss, mha, x, mode="primal")
    boxes = [n for n in ins.graph.nodes if n.label.startswith("MultiheadAttention._project")]
    # one `_project` per projection: the last (in a run with the attention) was a box,
    # the first two loose `transpose`, `reshape` with no data
    assert [n.label for n in boxes] == [
        "MultiheadAttention._project",
        "MultiheadAttention._project#2",
        "MultiheadAttention._project#3",
    ]
    l2 = {p.node: p.summaries["primal"]["l2"] for p in ins.probes}
    for box, proj in zip(boxes, (mha.query_proj, mha.key_proj, mha.value_proj), strict=True):
        want = jax.vmap(jax.vmap(proj))(x).reshape(3, 5, 4, -1)
        np.testing.assert_allclose(l2[box.id], float(jnp.linalg.norm(want)), rtol=1e-5)
