import { test } from "node:test";
import assert from "node:assert/strict";
import { noCotangentNote } from "../src/detail.js";

const summary = { dtype: "float32", l2: 1 };
const model = { modes: ["primal", "cotangent"] };

test("a sow's outer gradient under a derivative the program takes itself is a cotangent", () => {
  // `jax.jvp(jax.grad(f))` inside the loss: the sown value's gradient is `primal.cotangent`
  const nested = { summaries: { primal: summary, "primal.cotangent": summary, tangent: summary } };
  assert.equal(noCotangentNote(model, nested), "");
  assert.equal(noCotangentNote(model, { summaries: { primal: summary, cotangent: summary } }), "");
  // with none at any level the panel still says why
  assert.match(noCotangentNote(model, { summaries: { primal: summary, tangent: summary } }), /^No cotangent/);
});
