"""A return line that assigns no name is named by the library calls it makes
(`softmax_cross_entropy_with_integer_labels · mean`, `log_softmax · mean`), or by its
expression with a module it builds read by the name it gives it (`lm_head(x) + 0.1 *
aux.sum()`), never by its place (`loss_fn:21`); and `res = minimize(...)`'s box holds
`minimize` > `minimize_bfgs`, as the inline call's does."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.optimize import minimize

import sowviz


def _children(graph, node_id):
    return [n.label for n in sorted(graph.nodes, key=lambda n: n.order) if n.parent == node_id]


def _only(graph, label):
    (node,) = (n for n in graph.nodes if n.label == label)
    return node


def _placed(labels, fn):
    return [x for x in labels if re.fullmatch(rf"{fn.__name__}:\d+", x)]


_X = jax.random.normal(jax.random.PRNGKey(1), (16, 8))
_Y = jnp.arange(16) % 5


def test_an_optax_loss_return_line_names_the_cross_entropy_not_only_mean():
    optax = pytest.importorskip("optax")
    eqx = pytest.importorskip("equinox")
    model = eqx.nn.Linear(8, 5, key=jax.random.PRNGKey(0))

    def loss_fn(model, x, labels):
        logits = jax.vmap(model)(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    ins = sowviz.inspect(loss_fn, model, _X, _Y, mode="grad")
    g = ins.graph
    # (the line's box was `mean`, the cross-entropy, 29 of its 31 equations, inside)
    line = "softmax_cross_entropy_with_integer_labels · mean"
    assert _children(g, g.root)[-2:] == [line, "output"], _children(g, g.root)
    inside = _children(g, _only(g, line).id)
    assert inside[0] == "softmax_cross_entropy_with_integer_labels", inside
    value, grad = eqx.filter_value_and_grad(loss_fn)(model, _X, _Y)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1].weight, grad.weight, rtol=1e-5, atol=1e-7)


def _shared_loss(w, x, toks):
    logits = jnp.tanh(x @ w)
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(16), (toks + 1) % 5])


def test_a_long_return_line_is_named_by_its_float_calls_not_its_place():
    w = jax.random.normal(jax.random.PRNGKey(2), (8, 5))
    ins = sowviz.inspect(_shared_loss, w, _X, _Y, mode="grad")
    g = ins.graph
    labels = [n.label for n in g.nodes]
    assert not _placed(labels, _shared_loss), labels  # (it read `_shared_loss:61`)
    # (`jnp.arange`'s index is no work to name it by; the `%` is none written by name)
    assert "log_softmax · mean" in _children(g, g.root), _children(g, g.root)
    inside = _children(g, _only(g, "log_softmax · mean").id)
    assert {"log_softmax", "mean"} <= set(inside), inside
    value, grad = jax.value_and_grad(_shared_loss)(w, _X, _Y)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-5, atol=1e-7)


def test_a_linen_return_line_reads_its_module_by_the_name_it_gives():
    nn = pytest.importorskip("flax.linen")

    class Head(nn.Module):
        @nn.compact
        def __call__(self, x):
            for i in range(3):
                x = x + nn.Dense(8, name=f"fc_{i}")(nn.LayerNorm(name=f"ln_{i}")(x))
            x = nn.LayerNorm(name="ln_f")(x)
            aux = nn.Dense(4, name="aux_head")(x)
            return nn.Dense(3, name="lm_head")(x) + 0.1 * aux.sum()

    model = Head()
    params = model.init(jax.random.PRNGKey(0), _X)["params"]

    def loss(p, x):
        return jnp.mean(model.apply({"params": p}, x) ** 2)

    ins = sowviz.inspect(loss, params, _X, mode="grad")
    g = ins.graph
    head = _children(g, _only(g, "Head").id)
    # (it read `Head:<line>`, a module's name and a place)
    assert head[-2:] == ["lm_head", "lm_head(x) + 0.1 * aux.sum()"], head
    assert not [x for x in head if x.startswith("Head:")], head
    value, grad = jax.value_and_grad(loss)(params, _X)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    got, want = ins.result[1]["lm_head"]["kernel"], grad["lm_head"]["kernel"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def _inner_obj(z, lam, a, b):
    return jnp.sum((a @ z - b) ** 2) + lam * jnp.sum(z**2)


def outer(lam, a, b):  # (a name starting `o`: its line's fold read as `minimize`'s own work)
    res = minimize(_inner_obj, jnp.zeros(a.shape[1]), args=(lam, a, b), method="BFGS")
    return jnp.sum(res.x**2)


def test_a_minimize_line_assigning_its_result_keeps_the_library_s_structure():
    fn = outer
    a = jax.random.normal(jax.random.PRNGKey(0), (8, 4))
    b = jax.random.normal(jax.random.PRNGKey(1), (8,))
    ins = sowviz.inspect(fn, jnp.array(0.5), a, b, mode="primal")
    g = ins.graph
    res = _only(g, "res")
    # (`res` held 19 loose boxes: `iota`, `eq`, `convert_element_type`, `norm`, `lt`,
    # `while(body_fun)`, `not`, `and`, `where (×3)`)
    assert _children(g, res.id) == ["broadcast_in_dim", "minimize"], _children(g, res.id)
    bfgs = _children(g, _only(g, "minimize").id)
    assert bfgs[0] == "minimize_bfgs", bfgs
    inside = _children(g, _only(g, "minimize_bfgs").id)
    assert "while(body_fun)" in inside and "eye" in inside, inside
    np.testing.assert_allclose(ins.result, jax.jit(fn)(jnp.array(0.5), a, b), rtol=1e-5)
