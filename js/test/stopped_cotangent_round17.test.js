import { test } from "node:test";
import assert from "node:assert/strict";
import { noCotangentNote, stoppedByText } from "../src/detail.js";

const summary = { dtype: "float32", l2: 1 };
const model = { modes: ["primal", "cotangent"] };

test("a stop_gradient'ed target's note names the cut and its line, not independence", () => {
  const probe = {
    summaries: { primal: summary },
    no_cotangent: "stopped",
    stopped_by: { primitive: "stop_gradient", source: { file: "dqn.py", line: 17, function: "dqn_loss" } },
  };
  const note = noCotangentNote(model, probe);
  assert.match(note, /gradient stopped by `jax\.lax\.stop_gradient` at dqn\.py:17/);
  assert.match(note, /depends on the differentiated arguments/);
  assert.doesNotMatch(note, /does not depend/);
  // another cut by its primitive's name; no line known: none said
  assert.equal(stoppedByText({ primitive: "floor", source: null }), "`floor`");
  // an older model's "independent" keeps its words
  assert.match(noCotangentNote(model, { summaries: { primal: summary }, no_cotangent: "independent" }), /does not depend/);
});
