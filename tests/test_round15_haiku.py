"""Haiku modules as NNX's are drawn: a stateful module's state writes named by their
Haiku paths (`mean_ema/average (new)`) with `probe(name)` its activation, a module's
stage sourced at its call (not where it was built), and the model's module open."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

hk = pytest.importorskip("haiku")


def _line(fn, marker: str) -> int:
    """The line of `fn`'s source holding `marker` (its comment)."""
    lines, start = inspect.getsourcelines(fn)
    (k,) = [k for k, text in enumerate(lines) if marker in text]
    return start + k


def _bn_forward(x):
    x = hk.Linear(4)(x)
    return hk.BatchNorm(True, True, decay_rate=0.9, name="bn")(x, is_training=True)


_BN = hk.transform_with_state(_bn_forward)


def _bn_loss(params, state, x):
    y, state = _BN.apply(params, state, None, x)
    return jnp.mean(y**2 * jnp.arange(4.0)), state


def test_a_haiku_batchnorm_is_probed_as_its_activation_and_its_state_by_name():
    x = jax.random.normal(jax.random.PRNGKey(0), (8, 3))
    params, state = _BN.init(jax.random.PRNGKey(1), x)
    ins = sowviz.inspect(_bn_loss, params, state, x, has_aux=True)
    y, new_state = _BN.apply(params, state, None, x)
    cot = jax.grad(lambda y: jnp.mean(y**2 * jnp.arange(4.0)))(y)

    # `probe("bn")` raised a KeyError asking for `leaf='[0]'`: it is the activation
    bn = ins.probe("bn")
    np.testing.assert_allclose(bn.summaries["primal"]["l2"], float(jnp.linalg.norm(y)), rtol=1e-5)
    np.testing.assert_allclose(
        bn.summaries["cotangent"]["l2"], float(jnp.linalg.norm(cot)), rtol=1e-5
    )
    # the EMAs it sets are named by their Haiku paths below `bn`, not `[1]`..`[4]`
    leaves = {p.leaf for p in ins.probes if p.leaf and ins.probe_path(p).endswith("/bn")}
    written = {f"['{m}/{k} (new)']" for m in ("mean_ema", "var_ema") for k in ("hidden", "average")}
    assert leaves == {"['output']"} | written
    for m in ("mean_ema", "var_ema"):
        for k in ("hidden", "average"):
            got = ins.probe("bn", leaf=f"['{m}/{k} (new)']").summaries["primal"]["l2"]
            want = float(jnp.linalg.norm(new_state[f"bn/~/{m}"][k]))
            np.testing.assert_allclose(got, want, rtol=1e-5)
    # inside `bn`, each EMA module's own `hidden` is named below it, and `average`,
    # which it returns, is its output
    ema = {p.leaf for p in ins.probes if p.leaf and ins.probe_path(p).endswith("bn/mean_ema")}
    assert ema == {"['output']", "['hidden (new)']"}
    # (Haiku's `next_fun`, which runs a method interceptor, is no stage: `jnp.mean`'s is)
    d = ins.to_dict()
    (bn_node,) = [
        n for n in d["nodes"] if n["label"] == "bn" and n["kind"] == "scope" and n["n_eqns"]
    ]
    inside = [n["label"] for n in d["nodes"] if n["parent"] == bn_node["id"]]
    assert "mean" in inside and "next_fun" not in inside


def _norm(x):
    return hk.LayerNorm(-1, True, True)(x)


class _Block(hk.Module):
    def __call__(self, x):
        h = _norm(x)  # (the block's first equation: inside `_norm`)
        return x + hk.Linear(x.shape[-1])(h)


class _Outer(hk.Module):
    def __init__(self, block, name=None):
        super().__init__(name=name)
        self.block = block  # built by the caller, called below
        self.inner = _Block(name="inner")  # built here, called below

    def __call__(self, x):
        x = self.inner(x * 2.0)  # <inner call>
        return self.block(x)  # <block call>


def _outer_forward(x):
    return _Outer(_Block(name="block"), name="outer")(x)  # <outer call>


def test_a_haiku_module_built_elsewhere_is_sourced_at_its_call():
    net = hk.without_apply_rng(hk.transform(_outer_forward))
    x = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
    params = net.init(jax.random.PRNGKey(0), x)
    d = sowviz.inspect(lambda p, x: jnp.sum(net.apply(p, x) ** 2), params, x).to_dict()
    src = {n["label"]: n.get("source") for n in d["nodes"] if n["kind"] == "scope"}
    # `block` was sourced at the line building it (`_outer_forward`'s), which names it
    assert src["block"]["line"] == _line(_Outer.__call__, "<block call>")
    # and `inner` at its first equation (inside `_norm`)
    assert src["inner"]["line"] == _line(_Outer.__call__, "<inner call>")
    assert src["outer"]["line"] == _line(_outer_forward, "<outer call>")


class _Model(hk.Module):
    def __call__(self, x):
        for _ in range(3):
            x = jax.nn.gelu(hk.Linear(16)(hk.LayerNorm(-1, True, True)(x)))
        return hk.Linear(1)(x)


def test_a_haiku_model_module_starts_open_as_an_nnx_one_does():
    net = hk.without_apply_rng(hk.transform(lambda x: _Model(name="model")(x)))
    x = jnp.ones((4, 16))
    params = net.init(jax.random.PRNGKey(0), x)
    d = sowviz.inspect(lambda p, x: jnp.mean(net.apply(p, x) ** 2), params, x).to_dict()
    root = d["nodes"][0]["id"]
    (model,) = [n for n in d["nodes"] if n["label"] == "model"]
    assert model["parent"] == root
    assert not model["collapsed"]  # (it holds nearly every equation: one closed box)
    inside = [n["label"] for n in d["nodes"] if n["parent"] == model["id"]]
    assert inside[:2] == ["layer_norm", "linear"] and "linear_3" in inside
