"""An optax `adamw` training loop watched by `sowviz.Monitor`, with a last smaller batch
in every epoch: `mon.step` returns exactly `value_and_grad` on every step, and the
parameters after the loop equal a plain-JAX loop's."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import sowviz

from .checks import assert_close
from .models import eqx_models as em
from .models import linen_scan as ls

N, BATCH, EPOCHS = 40, 16, 2  # batches of 16, 16 and 8


def batches(x, y):
    for _ in range(EPOCHS):
        for i in range(0, N, BATCH):
            yield x[i : i + BATCH], y[i : i + BATCH]


def _train(model, x, y, loss, grad_fn, split, apply_updates, check=None):
    optim = optax.adamw(1e-2)
    opt_state = optim.init(split(model))
    for step, (xb, yb) in enumerate(batches(x, y)):
        value, grads = grad_fn(model, xb, yb)
        if check is not None:
            check(step, model, xb, yb, value, grads)
        updates, opt_state = optim.update(split(grads), opt_state, split(model))
        model = apply_updates(model, updates)
    return model


@pytest.mark.parametrize("family", ["equinox", "linen"])
def test_adamw_loop_with_monitor(family):
    if family == "equinox":
        model, x, y = em.make_mlp(batch=N)
        loss = em.mlp_loss
        plain_grad = eqx.filter_jit(eqx.filter_value_and_grad(loss))
        split = lambda t: eqx.filter(t, eqx.is_inexact_array)  # noqa: E731
        apply_updates = eqx.apply_updates
    else:
        model, x, y = ls.make(batch=N)
        loss = ls.loss
        plain_grad = jax.jit(jax.value_and_grad(loss))
        split = lambda t: t  # noqa: E731
        apply_updates = optax.apply_updates

    mon = sowviz.Monitor(loss, every=2)
    seen = []

    def check(step, model, xb, yb, value, grads):
        want_value, want_grads = plain_grad(model, xb, yb)
        assert_close(value, want_value, what=f"step {step} value")
        assert_close(grads, want_grads, what=f"step {step} grad")
        seen.append((step, xb.shape[0], float(value)))

    trained = _train(model, x, y, loss, mon.step, split, apply_updates, check)
    reference = _train(model, x, y, loss, plain_grad, split, apply_updates)
    assert [b for _, b, _ in seen] == [16, 16, 8] * EPOCHS
    assert_close(split(trained), split(reference), what="params after training")
    mon.flush()
    recorded = {e["step"]: e["loss"] for e in mon.history}
    assert sorted(recorded) == [0, 2, 4]
    for step, _, value in seen:
        if step in recorded:
            np.testing.assert_allclose(recorded[step], value, rtol=1e-6)
    assert jnp.isfinite(seen[-1][2])
