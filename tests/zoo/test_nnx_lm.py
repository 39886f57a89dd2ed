"""Flax NNX transformer LM passed as an `nnx.Module` argument."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import sowviz

from .checks import STAT_RTOL, assert_close, assert_stage, assert_value_and_grad
from .models import nnx_lm


@pytest.fixture(scope="module")
def lm():
    return nnx_lm.make()


@pytest.fixture(scope="module")
def grad_ins(lm):
    return sowviz.inspect(nnx_lm.loss, *lm, mode="grad")


def _hidden(model, tokens):
    """Every block's input and the last block's output, by plain calls."""
    mask = nnx.make_causal_mask(tokens)
    hs = [model.embed_tokens(tokens)]
    for layer in model.layers:
        hs.append(layer(hs[-1], mask))
    return hs, mask


def _tail(model, k, mask, targets):
    """The loss as a function of the hidden state entering block `k`."""

    def tail(h):
        for layer in list(model.layers)[k:]:
            h = layer(h, mask)
        logits = model.unembed(h)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    return tail


def test_grad_equals_nnx_value_and_grad(lm, grad_ins):
    value, grads = nnx.value_and_grad(nnx_lm.loss)(*lm)
    assert_value_and_grad(grad_ins.result, value, grads)


def test_inspect_leaves_the_model_unchanged(lm, grad_ins):
    fresh = nnx_lm.make()[0]
    assert_close(nnx.state(lm[0], nnx.Param), nnx.state(fresh, nnx.Param), rtol=0)


def test_block_cotangents_equal_grad_of_the_downstream_model(lm, grad_ins):
    model, tokens, targets = lm
    hs, mask = _hidden(model, tokens)
    for k in range(1, len(hs)):  # each block's output
        g = jax.grad(_tail(model, k, mask, targets))(hs[k])
        assert_stage(grad_ins, hs[k], key="cotangent", expected=g)
    logits = model.unembed(hs[-1])
    g_logits = jax.grad(
        lambda z: optax.softmax_cross_entropy_with_integer_labels(z, targets).mean()
    )(logits)
    assert_stage(grad_ins, logits, key="cotangent", expected=g_logits)


def test_jvp_mode_equals_jax_jvp(lm):
    model, tokens, targets = lm
    key = jax.random.PRNGKey(7)
    t_model = jax.tree.map(lambda a: jax.random.normal(key, a.shape, a.dtype), model)
    f0 = lambda a: np.zeros(a.shape, jax.dtypes.float0)  # noqa: E731
    tangents = (t_model, f0(tokens), f0(targets))
    ins = sowviz.inspect(nnx_lm.loss, *lm, mode="jvp", tangents=tangents)
    want = jax.jvp(nnx_lm.loss, lm, tangents)
    assert_close(ins.result[0], want[0], what="value")
    assert_close(ins.result[1], want[1], what="tangent")


class Tap(nnx.Module):
    """Wraps a layer and sows its output: a copy of the model with `sowviz.sow` in it."""

    def __init__(self, inner, name: str):
        self.inner = inner
        self.name = name

    def __call__(self, *args, **kwargs):
        return sowviz.sow(self.inner(*args, **kwargs), self.name)


def test_sown_copy_under_nnx_grad(lm):
    model, tokens, targets = lm
    sown = nnx.clone(model)
    for i in range(len(sown.layers)):
        sown.layers[i] = Tap(sown.layers[i], f"block{i}")
    grads, inter = sowviz.save_intermediates(nnx.grad(nnx_lm.loss))(sown, tokens, targets)
    hs, mask = _hidden(model, tokens)
    for i in range(len(model.layers)):
        got = inter[f"block{i}"]
        np.testing.assert_allclose(got["primal"], hs[i + 1], rtol=STAT_RTOL, atol=1e-5)
        want = jax.grad(_tail(model, i + 1, mask, targets))(hs[i + 1])
        np.testing.assert_allclose(
            got["cotangent"], want, rtol=STAT_RTOL, atol=1e-4 * float(jnp.abs(want).max())
        )
    want_grads = nnx.grad(nnx_lm.loss)(model, tokens, targets)
    got_grads = nnx.state(grads, nnx.Param) if isinstance(grads, nnx.Module) else grads
    assert sorted(np.asarray(v).size for v in jax.tree.leaves(got_grads)) == sorted(
        np.asarray(v).size for v in jax.tree.leaves(want_grads)
    )


@pytest.mark.browser
def test_report_opens_in_chromium(grad_ins, report):
    report(grad_ins)
