"""Round 21, a Tesseract's own VJP per input field: in modes grad and vjp each
differentiable input field of a Tesseract's stage is probed (`probe(stage,
input=field)`), its cotangent what the Tesseract's VJP alone hands back for the field
(as `jax.vjp` of the call alone says, and the closed form of the fixture), not the
total gradient of a value the program also reads elsewhere (which the value's own
probe keeps, as `jax.grad` of the whole function says); a nested field by its schema
path; inside a `jit` and per iteration of a `scan`; in mode all too; none in modes
primal and jvp. And
a small program's Tesseract line computing its input in the call (`{"x": x**2 + 1}`)
draws that arithmetic as one box `<stage> inputs`, not loose `integer_pow`, `add`.

Gaps: the panel's table (‖Tesseract VJP‖₂ beside ‖total‖₂) is not built; a field the
call gets as a literal, or a non-differentiable one, has no probe."""

from __future__ import annotations

import pathlib

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


def _load(name: str) -> Tesseract:
    return Tesseract.from_tesseract_api(TESS / name / "tesseract_api.py")


@pytest.fixture(scope="module")
def scale():
    return _load("scale")  # y = a * x + b


def _stats(v) -> dict:
    v = np.asarray(v, np.float64)
    return {"l2": np.linalg.norm(v), "mean": v.mean(), "min": v.min(), "max": v.max()}


def _check(summary: dict, want) -> None:
    for key, value in _stats(want).items():
        np.testing.assert_allclose(summary[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def _shared_loss(tess):
    # `x` feeds the Tesseract and a regulariser; `a` the Tesseract and a penalty
    def loss(x, a):
        y = apply_tesseract(tess, {"x": x, "a": a, "b": jnp.float32(0.5)})["y"]
        return jnp.sum(y**2) + 0.1 * jnp.sum(x**3) + 0.3 * a**2

    return loss


def test_each_input_fields_cotangent_is_the_tesseracts_own_vjp(scale):
    loss = _shared_loss(scale)
    x, a = jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32), jnp.float32(1.5)
    ins = sowviz.inspect(loss, x, a, mode="grad", argnums=(0, 1), tesseract_names={scale: "solve"})
    # the Tesseract's call alone, by `jax.vjp`, seeded with dL/dy = 2 y
    call = lambda x, a: apply_tesseract(scale, {"x": x, "a": a, "b": jnp.float32(0.5)})["y"]  # noqa: E731
    y, pull = jax.vjp(call, x, a)
    vjp_x, vjp_a = pull(2.0 * y)
    # ... and as the fixture's closed form says (y = a x + b)
    y_np = 1.5 * np.asarray(x, np.float64) + 0.5
    np.testing.assert_allclose(vjp_x, 1.5 * 2 * y_np, rtol=1e-5)
    np.testing.assert_allclose(vjp_a, np.sum(np.asarray(x) * 2 * y_np), rtol=1e-5)
    px, pa = ins.probe("solve", input="x"), ins.probe("solve", input="a")
    assert px.leaf == "['x (input)']" and pa.leaf == "['a (input)']"
    assert px.node == pa.node == ins.probe("solve", "y").node
    # the stage's name alone is still its one output, not ambiguous with its inputs
    assert ins.probe("solve").leaf == "['y']"
    _check(px.summaries["cotangent"], vjp_x)
    _check(pa.summaries["cotangent"], vjp_a)
    _check(px.summaries["primal"], x)  # the value the call got
    # the total gradient stays on the value's own probe, and differs: the regulariser
    gx, ga = jax.grad(loss, argnums=(0, 1))(x, a)
    _check(ins.probe("x").summaries["cotangent"], gx)
    _check(ins.probe("a").summaries["cotangent"], ga)
    assert not np.isclose(px.summaries["cotangent"]["l2"], float(jnp.linalg.norm(gx)), rtol=1e-3)
    assert not np.isclose(pa.summaries["cotangent"]["mean"], float(ga), rtol=1e-3)
    # the mode's result is the plain gradient, unchanged by the copies the probes read
    np.testing.assert_allclose(ins.result[1][0], gx, rtol=1e-6)
    # the stage's panel opens on its output, its inputs after
    leaves = [p.leaf for p in ins.probes if p.node == px.node]
    assert leaves == ["['y']", "['a (input)']", "['x (input)']"]
    # and the model carries them as probes of the stage
    d = ins.to_dict()
    assert {p["leaf"] for p in d["probes"] if p["node"] == px.node} == set(leaves)
    # its fields are named by what feeds them, a differentiated argument too (`x`), for
    # the panel's table of each field's VJP beside the value's total
    (stage,) = [n for n in d["nodes"] if n["id"] == px.node]
    by_id = {n["id"]: n for n in d["nodes"]}
    assert {by_id[m]["label"]: f for m, f in stage["port_names"].items()} == {"x": "x", "a": "a"}


def test_a_nested_field_is_named_by_its_schema_path():
    static = _load("scale_static")  # y = scale.a * x ** power + shift

    def loss(theta, x):
        k = 0.1 + jax.nn.softplus(theta)
        inputs = {"x": x, "scale": {"a": k}, "shift": k * 0.5, "solver": "dense", "power": 2}
        y = apply_tesseract(static, inputs)["y"]
        return jnp.mean(y**2) + 0.01 * k

    theta, x = jnp.float32(0.3), jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32)
    ins = sowviz.inspect(loss, theta, x, mode="grad", tesseract_names={static: "T"})
    k = 0.1 + jax.nn.softplus(theta)

    def call(a, shift):
        inputs = {"x": x, "scale": {"a": a}, "shift": shift, "solver": "dense", "power": 2}
        return apply_tesseract(static, inputs)["y"]

    y, pull = jax.vjp(call, k, k * 0.5)
    d_a, d_shift = pull(2.0 * y / y.size)
    _check(ins.probe("T", input="scale.a").summaries["cotangent"], d_a)
    _check(ins.probe("T", input="shift").summaries["cotangent"], d_shift)
    # (the closed form: d/da = sum(x^2 * dy), d/dshift = sum(dy))
    dy = 2.0 * np.asarray(y, np.float64) / y.size
    np.testing.assert_allclose(float(d_a), np.sum(np.asarray(x, np.float64) ** 2 * dy), rtol=1e-5)
    np.testing.assert_allclose(float(d_shift), np.sum(dy), rtol=1e-5)
    # `x` is not differentiated here (argument 1): its value, no cotangent
    assert "cotangent" not in ins.probe("T", input="x").summaries
    # a field not probed: the error lists those that are
    with pytest.raises(KeyError, match=r"no input field 'power' probed; it has 'scale\.a', "):
        ins.probe("T", input="power")
    with pytest.raises(TypeError, match="without `leaf`"):
        ins.probe("T", "['y']", input="x")


