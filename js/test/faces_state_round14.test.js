// Round 14: a module's call that writes its variables (a Flax NNX BatchNorm's running
// statistics, leaves `['mean (new)']`, graph/saved.py `NEW`) keeps them apart from what
// the call returns: the face shows its activation, as for a stage of one output.
import { test } from "node:test";
import assert from "node:assert/strict";
import { indexModel } from "../src/model.js";
import { computeFaces, ownOutputs } from "../src/faces.js";
import { summary } from "./helpers.js";

const BN = {
  id: "n1", label: "bn", shapes: ["float32[16,8]"],
  outputs: [
    { leaf: "['output']", summaries: { primal: summary({ shape: [16, 8], l2: 11 }) } },
    { leaf: "['mean (new)']", summaries: { primal: summary({ shape: [8], l2: 0.25 }) } },
    { leaf: "['var (new)']", summaries: { primal: summary({ shape: [8], l2: 3 }) } },
  ],
};

function stagesModel(stages) {
  const nodes = [{ id: "n0", label: "prog", kind: "jit", parent: null, order: 0, source: null, shapes: [], primitive: null, n_eqns: 0, collapsed: false }];
  const probes = [];
  stages.forEach(({ id, label, shapes, outputs }, i) => {
    nodes.push({ id, label, kind: "scope", parent: "n0", order: i + 1, source: null, shapes, primitive: null, n_eqns: 8, collapsed: true });
    outputs.forEach((o, j) => probes.push({ id: `${id}p${j}`, name: label, leaf: o.leaf, node: id, auto: true, summaries: o.summaries }));
  });
  return { version: 1, title: "t", root: "n0", mode: "primal", nodes, edges: [], probes, notes: [] };
}

test("a stage's state writes are not its outputs: its face is its activation's", () => {
  const ix = indexModel(stagesModel([BN]));
  const face = computeFaces(ix, ["n1"], { mode: "primal", stat: "l2" }).faces.get("n1");
  // not "output ‖x‖₂ = 11" beside a tooltip of three outputs
  assert.equal(face.text, "‖x‖₂ = 11");
  assert.equal(face.outputs, null);
  assert.deepEqual(ownOutputs(ix.probesByNode.get("n1")).map((p) => p.leaf), ["['output']"]);
  // a stage whose only values are state it writes keeps them
  const only = [{ leaf: "['mean (new)']" }, { leaf: "['var (new)']" }];
  assert.equal(ownOutputs(only).length, 2);
});
