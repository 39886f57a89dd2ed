"""`locate_nonfinite` inside `jax.custom_jvp` / `jax.custom_vjp` functions (their body,
their rules), and a backward record that only follows from the forward pass, which the
picture must not flag as a backward origin."""

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
    """The line of this file holding `marker` (a comment beside the origin)."""
    return marked_line(HERE, marker)


def _located(fn, *args, mode="grad"):
    ins = sowviz.inspect(fn, *args, mode=mode)
    return ins.locate_nonfinite()


def _at(eq, marker: str) -> None:
    assert eq.source is not None and eq.source.file.endswith(HERE.name), eq
    assert eq.source.line == _line(marker), (eq.source, marker)


# -- a custom_vjp whose backward rule makes the NaN ------------------------------------


@jax.custom_vjp
def my_log(x):
    return jnp.log(jnp.abs(x) + 1.0)


def _my_log_fwd(x):
    return my_log(x), x


def _my_log_bwd(x, g):
    r = g / x  # origin: bwd rule
    return (r * jnp.sign(x) * jnp.abs(x) / (jnp.abs(x) + 1.0),)


my_log.defvjp(_my_log_fwd, _my_log_bwd)


def loss_bwd_rule(w, x):
    return jnp.mean(my_log(x @ w))


def test_a_nan_made_in_a_custom_vjp_backward_rule_is_named_at_the_rules_line():
    w = jax.random.normal(jax.random.PRNGKey(0), (8, 8))
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 8)).at[0].set(0.0)
    # plain JAX: the value is finite, the gradient is not, and the rule's `g / x` is
    # where it breaks (x == 0 there)
    assert np.isfinite(loss_bwd_rule(w, x))
    assert not np.all(np.isfinite(jax.grad(loss_bwd_rule)(w, x)))
    z = np.asarray(x @ w)
    g = np.full_like(z, 1.0 / z.size)
    with np.errstate(divide="ignore", invalid="ignore"):
        assert not np.all(np.isfinite(g / z)) and np.all(np.isfinite(g))
    found = _located(loss_bwd_rule, w, x)
    assert found.forward is None and found.backward is not None
    eq = found.backward.equation
    assert eq.primitive == "div" and eq.within == "the backward rule of `my_log`"
    _at(eq, "# origin: bwd rule")
    assert found.backward.message.startswith(
        f"born in `div` in the backward rule of `my_log` at {eq.source.file}:{eq.source.line}"
    ), found.backward.message


# -- a custom_vjp whose forward rule makes an infinite residual ------------------------


@jax.custom_vjp
def root(x):
    return jnp.sqrt(jnp.abs(x))


def _root_fwd(x):
    inv = 0.5 / jnp.sqrt(jnp.abs(x))  # origin: fwd residual
    return root(x), (inv, jnp.sign(x))


def _root_bwd(res, g):
    inv, s = res
    return (g * inv * s,)  # inf * 0 -> NaN


root.defvjp(_root_fwd, _root_bwd)


def loss_residual(w, x):
    return jnp.sum(root(x @ w))


def test_an_infinite_residual_of_a_custom_vjp_forward_rule_is_named_at_its_line():
    w, x = jnp.ones((4, 3)), jnp.ones((2, 4)).at[0].set(0.0)
    assert np.isfinite(loss_residual(w, x))
    assert not np.all(np.isfinite(jax.grad(loss_residual)(w, x)))
    found = _located(loss_residual, w, x)
    eq = found.backward.equation
    assert eq.primitive == "div" and eq.within == "the forward rule of `root`"
    _at(eq, "# origin: fwd residual")


# -- a custom_vjp whose forward rule computes its value otherwise than its body ----------


@jax.custom_vjp
def soft_log(x):
    return jnp.log(jnp.abs(x) + 1.0)


def _soft_log_fwd(x):
    return jnp.log(x), x  # origin: fwd value


soft_log.defvjp(_soft_log_fwd, lambda x, g: (g / (jnp.abs(x) + 1.0),))


def loss_fwd_value(w, x):
    return jnp.sum(soft_log(x @ w))


