import { blockNumbers } from "../src/repeatview.js";
import { test } from "node:test";
import assert from "node:assert/strict";
import { indexModel } from "../src/model.js";
import { repeatStats } from "../src/repeats.js";
import { summary } from "./helpers.js";

// root n0 ─ n1 group "layers[0–2] (×3)" ─ n2, n3, n4 blocks (each with a stage probe);
// n4's block also has a second leaf; n5 output.
function groupModel() {
  const node = (id, label, parent, order, extra = {}) => ({ id, label, kind: "scope", parent, order, source: null, shapes: ["float32[4]"], primitive: null, n_eqns: 3, collapsed: true, ...extra });
  const stats = [[2, 0.5, 1], [3, -0.25, 2], [5, 0.125, 4]]; // l2, mean, absmax per block
  const probes = stats.map(([l2, mean, absmax], i) => ({
    id: `p${i}`, name: `layers.${i}`, leaf: "", node: `n${i + 2}`, auto: true,
    summaries: { primal: summary({ l2, mean, absmax }), cotangent: summary({ l2: l2 / 10, nan: i === 1 ? 2 : 0 }) },
  }));
  probes.push({ id: "p9", name: "h", leaf: "", node: "n4", auto: false, summaries: { primal: summary({ l2: 99 }) } });
  return {
    root: "n0", nodes: [
      node("n0", "prog", null, 0, { kind: "jit" }),
      node("n1", "layers[0–2] (×3)", "n0", 1, { repeats: 3 }),
      node("n2", "layers[0]", "n1", 2), node("n3", "layers[1]", "n1", 3), node("n4", "layers[2]", "n1", 4),
      node("n5", "out", "n0", 5, { kind: "output" }),
    ], edges: [], probes, notes: [],
  };
}

test("a group's per-block statistics are its blocks' stage probe summaries, in order", () => {
  const m = groupModel();
  const index = indexModel(m);
  assert.equal(index.nodes.get("n1").repeats, 3);
  assert.equal(index.nodes.get("n2").repeats, 0);
  const st = repeatStats(index, "n1");
  assert.deepEqual(st.blocks.map((b) => b.label), ["layers[0]", "layers[1]", "layers[2]"]);
  assert.deepEqual(st.modes, ["primal", "cotangent"]);
  for (const mode of st.modes) {
    for (const k of ["l2", "mean", "absmax", "min", "max", "std"]) {
      // each block's stage probe (auto), never the user's sow on the last block
      const want = [0, 1, 2].map((i) => m.probes[i].summaries[mode][k]);
      assert.deepEqual(st.series[mode][k], want, `${mode} ${k}`);
    }
  }
  assert.deepEqual(st.series.cotangent.nonfinite, [0, 2, 0]);
});

test("equations between the blocks (a loop's slice before each call) are no blocks", () => {
  const m = groupModel();
  const eqn = (id, order) => ({ id, label: "slice", kind: "eqn", parent: "n1", order, source: null, shapes: ["float32[4]"], primitive: "slice", n_eqns: 1, collapsed: true });
  m.nodes.splice(2, 0, eqn("e1", 2));
  m.nodes.splice(4, 0, eqn("e2", 3));
  const st = repeatStats(indexModel(m), "n1");
  assert.deepEqual(st.blocks.map((b) => b.id), ["n2", "n3", "n4"]);
  assert.deepEqual(st.series.primal.l2, [2, 3, 5]);
});

test("a block without the statistic gives null, not a made-up number", () => {
  const m = groupModel();
  m.probes[1].summaries.primal.l2 = null;
  m.probes = m.probes.filter((p) => p.id !== "p2" && p.id !== "p9");
  const st = repeatStats(indexModel(m), "n1");
  assert.deepEqual(st.series.primal.l2, [2, null, null]);
  assert.equal(st.blocks[2].probe, null);
});

test("a last block whose values leave it only in part charts the group's value, as the others do", () => {
  // A Python loop's passes hand on `[0]` a cache and `[1]` a token; the last pass's cache
  // is read by no one, so it has one value, leaf "", which the group shows as its own.
  const m = groupModel();
  const typed = (dtype, shape, l2) => ({ ...summary({ l2 }), dtype, shape });
  m.probes = [];
  for (const [i, n] of ["n2", "n3"].entries()) {
    m.probes.push({ id: `c${i}`, name: n, leaf: "[0]", node: n, auto: true, summaries: { primal: typed("float32", [6, 4], 100 + i) } });
    m.probes.push({ id: `t${i}`, name: n, leaf: "[1]", node: n, auto: true, summaries: { primal: typed("float32", [4], 1 + i) } });
  }
  m.probes.push({ id: "t2", name: "n4", leaf: "", node: "n4", auto: true, summaries: { primal: typed("float32", [4], 3) } });
  m.probes.push({ id: "g", name: "group", leaf: "", node: "n1", auto: true, summaries: { primal: typed("float32", [4], 3) } });
  const st = repeatStats(indexModel(m), "n1", "");
  assert.deepEqual(st.blocks.map((b) => b.probe?.id), ["t0", "t1", "t2"]);
  assert.deepEqual(st.series.primal.l2, [1, 2, 3]);
});

test("blocks are numbered as their labels number them", () => {
  assert.deepEqual(blockNumbers(["BottleneckResNetBlock_8", "BottleneckResNetBlock_9", "BottleneckResNetBlock_10"]), [8, 9, 10]);
  assert.deepEqual(blockNumbers(["layers[0]: Block", "layers[1]: Block"]), [0, 1]);
  assert.deepEqual(blockNumbers(["down[1][0]", "down[1][1]"]), [0, 1]); // the number that differs
  assert.deepEqual(blockNumbers(["a", "b"]), [0, 1]); // no numbers: positions
  assert.deepEqual(blockNumbers(["x_3", "x_3"]), [0, 1]); // no number tells them apart
});
