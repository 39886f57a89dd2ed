import { test } from "node:test";
import assert from "node:assert/strict";
import { ellipsis } from "../src/dom.js";

test("a short label is left whole", () => {
  assert.equal(ellipsis("loss:35", 15), "loss:35");
});

test("a long path keeps its last part, so like names stay apart", () => {
  const mean = ellipsis("aux.BatchNorm_0.mean", 15);
  const vr = ellipsis("aux.BatchNorm_0.var", 15);
  assert.equal(mean, "aux.Batch….mean");
  assert.equal(vr, "aux.BatchN….var");
  assert.equal(mean.length, 15);
  assert.equal(ellipsis("parameters/block_1/dense/kernel", 16), "paramete…/kernel");
});

test("a label without a short last part is cut at its end", () => {
  assert.equal(ellipsis("layers[0]: Conv2d with a long name", 12), "layers[0]: …");
  assert.equal(ellipsis("x.averyveryverylongleafname", 10), "x.averyve…");
});
