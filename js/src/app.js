// The front end of one view: toolbar, graph, legend, detail panel and Monitor loss
// curve, wired to the view state (expanded stages, selection, search, statistic).
// Used by the widget (index.js render) and the report (index.js mount) alike.

import { h, clear, noteClass, said } from "./dom.js";
import { indexModel, isExpandable, soleChain, STAGE_KINDS } from "./model.js";
import { edgesByLevel, portsByLevel, visibleRepresentative, pathToReveal } from "./levels.js";
import { layoutView } from "./layout.js";
import { computeFaces } from "./faces.js";
import { nonfiniteRoles, originNodes, originsOnStep, storedOrigins } from "./nonfinite.js";
import { bannerParts } from "./banner.js";
import { parentPath, rankHits, searchNodes } from "./search.js";
import { defaultStat, STATS, fmt, VIRIDIS_STOPS } from "./stats.js";
import { GraphView } from "./graph.js";
import { FIT_BUTTON_SCALE, READABLE_SCALE, widgetHeight } from "./viewport.js";
import { DetailPanel } from "./detail.js";
import { drawLines, purge } from "./charts.js";
import { watchTheme, chartColours } from "./theme.js";
import { HistoryStore, lossSeries, nearestStep, nonfiniteCount, nonfiniteSteps, shownStep, skippedCount, withStep } from "./history.js";

export const MODES = ["primal", "grad", "jvp", "vjp", "all"];
/** The first picture fits the whole graph unless its text would get smaller than readable. */
export const FIT_MIN_SCALE = READABLE_SCALE;
// The loss chart's size (px), beside the legend in the strip under the graph: the strip
// is as tall as the chart, and its height comes from the graph's view (104 px left a
// blank band the width of the view under a one-line legend).
const LOSS_W = 320;
const LOSS_H = 54;
const EMPTY = "Nothing to show yet: the model has no nodes.";
const FAILED = "Nothing to draw: the program did not run (the error above says why).";
/** Phases in which Python is working (`phase` trait of the widget). */
export const WORKING = new Set(["tracing", "compiling", "running", "locating", "drawing"]);

/**
 * @typedef {Object} AppOptions
 * @property {(mode: string) => void} [onModeChange] given: the mode dropdown is live (widget)
 * @property {() => void} [onLocate] given: the banner's "Locate the equation" button is live (widget)
 * @property {HistoryStore} [store] shared Monitor history (widget: one per model)
 * @property {boolean} [standalone] the HTML report: fill the window
 */

export class App {
  /**
   * @param {HTMLElement} el
   * @param {any} model a sowviz/1 model
   * @param {AppOptions} options
   */
  constructor(el, model, options = {}) {
    this.el = el;
    this.options = options;
    this.store = options.store ?? new HistoryStore(model?.history ?? null);
    this.ownStore = !options.store;
    this.expanded = new Set();
    this.selected = null;
    /** the recorded step whose values are drawn (null: the latest) */
    this.viewStep = null;
    this.query = "";
    this.layoutCache = new Map();
    this.cleanups = [];
    this.buildDom();
    this.cleanups.push(watchTheme(this.root, () => this.onTheme()));
    this.cleanups.push(this.store.subscribe(() => this.scheduleHistory()));
    this.setModel(model, { first: true });
    this.watchSize();
  }

  /**
   * Fits again when the view first gets a size (a widget may render while detached),
   * and when it changes size (the detail panel opens, the window is resized) while
   * the user has not moved the view since the last fit: the graph stays whole (a
   * Monitor's loss chart, appearing under it, makes the view shorter).
   */
  watchSize() {
    if (typeof ResizeObserver === "undefined") return;
    let sized = this.canvas.clientWidth > 0;
    const ro = new ResizeObserver(() => {
      const now = this.canvas.clientWidth > 0;
      // the widget's height follows a narrow/wide switch (the panel stacked or beside)
      if (now) this.fitHeight();
      if (now && (!sized || !this.graph.moved)) {
        this.graph.fit({ minScale: FIT_MIN_SCALE });
        // the whole graph at its least scale may leave the selected node out of view
        if (this.selected != null) this.graph.ensureVisible(this.layout?.boxes.get(this.selected));
      }
      sized = now;
    });
    ro.observe(this.canvas);
    this.cleanups.push(() => ro.disconnect());
  }

