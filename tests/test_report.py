"""Reports of real inspections, opened from disk in chromium with the network blocked."""

from __future__ import annotations

import gzip
import html.parser
import json
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _x64 import run_x64
from conftest import Page

import sowviz

INJECTION = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory):
    """`python -m sowviz demo`, as `make demo` runs it."""
    out = tmp_path_factory.mktemp("demo") / "report.html"
    proc = subprocess.run(
        [sys.executable, "-m", "sowviz", "demo", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout
    return out


@pytest.fixture
def page(browser):
    p = Page(browser)
    yield p
    p.close()


class _Markup(html.parser.HTMLParser):
    """The page's markup: every tag with its attributes and the text outside <script>
    and <style> (whose bodies are the model JSON, the bundle and its styles: they hold
    XML namespace strings such as http://www.w3.org/2000/svg, never loaded)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.tags: list[tuple[str, dict]] = []
        self._raw = 0

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.parts += [tag, *(f"{k}={v}" for k, v in attrs)]
        self._raw += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._raw -= tag in ("script", "style")

    def handle_data(self, data):
        if not self._raw:
            self.parts.append(data)


def external_references(text: str) -> list[str]:
    """URLs and loaded resources anywhere in the page's markup (not in script bodies)."""
    parser = _Markup()
    parser.feed(text)
    markup = "\n".join(parser.parts)
    found = re.findall(r"(?:https?:)?//[\w.-]+\.\w+[^\s\"'<>]*", markup)
    found += [f"<{t} src>" for t, a in parser.tags if "src" in a]
    found += [f"<{t} href>" for t, a in parser.tags if t in ("link", "base", "a") and "href" in a]
    return found


def test_external_references_are_found_anywhere_in_the_markup():
    page = "<html><head><title>t</title></head><body>{}</body></html>"
    inline = '<script type="module">const ns = "http://www.w3.org/2000/svg";</script>'
    assert external_references(page.format(inline)) == []
    for bad in (
        '<img src="http://example.com/x.png">',  # after the model, in a footer...
        '<footer><a href="https://example.com">x</a></footer>',
        "<p>see //cdn.example.com/lib.js</p>",
        '<script src="lib.js"></script>',
        '<link rel="stylesheet" href="s.css">',
    ):
        assert external_references(page.format(inline + bad)), bad


def test_demo_report_is_small_and_self_contained(demo_report):
    text = demo_report.read_text(encoding="utf-8")
    assert demo_report.stat().st_size < 3_000_000
    assert external_references(text) == []
    assert "default-src 'none'" in text  # and the page forbids any request it might make
    assert "sowviz demo" in text and jax.__version__ in text


@pytest.mark.browser
def test_demo_report_in_the_browser(page, demo_report):
    pg = page.open_report(demo_report)
    nodes = pg.locator("[data-node-id]")
    # parameters, x, embed, the blocks' stack, distance, head, the loss's own
    # equations (`mean` a stage of its own), output
    assert nodes.count() >= 10
    labels = nodes.evaluate_all("els => els.map(e => e.dataset.kind + ':' + e.textContent)")
    # the identical blocks are one stacked node (graph/repeats.py); expanding it shows each
    assert any(label.startswith("scope:block_0–") for label in labels)
    stack = pg.locator("[data-repeats]").first
    assert stack.get_attribute("data-kind") == "scope"
    stack.locator('[data-role="toggle"]').click()
    pg.locator('[data-kind="scope"]', has_text="block_3").first.wait_for()
    # the NaN is flagged where it is born: in `distance` (its tangents, and its backward
    # rule, which turns finite cotangents into NaN reaching `embed`)
    distance = pg.locator('[data-kind="scope"]', has_text="distance").first
    assert distance.get_attribute("data-nonfinite") == "true"
    assert "forward" in (distance.get_attribute("data-nonfinite-origin") or "")
    assert "backward" in (distance.get_attribute("data-nonfinite-origin") or "")
    embed = pg.locator('[data-kind="scope"]', has_text="embed").first
    assert embed.get_attribute("data-nonfinite-role") == "propagator"
    assert "reaching embed" in pg.locator('[data-role="nonfinite-banner"]').inner_text()
    # click → one chart per captured mode
    pg.locator('[data-kind="scope"]', has_text="block_1").first.click()
    detail = pg.locator('[data-role="detail"]')
    detail.wait_for(state="visible")
    modes = detail.locator(".js-plotly-plot").evaluate_all("els => els.map(e => e.dataset.mode)")
    assert modes == ["primal", "tangent", "cotangent"]
    # search filters by name
    pg.locator('[data-role="search"]').fill("block_4")
    pg.wait_for_timeout(300)
    hits = pg.locator(".sv-match, [data-match='true']")
    assert hits.count() >= 1
    assert page.errors == []
    assert page.requests == []


@pytest.mark.browser
def test_user_strings_are_text_never_markup(page, tmp_path):
    def fn(x):
        with jax.named_scope(INJECTION):
            h = sowviz.sow(jnp.tanh(x), INJECTION)
        return jnp.sum(h**2)

    fn.__name__ = f"title {INJECTION}"
    path = sowviz.inspect(fn, jnp.ones(3)).save_html(str(tmp_path / f"r{INJECTION[:4]}.html"))
    pg = page.open_report(path)
    assert pg.locator("img").count() == 0
    assert page.dialogs == []
    assert INJECTION in pg.locator("body").inner_text()
    node = pg.locator('[data-kind="scope"]').first
    node.click()
    pg.locator('[data-role="detail"]').wait_for(state="visible")
    assert pg.locator("img").count() == 0 and page.dialogs == []
    assert page.errors == [] and page.requests == []


@pytest.mark.browser
def test_large_models_are_embedded_compressed_and_still_open_offline(page, tmp_path, monkeypatch):
    from sowviz import report

    monkeypatch.setattr(report, "COMPRESS_ABOVE", 0)

    def fn(x):
        with jax.named_scope("layer"):
            h = jnp.tanh(x)
        return jnp.sum(h**2)

    path = sowviz.inspect(fn, jnp.ones(4)).save_html(str(tmp_path / "z.html"))
    text = path.read_text(encoding="utf-8")
    assert 'data-encoding="gzip-base64"' in text
    pg = page.open_report(path)
    assert pg.locator('[data-kind="scope"]', has_text="layer").count() == 1
    assert page.errors == [] and page.requests == []


# ---------------------------------------------------------------- float32 in the model JSON


def _pairs(orig, back, path=""):
    """(path, written value, value read back) for every number of a summary's JSON."""
    if isinstance(orig, dict):
        assert set(back) == set(orig), path
        for k in orig:
            yield from _pairs(orig[k], back[k], f"{path}.{k}")
    elif isinstance(orig, list):
        assert len(back) == len(orig), path
        for i, (a, b) in enumerate(zip(orig, back, strict=True)):
            yield from _pairs(a, b, f"{path}[{i}]")
    else:
        yield path, orig, back


def test_float32_statistics_are_written_short_and_read_back_as_the_same_float32():
    from sowviz._model import model_json

    def loss(params, x):
        h = x
        for i, p in enumerate(params):
            with jax.named_scope(f"layer_{i}"):
                h = jnp.tanh(h @ p["w"] + p["b"])
        return jnp.mean(h**2)

    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    params = [{"w": jax.random.normal(k, (16, 16)) / 4, "b": jnp.zeros(16)} for k in keys]
    x = jax.random.normal(jax.random.PRNGKey(1), (32, 16))
    model = sowviz.inspect(loss, params, x, mode="grad").to_dict()
    new = model_json(model)
    # the encoding before: the same model as plain dicts, every float64 digit written
    old = model_json(json.loads(json.dumps(model)))
    assert len(new) < 0.85 * len(old)
    assert len(gzip.compress(new.encode())) < 0.85 * len(gzip.compress(old.encode()))
    back = json.loads(new)
    plain = json.loads(old)
    assert {k: v for k, v in back.items() if k != "probes"} == {
        k: v for k, v in plain.items() if k != "probes"
    }  # only the probes' statistics change
    checked = shortened = 0
    for p, q in zip(model["probes"], back["probes"], strict=True):
        for mode, s in p["summaries"].items():
            assert s["dtype"] == "float32"
            for path, a, b in _pairs(s, q["summaries"][mode], mode):
                if isinstance(a, float) and ".loghist." not in path:
                    # a float32 statistic: read back, it is the same float32 ...
                    assert np.float32(b) == np.float32(a) and float(np.float32(b)) == a, path
                    # ... in at most 9 significant digits (float32's round-trip bound)
                    assert len(repr(b).split("e")[0].strip("-0.").replace(".", "")) <= 9, b
                    checked += 1
                    shortened += len(repr(b)) < len(repr(a))
                else:  # integers, null, and the host's float64 log10 edges: unchanged
                    assert b == a and type(b) is type(a), path
    assert checked > 1000 and shortened > checked // 2


def test_float32_floats_are_shortened_to_numpys_shortest_repr_all_at_once():
    """`shortest32_floats` (the whole model's float32 floats in one NumPy pass) writes
    what `str(np.float32(v))` (Dragon4, one value at a time) writes, across the range."""
    from sowviz._model import shortest32_floats

    rng = np.random.default_rng(0)
    n = 20_000
    exps = rng.integers(-45, 39, size=n)
    with np.errstate(over="ignore"):
        a = (rng.normal(size=n) * 10.0**exps).astype(np.float32)
    decades = np.float32([10.0**e for e in range(-37, 39)])
    edge = [np.float32(0.1), np.float32(1 / 3), np.float32(16777217), np.finfo(np.float32).max]
    edge += [np.finfo(np.float32).tiny, np.float32(1e-45), np.float32(-0.0), np.float32(2.5)]
    a = np.concatenate([a, decades, np.nextafter(decades, np.inf), np.nextafter(decades, 0), edge])
    a = a[np.isfinite(a)]
    values = [*a.astype(np.float64).tolist(), None]
    want = [None if v is None else float(str(np.float32(v))) for v in values]
    got = shortest32_floats(values)
    assert [repr(v) for v in got] == [repr(v) for v in want]


_X64 = r"""
import json, numpy as np
from sowviz import summarize
from sowviz._model import jsonable, model_json
# min -2**-20 is a float32 value, but a float64 statistic here: every digit stays
f64 = summarize(np.array([0.1, -(2.0 ** -20), 1 / 3]), bins=4).to_json()
f32 = summarize(np.array([0.1, -(2.0 ** -20), 1 / 3], np.float32), bins=4).to_json()
print(json.dumps({"f64": f64, "f64_back": json.loads(model_json(f64)),
                  "f32": f32, "f32_back": json.loads(model_json(f32)),
                  "np": jsonable({"a": np.float32(0.1), "b": np.array([0.1, np.nan], np.float32),
                                  "c": np.float64(np.float32(0.1))})}))
"""


def test_float64_statistics_keep_every_digit_with_x64():
    got = run_x64(_X64)  # x64 is process-wide: a child process
    assert got["f64"]["dtype"] == "float64" and got["f64_back"] == got["f64"]  # bit for bit
    assert got["f64"]["min"] == -(2.0**-20) and got["f64_back"]["min"] == -(2.0**-20)
    assert got["f64"]["max"] == 1 / 3
    # float32 ones in the same process are written short and read back as the same float32
    f32, back = got["f32"], got["f32_back"]
    assert f32["dtype"] == "float32" and back["mean"] != f32["mean"]
    assert np.float32(back["mean"]) == np.float32(f32["mean"])
    assert [np.float32(e) for e in back["hist"]["edges"]] == [
        np.float32(e) for e in f32["hist"]["edges"]
    ]
    # NumPy float32 values too; NaN is still null; float64 untouched
    assert got["np"] == {"a": 0.1, "b": [0.1, None], "c": float(np.float32(0.1))}


def test_jsonable_lists_of_floats_nan_to_null_and_the_input_left_as_it_was():
    from sowviz._model import jsonable
    from sowviz.summary_data import Float32Json

    edges = [float(np.float32(0.1)), float(np.float32(0.2))]  # float32 values, long in float64
    model = {
        "plain": [0.5, float("nan"), float("inf"), -float("inf")],
        "finite": [0.25, 1e300],
        "summary": Float32Json({"hist": {"edges": edges, "counts": [3]}}),
    }
    got = jsonable(model)
    assert got["plain"] == [0.5, None, None, None] and got["finite"] == [0.25, 1e300]
    assert got["summary"]["hist"] == {"edges": [0.1, 0.2], "counts": [3]}  # shortest float32
    assert edges == [float(np.float32(0.1)), float(np.float32(0.2))]  # not shortened in place
    assert model["plain"][1] != model["plain"][1]  # NaN, as it was


@pytest.mark.browser
def test_per_iteration_charts_of_a_real_loop(page, tmp_path):
    # as a user meets them: a fori_loop's stage, its statistics from the program
    def heat(u):
        def step(i, u):
            with jax.named_scope("update"):
                return u + 0.1 * jnp.sin(u)

        return jnp.sum(jax.lax.fori_loop(0, 10, step, u) ** 2)

    u0 = jnp.linspace(0.0, 1.0, 8)
    ins = sowviz.inspect(heat, u0)
    pg = page.open_report(ins.save_html(tmp_path / "heat.html"))
    update = next(n.id for n in ins.graph.nodes if n.label == "update")
    node = lambda nid: pg.locator(f'[data-node-id="{nid}"]')  # noqa: E731
    if node(update).count() == 0:
        loop = next(n.id for n in ins.graph.nodes if n.kind == "scan")
        node(loop).locator('[data-role="toggle"]').first.click()
    node(update).click()
    block = pg.locator('[data-role="per-iteration"][data-mode="primal"]')
    assert block.locator(".sv-chart-title").inner_text() == "primal: per iteration (10)"
    lines = block.locator('[data-iter="lines"]')
    lines.locator(".main-svg").first.wait_for()
    # the update's value in each iteration, by NumPy
    us, u = [], np.asarray(u0, np.float64)
    for _ in range(10):
        u = u + 0.1 * np.sin(u)
        us.append(u)
    assert lines.evaluate("e => Array.from(e.data[0].x)") == list(range(10))
    np.testing.assert_allclose(
        lines.evaluate("e => e.data[0].y"), [np.linalg.norm(v) for v in us], rtol=1e-5
    )
    assert block.locator('[data-role="iteration-label"]').inner_text() == "9 of 0–9"
    hist = block.locator('[data-iter="hist"]')
    assert sum(hist.evaluate("e => e.data[0].y")) == 8  # the last iteration's 8 values
    assert page.errors == []


@pytest.mark.browser
def test_a_layers_panel_lists_the_parameters_it_reads(page, tmp_path):
    import equinox as eqx

    model = eqx.nn.MLP(4, 1, 8, depth=2, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (6, 4))

    def mse(model, x):
        return jnp.mean(jax.vmap(model)(x) ** 2)

    ins = sowviz.inspect(mse, model, x)
    grads = eqx.filter_grad(mse)(model, x)
    pg = page.open_report(ins.save_html(tmp_path / "mlp.html"))
    layer = next(n.id for n in ins.graph.nodes if n.label == "layers[1]: Linear")
    pg.locator(f'[data-node-id="{layer}"]').click()
    table = pg.locator('[data-role="stage-params"]')
    assert table.locator("h4").inner_text().lower() == "arguments read here: 2"
    rows = table.locator("tbody tr").evaluate_all(
        "rs => rs.map(r => Array.from(r.cells).map(c => c.textContent.replace(/\\u200b/g, '')))"
    )
    names = [r[0] for r in rows]
    assert names == ["layers[1].weight", "layers[1].bias"]  # as the layer reads them
    for name, _, value, grad, _ in rows:
        leaf = name.split(".")[-1]
        want_v = np.linalg.norm(getattr(model.layers[1], leaf))
        want_g = np.linalg.norm(getattr(grads.layers[1], leaf))
        np.testing.assert_allclose(float(value), want_v, rtol=2e-3)
        np.testing.assert_allclose(float(grad), want_g, rtol=2e-3)
    # a row reveals its leaf in the parameters group
    table.locator("tbody tr button").first.click()
    pg.wait_for_function(
        "() => document.querySelector('.sv-detail-title').textContent === 'weight'"
    )
    assert page.errors == []