@pytest.mark.parametrize("mode", ["primal", "jvp"])
def test_no_input_probe_where_no_cotangent_is_computed(scale, mode):
    loss = _shared_loss(scale)
    x, a = jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32), jnp.float32(1.5)
    ins = sowviz.inspect(loss, x, a, mode=mode, tesseract_names={scale: "solve"})
    node = ins.probe("solve", "y").node
    assert [p.leaf for p in ins.probes if p.node == node] == ["['y']"]
    with pytest.raises(KeyError, match=rf"in mode '{mode}': .* modes 'grad', 'vjp' and 'all'"):
        ins.probe("solve", input="x")


def test_vjp_mode_probes_the_fields_with_its_cotangent(scale):
    loss = _shared_loss(scale)
    x, a = jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32), jnp.float32(1.5)
    ins = sowviz.inspect(loss, x, a, mode="vjp", tesseract_names={scale: "solve"})
    seed = ins.probe("solve", "y").summaries["cotangent"]
    call = lambda x: apply_tesseract(scale, {"x": x, "a": a, "b": jnp.float32(0.5)})["y"]  # noqa: E731
    y = call(x)
    # the seed dL/dy of the output is 2 y times the mode's output cotangent (a scalar)
    ct = seed["mean"] / float(jnp.mean(2.0 * y))
    (want,) = jax.vjp(call, x)[1](2.0 * y * ct)
    _check(ins.probe("solve", input="x").summaries["cotangent"], want)


def test_inside_a_jit_and_per_iteration_of_a_scan(scale):
    @jax.jit
    def inner(x):
        return apply_tesseract(
            scale, {"x": jnp.sin(x), "a": jnp.float32(2.0), "b": jnp.float32(0.5)}
        )["y"]

    def loss(x):
        def body(c, _):
            y = apply_tesseract(scale, {"x": c, "a": jnp.float32(0.5), "b": jnp.float32(0.1)})["y"]
            return y, jnp.sum(y)

        c, s = jax.lax.scan(body, x, None, length=3)
        return jnp.sum(inner(x) ** 2) + jnp.sum(c) + jnp.sum(s)

    x = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)
    ins = sowviz.inspect(loss, x, mode="grad", tesseract_names={scale: "solve"})
    got = {ins.probe_path(p): p for p in ins.probes if p.leaf == "['x (input)']"}
    assert sorted(got) == ["inner/solve", "scan(body)/solve"]
    # in the jit: a = 2, dL/dy = 2 y
    y = 2.0 * jnp.sin(x) + 0.5
    _check(got["inner/solve"].summaries["cotangent"], 2.0 * 2.0 * y)
    # in the scan, one row per iteration t: dL/dc_t = a dL/dy_t with a = 0.5, where
    # dL/dy_2 = 2 (the final carry's sum and its own) and dL/dy_t = dL/dc_{t+1} + 1
    rows, dy = [], 2.0 * np.ones(4)
    for _ in range(3):
        rows.append(0.5 * dy)
        dy = 0.5 * dy + 1.0
    want = np.stack(rows[::-1])
    summary = got["scan(body)/solve"].summaries["cotangent"]
    assert summary["shape"] == [3, 4]
    _check(summary, want)


