import { test } from "node:test";
import assert from "node:assert/strict";
import { indexModel } from "../src/model.js";
import * as nf from "../src/nonfinite.js";
import { isBackwardKey, nodeNonfinite, nonfiniteRoles, originNodes, storedOrigins } from "../src/nonfinite.js";
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

test("origins are never recomputed: the front end has no rule of its own", () => {
  assert.equal(nf.nonfiniteOrigins, undefined);
  // summaries full of NaN but no stored record: no origin
  const m = smallModel();
  m.probes = [{ id: "p0", name: "a", leaf: "", node: "n4", auto: true, summaries: { primal: bad } }];
  assert.equal(storedOrigins(m, null), null);
});

const record = {
  step: 7,
  forward: { node: "n2", reaching: null, candidates: [], equation: { node: "n4", primitive: "tanh", label: "tanh", source: null, reaching: null }, message: "first made by `tanh` in `layer_0`" },
  backward: null,
  propagators: ["n8", "n9"],
  expected: [],
  removed: false,
  alarm: true,
  message: "forward pass: first made by `tanh` in `layer_0`",
};

test("the stored record is read from the model, else from the Monitor history", () => {
  const m = smallModel();
  m.nonfinite = record;
  const o = storedOrigins(m, { nonfinite: { step: 3, forward: "n8", backward: null } });
  assert.equal(o.step, 7);
  assert.equal(o.forward.message, record.forward.message);
  assert.deepEqual(originNodes(o.forward), ["n2", "n4"]);
  // a history in the older form (bare node ids)
  const h = storedOrigins(smallModel(), { nonfinite: { step: 3, forward: "n8", backward: null } });
  assert.equal(h.step, 3);
  assert.deepEqual(h.forward, { node: "n8", reaching: null, equation: null, message: null });
  assert.equal(h.backward, null);
  assert.deepEqual(h.propagators, []);
});

test("roles: the producer and the stages holding it beat propagators; collapsed stages show what they hide", () => {
  const m = smallModel();
  const ix = indexModel(m);
  const roles = nonfiniteRoles(storedOrigins({ nonfinite: record }, null), ix);
  assert.equal(roles.get("n4"), "producer"); // the equation
  assert.equal(roles.get("n2"), "producer"); // its stage
  assert.equal(roles.get("n0"), "producer"); // the root holds it too
  assert.equal(roles.get("n8"), "propagator");
  assert.equal(roles.get("n7"), "propagator"); // the scan holding a propagator
  assert.equal(roles.get("n6"), "propagator");
  assert.equal(roles.get("n9"), "propagator");
  assert.equal(roles.get("n3"), undefined);
  assert.equal(roles.get("n1"), undefined);
});

test("roles: expected values rank below propagators", () => {
  const ix = indexModel(smallModel());
  const rec = { ...record, forward: null, propagators: ["n8"], expected: ["n3", "n7"] };
  const roles = nonfiniteRoles(storedOrigins({ nonfinite: rec }, null), ix);
  assert.equal(roles.get("n3"), "expected");
  assert.equal(roles.get("n2"), "expected");
  assert.equal(roles.get("n7"), "propagator"); // holds the propagator n8
});

test("no record, no roles", () => {
  assert.equal(nonfiniteRoles(null, indexModel(smallModel())).size, 0);
});

test("a backward origin with no known making stage points at the node it reached", () => {
  assert.deepEqual(originNodes({ node: null, reaching: "n6", equation: null }), ["n6"]);
  assert.deepEqual(originNodes({ node: "n2", reaching: "n1", equation: { node: "n4" } }), ["n2", "n4"]);
  assert.deepEqual(originNodes(null), []);
});

test("messages show names in backticks as code", () => {
  const parts = nf.messageParts("first made by `rsqrt` in `norm` at m.py:3");
  assert.deepEqual(parts, [
    { code: false, text: "first made by " }, { code: true, text: "rsqrt" },
    { code: false, text: " in " }, { code: true, text: "norm" }, { code: false, text: " at m.py:3" },
  ]);
  assert.deepEqual(nf.messageParts(null), []);
});

test("a Monitor's origins are flagged on the step that had them only", () => {
  assert.equal(nf.originsOnStep(null, null), true); // an Inspection
  assert.equal(nf.originsOnStep(null, 19), true);
  assert.equal(nf.originsOnStep(7, 7), true);
  assert.equal(nf.originsOnStep(7, 5), false); // before the NaN
  assert.equal(nf.originsOnStep(7, 19), false); // a later step: finite, or NaN for other reasons
  assert.equal(nf.originsOnStep(7, null), true); // no recorded step to tell: as drawn
});
