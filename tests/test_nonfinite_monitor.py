"""The non-finite record says what the user's own values hold: `locate`'s re-run (a
program compiled, so rounded, otherwise) never adds or drops a gradient leaf from the
step's list without saying so; and a Monitor's masked `-inf` (no alarm) is drawn muted
with inspect's banner, not as a NaN alarm."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz import nonfinite_locate
from sowviz.nonfinite_messages import (
    NONFINITE_GRADS,
    RERUN,
    grads_sentence,
    with_step_grads,
)
from sowviz.nonfinite_record import Origin, Origins


def two_sqrts(p, x):
    """`sqrt` of `p["a"] * x[0]` and of `p["b"] * x[1]`: a finite value (sqrt(0) = 0)
    whose gradient is +Inf where `p * x` is 0, and NaN where `x` is 0 (0 * Inf)."""
    return jnp.sum(jnp.sqrt(p["a"] * x[0])) + jnp.sum(jnp.sqrt(p["b"] * x[1]))


PARAMS = {"a": jnp.zeros(3), "b": jnp.ones(3)}
X_STEP = jnp.ones((2, 3))  # the step: only `a`'s gradient is non-finite
X_RERUN = jnp.ones((2, 3)).at[1].set(0.0)  # "rounded otherwise": `b`'s breaks too


def nonfinite_grad_keys(x) -> list[str]:
    """The leaves whose gradient plain JAX makes non-finite."""
    g = jax.jit(jax.grad(two_sqrts))(PARAMS, x)
    return sorted(k for k, v in g.items() if not np.all(np.isfinite(np.asarray(v))))


def paths(keys: list[str]) -> tuple[str, ...]:
    """The record's name of each parameter leaf (as its message names it)."""
    return tuple(f"parameters/{k}" for k in keys)


@pytest.fixture
def rerun_rounds_otherwise(monkeypatch):
    """`locate`'s re-run sees values whose gradients differ from the step's, as the
    float16 GPT's re-run did (its fusion broke one more leaf): the real `locate`, on
    `X_RERUN` in place of the step's `X_STEP`."""
    real = nonfinite_locate.locate

    def locate(fn, args, options=None, **kw):
        return real(fn, (args[0], X_RERUN), options, **kw)

    monkeypatch.setattr(nonfinite_locate, "locate", locate)


def test_the_plain_jax_premise():
    assert nonfinite_grad_keys(X_STEP) == ["a"]
    assert nonfinite_grad_keys(X_RERUN) == ["a", "b"]


def test_inspect_located_names_the_steps_gradients(rerun_rounds_otherwise):
    ins = sowviz.inspect(two_sqrts, PARAMS, X_STEP)
    assert ins.nonfinite.grads + ins.nonfinite.other_grads == paths(["a"])
    found = ins.locate_nonfinite()
    # the leaves named as non-finite are those of the gradients the user got
    assert found.grads + found.other_grads == paths(nonfinite_grad_keys(X_STEP))
    bwd = found.backward.message
    assert NONFINITE_GRADS + "`parameters/a`;" in bwd
    # and the re-run's extra leaf is said apart, as the re-run's alone
    assert f"; {RERUN} also made a non-finite gradient of `parameters/b`" in bwd
    assert found.located
    assert ins.to_dict()["nonfinite"]["message"] == found.message


def test_monitor_record_names_the_steps_gradients(rerun_rounds_otherwise):
    mon = sowviz.Monitor(two_sqrts)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, grads = mon.step(PARAMS, X_STEP)
        mon.flush()
    returned = sorted(k for k, v in grads.items() if not np.all(np.isfinite(np.asarray(v))))
    assert returned == nonfinite_grad_keys(X_STEP) == ["a"]
    rec = mon.nonfinite.origins
    assert rec.located
    assert rec.grads + rec.other_grads == paths(returned)
    said = NONFINITE_GRADS + "`parameters/a`;"
    assert said in rec.message
    assert f"{RERUN} also made a non-finite gradient of `parameters/b`" in rec.message
    # the run's report, its history and its warning say the same
    assert mon.to_dict()["history"]["nonfinite"]["message"] == rec.message
    assert any(said in str(w.message) for w in caught)


def _record(grads=(), other=(), message_tail=None) -> Origins:
    tail = grads_sentence(grads, other) if message_tail is None else message_tail
    bwd = Origin("backward", "n1", "n2", message="born in the backward of `sqrt`" + tail)
    return Origins(None, None, bwd, grads=tuple(grads), other_grads=tuple(other))


def test_a_leaf_the_rerun_kept_finite_is_still_named():
    step = _record(["parameters/a", "parameters/b"])
    found = _record(["parameters/a"])
    out = with_step_grads(step, found)
    assert out.grads == ("parameters/a", "parameters/b")
    assert out.backward.message == (
        "born in the backward of `sqrt`; non-finite gradient of `parameters/a`, "
        f"`parameters/b`; {RERUN} kept the gradient of `parameters/b` finite, which this "
        "step's gradients hold non-finite"
    )
    assert out.message == "backward pass: " + out.backward.message


def test_agreeing_records_are_left_alone():
    found = _record(["parameters/a"], ["parameters/c"])
    assert with_step_grads(_record(["parameters/c", "parameters/a"]), found) is found