def test_a_small_programs_tesseract_line_draws_its_input_arithmetic_as_one_box(scale):
    def loss(x):
        y = apply_tesseract(scale, {"x": x**2 + 1, "a": jnp.float32(2.0), "b": jnp.float32(0.5)})[
            "y"
        ]
        return jnp.sum(y**2) + 0.1 * jnp.sum(x**2)

    x = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)
    ins = sowviz.inspect(loss, x, mode="grad", tesseract_names={scale: "solve"})
    np.testing.assert_allclose(ins.result[1], jax.grad(loss)(x), rtol=1e-6)
    d = ins.to_dict()
    by_id = {n["id"]: n for n in d["nodes"]}
    top = [n for n in d["nodes"] if n["parent"] == d["root"]]
    labels = [n["label"] for n in top]
    # one box before the stage, holding the line's `integer_pow` and `add`
    assert labels[labels.index("solve") - 1] == "solve inputs", labels
    (box,) = [n for n in top if n["label"] == "solve inputs"]
    inside = [n for n in d["nodes"] if n["parent"] == box["id"]]
    assert sorted(n["primitive"] for n in inside) == ["add", "integer_pow"]
    # the top level has the program's other lines loose: 2 `integer_pow`, not 3
    loose = [n["primitive"] for n in top if n["kind"] == "eqn"]
    assert loose.count("integer_pow") == 2 and loose.count("add") == 1, loose
    assert by_id[box["parent"]]["id"] == d["root"]
    # the box's value is the field's; only the Tesseract reads it: its cotangent is the VJP
    u = x**2 + 1
    y = 2.0 * u + 0.5
    _check(ins.probe("solve inputs").summaries["primal"], u)
    _check(ins.probe("solve inputs").summaries["cotangent"], 2.0 * 2.0 * y)
    _check(ins.probe("solve", input="x").summaries["cotangent"], 2.0 * 2.0 * y)


def test_mode_all_probes_the_fields_too(scale):
    loss = _shared_loss(scale)
    x, a = jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32), jnp.float32(1.5)
    ins = sowviz.inspect(loss, x, a, mode="all", tesseract_names={scale: "solve"})
    call = lambda x: apply_tesseract(scale, {"x": x, "a": a, "b": jnp.float32(0.5)})["y"]  # noqa: E731
    y, pull = jax.vjp(call, x)
    (want,) = pull(2.0 * y)
    got = ins.probe("solve", input="x").summaries
    _check(got["cotangent"], want)
    _check(got["primal"], x)
    # its tangent is the input's own: a copy carries the tangent unchanged
    tangent = ins.probe("x").summaries["tangent"]
    for key in ("l2", "mean", "min", "max"):
        assert got["tangent"][key] == pytest.approx(tangent[key], rel=1e-6), key


@pytest.mark.browser
def test_the_panel_shows_the_vjp_beside_the_total(page, tmp_path, scale):
    loss = _shared_loss(scale)
    x, a = jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32), jnp.float32(1.5)
    ins = sowviz.inspect(loss, x, a, mode="grad", tesseract_names={scale: "solve"})
    node = ins.probe("solve").node
    pg = page.open_report(ins.save_html(tmp_path / "t.html"))
    pg.locator(f'[data-node-id="{node}"]').click()
    table = pg.locator('[data-role="detail"] [data-role="tesseract-vjp"]')
    table.wait_for(state="visible")
    row = table.locator('tr[data-field="x"] td').all_inner_texts()
    assert row[:2] == ["x", "x"]
    vjp, total = (float(v) for v in row[2:])
    call = lambda x: apply_tesseract(scale, {"x": x, "a": a, "b": jnp.float32(0.5)})["y"]  # noqa: E731
    y, pull = jax.vjp(call, x)
    assert vjp == pytest.approx(float(jnp.linalg.norm(pull(2.0 * y)[0])), rel=1e-3)
    assert total == pytest.approx(float(jnp.linalg.norm(jax.grad(loss)(x, a))), rel=1e-3)
    # `a` is not differentiated (argument 0 only): no row
    assert table.locator('tr[data-field="a"]').count() == 0
    # the stage's face is its output's, not named among its inputs
    face = pg.locator(f'[data-node-id="{node}"]').text_content()
    # (an input among its outputs, the face named the one it shows: `y ‖grad‖₂ = …`)
    assert "‖grad‖₂ = " in face and "y ‖grad‖₂" not in face and "input" not in face, face
    assert page.errors == []
