"""Flax NNX's own capture points, written as the NNX docs write them: a module's
`self.sow(nnx.Intermediate, "h", h)` and `self.perturb("h", h)`. Under `nnx.jit` the
sown value lands on the model; a plain function of the split model (what `inspect`
traces, as `jax.jit` would) loses it. `inspect` draws each as a sow point in its
module's stage, with the value and the gradient NNX itself gives: `nnx.pop` of the
sown values, and `nnx.grad` with respect to the perturbations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import sowviz

from .checks import STAT_RTOL, node_paths


class Block(nnx.Module):
    def __init__(self, width: int, rngs: nnx.Rngs):
        self.linear = nnx.Linear(width, width, rngs=rngs)

    def __call__(self, x):
        h = self.linear(x)
        self.sow(nnx.Intermediate, "pre_act", value=h)  # (by keyword too)
        return nnx.relu(self.perturb("act", h))


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.blocks = nnx.List([Block(8, rngs) for _ in range(2)])
        self.out = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def loss(model, x):
    # Flax >= 0.12: sows are collected by `nnx.capture` (outside it they are deprecated)
    y, _ = nnx.capture(model, nnx.Intermediate)(x)
    return jnp.mean(y**2)


def test_nnx_sow_and_perturb_are_drawn_with_their_values_and_gradients():
    model = Net(nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 8))
    # NNX's own answer: the sown values, and d loss / d h by the perturbations (NNX's
    # gradient extraction: capture them once, then differentiate with respect to them)
    _, sown = nnx.capture(model, nnx.Intermediate)(x)
    _, perturbations = nnx.capture(model, nnx.Perturbation)(x)

    def perturbed(model, perturbations, x):
        return nnx.capture(lambda m, x: jnp.mean(m(x) ** 2), init=perturbations)(model, x)

    grads = nnx.grad(perturbed, argnums=1)(model, perturbations, x)

    ins = sowviz.inspect(loss, model, x, mode="grad")
    # (the two alike blocks may be drawn stacked, `Net/blocks[0–1] (×2)/blocks[0]/act`)
    sows = {p.replace("blocks[0–1] (×2)/", ""): n for p, n in node_paths(ins.graph, "sow").items()}
    assert {p for p in sows if p.endswith("act")} == {
        f"Net/blocks[{i}]/{name}" for i in range(2) for name in ("pre_act", "act")
    }, sorted(sows)
    by_node = {p.node: p for p in ins.probes}
    for i in range(2):
        pre = by_node[sows[f"Net/blocks[{i}]/pre_act"].id].summaries
        want = np.asarray(sown["blocks"][i]["pre_act"].get_value()[0])
        np.testing.assert_allclose(pre["primal"]["l2"], np.linalg.norm(want), rtol=STAT_RTOL)
        np.testing.assert_allclose(pre["primal"]["max"], want.max(), rtol=STAT_RTOL)
        act = by_node[sows[f"Net/blocks[{i}]/act"].id].summaries
        g = np.asarray(grads["blocks"][i]["act"][...])
        assert np.linalg.norm(g) > 0
        np.testing.assert_allclose(act["cotangent"]["l2"], np.linalg.norm(g), rtol=STAT_RTOL)
        np.testing.assert_allclose(act["cotangent"]["mean"], g.mean(), rtol=1e-4, atol=1e-7)
        # `pre_act` is the same `h` (NNX stores its sown copy; the module computes on
        # with `h`): its gradient is d loss / d h too, not the zero of the stored copy
        np.testing.assert_allclose(pre["cotangent"]["l2"], np.linalg.norm(g), rtol=STAT_RTOL)
    # inspect only looks: nothing was added to the model
    assert not nnx.state(model, nnx.Intermediate) and not nnx.state(model, nnx.Perturbation)
