"""Round 13 in a real browser: a partly-NaN face says its count, a colour scale that
smallest-magnitude sentinels do not stretch, and a stack's children told apart by
their index when their labels are cut."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

# float32's smallest normal number (`jnp.finfo(jnp.float32).tiny`): diffrax's
# `prevbefore(0.0)` under flush-to-zero
FLT_MIN = float(jnp.finfo(jnp.float32).tiny)


def node(pg, nid):
    return pg.locator(f'[data-node-id="{nid}"]')


def _denoise_loss(w, x, noise):
    with jax.named_scope("denoiser"):
        # two NaN entries of the 16 (sqrt of a negative), as a bad noise schedule made
        d = jnp.sqrt(x) @ w + 0.0 * jnp.sum(w)
    with jax.named_scope("mse"):
        return jnp.nanmean((d - noise) ** 2)


@pytest.mark.browser
def test_a_partly_nan_face_says_its_count(page, tmp_path):
    w = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
    x = jnp.abs(jnp.linspace(-1.0, 1.0, 8)).reshape(4, 2).at[1, 0].set(-1.0)
    noise = jnp.linspace(0.0, 1.0, 16).reshape(4, 4)
    ins = sowviz.inspect(_denoise_loss, w, x, noise)
    model = ins.to_dict()
    den = next(n for n in model["nodes"] if n["label"] == "denoiser")
    # the cotangent at the denoiser's output, by JAX, and the norm of its finite entries
    d = jnp.sqrt(x) @ w
    ct = np.asarray(jax.grad(lambda d: jnp.nanmean((d - noise) ** 2))(d))
    n_nan = int(np.isnan(ct).sum())
    finite_l2 = float(np.linalg.norm(ct[np.isfinite(ct)]))
    assert 0 < n_nan < ct.size  # the case: NaN beside finite values
    pg = page.open_report(ins.save_html(tmp_path / "nan_face.html"))
    text = node(pg, den["id"]).locator(".sv-value").text_content()
    # it read "‖grad‖₂ = 0.1973", the finite entries' norm as if it were the whole value's
    number = text.removeprefix("‖grad‖₂ = ").removesuffix(f" · {n_nan} NaN")
    assert text == f"‖grad‖₂ = {number} · {n_nan} NaN", text
    assert float(number) == pytest.approx(finite_l2, rel=1e-3)
    # inside its box, left of nothing it overlaps: the value ends within the node
    box = node(pg, den["id"]).locator(".sv-node-bg").first.bounding_box()
    value = node(pg, den["id"]).locator(".sv-value").bounding_box()
    toggle = node(pg, den["id"]).locator('[data-role="toggle"]').bounding_box()
    assert value["x"] + value["width"] <= box["x"] + box["width"]
    assert value["x"] >= toggle["x"] + toggle["width"]


def _sentinels(x):
    h = x
    for i in range(6):  # stages holding only float32's smallest normal number
        with jax.named_scope(f"prevbefore_{i}"):
            t = jnp.float32(FLT_MIN) * jnp.sign(x + i)
        h = h + t
    with jax.named_scope("solve"):
        return h * 2.0


@pytest.mark.browser
def test_smallest_magnitude_sentinels_do_not_set_the_legend(page, tmp_path):
    x = jnp.ones(3)
    ins = sowviz.inspect(_sentinels, x, mode="primal")
    pg = page.open_report(ins.save_html(tmp_path / "sentinels.html"))
    ticks = pg.locator(".sv-legend-tick").all_text_contents()
    # it ran from 1.175e-38 (the sentinels' norm); now from the input's √3, saying that
    # smaller values take its colour, to the solve's 2√3
    assert ticks == [f"≤ {np.sqrt(3):.4g}", f"{2 * np.sqrt(3):.4g}"], ticks
    model = ins.to_dict()
    ids = {n["label"]: n["id"] for n in model["nodes"]}
    chips = {
        k: node(pg, ids[k]).locator(".sv-chip").first.get_attribute("fill") for k in ("x", "solve")
    }
    assert chips["x"] != chips["solve"], chips  # both were the scale's top yellow


@pytest.mark.browser
def test_an_opened_stack_s_children_keep_their_index(page, tmp_path):
    eqx = pytest.importorskip("equinox")

    class AttentionBlock(eqx.Module):
        linear1: eqx.nn.Linear

        def __call__(self, x):
            return x + jnp.tanh(self.linear1(x))

    class VisionTransformer(eqx.Module):
        attention_blocks: list

        def __call__(self, x):
            for b in self.attention_blocks:
                x = b(x)
            return x

    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    model = VisionTransformer([AttentionBlock(eqx.nn.Linear(8, 8, key=k)) for k in keys])

    def loss(model, x):
        return jnp.mean(jax.vmap(model)(x) ** 2)

    ins = sowviz.inspect(loss, model, jnp.ones((4, 8)))
    pg = page.open_report(ins.save_html(tmp_path / "stack.html"))
    pg.get_by_text("+ 2 blocks").first.click()
    labels = pg.eval_on_selector_all(
        "[data-node-id] .sv-label", "els => els.map(e => e.textContent)"
    )
    blocks = [t for t in labels if t.startswith("attention_b")]
    # both read `attention_blocks…: AttentionBlock`
    assert len(blocks) == 2 and "[0]" in blocks[0] and "[1]" in blocks[1], blocks
    assert all(t.endswith(": AttentionBlock") for t in blocks), blocks
