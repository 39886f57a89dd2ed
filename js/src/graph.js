// The SVG graph: draws a layout (layout.js) with node faces (faces.js), pans and zooms
// with d3-zoom, and reports clicks. Cheap updates (selection, search, colours) change
// attributes of the existing elements; only a new layout rebuilds the SVG.

import { select } from "d3-selection";
import { zoom, zoomIdentity } from "d3-zoom";
import { h, s, clear, ellipsis } from "./dom.js";
import { fitted, sparklinePath } from "./faces.js";
import { HEADER, SHAPE_CHAR, SHAPE_X, SPARK_ROOM, kindWidth, shapeText, stageHead, toggleText, toggleWidth, valueRoom } from "./layout.js";
import { fitTransform, hiddenSides, moreText, showBoxTransform } from "./viewport.js";
import { leafSummary } from "./params.js";

/** px: a view narrower says where more lies but not how to get there (the line was cut). */
const NARROW_HINT = 520;

let instances = 0;

/** Smooth path through dagre's edge points. */
export function edgePath(points) {
  if (!points.length) return "";
  const f = (p) => `${p.x.toFixed(1)},${p.y.toFixed(1)}`;
  let d = `M${f(points[0])}`;
  if (points.length === 2) return `${d}L${f(points[1])}`;
  for (let i = 1; i < points.length - 1; i++) {
    const mid = { x: (points[i].x + points[i + 1].x) / 2, y: (points[i].y + points[i + 1].y) / 2 };
    d += i === points.length - 2 ? `Q${f(points[i])} ${f(points[i + 1])}` : `Q${f(points[i])} ${f(mid)}`;
  }
  return d;
}

export class GraphView {
  /**
   * @param {HTMLElement} container
   * @param {{onSelect: (id: string|null) => void, onToggle: (id: string) => void}} handlers
   */
  constructor(container, handlers) {
    this.container = container;
    this.handlers = handlers;
    this.uid = `sv${++instances}`;
    // a group of buttons, one a stage (role "img" hid every stage from assistive tech)
    // (tabindex -1: Chrome made the <svg> a Tab stop of its own before the stage's)
    this.svg = s("svg", { class: "sv-svg", tabindex: "-1", role: "group", "aria-label": "stage graph: arrow keys move between stages, Enter opens a stage's panel, + and − open and close a stage" });
    const defs = s("defs", {}, [
      s("marker", { id: `${this.uid}-arrow`, viewBox: "0 0 10 10", refX: "9", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" }, [
        s("path", { d: "M0,0L10,5L0,10z", class: "sv-arrow" }),
      ]),
    ]);
    this.viewport = s("g", { class: "sv-viewport" });
    this.svg.append(defs, this.viewport);
    // "more below · drag to pan": a view that shows part of the drawing says so
    this.more = h("div", { class: "sv-more", "data-role": "more-hint", hidden: true });
    container.append(this.svg, this.more);
    this.els = new Map();
    this.edgeEls = [];
    this.zoom = zoom()
      .scaleExtent([0.02, 4])
      .filter((ev) => (!ev.ctrlKey || ev.type === "wheel") && !ev.button && !ev.target.closest?.("[data-role=toggle]"))
      .on("zoom", (ev) => {
        this.transform = ev.transform;
        this.viewport.setAttribute("transform", ev.transform.toString());
        if (ev.sourceEvent) this.moved = true; // the user panned or zoomed since the last fit
        this.updateMore();
      });
    this.sel = select(this.svg).call(this.zoom).on("dblclick.zoom", null);
    this.transform = zoomIdentity;
    this.moved = false;
    this.svg.addEventListener("click", (ev) => {
      if (ev.defaultPrevented) return;
      const t = ev.target.closest?.("[data-role=toggle]");
      if (t) { this.handlers.onToggle(t.closest("[data-node-id]").dataset.nodeId); return; }
      const g = ev.target.closest?.("[data-node-id]");
      this.handlers.onSelect(g ? g.dataset.nodeId : null);
    });
    // Keyboard: one stage is in the Tab order at a time (a roving tabindex: a graph of
    // hundreds of stages is one Tab stop, not hundreds); arrows move to the nearest
    // stage that way, Enter or Space opens its panel, + and − open and close it.
    this.focusId = null;
    this.svg.addEventListener("keydown", (ev) => this.onKey(ev));
    this.svg.addEventListener("focusin", (ev) => {
      const g = /** @type {Element} */ (ev.target).closest?.("[data-node-id]");
      if (!g) return;
      const id = g.getAttribute("data-node-id");
      this.setRoving(id);
      // (a click focuses the stage too: no ring then, and no pan under the pointer)
      if (g.matches(":focus-visible")) {
        g.append(focusRing(this.boxes?.get(id)));
        if (!this.restoring) this.ensureVisible(this.boxes?.get(id));
      }
    });
    this.svg.addEventListener("focusout", (ev) => {
      /** @type {Element} */ (ev.target).querySelector?.(":scope > .sv-focus-ring")?.remove();
    });
    this.svg.addEventListener("dblclick", (ev) => {
      const g = ev.target.closest?.("[data-node-id]");
      if (g && g.dataset.expandable === "true" && !ev.target.closest("[data-role=toggle]")) this.handlers.onToggle(g.dataset.nodeId);
    });
  }

