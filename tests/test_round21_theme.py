"""Readable colours in the light and dark themes (round 21), measured in Chromium.

A report of a program run in mode "all" (primal, tangent and cotangent), its stages opened
five deep, opens from file:// with the page's colour scheme light, then dark. The test
reads the computed colours of what is drawn (edges, arrowheads, ports, face sparklines, the
detail panel's histogram bars and series swatches, text) and of what lies under each (the
widget's background, the translucent stage boxes nested above it, the node, the panel),
composites them as the browser paints them, and computes WCAG 2.1 contrast ratios here, from
the relative luminance formula: graphics >= 3:1 (SC 1.4.11), text >= 4.5:1 (SC 1.4.3).
The three series colours stay apart (hues >= 60 degrees from each other).

The no-cotangent note of a value behind `jax.lax.stop_gradient` shows its backticked
names as `<code>`, with markup in a user's file name shown as text, never parsed.

`test_widget_follows_jupyterlab_theme` starts a real JupyterLab (slow): JupyterLab Dark set
in its settings while the browser prefers light, then Settings > Theme > JupyterLab Light
while the browser prefers dark. The widget takes JupyterLab's theme, not the system's, and
its colours pass the same ratios on JupyterLab's own backgrounds.

Gaps: the viridis value chips of the light theme (their yellow top is pale on white, a
colour scale, not a series) and JupyterLab's own colours (its --jp-ui-font-color2 is the
widget's muted text there) beyond what the widget draws on them are not checked here;
kind badges and dark-theme chips are checked in test_frontend_browser.py.
"""

from __future__ import annotations

import colorsys
import json
import pathlib
import re

import jax
import jax.numpy as jnp
import pytest
from conftest import Page

import sowviz

ROOT = pathlib.Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"

# a file name with markup: the note names it, and it must reach the page as text
EVIL_FILE = "tgt<img src=x onerror=window.__pwned=1>.py"
TARGET_SRC = """
def target_of(h):
    return jax.lax.stop_gradient(h * 2.0)
"""


def _program():
    ns = {"jax": jax}
    exec(compile(TARGET_SRC, EVIL_FILE, "exec"), ns)
    target_of = ns["target_of"]

    def loss(params, x):
        with jax.named_scope("outer"):
            with jax.named_scope("inner"):
                with jax.named_scope("mid"), jax.named_scope("deep"), jax.named_scope("core"):
                    h = jnp.tanh(x @ params["w"] + params["b"])
            with jax.named_scope("target"):
                t = target_of(h)
        return jnp.mean((h - t) ** 2)

    params = {"w": jax.random.normal(jax.random.PRNGKey(0), (8, 8)) / 3, "b": jnp.zeros(8)}
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 8))
    return loss, params, x


@pytest.fixture(scope="module")
def theme_report(tmp_path_factory):
    loss, params, x = _program()
    ins = sowviz.inspect(loss, params, x, mode="all")
    model = ins.to_dict()
    return model, ins.save_html(tmp_path_factory.mktemp("r21theme") / "theme.html")


def _id(model, label):
    found = [n["id"] for n in model["nodes"] if n["label"] == label]
    assert len(found) == 1, (label, found)
    return found[0]


# --- colour arithmetic (WCAG 2.1), independent of the page --------------------------


def _rgba(c: str) -> tuple[float, float, float, float]:
    """A computed CSS colour (`rgb(...)`, `rgba(...)`, `#rrggbb`) as 0-255 channels, alpha."""
    c = c.strip()
    if c.startswith("#"):
        h = "".join(ch * 2 for ch in c[1:]) if len(c) == 4 else c[1:]
        return (*(int(h[i : i + 2], 16) for i in (0, 2, 4)), 1.0)
    m = re.fullmatch(r"rgba?\(([^)]*)\)", c)
    assert m, f"not a colour: {c!r}"
    parts = [float(v) for v in re.split(r"[\s,/]+", m.group(1).strip()) if v]
    return (parts[0], parts[1], parts[2], parts[3] if len(parts) > 3 else 1.0)


def _over(top, alpha: float, under):
    """`top` painted with opacity `alpha` (times its own alpha) over the opaque `under`."""
    r, g, b, a = _rgba(top) if isinstance(top, str) else top
    a *= alpha
    return (*(f * a + u * (1 - a) for f, u in zip((r, g, b), under[:3], strict=True)), 1.0)


