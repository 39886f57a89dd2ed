"""Compile once, reuse everywhere; strict options; reproducible, atomic reports."""

from __future__ import annotations

import contextlib
import gc
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz import _program


def make_loss():
    calls = []

    def loss(w, x):
        calls.append(x.shape)
        with jax.named_scope("layer"):
            h = jnp.tanh(x @ w)
        return jnp.mean(h**2)

    return loss, calls


W = jax.random.normal(jax.random.PRNGKey(0), (4, 3))
X = jax.random.normal(jax.random.PRNGKey(1), (8, 4))


def test_repeat_inspect_reuses_the_compiled_program():
    loss, calls = make_loss()
    first = sowviz.inspect(loss, W, X)
    runner = _program.runner_for(loss, sowviz.inspection.InspectOptions())
    assert runner._instrumented._cache_size() == 1
    again = sowviz.inspect(loss, W * 2.0, X + 1.0)  # new values, like shapes
    assert len(calls) == 1 and runner._instrumented._cache_size() == 1
    ref_value, ref_grad = jax.value_and_grad(loss)(W * 2.0, X + 1.0)
    np.testing.assert_allclose(again.result[0], ref_value, rtol=1e-6)
    np.testing.assert_allclose(again.result[1], ref_grad, rtol=1e-5)
    assert first.to_dict()["nodes"] == again.to_dict()["nodes"]
    sowviz.inspect(loss, W, X[:3])  # another shape: one more trace, like jax.jit
    assert len(calls) == 3 and runner._instrumented._cache_size() == 2


@pytest.mark.parametrize("enabled", [True, False])
def test_the_garbage_collector_pauses_while_a_program_is_traced(enabled):
    # Tracing allocates objects by the hundred thousand; collections during it walked a
    # heap growing with the program. Off while tracing, then as the user had it, even
    # when the trace fails; values unchanged.
    seen = []

    def loss(w, x):
        seen.append(gc.isenabled())
        if x.shape[0] == 3:
            raise ValueError("this batch is refused")
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    (gc.enable if enabled else gc.disable)()
    try:
        out = sowviz.inspect(loss, W, X)
        assert gc.isenabled() is enabled
        with pytest.raises(ValueError, match="refused"):
            sowviz.inspect(loss, W, X[:3])
        assert gc.isenabled() is enabled
        grad, _ = sowviz.save_intermediates(jax.grad(loss))(W, X[:5])
        assert gc.isenabled() is enabled
    finally:
        gc.enable()
    assert seen and not any(seen)
    np.testing.assert_allclose(out.result[1], jax.grad(loss)(W, X), rtol=1e-5)
    np.testing.assert_allclose(grad, jax.grad(loss)(W, X[:5]), rtol=1e-5)


def test_mode_switch_traces_the_function_once():
    loss, calls = make_loss()
    w = sowviz.show(loss, W, X)
    for mode in ("jvp", "all", "grad", "jvp"):
        w.mode = mode
        assert str(w.phase) == "ready" and w.model["mode"] == mode, w.status
    assert len(calls) == 1  # one trace; each mode compiled once from it


def test_cache_is_weak_in_the_function():
    loss, _ = make_loss()
    sowviz.inspect(loss, W, X)
    key, ref = _program._fn_key(loss)
    assert key in _program._FAMILIES
    del loss
    gc.collect()
    assert ref() is None  # the cache did not keep the function (nor its programs) alive
    sowviz.inspect(make_loss()[0], W, X)  # a new family purges the dead one
    assert key not in _program._FAMILIES


