"""Round 21: a diffrax solve that reads well.

A neural ODE as diffrax's example writes it (`diffeqsolve(..., t0=ts[0], t1=ts[-1],
dt0=ts[1] - ts[0], saveat=SaveAt(ts=ts))`, an Equinox MLP vector field):

- the time arguments' indexing (`slice`, `squeeze`: no integer work) was drawn as
  loose equation boxes beside the solve; each argument's line is now one box, named
  by what it computes (`ts[0]`), carrying that value;
- a healthy solve writes every row of the +Inf output buffer diffrax allocates: its
  record says the fill was written over inside the loop (`overwritten`) and the view
  draws no banner; a solve that stopped early (`throw=False` past `max_steps`) hands
  its unwritten +Inf rows on, and is still reported (alarm when they reach the
  result, the quiet "Only +Inf fill values" banner when the user masks them);
- the captured values are plain JAX's: the loss and gradient (Equinox's
  `filter_value_and_grad`), the solution (the plain solve's `ys`) and its cotangent
  (`2 (ys - yi) / ys.size`, computed apart).

Gaps left: the vector field runs inside the adjoint's `custom_vjp`, so its stage
carries no cotangent (the round-19 `custom_rule` record says why; asserted here);
the vector field still sits deep in Equinox's and diffrax's wrappers (no
single-child-wrapper elision this round).
"""

from __future__ import annotations

import inspect
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

diffrax = pytest.importorskip("diffrax")
eqx = pytest.importorskip("equinox")

ARTIFACTS = pathlib.Path(__file__).resolve().parents[1] / "artifacts"


class Func(eqx.Module):
    mlp: eqx.nn.MLP

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(2, 2, 8, depth=1, activation=jax.nn.softplus, key=key)

    def __call__(self, t, y, args):
        return jnp.tanh(self.mlp(y))


class NeuralODE(eqx.Module):
    func: Func

    def __call__(self, ts, y0):
        solution = diffrax.diffeqsolve(
            diffrax.ODETerm(self.func),
            diffrax.Tsit5(),
            t0=ts[0],
            t1=ts[-1],
            dt0=ts[1] - ts[0],
            y0=y0,
            stepsize_controller=diffrax.PIDController(rtol=1e-3, atol=1e-6),
            saveat=diffrax.SaveAt(ts=ts),
            adjoint=diffrax.RecursiveCheckpointAdjoint(),
        )
        return solution.ys


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    (at,) = [k for k, line in enumerate(lines) if text in line]
    return first + at


def ode_loss(model, ts, y0, yi):
    return jnp.mean((model(ts, y0) - yi) ** 2)


TS = jnp.linspace(0.0, 1.0, 6)
Y0 = jnp.array([1.0, 0.5])
YI = jnp.ones((6, 2))


@pytest.fixture(scope="module")
def solved():
    model = NeuralODE(Func(jax.random.PRNGKey(0)))
    return model, sowviz.inspect(ode_loss, model, TS, Y0, YI, mode="grad")


def _nodes(ins):
    d = ins.to_dict()
    return d, {n["id"]: n for n in d["nodes"]}


def _probe_of(d, node_id, shape=None):
    found = [p for p in d["probes"] if p["node"] == node_id]
    if shape is not None:  # (a stage of several outputs: the one of this shape)
        found = [p for p in found if list(p["summaries"]["primal"]["shape"]) == shape]
    assert len(found) == 1, found
    return found[0]


