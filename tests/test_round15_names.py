"""Round 15 naming: a library call named whatever its leaf count (`optax.apply_updates`
of one array), a library's `lax.cond` inside the box of the line assigning it (optax's
`value_and_grad_from_state`), three `jnp.mean`s on one line as three boxes,
`checkify.checkify(f)` titled and its arguments named by `f`, and a `checkpoint_name`
line drawn by the name it gives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name
from jax.experimental import checkify

import sowviz


def _top(ins):
    g = ins.graph
    return {n.label: n for n in g.nodes if n.parent == g.root}


def _primal_l2(ins, name, leaf=None):
    probe = ins.probe(name) if leaf is None else ins.probe(name, leaf=leaf)
    return float(probe.summaries["primal"]["l2"])


# -- optax.apply_updates of one array -----------------------------------------------


def _adam_steps():
    optax = pytest.importorskip("optax")
    opt = optax.adam(1e-2)

    def loss(w, x):
        return jnp.mean((x @ w) ** 2)

    def returned(w, opt_state, x):
        g = jax.grad(loss)(w, x)
        updates, opt_state = opt.update(g, opt_state, w)
        return optax.apply_updates(w, updates), opt_state

    def assigned(w, opt_state, x):
        g = jax.grad(loss)(w, x)
        updates, opt_state = opt.update(g, opt_state, w)
        w = optax.apply_updates(w, updates)
        return w, opt_state

    return opt, (returned, assigned)


@pytest.mark.parametrize("form", ["returned", "assigned"])
def test_apply_updates_of_one_array_is_a_box_named_by_the_call(form):
    # One array makes one `add`: it was a bare `add`, or a box `w` beside the input `w`
    opt, steps = _adam_steps()
    step = dict(zip(("returned", "assigned"), steps, strict=True))[form]
    w, x = jnp.array([1.0, -2.0, 0.5]), jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    ins = sowviz.inspect(step, w, opt.init(w), x, mode="primal")
    top = _top(ins)
    assert "apply_updates" in top and "add" not in top, sorted(top)
    assert [n.label for n in ins.graph.nodes if n.label == "w"] == ["w"]  # the input alone
    want, _ = jax.jit(step)(w, opt.init(w), x)
    np.testing.assert_allclose(ins.result[0], want, rtol=1e-6)
    np.testing.assert_allclose(
        _primal_l2(ins, "apply_updates"), np.linalg.norm(np.asarray(want)), rtol=1e-5
    )


# -- optax.lbfgs: value_and_grad_from_state ------------------------------------------


def _rosenbrock(w):
    return jnp.sum(100.0 * (w[1:] - w[:-1] ** 2) ** 2 + (1.0 - w[:-1]) ** 2)


def test_a_library_cond_assigned_by_a_line_is_inside_the_line_s_box():
    # `value, grad = value_and_grad(params, state=state)`: the box `value, grad` held
    # only the cond's int32 branch index; the value and gradient were in the cond
    # beside it, and optax's `isinf` check stood loose at the top level. The function
    # the line calls is the closure `optax.value_and_grad_from_state` made: its stage,
    # named by that maker (as jraph's `GraphNetwork`), holds the check and the cond
    optax = pytest.importorskip("optax")
    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(_rosenbrock)

    def step(params, state):
        value, grad = value_and_grad(params, state=state)
        updates, state = opt.update(
            grad, state, params, value=value, grad=grad, value_fn=_rosenbrock
        )
        return optax.apply_updates(params, updates), state, value

    params = jnp.array([0.1, -0.2, 0.3, 0.0, 0.5, -0.1])
    ins = sowviz.inspect(step, params, opt.init(params), mode="primal")
    top = _top(ins)
    box = top["value_and_grad_from_state"]
    assert box.kind == "scope" and box.shapes == ("float32[]", "float32[6]"), box
    assert "isinf" not in top and "value, grad" not in top, sorted(top)
    inside = {n.label: n for n in ins.graph.nodes if n.parent == box.id}
    assert inside["value_and_grad_from_state"].kind == "cond", sorted(inside)
    assert "isinf" in inside, sorted(inside)
    # the state holds no value yet (+inf): the cond evaluates the function and its gradient
    value, grad = jax.value_and_grad(_rosenbrock)(params)
    np.testing.assert_allclose(
        _primal_l2(ins, "value_and_grad_from_state", "[0]"), abs(value), rtol=1e-6
    )
    np.testing.assert_allclose(
        _primal_l2(ins, "value_and_grad_from_state", "[1]"), np.linalg.norm(grad), rtol=1e-5
    )


# -- three jnp.mean calls on one line -------------------------------------------------


def _pinn_like_loss(w, r_pts, b_pts, c_pts):
    r = jnp.tanh(r_pts * w)
    u0 = jnp.sin(b_pts * w)
    bc = jnp.cos(c_pts * w)
    return jnp.mean(r**2) + jnp.mean((u0 + jnp.sin(jnp.pi * b_pts)) ** 2) + jnp.mean(bc**2)


def test_three_calls_of_one_function_on_a_line_are_three_boxes():
    # The line's `+` and `bc ** 2` between the 2nd and 3rd mean (`add`, `integer_pow`,
    # as before the 2nd) read as a `tree.map`'s work per leaf: one box `mean#2` held
    # both means, and no `mean#3` was drawn
    w = jnp.array(0.7)
    r_pts, b_pts, c_pts = (jnp.linspace(0.0, 1.0, n) for n in (32, 16, 24))
    ins = sowviz.inspect(_pinn_like_loss, w, r_pts, b_pts, c_pts, mode="grad")
    paths = [ins.probe_path(p) for p in ins.probes]
    assert len(paths) == len(set(paths)), paths
    means = [
        jnp.mean(jnp.tanh(r_pts * w) ** 2),
        jnp.mean((jnp.sin(b_pts * w) + jnp.sin(jnp.pi * b_pts)) ** 2),
        jnp.mean(jnp.cos(c_pts * w) ** 2),
    ]
    for name, want in zip(("mean", "mean#2", "mean#3"), means, strict=True):
        probe = ins.probe(name)  # one output each: no `leaf=` needed
        np.testing.assert_allclose(probe.summaries["primal"]["l2"], float(want), rtol=1e-5)
        np.testing.assert_allclose(probe.summaries["cotangent"]["l2"], 1.0, rtol=1e-6)
    value, grads = ins.result
    want_value, want_grad = jax.value_and_grad(_pinn_like_loss)(w, r_pts, b_pts, c_pts)
    np.testing.assert_allclose(value, want_value, rtol=1e-6)
    np.testing.assert_allclose(grads, want_grad, rtol=1e-5)


# -- checkify -------------------------------------------------------------------------


def _checked_loss(params, x):
    h = jnp.tanh(x @ params["w"])
    checkify.check(jnp.all(jnp.isfinite(h)), "bad h")
    return jnp.mean(h**2)


def test_a_checkified_function_is_titled_and_its_arguments_named_by_it():
    # checkify's `checked_fun` copies neither the name nor the signature: the report was
    # `checked_fun` with arguments `arg0.w`, `arg1`
    checked = checkify.checkify(_checked_loss)
    params = {"w": jnp.linspace(-1.0, 1.0, 16).reshape(4, 4)}
    x = jnp.ones((2, 4))
    ins = sowviz.inspect(checked, params, x, mode="primal")
    d = ins.to_dict()
    assert d["title"] == "_checked_loss"
    labels = {n.label for n in ins.graph.nodes}
    assert {"params.w", "x"} <= labels and not any(lb.startswith("arg") for lb in labels)
    err, out = ins.result
    assert err.get() is None
    np.testing.assert_allclose(out, _checked_loss(params, x), rtol=1e-6)


# -- checkpoint_name ------------------------------------------------------------------


def _named_block(w, x):
    h = x @ w
    h = checkpoint_name(h, "pre_act")
    h = jnp.tanh(h)
    return jnp.sum(h**2)


def test_a_checkpoint_name_line_is_drawn_by_the_name_it_gives():
    # the line was a box `h#2` (identical values to `h`), `pre_act` nowhere
    policy = jax.checkpoint_policies.save_only_these_names("pre_act")
    block = jax.checkpoint(_named_block, policy=policy)
    w = jnp.linspace(-0.5, 0.5, 16).reshape(4, 4)
    x = jnp.linspace(0.0, 1.0, 8).reshape(2, 4)
    ins = sowviz.inspect(lambda w, x: block(w, x), w, x, mode="grad")
    (node,) = [n for n in ins.graph.nodes if n.label == "pre_act"]
    assert node.kind == "eqn" and node.primitive == "name"
    assert not [n for n in ins.graph.nodes if n.label == "h#3"]
    pre = np.asarray(x) @ np.asarray(w)
    got = ins.probe("pre_act").summaries
    np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(pre), rtol=1e-5)
    dpre = 2 * np.tanh(pre) * (1 - np.tanh(pre) ** 2)
    np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(dpre), rtol=1e-5)
    _, grads = ins.result  # (argument 0's, as `jax.grad`'s)
    np.testing.assert_allclose(grads, jax.grad(_named_block)(w, x), rtol=1e-5, atol=1e-7)
