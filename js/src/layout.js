// Positions for everything drawn. Each visible level (the children of one expanded
// stage) is laid out on its own with dagre, innermost first, so an expanded stage is
// just a bigger node to the level around it. Levels above GRID_THRESHOLD nodes use a
// program-order grid instead (dagre is superlinear; such levels are rare and dense).
// Local layouts are cached by level and by the sizes of their expanded children, so
// expanding a stage only lays out that stage and its ancestors again.

import dagre from "@dagrejs/dagre";
import { visibleLevels } from "./levels.js";
import { countedFaceChars, namedFaceChars } from "./faces.js";

export const NODE_W = 204;
export const NODE_H = 62;
export const PAD = 14;
export const HEADER = 32;
export const GRID_THRESHOLD = 300;
export const MAX_W = 340;

/** Room between an open group's corner and where an edge may meet its border. */
const END_INSET = 14;

/**
 * A collapsed node's width: room for its label beside a sparkline (graph.js draws
 * 7.4 px a character and keeps 92 px for the sparkline and margins), at least NODE_W
 * and at most MAX_W, past which the label is cut and its full text is the tooltip.
 * @param {string | undefined} label
 */
export function leafWidth(label) {
  // a stack's "(×3)" is not drawn (its cards and "+ 3 blocks" say it): at 300 px
  // `checkpoint(blocks[0–2]: EBlock)` lost its range, `checkpoint(blocks[…: EBlock)`
  const drawn = String(label ?? "").replace(/ \(×\d+\)$/, "");
  return Math.min(MAX_W, Math.max(NODE_W, Math.ceil(96 + 7.4 * drawn.length)));
}

/** Where a collapsed node's type text starts after its kind badge (graph.js). */
export const SHAPE_X = 20;
/** The room a collapsed node keeps on its right for the sparkline (56 px and margins). */
export const SPARK_ROOM = 68;
/** Pixels a character of the type text takes (.sv-shape). */
export const SHAPE_CHAR = 6.3;

/** A kind badge's width: `eqn`, `scope`, `custom`. @param {string} kind */
export function kindWidth(kind) {
  return 8 + kind.length * 6.2;
}

/**
 * A node's type as its card writes it: the first output's (`f32[64@data,32@model]`),
 * `+2` for two more. @param {{shapes?: string[]}} node
 */
export function shapeText(node) {
  const sh = node.shapes?.[0] ?? "";
  const more = (node.shapes?.length ?? 0) > 1 ? ` +${node.shapes.length - 1}` : "";
  return `${sh.replace(/^float/, "f").replace(/^bfloat/, "bf").replace(/^int/, "i")}${more}`;
}

/**
 * A collapsed node's width: its label's (`leafWidth`), widened to its type beside the
 * sparkline. A sharded type (`f32[64@data,32@model]`, what a `reshard` box is for) ran
 * under the sparkline, or lost its `@model`. At most MAX_W, past which the type is cut.
 * `valueChars`: characters of face value it must also hold right of its expand button
 * (`toggle`, "" for none).
 * @param {{label?: string, kind?: string, shapes?: string[]} | undefined} node
 * @param {number} [valueChars] @param {string} [toggle]
 */
export function leafNodeWidth(node, valueChars = 0, toggle = "") {
  const label = leafWidth(node?.label);
  if (!node) return label;
  const type = SHAPE_X + kindWidth(node.kind ?? "") + SHAPE_CHAR * shapeText(node).length + SPARK_ROOM;
  const value = valueChars > 0 ? valueRight(toggle) + VALUE_CHAR * valueChars + 1 : 0;
  return Math.min(MAX_W, Math.max(label, Math.ceil(type), Math.ceil(value)));
}

/** Pixels a character of a collapsed node's face value takes (.sv-value). */
export const VALUE_CHAR = 6.35;

/**
 * A collapsed node's expand button: `+ 24 blocks`, `+ 11 eqns`, or, for a group of
 * inputs (no equations), `+ 3 inside`.
 * @param {{repeats?: number, n_eqns?: number}} node @param {number} inside its children
 */
export function toggleText(node, inside) {
  const k = node.n_eqns || inside;
  return node.repeats ? `+ ${node.repeats} blocks` : node.n_eqns ? `+ ${k} eqn${k === 1 ? "" : "s"}` : `+ ${k} inside`;
}

