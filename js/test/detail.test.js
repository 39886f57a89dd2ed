import { test } from "node:test";
import assert from "node:assert/strict";
import { leafLabel } from "../src/detail.js";

test("a probe's leaf reads as the path a user writes", () => {
  assert.equal(leafLabel("['vector_add.normed_result']"), "vector_add.normed_result");
  assert.equal(leafLabel("['a']['b'][0]"), "a.b[0]");
  assert.equal(leafLabel("[1]"), "[1]");
});

test("the panel's header says where a stage sits by its names, never by internal ids", async () => {
  const { placeOf } = await import("../src/detail.js");
  const { indexModel } = await import("../src/model.js");
  const { smallModel } = await import("./helpers.js");
  const ix = indexModel(smallModel());
  assert.equal(placeOf(ix, "n4"), "in layer_0");
  assert.equal(placeOf(ix, "n8"), "in layer_1 › loop");
  assert.equal(placeOf(ix, "n2"), ""); // at the top level: nothing to say
  for (const id of ["n4", "n8"]) assert.doesNotMatch(placeOf(ix, id), /\bn\d+\b/);
});

test("an equation no probe saw points to the stage holding it that carries values", async () => {
  const { carrierOf } = await import("../src/detail.js");
  const { indexModel } = await import("../src/model.js");
  const { smallModel } = await import("./helpers.js");
  const ix = indexModel(smallModel());
  assert.equal(carrierOf(ix, "n8"), "n6"); // `mul` in layer_1's loop: layer_1 is probed
  assert.equal(carrierOf(ix, "n3"), null); // layer_0 carries no values itself
  assert.equal(carrierOf(ix, "n6"), null); // a stage, not an equation
});
