"""Round 15, on every supported JAX:

* mode 'all' of a step returning integers (an optax state's step count). Their tangents
  are float0, which JAX 0.10's `linear_transpose` refused ("linear_transpose only
  supports [float or complex] -> [float or complex]"); sowviz leaves them out of the
  transpose, as JAX 0.12 does. The results are checked against plain `jax.jvp`,
  `jax.vjp` and `jax.value_and_grad` of the same step.
* subnormals per dtype (sowviz.summary's docstring): float32 and bfloat16 ones count
  as zeros, float16 ones (normal in the float32 they are summarised in) as the
  non-zero values they are; checked against NumPy in each way a summary is made.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import sowviz


def _float0_like(v):
    return np.zeros(jnp.shape(v), jax.dtypes.float0)


def _is_float(v):
    return jnp.issubdtype(jnp.result_type(v), jnp.inexact)


def _tangents_like(tree, seed):
    """A deterministic direction for the floating leaves, float0 for the integer ones
    (what `jax.jvp` wants; sowviz ignores the integer leaves' tangents)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    rng = np.random.default_rng(seed)
    out = [
        jnp.asarray(rng.standard_normal(jnp.shape(v)), jnp.result_type(v))
        if _is_float(v)
        else _float0_like(v)
        for v in leaves
    ]
    return jax.tree_util.tree_unflatten(treedef, out)


def _ones_seed(y):
    return jax.tree_util.tree_map(
        lambda v: jnp.ones_like(v) if _is_float(v) else _float0_like(v), y
    )


def _assert_float_leaves_close(got, want):
    """Equal structure; every floating leaf close, every integer leaf's sowviz
    cotangent None (as mode grad gives it), its JAX one float0."""
    got_leaves = jax.tree_util.tree_leaves(got, is_leaf=lambda v: v is None)
    want_leaves = jax.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    n_float = 0
    for g, w in zip(got_leaves, want_leaves, strict=True):
        if w.dtype == jax.dtypes.float0:
            assert g is None or jnp.result_type(g) == jax.dtypes.float0
            continue
        n_float += 1
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
    assert n_float > 0


def _check_mode_all(step, args, cotangents=None):
    """Mode all's output, tangent and gradients against `jax.jvp` and `jax.vjp` (pulled
    back from `cotangents`, default ones, float0 at the integer outputs)."""
    tangents = tuple(_tangents_like(a, seed) for seed, a in enumerate(args))
    ins = sowviz.inspect(step, *args, mode="all", tangents=tangents, cotangents=cotangents)
    out, tangent, grads = ins.result

    # (jitted: op by op, an optax step's references take longer than sowviz)
    want_out, want_tangent = jax.jit(lambda a, t: jax.jvp(step, a, t))(args, tangents)
    seed = _ones_seed(want_out) if cotangents is None else cotangents
    seed = jax.tree_util.tree_map(
        lambda c, v: jnp.asarray(c) if _is_float(v) else _float0_like(v), seed, want_out
    )
    want_grads = jax.jit(lambda a, c: jax.vjp(step, *a)[1](c))(args, seed)

    for g, w in zip(
        jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(want_out), strict=True
    ):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)
    _assert_float_leaves_close(tangent, want_tangent)
    # sowviz: one tree per argument, None at the integer leaves
    for got_tree, want_tree in zip(grads, want_grads, strict=True):
        got_leaves = jax.tree_util.tree_leaves(got_tree)
        want_leaves = [
            w for w in jax.tree_util.tree_leaves(want_tree) if w.dtype != jax.dtypes.float0
        ]
        assert len(got_leaves) == len(want_leaves)
        for g, w in zip(got_leaves, want_leaves, strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
    return ins


def test_mode_all_of_a_step_returning_an_integer_count_matches_jax():
    def step(w, count):
        lr = 0.1 * jnp.cos(count / 10)  # a schedule of the step count
        return w - lr * w**2, count + 1, jnp.sum(w**2)

    ins = _check_mode_all(step, (jnp.linspace(-1.0, 1.0, 4), jnp.int32(3)))
    assert int(ins.result[0][1]) == 4


def _optax_step():
    optax = pytest.importorskip("optax")
    sched = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 3, 20, 1e-4)
    opt = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.inject_hyperparams(optax.adamw)(learning_rate=sched),
    )
    params = {"w": jnp.linspace(-0.5, 0.5, 6).reshape(3, 2), "b": jnp.full(2, 0.1)}
    x = jnp.linspace(-1, 1, 12).reshape(4, 3)

    def loss(p, x):
        return jnp.mean(jnp.tanh(x @ p["w"] + p["b"]) ** 2)

    def step(params, state, x):
        value, grads = jax.jit(jax.value_and_grad(loss))(params, x)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    # the step counts at 1: the schedule past its first value (0)
    state = jax.tree_util.tree_map(lambda v: v if _is_float(v) else v + 1, opt.init(params))
    return step, loss, (params, state, x)


