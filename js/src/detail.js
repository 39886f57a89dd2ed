// The detail panel [data-role="detail"]: metadata, one histogram per captured mode,
// the statistics table, and for a Monitor the history of the selected probe.

import { h, clear, noteClass, said, withCode } from "./dom.js";
import { drawHistogram, drawHistoryHeatmap, drawLines, drawSignedLog, modeColour, purge } from "./charts.js";
import { hasSigned, signedLog } from "./loghist.js";
import { probeNonfiniteSteps } from "./history.js";
import { chartColours } from "./theme.js";
import { fmt } from "./stats.js";
import { parentPath } from "./search.js";
import { chartNorm, nonfiniteCount, nonfiniteText } from "./nonfinite.js";
import { orderModes } from "./model.js";
import { faceOutputs, isInputLeaf, outputLabel, ownOutputs } from "./faces.js";
import { gradHistory, gradNote, paramRows, paramTable, readRows } from "./params.js";
import { iterationBlock } from "./iterations.js";
import { repeatBlock } from "./repeatview.js";

// Leaf colours of the gradient-norm chart (Tableau 10).
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7"];

// `count` is the number of finite values, over which min … absmax are taken.
export const TABLE_ROWS = [
  ["count", "finite"], ["nan", "NaN"], ["posinf", "+Inf"], ["neginf", "−Inf"], ["zeros", "zeros"],
  ["min", "min"], ["max", "max"], ["mean", "mean"], ["std", "std"], ["l2", "l2"], ["absmax", "absmax"],
];

export class DetailPanel {
  /**
   * @param {HTMLElement} root the widget root (for theme colours)
   * @param {{onClose: () => void, onReveal: (id: string) => void}} handlers
   */
  constructor(root, handlers) {
    this.root = root;
    this.handlers = handlers;
    this.el = h("aside", { class: "sv-detail", "data-role": "detail", hidden: true, "aria-label": "details" });
    this.scale = "linear";
    this.logY = false;
    this.probeByNode = new Map();
    this.charts = [];
    this.nodeId = null;
  }

  get isOpen() {
    return !this.el.hidden;
  }

  close() {
    this.purgeCharts();
    clear(this.el);
    this.el.hidden = true;
    this.nodeId = null;
  }

  purgeCharts() {
    for (const c of this.charts) purge(c);
    this.charts = [];
  }

  /**
   * @param {import("./model.js").ModelIndex} index
   * @param {string} id
   * @param {{history: any, origins: {forward: string|null, backward: string|null}, faceMode?: string}} ctx
   *   `faceMode`: the mode the faces show (the colouring's), whose output the panel opens on
   */
  open(index, id, ctx) {
    this.index = index;
    this.ctx = ctx;
    this.nodeId = id;
    this.purgeCharts();
    clear(this.el);
    this.el.hidden = false;
    // the colours every chart below is drawn in (a theme switch draws the panel again)
    this.drawnColours = JSON.stringify(chartColours(this.root));
    const node = index.nodes.get(id);
    if (!node) return this.close();
    const probes = index.probesByNode.get(id) ?? [];
    let pid = this.probeByNode.get(id);
    // unpicked: the output the node's face describes (a chain's `[1]` when its `[0]`,
    // an injected learning rate, has no gradient), not its first, which the face did
    // not show
    if (!probes.some((p) => p.id === pid)) pid = (faceOutputs(probes, node, ctx.faceMode)[0] ?? probes[0])?.id;
    const probe = probes.find((p) => p.id === pid) ?? null;
    // the rows about the values (dtype, output, captured) follow the probe picked
    this.metaEl = this.meta(index, node, probes, probe);
    this.el.append(this.header(node), this.metaEl);
    const alert = this.nonfiniteAlert(index, id, probes, ctx.origins);
    if (alert) this.el.append(alert);
    if (node.repeats) { // a group of identical blocks: each block's statistics (repeats.js)
      const rep = repeatBlock(index, id, (c) => this.handlers.onReveal(c));
      this.el.append(rep.el);
      rep.draw(chartColours(this.root), Math.max(220, (this.el.clientWidth || 380) - 34));
      this.charts.push(...rep.charts);
    }
    const rows = node.kind === "input" ? [] : paramRows(index, id);
    if (rows.length) {
      this.drawGradHistory(rows, ctx.history); // above the table: a run has many leaves
      this.el.append(paramTable(rows, (c) => this.handlers.onReveal(c), undefined, gradNote(index, id, rows)));
    }
    // a stage's own parameters (what its equations read), below its own statistics
    const reads = rows.length || node.kind === "input" ? [] : readRows(index, id);
    const readTable = reads.length
      ? paramTable(reads, (c) => this.handlers.onReveal(c), `arguments read here: ${reads.length}`)
      : null;
    readTable?.setAttribute("data-role", "stage-params");
    const fields = node.kind === "tesseract" ? tesseractInputs(index, node) : null;
    if (fields) this.el.append(fields);
    if (!probes.length) {
      if (!rows.length) this.el.append(this.noProbes(index, id));
      if (readTable) this.el.append(readTable);
      return;
    }
    if (probes.length > 1) this.el.append(this.probePicker(probes, probe));
    this.body = h("div", { class: "sv-detail-body" });
    this.el.append(this.body);
    this.drawProbe(probe);
    if (readTable) this.el.append(readTable);
  }