  /**
   * Rebuilds the SVG for a layout.
   * @param {{index: any, layout: any, faces: Map<string, any>, expandable: (id: string) => boolean}} view
   */
  draw({ index, layout, faces, expandable }) {
    this.index = index;
    // a stage focused before (opened with +): focused again once drawn anew
    const active = this.svg.ownerDocument?.activeElement;
    const hadFocus = active instanceof Element && this.svg.contains(active) ? active.closest("[data-node-id]")?.getAttribute("data-node-id") ?? null : null;
    clear(this.viewport);
    this.els = new Map();
    this.edgeEls = [];
    const stages = s("g", { class: "sv-layer-stages" });
    const edgesG = s("g", { class: "sv-layer-edges" });
    const nodesG = s("g", { class: "sv-layer-nodes" });
    this.viewport.append(stages, edgesG, nodesG);
    for (const [id, box] of layout.boxes) {
      const node = index.nodes.get(id);
      const compact = layout.levels.get(box.level)?.mode === "grid";
      const el = box.expanded ? this.stageBox(node, box, faces.get(id)) : this.nodeFace(node, box, faces.get(id), expandable(id), compact);
      el.dataset.nodeId = id;
      el.dataset.kind = node.kind;
      if (index.subtreeProbe.has(id)) el.dataset.hasProbe = "true";
      if (index.subtreeNonfinite.has(id)) {
        el.dataset.nonfinite = "true";
        el.append(nanIcon(box.w, index.nonfinite.has(id)));
      }
      el.dataset.expandable = String(expandable(id));
      if (expandable(id)) el.dataset.expanded = String(box.expanded);
      el.setAttribute("tabindex", "-1");
      el.setAttribute("role", "button");
      el.setAttribute("aria-label", stageName(node));
      if (expandable(id)) el.setAttribute("aria-expanded", String(box.expanded));
      (box.expanded ? stages : nodesG).append(el);
      this.els.set(id, el);
    }
    for (const port of layout.ports ?? []) nodesG.append(portFace(port));
    for (const e of layout.edges) {
      const p = s("path", {
        class: "sv-edge", d: edgePath(e.points), "marker-end": `url(#${this.uid}-arrow)`,
        "stroke-width": Math.min(1.2 + Math.log2(e.count), 4).toFixed(2),
      }, [s("title", { text: edgeTitle(index, e) })]);
      p.dataset.source = e.source;
      p.dataset.target = e.target;
      edgesG.append(p);
      this.edgeEls.push(p);
    }
    this.bounds = layout.bounds;
    this.boxes = layout.boxes;
    this.setRoving(this.focusId);
    if (hadFocus && this.els.has(hadFocus)) this.focusNode(hadFocus);
    this.updateMore();
  }

  /** Puts stage `id` (else the first drawn) in the Tab order, and no other. */
  setRoving(id) {
    const now = id != null && this.els.has(id) ? id : this.els.keys().next().value ?? null;
    const was = this.focusId != null ? this.els.get(this.focusId) : null;
    if (was && this.focusId !== now) was.setAttribute("tabindex", "-1");
    this.focusId = now;
    if (now != null) this.els.get(now)?.setAttribute("tabindex", "0");
  }