/** The expand button's width. @param {string} text */
export function toggleWidth(text) {
  return 10 + text.length * 6;
}

/** Pixels of a collapsed node's bottom row that are not its face value: the margins
 * and the expand button when there is one (`toggle`). @param {string} toggle */
function valueRight(toggle) {
  return 8 + (toggle ? 14 + toggleWidth(toggle) + 6 : 14);
}

/**
 * How many characters of face value fit in a collapsed node `w` wide, right of its
 * expand button (`toggle`, "" when there is none).
 * @param {number} w @param {string} toggle
 */
export function valueRoom(w, toggle) {
  return Math.floor((w - valueRight(toggle)) / VALUE_CHAR);
}

// An expanded stage's header: the toggle, then its label (7.6 px a character from
// x = 38), then on the right its kind and equation count, then the face value (6.6 px
// a character). The label comes first: the kind and the value are dropped before it
// is cut, and past MAX_HEAD_W the label is cut and its full text is the tooltip.
const HEAD_LABEL_X = 38;
const HEAD_CHAR = 7.6;
const HEAD_RIGHT_CHAR = 6.6;
const HEAD_GAP = 14;
export const MAX_HEAD_W = 440;

/** @param {{kind?: string, n_eqns?: number, leaves?: {kind: string, count: number}} | undefined} node */
function headKind(node) {
  // a group of an argument's leaves holds no equations: what it holds instead
  if (node?.leaves) return `${node.leaves.kind}s · ${node.leaves.count} lea${node.leaves.count === 1 ? "f" : "ves"}`;
  return `${node?.kind ?? ""} · ${node?.n_eqns ?? 0} eqns`;
}

/**
 * The width an expanded stage's header needs for its whole label and its kind, at
 * most MAX_HEAD_W: the stage is at least this wide whatever its contents.
 * @param {{label?: string, kind?: string, n_eqns?: number} | undefined} node
 */
export function stageHeadWidth(node) {
  const label = String(node?.label ?? "");
  const need = HEAD_LABEL_X + HEAD_CHAR * label.length + HEAD_GAP + HEAD_RIGHT_CHAR * headKind(node).length + 10;
  return Math.min(MAX_HEAD_W, Math.ceil(need));
}

/**
 * What an expanded stage's header of width `w` shows: the label's characters (all
 * of them when they fit), and whether the kind and the face value fit beside it.
 * @param {{label?: string, kind?: string, n_eqns?: number}} node
 * @param {number} w
 * @param {string} [value]
 */
export function stageHead(node, w, value = "") {
  const label = String(node.label ?? "");
  const kindText = headKind(node);
  const kindW = HEAD_RIGHT_CHAR * kindText.length + 10;
  const valueW = value ? HEAD_RIGHT_CHAR * (value.length + 2) : 0;
  const fits = (/** @type {number} */ right) => HEAD_LABEL_X + HEAD_CHAR * label.length + HEAD_GAP + right <= w;
  if (value && fits(kindW + valueW)) return { labelChars: label.length, kindText, showKind: true, showValue: true };
  if (fits(kindW)) return { labelChars: label.length, kindText, showKind: true, showValue: false };
  const alone = Math.max(4, Math.floor((w - HEAD_LABEL_X - HEAD_GAP) / HEAD_CHAR));
  return { labelChars: alone, kindText, showKind: false, showValue: false };
}

/**
 * @typedef {{x: number, y: number, w: number, h: number}} Box
 * @typedef {{pos: Map<string, Box>, edges: Array<{source: string, target: string, count: number, points: Array<{x: number, y: number}>}>, w: number, h: number, mode: string, hiddenEdges: number, ports?: Array<Box & {id: string, side: string, label: string, title: string}>}} LocalLayout
 */

/**
 * dagre on one level. Boxes are top-left based, relative to the level's origin.
 * `anchors(e)` may place an edge's ends: `{sx, tx}`, offsets from its source's and
 * its target's left side (an open stage's port, where the edge goes on inside).
 * `pinned`: nodes kept in the first rank (`top`: an open stage's entry ports) or the
 * last (`bottom`: its exit port), which dagre puts next to their readers otherwise.
 * @param {(e: any) => {sx?: number, tx?: number} | undefined} [anchors]
 * @param {{top?: string[], bottom?: string[]}} [pinned]
 */