def test_another_origins_leaf_stays_apart():
    step = _record(["parameters/a"], ["parameters/c"])
    found = _record(["parameters/a", "parameters/d"], ["parameters/c"])
    out = with_step_grads(step, found)
    assert (out.grads, out.other_grads) == (("parameters/a",), ("parameters/c",))
    assert out.backward.message.startswith(
        "born in the backward of `sqrt`" + grads_sentence(["parameters/a"], ["parameters/c"])
    )
    assert "also made a non-finite gradient of `parameters/d`" in out.backward.message


# -- a Monitor's masked -inf: no alarm, as inspect says ---------------------------------


def masked_attention(w, x, mask):
    s = (x @ w) @ x.T
    s = jnp.where(mask, s, -jnp.inf)  # an intended causal mask
    return jnp.mean((jax.nn.softmax(s, -1) @ x) ** 2)


W = jax.random.normal(jax.random.PRNGKey(0), (4, 4))
XS = jax.random.normal(jax.random.PRNGKey(1), (8, 4))
CAUSAL = jnp.tril(jnp.ones((8, 8), bool))


def _quiet_fields(rec: dict) -> dict:
    return {
        "alarm": rec["alarm"],
        "removed": rec["removed"],
        "forward": rec["forward"]["node"],
        "backward": rec["backward"],
    }


def test_monitor_model_says_no_alarm_as_inspect_does():
    loss, _ = jax.value_and_grad(masked_attention)(W, XS, CAUSAL)
    assert np.isfinite(float(loss))  # the premise: the mask reaches no result
    mon = sowviz.Monitor(masked_attention)
    for _ in range(2):
        mon.step(W, XS, CAUSAL)
    mon.flush()
    assert mon.nonfinite is None  # no alarm
    model = mon.to_dict()
    inspected = sowviz.inspect(masked_attention, W, XS, CAUSAL).to_dict()["nonfinite"]
    assert inspected is not None and not inspected["alarm"]
    # the front end draws `"nonfinite"` with `alarm` false muted, with the no-alarm banner
    assert model["nonfinite"] is not None
    assert _quiet_fields(model["nonfinite"]) == _quiet_fields(inspected)
    assert model["nonfinite"]["step"] == 1  # the step drawn
    assert model["history"]["nonfinite"] is None


def test_a_later_finite_step_drops_the_quiet_record():
    mon = sowviz.Monitor(masked_attention)
    mon.step(W, XS, CAUSAL)
    mon.flush()
    assert mon.to_dict()["nonfinite"] is not None
    mon.step(W, XS, jnp.ones((8, 8), bool))  # nothing masked: every value finite
    mon.flush()
    assert mon.to_dict()["nonfinite"] is None


def test_the_live_view_gets_the_quiet_record():
    # The first step is drawn before the view exists: a finite one (nothing masked);
    # the masked steps after it reach the view as steps messages, which carry no record:
    # the quiet record makes the next update a whole model, which carries it.
    mon = sowviz.Monitor(masked_attention)
    mon.step(W, XS, jnp.ones((8, 8), bool))
    mon.flush()
    view = mon.view()
    view.clock = iter(range(0, 10**6, 3600)).__next__  # every update past the throttle
    view.send = lambda msg, buffers=None: None
    assert view.model["nonfinite"] is None
    mon.step(W, XS, CAUSAL)
    mon.flush()
    rec = view.model["nonfinite"]
    assert rec is not None and rec["alarm"] is False and rec["removed"] is True
    mon.step(W, XS, jnp.ones((8, 8), bool))  # finite again: the record goes
    mon.flush()
    assert view.model["nonfinite"] is None


def test_a_run_log_s_alarm_is_not_hidden_by_an_earlier_quiet_record(tmp_path):
    # model.json is written at the first step, with that step's "no alarm" record; a
    # later step's NaN (an input holding one) must be what the log's report draws.
    mon = sowviz.Monitor(masked_attention, log_dir=tmp_path)
    mon.step(W, XS, CAUSAL)
    mon.flush()
    mon.step(W, XS.at[0, 0].set(jnp.nan), CAUSAL)
    mon.close()
    model = sowviz.load(tmp_path).model
    assert model["nonfinite"] is None
    assert model["history"]["nonfinite"]["alarm"] is True
    assert model["history"]["nonfinite"]["step"] == 1


def test_a_run_logs_report_draws_the_mask_without_alarm(tmp_path):
    # model.json holds the first step's "no alarm" record; the log's report draws the
    # latest step, whose mask is there too: without the record it was painted red.
    mon = sowviz.Monitor(masked_attention, log_dir=tmp_path / "masked")
    for _ in range(3):
        mon.step(W, XS, CAUSAL)
    mon.close()
    model = sowviz.load(tmp_path / "masked").model
    inspected = sowviz.inspect(masked_attention, W, XS, CAUSAL).to_dict()["nonfinite"]
    assert model["nonfinite"] is not None
    assert _quiet_fields(model["nonfinite"]) == _quiet_fields(inspected)
    assert model["nonfinite"]["step"] == 2  # the step drawn
    assert model["history"]["nonfinite"] is None
    # a last step with nothing masked holds no non-finite value: no record to draw
    mon = sowviz.Monitor(masked_attention, log_dir=tmp_path / "unmasked")
    mon.step(W, XS, CAUSAL)
    mon.step(W, XS, jnp.ones((8, 8), bool))
    mon.close()
    assert sowviz.load(tmp_path / "unmasked").model["nonfinite"] is None
