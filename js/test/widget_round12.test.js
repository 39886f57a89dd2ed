// Round 12, the widget in real JupyterLab: the locate button on a one-equation origin,
// and the theme read from the page while the widget's root is still detached.
import { test } from "node:test";
import assert from "node:assert/strict";
import { needsLocate } from "../src/banner.js";
import { storedOrigins } from "../src/nonfinite.js";
import { themeFromHints, watchTheme } from "../src/theme.js";
import { indexModel } from "../src/model.js";
import { smallModel } from "./helpers.js";

// `jnp.where(h > 0, jnp.sqrt(h), 0.0)`: Python's record before locating (sowviz.inspect
// on /tmp/s37/lab/sqrt_trap.py), on the small model's one-equation `tanh` (n4) standing
// for `sqrt`: the forward origin, and a backward that follows from it, neither located.
function sqrtTrap(extra = {}) {
  const model = smallModel();
  const at = { node: "n4", path: ["layer_0", "tanh"], iteration: [], candidates: [], equation: null };
  model.nonfinite = {
    step: null,
    forward: { ...at, reaching: null, follows_forward: false, message: "first made by `tanh` (f.py:6)" },
    backward: {
      ...at, reaching: "n3", candidates: ["n4"], follows_forward: true,
      message: "follows from the forward pass: `tanh` (f.py:6) holds non-finite values, so its backward does too",
    },
    propagators: ["n3"], expected: [], removed: false, alarm: true, located: false, not_reproduced: false,
    message: "forward pass: …; backward pass: …",
    ...extra,
  };
  return { rec: storedOrigins(model, null), index: indexModel(model) };
}

test("a one-equation origin whose backward is not located yet offers the locate button", () => {
  const { rec, index } = sqrtTrap();
  assert.equal(index.nodes.get("n4").n_eqns, 1);
  assert.equal(rec.located, false);
  assert.equal(needsLocate(rec, index), true); // the re-run names the double-where trap
});

test("no locate button once located, even where an equation stayed unnamed", () => {
  const { rec, index } = sqrtTrap({ located: true });
  assert.equal(rec.located, true);
  assert.equal(needsLocate(rec, index), false); // a second locate returns the stored record
});

test("a one-equation forward origin outside loops is named whole: no button", () => {
  const { rec, index } = sqrtTrap({ backward: null });
  assert.equal(needsLocate(rec, index), false);
});

test("a one-equation forward origin inside a loop offers the button (its iteration)", () => {
  const model = smallModel();
  model.nonfinite = {
    step: null, forward: { node: "n8", equation: null, message: "first made by `mul`" }, backward: null,
    propagators: [], expected: [], removed: false, alarm: true, located: false, message: "",
  };
  assert.equal(model.nodes.find((n) => n.id === "n8").n_eqns, 1);
  assert.equal(needsLocate(storedOrigins(model, null), indexModel(model)), true);
});

test("JupyterLab's flag decides the theme; the page's colour, VS Code's kind, the system follow", () => {
  assert.deepEqual(themeFromHints({ jpColour: "#111", jpLight: "false" }), { theme: "dark", host: "jupyter" });
  assert.deepEqual(themeFromHints({ jpColour: "white", jpLight: "true", prefersDark: true }), { theme: "light", host: "jupyter" });
  assert.deepEqual(themeFromHints({ jpColour: "", jpLight: "false" }), { theme: "dark", host: "jupyter" });
  assert.deepEqual(themeFromHints({ jpColour: "#111" }), { theme: "dark", host: "jupyter" });
  assert.deepEqual(themeFromHints({ jpColour: "#ffffff", vscodeKind: "vscode-dark" }), { theme: "dark", host: "jupyter" });
  assert.deepEqual(themeFromHints({ vscodeKind: "vscode-high-contrast-light", prefersDark: true }), { theme: "light", host: "standalone" });
  assert.deepEqual(themeFromHints({ prefersDark: true }), { theme: "dark", host: "standalone" });
  assert.deepEqual(themeFromHints({}), { theme: "light", host: "standalone" });
});

/**
 * A page like JupyterLab Dark at the moment anywidget renders: --jp-* on :root and body,
 * data-jp-theme-light="false" on body, the widget's root not attached yet (its computed
 * style holds no --jp-* variable). Frames and mutations run when the test says.
 */
function fakeJupyterPage() {
  const vars = new Map([["--jp-layout-color0", "#111"]]);
  const page = {
    frames: [],
    observers: [],
    body: { dataset: { jpThemeLight: "false", jpThemeName: "JupyterLab Dark" } },
    documentElement: {},
  };
  const saved = {};
  for (const k of ["document", "getComputedStyle", "requestAnimationFrame", "MutationObserver", "matchMedia"]) saved[k] = globalThis[k];
  globalThis.document = /** @type {any} */ ({ body: page.body, documentElement: page.documentElement });
  globalThis.getComputedStyle = /** @type {any} */ ((el) => ({
    getPropertyValue: (name) => (el === page.body || el === page.documentElement ? vars.get(name) ?? "" : ""),
  }));
  globalThis.requestAnimationFrame = /** @type {any} */ ((f) => { page.frames.push(f); return page.frames.length; });
  globalThis.MutationObserver = /** @type {any} */ (class {
    constructor(cb) { this.cb = cb; page.observers.push(this); }
    observe() {}
    disconnect() { this.cb = null; }
  });
  globalThis.matchMedia = /** @type {any} */ (() => ({ matches: false, addEventListener() {}, removeEventListener() {} }));
  return {
    page,
    vars,
    runFrames(n = 1) { for (let i = 0; i < n; i++) { const fs = page.frames.splice(0); for (const f of fs) f(0); } },
    mutate() { for (const o of page.observers) o.cb?.([]); },
    restore() { for (const [k, v] of Object.entries(saved)) globalThis[k] = v; },
  };
}

test("a widget rendered detached takes JupyterLab's dark theme from the page", () => {
  const fake = fakeJupyterPage();
  try {
    const root = { dataset: /** @type {Record<string, string>} */ ({}), isConnected: false };
    const stop = watchTheme(root, () => {});
    // was light and "standalone": the detached root's own style held no --jp-* variable
    assert.deepEqual({ ...root.dataset }, { svTheme: "dark", svHost: "jupyter" });
    stop();
  } finally {
    fake.restore();
  }
});

test("a theme switch is followed, charts again once the new colours are in", () => {
  const fake = fakeJupyterPage();
  try {
    const root = { dataset: /** @type {Record<string, string>} */ ({}), isConnected: true };
    let changes = 0;
    const stop = watchTheme(root, () => { changes += 1; });
    assert.equal(root.dataset.svTheme, "dark");
    // JupyterLab flips its flag; the light theme's stylesheet applies a frame later
    fake.page.body.dataset.jpThemeLight = "true";
    fake.mutate();
    assert.equal(root.dataset.svTheme, "light");
    assert.equal(changes, 1);
    fake.vars.set("--jp-layout-color0", "white");
    fake.runFrames(2);
    assert.equal(changes, 2); // drawn again in the light colours
    fake.runFrames(200); // nothing more changes; the frames stop
    assert.equal(changes, 2);
    assert.equal(fake.page.frames.length, 0);
    stop();
  } finally {
    fake.restore();
  }
});