export function dagreLevel(ids, sizes, edges, anchors, pinned = {}) {
  const g = new dagre.graphlib.Graph({ multigraph: false });
  g.setGraph({ rankdir: "TB", nodesep: 26, ranksep: 40, edgesep: 12, marginx: 0, marginy: 0 });
  g.setDefaultEdgeLabel(() => ({}));
  for (const id of ids) g.setNode(id, { width: sizes.get(id).w, height: sizes.get(id).h });
  for (const e of edges) g.setEdge(e.source, e.target);
  pin(g, ids, edges, pinned);
  dagre.layout(g);
  const pos = new Map();
  for (const id of ids) {
    const n = g.node(id);
    const { w, h } = sizes.get(id);
    pos.set(id, { x: n.x - w / 2, y: n.y - h / 2, w, h });
  }
  const bands = rankBands(pos);
  const outEdges = edges.map((e) => {
    const points = (g.edge(e.source, e.target)?.points ?? []).map((p) => ({ x: p.x, y: p.y }));
    const src = pos.get(e.source);
    const dst = pos.get(e.target);
    const at = anchors?.(e);
    const ends = {
      sx: at?.sx === undefined || !src ? undefined : src.x + at.sx,
      tx: at?.tx === undefined || !dst ? undefined : dst.x + at.tx,
    };
    const routed = throughGaps(points, src, dst, bands, ends);
    return { ...e, points: routed, routed: routed !== points };
  });
  const { w, h } = fitToContent(pos, outEdges);
  return { pos, edges: outEdges, w, h, mode: "dagre", hiddenEdges: 0 };
}

/**
 * Moves `pos` and the edges' points so that together they start at (0, 0), and returns
 * their extent. dagre sizes a graph by its nodes, so an edge it routed round the left
 * of every node (a residual's skip past the layers) ran outside the stage drawn
 * around the level; and the pins' rows (`pin`) are no part of it.
 * @param {Map<string, Box>} pos
 * @param {Array<{points: Array<{x: number, y: number}>}>} edges
 */
export function fitToContent(pos, edges) {
  let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
  const take = (/** @type {number} */ xa, /** @type {number} */ ya, /** @type {number} */ xb, /** @type {number} */ yb) => {
    x0 = Math.min(x0, xa); y0 = Math.min(y0, ya); x1 = Math.max(x1, xb); y1 = Math.max(y1, yb);
  };
  for (const b of pos.values()) take(b.x, b.y, b.x + b.w, b.y + b.h);
  for (const e of edges) for (const q of e.points) take(q.x, q.y, q.x, q.y);
  if (!Number.isFinite(x0)) return { w: 0, h: 0 };
  for (const b of pos.values()) { b.x -= x0; b.y -= y0; }
  for (const e of edges) for (const q of e.points) { q.x -= x0; q.y -= y0; }
  return { w: x1 - x0, h: y1 - y0 };
}

const PIN_TOP = "\u0002top";
const PIN_BOTTOM = "\u0002bottom";

/**
 * Pins `pinned.top` to the first rank and `pinned.bottom` to the last: an invisible
 * node above the sources (below the sinks) holds them by edges heavier than those
 * pulling them towards their readers (makers).
 */
function pin(g, ids, edges, pinned) {
  const pinnedSet = new Set([...(pinned.top ?? []), ...(pinned.bottom ?? [])]);
  if (pinned.top?.length) {
    g.setNode(PIN_TOP, { width: 0, height: 0 });
    const fed = new Set(edges.map((e) => e.target));
    for (const id of pinned.top) g.setEdge(PIN_TOP, id, { weight: 50, minlen: 1 });
    for (const id of ids) if (!fed.has(id) && !pinnedSet.has(id)) g.setEdge(PIN_TOP, id, { weight: 0, minlen: 2 });
  }
  if (pinned.bottom?.length) {
    g.setNode(PIN_BOTTOM, { width: 0, height: 0 });
    const feeding = new Set(edges.map((e) => e.source));
    for (const id of pinned.bottom) g.setEdge(id, PIN_BOTTOM, { weight: 50, minlen: 1 });
    for (const id of ids) if (!feeding.has(id) && !pinnedSet.has(id)) g.setEdge(id, PIN_BOTTOM, { weight: 0, minlen: 2 });
  }
}

