"""One statement is one box: a generator or list comprehension over a pytree's leaves on
one line (`norms = jnp.sqrt(sum(... for g in jax.tree.leaves(per_ex)))`, DP-SGD) is one
box named by the line, not a box per leaf and per add, on Python 3.11 (the comprehension
runs in a frame of its own) and 3.12 (a list comprehension is inlined); a `for` loop on
one line still reads by pass. A Hessian's unravelling of a scalar (`split`, `reshape`) is
the work of the line's box `u_xx`, no boxes of its own. A return line reads by what it
computes (`u_t + u_val*u_x - nu*u_xx`, `grads / divisor`), and a line assigning one JAX
call is named by its target at any level (`x = jnp.mean(r)`: `x`)."""

import jax
import jax.numpy as jnp
import numpy as np

import sowviz


def _nodes(ins):
    return ins.to_dict()["nodes"]


def _children(ins, label):
    nodes = _nodes(ins)
    (box,) = (n for n in nodes if n["label"] == label)
    return [n["label"] for n in sorted(nodes, key=lambda n: n["order"]) if n["parent"] == box["id"]]


def _check_stats(summary: dict, values) -> None:
    v = np.asarray(values, np.float64).ravel()
    assert summary["count"] == v.size
    np.testing.assert_allclose(summary["min"], v.min(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(summary["max"], v.max(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(summary["l2"], np.linalg.norm(v), rtol=1e-5, atol=1e-6)


# -- 4. comprehensions over a pytree's leaves ---------------------------------------------

_K = jax.random.split(jax.random.PRNGKey(0), 4)
_B = 6
_PARAMS = {
    "w1": jax.random.normal(_K[0], (3, 5)) / 2,
    "b1": jnp.zeros(5),
    "w2": jax.random.normal(_K[1], (5, 2)) / 2,
    "b2": jnp.zeros(2),
}
_X = jax.random.normal(_K[2], (_B, 3))
_Y = jax.random.normal(_K[3], (_B, 2))


def _loss(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def _grad_norms(params, x, y):
    per_ex = jax.vmap(jax.grad(_loss), in_axes=(None, 0, 0))(params, x, y)
    norms = jnp.sqrt(sum(jnp.sum(g.reshape(g.shape[0], -1) ** 2, axis=1) for g in jax.tree.leaves(per_ex)))  # fmt: skip
    return jnp.mean(norms)


def test_generator_over_leaves_is_one_box_with_the_lines_value():
    ins = sowviz.inspect(_grad_norms, _PARAMS, _X, _Y, mode="grad")
    labels = [n["label"] for n in _nodes(ins)]
    assert [lab for lab in labels if lab.startswith("norms")] == ["norms"]
    per_ex = jax.vmap(jax.grad(_loss), in_axes=(None, 0, 0))(_PARAMS, _X, _Y)
    leaves = [np.asarray(g, np.float64).reshape(_B, -1) for g in jax.tree.leaves(per_ex)]
    want = np.sqrt(sum((g**2).sum(1) for g in leaves))
    probe = ins.probe("norms")
    _check_stats(probe.summaries["primal"], want)
    _check_stats(probe.summaries["cotangent"], np.full(_B, 1 / _B))  # d mean / d norms
    np.testing.assert_allclose(ins.result[0], want.mean(), rtol=1e-5)


def _private(params, key):
    leaves = jax.tree.leaves(params)
    total = jnp.linalg.norm(jnp.array([jnp.linalg.norm(g.ravel()) for g in leaves]))
    keys = jax.random.split(key, len(leaves))
    noised = [g / total + 0.1 * jax.random.normal(k, g.shape) for g, k in zip(leaves, keys, strict=True)]  # fmt: skip
    return jnp.concatenate([n.ravel() for n in noised])


def test_list_comprehensions_are_one_box_each():
    key = jax.random.PRNGKey(3)
    ins = sowviz.inspect(_private, _PARAMS, key, mode="primal")
    labels = [n["label"] for n in _nodes(ins)]
    assert [lab for lab in labels if lab.startswith("total")] == ["total"]
    assert [lab for lab in labels if lab.startswith("noised")] == ["noised"]
    leaves = [np.asarray(g, np.float64) for g in jax.tree.leaves(_PARAMS)]
    total = np.sqrt(sum((g**2).sum() for g in leaves))
    _check_stats(ins.probe("total").summaries["primal"], total)
    np.testing.assert_allclose(ins.result, jax.jit(_private)(_PARAMS, key), rtol=1e-6)


def _one_line_loop(ws, x):
    for w in ws: x = jnp.tanh(x @ w)  # fmt: skip  # noqa: E701
    return jnp.sum(x)


def test_a_for_loop_on_one_line_still_reads_by_pass():
    # (its passes are a Python loop's, not a comprehension's: `x#2`, `x#3`, `x#4` beside
    # the argument `x` they rebind)
    ws = [jax.random.normal(k, (3, 3)) / 2 for k in jax.random.split(jax.random.PRNGKey(1), 3)]
    x = jnp.ones(3)
    ins = sowviz.inspect(_one_line_loop, ws, x, mode="primal")
    labels = [n["label"] for n in _nodes(ins)]
    assert [lab for lab in labels if lab.startswith("x#")] == ["x#2", "x#3", "x#4"]
    h = np.asarray(x, np.float64)
    for w in ws:
        h = np.tanh(h @ np.asarray(w, np.float64))
    _check_stats(ins.probe("x#4").summaries["primal"], h)


# -- 5. a scalar Hessian's unravelling ------------------------------------------------------

_W = jax.random.normal(jax.random.PRNGKey(0), (2, 8))
_T = jnp.linspace(0, 1, 8)
_XS = jnp.linspace(-1, 1, 8)


def _u(params, t, x):
    return jnp.sum(jnp.tanh(jnp.array([t, x]) @ params["w"]))


def _residual(params, t, x):
    u_xx = jax.hessian(_u, argnums=2)(params, t, x)
    return u_xx


def _hess_loss(params, t, x):
    return jnp.mean(jax.vmap(_residual, in_axes=(None, 0, 0))(params, t, x) ** 2)


def test_scalar_hessian_unravelling_is_the_lines_own_work():
    params = {"w": _W}
    ins = sowviz.inspect(_hess_loss, params, _T, _XS, mode="grad")
    assert not {"split", "reshape"} & set(_children(ins, "u_xx"))
    (box,) = (n for n in _nodes(ins) if n["label"] == "u_xx")
    assert box["n_eqns"] >= 4  # (its work is counted, not drawn)
    want = jax.vmap(jax.hessian(_u, argnums=2), in_axes=(None, 0, 0))(params, _T, _XS)
    probe = ins.probe("u_xx")
    _check_stats(probe.summaries["primal"], want)
    _check_stats(probe.summaries["cotangent"], 2 * np.asarray(want, np.float64) / want.size)
    v, g = jax.value_and_grad(_hess_loss)(params, _T, _XS)
    np.testing.assert_allclose(ins.result[0], v, rtol=1e-5)
    np.testing.assert_allclose(ins.result[1]["w"], g["w"], rtol=1e-4, atol=1e-6)


def _burgers(params, t, x):
    u_val = _u(params, t, x)
    u_t = jax.grad(_u, argnums=1)(params, t, x)
    u_x = jax.grad(_u, argnums=2)(params, t, x)
    u_xx = jax.hessian(_u, argnums=2)(params, t, x)
    return u_t + u_val * u_x - 0.01 * u_xx


def _burgers_loss(params, t, x):
    return jnp.mean(jax.vmap(_burgers, in_axes=(None, 0, 0))(params, t, x) ** 2)


def test_hessian_box_holding_its_evaluations_draws_no_unravelling():
    # (`u` evaluated on another line too: `u_xx` holds `u`, `u (backward)`, and its
    # `split`s and `reshape`s are its own work); the return line reads by what it computes
    params = {"w": _W}
    ins = sowviz.inspect(_burgers_loss, params, _T, _XS, mode="grad")
    assert _children(ins, "u_xx") == ["_u", "_u (backward)"]
    want = jax.vmap(jax.hessian(_u, argnums=2), in_axes=(None, 0, 0))(params, _T, _XS)
    _check_stats(ins.probe("u_xx").summaries["primal"], want)
    label = "u_t + u_val*u_x - 0.01*u_xx"
    assert label in [n["label"] for n in _nodes(ins)]
    residual = jax.vmap(_burgers, in_axes=(None, 0, 0))(params, _T, _XS)
    _check_stats(ins.probe(label).summaries["primal"], residual)
    v = _burgers_loss(params, _T, _XS)
    np.testing.assert_allclose(ins.result[0], v, rtol=1e-5)


# -- 6. a return line of a tree map ---------------------------------------------------------


def _clipped(params, x, y):
    grads = jax.grad(_loss)(params, x, y)
    divisor = jnp.maximum(optax_norm(grads) / 0.5, 1.0)
    return jax.tree.map(lambda g: g / divisor, grads)


def optax_norm(tree):
    return jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(tree)))


def test_returned_tree_map_reads_by_what_it_computes():
    ins = sowviz.inspect(jax.vmap(_clipped, in_axes=(None, 0, 0)), _PARAMS, _X, _Y, mode="primal")
    labels = [n["label"] for n in _nodes(ins)]
    assert "grads / divisor" in labels and "map" not in labels
    want = jax.vmap(_clipped, in_axes=(None, 0, 0))(_PARAMS, _X, _Y)
    for a, b in zip(jax.tree.leaves(ins.result), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


# -- 7. a line assigning one JAX call, at a small and a big level ---------------------------


def _f_big(p, d):
    r = jnp.tanh(p * d)
    x = jnp.mean(r)
    y = jnp.mean(jnp.tanh(r))
    return (1 - x) ** 2 + 100 * (y - x**2) ** 2


def _f_small(p, d):
    r = jnp.tanh(p * d)
    x = jnp.mean(r)
    y = jnp.mean(jnp.tanh(r))
    return jnp.stack([x, y]).sum()


def test_line_assigning_one_call_is_named_by_its_target_at_any_level():
    p, d = jnp.ones(8), jnp.linspace(-1, 1, 8)
    r = np.tanh(np.asarray(p * d, np.float64))
    for f in (_f_big, _f_small):
        ins = sowviz.inspect(f, p, d, mode="grad")
        labels = [n["label"] for n in _nodes(ins)]
        assert "x" in labels and "y" in labels and "mean" not in labels, (f.__name__, labels)
        _check_stats(ins.probe("x").summaries["primal"], r.mean())
        _check_stats(ins.probe("y").summaries["primal"], np.tanh(r).mean())