  /** A parameter group in a Monitor: its leaves' gradient norms over the steps. */
  drawGradHistory(rows, hist) {
    if (!hist?.steps?.length) return;
    const g = gradHistory(rows, hist);
    if (!g.series.length) return;
    const colours = chartColours(this.root);
    const width = Math.max(220, (this.el.clientWidth || 380) - 34);
    const chart = h("div", { class: "sv-chart", "data-role": "param-grad-history" });
    const key = h("div", { class: "sv-param-key", "data-role": "param-grad-key" }, g.series.map((s, i) => h("span", { "data-node": s.id, title: s.name }, [
      h("i", { class: "sv-swatch", style: `background:${PALETTE[i % PALETTE.length]}` }), s.name,
    ])));
    const shown = g.series.length < g.total ? `the ${g.series.length} largest of ${g.total} leaves (at the last step)` : `${g.total} leaves`;
    this.el.append(h("section", { class: "sv-history" }, [
      h("h4", { class: "sv-section", text: `gradient norms over ${hist.steps.length} steps: ${shown}` }), chart, key,
    ]));
    this.charts.push(chart);
    const series = g.series.map((s, i) => ({ name: s.name, y: s.y, colour: PALETTE[i % PALETTE.length] }));
    drawLines(chart, hist.steps, series, { colours, width, height: 160, yTitle: "‖grad‖₂", nonfinite: g.nonfinite, legend: false });
  }

  header(node) {
    // where the stage sits, as the user names it (never the model's internal id, `n4`)
    const where = placeOf(this.index, node.id);
    return h("div", { class: "sv-detail-head" }, [
      h("div", {}, [
        h("h3", { class: "sv-detail-title", text: node.label, title: node.label }),
        h("span", { class: `sv-pill sv-kind-${node.kind.replace(/[^a-z0-9_-]/gi, "_")}`, text: node.kind }),
        where ? h("span", { class: "sv-muted sv-where", "data-role": "detail-path", text: where, title: where }) : null,
      ]),
      h("button", { class: "sv-close", type: "button", title: "close", "aria-label": "close", text: "×", onclick: () => this.handlers.onClose() }),
    ]);
  }

  /** @param {any} probe the probe shown (the picker's choice): its dtype, output and shape */
  meta(index, node, probes, probe) {
    const rows = [];
    const src = node.source;
    if (node.primitive) rows.push(["primitive", node.primitive]);
    if (node.shapes?.length) rows.push(["shape", node.shapes.join(", ")]);
    const s0 = probe ? Object.values(probe.summaries)[0] : null;
    if (s0?.dtype) rows.push(["dtype", `${s0.dtype}${s0.complex ? " (statistics of |x|)" : ""}`]);
    // which output the values are (a scan's carry [0] or its stacked ys [1]; a
    // Tesseract's field read alone)
    // (named as its face names it: `outputLabel`)
    if (probe?.leaf) rows.push([isInputLeaf(probe.leaf) ? "input" : "output", outputLabel(probe) + (probes.length > 1 ? ` (${probes.indexOf(probe) + 1} of ${probes.length})` : "")]);
    if (s0?.shape) rows.push(capturedRow(probe, s0));
    if (node.collectives?.length) {
      rows.push(["communicates", node.collectives.join(", "), `collectives its equations call (values moved between devices): ${node.collectives.join(", ")}`]);
    }
    // a group of an argument's leaves holds none: "equations 0" said nothing of it
    if (node.leaves) rows.push(["leaves", `${node.leaves.count} ${node.leaves.kind}${node.leaves.count === 1 ? "" : "s"}`]);
    else if (node.n_eqns > 1 || (index.children.get(node.id)?.length ?? 0) > 0) rows.push(["equations", String(node.n_eqns)]);
    if (index.model.device) rows.push(["device", index.model.device]);
    if (src?.file) {
      // the file's name and the line, which a cut-off path hid; the whole path on hover
      const at = `:${src.line ?? "?"}${src.function ? ` (${src.function})` : ""}`;
      rows.push(["source", `${src.file.split("/").pop()}${at}`, `${src.file}${at}`]);
    }
    // a note names the probe it is about (a sow's name) or the node (its id: a stage's)
    const notes = (index.model.notes ?? []).filter((n) => n.probe === node.id || n.nodes?.includes(node.id) || probes.some((p) => p.name === n.probe));
    return h("div", {}, [
      h("dl", { class: "sv-meta" }, rows.flatMap(([k, v, full]) => [h("dt", { text: k }), h("dd", { text: v, title: full ?? v, "data-meta": k })])),
      ...notes.map((n) => h("p", { class: `sv-note sv-note-${noteClass(n.level)}` }, said(n.message))),
    ]);
  }