# --- strict inputs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"strict": "no"}, TypeError, "`strict` must be True or False"),
        ({"title": ["l"]}, TypeError, "`title` must be a non-empty string or None"),
        ({"tesseract_names": 42}, TypeError, "`tesseract_names` must be None, a dict"),
        ({"bins": 10**8}, ValueError, "`bins` must be an int between 1 and 4096"),
        ({"bins": 2.5}, TypeError, "`bins` must be an int"),
        ({"argnums": "0"}, TypeError, "`argnums` must be an int or a non-empty tuple"),
        ({"tangents": jnp.ones(3)}, TypeError, "`tangents` must be a tuple"),
        ({"duplicates": "merge"}, ValueError, "unknown `duplicates`"),
        ({"loops": 0}, ValueError, "`loops` must be an int"),
    ],
)
def test_every_option_is_checked(kwargs, error, match):
    loss, _ = make_loss()
    with pytest.raises(error, match=match):
        sowviz.inspect(loss, W, X, **kwargs)


def test_tangent_and_cotangent_structure_errors():
    loss, _ = make_loss()
    with pytest.raises(ValueError, match="one tangent per positional argument"):
        sowviz.inspect(loss, W, X, mode="jvp", tangents=(jnp.ones_like(W),))
    with pytest.raises(ValueError, match="has shape"):
        sowviz.inspect(loss, W, X, mode="jvp", tangents=(jnp.ones(3), jnp.ones_like(X)))
    with pytest.raises(ValueError, match="`cotangents` must have the structure"):
        sowviz.inspect(loss, W, X, mode="vjp", cotangents=(jnp.ones(()), jnp.ones(())))
    # the right ones work, and new tangent values reuse the program
    t = (jnp.ones_like(W), jnp.zeros_like(X))
    got = sowviz.inspect(loss, W, X, mode="jvp", tangents=t).result[1]
    np.testing.assert_allclose(got, jax.jvp(loss, (W, X), t)[1], rtol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"stop_on_nonfinite": "no"}, TypeError, "`stop_on_nonfinite` must be True or False"),
        ({"throttle": "x"}, TypeError, "`throttle` must be a number"),
        ({"every": 0}, ValueError, "`every` must be an int"),
        ({"history": 1}, ValueError, "`history` must be an int"),
    ],
)
def test_monitor_options_are_checked(kwargs, error, match):
    loss, _ = make_loss()
    with pytest.raises(error, match=match):
        sowviz.Monitor(loss, **kwargs)


def test_monitor_step_inside_jit_is_a_clear_error():
    loss, _ = make_loss()
    mon = sowviz.Monitor(loss)
    with pytest.raises(TypeError, match=r"Monitor\.step was called on traced values"):
        jax.jit(lambda w: mon.step(w, X)[0])(W)


# --- reports ---------------------------------------------------------------------------


def test_reports_are_reproducible_byte_for_byte(tmp_path):
    loss, _ = make_loss()
    a = sowviz.inspect(loss, W, X).save_html(tmp_path / "a.html", created=None)
    b = sowviz.inspect(loss, W, X).save_html(tmp_path / "b.html", created=None)
    assert a.read_bytes() == b.read_bytes()
    pinned = sowviz.inspect(loss, W, X).to_dict(created="2026-01-01T00:00:00Z")
    assert pinned["created"] == "2026-01-01T00:00:00Z"


def test_a_failed_write_leaves_the_previous_report(tmp_path, monkeypatch):
    loss, _ = make_loss()
    ins = sowviz.inspect(loss, W, X)
    path = ins.save_html(tmp_path / "r.html")
    before = path.read_bytes()

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        sowviz.inspect(loss, W * 3.0, X).save_html(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in pathlib.Path(tmp_path).iterdir()) == ["r.html"]


