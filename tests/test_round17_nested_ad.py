"""Round 17: a sow under a derivative the program takes itself, and the boxes of lines
taking derivatives (`jax.grad(u, argnums=1)(...)`, `jax.linearize`, `jax.vjp`)."""

import inspect as pyinspect

import jax
import jax.numpy as jnp
import numpy as np

import sowviz


def _hvp_f(w, x):
    h = sowviz.sow(jnp.tanh(x @ w), "h")
    return jnp.sum(h**3)


def _hvp_loss(w, x, v):
    hv = jax.jvp(jax.grad(_hvp_f), (w, x), (v, jnp.zeros_like(x)))[1]
    return jnp.vdot(hv, v)


def test_nested_sow_with_outer_cotangent_gets_no_no_cotangent_note():
    w = jax.random.normal(jax.random.PRNGKey(0), (4, 3))
    x = jax.random.normal(jax.random.PRNGKey(1), (5, 4))
    v = jax.random.normal(jax.random.PRNGKey(2), (4, 3))
    ins = sowviz.inspect(_hvp_loss, w, x, v, mode="grad")
    p = next(p for p in ins.probes if p.name == "h" and p.leaf == "")

    # dL/dh, independently: an offset added to h, differentiated at zero
    def loss_of(d):
        f = lambda w_: jnp.sum((jnp.tanh(x @ w_) + d) ** 3)  # noqa: E731
        return jnp.vdot(jax.jvp(jax.grad(f), (w,), (v,))[1], v)

    dh = jax.grad(loss_of)(jnp.zeros((5, 3)))
    np.testing.assert_allclose(
        p.summaries["primal.cotangent"]["l2"], float(jnp.linalg.norm(dh)), rtol=1e-4
    )
    assert float(jnp.linalg.norm(dh)) > 1
    assert not [n for n in ins.notes if "no cotangent" in str(n)], ins.notes


def _u(params, t, x):
    h = jnp.tanh(jnp.array([t, x]) @ params["w"])
    return jnp.sum(h)


def _residual(params, t, x):
    u_t = jax.grad(_u, argnums=1)(params, t, x)
    u_xx = jax.hessian(_u, argnums=2)(params, t, x)
    return u_t - 0.1 * u_xx


def _pinn_loss(params, t, x):
    return jnp.mean(jax.vmap(_residual, in_axes=(None, 0, 0))(params, t, x) ** 2)


def test_grad_line_box_is_sourced_at_the_line_taking_the_derivative():
    params = {"w": jax.random.normal(jax.random.PRNGKey(0), (2, 8))}
    t = jnp.linspace(0, 1, 8)
    x = jnp.linspace(-1, 1, 8)
    ins = sowviz.inspect(_pinn_loss, params, t, x, mode="grad")
    nodes = {n["label"]: n for n in ins.to_dict()["nodes"] if n["label"] in ("u_t", "u_xx")}
    start = pyinspect.getsourcelines(_residual)[1]
    assert nodes["u_t"]["source"]["line"] == start + 1
    assert nodes["u_t"]["source"]["function"] == "_residual"
    assert nodes["u_xx"]["source"]["line"] == start + 2
    probe = next(p for p in ins.probes if p.node == nodes["u_t"]["id"])
    u_t = jax.vmap(jax.grad(_u, argnums=1), in_axes=(None, 0, 0))(params, t, x)
    np.testing.assert_allclose(
        probe.summaries["primal"]["l2"], float(jnp.linalg.norm(u_t)), rtol=1e-5
    )


def _g(w, x):
    h = jnp.tanh(x @ w)
    return jnp.sum(h**2)


def _lin_loss(w, x, v):
    y, f_jvp = jax.linearize(lambda p: _g(p, x), w)  # noqa: RUF059 (as users write it)
    lin = f_jvp(v)
    out, pullback = jax.vjp(lambda p: _g(p, x), w)
    (ct,) = pullback(jnp.ones_like(out))
    return lin**2 + jnp.sum(ct**2)


def test_applied_linearize_map_box_is_named_for_what_it_holds():
    w = jax.random.normal(jax.random.PRNGKey(0), (4, 3))
    x = jax.random.normal(jax.random.PRNGKey(1), (5, 4))
    v = jax.random.normal(jax.random.PRNGKey(2), (4, 3))
    ins = sowviz.inspect(_lin_loss, w, x, v, mode="grad")
    y, lin = jax.jvp(lambda p: _g(p, x), (w,), (v,))
    ct = jax.grad(_g)(w, x)
    d = ins.to_dict()
    labels = [n["label"] for n in d["nodes"]]
    assert "y, f_jvp" not in labels and "out, pullback" not in labels, labels
    box = next(n for n in d["nodes"] if n["label"] == "lin")
    probe = next(p for p in ins.probes if p.node == box["id"])
    np.testing.assert_allclose(probe.summaries["primal"]["mean"], float(lin), rtol=1e-5)
    assert abs(float(lin) - float(y)) > 1  # (the box holds lin, not y)
    assert box["source"]["function"] == "_lin_loss"
    # the pullback's value is the gradient
    back = [p for p in ins.probes if p.summaries["primal"]["shape"] == [4, 3] and p.auto]
    l2 = float(jnp.linalg.norm(ct))
    assert any(abs(p.summaries["primal"]["l2"] - l2) < 1e-4 * l2 for p in back)
