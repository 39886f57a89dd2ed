"""Round 19: stage names on BlackJAX and `jax.scipy.optimize.minimize` programs.

A library's closure whose work is one `lax.cond` is named as a call is (`expand_once`,
never `...<locals>.expand_once`); a library's loop step calling the user's function
amid its own arithmetic (BlackJAX's leapfrog) is named by the step (`fori_loop(one_step)`)
and holds the user's function; `minimize(lambda w: nll(w, X, y), w0)` is one `minimize`
stage holding the first evaluation of `nll` and the loop.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _round19_labels_programs import FAKE_MCMC
from jax.scipy.optimize import minimize

import sowviz


def _leaky(graph):
    return [n.label for n in graph.nodes if "<locals>" in n.label or "<lambda>" in n.label]


def _ancestors(graph, node):
    out = []
    while node.parent is not None:
        node = graph.node(node.parent)
        out.append(node.label)
    return out


def _nodes(graph, label, kind=None):
    found = [n for n in graph.nodes if n.label == label and (kind is None or n.kind == kind)]
    assert found, sorted({n.label for n in graph.nodes})
    return found


def logdensity_fn(x):
    return -0.5 * jnp.sum(x**2) - 0.1 * jnp.sum(x**4)


def _assert_trees_close(got, want):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


# --- plain-JAX stand-ins for BlackJAX's kernels (run whether or not it is installed) ---


@pytest.fixture
def mcmc(tmp_path, monkeypatch):
    installed = tmp_path / "site-packages"  # an installed package's file: a library's
    installed.mkdir()
    (installed / "fakemcmc19.py").write_text(FAKE_MCMC)
    monkeypatch.syspath_prepend(str(installed))
    return importlib.import_module("fakemcmc19")


def test_a_library_closure_s_cond_is_named_without_locals(mcmc):
    # NUTS's conds read `dynamic_multiplicative_expansion.<locals>.expand.<locals>.
    # expand_once`; the stand-in's read `nuts_build_kernel.<locals>.kernel.<locals>...`
    kernel = mcmc.nuts_build_kernel(3, 2)

    def step(key, state):
        return kernel(key, state, logdensity_fn, 0.1)

    key, state = jax.random.PRNGKey(0), mcmc.init(jnp.ones(3), logdensity_fn)
    ins = sowviz.inspect(jax.jit(step), key, state, mode="primal")
    assert not _leaky(ins.graph), _leaky(ins.graph)
    conds = {n.label for n in ins.graph.nodes if n.kind == "cond"}
    assert {"add_one_state", "expand_once"} <= conds, conds
    _assert_trees_close(ins.result, jax.jit(step)(key, state))


def test_a_library_step_around_your_function_names_its_loop(mcmc):
    # HMC's leapfrog loop read `fori_loop(logdensity_fn)`, as if the user's function were
    # all it ran; it is the integrator's `one_step`, holding `logdensity_fn`
    kernel = mcmc.hmc_build_kernel(4)

    def step(key, state):
        return kernel(key, state, logdensity_fn, 0.1)

    key, state = jax.random.PRNGKey(1), mcmc.init(jnp.ones(3), logdensity_fn)
    ins = sowviz.inspect(jax.jit(step), key, state, mode="primal")
    loops = [n.label for n in ins.graph.nodes if n.kind == "scan"]
    assert loops == ["fori_loop(one_step)"], loops
    (fn,) = _nodes(ins.graph, "logdensity_fn")
    assert "fori_loop(one_step)" in _ancestors(ins.graph, fn)
    assert not _leaky(ins.graph), _leaky(ins.graph)
    _assert_trees_close(ins.result, jax.jit(step)(key, state))
    # the stage's rows are the log-density at each leapfrog position, as plain JAX
    # computes them by the same integrator from the same momentum
    one_step = mcmc.velocity_verlet(logdensity_fn)
    momentum = jax.random.normal(jax.random.split(key)[0], (3,))
    leap, want = state._replace(momentum=momentum), []
    for _ in range(4):
        leap = one_step(leap, 0.1)
        want.append(float(leap.logdensity))
    got = _probe_of(ins, fn).summaries["primal"]
    np.testing.assert_allclose(got["l2"], np.linalg.norm(want), rtol=1e-5)
    np.testing.assert_allclose(got["min"], min(want), rtol=1e-5)


def _probe_of(ins, node):
    # the stage's value (a gradient's forward pass also hands on what it saves for the
    # backward pass: another leaf)
    (probe,) = [p for p in ins.probes if p.node == node.id and p.leaf in ("", "['output']")]
    return probe


def test_a_user_function_called_inside_a_library_body_s_call_is_drawn_in_it(mcmc):
    # NUTS's `add_one_state` body calls the integrator's `one_step`, which evaluates the
    # user's `logdensity_fn` between its updates: it is drawn inside `one_step`, not
    # loose in the body; the loop is the library's, `while(add_one_state)`
    kernel = mcmc.nuts_build_kernel(3, 2)

    def step(key, state):
        return kernel(key, state, logdensity_fn, 0.1)

    key, state = jax.random.PRNGKey(2), mcmc.init(jnp.ones(3), logdensity_fn)
    ins = sowviz.inspect(jax.jit(step), key, state, mode="primal")
    whiles = sorted(n.label for n in ins.graph.nodes if n.kind == "while")
    assert whiles == ["while(add_one_state)", "while(expand_once)"], whiles
    (fn,) = _nodes(ins.graph, "logdensity_fn")
    up = _ancestors(ins.graph, fn)
    assert up[0] == "one_step" and "while(add_one_state)" in up, up


# --- the real BlackJAX, as its docs write it ---


def _blackjax_step(blackjax, kind):
    d = 3
    if kind == "nuts":
        alg = blackjax.nuts(logdensity_fn, step_size=1e-3, inverse_mass_matrix=jnp.ones(d))
    else:
        alg = blackjax.hmc(
            logdensity_fn,
            step_size=1e-3,
            inverse_mass_matrix=jnp.ones(d),
            num_integration_steps=5,
        )
    return jax.jit(alg.step), alg.init(jnp.ones(d))


def test_blackjax_nuts_is_named_without_locals():
    blackjax = pytest.importorskip("blackjax")
    step, state = _blackjax_step(blackjax, "nuts")
    key = jax.random.PRNGKey(0)
    ins = sowviz.inspect(step, key, state, mode="primal")
    assert not _leaky(ins.graph), _leaky(ins.graph)
    assert "expand_once" in {n.label for n in ins.graph.nodes if n.kind == "cond"}
    (fn,) = _nodes(ins.graph, "logdensity_fn")
    assert _ancestors(ins.graph, fn)[0] == "one_step", _ancestors(ins.graph, fn)
    _assert_trees_close(ins.result, step(key, state))


def test_blackjax_hmc_s_integrator_is_one_loop_holding_the_log_density():
    blackjax = pytest.importorskip("blackjax")
    step, state = _blackjax_step(blackjax, "hmc")
    key = jax.random.PRNGKey(0)
    ins = sowviz.inspect(step, key, state, mode="primal")
    loops = [n.label for n in ins.graph.nodes if n.kind == "scan"]
    assert loops == ["fori_loop(one_step)"], loops
    (fn,) = _nodes(ins.graph, "logdensity_fn")
    assert "fori_loop(one_step)" in _ancestors(ins.graph, fn)
    assert not _leaky(ins.graph), _leaky(ins.graph)
    _assert_trees_close(ins.result, step(key, state))


# --- jax.scipy.optimize.minimize with the objective passed as a lambda ---


def _data():
    X = jax.random.normal(jax.random.PRNGKey(0), (50, 3))
    y = (X @ jnp.array([1.0, -2.0, 0.5]) > 0).astype(jnp.float32)
    return X, y


def nll(w, X, y):
    logits = X @ w
    return jnp.mean(jnp.logaddexp(0.0, logits) - y * logits)


def _fit(X, y):
    return minimize(lambda w: nll(w, X, y), jnp.zeros(3), method="BFGS").fun


def test_minimize_of_a_lambda_holds_its_first_evaluation():
    # `minimize(lambda w: nll(w, X, y), w0)` drew `nll` and `nll (backward)` (the value
    # and gradient at `w0`) before a second `minimize` box holding the loop
    X, y = _data()
    ins = sowviz.inspect(_fit, X, y, mode="primal")
    top = [
        n.label
        for n in ins.graph.children(ins.graph.root)
        if n.kind not in ("input", "output", "eqn")
    ]
    assert top == ["minimize"], top
    first = _nodes(ins.graph, "nll")[0]
    assert _ancestors(ins.graph, first)[:2] == ["minimize_bfgs", "minimize"]
    # its value is the objective at `w0`, the loop's result JAX's own
    got = _probe_of(ins, first).summaries["primal"]["l2"]
    np.testing.assert_allclose(got, float(nll(jnp.zeros(3), X, y)), rtol=1e-6)
    # (the minimum is ~6e-6: float32 BFGS steps of two compilations differ in its last bits)
    np.testing.assert_allclose(float(ins.result), float(jax.jit(_fit)(X, y)), atol=1e-7)