  /** Focuses stage `id` without scrolling the page (the view pans to it instead). */
  focusNode(id) {
    const el = this.els.get(id);
    if (!el) return;
    this.setRoving(id);
    this.restoring = true;
    try { el.focus({ preventScroll: true }); } finally { this.restoring = false; }
  }

  /** A key on a focused stage (the keys it handles go no further: not to a notebook's
   * command mode, whose Enter edits the cell and whose arrows move between cells). */
  onKey(ev) {
    const g = ev.target.closest?.("[data-node-id]");
    if (!g || ev.altKey || ev.ctrlKey || ev.metaKey) return;
    const id = g.dataset.nodeId;
    let to = null;
    if (ev.key === "Enter" || ev.key === " ") this.handlers.onSelect(id);
    else if ((ev.key === "+" || ev.key === "=") && g.dataset.expanded === "false") this.handlers.onToggle(id);
    else if ((ev.key === "-" || ev.key === "−") && g.dataset.expanded === "true") this.handlers.onToggle(id);
    else if (ev.key === "Home" || ev.key === "End") to = ev.key === "Home" ? this.els.keys().next().value : [...this.els.keys()].pop();
    else if (ev.key.startsWith("Arrow")) to = nearestStage(this.boxes, id, ev.key.slice(5).toLowerCase()) ?? id;
    else return;
    ev.preventDefault();
    ev.stopPropagation();
    if (to != null) this.focusNode(to);
    if (to != null) this.ensureVisible(this.boxes?.get(to));
  }

  /** Shows or hides the hint that part of the drawing lies outside the view. */
  updateMore() {
    const W = this.svg.clientWidth;
    const H = this.svg.clientHeight;
    const sides = W && H ? hiddenSides(this.bounds, this.transform, W, H) : [];
    // Said until the user pans or zooms (then they know), and in a narrow view without
    // the instructions. Its place in the strip under the graph (app.js) stays taken while
    // it is hidden, the last text kept: the strip's height never changes with it (that
    // resized the view, which fitted again, which changed the hint).
    this.more.hidden = !sides.length || this.moved;
    this.more.dataset.sides = sides.join(" ");
    if (sides.length) this.more.textContent = moreText(sides, W < NARROW_HINT);
  }

  stageBox(node, box, face) {
    const g = s("g", { class: `sv-stage sv-kind-${safeKind(node.kind)}`, transform: `translate(${box.x},${box.y})` });
    g.append(
      s("rect", { class: "sv-stage-bg", width: box.w, height: box.h, rx: 10 }),
      s("rect", { class: "sv-stage-head", width: box.w, height: HEADER - 6, rx: 10 }),
      s("rect", { class: "sv-chip", x: 1, y: 1, width: 6, height: HEADER - 8, rx: 3, fill: face?.colour ?? "none" }),
      chipLift({ x: 1, y: 1, width: 6, height: HEADER - 8, rx: 3 }),
      s("g", { class: "sv-toggle", "data-role": "toggle", transform: "translate(12,4)" }, [
        s("rect", { width: 18, height: 18, rx: 4 }),
        s("text", { x: 9, y: 13, "text-anchor": "middle", text: "−" }),
        s("title", { text: "collapse" }),
      ]),
    );
    const head = this.stageHead(node, box, face);
    g.append(...[head.label, head.kind].filter(Boolean));
    return g;
  }

  /** An open stage's label (its tooltip says the statistic) and, when it fits, its kind
   * and face value. */
  stageHead(node, box, face) {
    const head = stageHead(node, box.w, face?.text ?? "");
    const tip = [`${node.label} (${node.kind} · ${node.leaves ? `${node.leaves.count} ${node.leaves.kind} leaves` : `${node.n_eqns} eqns`})`];
    if (face?.text) tip.push(`statistic: ${face.text}`);
    if (face?.outputs) tip.push(`the face shows ${face.shown ?? "the first"} of ${face.outputs.length} outputs:`, ...face.outputs.map((o) => `  ${o}`));
    return {
      label: s("text", { class: "sv-stage-label", x: 38, y: 18, text: ellipsis(node.label, head.labelChars) }, [
        s("title", { text: tip.join("\n") }),
      ]),
      kind: head.showKind ? s("text", { class: "sv-stage-kind", x: box.w - 10, y: 18, "text-anchor": "end" }, [
        head.kindText,
        head.showValue ? s("tspan", { class: "sv-value", dx: 8, text: face?.text ?? "" }) : null,
      ]) : null,
    };
  }

