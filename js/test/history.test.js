import { test } from "node:test";
import assert from "node:assert/strict";
import { appendStep, copyHistory, emptyHistory, HistoryStore, latestSummaries, withLatest } from "../src/history.js";
import { smallModel } from "./helpers.js";

test("steps append aligned; a probe missing from a step gets null", () => {
  const h = emptyHistory();
  appendStep(h, { step: 0, loss: 2, probes: { p0: { primal: { l2: 1 } } } });
  appendStep(h, { step: 1, loss: 1.5, probes: { p1: { cotangent: { l2: 3 } } } });
  assert.deepEqual(h.steps, [0, 1]);
  assert.deepEqual(h.loss, [2, 1.5]);
  assert.deepEqual(h.probes.p0.primal, [{ l2: 1 }, null]);
  assert.deepEqual(h.probes.p1.cotangent, [null, { l2: 3 }]);
  assert.deepEqual(latestSummaries(h), { p1: { cotangent: { l2: 3 } } });
});

test("the oldest steps are dropped past the limit", () => {
  const h = emptyHistory(2);
  for (let i = 0; i < 5; i++) appendStep(h, { step: i, loss: i, probes: { p0: { primal: { l2: i } } } });
  assert.deepEqual(h.steps, [3, 4]);
  assert.deepEqual(h.probes.p0.primal.map((s) => s.l2), [3, 4]);
});

test("the first non-finite step is kept", () => {
  const h = emptyHistory();
  appendStep(h, { step: 7, loss: null, probes: {}, nonfinite: { forward: "n4", backward: null } });
  appendStep(h, { step: 8, loss: null, probes: {}, nonfinite: { forward: "n2", backward: "n9" } });
  assert.deepEqual(h.nonfinite, { step: 7, forward: "n4", backward: null });
});

test("copies do not share arrays with the model; the store notifies", () => {
  const src = { steps: [0], loss: [1], probes: { p0: { primal: [{ l2: 1 }] } }, nonfinite: null };
  const store = new HistoryStore(src);
  let calls = 0;
  store.subscribe(() => calls++);
  store.push({ step: 1, loss: 0.5, probes: { p0: { primal: { l2: 2 } } } });
  assert.equal(calls, 1);
  assert.deepEqual(src.steps, [0]);
  assert.deepEqual(src.probes.p0.primal.length, 1);
  assert.deepEqual(copyHistory(null).steps, []);
});

test("withLatest overlays statistics but keeps shape and loghist", () => {
  const m = smallModel();
  const h = emptyHistory();
  appendStep(h, { step: 0, loss: 1, probes: { p0: { primal: { l2: 99, nan: 1 } } } });
  const m2 = withLatest(m, h);
  const s = m2.probes[0].summaries.primal;
  assert.equal(s.l2, 99);
  assert.equal(s.nan, 1);
  assert.deepEqual(s.shape, [4]);
  assert.ok(s.loghist);
  assert.equal(m.probes[0].summaries.primal.l2, 2);
});
