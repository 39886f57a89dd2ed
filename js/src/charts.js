// Plotly charts of the detail panel, drawn from precomputed bin counts only.
import Plotly from "./plotly.js";
import { histogramHeatmap } from "./resample.js";
import { signedLog } from "./loghist.js";
import { logTicks } from "./ticks.js";

const CONFIG = { displaylogo: false, displayModeBar: false, responsive: false, scrollZoom: false };

export function modeColour(colours, mode) {
  const head = String(mode).split(".")[0];
  return colours.modes[head] ?? colours.modes.other;
}

/** Sets `logTicks` on a log axis (leaves Plotly's when there is nothing positive). */
function setLogTicks(axis, values) {
  const t = logTicks(values);
  if (t) Object.assign(axis, { tickmode: "array", ...t });
}

/** @returns {any} a plotly layout (extended per chart) */
function baseLayout(c, { width, height, xTitle, yTitle, logY = false }) {
  const axis = (title) => ({
    title: { text: title, font: { size: 10, color: c.muted } },
    color: c.muted, gridcolor: c.grid, zerolinecolor: c.grid, tickfont: { size: 9 }, automargin: true,
  });
  return {
    width, height,
    margin: { l: 44, r: 8, t: 6, b: 34 },
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { family: c.font, size: 10, color: c.fg },
    // e-notation, as the tables write numbers (`5e-4`, not an SI `500μ` that reads as
    // a unit, nor `5×10⁻⁴`); log axes have their own ticks (`logTicks`)
    xaxis: { ...axis(xTitle), exponentformat: "e" },
    yaxis: { ...axis(yTitle), type: logY ? "log" : "linear", nticks: logY ? 4 : 6, exponentformat: "e" },
    bargap: 0, showlegend: false,
  };
}

/**
 * A histogram from a Summary's `hist` (linear) or `loghist` (log10 |x|).
 * @param {HTMLElement} el
 * @param {{edges: number[], counts: number[]} | null} hist
 */
export function drawHistogram(el, hist, { colours, mode, scale, logY, width, height = 150, title = null }) {
  const edges = hist?.edges ?? [];
  const counts = hist?.counts ?? [];
  const x = [];
  const w = [];
  for (let i = 0; i < counts.length; i++) {
    const lo = edges[i];
    const hi = edges[i + 1];
    x.push((lo + hi) / 2);
    w.push(hi > lo ? hi - lo : 1);
  }
  const colour = modeColour(colours, mode);
  el.dataset.signed = "false";
  const trace = {
    type: "bar", x, y: counts, width: w, marker: { color: colour, line: { width: 0 } },
    hovertemplate: scale === "log" ? "log₁₀|x| ≈ %{x:.3g}<br>%{y} values<extra></extra>" : "x ≈ %{x:.4g}<br>%{y} values<extra></extra>",
  };
  const layout = baseLayout(colours, {
    width, height, logY,
    xTitle: title ?? (scale === "log" ? `log₁₀|${mode}|` : mode),
    yTitle: "count",
  });
  if (logY) setLogTicks(layout.yaxis, counts);
  else {
    // Counts are whole numbers: integer ticks, one per count when there are few.
    const max = Math.max(0, ...counts);
    layout.yaxis.tickformat = ",d";
    if (max <= 5) layout.yaxis.dtick = 1;
    layout.yaxis.rangemode = "tozero";
  }
  // (an empty slice's histogram, or an all-NaN one's, has bins but nothing in them)
  if (!counts.some((c) => c > 0)) {
    layout.annotations = [{ text: "no finite values", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5, font: { color: colours.muted } }];
  }
  return Plotly.react(el, [trace], layout, CONFIG);
}

/**
 * The signed log view: log10|x| bins of the positive values above the axis and of the
 * negative values mirrored below it (two stacked y axes sharing x, so "log count"
 * works for both). Needs `loghist.neg`; draws "no sign counts" otherwise.
 * @param {HTMLElement} el
 * @param {import("./types").LogHistogram | null} lh
 */
