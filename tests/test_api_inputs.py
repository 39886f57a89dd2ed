"""What `inspect`, `show` and `Monitor` make of unusual inputs: a function of no
arguments, a Python float to differentiate, options the mode does not use, tangents
of the wrong kind, a callable instance as `fn`, a sown typed PRNG key, and a tracer
that `fn` leaks (JAX's error names `fn`, not sowviz's wrapper)."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz import _program
from sowviz.options import InspectOptions

W = jnp.arange(3.0)


def _sum_of_squares(w):
    return jnp.sum(w**2)


# -- a function of no arguments -------------------------------------------------------


def test_a_function_of_no_arguments_in_mode_grad_says_there_is_nothing_to_differentiate():
    with pytest.raises(TypeError, match=r"no arguments.*nothing to differentiate.*mode='primal'"):
        sowviz.inspect(lambda: jnp.sum(W**2))
    with pytest.raises(TypeError, match=r"sowviz.Monitor.*no arguments"):
        sowviz.Monitor(lambda: jnp.sum(W**2)).step()


def test_a_function_of_no_arguments_runs_in_the_other_modes_as_plain_jax():
    f = lambda: jnp.sum(W**2)  # noqa: E731
    want_y, want_t = jax.jvp(f, (), ())
    y, pull = jax.vjp(f)
    assert float(sowviz.inspect(f, mode="primal").result) == float(f())
    got = sowviz.inspect(f, mode="jvp").result
    np.testing.assert_allclose(got, (want_y, want_t))
    got_y, got_cts = sowviz.inspect(f, mode="vjp").result
    assert float(got_y) == float(y) and got_cts == pull(jnp.ones_like(y)) == ()
    got = sowviz.inspect(f, mode="all").result
    assert float(got[0]) == float(want_y) and float(got[1]) == float(want_t) and got[2] == ()


# -- a leaked tracer ----------------------------------------------------------------------


class _Leaker:
    def __init__(self):
        self.leak = []

    def __call__(self, w):
        h = jnp.tanh(w)
        self.leak.append(h)
        return jnp.sum(h**2)


@pytest.mark.parametrize("kind", ["function", "instance"])
def test_a_leaked_tracer_is_said_of_the_users_function(kind):
    leak = []

    def leaker(w):
        h = jnp.tanh(w)
        leak.append(h)
        return jnp.sum(h**2)

    fn = leaker if kind == "function" else _Leaker()
    sowviz.inspect(fn, W)
    held = leak if kind == "function" else fn.leak
    with pytest.raises(jax.errors.UnexpectedTracerError) as err:
        held[0] + 1
    said = str(err.value)
    name = "leaker" if kind == "function" else "__call__"
    assert f"traced when the value leaked was {name} (traced by sowviz) at {__file__}:" in said
    assert "flat_fn" not in said and "_program.py" not in said


def test_tracing_errors_still_name_the_arguments_leaves():
    # (`traced_as` renames `flat[i]` by the arguments' paths: the wrapper's own
    # signature is kept for JAX to read)
    def branchy(params):
        return params["w"].sum() if params["w"][0] > 0 else 0.0

    with pytest.raises(jax.errors.TracerBoolConversionError) as err:
        sowviz.inspect(branchy, {"w": W})
    said = str(err.value)
    assert "params['w']" in said and "branchy at" in said and "flat[" not in said


# -- callable instances as `fn` -----------------------------------------------------------


class Loss:
    def __init__(self, s):
        self.s = s

    def __call__(self, w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2) * self.s


class ELoss(eqx.Module):
    s: float = 2.0

    def __call__(self, w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2) * self.s


WX = (jnp.ones((4, 3)) / 4, jnp.ones((5, 4)))


@pytest.mark.parametrize(
    ("fn", "args", "title"),
    [
        (Loss(3.0), WX, "Loss"),
        (ELoss(), WX, "ELoss"),
        (functools.partial(Loss(3.0), WX[0]), WX[1:], "partial(Loss)"),
        (Loss(3.0).__call__, WX, "__call__"),  # (a bound method: by its name, as before)
    ],
)
def test_a_callable_instance_is_titled_by_its_class(fn, args, title):
    ins = sowviz.inspect(fn, *args)
    assert ins.title == title
    assert ins.graph.nodes[0].label == title
    np.testing.assert_allclose(ins.result[0], fn(*args), rtol=1e-6)


def test_an_nnx_module_as_fn_is_titled_by_its_class():
    nnx = pytest.importorskip("flax.nnx")

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(4, 3, rngs=rngs)

        def __call__(self, x):
            return jnp.mean(self.lin(x) ** 2)

    block, x = Block(nnx.Rngs(0)), jnp.ones((5, 4))
    ins = sowviz.inspect(block, x, mode="primal")
    assert ins.title == "Block" and ins.graph.nodes[0].label == "Block"
    np.testing.assert_allclose(ins.result, block(x), rtol=1e-6)


# -- options the mode does not use -----------------------------------------------------

USED_BY = {
    "argnums": ("grad", "jvp", "vjp", "all"),
    "tangents": ("jvp", "all"),
    "cotangents": ("vjp", "all"),
}
VALUES = {"argnums": 0, "tangents": (jnp.ones(3),), "cotangents": jnp.asarray(10.0)}


@pytest.mark.parametrize("mode", ["primal", "grad", "jvp", "vjp", "all"])
@pytest.mark.parametrize("name", sorted(USED_BY))
def test_an_option_is_refused_in_a_mode_that_does_not_use_it(mode, name):
    options = {name: VALUES[name]}
    if mode in USED_BY[name]:  # taken (checked only: compiling 10 programs is slow)
        taken = InspectOptions.from_kwargs("inspect", mode, "stages", options)
        assert getattr(taken, name) is not None
        return
    modes = " and ".join(repr(m) for m in USED_BY[name])
    with pytest.raises(ValueError, match=rf"`{name}`.*ignored.*{modes}"):
        sowviz.inspect(_sum_of_squares, W, mode=mode, **options)
    with pytest.raises(ValueError, match=rf"sowviz.Monitor: `{name}`"):
        sowviz.Monitor(_sum_of_squares, mode=mode, **options)


def test_cotangents_in_mode_grad_were_ignored_and_are_refused():
    with pytest.raises(ValueError, match=r"`cotangents`.*mode 'grad' pulls back 1.*scale the loss"):
        sowviz.inspect(_sum_of_squares, W, mode="grad", cotangents=jnp.asarray(10.0))
    sowviz.Monitor(_sum_of_squares, argnums=None)  # (None: not given)


def test_show_takes_the_options_of_the_modes_its_widget_switches_to():
    ct = jnp.asarray(10.0)
    w = sowviz.show(_sum_of_squares, W, mode="grad", cotangents=ct, warm=())
    assert w.phase == "ready" and w.model["mode"] == "grad"
    want = jax.vjp(_sum_of_squares, W)[1](ct)
    np.testing.assert_allclose(w._rerun("vjp").result[1][0], want[0])  # the switch's run
    w.mode = "vjp"
    assert w.phase == "ready" and w.model["mode"] == "vjp"


def test_integer_tangents_are_refused_naming_the_leaf_and_dtypes():
    with pytest.raises(ValueError, match=r"tangent of leaf `args\[0\]\['w'\]` is int32.*float32"):
        sowviz.inspect(
            lambda p: jnp.sum(p["w"] ** 2),
            {"w": W},
            mode="jvp",
            tangents=({"w": jnp.ones(3, jnp.int32)},),
        )
    with pytest.raises(ValueError, match=r"is complex64.*float32.*real for a real one"):
        sowviz.inspect(_sum_of_squares, W, mode="jvp", tangents=(jnp.ones(3, jnp.complex64),))


def test_a_float64_numpy_tangent_is_taken_as_jax_jvp_takes_it():
    t = np.linspace(-1.0, 1.0, 3)  # float64; x64 off: JAX takes it as float32
    got = sowviz.inspect(_sum_of_squares, W, mode="jvp", tangents=(t,)).result
    np.testing.assert_allclose(got, jax.jvp(_sum_of_squares, (W,), (t,)), rtol=1e-6)


# -- a sown typed PRNG key -------------------------------------------------------------


def _noisy(w, key):
    k1, k2 = jax.random.split(key)
    sowviz.sow(k1, "k1")
    return jnp.sum((w + jax.random.normal(k2, w.shape)) ** 2)


@pytest.mark.parametrize("mode", ["primal", "grad"])
@pytest.mark.parametrize("make_key", [jax.random.key, jax.random.PRNGKey])
def test_a_sown_prng_key_is_summarised_as_its_bits(mode, make_key):
    key = make_key(0)
    ins = sowviz.inspect(_noisy, W, key, mode=mode)
    bits = np.asarray(jax.random.key_data(jax.random.split(key)[0]), np.float64)
    got = ins.probe("k1").summaries["primal"]  # (the JSON the front end gets)
    assert got["shape"] == [2] and got["dtype"] == "uint32" and got["nan"] == 0
    # (float32 statistics of uint32 bits: equal to float32's rounding)
    np.testing.assert_allclose([got["min"], got["max"]], [bits.min(), bits.max()], rtol=1e-6)
    want = _noisy(W, key) if mode == "primal" else jax.value_and_grad(_noisy)(W, key)
    for g, v in zip(jax.tree.leaves(ins.result), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, v, rtol=1e-6)


def test_a_sown_typed_key_is_summarised_by_save_intermediates_too():
    key = jax.random.key(0)
    _, inter = sowviz.save_intermediates(_noisy, summarize=True)(W, key)
    got = inter["k1"]["primal"].to_json()
    bits = np.asarray(jax.random.key_data(jax.random.split(key)[0]), np.float64)
    assert got["count"] == 2
    np.testing.assert_allclose(got["max"], bits.max(), rtol=1e-6)


# -- a Python float to differentiate ---------------------------------------------------


def _square(w):
    return w**2


def test_a_python_float_argument_is_differentiated_as_jax_grad_does():
    got = sowviz.inspect(_square, 3.0).result
    want = jax.value_and_grad(_square)(3.0)
    for g, v in zip(got, want, strict=True):
        assert float(g) == float(v) and g.dtype == v.dtype and g.weak_type == v.weak_type
    # traced, not static: another number reuses the trace and the compiled program
    again = sowviz.inspect(_square, 5.0).result
    assert [float(v) for v in again] == [25.0, 10.0]
    runner = _program.runner_for(_square, InspectOptions())
    assert len(runner.family._traced) == 1
    assert runner._instrumented._cache_size() == 1


def test_a_python_float_steps_a_monitor_as_jax_value_and_grad():
    mon = sowviz.Monitor(_square)
    for x in (3.0, 4.0):
        got, want = mon.step(x), jax.value_and_grad(_square)(x)
        assert [float(v) for v in got] == [float(v) for v in want]


def test_python_floats_named_by_argnums_are_differentiated_in_every_mode():
    def g(s, x):
        return jnp.sum(s * x)

    x = jnp.arange(3.0)
    got = sowviz.inspect(g, 2.0, x, argnums=(0, 1)).result
    want = jax.value_and_grad(g, argnums=(0, 1))(2.0, x)
    np.testing.assert_allclose(got[1][0], want[1][0])
    np.testing.assert_allclose(got[1][1], want[1][1])
    _, cts = sowviz.inspect(g, 2.0, x, mode="vjp", argnums=(0, 1)).result
    want_cts = jax.vjp(g, 2.0, x)[1](jnp.ones(()))
    np.testing.assert_allclose(cts[0], want_cts[0])
    np.testing.assert_allclose(cts[1], want_cts[1])


def test_other_python_numbers_stay_static():
    # not differentiated (argument 1, a model's float field): static, so Python may
    # branch on it, as under `equinox.filter_jit`
    def scaled(w, s):
        return jnp.sum(w**2) * (2.0 if s > 1 else 1.0)

    value, grad = sowviz.inspect(scaled, W, 3.0).result
    np.testing.assert_allclose(value, 2 * jnp.sum(W**2))
    np.testing.assert_allclose(grad, 4 * W)
    y, _ = sowviz.inspect(scaled, W, 3.0, mode="jvp").result  # (every argument, by default)
    np.testing.assert_allclose(y, 2 * jnp.sum(W**2))
    value, grad = sowviz.inspect(lambda p: p["w"].sum() * p["s"], {"w": W, "s": 2.0}).result
    assert grad["s"] is None  # a float in a pytree stays static, as `eqx.filter_grad`
    np.testing.assert_allclose(grad["w"], 2.0 * jnp.ones(3))


@pytest.mark.parametrize(
    ("dtype", "said"),
    [
        (jnp.int32, "must be floating point"),
        (jnp.bool_, "must be floating point"),
        (jnp.complex64, "imaginary part"),
    ],
)
def test_a_cotangent_of_another_kind_is_refused_naming_the_output(dtype, said):
    def f(w):
        return {"y": jnp.tanh(w) * 2}

    with pytest.raises(ValueError, match=rf"`\['y'\]` is {jnp.dtype(dtype).name}.*{said}"):
        sowviz.inspect(f, jnp.ones(3), mode="vjp", cotangents={"y": jnp.ones(3, dtype)})


def test_a_float64_numpy_cotangent_is_taken_as_jax_vjp_takes_it():
    def f(w):
        return jnp.tanh(w) * 2

    w, ct = jnp.arange(3.0), np.array([1.0, 2.0, 3.0])
    _, (got,) = sowviz.inspect(f, w, mode="vjp", cotangents=ct).result
    (want,) = jax.vjp(f, w)[1](jnp.asarray(ct, jnp.float32))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def test_a_tracer_leaked_under_save_intermediates_is_said_of_the_users_function():
    leak = []

    def leaker(w):
        leak.append(jnp.tanh(w))
        return jnp.sum(w)

    sowviz.save_intermediates(leaker)(W)
    with pytest.raises(jax.errors.UnexpectedTracerError) as err:
        leak[0] + 1
    said = str(err.value)
    assert f"traced when the value leaked was leaker (traced by sowviz) at {__file__}:" in said
    assert "flat_fn" not in said and "capture/api.py" not in said
