"""Monitor steps against plain JAX: every process of a `jax.distributed` job refuses a
taken `log_dir` alike; recorded steps return the plain steps' shardings; low-precision
steps return the plain program's values."""

from __future__ import annotations

import json
import pathlib
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _distributed import run_two_processes
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import sowviz

ROOT = pathlib.Path(__file__).resolve().parents[1]

# One process of a 2-process job (1 CPU device each): builds a Monitor on a `log_dir`
# that already holds a run log and reports what it raised.
_WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    import jax
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except (AttributeError, KeyError, ValueError):
        pass
    port, pid, log_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid
    )
    import jax.numpy as jnp
    import sowviz
    t0 = time.monotonic()
    try:
        mon = sowviz.Monitor(lambda w: jnp.sum(w ** 2), log_dir=log_dir)
        said = {"raised": None}
    except Exception as err:
        said = {"raised": type(err).__name__, "message": str(err)}
    said["seconds"] = time.monotonic() - t0
    print("REPORT " + json.dumps(said), flush=True)
    jax.distributed.shutdown()
    """
)


def _run_two_processes(tmp_path: pathlib.Path, log_dir: pathlib.Path) -> list[tuple]:
    worker = tmp_path / "worker.py"
    worker.write_text(_WORKER)
    return run_two_processes(worker, str(log_dir), timeout=120)


def test_every_process_refuses_a_log_dir_holding_a_run_log(tmp_path):
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    (log_dir / "steps.log").write_bytes(b"an earlier run's steps" * 10)
    reports = []
    for rc, out, err in _run_two_processes(tmp_path, log_dir):
        assert rc == 0, out[-2000:] + err[-3000:]
        line = next(ln for ln in out.splitlines() if ln.startswith("REPORT "))
        reports.append(json.loads(line[len("REPORT ") :]))
        # no second traceback at the exit (the Monitor was never built)
        assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    first, other = reports
    assert first["raised"] == other["raised"] == "FileExistsError", reports
    assert "already holds a run log (steps.log, 220 bytes)" in first["message"]
    assert other["message"].startswith(first["message"])
    assert "said by process 0" in other["message"]
    assert other["seconds"] < 20  # at once, not after a 30 s collective timeout


def test_a_read_failing_at_the_exit_says_one_line_not_a_second_traceback(
    tmp_path, monkeypatch, capsys
):
    # A `jax.distributed` peer gone: the script's own error is shown, then the exit
    # hook's read of the steps in flight fails too (a Gloo timeout).
    mon = sowviz.Monitor(lambda w: jnp.sum(w**2), log_dir=tmp_path / "log")
    mon.step(jnp.ones(3))

    def dead(*_):
        raise RuntimeError("Gloo context initialization failed: DEADLINE_EXCEEDED")

    monkeypatch.setattr(mon, "_drain_now", dead)
    mon._close_at_exit()  # raises nothing
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "could not be read" in err and "DEADLINE_EXCEEDED" in err
    assert mon._closed and all(s.closed for s in mon._listeners)


# -- a recorded step returns its results where the plain steps put them ------------------


def _sharded_embedding_problem():
    """`embed` split P('tensor', 'fsdp'): the plain program returns its gradient as
    P(None, 'fsdp'), the instrumented one (probes as outputs) chose P('tensor', 'fsdp')."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("fsdp", "tensor"))

    def loss(params, tokens):
        x = params["embed"][tokens]
        return jnp.mean((x @ params["out"]) ** 2)

    k0, k1, k2 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {
        "embed": jax.device_put(
            jax.random.normal(k0, (100, 32)), NamedSharding(mesh, P("tensor", "fsdp"))
        ),
        "out": jax.device_put(
            jax.random.normal(k1, (32, 16)), NamedSharding(mesh, P("fsdp", "tensor"))
        ),
    }
    tokens = jax.device_put(
        jax.random.randint(k2, (8, 16), 0, 100), NamedSharding(mesh, P("fsdp", None))
    )
    return loss, params, tokens


def _specs(tree):
    return {k: v.sharding for k, v in tree.items()}


@pytest.mark.parametrize("every", [1, 2])
def test_recorded_steps_return_the_plain_steps_shardings(every):
    loss, params, tokens = _sharded_embedding_problem()
    want_value, want_grads = jax.jit(jax.value_and_grad(loss))(params, tokens)
    apply = jax.jit(lambda p, g: jax.tree.map(lambda a, b: a - 0.1 * b, p, g))
    mon = sowviz.Monitor(loss, every=every)
    p = params
    for _ in range(4):
        value, grads = mon.step(p, tokens)
        assert _specs(grads) == _specs(want_grads)  # recorded and unrecorded alike
        assert value.sharding == want_value.sharding
        p = apply(p, grads)
    mon.flush()
    assert len(mon.history) == 4 // every
    assert apply._cache_size() == 1  # the update compiled once, as in a plain loop
    _, grads = sowviz.Monitor(loss).step(params, tokens)
    for k in params:
        np.testing.assert_array_equal(np.asarray(grads[k]), np.asarray(want_grads[k]))


