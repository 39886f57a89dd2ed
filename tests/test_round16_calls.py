"""Round 16: function-call stages around derivatives and calls back.

- `force = jax.grad(lambda R: -energy(R))`, then `F = force(R)` (JAX-MD's idiom): one
  box `force` holding `energy` and `energy (backward)`, whose output is the forces. The
  lambda's own `neg` was a box `force` of the scalar -E beside them, and the forces came
  out of `energy (backward)`.
- Equinox's `MultiheadAttention` calling the user's `process_heads` back: the call is a
  stage directly in `attn`, not inside a box named after the caller's line (`x = x +
  self.attn(...)` drew a box `x`, or `Block:N` without source, around it).
"""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import sowviz


def _energy(R):
    dr2 = jnp.sum((R[:, None] - R[None]) ** 2, -1)
    mask = ~jnp.eye(R.shape[0], dtype=bool)
    return 0.5 * jnp.sum(jnp.where(mask, jnp.exp(-dr2), 0.0))


force = jax.grad(lambda R: -_energy(R))


def _step(i, state):
    R, V = state
    F = force(R)
    V = V + 0.01 * F
    R = R + 0.01 * V
    return R, V


def _nvt(R0, V0):
    R, _ = lax.fori_loop(0, 3, _step, (R0, V0))
    return jnp.sum(R**2)


def _forces_once(R0, V0):
    F = force(R0)
    return jnp.sum(F * V0)


def _forces_inline(R0, V0):
    F = jax.grad(lambda R: -_energy(R))(R0)
    return jnp.sum(F * V0)


def _value_and_forces(R0, V0):
    e, F = jax.value_and_grad(lambda R: -_energy(R))(R0)
    return e + jnp.sum(F * V0)


def _positions():
    R0 = jax.random.normal(jax.random.PRNGKey(0), (8, 2))
    return R0, jnp.linspace(-1.0, 1.0, 16).reshape(8, 2)


def _children(g, node):
    return [n.label for n in g.children(node.id)]


def _scope(g, label):
    found = [n for n in g.nodes if n.kind == "scope" and n.label == label]
    assert len(found) == 1, [n.label for n in g.nodes if n.kind == "scope"]
    return found[0]


def _plain_forces(R):
    return -jax.grad(_energy)(R)


def test_forces_of_a_grad_of_a_lambda_are_one_box_holding_the_energy_in_a_loop():
    R0, _ = _positions()
    V0 = jnp.zeros_like(R0)
    ins = sowviz.inspect(_nvt, R0, V0, mode="grad")
    g = ins.graph
    box = _scope(g, "force")
    assert g.node(box.parent).kind == "scan"  # (the fori_loop's body)
    assert box.shapes == ("float32[8,2]",)  # the forces, not the scalar -E
    inside = _children(g, box)
    assert "_energy" in inside and "_energy (backward)" in inside, inside
    loop = g.node(box.parent)
    assert not any(c.startswith("_energy") for c in _children(g, loop)), _children(g, loop)
    # its values, per iteration, are the forces plain `jax.grad` gives at each step
    R, V, want = R0, V0, []
    for i in range(3):
        want.append(_plain_forces(R))
        R, V = _step(i, (R, V))
    want = jnp.stack(want)
    got = ins.probe("force").summaries["primal"]
    assert got["shape"] == [3, 8, 2]
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(want)), rtol=1e-5)
    np.testing.assert_allclose(got["mean"], float(jnp.mean(want)), atol=1e-6)


@pytest.mark.parametrize(("fn", "label"), [(_forces_once, "force"), (_forces_inline, "F")])
def test_forces_of_a_grad_of_a_lambda_are_one_box_at_the_top_level(fn, label):
    R0, V0 = _positions()
    ins = sowviz.inspect(fn, R0, V0, mode="grad")
    g = ins.graph
    box = _scope(g, label)
    assert box.parent == g.root and box.shapes == ("float32[8,2]",)
    assert {"_energy", "_energy (backward)"} <= set(_children(g, box))
    assert not any(c.startswith("_energy") for c in _children(g, g.node(g.root)))
    want = _plain_forces(R0)
    got = ins.probe(label).summaries
    np.testing.assert_allclose(got["primal"]["l2"], float(jnp.linalg.norm(want)), rtol=1e-5)
    np.testing.assert_allclose(got["primal"]["mean"], float(jnp.mean(want)), atol=1e-6)
    # dloss/dF = V0
    np.testing.assert_allclose(got["cotangent"]["l2"], float(jnp.linalg.norm(V0)), rtol=1e-5)