def test_a_value_only_the_forward_rule_makes_non_finite_is_named_in_that_rule():
    w, x = jnp.array([[1.0, -1.0], [0.5, 0.5]]), jnp.ones((3, 2))
    assert np.isfinite(loss_fwd_value(w, x))  # the body: finite
    assert np.isnan(jax.value_and_grad(loss_fwd_value)(w, x)[0])  # the forward rule: NaN
    found = _located(loss_fwd_value, w, x)
    eq = found.forward.equation
    assert eq.primitive == "log" and eq.within == "the forward rule of `soft_log`", eq
    _at(eq, "# origin: fwd value")
    # primal mode runs the body: finite, no alarm
    assert sowviz.inspect(loss_fwd_value, w, x, mode="primal").nonfinite is None


# -- a custom_jvp whose JVP rule makes the NaN -----------------------------------------


@jax.custom_jvp
def wave(x):
    return jnp.sin(x)


@wave.defjvp
def _wave_jvp(primals, tangents):
    (x,), (tx,) = primals, tangents
    d = jnp.cos(x) * x / x  # origin: jvp rule
    return wave(x), d * tx


def loss_jvp_rule(w, x):
    return jnp.sum(wave(x @ w))


@pytest.mark.parametrize("mode", ["jvp", "grad"])
def test_a_nan_made_in_a_custom_jvp_rule_is_named_at_the_rules_line(mode):
    w, x = jnp.ones((8, 5)), jnp.ones((4, 8)).at[0].set(0.0)
    assert np.isfinite(loss_jvp_rule(w, x))
    assert np.isnan(jax.jvp(loss_jvp_rule, (w, x), (w, jnp.zeros_like(x)))[1])
    assert not np.all(np.isfinite(jax.grad(loss_jvp_rule)(w, x)))
    found = _located(loss_jvp_rule, w, x, mode=mode)
    origin = found.forward if mode == "jvp" else found.backward
    assert origin is not None, found.message
    eq = origin.equation
    assert eq.primitive == "div" and eq.within == "the JVP rule of `wave`", eq
    _at(eq, "# origin: jvp rule")
    if mode == "jvp":  # the value is finite: the tangent holds the NaN
        assert "in its tangent" in origin.message, origin.message


# -- NaN made in the primal body of a custom function ----------------------------------


@jax.custom_jvp
def stable_log(x):
    m = jnp.maximum(x, 0.0) - 1.0
    return jnp.log(x) + m * 0.0  # origin: custom_jvp body


stable_log.defjvp(lambda p, t: (stable_log(p[0]), t[0] / p[0]))


@jax.custom_vjp
def clip_id(x):
    y = jnp.sqrt(x)  # origin: custom_vjp body
    return y * 1.0


clip_id.defvjp(lambda x: (clip_id(x), None), lambda _, g: (jnp.clip(g, -1, 1),))


def loss_stable_log(w, x):
    return jnp.mean(stable_log(x @ w))


def loss_clip_id(w, x):
    return jnp.mean(clip_id(x @ w))


@pytest.mark.parametrize(
    "fn, mode, primitive, name, marker",
    [
        (loss_stable_log, "primal", "log", "stable_log", "# origin: custom_jvp body"),
        (loss_stable_log, "grad", "log", "stable_log", "# origin: custom_jvp body"),
        (loss_stable_log, "jvp", "log", "stable_log", "# origin: custom_jvp body"),
        (loss_clip_id, "primal", "sqrt", "clip_id", "# origin: custom_vjp body"),
        (loss_clip_id, "grad", "sqrt", "clip_id", "# origin: custom_vjp body"),
    ],
)
def test_a_nan_made_in_a_custom_functions_body_is_named_at_the_bodys_line(
    fn, mode, primitive, name, marker
):
    w, x = jnp.array([[1.0, -1.0], [0.5, 0.5]]), jnp.ones((3, 2))
    z = np.asarray(x @ w)
    assert (z < 0).any()  # log and sqrt of a negative: NaN, in every mode
    assert np.isnan(fn(w, x))
    found = _located(fn, w, x, mode=mode)
    eq = found.forward.equation
    # (found by replaying the call's body, or, where the body's lines are boxes of its
    # stage, by the probes of its equations: the message says where alike)
    assert eq.primitive == primitive and eq.within in (f"`{name}`", ""), eq
    _at(eq, marker)
    # in the function's stage, or in its line's box there (`y = jnp.sqrt(x)`: `y`)
    assert found.forward.message.startswith(f"first made by `{primitive}` in `"), found.forward
    assert name in found.forward.path, found.forward.path


