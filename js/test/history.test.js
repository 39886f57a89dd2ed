import { test } from "node:test";
import assert from "node:assert/strict";
import { appendStep, copyHistory, emptyHistory, HistoryStore, latestSummaries, nonfiniteCount, nonfiniteSteps, probeNonfiniteSteps, shownStep, stepAt, withLatest, withStep } from "../src/history.js";
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

test("a model arriving after newer steps keeps them (decoding it took longer than a step)", () => {
  // The Monitor sent a model holding steps 0-1, then steps 2 and 3; the steps were
  // decoded and pushed first. Resetting to the model dropped them.
  const store = new HistoryStore({ steps: [0], loss: [1], probes: { p0: { primal: [{ l2: 1 }] } } });
  store.push({ step: 1, loss: 0.9, probes: { p0: { primal: { l2: 2 } } } });
  store.push({ step: 2, loss: 0.8, finite: true, probes: { p0: { primal: { l2: 3 } } } });
  store.push({ step: 3, loss: null, finite: false, probes: { p1: { cotangent: { l2: 4 } } }, nonfinite: { forward: "n4", backward: null } });
  store.reset({ steps: [0, 1], loss: [1, 0.9], finite: [true, true], probes: { p0: { primal: [{ l2: 1 }, { l2: 2 }] } }, nonfinite: null });
  const h = store.history;
  assert.deepEqual(h.steps, [0, 1, 2, 3]);
  assert.deepEqual(h.loss, [1, 0.9, 0.8, null]);
  assert.deepEqual(h.finite, [true, true, true, false]);
  assert.deepEqual(h.probes.p0.primal.map((s) => s?.l2 ?? null), [1, 2, 3, null]);
  assert.deepEqual(h.probes.p1.cotangent.map((s) => s?.l2 ?? null), [null, null, null, 4]);
  assert.deepEqual(h.nonfinite, { step: 3, forward: "n4", backward: null });
  // a model that already holds those steps replaces them, once each
  store.reset({ steps: [0, 1, 2, 3], loss: [1, 0.9, 0.7, 0.6], probes: {} });
  assert.deepEqual(store.history.steps, [0, 1, 2, 3]);
  assert.deepEqual(store.history.loss, [1, 0.9, 0.7, 0.6]);
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

test("non-finite steps come from the finite flags, kept aligned past the limit", () => {
  const h = emptyHistory(4);
  const losses = [1, 0.5, null, null, 0.25, null];
  losses.forEach((loss, i) => appendStep(h, { step: i * 10, loss, finite: loss != null, probes: {} }));
  assert.deepEqual(h.steps, [20, 30, 40, 50]);
  assert.deepEqual(h.finite, [false, false, true, false]);
  assert.deepEqual(nonfiniteSteps(h), [20, 30, 50]);
  // a NaN gradient under a finite loss: only the flag knows
  appendStep(h, { step: 60, loss: 0.1, finite: false, probes: {} });
  assert.deepEqual(nonfiniteSteps(h), [30, 50, 60]);
});

test("without flags (an older model), a null loss among numbers is a non-finite step", () => {
  const h = copyHistory({ steps: [0, 1, 2], loss: [1, null, 2], probes: {} });
  assert.deepEqual(h.finite, [null, null, null]);
  assert.deepEqual(nonfiniteSteps(h), [1]);
  // a program without a scalar loss: nulls everywhere mean nothing
  assert.deepEqual(nonfiniteSteps(copyHistory({ steps: [0, 1], loss: [null, null], probes: {} })), []);
});

test("a probe's non-finite steps count NaN, +Inf and −Inf", () => {
  const list = [{ nan: 0, posinf: 0, neginf: 0 }, { nan: 2 }, null, { neginf: 1 }, { posinf: 0 }];
  assert.deepEqual(probeNonfiniteSteps([5, 6, 7, 8, 9], list), [6, 8]);
});

test("withStep draws a past step's statistics, without the latest's log histogram", () => {
  const m = smallModel();
  const h = emptyHistory();
  appendStep(h, { step: 0, loss: 1, probes: { p0: { primal: { l2: 5, nan: 0 } } } });
  appendStep(h, { step: 10, loss: null, finite: false, probes: { p0: { primal: { l2: 7, nan: 3 } } } });
  appendStep(h, { step: 20, loss: 2, probes: {} });
  const past = withStep(m, h, 10).probes[0].summaries.primal;
  assert.equal(past.l2, 7);
  assert.equal(past.nan, 3);
  assert.deepEqual(past.shape, [4]);
  assert.equal(past.loghist, null);
  // step 20 holds no summary of p0: no data, not step 10's or the model's
  assert.deepEqual(withStep(m, h, 20).probes[0].summaries, m.probes[0].summaries);
  assert.deepEqual(withStep(m, h, 0).probes[0].summaries.primal.l2, 5);
  // a step the history no longer holds (thinned), or none: the latest
  assert.equal(shownStep(h, 10), 10);
  assert.equal(shownStep(h, 20), null);
  assert.equal(shownStep(h, 15), null);
  assert.equal(shownStep(h, null), null);
  assert.equal(m.probes[0].summaries.primal.l2, 2);
});

test("a step is drawn with the shapes of the program it ran (a ragged last batch ran another)", () => {
  const m = smallModel(); // its graph and probes: the latest program's, float32[4]
  m.programs = [
    { nodes: { n2: ["float32[16]"], n5: ["float32[16]"] }, probes: { p0: { shape: [16], size: 16 } } },
    { nodes: { n2: ["float32[4]"], n5: ["float32[4]"] }, probes: { p0: { shape: [4], size: 4 } } },
  ];
  const h = copyHistory({ steps: [0, 1], loss: [1, 2], program: [0, 1], probes: { p0: { primal: [{ l2: 5, count: 16 }, { l2: 6, count: 4 }], cotangent: [{ l2: 1 }, { l2: 2 }] } } });
  const past = withStep(m, h, 0);
  assert.deepEqual(past.nodes.find((n) => n.id === "n5").shapes, ["float32[16]"]);
  assert.deepEqual(past.nodes.find((n) => n.id === "n3").shapes, ["float32[4]"]); // not in the program: as drawn
  for (const mode of ["primal", "cotangent"]) {
    assert.deepEqual(past.probes[0].summaries[mode].shape, [16]);
    assert.equal(past.probes[0].summaries[mode].size, 16);
  }
  assert.equal(past.probes[0].summaries.primal.count, 16);
  const latest = withStep(m, h, null);
  assert.deepEqual(latest.nodes.find((n) => n.id === "n5").shapes, ["float32[4]"]);
  assert.equal(latest.probes[0].summaries.primal.size, 4);
  assert.deepEqual(m.nodes.find((n) => n.id === "n5").shapes, ["float32[4]"]); // the model is not changed
  // appended steps and the store's reset carry the program
  appendStep(h, { step: 2, loss: 1, program: 0, probes: {} });
  assert.deepEqual(h.program, [0, 1, 0]);
  assert.equal(stepAt(h, 2).program, 0);
  assert.deepEqual(withStep(m, h, 2).nodes.find((n) => n.id === "n2").shapes, ["float32[16]"]);
  // an older model (no programs) or a step that names none: the model's own shapes
  const old = smallModel();
  assert.deepEqual(withStep(old, h, 0).probes[0].summaries.primal.shape, [4]);
  assert.deepEqual(withStep(m, copyHistory({ steps: [0, 1], loss: [1, 2], probes: {} }), 0).nodes, m.nodes);
});

test("every non-finite step the Monitor found counts, recorded or not (runs of steps)", () => {
  // every=5: steps 0, 5, ... recorded; 17 re-run; 17..24 non-finite (20 recorded)
  const h = copyHistory({ steps: [15, 17, 20], loss: [1, null, null], finite: [true, false, false], probes: {}, nonfinite_steps: [[17, 24]], nonfinite_count: 8 });
  const bad = nonfiniteSteps(h);
  assert.deepEqual(bad, [17, 18, 19, 20, 21, 22, 23, 24]);
  assert.equal(nonfiniteCount(h, bad), 8);
  // an old model without the runs: the steps it holds
  const old = copyHistory({ steps: [15, 17, 20], loss: [1, null, null], finite: [true, false, false], probes: {} });
  assert.deepEqual(nonfiniteSteps(old), [17, 20]);
  assert.equal(nonfiniteCount(old, nonfiniteSteps(old)), 2);
});
