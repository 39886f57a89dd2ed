"""Round 19: statistics of values with no finite element, and sowviz's own errors.

An all-NaN gradient showed ‖grad‖₂ = 0 (the l2 of an empty sum) where every other
statistic over the finite values was null: its norm is now null in the JSON, "—" marked
as NaN/Inf in the widget and report, a gap in the Monitor's charts and NaN in the
TensorBoard/W&B scalars. A refused overwrite no longer ends with JAX's "JAX has removed
its internal frames" note, and joining two run logs that both begin at step 0 says how
to load them apart or resume with `start_step=`.
"""

from __future__ import annotations

import math
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import sowviz
from sowviz.runlog import naming
from sowviz.summary import summarize
from sowviz.summary_data import stack_rows

FINITE_STATS = ("min", "max", "mean", "std", "l2", "absmax")
NAN, INF = float("nan"), float("inf")


def _numpy_stats(v: np.ndarray) -> dict:
    """The summary's statistics of `v`, by NumPy (float64; None with no finite value)."""
    v = np.asarray(v, np.float64).ravel()
    fin = v[np.isfinite(v)]
    out = {
        "count": fin.size,
        "nan": int(np.isnan(v).sum()),
        "posinf": int(np.isposinf(v).sum()),
        "neginf": int(np.isneginf(v).sum()),
        "zeros": int((v == 0).sum()),
    }
    if fin.size == 0:
        return out | dict.fromkeys(FINITE_STATS)
    return out | {
        "min": fin.min(),
        "max": fin.max(),
        "mean": fin.mean(),
        "std": fin.std(),
        "l2": np.linalg.norm(fin),
        "absmax": np.abs(fin).max(),
    }


def _assert_stats(got: dict, v: np.ndarray) -> None:
    want = _numpy_stats(v)
    for k, w in want.items():
        if w is None:
            assert got[k] is None, (k, got[k])
        elif isinstance(w, int):
            assert got[k] == w, (k, got[k], w)
        else:
            np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=1e-30, err_msg=k)


