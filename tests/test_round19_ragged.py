"""A `sow` inside `jax.lax.map(f, xs, batch_size=B)` where `f` is a `jax.jit` function
(also `eqx.filter_jit`, an NNX module's jitted call) or the map is inside a `vmap`: one row
per element, in order, for every `B` (dividing the length or not, larger than it, 1), as
a map without `batch_size` gives; primal values, tangents and cotangents checked against
`f` applied per row in plain JAX (`jax.jvp`, `jax.grad`)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import sowviz

W = jax.random.normal(jax.random.PRNGKey(0), (4, 5)) / 2
C = jax.random.normal(jax.random.PRNGKey(1), (5,))
XS = jax.random.normal(jax.random.PRNGKey(2), (8, 4))
TXS = jax.random.normal(jax.random.PRNGKey(3), (8, 4))
BATCH_SIZES = [None, 1, 3, 4, 10]  # none, 1, ragged, dividing, larger than the length


def _h(x):
    return jnp.tanh(x @ W)


def _after(h):  # what f does with the sown value (its cotangent: cos(h) * C)
    return jnp.sum(jnp.sin(h) * C)


def _f(x):
    return _after(sowviz.sow(_h(x), "ragged"))


_jitted_f = jax.jit(_f)


def _loss(f, batch_size):
    return lambda xs: jnp.sum(jax.lax.map(f, xs, batch_size=batch_size))


def _rows(xs):
    """The sown value of each row, computed per row in plain JAX."""
    return np.stack([np.asarray(_h(x)) for x in xs])


def _row_cotangents(xs):
    return np.stack([np.asarray(jax.grad(_after)(_h(x))) for x in xs])


def _row_tangents(xs, txs):
    return np.stack([np.asarray(jax.jvp(_h, (x,), (t,))[1]) for x, t in zip(xs, txs, strict=True)])


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("f", [_jitted_f, _f], ids=["jit-f", "plain-f"])
def test_grad_rows_of_a_sow_in_lax_map_with_batch_size(f, batch_size):
    fn = jax.jit(jax.grad(_loss(f, batch_size)))  # nested in an outer jit too
    g, inter = sowviz.save_intermediates(fn)(XS)
    assert set(inter) == {"ragged"}
    _close(inter["ragged"]["primal"], _rows(XS))
    _close(inter["ragged"]["cotangent"], _row_cotangents(XS))
    _close(g, jax.grad(_loss(_f, None))(XS))


@pytest.mark.parametrize("batch_size", [3, 10])
def test_jvp_rows_of_a_jitted_f(batch_size):
    fn = lambda xs, t: jax.jvp(_loss(_jitted_f, batch_size), (xs,), (t,))  # noqa: E731
    _, inter = sowviz.save_intermediates(fn)(XS, TXS)
    _close(inter["ragged"]["primal"], _rows(XS))
    _close(inter["ragged"]["tangent"], _row_tangents(XS, TXS))


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
def test_inside_a_vmap_rows_then_the_vmap_axis(batch_size):
    """As `lax.map` without `batch_size` under a vmap: (rows, vmap, ...)."""
    xss = jnp.stack([XS, 2 * XS, XS - 1])

    def fn(xss):
        return jnp.sum(jax.vmap(_loss(_f, batch_size))(xss))

    _, inter = sowviz.save_intermediates(jax.grad(fn))(xss)
    want = np.stack([_rows(xs) for xs in xss], axis=1)  # (8, 3, 5)
    _close(inter["ragged"]["primal"], want)
    _close(inter["ragged"]["cotangent"], np.stack([_row_cotangents(xs) for xs in xss], axis=1))


def test_inspect_statistics_over_all_rows_in_order():
    ins = sowviz.inspect(_loss(_jitted_f, 3), XS, mode="jvp", tangents=(TXS,))
    summaries = ins.probe("ragged").summaries
    h, h_dot = _rows(XS), _row_tangents(XS, TXS)
    for key, want in (("primal", h), ("tangent", h_dot)):
        s = summaries[key]
        assert s["count"] == want.size and s["shape"] == list(want.shape)
        np.testing.assert_allclose(s["min"], want.min(), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(s["max"], want.max(), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(s["mean"], want.mean(), rtol=1e-4, atol=1e-7)
        rows = s["per_iteration"]
        assert rows["iterations"] == 8
        np.testing.assert_allclose(rows["mean"], want.mean(axis=1), rtol=1e-4, atol=1e-6)


class _EqxMap(eqx.Module):
    lin: eqx.nn.Linear
    batch_size: int | None = eqx.field(static=True, default=3)

    def __call__(self, xs):
        @eqx.filter_jit
        def one(x):
            return jnp.sum(sowviz.sow(jnp.tanh(self.lin(x)), "ragged") ** 2)

        return jnp.sum(jax.lax.map(one, xs, batch_size=self.batch_size))


class _NnxMap(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(4, 5, rngs=rngs)

    def __call__(self, xs):
        @jax.jit
        def one(x):
            return jnp.sum(sowviz.sow(jnp.tanh(self.lin(x)), "ragged") ** 2)

        return jnp.sum(jax.lax.map(one, xs, batch_size=3))


@pytest.mark.parametrize("kind", ["equinox", "nnx"])
def test_in_a_module(kind):
    if kind == "equinox":
        model = _EqxMap(eqx.nn.Linear(4, 5, key=jax.random.PRNGKey(4)))
        w, b = model.lin.weight.T, model.lin.bias
    else:
        model = _NnxMap(nnx.Rngs(4))
        w, b = model.lin.kernel[...], model.lin.bias[...]
    h = np.tanh(np.asarray(XS) @ np.asarray(w) + np.asarray(b))
    ins = sowviz.inspect(lambda m, xs: m(xs), model, XS)
    s = ins.probe("ragged").summaries
    assert s["primal"]["count"] == h.size
    np.testing.assert_allclose(s["primal"]["mean"], h.mean(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(s["cotangent"]["mean"], (2 * h).mean(), rtol=1e-4, atol=1e-7)
    _, inter = sowviz.save_intermediates(lambda xs: model(xs))(XS)
    _close(inter["ragged"]["primal"], h)


def test_a_users_vmap_inside_the_jitted_f_keeps_the_captured_layout():
    """Strict, as without the jit: a vmap of the user's between `lax.map`'s and the sow
    leaves the two calls as captured."""

    @jax.jit
    def one(x):
        return jax.vmap(lambda r: _after(sowviz.sow(_h(r), "ragged")))(x[None])[0]

    fn = sowviz.save_intermediates(_loss(one, 3), duplicates="suffix")
    _, inter = fn(XS)
    assert {k: np.shape(v["primal"]) for k, v in inter.items()} == {
        "ragged_0": (2, 3, 1, 5),
        "ragged_1": (2, 1, 5),
    }


# --- the graph: one stage for the map, its statistics over every row -----------------


def _map_program(f, batch_size):
    return lambda xs: jnp.sum(jnp.sin(jax.lax.map(f, xs, batch_size=batch_size)))


def _stages_at_top(ins):
    top = [n for n in ins.graph.nodes if n.parent is not None and n.kind != "input"]
    top = [n for n in top if ins.graph.node(n.parent).parent is None]
    return [(n.kind, n.label) for n in top if n.kind not in ("eqn", "output", "sow")]


def _stats(summary, want):
    want = np.asarray(want, np.float64)
    assert summary["count"] == want.size and summary["shape"] == list(want.shape)
    np.testing.assert_allclose(summary["min"], want.min(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(summary["max"], want.max(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(summary["mean"], want.mean(), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("capture", ["stages", "all"])
@pytest.mark.parametrize("f", [_jitted_f, _f], ids=["jit-f", "plain-f"])
def test_one_map_stage_with_every_row(f, capture):
    ins = sowviz.inspect(_map_program(f, 3), XS, capture=capture)
    plain = sowviz.inspect(_map_program(f, None), XS, capture=capture)
    assert _stages_at_top(ins) == _stages_at_top(plain)  # one `map`/`map(f)`, no `f` beside
    (node,) = [n for n in ins.graph.nodes if n.kind == "scan"]
    ys = np.asarray(jax.vmap(_f)(XS))  # f per row
    s = next(p for p in ins.probes if p.node == node.id).summaries
    _stats(s["primal"], ys)
    _stats(s["cotangent"], np.cos(ys))  # d sum(sin(ys)) / d ys
    # a stage inside f: every row, in order, one iteration per row
    h = next(p for p in ins.probes if p.name == "_h").summaries
    _stats(h["primal"], _rows(XS))
    np.testing.assert_allclose(
        h["primal"]["per_iteration"]["mean"], _rows(XS).mean(axis=1), rtol=1e-4, atol=1e-6
    )
    notes = [n["message"] for n in ins.to_dict()["notes"] if n["probe"] == node.id]
    assert len(notes) == 1 and "batch_size=3" in notes[0]
    assert "2 chunks of 3 rows" in notes[0] and "2 remaining rows" in notes[0]
    assert "all 8 rows" in notes[0]
    assert not [n for n in plain.to_dict()["notes"] if "batched map" in n["message"]]


def test_one_map_stage_tangents_of_every_row():
    ins = sowviz.inspect(_map_program(_f, 3), XS, mode="jvp", tangents=(TXS,))
    (node,) = [n for n in ins.graph.nodes if n.kind == "scan"]
    ys, ys_dot = jax.jvp(jax.vmap(_f), (XS,), (TXS,))
    s = next(p for p in ins.probes if p.node == node.id).summaries
    _stats(s["primal"], ys)
    _stats(s["tangent"], ys_dot)
    h = next(p for p in ins.probes if p.name == "_h").summaries
    _stats(h["tangent"], _row_tangents(XS, TXS))


def test_one_map_stage_in_a_module():
    model = _EqxMap(eqx.nn.Linear(4, 5, key=jax.random.PRNGKey(4)))

    ins = sowviz.inspect(lambda m, xs: m(xs), model, XS)
    plain = sowviz.inspect(lambda m, xs: m(xs), _EqxMap(model.lin, None), XS)

    def labels(i):  # (the chunks' and the remainder's slices of `xs`: `map setup`)
        return sorted(
            (n.kind, n.label) for n in i.graph.nodes if n.kind != "eqn" and n.label != "map setup"
        )

    assert labels(ins) == labels(plain)  # one `map` holding `one`, no `one` nor `map#2` beside
    z = np.asarray(XS) @ np.asarray(model.lin.weight.T) + np.asarray(model.lin.bias)
    h = np.tanh(z)
    (node,) = [n for n in ins.graph.nodes if n.kind == "scan"]
    _stats(next(p for p in ins.probes if p.node == node.id).summaries["primal"], (h**2).sum(1))
    _stats(ins.probe("lin").summaries["primal"], z)  # the Linear's output, every row
    _stats(ins.probe("lin").summaries["cotangent"], 2 * h * (1 - h**2))


def test_a_map_inside_a_vmap_keeps_its_remainder_stage():
    """Not joined in the graph (the vmap's axis comes first in the remainder's stages);
    its sow is (`test_inside_a_vmap_rows_then_the_vmap_axis`)."""
    xss = jnp.stack([XS, 2 * XS])
    ins = sowviz.inspect(lambda xss: jnp.sum(jax.vmap(_loss(_f, 3))(xss)), xss)
    assert not [n for n in ins.to_dict()["notes"] if "batched map" in n["message"]]
    _stats(ins.probe("ragged").summaries["primal"], np.stack([_rows(x) for x in xss], axis=1))
