import { test } from "node:test";
import assert from "node:assert/strict";
import { indexModel } from "../src/model.js";
import { breakable, gradHistory, joinPath, paramRows, readRows, sortRows } from "../src/params.js";
import { iterationHist } from "../src/stats.js";
import { statSymbol, computeFaces, fitted } from "../src/faces.js";
import { summary } from "./helpers.js";

function paramsModel() {
  const node = (id, label, kind, parent, order) => ({ id, label, kind, parent, order, source: null, shapes: ["float32[4]"], primitive: null, n_eqns: 0, collapsed: kind === "scope" });
  const probe = (id, nodeId, value, grad) => ({ id, name: nodeId, leaf: "", node: nodeId, auto: true, summaries: { primal: summary({ l2: value }), cotangent: summary({ l2: grad }) } });
  return {
    schema: "sowviz/1", title: "t", mode: "grad", modes: ["primal", "cotangent"], device: "cpu", versions: {}, created: "", root: "n0",
    nodes: [
      node("n0", "prog", "jit", null, 0), node("n1", "parameters", "scope", "n0", 1),
      node("n2", "blocks[0]", "scope", "n1", 2), node("n3", "w", "input", "n2", 3), node("n4", "b", "input", "n2", 4),
      node("n5", "scale", "input", "n1", 5), node("n6", "x", "input", "n0", 6),
    ],
    edges: [],
    probes: [probe("p0", "n3", 4, 1e-3), probe("p1", "n4", 2, 1), { ...probe("p2", "n5", 1, 0.5), summaries: { primal: summary({ l2: 1 }) } }],
    notes: [], history: null,
  };
}

test("the parameter table lists every leaf below a group with its path and norms", () => {
  const ix = indexModel(paramsModel());
  const rows = paramRows(ix, "n1");
  assert.deepEqual(rows.map((r) => r.name), ["blocks[0].w", "blocks[0].b", "scale"]);
  assert.deepEqual(rows.map((r) => [r.value, r.grad]), [[4, 1e-3], [2, 1], [1, null]]);
  assert.equal(rows[0].ratio, 1e-3 / 4);
  assert.equal(rows[2].ratio, null); // no gradient: no ratio
  assert.deepEqual(paramRows(ix, "n2").map((r) => r.name), ["w", "b"]);
});

test("sorting puts missing values last in both directions", () => {
  const rows = paramRows(indexModel(paramsModel()), "n1");
  assert.deepEqual(sortRows(rows, "grad", -1).map((r) => r.name), ["blocks[0].b", "blocks[0].w", "scale"]);
  assert.deepEqual(sortRows(rows, "grad", 1).map((r) => r.name), ["blocks[0].w", "blocks[0].b", "scale"]);
  assert.deepEqual(sortRows(rows, "name", 1).map((r) => r.name), ["blocks[0].b", "blocks[0].w", "scale"]);
});

test("an iteration's histogram uses the pooled edges and its own counts", () => {
  const s = summary({ per_iteration: { iterations: 2, index: [0, 1], count: [1, 3], hist_counts: [[1, 0, 0, 0], [0, 2, 1, 0]], l2: [1, 2] } });
  assert.deepEqual(iterationHist(s, 1), { edges: s.hist.edges, counts: [0, 2, 1, 0] });
  assert.equal(iterationHist(s, 2), null);
  assert.equal(iterationHist(summary(), 0), null);
});

test("node values say what they are", () => {
  assert.equal(statSymbol("cotangent", "l2"), "‖grad‖₂");
  assert.equal(statSymbol("primal", "absmax"), "max|x|");
  const ix = indexModel(paramsModel());
  const { faces } = computeFaces(ix, ["n3"], { mode: "cotangent", stat: "l2" });
  assert.equal(faces.get("n3").text, "‖grad‖₂ = 0.001");
});

test("a face says what non-finite values a node holds: its statistics are over finite ones", () => {
  const m = paramsModel();
  const allNan = summary({ count: 0, nan: 4, l2: 0, mean: null, min: null, max: null });
  m.probes[0].summaries.cotangent = allNan; // n3: every gradient NaN (its l2 is 0 over none)
  m.probes[1].summaries.cotangent = summary({ count: 3, posinf: 1, l2: 2 }); // n4: one +Inf
  m.nodes.push({ ...m.nodes[6], id: "n7", label: "output", kind: "output" });
  m.probes.push({ id: "p3", name: "output", leaf: "", node: "n7", auto: true,
    summaries: { primal: { ...allNan, shape: [], size: 1, nan: 1 }, cotangent: summary({ size: 1, l2: 1 }) } });
  const ix = indexModel(m);
  const { faces } = computeFaces(ix, ["n3", "n4", "n7"], { mode: "cotangent", stat: "l2" });
  assert.equal(faces.get("n3").text, "grad: 4 NaN");
  assert.equal(faces.get("n4").text, "‖grad‖₂ = 2 · 1 +Inf");
  assert.equal(faces.get("n4").short, "grad: 1 +Inf"); // what a narrow face shows
  assert.equal(faces.get("n3").short, "grad: 4 NaN");
  assert.equal(faces.get("n7").text, "value = NaN"); // the NaN loss, not its cotangent's 1
});