export function drawSignedLog(el, lh, { colours, mode, logY, width, height = 210 }) {
  const sl = signedLog(lh);
  const colour = modeColour(colours, mode);
  const layout = baseLayout(colours, { width, height, logY, xTitle: `log₁₀|${mode}|`, yTitle: "x > 0" });
  layout.yaxis.domain = [0.53, 1];
  layout.yaxis2 = { ...layout.yaxis, domain: [0, 0.47], title: { ...layout.yaxis.title, text: "x < 0" } };
  layout.xaxis.anchor = "y2";
  layout.bargap = 0;
  if (!logY) for (const ax of [layout.yaxis, layout.yaxis2]) { ax.tickformat = ",d"; ax.rangemode = "tozero"; }
  const trace = (y, axis, name, pattern) => ({
    type: "bar", x: sl?.x ?? [], y, width: sl?.width ?? [], yaxis: axis, name,
    marker: { color: colour, line: { width: 0 }, pattern },
    hovertemplate: `${name} · log₁₀|x| ≈ %{x:.3g}<br>%{y} values<extra></extra>`,
  });
  const traces = sl ? [trace(sl.pos, "y", "positive", undefined), trace(sl.neg, "y2", "negative", { shape: "/", fillmode: "overlay", fgcolor: colours.bg, size: 6, solidity: 0.3 })] : [];
  if (sl) {
    const top = Math.max(1, ...sl.pos, ...sl.neg);
    // One scale for both halves (mirrored: the lower axis runs downwards), so bar
    // lengths compare across the sign.
    const hi = logY ? Math.log10(top) + 0.1 : top * 1.05;
    const lo = logY ? -0.1 : 0;
    layout.yaxis.range = [lo, hi];
    layout.yaxis2.range = [hi, lo];
    if (!logY && top <= 5) { layout.yaxis.dtick = 1; layout.yaxis2.dtick = 1; }
  }
  if (!sl || !sl.x.length) {
    layout.annotations = [{ text: sl ? "no non-zero finite values" : "no sign counts in this summary", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5, font: { color: colours.muted } }];
  }
  el.dataset.signed = "true";
  return Plotly.react(el, traces, layout, CONFIG);
}

/** Heatmap of a probe's histogram over Monitor steps, resampled onto a common grid. */
export function drawHistoryHeatmap(el, steps, hists, { colours, mode, width, height = 150 }) {
  const hm = histogramHeatmap(hists, 48);
  const layout = baseLayout(colours, { width, height, xTitle: "step", yTitle: mode });
  if (!hm) {
    layout.annotations = [{ text: "no histogram yet", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 }];
    return Plotly.react(el, [], layout, CONFIG);
  }
  const trace = {
    type: "heatmap", x: steps, y: hm.centers, z: hm.z, showscale: false,
    colorscale: "Viridis", hoverongaps: false,
    hovertemplate: "step %{x}<br>x ≈ %{y:.3g}<br>%{z:.1%}<extra></extra>",
  };
  return Plotly.react(el, [trace], layout, CONFIG);
}

/**
 * Lines over steps: [{name, y, colour, dash}] with a log y axis when every value is positive.
 * `nonfinite` lists the steps whose values held NaN/Inf (JSON brings them as null, so a
 * line would just stop): each gets a red band and a red × at the top of the chart.
 */
