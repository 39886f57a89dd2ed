"""Round 14 in a real browser: a block's "arguments read here" in the order the program
reads them, and a Monitor report's loss chart beside the legend in a strip no taller
than the chart."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from conftest import Page

import sowviz
from sowviz import _compat


def _block_loss(p, x):
    with jax.named_scope("block"):
        with jax.named_scope("a"):
            with jax.named_scope("inner"):
                h = jnp.tanh(x @ p["a"]["w"])
            h = h + p["a"]["b"]
        with jax.named_scope("c"):
            h = h @ p["c"]["w"]
        h = h * p["gain"]  # the block's own read, after its layers' ones
    return jnp.mean(h**2)


def _params():
    return {
        "a": {"b": jnp.full((4,), 0.1), "w": jnp.full((3, 4), 0.2)},
        "c": {"w": jnp.full((4, 4), 0.3)},
        "gain": jnp.full((4,), 1.5),
    }


def _first_reads(fn, p, x):
    """The leaves of `p` (named as the tables do: `a.w`) and `x` as the program first
    reads them, from its jaxpr alone."""
    closed = jax.make_jaxpr(fn)(p, x)
    names = [
        ".".join(str(k.key) for k in path) for path, _ in jax.tree_util.tree_flatten_with_path(p)[0]
    ]
    leaf_of = dict(zip(closed.jaxpr.invars, [*names, "x"], strict=True))
    seen: list[str] = []
    for eqn in closed.jaxpr.eqns:  # named scopes make no sub-jaxprs: one flat program
        for v in eqn.invars:
            if isinstance(v, _compat.Var) and v in leaf_of and leaf_of[v] not in seen:
                seen.append(leaf_of[v])
    return seen


def _rows(pg, role):
    return pg.evaluate(
        f"""Array.from(document.querySelectorAll('[data-role={role}] tbody tr'))
              .map(r => r.cells[0].innerText.replace(/[\\s\\u200b]+/g, ''))"""
    )


@pytest.mark.browser
def test_a_block_s_reads_are_listed_in_program_order(page, tmp_path):
    p, x = _params(), jnp.ones((2, 3))
    want = _first_reads(_block_loss, p, x)
    # the case: the block's own read (`gain`) comes last, one of its layers' (`a.w`) is
    # read by a stage two levels down, before its parent's own (`a.b`)
    assert want == ["x", "a.w", "a.b", "c.w", "gain"]
    ins = sowviz.inspect(_block_loss, p, x)
    block = next(n for n in ins.to_dict()["nodes"] if n["label"] == "block")
    pg = page.open_report(ins.save_html(tmp_path / "reads.html"))
    pg.locator(f'[data-node-id="{block["id"]}"]').first.click()
    pg.locator('[data-role="stage-params"]').wait_for()
    # it read `gain, a.b, c.w, x, a.w`: the block's own, its layers', then inner's
    assert _rows(pg, "stage-params") == want
    # the parameters' table is in the same order (`x` is no parameter)
    group = next(n for n in ins.to_dict()["nodes"] if n["label"] == "parameters")
    pg.locator(f'[data-node-id="{group["id"]}"]').first.click()
    pg.locator('[data-role="param-table"]').first.wait_for()
    assert _rows(pg, "param-table") == [n for n in want if n != "x"]
    assert page.errors == []


def test_the_model_places_each_read_at_its_equation():
    """`read_at` pairs each of a node's `reads` with the `order` of the equation that
    first reads it: inside the node, in program order."""
    p, x = _params(), jnp.ones((2, 3))
    nodes = {n["id"]: n for n in sowviz.inspect(_block_loss, p, x).to_dict()["nodes"]}
    placed = []
    for n in nodes.values():
        if not n.get("reads"):
            continue
        assert len(n["read_at"]) == len(n["reads"])
        for r, at in zip(n["reads"], n["read_at"], strict=True):
            reader = nodes[f"n{at}"]
            assert reader["order"] == at and reader["kind"] == "eqn"
            # the reading equation lies inside the node that lists the read
            up = reader
            while up["id"] != n["id"]:
                up = nodes[up["parent"]]
            placed.append((at, nodes[r]["label"], n["label"]))
    got = [(label, where) for _, label, where in sorted(placed)]
    assert got == [("w", "inner"), ("x", "inner"), ("b", "a"), ("w", "c"), ("gain", "block")]


def _monitor_report(path):
    def loss(w, x):
        with jax.named_scope("layer"):
            h = jnp.tanh(x @ w)
        return jnp.mean(h**2)

    mon = sowviz.Monitor(loss)
    w = jnp.ones((4, 4)) / 4
    for i in range(6):
        _, g = mon.step(w, jnp.full((8, 4), 1.0 + i))
        w = w - 0.1 * g
    mon.save_html(path)
    mon.close()
    return path


def _foot(pg):
    return pg.evaluate(
        """(() => {
          const box = (e) => { const r = e.getBoundingClientRect();
            return {x: r.x, y: r.y, w: r.width, h: r.height}; };
          const q = (s) => document.querySelector(s);
          const style = (s) => getComputedStyle(q(s));
          return {foot: box(q('.sv-foot')), legend: box(q('[data-role=legend]')),
                  loss: box(q('[data-role=loss]')), graph: box(q('.sv-graph')),
                  svg: box(q('.sv-svg')), titleColour: style('[data-role=loss-title]').color,
                  footBg: style('.sv-foot').backgroundColor};
        })()"""
    )


@pytest.mark.browser
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_a_monitor_s_loss_chart_takes_no_band_of_its_own(browser, tmp_path, scheme):
    path = _monitor_report(tmp_path / "monitor.html")
    page = Page(browser, color_scheme=scheme)
    try:
        pg = page.open_report(path)
        pg.locator('[data-role="loss"] .js-plotly-plot').wait_for()
        g = _foot(pg)
        foot, legend, loss = g["foot"], g["legend"], g["loss"]
        # one row: the chart beside the legend, the strip as tall as the taller of them
        # (it was 130 px: a 104 px chart under its title, blank left of it)
        assert abs(loss["y"] + loss["h"] / 2 - (legend["y"] + legend["h"] / 2)) < 2
        assert loss["x"] >= legend["x"] + legend["w"] - 1
        assert foot["h"] <= max(legend["h"], loss["h"]) + 2 <= 64, g
        # the graph keeps the rest of the view's height
        assert g["svg"]["h"] >= g["graph"]["h"] - foot["h"] - 2
        # every step still has its tick, and the title reads against the strip
        xs = pg.locator('[data-role="loss"] .xtick text').all_text_contents()
        assert xs == [str(s) for s in range(6)]
        assert g["titleColour"] != g["footBg"]
        assert page.errors == []
    finally:
        page.close()
