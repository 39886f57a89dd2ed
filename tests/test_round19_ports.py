"""Where stages are sourced and how their ports and repeats are named (round 19):

* a NumPyro distribution's construction is named by its site (`theta: Normal`, not
  `Normal#2`) and sourced at the line that built it (not the `with numpyro.plate`
  line above, whose `arange` JAX stages where it is first read);
* a `jax.named_call` / `@jax.named_scope` stage is sourced at its call, also where
  that line does not write the name (`attn = jax.named_call(...)` called as
  `attn(w, x)`; `name=f"layer{i}"`; a decorated `feed_forward` pushing `"mlp"`);
* a `jax.vmap`ped function's stage names its ports by the function's parameters;
* boxes of lines sharing a label from several lines are named by line (`h (line 17)`),
  not numbered across lines (`h#3`).

Lines are found by markers in the programs' file; numbers are checked against plain
JAX and NumPy."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from tests import _round19_ports_programs as prog


def _nodes(ins):
    return list(ins.graph.nodes)


def _by_label(ins, label):
    found = [n for n in _nodes(ins) if n.label == label]
    assert found, (label, sorted({n.label for n in _nodes(ins)}))
    return found


def _ports(ins, node):
    labels = {n.id: n.label for n in _nodes(ins)}
    return {labels[k]: v for k, v in node.port_names}


def _file_of(n):
    return n.source.file.replace("\\", "/").rsplit("/", 1)[-1]


# ---------------------------------------------------------------------------
# NumPyro


def _normal_logpdf(x, mu, s):
    return -0.5 * ((x - mu) / s) ** 2 - np.log(s) - 0.5 * math.log(2 * math.pi)


def test_numpyro_construction_stages_are_named_by_site_and_sourced_at_their_line():
    pytest.importorskip("numpyro")
    params = {"mu": jnp.array(1.0), "tau": jnp.array(2.0), "theta": jnp.arange(8.0)}
    ins = sowviz.inspect(prog.schools_log_density, params, mode="primal")
    theta, obs = _by_label(ins, "theta: Normal"), _by_label(ins, "obs: Normal")
    assert [n.source.line for n in theta] == [prog.marked_line("theta")]
    assert [n.source.line for n in obs] == [prog.marked_line("obs")]
    assert all(_file_of(n) == "_round19_ports_programs.py" for n in theta + obs)
    assert not [n.label for n in _nodes(ins) if re.fullmatch(r"Normal(#\d+)?", n.label)]
    # the numbers are the model's: NumPy's log-density of the same values
    th = np.arange(8.0)
    want = (
        _normal_logpdf(1.0, 0.0, 5.0)
        + math.log(2 / (math.pi * 5 * (1 + (2.0 / 5) ** 2)))
        + _normal_logpdf(th, 1.0, 2.0).sum()
        + _normal_logpdf(prog.SCHOOLS_Y, th, prog.SCHOOLS_SIGMA).sum()
    )
    np.testing.assert_allclose(float(ins.result), want, rtol=1e-5)


def test_numpyro_wrapped_distribution_is_named_by_its_site():
    pytest.importorskip("numpyro")
    params = {"w": jnp.ones(3), "b": jnp.array(0.1), "sigma": jnp.array(1.0)}
    ins = sowviz.inspect(prog.regression_log_density, params, mode="primal")
    # `dist.Normal(...).to_event(1)`: the site's distribution wraps the Normal built
    (w,) = _by_label(ins, "w: Normal")
    (y,) = _by_label(ins, "y: Normal")
    assert w.source.line == prog.marked_line("w")
    assert y.source.line == prog.marked_line("y")
    mu = prog.REG_X @ np.ones(3) + 0.1
    want = (
        _normal_logpdf(np.ones(3), 0.0, 1.0).sum()
        + _normal_logpdf(0.1, 0.0, 1.0)
        + math.log(2.0)
        + _normal_logpdf(1.0, 0.0, 1.0)
        + _normal_logpdf(prog.REG_Y, mu, 1.0).sum()
    )
    np.testing.assert_allclose(float(ins.result), want, rtol=1e-5)


def test_numpyro_autoguide_constructions_are_named_by_site_where_they_are():
    pytest.importorskip("numpyro")
    loss, params = prog.svi_setup()
    key = jax.random.PRNGKey(1)
    ins = sowviz.inspect(loss, params, key, mode="primal")
    by_id = {n.id: n for n in _nodes(ins)}
    (guide,) = _by_label(ins, "guide: AutoNormal")
    inside = {n.label: n for n in _nodes(ins) if n.parent == guide.id}
    # the guide's own `dist.Normal(loc, scale)` per site, in NumPyro's code: named by the
    # site, sourced where the guide's stage is (not at the model's `mu` line)
    assert {"mu: Normal", "sig: Normal"} <= set(inside), sorted(inside)
    assert inside["mu: Normal"].source.line != prog.marked_line("svi mu")
    assert inside["mu: Normal"].source == guide.source
    (obs,) = _by_label(ins, "obs: Normal")
    assert by_id[obs.parent].label == "svi_model"
    assert obs.source.line == prog.marked_line("svi obs")
    np.testing.assert_allclose(float(ins.result), float(loss(params, key)), rtol=1e-5)


# ---------------------------------------------------------------------------
# jax.named_call


def test_named_call_stages_are_sourced_at_their_calls():
    w, x = jnp.eye(4) * 0.5, jnp.ones((3, 4))
    ins = sowviz.inspect(prog.named_loss, w, x, mode="grad")
    (attn,) = _by_label(ins, "attn")
    assert attn.source.line == prog.marked_line("attn")
    for label in ("layer0", "layer1"):
        (n,) = _by_label(ins, label)
        assert n.source.line == prog.marked_line("layer"), label
    mlps = {n.source.line for n in _by_label(ins, "mlp")}
    # inside each `layer{i}` (called through its wrapper) and alone
    assert mlps == {prog.marked_line("layer"), prog.marked_line("mlp")}
    assert all(_file_of(n) == "_round19_ports_programs.py" for n in _by_label(ins, "mlp"))
    value, grads = ins.result
    want_value, want_grads = jax.value_and_grad(prog.named_loss)(w, x)
    np.testing.assert_allclose(float(value), float(want_value), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grads), np.asarray(want_grads), rtol=1e-5, atol=1e-7)


def test_named_call_recording_puts_jax_back():
    from jax._src import source_info_util

    before = source_info_util.ExtendNameStackContextManager.__enter__
    sowviz.inspect(prog.named_loss, jnp.eye(4), jnp.ones((3, 4)))
    assert source_info_util.ExtendNameStackContextManager.__enter__ is before
    from jax._src import api

    assert not hasattr(api.debug_info, "sowviz_original")


# ---------------------------------------------------------------------------
# jax.vmap


def _vmap_args():
    k1, k2 = jax.random.split(jax.random.key(1))
    params = {"w": jax.random.normal(k1, (4, 3)) * 0.3, "b": jnp.zeros(3)}
    return params, jax.random.normal(k2, (5, 4))


def test_vmapped_function_ports_are_named_by_its_parameters():
    params, xs = _vmap_args()
    ins = sowviz.inspect(prog.per_example, params, xs, mode="primal")
    (loss,) = _by_label(ins, "example_loss")
    # what enters it from outside is `z = xs * 2.0` (its box is its `mul`): the
    # function calls it `x`; and the leaves of its `params` (not differentiated in
    # mode "primal", so not the weights, whose ports are never named)
    assert _ports(ins, loss) == {"mul": "x", "w": "params['w']", "b": "params['b']"}
    np.testing.assert_allclose(float(ins.result), float(prog.per_example(params, xs)), rtol=1e-5)


def test_vmapped_gradient_and_in_axes_variants_name_ports_too():
    params, xs = _vmap_args()
    ins = sowviz.inspect(prog.per_example_grads, params, xs, mode="primal")
    named = {n.label: _ports(ins, n) for n in _nodes(ins) if n.label.startswith("example_loss")}
    weights = {"w": "params['w']", "b": "params['b']"}
    # its forward pass reads all; its backward pass (`jax.grad`'s, under the vmap) `x`
    assert named == {"example_loss": {"xs": "x", **weights}, "example_loss (backward)": {"xs": "x"}}
    want = sum(
        float(jnp.sum(g**2))
        for g in jax.tree.leaves(jax.vmap(jax.grad(prog.example_loss), (None, 0))(params, xs))
    )
    np.testing.assert_allclose(float(ins.result), want, rtol=1e-5)

    ins = sowviz.inspect(prog.per_column, params, xs.T, mode="primal")
    (loss,) = _by_label(ins, "example_loss")
    assert _ports(ins, loss) == {"xs_t": "x", "w": "params['w']", "b": "params['b']"}
    np.testing.assert_allclose(
        float(ins.result), float(prog.per_example(params, xs / 2)), rtol=1e-6
    )


def test_a_plain_call_is_not_named_from_a_vmap_of_it():
    params, xs = _vmap_args()

    def f(params, xs):
        return jax.vmap(prog.example_loss, in_axes=(None, 0))(params, xs).sum() + (
            prog.example_loss(params, xs[0] * 3.0)
        )

    ins = sowviz.inspect(f, params, xs, mode="grad")
    ports = {n.label: _ports(ins, n) for n in _nodes(ins) if n.label.startswith("example_loss")}
    # the vmapped call's `xs` is its `x`; the plain call's operand (`xs[0] * 3.0`) was
    # passed to no vmap: unnamed, as before
    assert ports["example_loss"] == {"xs": "x"}
    assert "x" not in ports.get("example_loss#2", {}).values()


# ---------------------------------------------------------------------------
# A mixed-precision loop


def test_mixed_precision_loop_names_rebound_values_by_line():
    params, x = prog.mixed_args()
    ins = sowviz.inspect(prog.mixed_loss, params, x, mode="grad")
    labels = [n.label for n in _nodes(ins)]
    assert not [x for x in labels if re.fullmatch(r"h#\d+", x)], labels
    first, loop = prog.marked_line("h in"), prog.marked_line("h loop")
    assert f"h (line {first})" in labels
    passes = [x for x in labels if x.startswith(f"h (line {loop})")]
    assert passes == [f"h (line {loop})", f"h (line {loop})#2", f"h (line {loop})#3"]
    # the loop's three passes still stack as one group, named by the line's box
    (group,) = [n for n in _nodes(ins) if n.label.endswith("(×3)")]
    assert f"h (line {loop})" in group.label and "#" not in group.label.replace("(×3)", "")
    # a line used once keeps its plain label (`astype`'s passes are one line's: numbered)
    assert "astype#2" in labels
    want = jax.value_and_grad(prog.mixed_loss)(params, x)
    for got, exp in zip(jax.tree.leaves(ins.result), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(exp), rtol=1e-2, atol=1e-4)
