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

/**
 * The ports of every level: where values from outside a stage enter its children, and
 * where its children's values leave it. An edge lifted to siblings (`stem -> block`)
 * stands for values that inner nodes make and read (`Edge.ends`: `stem`'s `add` ->
 * `block`'s `conv1` and its residual `add`); an opened `block` drew neither, and its
 * `add` seemed to have one input. Per level: an entry port per outside source (named
 * by the sibling it comes from at the level the edge was lifted to) with an edge to
 * each child that reads it, and one exit port fed by each child whose value leaves.
 * Edges without `ends` (saved before them, or the parameters' reads) add none.
 * @param {import("./model.js").ModelIndex} index
 * @returns {Map<string, {ports: Array<{id: string, side: "in"|"out", label: string, title: string}>, edges: Array<{source: string, target: string, count: number, shape: any, dtype: any, port: true}>}>}
 */
export function portsByLevel(index) {
  /** @type {Map<string, {ins: Map<string, Map<string, any>>, names: Map<string, Set<string>>, outs: Map<string, any>, outTargets: Set<string>}>} */
  const acc = new Map();
  const at = (level) => {
    if (!acc.has(level)) acc.set(level, { ins: new Map(), names: new Map(), outs: new Map(), outTargets: new Set() });
    return acc.get(level);
  };
  const up = (id) => index.nodes.get(id).parent;
  for (const e of index.model?.edges ?? []) {
    if (!e || !Array.isArray(e.ends)) continue;
    const type = { shape: e.shape ?? null, dtype: e.dtype ?? null };
    for (const pair of e.ends) {
      const [s, t] = (Array.isArray(pair) ? pair : []).map(String);
      const l = liftEdge(index, s, t);
      if (!l) continue;
      // the reader's enclosing stages below the edge's level: each takes the value in
      for (let cur = t; up(cur) !== l.parent; cur = up(cur)) {
        const level = at(up(cur));
        if (!level.ins.has(l.source)) level.ins.set(l.source, new Map());
        level.ins.get(l.source).set(cur, type);
        // what the stage's body calls the value (a loop's `step(h, x)`: `h`)
        const name = index.nodes.get(up(cur))?.port_names?.[s];
        if (typeof name === "string" && name) {
          if (!level.names.has(l.source)) level.names.set(l.source, new Set());
          level.names.get(l.source).add(name);
        }
      }
      // the maker's enclosing stages: each hands the value out
      for (let cur = s; up(cur) !== l.parent; cur = up(cur)) {
        const level = at(up(cur));
        level.outs.set(cur, type);
        level.outTargets.add(l.target);
      }
    }
  }
  const out = new Map();
  const label = (id) => index.nodes.get(id)?.label ?? id;
  for (const [level, { ins, names, outs, outTargets }] of acc) {
    const ports = [];
    const edges = [];
    const taken = new Map(); // a label -> how many ports bear it (two `reshape`s)
    for (const [src, readers] of ins) {
      const id = `${level}\u0001in\u0001${src}`;
      const named = [...(names.get(src) ?? [])].join(", ");
      const base = named || label(src);
      const k = (taken.get(base) ?? 0) + 1;
      taken.set(base, k);
      const from = named ? `${named}: from ${label(src)}` : `from ${label(src)}`;
      ports.push({ id, side: /** @type {const} */ ("in"), label: k > 1 ? `${base} #${k}` : base, title: `${from}, outside ${label(level)}` });
      for (const [child, type] of readers) edges.push({ source: id, target: child, count: 1, ...type, port: /** @type {const} */ (true) });
    }
    if (outs.size) {
      const id = `${level}\u0001out`;
      // named by the first place its values go, `+2` for more (the title lists them:
      // "mean, new model.en….count" was cut), and said so: a bare `rev` read as the
      // value's maker
      const to = [...outTargets].map(label);
      const more = to.length > 1 ? ` +${to.length - 1}` : "";
      ports.push({ id, side: /** @type {const} */ ("out"), label: `to ${to[0]}${more}`, title: `to ${to.join(", ")}, outside ${label(level)}` });
      for (const [child, type] of outs) edges.push({ source: child, target: id, count: 1, ...type, port: /** @type {const} */ (true) });
    }
    out.set(level, { ports, edges });
  }
  return out;
}