  nonfiniteAlert(index, id, probes, origins) {
    if (!index.subtreeNonfinite.has(id)) return null;
    const parts = probes.map((p) => outputNonfinite(p, probes.length > 1)).filter(Boolean);
    const lines = [parts.length ? parts.join(" · ") : "a stage inside holds NaN/Inf values"];
    const stored = origins.stored;
    if (origins.forward === id) lines.push(`Forward pass: ${stored?.forward?.message ?? "NaN/Inf first made here"}.`);
    if (origins.backward === id) lines.push(`Backward pass: ${stored?.backward?.message ?? "NaN/Inf first made here"}.`);
    if (origins.forward !== id && origins.backward !== id && stored?.propagators.includes(id)) {
      lines.push("Passes on non-finite values made upstream.");
    }
    // Masked before any result (a solver's buffer pre-filled with Inf): said, not alarmed.
    let quiet = stored != null && !stored.alarm;
    if (quiet) lines.push("Masked before any result: no result is non-finite (no alarm).");
    // A record of null (Python's rule ran, as app.js `markOrigins` reads it): only fill
    // values reaching no result, which the faces draw muted; said why, not alarmed (an
    // empty `segment_max`'s -Inf read the same red as a NaN, and GNN users chased it).
    if (stored == null && index.model.nonfinite === null) {
      quiet = true;
      lines.push(fillNote(index, id));
    }
    return h("div", { class: quiet ? "sv-alert sv-alert-quiet" : "sv-alert", role: quiet ? "note" : "alert" },
      // Python's messages and `fillNote` mark code with backticks, as the banner reads them.
      lines.map((t) => h("div", {}, said(t))));
  }

  noProbes(index, id) {
    const inside = [];
    const stack = [...(index.children.get(id) ?? [])];
    while (stack.length && inside.length < 40) {
      const c = stack.shift();
      if (index.probesByNode.has(c)) inside.push(c);
      stack.push(...(index.children.get(c) ?? []));
    }
    if (!inside.length) {
      // An equation inside a stage (where `locate_nonfinite()` opens the graph: an
      // fp16 overflow's `integer_pow` in a line's box) has none: its stage has them.
      const at = carrierOf(index, id);
      if (!at) return h("p", { class: "sv-muted", text: "No values were captured at this node." });
      return h("p", { class: "sv-muted", "data-role": "carrier" }, [
        h("span", { text: "No values were captured at this equation (capture=\"all\" captures every equation's). Its stage carries them: " }),
        h("button", { type: "button", class: "sv-link", text: index.nodes.get(at).label, onclick: () => this.handlers.onReveal(at) }),
      ]);
    }
    return h("div", {}, [
      h("p", { class: "sv-muted", text: "No values captured on the stage itself. Probes inside:" }),
      h("ul", { class: "sv-probe-list" }, inside.map((c) => h("li", {}, [
        h("button", { type: "button", class: "sv-link", text: index.nodes.get(c).label, onclick: () => this.handlers.onReveal(c) }),
      ]))),
    ]);
  }

  probePicker(probes, current) {
    const sel = h("select", { class: "sv-select", "data-role": "probe", "aria-label": "probe" },
      probes.map((p) => h("option", { value: p.id, text: probeOption(p), selected: p.id === current.id })));
    sel.addEventListener("change", () => {
      this.probeByNode.set(this.nodeId, sel.value);
      this.purgeCharts();
      clear(this.body);
      const probe = probes.find((p) => p.id === sel.value);
      const node = this.index.nodes.get(this.nodeId);
      const meta = this.meta(this.index, node, probes, probe);
      this.metaEl?.replaceWith(meta);
      this.metaEl = meta;
      this.drawProbe(probe);
    });
    return h("label", { class: "sv-row" }, [h("span", { class: "sv-muted", text: "probe" }), sel]);
  }

  /**
   * @param {boolean} signed offer the signed log view (the summaries carry `loghist.neg`)
   * @param {boolean} [logged] offer the log views (the summaries carry a `loghist`)
   */
  controls(signed, logged = true) {
    const seg = (value, label) => h("button", {
      type: "button", class: "sv-seg", "data-scale": value, "aria-pressed": String(this.scale === value), text: label,
      onclick: () => { this.scale = value; this.redraw(); },
    });
    const logY = h("input", { type: "checkbox", checked: this.logY, "data-role": "log-count" });
    logY.addEventListener("change", () => { this.logY = logY.checked; this.redraw(); });
    return h("div", { class: "sv-row sv-controls", "data-role": "hist-scale" }, [
      h("div", { class: "sv-segmented" }, [seg("linear", "linear"), logged ? seg("log", "log₁₀|x|") : null, signed ? seg("signed", "signed log") : null]),
      h("label", { class: "sv-check" }, [logY, " log count"]),
    ]);
  }

