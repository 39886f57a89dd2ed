"""Round 17 (a visual check in JupyterLab and reports): the keyboard reaches the graph's
stages, Escape closes the panel, headings keep the user's names, a parameter group says
what it is, and search's Enter opens the stage a user means."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Page

import sowviz

SHOTS = __import__("os").environ.get(
    "SV_SHOTS"
)  # a folder path to keep this file's screenshots (for a look by eye)


def _mlp_loss(params, x, y):
    with jax.named_scope("mlp"):
        h = jax.nn.relu(x @ params["w1"] + params["b1"])
        out = h @ params["w2"] + params["b2"]
    return jnp.mean((out - y) ** 2)


def _mlp_report(tmp_path):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {
        "w1": jax.random.normal(k1, (8, 32)) * 0.3,
        "b1": jnp.zeros(32),
        "w2": jax.random.normal(k2, (32, 1)) * 0.3,
        "b2": jnp.zeros(1),
    }
    x = jax.random.normal(k3, (64, 8))
    ins = sowviz.inspect(_mlp_loss, params, x, jnp.sin(x[:, :1]))
    return ins.save_html(tmp_path / "mlp.html")


def _active(pg):
    return pg.evaluate(
        "() => { const g = document.activeElement.closest('[data-node-id]');"
        " return g ? g.dataset.nodeId : null }"
    )


def _tab_to_stage(pg):
    pg.locator('[data-role="search"]').focus()
    for _ in range(10):
        pg.keyboard.press("Tab")
        if _active(pg):
            return _active(pg)
    raise AssertionError("Tab never reached a stage")


@pytest.mark.browser
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_keyboard_opens_a_stage_panel_and_escape_returns_to_it(browser, tmp_path, scheme):
    p = Page(browser, color_scheme=scheme)
    try:
        pg = p.open_report(_mlp_report(tmp_path))
        stages = pg.locator("[data-node-id]")
        # one Tab stop for the whole graph (a roving tabindex), each stage a named button
        tabbable = pg.locator('[data-node-id][tabindex="0"]')
        assert tabbable.count() == 1
        assert stages.count() == pg.locator('[data-node-id][role="button"]').count() > 3
        first = _tab_to_stage(pg)
        el = pg.locator(f'[data-node-id="{first}"]')
        label = pg.evaluate(
            f"() => document.querySelector('[data-node-id=\"{first}\"]').dataset.kind"
        )
        assert el.get_attribute("aria-label").endswith(label) or "group of" in el.get_attribute(
            "aria-label"
        )
        # the keyboard's focus is drawn (a ring round the stage), not the selection's mark
        assert el.locator(".sv-focus-ring").count() == 1
        ring = el.locator(".sv-focus-ring").bounding_box()
        assert ring["width"] > 20 and ring["height"] > 10
        # arrows move the focus to another stage, which then is the Tab stop
        pg.keyboard.press("ArrowDown")
        moved = _active(pg)
        assert moved and moved != first
        assert pg.locator('[data-node-id][tabindex="0"]').count() == 1
        assert pg.locator(f'[data-node-id="{moved}"]').get_attribute("tabindex") == "0"
        if SHOTS:
            pg.screenshot(path=f"{SHOTS}/focus_{scheme}.png")
        # Enter opens its panel; the focus stays on the stage
        pg.keyboard.press("Enter")
        detail = pg.locator('[data-role="detail"]')
        detail.wait_for(state="visible")
        name = pg.evaluate(
            f"() => document.querySelector('[data-node-id=\"{moved}\"]').getAttribute('aria-label')"
        )
        assert name.startswith(detail.locator(".sv-detail-title").inner_text())
        assert _active(pg) == moved
        # Escape closes it, and the focus is on the stage it came from
        pg.keyboard.press("Escape")
        assert detail.is_hidden()
        assert _active(pg) == moved
        # from inside the panel too (its × button focused)
        pg.keyboard.press(" ")
        detail.wait_for(state="visible")
        detail.locator(".sv-close").focus()
        pg.keyboard.press("Escape")
        assert detail.is_hidden()
        assert _active(pg) == moved
        # the search box's Escape still clears the query (and leaves an open panel)
        pg.keyboard.press("Enter")
        search = pg.locator('[data-role="search"]')
        search.fill("relu")
        search.press("Escape")
        assert search.input_value() == "" and detail.is_visible()
        assert p.errors == []
    finally:
        p.close()


@pytest.mark.browser
def test_plus_opens_a_focused_stage_and_keeps_its_focus(page, tmp_path):
    pg = page.open_report(_mlp_report(tmp_path))
    pg.locator("[data-node-id]", has_text="parameters").first.click()
    pg.keyboard.press("Escape")  # (the panel the click opened)
    group = pg.locator('[data-node-id][aria-label^="parameters"]')
    gid = group.get_attribute("data-node-id")
    assert group.get_attribute("aria-expanded") == "false"
    assert _active(pg) == gid
    pg.keyboard.press("+")
    group = pg.locator(f'[data-node-id="{gid}"]')
    assert group.get_attribute("aria-expanded") == "true"
    assert _active(pg) == gid  # drawn anew, focused again
    # an opened group of parameters says what it holds, not "scope · 0 eqns"
    kind = group.locator(".sv-stage-kind").text_content()
    assert kind.startswith("inputs · 4 leaves"), kind
    pg.keyboard.press("Enter")
    detail = pg.locator('[data-role="detail"]')
    assert detail.locator('[data-meta="leaves"]').inner_text() == "4 inputs"
    assert detail.locator('[data-meta="equations"]').count() == 0
    pg.keyboard.press("-")
    assert pg.locator(f'[data-node-id="{gid}"]').get_attribute("aria-expanded") == "false"
    assert page.errors == []


@pytest.mark.browser
def test_parameters_tooltip_is_a_summary_with_the_largest_leaves(page, tmp_path):
    sizes = [(8, 8 + i) for i in range(20)]
    params = {f"layer{i}": {"w": jnp.ones(s), "b": jnp.zeros(s[1])} for i, s in enumerate(sizes)}

    def loss(p, x):
        for i in range(20):
            x = jnp.tanh(x[:, :8] @ p[f"layer{i}"]["w"] + p[f"layer{i}"]["b"])
        return jnp.sum(x)

    ins = sowviz.inspect(loss, params, jnp.ones((2, 8)), mode="primal")
    pg = page.open_report(ins.save_html(tmp_path / "p.html"))
    # (the group is named for the argument, `p`)
    tip = pg.locator('[data-node-id][aria-label^="p, group of"] > title').text_content()
    lines = tip.split("\n")
    assert len(lines) <= 10, lines
    total = sum(int(np.prod(s)) + s[1] for s in sizes)
    assert f"40 input leaves · {total:,} values" in lines
    # the largest leaves by name, then how many more
    assert lines[lines.index("largest:") + 1].split() == ["layer19.w", "float32[8,27]"]
    assert lines[-1].strip().startswith("+35 more")
    assert page.errors == []


@pytest.mark.browser
def test_search_enter_opens_the_module_not_the_parameter_group(page, tmp_path):
    # the parameters have an `attn` group, and the program an `attn` stage after them
    params = {"attn": {"wq": jnp.ones((4, 4)), "wk": jnp.ones((4, 4))}, "out": jnp.ones((4, 2))}

    def loss(p, x):
        with jax.named_scope("attn"):
            a = jax.nn.softmax((x @ p["attn"]["wq"]) @ (x @ p["attn"]["wk"]).T)
            x = a @ x
        return jnp.sum(x @ p["out"])

    ins = sowviz.inspect(loss, params, jnp.ones((3, 4)))
    pg = page.open_report(ins.save_html(tmp_path / "a.html"))
    search = pg.locator('[data-role="search"]')
    search.fill("attn")
    results = pg.locator('[data-role="search-results"] .sv-result')
    results.first.wait_for()
    # both match; the stage holding work is listed (and opened) first
    paths = results.locator('[data-role="result-path"]').all_inner_texts()
    assert len(paths) == 2 and "parameters" in paths[1] and "parameters" not in paths[0]
    search.press("Enter")
    detail = pg.locator('[data-role="detail"]')
    detail.wait_for(state="visible")
    assert detail.locator(".sv-detail-title").inner_text() == "attn"
    assert detail.locator('[data-meta="equations"]').count() == 1
    assert (
        "parameters"
        not in (detail.locator('[data-role="detail-path"]').all_inner_texts() or [""])[0]
    )
    assert page.errors == []


@pytest.mark.browser
def test_a_stage_opened_at_the_right_edge_stays_clear_of_the_panel(page, tmp_path):
    pg = page.open_report(_mlp_report(tmp_path))
    canvas = pg.locator(".sv-canvas")
    cb = canvas.bounding_box()
    # the stage nearest the right edge of the view
    ids = pg.evaluate(
        "() => [...document.querySelectorAll('.sv-node[data-node-id]')].map(n => n.dataset.nodeId)"
    )
    boxes = {i: pg.locator(f'[data-node-id="{i}"] > .sv-node-bg').bounding_box() for i in ids}
    right = max(
        (i for i in ids if boxes[i]["x"] + boxes[i]["width"] <= cb["x"] + cb["width"]),
        key=lambda i: boxes[i]["x"],
    )
    pg.locator(f'[data-node-id="{right}"] > .sv-node-bg').click()
    pg.locator('[data-role="detail"]').wait_for(state="visible")
    pg.wait_for_timeout(300)
    cb = canvas.bounding_box()
    nb = pg.locator(f'[data-node-id="{right}"] > .sv-node-bg').bounding_box()
    panel = pg.locator('[data-role="detail"]').bounding_box()
    assert nb["x"] >= cb["x"] - 1 and nb["x"] + nb["width"] <= cb["x"] + cb["width"] + 1, (nb, cb)
    assert nb["x"] + nb["width"] <= panel["x"] + 1
    assert page.errors == []


@pytest.mark.browser
def test_block_group_heading_keeps_the_users_names(page, tmp_path):
    eqx = pytest.importorskip("equinox")

    class Block(eqx.Module):
        lin: eqx.nn.Linear

        def __init__(self, key):
            self.lin = eqx.nn.Linear(8, 8, key=key)

        def __call__(self, x):
            return x + jnp.tanh(self.lin(x))

    class Net(eqx.Module):
        blocks: list

        def __init__(self, key):
            self.blocks = [Block(k) for k in jax.random.split(key, 4)]

        def __call__(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    def loss(m, x):
        return jnp.mean(jax.vmap(m)(x) ** 2)

    ins = sowviz.inspect(loss, Net(jax.random.PRNGKey(0)), jnp.ones((4, 8)))
    pg = page.open_report(ins.save_html(tmp_path / "b.html"))
    pg.locator("[data-node-id][data-repeats]").first.click()
    head = pg.locator('[data-role="repeats"] .sv-section').first
    text = head.inner_text()
    # the heading's own words in capitals, the blocks' names as the user wrote them
    assert "IDENTICAL BLOCKS" in text
    names = head.locator("code.sv-name").all_inner_texts()
    assert len(names) == 2 and all(n.startswith("blocks[") and n.endswith(": Block") for n in names)
    assert all(n in text for n in names), text
    assert page.errors == []