test("gradient norms over steps: one series per leaf, the largest latest first, NaN steps marked", () => {
  const rows = paramRows(indexModel(paramsModel()), "n1");
  const hist = {
    steps: [0, 5, 10],
    loss: [1, 1, 1],
    probes: {
      p0: { cotangent: [{ l2: 3 }, { l2: 2 }, { l2: 1, nan: 0 }] },
      p1: { cotangent: [{ l2: 1 }, { l2: null, nan: 4 }, { l2: 5 }], primal: [{ l2: 9 }, { l2: 9 }, { l2: 9 }] },
      // p2 (scale) has no gradient: no series
    },
  };
  const g = gradHistory(rows, hist);
  assert.deepEqual(g.series.map((s) => [s.name, s.y]), [["blocks[0].b", [1, null, 5]], ["blocks[0].w", [3, 2, 1]]]);
  assert.equal(g.total, 2);
  assert.deepEqual(g.nonfinite, [5]);
  const top = gradHistory(rows, hist, 1);
  assert.deepEqual([top.series.map((s) => s.name), top.total, top.nonfinite], [["blocks[0].b"], 2, [5]]);
  assert.deepEqual(gradHistory(rows, { steps: [], probes: {} }).series, []);
});

test("a parameter's name is shown whole, breakable at its path's dots and keys", () => {
  const zw = "\u200b";
  assert.equal(breakable("layers[0].attn.key.bias"), `layers${zw}[0].${zw}attn.${zw}key.${zw}bias`);
  assert.equal(breakable("[0]['w']"), `[0]${zw}['w']`);
  assert.equal(breakable("layers[0].attn.key.bias").replaceAll(zw, ""), "layers[0].attn.key.bias");
});

test("parameters come in model order: by the first stage that reads them", () => {
  const m = paramsModel();
  // two stages: the first reads `scale`, the second `blocks[0].b` then `blocks[0].w`
  m.nodes.push(
    { id: "n7", label: "norm", kind: "scope", parent: "n0", order: 7, source: null, shapes: [], primitive: null, n_eqns: 2, collapsed: true, reads: ["n5", "n6"] },
    { id: "n8", label: "dense", kind: "scope", parent: "n0", order: 8, source: null, shapes: [], primitive: null, n_eqns: 2, collapsed: true, reads: ["n4", "n3"] },
  );
  const ix = indexModel(m);
  assert.deepEqual(paramRows(ix, "n1").map((r) => r.name), ["scale", "blocks[0].b", "blocks[0].w"]);
  // a stage's own: what it and its stages read, named as in the parameters' table
  assert.deepEqual(readRows(ix, "n8").map((r) => r.name), ["blocks[0].b", "blocks[0].w"]);
  assert.deepEqual(readRows(ix, "n7").map((r) => r.name), ["scale", "x"]);
});

test("a face describes a stage's outputs, not what it saved for its backward pass", () => {
  const m = paramsModel();
  const base = m.probes[0];
  m.probes = m.probes.filter((p) => p.node !== base.node);
  m.probes.push(
    { ...base, id: "q0", leaf: "['output']", summaries: { cotangent: summary({ l2: 3 }) } },
    { ...base, id: "q1", leaf: "['saved for backward'][0]", summaries: { cotangent: summary({ l2: 4, nan: 2 }) } },
  );
  const { faces } = computeFaces(indexModel(m), [base.node], { mode: "cotangent", stat: "l2" });
  // ‖grad‖₂ of the output alone (3, not √(3² + 4²) = 5); the NaN it saved still said
  assert.equal(faces.get(base.node).text, "‖grad‖₂ = 3 · 2 NaN");
  assert.equal(faces.get(base.node).value, 3);
});

