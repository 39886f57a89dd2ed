"""Programs for `test_round19_ports.py`, written as their libraries' docs write them.
Each line a test points at carries a `# <-- name` marker, which the tests find in this
file's text (not from sowviz)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def marked_line(marker: str) -> int:
    """The line of this file holding `# <-- marker`."""
    with open(__file__) as f:
        hits = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# <-- {marker}")]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


# ---------------------------------------------------------------------------
# NumPyro: eight schools (NumPyro's getting-started example) and a linear regression.


def eight_schools(J, sigma, y=None):
    import numpyro
    import numpyro.distributions as dist

    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfCauchy(5))
    with numpyro.plate("J", J):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))  # <-- theta
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)  # <-- obs


SCHOOLS_Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SCHOOLS_SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def schools_log_density(params):
    from numpyro.infer.util import log_density

    lp, _ = log_density(eight_schools, (8, SCHOOLS_SIGMA), {"y": SCHOOLS_Y}, params)
    return lp


def regression(X, y=None):
    import numpyro
    import numpyro.distributions as dist

    w = numpyro.sample("w", dist.Normal(jnp.zeros(X.shape[1]), 1.0).to_event(1))  # <-- w
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ w + b, sigma), obs=y)  # <-- y


REG_X = np.random.RandomState(0).randn(20, 3)
REG_Y = REG_X @ np.array([1.0, -2.0, 0.5]) + 0.3


def regression_log_density(params):
    from numpyro.infer.util import log_density

    return log_density(regression, (REG_X,), {"y": REG_Y}, params)[0]


def svi_model(y=None):
    import numpyro
    import numpyro.distributions as dist

    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))  # <-- svi mu
    sig = numpyro.sample("sig", dist.HalfNormal(1.0))
    with numpyro.plate("n", 5):
        numpyro.sample("obs", dist.Normal(mu, sig), obs=y)  # <-- svi obs


def svi_setup():
    """An `AutoNormal` guide's parameters after `SVI.init`, as NumPyro's SVI tutorial
    makes them, and the ELBO loss of them."""
    import numpyro
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro.infer.autoguide import AutoNormal

    y = jnp.arange(5.0)
    guide = AutoNormal(svi_model)
    svi = SVI(svi_model, guide, numpyro.optim.Adam(0.01), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), y=y))

    def loss(params, key):
        return Trace_ELBO().loss(key, params, svi_model, guide, y=y)

    return loss, params


# ---------------------------------------------------------------------------
# `jax.named_call` and `@jax.named_scope` wrappers, called where the name is not written.


def attention(w, x):
    q = x @ w
    s = jax.nn.softmax(q, axis=-1)
    return s @ w.T


@jax.named_scope("mlp")
def feed_forward(w, x):
    h = jnp.tanh(x @ w)
    return h @ w.T


attn = jax.named_call(attention, name="attn")


def named_loss(w, x):
    y = attn(w, x)  # <-- attn
    for i in range(2):
        y = jax.named_call(feed_forward, name=f"layer{i}")(w, y)  # <-- layer
    z = feed_forward(w, y)  # <-- mlp
    return jnp.sum(jnp.sin(z) ** 2)


# ---------------------------------------------------------------------------
# `jax.vmap` of the user's function: per-example losses and gradients.


def example_loss(params, x):
    h = jnp.tanh(x @ params["w"] + params["b"])
    return jnp.sum(h**2)


def per_example(params, xs):
    z = xs * 2.0
    losses = jax.vmap(example_loss, in_axes=(None, 0))(params, z)
    return jnp.mean(losses)


def per_example_grads(params, xs):
    grads = jax.vmap(jax.grad(example_loss), in_axes=(None, 0))(params, xs)
    return sum(jnp.sum(g**2) for g in jax.tree.leaves(grads))


def per_column(params, xs_t):
    losses = jax.vmap(example_loss, in_axes=(None, 1))(params, xs_t)
    return jnp.mean(losses)


# ---------------------------------------------------------------------------
# A mixed-precision loop (jmp's idiom, in plain JAX): bf16 compute, f32 normalisation.


def layer(p, h):
    return jax.nn.gelu(h @ p["w"] + p["b"])


def mixed_loss(params, x):
    h = x.astype(jnp.bfloat16)  # <-- h in
    for p in params:
        p16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), p)
        h = layer(p16, h)
        h = h.astype(jnp.float32)
        h = h / (1.0 + jnp.abs(h).mean())  # <-- h loop
        h = h.astype(jnp.bfloat16)
    return jnp.mean(h.astype(jnp.float32) ** 2)


def mixed_args():
    ks = jax.random.split(jax.random.key(0), 4)
    params = [{"w": jax.random.normal(k, (8, 8)) * 0.3, "b": jnp.zeros(8)} for k in ks[:3]]
    return params, jax.random.normal(ks[3], (4, 8))
