"""NumPyro models drawn as their structure (`graph/numpyro_sites.py`): the model's run,
each sample site's log-density, draw and constraint, deterministic sites, with values
checked against plain JAX and NumPyro."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

numpyro = pytest.importorskip("numpyro")
dist = pytest.importorskip("numpyro.distributions")
infer_util = pytest.importorskip("numpyro.infer.util")
handlers = pytest.importorskip("numpyro.handlers")

N, D = 100, 3
X = jax.random.normal(jax.random.PRNGKey(0), (N, D))
Y = jax.random.uniform(jax.random.PRNGKey(1), (N,)) < jax.nn.sigmoid(
    X @ jnp.array([1.0, -2.0, 0.5])
)
Y = Y.astype(jnp.float32)
PARAMS = {"w": jnp.array([0.3, -0.1, 0.2]), "b": jnp.array(0.1)}

J = 8
SCHOOLS_Y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])

#: What NumPyro's own code was drawn as before: its metaclass, a private method, its
#: source text, its handler's method.
_NUMPYRO_NOISE = ("DistributionMeta", "_validate_sample", "log_joint", "get_trace")


def logreg(X, y=None):
    w = numpyro.sample("w", dist.Normal(jnp.zeros(D), 1.0).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    logits = numpyro.deterministic("logits", X @ w + b)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=logits), obs=y)


def logp(params):
    lp, _ = infer_util.log_density(logreg, (X, Y), {}, params)
    return lp


def eight_schools(J, sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfCauchy(5))
    with numpyro.plate("J", J):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


def _labels(ins) -> list[str]:
    return [n.label for n in ins.graph.nodes]


def _stage(ins, label: str):
    found = [n for n in ins.graph.nodes if n.label == label]
    assert len(found) == 1, (label, _labels(ins))
    return found[0]


def _inside(ins, label: str) -> list[str]:
    """The labels of every node inside the stage `label`."""
    root = _stage(ins, label).id
    parents = {n.id: n.parent for n in ins.graph.nodes}
    out = []
    for n in ins.graph.nodes:
        p = n.parent
        while p is not None and p != root:
            p = parents.get(p)
        if p == root:
            out.append(n.label)
    return out


def _stats(x) -> dict[str, float]:
    x = np.asarray(x, np.float64)
    return {"min": x.min(), "max": x.max(), "mean": x.mean(), "l2": np.sqrt((x**2).sum())}


def _assert_stats(summary: dict, want, rtol: float = 1e-5) -> None:
    for key, value in _stats(want).items():
        np.testing.assert_allclose(summary[key], value, rtol=rtol, atol=1e-5, err_msg=key)


def test_numpyro_log_density_draws_the_model_and_its_sites():
    value, grads = jax.value_and_grad(logp)(PARAMS)
    ins = sowviz.inspect(logp, PARAMS, mode="grad")

    got_value, got_grads = ins.result
    np.testing.assert_allclose(got_value, value, rtol=1e-6)
    for k in grads:
        np.testing.assert_allclose(got_grads[k], grads[k], rtol=1e-5, atol=1e-6)

    labels = _labels(ins)
    for want in ("logreg", "log_prob(w)", "log_prob(b)", "log_prob(y)", "logits"):
        assert want in labels, (want, labels)
    assert not [lab for lab in labels if any(s in lab for s in _NUMPYRO_NOISE)], labels
    # the user's code is in the model's stage: its construction of the prior (by the
    # class, not the metaclass, named by its site) and the deterministic site, sown
    inside = _inside(ins, "logreg")
    assert "w: Normal" in inside and "logits" in inside, inside
    assert any(lab.startswith("support(") for lab in _inside(ins, "log_prob(y)"))

    # each site's log-density, as NumPyro computes it alone, with d logp / d it
    logits = X @ PARAMS["w"] + PARAMS["b"]
    site_y = ins.probe("log_prob(y)").summaries
    _assert_stats(site_y["primal"], dist.Bernoulli(logits=logits).log_prob(Y))
    _assert_stats(site_y["cotangent"], jnp.ones(N))
    site_w = ins.probe("log_prob(w)").summaries
    _assert_stats(site_w["primal"], dist.Normal(0.0, 1.0).log_prob(PARAMS["w"]).sum())
    # the deterministic site: its value, and d logp / d logits = y - sigmoid(logits)
    sown = ins.probe("logits").summaries
    _assert_stats(sown["primal"], logits)
    _assert_stats(sown["cotangent"], Y - jax.nn.sigmoid(logits))


def test_numpyro_potential_energy_names_constraints_and_densities():
    init, potential_fn, _, _ = infer_util.initialize_model(
        jax.random.PRNGKey(0), eight_schools, model_args=(J, SIGMA, SCHOOLS_Y), dynamic_args=False
    )
    z = init.z
    value, grads = jax.value_and_grad(potential_fn)(z)
    ins = sowviz.inspect(potential_fn, z, mode="grad")

    got_value, got_grads = ins.result
    np.testing.assert_allclose(got_value, value, rtol=1e-6)
    for k in grads:
        np.testing.assert_allclose(got_grads[k], grads[k], rtol=1e-5, atol=1e-4)

    labels = _labels(ins)
    for site in ("mu", "tau", "theta", "obs"):
        assert f"log_prob({site})" in labels, labels
    assert "constrain(tau)" in _inside(ins, "eight_schools")
    assert not [lab for lab in labels if any(s in lab for s in _NUMPYRO_NOISE)], labels

    # the densities at the constrained values; the potential is minus their sum
    tau = jnp.exp(z["tau"])
    site_tau = ins.probe("log_prob(tau)").summaries
    _assert_stats(site_tau["primal"], dist.HalfCauchy(5.0).log_prob(tau))
    _assert_stats(site_tau["cotangent"], -1.0)
    site_obs = ins.probe("log_prob(obs)").summaries
    _assert_stats(site_obs["primal"], dist.Normal(z["theta"], SIGMA).log_prob(SCHOOLS_Y))
    _assert_stats(site_obs["cotangent"], -jnp.ones(J))


def inspected_elbo(seed: int):
    """`Trace_ELBO().loss` of `eight_schools` with an `AutoNormal` guide, inspected in
    mode grad, its value and gradients checked against NumPyro's own: the inspection,
    the guide, its parameters and the key."""
    from numpyro.infer import Trace_ELBO
    from numpyro.infer.autoguide import AutoNormal

    guide = AutoNormal(eight_schools)
    with handlers.seed(rng_seed=0):
        guide(J, SIGMA, SCHOOLS_Y)  # its parameters' prototype
    params = {
        name: site["value"]
        for name, site in handlers.trace(handlers.seed(guide, 0))
        .get_trace(J, SIGMA, SCHOOLS_Y)
        .items()
        if site["type"] == "param"
    }
    rng = jax.random.PRNGKey(seed)

    def elbo_loss(params, rng):
        return Trace_ELBO().loss(rng, params, eight_schools, guide, J, SIGMA, SCHOOLS_Y)

    value, grads = jax.value_and_grad(elbo_loss)(params, rng)
    ins = sowviz.inspect(elbo_loss, params, rng, mode="grad")
    got_value, got_grads = ins.result
    np.testing.assert_allclose(got_value, value, rtol=1e-5)
    for k in grads:
        np.testing.assert_allclose(got_grads[k], grads[k], rtol=1e-4, atol=1e-5)
    return ins, guide, params, rng


def test_numpyro_elbo_tells_the_guide_from_the_model():
    ins, guide, params, rng = inspected_elbo(1)
    labels = _labels(ins)
    assert "guide: AutoNormal" in labels and "eight_schools" in labels, labels
    for site in ("mu", "tau", "theta"):
        assert f"log q({site})" in labels and f"log_prob({site})" in labels, labels
        assert f"sample({site})" in _inside(ins, "guide: AutoNormal")
    assert not [lab for lab in labels if any(s in lab for s in _NUMPYRO_NOISE)], labels

    # log q(mu) at the guide's draw, as NumPyro's own trace of the guide has it (the
    # ELBO seeds the guide with the second half of its key); loss = log q - log p
    _, guide_key = jax.random.split(rng)
    seeded = handlers.substitute(handlers.seed(guide, guide_key), data=params)
    site = handlers.trace(seeded).get_trace(J, SIGMA, SCHOOLS_Y)["mu"]
    q_mu = ins.probe("log q(mu)").summaries
    _assert_stats(q_mu["primal"], site["fn"].log_prob(site["value"]))
    _assert_stats(q_mu["cotangent"], 1.0)


def test_numpyro_hooks_only_while_sowviz_traces():
    from numpyro.primitives import Messenger

    originals = (
        Messenger.__dict__["__call__"],
        type(dist.Normal).__dict__["__call__"],
        dist.Normal.__dict__["log_prob"],
    )

    def my_guide():
        loc = numpyro.param("loc", 0.5)
        numpyro.sample("mu", dist.Normal(loc, 1.0))

    def log_q(loc):
        lp, _ = infer_util.log_density(my_guide, (), {}, {"loc": loc, "mu": 0.3})
        return lp

    ins = sowviz.inspect(log_q, jnp.array(0.5), mode="grad")
    # a guide of the user's, known by its name
    assert "my_guide" in _labels(ins) and "log q(mu)" in _labels(ins), _labels(ins)
    np.testing.assert_allclose(ins.result[1], jax.grad(log_q)(jnp.array(0.5)), rtol=1e-6)

    after = (
        Messenger.__dict__["__call__"],
        type(dist.Normal).__dict__["__call__"],
        dist.Normal.__dict__["log_prob"],
    )
    assert after == originals
    # outside sowviz, NumPyro's program pushes no scope of sowviz's
    jaxpr = jax.make_jaxpr(logp)(PARAMS)
    stacks = {str(e.source_info.name_stack) for e in jaxpr.jaxpr.eqns}
    assert not any("log_prob(" in s or "model" in s for s in stacks), stacks
