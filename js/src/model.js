// Indexes a "sowviz/1" model (docs/model.md) into lookup tables the views use.
// Pure: no DOM, no plotly. Everything here is linear in the model's size.

import { nodeNonfinite } from "./nonfinite.js";

/** Kinds that are containers of other nodes. */
export const STAGE_KINDS = new Set([
  "jit", "scope", "tesseract", "scan", "cond", "while", "remat", "custom", "shard_map",
]);

/**
 * @typedef {import("./types").SowvizModel} SowvizModel
 * @typedef {import("./types").Node} Node
 * @typedef {import("./types").Probe} Probe
 * @typedef {import("./types").Summary} Summary
 *
 * @typedef {Object} ModelIndex
 * @property {SowvizModel} model
 * @property {string} root
 * @property {Map<string, Node>} nodes
 * @property {Map<string, string[]>} children   ids in program order
 * @property {Map<string, number>} depth        root has depth 0
 * @property {Map<string, number>} exit         largest `order` in the node's subtree
 * @property {Map<string, Probe[]>} probesByNode
 * @property {Map<string, Probe>} probes
 * @property {string[]} modes                   capture keys, e.g. ["primal", "cotangent"]
 * @property {Set<string>} subtreeProbe         nodes with a probe on themselves or a descendant
 * @property {Map<string, {forward: boolean, backward: boolean}>} nonfinite  own probes only
 * @property {Set<string>} subtreeNonfinite     nodes whose subtree holds a non-finite value
 */

const num = (x, d = 0) => (typeof x === "number" && Number.isFinite(x) ? x : d);

/**
 * Fills defaults so the views never meet a missing field.
 * @param {Partial<Node>} n
 * @param {number} i position in `nodes`, used when `order` is missing
 * @returns {Node}
 */
function normaliseNode(n, i) {
  return {
    id: String(n.id),
    label: n.label == null ? String(n.id) : String(n.label),
    kind: n.kind ? String(n.kind) : "eqn",
    parent: n.parent == null ? null : String(n.parent),
    order: num(n.order, i),
    source: n.source ?? null,
    shapes: Array.isArray(n.shapes) ? n.shapes.map(String) : [],
    primitive: n.primitive ?? null,
    n_eqns: num(n.n_eqns, 0),
    collapsed: n.collapsed !== false,
    repeats: num(n.repeats, 0),
    blocks: Array.isArray(n.blocks) ? n.blocks.map(String) : [],
    reads: Array.isArray(n.reads) ? n.reads.map(String) : [],
    read_at: readAt(n),
    port_names: portNames(n.port_names),
    static_inputs: portNames(n.static_inputs),
    collectives: Array.isArray(n.collectives) ? n.collectives.map(String) : [],
  };
}

/**
 * A node's `read_at` (per input in `reads`, the order of the equation first reading it),
 * or [] when it does not pair up with `reads` (a model saved before it: its reads are
 * then placed at the node's own `order`).
 * @param {Partial<Node>} n
 * @returns {number[]}
 */
function readAt(n) {
  const at = n.read_at;
  if (!Array.isArray(at) || !Array.isArray(n.reads) || at.length !== n.reads.length) return [];
  return at.every((x) => typeof x === "number" && Number.isFinite(x)) ? at : [];
}

/**
 * A node's `port_names` (producer -> what its body calls the value), strings only.
 * @param {unknown} raw
 * @returns {Record<string, string>}
 */
function portNames(raw) {
  /** @type {Record<string, string>} */
  const out = {};
  if (raw && typeof raw === "object" && !Array.isArray(raw)) {
    for (const [k, v] of Object.entries(raw)) if (typeof v === "string" && v) out[k] = v;
  }
  return out;
}

/**
 * Builds the index. Unknown parents are re-attached to the root so no node is lost.
 * @param {SowvizModel} model
 * @returns {ModelIndex}
 */
