import { test } from "node:test";
import assert from "node:assert/strict";
import { appendStep, copyHistory, emptyHistory, HistoryStore, lossSeries, nearestStep } from "../src/history.js";

test("unrecorded steps' losses join the every-step series, not the recorded steps", () => {
  const h = emptyHistory();
  appendStep(h, { step: 0, loss: 3, probes: {} });
  appendStep(h, { kind: "losses", steps: [1, 2, 3], loss: [2.5, null, 2] });
  appendStep(h, { step: 4, loss: 1.5, probes: {} });
  assert.deepEqual(h.steps, [0, 4]);
  assert.deepEqual(lossSeries(h), { steps: [0, 1, 2, 3, 4], loss: [3, 2.5, null, 2, 1.5], limit: 2000 });
  appendStep(h, { kind: "losses", steps: [3, 5], loss: [9, 1] }); // step 3 again: dropped
  assert.deepEqual(h.losses.steps, [0, 1, 2, 3, 4, 5]);
  assert.equal(nearestStep(h, 3), 4);
  assert.equal(nearestStep(h, 1), 0);
});

test("an older model without `losses` charts the recorded steps", () => {
  const h = copyHistory({ steps: [0, 10], loss: [2, 1], probes: {} });
  assert.equal(h.losses, null);
  assert.deepEqual(lossSeries(h), { steps: [0, 10], loss: [2, 1] });
});

test("the series is thinned past its limit, keeping its first and newest points", () => {
  const h = copyHistory({ steps: [], loss: [], probes: {}, losses: { steps: [], loss: [], limit: 8 } });
  appendStep(h, { kind: "losses", steps: [...Array(20).keys()], loss: [...Array(20).keys()] });
  assert.ok(h.losses.steps.length <= 8);
  assert.equal(h.losses.steps[0], 0);
  assert.equal(h.losses.steps.at(-1), 19);
});

test("a model reset keeps the losses that arrived while it travelled", () => {
  const store = new HistoryStore({ steps: [0], loss: [1], probes: {}, losses: { steps: [0], loss: [1] } });
  store.push({ kind: "losses", steps: [1, 2], loss: [0.9, 0.8] });
  store.reset({ steps: [0], loss: [1], probes: {}, losses: { steps: [0, 1], loss: [1, 0.9] } });
  assert.deepEqual(store.history.losses.steps, [0, 1, 2]);
});
