"""Round 17, Tesseracts (tesseract-jax): a Tesseract's inputs named by schema field and
its static fields shown; a Tesseract never swallowed by its line's box; endpoint errors
that name the Tesseract and advise modes it allows; a sow inside a Tesseract's own
`apply_jit` worded as such; a self-differentiating program's VJP call labelled so."""

from __future__ import annotations

import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

pytest.importorskip("tesseract_jax")
pytest.importorskip("tesseract_core")

from tesseract_core import Tesseract
from tesseract_jax import apply_tesseract

TESS = pathlib.Path(__file__).resolve().parent / "fixtures" / "tesseracts"


def _tesseract_jax_version() -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(p) for p in version("tesseract-jax").split(".")[:2])


def _load(name: str) -> Tesseract:
    return Tesseract.from_tesseract_api(TESS / name / "tesseract_api.py")


@pytest.fixture(scope="module")
def static():
    return _load("scale_static")


def _static_loss(tess):
    def loss(theta, x):
        k = 0.1 + jax.nn.softplus(theta)
        inputs = {"x": x, "scale": {"a": k}, "shift": k * 0.5, "solver": "dense", "power": 2}
        y = apply_tesseract(tess, inputs)["y"]
        return jnp.mean(y**2) + 0.01 * k

    return loss


def _plain_static_loss(theta, x):
    k = 0.1 + jax.nn.softplus(theta)
    return jnp.mean((k * x**2 + k * 0.5) ** 2) + 0.01 * k


def test_tesseract_inputs_are_named_by_schema_field(static):
    # finding 1: the ports of the stage are `scale.a`, `shift`, `x`; the static fields
    # `solver` and `power` are on the node (they are no operand, no edge)
    theta, x = jnp.float32(0.3), jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32)
    loss = _static_loss(static)
    ins = sowviz.inspect(loss, theta, x, mode="grad")
    want = jax.value_and_grad(_plain_static_loss)(theta, x)
    np.testing.assert_allclose(ins.result[0], want[0], rtol=1e-5)
    np.testing.assert_allclose(ins.result[1], want[1], rtol=1e-5)
    d = ins.to_dict()
    (tess,) = [n for n in d["nodes"] if n["kind"] == "tesseract"]
    assert sorted(tess["port_names"].values()) == ["scale.a", "shift", "x"]
    if _tesseract_jax_version() >= (0, 5):  # (0.4 keeps statics as hashable wrappers)
        assert tess["static_inputs"] == {"solver": "'dense'", "power": "2"}
    by_id = {n["id"]: n for n in d["nodes"]}
    # the input `x` feeds the field `x`; every port's maker feeds this stage by an edge
    x_in = next(k for k, f in tess["port_names"].items() if f == "x")
    assert by_id[x_in]["kind"] == "input" and by_id[x_in]["label"] == "x"
    into = {e["source"] for e in d["edges"] if e["target"] == tess["id"]}
    into |= {a for e in d["edges"] if e["target"] == tess["id"] for a, _ in e.get("ends", [])}
    assert set(tess["port_names"]) <= into


def _line_loss(tess):
    def loss(v):
        w = jnp.tanh(v)
        z = jnp.cumsum(w) / v.size
        y = apply_tesseract(
            tess, {"x": 0.5 * w**2 + jnp.ones(v.size), "a": jnp.float32(2.0), "b": jnp.float32(0.5)}
        )["y"]
        smooth = jnp.sum(jnp.diff(y) ** 2)
        s = jnp.sin(v) * jnp.cos(v)  # (more lines: a level big enough to fold lines)
        e = jnp.exp(-v) + jnp.log1p(v**2)
        return jnp.mean(y) + 0.1 * smooth + jnp.sum(z**2) + jnp.sum(s * e)

    return loss