export function indexModel(model) {
  const raw = Array.isArray(model?.nodes) ? model.nodes : [];
  /** @type {Map<string, Node>} */
  const nodes = new Map();
  raw.forEach((n, i) => {
    if (n && n.id != null) nodes.set(String(n.id), normaliseNode(n, i));
  });
  let root = model?.root != null ? String(model.root) : null;
  if (root == null || !nodes.has(root)) {
    const top = [...nodes.values()].find((n) => n.parent == null);
    root = top ? top.id : "__root__";
  }
  if (!nodes.has(root)) {
    nodes.set(root, normaliseNode({ id: root, label: model?.title ?? "program", kind: "jit", order: -1 }, -1));
  }
  const children = new Map();
  for (const n of nodes.values()) {
    if (n.id === root) { n.parent = null; continue; }
    if (n.parent == null || !nodes.has(n.parent) || n.parent === n.id) n.parent = root;
    if (!children.has(n.parent)) children.set(n.parent, []);
    children.get(n.parent).push(n.id);
  }
  for (const ids of children.values()) ids.sort((a, b) => nodes.get(a).order - nodes.get(b).order);

  // Depth and subtree exit by an explicit DFS (no recursion: models can be deep).
  const depth = new Map([[root, 0]]);
  const exit = new Map();
  /** @type {Array<[string, boolean]>} */
  const stack = [[root, false]];
  while (stack.length) {
    const [id, done] = stack.pop();
    const kids = children.get(id) ?? [];
    if (done) {
      let e = nodes.get(id).order;
      for (const k of kids) e = Math.max(e, exit.get(k));
      exit.set(id, e);
      continue;
    }
    stack.push([id, true]);
    for (const k of kids) {
      if (depth.has(k)) continue; // a cycle in `parent` would loop forever
      depth.set(k, depth.get(id) + 1);
      stack.push([k, false]);
    }
  }
  // Nodes unreachable from the root (parent cycles) hang directly under it.
  for (const n of nodes.values()) {
    if (!depth.has(n.id)) {
      n.parent = root;
      children.get(root)?.push(n.id) ?? children.set(root, [n.id]);
      depth.set(n.id, 1);
      exit.set(n.id, n.order);
    }
  }

  markLeafGroups(nodes, children);

  const probes = new Map();
  const probesByNode = new Map();
  const modeSet = new Set(Array.isArray(model?.modes) ? model.modes : []);
  for (const p of Array.isArray(model?.probes) ? model.probes : []) {
    if (!p || p.id == null) continue;
    const probe = { ...p, id: String(p.id), node: nodes.has(String(p.node)) ? String(p.node) : root };
    probe.summaries = probe.summaries ?? {};
    probes.set(probe.id, probe);
    if (!probesByNode.has(probe.node)) probesByNode.set(probe.node, []);
    probesByNode.get(probe.node).push(probe);
    for (const k of Object.keys(probe.summaries)) modeSet.add(k);
  }
  const modes = orderModes([...modeSet]);

  const subtreeProbe = new Set();
  for (const id of probesByNode.keys()) markUp(id, subtreeProbe, nodes);

  const nonfinite = new Map();
  const subtreeNonfinite = new Set();
  for (const [id, ps] of probesByNode) {
    const f = nodeNonfinite(ps);
    if (f.forward || f.backward) {
      nonfinite.set(id, f);
      markUp(id, subtreeNonfinite, nodes);
    }
  }
  return { model, root, nodes, children, depth, exit, probesByNode, probes, modes, subtreeProbe, nonfinite, subtreeNonfinite };
}

/**
 * Marks each group of an argument's or a returned value's leaves (a "scope" with no
 * equations holding only input, or only output, nodes: `parameters`, `blocks[0]`) with
 * `leaves`: what its leaves are and how many. Its header and panel said "scope · 0 eqns"
 * and "equations 0", which told nothing of a pytree of parameters.
 * @param {Map<string, Node>} nodes @param {Map<string, string[]>} children
 */
function markLeafGroups(nodes, children) {
  /** @type {Map<string, {kind: string, count: number} | null>} */
  const memo = new Map();
  /** @param {string} id @returns {{kind: string, count: number} | null} */
  const of = (id) => {
    if (memo.has(id)) return memo.get(id) ?? null;
    memo.set(id, null); // (a cycle reads as no group)
    const n = nodes.get(id);
    /** @type {{kind: string, count: number} | null} */
    let out = null;
    if (n?.kind === "input" || n?.kind === "output") out = { kind: n.kind, count: 1 };
    else if (n?.kind === "scope" && !n.n_eqns && children.get(id)?.length) {
      const kids = (children.get(id) ?? []).map(of);
      const kind = kids[0]?.kind;
      if (kind && kids.every((k) => k?.kind === kind)) out = { kind, count: kids.reduce((a, k) => a + (k?.count ?? 0), 0) };
    }
    memo.set(id, out);
    return out;
  };
  for (const n of nodes.values()) {
    if (n.kind !== "scope" || n.n_eqns) continue;
    const g = of(n.id);
    if (g) n.leaves = g;
  }
}

/** Adds `id` and its ancestors to `set`, stopping at the first one already there. */
function markUp(id, set, nodes) {
  let cur = id;
  while (cur != null && !set.has(cur)) {
    set.add(cur);
    cur = nodes.get(cur)?.parent ?? null;
  }
}

/** Primal first, then tangent, cotangent, then composite keys alphabetically. */
export function orderModes(keys) {
  const rank = (k) => ({ primal: 0, tangent: 1, cotangent: 2 })[k] ?? 3;
  return [...keys].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
}

/** True when the node has children (an expandable stage). */
export function isExpandable(index, id) {
  return (index.children.get(id)?.length ?? 0) > 0;
}

/**
 * `id` and the chain of sole children below it that hold more (a wrapper calling one
 * function calling one loop: Equinox's `fn_wrapped` > `checkpointed-no-vjp` > `while`):
 * opening `id` opens them all, so one click reaches what the wrappers hold.
 */
export function soleChain(index, id) {
  const out = [id];
  let kids = index.children.get(id) ?? [];
  while (kids.length === 1 && isExpandable(index, kids[0])) {
    out.push(kids[0]);
    kids = index.children.get(kids[0]) ?? [];
  }
  return out;
}

/** Ancestors of `id`, nearest first, excluding `id` itself. */
export function ancestors(index, id) {
  const out = [];
  let cur = index.nodes.get(id)?.parent ?? null;
  while (cur != null) {
    out.push(cur);
    cur = index.nodes.get(cur)?.parent ?? null;
  }
  return out;
}
