"""Where NaN hunting says a NaN/Inf was first made (round 13): before `locate`, only a
stage that can have made it is named (the one reading the argument whose gradient is
NaN; no integer equation, no move, nothing inside a stage that stayed finite); a
`sqrt`/`norm` derivative at exactly 0 says why and how to fix it; an empty
`jax.ops.segment_max`'s -Inf (its identity) is a fill, not an origin."""

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


def _at(marker: str) -> str:
    return f"(tests/{HERE.name}:{_line(marker)})"


# -- 1. the stage-level candidates ------------------------------------------------------

N = 5
POS = jax.random.normal(jax.random.PRNGKey(0), (N, 3))
W = jnp.ones((16,)) * 0.1


def energy(w, pos):
    dist = jnp.linalg.norm(pos[:, None, :] - pos[None, :, :], axis=-1)  # energy: dist
    rbf = jnp.exp(-((dist[..., None] - jnp.linspace(0.0, 4.0, 16)) ** 2))
    return jnp.sum((rbf @ w) * (1.0 - jnp.eye(N)))  # energy: sum


def test_a_backward_origin_at_an_argument_names_only_the_stages_reading_it():
    # the independent check: `pos`'s gradient is NaN (the zero self-distance), `w`'s is
    # finite; the `sum` line reads `w` and `rbf`, never `pos`
    g_w, g_pos = jax.grad(energy, argnums=(0, 1))(W, POS)
    assert np.all(np.isfinite(g_w)) and np.isnan(g_pos).any()
    ins = sowviz.inspect(energy, W, POS, argnums=(0, 1))
    b = ins.nonfinite.backward
    assert b.message == (
        f"born in the backward of `dist` {_at('# energy: dist')}, reaching `pos`; "
        "non-finite gradient of `parameters/pos`"
    ), b.message
    assert [ins.graph.node(c).label for c in b.candidates] == ["dist"]


S = 50
BETAS = jnp.linspace(1.5, 1e-4, S)  # beta_0 = 1.5 > 1: alphas[t] < 0 at small t
ALPHAS = 1.0 - BETAS
ALPHA_BARS = jnp.cumprod(ALPHAS)


def sample(params, key, n=8):
    x = jax.random.normal(key, (n, 2))

    def body(i, x):
        t = S - 1 - i  # an int32 `sub`: no NaN
        eps = jnp.tanh(x @ params["w1"] + t / S) @ params["w2"]
        scale = BETAS[t] / jnp.sqrt(jnp.abs(1 - ALPHA_BARS[t]))
        mean = (x - scale * eps) / jnp.sqrt(ALPHAS[t])  # mean
        z = jax.random.normal(jax.random.fold_in(key, i), x.shape)  # noise: moves, finite
        return mean + jnp.sqrt(BETAS[t]) * z

    return jax.lax.fori_loop(0, S, body, x)


def test_a_forward_origin_in_a_loop_names_no_integer_move_or_finite_stage():
    # the independent check: `sqrt(alphas[t])` is first NaN at iteration S - 1 - t of
    # the largest t with alphas[t] < 0, and nothing after `mean` in the body was
    # non-finite before it (the noise is finite)
    first = S - 1 - int(np.where(np.asarray(ALPHAS) < 0)[0].max())
    params = {"w1": jnp.eye(2) * 0.5, "w2": jnp.eye(2) * 0.1}
    key = jax.random.PRNGKey(0)
    ins = sowviz.inspect(sample, params, key, mode="primal")
    msg = ins.nonfinite.forward.message
    assert msg == f"first made by `mean` {_at('# mean')}, in iteration {first} of `fori_loop(body)`"
    for named in ("`sub`", "`broadcast_in_dim`", "`bitcast_convert_type`", "unless"):
        assert named not in msg, msg
    o = ins.locate_nonfinite()
    assert o.forward.equation.primitive == "sqrt" and o.forward.iteration == (first,)
    assert o.forward.equation.source.line == _line("# mean")


# -- 2. the derivative of `sqrt` at 0 ---------------------------------------------------