  buildDom() {
    const o = this.options;
    this.root = h("div", { class: `sowviz${o.standalone ? " sv-standalone" : ""}` });
    this.title = h("span", { class: "sv-title" });
    // A Monitor's model: which recorded step the graph's values are, and the way back
    this.stepNote = h("span", { class: "sv-step", "data-role": "step", hidden: true });
    this.modeSel = h("select", { class: "sv-select", "data-role": "mode", "aria-label": "mode", disabled: !o.onModeChange },
      MODES.map((m) => h("option", { value: m, text: m })));
    this.modeSel.addEventListener("change", () => {
      // Python re-runs (and sends its `phase`) only when the mode differs from the model's
      if (this.modeSel.value !== this.model.mode) this.setStatus("tracing", `switching to ${this.modeSel.value}…`);
      o.onModeChange?.(this.modeSel.value);
    });
    this.statSel = h("select", { class: "sv-select", "data-role": "stat", "aria-label": "colour nodes by" });
    this.statSel.addEventListener("change", () => {
      const [mode, stat] = this.statSel.value.split("\u0000");
      this.stat = { mode, stat };
      this.statPicked = true; // the user's choice: kept across the widget's mode switches
      this.refreshFaces();
    });
    this.search = h("input", { type: "search", class: "sv-search", "data-role": "search", placeholder: "search  (kind:scan, is:nan)", "aria-label": "search nodes", spellcheck: "false" });
    this.searchCount = h("span", { class: "sv-muted sv-search-count", "data-role": "search-count" });
    this.results = h("ul", { class: "sv-results", "data-role": "search-results", hidden: true });
    let timer = null;
    this.search.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => this.setQuery(this.search.value), 80);
    });
    this.search.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter") {
        clearTimeout(timer); // typed then Enter at once: search now, not after the pause
        if (this.query !== this.search.value) this.setQuery(this.search.value);
        if (this.hits?.length) this.reveal(this.hits[0]);
        this.results.hidden = true; // the dropdown closes on Enter
      }
      if (ev.key === "Escape") { this.search.value = ""; this.setQuery(""); }
    });
    this.statusText = h("span", { class: "sv-status-text" });
    this.busy = h("span", { class: "sv-busy", "data-role": "status", role: "status", "aria-live": "polite", hidden: true }, [h("span", { class: "sv-spinner" }), this.statusText]);
    this.notesBtn = h("button", { type: "button", class: "sv-btn", "data-role": "notes-toggle", hidden: true });
    this.notesList = h("ul", { class: "sv-notes", "data-role": "notes", hidden: true });
    this.notesBtn.addEventListener("click", () => { this.notesList.hidden = !this.notesList.hidden; });
    const toolbar = h("div", { class: "sv-toolbar" }, [
      this.title,
      this.stepNote,
      h("label", { class: "sv-field" }, [h("span", { class: "sv-muted", text: "mode" }), this.modeSel]),
      h("label", { class: "sv-field" }, [h("span", { class: "sv-muted", text: "colour" }), this.statSel]),
      h("div", { class: "sv-search-box" }, [this.search, this.searchCount, this.results]),
      // asked for: the whole graph, as small as keeps its labels readable (9 px; the wheel zooms out further)
      h("button", { type: "button", class: "sv-btn", "data-role": "fit", text: "Fit", title: "show the whole graph, or as much as stays readable (the wheel zooms out further)", onclick: () => this.graph.fit({ minScale: FIT_BUTTON_SCALE }) }),
      h("button", { type: "button", class: "sv-btn", "data-role": "collapse-all", text: "Collapse all", onclick: () => this.collapseAll() }),
      this.notesBtn,
      this.busy,
    ]);
    this.errorBox = h("div", { class: "sv-error", "data-role": "error", role: "alert", hidden: true });
    this.banner = h("div", { class: "sv-banner", "data-role": "nonfinite-banner", hidden: true });
    // The drawing and, below it (never over it), a strip with the legend and a Monitor's
    // loss chart: a node can never hide under either, however the graph is fitted,
    // panned or zoomed. (The chart floated over the graph's corner: a fit kept clear of
    // it, but a click, a pan or an opened stage put boxes under it.)
    this.graphBox = h("div", { class: "sv-graph" });
    this.canvas = h("div", { class: "sv-canvas" });
    this.legend = h("div", { class: "sv-legend", "data-role": "legend" });
    this.lossBox = h("div", { class: "sv-loss", "data-role": "loss", hidden: true });
    const foot = h("div", { class: "sv-foot", "data-role": "foot" }, [this.legend, this.lossBox]);
    this.levelNote = h("div", { class: "sv-level-note sv-muted", hidden: true });
    this.detail = new DetailPanel(this.root, {
      onClose: () => this.closeDetail(),
      onReveal: (id) => this.reveal(id),
    });
    this.graph = new GraphView(this.canvas, {
      onSelect: (id) => this.select(id),
      onToggle: (id) => this.toggle(id),
    });
    this.empty = h("div", { class: "sv-empty sv-muted", "data-role": "empty", text: EMPTY, hidden: true });
    this.canvas.append(this.levelNote, this.empty);
    // "more below · drag to pan" in the strip too: over the drawing's corner it covered
    // the node drawn there
    foot.insertBefore(this.graph.more, this.lossBox);
    this.graphBox.append(this.canvas, foot);
    this.root.append(toolbar, this.notesList, this.errorBox, this.banner, h("div", { class: "sv-body" }, [this.graphBox, this.detail.el]));
    this.el.append(this.root);
    // Escape closes the stage panel, from the graph or the panel, and the focus goes back
    // to its stage (the search box's Escape clears the query instead; an open <select>'s
    // list takes its own Escape). Stopped here: a notebook's Escape leaves the cell.
    this.root.addEventListener("keydown", (ev) => {
      if (ev.key !== "Escape" || !this.detail.isOpen || ev.target === this.search) return;
      ev.preventDefault();
      ev.stopPropagation();
      this.closeDetail();
    });
  }

  /** Closes the panel; the focus, when it was in the widget, returns to the stage shown. */
  closeDetail() {
    const id = this.selected;
    const inside = this.root.contains(document.activeElement) || document.activeElement === document.body;
    this.select(null);
    if (id != null && inside) this.graph.focusNode(visibleRepresentative(this.index, this.expanded, id));
  }

  /** Installs a (new) model, keeping what the user opened and selected when ids persist. */
  setModel(model, { first = false } = {}) {
    this.model = model ?? { nodes: [], edges: [], probes: [] };
    if (!first && model?.history) this.store.reset(model.history);
    // show() mounts the widget empty while the kernel works: its first real model is
    // installed as a first picture (stages opened as stored, fitted).
    const fresh = first || !this.layout?.boxes.size;
    this.rebuildIndex();
    const ix = this.index;
    if (fresh) {
      for (const n of ix.nodes.values()) if (!n.collapsed && isExpandable(ix, n.id)) this.expanded.add(n.id);
    } else {
      this.expanded = new Set([...this.expanded].filter((id) => ix.nodes.has(id)));
      if (this.selected && !ix.nodes.has(this.selected)) this.selected = null;
    }
    this.levelEdges = edgesByLevel(ix);
    this.levelPorts = portsByLevel(ix); // where values enter and leave an opened stage
    this.layoutCache = new Map();
    this.title.textContent = this.model.title ?? "";
    this.title.title = this.model.title ?? "";
    if (MODES.includes(this.model.mode)) this.modeSel.value = this.model.mode;
    if (this.modeSel.disabled) {
      // A saved report cannot run the program again: say so where the picker is.
      this.modeSel.title = `Computed in mode "${this.model.mode ?? "?"}". A saved report cannot re-run the program: `
        + "call sowviz.show(...) or inspect(..., mode=...) for another mode.";
    }
    this.fillStatOptions(fresh);
    this.fillNotes();
    this.drawLoss(); // first: the chart's strip takes its height from the view before the fit
    this.relayout({ fit: fresh });
    if (this.selected) this.openDetail(this.selected); else this.detail.close();
  }

  rebuildIndex() {
    this.viewStep = shownStep(this.store.history, this.viewStep);
    this.index = indexModel(withStep(this.model, this.store.history, this.viewStep));
    // Origins are computed once in Python and stored in the model: displayed, never recomputed.
    const stored = storedOrigins(this.model, this.store.history);
    // "starts here" flags only on the Monitor step that had the NaN (the banner names
    // it and links to it from any other step)
    const steps = this.store.history?.steps ?? [];
    const drawn = this.viewStep ?? steps[steps.length - 1] ?? null;
    const here = originsOnStep(stored?.step ?? null, drawn);
    const shown = (o) => (here ? originNodes(o).reverse().find((id) => this.index.nodes.has(id)) ?? null : null);
    this.origins = { forward: shown(stored?.forward), backward: shown(stored?.backward), stored };
    this.roles = here ? nonfiniteRoles(stored, this.index) : new Map();
    this.searchCache = new Map();
  }

  /**
   * The colour picker's choices. A statistic the user picked stays while the model has
   * it; a default one follows the run's mode (`defaultStat`): a first picture, or the
   * widget switched to another mode, takes that mode's. (grad's default cotangent, kept
   * after a switch to primal, coloured a primal run by a sow's inner gradient.)
   * @param {boolean} [fresh] a first picture
   */
  fillStatOptions(fresh = false) {
    const modes = this.index.modes;
    const runMode = this.model.mode;
    const held = !fresh && this.stat && modes.includes(this.stat.mode);
    const keep = held && (this.statPicked || this.statRunMode === runMode) ? this.stat : defaultStat(modes, runMode);
    if (fresh) this.statPicked = false;
    this.stat = keep;
    this.statRunMode = runMode;
    clear(this.statSel);
    for (const mode of modes) {
      for (const [stat, def] of Object.entries(STATS)) {
        this.statSel.append(h("option", { value: `${mode}\u0000${stat}`, text: `${mode} ${def.label}`, selected: mode === keep.mode && stat === keep.stat }));
      }
    }
    // Nothing to colour by yet (a Monitor before its first step's values): a placeholder,
    // not an empty box.
    if (!modes.length) this.statSel.append(h("option", { value: "", text: "no values", selected: true }));
    this.statSel.disabled = !modes.length;
  }

  fillNotes() {
    const notes = this.model.notes ?? [];
    clear(this.notesList);
    this.notesBtn.hidden = !notes.length;
    this.notesBtn.textContent = `${notes.length} note${notes.length === 1 ? "" : "s"}`;
    for (const n of notes) {
      // a note about a node says its label (its probe's name is the node's id, `n28`),
      // and shows it when clicked
      const node = this.index.nodes.get(n.node ?? n.probe ?? "") ?? null;
      const head = node
        ? h("button", { type: "button", class: "sv-link", text: node.label, title: `show it${parentPath(this.index, node.id)}`, onclick: () => this.reveal(node.id) })
        : n.probe ? h("strong", { text: n.probe }) : null;
      // a note said alike of several stages: each is a link, numbered, its place on hover
      const others = node ? (n.nodes ?? []).filter((id) => id !== node.id && this.index.nodes.has(id)) : [];
      const more = others.length ? h("span", { class: "sv-muted", "data-role": "note-places" }, [
        ` (${others.length + 1} places: `,
        ...[node.id, ...others].flatMap((id, i) => [i ? " " : null, h("button", {
          type: "button", class: "sv-link", text: String(i + 1), title: `show it${parentPath(this.index, id)}`, onclick: () => this.reveal(id),
        })]),
        ")",
      ]) : null;
      this.notesList.append(h("li", { class: `sv-note sv-note-${noteClass(n.level)}` }, [
        head, more, head ? ": " : null, ...said(n.message ?? ""),
      ]));
    }
  }

  /** Lays out and draws the visible levels; `anchorId` stays put on screen. */
  relayout({ fit = false, anchorId = null } = {}) {
    const before = anchorId ? this.graph.screenOf(this.layout?.boxes.get(anchorId)) : null;
    this.layout = layoutView(this.index, this.expanded, this.levelEdges, this.layoutCache, this.levelPorts);
    this.faceIds = [...this.layout.boxes.keys()];
    const { faces, scale } = computeFaces(this.index, this.faceIds, this.stat);
    this.graph.draw({ index: this.index, layout: this.layout, faces, expandable: (id) => isExpandable(this.index, id) });
    this.drawLegend(scale);
    this.markOrigins();
    this.graph.setSelected(this.selected);
    this.applySearch();
    this.showLevelNote();
    this.empty.hidden = this.layout.boxes.size > 0;
    this.legend.hidden = this.layout.boxes.size === 0; // nothing drawn: no colour scale to explain
    this.fitHeight(); // before a fit: it fits into the new height
    if (fit) this.graph.fit({ minScale: FIT_MIN_SCALE });
    else if (before) this.graph.anchor(this.layout.boxes.get(anchorId), before);
  }

  refreshFaces() {
    // sparklines and value slots depend on the statistic's mode: redraw (layouts are cached)
    this.relayout({ anchorId: this.faceIds?.[0] ?? null });
  }

  drawLegend(scale) {
    clear(this.legend);
    const { mode, stat } = this.stat;
    const hasData = scale.lo <= scale.hi && [...this.index.probesByNode.keys()].length > 0;
    const grad = `linear-gradient(to right, ${VIRIDIS_STOPS.join(", ")})`;
    this.legend.append(
      h("span", { class: "sv-legend-title", text: `${mode} ${STATS[stat].label}, log scale` }),
      hasData ? h("span", { class: "sv-legend-scale" }, [
        // "≤" / "≥": values past the ends (outliers) take the end's colour
        h("span", { class: "sv-legend-tick", text: `${scale.clippedLo ? "≤ " : ""}${fmt(10 ** scale.lo)}` }),
        h("span", { class: "sv-legend-bar", style: `background: ${grad}` }),
        h("span", { class: "sv-legend-tick", text: `${scale.clippedHi ? "≥ " : ""}${fmt(10 ** scale.hi)}` }),
      ]) : h("span", { class: "sv-legend-scale sv-muted", "data-role": "legend-empty", text: "no values to colour by" }),
      h("span", { class: "sv-legend-keys" }, [
        h("span", { class: "sv-key sv-key-nan", text: "NaN/Inf" }),
        h("span", { class: "sv-key sv-key-none", text: "no data" }),
        h("span", { class: "sv-key sv-key-probe", text: "probe" }),
        // the faces' sparklines are histograms of the colouring's mode, whatever its statistic
        h("span", { class: "sv-key sv-key-spark", "data-role": "legend-spark", text: `${mode} histogram` }),
      ]),
    );
  }

  markOrigins() {
    const reps = new Map();
    for (const pass of ["forward", "backward"]) {
      const id = this.origins[pass];
      if (!id) continue;
      const rep = visibleRepresentative(this.index, this.expanded, id);
      if (!reps.has(rep)) reps.set(rep, []);
      reps.get(rep).push(pass);
    }
    this.graph.markOrigins(reps);
    for (const [id, el] of this.graph.els) {
      const role = this.roles.get(id);
      if (role && (el.dataset.nonfinite === "true" || role === "producer")) el.dataset.nonfiniteRole = role;
      else el.removeAttribute("data-nonfinite-role");
    }
    clear(this.banner);
    const rec = this.origins.stored;
    this.banner.hidden = !rec || rec.overwritten;
    if (!rec || rec.overwritten) {
      // a record of null (Python's rule ran) over non-finite values: only fills that
      // reach no result (an empty `segment_max`'s -Inf), marked in the muted colour;
      // so is a loop's fill written over inside the loop (no value holding it left)
      this.root.toggleAttribute("data-nonfinite-quiet", this.model?.nonfinite === null || !!rec?.overwritten);
      return;
    }
    this.banner.classList.toggle("sv-banner-quiet", !rec.alarm);
    // no alarm (every non-finite value masked before a result): the nodes holding them
    // are drawn in the muted colour, not the alarm's red
    this.root.toggleAttribute("data-nonfinite-quiet", !rec.alarm);
    this.banner.append(...bannerParts(this.origins, this.index, {
      onReveal: (id) => this.reveal(id),
      onShowStep: this.canShow(rec.step) ? (step) => this.showStep(step) : undefined,
      onLocate: this.options.onLocate,
      locating: this.phase === "locating",
    }));
  }

  showLevelNote() {
    const grids = [...this.layout.levels.entries()].filter(([, v]) => v.mode === "grid");
    this.levelNote.hidden = !grids.length;
    this.levelNote.textContent = grids.map(([id, v]) => `${this.index.nodes.get(id)?.label ?? id}: ${v.n} nodes in program order, ${v.hiddenEdges} edges hidden`).join(" · ");
  }

  setQuery(q) {
    this.query = q;
    this.applySearch();
  }

  applySearch() {
    const q = this.query.trim();
    clear(this.results);
    if (!q) {
      this.hits = [];
      this.graph.setSearch(null, new Map());
      this.searchCount.textContent = "";
      this.results.hidden = true;
      return;
    }
    this.hits = rankHits(this.index, searchNodes(this.index, q, this.searchCache));
    const drawn = new Set();
    const inside = new Map();
    for (const id of this.hits) {
      if (this.graph.els.has(id)) { drawn.add(id); continue; }
      const rep = visibleRepresentative(this.index, this.expanded, id);
      inside.set(rep, (inside.get(rep) ?? 0) + 1);
    }
    this.graph.setSearch(drawn, inside);
    this.searchCount.textContent = `${this.hits.length} match${this.hits.length === 1 ? "" : "es"}`;
    for (const id of this.hits.slice(0, 30)) {
      const n = this.index.nodes.get(id);
      this.results.append(h("li", {}, [h("button", {
        type: "button", class: "sv-result", "data-node": id, onclick: () => this.reveal(id),
      }, [
        h("span", { text: n.label }), h("span", { class: "sv-muted", text: ` ${n.kind}` }),
        h("span", { class: "sv-muted sv-result-path", "data-role": "result-path", text: parentPath(this.index, id) }),
      ])]));
    }
    this.results.hidden = document.activeElement !== this.search || !this.hits.length;
    this.search.onfocus = () => { this.results.hidden = !this.hits.length; };
    this.search.onblur = () => setTimeout(() => { this.results.hidden = true; }, 150);
  }

  toggle(id) {
    if (!isExpandable(this.index, id)) return;
    const opening = !this.expanded.has(id);
    if (opening) for (const s of soleChain(this.index, id)) this.expanded.add(s);
    else this.expanded.delete(id);
    this.relayout({ anchorId: id });
    // the stage opened (or closed) where it was clicked, in view and readable: its
    // contents are not left off-screen, nor drawn at the tiny zoom of a whole-graph Fit
    this.graph.showBox(this.layout.boxes.get(id), FIT_MIN_SCALE);
  }

  collapseAll() {
    this.expanded.clear();
    this.relayout({ fit: true });
  }

  /** Expands the stages around `id`, selects it and centres it. */
  reveal(id) {
    for (const a of pathToReveal(this.index, id)) this.expanded.add(a);
    this.relayout();
    this.select(id);
    const box = this.layout.boxes.get(id);
    if (box) this.graph.centreOn(box, 0.8);
  }

  select(id) {
    this.selected = id;
    this.graph.setSelected(id);
    if (id == null) { this.detail.close(); this.fitHeight(); return; }
    this.openDetail(id);
    this.fitHeight(); // stacked under the graph (a narrow widget), the panel gets room
    // The panel narrows the graph: keep the selected node in view.
    const box = this.layout?.boxes.get(id);
    if (box) this.graph.ensureVisible(box);
  }

  openDetail(id) {
    this.detail.open(this.index, id, { history: this.store.history, origins: this.origins, faceMode: this.stat?.mode });
  }

  /** The open panel drawn again from the current index, where it was scrolled to. */
  reopenDetail() {
    const top = this.detail.el.scrollTop;
    this.openDetail(this.selected);
    this.detail.el.scrollTop = top;
  }

  /**
   * What Python is doing (widget traits `phase` and `status`): a status line with a
   * spinner while it works, the message as an alert on an error, nothing when ready.
   * Text only: the message reaches the page through textContent.
   * @param {string} phase @param {string} text
   */
  setStatus(phase, text) {
    const was = this.phase;
    this.phase = phase;
    const working = WORKING.has(phase);
    this.busy.hidden = !working;
    this.busy.dataset.phase = phase;
    this.root.dataset.phase = phase;
    this.statusText.replaceChildren(...said(working ? text || `${phase}…` : ""));
    this.root.toggleAttribute("data-busy", working);
    const err = phase === "error" ? text || "error" : "";
    this.errorBox.hidden = !err;
    this.errorBox.replaceChildren(...said(err));
    const empty = this.layout ? this.layout.boxes.size === 0 : true;
    const failed = phase === "error" && empty;
    this.empty.replaceChildren(h("span", {}, said(working && empty ? text || `${phase}…` : failed ? FAILED : EMPTY)));
    // a program that never ran: the error, not 600 px of empty canvas above the traceback
    if (failed || this.failedHeight) {
      this.root.style.height = failed ? "160px" : "";
      this.root.style.minHeight = failed ? "0" : "";
      this.failedHeight = failed;
      this.autoHeight = "";
      if (!failed) this.fitHeight();
    }
    this.empty.classList.toggle("sv-empty-working", working && empty);
    if ((was === "locating") !== (phase === "locating")) this.markOrigins();
  }

  /**
   * The notebook widget's height follows the graph and, stacked in a narrow widget,
   * the open panel (`viewport.widgetHeight`). Not the report, which fills its window,
   * nor a widget the user resized with its handle (its height is then theirs), nor a
   * program that failed (its error box is short).
   */
  fitHeight() {
    const r = this.root;
    const b = this.graph.bounds;
    if (r.classList.contains("sv-standalone") || this.failedHeight || !r.clientWidth) return;
    if (r.style.height && r.style.height !== this.autoHeight) return; // resized by the user
    const body = this.graphBox.parentElement;
    const stacked = body ? getComputedStyle(body).flexDirection === "column" : false;
    const border = r.offsetHeight - r.clientHeight;
    const { height, drawing } = widgetHeight({
      chrome: (body?.offsetTop ?? 0) + border,
      foot: this.graphBox.offsetHeight - this.canvas.offsetHeight,
      graphH: b?.h && this.layout?.boxes.size ? b.h : 0,
      windowH: globalThis.innerHeight || 900,
      stacked,
      panelH: this.detail.isOpen ? this.detail.el.scrollHeight : 0,
    });
    // stacked, the graph keeps its share: the panel's rest scrolls in the widget
    this.graphBox.style.minHeight = drawing ? `${drawing}px` : "";
    this.autoHeight = `${height}px`;
    if (r.style.height !== this.autoHeight) r.style.height = this.autoHeight;
  }

  /** Coalesces Monitor steps into one redraw per animation frame. */
  scheduleHistory() {
    if (this.historyPending) return;
    this.historyPending = true;
    const run = () => {
      this.historyPending = false;
      if (this.destroyed) return;
      this.rebuildIndex();
      const { faces, scale } = computeFaces(this.index, this.faceIds, this.stat);
      // in place (the layout is the same): sparklines, texts and NaN badges follow the
      // step, as a fresh drawing of it would show them
      this.graph.updateFaces(this.index, faces);
      this.drawLegend(scale);
      this.markOrigins();
      this.drawLoss();
      // a search (`is:nan`) asks the step drawn: its marks and matches follow it
      if (this.query.trim()) this.applySearch();
      if (this.detail.isOpen && this.selected) {
        // Following the latest step, the whole panel is of it (its table and histograms
        // kept the step it was opened at), kept where it was scrolled to; on a past
        // step only the history charts grow.
        if (this.detail.history && this.viewStep != null) this.detail.refreshHistory(this.store.history);
        else this.reopenDetail();
      }
    };
    (globalThis.requestAnimationFrame ?? setTimeout)(run);
  }

  /** Whether `step` is a recorded step of the history other than the one drawn. */
  canShow(step) {
    const steps = this.store.history?.steps ?? [];
    return step != null && steps.includes(step) && step !== (this.viewStep ?? steps[steps.length - 1]);
  }

  /**
   * Draws the values of recorded step `step` (the loss chart's points, the banner's
   * link; null or the latest step: the latest), keeping what is open and selected.
   * @param {number|null} step
   */
  showStep(step) {
    this.viewStep = shownStep(this.store.history, step);
    this.rebuildIndex();
    this.relayout({ anchorId: this.selected ?? this.faceIds?.[0] ?? null });
    this.drawLoss();
    if (this.detail.isOpen && this.selected) this.openDetail(this.selected);
  }

  drawStepNote() {
    const steps = this.store.history?.steps ?? [];
    this.stepNote.hidden = !steps.length;
    if (!steps.length) return;
    const latest = steps[steps.length - 1];
    const past = this.viewStep != null;
    this.stepNote.classList.toggle("sv-step-past", past);
    this.stepNote.replaceChildren(
      h("span", { class: past ? null : "sv-muted", "data-role": "step-shown", text: `step ${this.viewStep ?? latest}` }),
      past
        // short: the toolbar must not wrap (a narrow notebook cell)
        ? h("button", { type: "button", class: "sv-link", "data-role": "step-latest", text: `latest (${latest})`, title: "back to the latest recorded step", onclick: () => this.showStep(null) })
        : h("span", { class: "sv-muted", text: " (latest)" }),
    );
    this.stepNote.title = "The values drawn are those of this recorded step. Click a point of the loss chart to see another step.";
  }

  drawLoss() {
    this.drawStepNote();
    const hist = this.store.history;
    // every step's loss (`history.losses`), the recorded steps' in an older model
    const series = lossSeries(hist);
    const has = hist?.steps?.length && (series.loss.some((v) => v != null) || nonfiniteSteps(hist).length > 0);
    const appeared = has && this.lossBox.hidden;
    this.lossBox.hidden = !has;
    if (!has) return;
    // A live Monitor's chart appears with its first step, and the view gets shorter:
    // fit again, unless the user has moved the view since the last fit.
    if (appeared && this.layout && !this.graph.moved) {
      (globalThis.requestAnimationFrame ?? setTimeout)(() => this.graph.fit({ minScale: FIT_MIN_SCALE }));
    }
    if (!this.lossChart) {
      this.lossChart = h("div", { class: "sv-chart" });
      this.lossTitle = h("div", { class: "sv-legend-title", "data-role": "loss-title", text: "loss" });
      this.lossBox.append(this.lossTitle, this.lossChart);
    }
    const c = chartColours(this.root);
    const bad = nonfiniteSteps(hist);
    const nBad = nonfiniteCount(hist, bad);
    // (beside the chart, in a narrow column: `non-finite` is not cut at its hyphen)
    const nSkipped = skippedCount(hist);
    // (steps a guarded update skipped, declared expected: said, muted, not an alarm)
    const skipped = nSkipped ? [" · ", h("span", { class: "sv-nowrap sv-muted", "data-role": "skipped", text: `${nSkipped} skipped` }), ` step${nSkipped > 1 ? "s" : ""}`] : [];
    this.lossTitle.replaceChildren(...(bad.length
      ? ["loss · ", h("span", { class: "sv-nowrap", text: `${nBad} non-finite` }), ` step${nBad > 1 ? "s" : ""} (first: ${bad[0]})`, ...skipped]
      : ["loss", ...skipped]));
    this.lossTitle.classList.toggle("sv-bad", bad.length > 0);
    const shown = this.viewStep ?? hist.steps[hist.steps.length - 1];
    const plot = drawLines(this.lossChart, series.steps, [{ name: "loss", y: series.loss, colour: c.accent }], { colours: c, width: LOSS_W, height: LOSS_H, yTitle: "", nonfinite: bad, marker: shown, compact: true });
    if (!this.lossClicks) {
      // a click on the chart draws the values of the step clicked (the nearest recorded
      // one: with `every=N` the line has every step, the summaries the recorded ones)
      this.lossClicks = true;
      Promise.resolve(plot).then((gd) => gd?.on?.("plotly_click", (ev) => {
        const x = ev?.points?.[0]?.x;
        if (typeof x === "number") this.showStep(nearestStep(this.store.history, x));
      }));
    }
  }

  onTheme() {
    if (this.detail.isOpen) this.detail.redraw();
    this.drawLoss();
  }

  /** Public handle methods */
  update(model) { this.setModel(model); }
  pushStep(step) { this.store.push(step); }

  destroy() {
    this.destroyed = true;
    for (const c of this.cleanups) c();
    this.detail.close();
    if (this.lossChart) purge(this.lossChart);
    this.graph.destroy();
    this.root.remove();
  }
}

export { STAGE_KINDS, parentPath };