def test_the_solves_time_arguments_are_boxes_of_their_lines(solved):
    _, ins = solved
    d, _ = _nodes(ins)
    (ode,) = [n for n in d["nodes"] if n["label"] == "NeuralODE"]
    kids = [n for n in d["nodes"] if n["parent"] == ode["id"]]
    # no loose equation beside the solve (they were `slice`, `squeeze` per argument,
    # and `slice`, `squeeze`, `slice`, `squeeze`, `sub` for `dt0`)
    assert [k["label"] for k in kids if k["kind"] == "eqn"] == [], [k["label"] for k in kids]
    top = [n for n in d["nodes"] if n["parent"] == d["root"]]
    indexing = {"slice", "squeeze", "dynamic_slice", "gather"}
    assert not [n for n in top if n["kind"] == "eqn" and n["primitive"] in indexing]
    boxes = {k["label"]: k for k in kids if k["kind"] == "scope"}
    want = {
        "ts[0]": (TS[0], "t0=ts[0]"),
        "ts[-1]": (TS[-1], "t1=ts[-1]"),
        "ts[1] - ts[0]": (TS[1] - TS[0], "dt0=ts[1] - ts[0]"),
    }
    assert set(want) <= set(boxes), sorted(boxes)
    for label, (value, text) in want.items():
        box = boxes[label]
        assert box["source"]["line"] == _line_of(NeuralODE.__call__, text), box
        # its equations inside it, and its value on it
        inside = {n["primitive"] for n in d["nodes"] if n["parent"] == box["id"]}
        assert inside and inside <= indexing | {"sub"}, inside
        primal = _probe_of(d, box["id"])["summaries"]["primal"]
        np.testing.assert_allclose(primal["mean"], float(value), rtol=1e-6)
    # the solve is still its own stage, after them
    assert any(k["kind"] == "jit" and k["label"] == "diffeqsolve" for k in kids)


def test_captured_values_are_plain_jaxs(solved):
    model, ins = solved
    value, grads = eqx.filter_value_and_grad(ode_loss)(model, TS, Y0, YI)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-5)
    want_w = np.asarray(grads.func.mlp.layers[0].weight)
    np.testing.assert_allclose(
        np.asarray(ins.result[1].func.mlp.layers[0].weight), want_w, rtol=1e-4, atol=1e-7
    )
    # the solution: the plain solve's ys, and the cotangent the mean-square loss sends it
    ys = np.asarray(eqx.filter_jit(model)(TS, Y0), np.float64)
    cot = 2.0 * (ys - np.asarray(YI, np.float64)) / ys.size
    d, _ = _nodes(ins)
    (solve,) = [n for n in d["nodes"] if n["label"] == "diffeqsolve"]
    s = _probe_of(d, solve["id"], shape=[6, 2])["summaries"]
    np.testing.assert_allclose(s["primal"]["l2"], np.linalg.norm(ys), rtol=1e-4)
    np.testing.assert_allclose(s["primal"]["mean"], ys.mean(), rtol=1e-4)
    np.testing.assert_allclose(s["cotangent"]["l2"], np.linalg.norm(cot), rtol=1e-4)
    np.testing.assert_allclose(s["cotangent"]["mean"], cot.mean(), rtol=1e-4, atol=1e-7)
    # the first layer's weight: its gradient is Equinox's
    got = ins.probe("func.mlp.layers[0].weight").summaries["cotangent"]
    np.testing.assert_allclose(got["l2"], np.linalg.norm(want_w), rtol=1e-4)
    # (gap) the vector field, run inside the adjoint's custom_vjp, carries no cotangent
    (vf,) = [n["id"] for n in d["nodes"] if n["label"].startswith("vector_field")]
    p = _probe_of(d, vf)
    assert "cotangent" not in p["summaries"] and p["no_cotangent"] == "custom_rule"


def test_a_healthy_solve_has_nothing_to_say_of_its_fill(solved):
    _, ins = solved
    o = ins.nonfinite
    # still recorded, as the library's fill (drawn quietly where it is held) ...
    assert o.forward is None and o.backward is None and not o.alarm, o.message
    assert o.expected and "fill values, first made by `_allocate_output`" in o.message
    # ... every row written over inside the loop: no banner
    assert o.overwritten
    assert ins.to_dict()["nonfinite"]["overwritten"] is True


# -- a solve that stopped early: its unwritten rows are +Inf ------------------------------

SAVE = jnp.linspace(0.0, 10.0, 5)


def early(y0, k):
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, a: -a * y),
        diffrax.Tsit5(),
        0.0,
        10.0,
        0.01,
        y0,
        args=k,
        saveat=diffrax.SaveAt(ts=SAVE),
        max_steps=16,
        throw=False,
    )
    return sol.ys


def early_sum(y0, k):
    return jnp.sum(early(y0, k))


