"""Two Tesseracts in-process, one with non-differentiable outputs; and the spirit of
tesseract-jax's own `tests/test_sow.py`: values tagged with `tesseract_jax.sow` are
captured by `sowviz.save_intermediates`, keeping their pytree structure."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

from .checks import assert_close, assert_stage, assert_value_and_grad
from .conftest import need

tesseract_jax = need("tesseract_jax", "pip install sowviz[tesseract]")
need("tesseract_core", "pip install sowviz[tesseract]")

from .models import tesseract_pipeline as tp  # noqa: E402


@pytest.fixture(scope="module")
def tesseracts():
    return tp.load()


@pytest.fixture(scope="module")
def pipeline(tesseracts):
    return tp.make_pipeline(*tesseracts)


@pytest.fixture(scope="module")
def grad_ins(pipeline):
    return sowviz.inspect(pipeline, *tp.make_args(), mode="grad", argnums=(0, 1))


def test_grad_equals_value_and_grad(pipeline, grad_ins):
    want = jax.value_and_grad(pipeline, argnums=(0, 1))(*tp.make_args())
    assert_value_and_grad(grad_ins.result, *want)


def _tesseract_jax_version() -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(p) for p in version("tesseract-jax").split(".")[:2])


@pytest.mark.skipif(
    _tesseract_jax_version() < (0, 5),
    reason="tesseract-jax 0.4 (the newest on Python 3.11) fills the tangent of the "
    "non-differentiable int output `count` with np.full(NaN) cast to int when that "
    "tangent is asked for, and a stage probe on the Tesseract's outputs asks for it: "
    "the jvp then carries that garbage (2.6e8 vs 0.198). tesseract-jax 0.5 is right; "
    "see the README's limitations.",
)
def test_jvp_mode_equals_jax_jvp(pipeline):
    args = tp.make_args()
    tangents = (jnp.cos(args[0]), jnp.float32(0.7))
    ins = sowviz.inspect(pipeline, *args, mode="jvp", tangents=tangents)
    want = jax.jvp(pipeline, args, tangents)
    assert_close(ins.result[0], want[0], what="value")
    assert_close(ins.result[1], want[1], what="tangent")


def test_stage_cotangents(tesseracts, grad_ins):
    """The first Tesseract's output `y` gets the gradient of everything downstream of it;
    the second's `energy` gets 1 / (1 + count)."""
    from tesseract_jax import apply_tesseract

    scale, energy_mask = tesseracts
    x, a = tp.make_args()
    y = apply_tesseract(scale, {"x": x, "a": a, "b": jnp.float32(0.5)})["y"]

    def downstream(y):
        out = apply_tesseract(energy_mask, {"y": jnp.tanh(y)})
        return out["energy"] / (1.0 + out["count"])

    assert_stage(grad_ins, y, key="cotangent", expected=jax.grad(downstream)(y))
    out = apply_tesseract(energy_mask, {"y": jnp.tanh(y)})
    assert_stage(grad_ins, out["energy"], key="cotangent", expected=1.0 / (1.0 + out["count"]))


@pytest.mark.parametrize("sow", ["sowviz", "tesseract_jax"])
def test_sow_on_an_output_dict_with_non_differentiable_fields(tesseracts, sow):
    """Issue 11 #4: a sow on the whole output dict, and plain `jax.grad` with no capture
    must still work (symbolic zero cotangents for `active` and `count` stay symbolic)."""
    from tesseract_jax import apply_tesseract

    sow_fn = sowviz.sow if sow == "sowviz" else tesseract_jax.sow
    scale, energy_mask = tesseracts

    def f(x, a):
        y = apply_tesseract(scale, {"x": x, "a": a, "b": jnp.float32(0.5)})["y"]
        out = sow_fn(apply_tesseract(energy_mask, {"y": jnp.tanh(y)}), "out")
        return out["energy"]

    def plain(x, a):
        y = apply_tesseract(scale, {"x": x, "a": a, "b": jnp.float32(0.5)})["y"]
        return apply_tesseract(energy_mask, {"y": jnp.tanh(y)})["energy"]

    args = tp.make_args()
    want = jax.grad(plain)(*args)
    np.testing.assert_allclose(jax.grad(f)(*args), want, rtol=1e-6)
    grads, inter = sowviz.save_intermediates(jax.grad(f))(*args)
    np.testing.assert_allclose(grads, want, rtol=1e-6)
    out = inter["out"]
    assert isinstance(out["primal"], dict) and sorted(out["primal"]) == [
        "active",
        "count",
        "energy",
    ]
    np.testing.assert_allclose(out["cotangent"]["energy"], 1.0)
    np.testing.assert_array_equal(np.asarray(out["cotangent"]["active"], np.float32), 0.0)


