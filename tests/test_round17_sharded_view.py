"""Round 17, sharded programs as the report shows them: a `lax.scan` inside a
`shard_map` body keeps its per-iteration statistics (the iteration axis sits behind
the mesh axes; each iteration's statistics pool the shards); a probe names the
leading axes of its captured shape (`Probe.axes`: mesh axes, iterations) and the
panel says them; a card whose equations call a collective says so (`Node.collectives`)."""

from __future__ import annotations

import os

# Must be set before JAX initialises its backends (conftest sets it too).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import sowviz


def _mesh():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return jax.make_mesh((4, 2), ("data", "model"))


def _scan_loss(w, x):
    def body(h, _):
        h = sowviz.sow(jnp.tanh(h @ w), "step")
        return h, None

    h, _ = jax.lax.scan(body, x, None, length=3)
    return jnp.mean(h**2)


def _rows_np(blocks, w):
    """Per iteration, every shard's values of `_scan_loss`'s sown `step`, pooled."""
    rows, hs = [], [np.asarray(b, np.float64) for b in blocks]
    for _ in range(3):
        hs = [np.tanh(h @ np.asarray(w, np.float64)) for h in hs]
        rows.append(np.concatenate([h.ravel() for h in hs]))
    return rows


def _check_rows(per, rows):
    assert per["index"] == [0, 1, 2]
    for k, fn in [("mean", np.mean), ("min", np.min), ("max", np.max), ("std", np.std)]:
        np.testing.assert_allclose(per[k], [fn(r) for r in rows], rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(per["l2"], [np.linalg.norm(r) for r in rows], rtol=2e-5)
    assert per["count"] == [r.size for r in rows]


def test_a_scan_inside_shard_map_has_per_iteration_statistics_pooled_over_shards():
    mesh = _mesh()
    xh = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (16, 8)))
    wh = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (8, 8))) / 2
    x = jax.device_put(xh, NamedSharding(mesh, P("data", None)))
    w = jax.device_put(wh, NamedSharding(mesh, P()))
    fn = jax.jit(
        partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("data")), out_specs=P())(
            lambda w, x: jax.lax.pmean(_scan_loss(w, x), "data")
        )
    )
    ins = sowviz.inspect(fn, w, x, mode="all")
    probe = ins.probe("step")
    s = probe.summaries["primal"]
    # shown as captured: (data, iteration, local...)
    assert s["shape"] == [4, 3, 4, 8]
    assert probe.to_dict()["axes"]["primal"] == ["mesh:data", "scan"]
    rows = _rows_np([xh[i * 4 : (i + 1) * 4] for i in range(4)], wh)
    _check_rows(s["per_iteration"], rows)
    np.testing.assert_allclose(s["mean"], np.mean(np.concatenate(rows)), rtol=2e-5)
    # the derivatives' captures are laid out alike, and get theirs too
    for key in ("tangent", "cotangent"):
        assert probe.summaries[key]["per_iteration"]["iterations"] == 3
    # the plain (unsharded) scan's statistics are the same numbers
    plain = sowviz.inspect(_scan_loss, wh, xh).probe("step").summaries["primal"]
    np.testing.assert_allclose(plain["per_iteration"]["l2"], s["per_iteration"]["l2"], rtol=2e-5)


def test_the_iteration_axis_behind_two_mesh_axes():
    mesh = _mesh()
    xh = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (16, 8)))
    wh = np.asarray(jax.random.normal(jax.random.PRNGKey(3), (4, 4))) / 2
    x = jax.device_put(xh, NamedSharding(mesh, P("data", "model")))
    w = jax.device_put(wh, NamedSharding(mesh, P()))
    fn = jax.jit(
        partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("data", "model")), out_specs=P())(
            lambda w, x: jax.lax.pmean(_scan_loss(w, x), ("data", "model"))
        )
    )
    ins = sowviz.inspect(fn, w, x, mode="primal")
    probe = ins.probe("step")
    s = probe.summaries["primal"]
    assert s["shape"] == [4, 2, 3, 4, 4]
    assert probe.to_dict()["axes"] == {"primal": ["mesh:data", "mesh:model", "scan"]}
    blocks = [xh[i * 4 : (i + 1) * 4, j * 4 : (j + 1) * 4] for i in range(4) for j in range(2)]
    _check_rows(s["per_iteration"], _rows_np(blocks, wh))