/**
 * The horizontal bands dagre's ranks take: nodes of one rank share their centre's y,
 * and the band spans its tallest node. Between two bands runs a gap no node enters.
 * @param {Map<string, Box>} pos
 * @returns {Array<{top: number, bottom: number}>} top to bottom
 */
export function rankBands(pos) {
  const byCentre = new Map();
  for (const b of pos.values()) {
    const c = Math.round(b.y + b.h / 2);
    const band = byCentre.get(c);
    if (band) { band.top = Math.min(band.top, b.y); band.bottom = Math.max(band.bottom, b.y + b.h); }
    else byCentre.set(c, { top: b.y, bottom: b.y + b.h });
  }
  return [...byCentre.values()].sort((a, b) => a.top - b.top);
}

/**
 * An edge's points routed so that it crosses a rank's band only straight down: from
 * the source's bottom, through each band it passes at its place there, into the
 * target's top; it moves sideways only in the gaps between bands. dagre draws a
 * segment straight from one rank's centre to the next, which crossed a neighbour in
 * the band (`loss_fn (backward) → Optimizer.update` ran under `new metrics`, which
 * then seemed to feed the update). An edge dagre turned upwards keeps its points.
 * @param {Array<{x: number, y: number}>} points dagre's, relative to the level
 * @param {Box | undefined} src
 * @param {Box | undefined} dst
 * @param {Array<{top: number, bottom: number}>} bands
 * @param {{sx?: number, tx?: number}} [ends] where to leave the source and enter the
 *   target (x), else at dagre's places
 */
export function throughGaps(points, src, dst, bands, ends = {}) {
  if (points.length < 2 || !src || !dst || dst.y < src.y + src.h) return points;
  const bandOf = (/** @type {number} */ y) => bands.find((b) => b.top - 0.5 <= y && y <= b.bottom + 0.5);
  const clampX = (/** @type {number} */ x, /** @type {Box} */ b) =>
    Math.min(Math.max(x, b.x + END_INSET), b.x + b.w - END_INSET);
  const inner = points.slice(1, -1);
  const sx = clampX(ends.sx ?? inner[0]?.x ?? points[0].x, src);
  const tx = clampX(ends.tx ?? inner[inner.length - 1]?.x ?? points[points.length - 1].x, dst);
  const out = [{ x: sx, y: src.y + src.h }];
  const srcBand = bandOf(src.y + src.h / 2);
  if (srcBand && srcBand.bottom > src.y + src.h) out.push({ x: sx, y: srcBand.bottom });
  for (const p of inner) {
    const band = bandOf(p.y);
    if (!band) out.push(p); // a point in a gap (dagre's half ranks)
    else if (band !== srcBand && band !== bandOf(dst.y + dst.h / 2)) out.push({ x: p.x, y: band.top }, { x: p.x, y: band.bottom });
  }
  const dstBand = bandOf(dst.y + dst.h / 2);
  if (dstBand && dstBand.top < dst.y) out.push({ x: tx, y: dstBand.top });
  out.push({ x: tx, y: dst.y });
  return out;
}

/** Rows in program order, wrapped at about a 16:10 aspect ratio. Edges are not drawn. */
export function gridLevel(ids, sizes, edges) {
  const gap = 16;
  let area = 0;
  for (const id of ids) area += (sizes.get(id).w + gap) * (sizes.get(id).h + gap);
  const target = Math.max(NODE_W, Math.sqrt(area * 1.6));
  const pos = new Map();
  let x = 0;
  let y = 0;
  let rowH = 0;
  let w = 0;
  for (const id of ids) {
    const s = sizes.get(id);
    if (x > 0 && x + s.w > target) { x = 0; y += rowH + gap; rowH = 0; }
    pos.set(id, { x, y, w: s.w, h: s.h });
    x += s.w + gap;
    w = Math.max(w, x - gap);
    rowH = Math.max(rowH, s.h);
  }
  return { pos, edges: [], w, h: y + rowH, mode: "grid", hiddenEdges: edges.length };
}


/**
 * An edge's points with its ends on the top border of an open target group and the
 * bottom border of an open source group. dagre aims an edge at a node's centre, so at
 * a tall open group it met the side halfway down, beside an unrelated child (the
 * batch seemed to enter the third layer); a closed node keeps dagre's ends.
 * @param {Array<{x: number, y: number}>} points absolute
 * @param {(Box & {expanded: boolean}) | undefined} src
 * @param {(Box & {expanded: boolean}) | undefined} dst
 */