  nodeFace(node, box, face, canExpand, compact) {
    const { w, h } = box;
    const g = s("g", { class: `sv-node sv-kind-${safeKind(node.kind)}`, transform: `translate(${box.x},${box.y})` });
    const parts = this.faceParts(node, box, face, canExpand, compact);
    if (node.repeats) {
      // A stack of cards: the blocks behind the first one (inside the layout's gaps).
      g.dataset.repeats = String(node.repeats);
      for (const d of [6, 3]) g.append(s("rect", { class: "sv-node-bg sv-stacked", x: d, y: -d, width: w, height: h, rx: 8 }));
    }
    g.append(
      s("rect", { class: "sv-node-bg", width: w, height: h, rx: 8 }),
      s("rect", { class: "sv-chip", x: 1.5, y: 1.5, width: 6, height: h - 3, rx: 3, fill: face?.colour ?? "none" }),
      chipLift({ x: 1.5, y: 1.5, width: 6, height: h - 3, rx: 3 }),
      s("title", { text: parts.tip }),
    );
    if (node.collectives?.length) g.append(commBadge(node));
    g.append(s("text", { class: "sv-label", x: 16, y: 20, text: parts.label }));
    if (compact) {
      g.append(s("text", { class: "sv-shape", x: 16, y: 40, text: `${node.kind} ${ellipsis(shapeText(node), 18)}` }));
    } else {
      const kind = s("g", { class: "sv-badge", transform: "translate(14,28)" });
      const kw = kindWidth(node.kind);
      kind.append(s("rect", { width: kw, height: 15, rx: 7.5 }), s("text", { x: kw / 2, y: 11, "text-anchor": "middle", text: node.kind }));
      g.append(kind, s("text", { class: "sv-shape", x: SHAPE_X + kw, y: 39, text: parts.type }));
      if (parts.spark) g.append(sparkEl(parts.spark, w));
      if (parts.value) g.append(valueEl(parts.value, box));
      if (canExpand) {
        const tw = toggleWidth(parts.toggle);
        g.append(s("g", { class: "sv-toggle", "data-role": "toggle", transform: `translate(14,${h - 19})` }, [
          s("rect", { width: tw, height: 15, rx: 4 }),
          s("text", { x: tw / 2, y: 11, "text-anchor": "middle", text: parts.toggle }),
          s("title", { text: "expand (or double-click the node)" }),
        ]));
      }
    }
    return g;
  }

  /**
   * What of a collapsed node's face its values decide: its tooltip, its sparkline's
   * path ("" for none), its label and type (cut shorter beside a sparkline), and the
   * face value that fits beside the expand button (`toggle`).
   */
  faceParts(node, box, face, canExpand, compact) {
    const { w } = box;
    // a group of leaves: a summary (its shapes, one a line, were taller than the screen)
    const tip = [node.label, `${node.kind}${node.primitive ? ` · ${node.primitive}` : ""}`,
      ...(node.leaves && this.index ? leafSummary(this.index, node.id) : node.shapes ?? [])];
    if (node.repeats) tip.splice(1, 0, `${node.repeats} identical blocks: expand to see each`);
    if (face?.text) tip.push(`statistic: ${face.text}`);
    if (face?.outputs) tip.push(`the face shows ${face.shown ?? "the first"} of ${face.outputs.length} outputs:`, ...face.outputs.map((o) => `  ${o}`));
    const spark = !compact && face?.hist ? sparklinePath(face.hist, 56, 22) : "";
    // a group's "(×24)" is said by its stack of cards and its "+ 24 blocks" button
    const name = node.repeats ? node.label.replace(/ \(×\d+\)$/, "") : node.label;
    const label = ellipsis(name, spark ? Math.floor((w - 92) / 7.4) : Math.floor((w - 30) / 7.4));
    // the type ends before the sparkline: under it, `32@model` was unreadable
    const typeRoom = Math.floor((w - SHAPE_X - kindWidth(node.kind) - (spark ? SPARK_ROOM : 14)) / SHAPE_CHAR);
    const type = ellipsis(shapeText(node), Math.max(4, typeRoom));
    // a group of inputs holds no equations: say how many things it holds instead
    const toggle = toggleText(node, this.index?.children.get(node.id)?.length ?? 0);
    // right of the expand button: a narrow face says only its non-finite counts
    // (the full text is in the tooltip)
    const value = !compact && face?.text ? fitted(face, valueRoom(w, canExpand ? toggle : "")) : "";
    return { tip: tip.join("\n"), spark, label, type, value, toggle };
  }

