"""Round 13: which stages the first picture opens (`graph.repeats.open_model`). A
PINN's first picture opened its small boundary-term model call and left `residual`,
most of the program, closed; a jitted train step was one closed box between its
inputs and outputs."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz.graph import repeats


def _top(ins):
    g = ins.graph
    return {n.label: n for n in g.nodes if n.parent == g.root}


def test_the_stage_holding_most_of_the_program_opens_beside_the_model():
    eqx = pytest.importorskip("equinox")

    class PINN(eqx.Module):
        lin: eqx.nn.Linear

        def __call__(self, t, x):
            return jnp.tanh(self.lin(jnp.stack([t, x]))).sum()

    def residual(model, t, x):
        u = model(t, x)
        u_t = jax.grad(model, argnums=0)(t, x)
        u_x = jax.grad(model, argnums=1)(t, x)
        return u_t + u * u_x

    def loss(model, t, x, xb):
        pde = jnp.mean(jax.vmap(residual, in_axes=(None, 0, 0))(model, t, x) ** 2)
        bc = jnp.mean(jax.vmap(model)(jnp.zeros_like(xb), xb) ** 2)
        return pde + bc

    model = PINN(eqx.nn.Linear(2, 3, key=jax.random.PRNGKey(0)))
    t, x = jnp.linspace(0.0, 1.0, 4), jnp.linspace(-1.0, 1.0, 4)
    xb = jnp.array([-1.0, 1.0])
    ins = sowviz.inspect(loss, model, t, x, xb)
    np.testing.assert_allclose(ins.result[0], loss(model, t, x, xb), rtol=1e-6)
    top = _top(ins)
    root = ins.graph.node(ins.graph.root)
    res, pinn = top["residual"], top["PINN"]
    assert 2 * res.n_eqns >= root.n_eqns > 2 * pinn.n_eqns  # the case: the PDE is most of it
    assert not res.collapsed  # it stayed closed beside the open boundary-term call
    assert not pinn.collapsed  # the model's call still opens: both fit the first picture
    inside = [n.label for n in ins.graph.children(res.id)]
    assert "PINN" in inside, inside


def test_a_jitted_train_step_holding_the_whole_program_starts_open():
    def loss_fn(params, x):
        h = jnp.tanh(x @ params["w"] + params["b"])
        return jnp.mean(h**2)

    @jax.jit
    def train_step(params, x):
        loss, grads = jax.value_and_grad(loss_fn)(params, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss

    params = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": jnp.zeros(4)}
    x = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
    # (a title keeps the jit a stage of its own, as in the tester's report; without one
    # the program is the jit's body)
    ins = sowviz.inspect(train_step, params, x, mode="primal", title="train step")
    want_params, want_loss = train_step(params, x)
    np.testing.assert_allclose(ins.result[1], want_loss, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(ins.result[0]), jax.tree.leaves(want_params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    g = ins.graph
    root = g.node(g.root)
    working = [n for n in g.children(root.id) if n.n_eqns > 0]
    assert [(n.label, n.kind) for n in working] == [("train_step", "jit")]
    step = working[0]
    assert step.n_eqns == root.n_eqns  # the whole program
    assert not step.collapsed  # it was one closed box between the inputs and outputs
    assert "loss_fn" in [n.label for n in g.children(step.id)]


def _rec(id, parent, label, n_eqns, kind="scope", called=True):
    return types.SimpleNamespace(
        id=id,
        parent=parent,
        label=label,
        n_eqns=n_eqns,
        kind=kind,
        called=called,
        made=False,
        collapsed=True,
    )


def test_the_first_picture_budget_goes_to_the_larger_stage_first(monkeypatch):
    # two calls each holding half the program; room for one of them opened
    root = _rec("n0", None, "loss", 100, kind="jit")
    small = _rec("n1", "n0", "small", 50)
    big = _rec("n2", "n0", "big", 50)
    recs = [root, small, big]
    recs += [_rec(f"s{i}", "n1", "eqn", 1, kind="eqn") for i in range(3)]
    recs += [_rec(f"b{i}", "n2", "eqn", 1, kind="eqn") for i in range(5)]
    big.n_eqns = 51  # the larger, by one equation
    monkeypatch.setattr(repeats, "FIRST_VIEW", 2 - 1 + 5)  # the top level and big's 5
    repeats.open_model(recs, root)
    assert (big.collapsed, small.collapsed) == (False, True)
    # with room for both, both open
    big.collapsed = True
    monkeypatch.setattr(repeats, "FIRST_VIEW", 2 - 2 + 5 + 3)
    repeats.open_model(recs, root)
    assert (big.collapsed, small.collapsed) == (False, False)


def test_a_sole_stage_opens_and_the_rule_applies_inside_it():
    # `jit(step)` holding everything; inside, `loss_fn` holds most of it
    root = _rec("n0", None, "program", 10, kind="jit")
    x = _rec("n1", "n0", "x", 0, kind="input", called=False)
    step = _rec("n2", "n0", "step", 10, kind="jit", called=False)
    loss_fn = _rec("n3", "n2", "loss_fn", 8)
    other = _rec("n4", "n2", "update", 2)
    out = _rec("n5", "n0", "output", 0, kind="output", called=False)
    recs = [root, x, step, loss_fn, other, out]
    recs += [_rec(f"e{i}", "n3", "eqn", 1, kind="eqn") for i in range(8)]
    repeats.open_model(recs, root)
    assert not step.collapsed and not loss_fn.collapsed and other.collapsed
    # a stage beside other work is no sole stage (`nested_jits`: `middle_fn` and a `mul`)
    step.collapsed = loss_fn.collapsed = True
    mul = _rec("n6", "n0", "mul", 1, kind="eqn", called=False)
    repeats.open_model([*recs, mul], root)
    assert step.collapsed
