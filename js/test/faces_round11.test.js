// Round 11 of the node faces: one name for an output (face, tooltip and panel), the
// statistic always named, values of no size drawn as no data, and an opened stage's
// neighbours kept in view.
import { test } from "node:test";
import assert from "node:assert/strict";
import { indexModel } from "../src/model.js";
import { computeFaces, fitted, outputLabel, EMPTY_TEXT } from "../src/faces.js";
import { nodeStat, logScale } from "../src/stats.js";
import { outputNonfinite } from "../src/detail.js";
import { showBoxTransform, READABLE_SCALE } from "../src/viewport.js";
import { summary } from "./helpers.js";

/** A model of one program `n0` holding the given stages, each with its probes. */
function stagesModel(stages) {
  const nodes = [{ id: "n0", label: "prog", kind: "jit", parent: null, order: 0, source: null, shapes: [], primitive: null, n_eqns: 0, collapsed: false }];
  const probes = [];
  stages.forEach(({ id, label, shapes, outputs }, i) => {
    nodes.push({ id, label, kind: "scope", parent: "n0", order: i + 1, source: null, shapes, primitive: null, n_eqns: 8, collapsed: true });
    outputs.forEach((o, j) => probes.push({ id: `${id}p${j}`, name: label, leaf: o.leaf, node: id, auto: true, summaries: o.summaries }));
  });
  return { schema: "sowviz/1", title: "t", mode: "grad", modes: ["primal", "cotangent"], device: "cpu", versions: {}, created: "", root: "n0", nodes, edges: [], probes, notes: [], history: null };
}

// The nested-derivative PINN (sci/n3_nested.py): `net` keeps three values for its
// backward pass, `net (backward)#2` has two outputs; their cotangents hold NaN.
const grad = (l2, nan, shape = [9, 3]) => summary({ shape, size: shape.reduce((a, b) => a * b, 1), count: shape.reduce((a, b) => a * b, 1) - nan, nan, l2 });
const NET = {
  id: "n1", label: "net", shapes: ["float32[9,3]", "float32[9,3]", "float32[9,3]"],
  outputs: [
    { leaf: "['saved for backward[0]']", summaries: { primal: summary({ shape: [9, 3] }), cotangent: grad(0.8055655, 9) } },
    { leaf: "['saved for backward[1]']", summaries: { primal: summary({ shape: [9, 3], posinf: 3 }), cotangent: grad(0.27961254, 9) } },
    { leaf: "['saved for backward[2]']", summaries: { primal: summary({ shape: [9, 3] }), cotangent: grad(0.5838523, 9) } },
  ],
};
const BACKWARD2 = {
  id: "n2", label: "net (backward)#2", shapes: ["float32[9,1]", "float32[9,1,1]"],
  outputs: [
    { leaf: "[0]", summaries: { primal: summary({ shape: [9, 1] }) } },
    { leaf: "[1]", summaries: { primal: summary({ shape: [9, 1, 1] }), cotangent: grad(0.38923487, 3, [9, 1, 1]) } },
  ],
};
const ALONE = { id: "n3", label: "u_xx", shapes: ["float32[9]"], outputs: [{ leaf: "", summaries: { cotangent: grad(0.38923487, 3, [9]) } }] };

// the room graph.js gives a 204 px face beside a "+ 8 eqns" button
const ROOM_204 = Math.floor((204 - 8 - (14 + (10 + 8 * 6) + 6)) / 6.35);

test("a face names its output as the panel does, and never a number without its statistic", () => {
  const ix = indexModel(stagesModel([NET, BACKWARD2, ALONE]));
  const { faces } = computeFaces(ix, ["n1", "n2", "n3"], { mode: "cotangent", stat: "l2" });
  const net = faces.get("n1");
  // the panel's "output" row reads "saved for backward[0] (1 of 3)": the same name,
  // not `#1` (counted from 1 beside a sibling's `[1]`, counted from 0)
  assert.equal(net.text, "saved for backward[0] ‖grad‖₂ = 0.8056 · 9 NaN");
  assert.equal(net.shown, "saved for backward[0]");
  assert.deepEqual(net.outputs, [
    "saved for backward[0]: ‖grad‖₂ = 0.8056", "saved for backward[1]: ‖grad‖₂ = 0.2796", "saved for backward[2]: ‖grad‖₂ = 0.5839",
  ]);
  assert.equal(faces.get("n2").text, "[1] ‖grad‖₂ = 0.3892 · 3 NaN");
  assert.equal(faces.get("n3").text, "‖grad‖₂ = 0.3892 · 3 NaN");
  assert.equal(ROOM_204, 18);
  // in a 204 px face (18 characters), where they read "#1 = 0.81 · 9 NaN",
  // "[1] = 0.389 · 3 NaN" and "= 0.3892 · 3 NaN": the counts alone, never the norm
  // of the finite values as if it were the whole value's (round 13; the layout makes
  // such boxes wide enough for both)
  assert.equal(fitted(net, ROOM_204), "grad: 9 NaN");
  assert.equal(fitted(faces.get("n2"), ROOM_204), "grad: 3 NaN");
  assert.equal(fitted(faces.get("n3"), ROOM_204), "grad: 3 NaN");
  assert.equal(fitted(faces.get("n3"), 24), "‖grad‖₂ = 0.3892 · 3 NaN");
  // wide enough: the output by its name, the statistic and the count
  assert.equal(fitted(net, 60), net.text);
  assert.equal(fitted(faces.get("n2"), 28), "[1] ‖grad‖₂ = 0.3892 · 3 NaN");
  // at every room: the statistic named, or the counts alone, or nothing
  for (const face of faces.values()) {
    for (let room = 0; room <= 60; room++) {
      const t = fitted(face, room);
      assert.ok(t.length <= room, `${t} in ${room}`);
      assert.ok(t === "" || /(^|\] |\d\] )‖grad‖₂ = /.test(t) || /^(grad: )?\d+ NaN$/.test(t), `${room}: "${t}"`);
      assert.ok(!/#\d/.test(t) && !t.startsWith("="), t);
    }
  }
});

