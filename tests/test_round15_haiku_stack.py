"""Haiku's own plumbing drawn as no stage of the user's: the key split of `hk.layer_stack`
and `hk.scan` is one box named by the API beside the loop, and a mixed-precision policy's
casts (of a module's input, of the parameters it reads) are edges, not boxes named by
`get_parameter` nor a level that keeps the first of identical `hk.remat` blocks apart."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

hk = pytest.importorskip("haiku")


def _kids(ins, node) -> list:
    return [c for c in ins.graph.nodes if c.parent == node.id]


def _only(ins, label: str):
    (node,) = [n for n in ins.graph.nodes if n.label == label]
    return node


# -- 1. a layer stack's and a scan's key split ------------------------------------------


def _stacked(x):
    x = hk.Linear(8, name="embed")(x)

    def block(x):
        return x + hk.Linear(8)(jax.nn.gelu(x))

    x = hk.layer_stack(3, name="layers")(block)(x)
    return hk.Linear(1, name="head")(x)


def test_a_layer_stack_s_key_split_is_one_box_beside_its_scan():
    # was a box named by the line's `x` holding five loose `random_split` / `unstack`
    # boxes above `scan(block)`
    net = hk.transform(_stacked)
    x = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
    params = net.init(jax.random.PRNGKey(0), x)

    def loss(p, rng, x):
        return jnp.mean(net.apply(p, rng, x) ** 2)

    ins = sowviz.inspect(loss, params, jax.random.PRNGKey(1), x, mode="primal")
    fwd = _only(ins, "_stacked")
    assert [c.label for c in _kids(ins, fwd)] == ["embed", "hk.layer_stack", "scan(block)", "head"]
    plumbing = _only(ins, "hk.layer_stack")
    inside = {c.label for c in _kids(ins, plumbing)}
    # (JAX 0.10 unstacks the keys with `slice` and `squeeze`)
    assert "random_split" in inside and inside <= {"random_split", "unstack", "slice", "squeeze"}
    # the stack still carries its layers' values: the output of the last layer
    h = jnp.asarray(x)
    p = params
    h = h @ p["embed"]["w"] + p["embed"]["b"]
    for k in range(3):
        w, b = p["layers/linear"]["w"][k], p["layers/linear"]["b"][k]
        h = h + jax.nn.gelu(h) @ w + b
    got = ins.probe("scan(block)").summaries["primal"]
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(h)), rtol=1e-5)


def test_the_user_s_own_maybe_next_rng_key_keeps_its_name():
    # the layer stack's split is told apart by Haiku's wrapper around it, not by
    # `maybe_next_rng_key` alone, which a user may call too
    def fwd(x):
        key = hk.maybe_next_rng_key()
        return x * jax.random.uniform(key, x.shape)

    net = hk.transform(fwd)
    x = jnp.ones((2, 4))
    ins = sowviz.inspect(lambda x, rng: jnp.sum(net.apply({}, rng, x)), x, jax.random.PRNGKey(2))
    labels = [n.label for n in ins.graph.nodes]
    assert "maybe_next_rng_key" in labels, labels
    assert "hk.layer_stack" not in labels and "hk.scan" not in labels, labels


def test_hk_scan_s_key_split_is_one_box_beside_its_loop():
    # `random_split`, `unstack` were loose beside `scan(step)` at the caller's level
    def rnn(xs):
        core = hk.LSTM(8)
        state = core.initial_state(xs.shape[1])

        def step(state, x):
            out, state = core(x, state)
            return state, out

        _, outs = hk.scan(step, state, xs)
        return hk.Linear(1, name="head")(outs)

    net = hk.transform(rnn)
    xs = jnp.linspace(-1.0, 1.0, 40).reshape(5, 2, 4)
    params = net.init(jax.random.PRNGKey(0), xs)

    def loss(p, rng, xs):
        return jnp.mean(net.apply(p, rng, xs) ** 2)

    ins = sowviz.inspect(loss, params, jax.random.PRNGKey(1), xs, mode="primal")
    top = [c.label for c in _kids(ins, _only(ins, "rnn"))]
    assert "random_split" not in top and "unstack" not in top, top
    assert top.index("hk.scan") + 1 == top.index("scan(step)"), top
    want = float(loss(params, jax.random.PRNGKey(1), xs))
    (out,) = [n for n in ins.graph.nodes if n.kind == "output"]
    np.testing.assert_allclose(ins.probe(out.label).summaries["primal"]["l2"], want, rtol=1e-5)


# -- 2, 3. a mixed-precision policy's casts ----------------------------------------------


@pytest.fixture
def policy():
    jmp = pytest.importorskip("jmp")
    set_for = []

    def set_policy(cls, spec):
        hk.mixed_precision.set_policy(cls, jmp.get_policy(spec))
        set_for.append(cls)

    yield set_policy
    for cls in set_for:
        hk.mixed_precision.clear_policy(cls)


class _Block(hk.Module):
    def __call__(self, x):
        return x + jnp.tanh(hk.Linear(x.shape[-1], name="fc")(x))


def _remat_blocks(x):
    for i in range(3):
        x = hk.remat(lambda x, i=i: _Block(name=f"block_{i}")(x))(x)
    return jnp.sum(x.astype(jnp.float32))


def test_identical_remat_blocks_under_a_policy_are_stacked(policy):
    # the first block cast the f32 input: `checkpoint(block_0) > block_0 > _Block > fc`
    # beside `checkpoint(block_1–2) (×2)`
    policy(_Block, "params=float32,compute=bfloat16,output=bfloat16")
    net = hk.without_apply_rng(hk.transform(_remat_blocks))
    x = jnp.linspace(-1.0, 1.0, 32).reshape(4, 8)
    params = net.init(jax.random.PRNGKey(0), x)
    ins = sowviz.inspect(lambda p, x: net.apply(p, x), params, x)
    paths = sorted(ins.probe_path(p) for p in ins.probes if ins.probe_path(p).endswith("/fc"))
    assert paths == [
        f"checkpoint(block_0–2) (×3)/checkpoint(block_{i})/block_{i}/fc" for i in range(3)
    ]
    grads = jax.grad(lambda p: net.apply(p, x))(params)
    for i in range(3):
        g = grads[f"block_{i}/fc"]["w"]
        got = ins.probe(f"block_{i}/fc/w").summaries["cotangent"]["l2"]
        np.testing.assert_allclose(got, float(jnp.linalg.norm(g)), rtol=1e-5)


class _Dense(hk.Module):
    def __call__(self, x):
        w = hk.get_parameter("w", (x.shape[-1], 8), init=hk.initializers.VarianceScaling())
        b = hk.get_parameter("b", (8,), init=jnp.zeros)
        return x @ w + b


def test_a_policy_s_parameter_casts_are_edges_from_the_parameters(policy):
    # drawn as boxes `get_parameter`, `get_parameter#2` (Haiku's function, not `w`, `b`)
    policy(_Dense, "params=float32,compute=bfloat16,output=float32")
    net = hk.without_apply_rng(hk.transform(lambda x: jnp.sum(_Dense(name="dense")(x))))
    x = jnp.linspace(-1.0, 1.0, 32).reshape(4, 8)
    params = net.init(jax.random.PRNGKey(0), x)
    ins = sowviz.inspect(lambda p, x: net.apply(p, x), params, x)
    labels = [n.label for n in ins.graph.nodes]
    assert not any("get_parameter" in label for label in labels), labels
    assert "convert_element_type" not in labels, labels
    # drawn as without the policy: the parameters read by the `dense` stage, its sum
    # (the policy's cast of the result is the module's, not the `sum` line's)
    (dense,) = [n for n in ins.graph.nodes if n.label == "dense" and n.source is not None]
    (group,) = [n for n in ins.graph.nodes if n.label == "parameters"]
    assert any(e.source == group.id and e.target == dense.id for e in ins.graph.edges)
    assert "sum" not in labels and "reduce_sum" in labels, labels
    grads = jax.grad(lambda p: net.apply(p, x))(params)
    for leaf in ("w", "b"):
        got = ins.probe(f"dense/{leaf}").summaries["cotangent"]["l2"]
        np.testing.assert_allclose(got, float(jnp.linalg.norm(grads["dense"][leaf])), rtol=1e-5)
