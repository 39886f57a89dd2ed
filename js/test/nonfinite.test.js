import { test } from "node:test";
import assert from "node:assert/strict";
import { indexModel } from "../src/model.js";
import { isBackwardKey, nonfiniteOrigins, nodeNonfinite } from "../src/nonfinite.js";
import { smallModel, summary } from "./helpers.js";

function withProbes(probes) {
  const m = smallModel();
  m.probes = probes.map(([id, node, summaries]) => ({ id, name: id, leaf: "", node, auto: false, summaries }));
  return indexModel(m);
}
const bad = summary({ nan: 2 });
const ok = summary();

test("backward keys are the ones holding a cotangent", () => {
  assert.ok(isBackwardKey("cotangent"));
  assert.ok(isBackwardKey("cotangent.tangent"));
  assert.ok(!isBackwardKey("tangent"));
  assert.ok(!isBackwardKey("primal"));
});

test("node non-finite flags split by pass and propagate to ancestors", () => {
  assert.deepEqual(nodeNonfinite([{ summaries: { primal: ok, cotangent: summary({ posinf: 1 }) } }]), { forward: false, backward: true });
  const ix = withProbes([["a", "n4", { primal: bad }]]);
  assert.ok(ix.nonfinite.get("n4").forward);
  assert.ok(ix.subtreeNonfinite.has("n2") && ix.subtreeNonfinite.has("n0"));
  assert.ok(!ix.subtreeNonfinite.has("n6"));
});

test("forward origin is the first in program order, backward the last", () => {
  const ix = withProbes([
    ["a", "n4", { primal: bad, cotangent: bad }],
    ["b", "n8", { primal: bad, cotangent: bad }],
    ["c", "n1", { primal: ok, cotangent: ok }],
  ]);
  assert.deepEqual(nonfiniteOrigins(ix), { forward: "n4", backward: "n8" });
});

test("a child beats its stage forward; the stage beats its child backward", () => {
  // n2 (order 2, exit 5) contains n5 (order 5, the stage's last value).
  const ix = withProbes([
    ["s", "n2", { primal: bad, cotangent: bad }],
    ["h", "n5", { primal: bad, cotangent: bad }],
  ]);
  assert.deepEqual(nonfiniteOrigins(ix), { forward: "n5", backward: "n2" });
  // a stage whose NaN comes before a later sibling's, forward
  const ix2 = withProbes([["s", "n2", { primal: bad }], ["t", "n9", { primal: bad }]]);
  assert.equal(nonfiniteOrigins(ix2).forward, "n2");
});

test("no non-finite values, no origin", () => {
  const ix = withProbes([["a", "n4", { primal: ok, cotangent: ok }]]);
  assert.deepEqual(nonfiniteOrigins(ix), { forward: null, backward: null });
});