NORM_FIX = "`jnp.sqrt(jnp.maximum(jnp.sum(d ** 2, axis=-1), eps))` in place of `jnp.linalg.norm"
DOUBLE_WHERE = "`jnp.where(ok, x, 1.0)` before it as well as `jnp.where(ok, ..., 0.0)` after it"


def test_norm_at_a_zero_distance_says_why_and_the_fix_once_located():
    # the independent check: the self-distances are exactly 0, where sqrt' is infinite
    d2 = np.sum((np.asarray(POS)[:, None] - np.asarray(POS)[None]) ** 2, -1)
    assert np.all(np.diag(d2) == 0) and jax.grad(jnp.sqrt)(0.0) == np.inf
    ins = sowviz.inspect(energy, W, POS, argnums=(0, 1))
    o = ins.locate_nonfinite()
    assert o.backward.equation.primitive == "sqrt"
    msg = o.backward.message
    assert msg.startswith(f"born in the backward of `sqrt` in `norm` at tests/{HERE.name}:"), msg
    assert (
        "; `sqrt`'s derivative 0.5 / sqrt(x) is infinite at x = 0, and only there: its input "
        "is exactly 0 (`norm` of a zero vector: a distance of 0, as a point's to itself). "
        f"Fix: {NORM_FIX}"
    ) in msg, msg
    assert msg.endswith(f"{DOUBLE_WHERE}; non-finite gradient of `parameters/pos`"), msg


def _energy_of(pos):
    dist = jnp.linalg.norm(pos[:, None, :] - pos[None, :, :], axis=-1)  # forces: dist
    return jnp.sum(jnp.exp(-dist) * (1.0 - jnp.eye(pos.shape[0])))


def force_loss(pos):
    return jnp.mean(jax.grad(_energy_of)(pos) ** 2)  # forces as -grad(energy)


def test_a_forward_inf_derivative_of_norm_at_zero_says_why_and_the_fix():
    # the independent check: the forces are NaN (0.5 / sqrt(0) = +Inf, times the zero
    # difference of a point with itself)
    assert np.isnan(force_loss(POS))
    o = sowviz.inspect(force_loss, POS, mode="primal").locate_nonfinite()
    msg = o.forward.message
    assert o.forward.equation.primitive == "div", msg
    assert "it held +Inf, which led to the NaN" in msg, msg
    assert (
        "; that +Inf is `sqrt`'s derivative 0.5 / sqrt(x) at x = 0 (`norm` of a zero vector: "
        "a distance of 0, as a point's to itself), computed for a `jax.grad` or `jax.jvp` "
        f"inside the program, and 0 × Inf = NaN. Fix: {NORM_FIX}"
    ) in msg, msg


def sum_sqrt(x):
    return jnp.sum(jnp.sqrt(x))


def sum_pow(x):
    return jnp.sum(x**0.5)


def sum_where_sqrt(x):
    return jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))


def test_sqrt_and_pow_at_zero_name_their_own_fix_and_a_where_keeps_its_hint():
    x = jnp.array([4.0, 0.0])
    assert np.isinf(jax.grad(sum_sqrt)(x)[1]) and np.isinf(jax.grad(sum_pow)(x)[1])
    msg = sowviz.inspect(sum_sqrt, x).locate_nonfinite().backward.message
    assert "`sqrt`'s derivative 0.5 / sqrt(x) is infinite at x = 0, and only there" in msg
    assert "Fix: `jnp.sqrt(jnp.maximum(x, eps))`, or the double-where trick" in msg, msg
    assert "norm" not in msg
    msg = sowviz.inspect(sum_pow, x).locate_nonfinite().backward.message
    assert "`x ** 0.5`'s derivative 0.5 * x ** -0.5 is infinite at x = 0" in msg, msg
    assert "Fix: `jnp.maximum(x, eps) ** 0.5`, or the double-where trick" in msg, msg
    # masked by a `jnp.where`: the masked branch's hint, not this one
    assert np.isnan(jax.grad(sum_where_sqrt)(x)[1])
    msg = sowviz.inspect(sum_where_sqrt, x).locate_nonfinite().backward.message
    assert "and a `jnp.where`" in msg and "and only there" not in msg, msg


