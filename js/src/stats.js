// The statistic drawn on node faces, its colour scale, and number formatting. Pure.

export const STATS = {
  l2: { label: "‖·‖₂ (l2 norm)", combine: (vs) => Math.sqrt(vs.reduce((a, v) => a + v * v, 0)) },
  absmax: { label: "max |x|", combine: (vs) => Math.max(...vs) },
  std: { label: "std", combine: (vs) => Math.max(...vs) },
};

/** The values each run mode is about (the model's `mode`): what its faces colour by. */
const RUN_MODE_VALUES = { primal: "primal", grad: "cotangent", vjp: "cotangent", jvp: "tangent", all: "cotangent" };

/**
 * Default face statistic: the l2 norm of the values the run is about, `runMode`
 * (the model's `mode`: grad's cotangent, jvp's tangent, primal's primal), when some
 * probe has them. `modes` lists every value kind some probe holds, which is no mode of
 * the run: a `sow` under an inner `jax.grad` (an HMC step's log density) holds a
 * cotangent in a primal run, and a primal report coloured by it left every stage but
 * the sow without a value. Without a known `runMode` (older models): the backward
 * quantity when there is one.
 * @param {string[]} modes @param {string} [runMode]
 */
export function defaultStat(modes, runMode) {
  const wanted = RUN_MODE_VALUES[runMode ?? ""];
  const mode = (wanted && modes.find((m) => m === wanted))
    ?? modes.find((m) => m === "cotangent") ?? modes.find((m) => m.includes("cotangent"))
    ?? modes.find((m) => m === "tangent") ?? modes[0] ?? "primal";
  return { mode, stat: "l2" };
}

/**
 * The statistic of a node over its own probes, or null when none has it. Values of no
 * size (shape [0, 4]) have none: their summary's l2 of 0 over no values drew an empty
 * slice of `associative_scan` as a zero gradient, in the colour scale's lowest colour.
 */
export function nodeStat(probes, mode, stat) {
  const vs = [];
  for (const p of probes ?? []) {
    if (p.summaries?.[mode]?.size === 0) continue;
    const v = p.summaries?.[mode]?.[stat];
    if (typeof v === "number" && Number.isFinite(v)) vs.push(Math.abs(v));
  }
  return vs.length ? STATS[stat].combine(vs) : null;
}

const VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"];

function lerpHex(a, b, t) {
  const pa = [1, 3, 5].map((i) => parseInt(a.slice(i, i + 2), 16));
  const pb = [1, 3, 5].map((i) => parseInt(b.slice(i, i + 2), 16));
  return `#${pa.map((v, i) => Math.round(v + (pb[i] - v) * t).toString(16).padStart(2, "0")).join("")}`;
}

