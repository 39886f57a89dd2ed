"""NaN hunting on decoders (round 14): a fully masked attention row (a softmax of a
`jnp.where(mask, s, -jnp.inf)` whose every entry is masked) says why and how to fix
it; a causal mask made inside a loop's step and masked afterwards is a mask's fill,
flagged nowhere; a while loop's "unless, at an earlier iteration" names neither the
origin's own code again nor a value that leaves as integers."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import marked_line

import sowviz
import sowviz.nonfinite as nonfinite

HERE = pathlib.Path(__file__)


def _line(marker: str) -> int:
    return marked_line(HERE, marker)


# -- 1. a fully masked softmax row ------------------------------------------------------

KS = jax.random.split(jax.random.PRNGKey(0), 4)
W = {n: jax.random.normal(k, (8, 8)) / 3 for n, k in zip("qkv", KS, strict=False)}
X = jax.random.normal(KS[3], (2, 5, 8))
PAD = jnp.array([[True] * 5, [False, False, True, True, True]])  # left padding


def _attention_loss(fill):
    def loss(w, x, pad):
        q, k, v = x @ w["q"], x @ w["k"], x @ w["v"]
        s = jnp.einsum("bqd,bkd->bqk", q, k)
        mask = jnp.tril(jnp.ones((5, 5), bool))[None] & pad[:, None, :]
        if fill == "softmax-where":
            p = jax.nn.softmax(s, axis=-1, where=mask)
        else:
            s = jnp.where(mask, s, fill)  # row: where
            p = jax.nn.softmax(s, axis=-1)  # row: softmax
        return jnp.mean((p @ v) ** 2)

    return loss


def _manual_softmax_loss(s, mask):
    s = jnp.where(mask, s, -jnp.inf)  # manual: where
    e = jnp.exp(s)
    return jnp.sum(e / jnp.sum(e, axis=-1, keepdims=True))  # manual: div


def test_a_fully_masked_softmax_row_says_why_and_the_fixes():
    loss = _attention_loss(-jnp.inf)
    value, grads = jax.value_and_grad(loss)(W, X, PAD)
    assert np.isnan(value) and np.isnan(grads["v"]).any()  # plain JAX: the NaN is real
    o = sowviz.inspect(loss, W, X, PAD, mode="grad").locate_nonfinite()
    eq = o.forward.equation
    assert (eq.primitive, eq.source.line) == ("sub", _line("# row: softmax")), o.message
    msg = o.forward.message
    assert f"a fully masked row: the `jnp.where` at {HERE.name}" in msg.replace("tests/", "")
    assert f":{_line('# row: where')} put -Inf in every entry of a row" in msg
    assert "-Inf - (-Inf) = NaN" in msg
    assert "jnp.finfo(s.dtype).min" in msg and "jax.nn.softmax(s, where=mask)" in msg


@pytest.mark.parametrize("fix", ["finfo", "softmax-where"])
def test_the_suggested_fixes_give_finite_values_and_gradients(fix):
    # what the hint promises, checked against plain JAX
    fill = jnp.finfo(jnp.float32).min if fix == "finfo" else fix
    value, grads = jax.value_and_grad(_attention_loss(fill))(W, X, PAD)
    assert np.isfinite(value) and all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


def test_an_exp_normalise_without_max_says_it_too():
    s = jnp.arange(6.0).reshape(2, 3)
    mask = jnp.array([[True, False, True], [False, False, False]])
    assert np.isnan(_manual_softmax_loss(s, mask))
    o = sowviz.inspect(_manual_softmax_loss, s, mask, mode="primal").locate_nonfinite()
    eq = o.forward.equation
    assert (eq.primitive, eq.source.line) == ("div", _line("# manual: div")), o.message
    assert "a fully masked row" in o.message and "0 / 0 = NaN" in o.message


def test_a_nan_of_no_mask_gets_no_masked_row_hint():
    # -Inf - (-Inf) of an overflow, no `jnp.where`: not a masked row
    def f(x):
        y = -jnp.exp(x)  # -Inf at x = 100: every entry
        return jnp.sum(y - jnp.max(y))

    x = jnp.array([100.0, 100.0])
    assert np.isnan(f(x))
    o = sowviz.inspect(f, x, mode="primal").locate_nonfinite()
    assert o.alarm and "fully masked row" not in o.message, o.message


# -- 2. a causal mask made inside a loop's step ------------------------------------------

T = 6
Q = jnp.ones(4) * 0.1
K = jax.random.normal(jax.random.PRNGKey(0), (T, 4))


def _attend(q, k, pos):
    s = jnp.where(jnp.arange(T) <= pos, k @ q, -jnp.inf)  # step: mask
    return jax.nn.softmax(s) @ k


def _decoder_scan(q, k):
    def body(acc, i):
        return acc + _attend(q + acc, k, i), None

    return jnp.sum(jax.lax.scan(body, jnp.zeros_like(q), jnp.arange(T))[0])


def _decoder_fori(q, k):
    return jnp.sum(
        jax.lax.fori_loop(0, T, lambda i, acc: acc + _attend(q + acc, k, i), jnp.zeros_like(q))
    )


@pytest.mark.parametrize("fn", [_decoder_scan, _decoder_fori], ids=["scan", "fori"])
def test_a_mask_made_in_a_loop_step_and_masked_is_a_fill_with_no_origin(fn):
    value, grads = jax.value_and_grad(fn)(Q, K)
    assert np.isfinite(value) and np.isfinite(grads).all()
    ins = sowviz.inspect(fn, Q, K, mode="grad")
    for o in (ins.nonfinite, ins.locate_nonfinite()):
        assert o.forward is None and o.backward is None, o.message
        assert o.removed and not o.alarm and o.expected
        assert o.message.startswith("Only -Inf mask values, first put by `"), o.message
        assert f":{_line('# step: mask')}), in iteration 0 of `" in o.message
        assert "(masked afterwards: no result is non-finite)" in o.message
    rec = ins.to_dict()["nonfinite"]
    assert rec["forward"] is None and rec["expected"] and not rec["alarm"]


def test_an_overflow_masked_in_a_loop_keeps_its_origin():
    # +Inf of `exp`, masked: made of finite values, not a mask's fill
    def f(x):
        def body(acc, xi):
            e = jnp.exp(xi)  # overflow: exp
            return acc + jnp.where(jnp.isfinite(e), e, 0.0), None

        return jax.lax.scan(body, 0.0, x)[0]

    x = jnp.array([1.0, 100.0, 2.0])
    assert np.isfinite(f(x))
    o = sowviz.inspect(f, x, mode="primal").nonfinite
    assert o.forward is not None and o.removed and not o.alarm, o.message
    assert o.forward.iteration == (1,)


def test_a_mask_outside_any_loop_keeps_its_origin():
    def f(q, k):
        return jnp.sum(_attend(q, k, 2))

    o = sowviz.inspect(f, Q, K, mode="primal").nonfinite
    assert o.forward is not None and o.removed and not o.alarm, o.message


@pytest.mark.browser
def test_a_mask_made_in_a_loop_step_draws_no_start_flag(page, tmp_path):
    ins = sowviz.inspect(_decoder_fori, Q, K, mode="primal")
    pg = page.open_report(ins.save_html(tmp_path / "decoder.html"))
    banner = pg.locator('[data-role="nonfinite-banner"]')
    assert "never reached a result (no alarm)" in banner.inner_text()
    assert "Only -Inf mask values" in banner.inner_text(), banner.inner_text()
    assert pg.locator(".sv-origin-flag").count() == 0
    assert pg.locator("[data-nonfinite-origin]").count() == 0
    assert pg.locator('[data-nonfinite="true"]').count() >= 1  # still said, quietly
    assert page.errors == []


# -- 3. a while loop's candidates from an earlier iteration ------------------------------


def _log_twice(x):
    h = jnp.log(x)  # twice: log
    return h


def _pick(key, logits):
    return jax.random.categorical(key, logits)  # gumbel: add


def _sampler(x0, key):
    def body(c):
        i, x, key, tok = c
        key, sub = jax.random.split(key)
        x = _log_twice(_log_twice(x))  # twice: calls
        tok = _pick(sub, jnp.stack([x, 2 * x]))
        return i + 1, x, key, tok

    return jax.lax.while_loop(lambda c: c[0] < 4, body, (0, x0, key, 0))[1]


def _carried_names(monkeypatch, filtered: bool) -> str:
    if not filtered:  # the list as it was, for comparison
        monkeypatch.setattr(nonfinite, "_same_code", lambda *a: False)
        monkeypatch.setattr(nonfinite, "_leaves_exact", lambda *a: False)
    ins = sowviz.inspect(_sampler, jnp.float32(20.0), jax.random.PRNGKey(0), mode="primal")
    msg = ins.nonfinite.message
    assert f"first made by `_log_twice` ({'tests/' + HERE.name}:{_line('# twice: calls')})" in msg
    names = msg.partition(nonfinite.LOOP_CARRIED)[2]
    return names


def test_a_while_loops_earlier_iteration_candidates_skip_the_origins_code_and_integers(
    monkeypatch,
):
    assert np.isnan(_sampler(jnp.float32(20.0), jax.random.PRNGKey(0)))
    names = _carried_names(monkeypatch, filtered=True)
    assert names, "some later line may still have made it"
    assert "_log_twice" not in names and f":{_line('# twice: log')})" not in names, names
    assert f":{_line('# gumbel: add')})" not in names, names  # categorical's int output
    monkeypatch.undo()
    unfiltered = _carried_names(monkeypatch, filtered=False)
    # (what was said before: the filters are what removed them)
    assert f":{_line('# gumbel: add')})" in unfiltered or "_log_twice#2" in unfiltered