test("a stage of several outputs (a scan's carry and ys): its face is its first output's, and says so", () => {
  const m = paramsModel();
  const scan = { ...m.nodes[6], id: "n8", label: "scan(step)", kind: "scan", shapes: ["float32[4]", "float32[6,4]"] };
  m.nodes.push(scan);
  const out = (id, leaf, l2, counts) => ({ id, name: "scan(step)", leaf, node: "n8", auto: true,
    summaries: { primal: summary(), cotangent: summary({ l2, hist: { edges: [0, 1, 2], counts } }) } });
  m.probes.push(out("p8", "[0]", 2.6, [5, 1]), out("p9", "[1]", 0.54, [1, 9]));
  const { faces } = computeFaces(indexModel(m), ["n8"], { mode: "cotangent", stat: "l2" });
  const f = faces.get("n8");
  assert.equal(f.value, 2.6); // the carry's, not √(2.6² + 0.54²) of the two together
  assert.equal(f.text, "[0] ‖grad‖₂ = 2.6");
  assert.deepEqual(f.hist, [5, 1]); // the sparkline is of the same output
  assert.deepEqual(f.outputs, ["[0]: ‖grad‖₂ = 2.6", "[1]: ‖grad‖₂ = 0.54"]);
});

test("a face describes the output its shape names: a scan's values before its dropped carry", () => {
  // The graph lists what the program reads first (ys), the probes come in the scan's
  // output order (carry, ys): the face showed the unused carry's ‖grad‖₂ = 0.
  const m = paramsModel();
  m.nodes.push({ ...m.nodes[6], id: "n8", label: "scan", kind: "scan", shapes: ["float32[10,4]", "float32[4]"] });
  const out = (id, leaf, shape, l2) => ({ id, name: "scan", leaf, node: "n8", auto: true,
    summaries: { primal: summary({ shape }), cotangent: summary({ shape, l2 }) } });
  m.probes.push(out("p8", "[0]", [4], 0), out("p9", "[1]", [10, 4], 51.6));
  const f = computeFaces(indexModel(m), ["n8"], { mode: "cotangent", stat: "l2" }).faces.get("n8");
  assert.equal(f.value, 51.6);
  assert.equal(f.text, "[1] ‖grad‖₂ = 51.6");
  // under explicit sharding the shape names mesh axes too
  m.nodes[m.nodes.length - 1].shapes = ["float32[10@data,4@(data,model)]", "float32[4]"];
  const g = computeFaces(indexModel(m), ["n8"], { mode: "cotangent", stat: "l2" }).faces.get("n8");
  assert.equal(g.text, "[1] ‖grad‖₂ = 51.6");
});

test("a face's text never runs over the expand button: shorter forms, never a cut number", () => {
  const face = { text: "[0] ‖x‖₂ = 0.008354", short: "[0] ‖x‖₂ = 0.008354" };
  assert.equal(fitted(face, 40), "[0] ‖x‖₂ = 0.008354");
  // the statistic before the output it names: "[1] = 12.41" read as the output's value
  assert.equal(fitted(face, 16), "‖x‖₂ = 0.008354");
  assert.equal(fitted(face, 14), "‖x‖₂ = 0.00835");
  assert.equal(fitted(face, 13), "‖x‖₂ = 0.0084");
  assert.equal(fitted(face, 10), ""); // never a number without its statistic's name
  // the output stays named while its number to 2 digits fits (round 15: a chain's
  // face said "‖grad‖₂ = 7.002" of its `[1]`, the panel opened on its `[0]`)
  assert.equal(fitted({ text: "[1] ‖grad‖₂ = 12.41" }, 17), "[1] ‖grad‖₂ = 12");
  assert.equal(fitted({ text: "[1] ‖grad‖₂ = 12.41" }, 15), "‖grad‖₂ = 12.41");
  // one character short: the number to 3 digits, not the statistic dropped
  assert.equal(fitted({ text: "‖grad‖₂ = 0.009034" }, 17), "‖grad‖₂ = 0.00903");
  assert.equal(fitted({ text: "‖grad‖₂ = 3.657e+6" }, 17), "‖grad‖₂ = 3.66e+6");
  assert.equal(fitted({ text: "‖grad‖₂ = 0.009034" }, 18), "‖grad‖₂ = 0.009034");
  // two short (a "+ 215 eqns" button): 2 digits, still the statistic
  assert.equal(fitted({ text: "‖grad‖₂ = 0.006314" }, 16), "‖grad‖₂ = 0.0063");
  assert.equal(fitted({ text: "‖grad‖₂ = 6.314e-4" }, 16), "‖grad‖₂ = 6.3e-4");
  assert.equal(fitted({ text: "‖x‖₂ = 0.008354" }, 16), "‖x‖₂ = 0.008354");
  assert.equal(fitted(face, 5), "");
  assert.equal(fitted({ text: "‖grad‖₂ = 2 · 1 +Inf", short: "grad: 1 +Inf" }, 14), "grad: 1 +Inf");
});

