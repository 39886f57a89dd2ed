// The graph of one level (the children of one stage) and which levels are visible.
// Pure: computed from the index and the set of expanded stages.

/**
 * Lifts an edge to the nearest ancestors of its endpoints that are siblings.
 * Returns null when one endpoint contains the other (nothing to draw at any level).
 * @param {import("./model.js").ModelIndex} index
 * @returns {{parent: string, source: string, target: string} | null}
 */
export function liftEdge(index, source, target) {
  if (!index.nodes.has(source) || !index.nodes.has(target) || source === target) return null;
  let s = source;
  let t = target;
  let ds = index.depth.get(s);
  let dt = index.depth.get(t);
  const up = (id) => index.nodes.get(id).parent;
  while (ds > dt) { s = up(s); ds--; }
  while (dt > ds) { t = up(t); dt--; }
  if (s === t) return null; // one endpoint is an ancestor of the other
  while (up(s) !== up(t)) { s = up(s); t = up(t); }
  return { parent: up(s), source: s, target: t };
}

/**
 * Every model edge lifted to its level, merged when several edges lift to one pair.
 * @returns {Map<string, Array<{source: string, target: string, count: number, shape: any, dtype: any}>>}
 */
export function edgesByLevel(index) {
  const byLevel = new Map();
  const seen = new Map();
  for (const e of index.model?.edges ?? []) {
    if (!e) continue;
    const l = liftEdge(index, String(e.source), String(e.target));
    if (!l) continue;
    const key = `${l.source}\u0000${l.target}`;
    const prev = seen.get(key);
    if (prev) { prev.count++; continue; }
    const edge = { source: l.source, target: l.target, count: 1, shape: e.shape ?? null, dtype: e.dtype ?? null };
    seen.set(key, edge);
    if (!byLevel.has(l.parent)) byLevel.set(l.parent, []);
    byLevel.get(l.parent).push(edge);
  }
  return byLevel;
}

/**
 * Stages whose children are drawn: the root, then every expanded stage whose
 * ancestors are all expanded. Outer levels come before inner ones.
 * @param {Set<string>} expanded
 * @returns {string[]}
 */
export function visibleLevels(index, expanded) {
  const out = [];
  const stack = [index.root];
  while (stack.length) {
    const id = stack.pop();
    const kids = index.children.get(id) ?? [];
    if (!kids.length) continue;
    out.push(id);
    for (let i = kids.length - 1; i >= 0; i--) if (expanded.has(kids[i])) stack.push(kids[i]);
  }
  return out;
}

/**
 * The drawn node that stands for `id`: itself when visible, else its outermost
 * collapsed ancestor.
 */
export function visibleRepresentative(index, expanded, id) {
  let rep = id;
  let cur = index.nodes.get(id)?.parent ?? null;
  while (cur != null && cur !== index.root) {
    if (!expanded.has(cur)) rep = cur;
    cur = index.nodes.get(cur).parent;
  }
  return rep;
}

/** The stages to expand so that `id` is drawn. */
export function pathToReveal(index, id) {
  const out = [];
  let cur = index.nodes.get(id)?.parent ?? null;
  while (cur != null && cur !== index.root) {
    out.push(cur);
    cur = index.nodes.get(cur).parent;
  }
  return out;
}
