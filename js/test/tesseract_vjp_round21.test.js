import { test } from "node:test";
import assert from "node:assert/strict";
import { indexModel } from "../src/model.js";
import { tesseractVjpRows } from "../src/detail.js";
import { faceOutputs, ownOutputs } from "../src/faces.js";
import { summary } from "./helpers.js";

// `loss(x, a) = sum(solve(x, a) ** 2) + 0.1 sum(x ** 3) + 0.3 a ** 2` in mode grad: the
// Tesseract stage `solve` has its output `['y']` and, after it, its input fields'
// probes, whose cotangent is its own VJP (the values are `tesseract_vjp_round21`'s
// Python test's: ‖VJP_x‖₂ = 7.35 beside ‖dL/dx‖₂ = 7.50)
function model() {
  const node = (id, label, kind, parent, order, extra = {}) => ({ id, label, kind, parent, order, source: null, shapes: ["float32[5]"], primitive: null, n_eqns: 1, collapsed: true, ...extra });
  const probe = (id, name, leaf, nodeId, l2) => ({ id, name, leaf, node: nodeId, auto: true, summaries: { primal: summary(), cotangent: summary({ l2 }) } });
  return {
    schema: "sowviz/1", title: "t", mode: "grad", modes: ["primal", "cotangent"], device: "cpu",
    versions: { sowviz: "0.1.0" }, created: "2026-01-01T00:00:00Z", root: "n0",
    nodes: [
      node("n0", "loss", "jit", null, 0),
      node("n1", "x", "input", "n0", 1),
      node("n2", "a", "input", "n0", 2, { shapes: ["float32[]"] }),
      node("n3", "solve", "tesseract", "n0", 3, { port_names: { n1: "x", n2: "a" } }),
      node("n4", "out", "output", "n0", 4),
    ],
    edges: [{ source: "n1", target: "n3" }, { source: "n2", target: "n3" }, { source: "n3", target: "n4" }],
    probes: [
      probe("p0", "x", "", "n1", 7.4955),
      probe("p1", "a", "", "n2", 7.9),
      probe("p2", "solve", "['y']", "n3", 4.9),
      probe("p3", "solve", "['a (input)']", "n3", 7.0),
      probe("p4", "solve", "['x (input)']", "n3", 7.3485),
    ],
    notes: [],
  };
}

test("a Tesseract's input fields are no outputs of its face", () => {
  const ix = indexModel(model());
  const probes = ix.probesByNode.get("n3");
  assert.deepEqual(ownOutputs(probes).map((p) => p.leaf), ["['y']"]);
  assert.deepEqual(faceOutputs(probes, ix.nodes.get("n3"), "cotangent").map((p) => p.leaf), ["['y']"]);
});

test("the panel's rows: per input field its own VJP beside the value's total gradient", () => {
  const ix = indexModel(model());
  const rows = tesseractVjpRows(ix, ix.nodes.get("n3"));
  assert.deepEqual(rows, [
    { field: "a", from: "a", vjp: 7.0, total: 7.9 },
    { field: "x", from: "x", vjp: 7.3485, total: 7.4955 },
  ]);
  // primal mode: the probes hold no cotangent, there are no rows
  const m = model();
  for (const p of m.probes) delete p.summaries.cotangent;
  const ip = indexModel(m);
  assert.deepEqual(tesseractVjpRows(ip, ip.nodes.get("n3")), []);
});
