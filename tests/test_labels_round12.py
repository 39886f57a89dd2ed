"""Labels of JAX constructs that said too little for a JAX user to know the box: a
`jax.checkpoint`'s policy, a reverse `lax.scan`, a Pallas kernel and the host function
a callback runs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name
from jax.experimental import io_callback

import sowviz
from sowviz import _compat

policies = jax.checkpoint_policies


def _mlp_block(w, x):
    return x + jnp.cos(jnp.sin(x @ w[0]) @ w[1])


def _three_policies(ws, x):
    x = jax.checkpoint(_mlp_block, policy=policies.checkpoint_dots)(ws[0], x)
    x = jax.checkpoint(_mlp_block, policy=policies.nothing_saveable)(ws[1], x)
    x = jax.checkpoint(_mlp_block, policy=policies.everything_saveable)(ws[2], x)
    return jnp.mean(x**2)


def _weights(n):
    ks = jax.random.split(jax.random.PRNGKey(0), 2 * n)
    return [
        (jax.random.normal(ks[2 * i], (8, 16)) / 3, jax.random.normal(ks[2 * i + 1], (16, 8)) / 4)
        for i in range(n)
    ]


def test_checkpoints_of_one_block_under_three_policies_say_their_policy_and_do_not_stack():
    # three policies on one block stacked as `checkpoint(mlp_block) (×3)`: no policy named
    ws, x = _weights(3), jnp.linspace(-1.0, 1.0, 32).reshape(4, 8)
    ins = sowviz.inspect(_three_policies, ws, x)
    g = ins.graph
    top = [(n.label, n.kind) for n in g.children(g.root) if n.kind == "remat"]
    assert top == [
        ("checkpoint(_mlp_block, save dots)", "remat"),
        ("checkpoint(_mlp_block, save nothing)", "remat"),
        ("checkpoint(_mlp_block, save everything)", "remat"),
    ]
    assert not [n.label for n in g.nodes if n.repeats], "blocks of other policies were stacked"
    value, grads = ins.result
    np.testing.assert_allclose(value, _three_policies(ws, x), rtol=1e-6)
    want = jax.grad(_three_policies)(ws, x)
    for got, exp in zip(jax.tree.leaves(grads), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-7)


def _named_block(w, x):
    return jnp.tanh(checkpoint_name(x @ w, "proj")) * 2.0


def test_a_checkpoint_saving_named_values_says_which():
    w, x = jnp.full((3, 3), 0.25), jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
    policy = policies.save_only_these_names("proj")
    ins = sowviz.inspect(
        lambda w, x: jnp.sum(jax.checkpoint(_named_block, policy=policy)(w, x)), w, x
    )
    labels = [n.label for n in ins.graph.nodes]
    assert "checkpoint(_named_block, save proj)" in labels, labels
    assert "proj" in labels, labels  # the named value, as before


@pytest.mark.parametrize(
    ("policy", "label"),
    [
        (None, None),
        (policies.dots_saveable, "save dots"),
        (policies.checkpoint_dots_with_no_batch_dims, "save no-batch dots"),
        (policies.save_only_these_names("b", "a"), "save a, b"),
        (policies.save_any_names_but_these("a"), "save all but a"),
        (
            policies.save_from_both_policies(
                policies.checkpoint_dots, policies.save_only_these_names("a")
            ),
            "save dots + save a",
        ),
        (
            policies.save_and_offload_only_these_names(
                names_which_can_be_saved=["a"],
                names_which_can_be_offloaded=["b"],
                offload_src="device",
                offload_dst="pinned_host",
            ),
            "save a, offload b",
        ),
    ],
)
def test_each_checkpoint_policy_has_a_label(policy, label):
    # JAX 0.10 spells the dots and names policies as dataclasses, 0.12 as closures
    eqn = jax.make_jaxpr(jax.checkpoint(_named_block, policy=policy))(jnp.ones((3, 3)), jnp.ones(3))
    assert _compat.remat_policy_label(eqn.eqns[0].params) == label


def _my_policy(prim, *_, **__):
    return prim.name == "dot_general"


def test_a_policy_of_yours_is_named_by_its_function():
    def label(policy):
        eqn = jax.make_jaxpr(jax.checkpoint(_named_block, policy=policy))(jnp.eye(3), jnp.ones(3))
        return _compat.remat_policy_label(eqn.eqns[0].params)

    assert label(_my_policy) == "_my_policy"
    assert label(lambda *a, **k: False) == "custom policy"


def _gae(values, rewards):
    def step(gae, x):
        value, reward = x
        gae = reward - value + 0.9 * gae
        return gae, gae

    _, forward = jax.lax.scan(step, jnp.zeros(values.shape[1]), (values, rewards))
    _, backward = jax.lax.scan(step, jnp.zeros(values.shape[1]), (values, rewards), reverse=True)
    _, bare = jax.lax.scan(
        lambda c, x: (c + x, c), jnp.zeros(values.shape[1]), values, reverse=True
    )
    return forward.sum() + backward.sum() + bare.sum()


def test_a_reverse_scan_says_it_runs_backwards():
    # `lax.scan(step, reverse=True)` looked exactly like the forward scan of `step`
    values = jnp.linspace(-1.0, 1.0, 12).reshape(6, 2)
    rewards = jnp.arange(12.0).reshape(6, 2)
    ins = sowviz.inspect(_gae, values, rewards, mode="primal")
    scans = [n.label for n in ins.graph.nodes if n.kind == "scan"]
    assert scans == ["scan(step)", "scan(step, reverse)", "scan(reverse)"]
    np.testing.assert_allclose(ins.result, _gae(values, rewards), rtol=1e-6)


def _block(p, h):
    return jnp.tanh(h @ p)


def _layers(ps, h):
    remat = jax.checkpoint(lambda h, p: (_block(p, h), None), policy=policies.nothing_saveable)
    h, _ = jax.lax.scan(remat, h, ps, reverse=True)
    return jnp.mean(h**2)


def test_a_reverse_scan_over_checkpointed_layers_is_named_by_the_layer_not_its_policy():
    ps, h = jnp.full((4, 3, 3), 0.25), jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
    g = sowviz.inspect(_layers, ps, h, mode="primal").graph
    (scan,) = [n for n in g.nodes if n.kind == "scan"]
    assert scan.label == "scan(_block, reverse)"
    assert [n.label for n in g.children(scan.id)] == ["checkpoint(_block, save nothing)"]


def matmul_kernel(x_ref, y_ref, z_ref):
    z_ref[...] = x_ref[...] @ y_ref[...]


def _matmul(x, y):
    from jax.experimental import pallas as pl

    return pl.pallas_call(
        matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((16, 16), x.dtype),
        grid=(2, 2),
        in_specs=[
            pl.BlockSpec((8, 16), lambda i, j: (i, 0)),
            pl.BlockSpec((16, 8), lambda i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((8, 8), lambda i, j: (i, j)),
        interpret=True,
    )(x, y)


def _pallas_program(x, y):
    return jnp.tanh(_matmul(x, y))


def test_a_pallas_kernel_is_named_with_its_grid_and_counts_as_the_one_box_it_opens_to():
    x = jnp.linspace(-1.0, 1.0, 256).reshape(16, 16)
    y = jnp.eye(16) / 2
    ins = sowviz.inspect(_pallas_program, x, y, mode="primal")
    g = ins.graph
    (kernel,) = [n for n in g.nodes if n.primitive == "pallas_call"]
    assert kernel.label == "pallas_call(matmul_kernel, grid=(2, 2))"
    # each stage's count is the boxes it opens to (it said 5: the kernel body's)
    for stage in g.nodes:
        if stage.kind in ("jit", "scope"):
            below, todo = 0, [stage.id]
            while todo:
                kids = g.children(todo.pop())
                below += sum(1 for n in kids if n.kind == "eqn")
                todo += [n.id for n in kids]
            assert stage.n_eqns == below, (stage.label, stage.n_eqns, below)
    np.testing.assert_allclose(ins.result, np.tanh(np.asarray(x) @ np.asarray(y)), rtol=1e-6)


_LOG: list[float] = []


def log_fn(v):
    _LOG.append(float(v))


def record(v):
    _LOG.append(float(v))
    return np.int32(len(_LOG))


def host_double(v):
    return np.asarray(v) * 2


def _callbacks(w, x):
    h = jnp.tanh(x @ w)
    jax.debug.print("h mean {m}", m=h.mean())
    jax.debug.callback(log_fn, h.sum())
    jax.debug.callback(lambda v: _LOG.append(float(v)), h.max())
    io_callback(record, jax.ShapeDtypeStruct((), jnp.int32), jax.lax.stop_gradient(h.min()))
    shape = jax.ShapeDtypeStruct(h.shape, h.dtype)
    doubled = jax.pure_callback(functools.partial(host_double), shape, h)
    return jnp.mean(h**2) + jnp.mean(doubled)


def test_a_callback_is_named_by_the_function_it_runs_on_the_host():
    w, x = jnp.full((4, 3), 0.25), jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
    ins = sowviz.inspect(_callbacks, w, x, mode="primal")
    calls = [(n.primitive, n.label) for n in ins.graph.nodes if "callback" in (n.primitive or "")]
    # (JAX 0.10's `jax.debug.print` is a `debug_callback` of JAX's formatter: not named)
    if len(calls) == 5:
        assert calls.pop(0) == ("debug_callback", "debug_callback")
    assert calls == [
        ("debug_callback", "debug_callback(log_fn)"),
        ("debug_callback", "debug_callback"),  # a lambda
        ("io_callback", "io_callback(record)"),
        ("pure_callback", "pure_callback(host_double)"),
    ]
    assert not [n.label for n in ins.graph.nodes if "format" in n.label]
    h = np.tanh(np.asarray(x) @ np.asarray(w))
    np.testing.assert_allclose(ins.result, np.mean(h**2) + np.mean(2 * h), rtol=1e-6)
