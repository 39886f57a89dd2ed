import { test } from "node:test";
import assert from "node:assert/strict";
import { indexModel, orderModes, ancestors, soleChain } from "../src/model.js";
import { liftEdge, edgesByLevel, visibleLevels, visibleRepresentative, pathToReveal } from "../src/levels.js";
import { smallModel } from "./helpers.js";

test("index: children in program order, depth, subtree exit", () => {
  const ix = indexModel(smallModel());
  assert.equal(ix.root, "n0");
  assert.deepEqual(ix.children.get("n0"), ["n1", "n2", "n6", "n9"]);
  assert.deepEqual(ix.children.get("n2"), ["n3", "n4", "n5"]);
  assert.equal(ix.depth.get("n8"), 3);
  assert.equal(ix.exit.get("n2"), 5);
  assert.equal(ix.exit.get("n6"), 8);
  assert.equal(ix.exit.get("n0"), 9);
  assert.deepEqual(ancestors(ix, "n8"), ["n7", "n6", "n0"]);
});

test("index: probes propagate up as subtreeProbe", () => {
  const ix = indexModel(smallModel());
  for (const id of ["n5", "n2", "n0", "n6"]) assert.ok(ix.subtreeProbe.has(id), id);
  for (const id of ["n1", "n3", "n7", "n8", "n9"]) assert.ok(!ix.subtreeProbe.has(id), id);
});

test("index: unknown parents and missing root are repaired", () => {
  const m = smallModel();
  m.nodes[3].parent = "nope";
  delete m.root;
  const ix = indexModel(m);
  assert.equal(ix.root, "n0");
  assert.equal(ix.nodes.get("n3").parent, "n0");
  assert.ok(ix.children.get("n0").includes("n3"));
});

test("index: a parent cycle does not hang and keeps every node", () => {
  const m = smallModel();
  m.nodes[1].parent = "n3"; // n1 under n3 (fine)
  m.nodes[2].parent = "n4"; // n2 <-> n4 cycle: n4 is n2's child
  const ix = indexModel(m);
  assert.equal(ix.depth.size, ix.nodes.size);
});

test("modes are ordered primal, tangent, cotangent, then composites", () => {
  assert.deepEqual(orderModes(["cotangent.tangent", "cotangent", "primal", "tangent"]), ["primal", "tangent", "cotangent", "cotangent.tangent"]);
});

test("edge lifting to the nearest sibling ancestors", () => {
  const ix = indexModel(smallModel());
  assert.deepEqual(liftEdge(ix, "n1", "n3"), { parent: "n0", source: "n1", target: "n2" });
  assert.deepEqual(liftEdge(ix, "n3", "n4"), { parent: "n2", source: "n3", target: "n4" });
  assert.deepEqual(liftEdge(ix, "n5", "n8"), { parent: "n0", source: "n2", target: "n6" });
  assert.equal(liftEdge(ix, "n2", "n3"), null);
  assert.equal(liftEdge(ix, "n8", "n6"), null);
  assert.equal(liftEdge(ix, "n3", "missing"), null);
});

test("edges per level are merged with a count", () => {
  const ix = indexModel(smallModel());
  const by = edgesByLevel(ix);
  const root = by.get("n0").map((e) => [e.source, e.target, e.count]);
  assert.deepEqual(root, [["n1", "n2", 1], ["n2", "n6", 2], ["n6", "n9", 1]]);
  assert.deepEqual(by.get("n2").map((e) => [e.source, e.target]), [["n3", "n4"], ["n4", "n5"]]);
  assert.equal(by.get("n7"), undefined);
});

test("visible levels follow expansion; collapsed ancestors hide inner expansions", () => {
  const ix = indexModel(smallModel());
  assert.deepEqual(visibleLevels(ix, new Set()), ["n0"]);
  assert.deepEqual(visibleLevels(ix, new Set(["n2", "n6"])), ["n0", "n2", "n6"]);
  assert.deepEqual(visibleLevels(ix, new Set(["n7"])), ["n0"]);
  assert.deepEqual(visibleLevels(ix, new Set(["n6", "n7"])), ["n0", "n6", "n7"]);
  // expanding a leaf adds no level
  assert.deepEqual(visibleLevels(ix, new Set(["n1"])), ["n0"]);
});

test("representative of a hidden node is its outermost collapsed ancestor", () => {
  const ix = indexModel(smallModel());
  assert.equal(visibleRepresentative(ix, new Set(), "n8"), "n6");
  assert.equal(visibleRepresentative(ix, new Set(["n6"]), "n8"), "n7");
  assert.equal(visibleRepresentative(ix, new Set(["n6", "n7"]), "n8"), "n8");
  assert.deepEqual(pathToReveal(ix, "n8"), ["n7", "n6"]);
});

test("opening a wrapper opens the chain of sole children below it", () => {
  const ix = indexModel(smallModel());
  // n6 holds only n7, which holds n8 (an equation): one click opens both stages
  assert.deepEqual(soleChain(ix, "n6"), ["n6", "n7"]);
  // n2 holds three children: only itself
  assert.deepEqual(soleChain(ix, "n2"), ["n2"]);
});
