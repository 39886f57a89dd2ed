"""inspect(): the model, probe summaries against independently computed values."""

import functools
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

ROOT = pathlib.Path(__file__).resolve().parents[1]

WIDTH = 6


def make_params(n=3):
    keys = jax.random.split(jax.random.PRNGKey(0), n)
    return [
        {"w": jax.random.normal(k, (WIDTH, WIDTH)) / 2, "b": jnp.full(WIDTH, 0.1)} for k in keys
    ]


def mlp(params, x):
    h = x
    for i, p in enumerate(params):
        with jax.named_scope(f"layer_{i}"):
            h = jnp.tanh(h @ p["w"] + p["b"])
            h = sowviz.sow(h, f"act_{i}")
    return jnp.mean(h**2)


PARAMS = make_params()
X = jax.random.normal(jax.random.PRNGKey(1), (4, WIDTH))


def forward_to(params, x, k):
    h = x
    for p in params[: k + 1]:
        h = jnp.tanh(h @ p["w"] + p["b"])
    return h


def downstream(params, h, k):
    for p in params[k + 1 :]:
        h = jnp.tanh(h @ p["w"] + p["b"])
    return jnp.mean(h**2)


def check_stats(summary, values):
    v = np.asarray(values, np.float64).ravel()
    assert summary["count"] == v.size
    assert summary["nan"] == 0
    np.testing.assert_allclose(summary["min"], v.min(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(summary["max"], v.max(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(summary["mean"], v.mean(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(summary["std"], v.std(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(summary["l2"], np.linalg.norm(v), rtol=1e-5)
    assert sum(summary["hist"]["counts"]) == v.size


def test_grad_mode_summaries_match_jax_grad():
    ins = sowviz.inspect(mlp, PARAMS, X, mode="grad")
    value, grads = ins.result
    ref_value, ref_grads = jax.value_and_grad(mlp)(PARAMS, X)
    np.testing.assert_allclose(value, ref_value, rtol=1e-6)
    np.testing.assert_allclose(grads[1]["w"], ref_grads[1]["w"], rtol=1e-5)
    for k in range(3):
        h = forward_to(PARAMS, X, k)
        ct = jax.grad(downstream, argnums=1)(PARAMS, h, k)
        probe = ins.probe(f"act_{k}")
        check_stats(probe.summaries["primal"], h)
        check_stats(probe.summaries["cotangent"], ct)
        # The scope's own automatic probe sees the same value leaving the scope.
        stage = ins.probe(f"layer_{k}")
        assert stage.auto
        check_stats(stage.summaries["cotangent"], ct)


def test_probe_json_is_made_when_first_read(monkeypatch):
    # `inspect` returns typed summaries; a probe's JSON is made when read (or by
    # `to_dict`), once. A script reading one probe pays for that one.
    from sowviz.summary import Summary
    from sowviz.summary_data import SummaryRow

    made = []
    for cls in (Summary, SummaryRow):
        original = cls.to_json
        monkeypatch.setattr(cls, "to_json", lambda self, _o=original: made.append(self) or _o(self))
    ins = sowviz.inspect(mlp, PARAMS, X, mode="grad")
    assert made == [] and ins.nonfinite is None
    probe = ins.probe("act_1")
    h = forward_to(PARAMS, X, 1)
    check_stats(probe.summaries["primal"], h)
    check_stats(probe.summaries["cotangent"], jax.grad(downstream, argnums=1)(PARAMS, h, 1))
    assert len(made) == 2
    model = ins.to_dict()
    total = sum(len(p.typed_summaries) for p in ins.probes)
    assert len(made) == total > 2  # every other probe's JSON, and act_1's not again
    assert model["probes"][ins.probes.index(probe)]["summaries"] is probe.summaries
    assert json.loads(ins.to_json())["probes"][0]["summaries"].keys() == {"primal", "cotangent"}


def test_jvp_mode_tangent_matches_jax_jvp():
    tangents = jax.tree_util.tree_map(jnp.ones_like, (PARAMS, X))
    ins = sowviz.inspect(mlp, PARAMS, X, mode="jvp", tangents=tangents)
    for k in range(3):
        t = jax.jvp(lambda p, x, k=k: forward_to(p, x, k), (PARAMS, X), tangents)[1]
        check_stats(ins.probe(f"act_{k}").summaries["tangent"], t)
    np.testing.assert_allclose(ins.result[1], jax.jvp(mlp, (PARAMS, X), tangents)[1], rtol=1e-5)


def test_all_mode_has_three_kinds_and_no_second_order_keys():
    ins = sowviz.inspect(mlp, PARAMS, X, mode="all")
    assert ins.to_dict()["modes"] == ["primal", "tangent", "cotangent"]
    ct = jax.grad(downstream, argnums=1)(PARAMS, forward_to(PARAMS, X, 1), 1)
    check_stats(ins.probe("act_1").summaries["cotangent"], ct)


def test_vjp_mode_with_cotangent_seed():
    ins = sowviz.inspect(mlp, PARAMS, X, mode="vjp", cotangents=jnp.asarray(2.0))
    ct = 2.0 * jax.grad(downstream, argnums=1)(PARAMS, forward_to(PARAMS, X, 2), 2)
    check_stats(ins.probe("act_2").summaries["cotangent"], ct)


def test_model_structure_and_probe_attachment():
    ins = sowviz.inspect(mlp, PARAMS, X)
    d = json.loads(ins.to_json(allow_nan=False))
    assert d["schema"] == "sowviz/1"
    assert d["mode"] == "grad" and d["modes"] == ["primal", "cotangent"]
    assert d["versions"]["sowviz"] == sowviz.__version__
    assert d["versions"]["jax"] == jax.__version__
    nodes = {n["id"]: n for n in d["nodes"]}
    assert d["root"] in nodes
    kinds = {n["kind"] for n in d["nodes"]}
    assert {"input", "output", "scope", "sow", "eqn"} <= kinds
    for p in d["probes"]:
        node = nodes[p["node"]]
        if not p["auto"]:
            assert node["kind"] == "sow" and node["label"] == p["name"]
    scopes = [n for n in d["nodes"] if n["kind"] == "scope" and n["parent"] == d["root"]]
    assert [s["label"] for s in scopes if s["label"].startswith("layer")] == [
        "layer_0",
        "layer_1",
        "layer_2",
    ]
    sow1 = next(n for n in d["nodes"] if n["kind"] == "sow" and n["label"] == "act_1")
    assert nodes[sow1["parent"]]["label"] == "layer_1"
    assert sow1["source"]["file"].endswith("test_inspection.py")
    for e in d["edges"]:
        assert nodes[e["source"]]["parent"] == nodes[e["target"]]["parent"]


def test_capture_levels():
    sows = sowviz.inspect(mlp, PARAMS, X, capture="sows")
    assert all(not p.auto for p in sows.probes) and len(sows.probes) == 3
    every = sowviz.inspect(mlp, PARAMS, X, capture="all")
    kinds = {every.graph.node(p.node).kind for p in every.probes}
    assert "eqn" in kinds
    assert len(every.probes) > len(sowviz.inspect(mlp, PARAMS, X).probes)


def test_nonfinite_values_are_counted():
    def bad(x):
        with jax.named_scope("root"):
            r = jnp.sqrt(x)  # NaN for negative inputs, infinite gradient at 0
        return jnp.sum(r)

    ins = sowviz.inspect(bad, jnp.array([-1.0, 0.0, 4.0]))
    s = ins.probe("root").summaries
    assert s["primal"]["nan"] == 1
    assert s["cotangent"]["nan"] == 0 and s["primal"]["count"] == 2


def test_scan_and_cond_stages_in_the_graph():
    def fn(x):
        def body(c, _):
            with jax.named_scope("cell"):
                c = jnp.sin(c)
            return c, c

        c, ys = jax.lax.scan(body, x, None, length=3)
        return jax.lax.cond(c[0] > 0, jnp.sum, lambda v: -jnp.sum(v), ys)

    ins = sowviz.inspect(fn, jnp.ones(2))
    kinds = [n.kind for n in ins.graph.nodes]
    assert "scan" in kinds and "cond" in kinds
    scan = {p.leaf: p.summaries for p in ins.probes if ins.graph.node(p.node).kind == "scan"}
    assert scan["[0]"]["primal"]["count"] == 2 and scan["[1]"]["primal"]["count"] == 6
    # `ys` carries the gradient; the final carry `c` only decides the branch (`c[0] > 0`
    # carries no tangent), so no cotangent was computed for it (none, not zeros)
    assert "cotangent" in scan["[1]"] and "cotangent" not in scan["[0]"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown `mode` 'hessian'"):
        sowviz.inspect(mlp, PARAMS, X, mode="hessian")
    with pytest.raises(TypeError, match="unknown option\\(s\\) 'bin'"):
        sowviz.inspect(mlp, PARAMS, X, bin=10)
    with pytest.raises(ValueError, match="unknown `capture` 'everything'"):
        sowviz.inspect(mlp, PARAMS, X, capture="everything")
    with pytest.raises(TypeError, match="`fn` must be callable"):
        sowviz.inspect("mlp", PARAMS, X)
    with pytest.raises(ValueError, match="`argnums`"):
        sowviz.inspect(mlp, PARAMS, X, argnums=5)


def test_model_is_deterministic():
    a = sowviz.inspect(mlp, PARAMS, X).to_dict()
    b = sowviz.inspect(mlp, PARAMS, X).to_dict()
    for d in (a, b):
        d.pop("created")
    assert a == b


def test_what_a_custom_rule_hides_is_reported():
    @jax.custom_vjp
    def clipped(x):
        return sowviz.sow(jnp.sin(x), "inside")

    def fwd(x):
        return jnp.sin(x), jnp.cos(x)  # does not call `clipped`: the sow is never reached

    clipped.defvjp(fwd, lambda c, g: (jnp.clip(g * c, -1, 1),))

    def fn(x):
        return jnp.sum(sowviz.sow(clipped(x), "outside") ** 2)

    ins = sowviz.inspect(fn, jnp.ones(3))
    notes = " ".join(n["message"] for n in ins.to_dict()["notes"])
    assert "'inside'" in notes and "not reached" in notes
    out = ins.probe("outside").summaries
    np.testing.assert_allclose(out["cotangent"]["mean"], 2 * np.sin(1.0), rtol=1e-5)
    primal = sowviz.inspect(fn, jnp.ones(3), mode="primal")
    assert primal.probe("inside").summaries["primal"]["count"] == 3


# --- arbitrary pytrees: array leaves traced, everything else static -------------------


def _same_tree(got, want, rtol=1e-6):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-7)


def test_equinox_module_argument_matches_filter_grad():
    eqx = pytest.importorskip("equinox")
    model = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.PRNGKey(0))  # holds activation functions
    x = jax.random.normal(jax.random.PRNGKey(1), (5, 3))

    def loss(model, x):
        return jnp.mean(jax.vmap(model)(x) ** 2)

    value, grads = sowviz.inspect(loss, model, x).result
    ref_value, ref_grads = eqx.filter_value_and_grad(loss)(model, x)
    np.testing.assert_allclose(value, ref_value, rtol=1e-6)
    _same_tree(grads, ref_grads, rtol=1e-5)  # a module, None at every non-array leaf


def test_flax_nnx_module_argument_matches_jax_grad():
    nnx = pytest.importorskip("flax.nnx")

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(3, 4, rngs=rngs)
            self.l2 = nnx.Linear(4, 1, rngs=rngs)

        def __call__(self, x):
            return self.l2(jax.nn.relu(self.l1(x)))

    net, x = Net(nnx.Rngs(0)), jnp.ones((5, 3))

    def loss(model, x):
        return jnp.mean(model(x) ** 2)

    value, grads = sowviz.inspect(loss, net, x).result
    ref_value, ref_grads = jax.value_and_grad(loss)(net, x)  # an NNX module is a pytree
    np.testing.assert_allclose(value, ref_value, rtol=1e-6)
    _same_tree(grads, ref_grads, rtol=1e-5)
    nnx_grads = nnx.grad(loss)(net, x)  # an nnx.State of the same values
    np.testing.assert_allclose(grads.l1.kernel[...], nnx_grads["l1"]["kernel"][...], rtol=1e-5)


def test_strings_dataclasses_and_python_numbers_are_static():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Config:  # not a pytree: one hashable, static leaf
        power: int
        name: str

    calls = []

    def loss(params, cfg, label, scale):
        calls.append(1)
        assert isinstance(label, str) and isinstance(scale, float)
        return scale * jnp.sum(params["w"] ** cfg.power) + len(label)

    params = {"w": jnp.arange(3.0), "note": "static text"}
    ins = sowviz.inspect(loss, params, Config(2, "sq"), "abc", 0.5)
    value, grads = ins.result
    ref = jax.value_and_grad(lambda w: loss({"w": w, "note": ""}, Config(2, "sq"), "abc", 0.5))
    ref_value, ref_gw = ref(params["w"])
    np.testing.assert_allclose(value, ref_value, rtol=1e-6)
    np.testing.assert_allclose(grads["w"], ref_gw, rtol=1e-6)
    assert grads["note"] is None
    # A static leaf keys the cache: another value traces again, the same one does not.
    n = len(calls)
    sowviz.inspect(loss, params, Config(2, "sq"), "abc", 0.5)
    assert len(calls) == n
    sowviz.inspect(loss, params, Config(3, "cube"), "abc", 0.5)
    assert len(calls) == n + 1


def test_unhashable_leaf_is_named_with_its_path():
    with pytest.raises(TypeError, match=r"`args\[1\]\['buf'\]`.*bytearray.*eqx.partition"):
        sowviz.inspect(lambda w, d: jnp.sum(w), jnp.ones(2), {"buf": bytearray(b"x")})


def test_argnums_on_an_integer_argument_is_a_clear_error():
    with pytest.raises(TypeError, match="no floating-point array leaves"):
        sowviz.inspect(lambda w, i: jnp.sum(w[i]), jnp.ones(3), jnp.array([0, 1]), argnums=1)


def test_inspect_inside_jit_is_a_clear_error():
    def f(w):
        return sowviz.inspect(lambda v: jnp.sum(v**2), w).result[0]

    with pytest.raises(TypeError, match=r"tracer.*outside the transformation"):
        jax.jit(f)(jnp.ones(3))


# --- integer and bool arguments in every mode ------------------------------------------


def xent(w, x, labels, mask):
    logp = jax.nn.log_softmax(x @ w)
    picked = jnp.take_along_axis(logp, labels[:, None], axis=1)[:, 0]
    return -jnp.sum(jnp.where(mask, picked, 0.0)) / jnp.sum(mask)


W3 = jax.random.normal(jax.random.PRNGKey(3), (6, 4))
LABELS, MASK = jnp.array([0, 3, 1, 2]), jnp.array([True, True, False, True])
F0 = np.zeros((4,), jax.dtypes.float0)


@pytest.mark.parametrize("mode", ["primal", "grad", "jvp", "vjp", "all"])
def test_integer_and_bool_arguments_in_every_mode(mode):
    args = (W3, X, LABELS, MASK)
    tw, tx = jnp.ones_like(W3), jnp.full_like(X, 0.5)
    # (`tangents` only where the mode pushes them: the others refuse them)
    pushed = {"tangents": (tw, tx, F0, F0)} if mode in ("jvp", "all") else {}
    ins = sowviz.inspect(xent, *args, mode=mode, **pushed)
    value, (_, tangent) = xent(*args), jax.jvp(xent, args, (tw, tx, F0, F0))
    ct_value, pull = jax.vjp(xent, *args)
    cts = pull(jnp.ones_like(ct_value))
    r = ins.result
    if mode == "primal":
        np.testing.assert_allclose(r, value, rtol=1e-6)
        return
    np.testing.assert_allclose(r[0], value, rtol=1e-6)
    if mode == "grad":
        np.testing.assert_allclose(r[1], jax.grad(xent)(*args), rtol=1e-5)
    if mode in ("jvp", "all"):
        np.testing.assert_allclose(r[1], tangent, rtol=1e-5)
    if mode in ("vjp", "all"):
        got = r[-1]
        np.testing.assert_allclose(got[0], cts[0], rtol=1e-5)
        np.testing.assert_allclose(got[1], cts[1], rtol=1e-5)
        assert got[2] is None and got[3] is None  # no cotangent space (jax: float0)


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda w: w * 2, r"scalar-output.*had shape: \(3,\).*mode='vjp'"),
        (lambda w: (jnp.sum(w), w), r"scalar-output.*Output was \(.*mode='vjp'.*has_aux=True"),
        (lambda w: jnp.sum(w).astype(jnp.int32), r"real-valued.*got int32.*mode='vjp'"),
        (lambda w: jnp.sum(w) * 1j, r"real-valued.*got complex64.*mode='vjp'"),
        # a Monitor user passing `jax.value_and_grad(loss)`; a loss returning a string
        (
            jax.value_and_grad(lambda w: jnp.sum(w**2)),
            r"has_aux=True.*already `jax.value_and_grad\(loss\)`, pass `loss` itself",
        ),
        (lambda w: "loss", r"Output was None: `fn` returned None, or a value that is not"),
    ],
)
def test_grad_mode_of_a_non_scalar_or_non_real_output_says_which_mode_instead(fn, message):
    # What `jax.grad` says of such a function, then sowviz's way out (the modes).
    with pytest.raises(TypeError, match=message):
        sowviz.inspect(fn, jnp.ones(3))


def test_a_constant_loss_has_its_value_and_zero_gradients():
    # `return 0.0` (a placeholder loss, or every term masked off) was a static output:
    # grad mode said "Output was None"
    w = jnp.ones((3, 2))
    value, grads = sowviz.inspect(lambda w: 0.5, w).result
    want_value, want_grads = jax.value_and_grad(lambda w: 0.5)(w)
    assert float(value) == want_value and jnp.shape(value) == ()
    np.testing.assert_array_equal(grads, want_grads)
    primal, tangent = sowviz.inspect(lambda w: 0.5, w, mode="jvp").result
    assert float(primal) == 0.5 and float(tangent) == 0.0
    # a number inside the output stays what it was (an Equinox field, `Dropout.p`)
    value, aux = sowviz.inspect(lambda w: (jnp.sum(w), 0.25), w, mode="primal").result
    assert aux == 0.25 and type(aux) is float


@jax.custom_vjp
def _clip_gradient(x):
    return x


_clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.01, 0.01),))


def _clipped_loss(w, x):
    return jnp.sum(_clip_gradient(jnp.tanh(x @ w)) ** 2)


@pytest.mark.parametrize("mode", ["jvp", "all"])
def test_forward_modes_through_a_custom_vjp_say_what_to_use_instead(mode):
    w, x = jnp.ones((3, 2)) / 3, jnp.ones((4, 3))
    value, grad = jax.value_and_grad(_clipped_loss)(w, x)
    got_value, got_grad = sowviz.inspect(_clipped_loss, w, x).result  # reverse mode works
    np.testing.assert_allclose(got_value, value, rtol=1e-6)
    np.testing.assert_allclose(got_grad, grad, rtol=1e-6)
    assert np.abs(np.asarray(grad)).max() <= 4 * 0.01 * 3  # the clipped cotangent
    with pytest.raises(TypeError, match=f"mode '{mode}' pushes tangents forward") as err:
        sowviz.inspect(_clipped_loss, w, x, mode=mode)
    assert "mode='grad' or 'vjp'" in str(err.value)
    assert "custom_vjp" in str(err.value.__cause__)  # JAX's own words, and its trace


def _pallas_loss(w, x):
    from jax.experimental import pallas as pl

    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = x_ref[...] * jnp.tanh(w_ref[...])

    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)
    return jnp.sum(out(x, w) ** 2)


