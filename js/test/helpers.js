// A small sowviz/1 model for unit tests:
//   n0 (jit, root)
//   ├─ n1 input x
//   ├─ n2 scope "layer_0"  ─ n3 eqn dot_general, n4 eqn tanh, n5 sow "h0"
//   ├─ n6 scope "layer_1"  ─ n7 scan ─ n8 eqn mul
//   └─ n9 output
export function hist(lo, hi, counts) {
  const edges = counts.map((_, i) => lo + ((hi - lo) * i) / counts.length);
  edges.push(hi);
  return { edges, counts };
}

export function summary(extra = {}) {
  return {
    shape: [4], dtype: "float32", size: 4, count: 4, nan: 0, posinf: 0, neginf: 0, zeros: 0,
    min: -1, max: 1, mean: 0, std: 1, l2: 2, absmax: 1, hist: hist(-1, 1, [1, 1, 1, 1]),
    loghist: hist(-1, 0, [2, 2]), ...extra,
  };
}

export function smallModel() {
  const node = (id, label, kind, parent, order, extra = {}) => ({ id, label, kind, parent, order, source: null, shapes: ["float32[4]"], primitive: null, n_eqns: 1, collapsed: true, ...extra });
  return {
    schema: "sowviz/1", title: "t", mode: "grad", modes: ["primal", "cotangent"], device: "cpu",
    versions: { sowviz: "0.1.0" }, created: "2026-01-01T00:00:00Z", root: "n0",
    nodes: [
      node("n0", "prog", "jit", null, 0),
      node("n1", "x", "input", "n0", 1),
      node("n2", "layer_0", "scope", "n0", 2),
      node("n3", "dot_general", "eqn", "n2", 3, { primitive: "dot_general" }),
      node("n4", "tanh", "eqn", "n2", 4, { primitive: "tanh" }),
      node("n5", "h0", "sow", "n2", 5),
      node("n6", "layer_1", "scope", "n0", 6),
      node("n7", "loop", "scan", "n6", 7),
      node("n8", "mul", "eqn", "n7", 8, { primitive: "mul" }),
      node("n9", "out", "output", "n0", 9),
    ],
    edges: [
      { source: "n1", target: "n3" }, // lifts to n1 -> n2 at the root level
      { source: "n3", target: "n4" },
      { source: "n4", target: "n5" },
      { source: "n5", target: "n8" }, // lifts to n2 -> n6
      { source: "n4", target: "n8" }, // also n2 -> n6: merged, count 2
      { source: "n8", target: "n9" }, // n6 -> n9
      { source: "n2", target: "n3" }, // ancestor -> descendant: dropped
    ],
    probes: [
      { id: "p0", name: "h0", leaf: "", node: "n5", auto: false, summaries: { primal: summary(), cotangent: summary({ l2: 3 }) } },
      { id: "p1", name: "layer_1", leaf: "", node: "n6", auto: true, summaries: { primal: summary(), cotangent: summary() } },
    ],
    notes: [], history: null,
  };
}
