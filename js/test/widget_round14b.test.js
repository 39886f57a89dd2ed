// Round 14 (JupyterLab notes): a face's non-finite counts of primal values say "value",
// not "x"; an opened stage a little wider than the view zooms out to show it across.
import { test } from "node:test";
import assert from "node:assert/strict";
import { indexModel } from "../src/model.js";
import { computeFaces, fitted } from "../src/faces.js";
import { ACROSS_SCALE, READABLE_SCALE, showBoxTransform } from "../src/viewport.js";
import { summary } from "./helpers.js";

function oneStage(primal) {
  const nodes = [
    { id: "n0", label: "prog", kind: "jit", parent: null, order: 0, source: null, shapes: [], primitive: null, n_eqns: 0, collapsed: false },
    { id: "n1", label: "l1", kind: "scope", parent: "n0", order: 1, source: null, shapes: ["float32[32,32]"], primitive: null, n_eqns: 3, collapsed: true },
  ];
  const probes = [{ id: "p1", name: "l1", node: "n1", auto: true, summaries: { primal } }];
  return { version: 1, title: "t", root: "n0", mode: "grad", nodes, edges: [], probes, notes: [] };
}

test("an all-NaN stage's face says 'value: 1024 NaN', not 'x: …' (read as the input x)", () => {
  const nan = summary({ shape: [32, 32], size: 1024, count: 0, nan: 1024, l2: 0, hist: { edges: [0, 1], counts: [0] } });
  const face = computeFaces(indexModel(oneStage(nan)), ["n1"], { mode: "primal", stat: "l2" }).faces.get("n1");
  assert.equal(face.text, "value: 1024 NaN");
  assert.equal(face.short, "value: 1024 NaN");
  // a narrow face keeps the counts alone
  assert.equal(fitted(face, 15), "value: 1024 NaN");
  assert.equal(fitted(face, 12), "1024 NaN");
  // finite values beside NaN: the statistic, then the counts (no word before them)
  const mixed = summary({ shape: [32, 32], size: 1024, count: 1000, nan: 24, l2: 3 });
  const m = computeFaces(indexModel(oneStage(mixed)), ["n1"], { mode: "primal", stat: "l2" }).faces.get("n1");
  assert.equal(m.text, "‖x‖₂ = 3 · 24 NaN");
  assert.equal(m.short, "value: 24 NaN");
});

const onScreen = (b, t) => ({ left: t.x + b.x * t.k, right: t.x + (b.x + b.w) * t.k, top: t.y + b.y * t.k });

test("an opened stage a little wider than the view at readable zoom is shown across whole", () => {
  // the lab's notebook: `parameters` of three layers opened in a view 566 px wide
  // (the detail panel open), 697 graph units wide: at READABLE_SCALE it ran past the
  // right edge, and the graph beside it was pushed out to the left
  const W = 566;
  const H = 531;
  const params = { x: 200, y: 40, w: 697, h: 104 };
  const mlp = { x: 215, y: 204, w: 204, h: 62 };
  const inputs = { x: -20, y: 60, w: 204, h: 62 };
  const t = { k: 1, x: 180, y: 20 };
  const v = showBoxTransform(params, t, W, H, { minScale: READABLE_SCALE, around: [params, mlp, inputs] });
  assert.ok(Math.abs(v.k - (W - 32) / 697) < 1e-12 && v.k >= ACROSS_SCALE, String(v.k));
  const s = onScreen(params, v);
  assert.ok(s.left >= 16 - 1e-9 && s.right <= W - 16 + 1e-9, JSON.stringify(s));
  assert.ok(s.top >= 16 - 1e-9, JSON.stringify(s));
  // a stage much wider than the view: not shrunk below readable, its start at the margin
  const wide = { x: 200, y: 40, w: 1400, h: 104 };
  const w = showBoxTransform(wide, t, W, H, { minScale: READABLE_SCALE, around: [wide, mlp, inputs] });
  assert.equal(w.k, READABLE_SCALE);
  assert.equal(onScreen(wide, w).left, 16);
  // a stage taller than the view (not wider) still starts at its top at readable zoom
  const tall = { x: 200, y: 40, w: 300, h: 700 };
  const u = showBoxTransform(tall, t, W, H, { minScale: READABLE_SCALE });
  assert.equal(u.k, READABLE_SCALE);
  assert.equal(onScreen(tall, u).top, 16);
});
