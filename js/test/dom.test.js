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

test("a function's line, a reuse index or a stack's count survives the cut", () => {
  assert.equal(ellipsis("neg_log_marginal_likelihood:31", 16), "neg_log_marg…:31");
  assert.equal(ellipsis("neg_log_marginal_likelihood:33", 16), "neg_log_marg…:33");
  assert.equal(ellipsis("scale_by_adam_critic#2", 12), "scale_by_…#2");
  assert.equal(ellipsis("tree_bias_correction (×2)", 16), "tree_bias_… (×2)");
});
