// Per-iteration statistics of a stacked probe (scan / fori_loop / while): norm, mean and
// abs-max per iteration, and the histogram of one chosen iteration (a slider).

import { h } from "./dom.js";
import { drawHistogram, drawLines, modeColour } from "./charts.js";
import { iterationHist, rangeLabel } from "./stats.js";
import { chartNorm } from "./nonfinite.js";

/**
 * A block for one capture key; returns {el, draw(colours, width), charts}.
 * @param {string} mode
 * @param {any} s a Summary with `per_iteration`
 */
export function iterationBlock(mode, s) {
  const it = s.per_iteration;
  // one row per kept iteration: `index` says which (a long loop keeps some), out of
  // `iterations`; `count` is each row's number of finite values
  const n = it.l2?.length ?? 0;
  const index = Array.isArray(it.index) && it.index.length === n ? it.index : Array.from({ length: n }, (_, i) => i);
  const total = Number.isFinite(it.iterations) ? it.iterations : n;
  const lines = h("div", { class: "sv-chart", "data-iter": "lines", "data-mode": mode });
  const hist = h("div", { class: "sv-chart", "data-iter": "hist", "data-mode": mode });
  const slider = h("input", { type: "range", min: "0", max: String(Math.max(0, n - 1)), value: String(Math.max(0, n - 1)), step: "1", "data-role": "iteration", "aria-label": "iteration" });
  const label = h("span", { class: "sv-muted", "data-role": "iteration-label" });
  const el = h("section", { class: "sv-iter", "data-role": "per-iteration", "data-mode": mode }, [
    h("h4", { class: "sv-chart-title", text: `${mode}: per iteration (${n < total ? `${n} of ${total} kept` : total})` }),
    lines,
    h("label", { class: "sv-row" }, [h("span", { class: "sv-muted", text: "iteration" }), slider, label]),
    hist,
  ]);
  let last = null;
  const drawHist = () => {
    const i = Number(slider.value);
    label.textContent = rangeLabel(index[i], 0, total - 1);
    if (last) drawHistogram(hist, iterationHist(s, i), { ...last, mode, scale: "linear", logY: false, height: 130, title: `${mode} at iteration ${index[i]}` });
  };
  slider.addEventListener("input", drawHist);
  return {
    el,
    charts: [lines, hist],
    draw(colours, width) {
      last = { colours, width };
      const x = index;
      const col = modeColour(colours, mode);
      drawLines(lines, x, [
        // a row with NaN/Inf is a gap (`chartNorm`): the l2 of its finite part alone
        // (0 with none) would draw as a value
        { name: "‖·‖₂", y: (it.l2 ?? []).map((v, i) => chartNorm({ l2: v, count: it.count?.[i] ?? 1, nan: it.nonfinite?.[i] ?? 0 })), colour: col },
        { name: "mean", y: it.mean ?? [], colour: colours.accent, dash: "dash" },
        { name: "max|·|", y: it.absmax ?? [], colour: colours.fg, dash: "dot" },
      ], { colours, width, xTitle: "iteration", yTitle: "", logY: false });
      drawHist();
    },
  };
}