def _luminance(c) -> float:
    lin = [
        (v / 255) / 12.92 if v / 255 <= 0.03928 else ((v / 255 + 0.055) / 1.055) ** 2.4
        for v in c[:3]
    ]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def _contrast(a, b) -> float:
    hi, lo = sorted([_luminance(a), _luminance(b)], reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _background(layers) -> tuple:
    """Paints `layers` ([colour, opacity], bottom first) over white (the page's canvas)."""
    under = (255.0, 255.0, 255.0, 1.0)
    for colour, opacity in layers:
        under = _over(colour, opacity, under)
    return under


def test_contrast_arithmetic_matches_wcag_reference_values():
    # WCAG's own extremes and a well-known pair (#767676 on white is 4.54:1)
    assert _contrast(_rgba("#000000"), _rgba("#ffffff")) == pytest.approx(21.0)
    assert _contrast(_rgba("#767676"), _rgba("#ffffff")) == pytest.approx(4.54, abs=0.01)
    assert _contrast(_rgba("#777777"), _rgba("#ffffff")) == pytest.approx(4.48, abs=0.01)
    assert _rgba("#0f8") == (0, 255, 136, 1.0)
    assert _rgba("rgba(1, 2, 3, 0.5)") == (1, 2, 3, 0.5)
    # half-transparent black over white is mid grey (127.5)
    assert _over("rgba(0, 0, 0, 0.5)", 1.0, (255, 255, 255, 1))[:3] == (127.5, 127.5, 127.5)


# --- what the page paints ---------------------------------------------------------------

# For each thing drawn: its colour and opacity, and the surfaces painted under it at the
# points it covers (translucent stage boxes and their heads, nodes, ports, toggles, badge
# tints, bottom first, over the widget's background and the page's). SVG surfaces are
# found geometrically (their screen boxes, earlier in paint order); HTML backgrounds by
# walking up the element's ancestors.
MEASURE = r"""
() => {
  const root = document.querySelector('.sowviz');
  const cs = (el) => getComputedStyle(el);
  const opacityChain = (el) => {  // the element's and its ancestors' opacity, multiplied
    let o = 1;
    for (let e = el; e && e !== document; e = e.parentElement) o *= Number(cs(e).opacity);
    return o;
  };
  const htmlBg = (el) => {  // [colour, 1] layers under an HTML element, bottom first
    const out = [];
    for (let e = el; e; e = e.parentElement) {
      const c = cs(e).backgroundColor;
      if (c && c !== 'rgba(0, 0, 0, 0)' && c !== 'transparent') out.unshift([c, Number(cs(e).opacity)]);
    }
    return out;
  };
  const svg = root.querySelector('.sv-svg');
  const surfaces = [...svg.querySelectorAll(
    '.sv-stage-bg, .sv-stage-head, .sv-node-bg, .sv-port rect, .sv-toggle rect, .sv-badge rect')];
  const svgBg = (el, x, y) => {
    const layers = htmlBg(svg);
    for (const s of surfaces) {
      if (s === el || s.contains(el) || el.contains(s)) continue;
      if (!(s.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING)) continue;
      const r = s.getBoundingClientRect();
      if (x < r.left || x > r.right || y < r.top || y > r.bottom) continue;
      const c = cs(s);
      if (c.display === 'none' || c.fill === 'none') continue;
      layers.push([c.fill, opacityChain(s) * Number(c.fillOpacity)]);
    }
    return layers;
  };
  const centre = (el) => { const r = el.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; };
  const out = [];
  const add = (kind, what, el, colour, layers, extra = {}) =>
    out.push({ kind, what, colour, opacity: opacityChain(el), layers, ...extra });
  // edges: three points along each path
  for (const p of svg.querySelectorAll('.sv-edge')) {
    const m = p.getScreenCTM(); const len = p.getTotalLength();
    for (const f of [0.25, 0.5, 0.75]) {
      const q = p.getPointAtLength(len * f).matrixTransform(m);
      const what = p.classList.contains('sv-edge-active') ? 'edge (selected)' : 'edge';
      add('graphic', what, p, cs(p).stroke, svgBg(p, q.x, q.y), { stroke: p.getAttribute('stroke-width') });
    }
  }
  const arrow = svg.querySelector('marker path, marker polygon');
  if (arrow) add('graphic', 'arrowhead', arrow, cs(arrow).fill, htmlBg(svg));
  for (const r of svg.querySelectorAll('.sv-port rect')) {
    add('graphic', 'port border', r, cs(r).stroke, svgBg(r, ...centre(r)).concat([[cs(r).fill, 1]]));
    add('graphic', 'port border (outside)', r, cs(r).stroke, svgBg(r, ...centre(r)));
  }
  for (const sp of svg.querySelectorAll('.sv-spark')) add('graphic', 'face histogram', sp, cs(sp).fill, svgBg(sp, ...centre(sp)));
  for (const t of svg.querySelectorAll('text')) {
    if (t.closest('.sv-badge, .sv-nan-icon, .sv-origin-flag, .sv-hits') || !t.textContent.trim()) continue;
    const cls = t.getAttribute('class') || t.parentElement.getAttribute('class') || 'text';
    add('text', `svg ${cls}: ${t.textContent.slice(0, 24)}`, t, cs(t).fill, svgBg(t, ...centre(t)));
  }
  const detail = root.querySelector('.sv-detail');
  for (const b of detail.querySelectorAll('.js-plotly-plot .bars path')) {
    const mode = b.closest('.sv-chart-block')?.querySelector('[data-mode]')?.dataset.mode;
    add('graphic', `histogram bar ${mode}`, b, cs(b).fill, htmlBg(detail), { fillOpacity: Number(cs(b).fillOpacity) });
  }
  for (const sw of detail.querySelectorAll('.sv-chart-title .sv-swatch')) {
    add('graphic', `swatch ${sw.parentElement.textContent.trim()}`, sw, cs(sw).backgroundColor, htmlBg(sw.parentElement));
  }
  // HTML text: every element with its own text node
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const seen = new Set();
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!n.textContent.trim() || seen.has(el) || el.closest('svg, [hidden], option')) continue;
    const r = el.getBoundingClientRect();
    if (!r.width || !r.height || cs(el).visibility === 'hidden') continue;
    seen.add(el);
    add('text', `html ${el.tagName.toLowerCase()}.${el.className}: ${n.textContent.trim().slice(0, 24)}`,
        el, cs(el).color, htmlBg(el));
  }
  const modes = {};
  for (const m of ['primal', 'tangent', 'cotangent']) modes[m] = cs(root).getPropertyValue(`--sv-${m}`).trim();
  return { theme: root.dataset.svTheme, host: root.dataset.svHost, items: out, modes };
}
"""


def _ratios(measured):
    """Each item's contrast ratio: its colour at its opacity over its background."""
    rows = []
    for it in measured["items"]:
        under = _background(it["layers"])
        alpha = it["opacity"] * it.get("fillOpacity", 1.0)
        fg = _over(it["colour"], alpha, under)
        rows.append({**it, "ratio": _contrast(fg, under)})
    return rows


def assert_readable(measured):
    rows = _ratios(measured)
    kinds = {r["what"].split(" ")[0] for r in rows}
    # everything the checks are about was there to measure
    assert {"edge", "arrowhead", "port", "face", "histogram", "swatch", "svg", "html"} <= kinds, (
        kinds
    )
    bad = [
        (r["what"], r["colour"], round(r["ratio"], 2), r["layers"])
        for r in rows
        if r["ratio"] < (4.5 if r["kind"] == "text" else 3.0)
    ]
    assert bad == [], json.dumps(bad, indent=1)
    return rows


def assert_series_apart(modes):
    hues = {}
    for m, c in modes.items():
        r, g, b, _ = _rgba(c)
        hues[m] = colorsys.rgb_to_hls(r / 255, g / 255, b / 255)[0] * 360
    for a in hues:
        for b in hues:
            d = abs(hues[a] - hues[b]) % 360
            if a < b:
                assert min(d, 360 - d) >= 60, (a, b, modes)


def open_five_deep(pg, model):
    """Opens outer > inner > mid > deep > core (five nested stage boxes), selects `core`."""
    for label in ("outer", "inner", "mid", "deep", "core"):
        nid = _id(model, label)
        g = pg.locator(f'[data-node-id="{nid}"]')
        if g.get_attribute("data-expanded") != "true":
            g.locator('[data-role="toggle"]').first.click()
        pg.wait_for_selector(f'[data-node-id="{nid}"][data-expanded="true"]')
    pg.locator(f'[data-node-id="{_id(model, "core")}"] .sv-stage-label').first.click()
    pg.locator(".sv-detail .js-plotly-plot .bars path").first.wait_for()
    pg.wait_for_timeout(300)


@pytest.mark.browser
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_report_colours_reach_wcag_contrast(browser, theme_report, scheme):
    model, path = theme_report
    p = Page(browser, color_scheme=scheme)
    try:
        pg = p.open_report(path)
        open_five_deep(pg, model)
        measured = pg.evaluate(MEASURE)
        assert measured["theme"] == scheme and measured["host"] == "standalone"
        rows = assert_readable(measured)
        # the edges were measured inside five nested stage boxes too
        deepest = max(len(r["layers"]) for r in rows if r["what"] == "edge")
        assert deepest >= 6, deepest  # widget background + outer, inner, mid, deep, core
        modes = {r["what"].split(" ")[-1] for r in rows if r["what"].startswith("histogram bar")}
        assert modes == {"primal", "tangent", "cotangent"}
        assert_series_apart(measured["modes"])
        ARTIFACTS.mkdir(exist_ok=True)
        pg.screenshot(path=str(ARTIFACTS / f"round21_theme_{scheme}.png"))
        assert p.errors == []
    finally:
        p.close()


@pytest.mark.browser
def test_a_broken_colour_is_caught(browser, theme_report):
    """The checks fail on the colours this round replaced (edge #9aa3b2 at 0.85, tangent
    #54a24b): the measurement sees what the page paints."""
    model, path = theme_report
    p = Page(browser, color_scheme="light")
    try:
        pg = p.open_report(path)
        pg.add_style_tag(
            content=".sowviz { --sv-edge: #9aa3b2; --sv-tangent: #54a24b; }"
            " .sv-edge { opacity: 0.85; }"
        )
        open_five_deep(pg, model)
        rows = _ratios(pg.evaluate(MEASURE))
        edges = [r["ratio"] for r in rows if r["what"] == "edge"]
        tangent = [r["ratio"] for r in rows if r["what"] == "histogram bar tangent"]
        assert edges and max(edges) < 3.0, edges  # 2.0:1 on the background
        assert tangent and max(tangent) < 3.2, tangent
        with pytest.raises(AssertionError, match="edge"):
            assert_readable(pg.evaluate(MEASURE))
    finally:
        p.close()


@pytest.mark.browser
def test_stopped_note_shows_names_as_code_and_user_markup_as_text(browser, theme_report):
    model, path = theme_report
    p = Page(browser)
    try:
        pg = p.open_report(path)
        outer = _id(model, "outer")
        pg.locator(f'[data-node-id="{outer}"] [data-role="toggle"]').first.click()
        target = _id(model, "target")
        pg.locator(f'[data-node-id="{target}"] .sv-label').first.click()
        note = pg.locator('.sv-detail [data-role="no-cotangent"]')
        note.wait_for()
        codes = note.locator("code").all_text_contents()
        assert codes == ["jax.lax.stop_gradient"]
        text = note.text_content()
        assert f"at {EVIL_FILE}:3" in text  # the file name's markup, as its characters
        assert "`" not in text
        assert note.locator("img, b, i").count() == 0
        assert pg.evaluate("() => window.__pwned") is None
        # the code reads in the code font
        assert "mono" in note.locator("code").first.evaluate("e => getComputedStyle(e).fontFamily")
        assert p.errors == []
    finally:
        p.close()


# --- the widget in a real JupyterLab ---------------------------------------------------

LAB_CELL = """import jax, jax.numpy as jnp, sowviz
print("SOWVIZ", sowviz.__file__)

def loss(params, x):
    with jax.named_scope("outer"):
        with jax.named_scope("inner"):
            with jax.named_scope("mid"), jax.named_scope("deep"), jax.named_scope("core"):
                h = jnp.tanh(x @ params["w"] + params["b"])
        with jax.named_scope("target"):
            t = jax.lax.stop_gradient(h * 2.0)
    return jnp.mean((h - t) ** 2)

params = {"w": jax.random.normal(jax.random.PRNGKey(0), (8, 8)) / 3, "b": jnp.zeros(8)}
x = jax.random.normal(jax.random.PRNGKey(1), (16, 8))
sowviz.show(loss, params, x, mode="all", warm=())"""

WIDGET = ".jp-OutputArea-output .sowviz"


def _lab_measure(page):
    return page.evaluate(
        MEASURE.replace("document.querySelector('.sowviz')", f"document.querySelector('{WIDGET}')")
    )


@pytest.mark.browser
@pytest.mark.slow
def test_widget_follows_jupyterlab_theme(browser, theme_report, tmp_path):
    """JupyterLab Dark while the system prefers light: the widget is dark; Settings >
    Theme > JupyterLab Light while the system prefers dark: the widget turns light. Both
    pass the contrast checks on JupyterLab's own backgrounds."""
    import nbformat
    from lab_session import failed, jupyter_lab, open_notebook, run_all_cells, write_json

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(LAB_CELL)])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    path = tmp_path / "theme.ipynb"
    nbformat.write(nb, path)
    base = tmp_path / "lab"
    write_json(
        base / "settings" / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings",
        {"theme": "JupyterLab Dark"},
    )
    ARTIFACTS.mkdir(exist_ok=True)
    errors: list[str] = []
    # the kernel imports this checkout's sowviz (and its widget's script)
    with jupyter_lab(base, [path], env={"PYTHONPATH": str(ROOT)}) as (url, log):
        context = browser.new_context(
            viewport={"width": 1500, "height": 1100}, color_scheme="light"
        )
        page = context.new_page()
        page.set_default_timeout(30_000)
        try:
            open_notebook(page, url, path.name, errors, blocked := [])
            assert page.evaluate("() => document.body.dataset.jpThemeLight") == "false"
            run_all_cells(page)
            page.wait_for_function(
                f"() => document.querySelector('{WIDGET} [data-node-id]')", timeout=240_000
            )
            out = page.locator(".jp-OutputArea-output", has_text="SOWVIZ").inner_text()
            assert str(ROOT / "sowviz") in out, out
            # the notebook's program is the report's: its stages have the same ids
            open_five_deep(page, theme_report[0])
            dark = _lab_measure(page)
            assert (dark["theme"], dark["host"]) == ("dark", "jupyter")
            assert_readable(dark)
            assert_series_apart(dark["modes"])
            page.locator(WIDGET).first.screenshot(
                path=str(ARTIFACTS / "round21_jupyterlab_dark.png")
            )

            # the system turns dark, JupyterLab is switched to its light theme by menu
            page.emulate_media(color_scheme="dark")
            page.locator(".lm-MenuBar-itemLabel", has_text="Settings").first.click()
            page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Theme$")).first.hover()
            page.locator(
                '.lm-Menu-item[data-command="apputils:change-theme"]', has_text="JupyterLab Light"
            ).first.click()
            page.wait_for_function("() => document.body.dataset.jpThemeLight === 'true'")
            page.wait_for_function(
                f"() => document.querySelector('{WIDGET}').dataset.svTheme === 'light'"
            )
            page.wait_for_timeout(1500)  # the theme's stylesheet, then the charts redrawn
            light = page.evaluate(
                MEASURE.replace(
                    "document.querySelector('.sowviz')", f"document.querySelector('{WIDGET}')"
                )
            )
            assert (light["theme"], light["host"]) == ("light", "jupyter")
            assert_readable(light)
            # the charts took the light theme's colours (not the dark theme's white text)
            fonts = page.evaluate(
                f"""() => [...document.querySelectorAll('{WIDGET} .sv-detail .js-plotly-plot')]
                         .map(g => g._fullLayout.font.color)"""
            )
            assert fonts and all(_luminance(_rgba(f)) < 0.2 for f in fonts), fonts
            page.locator(WIDGET).first.screenshot(
                path=str(ARTIFACTS / "round21_jupyterlab_light.png")
            )
        except Exception as err:
            raise failed(err, page, log, ARTIFACTS / "round21_jupyterlab_failure.png") from err
        finally:
            context.close()
    assert blocked == []
    assert errors == [], errors