def _gather_loss():
    mesh = _mesh()

    @jax.jit
    @partial(
        jax.shard_map, mesh=mesh, in_specs=(P("data", "model"), P("data", None)), out_specs=P()
    )
    def loss(w, x):
        w = jax.lax.all_gather(w, "data", axis=0, tiled=True)  # FSDP gather: [16, 32]
        h = jnp.tanh(x @ w)
        return jax.lax.psum(jnp.sum(h**2), ("data", "model")) / 1024

    wh = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (16, 64))) / 4
    xh = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (16, 16)))
    w = jax.device_put(wh, NamedSharding(mesh, P("data", "model")))
    x = jax.device_put(xh, NamedSharding(mesh, P("data", None)))
    return loss, wh, w, x


def test_probes_name_the_mesh_axes_of_their_captured_shape():
    loss, wh, w, x = _gather_loss()
    ins = sowviz.inspect(loss, w, x)
    d = ins.to_dict()
    gathered = next(
        p for p in d["probes"] if p["name"] == "w" and p["summaries"]["primal"]["shape"][0] == 4
    )
    assert gathered["axes"] == {
        "primal": ["mesh:data", "mesh:model"],
        "cotangent": ["mesh:data", "mesh:model"],
    }
    assert gathered["summaries"]["primal"]["shape"] == [4, 2, 16, 32]
    # the statistics pool every device's copy: 4 copies of each column block along `data`
    np.testing.assert_allclose(
        gathered["summaries"]["primal"]["l2"], 2 * np.linalg.norm(wh), rtol=1e-5
    )
    # values outside the shard_map have no stacking axes
    argument = next(p for p in d["probes"] if p["name"] == "w" and p is not gathered)
    assert "axes" not in argument
    # the loss after its psum is invariant: captured once, no mesh axes
    out = next(p for p in d["probes"] if p["name"] == "output")
    assert "axes" not in out and out["summaries"]["primal"]["shape"] == []


def _tp():
    mesh = _mesh()
    b, dd, hh = 32, 16, 64

    @jax.jit
    @partial(
        jax.shard_map,
        mesh=mesh,
        in_specs=(P("data", "model"), P("model", None), P("data", None), P("data", "model")),
        out_specs=P(),
    )
    def tp_loss(w1, w2, x, y):
        w1 = jax.lax.all_gather(w1, "data", axis=0, tiled=True)
        h = jax.nn.relu(x @ w1)
        out = jax.lax.psum_scatter(h @ w2, "model", scatter_dimension=1, tiled=True)
        sq = jnp.sum((out - y) ** 2)
        return jax.lax.psum(sq, ("data", "model")) / (b * dd)

    k = jax.random.split(jax.random.PRNGKey(0), 4)
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    args = (
        put(jax.random.normal(k[0], (dd, hh)) / 4, P("data", "model")),
        put(jax.random.normal(k[1], (hh, dd)) / 8, P("model", None)),
        put(jax.random.normal(k[2], (b, dd)), P("data", None)),
        put(jax.random.normal(k[3], (b, dd)), P("data", "model")),
    )
    return tp_loss, args


def test_nodes_say_which_collectives_their_equations_call():
    tp_loss, args = _tp()
    d = sowviz.inspect(tp_loss, *args, argnums=(0, 1)).to_dict()
    by_label = {}
    for n in d["nodes"]:
        by_label.setdefault(n["label"], []).append(n)
    assert by_label["w1"][-1]["collectives"] == ["all_gather"]  # a line box of one gather
    assert by_label["out"][-1]["collectives"] == ["psum_scatter"]
    smap = by_label["shard_map(tp_loss)"][0]
    assert smap["collectives"] == ["all_gather", "psum_scatter", "psum"]  # program order
    assert by_label["psum"][0]["collectives"] == ["psum"]
    assert "collectives" not in by_label["h"][-1]  # no communication there
    # a program without collectives has none anywhere
    plain = sowviz.inspect(lambda w: jnp.sum(jnp.tanh(w)), jnp.ones(3)).to_dict()
    assert not any("collectives" in n for n in plain["nodes"])


def _node_id(d, label, parent_label=None):
    by_id = {n["id"]: n for n in d["nodes"]}
    return next(
        n["id"]
        for n in d["nodes"]
        if n["label"] == label
        and (parent_label is None or by_id[n["parent"]]["label"] == parent_label)
    )


