import { test } from "node:test";
import assert from "node:assert/strict";
import { indexModel } from "../src/model.js";
import { parseQuery, searchNodes } from "../src/search.js";
import { smallModel, summary } from "./helpers.js";

test("query parsing", () => {
  assert.deepEqual(parseQuery("  Layer kind:SCAN is:nan "), [
    { field: "text", value: "layer" }, { field: "kind", value: "scan" }, { field: "is", value: "nan" },
  ]);
  assert.deepEqual(parseQuery(""), []);
});

test("matches label, kind, primitive and probe name, case-insensitively", () => {
  const ix = indexModel(smallModel());
  assert.deepEqual(searchNodes(ix, "LAYER"), ["n2", "n6"]);
  assert.deepEqual(searchNodes(ix, "kind:scan"), ["n7"]);
  assert.deepEqual(searchNodes(ix, "dot_"), ["n3"]);
  assert.deepEqual(searchNodes(ix, "h0"), ["n5"]); // the sow's label and its probe's name
  assert.deepEqual(searchNodes(ix, "scope layer_1"), ["n6"]); // every term must match
  assert.deepEqual(searchNodes(ix, "prog"), []); // the root is never a match
  assert.deepEqual(searchNodes(ix, ""), []);
});

test("is:probe and is:nonfinite", () => {
  const m = smallModel();
  m.probes[1].summaries.cotangent = summary({ neginf: 1 });
  const ix = indexModel(m);
  assert.deepEqual(searchNodes(ix, "is:probe"), ["n5", "n6"]);
  assert.deepEqual(searchNodes(ix, "is:nonfinite"), ["n6"]);
});

test("injection strings are plain text to search", () => {
  const m = smallModel();
  m.nodes[5].label = "<img src=x onerror=alert(1)>";
  const ix = indexModel(m);
  assert.deepEqual(searchNodes(ix, "<img"), ["n5"]);
});