def test_grad_through_an_operation_without_reverse_mode_says_what_jax_says():
    # A Pallas kernel has a JVP but no transpose: `jax.grad` refuses it with JAX's words,
    # and so does grad mode (it said "a primal output of the JVP is not known").
    w, x = jnp.eye(4) * 0.5, jnp.ones((4, 4)) * 0.1
    with pytest.raises(ValueError, match="does not support reverse-mode") as plain:
        jax.grad(_pallas_loss)(w, x)
    with pytest.raises(ValueError, match="does not support reverse-mode") as err:
        sowviz.inspect(_pallas_loss, w, x, mode="grad")
    assert "custom_vjp" in str(err.value) and 'mode="jvp"' in str(err.value)
    assert "Linearization failed" in str(plain.value)
    # and the way out it names works: forward mode equals jax.jvp
    t = (jnp.ones_like(w), jnp.zeros_like(x))
    got = sowviz.inspect(_pallas_loss, w, x, mode="jvp", tangents=t).result
    np.testing.assert_allclose(got[1], jax.jvp(_pallas_loss, (w, x), t)[1], rtol=1e-5)


def test_a_partial_is_titled_by_the_function_it_binds():
    import functools

    def step(w, x, lr):
        return jnp.sum(jnp.tanh(x @ w)) * lr

    w, x = jnp.ones((3, 2)) / 3, jnp.ones((4, 3))
    ins = sowviz.inspect(functools.partial(step, lr=0.5), w, x)
    assert ins.title == "partial(step)" == ins.to_dict()["title"]
    value, grad = jax.value_and_grad(step)(w, x, 0.5)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-6)


