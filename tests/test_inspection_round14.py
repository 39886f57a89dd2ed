"""Round 14: `Inspection.probe` by a name the program gives twice: a stage's whole path
is that stage's; a sow reached several times (so numbered) is never answered by a
stage of the bare name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import sowviz


def _energy(r):
    return jnp.sum(jnp.sin(r) ** 2)


def _forces(r):
    return -jax.grad(_energy)(r)


def test_a_whole_path_names_its_stage_beside_the_same_name_deeper():
    # JAX-MD's shape: `energy` at the top and inside `forces` (under `jax.grad`, so that
    # stage has several outputs); "energy" is the whole path of the top-level call
    def observable(r):
        f = _forces(r)
        return jnp.sum(f**2) + _energy(r)

    r = jnp.linspace(0.0, 1.0, 8)
    ins = sowviz.inspect(observable, r, mode="grad")
    got = ins.probe("_energy")
    assert ins.probe_path(got) == "_energy"
    np.testing.assert_allclose(got.summaries["primal"]["mean"], float(_energy(r)), rtol=1e-6)
    # its cotangent: d observable / d energy = 1
    np.testing.assert_allclose(got.summaries["cotangent"]["mean"], 1.0, rtol=1e-6)


def _rhs(u):
    u = sowviz.sow(u, "u")
    return -(u**3)


def _step(u, _):
    k1 = _rhs(u)
    k2 = _rhs(u + 0.05 * k1)
    u = u + 0.05 * (k1 + k2)  # a line assigning `u`: a stage named `u`
    return u, None


def _loss(u0):
    u_t, _ = lax.scan(_step, u0, None, length=5)
    return jnp.sum(u_t**2)


def test_a_numbered_sow_is_never_answered_by_a_stage_of_its_bare_name():
    u0 = jnp.linspace(0.1, 1.0, 6)
    ins = sowviz.inspect(_loss, u0, mode="grad")
    with pytest.raises(KeyError) as e:
        ins.probe("u")
    msg = str(e.value)
    assert "'u_0', 'u_1'" in msg and "'scan(_step)/u'" in msg, msg
    # each name the message gives works, and is what it says
    line = ins.probe("scan(_step)/u")
    assert ins.graph.node(line.node).kind != "sow"
    _, inter = sowviz.save_intermediates(jax.grad(_loss), duplicates="suffix")(u0)
    sown = ins.probe("u_0")
    want = np.asarray(inter["u_0"]["primal"])  # (5, 6): every iteration, as the probe's
    np.testing.assert_allclose(sown.summaries["primal"]["l2"], np.linalg.norm(want), rtol=1e-5)