test("the panel's NaN line names each output, as its output row does", () => {
  const m = stagesModel([NET, ALONE]);
  const probes = m.probes.filter((p) => p.node === "n1");
  assert.deepEqual(probes.map((p) => outputLabel(p)), ["saved for backward[0]", "saved for backward[1]", "saved for backward[2]"]);
  // it read "net cotangent: 9 NaN · net cotangent: 9 NaN · net primal: 3 +Inf · net cotangent: 9 NaN"
  assert.deepEqual(probes.map((p) => outputNonfinite(p, true)), [
    "saved for backward[0]: cotangent 9 NaN",
    "saved for backward[1]: primal 3 +Inf, cotangent 9 NaN",
    "saved for backward[2]: cotangent 9 NaN",
  ]);
  // a stage's only output: its counts by mode, as before
  assert.equal(outputNonfinite(m.probes.find((p) => p.node === "n3"), false), "cotangent: 3 NaN");
  assert.equal(outputNonfinite({ name: "w", leaf: "", summaries: { cotangent: summary() } }, true), "");
  // a probe without a leaf (a sow) goes by its name
  assert.equal(outputLabel({ name: "hidden", leaf: "" }), "hidden");
});

// associative_scan on an odd length (seq/r4_assoc_empty.py): combine calls on slices of
// shape [0, 4], whose summaries hold count 0, size 0 and an l2 of 0 over no values
const empty = (extra = {}) => summary({ shape: [0, 4], size: 0, count: 0, min: null, max: null, mean: null, std: null, l2: 0, absmax: null, hist: { edges: [0, 1], counts: [0] }, ...extra });

test("values of no size are no data: no statistic, no colour, outside the colour scale", () => {
  const m = stagesModel([
    { id: "n1", label: "combine#5", shapes: ["float32[1,4]", "float32[1,4]"], outputs: [
      { leaf: "[0]", summaries: { primal: summary({ shape: [1, 4] }) } },
      { leaf: "[1]", summaries: { primal: summary({ shape: [1, 4] }), cotangent: summary({ shape: [1, 4], l2: 38.63 }) } },
    ] },
    { id: "n2", label: "combine#6", shapes: ["float32[0,4]", "float32[0,4]"], outputs: [
      { leaf: "[0]", summaries: { primal: empty() } },
      { leaf: "[1]", summaries: { primal: empty(), cotangent: empty() } },
    ] },
    { id: "n3", label: "mixed", shapes: ["float32[0,4]", "float32[4]"], outputs: [
      { leaf: "[0]", summaries: { cotangent: empty() } },
      { leaf: "[1]", summaries: { cotangent: summary({ l2: 2.5 }) } },
    ] },
  ]);
  const ix = indexModel(m);
  const { faces, scale } = computeFaces(ix, ["n1", "n2", "n3"], { mode: "cotangent", stat: "l2" });
  const none = faces.get("n2");
  // it read "[1] ‖grad‖₂ = 0" in the scale's lowest colour
  assert.equal(none.value, null);
  assert.equal(none.colour, null);
  assert.equal(none.text, EMPTY_TEXT);
  assert.equal(fitted(none, 18), "0 values");
  assert.equal(nodeStat(m.probes.filter((p) => p.node === "n2"), "cotangent", "l2"), null);
  // a stage with an empty output and a full one shows the full one
  assert.equal(faces.get("n3").text, "[1] ‖grad‖₂ = 2.5");
  assert.equal(faces.get("n3").value, 2.5);
  assert.deepEqual(faces.get("n3").outputs, ["[0]: 0 values", "[1]: ‖grad‖₂ = 2.5"]);
  // the scale spans the values there are, 2.5 to 38.63, as if the empty ones were not there
  const want = logScale([38.63, 2.5]);
  assert.deepEqual([scale.lo, scale.hi], [want.lo, want.hi]);
  assert.deepEqual([scale.lo, scale.hi], [Math.log10(2.5), Math.log10(38.63)]);
  // an all-NaN gradient (size > 0, count 0) is still "grad: n NaN", not no data
  m.probes.find((p) => p.id === "n2p1").summaries.cotangent = summary({ shape: [2, 4], size: 8, count: 0, nan: 8, l2: 0 });
  assert.equal(computeFaces(indexModel(m), ["n2"], { mode: "cotangent", stat: "l2" }).faces.get("n2").text, "[1] grad: 8 NaN");
});

