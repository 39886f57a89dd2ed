// Round 14: a stage's "arguments read here" and a group's parameter table list the
// inputs in the order the program first reads them (`Node.read_at`), not level by level.
import { test } from "node:test";
import assert from "node:assert/strict";
import { indexModel } from "../src/model.js";
import { paramRows, readRows } from "../src/params.js";

const node = (id, label, kind, parent, order, extra = {}) => ({
  id, label, kind, parent, order, source: null, shapes: ["float32[4]"], primitive: null, n_eqns: 0, collapsed: kind === "scope", ...extra,
});

/**
 * A block of two layers: `conv` (reads `conv.w` at 6), `bn` (reads `bn.mean` at 8 itself,
 * then its stage `stats` reads `bn.var` at 10 and `norm` reads `bn.scale` at 12), and the
 * block's own `gain` read at 14, after all of its layers' reads.
 * @param {boolean} withAt whether the nodes carry `read_at` (a model saved before it does not)
 */
function blockModel(withAt) {
  const at = (xs) => (withAt ? { read_at: xs } : {});
  return {
    schema: "sowviz/1", title: "t", mode: "grad", modes: ["primal"], device: "cpu", versions: {}, created: "", root: "n0",
    nodes: [
      node("n0", "prog", "jit", null, 0),
      node("p", "parameters", "scope", "n0", 1),
      // the inputs in the parameters' own (alphabetical) order
      node("i1", "bn.mean", "input", "p", 2), node("i2", "bn.scale", "input", "p", 3), node("i3", "bn.var", "input", "p", 4),
      node("i4", "conv.w", "input", "p", 5), node("i5", "gain", "input", "p", 5.5),
      node("b", "block", "scope", "n0", 5.8, { reads: ["i5"], ...at([14]) }),
      node("c", "conv", "scope", "b", 5.9, { reads: ["i4"], ...at([6]) }),
      node("bn", "bn", "scope", "b", 7, { reads: ["i1"], ...at([8]) }),
      node("st", "stats", "scope", "bn", 9, { reads: ["i3"], ...at([10]) }),
      node("nm", "norm", "scope", "bn", 11, { reads: ["i2"], ...at([12]) }),
    ],
    edges: [], probes: [], notes: [], history: null,
  };
}

test("a block's reads come in program order, its own read after its layers' ones", () => {
  const ix = indexModel(blockModel(true));
  const want = ["conv.w", "bn.mean", "bn.var", "bn.scale", "gain"];
  assert.deepEqual(readRows(ix, "b").map((r) => r.name), want);
  assert.deepEqual(paramRows(ix, "p").map((r) => r.name), want);
  assert.deepEqual(readRows(ix, "bn").map((r) => r.name), ["bn.mean", "bn.var", "bn.scale"]);
});

test("without read_at (an older model), a stage's reads come before its stages', depth first", () => {
  const ix = indexModel(blockModel(false));
  // depth first, not level by level (that gave conv.w, bn.mean, bn.var, bn.scale with
  // `gain` first and bn's stages' reads after all of the block's layers' own)
  const want = ["gain", "conv.w", "bn.mean", "bn.var", "bn.scale"];
  assert.deepEqual(readRows(ix, "b").map((r) => r.name), want);
  assert.deepEqual(paramRows(ix, "p").map((r) => r.name), want);
});

test("an input read twice is placed at its first read; a malformed read_at is ignored", () => {
  const m = blockModel(true);
  // `norm` reads `conv.w` again (tied weights) at 13: still first, at 6
  m.nodes.find((n) => n.id === "nm").reads = ["i2", "i4"];
  m.nodes.find((n) => n.id === "nm").read_at = [12, 13];
  assert.deepEqual(readRows(indexModel(m), "b").map((r) => r.name), ["conv.w", "bn.mean", "bn.var", "bn.scale", "gain"]);
  assert.deepEqual(readRows(indexModel(m), "nm").map((r) => r.name), ["bn.scale", "conv.w"]);
  // read_at not pairing with reads: the node's own order stands in for it
  const bad = blockModel(true);
  bad.nodes.find((n) => n.id === "b").read_at = [14, 15];
  const ix = indexModel(bad);
  assert.deepEqual(ix.nodes.get("b").read_at, []);
  assert.deepEqual(readRows(ix, "b").map((r) => r.name), ["gain", "conv.w", "bn.mean", "bn.var", "bn.scale"]);
});