# -- inside a loop: the iteration holding it -------------------------------------------


def loss_in_scan(ws, x):
    def step(h, w):
        return my_log(h @ w) + 0.5, None

    h, _ = jax.lax.scan(step, x, ws)
    return jnp.mean(h)


def test_a_custom_rule_in_a_scan_is_searched_at_the_iteration_that_broke():
    # iteration 1 alone reads a zero (its weights are zero): its backward rule divides
    # by it; iterations 0 and 2 are finite
    ws = jnp.stack([jnp.eye(3), jnp.zeros((3, 3)), jnp.eye(3)])
    x = jnp.ones((2, 3))
    assert np.isfinite(loss_in_scan(ws, x))
    assert not np.all(np.isfinite(jax.grad(loss_in_scan)(ws, x)))
    found = _located(loss_in_scan, ws, x)
    eq = found.backward.equation
    assert eq.primitive == "div" and eq.within == "the backward rule of `my_log`", eq
    _at(eq, "# origin: bwd rule")


# -- a backward record that follows from the forward pass ------------------------------


def _remat_scan_log(ws, x):
    def body(h, w):
        return jnp.tanh(jnp.log(h @ w)), None  # the only origin

    h, _ = jax.lax.scan(jax.checkpoint(body), x, ws)
    return jnp.mean(h**2)


BADGE_ARGS = (jnp.stack([jnp.eye(4) * 0.5, -jnp.eye(4), jnp.eye(4)]), jnp.ones((2, 4)))


def test_a_backward_that_only_passes_the_forward_nan_on_is_no_backward_origin():
    found = _located(_remat_scan_log, *BADGE_ARGS)
    assert found.forward.equation.primitive == "log"
    back = found.to_dict()["backward"]
    assert back["message"].startswith("follows from the forward pass: `integer_pow`")
    assert back["follows_forward"] is True
    assert found.to_dict()["forward"]["follows_forward"] is False


def test_a_backward_born_of_finite_values_is_a_backward_origin():
    # sqrt at exactly 0: finite value, infinite derivative; the origin of the NaN
    def f(x):
        return jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))

    x = jnp.array([0.0, 1.0])
    assert np.isfinite(f(x)) and not np.all(np.isfinite(jax.grad(f)(x)))
    found = _located(f, x)
    assert found.backward is not None and found.backward.follows_forward is False
    assert found.to_dict()["backward"]["follows_forward"] is False


@pytest.mark.browser
def test_a_backward_that_follows_from_the_forward_pass_is_flagged_nowhere(page, tmp_path):
    ins = sowviz.inspect(_remat_scan_log, *BADGE_ARGS)
    ins.locate_nonfinite()
    rec = ins.to_dict()["nonfinite"]
    power = rec["backward"]["node"]
    assert ins.graph.node(power).label == "integer_pow"
    pg = page.open_report(ins.save_html(tmp_path / "follows.html"))
    flags = [t.strip() for t in pg.locator(".sv-origin-flag").all_text_contents()]
    assert flags == ["NaN/Inf starts here (forward)"], flags
    assert pg.locator(f'[data-node-id="{power}"]').get_attribute("data-nonfinite-origin") is None
    # it still holds NaN, and is drawn as a stage passing it on
    assert pg.locator(f'[data-node-id="{power}"]').get_attribute("data-nonfinite-role") == (
        "propagator"
    )
    banner = pg.locator('[data-role="nonfinite-banner"]').inner_text()
    assert "follows from the forward pass" in banner
    assert page.errors == []
