"""Graphs of programs that transform inside (round 14, meta-learning): `jax.vmap`'s
broadcasts of a loop's unbatched carry, an optax step inside a Python loop's pass, and
a sow inside a `lax.custom_root` solver the graph does not open."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz.graph.names import function_label


def _labels(g, node_id):
    return [n.label for n in g.children(node_id)]


def _one(g, label):
    (node,) = [n for n in g.nodes if n.label == label]
    return node


def _params():
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    return [
        {"w": jax.random.normal(k1, (1, 8)), "b": jnp.zeros(8) + 0.5},
        {"w": jax.random.normal(k2, (8, 1)) * 0.3, "b": jnp.ones(1)},
    ]


def _mse(params, x, y):
    h = jnp.tanh(x @ params[0]["w"] + params[0]["b"])
    return jnp.mean((h @ params[1]["w"] + params[1]["b"] - y) ** 2)


def _adapt(params, xs, ys):
    def inner_step(p, _):
        g = jax.grad(_mse)(p, xs, ys)
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g), None

    adapted, _ = jax.lax.scan(inner_step, params, None, length=2)
    return adapted


def _maml_scan(params, xs, ys, xq, yq):
    adapted, _ = jax.lax.scan(
        lambda p, _: (jax.tree.map(lambda a, b: a - 0.1 * b, p, jax.grad(_mse)(p, xs, ys)), None),
        params,
        None,
        length=2,
    )
    return _mse(adapted, xq, yq)


def _tasks():
    x = jax.random.normal(jax.random.PRNGKey(1), (3, 6, 1))
    return x, jnp.sin(x)


def _meta_loss(params, xs, ys, xq, yq):
    return jnp.mean(jax.vmap(_maml_scan, in_axes=(None, 0, 0, 0, 0))(params, xs, ys, xq, yq))


def _adapted_mean(params, xs, ys):
    adapted = jax.vmap(_adapt, in_axes=(None, 0, 0))(params, xs, ys)
    return jnp.mean(adapted[1]["w"])


def test_a_vmapped_loop_s_carry_broadcasts_are_one_setup_box_at_a_small_level():
    # `jax.vmap(maml, in_axes=(None, ...))`: the scan's carry starts at the shared
    # parameters, which vmap broadcasts one leaf at a time on the scan's line. At a small
    # level each was a `broadcast_in_dim` box in a row beside `scan(<lambda>)` (a big
    # level already grouped them as `scan(step) setup`).
    params = _params()
    x, y = _tasks()
    ins = sowviz.inspect(_meta_loss, params, x, y, x, y, mode="primal")
    g = ins.graph
    call = _one(g, "_maml_scan")
    labels = _labels(g, call.id)
    assert "broadcast_in_dim" not in labels, labels
    (setup,) = [n for n in g.children(call.id) if n.label.endswith(" setup")]
    assert labels.index(setup.label) + 1 == labels.index(setup.label[: -len(" setup")])
    assert _labels(g, setup.id) == ["broadcast_in_dim"] * 4
    # the setup's values are the parameters, once per task (3): its probe holds them
    leaves = jax.tree.leaves(params)
    for k, leaf in enumerate(leaves):
        got = ins.probe(setup.label, leaf=f"[{k}]").summaries["primal"]
        np.testing.assert_allclose(got["l2"], np.sqrt(3) * np.linalg.norm(leaf), rtol=1e-5)
    np.testing.assert_allclose(ins.result, jax.jit(_meta_loss)(params, x, y, x, y), rtol=1e-6)


def test_a_vmapped_function_that_is_only_a_loop_still_parts_its_setup():
    # `adapt` holds nothing but the broadcasts and the scan: the setup box is no
    # restatement of the call around it
    params = _params()
    x, y = _tasks()
    ins = sowviz.inspect(_adapted_mean, params, x, y, mode="primal")
    g = ins.graph
    assert _labels(g, _one(g, "_adapt").id) == ["scan(inner_step) setup", "scan(inner_step)"]


def _optax_maml(tx):
    import optax

    def maml(params, xs, ys, xq, yq):
        opt_state = tx.init(params)
        p = params
        for _ in range(2):
            g = jax.grad(_mse)(p, xs, ys)
            updates, opt_state = tx.update(g, opt_state, p)
            p = optax.apply_updates(p, updates)
        return _mse(p, xq, yq)

    return maml


def test_an_inner_loop_pass_names_its_optimizer_step_and_init_is_told_from_update():
    # Each pass was `mse · mse (backward)`, the optimizer's `chain` and `apply_updates`
    # in it unnamed, and `opt_state = tx.init(params)` was a box `chain`, like the update.
    optax = pytest.importorskip("optax")
    maml = _optax_maml(optax.adam(1e-2))
    params = _params()
    x, y = _tasks()
    x, y = x[0], y[0]
    ins = sowviz.inspect(maml, params, x, y, x, y, mode="primal")
    g = ins.graph
    top = _labels(g, g.root)
    assert "chain.init" in top and "chain" not in top, top
    passes = [lab for lab in top if lab.startswith("_mse ·")]
    assert passes == ["_mse · chain · apply_updates", "_mse · chain · apply_updates#2"], top
    inside = _labels(g, _one(g, passes[0]).id)
    assert inside == ["_mse", "_mse (backward)", "chain", "apply_updates"], inside
    # the init's value: adam's zero moments (and its count)
    got = ins.probe("chain.init", leaf="[1]").summaries["primal"]
    assert got["zeros"] > 0 and got["l2"] == 0.0, got
    np.testing.assert_allclose(ins.result, jax.jit(maml)(params, x, y, x, y), rtol=1e-6)


def test_a_closure_making_a_state_is_named_init_beside_its_maker():
    assert function_label("chain.<locals>.init_fn") == ("chain.init", False)
    assert function_label("chain.<locals>.update_fn") == ("chain", False)
    assert function_label("chain.<locals>.init_fn.<locals>.<genexpr>") == ("chain.init", False)
    assert function_label("scale_by_adam.<locals>.update_fn") == ("scale_by_adam", False)


_X = jax.random.normal(jax.random.PRNGKey(0), (16, 4))
_Y = jax.random.normal(jax.random.PRNGKey(1), (16,))


def _implicit(theta):
    def grad_inner(w):
        return 2 * _X.T @ (_X @ w - _Y) + 2 * (w - theta)

    def newton(f, w0):
        def body(i, w):
            step = jnp.linalg.solve(jax.jacfwd(f)(w), f(w))
            return sowviz.sow(w - step, "newton_iterate")

        return jax.lax.fori_loop(0, 3, body, w0)

    def tangent_solve(g, y):
        return jnp.linalg.solve(jax.jacfwd(g)(y), y)

    w = jax.lax.custom_root(grad_inner, jnp.zeros(4), newton, tangent_solve)
    return jnp.sum(w**2)


def test_a_sow_inside_a_custom_root_solver_says_where_it_is_and_how_to_get_it():
    theta = jnp.ones(4)
    ins = sowviz.inspect(_implicit, theta, mode="primal")
    if "newton_iterate" in ins.graph.sow_nodes:
        # (JAX 0.10 binds `custom_root` as a `custom_jvp_call`, whose body is drawn)
        assert not [n for n in ins.notes if "has no node" in n["message"]]
    else:
        (note,) = [n["message"] for n in ins.notes if "newton_iterate" in n["message"]]
        assert "`custom_root`" in note and "save_intermediates" in note, note
        assert "primal program" not in note
    # and it does: each Newton iterate (one per step, stacked) is the closed-form
    # minimiser, which Newton's method reaches in one step on this quadratic
    _, got = sowviz.save_intermediates(_implicit)(theta)
    want = np.linalg.solve(np.asarray(_X.T @ _X) + np.eye(4), np.asarray(_X.T @ _Y + theta))
    iterates = np.asarray(got["newton_iterate"]["primal"])
    assert iterates.shape == (3, 4)
    np.testing.assert_allclose(iterates, np.broadcast_to(want, (3, 4)), rtol=1e-4)
