// The detail panel's section for a group of identical blocks (statistics in repeats.js).

import { h } from "./dom.js";
import { drawHistogram, drawLines, modeColour, roundingNoise } from "./charts.js";
import { repeatStats } from "./repeats.js";
import { rangeLabel } from "./stats.js";

/**
 * The detail panel's block for a group; returns {el, charts, draw(colours, width)}.
 * @param {import("./model.js").ModelIndex} index
 * @param {string} id
 * @param {(id: string) => void} onReveal
 */
export function repeatBlock(index, id, onReveal) {
  const own = index.probesByNode.get(id)?.[0];
  const st = repeatStats(index, id, own?.leaf ?? null);
  const n = st.blocks.length;
  const x = blockNumbers(st.blocks.map((b) => b.label));
  const slider = h("input", { type: "range", min: "0", max: String(Math.max(0, n - 1)), value: String(Math.max(0, n - 1)), step: "1", "data-role": "repeat", "aria-label": "block" });
  const label = h("span", { class: "sv-muted", "data-role": "repeat-label" });
  const show = h("button", { type: "button", class: "sv-link", "data-role": "repeat-reveal" });
  show.addEventListener("click", () => onReveal(st.blocks[Number(slider.value)].id));
  const per = st.modes.map((mode) => ({
    mode,
    lines: h("div", { class: "sv-chart", "data-repeat": "lines", "data-mode": mode }),
    mean: h("div", { class: "sv-chart", "data-repeat": "mean", "data-mode": mode }),
    hist: h("div", { class: "sv-chart", "data-repeat": "hist", "data-mode": mode }),
  }));
  const first = st.blocks[0]?.label ?? "";
  const last = st.blocks[n - 1]?.label ?? "";
  const el = h("section", { class: "sv-iter", "data-role": "repeats" }, [
    // the blocks' names as the user wrote them: the heading's capitals are its own words'
    // only (they read `BLOCKS[0]: BLOCK` for Equinox's `blocks[0]: Block`)
    h("h4", { class: "sv-section" }, [
      `${n} identical blocks (`, h("code", { class: "sv-name", text: first }), " … ",
      h("code", { class: "sv-name", text: last }), "): statistics per block",
    ]),
    per.length ? null : h("p", { class: "sv-muted", "data-role": "repeats-empty", text: "No values were captured on the blocks (capture=\"sows\" probes only your sows); the slider still finds each block." }),
    ...per.flatMap((p) => [h("h4", { class: "sv-chart-title", text: `${p.mode}: per block` }), p.lines, p.mean]),
    h("label", { class: "sv-row" }, [h("span", { class: "sv-muted", text: "block" }), slider, label, show]),
    ...per.map((p) => p.hist),
  ]);
  let last_ = null;
  const drawHists = () => {
    const b = st.blocks[Number(slider.value)];
    if (!b) return;
    label.textContent = rangeLabel(x[Number(slider.value)], x[0], x[n - 1]);
    show.textContent = `show ${b.label}`;
    if (!last_) return;
    for (const p of per) {
      const s = b.probe?.summaries?.[p.mode];
      drawHistogram(p.hist, s?.hist ?? null, { ...last_, mode: p.mode, scale: "linear", logY: false, height: 130, title: `${p.mode} of ${b.label}` });
    }
  };
  slider.addEventListener("input", drawHists);
  return {
    el,
    charts: per.flatMap((p) => [p.lines, p.mean, p.hist]),
    stats: st,
    draw(colours, width) {
      last_ = { colours, width };
      for (const p of per) {
        const s = st.series[p.mode];
        const nonfinite = x.filter((_, i) => s.nonfinite[i] > 0);
        // norms on a log axis (they span decades across a deep stack); the mean apart, linear
        drawLines(p.lines, x, [
          { name: "‖·‖₂", y: s.l2, colour: modeColour(colours, p.mode) },
          { name: "max|·|", y: s.absmax, colour: colours.fg, dash: "dot" },
        ], { colours, width, xTitle: "block", yTitle: "norm", logY: true, nonfinite });
        // a mean that is rounding noise next to the values (a LayerNorm's cotangent) is drawn flat
        drawLines(p.mean, x, [{ name: "mean", y: s.mean, colour: colours.accent, dash: "dash" }],
          { colours, width, height: 100, xTitle: "block", yTitle: "mean", logY: false, nonfinite, noise: roundingNoise(s.mean, s.absmax) });
      }
      drawHists();
    },
  };
}

/**
 * The blocks' own numbers, from their labels (`BottleneckResNetBlock_8` … `_12`: 8 … 12;
 * `layers[0]` … `layers[23]`: 0 … 23): the last number that tells them apart, else
 * their positions.
 * @param {string[]} labels
 * @returns {number[]}
 */
export function blockNumbers(labels) {
  const nums = labels.map((l) => (l.match(/\d+/g) ?? []).map(Number));
  const k = nums[0]?.length ?? 0;
  if (k && nums.every((t) => t.length === k)) {
    for (let at = k - 1; at >= 0; at--) {
      const col = nums.map((t) => t[at]);
      if (new Set(col).size === col.length && col.every((v, i) => i === 0 || v > col[i - 1])) return col;
    }
  }
  return labels.map((_, i) => i);
}