def test_a_type_shows_the_explicit_mesh_axes_that_split_it():
    # Under explicit sharding the sharding is part of a value's type: drawn without it,
    # a `reshard` read as a no-op (`float32[64,32]` in, `float32[64,32]` out).
    from jax.sharding import AxisType, reshard
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)

    def loss(w, x):
        h = jnp.tanh(x @ w)
        return jnp.mean(reshard(h, P("data", None)) ** 2)

    with jax.set_mesh(mesh):
        w = reshard(jnp.full((16, 32), 0.1), P(None, "model"))
        x = reshard(jnp.ones((64, 16)), P("data", None))
        ins = sowviz.inspect(loss, w, x)
        want = jax.value_and_grad(loss)(w, x)
    shapes = {n.label: n.shapes[0] for n in ins.graph.nodes if n.shapes}
    assert shapes["w"] == "float32[16,32@model]" and shapes["x"] == "float32[64@data,16]"
    # (`h = jnp.tanh(x @ w)`: a box named by what the line assigns)
    assert shapes["h"] == "float32[64@data,32@model]" and shapes["tanh"] == shapes["h"]
    assert shapes["reshard"] == "float32[64@data,32]"
    # (sharded sums: summed in another order than a plain run's)
    np.testing.assert_allclose(ins.result[0], want[0], rtol=1e-4)
    # the face's statistics are the same value's
    got = ins.probe("h").summaries["primal"]["mean"]
    np.testing.assert_allclose(got, float(jnp.tanh(x @ w).mean()), rtol=1e-5)


def test_inputs_keep_an_explicit_mesh_s_sharding_as_under_jax_jit():
    # `jax.make_mesh`'s axes are Explicit: jax.jit traces an argument with its sharding
    # in its type (`float32[4@data,3]`). A trace without it made relu's custom_jvp
    # rule refuse mixed shardings and a shard_map refuse its in_specs.
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((1,), ("data",), axis_types=(AxisType.Explicit,))
    w = jnp.linspace(-1.0, 1.0, 6).reshape(3, 2)
    x = jnp.arange(12.0).reshape(4, 3) / 10

    def relu_loss(w, x):
        return jnp.mean(jax.nn.relu(x @ w) ** 2)

    def mapped_loss(w, x):
        local = lambda w, x: jax.lax.psum(jnp.sum((x @ w) ** 2), "data")  # noqa: E731
        return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data")), out_specs=P())(w, x)

    cases = (
        (relu_loss, jax.device_put(w, NamedSharding(mesh, P(None, "data"))), x),
        (mapped_loss, w, jax.device_put(x, NamedSharding(mesh, P("data")))),
    )
    with jax.set_mesh(mesh):
        for loss, w_, x_ in cases:
            value, grad = jax.jit(jax.value_and_grad(loss))(w_, x_)
            got_value, got_grad = sowviz.inspect(loss, w_, x_).result
            np.testing.assert_allclose(got_value, value, rtol=1e-6)
            np.testing.assert_allclose(got_grad, grad, rtol=1e-6)
            t = jnp.ones_like(w_)
            _, ty = jax.jvp(loss, (w_, x_), (t, jnp.zeros_like(x_)))
            got = sowviz.inspect(loss, w_, x_, mode="jvp", tangents=(t, jnp.zeros_like(x_))).result
            np.testing.assert_allclose(got[1], ty, rtol=1e-5)


def test_a_parameter_sharded_over_explicit_mesh_axes_gets_its_gradient_placed_alike():
    # `jax.make_mesh`'s default axes are Explicit: a gradient's type carries its
    # sharding, and `with_sharding_constraint` (which places an Auto-sharded one)
    # refuses it. Grad mode and the Monitor raised at every step.
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    if jax.device_count() < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    place = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    w = place(jax.random.normal(jax.random.key(0), (8, 16)), P(None, "model"))
    x = place(jax.random.normal(jax.random.key(1), (4, 8)), P("data", None))

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    value, grad = jax.jit(jax.value_and_grad(loss))(w, x)
    got_value, got_grad = sowviz.inspect(loss, w, x).result
    np.testing.assert_allclose(got_value, value, rtol=1e-5)
    np.testing.assert_allclose(got_grad, grad, rtol=1e-5, atol=1e-7)
    assert got_grad.sharding.is_equivalent_to(w.sharding, 2)
    mon = sowviz.Monitor(loss, every=2)
    for _ in range(3):
        got_value, got_grad = mon.step(w, x)
        np.testing.assert_allclose(got_value, value, rtol=1e-5)
        np.testing.assert_allclose(got_grad, grad, rtol=1e-5, atol=1e-7)
        assert got_grad.sharding.is_equivalent_to(w.sharding, 2)
    mon.close()


def _waves(w):
    with jax.named_scope("waves"):
        y = jnp.sin(w)
    return jnp.sum(y**2)


