"""Round 16: a stage's outputs as it shows them. A Flax Linen module's stage numbers
what its call returns first, the submodule values `capture_intermediates=True` takes
out of it after; a scan's type ("shape" row) lists its outputs in the order its probes
number them; a value that does not reach the differentiated output says so in the
panel, not that it does not depend on the differentiated arguments."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import sowviz


def _probes_of(model: dict, node: str) -> dict[str, dict]:
    return {p["leaf"]: p for p in model["probes"] if p["node"] == node}


def _shape(p: dict) -> str:
    s = p["summaries"]["primal"]
    return f"{s['dtype']}[{','.join(map(str, s['shape']))}]"


def _l2(x) -> float:
    return float(jnp.linalg.norm(jnp.ravel(x)))


# -- 1. Linen `capture_intermediates=True`: the module's return value is `[0]` ---------


class _Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x + nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8, name="self_attn")(
            x, x
        )


def test_a_linen_module_numbers_its_return_value_first_under_capture_intermediates():
    model = _Block()
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 8))
    params = model.init(jax.random.PRNGKey(0), x)["params"]

    def loss_fn(params, x):
        y, inter = model.apply(
            {"params": params}, x, capture_intermediates=True, mutable=["intermediates"]
        )
        return jnp.mean(y**2), inter

    d = sowviz.inspect(loss_fn, params, x, mode="grad", has_aux=True).to_dict()
    block = next(n["id"] for n in d["nodes"] if n["label"] == "_Block")
    node = next(n for n in d["nodes"] if n["label"] == "self_attn" and n["parent"] == block)
    # what `__call__` returns first, the `query`, `key`, `value` projections after it
    assert node["shapes"] == ["float32[2,5,8]"] + ["float32[2,5,2,4]"] * 3
    probes = _probes_of(d, node["id"])
    assert [_shape(probes[f"[{k}]"]) for k in range(4)] == node["shapes"]
    # `[0]` is the attention's output, computed apart, and its gradient d loss / d out
    attn = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8)
    out = attn.apply({"params": params["self_attn"]}, x, x)
    cot = jax.grad(lambda a: jnp.mean((x + a) ** 2))(out)
    first = probes["[0]"]["summaries"]
    np.testing.assert_allclose(first["primal"]["l2"], _l2(out), rtol=1e-5)
    np.testing.assert_allclose(first["primal"]["mean"], float(out.mean()), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(first["cotangent"]["l2"], _l2(cot), rtol=1e-5)
    # and `[1]` is the query projection (the one it used to show as `[0]`)
    query = nn.DenseGeneral(features=(2, 4)).apply({"params": params["self_attn"]["query"]}, x)
    np.testing.assert_allclose(probes["[1]"]["summaries"]["primal"]["l2"], _l2(query), rtol=1e-5)


# -- 2. a scan's shape row in its output numbering ---------------------------------------


def _body(state, _):
    R, V, F = state
    V = V + 0.1 * F
    R = R + 0.1 * V
    F = -R
    return (R, V, F), jnp.sum(V**2)


def _md_loss(R0, V0):
    (_, V, _), ke = lax.scan(_body, (R0, V0, -R0), None, length=5)
    return jnp.sum(V**2) + jnp.var(ke)


def test_a_scans_shapes_follow_its_output_numbering():
    R0 = jax.random.normal(jax.random.PRNGKey(0), (4, 2))
    V0 = jnp.zeros_like(R0)
    d = sowviz.inspect(_md_loss, R0, V0, mode="grad").to_dict()
    scan = next(n for n in d["nodes"] if n["kind"] == "scan")
    probes = _probes_of(d, scan["id"])
    assert sorted(probes) == ["[0]", "[1]", "[2]", "[3]"]
    assert [_shape(probes[f"[{k}]"]) for k in range(4)] == scan["shapes"]
    # what the program reads first (the final V, the stacked energies), as the card's
    # type and face show it, then the carry it drops (R, F): values computed apart
    (R, V, F), ke = lax.scan(_body, (R0, V0, -R0), None, length=5)
    assert scan["shapes"][:2] == ["float32[4,2]", "float32[5]"]
    gV, gke = jax.grad(lambda v, k: jnp.sum(v**2) + jnp.var(k), argnums=(0, 1))(V, ke)
    for leaf, value, cot in (("[0]", V, gV), ("[1]", ke, gke), ("[2]", R, None), ("[3]", F, None)):
        s = probes[leaf]["summaries"]
        np.testing.assert_allclose(s["primal"]["l2"], _l2(value), rtol=1e-5, err_msg=leaf)
        if cot is not None:
            np.testing.assert_allclose(s["cotangent"]["l2"], _l2(cot), rtol=1e-5, err_msg=leaf)
        else:  # (R and F reach no output: no cotangent, and the model says why)
            assert "cotangent" not in s and probes[leaf]["no_cotangent"] == "unreached"


# -- 3. "no cotangent": does not reach the output vs does not depend on the arguments ----


class _Enc(nn.Module):
    @nn.compact
    def __call__(self, x):
        carry, outs = nn.RNN(nn.GRUCell(4), return_carry=True, name="rnn")(x)
        self.sow("intermediates", "outs", outs)  # returned as aux, never read by the loss
        return carry


def _enc_case():
    model = _Enc()
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 5))
    params = model.init(jax.random.PRNGKey(0), x)["params"]

    def loss_fn(params, x):
        carry, inter = model.apply({"params": params}, x, mutable=["intermediates"])
        return jnp.mean(carry**2), inter

    return loss_fn, params, x


def _forces_like(params, pos):
    # `dist` and `rbf` are of the positions only: no tangent of the parameters reaches them
    dist = jnp.sqrt(jnp.sum((pos[:, None] - pos[None]) ** 2, -1) + 1.0)
    rbf = jnp.exp(-((dist[..., None] - jnp.arange(3.0)) ** 2))
    energy = jnp.tanh(rbf @ params["w"])
    return jnp.sum(energy**2)


def test_the_model_says_why_a_probe_has_no_cotangent():
    loss_fn, params, x = _enc_case()
    # the sown outputs do depend on the parameters; the loss does not read them
    ones = jax.tree.map(jnp.ones_like, params)
    _, tangent = jax.jvp(lambda p: loss_fn(p, x)[1]["intermediates"]["outs"][0], (params,), (ones,))
    assert _l2(tangent) > 1e-3
    ins = sowviz.inspect(loss_fn, params, x, mode="grad", has_aux=True)
    d = ins.to_dict()
    out = next(n for n in d["nodes"] if n["kind"] == "output" and "outs" in n["label"])
    (p,) = _probes_of(d, out["id"]).values()
    assert "cotangent" not in p["summaries"] and p["no_cotangent"] == "unreached"
    outs = loss_fn(params, x)[1]["intermediates"]["outs"][0]
    np.testing.assert_allclose(p["summaries"]["primal"]["l2"], _l2(outs), rtol=1e-5)
    # a probe has a reason exactly when it has no cotangent (the input `x`: independent)
    assert all(
        ("cotangent" in q["summaries"]) == ("no_cotangent" not in q)
        for q in d["probes"]
        if q["auto"] and "primal" in q["summaries"]
    )
    # a value of the non-differentiated positions only: "independent"
    w = {"w": jnp.array([[0.3], [-0.2], [0.5]])}
    pos = jax.random.normal(jax.random.PRNGKey(7), (4, 3))
    d2 = sowviz.inspect(_forces_like, w, pos, mode="grad").to_dict()
    by_label = {n["label"]: n["id"] for n in d2["nodes"]}
    for label in ("dist", "rbf"):
        (q,) = _probes_of(d2, by_label[label]).values()
        assert q["no_cotangent"] == "independent", label
    (e,) = _probes_of(d2, by_label["energy"]).values()
    assert "no_cotangent" not in e and "cotangent" in e["summaries"]


@pytest.mark.browser
def test_the_panel_says_an_unread_aux_does_not_reach_the_output(page, tmp_path):
    loss_fn, params, x = _enc_case()
    ins = sowviz.inspect(loss_fn, params, x, mode="grad", has_aux=True)
    path = tmp_path / "enc.html"
    ins.save_html(path)
    pg = page.open_report(path)
    out = next(n for n in ins.graph.nodes if n.kind == "output" and "outs" in n.label)
    pg.locator(f'[data-node-id="{out.id}"]').first.click()
    pg.wait_for_timeout(200)
    note = pg.locator('[data-role="detail"] [data-role="no-cotangent"]')
    assert note.count() == 1
    text = note.text_content()
    assert "does not reach the differentiated output" in text and "gradient is zero" in text
    assert "does not depend on the differentiated arguments" not in text
    # a value of the non-differentiated positions only still says that
    w = {"w": jnp.array([[0.3], [-0.2], [0.5]])}
    pos = jax.random.normal(jax.random.PRNGKey(7), (4, 3))
    ins2 = sowviz.inspect(_forces_like, w, pos, mode="grad")
    path2 = tmp_path / "forces.html"
    ins2.save_html(path2)
    pg = page.open_report(path2)
    rbf = next(n.id for n in ins2.graph.nodes if n.label == "rbf")
    pg.locator(f'[data-node-id="{rbf}"]').first.click()
    pg.wait_for_timeout(200)
    note = pg.locator('[data-role="detail"] [data-role="no-cotangent"]')
    assert "does not depend on the differentiated arguments" in note.text_content()
    assert page.errors == [] and page.requests == []