# -- tesseract_jax.sow under sowviz.save_intermediates (after tesseract-jax's test_sow.py)

jit_parametrize = pytest.mark.parametrize("use_jit", [False, True], ids=["nojit", "jit"])


def maybe_jit(fn, use_jit):
    return jax.jit(fn) if use_jit else fn


def _squared(x):
    return tesseract_jax.sow(x**2, "squared")


@jit_parametrize
def test_tj_sow_forward_pytree(use_jit):
    def fn(x):
        result = tesseract_jax.sow({"outer": {"a": x, "b": x**2}}, "step")
        return result["outer"]["a"].sum() + result["outer"]["b"].sum()

    x = jnp.array([1.0, 2.0])
    result, inter = sowviz.save_intermediates(maybe_jit(fn, use_jit))(x)
    np.testing.assert_allclose(result, 8.0)
    assert isinstance(inter["step"]["primal"], dict)
    np.testing.assert_array_equal(inter["step"]["primal"]["outer"]["a"], x)
    np.testing.assert_array_equal(inter["step"]["primal"]["outer"]["b"], x**2)


@jit_parametrize
def test_tj_sow_grad_pytree(use_jit):
    def fn(x):
        result = tesseract_jax.sow({"a": x, "b": x**2}, "step")
        return result["a"].sum() + result["b"].sum()

    x = jnp.array([1.0, 2.0])
    grad, inter = sowviz.save_intermediates(jax.grad(maybe_jit(fn, use_jit)))(x)
    np.testing.assert_array_equal(grad, 1 + 2 * x)
    np.testing.assert_array_equal(inter["step"]["primal"]["b"], x**2)
    np.testing.assert_array_equal(inter["step"]["cotangent"]["a"], jnp.ones(2))
    np.testing.assert_array_equal(inter["step"]["cotangent"]["b"], jnp.ones(2))


@jit_parametrize
@pytest.mark.parametrize(
    "transform, key, expected",
    [
        (lambda f: lambda x: jax.jvp(f, (x,), (jnp.ones_like(x),))[1], "tangent", lambda x: 2 * x),
        (jax.jacfwd, "tangent", lambda x: jnp.diag(2 * x)),
        (jax.jacrev, "cotangent", lambda x: jnp.eye(2)),
        (lambda f: jax.grad(lambda x: f(x).sum()), "cotangent", lambda x: jnp.ones(2)),
    ],
    ids=["jvp", "jacfwd", "jacrev", "grad"],
)
def test_tj_sow_under_transformations(use_jit, transform, key, expected):
    x = jnp.array([1.0, 2.0])
    _, inter = sowviz.save_intermediates(transform(maybe_jit(_squared, use_jit)))(x)
    np.testing.assert_array_equal(inter["squared"]["primal"], x**2)
    np.testing.assert_array_equal(inter["squared"][key], expected(x))


@jit_parametrize
def test_tj_sow_vmap_grad(use_jit):
    x = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    grad, inter = sowviz.save_intermediates(
        jax.vmap(jax.grad(maybe_jit(lambda x: _squared(x).sum(), use_jit)))
    )(x)
    np.testing.assert_array_equal(grad, 2 * x)
    np.testing.assert_array_equal(inter["squared"]["primal"], x**2)
    # The cotangent seed does not vary over the vmapped axis, so its capture has no
    # batch axis (sowviz keeps what vmap gives; see the README's capture keys).
    np.testing.assert_array_equal(inter["squared"]["cotangent"], jnp.ones_like(x[0]))