  drawProbe(probe) {
    this.probe = probe;
    const modes = orderModes(Object.keys(probe.summaries));
    const signed = modes.some((m) => hasSigned(probe.summaries[m]?.loghist));
    if (this.scale === "signed" && !signed) this.scale = "log"; // this probe's summaries lack sign counts
    // a Monitor's past step keeps its linear histogram only (`history.withStep`)
    const logged = modes.some((m) => probe.summaries[m]?.loghist);
    if (!logged) this.scale = "linear";
    this.body.append(this.controls(signed, logged));
    const colours = chartColours(this.root);
    const width = Math.max(220, (this.el.clientWidth || 380) - 34);
    const blocks = modes.map((mode) => {
      const target = h("div", { class: "sv-chart", "data-mode": mode });
      const s = probe.summaries[mode];
      const title = h("h4", { class: "sv-chart-title" }, [
        h("span", { class: "sv-swatch", style: `background:${modeColour(colours, mode)}` }),
        mode,
        nonfiniteCount(s) > 0 ? h("span", { class: "sv-bad", text: ` ${nonfiniteCount(s)} non-finite` }) : null,
      ]);
      const counts = h("div", { class: "sv-special", "data-role": "special-counts", "data-mode": mode });
      const iter = s?.per_iteration ? iterationBlock(mode, s) : null;
      this.body.append(h("div", { class: "sv-chart-block" }, [title, target, counts, iter?.el ?? null]));
      return { mode, target, s, counts, iter };
    });
    this.blocks = blocks;
    const why = noCotangentNote(this.index.model, probe, this.index);
    // (its names in backticks, `jax.lax.stop_gradient`, shown as code: `withCode`, text nodes only)
    if (why) this.body.append(h("p", { class: "sv-muted", "data-role": "no-cotangent" }, withCode(why)));
    this.body.append(this.statsTable(probe, modes));
    this.drawCharts(colours, width);
    this.drawHistory(probe, modes, colours, width);
  }

  drawCharts(colours, width) {
    for (const b of this.blocks) {
      if (this.scale === "signed" && hasSigned(b.s?.loghist)) {
        drawSignedLog(b.target, b.s.loghist, { colours, mode: b.mode, logY: this.logY, width });
      } else {
        const hist = this.scale === "linear" ? b.s?.hist : b.s?.loghist;
        // a complex value's statistics are of |x| (its summary's `complex`): the axis says so
        const title = b.s?.complex && this.scale === "linear" ? `|${b.mode}|` : null;
        drawHistogram(b.target, hist ?? null, { colours, mode: b.mode, scale: this.scale === "linear" ? "linear" : "log", logY: this.logY, width, title });
      }
      if (!this.charts.includes(b.target)) this.charts.push(b.target);
      b.counts.replaceChildren(...specialCounts(b.s, this.scale));
      if (b.iter) {
        b.iter.draw(colours, width);
        for (const c of b.iter.charts) if (!this.charts.includes(c)) this.charts.push(c);
      }
    }
  }

  redraw() {
    if (!this.isOpen) return;
    // a theme switch: every chart takes the new colours, also those of a group of blocks
    // and of parameter gradients, which have no histogram blocks (their panel kept the
    // old theme's text: white on white)
    if (JSON.stringify(chartColours(this.root)) !== this.drawnColours) return this.reopen();
    if (!this.blocks) return;
    for (const b of this.el.querySelectorAll(".sv-seg")) b.setAttribute("aria-pressed", String(b.dataset.scale === this.scale));
    const colours = chartColours(this.root);
    const width = Math.max(220, (this.el.clientWidth || 380) - 34);
    this.drawCharts(colours, width);
    if (this.history) this.refreshHistory(this.ctx.history);
  }

  /** Draws the open panel again, where it was scrolled to. */
  reopen() {
    const top = this.el.scrollTop;
    this.open(this.index, this.nodeId, this.ctx);
    this.el.scrollTop = top;
  }