  /**
   * Shows the faces' new values (a live Monitor's step) on the nodes drawn, in place:
   * the elements stay, so a hover's tooltip, a click in progress and the selection and
   * search marks are kept. Everything a face's values decide changes with them: the
   * colour, the sparkline (removed when the values have no histogram: an all-NaN
   * stage kept the bell curve of an earlier finite step), the text, the tooltip and
   * the NaN/Inf badge.
   * @param {any} index the model's index for the step drawn
   * @param {Map<string, any>} faces `computeFaces` of the ids drawn
   */
  updateFaces(index, faces) {
    this.index = index;
    for (const [id, face] of faces) {
      const el = this.els.get(id);
      const box = this.boxes?.get(id);
      const node = index.nodes.get(id);
      if (!el || !box || !node) continue;
      el.querySelector(":scope > .sv-chip")?.setAttribute("fill", face.colour ?? "none");
      if (box.expanded) this.updateStageHead(el, node, box, face);
      else this.updateNodeFace(el, node, box, face);
      // the badge is replaced only when it changes (its tooltip stays under a hover)
      const bad = index.subtreeNonfinite.has(id);
      const icon = el.querySelector(":scope > .sv-nan-icon");
      const own = index.nonfinite.has(id);
      if (icon && (!bad || icon.dataset.own !== String(own))) icon.remove();
      if (bad) el.dataset.nonfinite = "true";
      else el.removeAttribute("data-nonfinite");
      if (bad && !el.querySelector(":scope > .sv-nan-icon")) el.append(nanIcon(box.w, own));
    }
  }

  /** `updateFaces` for a collapsed node: what `nodeFace` draws from the values. */
  updateNodeFace(el, node, box, face) {
    const compact = !el.querySelector(":scope > .sv-badge");
    const parts = this.faceParts(node, box, face, el.dataset.expandable === "true", compact);
    setText(el.querySelector(":scope > title"), parts.tip);
    setText(el.querySelector(":scope > .sv-label"), parts.label);
    if (compact) return;
    const shape = el.querySelector(":scope > .sv-shape");
    setText(shape, parts.type);
    let spark = el.querySelector(":scope > .sv-spark");
    if (!parts.spark) spark?.remove();
    else if (spark) spark.setAttribute("d", parts.spark);
    else shape?.after((spark = sparkEl(parts.spark, box.w)));
    const value = el.querySelector(":scope > .sv-value");
    if (!parts.value) value?.remove();
    else if (value) value.textContent = parts.value;
    else (spark ?? shape)?.after(valueEl(parts.value, box));
  }

  /** `updateFaces` for an open stage: its header's label, tooltip, kind and value. */
  updateStageHead(el, node, box, face) {
    const head = this.stageHead(node, box, face);
    const label = el.querySelector(":scope > .sv-stage-label");
    if (!label) return;
    // in place: the label holds the tooltip (its <title>), which a hover keeps
    if (label.firstChild?.nodeType === 3) label.firstChild.nodeValue = head.label.firstChild.nodeValue;
    setText(label.querySelector(":scope > title"), head.label.querySelector(":scope > title").textContent);
    const kind = el.querySelector(":scope > .sv-stage-kind");
    if (kind && head.kind) { if (kind.textContent !== head.kind.textContent) kind.replaceWith(head.kind); }
    else if (head.kind) label.after(head.kind);
    else kind?.remove();
  }

