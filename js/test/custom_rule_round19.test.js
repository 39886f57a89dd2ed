import { test } from "node:test";
import assert from "node:assert/strict";
import { noCotangentNote } from "../src/detail.js";

const summary = { dtype: "float32", l2: 1 };
const model = { modes: ["primal", "cotangent"] };

test("a value inside a custom_vjp names the rule, its line and the stage showing the gradient", () => {
  const probe = {
    node: "vf",
    summaries: { primal: summary },
    no_cotangent: "custom_rule",
    custom_rule: { kind: "custom_vjp", function: "fn_wrapped", source: { file: "equinox/_ad.py", line: 1001 } },
  };
  const nodes = new Map([
    ["root", { label: "loss", parent: null }],
    ["solve", { label: "diffeqsolve", parent: "root" }],
    ["loop", { label: "while(body_fun)", parent: "solve" }],
    ["vf", { label: "vector_field: Func", parent: "loop" }],
  ]);
  const probesByNode = new Map([
    ["loop", [{ summaries: { primal: summary } }]],
    ["solve", [{ summaries: { primal: summary, cotangent: summary } }]],
  ]);
  const note = noCotangentNote(model, probe, { nodes, probesByNode });
  assert.match(note, /inside the `jax\.custom_vjp` function `fn_wrapped` \(equinox\/_ad\.py:1001\)/);
  assert.match(note, /the gradient is seen at diffeqsolve/);
  assert.doesNotMatch(note, /does not depend/);
  // no index, no function known: still the rule, nothing invented
  const bare = noCotangentNote(model, { ...probe, custom_rule: { kind: "custom_jvp", function: null, source: null } });
  assert.match(bare, /inside the `jax\.custom_jvp` function, whose gradient/);
  assert.doesNotMatch(bare, /seen at/);
});
