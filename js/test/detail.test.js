import { test } from "node:test";
import assert from "node:assert/strict";
import { leafLabel } from "../src/detail.js";

test("a probe's leaf reads as the path a user writes", () => {
  assert.equal(leafLabel("['vector_add.normed_result']"), "vector_add.normed_result");
  assert.equal(leafLabel("['a']['b'][0]"), "a.b[0]");
  assert.equal(leafLabel("[1]"), "[1]");
});
