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
    # a tuple carry both of whose parts one value fills, unpacked by the body as
    # `a, b = c`: both names (in mode "jvp": "grad"'s forward loop reads `b` only,
    # `a * 2.0` moving to the backward)
    assert list(
        _ports(sowviz.inspect(_rnn, params, xs, mode="jvp"))["fori_loop(body)"].values()
    ) == ["a, b"]
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
    # `jnp.where` is a `jit` of JAX's own: its parameter names are not the user's; inside
    # `layer` it takes `layer`'s name for the value
    assert ports.get("where", {"sin": "y"}) == {"sin": "y"}


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
    # the body unpacks its carry (`i, x, key = carry`): the ports read its names
    assert _ports(ins)["while(body)"] == {"key": "key", "x": "x"}
    np.testing.assert_allclose(ins.result, run(x, key), rtol=1e-6)


def test_a_body_unpacking_its_tuple_names_the_ports_as_it_unpacks():
    def step(carry, x):
        h, stats = carry  # JAX records `carry[0]`, `carry[1]['mu']`
        h = jnp.tanh(h + x)
        return (h, {"mu": stats["mu"] * 0.9 + h.mean()}), h

    def reassigned(carry, x):
        carry = (carry[0] * 2.0, carry[1])  # from here `carry` is another tuple
        a, b = carry
        return (a + x, b), a

    def run(xs):
        init = (jnp.sin(xs[0]), {"mu": jnp.cos(xs[0]).sum()})
        (_, stats), hs = jax.lax.scan(step, init, xs)
        (a, _), _ = jax.lax.scan(reassigned, (jnp.exp(xs[0]), jnp.tanh(xs[0])), xs)
        return jnp.sum(hs**2) + stats["mu"] + a.sum()

    xs = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    ins = sowviz.inspect(run, xs)
    ports = _ports(ins)
    assert ports["scan(step)"]["sin"] == "h"
    assert "stats['mu']" in ports["scan(step)"].values()
    assert not [n for n in ports["scan(step)"].values() if n.startswith("carry")]
    # a parameter assigned before it is unpacked keeps JAX's names
    assert set(ports["scan(reassigned)"].values()) <= {"carry[0]", "carry[1]", "x"}
    loss, grad = jax.value_and_grad(run)(xs)
    np.testing.assert_allclose(ins.result[0], loss, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-5, atol=1e-6)