_X64_CONTEXT = """
import json, sys, jax, jax.numpy as jnp, numpy as np, sowviz
sys.path.insert(0, "tests")
from test_inspection import _waves as f

with jax.enable_x64(True):
    w = jnp.linspace(-1, 1, 6, dtype=jnp.float64)
    value, grad = jax.jit(jax.value_and_grad(f))(w)
    ins = sowviz.inspect(f, w, mode="grad")
(probe,) = [p for p in ins.probes if p.name == "waves"]
print(json.dumps({
    "dtype": str(ins.result[1].dtype),
    "value": [float(ins.result[0]), float(value)],
    "grad": [np.asarray(ins.result[1]).tolist(), np.asarray(grad).tolist()],
    "probe": [probe.summaries["primal"]["dtype"], probe.summaries["primal"]["l2"],
              float(np.linalg.norm(np.sin(np.asarray(w))))],
}))
"""


def test_inspect_and_show_under_the_enable_x64_context(tmp_path):
    # `jax.enable_x64` holds in the thread that entered it only, and only while its
    # block runs: sowviz lowers its summary programs in a thread (a float64 program was
    # lowered as float32 there, and refused its arguments), and the widget compiles
    # other modes in one and switches modes after the block has ended. In a process of
    # one device, as a user's (this one has 8, where another path hid the failure).
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", SOWVIZ_CACHE_DIR=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", _X64_CONTEXT], env=env, capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["dtype"] == "float64"
    np.testing.assert_allclose(*got["value"], rtol=1e-13)
    np.testing.assert_allclose(*got["grad"], rtol=1e-13)
    assert got["probe"][0] == "float64"
    np.testing.assert_allclose(got["probe"][1], got["probe"][2], rtol=1e-12)

    with jax.enable_x64(True):
        w = jnp.linspace(-1, 1, 6, dtype=jnp.float64)
        widget = sowviz.show(_waves, w, warm=("all",))
    assert widget._wait_warm("all", 120)
    widget.mode = "all"
    assert (widget.model["mode"], widget.phase) == ("all", "ready")
    (probe,) = [p for p in widget.model["probes"] if p["name"] == "waves"]
    assert probe["summaries"]["cotangent"]["dtype"] == "float64"
    np.testing.assert_allclose(
        probe["summaries"]["cotangent"]["l2"], np.linalg.norm(2 * np.sin(w)), rtol=1e-12
    )


def test_a_custom_vjp_closing_over_a_traced_value_is_said_plainly():
    # A function given through `nondiff_argnums` that closes over `x`: plain
    # `jax.jit(jax.value_and_grad(loss))` takes it (the rule runs in the same trace),
    # `jax.grad(jax.jit(loss))` does not, nor can sowviz, which differentiates its
    # trace of `loss`. A deep UnexpectedTracerError became a sentence with the fix.
    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def apply(f, a):
        return f(a)

    apply.defvjp(lambda f, a: (f(a), a), lambda f, a, g: (jax.vjp(f, a)[1](g)[0],))

    def loss(w, x):
        return jnp.sum(apply(lambda a: jnp.tanh(a * x), w))

    w, x = jnp.ones(3), jnp.arange(3.0)
    with pytest.raises(TypeError):  # what JAX itself does with the trace differentiated
        jax.grad(jax.jit(loss))(w, x)
    with pytest.raises(
        jax.errors.UnexpectedTracerError, match=r"closes over a traced value.*closure_convert"
    ):
        sowviz.inspect(loss, w, x, mode="grad")
    np.testing.assert_allclose(sowviz.inspect(loss, w, x, mode="primal").result, loss(w, x))


def test_argnums_picks_what_jvp_vjp_and_all_differentiate():
    """Given, `argnums` is honoured in every mode: only those arguments get tangents
    (the others `None` or zeros in `tangents`) and their cotangents come back as
    grad's do; not given, every argument is differentiated, as `jax.jvp`/`jax.vjp`."""

    def f(w, x):
        return jnp.tanh(x @ w)

    w = jax.random.normal(jax.random.PRNGKey(0), (3, 2))
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 3))
    tw = jax.random.normal(jax.random.PRNGKey(2), w.shape)
    tx = jax.random.normal(jax.random.PRNGKey(3), x.shape)
    ct = jax.random.normal(jax.random.PRNGKey(4), (4, 2))

    _, want_t = jax.jvp(f, (w, x), (tw, jnp.zeros_like(x)))
    for tangents in ((tw, None), (tw, jnp.zeros_like(x))):
        _, t = sowviz.inspect(f, w, x, mode="jvp", argnums=0, tangents=tangents).result
        np.testing.assert_allclose(t, want_t, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"argument 1 is not in `argnums`"):
        sowviz.inspect(f, w, x, mode="jvp", argnums=0, tangents=(tw, tx))

    _, pull = jax.vjp(f, w, x)
    gw, gx = pull(ct)
    _, cw = sowviz.inspect(f, w, x, mode="vjp", argnums=0, cotangents=ct).result
    np.testing.assert_allclose(cw, gw, rtol=1e-5, atol=1e-6)
    _, t, (cx,) = sowviz.inspect(
        f, w, x, mode="all", argnums=(1,), tangents=(None, tx), cotangents=ct
    ).result
    np.testing.assert_allclose(cx, gx, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t, jax.jvp(f, (w, x), (jnp.zeros_like(w), tx))[1], rtol=1e-5)
    # not given: every argument, one cotangent tree each
    _, (cw, cx) = sowviz.inspect(f, w, x, mode="vjp", cotangents=ct).result
    np.testing.assert_allclose(cw, gw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cx, gx, rtol=1e-5, atol=1e-6)
    # the probe of `x` carries no tangent when only `w` is perturbed
    ins = sowviz.inspect(f, w, x, mode="jvp", argnums=0, tangents=(tw, None))
    assert "tangent" not in ins.probe("x").summaries


def test_probes_answer_to_the_names_a_user_sees():
    import equinox as eqx

    class Net(eqx.Module):
        conv1: eqx.nn.Linear
        head: eqx.nn.Linear

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.conv1, self.head = eqx.nn.Linear(4, 4, key=k1), eqx.nn.Linear(4, 1, key=k2)

        def __call__(self, x):
            with jax.named_scope("cholesky"):  # a scope named like the call inside it
                c = jnp.linalg.cholesky(jnp.outer(x, x) + 3.0 * jnp.eye(4))
            return self.head(jnp.tanh(self.conv1(c @ x)))

    net = Net(jax.random.key(0))
    x = jnp.linspace(-1.0, 1.0, 4)
    ins = sowviz.inspect(lambda m, x: jnp.sum(m(x)), net, x)
    path = ins.probe_path
    # the whole path wins over another probe's that ends with it
    assert path(ins.probe("cholesky")).endswith("Net/cholesky")
    assert path(ins.probe("cholesky/cholesky")).endswith("Net/cholesky/cholesky")
    # a module by its name alone, as by its label
    assert ins.probe("conv1") is ins.probe("conv1: Linear")
    assert ins.probe("Net/conv1") is ins.probe("conv1: Linear")
    want = net.conv1(jnp.linalg.cholesky(jnp.outer(x, x) + 3.0 * jnp.eye(4)) @ x)
    got = ins.probe("conv1").summaries["primal"]
    np.testing.assert_allclose(got["l2"], np.linalg.norm(want), rtol=1e-5)
    # a parameter by its name in the parameter table
    w = ins.probe("conv1.weight").summaries["primal"]
    np.testing.assert_allclose(w["l2"], np.linalg.norm(net.conv1.weight), rtol=1e-6)
    assert ins.probe("conv1.weight") is ins.probe("parameters/conv1/weight")
    # a near miss says what is there
    with pytest.raises(KeyError, match=r"did you mean 'conv1: Linear'"):
        ins.probe("conv1: Linea")


def test_a_lone_parameter_leaf_answers_to_its_name():
    # One leaf is drawn as the input `params.w`, two in the parameters group (`w`, `b`):
    # `probe("w")` found the second and raised KeyError on the first.
    def loss(params, x):
        return jnp.mean((x @ params["w"]) ** 2)

    params, x = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)}, jnp.ones((2, 4))
    ins = sowviz.inspect(loss, params, x)
    got = ins.probe("w")
    assert got is ins.probe("params.w")
    grad = jax.grad(loss)(params, x)["w"]
    np.testing.assert_allclose(got.summaries["cotangent"]["l2"], np.linalg.norm(grad), rtol=1e-5)


