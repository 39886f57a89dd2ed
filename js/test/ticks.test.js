import { test } from "node:test";
import assert from "node:assert/strict";
import { logTicks, tickText } from "../src/ticks.js";

test("log ticks over several decades are powers of ten only", () => {
  const t = logTicks([0.0123, 0.5, 3.2, 47, 250]); // decades 0.1 … 100 in range
  assert.deepEqual(t.tickvals, [0.1, 1, 10, 100]);
  assert.deepEqual(t.ticktext, ["0.1", "1", "10", "100"]);
});

test("many decades are thinned, and read as 10ᵏ when any is long", () => {
  const t = logTicks([3e-9, 1, 5e3]); // twelve decades, 1e-8 … 1e3
  assert.deepEqual(t.ticktext, ["10⁻⁸", "10⁻⁵", "10⁻²", "10"]);
  [-8, -5, -2, 1].forEach((k, i) => assert.ok(Math.abs(Math.log10(t.tickvals[i]) - k) < 1e-12));
});

test("within a decade: 1-2-5 values in range, else the two ends; nulls and non-positives ignored", () => {
  assert.deepEqual(logTicks([null, -4, 0, 1.5, 7]).tickvals, [2, 5]);
  assert.deepEqual(logTicks([3.1, 3.9]).tickvals, [3.1, 3.9]);
  assert.deepEqual(logTicks([4.2]).tickvals, [4.2]);
  assert.equal(logTicks([null, 0, -1]), null);
});

test("tick labels stay short", () => {
  assert.equal(tickText(0.002), "0.002");
  assert.equal(tickText(2e-5), "2×10⁻⁵");
  assert.equal(tickText(1e-5), "10⁻⁵");
  assert.equal(tickText(12345), "1.23×10⁴");
});

test("two ends that read alike at 3 digits get the digits that tell them apart", () => {
  const t = logTicks([0.35612, 0.35648]); // a loss over two steps
  assert.deepEqual(t.ticktext, ["0.3561", "0.3565"]);
  assert.equal(new Set(logTicks([0.3561201, 0.3561202]).ticktext).size, 2);
  assert.deepEqual(logTicks([0.5, 0.5]).ticktext, ["0.5"]);
});
