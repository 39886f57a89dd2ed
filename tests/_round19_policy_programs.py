"""Mixed-precision programs for tests/test_round19_policy.py: a Haiku MLP under a float16
policy (jmp's, or a hand-written one with jmp's three casts), its loss scaled as
`jmp.DynamicLossScale.scale` does, and a plain-JAX float16 model trained with a guarded
(skipped) update."""

from __future__ import annotations

import functools
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

F16_MAX = float(jnp.finfo(jnp.float16).max)  # 65504


class HandPolicy:
    """`jmp.Policy`'s three casts, written by hand: params float32, compute float16,
    output float32. Each cast is `jax.tree_util.tree_map` of `jnp.asarray` (as jmp's
    `cast_to` maps `astype`), so no frame of this file is on the cast's stack: Haiku's
    `mixed_precision.py` calls JAX directly, as with jmp."""

    param_dtype = jnp.float32
    compute_dtype = jnp.float16
    output_dtype = jnp.float32

    def __init__(self) -> None:
        self.cast_to_param = _caster(jnp.float32)
        self.cast_to_compute = _caster(jnp.float16)
        self.cast_to_output = _caster(jnp.float32)


def _caster(dtype: Any) -> Any:
    return functools.partial(jax.tree_util.tree_map, functools.partial(jnp.asarray, dtype=dtype))


class HandMLP(hk.Module):
    """`hk.nets.MLP([32, 32, 1])` as a module of the user's: its layers made in
    `__init__` (`mlp/~/linear_0`, as Haiku's), which takes no argument for
    `HandPolicy` to cast (jmp casts floating leaves only; `hk.nets.MLP`'s
    `output_sizes` are ints)."""

    sizes = (32, 32, 1)
    activate_final = False

    def __init__(self) -> None:
        super().__init__(name="mlp")
        self.layers = [hk.Linear(n, name=f"linear_{i}") for i, n in enumerate(self.sizes)]

    def __call__(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1 or self.activate_final:
                x = jax.nn.relu(x)
        return x


class HandSqrtMLP(HandMLP):
    sizes = (8, 4)
    activate_final = True


def mlp_net(cls: Any = None):
    """The MLP transformed: Haiku's `hk.nets.MLP([32, 32, 1])`, or `cls()`."""
    return hk.transform(lambda x: (cls() if cls is not None else hk.nets.MLP([32, 32, 1]))(x))


def mlp_args(w1_scale: float = 200.0, w2_scale: float = 1.0):
    """Params and input of the MLP: layer 1's weights scaled by `w1_scale` (its output
    reaches ~1e4 in float16, still finite), layer 2's by `w2_scale`."""
    x = jax.random.normal(jax.random.PRNGKey(1), (8, 16)) * 30.0
    params = mlp_net().init(jax.random.PRNGKey(0), x)
    params = jax.tree_util.tree_map(lambda a: a, params)  # (a mutable copy)
    params["mlp/~/linear_1"]["w"] = params["mlp/~/linear_1"]["w"] * w1_scale
    params["mlp/~/linear_2"]["w"] = params["mlp/~/linear_2"]["w"] * w2_scale
    return params, x


def hand_scaled_loss(params, x, scale):
    """The loss as `jmp.DynamicLossScale.scale` makes it: `loss * scale` (float32)."""
    y = mlp_net(HandMLP).apply(params, None, x)
    return jnp.mean(y**2) * scale


def jmp_scaled_loss(params, x, loss_scale):
    y = mlp_net().apply(params, None, x)
    return loss_scale.scale(jnp.mean(y**2))


def sqrt_loss(params, x):
    """`sqrt` of the policy's float32 output, zero where the final ReLU cut: its float32
    backward is +Inf there (`sqrt`'s derivative at 0), before any cast."""
    y = mlp_net(HandSqrtMLP).apply(params, None, x)
    return jnp.sum(jnp.sqrt(y))


def sqrt_args():
    x = jnp.linspace(-1.0, 1.0, 24).reshape(4, 6)
    return mlp_net(HandSqrtMLP).init(jax.random.PRNGKey(2), x), x


# -- a float16 model trained with a guarded update ---------------------------------------


def predict(params, x):
    h = jnp.tanh(x.astype(jnp.float16) @ params["w1"].astype(jnp.float16))
    return (h @ params["w2"].astype(jnp.float16)).astype(jnp.float32)


def loss(params, x, y, scale):
    """The scaled loss: gradients in float16 overflow while `scale` is too large."""
    return jnp.mean((predict(params, x) - y) ** 2) * scale


def train_args():
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {
        "w1": jax.random.normal(k1, (8, 16)) * 0.3,
        "w2": jax.random.normal(k2, (16, 1)) * 0.3,
    }
    x = jax.random.normal(k3, (32, 8))
    return params, x, jnp.sum(x, axis=1, keepdims=True)


def all_finite(tree) -> bool:
    return all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(tree))


def train(step_fn, n: int = 12, poison: int | None = None, scale: float = 2.0**24):
    """A guarded loop, as dynamic loss scaling runs one: unscale the gradients, apply the
    update only when they are finite (else skip it and halve the scale), double the
    scale every 4 good steps. `step_fn(params, x, y, scale)` -> (value, grads): the
    Monitor's step, or plain `jax.value_and_grad(loss)`. `poison`: the step at which a
    parameter is NaN (the guard was bypassed). Returns the skipped steps."""
    params, x, y = train_args()
    scale = jnp.float32(scale)
    skipped, good = [], 0
    for step in range(n):
        if step == poison:
            params = dict(params, w2=params["w2"].at[0, 0].set(jnp.nan))
        _, grads = step_fn(params, x, y, scale)
        grads = jax.tree_util.tree_map(functools.partial(_unscale, scale), grads)
        if all_finite(grads):
            params = jax.tree_util.tree_map(lambda p, g: p - 1e-2 * g, params, grads)
            good += 1
            scale = scale * 2 if good % 4 == 0 else scale
        else:
            skipped.append(step)
            scale = scale / 2
    return skipped


def _unscale(scale, g):
    return g / scale


def plain_skipped(n: int = 12, poison: int | None = None) -> list[int]:
    """The steps the guarded loop skips, run on plain `jax.value_and_grad` (no sowviz);
    from the poisoned step on, the loss is NaN too: those are not skipped but non-finite."""
    vg = jax.jit(jax.value_and_grad(loss))
    skipped = train(vg, n, poison)
    return [s for s in skipped if poison is None or s < poison]


def as_np(x) -> np.ndarray:
    return np.asarray(x, np.float64)
