"""A line taking a derivative of a function is one box named by what it assigns."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import sowviz


class _PINN(eqx.Module):
    mlp: eqx.nn.MLP

    def __call__(self, t, x):
        return self.mlp(jnp.stack([t, x]))


def _residual(model, t, x):
    u = model(t, x)
    u_t = jax.grad(model, argnums=0)(t, x)
    u_x = jax.grad(model, argnums=1)(t, x)
    u_xx = jax.hessian(model, argnums=1)(t, x)
    return u_t + u * u_x - 0.01 * u_xx


def _pinn_loss(model, t, x):
    return jnp.mean(jax.vmap(_residual, in_axes=(None, 0, 0))(model, t, x) ** 2)


def _children(graph, node_id):
    return [n.label for n in graph.nodes if n.parent == node_id]


def test_each_derivative_line_of_a_pinn_is_a_box_holding_its_forward_and_backward():
    # `jax.grad(model)`'s work is made in `PINN.__call__`'s line: the boxes of `u_t`'s
    # and `u_x`'s lines were `PINN#2`, `PINN (backward)` side by side, unnamed
    mlp = eqx.nn.MLP(2, "scalar", 16, depth=2, activation=jnp.tanh, key=jax.random.key(0))
    model = _PINN(mlp)
    t, x = jnp.linspace(0, 1, 32), jnp.linspace(-1, 1, 32)
    ins = sowviz.inspect(_pinn_loss, model, t, x)
    g = ins.graph
    (fn,) = (n.id for n in g.nodes if n.label == "_residual")
    top = _children(g, fn)
    assert top[:4] == ["_PINN", "u_t", "u_x", "u_xx"], top
    for name in ("u_t", "u_x", "u_xx"):
        (box,) = (n.id for n in g.nodes if n.parent == fn and n.label == name)
        inside = _children(g, box)
        assert any(a.startswith("_PINN") and "backward" not in a for a in inside), (name, inside)
        assert any(a.startswith("_PINN (backward)") for a in inside), (name, inside)
    wants = {
        "u_t": jax.vmap(jax.grad(model, argnums=0))(t, x),
        "u_x": jax.vmap(jax.grad(model, argnums=1))(t, x),
        "u_xx": jax.vmap(jax.hessian(model, argnums=1))(t, x),
    }
    for name, want in wants.items():
        got = ins.probe(f"_residual/{name}").summaries["primal"]
        np.testing.assert_allclose(got["mean"], float(jnp.mean(want)), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(want)), rtol=1e-4)


def _square(v):
    return jnp.sum(jnp.tanh(v) ** 2)


def _vmapped_loss(v):
    y = jax.vmap(_square)(v)
    return jnp.sum(y)


def test_a_line_mapping_a_function_without_a_derivative_is_not_wrapped():
    # one box's work (`_square`, vmapped): a box `y` around it would only restate it
    v = jnp.arange(12.0).reshape(3, 4) / 12
    ins = sowviz.inspect(_vmapped_loss, v)
    g = ins.graph
    top = [n.label for n in g.children(g.root) if n.kind != "input"]
    assert "_square" in top and "y" not in top, top


def _sq_loss(p, x, y):
    return jnp.mean((jnp.tanh(x @ p) - y) ** 2)


def _hessian_alone(p, x, y):
    H = jax.hessian(_sq_loss)(p, x, y)
    return jnp.sum(H)


def _hessian_and_loss(p, x, y):
    val = _sq_loss(p, x, y)
    H = jax.hessian(_sq_loss)(p, x, y)
    return val + jnp.sum(H)


def _scopes_under(graph, parent_label):
    label = {n.id: n.label for n in graph.nodes}
    return [
        n.label for n in graph.nodes if n.kind == "scope" and label.get(n.parent) == parent_label
    ]


def test_a_hessian_line_holds_its_evaluations_only_beside_another_evaluation():
    # README: alone, `H = jax.hessian(loss)(…)`'s `loss`, `loss (backward)` are drawn
    # beside the `H` box; with `val = loss(…)` beside it, `H` holds them
    p, x, y = jnp.ones(3) / 3, jnp.arange(12.0).reshape(4, 3) / 12, jnp.ones(4)
    alone = sowviz.inspect(_hessian_alone, p, x, y).graph
    assert _scopes_under(alone, "_hessian_alone") == ["_sq_loss", "_sq_loss (backward)", "H"]
    ins = sowviz.inspect(_hessian_and_loss, p, x, y)
    assert _scopes_under(ins.graph, "_hessian_and_loss") == ["_sq_loss", "H"]
    assert _scopes_under(ins.graph, "H") == ["_sq_loss", "_sq_loss (backward)"]
    want = jax.hessian(_sq_loss)(p, x, y)
    got = ins.probe("H").summaries["primal"]
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(want)), rtol=1e-5)
    np.testing.assert_allclose(got["mean"], float(jnp.mean(want)), rtol=1e-5)