@jit_parametrize
def test_tj_sow_scan_and_fori_stack(use_jit):
    def body(carry, _):
        carry = tesseract_jax.sow(carry * 2, "step")
        return carry, carry

    def fn(x):
        return jax.lax.scan(maybe_jit(body, use_jit), x, jnp.arange(3.0))[0]

    grad, inter = sowviz.save_intermediates(jax.grad(fn))(jnp.array(1.0))
    np.testing.assert_array_equal(grad, 8.0)
    np.testing.assert_array_equal(inter["step"]["primal"], [2.0, 4.0, 8.0])
    np.testing.assert_array_equal(inter["step"]["cotangent"], [4.0, 2.0, 1.0])

    def fori(x):
        return jax.lax.fori_loop(0, 3, lambda _, c: tesseract_jax.sow(c * 2, "step"), x)

    _, inter = sowviz.save_intermediates(fori)(jnp.array(1.0))
    np.testing.assert_array_equal(inter["step"]["primal"], [2.0, 4.0, 8.0])


def test_tj_duplicate_name_error_keeps_the_phrase():
    def fn(x):
        return tesseract_jax.sow(x, "dup") + tesseract_jax.sow(x * 2, "dup")

    with pytest.raises(ValueError, match="Duplicate sow name"):
        sowviz.save_intermediates(fn)(jnp.ones(2))


@pytest.mark.browser
def test_report_opens_in_chromium(grad_ins, report):
    report(grad_ins)


def test_a_tesseract_without_a_jvp_endpoint_says_which_modes_work():
    # tesseract-jax's fem-shapeopt design Tesseract has a VJP and no JVP: modes grad
    # and vjp work; jvp and all failed with the bare NotImplementedError (all too,
    # though grad's picture needs no JVP), and show()'s warm-up of "all" silently.
    from tesseract_core import Tesseract
    from tesseract_jax import apply_tesseract

    tess = Tesseract.from_tesseract_api(tp.TESSERACTS / "scale_vjp_only" / "tesseract_api.py")

    def loss(x, a):
        y = apply_tesseract(tess, {"x": x, "a": a, "b": jnp.float32(0.5)})["y"]
        return jnp.sum(jnp.tanh(y) ** 2)

    x, a = tp.make_args()
    want = jax.value_and_grad(loss, argnums=(0, 1))(x, a)
    got = sowviz.inspect(loss, x, a, mode="grad", argnums=(0, 1)).result
    assert_close(got, want)
    with pytest.raises(NotImplementedError, match="jacobian_vector_product"):
        jax.jvp(loss, (x, a), (x, a))  # plain JAX cannot either
    for mode in ("jvp", "all"):
        with pytest.raises(
            NotImplementedError,
            match=rf"mode '{mode}' takes `fn` forward.*Tesseract `scale_vjp_only`.*use mode='primal', 'grad' or 'vjp'",
        ):
            sowviz.inspect(loss, x, a, mode=mode)


def test_a_tesseract_stage_says_which_output_it_shows(tesseracts, grad_ins):
    # The pipeline reads one output of each Tesseract: the probe had leaf "" and the
    # model named no field, so the panel never said which output it showed.
    from tesseract_jax import apply_tesseract

    scale, _ = tesseracts
    x, a = tp.make_args()
    y = apply_tesseract(scale, {"x": x, "a": a, "b": jnp.float32(0.5)})["y"]
    leaves = {p.leaf for p in grad_ins.probes if p.node == grad_ins.probe("scale").node}
    # (its differentiable inputs have probes of their own since round 21, the
    # Tesseract's VJP per field: `probe("scale", input="x")`)
    assert leaves == {"['y']", "['x (input)']", "['a (input)']"}
    got = grad_ins.probe("scale")  # one output: named without `leaf=`, as before
    assert got is grad_ins.probe("scale", "y")
    np.testing.assert_allclose(got.summaries["primal"]["l2"], np.linalg.norm(y), rtol=1e-5)