  /** Marks nodes holding or hiding the NaN/Inf origins, with a flag above them. */
  markOrigins(reps) {
    for (const el of this.viewport.querySelectorAll("[data-nonfinite-origin]")) {
      el.removeAttribute("data-nonfinite-origin");
      el.querySelector(".sv-origin-flag")?.remove();
    }
    for (const [id, passes] of reps) {
      const el = this.els.get(id);
      if (!el) continue;
      el.dataset.nonfiniteOrigin = passes.join(" ");
      const label = `NaN/Inf starts here (${passes.join(" + ")})`;
      const w = 12 + label.length * 6;
      // above the node, unless that is its group's header (the first stage in a
      // group): then below it
      const box = this.boxes?.get(id);
      const outer = this.boxes?.get(this.index?.nodes.get(id)?.parent);
      const y = box && outer?.expanded && box.y - outer.y < HEADER + 20 ? box.h + 3 : -20;
      el.append(s("g", { class: "sv-origin-flag", transform: `translate(0,${y})` }, [
        s("rect", { width: w, height: 17, rx: 8.5 }),
        s("text", { x: w / 2, y: 12.5, "text-anchor": "middle", text: label }),
      ]));
    }
  }

  setSelected(id) {
    for (const el of this.viewport.querySelectorAll(".sv-selected")) el.classList.remove("sv-selected");
    for (const el of this.viewport.querySelectorAll(".sv-edge-active")) el.classList.remove("sv-edge-active");
    if (id == null) return;
    this.els.get(id)?.classList.add("sv-selected");
    for (const e of this.edgeEls) {
      if (e.dataset.source === id || e.dataset.target === id) e.classList.add("sv-edge-active");
    }
  }

  /**
   * @param {Set<string>|null} hits drawn ids that match (null: no query)
   * @param {Map<string, number>} inside drawn ids hiding n matches in their collapsed subtree
   */
  setSearch(hits, inside) {
    for (const [id, el] of this.els) {
      el.querySelector(":scope > .sv-hits")?.remove();
      if (!hits) {
        el.removeAttribute("data-match");
        el.classList.remove("sv-dim");
        continue;
      }
      const n = inside.get(id) ?? 0;
      const match = hits.has(id) ? "true" : n > 0 ? "descendant" : null;
      if (match) el.dataset.match = match; else el.removeAttribute("data-match");
      const expandedStage = el.classList.contains("sv-stage");
      el.classList.toggle("sv-dim", !match && !expandedStage);
      if (n > 0 && !expandedStage) {
        const t = `${n} inside`;
        const w = 10 + t.length * 6;
        const bw = Number(el.querySelector(".sv-node-bg")?.getAttribute("width") ?? 0);
        el.append(s("g", { class: "sv-hits", transform: `translate(${bw - w / 2 - 20},-9)` }, [
          s("rect", { width: w, height: 16, rx: 8 }), s("text", { x: w / 2, y: 12, "text-anchor": "middle", text: t }),
        ]));
      }
    }
  }

  /**
   * Fits the drawing into the view. With `minScale`, never zooms out below it (then the
   * top of the drawing shows: `viewport.fitTransform`).
   */
  fit({ minScale = 0, animate = false } = {}) {
    const b = this.bounds;
    const W = this.svg.clientWidth || this.container.clientWidth || 800;
    const H = this.svg.clientHeight || this.container.clientHeight || 500;
    if (!b || !b.w || !b.h) return;
    this.moved = false;
    const f = fitTransform(b, W, H, { minScale });
    const t = zoomIdentity.translate(f.x, f.y).scale(f.k);
    (animate ? this.sel.transition?.().duration(250) ?? this.sel : this.sel).call(this.zoom.transform, t);
  }

  /**
   * After stage `box` opened or closed where it was: brings it into view, zooming out
   * to show it whole but not below `minScale` (`viewport.showBoxTransform`).
   */
  showBox(box, minScale) {
    if (!box) return;
    const W = this.svg.clientWidth || 800;
    const H = this.svg.clientHeight || 500;
    // its neighbours too (`around`): a widened parent left them cut at the left edge
    const t = showBoxTransform(box, this.transform, W, H, { minScale, around: this.boxes?.values() ?? [] });
    this.sel.call(this.zoom.transform, zoomIdentity.translate(t.x, t.y).scale(t.k));
    this.moved = true; // a place chosen: a resize does not fit the whole graph over it
  }

  /** Screen position of a drawn node, to keep it still across a relayout. */
  screenOf(box) {
    return box ? { x: this.transform.applyX(box.x), y: this.transform.applyY(box.y) } : null;
  }

