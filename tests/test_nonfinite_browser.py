"""NaN origins as a user meets them: a real inspection, located down to the equation,
saved as a report and opened in headless chromium."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import pytest

import sowviz

ARTIFACTS = pathlib.Path(__file__).resolve().parents[1] / "artifacts"


def blocks(w, x):
    with jax.named_scope("embed"):
        h = jnp.tanh(x @ w)
    with jax.named_scope("norm"):
        v = jnp.mean(h * h, axis=-1, keepdims=True) - 1.0
        h = h * jax.lax.rsqrt(v)  # rsqrt of a negative: the NaN is born here
    with jax.named_scope("head"):
        h = h * 2.0
    with jax.named_scope("out"):
        h = jnp.sum(h, axis=-1)
    return jnp.mean(h)


LINE = 22  # the rsqrt line above


@pytest.fixture(scope="module")
def nan_report(tmp_path_factory):
    ins = sowviz.inspect(blocks, jnp.ones((3, 4)) * 0.1, jnp.ones((2, 3)))
    found = ins.locate_nonfinite()
    assert found.forward.equation.primitive == "rsqrt"
    return ins, ins.save_html(tmp_path_factory.mktemp("nf") / "nan.html")


def node(pg, nid):
    return pg.locator(f'[data-node-id="{nid}"]')


@pytest.mark.browser
def test_banner_names_the_equation_and_links_to_it(page, nan_report):
    ins, path = nan_report
    rec = ins.to_dict()["nonfinite"]
    eq = rec["forward"]["equation"]
    pg = page.open_report(path)
    banner = pg.locator('[data-role="nonfinite-banner"]')
    text = banner.inner_text()
    assert "rsqrt in norm" in text and f":{LINE}" in text
    assert banner.locator("code", has_text="rsqrt").count() >= 1
    link = banner.locator('[data-origin="forward"]')
    assert link.get_attribute("data-node") == eq["node"]
    link.click()  # opens the stage and selects the equation
    pg.wait_for_selector(f'[data-node-id="{eq["node"]}"]')
    assert node(pg, eq["node"]).get_attribute("data-nonfinite-role") == "producer"
    assert "rsqrt" in pg.locator('[data-role="detail"]').inner_text()
    assert page.errors == []


@pytest.mark.browser
def test_producer_is_drawn_apart_from_propagators(page, nan_report):
    ins, path = nan_report
    rec = ins.to_dict()["nonfinite"]
    label = {n.id: n.label for n in ins.graph.nodes}
    by_label = {v: k for k, v in label.items()}
    pg = page.open_report(path)
    norm, head, out = by_label["norm"], by_label["head"], by_label["out"]
    assert node(pg, norm).get_attribute("data-nonfinite") == "true"
    assert node(pg, norm).get_attribute("data-nonfinite-role") == "producer"
    for later in (head, out):  # they only pass the NaN on
        assert later in rec["propagators"]
        assert node(pg, later).get_attribute("data-nonfinite") == "true"
        assert node(pg, later).get_attribute("data-nonfinite-role") == "propagator"
    # the backward pass carries the NaN into `embed`'s cotangent: a propagator too
    assert by_label["embed"] in rec["propagators"]
    assert node(pg, by_label["x"]).get_attribute("data-nonfinite-role") is None  # finite
    # drawn differently: the propagator's outline is dashed, the producer's is not
    dash = "el => getComputedStyle(el.querySelector('.sv-node-bg')).strokeDasharray"
    assert node(pg, norm).evaluate(dash) in ("none", "")
    assert node(pg, head).evaluate(dash) not in ("none", "")
    # faces say what the NaN nodes hold: the statistics are over finite values (a
    # NaN gradient's ‖grad‖₂ read 0), and the NaN loss is no finite number
    w_face = node(pg, by_label["w"]).locator(".sv-value").text_content()
    n_nan = next(p for p in ins.probes if p.node == by_label["w"]).summaries["cotangent"]["nan"]
    assert n_nan == 12 and w_face == f"grad: {n_nan} NaN"
    output = next(n.id for n in ins.graph.nodes if n.kind == "output")
    assert node(pg, output).locator(".sv-value").text_content() == "value = NaN"
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "nonfinite_roles.png"))
    assert page.errors == []


@pytest.mark.browser
def test_a_value_masked_before_any_result_is_reported_quietly(page, tmp_path):
    """A -inf mask that never reaches a result is reported with no alarm: the banner
    says so, and does not say it in the alarm's colour."""

    def masked(s):
        with jax.named_scope("mask"):
            s = jnp.where(s > 0, s, -jnp.inf)
        return jnp.sum(jax.nn.softmax(s, axis=-1))

    ins = sowviz.inspect(masked, jnp.array([[1.0, -1.0, 2.0]]), mode="primal")
    rec = ins.to_dict()["nonfinite"]
    assert rec["removed"] and not rec["alarm"]
    pg = page.open_report(ins.save_html(tmp_path / "masked.html"))
    banner = pg.locator('[data-role="nonfinite-banner"]')
    assert "never reached a result (no alarm)" in banner.inner_text()
    colour = lambda sel: pg.eval_on_selector(sel, "e => getComputedStyle(e).color")  # noqa: E731
    heading = colour('[data-role="nonfinite-banner"] strong')
    assert heading == colour('[data-role="nonfinite-banner"]')  # the text's, not the alarm's
    # the node holding the masked -Inf is marked, not in the alarm's red (a finite
    # diffrax solve's +Inf buffer looked like a NaN alarm)
    mask = next(n.id for n in ins.graph.nodes if n.label == "mask")
    bg = f'[data-node-id="{mask}"] > .sv-node-bg'
    assert pg.get_attribute(f'[data-node-id="{mask}"]', "data-nonfinite") == "true"
    stroke = pg.eval_on_selector(bg, "e => getComputedStyle(e).stroke")
    bad = pg.evaluate(
        "() => getComputedStyle(document.querySelector('.sowviz')).getPropertyValue('--sv-bad')"
    )
    assert stroke != _rgb(bad.strip()) and "rgb" in stroke
    # its panel says the values were masked, in the muted colour, not as an alarm
    pg.click(f'[data-node-id="{mask}"]')
    alert = pg.locator('[data-role="detail"] .sv-alert')
    assert "Masked before any result" in alert.inner_text()
    assert alert.get_attribute("role") == "note"
    assert pg.eval_on_selector(
        '[data-role="detail"] .sv-alert', "e => getComputedStyle(e).color"
    ) != _rgb(bad.strip())
    assert page.errors == []


