"""Capture engine fixes of session 35: a `jax.debug.callback` beside a probed value in a
`jax.checkpoint` (mode all), and `sow` inside `lax.map(..., batch_size=B)`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

W = jax.random.normal(jax.random.PRNGKey(0), (4, 4)) / 2
X = jax.random.normal(jax.random.PRNGKey(1), (3, 4))


def _check_stats(summary, values):
    v = np.asarray(values, np.float64).ravel()
    assert summary["count"] == v.size
    np.testing.assert_allclose(summary["min"], v.min(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(summary["max"], v.max(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(summary["mean"], v.mean(), rtol=1e-4, atol=1e-7)


# --- a debug callback inside jax.checkpoint, mode "all" ----------------------------


def _block(w, x):
    return jnp.tanh(x @ w)


def _remat_loss(callback):
    @jax.checkpoint
    def blk(w, x):
        h = sowviz.sow(_block(w, x), "h")
        callback(h)
        return h

    return lambda w, x: jnp.sum(blk(w, x) ** 2)


CALLBACKS = {
    "debug.callback": lambda h: jax.debug.callback(lambda v: None, h.sum()),
    "debug.print": lambda h: jax.debug.print("s={s}", s=h.sum()),
}


@pytest.mark.parametrize("kind", sorted(CALLBACKS))
def test_mode_all_with_debug_callback_in_checkpoint_matches_jax(kind):
    loss = _remat_loss(CALLBACKS[kind])
    tw, tx = jnp.ones_like(W) * 0.3, jnp.ones_like(X) * -0.2
    ins = sowviz.inspect(loss, W, X, mode="all", tangents=(tw, tx))
    value, tangent, (gw, gx) = ins.result
    ref_value, ref_tangent = jax.jvp(loss, (W, X), (tw, tx))
    ref_gw, ref_gx = jax.grad(loss, argnums=(0, 1))(W, X)
    np.testing.assert_allclose(value, ref_value, rtol=1e-6)
    np.testing.assert_allclose(tangent, ref_tangent, rtol=1e-5)
    np.testing.assert_allclose(gw, ref_gw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gx, ref_gx, rtol=1e-5, atol=1e-6)  # float32 cancellation
    # the sow inside the checkpoint: its value, its tangent and d loss / d h
    h, h_dot = jax.jvp(_block, (W, X), (tw, tx))
    summaries = ins.probe("h").summaries
    _check_stats(summaries["primal"], h)
    _check_stats(summaries["tangent"], h_dot)
    _check_stats(summaries["cotangent"], 2 * h)


def test_save_intermediates_linearize_and_transpose_through_checkpoint_callback():
    """The engine alone: `linearize` + `linear_transpose` of a checkpoint whose callback
    reads a sown value (the capture's sow is effectful; plain JAX's identity is not)."""

    @jax.checkpoint
    def blk(w, x):
        s = sowviz.sow(_block(w, x).sum(), "s")
        jax.debug.callback(lambda v: None, s)
        return _block(w, x)

    def loss(w, x):
        return jnp.sum(blk(w, x) ** 2)

    def both(w, x):
        y, lin = jax.linearize(loss, w, x)
        return y, lin(w, x), jax.linear_transpose(lin, w, x)(1.0)

    (y, t, (gw, gx)), inter = sowviz.save_intermediates(both)(W, X)
    np.testing.assert_allclose(y, loss(W, X), rtol=1e-6)
    np.testing.assert_allclose(t, jax.jvp(loss, (W, X), (W, X))[1], rtol=1e-5)
    np.testing.assert_allclose(gw, jax.grad(loss)(W, X), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gx, jax.grad(loss, argnums=1)(W, X), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inter["s"]["primal"], _block(W, X).sum(), rtol=1e-6)
    s_dot = jax.jvp(lambda w, x: _block(w, x).sum(), (W, X), (W, X))[1]
    np.testing.assert_allclose(inter["s"]["tangent"], s_dot, rtol=1e-5)
    np.testing.assert_allclose(inter["s"]["cotangent"], 0.0)  # s reaches no output


# --- sow inside lax.map(..., batch_size=B): one row per element ---------------------


def _mapped_loss(batch_size, inner_vmap=False):
    def one(x):
        h = jnp.tanh(x @ W)
        if inner_vmap:  # a vmap of the user's own around the sow
            return jax.vmap(lambda r: sowviz.sow(r, "h"))(h[None])[0]
        return sowviz.sow(h, "h")

    return lambda xs: jnp.sum(jax.lax.map(one, xs, batch_size=batch_size) ** 2)


def _mapped_rows(batch_size):
    def one(x):
        return sowviz.sow(jnp.tanh(x @ W), "h")

    return lambda xs: jax.lax.map(one, xs, batch_size=batch_size).sum(1)


def _by_hand(xs):
    return np.stack([np.tanh(np.asarray(x) @ np.asarray(W)) for x in xs])


@pytest.mark.parametrize("rows", [1, 6, 7])
def test_lax_map_batch_size_sow_has_one_row_per_element(rows):
    xs = jax.random.normal(jax.random.PRNGKey(2), (rows, 4))
    g, inter = sowviz.save_intermediates(jax.grad(_mapped_loss(2)))(xs)
    h = _by_hand(xs)
    assert set(inter) == {"h"}
    np.testing.assert_allclose(inter["h"]["primal"], h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inter["h"]["cotangent"], 2 * h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g, jax.grad(_mapped_loss(None))(xs), rtol=1e-5, atol=1e-6)


def test_lax_map_batch_size_sow_tangents_and_policies():
    xs = jax.random.normal(jax.random.PRNGKey(3), (5, 4))
    txs = jnp.ones_like(xs)
    fn = lambda xs, t: jax.jvp(_mapped_loss(2), (xs,), (t,))  # noqa: E731
    for duplicates in ("error", "suffix", "stack"):
        _, inter = sowviz.save_intermediates(fn, duplicates=duplicates)(xs, txs)
        h, h_dot = jax.jvp(jax.vmap(lambda x: jnp.tanh(x @ W)), (xs,), (txs,))
        np.testing.assert_allclose(inter["h"]["primal"], h, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(inter["h"]["tangent"], h_dot, rtol=1e-5, atol=1e-6)


def test_lax_map_batch_size_inside_scan_rows_per_outer_step():
    xss = jax.random.normal(jax.random.PRNGKey(4), (3, 5, 4))

    def outer(xss):
        def step(c, xs):
            return c + _mapped_loss(2)(xs), None

        return jax.lax.scan(step, 0.0, xss)[0]

    _, inter = sowviz.save_intermediates(outer)(xss)
    want = np.stack([_by_hand(xs) for xs in xss])  # (steps, rows, 4)
    np.testing.assert_allclose(inter["h"]["primal"], want, rtol=1e-5, atol=1e-6)


def test_lax_map_batch_size_with_another_vmap_keeps_the_captured_layout():
    """Strict: a sow with a vmap of the user's too is left as captured (chunk × batch,
    the remainder apart), not guessed at."""
    xs = jax.random.normal(jax.random.PRNGKey(5), (7, 4))
    _, inter = sowviz.save_intermediates(_mapped_loss(2, inner_vmap=True), duplicates="suffix")(xs)
    assert {k: np.shape(v["primal"]) for k, v in inter.items()} == {
        "h_0": (3, 2, 1, 4),
        "h_1": (1, 1, 4),
    }
    # a jacrev's vmap reaches the cotangents only: the call is left whole, its primal too
    _, inter = sowviz.save_intermediates(jax.jacrev(_mapped_rows(2)), duplicates="suffix")(xs)
    assert {k: {m: np.shape(v) for m, v in e.items()} for k, e in inter.items()} == {
        "h_0": {"primal": (3, 2, 4), "cotangent": (3, 7, 2, 4)},
        "h_1": {"primal": (1, 4), "cotangent": (7, 1, 4)},
    }


def test_inspect_lax_map_batch_size_per_iteration_rows_and_no_false_note():
    xs = jax.random.normal(jax.random.PRNGKey(6), (7, 4))
    ins = sowviz.inspect(_mapped_loss(2), xs)
    h = _by_hand(xs)
    summaries = ins.probe("h").summaries
    _check_stats(summaries["primal"], h)
    _check_stats(summaries["cotangent"], 2 * h)
    rows = summaries["primal"]["per_iteration"]
    assert rows["iterations"] == 7
    np.testing.assert_allclose(rows["mean"], h.mean(axis=1), rtol=1e-4, atol=1e-6)
    assert not [n for n in ins.to_dict()["notes"] if "not reached" in n["message"]]