def test_probes_answer_to_dotted_module_paths_and_say_which_leaves_a_stage_has():
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.attn = nnx.Linear(3, 3, rngs=rngs)

        def __call__(self, x):
            return jnp.tanh(self.attn(x))

    class Split(nnx.Module):
        def __call__(self, x):
            return x * 2.0, x - 1.0

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.blocks = nnx.List([Block(rngs), Block(rngs)])
            self.split = Split()

        def __call__(self, x):
            for b in self.blocks:
                x = b(x)
            a, c = self.split(x)
            return jnp.sum(a * c)

    model = Model(nnx.Rngs(0))
    x = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
    ins = sowviz.inspect(lambda m, x: m(x), model, x)
    # as Python reaches the module: `blocks[1].attn`, the stage `blocks[1]/attn`
    got = ins.probe("blocks[1].attn")
    assert got is ins.probe("blocks[1]/attn")
    h = model.blocks[0](x)
    np.testing.assert_allclose(
        got.summaries["primal"]["l2"], np.linalg.norm(model.blocks[1].attn(h)), rtol=1e-5
    )
    # a stage of two outputs named without its leaf: which leaves there are
    with pytest.raises(KeyError, match=r"several output leaves.*'\[0\]', '\[1\]'"):
        ins.probe("split")
    with pytest.raises(KeyError, match=r"several output leaves"):
        ins.probe("Model.split")


def test_a_name_two_stages_share_is_refused_when_one_has_several_outputs():
    # `task/enc` also keeps what its backward pass needs (two leaves); `task#2/enc`
    # has one. `probe("enc")` returned `task#2/enc`'s, silently.
    def enc(w, x):
        return jnp.tanh(x @ w)

    def task(w, x):
        return jnp.mean(enc(w, x) ** 2)

    def meta(w, x):
        return task(w - 0.1 * jax.grad(task)(w, x), x)

    w = jax.random.normal(jax.random.PRNGKey(0), (4, 4))
    x = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)
    ins = sowviz.inspect(meta, w, x)
    with pytest.raises(KeyError, match=r"2 stages are called 'enc'.*'task/enc' with several"):
        ins.probe("enc")
    w2 = w - 0.1 * jax.grad(task)(w, x)
    l2 = ins.probe("task#2/enc").summaries["primal"]["l2"]
    np.testing.assert_allclose(l2, np.linalg.norm(np.tanh(x @ w2)), rtol=1e-5)
    # a leaf by its key alone: `leaf="output"` is `leaf="['output']"`
    first = ins.probe("task/enc", "output")
    assert first is ins.probe("task/enc", "['output']")
    np.testing.assert_allclose(
        first.summaries["primal"]["l2"], np.linalg.norm(np.tanh(x @ w)), rtol=1e-5
    )


def test_a_framework_s_functional_layers_are_boxes_with_their_data():
    # Flax Linen's MNIST-style CNN: `nn.avg_pool` (two equations) and `nn.max_pool`
    # (one) were unprobed primitives in the model's stage, their values unseen
    import flax.linen as nn

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(4, (3, 3))(x))
            x = nn.avg_pool(x, (2, 2), strides=(2, 2))
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
            return nn.Dense(2)(x.reshape((x.shape[0], -1)))

    model = CNN()
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 8, 1))
    params = model.init(jax.random.PRNGKey(1), x)["params"]

    def loss(p, x):
        return jnp.sum(model.apply({"params": p}, x) ** 2)

    ins = sowviz.inspect(loss, params, x)
    (cnn,) = [n for n in ins.graph.nodes if n.label == "CNN"]
    kids = [n.label for n in ins.graph.children(cnn.id)]
    assert kids[:5] == ["Conv_0", "relu", "avg_pool", "max_pool", "reshape"], kids
    h = nn.relu(nn.Conv(4, (3, 3)).apply({"params": params["Conv_0"]}, x))
    pooled = nn.avg_pool(h, (2, 2), strides=(2, 2))
    for name, want in (("avg_pool", pooled), ("max_pool", nn.max_pool(pooled, (2, 2), (2, 2)))):
        got = ins.probe(name).summaries
        assert list(got["primal"]["shape"]) == list(want.shape)
        np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(want), rtol=1e-5)
        assert "cotangent" in got


def _embed(p, x):
    cls = jnp.tile(p["cls"], (x.shape[0], 1, 1))
    return jnp.concatenate([cls, x], axis=1) + p["pos"]


def _encoder_loss(p, x):
    h = jnp.tanh(_embed(p, x) @ p["w"])
    return jnp.mean(jax.nn.logsumexp(h[:, 0], axis=-1) ** 2)


def test_every_box_your_code_draws_carries_its_data():
    # `_embed`'s three equations are its boxes (too few to fold by line): they were
    # drawn with no value and no gradient, beside probed stages. JAX's own work inside
    # a library function (`logsumexp`'s max, exp, log) stays unprobed: it is not yours.
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    p = {
        "cls": jax.random.normal(k[0], (1, 1, 6)),
        "pos": jax.random.normal(k[1], (1, 4, 6)),
        "w": jax.random.normal(k[2], (6, 5)),
    }
    x = jax.random.normal(k[3], (2, 3, 6))
    ins = sowviz.inspect(_encoder_loss, p, x, mode="grad")
    (embed,) = [n for n in ins.graph.nodes if n.label == "_embed"]
    boxes = ins.graph.children(embed.id)
    assert [n.label for n in boxes] == [
        "cls",
        "concatenate",
        "add",
    ]  # (`cls = jnp.tile(...)`: its line's box)
    by_node = {q.node: q.summaries for q in ins.probes}
    cls = jnp.tile(p["cls"], (2, 1, 1))
    cat = jnp.concatenate([cls, x], axis=1)
    out = cat + p["pos"]
    for box, want in zip(boxes, (cls, cat, out), strict=True):
        got = by_node[box.id]["primal"]
        assert list(got["shape"]) == list(want.shape)
        np.testing.assert_allclose(got["l2"], np.linalg.norm(want), rtol=1e-5)
    rest = lambda h: jnp.mean(jax.nn.logsumexp(jnp.tanh(h @ p["w"])[:, 0], axis=-1) ** 2)  # noqa: E731
    g = jax.grad(rest)(out)
    np.testing.assert_allclose(
        by_node[boxes[-1].id]["cotangent"]["l2"], np.linalg.norm(g), rtol=1e-5
    )
    (lse,) = [n for n in ins.graph.nodes if n.label == "logsumexp"]
    inside = [n for n in ins.graph.nodes if n.parent == lse.id]
    assert inside and not [n for n in inside if n.id in by_node]

    # nor another library's: Flax's Dense and LayerNorm (their stages carry the data)
    import flax.linen as nn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.LayerNorm()(nn.Dense(4)(x))

    params = Net().init(jax.random.PRNGKey(1), x)
    ins = sowviz.inspect(lambda q, x: jnp.sum(Net().apply(q, x) ** 2), params, x)
    probed = {q.node for q in ins.probes}
    stages = [n for n in ins.graph.nodes if n.label in ("Dense_0", "LayerNorm_0") and n.n_eqns]
    assert len(stages) == 2 and all(n.id in probed for n in stages)
    inside = [n for n in ins.graph.nodes if n.kind == "eqn" and n.parent != ins.graph.root]
    assert len(inside) > 5 and not [n for n in inside if n.id in probed]


def _loop_on_one_line(params, x):
    for p in params[:-1]:
        x = jax.nn.gelu(x @ p["w"] + p["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def test_a_loop_on_one_line_folds_a_stage_per_pass():
    # The hidden layers run on one line: folded by line, they were one stage holding
    # every layer, probed on the last one's output (layers 0 and 1 were nowhere).
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    params = [{"w": jax.random.normal(k, (8, 8)), "b": jnp.zeros(8)} for k in ks]
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 8))
    loss = lambda params, batch: jnp.mean(_loop_on_one_line(params, batch) ** 2)  # noqa: E731
    ins = sowviz.inspect(loss, params, x)
    h, want = x, []
    for p in params[:-1]:
        h = jax.nn.gelu(h @ p["w"] + p["b"])
        want.append(h)
    got = [ins.probe(name).summaries for name in ("x", "x#2", "x#3")]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g["primal"]["l2"], np.linalg.norm(w), rtol=1e-5)
    # the cotangent of the first layer's output, by plain JAX
    rest = lambda h: jnp.mean(_loop_on_one_line(params[1:], h) ** 2)  # noqa: E731
    g0 = jax.grad(rest)(want[0])
    np.testing.assert_allclose(got[0]["cotangent"]["l2"], np.linalg.norm(g0), rtol=1e-5)