def _plain_line_loss(v):
    w = jnp.tanh(v)
    z = jnp.cumsum(w) / v.size
    y = 2.0 * (0.5 * w**2 + 1.0) + 0.5
    s = jnp.sin(v) * jnp.cos(v)
    e = jnp.exp(-v) + jnp.log1p(v**2)
    return jnp.mean(y) + 0.1 * jnp.sum(jnp.diff(y) ** 2) + jnp.sum(z**2) + jnp.sum(s * e)


def test_a_tesseract_on_a_line_with_arithmetic_stays_a_top_level_stage():
    # finding 2: the line's arithmetic is a box of its own (`solve inputs`) beside the
    # Tesseract's stage, which was inside a line box `y` at a big level
    scale = _load("scale")
    v = jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32)
    ins = sowviz.inspect(_line_loss(scale), v, mode="grad", tesseract_names={scale: "solve"})
    want = jax.value_and_grad(_plain_line_loss)(v)
    np.testing.assert_allclose(ins.result[0], want[0], rtol=1e-5)
    np.testing.assert_allclose(ins.result[1], want[1], rtol=1e-5, atol=1e-6)
    d = ins.to_dict()
    top = [(n["label"], n["kind"]) for n in d["nodes"] if n["parent"] == d["root"]]
    assert ("solve", "tesseract") in top, top
    # (the line's arithmetic stays in a box of its own, or loose: never around the stage)
    # its output's cotangent: d loss / d y, as plain JAX says
    w = jnp.tanh(v)
    y = 2.0 * (0.5 * w**2 + 1.0) + 0.5
    dy = jax.grad(lambda y: jnp.mean(y) + 0.1 * jnp.sum(jnp.diff(y) ** 2))(y)
    got = ins.probe("solve").summaries["cotangent"]
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(dy)), rtol=1e-5)
    np.testing.assert_allclose(got["mean"], float(jnp.mean(dy)), rtol=1e-5, atol=1e-7)


def _two_tesseracts(jac_only):
    full = _load("scale")

    def loss(x):
        y1 = apply_tesseract(full, {"x": x, "a": jnp.float32(1.5), "b": jnp.float32(0.5)})["y"]
        y2 = apply_tesseract(
            jac_only, {"x": jnp.tanh(x), "a": jnp.float32(2.0), "b": jnp.float32(0.0)}
        )["y"]
        return jnp.sum(y1 * y2)

    return loss


@pytest.mark.parametrize("mode", ["jvp", "all", "grad", "vjp"])
def test_a_missing_endpoint_names_the_tesseract_and_the_modes_it_allows(mode):
    # finding 3: apply + jacobian only: no mode but primal works, and the message says
    # which of the two Tesseracts it is (grad/vjp raised tesseract-jax's bare error)
    jac_only = _load("scale_jac_only")
    loss = _two_tesseracts(jac_only)
    x = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)
    endpoint = "jacobian_vector_product" if mode in ("jvp", "all") else "vector_jacobian_product"
    with pytest.raises(NotImplementedError) as info:
        sowviz.inspect(loss, x, mode=mode)
    msg = str(info.value)
    assert f"mode '{mode}'" in msg and "Tesseract `scale_jac_only`" in msg
    assert f"no `{endpoint}` endpoint" in msg
    assert "endpoints apply, jacobian: use mode='primal'" in msg
    assert "mode='grad'" not in msg and "mode 'all' linearizes" not in msg
    # the primal mode it advises works, and agrees with plain JAX
    ins = sowviz.inspect(loss, x, mode="primal")
    np.testing.assert_allclose(
        ins.result, jnp.sum((1.5 * x + 0.5) * (2.0 * jnp.tanh(x))), rtol=1e-6
    )


def test_a_missing_jvp_with_a_vjp_advises_grad_and_vjp():
    tess = _load("scale_vjp_only")
    x = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)

    def loss(x):
        return jnp.sum(
            apply_tesseract(tess, {"x": x, "a": jnp.float32(2.0), "b": jnp.float32(0.5)})["y"] ** 2
        )

    with pytest.raises(
        NotImplementedError, match=r"Tesseract `t` .*use mode='primal', 'grad' or 'vjp'"
    ):
        sowviz.inspect(loss, x, mode="jvp", tesseract_names={tess: "t"})
    got = sowviz.inspect(loss, x, mode="grad").result
    want = jax.value_and_grad(lambda x: jnp.sum((2.0 * x + 0.5) ** 2))(x)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


