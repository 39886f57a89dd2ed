"""NumPyro sample sites in an ELBO and the log-Jacobian of a potential
(`graph/numpyro_sites.py`): the model's sites, replayed against the guide, are
`sample(<site>)` as the guide's draws are; the key a drawing site splits off is
`seed(<site>)`; `potential_energy`'s log-Jacobian term is `log|J| (<site>)`. Values are
checked against NumPyro's own `Trace_ELBO().loss` and `log_density`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

numpyro = pytest.importorskip("numpyro")
dist = pytest.importorskip("numpyro.distributions")
infer_util = pytest.importorskip("numpyro.infer.util")
handlers = pytest.importorskip("numpyro.handlers")
from test_numpyro import SCHOOLS_Y, SIGMA, J, eight_schools, inspected_elbo  # noqa: E402

LATENT = ("mu", "tau", "theta")


def _children(ins, label: str) -> list[str]:
    (stage,) = [n for n in ins.graph.nodes if n.label == label]
    return [n.label for n in ins.graph.nodes if n.parent == stage.id]


def _node(ins, label: str, parent: str):
    (owner,) = [n for n in ins.graph.nodes if n.label == parent]
    (found,) = [n for n in ins.graph.nodes if n.label == label and n.parent == owner.id]
    return found


def _primitives_inside(ins, node) -> set[str]:
    return {n.primitive for n in ins.graph.nodes if n.parent == node.id and n.primitive}


def test_numpyro_elbo_names_the_models_sample_sites_like_the_guides():
    ins, guide, params, rng = inspected_elbo(2)  # (value and gradients: NumPyro's)

    # the model's latent sites (replayed: the key its seed splits is all their code)
    # read as the guide's draws do, in the model's order; the observed site splits none
    model = _children(ins, "eight_schools")
    assert [lab for lab in model if lab.startswith("sample")] == [f"sample({s})" for s in LATENT]
    for site in LATENT:
        stage = _node(ins, f"sample({site})", "eight_schools")
        assert "random_split" in _primitives_inside(ins, stage), site
    # in the guide, each draw is preceded by the key it draws with, named by its site
    guide_kids = _children(ins, "guide: AutoNormal")
    for site in LATENT:
        at = guide_kids.index(f"sample({site})")
        assert guide_kids[at - 1] == f"seed({site})", guide_kids
    assert not [lab for lab in guide_kids if lab.startswith("ELBO.loss")], guide_kids

    # the probe `sample(mu)` is still the guide's draw: the value NumPyro's own trace of
    # the guide has (the ELBO seeds the guide with the second half of its key)
    _, guide_key = jax.random.split(rng)
    seeded = handlers.substitute(handlers.seed(guide, guide_key), data=params)
    trace = handlers.trace(seeded).get_trace(J, SIGMA, SCHOOLS_Y)
    mu = ins.probe("sample(mu)").summaries["primal"]
    np.testing.assert_allclose(mu["mean"], trace["mu"]["value"], rtol=1e-5)
    theta = ins.probe("sample(theta)").summaries["primal"]
    np.testing.assert_allclose(theta["mean"], jnp.mean(trace["theta"]["value"]), rtol=1e-5)


def _potential():
    init, potential_fn, _, _ = infer_util.initialize_model(
        jax.random.PRNGKey(0), eight_schools, model_args=(J, SIGMA, SCHOOLS_Y), dynamic_args=False
    )
    return init.z, potential_fn


def test_numpyro_potential_names_the_log_jacobian_term():
    z, potential_fn = _potential()
    value, grads = jax.value_and_grad(potential_fn)(z)
    ins = sowviz.inspect(potential_fn, z, mode="grad")
    got_value, got_grads = ins.result
    np.testing.assert_allclose(got_value, value, rtol=1e-6)
    for k in grads:
        np.testing.assert_allclose(got_grads[k], grads[k], rtol=1e-5, atol=1e-4)

    # a stage of its own beside the sites' log-densities, not a bare `reduce_sum`
    root = ins.graph.root
    top = [n.label for n in ins.graph.nodes if n.parent == root]
    assert "log|J| (tau)" in top, top
    (term,) = [n for n in ins.graph.nodes if n.label == "log|J| (tau)" and n.parent == root]
    into = {e.source for e in ins.graph.edges if e.target == term.id}
    labels = {n.id: n.label for n in ins.graph.nodes}
    assert {labels[s] for s in into} == {"eight_schools"}, [labels[s] for s in into]

    # its value is what the potential adds to NumPyro's log-density at the constrained
    # values: log|d exp(z)/dz| = z; d potential / d term = -1
    constrained = {**z, "tau": jnp.exp(z["tau"])}
    log_p, _ = infer_util.log_density(eight_schools, (J, SIGMA, SCHOOLS_Y), {}, constrained)
    want = -value - log_p
    np.testing.assert_allclose(want, jnp.log(jax.grad(jnp.exp)(z["tau"])), rtol=1e-4, atol=1e-5)
    summary = ins.probe("log|J| (tau)").summaries
    np.testing.assert_allclose(summary["primal"]["mean"], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(summary["cotangent"]["mean"], -1.0, rtol=1e-6)


def test_numpyro_seeded_model_names_each_key_by_its_site():
    """A model that draws (a prior sample): the key each site splits off is
    `seed(<site>)`, before the draw `sample(<site>)`, whose probe has one output."""

    def prior_model():
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        numpyro.sample("b", dist.Normal(a, 2.0))

    def prior(key):
        trace = handlers.trace(handlers.seed(prior_model, key)).get_trace()
        return trace["a"]["value"], trace["b"]["value"]

    key = jax.random.PRNGKey(0)
    ins = sowviz.inspect(prior, key, mode="primal")
    want = prior(key)
    np.testing.assert_allclose(ins.result, want, rtol=1e-6)
    kids = [lab for lab in _children(ins, "prior_model") if not lab.endswith(": Normal")]
    assert kids == ["seed(a)", "sample(a)", "seed(b)", "sample(b)"], kids
    b = ins.probe("sample(b)").summaries["primal"]
    np.testing.assert_allclose(b["mean"], want[1], rtol=1e-6)