const onScreen = (b, t) => ({ left: t.x + b.x * t.k, right: t.x + (b.x + b.w) * t.k, top: t.y + b.y * t.k, bottom: t.y + (b.y + b.h) * t.k });

test("an opened stage comes into view with its neighbours: nothing cut at the left", () => {
  // seq/p1_nnx_lstm.py at 1400 × 983: opening `rnn` widened `Model`; `y` and `sub`
  // beside it were drawn from x = -45 (the stage itself fitted, so nothing moved)
  const W = 1400;
  const H = 983;
  const rnn = { x: 200, y: 150, w: 1040, h: 280 };
  const model = { x: 185, y: 120, w: 1070, h: 600 };
  const y = { x: -45, y: 380, w: 204, h: 62 };
  const sub = { x: -40, y: 700, w: 204, h: 62 };
  const below = { x: -400, y: 3000, w: 204, h: 62 }; // far below: no neighbour in view
  const t = { k: 1, x: 0, y: 0 };
  const v = showBoxTransform(rnn, t, W, H, { minScale: READABLE_SCALE, around: [model, y, sub, below, rnn] });
  for (const b of [rnn, model, y, sub]) {
    const s = onScreen(b, v);
    assert.ok(s.left >= 0 && s.right <= W, `${JSON.stringify(b)} at ${JSON.stringify(s)}`);
  }
  assert.equal(v.k, 1); // their width fits at this zoom: kept
  assert.equal(onScreen(y, v).left, 16);
  // without neighbours: as before, the stage alone decides (it is in view: no move)
  assert.deepEqual(showBoxTransform(rnn, t, W, H, { minScale: READABLE_SCALE }), t);
  assert.deepEqual(showBoxTransform(rnn, t, W, H, { minScale: READABLE_SCALE, around: [below] }), t);
});

test("neighbours wider than the view: zoomed out to them while readable, else their left first", () => {
  const H = 983;
  const box = { x: 200, y: 150, w: 1040, h: 280 };
  const left = { x: -60, y: 300, w: 204, h: 62 };
  // 1300 wide in 1368 px of room at k 1: zoomed out to 1368 / 1300, above READABLE_SCALE
  const a = showBoxTransform(box, { k: 1, x: 0, y: 0 }, 1250 + 50, H, { minScale: READABLE_SCALE, around: [left] });
  assert.ok(Math.abs(a.k - (1300 - 32) / 1300) < 1e-12, String(a.k));
  for (const b of [box, left]) assert.ok(onScreen(b, a).left >= 0 && onScreen(b, a).right <= 1300, JSON.stringify(onScreen(b, a)));
  // a narrower view: not below READABLE_SCALE; the stage stays whole, the row's left
  // as far in as that allows
  const W = 1100;
  const b = showBoxTransform(box, { k: 1, x: 0, y: 0 }, W, H, { minScale: READABLE_SCALE, around: [left] });
  assert.equal(b.k, READABLE_SCALE);
  const s = onScreen(box, b);
  assert.ok(s.left >= 16 - 1e-9 && s.right <= W - 16 + 1e-9, JSON.stringify(s));
  // moved right until the stage's right reached the margin: the row's left is cut by
  // no more than the row's excess over the view
  assert.ok(Math.abs(s.right - (W - 16)) < 1e-9, JSON.stringify(s));
  const excess = 1300 * READABLE_SCALE - (W - 32);
  assert.ok(Math.abs(onScreen(left, b).left - (16 - excess)) < 1e-9, JSON.stringify(onScreen(left, b)));
  // a stage wider than the view keeps its start at the margin, whatever lies beside it
  const wide = { x: 0, y: 0, w: 3000, h: 200 };
  const c = showBoxTransform(wide, { k: 1, x: 0, y: 0 }, W, H, { minScale: READABLE_SCALE, around: [{ x: -500, y: 0, w: 100, h: 50 }] });
  assert.equal(onScreen(wide, c).left, 16);
});