def test_inline_summaries_equal_the_deferred_ones(monkeypatch):
    # The Monitor on an accelerator runs one program with every summary inline; the
    # summaries must equal those of the shared second program (`finish`), and the
    # Monitor must take that path there.
    import sowviz.monitor

    loss, _ = make_loss()
    runner = _program.runner_for(loss, sowviz.inspection.InspectOptions())
    deferred = runner.run((W, X), where="test")
    inline = runner.run((W, X), where="test", inline=True)
    assert deferred.packed.regroup.deferred and not inline.packed.regroup.deferred
    a, _ = deferred.packed.unpack()
    b, _ = inline.packed.unpack()
    leaves_a = jax.tree_util.tree_leaves_with_path(a, is_leaf=lambda v: hasattr(v, "to_json"))
    leaves_b = jax.tree_util.tree_leaves(b, is_leaf=lambda v: hasattr(v, "to_json"))
    assert len(leaves_a) == len(leaves_b) > 0
    for (path, sa), sb in zip(leaves_a, leaves_b, strict=True):
        ja, jb = sa.to_json(), sb.to_json()
        # Float sums over layouts of other shapes are rounded in another order (the
        # deferred layout is padded to `inspect`'s coarse size class): the moments
        # agree to float32 rounding, relative to the values' magnitude; all else exactly.
        moments = ("mean", "std", "l2")
        assert {k: v for k, v in ja.items() if k not in moments} == {
            k: v for k, v in jb.items() if k not in moments
        }, jax.tree_util.keystr(path)
        for k in moments:
            np.testing.assert_allclose(ja[k], jb[k], rtol=1e-5, atol=1e-6 * ja["absmax"])
    # the Monitor's choice: inline off the CPU
    seen = []
    real = _program.Runner.run
    monkeypatch.setattr(
        _program.Runner, "run", lambda self, *a, **k: seen.append(k) or real(self, *a, **k)
    )
    monkeypatch.setattr(sowviz.monitor.jax, "default_backend", lambda: "gpu")
    mon = sowviz.Monitor(loss)
    value, _ = mon.step(W, X)
    mon.flush()
    assert seen[-1]["inline"] is True
    np.testing.assert_allclose(mon.history[-1]["loss"], float(value), rtol=1e-6)


def test_an_output_that_is_an_input_or_returned_twice_leaves_the_program():
    # XLA gives every output a buffer of its own, so an input returned, or one value
    # returned twice, is a copy (a kernel to compile): `shared` leaves them out of the
    # program and `restored` puts them back, as jax.jit would have returned them.
    x = jnp.arange(6.0).reshape(2, 3)
    y = np.linspace(0.0, 1.0, 4)  # NumPy float64: the program sees a float32 array

    def both(x, y):
        s = jnp.sin(x)
        return {"a": s, "b": s, "c": y, "d": s + 1.0}

    def program(x, y):
        return _program.shared(both(x, y), (x, y))

    assert len(jax.tree_util.tree_leaves(jax.eval_shape(program, x, y))) == 2
    got = _program.restored(jax.jit(program)(x, y), (x, y))
    want = jax.jit(both)(x, y)
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert isinstance(got[k], jax.Array) and got[k].dtype == v.dtype
        np.testing.assert_array_equal(got[k], v)