/** Viridis at t in [0, 1]. */
export function viridis(t) {
  const x = Math.min(1, Math.max(0, Number.isFinite(t) ? t : 0)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  return lerpHex(VIRIDIS[i], VIRIDIS[i + 1], x - i);
}

export const VIRIDIS_STOPS = VIRIDIS;

// The largest finite magnitude of each floating dtype (complex: of its parts), as
// `jnp.finfo(dtype).max` gives it.
const FINITE_MAX = {
  float16: 65504,
  bfloat16: 3.3895313892515355e38,
  float32: 3.4028234663852886e38,
  float64: 1.7976931348623157e308,
  complex64: 3.4028234663852886e38,
  complex128: 1.7976931348623157e308,
};

// JAX's masked-logit fill, `-0.7 * finfo(dtype).max` capped at float32's range
// (`jax.nn.dot_product_attention`, which Flax NNX's `dot_product_attention` calls
// without dropout; 0.7 so that adding two stays finite). No ordinary value comes that
// close to overflow.
const FILL_FRACTION = 0.7;
// rounding slack: 0.7·max rounded to bfloat16 (8 significant bits) is 0.4% off
const FILL_SLACK = 1 / 128;

/**
 * Whether a summary's values reach a fill value of its dtype, not a measure of
 * anything: `jnp.finfo(s.dtype).min` (`jnp.where(mask, s, finfo.min)` masking attention
 * logits, as Flax's attention weights do) or JAX's `-0.7 * finfo.max`
 * (`jax.nn.dot_product_attention`; in float64 0.7 · float32's max). Its statistics (an
 * l2 of 3.4e38) would stretch a colour scale over 38 decades and paint every other
 * stage one colour; a greedy decoder's masked cache slots (JAX's 2.38e38) did, as the
 * rule knew finfo.min only. (float8 types are left out: a saturating cast reaches
 * their max in ordinary values.)
 * @param {any} s a summary
 */
export function holdsFillValue(s) {
  const top = FINITE_MAX[s?.dtype];
  if (!top) return false;
  const m = s.absmax ?? Math.max(Math.abs(s.min ?? 0), Math.abs(s.max ?? 0));
  if (typeof m !== "number") return false;
  // float64's JAX fill is float32's: matched itself, as float64 values of 1e39 are ordinary
  const jaxFill64 = FILL_FRACTION * FINITE_MAX.float32;
  return m >= FILL_FRACTION * top * (1 - FILL_SLACK) || Math.abs(m - jaxFill64) <= jaxFill64 * FILL_SLACK;
}

// The smallest normal magnitude of the floating dtypes whose normal range reaches far
// below any measured quantity (`jnp.finfo(dtype).tiny`). float16's (6.1e-5) is left
// out: float16 gradients that small are real values (underflow is what loss scaling
// is about), not sentinels.
const TINY = {
  bfloat16: 1.1754943508222875e-38,
  float32: 1.1754943508222875e-38,
  float64: 2.2250738585072014e-308,
  complex64: 1.1754943508222875e-38,
  complex128: 2.2250738585072014e-308,
};

/**
 * Whether a summary's non-zero values are no larger than its dtype's smallest normal
 * number: a sentinel, not a measure (diffrax's `prevbefore(0.0)`, `jnp.nextafter` of
 * 0, is -FLT_MIN under flush-to-zero). A reverse-time solve held 300 such stages among
 * 362: the colour scale ran from 1.175e-38 and every other stage came out one colour.
 * @param {any} s a summary
 */
export function holdsTinyValue(s) {
  const tiny = TINY[s?.dtype];
  if (!tiny) return false;
  const m = s.absmax ?? Math.max(Math.abs(s.min ?? 0), Math.abs(s.max ?? 0));
  return typeof m === "number" && m > 0 && m <= tiny * (1 + FILL_SLACK);
}

/**
 * Whether any of a node's probes holds a fill value (`holdsFillValue`) or only
 * sentinels of the smallest magnitude (`holdsTinyValue`) in `mode`: statistics that
 * are coloured but never set the colour scale's range.
 */
export function nodeHoldsFill(probes, mode) {
  return (probes ?? []).some((p) => holdsFillValue(p.summaries?.[mode]) || holdsTinyValue(p.summaries?.[mode]));
}

/** From this many values on, a colour scale cuts outliers past its `ROBUST_Q` quantiles. */
export const ROBUST_MIN = 20;
export const ROBUST_Q = 0.02;

/**
 * A log10 colour scale over the positive values given. With `ROBUST_MIN` values or more,
 * an end more than a decade past their 2nd (98th) percentile is cut back to it, so that
 * one outlier (an attention bias whose gradient is 1e-8) does not paint every other
 * node one colour; values past an end take its colour, and `clippedLo`/`clippedHi` say
 * whether an end was cut.
 *
 * `aside`: values that are coloured but never set the range (the statistics of fill
 * values, `holdsFillValue`, and of smallest-magnitude sentinels, `holdsTinyValue`),
 * however many there are: the percentile cut missed four
 * masked-logit stages among 144, and the scale ran to 3.4e38. They set it only when
 * nothing else does.
 * @param {Iterable<number|null>} values
 * @param {Iterable<number|null>} [aside]
 * @returns {{lo: number, hi: number, clippedLo: boolean, clippedHi: boolean, t: (v: number|null) => number|null, colour: (v: number|null) => string|null}}
 */
export function logScale(values, aside = []) {
  const own = sortedLogs(values);
  const others = sortedLogs(aside);
  const logs = own.length ? own : others;
  const n = logs.length;
  let lo = n ? logs[0] : 0;
  let hi = n ? logs[n - 1] : 0;
  if (n >= ROBUST_MIN) {
    // an end more than a decade past its percentile is an outlier: clipped
    const qlo = logs[Math.ceil(ROBUST_Q * (n - 1))];
    const qhi = logs[Math.floor((1 - ROBUST_Q) * (n - 1))];
    if (lo < qlo - 1) lo = qlo;
    if (hi > qhi + 1) hi = qhi;
  }
  const clippedLo = (n > 0 && logs[0] < lo) || (others.length > 0 && others[0] < lo);
  const clippedHi = (n > 0 && logs[n - 1] > hi) || (others.length > 0 && others[others.length - 1] > hi);
  const span = hi - lo;
  const t = (v) => {
    if (v == null || !Number.isFinite(v)) return null;
    if (v <= 0) return 0;
    return span > 0 ? Math.min(1, Math.max(0, (Math.log10(v) - lo) / span)) : 1;
  };
  return { lo, hi, clippedLo, clippedHi, t, colour: (v) => { const x = t(v); return x == null ? null : viridis(x); } };
}

/** log10 of the positive finite values, ascending. @param {Iterable<number|null>} values */
function sortedLogs(values) {
  const logs = [];
  for (const v of values) {
    if (v == null || !(v > 0) || !Number.isFinite(v)) continue;
    logs.push(Math.log10(v));
  }
  return logs.sort((a, b) => a - b);
}

/** Short, stable number formatting for tables and labels. */
export function fmt(x) {
  if (x == null) return "—";
  if (typeof x !== "number") return String(x);
  if (Number.isNaN(x)) return "NaN";
  if (!Number.isFinite(x)) return x > 0 ? "+Inf" : "−Inf";
  if (Number.isInteger(x) && Math.abs(x) < 1e7) return String(x);
  const a = Math.abs(x);
  // From 1e4 four digits no longer reach the ones: 30434.31 would read "30430", an
  // integer that looks exact; the exponent says how many digits are shown.
  // (9999.6 rounds to four digits as 1.000e+4: an exponent too, not "10000")
  const near = Number(x.toPrecision(4));
  if (a !== 0 && (Math.abs(near) >= 1e4 || a < 1e-3)) return x.toExponential(3).replace(/\.?0+e/, "e");
  return String(near);
}

/**
 * A slider's label: the value shown and the range it is taken from, in the numbers the
 * charts' x axes use (iterations from 0, blocks by their own numbers): "2 of 0–2" for the
 * last of 3 iterations. "2 of 2" read as two iterations, one too few.
 * @param {number} at @param {number} first @param {number} last
 */
export function rangeLabel(at, first, last) {
  return `${at} of ${first}–${last}`;
}

/** The iteration histogram as {edges, counts} over the pooled histogram's edges. */
export function iterationHist(summary, i) {
  const rows = summary?.per_iteration?.hist_counts;
  const edges = summary?.hist?.edges;
  if (!rows?.[i] || !edges) return null;
  return { edges, counts: rows[i] };
}