def test_an_nnx_model_s_tangent_may_be_the_state_of_its_parameters():
    from flax import nnx

    model = nnx.Sequential(
        nnx.Linear(8, 8, rngs=nnx.Rngs(0)),
        nnx.BatchNorm(8, rngs=nnx.Rngs(0)),
        nnx.Linear(8, 1, rngs=nnx.Rngs(1)),
    )
    model.layers[1].mean[...] = jnp.ones(8)  # state that is not zero: no tangent for it
    model.eval()
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 8))

    def f(m, x):
        return m(x).sum()

    tangent = jax.tree.map(lambda a: jnp.full_like(a, 0.1), nnx.state(model, nnx.Param))
    ins = sowviz.inspect(f, model, x, mode="jvp", tangents=(tangent, jnp.zeros_like(x)))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    want = jax.jvp(lambda p: f(nnx.merge(graphdef, p, rest), x), (params,), (tangent,))
    np.testing.assert_allclose(ins.result[0], want[0], rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], want[1], rtol=1e-5)
    # a tangent of another structure: a short message, not the whole value printed
    with pytest.raises(ValueError, match="structure differs") as err:
        sowviz.inspect(f, model, x, mode="jvp", tangents=({"w": tangent}, None))
    assert len(str(err.value)) < 800


def _branchy(x):
    def expensive(x):
        with jax.named_scope("exp_branch"):
            y = jnp.exp(x) * 2.0
        return jnp.sum(y)

    def cheap(x):
        with jax.named_scope("cheap_branch"):
            y = x + 5.0
        return jnp.sum(y)

    return jax.lax.cond(jnp.sum(x) > 100.0, expensive, cheap, x)


def test_a_cond_branch_that_did_not_run_shows_no_values_and_says_so():
    # The capture's zeros for a branch that did not run are no values: `exp(x) * 2`
    # cannot be 0, and its panel showed min = max = 0 and a zero gradient.
    x = jnp.arange(3.0)
    ins = sowviz.inspect(_branchy, x)
    names = [p.name for p in ins.probes]
    assert "exp_branch" not in names and "cheap_branch" in names, names
    got = ins.probe("cheap_branch").summaries["primal"]
    np.testing.assert_allclose([got["min"], got["max"]], [5.0, 7.0])
    node = next(n for n in ins.graph.nodes if n.label == "exp_branch")
    # said of the branch around it, which is what did not run
    (note,) = [n for n in ins.to_dict()["notes"] if n["probe"] == node.parent]
    assert "did not run" in note["message"] and "`exp_branch`" in note["message"]
    assert note["message"].endswith("its stage `exp_branch` has no values.")
    assert ins.graph.node(ins.graph.node(node.parent).parent).kind == "cond"
    np.testing.assert_allclose(ins.result[1], jax.grad(_branchy)(x))


def test_a_branch_that_did_not_run_is_one_note_naming_its_stages():
    # optax's line search: a branch of 14 stages (some in a branch inside it) that did
    # not run was 14 notes, one per stage
    def f(x, k):
        def taken(x):
            with jax.named_scope("b1"):
                return jnp.sum(x + 5.0)

        def untaken(x):
            y = x
            for i, op in enumerate([jnp.sin, jnp.exp, jnp.tanh, jnp.cos, jnp.log1p]):
                with jax.named_scope(f"stage{i}"):  # unlike stages: no stacked group
                    y = op(y)
            y = jax.lax.cond(jnp.sum(y) > 0, lambda y: y * 2, lambda y: y - 1, y)
            return jnp.sum(y)

        return jax.lax.cond(k > 0, untaken, taken, x)

    x = jnp.arange(3.0)
    ins = sowviz.inspect(f, x, 0)
    notes = [n for n in ins.to_dict()["notes"] if "did not run" in n["message"]]
    assert len(notes) == 1, notes
    branch = ins.graph.node(notes[0]["probe"])
    assert branch.label.startswith("branch 1") and ins.graph.node(branch.parent).kind == "cond"
    msg = notes[0]["message"]
    assert "6 stages (`stage0`, `stage1`, `stage2` and 3 more) have no values" in msg, msg
    assert not any(p.name.startswith("stage") for p in ins.probes)
    np.testing.assert_allclose(ins.result[0], f(x, 0))


def test_a_note_said_alike_of_several_stages_is_one_note_listing_them():
    from _notes_program import energy_twice

    ins = sowviz.inspect(energy_twice, jnp.linspace(0.1, 1.0, 4))
    notes = [n for n in ins.to_dict()["notes"] if "differentiated inside" in n["message"]]
    assert len(notes) == 1, notes
    nodes = [ins.graph.node(i) for i in notes[0]["nodes"]]
    assert notes[0]["probe"] == nodes[0].id and len(nodes) == 2
    assert [ins.graph.node(n.parent).label for n in nodes] == ["first", "second"]
    assert all(n.label == "energy" for n in nodes)


def test_a_sow_in_a_branch_that_ran_in_some_iterations_is_summarised_over_those():
    # The capture records zeros where the branch did not run (`taken` says which);
    # they were counted: count 24 (of 15 values), min 0, 9 zeros, mean 0.93 (of 1.49).
    w = jnp.eye(3) * 0.5
    xs = jax.random.normal(jax.random.PRNGKey(7), (8, 3))

    def f(w, xs):
        def body(c, x):
            def hot(c):
                sowviz.sow(jnp.arange(3) + 7, "ints")  # an integer capture, by value
                return sowviz.sow(jnp.tanh(c @ w) + 1.0, "hot")

            c = jax.lax.cond(jnp.sum(x) > 0, hot, lambda c: c * 0.5, c)
            return c, jnp.sum(c)

        return jnp.sum(jax.lax.scan(body, jnp.ones(3), xs)[1])

    ran = np.asarray(jnp.sum(xs, 1)) > 0
    assert 0 < ran.sum() < 8  # the seed makes the branch run in some iterations only
    (_, _), raw = sowviz.save_intermediates(jax.value_and_grad(f))(w, xs)
    np.testing.assert_array_equal(raw["hot"]["taken"], ran)
    ins = sowviz.inspect(f, w, xs)
    for mode in ("primal", "cotangent"):
        want = np.asarray(raw["hot"][mode])[ran]  # the iterations that ran, NumPy
        got = ins.probe("hot").summaries[mode]
        assert got["count"] == want.size and got["nan"] == 0 and got["zeros"] == 0
        np.testing.assert_allclose(
            [got["min"], got["max"], got["mean"], got["std"]],
            [want.min(), want.max(), want.mean(), want.std()],
            rtol=1e-5,
        )
        per = got["per_iteration"]
        assert per["count"] == [3 if r else 0 for r in ran] and per["nonfinite"] == [0] * 8
        assert [m is None for m in per["mean"]] == [not r for r in ran]  # empty: no value
    # an integer capture has no NaN to mark them: it keeps the zeros (README)
    ints = ins.probe("ints").summaries["primal"]
    assert (ints["count"], ints["zeros"], ints["dtype"]) == (24, 3 * (8 - ran.sum()), "int32")
    assert ins.nonfinite is None  # the masked iterations are no NaN
    # the Monitor and `summarize=True` take the same path
    _, sums = sowviz.save_intermediates(f, summarize=True)(w, xs)
    assert int(sums["hot"]["primal"].count) == 3 * ran.sum()
    assert int(sums["hot"]["primal"].nan) == 0


def test_a_while_loop_s_rows_past_its_count_are_no_values():
    # `loops=N` stacks N rows, zeros past the loop's count (`iterations` says how many
    # ran); they were counted: count 24 (of 12 values), min 0, 12 zeros. Inside a scan
    # each outer iteration has a count of its own. With `loops="last"`, a loop that
    # never ran recorded zeros that were counted as 4 values.
    def inner(x, n):
        def body(s):
            i, v = s
            return i + 1, sowviz.sow(jnp.tanh(v) + 2.0, "v")

        return jax.lax.while_loop(lambda s: s[0] < n, body, (0, x))[1]

    def one(x):
        return jnp.sum(inner(x, 3))

    def nested(xs):
        def outer(c, x):
            return c + jnp.sum(inner(x, jnp.where(x[0] > 0, 2, 4))), None

        return jax.lax.scan(outer, 0.0, xs)[0]

    x = jnp.linspace(0.1, 1.0, 4)
    xs = jax.random.normal(jax.random.PRNGKey(3), (5, 3))
    for fn, arg in ((one, x), (nested, xs)):
        _, raw = sowviz.save_intermediates(fn, loops=6)(arg)
        ran = np.atleast_1d(np.asarray(raw["v"]["iterations"]))
        rows = np.asarray(raw["v"]["primal"]).reshape(len(ran), 6, -1)
        want = np.concatenate([rows[o, : ran[o]].ravel() for o in range(len(ran))])
        got = sowviz.inspect(fn, arg, loops=6, mode="primal").probe("v").summaries["primal"]
        assert (got["count"], got["nan"], got["zeros"]) == (want.size, 0, 0)
        np.testing.assert_allclose(
            [got["min"], got["max"], got["mean"]], [want.min(), want.max(), want.mean()], rtol=1e-5
        )
        per_row = [int(n) * rows.shape[2] for n in ran] if fn is nested else [4, 4, 4, 0, 0, 0]
        assert got["per_iteration"]["count"] == per_row
        assert got["per_iteration"]["nonfinite"] == [0] * len(per_row)
    # `loops="last"`: zeros when the loop never ran, at the top level or per outer row
    never = sowviz.inspect(lambda x: jnp.sum(inner(x, 0)), x, mode="primal")
    got = never.probe("v").summaries["primal"]
    assert (got["count"], got["nan"], got["zeros"], got["min"]) == (0, 0, 0, None)

    def some(xs):
        def outer(c, x):
            return c + jnp.sum(inner(x, jnp.where(x[0] > 0, 0, 2))), None

        return jax.lax.scan(outer, 0.0, xs)[0]

    ran = np.asarray(xs[:, 0] <= 0)
    assert ran.any() and not ran.all()
    got = sowviz.inspect(some, xs, mode="primal").probe("v").summaries["primal"]
    assert (got["count"], got["nan"]) == (3 * ran.sum(), 0)
    assert got["per_iteration"]["count"] == [3 if r else 0 for r in ran]


