"""What an opened loop or call names the values entering it: the name its body gives
them (`step(h, x)`'s `h`, not `broadcast_in_dim`, the `jnp.zeros` making the carry's
first value), recorded as `Node.port_names` by producer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import sowviz
from sowviz.graph.build import joined_name


def _ports(ins: sowviz.Inspection) -> dict[str, dict[str, str]]:
    """Each stage's `port_names` from the model JSON, producers and stages by label."""
    m = ins.to_dict()
    label = {n["id"]: n["label"] for n in m["nodes"]}
    return {
        label[n["id"]]: {label.get(k, k): v for k, v in n["port_names"].items()}
        for n in m["nodes"]
        if n.get("port_names")
    }


def _rnn(params, xs):
    w, u = params

    def step(h, x):
        h = jnp.tanh(h @ w + x @ u)
        return h, h

    h0 = jnp.zeros((4, 8))
    _, hs = jax.lax.scan(step, h0, xs)

    def body(i, c):
        a, b = c
        return a * 2.0, b + i

    last = hs[-1]
    a, b = jax.lax.fori_loop(0, 3, body, (last, last))
    return jnp.mean(hs**2) + jnp.sum(a) + jnp.sum(b)


def _args():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = (jax.random.normal(k1, (8, 8)) * 0.3, jax.random.normal(k2, (3, 8)))
    return params, jax.random.normal(k3, (5, 4, 3))


def test_a_scan_names_its_carry_and_xs_as_its_body_does():
    params, xs = _args()
    ins = sowviz.inspect(_rnn, params, xs)
    ports = _ports(ins)
    # the carry's first value comes from `jnp.zeros` (a `broadcast_in_dim`), xs is the input
    assert ports["scan(step)"] == {"broadcast_in_dim": "h", "xs": "x"}
    # a tuple carry both of whose parts one value fills: their common name (in mode
    # "jvp": "grad"'s forward loop reads `c[1]` only, `a * 2.0` moving to the backward)
    assert list(
        _ports(sowviz.inspect(_rnn, params, xs, mode="jvp"))["fori_loop(body)"].values()
    ) == ["c"]
    # the values are what plain JAX computes (naming changes no number)
    loss, grads = jax.value_and_grad(_rnn)(params, xs)
    np.testing.assert_allclose(ins.result[0], loss, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(ins.result[1]), jax.tree.leaves(grads), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_users_jitted_function_names_its_parameters_a_librarys_does_not():
    @jax.jit
    def layer(y, w):
        return jnp.where(y > 0, y, 0.1 * y) @ w

    def net(w, x):
        h = jnp.sin(x)
        return jnp.sum(layer(h, w) ** 2)

    w, x = jnp.ones((3, 3)), jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
    ports = _ports(sowviz.inspect(net, w, x))
    assert ports["layer"] == {"sin": "y"}
    # `jnp.where` is a `jit` of JAX's own: its parameter names are not the user's
    assert "where" not in ports


def test_joined_name_keeps_the_common_pytree_prefix():
    assert joined_name(None, "h") == "h"
    assert joined_name("h", "h") == "h"
    assert joined_name("c[0]", "c[1]") == "c"
    assert joined_name("c[0][1]", "c[1]") == "c"
    assert joined_name("p['w']", "p['b']") == "p"
    assert joined_name("state.mu", "state.nu") == "state"
    assert joined_name("a", "b") == "a, b"


def test_a_key_carried_through_a_loop_enters_by_its_port():
    # the body wraps the carried key data (`random_wrap`, drawn as an edge) before
    # splitting it: its readers were lost, and the key had no port
    def body(carry):
        i, x, key = carry
        key, sub = jax.random.split(key)
        return i + 1, x + jax.random.normal(sub, x.shape), key

    def run(x, key):
        _, x, _ = jax.lax.while_loop(lambda c: c[0] < 5, body, (0, x, key))
        return x.sum()

    x, key = jnp.zeros(3), jax.random.PRNGKey(0)
    ins = sowviz.inspect(run, x, key, mode="primal")
    m = ins.to_dict()
    label = {n["id"]: n["label"] for n in m["nodes"]}
    (loop,) = [n["id"] for n in m["nodes"] if n["kind"] == "while"]
    into = {label[e["source"]]: {label[t] for _, t in e.get("ends", [])} for e in m["edges"]}
    assert [e for e in m["edges"] if e["target"] == loop and label[e["source"]] == "key"]
    assert into["key"] == {"random_split"} and into["x"] == {"add"}
    assert _ports(ins)["while(body)"] == {"key": "carry[2]", "x": "carry[1]"}
    np.testing.assert_allclose(ins.result, run(x, key), rtol=1e-6)