  statsTable(probe, modes) {
    // (a complex value's min, max, mean, ... are of |x|: "min 0.5" of values whose real parts
    // are all -0.5 read wrong under a bare "primal")
    const head = h("tr", {}, [h("th", { text: "" }), ...modes.map((m) => h("th", { text: probe.summaries[m]?.complex ? `|${m}|` : m }))]);
    const rows = TABLE_ROWS.map(([key, label]) => h("tr", { "data-stat": key }, [
      h("th", { text: label }),
      ...modes.map((m) => {
        const s = probe.summaries[m];
        // with no finite value, the statistics over the finite values (l2 too: null;
        // 0.0 from older writers) are "—", not as if the values were zeros (nor of no
        // values at all: an empty slice's l2 is no gradient of 0); marked as NaN/Inf
        // when that is why
        const over = !["count", "nan", "posinf", "neginf", "zeros"].includes(key);
        const v = over && s?.count === 0 ? null : s?.[key];
        const none = over && s?.count === 0 && nonfiniteCount(s) > 0;
        const bad = (["nan", "posinf", "neginf"].includes(key) && v > 0) || none;
        return h("td", {
          class: bad ? "sv-bad" : null, text: fmt(v),
          title: none ? `no finite value (${nonfiniteText(s)})` : null, "data-nonfinite": none ? "true" : null,
        });
      }),
    ]));
    return h("table", { class: "sv-stats", "data-role": "stats" }, [h("thead", {}, [head]), h("tbody", {}, rows)]);
  }

  drawHistory(probe, modes, colours, width) {
    this.history = null;
    const hist = this.ctx.history;
    if (!hist?.steps?.length || !hist.probes?.[probe.id]) return;
    this.history = h("section", { class: "sv-history", "data-role": "history" }, [h("h4", { class: "sv-section", text: `over ${hist.steps.length} steps` })]);
    this.body.append(this.history);
    this.historyCharts = [];
    for (const mode of modes) {
      if (!hist.probes[probe.id][mode]) continue;
      const heat = h("div", { class: "sv-chart", "data-history": "heatmap", "data-mode": mode });
      const lines = h("div", { class: "sv-chart", "data-history": "norms", "data-mode": mode });
      this.history.append(h("h4", { class: "sv-chart-title", text: `${mode}: distribution and norms` }), heat, lines);
      this.historyCharts.push({ mode, heat, lines });
      this.charts.push(heat, lines);
    }
    this.refreshHistory(hist, colours, width);
  }

  /** Redraws the history charts (after a new Monitor step). */
  refreshHistory(hist, colours = chartColours(this.root), width = Math.max(220, (this.el.clientWidth || 380) - 34)) {
    if (!this.history || !this.probe) return;
    this.ctx.history = hist;
    const byMode = hist.probes?.[this.probe.id] ?? {};
    for (const c of this.historyCharts) {
      const list = byMode[c.mode] ?? [];
      drawHistoryHeatmap(c.heat, hist.steps, list.map((s) => s?.hist ?? null), { colours, mode: c.mode, width });
      const col = modeColour(colours, c.mode);
      drawLines(c.lines, hist.steps, [
        { name: "l2", y: list.map(chartNorm), colour: col },
        { name: "absmax", y: list.map((s) => s?.absmax ?? null), colour: colours.muted, dash: "dot" },
      ], { colours, width, yTitle: "norm", nonfinite: probeNonfiniteSteps(hist.steps, list) });
    }
    const title = this.history.querySelector(".sv-section");
    if (title) title.textContent = `over ${hist.steps.length} steps`;
  }
}

/**
 * Why a floating value of a run that computes gradients shows no cotangent ("" when it
 * has one, or the run computes none): the gradient sends nothing back to a value the
 * differentiated arguments do not reach (a forces model's `pair_distance`, of the
 * positions only, under a gradient w.r.t. the parameters). Its box was grey with only
 * "primal" in the panel, and nothing said why. Python says which of two reasons it is
 * (`no_cotangent`): a value that does not reach the differentiated output (an aux the
 * loss never reads, a Flax Linen `self.sow` of an encoder's outputs) depends on the
 * arguments all the same, and read as detached from them; a value behind the user's
 * `jax.lax.stop_gradient` (a TD or GAE target, `"stopped"`) depends on them too, and its
 * note names the cut and its line (`stopped_by`); a value computed inside a custom
 * derivative rule (diffrax's vector field, inside Equinox's checkpointed `while`, a
 * `jax.custom_vjp`) has its gradient taken by the rule, not through this code
 * (`"custom_rule"`): the note names the rule and the stage where the gradient is seen
 * again; an older model says none of these.
 * @param {{modes?: string[]}} model
 * @param {{summaries: Record<string, any>, no_cotangent?: string, node?: string,
 *   stopped_by?: {primitive: string, source?: {file: string, line: number} | null},
 *   custom_rule?: {kind: string, function?: string | null, source?: {file: string, line: number | null} | null}}} probe
 * @param {{nodes: Map<string, {label: string, parent?: string | null}>,
 *   probesByNode: Map<string, {summaries: Record<string, any>}[]>}} [index] the model's
 *   index, to name the stage around the rule whose gradient is shown */
