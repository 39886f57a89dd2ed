"""Mixed precision and NaN hunting (round 19).

1. A float16 layer's output cast to float32 by a mixed-precision policy (Haiku's
   `set_policy` with jmp's, or a hand-written one): with a scaled loss the float32
   cotangent, cast back to float16, overflows there. The origin is that layer
   (`linear_2`), in the backward of the cast; it was `integer_pow` (whose float32
   backward is finite) or the layer's bias `add`, reaching `broadcast_to`.
2. `expect_nonfinite=("gradients",)`: a guarded update (dynamic loss scaling, optax's
   `apply_if_finite`, a `jnp.where(all_finite, new, old)`) skips the steps whose
   gradients overflow; the Monitor counts them as skipped (`history.skipped`), with no
   alarm, and still raises it for a non-finite loss or parameter. A name that is no
   stage, sow nor "gradients" is an error listing the valid names.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
import sowviz.nonfinite_casts
from sowviz.monitor import NonFiniteError, NonFiniteWarning

hk = pytest.importorskip("haiku")

import _round19_policy_programs as prog  # noqa: E402


@pytest.fixture
def hand_policy():
    classes = (prog.HandMLP, prog.HandSqrtMLP)  # (a policy is set per class)
    for cls in classes:
        hk.mixed_precision.set_policy(cls, prog.HandPolicy())
    yield
    for cls in classes:
        hk.mixed_precision.clear_policy(cls)


@pytest.fixture
def jmp_policy():
    jmp = pytest.importorskip("jmp")
    policy = jmp.get_policy("params=float32,compute=float16,output=float32")
    hk.mixed_precision.set_policy(hk.nets.MLP, policy)
    yield jmp
    hk.mixed_precision.clear_policy(hk.nets.MLP)


# -- 1. the overflow in the backward of a policy's cast ----------------------------------


def _check_by_hand(loss_of_y, params, x, cls=None):
    """In plain JAX: the forward is finite, the float32 cotangent of the MLP's output
    is finite but past float16's range, so its cast back to float16 is +-Inf, and
    every gradient is non-finite."""
    y = prog.mlp_net(cls).apply(params, None, x)
    assert y.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(y)))
    ct = jax.grad(loss_of_y)(y)
    assert bool(jnp.all(jnp.isfinite(ct))) and float(jnp.max(jnp.abs(ct))) > prog.F16_MAX
    assert not bool(jnp.all(jnp.isfinite(ct.astype(jnp.float16))))


def _assert_born_in_linear_2_cast(ins, grads):
    o = ins.nonfinite
    assert o is not None and o.alarm and o.forward is None
    b = o.backward
    assert b.path == ("mlp", "linear_2"), b.message
    assert "cast of the output of `linear_2`" in b.message, b.message
    assert "float16 to float32" in b.message and "65504" in b.message, b.message
    assert "integer_pow" not in b.message and "broadcast_to" not in b.message, b.message
    # the layer's cast reaches every gradient: no second origin to fix
    assert "another origin" not in b.message, b.message
    bad = sorted(
        f"parameters/{m}/{k}"
        for m, d in grads.items()
        for k, g in d.items()
        if not bool(jnp.all(jnp.isfinite(g)))
    )
    assert sorted(o.grads) == bad and len(bad) == 6, (o.grads, bad)
    located = ins.locate_nonfinite()
    lb = located.backward
    assert lb.path == ("mlp", "linear_2"), lb.message
    assert lb.equation.primitive == "convert_element_type", lb.equation
    assert "integer_pow" not in lb.message, lb.message


def test_a_hand_written_policy_s_scaled_backward_overflow_is_born_at_linear_2(hand_policy):
    params, x = prog.mlp_args()
    scale = jnp.float32(2.0**15)
    _check_by_hand(lambda y: jnp.mean(y**2) * scale, params, x, prog.HandMLP)
    grads = jax.grad(prog.hand_scaled_loss)(params, x, scale)
    ins = sowviz.inspect(prog.hand_scaled_loss, params, x, scale)
    _assert_born_in_linear_2_cast(ins, grads)


def test_a_jmp_policy_s_scaled_backward_overflow_is_born_at_linear_2(jmp_policy):
    jmp = jmp_policy
    params, x = prog.mlp_args()
    loss_scale = jmp.DynamicLossScale(jnp.float32(2.0**15))
    _check_by_hand(lambda y: loss_scale.scale(jnp.mean(y**2)), params, x)
    grads = jax.grad(prog.jmp_scaled_loss)(params, x, loss_scale)
    assert not jmp.all_finite(loss_scale.unscale(grads))  # jmp would skip this step
    ins = sowviz.inspect(prog.jmp_scaled_loss, params, x, loss_scale)
    _assert_born_in_linear_2_cast(ins, grads)


def test_a_forward_overflow_under_the_policy_is_still_linear_1_s_dot(hand_policy):
    # layer 1's float16 `dot_general` overflows (plain JAX: its output holds Inf)
    params, x = prog.mlp_args(w1_scale=2000.0)
    h = jax.nn.relu(x.astype(jnp.float16) @ params["mlp/~/linear_0"]["w"].astype(jnp.float16))
    pre = h @ params["mlp/~/linear_1"]["w"].astype(jnp.float16)
    assert bool(jnp.all(jnp.isfinite(h))) and not bool(jnp.all(jnp.isfinite(pre)))
    o = sowviz.inspect(prog.hand_scaled_loss, params, x, jnp.float32(1.0)).locate_nonfinite()
    assert o.forward.path == ("mlp", "linear_1"), o.forward.message
    assert o.forward.equation.primitive == "dot_general"
    assert "cast of the output" not in o.message


def test_a_reader_s_own_float32_overflow_after_the_cast_is_not_blamed_on_the_cast(hand_policy):
    # `sqrt` of the policy's float32 output at 0 (the final ReLU): +Inf made in float32
    params, x = prog.sqrt_args()
    y = prog.mlp_net(prog.HandSqrtMLP).apply(params, None, x)
    assert y.dtype == jnp.float32 and bool(jnp.any(y == 0))
    ins = sowviz.inspect(prog.sqrt_loss, params, x)
    widened = sowviz.nonfinite_casts.widened_reads(ins.graph)
    assert widened and all(v[:2] == ("float16", "float32") for v in widened.values()), widened
    g = jax.grad(lambda y: jnp.sum(jnp.sqrt(y)))(y)
    assert not bool(jnp.all(jnp.isfinite(g)))  # already in float32
    o = ins.locate_nonfinite()
    assert o.backward.equation.primitive == "sqrt", o.backward.message
    assert "cast of the output" not in o.message, o.message


# -- 2. expected non-finite gradients: skipped steps -------------------------------------


def _run(n=12, poison=None, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon = sowviz.Monitor(prog.loss, **kw)
        skipped = prog.train(mon.step, n, poison)
        mon.flush()
    alarms = [w for w in caught if issubclass(w.category, NonFiniteWarning)]
    return mon, skipped, alarms


@pytest.mark.parametrize("every", [1, 3])
def test_a_guarded_update_s_skipped_steps_are_counted_not_alarmed(every):
    want = prog.plain_skipped()
    assert len(want) >= 3 and want == list(range(len(want)))  # the scale comes down first
    mon, skipped, alarms = _run(every=every, expect_nonfinite=("gradients",))
    assert skipped == want  # the Monitor's gradients are plain JAX's: same skips
    assert alarms == [] and mon.nonfinite is None
    assert mon.history.skipped.count == len(want)
    assert mon.history.skipped.ranges == [[want[0], want[-1]]]
    assert mon.history.nonfinite.count == 0
    hist = mon.to_dict()["history"]
    assert hist["skipped_count"] == len(want) and hist["nonfinite_count"] == 0
    # a recorded skipped step says so, muted: no "starts here" flag
    for e in mon.history:
        if e["step"] in want:
            assert e["finite"] is False and e.get("skipped") is True


def test_without_the_declaration_the_same_steps_raise_the_alarm():
    want = prog.plain_skipped()
    mon, _, alarms = _run(every=1)
    assert len(alarms) == 1 and mon.nonfinite.step == want[0]
    # the warning says how to declare them
    assert "expect_nonfinite=('gradients',)" in str(alarms[0].message), alarms[0].message
    assert mon.history.nonfinite.count == len(want) and mon.history.skipped.count == 0


@pytest.mark.parametrize("every", [1, 3])
def test_a_non_finite_parameter_still_raises_the_alarm(every):
    poison = 10
    want = prog.plain_skipped(poison=poison)
    mon, _, alarms = _run(poison=poison, every=every, expect_nonfinite=("gradients",))
    assert len(alarms) == 1 and mon.nonfinite.step == poison
    assert "parameters/w2" in mon.nonfinite.message, mon.nonfinite.message
    assert mon.history.skipped.count == len(want)
    assert mon.history.nonfinite.count == 12 - poison


def test_stop_on_nonfinite_stops_only_at_the_bad_parameter():
    poison = 10
    want = prog.plain_skipped(poison=poison)
    mon = sowviz.Monitor(prog.loss, stop_on_nonfinite=True, expect_nonfinite=("gradients",))
    with pytest.raises(NonFiniteError, match="step 10"):
        prog.train(mon.step, 12, poison)
    assert mon.history.skipped.count == len(want)


def test_inspect_of_a_skipped_step_says_so_without_an_alarm():
    params, x, y = prog.train_args()
    scale = jnp.float32(2.0**24)
    _, grads = jax.value_and_grad(prog.loss)(params, x, y, scale)
    assert not prog.all_finite(grads)
    ins = sowviz.inspect(prog.loss, params, x, y, scale, expect_nonfinite="gradients")
    o = ins.nonfinite
    assert o.skipped and not o.alarm and o.forward is None and o.backward is None
    assert "guarded update" in o.message
    assert ins.to_dict()["nonfinite"]["skipped"] is True
    # a non-finite loss is no skipped step
    bad = dict(params, w2=params["w2"].at[0, 0].set(jnp.nan))
    o = sowviz.inspect(prog.loss, bad, x, y, scale, expect_nonfinite="gradients").nonfinite
    assert o.alarm and not o.skipped and o.forward is not None


def test_optax_apply_if_finite_skips_the_steps_the_monitor_counts():
    optax = pytest.importorskip("optax")
    params, x, y = prog.train_args()
    opt = optax.apply_if_finite(optax.sgd(1e-2), max_consecutive_errors=100)
    state = opt.init(params)
    mon = sowviz.Monitor(prog.loss, every=2, expect_nonfinite=("gradients",))
    # a fixed scale too large for float16 until the updates shrink the gradients
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteWarning)
        for scale in [2.0**24] * 3 + [1.0] * 3:
            _, grads = mon.step(params, x, y, jnp.float32(scale))
            updates, state = opt.update(grads, state, params)
            params = optax.apply_updates(params, updates)
        mon.flush()
    assert int(state.total_notfinite) == 3
    assert mon.history.skipped.count == 3 and mon.nonfinite is None


def test_jmp_dynamic_loss_scale_s_skipped_steps_are_counted(jmp_policy):
    jmp = jmp_policy
    params, x = prog.mlp_args(w1_scale=1.0)
    loss_scale = jmp.DynamicLossScale(jnp.float32(2.0**30), period=1000)
    mon = sowviz.Monitor(prog.jmp_scaled_loss, expect_nonfinite=("gradients",))
    skips = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteWarning)
        for _ in range(24):
            _, grads = mon.step(params, x, loss_scale)
            grads = loss_scale.unscale(grads)
            finite = jmp.all_finite(grads)
            skips += int(not finite)
            loss_scale = loss_scale.adjust(finite)
            new = jax.tree_util.tree_map(lambda p, g: p - 1e-4 * g, params, grads)
            params = jmp.select_tree(finite, new, params)
        mon.flush()
    assert skips >= 3 and mon.history.skipped.count == skips and mon.nonfinite is None


# -- the names `expect_nonfinite` accepts ------------------------------------------------


def test_a_name_that_is_no_stage_nor_sow_is_an_error_listing_the_valid_names():
    params, x, y = prog.train_args()
    args = (params, x, y, jnp.float32(1.0))
    with pytest.raises(ValueError, match="'gradient'") as err:
        sowviz.inspect(prog.loss, *args, expect_nonfinite=("gradient",))
    said = str(err.value)
    assert "Valid names: 'gradients'" in said and "'predict'" in said, said
    mon = sowviz.Monitor(prog.loss, expect_nonfinite=("predcit",))
    with pytest.raises(ValueError, match=r"'predcit'.*'predict'"):
        mon.step(*args)
    # a stage label is a name
    ins = sowviz.inspect(prog.loss, *args, expect_nonfinite=("predict",))
    assert ins.nonfinite is None


def test_the_docstrings_say_what_expect_nonfinite_accepts():
    for doc in (
        sowviz.Monitor.__doc__,
        sowviz.inspect.__doc__,
        sowviz.Inspection.locate_nonfinite.__doc__,
    ):
        assert '"gradients"' in doc and "skipped" in doc, doc[:200]


def test_the_hand_written_policy_casts_as_jmp_s_does(hand_policy):
    # (the sibling of the jmp tests: the same dtypes and the same graph)
    params, x = prog.mlp_args()
    y = prog.mlp_net(prog.HandMLP).apply(params, None, x)
    assert y.dtype == jnp.float32
    np.testing.assert_allclose(
        prog.as_np(y),
        prog.as_np(_by_hand(params, x)),
        rtol=1e-3,
    )


def _by_hand(params, x):
    h = x.astype(jnp.float16)
    for i in range(3):
        p = params[f"mlp/~/linear_{i}"]
        h = h @ p["w"].astype(jnp.float16) + p["b"].astype(jnp.float16)
        h = jax.nn.relu(h) if i < 2 else h
    return h.astype(jnp.float32)


def test_the_readme_s_guarded_step_example_runs_as_it_says():
    import pathlib

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text("utf-8")
    (block,) = [
        b.split("```", 1)[0]
        for b in readme.split("```python\n")[1:]
        if 'expect_nonfinite=("gradients",)' in b.split("```", 1)[0]
    ]
    ns = {"jax": jax, "jnp": jnp, "sowviz": sowviz}
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteWarning)
        exec(compile(block, "README.md", "exec"), ns)
    mon = ns["mon"]
    assert ns["skipped"] == 4 == mon.history.skipped.count and mon.nonfinite is None
    assert "# 4 4 None" in block


def test_the_front_end_counts_skipped_steps_apart_from_non_finite_ones(tmp_path):
    import json
    import pathlib
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    mon, skipped, _ = _run(every=1, expect_nonfinite=("gradients",))
    hist = mon.to_dict()["history"]
    assert hist["skipped"][: len(skipped)] == [True] * len(skipped)
    src = pathlib.Path(__file__).resolve().parents[1] / "js" / "src" / "history.js"
    data = tmp_path / "history.json"
    data.write_text(json.dumps({**hist, "probes": {}}, allow_nan=False))
    script = f"""
import {{ readFileSync }} from "node:fs";
import {{ appendStep, copyHistory, nonfiniteSteps, skippedCount }} from {json.dumps(src.as_uri())};
const h = copyHistory(JSON.parse(readFileSync({json.dumps(str(data))}, "utf8")));
const out = {{ bad: nonfiniteSteps(h), skipped: skippedCount(h) }};
// a live step pushed to the view: skipped, no alarm; a non-finite one: the alarm
appendStep(h, {{ step: 100, loss: 1, finite: false, skipped: true, probes: {{}} }});
appendStep(h, {{ step: 101, loss: null, finite: false, probes: {{}} }});
out.after = nonfiniteSteps(h);
console.log(JSON.stringify(out));
"""
    proc = subprocess.run(
        [node, "--input-type=module"], input=script, capture_output=True, text=True, check=True
    )
    got = json.loads(proc.stdout)
    assert got == {"bad": [], "skipped": len(skipped), "after": [101]}, got