def test_calls_of_one_tesseract_reading_other_outputs_are_no_repeats():
    # tesseract-jax's simple demo: two calls of one Tesseract, the first read for
    # `result`, the second for `normed_result`, were stacked as "(×2) identical
    # blocks", their per-block chart plotting one output against the other.
    from tesseract_core import Tesseract
    from tesseract_jax import apply_tesseract

    tess = Tesseract.from_tesseract_api(tp.TESSERACTS / "two_outputs" / "tesseract_api.py")
    x, a = tp.make_args()

    def other(x, a):
        y = apply_tesseract(tess, {"x": x, "a": a})["y"]
        return jnp.sum(apply_tesseract(tess, {"x": y, "a": a})["y_normed"] ** 3)

    def same(x, a):
        y = apply_tesseract(tess, {"x": x, "a": a})["y"]
        return jnp.sum(apply_tesseract(tess, {"x": y, "a": a})["y"] ** 3)

    nodes = sowviz.inspect(other, x, a).to_dict()["nodes"]
    assert [n["kind"] for n in nodes if n["label"].startswith("two_outputs")] == ["tesseract"] * 2
    assert not any(n.get("repeats") for n in nodes)
    nodes = sowviz.inspect(same, x, a).to_dict()["nodes"]  # alike: still one group
    assert [n["repeats"] for n in nodes if n.get("repeats")] == [2]


def test_tesseract_names_takes_a_tesseract_or_its_name(tesseracts):
    # `tesseract_names={tess: "label"}` was refused: only name strings were keys
    pipeline = tp.make_pipeline(*tesseracts)
    scale, energy_mask = tesseracts
    for names in (
        {scale: "affine", energy_mask: "energy"},
        {"scale": "affine", energy_mask: "energy"},
    ):
        nodes = sowviz.inspect(pipeline, *tp.make_args(), tesseract_names=names).to_dict()["nodes"]
        assert [n["label"] for n in nodes if n["kind"] == "tesseract"] == ["affine", "energy"]
    with pytest.raises(TypeError, match="`tesseract_names` must be None, a dict of Tesseract"):
        sowviz.inspect(pipeline, *tp.make_args(), tesseract_names={scale: 3})


def test_a_nan_tangent_of_a_tesseract_output_that_is_not_differentiable_says_why():
    # tesseract-jax gives such an output a NaN tangent (plain jax.jvp too); the banner
    # named the Tesseract with no word of why, and the user went hunting
    from tesseract_core import Tesseract
    from tesseract_jax import apply_tesseract

    tess = Tesseract.from_tesseract_api(tp.TESSERACTS / "two_outputs" / "tesseract_api.py")
    x, a = tp.make_args()

    def f(x, a):
        out = sowviz.sow(apply_tesseract(tess, {"x": x, "a": a}), "out")  # every output probed
        return jnp.sum(out["y"] ** 2)

    _, plain = jax.jvp(lambda x: apply_tesseract(tess, {"x": x, "a": a}), (x,), (jnp.ones_like(x),))
    assert np.isnan(plain["y_norm"])
    ins = sowviz.inspect(f, x, a, mode="jvp")
    assert np.isfinite(ins.result[1])
    msg = ins.nonfinite.forward.message
    assert "in its tangent: the value is finite); tesseract-jax gives a Tesseract's outputs" in msg
    assert not ins.nonfinite.alarm  # it never reaches a result


def test_a_tesseract_mapped_by_vmap_is_named_in_its_map(tesseracts):
    # tesseract-jax's `vmap_method="sequential"` maps the Tesseract with `lax.map`: the
    # stage read a bare `map`, the Tesseract's name hidden inside it
    from tesseract_jax import apply_tesseract

    scale = tesseracts[0]

    def one(x, a):
        return apply_tesseract(
            scale, {"x": x, "a": a, "b": jnp.float32(0.5)}, vmap_method="sequential"
        )["y"]

    def loss(xs, a):
        return jnp.sum(jax.vmap(one, in_axes=(0, None))(xs, a) ** 2)

    xs = jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(3, 4)
    ins = sowviz.inspect(loss, xs, jnp.float32(1.3))
    (loop,) = (n for n in ins.graph.nodes if n.kind == "scan")
    (tess,) = (n for n in ins.graph.nodes if n.kind == "tesseract")
    assert loop.label == f"map({tess.label})", (loop.label, tess.label)
    value, grad = jax.value_and_grad(loss)(xs, jnp.float32(1.3))
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-5)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-5)
