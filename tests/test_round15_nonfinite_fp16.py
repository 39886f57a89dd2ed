"""An fp16 MLP whose third `jax.nn.gelu` overflows (its `x ** 3` passes 65504; the forward
pass stays finite through `tanh`, the backward is 0 * Inf = NaN): the gradients the origin
stage itself makes, the names of a loop's passes after a line rebinding the argument, and
the located equation named by the call the user wrote."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz


def _mlp(params, x):
    x = x.astype(jnp.float16)
    for p in params:
        x = jax.nn.gelu(x @ p.astype(jnp.float16))
    return jnp.sum(x.astype(jnp.float32))


# The boxes of the lines rebinding `x`: the cast, then the loop's passes, named by their
# lines (the loop's line runs again: not `x#2`..`x#5`, numbers across lines and passes)
_START = inspect.getsourcelines(_mlp)[1]
_CAST, _LOOP = f"x (line {_START + 1})", f"x (line {_START + 3})"
_PASSES = [_CAST, _LOOP, f"{_LOOP}#2", f"{_LOOP}#3"]


def _args():
    ks = jax.random.split(jax.random.PRNGKey(0), 3)
    params = [jax.random.normal(k, (16, 16)) / 4 for k in ks]
    params[2] = params[2] * 3000.0  # layer 2's pre-activation reaches ~1e4: x**3 overflows
    x = jax.random.normal(jax.random.PRNGKey(1), (8, 16)) * 4
    return params, x


@pytest.fixture(scope="module")
def ins():
    return sowviz.inspect(_mlp, *_args())


def _layers(params, x):
    """Each line's value in plain JAX: the cast, then each gelu pass."""
    outs = [x.astype(jnp.float16)]
    for p in params:
        outs.append(jax.nn.gelu(outs[-1] @ p.astype(jnp.float16)))
    return outs


def test_a_parameter_the_origin_stage_reads_has_its_gradient_made_by_that_origin(ins):
    params, x = _args()
    grads = jax.grad(_mlp)(params, x)
    assert not any(bool(jnp.all(jnp.isfinite(g))) for g in grads)  # all three NaN
    assert bool(jnp.isfinite(_mlp(params, x)))  # the forward pass is finite
    o = ins.nonfinite
    assert o.backward is not None and o.backward.path == (_PASSES[-1],)
    # `parameters/[2]` is read by the last pass itself, whose backward made the NaN: no second
    # origin to fix (it was "another origin made the non-finite gradient of ...")
    assert "another origin" not in o.backward.message, o.backward.message
    assert o.other_grads == ()
    assert o.grads == ("parameters/[0]", "parameters/[1]", "parameters/[2]")


def test_a_line_rebinding_an_argument_is_numbered_after_it_as_its_probe_path(ins):
    labels = {n.id: n.label for n in ins.graph.nodes}
    top = [n.label for n in ins.graph.nodes if n.parent == ins.graph.root]
    assert top[:6] == ["parameters", "x", *_PASSES], top
    for p in ins.probes:
        path = ins.probe_path(p)
        assert path.split("/")[-1] == labels[p.node], (path, labels[p.node])
    # in program order: the argument, the cast line, the loop's passes (layer 2 last)
    want = _layers(*_args())
    for name, value in zip(_PASSES, want, strict=True):
        got = ins.probe(name).summaries["primal"]
        v = np.asarray(value, np.float64)
        np.testing.assert_allclose(got["max"], v.max(), rtol=2e-3)
        np.testing.assert_allclose(got["l2"], np.linalg.norm(v), rtol=2e-3)
    np.testing.assert_allclose(
        ins.probe("x").summaries["primal"]["l2"], np.linalg.norm(np.asarray(_args()[1])), rtol=1e-5
    )


def _scoped(s, mask):
    with jax.named_scope("mask"):
        s = jnp.where(mask, s, -1.0)
    return jnp.sum(s * s)


def test_a_named_scope_named_like_an_argument_keeps_its_name():
    # (the user named it: `expect_nonfinite=("mask",)` and `probe` name it so)
    s = jnp.arange(6.0).reshape(2, 3)
    mask = jnp.array([[True, False, True], [False, True, True]])
    g = sowviz.inspect(_scoped, s, mask, mode="primal").graph
    labels = sorted(n.label for n in g.nodes if n.parent == g.root and n.label.startswith("mask"))
    assert labels == ["mask", "mask"], labels


def test_the_located_overflow_is_named_by_the_library_call_the_line_made(ins):
    o = ins.locate_nonfinite()
    eq = o.forward.equation
    # the first ±Inf, as plain JAX makes it: `x ** 3` of layer 2's pre-activation
    params, x = _args()
    pre = _layers(params, x)[2] @ params[2].astype(jnp.float16)
    assert bool(jnp.all(jnp.isfinite(pre))) and not bool(jnp.all(jnp.isfinite(pre**3)))
    assert (eq.primitive, eq.call) == ("integer_pow", "gelu")
    assert o.forward.path == (_PASSES[-1],)
    want = f"`integer_pow` in the call of `gelu` in `{_PASSES[-1]}`"
    assert want in o.forward.message, o.forward.message
    assert "another origin" not in o.message


def _sqrt_line(x):
    y = jnp.sqrt(x - 1.0)
    return jnp.sum(y * 2.0)


def test_a_call_named_as_its_primitive_is_not_said_twice():
    o = sowviz.inspect(_sqrt_line, jnp.zeros(4), mode="primal").locate_nonfinite()
    assert o.forward.equation.primitive == "sqrt" and o.forward.equation.call == ""
    assert "the call of" not in o.forward.message, o.forward.message
