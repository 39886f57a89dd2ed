"""Why a value shows no cotangent when a custom derivative rule takes its gradient: a
neural ODE's vector field (diffrax, inside Equinox's checkpointed `while`, a
`jax.custom_vjp`) is what every gradient flows through, and its panel said "this value
does not depend on the differentiated arguments". It now says the value is computed
inside a `jax.custom_vjp` function (named, with its line) whose gradient is the rule's,
and which stage around it shows the gradient."""

from __future__ import annotations

import inspect
import os
import pathlib

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import sowviz

# -- a custom_vjp of the user's: the scope inside it ---------------------------------------


@jax.custom_vjp
def _clipped_tanh(x):
    with jax.named_scope("inner"):
        return jnp.tanh(x) * 2.0


def _fwd(x):
    return _clipped_tanh(x), x


def _bwd(x, g):
    return (jnp.clip(g * 2.0 * (1 - jnp.tanh(x) ** 2), -1.0, 1.0),)


_clipped_tanh.defvjp(_fwd, _bwd)


def _loss(w, x):
    with jax.named_scope("outside"):
        h = jnp.sin(x @ w)
    return jnp.sum(_clipped_tanh(h) ** 2)


def _probe_of(ins, label):
    d = ins.to_dict()
    (node,) = (n["id"] for n in d["nodes"] if n["label"] == label)
    return next(p for p in d["probes"] if p["node"] == node)


def test_a_value_inside_a_users_custom_vjp_names_the_rule_and_its_line():
    w = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    x = jnp.linspace(0.5, 2.0, 8).reshape(2, 4)
    ins = sowviz.inspect(_loss, w, x, mode="grad")
    np.testing.assert_allclose(
        ins.probe("w").summaries["cotangent"]["l2"],
        np.linalg.norm(jax.grad(_loss)(w, x)),
        rtol=1e-5,
    )
    inner = _probe_of(ins, "inner")
    assert "cotangent" not in inner["summaries"]
    assert inner["no_cotangent"] == "custom_rule"
    rule = inner["custom_rule"]
    assert rule["kind"] == "custom_vjp"
    assert rule["function"] == "_clipped_tanh"
    line = inspect.getsourcelines(_clipped_tanh.fun)[1]
    assert rule["source"]["file"].endswith(os.path.basename(__file__))
    assert rule["source"]["line"] in (line, line + 1)  # (the decorator's line or the def's)
    # a stage outside the rule has its cotangent, and no reason
    outside = _probe_of(ins, "outside")
    assert "cotangent" in outside["summaries"] and "no_cotangent" not in outside


def test_a_value_that_does_not_depend_on_the_arguments_stays_independent():
    def loss(w, x):
        with jax.named_scope("of_x"):
            s = jnp.cos(x) * 3.0
        return jnp.sum(w * s)

    w = jnp.ones(3)
    x = jnp.arange(3.0)
    ins = sowviz.inspect(loss, w, x, mode="grad")
    p = _probe_of(ins, "of_x")
    assert p["no_cotangent"] == "independent" and "custom_rule" not in p


# -- diffrax's neural ODE, as its example writes it ---------------------------------------


# (the zoo's neural ODE: diffrax's example with an Equinox MLP vector field)
from tests.zoo.test_diffrax import Func, NeuralODE  # noqa: E402


def _ode_loss(model, ts, y0, yi):
    return jnp.mean((model(ts, y0) - yi) ** 2)


def test_a_neural_odes_vector_field_says_the_adjoints_rule_takes_its_gradient():
    model = NeuralODE(Func(jax.random.PRNGKey(0)), diffrax.RecursiveCheckpointAdjoint())
    ts = jnp.linspace(0.0, 1.0, 6)
    y0 = jnp.array([1.0, 0.5])
    yi = jnp.ones((6, 2))
    ins = sowviz.inspect(_ode_loss, model, ts, y0, yi, mode="grad")
    want = eqx.filter_grad(_ode_loss)(model, ts, y0, yi)
    w0 = want.func.mlp.layers[0].weight
    got = ins.probe("func.mlp.layers[0].weight").summaries["cotangent"]
    np.testing.assert_allclose(got["l2"], np.linalg.norm(w0), rtol=1e-4)
    d = ins.to_dict()
    (vf,) = (n["id"] for n in d["nodes"] if n["label"].startswith("vector_field"))
    (p,) = (p for p in d["probes"] if p["node"] == vf)
    assert "cotangent" not in p["summaries"]
    assert p["no_cotangent"] == "custom_rule"
    assert p["custom_rule"]["kind"] == "custom_vjp"
    assert p["custom_rule"]["source"]["file"].startswith("equinox")


# -- a report's history: float32 statistics in their shortest decimals ---------------------


def _report_model(path):
    import base64
    import gzip
    import json
    import re

    text = pathlib.Path(path).read_text(encoding="utf-8")
    packed = re.search(r'data-encoding="gzip-base64">([^<]+)</script>', text)
    if packed is not None:
        return json.loads(gzip.decompress(base64.b64decode(packed.group(1))))
    return json.loads(re.search(r"data-sowviz-model[^>]*>(.*?)</script>", text, re.S).group(1))


def _floats(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _floats(v, f"{path}/{k}")
    elif isinstance(x, list):
        for v in x:
            yield from _floats(v, path)
    elif isinstance(x, float):
        yield path, x


def test_a_reports_history_writes_float32_statistics_in_their_shortest_decimals(tmp_path):
    def loss(p, x, y):
        h = jnp.tanh(x @ p["w1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(3), 3)
    params = {"w1": jax.random.normal(k1, (8, 16)) * 0.3, "w2": jax.random.normal(k2, (16, 1))}
    x = jax.random.normal(k3, (12, 8))
    y = jnp.sin(x[:, :1])
    mon = sowviz.Monitor(loss, every=1)
    for _ in range(6):
        _, g = mon.step(params, x, y)
        params = jax.tree.map(lambda p, d: p - 0.1 * d, params, g)
    want = mon.to_dict()["history"]
    got = _report_model(mon.save_html(tmp_path / "run.html"))["history"]
    assert got["steps"] == want["steps"]
    pid = next(iter(want["probes"]))
    for mode, rows in want["probes"][pid].items():
        for r_want, r_got in zip(rows, got["probes"][pid][mode], strict=True):
            for key in ("l2", "absmax", "min", "max"):
                assert np.float32(r_got[key]) == np.float32(r_want[key])
    # every float of the history reads back as a float32 in at most 9 significant digits
    history_floats = [v for p, v in _floats(got["probes"]) if "loghist" not in p]
    assert history_floats
    assert all(
        len(repr(v).replace("-", "").replace(".", "").lstrip("0").split("e")[0]) <= 9
        for v in history_floats
    )