  /** Pans (keeping the zoom) so that `box` lands at screen point `at`. */
  anchor(box, at) {
    if (!box || !at) return;
    const k = this.transform.k;
    this.sel.call(this.zoom.transform, zoomIdentity.translate(at.x - box.x * k, at.y - box.y * k).scale(k));
  }

  /** Pans as little as possible to bring `box` into view (its top-left first). */
  ensureVisible(box) {
    if (!box) return;
    const W = this.svg.clientWidth || 800;
    const H = this.svg.clientHeight || 500;
    const { k, x, y } = this.transform;
    const pad = 16;
    const left = x + box.x * k;
    const top = y + box.y * k;
    const right = left + box.w * k;
    const bottom = top + box.h * k;
    let dx = 0;
    let dy = 0;
    if (right > W - pad) dx = W - pad - right;
    if (left + dx < pad) dx = pad - left;
    if (bottom > H - pad) dy = H - pad - bottom;
    if (top + dy < pad) dy = pad - top;
    if (dx || dy) this.sel.call(this.zoom.transform, zoomIdentity.translate(x + dx, y + dy).scale(k));
  }

  /** Pans so that `box` is centred, zooming in to at least `k` when given. */
  centreOn(box, k) {
    const W = this.svg.clientWidth || 800;
    const H = this.svg.clientHeight || 500;
    const kk = Math.max(this.transform.k, k ?? 0);
    const t = zoomIdentity.translate(W / 2 - (box.x + box.w / 2) * kk, H / 2 - (box.y + box.h / 2) * kk).scale(kk);
    this.sel.call(this.zoom.transform, t);
    // a place chosen (a search result, a note's link): no fit on a resize moves off it
    // (the detail panel opening with it resized the view, and its fit hid the node)
    this.moved = true;
  }

  destroy() {
    this.sel.on(".zoom", null);
    this.svg.remove();
  }
}

/** A stage as assistive tech names it: its label and kind (`attn: MultiheadAttention, scope`). */
function stageName(node) {
  const what = node.leaves ? `group of ${node.leaves.count} ${node.leaves.kind} leaves` : node.repeats ? `${node.kind}, ${node.repeats} identical blocks` : node.kind;
  return `${node.label}, ${what}`;
}

/** The keyboard focus's ring, just outside a stage's box (the selection's is on it). */
function focusRing(box) {
  const w = box?.w ?? 0;
  // an open stage: its header (the ring round a whole open stage is far from the keys' target)
  const hh = box?.expanded ? HEADER - 6 : box?.h ?? 0;
  return s("rect", { class: "sv-focus-ring", x: -4, y: -4, width: w + 8, height: hh + 8, rx: 11, "aria-hidden": "true" });
}

/**
 * The drawn stage nearest to `from` in direction `dir` (up, down, left, right), or null:
 * of those whose centre lies that way (within 45° either side), the least distance, a
 * step aside counted twice. An open stage counts by its header, where its name is.
 * @param {Map<string, any>|undefined} boxes @param {string} from @param {string} dir
 */
export function nearestStage(boxes, from, dir) {
  const a = boxes?.get(from);
  if (!a) return null;
  const centre = (/** @type {any} */ b) => ({ x: b.x + b.w / 2, y: b.expanded ? b.y + HEADER / 2 : b.y + b.h / 2 });
  const c0 = centre(a);
  const [ux, uy] = { up: [0, -1], down: [0, 1], left: [-1, 0], right: [1, 0] }[dir] ?? [0, 0];
  // within 45° first; none there: anything that way at all
  for (const cone of [1, Infinity]) {
    let best = null;
    let bestD = Infinity;
    for (const [id, b] of boxes) {
      if (id === from) continue;
      const c = centre(b);
      const along = (c.x - c0.x) * ux + (c.y - c0.y) * uy;
      const aside = Math.abs((c.x - c0.x) * uy - (c.y - c0.y) * ux);
      if (along <= 0 || aside > cone * along) continue;
      const d = along + 2 * aside;
      if (d < bestD) { bestD = d; best = id; }
    }
    if (best != null) return best;
  }
  return null;
}

