"""A Monitor locates its first non-finite step on that step's own arguments, even when
the training loop changes them in place before the locate runs (round 14, lab finding 1).

`loss, grads = mon.step(model, x, y); opt.update(model, grads)`: `nnx.Optimizer`
assigns the Flax NNX model's parameters in place. A NaN in the batch `x` at step 2 made
NaN gradients, hence NaN parameters after `opt.update`; the locate (a re-run of step 2,
done later, at a flush or a later step) ran on the model as it was then and blamed
`parameters/l1/bias` instead of `x`. Here every step is flushed after `opt.update`, so
the locate always runs after the mutation (the case the timing only sometimes made).
The expected origin is checked independently: the step's parameters are finite and its
`x` is not (a plain `jnp.isfinite`)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import sowviz

BAD = 2  # the step whose input holds the NaN


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(4, 8, rngs=rngs)
        self.l2 = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
        return self.l2(nnx.gelu(self.l1(x)))


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def _batch(step: int):
    x = jax.random.normal(jax.random.PRNGKey(step), (8, 4))
    return x, x.sum(1, keepdims=True)


def _params_finite(model) -> bool:
    return all(bool(jnp.isfinite(v).all()) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))


def _train(every: int) -> tuple[sowviz.Monitor, nnx.Module]:
    model = Net(nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.sgd(0.05), wrt=nnx.Param)
    mon = sowviz.Monitor(loss_fn, every=every, throttle=60.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sowviz.NonFiniteWarning)
        for step in range(BAD + 2):
            x, y = _batch(step)
            if step == BAD:
                x = x.at[3, 1].set(jnp.nan)
                # the independent check of the expected origin: the input, not the model
                assert _params_finite(model) and not bool(jnp.isfinite(x).all())
            _, grads = mon.step(model, x, y)
            opt.update(model, grads)  # in place: the model's parameters are new objects' now
            if step == BAD:
                assert not _params_finite(model)  # the update wrote the NaN into the model
            mon.flush()  # the locate runs here, after the in-place update
    return mon, model


@pytest.mark.parametrize("every", [1, 10**9], ids=["recorded", "unrecorded"])
def test_nnx_optimizer_in_place_update_does_not_move_the_nan_origin(every):
    # every=1: step 2 is recorded and located when drained; every=10**9: step 2 is an
    # unrecorded step, whose flag read re-runs it with the probes, then locates it.
    mon, _ = _train(every)
    nf = mon.nonfinite
    assert nf is not None and nf.step == BAD
    assert nf.origins.forward.path == ("x",), nf.origins.forward.message
    assert "`x`" in nf.origins.forward.message


@pytest.mark.parametrize("every", [1, 10**9], ids=["recorded", "unrecorded"])
def test_parameters_made_finite_again_in_place_are_still_blamed(every):
    # The mirror case: the NaN is in the model's parameters at step 2, and the loop
    # repairs them in place right after the step. The re-run must see the NaN bias the
    # step got, not the repaired one (unrecorded: a re-run of the repaired model found
    # no NaN at all).
    model = Net(nnx.Rngs(0))
    mon = sowviz.Monitor(loss_fn, every=every, throttle=60.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sowviz.NonFiniteWarning)
        for step in range(BAD + 2):
            x, y = _batch(step)
            good = model.l1.bias[...]
            if step == BAD:
                model.l1.bias[...] = good.at[0].set(jnp.nan)
                assert bool(jnp.isfinite(x).all()) and not _params_finite(model)
            mon.step(model, x, y)
            model.l1.bias[...] = good  # repaired in place
            mon.flush()
    nf = mon.nonfinite
    assert nf is not None and nf.step == BAD
    assert nf.origins.forward.path[-2:] == ("l1", "bias"), nf.origins.forward.message


def test_plain_dict_parameters_updated_in_place():
    # Not only NNX: a dict of parameters a loop assigns in place (`params[k] = ...`)
    # keeps its place in the tree, so references to `args` saw the updated arrays too.
    def loss(params, x):
        return jnp.mean(jnp.tanh(x @ params["w"] + params["b"]) ** 2)

    params = {"w": jnp.ones((4, 3)) * 0.1, "b": jnp.zeros(3)}
    mon = sowviz.Monitor(loss, every=1, throttle=60.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sowviz.NonFiniteWarning)
        for step in range(BAD + 2):
            x, _ = _batch(step)
            if step == BAD:
                x = x.at[0, 0].set(jnp.nan)
            _, grads = mon.step(params, x)
            for k in params:  # in place, into the same dict
                params[k] = params[k] - 0.1 * grads[k]
            if step == BAD:
                assert not bool(jnp.isfinite(params["w"]).all())
            mon.flush()
    nf = mon.nonfinite
    assert nf is not None and nf.step == BAD
    assert nf.origins.forward.path == ("x",), nf.origins.forward.message
