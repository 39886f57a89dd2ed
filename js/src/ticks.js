// Readable ticks for the small log-scale charts of the detail panel.

const SUPERSCRIPT = { "-": "⁻", 0: "⁰", 1: "¹", 2: "²", 3: "³", 4: "⁴", 5: "⁵", 6: "⁶", 7: "⁷", 8: "⁸", 9: "⁹" };
const power = (k) => (k === 0 ? "1" : k === 1 ? "10" : `10${[...String(k)].map((c) => SUPERSCRIPT[c]).join("")}`);

/** A tick label: plain for 0.001 … 9999, `m×10ᵏ` beyond. */
export function tickText(v) {
  const k = Math.floor(Math.log10(v) + 1e-9);
  if (k >= -3 && k <= 3) return String(Number(v.toPrecision(3)));
  const m = Number((v / 10 ** k).toPrecision(3));
  return m === 1 ? power(k) : `${m}×${power(k)}`;
}

/**
 * Ticks for a log axis over the positive values: the powers of ten in range (every
 * n-th one when there are more than `max`), or 1-2-5 ticks when the values span less
 * than a decade, or their two ends. Plotly's own log ticks add unlabelled-looking
 * mantissas ("2, 10², 2, 5") that crowd a small chart.
 * @param {Array<number|null>} values
 * @returns {{tickvals: number[], ticktext: string[]} | null} null: no positive value
 */
export function logTicks(values, max = 4) {
  const pos = values.filter((v) => v != null && Number.isFinite(v) && v > 0);
  if (!pos.length) return null;
  const lo = Math.min(...pos);
  const hi = Math.max(...pos);
  const a = Math.ceil(Math.log10(lo) - 1e-9);
  const b = Math.floor(Math.log10(hi) + 1e-9);
  if (b > a) {
    const step = Math.ceil((b - a + 1) / max);
    const ks = [];
    for (let k = a; k <= b; k += step) ks.push(k);
    // one notation per axis: plain numbers only when every decade reads short
    const plain = ks.every((k) => k >= -3 && k <= 3);
    return { tickvals: ks.map((k) => 10 ** k), ticktext: ks.map((k) => (plain ? tickText(10 ** k) : power(k))) };
  }
  // less than two decades in range: the 1-2-5 values inside it, else its two ends
  let vals = [];
  for (let k = Math.floor(Math.log10(lo)); k <= Math.ceil(Math.log10(hi)); k++) {
    for (const m of [1, 2, 5]) {
      const v = Number((m * 10 ** k).toPrecision(1));
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) vals.push(v);
    }
  }
  if (vals.length < 2) vals = lo === hi ? [lo] : [lo, hi];
  let text = vals.map(tickText);
  // two ends closer than 3 digits tell apart ("0.356", "0.356"): as many as they need
  for (let digits = 4; new Set(text).size < text.length && digits <= 8; digits++) {
    text = vals.map((v) => String(Number(v.toPrecision(digits))));
  }
  if (new Set(text).size < text.length) return { tickvals: [vals[0]], ticktext: [text[0]] };
  return { tickvals: vals, ticktext: text };
}
