"""A Flax NNX model whose layers change their own state while they run (BatchNorm's
running statistics, Dropout's RNG counter), trained the way Flax's docs train it
(`nnx.Optimizer`, `nnx.value_and_grad` under `nnx.jit`) and by `sowviz.Monitor`: the
Monitor must carry that state out of its compiled program as `nnx.jit` does, so both
loops draw the same dropout masks and end with the same statistics and parameters.
`inspect` only looks: it leaves the model as it was."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import sowviz

from .checks import assert_close, node_paths


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(6, 16, rngs=rngs)
        self.bn = nnx.BatchNorm(16, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(self.dropout(nnx.relu(self.bn(self.linear(x)))))


def loss(model, x, y):
    logits = model(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def data(steps=5, batch=12):
    key = jax.random.PRNGKey(3)
    xs = jax.random.normal(key, (steps, batch, 6)) + 1.5  # BatchNorm has a mean to track
    ys = jax.random.randint(jax.random.fold_in(key, 1), (steps, batch), 0, 3)
    return list(zip(xs, ys, strict=True))


def _path(path: tuple) -> str:
    """An `nnx.State` path as the graph nests it (`('linear', 'kernel')`: `linear/kernel`)."""
    return "/".join(str(p) for p in path)


def _state(model, kind):
    def host(x):
        key = jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
        return np.asarray(jax.random.key_data(x) if key else x)

    return jax.tree_util.tree_map(host, nnx.state(model, kind))


@nnx.jit
def reference_step(model, optimizer, x, y):
    value, grads = nnx.value_and_grad(loss)(model, x, y)
    optimizer.update(model, grads)
    return value


def test_monitor_carries_batchnorm_statistics_and_dropout_rng_like_nnx_jit():
    batches = data()
    ref, watched = Net(nnx.Rngs(0)), Net(nnx.Rngs(0))
    # SGD, not Adam: the first linear map's bias has a zero gradient in exact arithmetic
    # (BatchNorm takes the mean out), which Adam would scale up from rounding noise.
    ref_opt = nnx.Optimizer(ref, optax.sgd(0.1), wrt=nnx.Param)
    opt = nnx.Optimizer(watched, optax.sgd(0.1), wrt=nnx.Param)
    mon = sowviz.Monitor(loss, every=2)  # steps 0, 2, 4 instrumented; 1, 3 plain
    want, got = [], []
    for x, y in batches:
        want.append(float(reference_step(ref, ref_opt, x, y)))
        value, grads = mon.step(watched, x, y)
        opt.update(watched, grads)
        got.append(float(value))
    mon.close()
    # The same dropout mask at every step would give other losses from step 1 on.
    np.testing.assert_allclose(got, want, rtol=2e-5)
    assert len(set(got)) == len(got)
    assert_close(_state(watched, nnx.BatchStat), _state(ref, nnx.BatchStat), what="BatchNorm")
    assert int(watched.dropout.rngs.count[...]) == int(ref.dropout.rngs.count[...]) == 5
    assert_close(_state(watched, nnx.Param), _state(ref, nnx.Param), what="parameters")
    # The statistics moved towards the data's mean (1.5 before the first linear map).
    assert np.abs(np.asarray(watched.bn.mean[...])).max() > 1e-3


@pytest.mark.parametrize("mode", ["grad", "jvp", "all", "primal"])
def test_inspect_leaves_the_state_alone_and_draws_it(mode):
    model = Net(nnx.Rngs(0))
    x, y = data(1)[0]
    before = _state(model, nnx.Not(nnx.Param))
    ins = sowviz.inspect(loss, model, x, y, mode=mode)
    assert_close(_state(model, nnx.Not(nnx.Param)), before, rtol=0, what="state")
    # The state the step would write shows as outputs of the program.
    drawn = set(node_paths(ins.graph, "output"))
    assert {"new model/bn/mean", "new model/bn/var", "new model/dropout.rngs/count"} <= drawn
    # The inputs part as `nnx.split(model, nnx.Param, ...)` does: the parameters, and
    # the model's state (BatchNorm statistics, the dropout stream) in a group apart.
    inputs = set(node_paths(ins.graph, "input"))
    params = {"parameters/" + _path(p) for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    others = nnx.to_flat_state(nnx.state(model, nnx.Not(nnx.Param)))
    assert params == {p for p in inputs if p.startswith("parameters/")}
    assert {p for p in inputs if p.startswith("model state/")} == {
        "model state/bn/mean",
        "model state/bn/var",
        "model state/dropout.rngs/count",
        "model state/dropout.rngs/key",
    }
    assert len(others) == 4
    # ... and the result is what one step of `nnx.jit` gives, dropout mask included.
    value = nnx.jit(loss)(Net(nnx.Rngs(0)), x, y)
    result = ins.result if mode == "primal" else ins.result[0]
    np.testing.assert_allclose(result, value, rtol=2e-5)


class Sowing(Net):
    """The same net keeping its hidden activation with `Module.sow` (Flax's older
    intermediates pattern): each call adds a variable to the model."""

    def __call__(self, x):
        h = nnx.relu(self.bn(self.linear(x)))
        self.sow(nnx.Intermediate, "hidden", h)
        return self.out(self.dropout(h))


def sowing_loss(model, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def _three_steps(make, fn, watched_fn=None):
    """Three steps of `fn` on fresh models from `make`: one by
    `nnx.jit(nnx.value_and_grad(fn))`, one by a Monitor of `watched_fn` (default `fn`);
    the losses of both, equal, and both models, to compare their state."""
    steps = data(3)
    ref, watched = make(nnx.Rngs(0)), make(nnx.Rngs(0))
    plain = nnx.jit(nnx.value_and_grad(fn))
    want = [float(plain(ref, x, y)[0]) for x, y in steps]
    mon = sowviz.Monitor(watched_fn or fn)
    got = [float(mon.step(watched, x, y)[0]) for x, y in steps]
    mon.close()
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert len(set(want)) == len(want)  # a repeated dropout mask would repeat a loss
    return ref, watched


@pytest.mark.filterwarnings("ignore:Using 'Module.sow\\(\\)' outside:DeprecationWarning")
def test_a_model_that_sows_still_gets_its_state_written_back():
    # `Module.sow` adds a variable, which shifted every leaf's position: the Monitor
    # wrote nothing back (the same dropout mask at every step), silently.
    with pytest.warns(UserWarning, match=r"added 1 variable.*hidden.*not written back"):
        ref, watched = _three_steps(Sowing, sowing_loss)
    assert int(watched.dropout.rngs.count[...]) == int(ref.dropout.rngs.count[...]) == 3
    assert_close(_state(watched, nnx.BatchStat), _state(ref, nnx.BatchStat), what="batch stats")


def test_an_nnx_jit_loss_returns_only_the_state_it_changes():
    # `nnx.jit` hands every variable back as a new value, so each parameter looked
    # assigned: "new model" drew all of them and the Monitor wrote them back every step.
    jitted = nnx.jit(loss)
    x, y = data(1)[0]
    ins = sowviz.inspect(jitted, Net(nnx.Rngs(0)), x, y, mode="grad")
    drawn = {p for p in node_paths(ins.graph, "output") if p.startswith("new model")}
    assert drawn == {"new model/bn/mean", "new model/bn/var", "new model/dropout.rngs/count"}
    np.testing.assert_allclose(ins.result[0], nnx.jit(loss)(Net(nnx.Rngs(0)), x, y), rtol=2e-5)

    ref, watched = _three_steps(Net, loss, jitted)
    assert int(watched.dropout.rngs.count[...]) == int(ref.dropout.rngs.count[...]) == 3
    assert_close(_state(watched, nnx.BatchStat), _state(ref, nnx.BatchStat), what="batch stats")
    assert_close(_state(watched, nnx.Param), _state(ref, nnx.Param), what="parameters")


class ScannedBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(6, 6, rngs=rngs)
        self.bn = nnx.BatchNorm(6, rngs=rngs)
        self.drop = nnx.Dropout(0.3, rngs=rngs)

    def __call__(self, x):
        return x + self.drop(nnx.relu(self.bn(self.linear(x))))


class Scanned(nnx.Module):
    """Flax's scan-over-layers with `nnx.remat`: the scan hands every layer's
    variables back, changed or not."""

    def __init__(self, rngs: nnx.Rngs):
        @nnx.split_rngs(splits=3)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return ScannedBlock(rngs)

        self.layers = make(rngs)
        self.out = nnx.Linear(6, 3, rngs=rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        @nnx.remat
        def forward(x, layer):
            return layer(x)

        return self.out(forward(x, self.layers))


def test_scan_over_layers_returns_only_the_state_it_changes():
    x, y = data(1)[0]
    ins = sowviz.inspect(loss, Scanned(nnx.Rngs(0)), x, y, mode="grad")
    drawn = {p for p in node_paths(ins.graph, "output") if p.startswith("new model")}
    want = {"new model/layers/bn/mean", "new model/layers/bn/var"}
    assert drawn == want | {"new model/layers/drop.rngs/count"}, drawn

    ref, watched = _three_steps(Scanned, loss)
    counts = np.asarray(watched.layers.drop.rngs.count[...])
    np.testing.assert_array_equal(counts, np.asarray(ref.layers.drop.rngs.count[...]))
    assert counts.tolist() == [3, 3, 3]
    assert_close(_state(watched, nnx.BatchStat), _state(ref, nnx.BatchStat), what="batch stats")


class Counting(nnx.Module):
    """A variable holding a Python int (a step counter), assigned while the model runs."""

    def __init__(self, rngs: nnx.Rngs):
        self.calls = nnx.Variable(0)
        self.out = nnx.Linear(6, 3, rngs=rngs)

    def __call__(self, x):
        self.calls.set_value(self.calls.get_value() + 1)
        return self.out(x)


def test_a_variable_holding_a_python_number_is_written_back():
    # It enters the program static, so it is never an input returned unchanged.
    def plain_loss(model, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    ref, watched = Counting(nnx.Rngs(0)), Counting(nnx.Rngs(0))
    plain = nnx.jit(nnx.value_and_grad(plain_loss))
    mon = sowviz.Monitor(plain_loss)
    for x, y in data(3):
        np.testing.assert_allclose(mon.step(watched, x, y)[0], plain(ref, x, y)[0], rtol=1e-5)
    mon.close()
    assert int(watched.calls.get_value()) == int(ref.calls.get_value()) == 3


class SpectralNorm(nnx.Module):
    """A power iteration in `lax.while_loop` over a `BatchStat` (not a `Param`)."""

    def __init__(self, rngs: nnx.Rngs):
        self.lin = nnx.Linear(6, 3, rngs=rngs)
        self.u = nnx.BatchStat(jnp.ones(3) / 2.0)

    def __call__(self, x):
        w = jax.lax.stop_gradient(self.lin.kernel[...])

        def body(carry):
            i, u = carry
            u = w.T @ (w @ u)
            return i + 1, u / jnp.linalg.norm(u)

        _, self.u[...] = jax.lax.while_loop(lambda c: c[0] < 3, body, (0, self.u[...]))
        return self.lin(x) / jnp.linalg.norm(w @ self.u[...])


def test_only_parameters_are_differentiated_as_nnx_grad_does():
    # Differentiating every float leaf took a tangent into the while loop over `u`,
    # which reverse mode refuses; `nnx.value_and_grad` differentiates `nnx.Param`s only.
    x, y = data(1)[0]
    value, grads = nnx.value_and_grad(loss)(SpectralNorm(nnx.Rngs(0)), x, y)
    ins = sowviz.inspect(loss, SpectralNorm(nnx.Rngs(0)), x, y, mode="grad")
    assert_close(ins.result[0], value)
    assert_close(ins.result[1], grads, what="grad")
    assert ins.result[1].u.get_value() is None  # state: no gradient, as nnx.grad's
    ref, watched = _three_steps(SpectralNorm, loss)
    assert_close(_state(watched, nnx.BatchStat), _state(ref, nnx.BatchStat), what="u")


class Tabled(nnx.Module):
    """A fixed table held as a plain array attribute, in no `nnx.Variable`."""

    def __init__(self, rngs: nnx.Rngs):
        self.table = jnp.linspace(-1.0, 1.0, 18).reshape(3, 6)
        self.lin = nnx.Linear(6, 3, rngs=rngs)

    def __call__(self, x):
        return self.lin(x + self.table[0])


def test_an_array_held_in_no_variable_is_not_differentiated_as_nnx_grad_does():
    x, y = data(1)[0]
    model = Tabled(nnx.Rngs(0))
    value, grads = nnx.value_and_grad(loss)(model, x, y)
    ins = sowviz.inspect(loss, model, x, y, mode="grad")
    assert_close(ins.result[0], value)
    assert_close(ins.result[1].lin, grads["lin"], what="grad")
    assert ins.result[1].table is None  # not a parameter: no gradient, as nnx.grad's
    # drawn among the inputs with its value, as state is, and no gradient
    table = ins.probe("table").summaries
    assert table["primal"]["size"] == 18 and table.get("cotangent") is None, sorted(table)


@pytest.mark.parametrize("mode", ["jvp", "all"])
def test_tangents_for_a_model_with_state_as_jax_jvp_takes_them(mode):
    """`jax.jvp` wants a tangent for every leaf, BatchNorm's statistics included:
    sowviz takes that tree, zeros (or None) for the state it does not differentiate,
    and refuses a non-zero one, naming the leaf."""

    class M(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(3, 3, rngs=rngs)
            self.bn = nnx.BatchNorm(3, use_running_average=True, rngs=rngs)

        def __call__(self, x):
            return self.bn(self.lin(x))

    def f(m, x):
        return jnp.sum(m(x) ** 2)

    m, x = M(nnx.Rngs(0)), jax.random.normal(jax.random.PRNGKey(1), (2, 3))
    params = nnx.state(m, nnx.Param)
    t_model = jax.tree.map(jnp.zeros_like, m)
    nnx.update(t_model, jax.tree.map(jnp.ones_like, params))  # ones on the parameters only
    tangents = (t_model, jnp.zeros_like(x))
    want_out, want_tan = jax.jvp(f, (m, x), tangents)
    got = sowviz.inspect(f, m, x, mode=mode, tangents=tangents).result
    np.testing.assert_allclose(got[0], want_out, rtol=1e-6)
    np.testing.assert_allclose(got[1], want_tan, rtol=1e-5)

    t_state = jax.tree.map(jnp.ones_like, m)  # ones on the BatchNorm statistics too
    with pytest.raises(ValueError, match=r"bn\.mean.*not zero.*nnx\.Param"):
        sowviz.inspect(f, m, x, mode=mode, tangents=(t_state, jnp.zeros_like(x)))


def test_a_layer_that_updates_state_shows_its_output_first():
    # BatchNorm returns its activations and updates its running statistics; Dropout
    # advances its RNG counter. The stage showed (and its panel opened on) the new
    # running mean, `f32[16] +2`, and Dropout's `uint32[] +1`.
    model = Net(nnx.Rngs(0))
    x, y = data()[0]
    ins = sowviz.inspect(loss, model, x, y)
    fresh = Net(nnx.Rngs(0))  # the same parameters and state, called directly
    h = fresh.bn(fresh.linear(x))
    (net,) = [n for n in ins.graph.nodes if n.label == "Net"]
    stage = {n.label: n for n in ins.graph.children(net.id)}
    # (the stage's type is what the call returns; the state it writes is named in its
    # probes, `mean (new)`: test_nnx_state_round14.py)
    assert stage["bn"].shapes == ("float32[12,16]",)
    assert stage["dropout"].shapes == ("float32[12,16]",)
    first = next(p for p in ins.probes if p.node == stage["bn"].id)
    assert first.leaf == "['output']"
    s = first.summaries["primal"]
    assert s["shape"] == [12, 16]
    np.testing.assert_allclose(s["l2"], np.linalg.norm(np.asarray(h)), rtol=1e-5)


@pytest.mark.skipif(not hasattr(nnx, "var_defaults"), reason="no HiJAX variables in this Flax")
def test_hijax_variables_are_refused_not_cached_as_static_leaves():
    # As static leaves, an optimizer's in-place update went unseen by the next call.
    with nnx.var_defaults(hijax=True):
        model = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match=r"`args\[0\]\.\w+` is a HijaxVariable.*hijax=False"):
        sowviz.inspect(lambda m, x: jnp.mean(m(x) ** 2), model, jnp.ones((3, 4)))


class Adapted(nnx.Module):
    """A frozen kernel with a trainable low-rank update (LoRA)."""

    def __init__(self, rngs: nnx.Rngs):
        self.w = nnx.Param(jax.random.normal(rngs.params(), (6, 3)) * 0.3)
        self.a = nnx.LoRAParam(jax.random.normal(rngs.params(), (6, 2)) * 0.3)
        self.b = nnx.LoRAParam(jnp.full((2, 3), 0.1))

    def __call__(self, x):
        return x @ (self.w[...] + self.a[...] @ self.b[...])


def test_a_diff_state_argnums_is_refused_with_a_split_that_equals_it():
    x, y = data(1)[0]
    model = Adapted(nnx.Rngs(0))
    with pytest.raises(TypeError, match=r"(?s)nnx\.DiffState.*nnx\.split\(model, nnx\.LoRAParam"):
        sowviz.inspect(loss, model, x, y, argnums=nnx.DiffState(0, nnx.LoRAParam))
    graphdef, trained, frozen = nnx.split(model, nnx.LoRAParam, ...)

    def loss_of(trained, frozen, x, y):
        return loss(nnx.merge(graphdef, trained, frozen), x, y)

    ins = sowviz.inspect(loss_of, trained, frozen, x, y, argnums=0)
    value, grads = nnx.value_and_grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam))(model, x, y)
    assert_close(ins.result[0], value)
    assert_close(ins.result[1], grads, what="LoRA grad")


def test_a_cached_partial_train_step_says_to_pass_the_model_and_optimizer():
    # `nnx.cached_partial(train_step, model, optimizer)` (Flax's performance guide)
    # failed with Flax's own TraceContextError and no word of what to do.
    def loss_fn(model, x, y):
        return jnp.mean((model(x) - y) ** 2)

    @nnx.jit
    def train_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss

    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    x, y = jnp.ones((8, 4)), jnp.zeros((8, 1))
    cached = nnx.cached_partial(train_step, model, opt)
    for run in (
        lambda: sowviz.inspect(cached, x, y, mode="primal"),
        lambda: sowviz.Monitor(cached, mode="primal").step(x, y),
    ):
        with pytest.raises(ValueError, match="not one of its arguments") as err:
            run()
        assert "step(model, optimizer, x, y)" in str(err.value)
    # what the message says to do works, and matches nnx.jit's step
    twin = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    twin_opt = nnx.Optimizer(twin, optax.sgd(0.1), wrt=nnx.Param)
    mon = sowviz.Monitor(train_step, mode="primal")
    for _ in range(2):
        np.testing.assert_allclose(
            mon.step(model, opt, x, y), train_step(twin, twin_opt, x, y), rtol=1e-6
        )
    np.testing.assert_allclose(model.kernel[...], twin.kernel[...], rtol=1e-6)