@pytest.mark.browser
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_panel_says_the_mesh_axes_and_cards_show_their_collectives(browser, tmp_path, scheme):
    from conftest import Page

    tp_loss, args = _tp()
    ins = sowviz.inspect(tp_loss, *args, argnums=(0, 1))
    d = ins.to_dict()
    page = Page(browser, color_scheme=scheme)
    try:
        pg = page.open_report(ins.save_html(tmp_path / "r.html"))
        # the line `w1 = all_gather(w1, ...)` is a box `w1`: its pill says the gather
        line = _node_id(d, "w1", "shard_map(tp_loss)")
        card = pg.locator(f'[data-node-id="{line}"]').first
        badge = card.locator('[data-role="collectives"]')
        assert badge.locator("text").text_content() == "⇄ all_gather"
        out = pg.locator(f'[data-node-id="{_node_id(d, "out", "shard_map(tp_loss)")}"]')
        assert out.locator('[data-role="collectives"] text').text_content() == "⇄ psum_scatter"
        h = pg.locator(f'[data-node-id="{_node_id(d, "h", "shard_map(tp_loss)")}"]')
        assert h.locator('[data-role="collectives"]').count() == 0
        # on the card's top edge, within its width
        box, card_box = badge.bounding_box(), card.locator(".sv-node-bg").first.bounding_box()
        assert box["y"] < card_box["y"] < box["y"] + box["height"]
        assert (
            card_box["x"] < box["x"] < box["x"] + box["width"] < card_box["x"] + card_box["width"]
        )
        card.click()
        pg.wait_for_selector('[data-role="detail"]:not([hidden])')
        captured = pg.locator('[data-role="detail"] [data-meta="captured"]')
        assert captured.text_content() == (
            "per device: data(4) × model(2) × float32[16,32] · 4096 values"
            " · statistics over all 8 shards"
        )
        assert "counts once per device" in captured.get_attribute("title")
        # said whole (wrapped), not cut off by the panel's width
        assert captured.evaluate("e => e.scrollWidth <= e.clientWidth")
        comm = pg.locator('[data-role="detail"] [data-meta="communicates"]')
        assert comm.text_content() == "all_gather"
        shot = os.environ.get("SOWVIZ_SHOT")
        if shot:
            pg.screenshot(path=f"{shot}-{scheme}.png")
        # the loss's `psum`: an equation's label names its collective (a glyph only), and
        # its scalar result is captured once (invariant): no "[] · 1 values"
        psum = pg.locator(f'[data-node-id="{_node_id(d, "psum", "shard_map(tp_loss)")}"]')
        assert psum.locator('[data-role="collectives"] text').text_content() == "⇄"
        psum.click()
        pg.wait_for_function(
            """() => document.querySelector('[data-role="detail"] [data-meta="captured"]')
                  ?.textContent === 'a scalar · 1 value'"""
        )
        assert page.errors == []
    finally:
        page.close()


def test_locate_names_the_device_and_the_iteration_inside_a_shard_map():
    _mesh()
    mesh = jax.make_mesh((4,), ("data",))

    def body_loss(x):
        def body(h, i):
            return jnp.sqrt(h - jnp.where(i == 2, 1.5, 0.0)), None  # NaN at iteration 2 ...

        h, _ = jax.lax.scan(body, x, jnp.arange(3))
        return jnp.mean(h)

    fn = jax.jit(
        partial(jax.shard_map, mesh=mesh, in_specs=(P("data"),), out_specs=P())(
            lambda x: jax.lax.pmean(body_loss(x), "data")
        )
    )
    xh = np.full((8, 2), 100.0, np.float32)
    xh[6, 0] = 1.0  # ... where h < 1.5: row 6, on the device holding rows 6-7 (data=3)
    with np.errstate(invalid="ignore"):
        want = np.sqrt(np.sqrt(np.sqrt(xh)) - 1.5)  # (NumPy: NaN in row 6 only)
    assert np.isnan(want).sum() == 1 and np.isnan(want[6, 0])
    ins = sowviz.inspect(fn, jax.device_put(xh, NamedSharding(mesh, P("data"))), mode="primal")
    got = ins.locate_nonfinite().forward
    assert got.equation.primitive == "sqrt"
    # the loop's rows follow the mesh axis in the capture: iteration 2, not the device's 3
    assert got.iteration == (2,)
    assert "in iteration 2 of `scan(body)`, on the device at `data`=3" in got.message


def test_the_device_is_named_outside_loops_too():
    _mesh()
    mesh = jax.make_mesh((8,), ("batch",))

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("batch")), out_specs=P())
    def loss(w, x):
        s = jnp.sqrt(x[:, :1])
        return jax.lax.pmean(jnp.mean(jnp.tanh(x @ w) * s), "batch")

    xh = np.abs(np.random.RandomState(0).randn(16, 4)).astype(np.float32)
    xh[13, 0] = -1.0  # row 13: device 6 (2 rows each)
    x = jax.device_put(xh, NamedSharding(mesh, P("batch")))
    w = jax.device_put(jnp.eye(4) * 0.1, NamedSharding(mesh, P()))
    ins = sowviz.inspect(loss, w, x, mode="grad")
    msg = ins.locate_nonfinite().forward.message
    assert msg.startswith("first made by `sqrt`") and "on the device at `batch`=6" in msg
