import { test } from "node:test";
import assert from "node:assert/strict";
import { hasSigned, signedLog } from "../src/loghist.js";
import { needsLocate } from "../src/banner.js";
import { storedOrigins } from "../src/nonfinite.js";
import { indexModel } from "../src/model.js";
import { smallModel } from "./helpers.js";

// Values whose signs and magnitudes are known: log10|x| bins [-2,-1), [-1,0), [0,1), [1,2].
const VALUES = [0.05, -0.02, -0.5, 0.3, 0.7, -3, 4, 5, -60, 70, 0, 0.001, -0.002];
const EDGES = [-2, -1, 0, 1, 2];

function loghistOf(values) {
  const counts = [0, 0, 0, 0];
  const neg = [0, 0, 0, 0];
  let under = 0;
  let underNeg = 0;
  for (const v of values) {
    if (v === 0) continue;
    const l = Math.log10(Math.abs(v));
    if (l < EDGES[0]) { under++; if (v < 0) underNeg++; continue; }
    const i = Math.min(3, Math.floor(l - EDGES[0]));
    counts[i]++;
    if (v < 0) neg[i]++;
  }
  return { edges: EDGES, counts, neg, under, under_neg: underNeg };
}

test("signed log splits each bin into positive and negative counts", () => {
  const sl = signedLog(loghistOf(VALUES));
  assert.deepEqual(sl.x, [-1.5, -0.5, 0.5, 1.5]);
  assert.deepEqual(sl.width, [1, 1, 1, 1]);
  // by hand: [-2,-1): 0.05, -0.02 ; [-1,0): -0.5, 0.3, 0.7 ; [0,1): -3, 4, 5 ; [1,2]: -60, 70
  assert.deepEqual(sl.pos, [1, 2, 2, 1]);
  assert.deepEqual(sl.neg, [1, 1, 1, 1]);
  assert.equal(sl.underPos, 1); // 0.001
  assert.equal(sl.underNeg, 1); // -0.002
  const nonzero = VALUES.filter((v) => v !== 0);
  const total = sl.pos.reduce((a, b) => a + b) + sl.neg.reduce((a, b) => a + b) + sl.underPos + sl.underNeg;
  assert.equal(total, nonzero.length);
});

test("a loghist without `neg` has no signed view", () => {
  assert.equal(hasSigned({ edges: EDGES, counts: [1, 2, 3, 4] }), false);
  assert.equal(signedLog({ edges: EDGES, counts: [1, 2, 3, 4] }), null);
  assert.equal(hasSigned({ edges: EDGES, counts: [1, 2, 3, 4], neg: [0, 1] }), false); // wrong length
  assert.equal(hasSigned(null), false);
});

test("negative counts are clamped into [0, count]", () => {
  const sl = signedLog({ edges: [0, 1, 2], counts: [3, 2], neg: [5, -1] });
  assert.deepEqual(sl.neg, [3, 0]);
  assert.deepEqual(sl.pos, [0, 2]);
});

function withOrigin(forward, nEqns) {
  const model = smallModel();
  model.nodes.find((n) => n.id === "n2").n_eqns = nEqns;
  model.nonfinite = { step: null, forward, backward: null, propagators: [], expected: [], removed: false, alarm: true, message: "" };
  return { rec: storedOrigins(model, null), index: indexModel(model) };
}

test("the locate button is offered for an unlocated origin stage with several equations", () => {
  let { rec, index } = withOrigin({ node: "n2", equation: null, message: "first made by `layer_0`" }, 3);
  assert.equal(needsLocate(rec, index), true);
  ({ rec, index } = withOrigin({ node: "n2", equation: { node: "n4", primitive: "tanh" }, message: "" }, 3));
  assert.equal(needsLocate(rec, index), false); // already located
  ({ rec, index } = withOrigin({ node: "n2", equation: null, message: "" }, 1));
  assert.equal(needsLocate(rec, index), false); // one equation: the stage is the equation
  assert.equal(needsLocate(null, index), false);
});

test("no locate button on a Monitor step's record that raised no alarm", () => {
  const model = smallModel();
  model.nodes.find((n) => n.id === "n2").n_eqns = 3;
  const forward = { node: "n2", equation: null, message: "first made by `where`" };
  const quiet = (step) => ({ step, forward, backward: null, propagators: [], expected: [], removed: true, alarm: false, message: "" });
  // inspect's no-alarm record (no step) can be located by re-running its one call
  model.nonfinite = quiet(null);
  assert.equal(needsLocate(storedOrigins(model, null), indexModel(model)), true);
  // a Monitor's (step 3): its arguments are gone and its locate answers only alarms
  model.nonfinite = quiet(3);
  assert.equal(needsLocate(storedOrigins(model, null), indexModel(model)), false);
});

test("no locate button on a record whose locate re-ran the step and found no NaN/Inf", () => {
  // the record `Inspection.locate_nonfinite()` keeps when its re-run is finite (Python's
  // `kept_record`): the step's own origin, no equation, the alarm kept, and the flag
  const model = smallModel();
  model.nodes.find((n) => n.id === "n2").n_eqns = 3;
  const forward = { node: "n2", equation: null, message: "first made by `layer_0`; `locate_nonfinite()` re-ran the step with every equation probed and found no NaN/Inf reaching a result" };
  const kept = { step: null, forward, backward: null, propagators: [], expected: [], removed: false, alarm: true, located: false, message: forward.message };
  const index = indexModel(model);
  const rec = (extra) => storedOrigins({ ...model, nonfinite: { ...kept, ...extra } }, null);
  assert.equal(rec({ not_reproduced: true }).notReproduced, true);
  assert.equal(needsLocate(rec({ not_reproduced: true }), index), false);
  // before the locate (and a record from before the flag existed): the button
  assert.equal(rec({ not_reproduced: false }).notReproduced, false);
  assert.equal(needsLocate(rec({ not_reproduced: false }), index), true);
  assert.equal(needsLocate(rec({}), index), true);
});