export function openEnds(points, src, dst) {
  if (points.length < 2) return points;
  let out = points;
  const clampX = (/** @type {number} */ x, /** @type {Box} */ b) =>
    Math.min(Math.max(x, b.x + END_INSET), b.x + b.w - END_INSET);
  if (dst?.expanded) {
    const top = dst.y;
    const kept = out.slice(0, -1).filter((p, i) => i === 0 || p.y < top - 4);
    const from = kept[kept.length - 1];
    kept.push({ x: clampX(from.y < top ? from.x : dst.x + dst.w / 2, dst), y: top });
    out = kept;
  }
  if (src?.expanded) {
    const bottom = src.y + src.h;
    const rest = out.slice(1).filter((p, i, a) => i === a.length - 1 || p.y > bottom + 4);
    const to = rest[0];
    out = [{ x: clampX(to.y > bottom ? to.x : src.x + src.w / 2, src), y: bottom }, ...rest];
  }
  return out;
}

export const PORT_H = 20;
const PORT_MIN_W = 36;
const PORT_MAX_W = 170;
const PORT_CHAR = 6.3;

/** A port's width: its label at 6.3 px a character, 36 to 170 px. @param {string} label */
export function portWidth(label) {
  return Math.min(PORT_MAX_W, Math.max(PORT_MIN_W, Math.ceil(16 + PORT_CHAR * label.length)));
}

/**
 * dagre on one level with its ports (levels.js `portsByLevel`) as small nodes, so that
 * they take their places above the children that read from outside and below those
 * whose values leave; the ports come back apart from the nodes' boxes.
 */
function dagreLevelWithPorts(ids, sizes, edges, portInfo, anchors) {
  const all = new Map(sizes);
  for (const p of portInfo.ports) all.set(p.id, { w: portWidth(p.label), h: PORT_H });
  const side = (/** @type {string} */ which) => portInfo.ports.filter((p) => p.side === which).map((p) => p.id);
  const pinned = { top: side("in"), bottom: side("out") };
  const lay = dagreLevel([...ids, ...portInfo.ports.map((p) => p.id)], all, [...edges, ...portInfo.edges], anchors, pinned);
  const ports = portInfo.ports.map((p) => ({ ...p, ...lay.pos.get(p.id) }));
  for (const p of portInfo.ports) lay.pos.delete(p.id);
  return { ...lay, ports };
}

/** The source a level's edge stands for: a port's outside source, else the node. */
function sourceKey(id) {
  const [, side, src] = String(id).split("\u0001");
  return side === "in" ? src : id;
}

/**
 * Where the edges of a level meet its open stages: at the stage's entry port for the
 * edge's source, at its exit port, as offsets from the stage's left side. The edge
 * met the border where dagre aimed it, beside another port (the `randint` edge above
 * the `xt` port), so it seemed to go on as that one.
 * @param {string[]} ids
 * @param {Map<string, {w: number, h: number}>} sizes
 * @param {Map<string, LocalLayout>} local the open stages' own layouts
 */
function portAnchors(ids, sizes, local) {
  /** @type {Map<string, {ins: Map<string, number>, out?: number}>} */
  const byStage = new Map();
  for (const id of ids) {
    const inner = local.get(id);
    if (!inner?.ports?.length) continue;
    const left = PAD + (sizes.get(id).w - 2 * PAD - inner.w) / 2;
    const ins = new Map();
    let out;
    for (const p of inner.ports) {
      const x = left + p.x + p.w / 2;
      if (p.side === "in") ins.set(sourceKey(p.id), x);
      else out = x;
    }
    byStage.set(id, { ins, out });
  }
  if (!byStage.size) return undefined;
  return (/** @type {any} */ e) => ({
    tx: byStage.get(e.target)?.ins.get(sourceKey(e.source)),
    sx: byStage.get(e.source)?.out,
  });
}

/**
 * A collapsed node's width (`leafNodeWidth`), widened so that a face holding NaN/Inf
 * beside finite values says both, the statistic and the counts, whatever statistic
 * colours it ("‖grad‖₂ = 0.1973 · 2 NaN"): at 204 px beside "+ 11 eqns" the counts
 * were cut and the norm of the finite values read as the whole value's. So that a face
 * of several outputs names the one it shows (`namedFaceChars`). Fixed per model, so
 * boxes do not move when the statistic changes.
 * @param {import("./model.js").ModelIndex} index @param {string} id
 */