export function drawLines(el, steps, series, { colours, width, height = 130, yTitle = "", logY = true, xTitle = "step", nonfinite = [], legend = true, marker = null, compact = false, noise = false }) {
  const positive = series.every((s) => s.y.every((v) => v == null || v > 0));
  const traces = series.map((s) => ({
    type: "scatter", mode: steps.length > 60 ? "lines" : "lines+markers", name: s.name,
    x: steps, y: s.y, line: { color: s.colour, width: 1.5, dash: s.dash ?? "solid" }, marker: { size: 3 },
    connectgaps: false, hovertemplate: `${s.name} %{y:.4g}<br>${xTitle} %{x}<extra></extra>`,
  }));
  const layout = baseLayout(colours, { width, height, xTitle, yTitle, logY: logY && positive });
  if (layout.yaxis.type === "log") setLogTicks(layout.yaxis, series.flatMap((s) => s.y));
  // steps and iterations are whole numbers: no tick at 0.5 on a run of one or two
  const span = steps.length ? Math.max(...steps) - Math.min(...steps) : 0;
  layout.xaxis.tickformat = "d";
  if (span <= 5) {
    layout.xaxis.dtick = 1;
    if (span === 0 && steps.length) layout.xaxis.range = [steps[0] - 0.5, steps[0] + 0.5];
  }
  layout.showlegend = legend && series.length > 1;
  layout.legend = { orientation: "h", y: 1.15, x: 0, font: { size: 9 } };
  layout.margin.t = layout.showlegend ? 18 : 6;
  if (compact) {
    // a strip's chart (the Monitor's loss under the graph): the x axis's title and its
    // room go (the hover still says `step 3`); tick labels only, fewer on y
    layout.xaxis.title = { text: "" };
    layout.margin = { ...layout.margin, t: 4, b: 18 };
    layout.yaxis.nticks = 3;
  }
  if (nonfinite.length) {
    layout.shapes = nonfiniteBands(steps, nonfinite, colours);
    // The markers sit on a hidden [0, 1] axis: a NaN step has no y on the real one.
    layout.yaxis2 = { overlaying: "y", range: [0, 1], visible: false, fixedrange: true };
    traces.push({
      type: "scatter", mode: "markers", name: "non-finite", yaxis: "y2", showlegend: false,
      x: nonfinite, y: nonfinite.map(() => 0.93),
      marker: { symbol: "x-thin", size: 7, color: colours.bad, line: { color: colours.bad, width: 1.5 } },
      hovertemplate: `${xTitle} %{x}: NaN/Inf<extra></extra>`,
    });
  }
  if (marker != null) {
    // the step whose values the graph draws
    layout.shapes = [...(layout.shapes ?? []), {
      type: "line", xref: "x", yref: "paper", x0: marker, x1: marker, y0: 0, y1: 1,
      line: { color: colours.muted ?? colours.text, width: 1, dash: "dot" },
    }];
    el.dataset.marker = String(marker);
  }
  el.dataset.nonfiniteSteps = nonfinite.join(",");
  el.dataset.noise = String(noise);
  if (noise) {
    // rounding noise (`roundingNoise`): drawn flat at 0 and said so; the hover keeps
    // each value
    for (const t of traces) {
      if (t.yaxis) continue;
      t.customdata = t.y;
      t.y = t.y.map((v) => (v == null ? null : 0));
      t.hovertemplate = t.hovertemplate.replace("%{y:.4g}", "%{customdata:.4g}");
    }
    Object.assign(layout.yaxis, { type: "linear", range: [-1, 1], tickvals: [0], ticktext: ["0"], tickmode: "array" });
    layout.annotations = [...(layout.annotations ?? []), {
      text: "≈ 0 (rounding noise)", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.9,
      font: { size: 10, color: colours.muted },
    }];
  }
  return Plotly.react(el, traces, layout, CONFIG);
}

/**
 * Whether `values` are rounding noise next to `scale` (the largest |value| they are
 * made from): every finite one within NOISE_SHARE of it, or all zero. A LayerNorm's
 * per-block cotangent mean (zero in exact arithmetic) came out ~1e-11 beside values
 * ~1e-2, and its chart autoscaled that noise into a curve that read as a signal.
 * @param {Array<number|null>} values @param {Array<number|null>} scale
 */
export function roundingNoise(values, scale) {
  const fin = values.filter((v) => v != null && Number.isFinite(v));
  if (!fin.length) return false;
  const top = Math.max(0, ...scale.filter((v) => v != null && Number.isFinite(v)).map(Math.abs));
  const most = Math.max(...fin.map(Math.abs));
  return most === 0 || (top > 0 && most <= NOISE_SHARE * top);
}
export const NOISE_SHARE = 1e-6;

/** Red bands over runs of consecutive non-finite steps, halfway to their neighbours. */
export function nonfiniteBands(steps, nonfinite, colours) {
  const bad = new Set(nonfinite);
  const shapes = [];
  const n = steps.length;
  for (let a = 0; a < n; a++) {
    if (!bad.has(steps[a])) continue;
    let b = a;
    while (b + 1 < n && bad.has(steps[b + 1])) b++;
    const x0 = steps[a] - (a > 0 ? (steps[a] - steps[a - 1]) / 2 : 0.5);
    const x1 = steps[b] + (b < n - 1 ? (steps[b + 1] - steps[b]) / 2 : 0.5);
    shapes.push({
      type: "rect", xref: "x", yref: "paper", x0, x1, y0: 0, y1: 1,
      fillcolor: colours.badSoft, line: { width: 0 }, layer: "below",
    });
    a = b;
  }
  return shapes;
}

export function purge(el) {
  try { Plotly.purge(el); } catch { /* already gone */ }
}
