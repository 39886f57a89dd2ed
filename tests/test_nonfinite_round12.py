"""Where NaN hunting says a NaN/Inf was first made (round 12): the first iteration of a
reverse `lax.scan` is its last xs index; a loop carry's non-finite literal start value
(`lax.scan(body, -jnp.inf, xs)`, BlackJAX's `Proposal(..., -jnp.inf)` starting a
`while_loop`) is a fill, not an origin; a finite inspection's `locate_nonfinite()`
returns at once."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import marked_line

import sowviz
from sowviz import nonfinite_locate

HERE = pathlib.Path(__file__)


def _line(marker: str) -> int:
    return marked_line(HERE, marker)


def _at(eq, primitive: str, marker: str) -> None:
    assert eq is not None
    assert eq.primitive == primitive, eq
    assert eq.source is not None and eq.source.file.endswith(HERE.name), eq
    assert eq.source.line == _line(marker), (eq.source, marker)


# -- a reverse scan: its first iteration is its last xs index ----------------------------


def _gae(reverse: bool):
    def gae(values):
        def step(carry, value):
            scale = jnp.sqrt(value)  # origin: gae sqrt
            carry = 0.9 * carry + value / (1.0 + scale)
            return carry, carry

        return jax.lax.scan(step, jnp.zeros(values.shape[1]), values, reverse=reverse)[1]

    return gae


def _values(bad_rows):
    values = np.abs(np.random.default_rng(0).normal(size=(16, 4))).astype(np.float32) + 0.1
    for r in bad_rows:
        values[r, 1] = -1.0
    return jnp.asarray(values)


def _first_sqrt_nan(values, reverse: bool) -> int:
    """The xs index of the first iteration (in the order the scan runs them) whose
    `sqrt` is NaN, in NumPy."""
    order = range(len(values) - 1, -1, -1) if reverse else range(len(values))
    return next(i for i in order if np.isnan(np.sqrt(np.asarray(values[i]))).any())


@pytest.mark.parametrize("reverse", [True, False])
@pytest.mark.parametrize("bad_rows", [(5,), (2, 9)])
def test_a_scans_first_iteration_is_the_first_it_ran(reverse, bad_rows):
    values = _values(bad_rows)
    gae = _gae(reverse)
    with np.errstate(invalid="ignore"):
        expected = _first_sqrt_nan(values, reverse)
    rows = np.where(np.isnan(np.asarray(jax.jit(gae)(values))).any(1))[0]
    # the carry spreads the NaN to the rows after it in time: before it in xs order
    assert (rows.min() if reverse else rows.max()) == (15 if not reverse else 0)
    ins = sowviz.inspect(lambda v: jnp.mean(gae(v) ** 2), values)
    before = ins.nonfinite.forward
    assert before.iteration == (expected,), before.message
    # (the stage-level message names the stage holding `sqrt`, by its line)
    assert f"{HERE.name}:{_line('# origin: gae sqrt')})" in before.message, before.message
    assert f"in iteration {expected} of" in before.message
    loc = ins.locate_nonfinite()
    _at(loc.forward.equation, "sqrt", "# origin: gae sqrt")
    assert loc.forward.iteration == (expected,), loc.forward.message


def _layers(reverse: bool):
    def loss(ws, x):
        def layer(h, w):
            h = h * w
            n = jnp.linalg.norm(h)  # origin: layer norm
            return h / (1.0 + n), n

        h, ns = jax.lax.scan(layer, x, ws, reverse=reverse)
        return jnp.sum(ns) + jnp.sum(h)

    return loss


def _first_norm_at_zero_backward(ws, x, reverse: bool) -> int:
    """The xs index whose `norm` (at 0: an infinite derivative) the backward pass meets
    first, in NumPy: the forward runs a reverse scan's indices downwards, its backward
    upwards."""
    order = list(range(len(ws) - 1, -1, -1) if reverse else range(len(ws)))
    h, zero = np.asarray(x), []
    for i in order:
        h = h * ws[i]
        n = np.linalg.norm(h)
        zero += [i] if n == 0 else []
        h = h / (1.0 + n)
    return zero[-1]  # (the backward runs the forward's order backwards)


@pytest.mark.parametrize("reverse", [True, False])
def test_a_scans_backward_origin_is_the_first_iteration_its_backward_ran(reverse):
    ws = np.ones((6, 3), np.float32)
    ws[3] = 0.0  # every layer the forward runs from it on reads h = 0
    x = jnp.ones(3)
    loss = _layers(reverse)
    assert np.isnan(np.asarray(jax.grad(loss)(jnp.asarray(ws), x))).any()
    expected = _first_norm_at_zero_backward(ws, x, reverse)
    assert expected == (0 if reverse else 5)
    ins = sowviz.inspect(loss, jnp.asarray(ws), x)
    assert ins.nonfinite.backward.iteration == (expected,), ins.nonfinite.message
    loc = ins.locate_nonfinite()
    assert loc.backward.iteration == (expected,), loc.backward.message
    assert loc.backward.equation.primitive == "sqrt", loc.backward.equation
    assert loc.backward.equation.source.line == _line("# origin: layer norm")


# -- a loop carry's non-finite start value is a fill -------------------------------------


def log_evidence(xs):
    def body(acc, x):
        lp = jnp.log(x)  # origin: evidence log
        lp = jnp.where(jnp.isnan(lp), -jnp.inf, lp)
        return jnp.logaddexp(acc, lp), lp

    return jax.lax.scan(body, -jnp.inf, xs)[0]  # a weak-typed Python float


def best_so_far(xs):
    """BlackJAX's NUTS shape: a `while_loop` started at a literal -inf, its update a
    `jit` inside a `cond`, the loop inside a scan."""

    def trajectory(carry, x):
        def cond(s):
            return s[0] < 3

        def body(s):
            i, total = s
            lp = jnp.log(x - i)  # origin: best log
            lp = jnp.where(jnp.isnan(lp), -jnp.inf, lp)
            total = jax.lax.cond(lp > -1e30, jnp.logaddexp, lambda a, b: a, total, lp)
            return i + 1, total

        _, total = jax.lax.while_loop(cond, body, (0, -jnp.inf))
        return carry + jnp.where(jnp.isfinite(total), total, 0.0), total

    return jax.lax.scan(trajectory, 0.0, xs)[0]


def _first_log_nan(xs, inner: int = 1) -> tuple[int, ...]:
    """The first (iteration, inner iteration) whose `log(x - i)` is NaN, in NumPy."""
    with np.errstate(invalid="ignore"):
        for k, x in enumerate(np.asarray(xs)):
            for i in range(inner):
                if np.isnan(np.log(np.float32(x - i))):
                    return (k, i) if inner > 1 else (k,)
    raise AssertionError("no NaN")


@pytest.mark.parametrize(
    ("fn", "xs", "marker", "inner"),
    [
        (log_evidence, [1.0, 2.0, -1.0, 3.0], "# origin: evidence log", 1),
        (best_so_far, [5.0, 4.0, 1.5, 6.0], "# origin: best log", 3),
    ],
)
def test_a_loop_carrys_literal_inf_start_is_no_origin(fn, xs, marker, inner):
    xs = jnp.asarray(xs)
    assert np.isfinite(float(jax.jit(fn)(xs)))  # the NaN is masked
    loc = sowviz.inspect(fn, xs, mode="primal").locate_nonfinite()
    _at(loc.forward.equation, "log", marker)
    assert loc.forward.iteration == _first_log_nan(xs, inner), loc.forward.message
    assert "convert_element_type" not in loc.forward.message


def test_a_carry_that_turns_inf_later_is_still_an_origin():
    # Only the carry's value at the loop's first iteration is its start value: an
    # overflow the body makes later stays where it was made.
    def grow(xs):
        def body(acc, x):
            acc = acc * x  # origin: grow mul
            return acc, acc

        return jnp.sum(jnp.where(jnp.isfinite(jax.lax.scan(body, 1.0, xs)[1]), 1.0, 0.0))

    xs = jnp.asarray([1e20, 1e20, 1.0], jnp.float32)
    with np.errstate(over="ignore"):
        assert np.isinf(np.float32(1e20) * np.float32(1e20))
    loc = sowviz.inspect(grow, xs, mode="primal").locate_nonfinite()
    _at(loc.forward.equation, "mul", "# origin: grow mul")
    assert loc.forward.iteration == (1,)


# -- nothing non-finite: nothing to locate ----------------------------------------------


def test_locating_a_finite_inspection_returns_none_without_a_rerun(monkeypatch):
    def evidence(xs):  # (a -inf start would be a non-finite value the probes see)
        return jax.lax.scan(lambda a, x: (jnp.logaddexp(a, jnp.log(x)), None), 0.0, xs)[0]

    ins = sowviz.inspect(evidence, jnp.asarray([1.0, 2.0, 3.0]), mode="primal")
    assert ins.nonfinite is None and np.isfinite(float(ins.result))

    def rerun(*_a, **_k):
        raise AssertionError("locate re-ran a finite inspection")

    monkeypatch.setattr(nonfinite_locate, "locate", rerun)
    assert ins.locate_nonfinite() is None
    assert ins.locate_nonfinite() is None and ins.to_dict()["nonfinite"] is None


def test_a_nan_no_probe_saw_in_a_result_is_still_located():
    # (the results are not finite: `locate` runs, though no stage probe saw the NaN)
    def f(x):
        return jnp.log(x)  # origin: unscoped log

    ins = sowviz.inspect(f, jnp.asarray([1.0, -1.0]), mode="primal")
    loc = ins.locate_nonfinite()
    assert loc is not None and loc.alarm
    _at(loc.forward.equation, "log", "# origin: unscoped log")


# -- a backward NaN made of a forward NaN, said alike before and after locating -------


def ppo_loss(w, x, adv):
    ratio = jnp.exp(x @ w - 0.1)
    adv = (adv - adv.mean()) / adv.std()  # origin: adv div
    adv = jax.lax.stop_gradient(adv)
    pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 0.8, 1.2) * adv).mean()
    return pg


def test_a_backward_nan_made_of_a_forward_one_follows_from_it_before_locating_too():
    w, x = jnp.full((3,), 0.1), jnp.ones((8, 3))
    adv = jnp.ones((8,))  # a constant minibatch: (adv - mean) / std is 0 / 0
    with np.errstate(invalid="ignore"):
        assert np.isnan((np.ones(8) - 1.0) / np.std(np.ones(8))).all()
    assert np.isnan(np.asarray(jax.grad(ppo_loss)(w, x, adv))).all()
    ins = sowviz.inspect(ppo_loss, w, x, adv)
    before = ins.nonfinite.backward
    loc = ins.locate_nonfinite()
    _at(loc.forward.equation, "div", "# origin: adv div")
    assert loc.backward.follows_forward and loc.backward.equation.primitive == "mul"
    assert before.follows_forward, before.message
    assert before.message.startswith("follows from the forward pass: `mul`"), before.message
