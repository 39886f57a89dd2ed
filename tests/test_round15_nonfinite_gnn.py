"""NaN hunting on padded graphs (round 15): a GAT's segment softmax over edges filled with
-Inf gives a padding node (no unmasked incoming edge) -Inf - (-Inf) = NaN; its loss masks
the padding nodes (finite) while its gradients are NaN. The origin is that `sub`, not the
-Inf fill, whether or not the loss holds the NaN, with the segment's why and fixes; an
empty `segment_max`'s -Inf that reaches no result is said to be harmless in the panel."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import marked_line

import sowviz

HERE = pathlib.Path(__file__)


def _line(marker: str) -> int:
    return marked_line(HERE, marker)


# A 2-node graph: node 0 receives edges 0 and 1, node 1 (padding) edges 2 and 3, masked.
IDS = jnp.array([0, 0, 1, 1])
EMASK = jnp.array([True, True, False, False])
NODE_MASK = jnp.array([True, False])
X = jnp.arange(4.0)
W = jnp.float32(0.5)
FINFO_MIN = float(jnp.finfo(jnp.float32).min)


def _gat(fill=-jnp.inf, guard="", mask_loss=True):
    def loss(w, x):
        s = x * w
        s = jnp.where(EMASK, s, fill)  # gat: where
        m = jax.ops.segment_max(s, IDS, 2)
        if guard:  # "max" or "both"
            m = jnp.where(jnp.isfinite(m), m, 0.0)
        ex = jnp.exp(s - m[IDS])  # gat: sub
        den = jax.ops.segment_sum(ex, IDS, 2)
        if guard == "both":
            den = jnp.where(den > 0, den, 1.0)
        p = ex / den[IDS]
        node = jax.ops.segment_sum(p * x, IDS, 2)
        out = node * w  # a second layer reads the padding node
        return jnp.sum(jnp.where(NODE_MASK, out, 0.0)) if mask_loss else jnp.sum(out)

    return loss


def _row_loss(w, x):
    mask = jnp.array([[True, True, False], [False, False, False]])
    s = jnp.where(mask, x * w, -jnp.inf)  # row: where
    ex = jnp.exp(s - s.max(-1, keepdims=True))  # row: sub
    o = jnp.sum(ex / ex.sum(-1, keepdims=True) * x, -1) * w
    return jnp.sum(jnp.where(NODE_MASK, o, 0.0))


@pytest.mark.parametrize("mask_loss", [True, False])
def test_a_padded_gat_names_the_sub_not_the_inf_fill(mask_loss):
    loss = _gat(mask_loss=mask_loss)
    value, grad = jax.value_and_grad(loss)(W, X)
    # plain JAX: the masked loss is finite, its gradient NaN (unmasked: both NaN)
    assert np.isfinite(value) == mask_loss and np.isnan(grad)
    ins = sowviz.inspect(loss, W, X, mode="grad")
    o = ins.nonfinite
    assert o.alarm and o.forward.path[-1] == "ex", o.message  # the stage `ex = ...`
    assert f"before it, `where` (tests/{HERE.name}:{_line('# gat: where')}) held -Inf" in (
        o.forward.message
    )
    o = ins.locate_nonfinite()
    eq = o.forward.equation
    assert (eq.primitive, eq.source.line) == ("sub", _line("# gat: sub")), o.message
    assert "before it, `where`" in o.forward.message and "held -Inf" in o.forward.message


@pytest.mark.parametrize("mode", ["primal", "jvp"])
def test_with_every_result_finite_the_sub_is_still_the_origin(mode):
    # primal/jvp: the masked loss is finite and nothing else is returned: no alarm, but
    # the NaN's origin is the `sub`, as in mode grad (the fill made nothing)
    assert np.isfinite(_gat()(W, X))
    o = sowviz.inspect(_gat(), W, X, mode=mode).locate_nonfinite()
    assert not o.alarm and o.removed
    assert o.forward.equation.primitive == "sub", o.message
    assert o.forward.equation.source.line == _line("# gat: sub")


def test_a_fully_masked_row_under_a_masked_loss_names_the_sub():
    x = jnp.ones((2, 3))
    value, grad = jax.value_and_grad(_row_loss)(W, x)
    assert np.isfinite(value) and np.isnan(grad)
    o = sowviz.inspect(_row_loss, W, x, mode="grad").locate_nonfinite()
    eq = o.forward.equation
    assert (eq.primitive, eq.source.line) == ("sub", _line("# row: sub")), o.message
    assert "a fully masked row" in o.forward.message
    assert "a node with no unmasked incoming edge" not in o.forward.message


def test_an_overflow_stays_the_origin_of_the_nan_made_of_it():
    # exp(x * w) overflows to +Inf (made of finite values), then Inf - Inf = NaN, masked
    # out of the loss: the overflow, not the NaN after it, is where it went wrong
    def loss(w, x):
        e = jnp.exp(x * w)  # overflow: exp
        d = e - e[::-1]
        return jnp.sum(jnp.where(jnp.isfinite(d), d, 0.0) * w)

    x = jnp.array([200.0, 1.0, 200.0])
    assert np.isfinite(loss(W, x)) and np.isnan(jax.grad(loss)(W, x))
    o = sowviz.inspect(loss, W, x, mode="grad").locate_nonfinite()
    eq = o.forward.equation
    assert (eq.primitive, eq.source.line) == ("exp", _line("# overflow: exp")), o.message


def test_a_node_with_no_unmasked_edge_says_why_and_the_fixes():
    o = sowviz.inspect(_gat(), W, X, mode="grad").locate_nonfinite()
    msg = o.forward.message
    assert "a node with no unmasked incoming edge" in msg, msg
    assert f"the `jnp.where` at tests/{HERE.name}:{_line('# gat: where')} put -Inf" in msg
    assert "`jax.ops.segment_max` gave it -Inf" in msg and "-Inf - (-Inf) = NaN" in msg
    assert "jnp.where(mask, s, jnp.finfo(s.dtype).min)" in msg
    assert "m = jnp.where(jnp.isfinite(m), m, 0)" in msg
    assert "den = jnp.where(den > 0, den, 1)" in msg
    assert "a fully masked row" not in msg


@pytest.mark.parametrize("fix", ["finfo", "guards"])
def test_the_segment_fixes_give_finite_gradients_equal_to_plain_jax(fix):
    loss = _gat(fill=FINFO_MIN) if fix == "finfo" else _gat(guard="both")
    value, grads = jax.value_and_grad(loss, argnums=(0, 1))(W, X)
    assert np.isfinite(value) and all(np.isfinite(g).all() for g in grads)
    ins = sowviz.inspect(loss, W, X, mode="grad", argnums=(0, 1))
    got_value, got_grads = ins.result
    np.testing.assert_allclose(got_value, value, rtol=1e-6)
    for got, want in zip(got_grads, grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert ins.nonfinite is None or not ins.nonfinite.alarm
    # guarding the max alone is not enough: `exp` then gives 0 / 0 in the normalisation
    assert np.isnan(jax.grad(_gat(guard="max"))(W, X))


# -- an empty segment's max that reaches no result -------------------------------------

RECV = jnp.array([0, 0, 1, 1, 2])  # node 3 receives nothing: its max is -Inf


def _segment_softmax_loss(w, x):
    logits = x * w
    maxs = jax.ops.segment_max(logits, RECV, 4)
    e = jnp.exp(logits - maxs[RECV])
    return jnp.sum(e / jax.ops.segment_sum(e, RECV, 4)[RECV] * x)


@pytest.mark.browser
def test_an_empty_segment_max_panel_says_it_is_the_identity_and_harmless(page, tmp_path):
    x = jnp.arange(5.0)
    assert np.isneginf(jax.ops.segment_max(x * W, RECV, 4)[3])
    ins = sowviz.inspect(_segment_softmax_loss, W, x)
    assert ins.nonfinite is None
    pg = page.open_report(ins.save_html(tmp_path / "segmax.html"))
    # the line `maxs = jax.ops.segment_max(...)`, named by what it assigns (round 16)
    (seg,) = [n.id for n in ins.graph.nodes if n.label == "maxs"]
    pg.click(f'[data-node-id="{seg}"]')
    alert = pg.locator('[data-role="detail"] .sv-alert')
    text = alert.inner_text()
    assert "primal: 1 −Inf" in text, text
    assert "−Inf is the max's identity" in text and "jax.ops.segment_max gives" in text
    # code is set as code, as the banner sets it, not between literal backticks
    assert "`" not in text
    assert alert.locator("code").all_inner_texts() == ["jax.ops.segment_max"]
    assert "reaches no result" in text and "no alarm" in text
    assert alert.get_attribute("role") == "note"
    assert "sv-alert-quiet" in alert.get_attribute("class")
    assert page.errors == []