def test_mode_all_of_an_optax_step_with_a_scheduled_injected_learning_rate_matches_jax():
    step, loss, (params, state, x) = _optax_step()
    counts = [v for v in jax.tree_util.tree_leaves(state) if not _is_float(v)]
    assert counts  # the case: integer step counts in the optimizer state
    # a cotangent on the loss alone (zeros on the new parameters and state, the counts
    # included): mode all's gradient of the parameters is then the loss's
    out = jax.eval_shape(step, params, state, x)
    zeros = jax.tree_util.tree_map(lambda v: jnp.zeros(v.shape, v.dtype), out[:2])
    ins = _check_mode_all(step, (params, state, x), cotangents=(*zeros, jnp.float32(1.0)))
    value, grads = jax.jit(jax.value_and_grad(loss))(params, x)
    np.testing.assert_allclose(np.asarray(ins.result[0][2]), np.asarray(value), rtol=1e-6)
    for k in params:
        np.testing.assert_allclose(
            np.asarray(ins.result[2][0][k]), np.asarray(grads[k]), rtol=1e-5, atol=1e-7
        )
    # the stages were probed in all three modes
    kinds = {k for p in ins.probes for k in p.summaries}
    assert {"primal", "tangent", "cotangent"} <= kinds


# --------------------------------------------------------------------------
# Subnormals by dtype

F32_TINY = float(np.finfo(np.float32).tiny)  # 1.18e-38
# Per dtype: values holding subnormals of that dtype (and zeros, normals, negatives),
# and the magnitude below which a value counts as a zero. bfloat16 has float32's
# exponent range: its subnormals are float32's. float16's (6e-8 to 6.1e-5) are normal
# in float32, where a float16 array is summarised: none counts as a zero.
SUBNORMAL_CASES = {
    "float32": (np.float32, [1e-45, -1e-40, 1.1e-38, 2e-38, 0.0, -0.0, 0.5, -3.0], F32_TINY),
    "bfloat16": (jnp.bfloat16, [1e-39, -5e-39, 1.1e-38, 2e-38, 0.0, -0.0, 0.5, -3.0], F32_TINY),
    "float16": (np.float16, [6e-8, -3e-6, 6.0e-5, 6.2e-5, 0.0, -0.0, 0.5, -3.0], 0.0),
}


def _subnormal_reference(a, flush_below):
    """The statistics of `a` in NumPy: values below `flush_below` in magnitude are
    zeros; moments in float64; the log histogram's 128 bins of 4 per octave, by the
    float32 bits of each magnitude, ending with the bin of the largest."""
    v = a.astype(np.float32)
    v = np.where(np.abs(v) < flush_below, np.float32(0), v)
    nz = v[v != 0]
    keys = np.abs(nz).view(np.uint32) >> 21  # exponent and the top 2 mantissa bits
    start = int(keys.max()) - 127
    first = int(keys[keys >= start].min())
    f = v.astype(np.float64)
    return {
        "zeros": int(np.sum(v == 0)),
        "min": float(f.min()),
        "max": float(f.max()),
        "mean": float(f.mean()),
        "l2": float(np.sqrt(np.sum(f * f))),
        "under": int(np.sum(keys < start)),
        "in_window": int(np.sum(keys >= start)),
        "first_edge": float(np.log10(np.float64(np.uint32(first << 21).view(np.float32)))),
    }


def _summary_json(a, how):
    if how in ("small", "blocked"):  # blocked: 2**20 values, summarised in blocks
        return sowviz.summarize(jnp.asarray(a)).to_json()
    # `inspect`: its sums tallied on the device, the moments finished on the host
    ins = sowviz.inspect(lambda x: 2 * x, jnp.asarray(a), mode="primal")
    return ins.probe("x").summaries["primal"]


@pytest.mark.parametrize("how", ["small", "blocked", "inspect"])
@pytest.mark.parametrize("dtype_name", list(SUBNORMAL_CASES))
def test_subnormals_count_as_zeros_in_float32_and_bfloat16_not_float16(dtype_name, how):
    dtype, values, flush_below = SUBNORMAL_CASES[dtype_name]
    a = np.resize(np.asarray(values, dtype), (1 << 20) if how == "blocked" else 64)
    # the case: subnormals of the array's own dtype (ml_dtypes' finfo knows bfloat16)
    tiny = float(ml_dtypes.finfo(dtype).tiny)
    subnormal = (a != 0) & (np.abs(a.astype(np.float32)) < tiny)
    assert np.sum(subnormal) == 3 * a.size // 8
    ref = _subnormal_reference(a, flush_below)
    got = _summary_json(a, how)
    assert got["dtype"] == dtype_name
    assert got["zeros"] == ref["zeros"]
    assert got["min"] == ref["min"] and got["max"] == ref["max"]
    np.testing.assert_allclose(got["mean"], ref["mean"], rtol=1e-5)
    np.testing.assert_allclose(got["l2"], ref["l2"], rtol=1e-5)
    log = got["loghist"]
    assert log["under"] == ref["under"] and sum(log["counts"]) == ref["in_window"]
    np.testing.assert_allclose(log["edges"][0], ref["first_edge"], rtol=1e-12)
    if dtype_name == "float16":
        # a float16 array's zeros are its exact zeros; its smallest subnormal (2**-24)
        # is in the log histogram, at its own magnitude
        assert got["zeros"] == int(np.sum(a == 0))
        assert log["edges"][0] == pytest.approx(np.log10(2.0**-24))
    else:
        assert got["zeros"] == int(np.sum((a == 0) | subnormal))