# -- low-precision programs: a recorded step returns the plain program's results ----------


def _bf16_loss(w, x):
    h = x.astype(jnp.bfloat16)
    for i in range(4):
        h = jnp.tanh(h @ w[i].astype(jnp.bfloat16)) * 1.7 + h
    return jnp.mean(h.astype(jnp.float32) ** 2)


def _bf16_problem():
    w = jax.random.normal(jax.random.PRNGKey(0), (4, 32, 32)) / 4
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 32))
    return w, x


def _sgd_losses(step, w, x, steps=4):
    losses = []
    for _ in range(steps):
        value, grad = step(w, x)
        w = w - 0.5 * grad
        losses.append(np.asarray(value))
    return np.array(losses), np.asarray(w)


def test_a_bf16_step_returns_exactly_what_jit_returns_recorded_or_not():
    w, x = _bf16_problem()
    want_losses, want_w = _sgd_losses(jax.jit(jax.value_and_grad(_bf16_loss)), w, x)
    mon = sowviz.Monitor(_bf16_loss, every=2)  # recorded and unrecorded steps mixed
    losses, got_w = _sgd_losses(mon.step, w, x)
    np.testing.assert_array_equal(losses, want_losses)  # bit for bit
    np.testing.assert_array_equal(got_w, want_w)
    # the loss charted for a recorded step is the one the step returned
    mon.flush()
    assert [e["loss"] for e in mon.history] == [float(want_losses[0]), float(want_losses[2])]


def test_a_float32_recorded_step_runs_one_program():
    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    w, x = jnp.ones((3, 2)) / 3, jnp.arange(12.0).reshape(4, 3) / 10
    mon = sowviz.Monitor(loss)
    value, grad = mon.step(w, x)
    want_value, want_grad = jax.jit(jax.value_and_grad(loss))(w, x)
    np.testing.assert_array_equal(np.asarray(value), np.asarray(want_value))
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(want_grad))
    (traced,) = mon._runner.family._traced.values()
    assert not traced.low_precision
    assert mon._runner._plain._cache_size() == 0  # no plain twin on one device


def _vae_problem():
    """A small float32 Equinox VAE whose instrumented program XLA fuses otherwise than
    the plain one (its loss moved 9 ulp on a recorded step)."""
    eqx = pytest.importorskip("equinox")

    class VAE(eqx.Module):
        enc: eqx.nn.Conv2d
        norm: eqx.nn.GroupNorm
        mu: eqx.nn.Linear
        logvar: eqx.nn.Linear
        dec_in: eqx.nn.Linear
        dec: eqx.nn.ConvTranspose2d

        def __init__(self, key):
            k = jax.random.split(key, 5)
            self.enc = eqx.nn.Conv2d(1, 8, 4, stride=2, padding=1, key=k[0])
            self.norm = eqx.nn.GroupNorm(2, 8)
            self.mu = eqx.nn.Linear(512, 4, key=k[1])
            self.logvar = eqx.nn.Linear(512, 4, key=k[2])
            self.dec_in = eqx.nn.Linear(4, 512, key=k[3])
            self.dec = eqx.nn.ConvTranspose2d(8, 1, 4, stride=2, padding=1, key=k[4])

        def __call__(self, x, key):
            h = jnp.ravel(jax.nn.gelu(self.norm(self.enc(x))))
            mu, logvar = self.mu(h), self.logvar(h)
            z = mu + jnp.exp(0.5 * logvar) * jax.random.normal(key, mu.shape)
            h = jax.nn.gelu(self.dec_in(z)).reshape(8, 8, 8)
            return self.dec(h), mu, logvar

    def loss(model, x, key):
        keys = jax.random.split(key, x.shape[0])
        rec, mu, logvar = jax.vmap(model)(x, keys)
        kl = -0.5 * jnp.sum(1 + logvar - mu**2 - jnp.exp(logvar))
        return jnp.sum((rec - x) ** 2) + kl

    x = jax.random.uniform(jax.random.key(1), (8, 1, 16, 16))
    return eqx, loss, VAE(jax.random.key(0)), x


def test_exact_returns_jit_bit_for_bit_on_a_float32_program():
    eqx, loss, model, x = _vae_problem()
    mon = sowviz.Monitor(loss, exact=True)
    want = eqx.filter_jit(eqx.filter_value_and_grad(loss))
    for step in range(2):
        key = jax.random.key(10 + step)
        value, grads = mon.step(model, x, key)
        want_value, want_grads = want(model, x, key)
        np.testing.assert_array_equal(np.asarray(value), np.asarray(want_value))
        for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    mon.flush()
    assert mon.history[0]["loss"] == float(want(model, x, jax.random.key(10))[0])
    with pytest.raises(TypeError, match="exact"):
        sowviz.Monitor(loss, exact="yes")