def _rgb(hex_colour: str) -> str:
    h = hex_colour.lstrip("#")
    return "rgb({}, {}, {})".format(*(int(h[i : i + 2], 16) for i in (0, 2, 4)))


def _first_in_group(w, x):
    with jax.named_scope("model"):
        with jax.named_scope("block"):
            h = jnp.sqrt(x @ w)  # a negative entry: NaN, in the group's first stage
        with jax.named_scope("head"):
            h = jnp.tanh(h) * 2.0
    return jnp.mean(h)


@pytest.mark.browser
def test_the_origin_flag_of_a_groups_first_stage_leaves_the_groups_name_readable(page, tmp_path):
    # The flag above a stage sat on its group's header, over the group's name.
    w = jnp.array([[1.0, -1.0], [0.5, -2.0]])
    ins = sowviz.inspect(_first_in_group, w, jnp.ones((3, 2)))
    by_label = {n.label: n.id for n in ins.graph.nodes}
    assert ins.nonfinite.forward.node == by_label["block"]
    pg = page.open_report(ins.save_html(tmp_path / "first.html"))
    if node(pg, by_label["model"]).get_attribute("data-expanded") != "true":
        node(pg, by_label["model"]).locator("[data-role=toggle]").first.click()
    pg.wait_for_selector(f'[data-node-id="{by_label["block"]}"] .sv-origin-flag')
    flag = node(pg, by_label["block"]).locator(".sv-origin-flag").bounding_box()
    name = node(pg, by_label["model"]).locator(".sv-stage-label").first.bounding_box()
    block = node(pg, by_label["block"]).locator(".sv-node-bg").bounding_box()
    assert flag and name and block
    below_name = flag["y"] >= name["y"] + name["height"]
    beside_name = flag["x"] >= name["x"] + name["width"]
    assert below_name or beside_name, (flag, name)
    # right above or right under its stage (above when the group's entry port stands
    # between its header and the stage), over no port
    above = abs(flag["y"] + flag["height"] - block["y"]) < 8
    under = abs(flag["y"] - (block["y"] + block["height"])) < 8
    assert above or under, (flag, block)
    for port in pg.locator(".sv-port").all():
        b = port.bounding_box()
        assert b["y"] + b["height"] <= flag["y"] or b["y"] >= flag["y"] + flag["height"]
    assert page.errors == []


def _loop_with_inf_buffer(y0):
    """A loop state holding an +Inf-filled buffer (diffrax's output buffer), masked at
    the end: every result is finite."""
    eqxi = pytest.importorskip("equinox.internal")

    def body(c):
        i, y, buf = c
        return i + 1, y - 0.1 * jnp.sqrt(y), buf.at[i].set(y[0])

    init = (0, y0, jnp.full((4,), jnp.inf))
    _, y, buf = eqxi.while_loop(
        lambda c: c[0] < 3, body, init, max_steps=8, kind="checkpointed", buffers=lambda c: c[2]
    )
    return jnp.sum(y) + jnp.sum(jnp.where(jnp.isfinite(buf), buf, 0.0))


@pytest.mark.browser
def test_a_loops_inf_fill_in_a_finite_run_draws_no_start_flag(page, tmp_path):
    """A finite diffrax or optimistix run carried "NaN/Inf starts here (forward)" on
    the solve: the +Inf its loop state starts with is a fill, said quietly, flagged
    nowhere."""
    ins = sowviz.inspect(_loop_with_inf_buffer, jnp.array([4.0]), mode="primal")
    assert bool(jnp.isfinite(ins.result)) and ins.nonfinite.forward is None
    pg = page.open_report(ins.save_html(tmp_path / "fill.html"))
    banner = pg.locator('[data-role="nonfinite-banner"]')
    assert "never reached a result (no alarm)" in banner.inner_text()
    # and says what they are: the record's sentence, there being no origin to name
    assert "Only +Inf fill values" in banner.inner_text(), banner.inner_text()
    assert pg.locator(".sv-origin-flag").count() == 0
    assert pg.locator("[data-nonfinite-origin]").count() == 0
    assert pg.locator('[data-nonfinite-role="producer"]').count() == 0
    # the stage holding the fill still says it holds +Inf, quietly
    assert pg.locator('[data-nonfinite="true"]').count() >= 1
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "nonfinite_loop_fill.png"))
    assert page.errors == []