def test_a_stage_s_many_outputs_are_listed_in_numeric_order():
    # a loop carrying 12 arrays: `[2]` before `[10]`, as the probe picker lists them
    def f(x):
        carry = tuple(x * (i + 1.0) for i in range(12))
        out = jax.lax.fori_loop(0, 3, lambda i, c: tuple(jnp.sin(v) for v in c), carry)
        return sum(jnp.sum(v) for v in out)

    ins = sowviz.inspect(f, jnp.linspace(0.1, 1.0, 4))
    node = next(n for n in ins.graph.nodes if n.kind == "scan")
    leaves = [p.leaf for p in ins.probes if p.node == node.id]
    assert leaves == [f"[{k}]" for k in range(len(leaves))] and len(leaves) >= 11, leaves


def _tracing_line(call) -> str:
    with pytest.raises(jax.errors.ConcretizationTypeError) as info:
        call()
    return next(line for line in str(info.value).splitlines() if "while tracing" in line)


def test_a_tracing_error_names_the_user_s_function_and_arguments_as_jit_does():
    # The most common JAX mistake (a Python `if` on a traced value): sowviz traces its
    # own function over the arguments' leaves, and JAX's message named that one
    # (`flat_fn at sowviz/_program.py`, arguments `flat[0]`, `flat[1]`).
    def unjittable(params, x):
        loss = jnp.mean(jnp.tanh(x @ params["w"]) ** 2)
        if loss > 0.1:
            loss = loss * 2
        return loss

    params, x = {"w": jnp.ones((4, 2))}, jnp.ones((8, 4))
    want = _tracing_line(lambda: jax.jit(jax.value_and_grad(unjittable))(params, x))
    assert "unjittable at" in want and "params['w'] and x" in want
    assert _tracing_line(lambda: sowviz.inspect(unjittable, params, x)) == want
    assert _tracing_line(lambda: sowviz.Monitor(unjittable).step(params, x)) == want


def _cast(tree):
    return jax.tree.map(lambda a: a.astype(jnp.bfloat16), tree)


def _mixed_precision_loss(w, x):
    w, xc = _cast((w, x))  # jmp style: one stage, two outputs; only `w` is differentiated
    return jnp.sum((xc @ w).astype(jnp.float32) ** 2)


def test_a_stage_output_no_derivative_reaches_has_no_cotangent_not_zeros():
    # `xc` is no function of `w`: grad's backward pass never computes its cotangent
    # (dloss/dxc is far from zero). Its probe has none, as a stage of `x` alone has
    # none; the output `w` gets its real cotangent.
    w = jax.random.normal(jax.random.key(0), (4, 3))
    x = jax.random.normal(jax.random.key(1), (5, 4))
    ins = sowviz.inspect(_mixed_precision_loss, w, x)
    by_leaf = {p.leaf: p.summaries for p in ins.probes if p.name == "_cast"}
    assert set(by_leaf) == {"[0]", "[1]"}, by_leaf
    assert "cotangent" not in by_leaf["[1]"], by_leaf["[1]"]["cotangent"]
    wc = w.astype(jnp.bfloat16)
    xc = x.astype(jnp.bfloat16)
    want = jax.grad(lambda wc: jnp.sum((xc @ wc).astype(jnp.float32) ** 2))(wc)
    got = by_leaf["[0]"]["cotangent"]
    np.testing.assert_allclose(got["max"], float(want.max()), rtol=1e-2)
    np.testing.assert_allclose(got["min"], float(want.min()), rtol=1e-2)
    # in jvp mode its tangent is exactly zero (a tangent in `w` does not move it)
    t = sowviz.inspect(_mixed_precision_loss, w, x, mode="jvp", argnums=0)
    tan = {p.leaf: p.summaries for p in t.probes if p.name == "_cast"}["[1]"]["tangent"]
    assert tan["min"] == tan["max"] == 0.0
    # a user's own sow keeps the documented zeros
    from sowviz import save_intermediates, sow

    def tagged(w, x):
        w, xc = sow(_cast((w, x)), "cast")
        return jnp.sum((xc @ w).astype(jnp.float32) ** 2)

    _, inter = save_intermediates(jax.grad(tagged))(w, x)
    np.testing.assert_array_equal(inter["cast"]["cotangent"][1], jnp.zeros((5, 4), jnp.bfloat16))


def test_a_none_tangent_without_argnums_says_what_none_means_and_the_fix():
    # `tangents=(t, None)` reads as "do not differentiate the batch", which sowviz
    # honours with `argnums`; without it every argument is differentiated, and the
    # error said only that the tangent "has shape None".
    params = PARAMS[0]
    batch = {"image": X, "label": jnp.arange(4)}

    def loss(params, batch):
        return jnp.mean(jnp.tanh(batch["image"] @ params["w"] + params["b"]) ** 2)

    t = jax.tree_util.tree_map(jnp.ones_like, params)
    with pytest.raises(
        ValueError,
        match=r"`tangents\[1\]` is None, which means \"do not differentiate argument 1\", "
        r"but `argnums` is not given.*`args\[1\]\['image'\]`.*Pass `argnums=0`.*zeros",
    ):
        sowviz.inspect(loss, params, batch, mode="jvp", tangents=(t, None))
    # the fix it names gives jax.jvp's answer along `t`, the batch held still
    got = sowviz.inspect(loss, params, batch, mode="jvp", tangents=(t, None), argnums=0)
    want = jax.jvp(lambda p: loss(p, batch), (params,), (t,))
    np.testing.assert_allclose(got.result, want, rtol=1e-5)
    # a None inside a differentiated argument: only zeros fix it
    with pytest.raises(ValueError, match=r"leaf `args\[0\]\['b'\]` is None.*jnp.zeros_like"):
        sowviz.inspect(loss, params, batch, mode="jvp", tangents=({"w": t["w"], "b": None}, None))


def _named_by_the_error(ins, err):
    """The probe the error's own example (`probe('Net#2/bn', leaf='[0]')`) names."""
    import re

    name, leaf = re.search(r"probe\('([^']+)', leaf='([^']+)'\)", str(err)).groups()
    return ins.probe(name, leaf=leaf)


def test_a_name_several_stages_of_several_outputs_share_lists_them_and_the_fix():
    # A model called twice: `Net/bn` and `Net#2/bn`, each of two outputs (centred values
    # and their variance). `probe("bn")` said "no probe named 'bn' (did you mean
    # 'bn'?)", with `bn` among the probes it listed. (It was a BatchNorm, whose new
    # running statistics are named since round 14, its call returning one array:
    # test_nnx_state_round14.py.)
    nnx = pytest.importorskip("flax.nnx")

    class Centre(nnx.Module):
        def __call__(self, h):
            return h - h.mean(0), h.var(0)

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(4, 4, rngs=rngs)
            self.bn = Centre()

        def __call__(self, x):
            y, v = self.bn(self.lin(x))
            return y / jnp.sqrt(v + 1e-5)

    def loss(model, x1, x2):
        return jnp.mean(model(x1) ** 2) + jnp.mean(model(x2) ** 2)

    model = Net(nnx.Rngs(0))
    x1, x2 = jnp.ones((8, 4)), jnp.arange(32.0).reshape(8, 4)
    ins = sowviz.inspect(loss, model, x1, x2)
    with pytest.raises(
        KeyError,
        match=r"2 stages are called 'bn', each with several outputs: "
        r"'([^']*/)?Net/bn' \(\[0\], \[1\]\), '([^']*/)?Net#2/bn' \(\[0\], \[1\]\)\. .*"
        r"`probe\('Net#2/bn', leaf='\[0\]'\)`",
    ) as err:
        ins.probe("bn")
    # the call it suggests names the second call's centred output
    h = x2 @ model.lin.kernel[...] + model.lin.bias[...]
    got = _named_by_the_error(ins, err.value).summaries["primal"]
    np.testing.assert_allclose(got["l2"], np.linalg.norm(h - h.mean(0)), rtol=1e-4)
    assert "did you mean" not in str(err.value)


