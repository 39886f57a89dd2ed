import { test } from "node:test";
import assert from "node:assert/strict";
import { codeSpans } from "../src/dom.js";
import { noCotangentNote } from "../src/detail.js";

test("a stopped note's backticked names are code spans, everything else plain text", () => {
  const probe = {
    summaries: { primal: { dtype: "float32" } },
    no_cotangent: "stopped",
    stopped_by: { primitive: "stop_gradient", source: { file: "dqn.py", line: 17 } },
  };
  const parts = codeSpans(noCotangentNote({ modes: ["primal", "cotangent"] }, probe));
  assert.deepEqual(parts.filter((p) => p.code).map((p) => p.text), ["jax.lax.stop_gradient"]);
  assert.equal(parts[0].text, "No cotangent: gradient stopped by ");
  assert.match(parts[2].text, /^ at dqn\.py:17: it depends/);
  // the parts put together are the message without its backticks
  assert.equal(parts.map((p) => p.text).join(""), "No cotangent: gradient stopped by jax.lax.stop_gradient at dqn.py:17: it depends on the differentiated arguments; its cotangent is cut by design.");
});

test("markup in a span stays text; a lone backtick stays as written", () => {
  assert.deepEqual(codeSpans("by `<b>x</b>` at a<i>.py"), [
    { code: false, text: "by " },
    { code: true, text: "<b>x</b>" },
    { code: false, text: " at a<i>.py" },
  ]);
  assert.deepEqual(codeSpans("a ` b"), [{ code: false, text: "a ` b" }]);
  assert.deepEqual(codeSpans("`a``b`"), [{ code: true, text: "a" }, { code: true, text: "b" }]);
  assert.deepEqual(codeSpans(""), []);
});