def test_a_sow_inside_a_tesseract_is_said_to_be_inside_it():
    # finding 4: not a custom_jvp/custom_vjp rule; both sows named, `tesseract_jax.sow` too
    tess = _load("scale_sowing")

    def loss(x):
        return jnp.sum(apply_tesseract(tess, {"x": x})["y"])

    x = jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grads, inter = sowviz.save_intermediates(jax.grad(loss))(x)
    np.testing.assert_allclose(
        grads, jax.grad(lambda x: jnp.sum(jnp.tanh(2 * x) ** 2))(x), rtol=1e-5
    )
    assert inter == {}
    msgs = [str(w.message) for w in caught]
    assert not any("custom_jvp" in m for m in msgs), msgs
    assert any("`sowviz.sow('inner_h')` is inside Tesseract `scale_sowing`" in m for m in msgs), (
        msgs
    )
    assert any(
        "`tesseract_jax.sow('inner_h_tj')` is inside Tesseract `scale_sowing`" in m for m in msgs
    )
    assert all("runs outside the traced program" in m for m in msgs)


def test_a_train_step_labels_the_tesseract_vjp_call(static):
    # finding 6: the program takes its own gradient: the Tesseract's VJP endpoint call is
    # `<label> (vjp)`, its forward call the label alone
    loss = _static_loss(static)
    x = jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32)

    def step(theta):
        value, g = jax.value_and_grad(loss)(theta, x)
        return theta - 0.1 * g, value

    theta = jnp.float32(0.3)
    ins = sowviz.inspect(step, theta, mode="primal", tesseract_names={static: "T"})
    want = step(theta)
    np.testing.assert_allclose(ins.result[0], want[0], rtol=1e-5)
    labels = sorted(n["label"] for n in ins.to_dict()["nodes"] if n["kind"] == "tesseract")
    assert labels == ["T", "T (vjp)"]


def test_a_tesseract_whose_line_computes_its_input_is_not_hidden_in_the_lines_box():
    # finding 2 as the tester wrote it: the input's arithmetic inside the call's dict;
    # the line was one box `u` around the Tesseract at the top level
    scale = _load("scale")

    def loss(v):
        w = jnp.tanh(v)
        z = jnp.cumsum(w) / v.size
        u = apply_tesseract(scale, {"x": 1.0 + w**2, "a": jnp.float32(2.0), "b": jnp.float32(0.5)})[
            "y"
        ]
        smooth = jnp.sum(jnp.diff(u) ** 2)
        return jnp.mean(u) + 0.1 * smooth + jnp.sum(z**2)

    def plain(v):
        w = jnp.tanh(v)
        z = jnp.cumsum(w) / v.size
        u = 2.0 * (1.0 + w**2) + 0.5
        return jnp.mean(u) + 0.1 * jnp.sum(jnp.diff(u) ** 2) + jnp.sum(z**2)

    v = jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32)
    ins = sowviz.inspect(loss, v, mode="grad", tesseract_names={scale: "solve"})
    want = jax.value_and_grad(plain)(v)
    np.testing.assert_allclose(ins.result[0], want[0], rtol=1e-5)
    np.testing.assert_allclose(ins.result[1], want[1], rtol=1e-5, atol=1e-6)
    d = ins.to_dict()
    top = [(n["label"], n["kind"]) for n in d["nodes"] if n["parent"] == d["root"]]
    assert ("solve", "tesseract") in top, top
    assert "u" not in [label for label, _ in top], top
    u = 2.0 * (1.0 + jnp.tanh(v) ** 2) + 0.5
    np.testing.assert_allclose(
        ins.probe("solve").summaries["primal"]["l2"], float(jnp.linalg.norm(u)), rtol=1e-5
    )