function leafWidthWithValue(index, id) {
  const node = index.nodes.get(id);
  const inside = index.children.get(id)?.length ?? 0;
  const probes = index.probesByNode.get(id);
  // (and a stage of several outputs names the one its face shows: `[1] ‖grad‖₂ = 0.28`)
  const chars = Math.max(countedFaceChars(probes, node), namedFaceChars(probes, node));
  return leafNodeWidth(node, chars, inside > 0 ? toggleText(node, inside) : "");
}

/**
 * Lays out every visible level and returns absolute boxes.
 * @param {import("./model.js").ModelIndex} index
 * @param {Set<string>} expanded
 * @param {Map<string, any[]>} levelEdges from edgesByLevel
 * @param {Map<string, LocalLayout>} cache
 * @param {Map<string, {ports: any[], edges: any[]}>} [levelPorts] from portsByLevel
 */
export function layoutView(index, expanded, levelEdges, cache = new Map(), levelPorts = new Map()) {
  const levels = visibleLevels(index, expanded);
  const local = new Map();
  for (let i = levels.length - 1; i >= 0; i--) {
    const L = levels[i];
    const ids = index.children.get(L);
    const sizes = new Map();
    const sig = [];
    for (const id of ids) {
      const inner = local.get(id);
      if (inner) {
        const head = stageHeadWidth(index.nodes.get(id));
        sizes.set(id, { w: Math.max(NODE_W, head, inner.w + 2 * PAD), h: inner.h + HEADER + PAD });
        // (and where its ports are: the edges into it meet them)
        sig.push(`${id}:${inner.w}x${inner.h}:${(inner.ports ?? []).map((q) => Math.round(q.x)).join("/")}`);
      } else {
        sizes.set(id, { w: leafWidthWithValue(index, id), h: NODE_H });
      }
    }
    const key = `${L}|${sig.join(",")}`;
    let lay = cache.get(key);
    if (!lay) {
      const edges = levelEdges.get(L) ?? [];
      const ports = levelPorts.get(L);
      const anchors = portAnchors(ids, sizes, local);
      if (ids.length > GRID_THRESHOLD) lay = gridLevel(ids, sizes, edges);
      else if (ports) lay = dagreLevelWithPorts(ids, sizes, edges, ports, anchors);
      else lay = dagreLevel(ids, sizes, edges, anchors);
      cache.set(key, lay);
    }
    local.set(L, lay);
  }

  /** @type {Map<string, Box & {expanded: boolean, level: string}>} */
  const boxes = new Map();
  const edges = [];
  /** @type {Array<Box & {id: string, side: string, label: string, title: string, level: string}>} */
  const ports = [];
  const levelInfo = new Map();
  const origin = new Map([[index.root, { x: 0, y: 0 }]]);
  for (const L of levels) {
    const lay = local.get(L);
    const o = origin.get(L);
    levelInfo.set(L, { mode: lay.mode, hiddenEdges: lay.hiddenEdges, n: lay.pos.size });
    for (const [id, b] of lay.pos) {
      const isOpen = local.has(id);
      boxes.set(id, { x: o.x + b.x, y: o.y + b.y, w: b.w, h: b.h, expanded: isOpen, level: L });
      if (isOpen) {
        const inner = local.get(id);
        // centre the inner layout when the box is wider than it (minimum width)
        const dx = (b.w - 2 * PAD - inner.w) / 2;
        origin.set(id, { x: o.x + b.x + PAD + dx, y: o.y + b.y + HEADER });
      }
    }
    for (const p of lay.ports ?? []) ports.push({ ...p, x: o.x + p.x, y: o.y + p.y, level: L });
    for (const e of lay.edges) {
      const points = e.points.map((p) => ({ x: p.x + o.x, y: p.y + o.y }));
      const ends = e.routed ? points : openEnds(points, boxes.get(e.source), boxes.get(e.target));
      edges.push({ ...e, level: L, points: ends });
    }
  }
  const root = local.get(index.root);
  return { boxes, edges, ports, levels: levelInfo, bounds: { x: 0, y: 0, w: root?.w ?? 0, h: root?.h ?? 0 } };
}