def test_inspect_passes_its_parameters_and_gradients_on_without_copies(monkeypatch):
    # The probes of a parameter's value and of its gradient are the input and the
    # gradient the mode returns: the capture program outputs neither twice, and the
    # summaries still equal NumPy's.
    seen = []
    real = _program.shared
    monkeypatch.setattr(_program, "shared", lambda *a: seen.append(real(*a)) or seen[-1])
    loss, _ = make_loss()
    got = sowviz.inspect(loss, W, X)
    (out,) = seen
    assert isinstance(out, _program.Shared)
    assert (True, 0) in {(is_input, j) for _, is_input, j in out.aliases}  # W itself
    assert any(not is_input for _, is_input, _ in out.aliases)  # its gradient, the result's
    # float32 from two programs XLA compiled apart: equal to rounding (JAX 0.10's CPU
    # dot differs from plain jax.grad's in the 6th digit), not bit for bit
    grad = jax.grad(loss)(W, X)
    np.testing.assert_allclose(got.result[1], grad, rtol=2e-5, atol=1e-7)
    (w,) = [p for p in got.to_dict()["probes"] if p["name"] == "w"]
    for mode, values in (("primal", W), ("cotangent", grad)):
        stats = w["summaries"][mode]
        np.testing.assert_allclose(stats["mean"], np.mean(values), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(stats["max"], np.max(values), rtol=2e-5)
        assert stats["count"] == W.size


def test_a_scope_whose_output_is_its_last_stages_is_summarised_once(monkeypatch):
    # The scope's output is `standardize`'s: both probes record one traced value (one
    # barrier; two were two outputs XLA found equal, and copied), summarised once and
    # read by both, primal and cotangent alike.
    from sowviz import inspection

    outs = []
    real = inspection.inspection_of
    monkeypatch.setattr(
        inspection, "inspection_of", lambda out, o: outs.append(out) or real(out, o)
    )

    def f(w, x):
        with jax.named_scope("block"):
            y = jax.nn.standardize(x @ w)
        return jnp.mean(jnp.tanh(y) ** 2)

    got = sowviz.inspect(f, W, X)
    (out,) = outs
    regroup = out.packed.regroup
    tree = jax.tree_util.tree_unflatten(regroup.treedef, regroup.where)  # {(tag, name): ...}
    placed = {name: e for (tag, name), e in tree.items() if tag == _program.PROBE_TAG}
    block, stage = (got.probe(name).node for name in ("block", "standardize"))
    y = jax.nn.standardize(X @ W)
    ct = jax.grad(lambda y: jnp.mean(jnp.tanh(y) ** 2))(y)
    for mode, values in (("primal", y), ("cotangent", ct)):
        assert placed[block][mode] == placed[stage][mode] is not None  # one (group, row)
        summary = got.probe("block").summaries[mode]
        assert summary == got.probe("standardize").summaries[mode]
        np.testing.assert_allclose(summary["mean"], np.mean(values), rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(summary["l2"], np.linalg.norm(values), rtol=1e-5)
    others = [w for k, e in placed.items() if k not in (block, stage) for w in e.values()]
    assert placed[block]["primal"] not in others  # no other probe reads that row


def test_a_sown_literal_is_laid_out_with_the_arrays():
    # A number sown as it is (a literal of the program, not an array) is a member of
    # the small probes' layout like any array.
    def f(w, x):
        sowviz.sow(1.5, "literal")
        with jax.named_scope("layer"):
            h = jnp.tanh(x @ w)
        return jnp.mean(h**2)

    probes = {p["name"]: p for p in sowviz.inspect(f, W, X).to_dict()["probes"]}
    literal = probes["literal"]["summaries"]["primal"]
    assert (literal["count"], literal["min"], literal["max"]) == (1, 1.5, 1.5)
    layer = probes["layer"]["summaries"]["primal"]
    np.testing.assert_allclose(layer["mean"], np.mean(np.tanh(X @ W)), rtol=1e-5)


@contextlib.contextmanager
def compiles_afresh(tmp_path, monkeypatch):
    """The names of the programs XLA compiles meanwhile, nothing compiled before (an empty
    disk cache, sowviz's in-process programs forgotten)."""
    from jax import monitoring

    from sowviz.capture import summaries

    monkeypatch.setenv("SOWVIZ_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(summaries, "_COMPILED", {})
    monkeypatch.setattr(summaries, "_STARTED", set())
    # JAX keeps what it compiled by the lowered program too: a `_finish` lowered
    # for the same shapes by an earlier test would be found there and not compiled.
    jax.clear_caches()
    compiled: list[str] = []

    def listen(event: str, secs: float, **kw) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(str(kw.get("fun_name", "")))

    monitoring.register_event_duration_secs_listener(listen)
    try:
        yield compiled
    finally:
        unregister = getattr(monitoring, "unregister_event_duration_listener", None)
        if unregister is not None:
            unregister(listen)


@pytest.mark.parametrize("host_layout", [True, False])
def test_an_edited_function_compiles_its_capture_program_but_not_its_layout(
    tmp_path, monkeypatch, host_layout
):
    # `inspect` lays its small probes out in a program keyed by their shapes (on a CPU,
    # with NumPy: no program at all): a cell run again (an edited function, like
    # shapes) compiles only its capture program.
    from sowviz.capture import summaries

    monkeypatch.setattr(summaries, "HOST_LAYOUT", host_layout)
    on_host = host_layout and jax.default_backend() == "cpu"
    with compiles_afresh(tmp_path, monkeypatch) as compiled:
        for scale in (1.0, 2.0):
            loss, _ = make_loss()
            edited = (lambda s, f: lambda w, x: f(w, x) * s)(scale, loss)
            got = sowviz.inspect(edited, W * 1.5, X)  # shapes seen before, values not
            np.testing.assert_allclose(got.result[0], scale * loss(W * 1.5, X), rtol=1e-6)
    assert sum("_instrumented_program" in n for n in compiled) == 2
    assert sum("_lay_out_program" in n for n in compiled) == (0 if on_host else 1)


@pytest.mark.parametrize("host_layout", [True, False])
def test_models_of_other_widths_share_one_summary_program(tmp_path, monkeypatch, host_layout):
    # A user's next model (other widths, arrays of other sizes, one of them past the
    # size a Monitor's program groups in blocks) is summarised by the program compiled
    # for the first: `inspect`'s layouts take coarse size classes. Its layout program
    # (keyed by the probes' shapes) is the only summary program it compiles; on a CPU
    # NumPy lays the probes out, and it compiles none.
    from sowviz.capture import summaries

    monkeypatch.setattr(summaries, "HOST_LAYOUT", host_layout)
    on_host = host_layout and jax.default_backend() == "cpu"

    def mlp(ws, x):
        for i, w in enumerate(ws):
            with jax.named_scope(f"layer{i}"):
                x = jnp.tanh(x @ w)
        return jnp.mean(x**2)

    with compiles_afresh(tmp_path, monkeypatch) as compiled:
        for width in (24, 40, 72, 260):  # 260 x 260 = 67,600 values: a large array
            keys = jax.random.split(jax.random.PRNGKey(width), 4)
            ws = [jax.random.normal(keys[0], (8, width)) / 3]
            ws += [jax.random.normal(keys[1], (width, width)) / width**0.5]
            ws += [jax.random.normal(keys[2], (width, 2))]
            x = jax.random.normal(keys[3], (16, 8))
            ins = sowviz.inspect(mlp, ws, x)
            np.testing.assert_allclose(ins.result[0], mlp(ws, x), rtol=1e-6)
            w1 = ins.probe("[1]").summaries  # in the "parameters" group
            assert w1["primal"]["size"] == width * width
            np.testing.assert_allclose(w1["primal"]["mean"], np.mean(ws[1]), rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(w1["primal"]["max"], np.max(ws[1]), rtol=1e-6)
            grad = jax.grad(mlp)(ws, x)[1]
            np.testing.assert_allclose(w1["cotangent"]["l2"], np.linalg.norm(grad), rtol=1e-4)
            assert sum(w1["cotangent"]["hist"]["counts"]) == width * width
    assert sum("_finish_program" in n for n in compiled) == 1
    assert sum("_lay_out_program" in n for n in compiled) == (0 if on_host else 4)


@pytest.mark.parametrize("stack_max", [_program.CPU_STACK_MAX, 0])
def test_all_finite_flags_each_leaf_as_numpy_does(monkeypatch, stack_max):
    # The per-leaf flag the Monitor chains and reads (`_program.all_finite`), against
    # NumPy's isfinite: every kind of non-finite value, in every inexact dtype, and
    # finite values at the edge of the range (x * 0 must stay 0 there); like leaves
    # stacked into one reduction (interleaved with others: `finite_order` says which
    # leaf each flag is) and, with stack_max=0, every leaf reduced on its own.
    monkeypatch.setattr(_program, "STACK_MAX", stack_max)
    monkeypatch.setattr(_program, "CPU_STACK_MAX", stack_max)  # a CPU's own bound
    big = np.finfo(np.float32).max
    rng = np.random.default_rng(0)
    like = [rng.normal(size=(3, 2)).astype(np.float32) for _ in range(5)]
    like[1][2, 1], like[4][0, 0] = np.nan, -np.inf
    leaves = {
        **{f"like{i}": x for i, x in enumerate(like)},
        "ok": np.array([1.0, big, big, 0.0, -0.0], np.float32),  # a plain sum overflows
        "nan": np.array([1.0, np.nan], np.float32),
        "inf": np.array([np.inf, 1.0], np.float32),
        "ninf": np.array([[2.0], [-np.inf]], np.float32),
        "bf16_inf": jnp.array([1.0, np.inf], jnp.bfloat16),
        "f16_ok": np.array([65504.0, -65504.0], np.float16),
        "c_inf_imag": np.array([1 + 1j, 1 + np.inf * 1j], np.complex64),
        "c_nan_real": np.array([np.nan + 0j], np.complex64),
        "c_ok": np.array([3 - 4j], np.complex64),
        "int": np.array([1, 2], np.int32),
        "empty": np.zeros((0,), np.float32),
    }
    flags = np.asarray(jax.jit(lambda t: _program.all_finite(t))(leaves))  # traced afresh
    order = _program.finite_order(leaves)
    assert sorted(order) == list(range(len(order)))
    got = flags[np.argsort(order)]
    want = [bool(np.isfinite(np.asarray(v, np.complex128)).all()) for v in jax.tree.leaves(leaves)]
    assert got.tolist() == want
    if stack_max:  # like leaves share one reduction: the flags are not in leaf order
        assert order != sorted(order)
    assert want.count(False) == 8  # the test covers both outcomes


def test_a_cpu_stacks_only_small_leaves_for_the_finite_test():
    # On a CPU a stack is a copy and a reduction no launch: a 3x128 MLP's 16K-element
    # gradients cost a Monitor's unrecorded step 55-90 µs stacked; tiny leaves (biases,
    # 250 of them in a deep model) still share one reduction.
    leaves = [np.ones((128, 128), np.float32) for _ in range(3)] + [
        np.ones((16,), np.float32) for _ in range(3)
    ]
    kinds = _program._finite_kinds(leaves)
    if jax.default_backend() == "cpu":
        assert kinds == [[0], [1], [2], [3, 4, 5]]
    else:
        assert kinds == [[0, 1, 2], [3, 4, 5]]


def test_pooled_finite_flags_say_whether_every_leaf_is_finite(monkeypatch):
    # The capture programs test their result with `pooled=True`: on a CPU, the small
    # leaves of a dtype share one copy and one reduction (each distinct reduction is a
    # kernel XLA:CPU compiles), so an entry covers a group; what the readers ask,
    # whether every entry is true, must be NumPy's answer for every leaf.
    if jax.default_backend() != "cpu":
        pytest.skip("pooled on a CPU backend only")
    big = np.finfo(np.float32).max
    rng = np.random.default_rng(1)
    base = {
        "a": rng.normal(size=(3, 2)).astype(np.float32),
        "b": rng.normal(size=(7,)).astype(np.float32),
        "edge": np.array([big, -big, 0.0], np.float32),  # x * 0 stays 0 at the range's edge
        "c": rng.normal(size=(2, 2, 2)).astype(np.float32),
        "bf16": jnp.array([1.0, 2.0], jnp.bfloat16),
        "cplx": np.array([3 - 4j, 1j], np.complex64),
        "int": np.array([1, 2], np.int32),
        "large": rng.normal(size=(9,)).astype(np.float32),  # past STACK_MAX below
        "empty": np.zeros((0,), np.float32),
    }
    monkeypatch.setattr(_program, "STACK_MAX", 8)
    pooled = jax.jit(lambda t: _program.all_finite(t, pooled=True))
    hlo = pooled.lower(base).compile().as_text()
    per_kind = jax.jit(lambda t: _program.all_finite(t)).lower(base).compile().as_text()
    # one reduction per dtype pool (f32, bf16, c64) and one for the large leaf
    assert hlo.count(" reduce(") < per_kind.count(" reduce(")
    assert bool(np.all(pooled(base)))
    bad_values = {"a": np.nan, "b": np.inf, "c": -np.inf, "large": np.nan, "bf16": np.inf}
    for name, bad in [*bad_values.items(), ("cplx", complex(0, np.inf))]:
        tree = dict(base)
        v = np.array(tree[name]).copy()
        v.reshape(-1)[-1] = bad
        tree[name] = v if name != "bf16" else jnp.asarray(v, jnp.bfloat16)
        want = all(np.isfinite(np.asarray(x, np.complex128)).all() for x in tree.values())
        assert not want
        assert bool(np.all(pooled(tree))) is want, name


def test_split_reuses_array_positions_but_never_static_values():
    # `split` caches where the arrays sit per (structure, leaf types); the static
    # leaves' values must still come from each call, and a tracer must still be refused.
    from sowviz._args import split

    w = jnp.ones(3)
    spec2, _ = split(({"w": w, "n": np.float32(1.0)}, 2.0, "a"), "inspect")
    spec3, dyn3 = split(({"w": w, "n": np.float32(1.0)}, 3.0, "a"), "inspect")
    assert spec2 != spec3 and spec2.static == ((2, 2.0), (3, "a"))
    assert spec3.static == ((2, 3.0), (3, "a")) and spec3.dynamic == (0, 1)
    assert len(dyn3) == 2 and dyn3[1] is w
    assert split(({"w": w, "n": np.float32(1.0)}, 2.0, "a"), "inspect")[0] == spec2
    # every leaf an array: the leaves themselves, in order
    spec, dyn = split((w, np.zeros(2)), "inspect")
    assert spec.static == () and spec.dynamic == (0, 1) and dyn[0] is w

    def traced(v):
        split((v, np.zeros(2)), "inspect")
        return v

    with pytest.raises(TypeError, match="tracer"):
        jax.jit(traced)(w)


def test_garbage_collection_pauses_overlapping_in_threads_end_as_they_began():
    """`gc_paused` blocks overlap across threads (a widget compiles a mode in the
    background while the kernel traces): the collector stays off until the last block
    closes, then is back on."""
    import gc
    import threading

    from sowviz._gc import gc_paused

    assert gc.isenabled()
    a_open, b_open, a_closed = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with gc_paused():
            a_open.set()
            b_open.wait(10)
        a_closed.set()

    t = threading.Thread(target=a)
    t.start()
    a_open.wait(10)
    with gc_paused():
        b_open.set()
        a_closed.wait(10)
        seen["after a closed, b open"] = gc.isenabled()
    t.join()
    assert seen == {"after a closed, b open": False}
    assert gc.isenabled()
    # a collector the user turned off stays off
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_parameters_group_follows_argnums_on_a_cached_function():
    # One function inspected with argnums=0, then 1: the cached graph of the first
    # call must not label the other argument "parameters".
    def f(a, b):
        return jnp.sum(a["x"] * b["y"] + a["z"])

    a = {"x": jnp.ones(3), "z": jnp.full(3, 2.0)}
    b = {"y": jnp.full(3, 3.0), "w": jnp.ones(3)}
    for argnums, want in ((0, ["parameters", "b"]), (1, ["a", "parameters"])):
        ins = sowviz.inspect(f, a, b, argnums=argnums)
        g = ins.graph
        assert [n.label for n in g.children(g.root) if n.kind == "scope"] == want
        grads = jax.grad(f, argnums=argnums)(a, b)
        np.testing.assert_allclose(
            ins.result[1]["x" if argnums == 0 else "y"], grads["x" if argnums == 0 else "y"]
        )


def test_an_equinox_module_or_filter_transform_as_fn_is_inspected():
    # Callables holding arrays are unhashable (an Equinox model, the module that
    # `eqx.filter_value_and_grad` returns); `eqx.filter_jit` takes them, and so must
    # sowviz: the cache keys them by identity.
    eqx = pytest.importorskip("equinox")
    model = eqx.nn.MLP(3, 2, 8, depth=1, key=jax.random.PRNGKey(0))
    x = jnp.linspace(-1.0, 1.0, 3)

    def loss(m, x):
        return jnp.sum(m(x) ** 2)

    ins = sowviz.inspect(model, x, mode="primal")
    np.testing.assert_allclose(ins.result, model(x), rtol=1e-6)
    value_and_grad = eqx.filter_value_and_grad(loss)
    ins = sowviz.inspect(value_and_grad, model, x, mode="primal")
    want_value, want_grads = value_and_grad(model, x)
    np.testing.assert_allclose(ins.result[0], want_value, rtol=1e-6)
    np.testing.assert_allclose(
        ins.result[1].layers[0].weight, want_grads.layers[0].weight, rtol=1e-5
    )
    # a bound method of such a module too
    ins = sowviz.inspect(model.__call__, x, mode="primal")
    np.testing.assert_allclose(ins.result, model(x), rtol=1e-6)


@pytest.mark.parametrize("wrap", ["none", "jit", "remat"])
def test_a_loop_s_captures_leave_the_capture_program_in_its_buffer(monkeypatch, wrap):
    # The small captures of a while loop ride in one buffer per dtype (`packing.Carried`)
    # and leave the program as that buffer, masked once where the loop never ran, then
    # cut on the host: one output, not one per probe (each was a kernel to compile:
    # a NUTS step's 430 probes). The summaries are those of the last iteration's values.
    # A loop inside a `jit` (Equinox's `filter_jit`, a diffrax solve) or `remat` too:
    # its buffer leaves that sub-program once (`packing.Passed`); its cuts, values of
    # their own outside it, were a slice and an XLA kernel each (at an offset of its
    # own: a diffrax `ForwardMode` solve compiled 2.5x longer than with no buffer).
    seen = []
    real = _program.shared
    monkeypatch.setattr(_program, "shared", lambda *a: seen.append(real(*a)) or seen[-1])

    def body(c):
        i, q = c
        for k in range(8):
            q = q + 0.01 * sowviz.sow(jnp.tanh(q * (1.0 + 0.1 * k)), f"h{k}")
        return i + 1, q

    def loop(q):
        return jax.lax.while_loop(lambda c: c[0] < 3, body, (0, q))[1]

    fn = {"none": loop, "jit": jax.jit(loop), "remat": jax.checkpoint(loop)}[wrap]
    q = np.asarray([0.4, -0.7, 1.5], np.float32)
    ins = sowviz.inspect(fn, jnp.asarray(q), mode="primal", capture="sows")
    (out,) = seen
    outputs = jax.tree_util.tree_leaves(out)
    # the result, the packed summaries, the masked buffer, the finite and clean flags
    assert len(outputs) <= 5, [x.shape for x in outputs]
    for _ in range(3):  # the loop in NumPy; its last iteration's values are kept
        last = {}
        for k in range(8):
            last[k] = np.tanh(q * np.float32(1.0 + 0.1 * k))
            q = q + np.float32(0.01) * last[k]
    np.testing.assert_allclose(ins.result, q, rtol=1e-6)
    for k, values in last.items():
        got = ins.probe(f"h{k}").summaries["primal"]
        assert (got["count"], got["nan"]) == (3, 0)
        np.testing.assert_allclose(
            [got["min"], got["max"], got["mean"]],
            [values.min(), values.max(), values.mean()],
            rtol=1e-5,
        )