def early_masked(y0, k):
    ys = early(y0, k)
    return jnp.sum(jnp.where(jnp.isfinite(ys), ys, 0.0))


ARGS = (jnp.array([1.0, 2.0]), jnp.array(0.5))


def test_a_solve_that_stopped_early_still_says_so():
    ys = np.asarray(jax.jit(early)(*ARGS))
    assert np.isinf(ys[1:]).all() and np.isfinite(ys[0]).all()  # stopped: rows 1.. unwritten
    ins = sowviz.inspect(early_sum, *ARGS, mode="grad")
    value, grad = jax.value_and_grad(early_sum)(*ARGS)
    assert np.isinf(ins.result[0]) and np.isinf(value)
    np.testing.assert_array_equal(np.asarray(ins.result[1]), np.asarray(grad))
    o = ins.nonfinite
    assert o.alarm and not o.overwritten, o.message
    assert o.forward is not None and "_allocate_output" in o.forward.message
    assert ins.to_dict()["nonfinite"]["overwritten"] is False


def test_an_early_stop_the_user_masks_keeps_its_quiet_notice():
    ins = sowviz.inspect(early_masked, *ARGS, mode="grad")
    value, grad = jax.value_and_grad(early_masked)(*ARGS)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-6)
    o = ins.nonfinite
    assert not o.alarm and o.removed and not o.overwritten, o.message
    assert o.message.startswith("Only +Inf fill values, first made by `_allocate_output`")


@pytest.mark.browser
def test_the_report_draws_no_banner_for_a_healthy_solve(page, solved, tmp_path):
    _, ins = solved
    pg = page.open_report(ins.save_html(tmp_path / "healthy.html"))
    banner = pg.locator('[data-role="nonfinite-banner"]')
    assert banner.is_hidden(), banner.inner_text()
    assert "fill values" not in pg.locator("body").inner_text()
    # the stages holding the fill are still drawn in the muted colour, not as an alarm
    assert pg.locator("[data-nonfinite-quiet]").count() == 1
    assert pg.locator(".sv-origin-flag").count() == 0
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "round21_diffrax_healthy.png"))
    # an early stop the user masks: the quiet banner, as before
    masked = sowviz.inspect(early_masked, *ARGS, mode="grad")
    pg = page.open_report(masked.save_html(tmp_path / "masked.html"))
    banner = pg.locator('[data-role="nonfinite-banner"]')
    assert banner.is_visible()
    assert "Only +Inf fill values" in banner.inner_text(), banner.inner_text()
    assert page.errors == []


def test_a_loop_on_an_indexing_line_stays_a_stage_beside_the_index_box():
    """A line holding a stage gets no index box: a `scan` on the same line
    (`lax.scan(step, xs[0], xs)`) was swallowed into a closed box named by the line's
    assignment, hiding the loop from the first view (and a sow's line,
    `scale = sow(jnp.exp(x[1]), "scale")`, made a box `scale` that took the sow's name:
    tests/test_capture.py)."""

    def f(xs):
        c, ys = jax.lax.scan(lambda c, x: (jnp.tanh(c + x), jnp.tanh(c + x) * 2.0), xs[0], xs)
        return jnp.sum(c**2) + jnp.mean(ys**2)

    xs = jnp.linspace(-1.0, 1.0, 6 * 4).reshape(6, 4)
    ins = sowviz.inspect(f, xs, mode="grad")
    model = ins.to_dict()
    by_id = {n["id"]: n for n in model["nodes"]}
    root = next(n for n in model["nodes"] if n.get("parent") is None)
    (scan,) = [n for n in model["nodes"] if n["kind"] == "scan"]
    assert scan["parent"] == root["id"], by_id[scan["parent"]]["label"]
    # the index's equations are not boxed with the loop (on such a line they stay loose,
    # as before the index box: a box would take the line's name, `c, ys`)
    index = [n for n in model["nodes"] if n["label"] in ("slice", "squeeze")]
    assert len(index) == 2 and all(n["parent"] == root["id"] for n in index), index
    value, grad = ins.result
    want_value, want_grad = jax.value_and_grad(f)(xs)
    np.testing.assert_allclose(float(value), float(want_value), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-5, atol=1e-7)