/** A collapsed node's sparkline (`sparklinePath`), at its top right. */
function sparkEl(d, w) {
  return s("path", { class: "sv-spark", d, transform: `translate(${w - 64},8)` });
}

/** A collapsed node's face value, at its bottom right. */
function valueEl(text, box) {
  return s("text", { class: "sv-value", x: box.w - 8, y: box.h - 8, "text-anchor": "end", text });
}

/** Sets an element's text unless it is already that (a hovered tooltip is left alone). */
function setText(el, text) {
  if (el && el.textContent !== text) el.textContent = text;
}

/**
 * A pill on a card's top edge naming the collectives its equations call (the first,
 * and how many more): where a sharded program communicates, which a line's box
 * (`w = all_gather(w, ...)`, a box `w`) hid. An equation's own label names it: a glyph.
 */
function commBadge(node) {
  const calls = node.collectives;
  const text = node.kind === "eqn" ? "⇄" : `⇄ ${calls[0]}${calls.length > 1 ? ` +${calls.length - 1}` : ""}`;
  const tw = Math.ceil(text.length * 6.2) + 10;
  return s("g", { class: "sv-comm", "data-role": "collectives", transform: "translate(16,-7)" }, [
    s("rect", { width: tw, height: 14, rx: 7 }),
    s("text", { x: tw / 2, y: 10.5, "text-anchor": "middle", text }),
    s("title", { text: `communicates between devices: ${calls.join(", ")}` }),
  ]);
}

/** The red badge of a node holding NaN/Inf (hollow when only a descendant does). */
function nanIcon(w, own) {
  return s("g", { class: "sv-nan-icon", transform: `translate(${w - 2},2)`, "data-own": String(own) }, [
    s("circle", { r: 9, "fill-opacity": own ? 1 : 0.75 }),
    s("text", { y: 4, "text-anchor": "middle", text: "!" }),
    s("title", { text: own ? "NaN/Inf in this node's values" : "NaN/Inf inside this stage" }),
  ]);
}

/**
 * A white veil over a colour chip, shown in the dark theme only (styles.css): viridis's
 * low end (#440154) is as dark as a dark node (1.03:1), so low values vanished; the
 * veil lifts every chip, and the legend's bar alike, to ≥ 3:1 there.
 */
function chipLift(geom) {
  return s("rect", { class: "sv-chip-lift", "aria-hidden": "true", ...geom });
}

function safeKind(kind) {
  return String(kind).replace(/[^a-z0-9_-]/gi, "_");
}

/**
 * A stage's port (levels.js `portsByLevel`): a small pill at the top of an opened stage
 * naming where a value comes from, or at its bottom naming where its values go.
 * @param {{id: string, side: string, label: string, title: string, level: string, x: number, y: number, w: number, h: number}} port
 */
function portFace(port) {
  const g = s("g", { class: `sv-port sv-port-${port.side}`, transform: `translate(${port.x},${port.y})` });
  g.dataset.port = port.side;
  g.dataset.level = port.level;
  const maxChars = Math.max(3, Math.floor((port.w - 12) / 6.3));
  g.append(
    s("title", { text: port.title }),
    s("rect", { width: port.w, height: port.h, rx: port.h / 2, style: "fill: var(--sv-panel); stroke: var(--sv-edge); stroke-dasharray: 3 2" }),
    s("text", { x: port.w / 2, y: port.h / 2 + 4, "text-anchor": "middle", style: "fill: var(--sv-muted); font: 11px var(--sv-mono)", text: ellipsis(port.label, maxChars) }),
  );
  return g;
}

function edgeTitle(index, e) {
  // a port's id ends with the outside node it names (`<stage>\u0001in\u0001<source>`)
  const outside = (id) => `${index.nodes.get(String(id).split("\u0001").pop())?.label ?? "outside"} (outside)`;
  const a = index.nodes.get(e.source)?.label ?? (e.port ? outside(e.source) : e.source);
  const b = index.nodes.get(e.target)?.label ?? (e.port ? "outside" : e.target);
  const shape = Array.isArray(e.shape) ? `${e.dtype ?? ""}[${e.shape.join(",")}]` : e.dtype ?? "";
  const many = e.count > 1 ? ` (${e.count} edges)` : "";
  return `${a} → ${b}${shape ? `: ${shape}` : ""}${many}`;
}