# -- 3. an empty segment's max ----------------------------------------------------------

RECV = jnp.array([0, 0, 1, 1, 2])  # node 3 receives nothing
X = jnp.arange(5.0)


def segment_softmax_loss(w, x):
    logits = x * w
    maxs = jax.ops.segment_max(logits, RECV, 4)
    e = jnp.exp(logits - maxs[RECV])
    return jnp.sum(e / jax.ops.segment_sum(e, RECV, 4)[RECV] * x)


def segment_min_loss(w, x):
    m = jax.ops.segment_min(x * w, RECV, 4)  # one line: its `mul` may have made the +Inf
    return jnp.sum(m[RECV])


def segment_max_returned(w, x):
    return jax.ops.segment_max(x * w, RECV, 4)  # returned: the -Inf reaches the result


def segment_max_times_zero(w, x):
    m = jax.ops.segment_max(x * w, RECV, 4)  # segmax: -Inf
    return jnp.sum(m * 0.0 + 1.0)  # segmax: NaN


def test_an_empty_segment_max_is_a_fill_when_nothing_nonfinite_reaches_a_result():
    # the independent check: segment_max's empty segment is -Inf, every result finite
    maxs = jax.ops.segment_max(X * 0.5, RECV, 4)
    assert np.isneginf(maxs[3]) and np.all(np.isfinite(maxs[:3]))
    ins = sowviz.inspect(segment_softmax_loss, jnp.float32(0.5), X)
    assert all(np.all(np.isfinite(v)) for v in jax.tree_util.tree_leaves(ins.result))
    assert ins.nonfinite is None  # no banner, no "starts here"
    assert "nonfinite" not in ins.to_dict() or ins.to_dict()["nonfinite"] is None
    assert ins.locate_nonfinite() is None


def test_a_line_holding_an_empty_segment_min_is_a_fill_once_located():
    assert np.isposinf(jax.ops.segment_min(X * 0.5, RECV, 4)[3])
    ins = sowviz.inspect(segment_min_loss, jnp.float32(0.5), X)
    assert np.isfinite(ins.result[0])
    # (the line's `mul` may have made the +Inf: said, with no alarm, until located)
    assert ins.nonfinite is not None and not ins.nonfinite.alarm
    assert ins.locate_nonfinite() is None and ins.nonfinite is None


def test_an_empty_segment_max_reaching_a_result_is_still_reported():
    ins = sowviz.inspect(segment_max_returned, jnp.float32(0.5), X, mode="primal")
    assert np.isneginf(ins.result[3])
    assert ins.nonfinite.alarm and ins.nonfinite.forward.message.startswith(
        "first made by `segment_max`"
    ), ins.nonfinite.message
    assert np.isnan(segment_max_times_zero(jnp.float32(0.5), X))
    ins = sowviz.inspect(segment_max_times_zero, jnp.float32(0.5), X, mode="primal")
    o = ins.locate_nonfinite()
    assert o.alarm and o.forward.equation.primitive == "mul", o.message
    assert o.forward.equation.source.line == _line("# segmax: NaN")
    assert f"before it, `scatter-max` {_at('# segmax: -Inf')} held -Inf" in o.forward.message


@pytest.mark.browser
def test_an_empty_segment_max_is_drawn_muted_with_no_banner_and_no_flag(page, tmp_path):
    ins = sowviz.inspect(segment_softmax_loss, jnp.float32(0.5), X)
    pg = page.open_report(ins.save_html(tmp_path / "segmax.html"))
    # the line `maxs = jax.ops.segment_max(...)`, named by what it assigns (round 16)
    (seg,) = [n.id for n in ins.graph.nodes if n.label == "maxs"]
    box = pg.locator(f'[data-node-id="{seg}"]')
    assert box.get_attribute("data-nonfinite") == "true"  # its -Inf is shown ...
    assert pg.locator(".sowviz[data-nonfinite-quiet]").count() == 1  # ... muted
    assert pg.locator('[data-role="nonfinite-banner"]').is_hidden()
    assert pg.locator("[data-nonfinite-origin]").count() == 0  # no "starts here"
    assert page.errors == []