def test_a_value_and_grad_line_keeps_its_evaluations_beside_its_own_work():
    # `e, F = jax.value_and_grad(...)` gets the lambda's value too: its fold (`e, F`)
    # holds that value, and the train-step reading (README) stays
    R0, V0 = _positions()
    g = sowviz.inspect(_value_and_forces, R0, V0, mode="grad").graph
    top = _children(g, g.node(g.root))
    assert "_energy" in top and "_energy (backward)" in top, top


_BLOCK = """
import jax
import equinox as eqx


class Block(eqx.Module):
    attn: eqx.nn.MultiheadAttention
    rope: eqx.nn.RotaryPositionalEmbedding

    def __init__(self, key):
        self.attn = eqx.nn.MultiheadAttention(2, 16, key=key)
        self.rope = eqx.nn.RotaryPositionalEmbedding(8)

    def __call__(self, x):
        def process_heads(q, k, v):
            q = jax.vmap(self.rope, in_axes=1, out_axes=1)(q)
            k = jax.vmap(self.rope, in_axes=1, out_axes=1)(k)
            return q, k, v

        x = x + self.attn(x, x, x, process_heads=process_heads)
        return x
"""


def _rope_by_hand(q):
    # Equinox's RotaryPositionalEmbedding (theta 10000), per head: q is [seq, heads, dim]
    seq, _, dim = q.shape
    freqs = 1.0 / (10000.0 ** (np.arange(0, dim, 2)[: dim // 2] / dim))
    angles = np.outer(np.arange(seq), freqs)
    angles = np.concatenate([angles, angles], -1)[:, None, :]
    half = np.concatenate([-q[..., dim // 2 :], q[..., : dim // 2]], -1)
    return q * np.cos(angles) + half * np.sin(angles)


@pytest.mark.parametrize("from_file", [True, False])
def test_a_function_called_back_by_a_library_module_is_a_stage_in_the_module(from_file, tmp_path):
    pytest.importorskip("equinox")
    namespace: dict = {}
    if from_file:  # (its source readable: the box was named `x`, by the caller's line)
        path = tmp_path / "r16_block.py"
        path.write_text(_BLOCK)
        code = compile(_BLOCK, str(path), "exec")
    else:  # (exec'd: the box was `Block:N`)
        code = compile(textwrap.dedent(_BLOCK), "<string>", "exec")
    exec(code, namespace)
    blk = namespace["Block"](jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (8, 16))
    ins = sowviz.inspect(lambda m, x: jnp.mean(m(x) ** 2), blk, x, mode="grad")
    g = ins.graph
    box = _scope(g, "process_heads")
    attn = g.node(box.parent)
    assert attn.label == "attn: MultiheadAttention", attn.label
    inside_attn = _children(g, attn)
    assert "dot_product_attention" in inside_attn and "query_proj: Linear" in inside_attn
    # the rotated queries it hands back, against RoPE by hand on the projected queries
    q = np.asarray(x @ blk.attn.query_proj.weight.T).reshape(8, 2, 8)
    want = _rope_by_hand(q)
    np.testing.assert_allclose(
        want, jax.vmap(blk.rope, in_axes=1, out_axes=1)(jnp.asarray(q)), rtol=1e-5, atol=1e-6
    )
    got = ins.probe("process_heads", leaf="[0]").summaries["primal"]
    assert got["shape"] == [8, 2, 8]
    np.testing.assert_allclose(got["l2"], float(np.linalg.norm(want)), rtol=1e-5)
    np.testing.assert_allclose(got["mean"], float(np.mean(want)), atol=1e-6)
