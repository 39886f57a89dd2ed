"""Round 13: a sow written as a statement is on the data flow; an aux output made
inside a loop or a call carries its gradient.

1. `sowviz.sow(h, "h")` as a statement (its result dropped, as Flax users write
   `self.sow(...)`) recorded an all-zero cotangent under `jax.grad`: the program read
   on `h`, not sow's copy. Later reads of `h` now read the sown value
   (`capture.primitive._SowPrimitive.bind`, `_compat.read_on_through`).
2. A Flax Linen `self.sow` inside `nn.scan`, returned as aux, drew its aux box with no
   cotangent: the box was probed on the scan's stacked copy, which nothing reads. It is
   now probed where the value is made (`graph.build._made_inside`)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import sowviz

W = jax.random.normal(jax.random.PRNGKey(0), (8, 8)) / 3
X = jax.random.normal(jax.random.PRNGKey(1), (4, 8))


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def statement(h, name):
    sowviz.sow(h, name)  # the result dropped: the program reads on `h`
    return h


def used(h, name):
    return sowviz.sow(h, name)


def head(h):
    return jnp.sum((h @ W) ** 2)


def plain(w, x, s):
    h = s(jnp.tanh(x @ w), "h")
    return head(h)


def jitted(w, x, s):
    return jax.jit(lambda w, x: plain(w, x, s))(w, x)


def remat(w, x, s):
    return jax.checkpoint(lambda w, x: plain(w, x, s))(w, x)


def vmapped(w, x, s):
    return jnp.sum(jax.vmap(lambda xi: plain(w, xi[None], s))(x))


def vmapped_axis1(w, x, s):  # (the batch axis the sow moves to the front)
    return jnp.sum(jax.vmap(lambda xi: plain(w, xi[None], s), in_axes=1)(x.T))


def conded(w, x, s):
    return lax.cond(True, lambda x: plain(w, x, s), jnp.sum, x)


def dh_reference(w, x):
    """dL/dh by plain JAX, L = head(h), h = tanh(x @ w)."""
    return jax.grad(head)(jnp.tanh(x @ w))


@pytest.mark.parametrize("program", [plain, jitted, remat, vmapped, vmapped_axis1, conded])
def test_statement_sow_records_the_gradient_of_its_value(program):
    g, inter = sowviz.save_intermediates(jax.grad(lambda w, x: program(w, x, statement)))(W, X)
    ref = dh_reference(W, X)
    close(inter["h"]["cotangent"].reshape(ref.shape), ref)
    close(inter["h"]["primal"].reshape(ref.shape), jnp.tanh(X @ W))
    close(g, jax.grad(lambda w, x: program(w, x, used))(W, X))  # the result untouched
    assert float(jnp.linalg.norm(ref)) > 1  # (not a zero the test could miss)


def test_statement_sow_in_a_scan_body_gives_each_iteration_its_gradient():
    def run(s):
        def loss(w, x):
            def body(c, _):
                h = s(jnp.tanh(c @ w), "h")
                return h @ w, None

            return jnp.sum(lax.scan(body, x, None, length=3)[0] ** 2)

        return sowviz.save_intermediates(jax.grad(loss))(W, X)[1]["h"]["cotangent"]

    got = run(statement)

    # by hand: perturb each iteration's h
    def by_eps(eps):
        c = X
        for k in range(3):
            c = (jnp.tanh(c @ W) + eps[k]) @ W
        return jnp.sum(c**2)

    ref = jax.grad(by_eps)(jnp.zeros((3, *X.shape)))
    close(got, ref)
    close(run(used), ref)


@pytest.mark.parametrize(
    "transform",
    [
        lambda f: jax.grad(lambda w: jnp.sum(jax.grad(f)(w) ** 2)),
        jax.hessian,
        lambda f: lambda w: jax.jvp(f, (w,), (W,)),
    ],
    ids=["grad_of_grad", "hessian", "jvp"],
)
def test_statement_sow_matches_the_used_result_under_every_transformation(transform):
    def keys(s):
        out, inter = sowviz.save_intermediates(transform(lambda w: plain(w, X, s)))(W)
        return out, inter["h"]

    (out_s, got), (out_u, want) = keys(statement), keys(used)
    close(out_s, out_u)
    assert sorted(got) == sorted(want)
    for k in want:
        close(got[k], want[k], tol=1e-4)
    assert any(float(jnp.abs(got[k]).max()) > 0 for k in got if k != "primal")


def test_a_value_sown_only_for_the_record_keeps_its_zero_gradient():
    def loss(w, x):
        sowviz.sow(jnp.linalg.norm(w), "wnorm")  # nothing reads it, nor its input
        return plain(w, x, used)

    g, inter = sowviz.save_intermediates(jax.grad(loss))(W, X)
    assert float(inter["wnorm"]["cotangent"]) == 0.0
    close(inter["wnorm"]["primal"], jnp.linalg.norm(W))
    close(g, jax.grad(lambda w, x: plain(w, x, used))(W, X))


def _read_first(w, x):
    h = jnp.tanh(x @ w)
    y = h @ W  # read before the sow: this read bypasses it
    sowviz.sow(h, "h")
    return jnp.sum(y**2)


def _read_first_in_scan(w, x):
    def body(c, _):
        h = jnp.tanh(c @ w)
        y = h @ w
        sowviz.sow(h, "h")
        return y, None

    return jnp.sum(lax.scan(body, x, None, length=3)[0] ** 2)


@pytest.mark.parametrize("program", [_read_first, _read_first_in_scan])
def test_a_value_read_before_its_sow_warns_instead_of_a_silent_zero(program):
    with pytest.warns(
        UserWarning,
        match=r"cotangent of sow 'h' \(.*test_capture_round13.py:\d+\) is all zeros because the program read the value before",
    ) as got:
        _, inter = sowviz.save_intermediates(jax.grad(program))(W, X)
    assert "h = sowviz.sow(h, 'h')" in str(got[0].message)
    assert float(jnp.abs(inter["h"]["cotangent"]).max()) == 0.0  # (what it warns of)


def test_inspect_of_a_statement_sow_agrees_with_save_intermediates():
    def loss(w, x):
        return plain(w, x, statement)

    ins = sowviz.inspect(loss, W, X)
    ref = dh_reference(W, X)
    got = ins.probe("h").summaries["cotangent"]["l2"]
    assert got == pytest.approx(float(jnp.linalg.norm(ref)), rel=1e-5)


# --- 2. an aux output made inside a loop or a call -------------------------------


class _Layer(nn.Module):
    perturbed: bool = False

    @nn.compact
    def __call__(self, x, _):
        h = jnp.tanh(nn.Dense(8, name="fc")(x))
        if self.perturbed:
            h = self.perturb("h", h)
        else:
            self.sow("intermediates", "h", h)
        return h, None


class _Net(nn.Module):
    perturbed: bool = False

    @nn.compact
    def __call__(self, x):
        axes = {"params": 0, "intermediates": 0, "perturbations": 0}
        scan = nn.scan(_Layer, variable_axes=axes, split_rngs={"params": True}, length=3)
        x, _ = scan(self.perturbed, name="layers")(x, None)
        self.sow("intermediates", "out", x)
        return x


def _aux_cotangent(ins, leaf_shape):
    """The cotangent summary of the aux output box whose value has `leaf_shape`."""
    boxes = {n.id for n in ins.graph.nodes if n.kind == "output"}
    got = [
        q.summaries
        for q in ins.probes
        if q.node in boxes and q.summaries["primal"]["shape"] == list(leaf_shape)
    ]
    assert len(got) == 1, [q.name for q in ins.probes if q.node in boxes]
    return got[0].get("cotangent")


def test_linen_sow_inside_nn_scan_gives_its_aux_box_the_gradient():
    params = _Net().init(jax.random.PRNGKey(1), X)["params"]

    def loss(params, x):
        y, mods = _Net().apply({"params": params}, x, mutable=["intermediates"])
        return jnp.sum(y**2), mods["intermediates"]

    ins = sowviz.inspect(loss, params, X, has_aux=True)
    # reference: Flax's own perturbations of the same h
    net = _Net(perturbed=True)
    pert = net.init(jax.random.PRNGKey(1), X)["perturbations"]
    ref = jax.grad(lambda p: jnp.sum(net.apply({"params": params, "perturbations": p}, X) ** 2))(
        pert
    )["layers"]["h"]
    got = _aux_cotangent(ins, (3, *X.shape))
    assert got is not None, "the aux box of a sow inside nn.scan has no cotangent"
    assert got["l2"] == pytest.approx(float(jnp.linalg.norm(ref)), rel=1e-5)
    assert got["mean"] == pytest.approx(float(jnp.mean(ref)), rel=1e-4, abs=1e-7)
    # the sow outside the scan kept its gradient: dL/dy = 2y
    y = _Net().apply({"params": params}, X)
    out = _aux_cotangent(ins, X.shape)
    assert out["l2"] == pytest.approx(float(jnp.linalg.norm(2 * y)), rel=1e-5)


def test_aux_output_made_inside_a_jit_carries_its_gradient():
    def loss(w, x):
        @jax.jit
        def f(w, x):
            h = jnp.tanh(x @ w)
            return head(h), h

        value, h = f(w, x)
        return value, {"h": h}

    ins = sowviz.inspect(loss, W, X, has_aux=True)
    got = _aux_cotangent(ins, X.shape)
    assert got is not None
    assert got["l2"] == pytest.approx(float(jnp.linalg.norm(dh_reference(W, X))), rel=1e-5)
