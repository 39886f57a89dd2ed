"""Readability of a diffrax solve's graph (round 15): the solver's `while` loop is
labelled by the body function diffrax hands Equinox's loop (`while(body_fun)`, not a
bare `while`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz.graph import build_graph

diffrax = pytest.importorskip("diffrax")


def _drift(t, y, w):
    return jnp.tanh(w * y)


def _diffusion(t, y, w):
    return 0.1 * jnp.eye(2)


def _sde_loss(w):
    bm = diffrax.VirtualBrownianTree(0.0, 1.0, tol=0.05, shape=(2,), key=jax.random.PRNGKey(0))
    terms = diffrax.MultiTerm(diffrax.ODETerm(_drift), diffrax.ControlTerm(_diffusion, bm))
    sol = diffrax.diffeqsolve(terms, diffrax.Euler(), 0.0, 1.0, 0.1, jnp.ones(2), args=w)
    return jnp.sum(sol.ys**2)


def _ode_loss(w):
    term = diffrax.ODETerm(_drift)
    sol = diffrax.diffeqsolve(term, diffrax.Euler(), 0.0, 0.5, 0.1, jnp.ones(2), args=w)
    return jnp.sum(sol.ys**2)


def _graph(fn, *args):
    closed = jax.make_jaxpr(fn)(*args)
    n_in, n_out = len(closed.jaxpr.invars), len(closed.jaxpr.outvars)
    return build_graph(
        closed,
        in_names=[f"in{i}" for i in range(n_in)],
        out_names=[f"out{i}" for i in range(n_out)],
    )


def _path(nodes: dict, node: dict) -> list[str]:
    out = []
    while node is not None:
        out.append(node["label"])
        node = nodes.get(node.get("parent"))
    return out[::-1]


def test_a_diffrax_solve_has_no_bare_while():
    g = _graph(_sde_loss, jnp.array(0.5))
    d = g.to_dict()
    nodes = {n["id"]: n for n in d["nodes"]}
    whiles = [n for n in d["nodes"] if n["kind"] == "while"]
    # the solve's loop and the Brownian tree's two: each by the body function it runs
    assert [n["label"] for n in whiles] == ["while(body_fun)"] * 3
    (tanh,) = [n for n in d["nodes"] if n["label"] == "tanh"]
    path = _path(nodes, tanh)
    # the user's drift runs in the solve's loop body, right inside the labelled loop
    assert path[path.index("while(body_fun)") + 1] == "body" and path[-1] == "tanh"
    # what the user wants to know still is there: the drift's stage, probed
    assert tanh["parent"] in {p.node for p in g.probe_points}


def test_a_diffrax_solve_is_inspected_as_plain_jax_computes_it():
    w = jnp.array(0.5)
    ins = sowviz.inspect(_ode_loss, w, mode="grad")
    value, grad = jax.value_and_grad(_ode_loss)(w)
    got_value, got_grad = ins.result
    np.testing.assert_allclose(np.asarray(got_value), np.asarray(value), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got_grad), np.asarray(grad), rtol=1e-6)
    d = ins.to_dict()
    nodes = {n["id"]: n for n in d["nodes"]}
    # (a body running one function of the user's was named by it already)
    assert [n["label"] for n in d["nodes"] if n["kind"] == "while"] == ["while(_drift)"]
    (tanh,) = [n for n in d["nodes"] if n["label"] == "tanh"]
    # The path to the user's field: 15 stages, as before (Equinox's wrappers
    # `fn_wrapped` > `checkpointed-no-vjp` > the loop open at one click in the report:
    # `soleChain`), the loop named.
    assert _path(nodes, tanh)[3:9] == [
        "RecursiveCheckpointAdjoint.loop",
        "outer-loop",
        "fn_wrapped",
        "checkpointed-no-vjp",
        "while(_drift)",
        "body",
    ]
    assert len(_path(nodes, tanh)) == 15