CASES = {
    "all NaN": np.full((4, 3), NAN),
    "all +Inf and -Inf": np.array([INF, -INF, INF]),
    "NaN and Inf": np.array([[INF, NAN], [NAN, -INF]]),
    "empty": np.zeros((0, 4)),
    "finite, NaN and Inf": np.array([1.0, NAN, -2.0, INF, 3.0, 0.0]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_summary_of_no_finite_value_has_no_norm(name):
    v = CASES[name]
    got = summarize(jnp.asarray(v, jnp.float32), bins=4).to_json()
    _assert_stats(got, v)
    fin = v[np.isfinite(v)]
    # the histogram holds the finite values only: none, or np.histogram's counts
    want_hist = np.histogram(fin, bins=got["hist"]["edges"])[0] if fin.size else [0] * 4
    assert got["hist"]["counts"] == list(want_hist)
    assert sum(got["loghist"]["counts"]) + got["loghist"]["under"] == int((fin != 0).sum())


def test_stacked_rows_and_iterations_give_no_norm_to_a_row_of_no_finite_value():
    rows = np.array([[NAN, NAN, NAN], [1.0, -2.0, 2.0], [INF, NAN, -INF]], np.float32)
    stack = jax.device_get(jax.vmap(lambda r: summarize(r, bins=4))(jnp.asarray(rows)))
    got = stack_rows(stack)
    for j, row in enumerate(rows):
        _assert_stats(got.stats(j), row)  # what a Monitor's history keeps of a step
        _assert_stats(got.member(j, _RowShape(row)), row)  # what `inspect` puts in the model

    # a scan whose second iteration is all NaN: its per-iteration l2 is null, the
    # others' the norm of their row
    def fn(x, ws):
        def body(c, w):
            c = sowviz.sow(jnp.log(c * w), "c")
            return c, None

        c, _ = jax.lax.scan(body, x, ws)
        return jnp.sum(c)

    x, ws = jnp.full((3,), 4.0), jnp.array([1.0, -1.0, 2.0])
    ins = sowviz.inspect(fn, x, ws, mode="primal")
    per = ins.probe("c").summaries["primal"]["per_iteration"]
    c, want = np.full(3, 4.0), []
    for w in [1.0, -1.0, 2.0]:
        with np.errstate(invalid="ignore"):
            c = np.log(c * w)
        want.append(c)
    assert per["count"] == [int(np.isfinite(r).sum()) for r in want] == [3, 0, 0]
    np.testing.assert_allclose(per["l2"][0], np.linalg.norm(want[0]), rtol=1e-5)
    assert per["l2"][1:] == [None, None]
    assert per["mean"][1:] == [None, None]


class _RowShape:
    """What `StackRows.member` reads of the row's summary: its static fields."""

    def __init__(self, row: np.ndarray):
        self.shape, self.size = tuple(row.shape), row.size
        self.dtype, self.is_complex = "float32", False


# -- a real program: Flax NNX + optax, a parameter whose gradient is all NaN ---------


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(4, 8, rngs=rngs)
        self.scale = nnx.Param(jnp.ones((3,)))

    def __call__(self, x, sign):
        # `sign = -1`: the log of a negative number, NaN, and so the scale's gradient
        h = jax.nn.relu(self.l1(x))
        return h.sum(-1) + jnp.log(self.scale[...] * sign).sum()


def loss_fn(model, x, sign):
    return jnp.mean(model(x, sign) ** 2)


def _data():
    # every row alike: the units ReLU shuts are shut for all of them, so at a NaN step
    # `l1`'s gradients are NaN where a unit is open and 0 where it is shut (mixed), and
    # the scale's all NaN
    return jnp.ones((5, 4)), jnp.float32(-1.0)


def _leaf_grads(model, x, sign):
    """The gradient of every parameter leaf by plain JAX, named `l1.kernel`, `scale`."""
    g = nnx.grad(loss_fn)(model, x, sign)
    return {
        ".".join(str(k) for k in path): np.asarray(v)
        for path, v in nnx.to_flat_state(nnx.state(g, nnx.Param))
    }


def test_inspect_of_an_all_nan_gradient_gives_its_norm_as_null():
    model = Net(nnx.Rngs(0))
    x, sign = _data()
    want = _leaf_grads(model, x, sign)
    assert np.isnan(want["scale"]).all()
    for name in ("l1.kernel", "l1.bias"):  # the mixed case: some NaN, some 0
        assert 0 < np.isnan(want[name]).sum() < want[name].size
        assert (want[name][np.isfinite(want[name])] == 0).all()
    ins = sowviz.inspect(loss_fn, model, x, sign, mode="grad")
    for name, g in want.items():
        _assert_stats(ins.probe(name).summaries["cotangent"], g)
    got = ins.probe("scale").summaries["cotangent"]
    assert got["l2"] is None and got["nan"] == 3  # was 0.0
    # every summary of no finite value in the model (the stages' too) says null
    none = [
        s
        for p in ins.to_dict()["probes"]
        for s in p["summaries"].values()
        if isinstance(s, dict) and s.get("count") == 0
    ]
    assert len(none) > 5 and all(s["l2"] is None for s in none)


def _monitor_run():
    """Six optax steps; at step 3 the batch's sign is -1 (NaN loss and gradients)."""
    model = Net(nnx.Rngs(1))
    optimizer = nnx.Optimizer(model, optax.sgd(1e-3), wrt=nnx.Param)
    x, _ = _data()
    mon = sowviz.Monitor(loss_fn, mode="grad")
    plain = []
    for step in range(6):
        sign = jnp.float32(-1.0 if step == 3 else 1.0)
        plain.append(_leaf_grads(model, x, sign))
        _loss, grads = mon.step(model, x, sign)
        if step != 3:  # a NaN step's update is skipped, as a training loop would
            optimizer.update(model, grads)
    return mon, plain


def test_a_monitor_s_history_and_run_log_scalars_give_no_norm_to_a_nan_step():
    mon, plain = _monitor_run()
    entries = list(mon.history)
    assert [e["step"] for e in entries] == list(range(6))
    model = mon.to_dict()
    tags = naming.probe_tags(model)
    for name in ("scale", "l1.kernel", "l1.bias"):
        pid = _probe_id(model, name)
        for e, g in zip(entries, plain, strict=True):
            s = e["probes"][pid]["cotangent"]
            _assert_stats(s, g[name])
            scalars = {
                i.tag: i.value
                for i in naming.items(e, tags)
                if isinstance(i, naming.Scalar) and i.tag.startswith(tags[pid] + "/")
            }
            l2 = scalars[f"{tags[pid]}/cotangent/l2"]
            if np.isfinite(g[name]).all():
                np.testing.assert_allclose(l2, np.linalg.norm(g[name]), rtol=1e-5)
            else:  # a gradient with NaN has no norm: NaN for TensorBoard, never 0
                assert math.isnan(l2), (name, e["step"], l2)
            bad = int((~np.isfinite(g[name])).sum())
            assert scalars[f"{tags[pid]}/cotangent/nonfinite"] == bad
    # the step 3 gradient of `scale` is all NaN: null in the history, not 0.0
    assert entries[3]["probes"][_probe_id(model, "scale")]["cotangent"]["l2"] is None


def test_run_log_scalars_of_an_older_log_s_zero_norm_over_no_value_are_nan():
    tags = {"p0": "scale"}
    old = {"step": 3, "probes": {"p0": {"cotangent": {"count": 0, "nan": 3, "l2": 0.0}}}}
    new = {"step": 3, "probes": {"p0": {"cotangent": {"count": 0, "nan": 3, "l2": None}}}}
    empty = {"step": 3, "probes": {"p0": {"cotangent": {"count": 0, "nan": 0, "l2": None}}}}
    for entry in (old, new):
        (l2,) = [i.value for i in naming.items(entry, tags) if i.tag == "scale/cotangent/l2"]
        assert math.isnan(l2)
    # values of no size: no norm to write, and no NaN either (nothing went wrong)
    assert [i.tag for i in naming.items(empty, tags)] == ["scale/cotangent/nonfinite"]


def _probe_id(model: dict, name: str) -> str:
    """The probe of the parameter leaf `name` (`l1.kernel`), as the parameter table
    names it (its node's label under the parameter group)."""
    nodes = {n["id"]: n for n in model["nodes"]}

    def path(n):
        parts = []
        while n is not None and n.get("parent") is not None:
            parts.append(n["label"])
            n = nodes.get(n["parent"])
        return list(reversed(parts))

    hits = [
        p["id"]
        for p in model["probes"]
        if "cotangent" in p["summaries"]
        and (lambda ps: ps[:1] == ["parameters"] and ".".join(ps[1:]) == name)(
            path(nodes[p["node"]])
        )
    ]
    assert len(hits) == 1, (name, hits)
    return hits[0]


# -- the widget and report, in a real browser ----------------------------------------


@pytest.mark.browser
def test_the_report_shows_no_norm_as_a_marked_dash_and_the_chart_a_gap(page, tmp_path):
    model = Net(nnx.Rngs(0))
    x, sign = _data()
    want = _leaf_grads(model, x, sign)
    ins = sowviz.inspect(loss_fn, model, x, sign, mode="grad")
    d = ins.to_dict()
    pg = page.open_report(ins.save_html(tmp_path / "nan.html"))
    group = next(n for n in d["nodes"] if n["label"] == "parameters")
    pg.locator(f'[data-node-id="{group["id"]}"]').first.click()
    pg.locator('[data-role="param-table"]').first.wait_for()
    cells = pg.evaluate(
        """Array.from(document.querySelectorAll('[data-role=param-table] tbody tr')).map(r => ({
             name: r.cells[0].innerText.replace(/[\\s\\u200b]+/g, ''), grad: r.cells[3].innerText,
             ratio: r.cells[4].innerText, marked: r.cells[3].dataset.nonfinite === 'true',
             title: r.cells[3].title }))"""
    )
    rows = {c["name"]: c for c in cells}
    assert set(rows) == set(want)
    for name, g in want.items():
        r = rows[name]
        fin = g[np.isfinite(g)]
        assert r["marked"] == (fin.size < g.size), name
        if fin.size == 0:  # all NaN: "—", marked, never 0 nor "NaN" as a number
            assert r["grad"] == "—" and f"no finite value ({g.size} NaN)" in r["title"]
        elif fin.size < g.size:  # the norm of its finite values, said so; no ratio
            assert float(r["grad"]) == pytest.approx(np.linalg.norm(fin), rel=1e-3, abs=1e-6)
            assert r["ratio"] == "—" and "the norm of the finite values" in r["title"]
        else:
            assert float(r["grad"]) == pytest.approx(np.linalg.norm(g), rel=1e-3)

    # a stage whose values are all NaN: every statistic over the finite values is a
    # marked "—" in its table (the l2 row was "—" only by a special case, unmarked)
    log = next(n for n in d["nodes"] if n["label"] == "log")
    pg.locator(f'[data-node-id="{log["id"]}"]').first.click()
    pg.locator('[data-role="stats"]').first.wait_for()
    table = pg.evaluate(
        """Array.from(document.querySelectorAll('[data-role=stats] tbody tr')).map(r => [
             r.dataset.stat, Array.from(r.cells).slice(1).map(c => [c.innerText, c.dataset.nonfinite === 'true'])])"""
    )
    stats = dict(table)
    for k in FINITE_STATS:
        assert stats[k] == [["—", True], ["—", True]], k
    assert stats["nan"] == [["3", False], ["3", False]]
    assert page.errors == []


@pytest.mark.browser
def test_a_monitor_report_draws_a_nan_step_as_a_gap_not_a_dip_to_zero(page, tmp_path):
    mon, plain = _monitor_run()
    model = mon.to_dict()
    pg = page.open_report(mon.save_html(tmp_path / "mon.html"))
    group = next(n for n in model["nodes"] if n["label"] == "parameters")
    pg.locator(f'[data-node-id="{group["id"]}"]').first.click()
    pg.locator('[data-role="param-grad-history"] .main-svg').first.wait_for()
    series = pg.evaluate(
        """(() => { const el = document.querySelector('[data-role=param-grad-history]');
             return el.data.filter(t => !t.yaxis).map(t => [t.name, t.y]); })()"""
    )
    got = dict(series)
    assert set(got) == {"l1.kernel", "l1.bias", "scale"}
    for name, ys in got.items():
        for step, (y, g) in enumerate(zip(ys, (p[name] for p in plain), strict=True)):
            if np.isfinite(g).all():
                assert y == pytest.approx(np.linalg.norm(g), rel=1e-5), (name, step)
            else:  # step 3: a gap, under the chart's NaN/Inf band
                assert y is None, (name, step, y)
    bad = pg.get_attribute('[data-role="param-grad-history"]', "data-nonfinite-steps")
    assert bad == "3"
    mon.close()
    assert page.errors == []


# -- sowviz's own errors read as sowviz's -------------------------------------------


def _rendered(err: BaseException) -> str:
    return "".join(traceback.format_exception(err))


def _quadratic(p, x):
    return jnp.sum((x @ p) ** 2)


def test_a_refused_overwrite_reads_as_sowviz_s_error_not_jax_s(tmp_path):
    target = tmp_path / "notes.html"
    target.write_text("my notes")
    ins = sowviz.inspect(_quadratic, jnp.ones(3), jnp.ones((2, 3)))
    with pytest.raises(FileExistsError) as got:
        ins.save_html(target)
    text = _rendered(got.value)
    assert "sowviz: will not write the report" in text
    assert "JAX has removed its internal frames" not in text
    assert not getattr(got.value, "__notes__", None)
    assert target.read_text() == "my notes"
    # the traceback still ends at the user's call: sowviz's frames stay hidden
    frames = traceback.extract_tb(got.value.__traceback__)
    assert frames[-1].filename == __file__

    with pytest.raises(FileExistsError) as got:  # a Monitor's save_html too
        with sowviz.Monitor(_quadratic) as mon:
            mon.step(jnp.ones(3), jnp.ones((2, 3)))
            mon.save_html(target)
    assert "JAX has removed" not in _rendered(got.value)


def test_a_second_writer_of_a_log_reads_as_sowviz_s_error(tmp_path):
    log = tmp_path / "runs" / "exp1"
    with sowviz.Monitor(_quadratic, log_dir=log) as first:
        first.step(jnp.ones(3), jnp.ones((2, 3)))
        with pytest.raises(FileExistsError, match="being written by another Monitor") as got:
            sowviz.Monitor(_quadratic, log_dir=log)
    text = _rendered(got.value)
    assert "JAX has removed" not in text
    # nor the lock's own error chained above it ("Resource temporarily unavailable")
    assert got.value.__cause__ is None and "BlockingIOError" not in text


def test_under_remove_frames_a_sowviz_error_has_no_jax_stack_trace_chained(tmp_path):
    target = tmp_path / "notes.html"
    target.write_text("my notes")
    ins = sowviz.inspect(_quadratic, jnp.ones(3), jnp.ones((2, 3)))
    before = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", "remove_frames")
    try:
        with pytest.raises(FileExistsError) as got:
            ins.save_html(target)
    finally:
        jax.config.update("jax_traceback_filtering", before)
    assert got.value.__cause__ is None  # (JAX had chained its UnfilteredStackTrace)
    assert "JAX-related" not in _rendered(got.value)


def test_an_error_of_the_user_s_function_keeps_jax_s_note():
    def bad(p, x):
        return jnp.sum(x @ p)  # (2, 3) @ (4, 2): a shape error raised by JAX

    with pytest.raises(TypeError) as got:
        sowviz.inspect(bad, jnp.ones((4, 2)), jnp.ones((2, 3)))
    # JAX's own error, through JAX's boundary: its note stays
    assert "JAX has removed its internal frames" in _rendered(got.value)


# -- joining two logs that both begin at step 0 --------------------------------------


def test_two_logs_both_at_step_0_are_refused_with_the_fix(tmp_path):
    a, b = tmp_path / "exp1", tmp_path / "exp2"
    for log in (a, b):
        with sowviz.Monitor(_quadratic, log_dir=log) as mon:
            mon.step(jnp.ones(3), jnp.ones((2, 3)))
    with pytest.raises(ValueError) as got:
        sowviz.load(a, b)
    msg = str(got.value)
    # the problem, the reason, and the fixes: each apart, or start_step= when resuming
    assert f"{str(a)!r} and {str(b)!r} both begin at step 0" in msg
    assert "would replace the other whole" in msg
    assert f"sowviz.load({str(b)!r})" in msg and f"python -m sowviz report {b}" in msg
    assert "start_step=" in msg and f"'{a}-resumed'" in msg
    assert "JAX has removed" not in _rendered(got.value)
    # what it says works: each loads apart, and a resumed log with start_step joins
    assert [e["step"] for e in sowviz.load(b).history] == [0]
    c = tmp_path / "exp1-resumed"
    with sowviz.Monitor(_quadratic, log_dir=c, start_step=1) as mon:
        mon.step(jnp.ones(3), jnp.ones((2, 3)))
    assert [e["step"] for e in sowviz.load(a, c).history] == [0, 1]