export function noCotangentNote(model, probe, index) {
  const primal = probe.summaries.primal;
  // (a sow under a derivative `fn` takes itself keeps its inner levels in its keys,
  // innermost first: its outer gradient is `primal.cotangent`, and read as missing)
  const hasCotangent = Object.keys(probe.summaries).some((k) => k === "cotangent" || k.endsWith(".cotangent"));
  if (!model.modes?.includes("cotangent") || hasCotangent || !primal) return "";
  if (primal.dtype && !/^(float|bfloat|complex)/.test(primal.dtype)) return "";
  if (probe.no_cotangent === "unreached") {
    return "No cotangent: this value does not reach the differentiated output, so its gradient is zero " +
      "(it may still depend on the differentiated arguments; it is probed beside the program's data flow).";
  }
  if (probe.no_cotangent === "stopped") {
    const by = probe.stopped_by;
    return `No cotangent: gradient stopped by ${stoppedByText(by)}: it depends on the differentiated ` +
      "arguments; its cotangent is cut by design.";
  }
  if (probe.no_cotangent === "custom_rule" && probe.custom_rule) {
    const rule = probe.custom_rule;
    const src = rule.source ? ` (${rule.source.file}${rule.source.line == null ? "" : `:${rule.source.line}`})` : "";
    const fn = rule.function ? ` \`${rule.function}\`` : "";
    const seen = index && probe.node ? gradientSeenAt(index, probe.node) : null;
    return `No cotangent here: this value is computed inside the \`jax.${rule.kind}\` function${fn}${src}, ` +
      "whose gradient is its own rule's (a separate backward program), not this code's, so no cotangent " +
      "flows through it" + (seen ? `; the gradient is seen at ${seen}, around it.` : ".");
  }
  return "No cotangent: this value does not depend on the differentiated arguments " +
    "(or a custom derivative rule replaced the code that computes it), so the gradient sends nothing back to it.";
}

/** The label of the nearest stage around `nodeId` with a captured cotangent, or null.
 * @param {{nodes: Map<string, {label: string, parent?: string | null}>,
 *   probesByNode: Map<string, {summaries: Record<string, any>}[]>}} index
 * @param {string} nodeId */
function gradientSeenAt(index, nodeId) {
  for (let id = index.nodes.get(nodeId)?.parent; id != null; id = index.nodes.get(id)?.parent) {
    const probes = index.probesByNode.get(id) ?? [];
    if (probes.some((p) => Object.keys(p.summaries ?? {}).some((k) => k === "cotangent" || k.endsWith(".cotangent")))) {
      return index.nodes.get(id)?.label ?? null;
    }
  }
  return null;
}

/** The equation that cut a value's tangent, in words: "`jax.lax.stop_gradient` at dqn.py:17"
 * (an integer result's primitive, `argmax`, or one of zero derivative, `floor`, by name).
 * @param {{primitive?: string, source?: {file: string, line: number} | null} | undefined} by */
export function stoppedByText(by) {
  const name = by?.primitive ?? "stop_gradient";
  const what = name === "stop_gradient" ? "`jax.lax.stop_gradient`" : `\`${name}\``;
  const src = by?.source;
  return src ? `${what} at ${src.file}:${src.line}` : what;
}

/** Why a node's NaN/Inf raises no alarm when Python's rule found no origin: an empty
 * max's -Inf (min's +Inf) is that reduction's identity, what `jax.ops.segment_max` gives
 * a segment no element reaches; any other is a library's fill value (`jnp.var`'s NaN).
 * @param {import("./model.js").ModelIndex} index @param {string} id */
export function fillNote(index, id) {
  const prims = new Set();
  const stack = [id];
  while (stack.length) {
    const c = stack.pop();
    const prim = index.nodes.get(c)?.primitive;
    if (prim) prims.add(prim);
    stack.push(...(index.children.get(c) ?? []));
  }
  const max = prims.has("scatter-max") || prims.has("reduce_max");
  const min = prims.has("scatter-min") || prims.has("reduce_min");
  const what = max || min
    ? `${max ? "−Inf is the max's" : "+Inf is the min's"} identity: \`jax.ops.segment_${max ? "max" : "min"}\` `
      + "gives it to an empty segment (a node with no incoming edge), by design"
    : "a fill value the program masks (a library's `-inf`/`nan` placeholder)";
  return `Expected, harmless: ${what}. It reaches no result and every result is finite (no alarm).`;
}

/**
 * One output's non-finite counts for the panel's NaN line, named as its "output" row
 * names it when the stage has several: "saved for backward[1]: primal 3 +Inf, cotangent
 * 9 NaN" ("" when it holds none). The line said "net cotangent: 9 NaN" three times over,
 * the stage's name for each of its outputs.
 * @param {import("./types").Probe} p @param {boolean} named
 */
