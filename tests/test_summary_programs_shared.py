"""`inspect` and a `Monitor` of one program share the summary programs compiled for
its shapes (in memory and on disk): a loop's per-iteration summaries differ between
the two (an `inspect` pads whole iterations, a Monitor does not), and a program
compiled for one was called with the other (a pytree mismatch: a crash)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz


def _loss(w, x):
    def body(h, _):
        for _ in range(4):
            h = jnp.tanh(h @ w)
        return h, None

    # (iterations: one count per test, each compiling its summary programs afresh)
    h, _ = jax.lax.scan(body, x, None, length=x.shape[0] // 2)
    return jnp.mean(h**2)


def _args(rows: int):
    w = jax.random.normal(jax.random.key(0), (32, 32)) / 6
    return w, jax.random.normal(jax.random.key(1), (rows, 32))


def _monitor_step(w, x):
    mon = sowviz.Monitor(_loss)
    try:
        loss, grads = mon.step(w, x)
        mon.flush()
        return loss, grads, mon.history
    finally:
        mon.close()


@pytest.mark.parametrize("inspect_first", [True, False], ids=["inspect-first", "monitor-first"])
def test_inspect_and_monitor_of_one_loop_program_both_run(inspect_first):
    w, x = _args(32 if inspect_first else 64)
    want_loss, want_grad = jax.value_and_grad(_loss)(w, x)
    if inspect_first:
        ins = sowviz.inspect(_loss, w, x)
        loss, grad, history = _monitor_step(w, x)
    else:
        loss, grad, history = _monitor_step(w, x)
        ins = sowviz.inspect(_loss, w, x)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(ins.result[0], want_loss, rtol=1e-6)
    assert len(history) == 1
