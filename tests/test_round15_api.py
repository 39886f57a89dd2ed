"""Round 15 (optax training loops): every reader of a Monitor sees the same, complete
steps; `mon.history.losses` is a series; `probe("chain")` of an optax chain holding
`inject_hyperparams/chain` names the top-level chain."""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz._history import History


def _loss(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2)


def _batch(i):
    # each "epoch" of 7 steps ends with a partial batch: a program of its own shapes
    return jax.random.normal(jax.random.PRNGKey(i), (8 if i % 7 != 6 else 3, 4))


W = jnp.linspace(-1.0, 1.0, 8).reshape(4, 2)
STEPS = 21


def _plain_losses(n=STEPS):
    step = jax.jit(jax.value_and_grad(_loss))
    return [float(step(W, _batch(i))[0]) for i in range(n)]


def _stepped(**kwargs):
    # `throttle` never elapses: the recorded steps wait for a read, as a fast loop's do
    mon = sowviz.Monitor(_loss, throttle=1e9, **kwargs)
    for i in range(STEPS):
        mon.step(W, _batch(i))
    return mon


def test_to_dict_reads_the_steps_still_waiting_as_history_does():
    plain = _plain_losses()
    mon = _stepped()
    assert mon._pending  # steps wait on the device: the case that truncated the model
    d = mon.to_dict()
    h = d["history"]
    assert h["steps"] == list(range(STEPS))
    np.testing.assert_allclose(h["loss"], plain, rtol=1e-6)
    # the graph is the last step's program (its partial batch), whose step the history ends at
    (x,) = [n for n in d["nodes"] if n["label"] == "x"]
    assert x["shapes"] == ["float32[3,4]"]
    assert d["programs"][h["program"][-1]]["nodes"][x["id"]] == ["float32[3,4]"]
    # every other reader: the same steps
    assert mon.history.steps == h["steps"]
    assert mon.graph is mon._traced.graph


def test_every_reader_sees_the_same_steps(tmp_path):
    plain = _plain_losses()
    readers = {
        "to_dict": lambda m: m.to_dict()["history"],
        "history": lambda m: m.history.to_dict(),
        "save_html": lambda m: _history_of_report(m.save_html(tmp_path / "r.html", created=None)),
        "view": lambda m: m.view().model["history"],
    }
    for name, read in readers.items():
        h = read(_stepped())
        assert h["steps"] == list(range(STEPS)), name
        np.testing.assert_allclose(h["loss"], plain, rtol=1e-6, err_msg=name)


def test_to_dict_with_every_n_has_every_step_s_loss():
    plain = _plain_losses()
    mon = _stepped(every=3)
    h = mon.to_dict()["history"]
    assert h["steps"] == list(range(0, STEPS, 3))
    assert h["losses"]["steps"] == list(range(STEPS))
    np.testing.assert_allclose(h["losses"]["loss"], plain, rtol=1e-6)


def _history_of_report(path):
    text = pathlib.Path(path).read_text(encoding="utf-8")
    start = text.index('<script type="application/json"')
    body = text[text.index(">", start) + 1 : text.index("</script>", start)]
    return json.loads(body)["history"]


def test_history_losses_is_a_series_of_the_losses():
    plain = _plain_losses()
    mon = sowviz.Monitor(_loss, exact=True)
    got = [float(mon.step(W, _batch(i))[0]) for i in range(STEPS)]
    assert got == plain  # exact=True: jax.jit's bits
    losses = mon.history.losses
    assert len(losses) == STEPS
    assert list(losses) == plain
    assert losses[-1] == plain[-1] and losses[:2] == plain[:2]
    arr = np.asarray(losses)
    assert arr.shape == (STEPS,) and arr.dtype == np.float64
    np.testing.assert_array_equal(arr, plain)
    assert np.asarray(losses, dtype=np.float32).dtype == np.float32
    # what it was: `.values` and `.steps`
    assert losses.values == plain and losses.steps == list(range(STEPS))
    assert "21 losses" in repr(losses)


def test_a_missing_loss_is_nan_in_the_array():
    h = History(10)
    h.add_losses([0, 1, 2], [1.5, None, 0.5])
    assert list(h.losses) == [1.5, None, 0.5]
    np.testing.assert_array_equal(np.asarray(h.losses), [1.5, np.nan, 0.5])


def optax_program():
    """An optax step whose chain injects a scheduled learning rate (made from the step
    count: no gradient): (step, its arguments, the schedule)."""
    optax = pytest.importorskip("optax")
    sched = optax.linear_schedule(1e-2, 1e-3, 10)
    opt = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.inject_hyperparams(optax.adam)(learning_rate=sched),
    )
    params = {"w": jnp.linspace(-0.5, 0.5, 6).reshape(3, 2), "b": jnp.zeros(2)}
    x = jnp.linspace(-1, 1, 12).reshape(4, 3)

    def loss(p, x):
        return jnp.mean(jnp.tanh(x @ p["w"] + p["b"]) ** 2)

    def step(params, state, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    return step, (params, opt.init(params), x), sched


@pytest.fixture(scope="module")
def optax_step():
    step, args, sched = optax_program()
    return sowviz.inspect(step, *args, mode="primal"), float(sched(0))


def test_probe_chain_is_the_top_level_chain(optax_step):
    ins, lr = optax_step
    paths = {ins.probe_path(p) for p in ins.probes}
    assert {"chain", "chain/inject_hyperparams/chain"} <= paths
    # the whole path `chain` names the top-level stage; it has several outputs
    with pytest.raises(KeyError) as err:
        ins.probe("chain")
    msg = str(err.value)
    assert "several output leaves" in msg and "leaf=" in msg
    assert "inject_hyperparams/chain" not in msg
    leaves = sorted(
        {p.leaf for p in ins.probes if ins.probe_path(p) == "chain"},
        key=lambda s: int(s.strip("[]")),
    )
    for leaf in leaves:
        assert ins.probe_path(ins.probe("chain", leaf=leaf)) == "chain"
    # its first output is the injected learning rate, the schedule's value at count 0
    s = ins.probe("chain", leaf="[0]").summaries["primal"]
    assert s["shape"] == [] and s["mean"] == pytest.approx(lr, rel=1e-6)
    # the inner one still answers to its own end
    assert ins.probe_path(ins.probe("inject_hyperparams/chain", leaf="[0]")) == (
        "chain/inject_hyperparams/chain"
    )