export function outputNonfinite(p, named) {
  const summaries = p.summaries ?? {};
  const counts = orderModes(Object.keys(summaries))
    .filter((mode) => nonfiniteCount(summaries[mode]) > 0)
    .map((mode) => `${mode}${named ? " " : ": "}${nonfiniteText(summaries[mode])}`);
  if (!counts.length) return "";
  return named ? `${outputLabel(p)}: ${counts.join(", ")}` : counts.join(" · ");
}

/** NaN / +Inf / −Inf / zero counts beside a histogram (the histogram holds finite
 * values only; the log view also leaves out zeros, and says so). */
export function specialCounts(s, scale) {
  if (!s) return [];
  const items = [["nan", "NaN"], ["posinf", "+Inf"], ["neginf", "−Inf"], ["zeros", "zeros"]];
  const out = items.map(([k, label]) => h("span", {
    class: `sv-count${k !== "zeros" && s[k] > 0 ? " sv-bad" : ""}`, "data-count": k, text: `${label} ${fmt(s[k] ?? 0)}`,
  }));
  if (scale === "linear") return out;
  if (s.zeros > 0) out.push(h("span", { class: "sv-muted", "data-role": "zeros-left-out", text: `· ${fmt(s.zeros)} zeros not shown (log₁₀|x| of 0 is −∞)` }));
  const lh = s.loghist;
  const under = lh?.under ?? 0;
  if (under > 0) {
    const sl = scale === "signed" ? signedLog(lh) : null;
    const bySign = sl ? ` (${fmt(sl.underPos)} positive, ${fmt(sl.underNeg)} negative)` : "";
    out.push(h("span", { class: "sv-muted", "data-role": "under-left-out", text: `· ${fmt(under)} tiny values below the first bin${bySign}` }));
  }
  if (sl0(scale, lh)) {
    const sl = signedLog(lh);
    const n = sl.neg.reduce((a, b) => a + b, 0) + sl.underNeg;
    const p = sl.pos.reduce((a, b) => a + b, 0) + sl.underPos;
    out.push(h("span", { class: "sv-muted", "data-role": "sign-totals", text: `· ${fmt(p)} positive above, ${fmt(n)} negative below` }));
  }
  return out;
}

const sl0 = (scale, lh) => scale === "signed" && hasSigned(lh);

/**
 * A probe as the picker lists it: name, leaf and, for one of several outputs, its shape
 * (a stage's outputs are numbered in the order the program makes them, which need not
 * be the order the function returns them: the shape tells `h` from `messages`).
 * @param {import("./types").Probe} p
 */
function probeOption(p) {
  const s = Object.values(p.summaries ?? {})[0];
  const shape = p.leaf && s?.shape ? ` ${s.dtype ?? ""}[${s.shape.join(",")}]` : "";
  // the output named as the face and the "output" row name it (`outputLabel`)
  return `${p.name}${p.leaf ? ` ${outputLabel(p)}` : ""}${shape}${p.auto ? " (stage)" : ""}`;
}

/** Where a node sits below the program: `in TransformerLM › layers[1]` ("" at the top level). */
export function placeOf(index, id) {
  return parentPath(index, id).trim();
}

/**
 * The nearest stage holding equation `id` that carries values (probes), or null: where
 * to look for what an equation no probe saw computed.
 * @param {import("./model.js").ModelIndex} index
 * @param {string} id
 */
export function carrierOf(index, id) {
  const node = index.nodes.get(id);
  if (!node || node.kind !== "eqn") return null;
  // (not the whole program's box, the root: that says nothing of the equation)
  for (let at = node.parent; at != null && index.nodes.get(at)?.parent != null; at = index.nodes.get(at).parent) {
    if (index.probesByNode.has(at)) return at;
  }
  return null;
}

/** A probe's leaf as a user reads it: `vector_add.normed_result` for `['vector_add.normed_result']`. */
export function leafLabel(leaf) {
  return String(leaf).replace(/\['([^']*)'\]/g, ".$1").replace(/^\./, "");
}

/**
 * A Tesseract's inputs by schema field: each array field with what feeds it (its
 * `port_names`: producer -> field), then its static fields (`solver = 'dense'`), which
 * are no edge. Text nodes only: field names and values come from the user's schema.
 * @param {import("./model.js").ModelIndex} index
 * @param {import("./types").Node} node
 */
export function tesseractInputs(index, node) {
  const ports = Object.entries(node.port_names ?? {});
  const statics = Object.entries(node.static_inputs ?? {});
  if (!ports.length && !statics.length) return null;
  const rows = [
    ...ports.map(([maker, field]) => h("li", { text: `${field} \u2190 ${index.nodes.get(maker)?.label ?? maker}` })),
    ...statics.map(([field, value]) => h("li", { text: `${field} = ${value} (static)` })),
  ];
  const vjp = tesseractVjpRows(index, node);
  return h("section", { "data-role": "tesseract-inputs" }, [
    h("h4", { class: "sv-section", text: `schema inputs: ${ports.length + statics.length}` }),
    h("ul", { class: "sv-tesseract-inputs" }, rows),
    vjp.length ? tesseractVjpTable(vjp) : null,
  ]);
}

