"""The one table of constructs (`sowviz.primitives`) drives both the capture
engine and the graph builder: a program per construct is drawn with the table's
node kind, its sown value inside the construct's node, and captured correctly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from sowviz import _compat, save_intermediates, sow
from sowviz.capture.interpret import RULES
from sowviz.graph import build_graph
from sowviz.primitives import Construct, construct_of, spec

X = jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(3, 4)


# ---------------------------------------------------------------------------
# Programs, one per construct of `sowviz.primitives`


def _closed_call(a):
    from jax.extend.core.primitives import closed_call_p

    inner = jax.make_jaxpr(lambda b: [sow(jnp.sin(b) * 2.0, "v")])(a)
    return closed_call_p.bind(a, **closed_call_p.get_bind_params({"call_jaxpr": inner}))[0]


def _scan(a):
    return lax.scan(lambda c, row: (c + sow(jnp.sin(row) * 2.0, "v"), c), jnp.zeros(4), a)[0]


def _cond(a):
    def pos(b):
        return sow(jnp.sin(b) * 2.0, "v")

    def neg(b):
        return sow(jnp.cos(b) * 2.0, "v")

    return lax.cond(jnp.sum(a) > -100.0, pos, neg, a)


def _while(a):
    def body(s):
        return s[0] + 1, sow(s[1] * 1.5, "v")

    return lax.while_loop(lambda s: s[0] < 3, body, (0, a))[1]


@jax.custom_jvp
def _cj(a):
    return sow(jnp.sin(a) * 2.0, "v")


_cj.defjvp(lambda p, t: (_cj(p[0]), t[0] * jnp.cos(p[0]) * 2.0))


@jax.custom_vjp
def _cv(a):
    return sow(jnp.sin(a) * 2.0, "v")


_cv.defvjp(lambda a: (_cv(a), a), lambda a, ct: (ct * jnp.cos(a) * 2.0,))


def _shard_map(a):
    mesh = jax.make_mesh((4,), ("d",))
    spec = jax.sharding.PartitionSpec("d")
    local = jax.shard_map(
        lambda b: sow(jnp.sin(b) * 2.0, "v"), mesh=mesh, in_specs=spec, out_specs=spec
    )
    return local(a)


def _sin2(a):
    return np.sin(a) * 2.0


X8 = jnp.arange(8.0, dtype=jnp.float32)
# construct -> (program, its input, the sown "v" computed with NumPy from the input)
CONSTRUCT_CASES = {
    "SOW": (lambda a: sow(jnp.sin(a) * 2.0, "v"), X, _sin2),
    "JIT": (jax.jit(lambda a: sow(jnp.sin(a) * 2.0, "v") * 3.0), X, _sin2),
    "CALL": (_closed_call, X, _sin2),
    "SCAN": (_scan, X, _sin2),
    "COND": (_cond, X, _sin2),
    "WHILE": (_while, X, lambda a: a * 1.5**3),
    "REMAT": (jax.checkpoint(lambda a: sow(jnp.sin(a) * 2.0, "v")), X, _sin2),
    "CUSTOM_JVP": (_cj, X, _sin2),
    "CUSTOM_VJP": (_cv, X, _sin2),
    "SHARD_MAP": (_shard_map, X8, lambda a: _sin2(a).reshape(4, 2)),
}


def test_every_construct_of_the_table_has_a_case():
    # Tesseract calls hold no sub-program (nothing to capture inside): their graph
    # node is tested in tests/test_graph.py (test_tesseract_pipeline_graph).
    assert {Construct[k] for k in CONSTRUCT_CASES} | {Construct.TESSERACT} == set(Construct)


@pytest.mark.parametrize("name", sorted(CONSTRUCT_CASES))
def test_each_construct_is_captured_and_drawn_from_the_one_table(name):
    construct = Construct[name]
    row = spec(construct)
    fn, x, expected = CONSTRUCT_CASES[name]
    if construct is Construct.SHARD_MAP:
        mesh = jax.make_mesh((4,), ("d",))
        x = jax.device_put(x, jax.NamedSharding(mesh, jax.sharding.PartitionSpec("d")))
    closed = jax.make_jaxpr(lambda a: jnp.sum(fn(a)))(x)
    g = build_graph(closed, in_names=["x"], out_names=["loss"])

    def eqns(j):
        for e in j.eqns:
            yield e
            for _, _, sub in _compat.sub_jaxprs(e):
                yield from eqns(sub)

    prims = [e.primitive.name for e in eqns(closed.jaxpr) if construct_of(e.primitive.name)]
    assert any(construct_of(p) is construct for p in prims), prims  # the case uses it
    # The graph: a node of the table's kind holds every sow of "v" (or is it).
    nodes = [n for n in g.nodes if n.kind == row.node_kind and n.id != g.root]
    assert nodes, [(n.label, n.kind) for n in g.nodes]
    sows = [n for n in g.nodes if n.kind == "sow" and n.label == "v"]
    assert sows
    for v in sows:
        chain, at = [], v
        while at is not None:
            chain.append(at.id)
            at = g.node(at.parent) if at.parent is not None else None
        assert {n.id for n in nodes} & set(chain), (name, chain)
        if row.bodies:  # the sow sits inside the construct's sub-program
            assert v.id not in {n.id for n in nodes}
    if row.shows_primitive:
        assert all(construct_of(n.primitive) is construct for n in nodes)
    # The capture engine: one rule exactly when there are sub-programs to rewrite,
    # and the value sown inside comes out right.
    assert (construct in RULES) == bool(row.bodies)
    _, inter = save_intermediates(fn)(x)
    np.testing.assert_allclose(inter["v"]["primal"], expected(np.asarray(x)), rtol=1e-5)