def test_two_equations_of_one_label_in_one_module_get_paths_of_their_own():
    # Two residual `add`s of one module: both drawn `add` (graph labels are kept), and
    # both had the path `Block/add`, so `probe` could name neither.
    nnx = pytest.importorskip("flax.nnx")

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.a, self.b = nnx.Linear(4, 4, rngs=rngs), nnx.Linear(4, 4, rngs=rngs)

        def __call__(self, x):
            x = x + self.a(x)
            return x + self.b(x)

    block = Block(nnx.Rngs(0))
    x = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
    ins = sowviz.inspect(lambda m, x: jnp.mean(m(x) ** 2), block, x)
    adds = [p for p in ins.probes if p.name == "add" and not p.leaf]
    assert [ins.probe_path(p) for p in adds] == ["Block/add", "Block/add#2"]
    assert [ins.graph.node(p.node).label for p in adds] == ["add", "add"]
    first = x + block.a(x)
    second = first + block.b(first)
    for name, want in (("Block/add", first), ("Block/add#2", second), ("add#2", second)):
        got = ins.probe(name).summaries["primal"]
        np.testing.assert_allclose(got["l2"], np.linalg.norm(want), rtol=1e-5)
    # the name both share lists both paths, and its example names one of them
    with pytest.raises(KeyError, match=r"'Block/add', 'Block/add#2'.*e\.g\. 'Block/add'\)"):
        ins.probe("add")
    assert all(ins.probe(ins.probe_path(p)) is p for p in adds)


def test_probe_takes_jaxs_own_key_path_of_a_parameter():
    # `jax.tree_util.keystr` of a leaf, as a user prints it from `tree_flatten_with_path`
    params = [{"log_nu": jnp.ones(3)}, {"log_nu": jnp.ones(3) * 2}]
    x = jnp.arange(3.0)

    def loss(params, x):
        return sum(jnp.sum(p["log_nu"] * x**i) for i, p in enumerate(params))

    ins = sowviz.inspect(loss, params, x)
    grads = jax.grad(loss)(params, x)
    for (path, _), grad in zip(
        jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(grads), strict=True
    ):
        got = ins.probe(jax.tree_util.keystr(path)).summaries["cotangent"]
        np.testing.assert_allclose(got["l2"], np.linalg.norm(grad), rtol=1e-6)
    with pytest.raises(KeyError, match="no probe named"):
        ins.probe("[2]['log_nu']")


def test_probe_takes_a_root_key_path_and_a_tensorboard_tag():
    # `.bias` (the model's own, beside `.cell.bias`) was "ambiguous"; a run log's
    # TensorBoard tag writes `layers[0]: Linear` as `layers[0]:_Linear`
    eqx = pytest.importorskip("equinox")
    from sowviz.runlog.naming import probe_tags

    class Model(eqx.Module):
        cell: eqx.nn.Linear
        bias: jax.Array

    model = Model(eqx.nn.Linear(3, 3, key=jax.random.key(0)), jnp.linspace(0.5, 1.5, 3))
    x = jnp.arange(3.0)

    def loss(model, x):
        return jnp.sum((model.cell(x) + model.bias) ** 2)

    ins = sowviz.inspect(loss, model, x)
    grads = eqx.filter_grad(loss)(model, x)
    flat = jax.tree_util.tree_flatten_with_path(eqx.filter(grads, eqx.is_array))[0]
    assert {jax.tree_util.keystr(p) for p, _ in flat} == {".cell.weight", ".cell.bias", ".bias"}
    for path, grad in flat:
        got = ins.probe(jax.tree_util.keystr(path)).summaries["cotangent"]
        np.testing.assert_allclose(got["l2"], np.linalg.norm(grad), rtol=1e-6)
    tags = probe_tags(ins.to_dict())
    spaced = [(p, t) for p, t in ((p, tags[p.id]) for p in ins.probes) if ":_" in t]
    assert spaced, tags
    for p, tag in spaced:
        assert ins.probe(tag, leaf=p.leaf).id == p.id


def test_a_sows_name_is_the_users_whatever_a_stage_is_called():
    # A `sow` named "mean" beside the `jnp.mean` stage of the loss: `probe("mean")`
    # answered with the stage (the loss, one value), silently.
    def loss(w, x):
        def f(xi):
            return jnp.sum((sowviz.sow(xi @ w, "mean") - 1.0) ** 2)

        return jnp.mean(jax.vmap(f)(x))

    w, x = jnp.ones(3), jnp.arange(12.0).reshape(4, 3)
    ins = sowviz.inspect(loss, w, x)
    got = ins.probe("mean").summaries
    sown = np.asarray(x @ w)
    assert got["primal"]["count"] == 4
    np.testing.assert_allclose(got["primal"]["mean"], sown.mean(), rtol=1e-6)
    # d loss / d sown = 2 (sown - 1) / 4
    np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm((sown - 1) / 2), rtol=1e-6)


_OBS = jnp.array([1.0, -2.0, 3.0, 0.5])


def _log_density(x, extra=0.0):
    scale = sowviz.sow(jnp.exp(x[1]), "scale") + extra
    return jnp.sum(-0.5 * ((_OBS - x[0]) / scale) ** 2 - jnp.log(scale))


def _leapfrog_like(x, extra=0.0):
    return jnp.sum(x + 0.1 * jax.grad(_log_density)(x, extra))


def test_a_sow_under_a_grad_inside_fn_shows_the_outer_modes_and_its_inner_cotangent_apart():
    # A sow in a log density whose `jax.grad` fn takes itself (every HMC step): its
    # face showed the inner dL/dscale as its gradient, and a primal-mode report was
    # coloured by that inner cotangent.
    x = jnp.array([0.3, 0.2])
    scale = float(jnp.exp(x[1]))
    outer = jax.grad(_leapfrog_like, 1)(x, 0.0)  # d fn / d (the sown value)
    inner = jax.grad(lambda s: jnp.sum(-0.5 * ((_OBS - x[0]) / s) ** 2 - jnp.log(s)))(scale)
    ins = sowviz.inspect(_leapfrog_like, x)
    assert ins.modes == ["primal", "cotangent"]
    got = ins.probe("scale").summaries
    np.testing.assert_allclose(got["primal"]["mean"], scale, rtol=1e-6)
    np.testing.assert_allclose(got["cotangent"]["mean"], outer, rtol=1e-5)
    apart = ins.probe("scale", leaf="inner cotangent").summaries
    np.testing.assert_allclose(apart["primal"]["mean"], inner, rtol=1e-5)
    primal = sowviz.inspect(_leapfrog_like, x, mode="primal")
    assert primal.modes == ["primal"]
    np.testing.assert_allclose(
        primal.probe("scale", leaf="inner cotangent").summaries["primal"]["mean"], inner, rtol=1e-5
    )


def _sparse_loss(w, A, x):
    return jnp.sum((A @ (x * w)) ** 2)


def test_a_sparse_matrix_s_leaves_are_named_by_its_attributes():
    # A `BCOO` gives JAX its children by position only: they were labelled
    # `[<flat index 0>]`, `[<flat index 1>]`, and found as `A/[<flat index 0>]`
    from jax.experimental import sparse

    A = sparse.BCOO.fromdense(jnp.eye(5) * 2.0)
    w, x = jnp.ones(5), jnp.arange(5.0)
    ins = sowviz.inspect(_sparse_loss, w, A, x, mode="all")
    g = ins.graph
    (group,) = [n for n in g.children(g.root) if n.label == "A"]
    assert [n.label for n in g.children(group.id)] == ["data", "indices"]
    assert not [n.label for n in g.nodes if "flat index" in n.label]
    # y = A @ (x * w) = 2 v with v = x * w; d sum(y^2) / d data_i = 2 y_i v_i = 4 v_i^2
    v = np.asarray(x * w)
    got = ins.probe("A/data").summaries
    np.testing.assert_allclose(got["primal"]["l2"], np.linalg.norm(np.asarray(A.data)), rtol=1e-6)
    np.testing.assert_allclose(got["cotangent"]["l2"], np.linalg.norm(4 * v**2), rtol=1e-5)


@jax.tree_util.register_pytree_node_class
class _Pair:
    """A pytree that gives JAX its children by position only, as `BCOO` does."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def tree_flatten(self):
        return (self.a, self.b), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def test_leaves_given_by_position_are_named_by_the_attribute_holding_them():
    from sowviz._args import _paths

    x, y = jnp.zeros(2), jnp.ones(3)
    assert _paths({"p": _Pair(x, [y, y])}) == ["['p'].a", "['p'].b[0]", "['p'].b[1]"]
    # one object in both attributes: which is which is unknown, so its position
    assert _paths([_Pair(x, x)]) == ["[0][0]", "[0][1]"]