/**
 * Per input field a Tesseract's stage probes (`['x (input)']`, modes grad, vjp, all):
 * ‖its own VJP‖₂ for the field, and ‖the total cotangent‖₂ of the value feeding it (its
 * maker's one output: null where the maker has several, or none with a cotangent).
 * Where the value is also read elsewhere (a regulariser) the two differ.
 * @param {import("./model.js").ModelIndex} index
 * @param {import("./types").Node} node
 * @returns {{field: string, from: string, vjp: number|null, total: number|null}[]}
 */
export function tesseractVjpRows(index, node) {
  const makers = new Map(Object.entries(node.port_names ?? {}).map(([maker, field]) => [field, maker]));
  const out = [];
  for (const p of index.probesByNode.get(node.id) ?? []) {
    if (!isInputLeaf(p.leaf) || !p.summaries?.cotangent) continue;
    const field = String(p.leaf).slice(2, -" (input)']".length);
    const maker = makers.get(field);
    const own = maker == null ? [] : ownOutputs(index.probesByNode.get(maker) ?? []);
    const total = own.length === 1 ? own[0].summaries?.cotangent?.l2 ?? null : null;
    out.push({ field, from: maker == null ? "" : index.nodes.get(maker)?.label ?? maker, vjp: p.summaries.cotangent.l2 ?? null, total });
  }
  return out;
}

/** `tesseractVjpRows` as a table (text nodes only: field names are the user's schema's). */
function tesseractVjpTable(rows) {
  const cell = (v) => h("td", { text: v == null ? "\u2014" : fmt(v) });
  return h("table", { class: "sv-param-table", "data-role": "tesseract-vjp" }, [
    h("caption", { class: "sv-muted", text: "its own VJP per input field, beside the total gradient of the value" }),
    h("thead", {}, [h("tr", {}, [
      h("th", { text: "field" }), h("th", { text: "from" }),
      h("th", { text: "\u2016Tesseract VJP\u2016\u2082" }), h("th", { text: "\u2016total\u2016\u2082" }),
    ])]),
    h("tbody", {}, rows.map((r) => h("tr", { "data-field": r.field }, [
      h("td", { text: r.field }), h("td", { text: r.from }), cell(r.vjp), cell(r.total),
    ]))),
  ]);
}

/**
 * The "captured" row: the shape of the values summarised, its leading axes named by
 * what made them (`probe.axes`: a shard_map's mesh axes, one slice per device; a loop's
 * iterations), and over what the statistics pool.
 * @param {any} probe
 * @param {any} s0 the probe's first summary (the row's values)
 * @returns {[string, string, string]}
 */
export function capturedRow(probe, s0) {
  const shape = s0.shape ?? [];
  const size = s0.size ?? shape.reduce((a, b) => a * b, 1);
  const count = `${size} value${size === 1 ? "" : "s"}`;
  const key = Object.keys(probe?.summaries ?? {})[0];
  const axes = (probe?.axes?.[key] ?? []).slice(0, shape.length);
  if (!axes.length) {
    const text = shape.length ? `[${shape.join(", ")}] · ${count}` : `a scalar · ${count}`;
    return ["captured", text, text];
  }
  const local = `${s0.dtype ?? ""}[${shape.slice(axes.length).join(",")}]`;
  const named = axes.map((a, i) => `${String(a).replace(/^mesh:/, "")}(${shape[i]})`);
  const mesh = axes.map((a, i) => [String(a), shape[i]]).filter(([a]) => a.startsWith("mesh:"));
  const shards = mesh.reduce((n, [, k]) => n * k, 1);
  const loops = axes.filter((a) => !String(a).startsWith("mesh:")).length;
  const text = `${mesh.length ? "per device: " : ""}${[...named, local].join(" × ")} · ${count}` +
    (mesh.length ? ` · statistics over all ${shards} shards` : "");
  const tip = [text];
  if (mesh.length) {
    tip.push(
      `The leading ${mesh.map(([a]) => a.slice(5)).join(", ")} ax${mesh.length > 1 ? "es are" : "is is"} the mesh of the shard_map around it: one slice per device, each of the local shape.`,
      "The statistics pool every shard: a value identical on several devices (an all_gather's or a psum's result) counts once per device.",
    );
  }
  if (loops) tip.push(`Iteration ax${loops > 1 ? "es" : "is"}: ${axes.filter((a) => !String(a).startsWith("mesh:")).join(", ")} (per-iteration statistics${mesh.length ? " pool the shards" : ""}).`);
  return ["captured", text, tip.join("\n")];
}
