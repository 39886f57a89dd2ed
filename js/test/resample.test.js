import { test } from "node:test";
import assert from "node:assert/strict";
import { binOf, commonGrid, histogramHeatmap, resampleHistogram } from "../src/resample.js";

const close = (a, b) => {
  assert.equal(a.length, b.length, `length ${a.length} vs ${b.length}`);
  a.forEach((v, i) => assert.ok(Math.abs(v - b[i]) < 1e-9, `${i}: ${v} vs ${b[i]}`));
};

test("resampling onto the same grid is the identity", () => {
  close(resampleHistogram([0, 1, 2, 3], [5, 0, 7], [0, 1, 2, 3]), [5, 0, 7]);
});

test("resampling splits a bin by overlap and conserves mass", () => {
  // one bin [0, 2) with 10 values onto [0, 0.5, 1, 1.5, 2]
  close(resampleHistogram([0, 2], [10], [0, 0.5, 1, 1.5, 2]), [2.5, 2.5, 2.5, 2.5]);
  // two bins onto a coarser, shifted grid
  const out = resampleHistogram([0, 1, 2], [4, 8], [-1, 0.5, 3]);
  close(out, [2, 10]);
  assert.equal(out.reduce((a, b) => a + b), 12);
});

test("a zero-width bin (constant array) lands in one grid bin", () => {
  close(resampleHistogram([1, 1], [7], [0, 0.5, 1.5, 2]), [0, 7, 0]);
});

test("mass outside the grid is dropped", () => {
  close(resampleHistogram([0, 10], [10], [0, 5]), [5]);
});

test("binOf is closed on the right end", () => {
  const g = [0, 1, 2];
  assert.equal(binOf(g, 0), 0);
  assert.equal(binOf(g, 1), 1);
  assert.equal(binOf(g, 2), 1);
  assert.equal(binOf(g, 2.1), -1);
});

test("common grid spans all steps; heatmap columns are normalised", () => {
  const a = { edges: [0, 1], counts: [4] };
  const b = { edges: [1, 3], counts: [2] };
  assert.deepEqual(commonGrid([a, null, b], 3), [0, 1, 2, 3]);
  const hm = histogramHeatmap([a, null, b], 3);
  assert.deepEqual(hm.centers, [0.5, 1.5, 2.5]);
  assert.deepEqual(hm.z.map((row) => row[0]), [1, 0, 0]);
  assert.deepEqual(hm.z.map((row) => row[1]), [null, null, null]);
  assert.deepEqual(hm.z.map((row) => row[2]), [0, 0.5, 0.5]);
  assert.equal(commonGrid([null, { edges: [] }]), null);
});