test("a narrow face keeps the statistic beside the non-finite counts while they fit", () => {
  const m = paramsModel();
  // a softmax's cotangent: 4 finite values, one NaN, one −Inf; a std's: one NaN
  m.probes[0].summaries.cotangent = summary({ count: 4, nan: 1, neginf: 1, l2: 5.71e25 });
  m.probes[1].summaries.cotangent = summary({ count: 4, nan: 1, l2: 3656509.75 });
  const { faces } = computeFaces(indexModel(m), ["n3", "n4"], { mode: "cotangent", stat: "l2" });
  const soft = faces.get("n3");
  const std = faces.get("n4");
  assert.equal(soft.text, "‖grad‖₂ = 5.71e+25 · 1 NaN, 1 −Inf");
  const shown = (face) => [40, 30, 24, 22, 19, 13, 9, 8].map((room) => fitted(face, room));
  assert.deepEqual(shown(soft), [
    "‖grad‖₂ = 5.71e+25 · 1 NaN, 1 −Inf",
    "‖grad‖₂ = 5.71e+25 · 2 NaN/Inf",
    // then the counts alone: the statistic without them (over the finite values only)
    // read as the whole value's (round 13)
    "grad: 1 NaN, 1 −Inf",
    "grad: 1 NaN, 1 −Inf",
    "grad: 1 NaN, 1 −Inf",
    "1 NaN, 1 −Inf",
    "2 NaN/Inf",
    "", // nothing rather than a count cut short
  ]);
  assert.deepEqual(shown(std), [
    "‖grad‖₂ = 3.657e+6 · 1 NaN",
    "‖grad‖₂ = 3.657e+6 · 1 NaN",
    "‖grad‖₂ = 3.7e+6 · 1 NaN", // the statistic, its number to 2 digits
    "grad: 1 NaN",
    "grad: 1 NaN",
    "grad: 1 NaN",
    "1 NaN",
    "1 NaN",
  ]);
  // every form keeps a count: never a bare number, nor a statistic without its NaN
  for (const face of [soft, std]) for (const t of shown(face)) assert.ok(t === "" || /NaN/.test(t), t);
});

test("a face of several outputs shows one with the mode's values, and the NaN of the one it shows", () => {
  const m = paramsModel();
  m.nodes.push({ ...m.nodes[6], id: "n8", label: "slogdet", kind: "jit", shapes: ["float32[]", "float32[]"] });
  const out = (id, leaf, summaries) => ({ id, name: "slogdet", leaf, node: "n8", auto: true, summaries });
  // slogdet: the sign has no gradient, the logdet has; the face showed none
  m.probes.push(out("p8", "[0]", { primal: summary({ shape: [] }) }),
    out("p9", "[1]", { primal: summary({ shape: [] }), cotangent: summary({ shape: [], l2: 1 }) }));
  // q, k, v: each output's own NaN count beside its own norm (it said "[0] = 0 · 192 NaN")
  m.nodes.push({ ...m.nodes[6], id: "n9", label: "q, k, v", kind: "scope", shapes: ["float32[80]", "float32[80]", "float32[80]"] });
  const qkv = (id, leaf, nan) => ({ id, name: "q, k, v", leaf, node: "n9", auto: true,
    summaries: { cotangent: summary({ shape: [80], count: 80 - nan, nan, l2: 2 }) } });
  m.probes.push(qkv("q0", "[0]", 0), qkv("q1", "[1]", 80), qkv("q2", "[2]", 32));
  const { faces } = computeFaces(indexModel(m), ["n8", "n9"], { mode: "cotangent", stat: "l2" });
  assert.equal(faces.get("n8").text, "[1] ‖grad‖₂ = 1");
  assert.equal(faces.get("n8").shown, "[1]"); // the tooltip says which it shows
  // the first output holding NaN is the one shown: a face never hides one
  assert.equal(faces.get("n9").text, "[1] grad: 80 NaN");
  m.probes[m.probes.length - 2].summaries.cotangent = summary({ shape: [80], count: 80, l2: 3 });
  const again = computeFaces(indexModel(m), ["n9"], { mode: "cotangent", stat: "l2" }).faces;
  assert.equal(again.get("n9").text, "[2] ‖grad‖₂ = 2 · 32 NaN");
});

test("a parameter's table name joins as its framework names it", () => {
  assert.equal(joinPath("layers[0]", "weight"), "layers[0].weight");
  assert.equal(joinPath("layers", "[1]"), "layers[1]");
  // Haiku: `mlp/~/linear_0/w`, not `mlp/~/linear_0.w`
  assert.equal(joinPath("mlp/~/linear_0", "w"), "mlp/~/linear_0/w");
  assert.equal(joinPath("", "embed"), "embed");
});
