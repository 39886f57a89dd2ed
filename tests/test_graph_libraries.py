"""Stage names of programs built with libraries (Equinox, diffrax): the library's own
wrapper classes are no stages; the user's function, method or module they wrap is."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

eqx = pytest.importorskip("equinox")


class _Interp(eqx.Module):
    ts: jax.Array
    ys: jax.Array

    @eqx.filter_jit
    def evaluate(self, t):
        return jnp.interp(t, self.ts, self.ys)


def _interp_loss(interp, t):
    return jnp.sum(interp.evaluate(t) ** 2)


def _labels_and_paths(g):
    def path(n):
        out = []
        while n.parent is not None:
            out.append(n.label)
            n = g.node(n.parent)
        return " > ".join(reversed(out))

    return [n.label for n in g.nodes], [path(n) for n in g.nodes if n.kind not in ("eqn",)]


def test_a_method_under_filter_jit_is_a_stage_of_its_name():
    # `eqx.filter_jit` makes a method a `Partial` of a `_JitWrapper` module: drawn as
    # `Partial` > `func: _JitWrapper` > `evaluate` (diffrax's `CubicInterpolation.evaluate`
    # in every neural CDE)
    interp = _Interp(jnp.linspace(0.0, 1.0, 5), jnp.linspace(0.0, 1.0, 5) ** 2)
    t = jnp.array([0.3, 0.6])
    ins = sowviz.inspect(_interp_loss, interp, t, mode="grad")
    labels, paths = _labels_and_paths(ins.graph)
    assert not [lbl for lbl in labels if "Partial" in lbl or "_JitWrapper" in lbl], labels
    (evaluate,) = [n for n in ins.graph.nodes if n.label == "evaluate"]
    assert evaluate.parent == ins.graph.root, paths
    want = np.interp(np.asarray(t), np.asarray(interp.ts), np.asarray(interp.ys))
    got = ins.probe("evaluate").summaries
    np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(want), rtol=1e-6)
    np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(2 * want), rtol=1e-6)
    _, grads = ins.result
    ref = jax.grad(_interp_loss)(interp, t)
    np.testing.assert_allclose(grads.ys, ref.ys, rtol=1e-6)


class _Field(eqx.Module):
    w: jax.Array

    def __call__(self, t, y, args):
        return jnp.tanh(self.w * y[:, None])  # (hidden, channels)


def _cde_rate(term, y):
    return jnp.sum(term.vf(0.3, y, None) ** 2)


def test_a_private_class_of_any_library_is_no_stage():
    # diffrax's `ControlTerm.to_ode()` wraps the term in its private `_ControlToODE`: it
    # was the stage `vector_field: _ControlToODE` around the user's field (and Equinox's
    # `Partial` > `_JitWrapper` around the control's `derivative`)
    diffrax = pytest.importorskip("diffrax")
    field = _Field(jnp.array([[0.5, -1.0], [2.0, 0.25], [1.0, 1.0]]))
    ts = jnp.linspace(0.0, 1.0, 5)
    control = diffrax.LinearInterpolation(ts, jnp.stack([ts, ts**2], axis=-1))
    term = diffrax.ControlTerm(field, control).to_ode()
    y = jnp.array([0.1, -0.4, 0.7])
    ins = sowviz.inspect(_cde_rate, term, y, mode="grad")
    labels, paths = _labels_and_paths(ins.graph)
    assert not [lbl for lbl in labels if "_ControlToODE" in lbl or "Partial" in lbl], paths
    assert [p for p in paths if p.endswith(": _Field")], paths  # the user's module is
    assert [p for p in paths if p.endswith("derivative")], paths  # and the control's method
    # the control's derivative at 0.3, on the piece [0.25, 0.5] of (t, t²): (1, 0.25 + 0.5)
    rate = np.tanh(np.asarray(field.w) * np.asarray(y)[:, None]) @ np.array([1.0, 0.75])
    loss, grads = ins.result
    np.testing.assert_allclose(loss, np.sum(rate**2), rtol=1e-6)
    ref = jax.grad(_cde_rate)(term, y)
    w = grads.vector_field.control_term.vector_field.w
    np.testing.assert_allclose(w, ref.vector_field.control_term.vector_field.w, rtol=1e-6)


def _sq_loss(model, x, y):
    return jnp.sum((model(x) - y) ** 2)


def _per_example_grads(model, xs, ys):
    return eqx.filter_vmap(eqx.filter_grad(_sq_loss), in_axes=(None, 0, 0))(model, xs, ys)


def test_a_models_backward_pass_holds_its_layers_directly():
    # Equinox's per-example gradients: the model's backward stage held Equinox's own
    # scope again, `MLP (backward)` > `eqx.nn.MLP` > `layers[2]: Linear`
    model = eqx.nn.MLP(3, 1, 8, 2, key=jax.random.PRNGKey(0))
    xs = jax.random.normal(jax.random.PRNGKey(1), (6, 3))
    ys = jax.random.normal(jax.random.PRNGKey(2), (6, 1))
    ins = sowviz.inspect(_per_example_grads, model, xs, ys, mode="primal")
    g = ins.graph
    labels = [n.label for n in g.nodes]
    assert not [lbl for lbl in labels if lbl.startswith("eqx.nn.")], labels
    (back,) = [n for n in g.nodes if n.label == "MLP (backward)"]
    inside = [n.label for n in g.children(back.id) if n.kind == "scope"]
    assert inside == [f"layers[{i}]: Linear" for i in (2, 1, 0)], inside
    # the last layer's backward makes each example's gradient of its weight
    ref = eqx.filter_jit(_per_example_grads)(model, xs, ys)  # plain Equinox, no sowviz
    got = ins.probe("MLP (backward)/layers[2]: Linear", leaf="[1]").summaries["primal"]
    np.testing.assert_allclose(got["l2"], np.linalg.norm(ref.layers[2].weight), rtol=1e-5)
    np.testing.assert_allclose(ins.result.layers[0].weight, ref.layers[0].weight, rtol=1e-5)


def test_a_linen_nn_jit_module_is_named_by_the_module():
    # `@nn.jit` on a Linen module jits Flax's own `core_fn`: its box read `core_fn`
    nn = pytest.importorskip("flax.linen")

    @nn.jit
    class Head(nn.Module):
        @nn.compact
        def __call__(self, h):
            return nn.Dense(3)(h)

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            return Head(name="head")(jnp.tanh(x))

    x = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
    net = Net()
    params = net.init(jax.random.PRNGKey(0), x)["params"]

    def loss(p, x):
        return jnp.sum(net.apply({"params": p}, x) ** 2)

    ins = sowviz.inspect(loss, params, x)
    labels = [n.label for n in ins.graph.nodes]
    assert "core_fn" not in labels and "jit(head)" in labels, labels
    (jit,) = [n for n in ins.graph.nodes if n.label == "jit(head)"]
    out = net.apply({"params": params}, x)
    (probe,) = [p for p in ins.probes if p.node == jit.id]
    np.testing.assert_allclose(probe.summaries["primal"]["l2"], np.linalg.norm(out), rtol=1e-5)
    np.testing.assert_allclose(
        probe.summaries["cotangent"]["l2"], np.linalg.norm(2 * out), rtol=1e-5
    )


class PINN(eqx.Module):
    mlp: eqx.nn.MLP

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(2, 1, 16, depth=2, activation=jnp.tanh, key=key)

    def __call__(self, x, t):
        return self.mlp(jnp.stack([x, t]))[0]


def _pinn_residual(model, x, t):
    u = model(x, t)
    u_t = jax.jacfwd(model, argnums=1)(x, t)
    return u_t + u


def _pinn_loss(model, xs, ts):
    return jnp.mean(jax.vmap(_pinn_residual, (None, 0, 0))(model, xs, ts) ** 2)


def test_a_module_under_jacfwd_says_it_holds_the_tangent():
    # `u_t = jax.jacfwd(model, argnums=1)(x, t)`: the stage `PINN#2` held du/dt with
    # nothing saying so, and a stage `jacfwd` held jacfwd's basis, [1,1] = 1.0
    model = PINN(jax.random.PRNGKey(0))
    xs, ts = jnp.linspace(-1, 1, 32), jnp.linspace(0, 1, 32)
    ins = sowviz.inspect(_pinn_loss, model, xs, ts)
    (res,) = (n for n in ins.graph.nodes if n.label == "_pinn_residual")
    labels = [n.label for n in ins.graph.children(res.id)]
    # the derivative line beside another evaluation of the model is one box named by
    # the line (round 13), holding the tangent stage
    assert labels[:2] == ["PINN", "u_t"], labels
    (box,) = (n for n in ins.graph.children(res.id) if n.label == "u_t")
    assert "PINN (tangent)" in [n.label for n in ins.graph.children(box.id)]
    assert "jacfwd" not in [n.label for n in ins.graph.nodes]
    u = jax.vmap(model)(xs, ts)
    u_t = jax.vmap(jax.jacfwd(model, argnums=1))(xs, ts)
    got_u = ins.probe("_pinn_residual/PINN").summaries["primal"]
    got_t = ins.probe("_pinn_residual/u_t/PINN (tangent)").summaries["primal"]
    np.testing.assert_allclose(got_u["mean"], float(u.mean()), rtol=1e-5)
    np.testing.assert_allclose(got_t["mean"], float(u_t.mean()), rtol=1e-5)
    np.testing.assert_allclose(got_t["l2"], float(jnp.linalg.norm(u_t)), rtol=1e-5)


def test_a_linen_module_s_own_parameter_is_found_by_its_module_and_name():
    # a custom module's lone `self.param("kernel")` read `FourierEmbs_0.kernel` (one box),
    # so `probe("FourierEmbs_0/kernel")` failed where `probe("Dense_0/kernel")` works
    nn = pytest.importorskip("flax.linen")

    class FourierEmbs(nn.Module):
        @nn.compact
        def __call__(self, x):
            kernel = self.param("kernel", nn.initializers.normal(1.0), (x.shape[-1], 8))
            return jnp.concatenate([jnp.cos(x @ kernel), jnp.sin(x @ kernel)], axis=-1)

    class Mlp(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(1)(jnp.tanh(nn.Dense(8)(FourierEmbs()(x))))[0]

    arch = Mlp()
    params = arch.init(jax.random.PRNGKey(0), jnp.ones(2))

    def loss(p, x):
        return jnp.mean(jax.vmap(lambda xi: arch.apply(p, xi))(x) ** 2)

    x = jax.random.normal(jax.random.PRNGKey(1), (4, 2))
    ins = sowviz.inspect(loss, params, x)
    q = ins.probe("FourierEmbs_0/kernel")
    assert ins.probe_path(q) == "parameters/params/FourierEmbs_0/kernel"
    assert ins.probe_path(ins.probe("Dense_0/kernel")) == "parameters/params/Dense_0/kernel"
    kernel = params["params"]["FourierEmbs_0"]["kernel"]
    grad = jax.grad(loss)(params, x)["params"]["FourierEmbs_0"]["kernel"]
    np.testing.assert_allclose(q.summaries["primal"]["mean"], float(kernel.mean()), rtol=1e-5)
    np.testing.assert_allclose(
        q.summaries["cotangent"]["l2"], float(jnp.linalg.norm(grad)), rtol=1e-4
    )


def test_equations_between_a_linen_modules_layers_carry_data():
    # `nn.tanh` and `jnp.squeeze` between a Linen module's `nn.Dense` layers were boxes
    # with no value or gradient (and `probe("tanh")` a KeyError), though Linen's
    # `nn.relu` beside them, and NNX's `nnx.tanh`, carry theirs.
    nn = pytest.importorskip("flax.linen")

    class Head(nn.Module):  # a module of yours, named by you, inside another
        @nn.compact
        def __call__(self, h):
            return jnp.sin(nn.Dense(1)(h))

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            a = jnp.squeeze(nn.tanh(nn.Dense(8)(x)), 1)
            b = nn.relu(nn.Dense(8)(a))
            return Head(name="head")(b)

    net = MLP()
    x = jnp.linspace(-1.0, 1.0, 24).reshape(6, 1, 4)
    params = net.init(jax.random.key(0), x)

    def loss(params, x):
        return jnp.mean(net.apply(params, x) ** 2)

    ins = sowviz.inspect(loss, params, x)
    p = params["params"]

    def dense(q, h):
        return h @ q["kernel"] + q["bias"]

    def rest(a):  # the loss from the squeezed activation on
        b = jax.nn.relu(dense(p["Dense_1"], a))
        return jnp.mean(jnp.sin(dense(p["head"]["Dense_0"], b)) ** 2)

    t = jnp.tanh(dense(p["Dense_0"], x))
    a = jnp.squeeze(t, 1)
    da = jax.grad(rest)(a)
    b = jax.nn.relu(dense(p["Dense_1"], a))
    y = jnp.sin(dense(p["head"]["Dense_0"], b))
    dy = 2 * y / y.size
    for name, value, grad in (("tanh", t, da[:, None]), ("squeeze", a, da), ("sin", y, dy)):
        got = ins.probe(name).summaries
        np.testing.assert_allclose(got["primal"]["mean"], np.mean(value), rtol=1e-5)
        np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(grad), rtol=1e-5)
    # a library's own work stays inside its stage: `Dense`'s `dot_general` has no probe
    dots = {n.id for n in ins.graph.nodes if n.primitive == "dot_general"}
    assert dots and not [q for q in ins.probes if q.node in dots]
