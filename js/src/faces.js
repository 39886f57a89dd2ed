// What each node face shows: the statistic, its colour, a sparkline and the flags.
// Pure: computed from the index and the chosen statistic.

import { STATS, nodeStat, nodeHoldsFill, logScale, fmt } from "./stats.js";
import { nonfiniteText } from "./nonfinite.js";

/** Counts of a histogram merged down to at most `n` bins. */
export function downsample(counts, n) {
  if (!counts || counts.length <= n) return counts ? [...counts] : [];
  const out = new Array(n).fill(0);
  for (let i = 0; i < counts.length; i++) out[Math.floor((i * n) / counts.length)] += counts[i];
  return out;
}

/** SVG path of a filled step sparkline of `counts` in a w×h box. */
export function sparklinePath(counts, w, h) {
  const c = downsample(counts, 24);
  const max = Math.max(0, ...c);
  if (!c.length || max <= 0) return "";
  const bw = w / c.length;
  let d = `M0,${h}`;
  c.forEach((v, i) => {
    const y = (h - (h * v) / max).toFixed(1);
    d += `L${(i * bw).toFixed(1)},${y}L${((i + 1) * bw).toFixed(1)},${y}`;
  });
  return `${d}L${w},${h}Z`;
}

/**
 * Faces for the given node ids. The colour scale spans every node in the model with
 * the statistic, so colours do not shift when stages open and close.
 * @returns {{faces: Map<string, {value: number|null, colour: string|null, text: string, short: string, bad: string, total: string, hist: number[]|null, outputs?: string[]|null, shown?: string|null, which?: string}>, scale: ReturnType<typeof logScale>}}
 */
export function computeFaces(index, ids, { mode, stat }) {
  // the statistics of stages holding fill values (finfo.max masks) are coloured, but
  // never set the scale
  const all = [];
  const fills = [];
  for (const [id, probes] of index.probesByNode) {
    const shown = faceOutputs(probes, index.nodes.get(id), mode);
    (nodeHoldsFill(shown, mode) ? fills : all).push(nodeStat(shown, mode, stat));
  }
  const scale = logScale(all, fills);
  const faces = new Map();
  for (const id of ids) {
    const probes = index.probesByNode.get(id);
    // a stage of several outputs (a scan's carry and stacked ys): the face is its first
    // output's, as its shape ("f32[4] +1") and the panel's first pick are, and says so
    const own = ownOutputs(probes);
    const shown = faceOutputs(probes, index.nodes.get(id), mode);
    const value = probes ? nodeStat(shown, mode, stat) : null;
    const hist = shown[0]?.summaries?.[mode]?.hist?.counts?.length ? shown[0].summaries[mode].hist.counts : null;
    const sym = statSymbol(mode, stat);
    // the output shown, named as the panel names it (`[1]`, `saved for backward[0]`)
    const name = own.length > 1 ? outputLabel(shown[0]) : "";
    const which = name ? `${name} ` : "";
    let text = value == null ? "" : `${which}${sym} = ${fmt(value)}`;
    // values of no size (a combine of `associative_scan` on an empty slice): no data,
    // not a zero gradient
    if (value == null && own.some((p) => isEmpty(p, mode))) text = EMPTY_TEXT;
    // each output's value, for the tooltip
    const outputs = own.length > 1 ? own.map((p) => {
      const v = nodeStat([p], mode, stat);
      return `${outputLabel(p)}: ${v != null ? `${sym} = ${fmt(v)}` : isEmpty(p, mode) ? EMPTY_TEXT : "no value"}`;
    }) : null;
    // Statistics are over the finite values: a NaN gradient's ‖grad‖₂ is 0 over none
    // of them, so the face says what else it holds ("grad: 128 NaN", "‖grad‖₂ = 2 · 1 +Inf").
    // (the shown output's: `q, k, v = ...` said "[0] = 0 · 192 NaN", q's norm beside
    // the three outputs' count; a stage's only output, or saved values alone: all)
    const bad = nonfiniteCounts(own.length > 1 ? shown : probes, mode);
    // `short`: what a narrow face shows instead of `text` (the counts alone)
    let short = null;
    if (bad.text) {
      short = `${COUNT_WORDS[mode] ?? mode}: ${bad.text}`;
      text = bad.finite === 0 ? `${which}${short}` : `${text} · ${bad.text}`;
    }
    // The program's scalar output (the loss) shows its value, whatever colours the nodes.
    const out = index.nodes.get(id)?.kind === "output" ? probes?.[0]?.summaries?.primal : null;
    if (out && out.size === 1) {
      const own = nonfiniteCounts([probes[0]], "primal");
      if (own.text) text = `value = ${own.kind}`;
      else if (out.mean != null) text = `value = ${fmt(out.mean)}`;
    }
    // which output the face shows, for the tooltip ("the face shows [3] of 4 outputs")
    const shownName = outputs ? outputLabel(shown[0]) : null;
    faces.set(id, { value, colour: scale.colour(value), text, short: short ?? text, bad: bad.text, total: bad.total, hist, outputs, shown: shownName, which: name });
  }
  return { faces, scale };
}

/**
 * The probes a face describes: the stage's first output, the one its shape names
 * (`node.shapes[0]`: a scan lists its stacked values, which the program reads, before
 * its final carry, which it may drop), else the first of its own outputs. A scan's face
 * showed "[0] ‖grad‖₂ = 0" of the unused carry beside the shape of the values. In a
 * `mode`: the first output holding NaN or Inf there, so a face never hides one
 * (`q, k, v` with k's NaN), else that one when it has the mode's values, else the
 * first that has (`slogdet`'s sign has no gradient, its logdet has: the face showed
 * none, as if the path to the loss were broken).
 * @param {any[]|undefined} probes @param {any} [node] @param {string} [mode]
 */
export function faceOutputs(probes, node, mode) {
  const own = ownOutputs(probes);
  // (explicit sharding's mesh axes, `64@data`, are no part of a probe's shape)
  const first = node?.shapes?.[0]?.replace(/@(\([^)]*\)|[^,\]]+)/g, "");
  const named = (first == null ? undefined : own.find((p) => shapeText(p) === first)) ?? own[0];
  if (mode == null || own.length < 2) return [named].filter(Boolean);
  const bad = own.find((p) => nonfiniteCounts([p], mode).text);
  // an output of no size holds no values to show (`isEmpty`)
  const has = (p) => p?.summaries?.[mode] != null && !isEmpty(p, mode);
  return [bad ?? (has(named) ? named : own.find(has) ?? named)].filter(Boolean);
}

/** A probe's value type as the graph writes shapes: `float32[10,4,8]`. */
function shapeText(p) {
  const s = p?.summaries?.primal ?? Object.values(p?.summaries ?? {})[0];
  return s?.dtype && Array.isArray(s.shape) ? `${s.dtype}[${s.shape.join(",")}]` : null;
}

/**
 * One output of a stage as the face, its tooltip and the panel (its "output" row and
 * NaN line) all name it: its leaf as a user reads it (`[1]`, `a.b`, `saved for
 * backward[0]`), else its probe's name. A face said `#1` (counting from 1) beside a
 * sibling's `[1]` (counting from 0) and the panel's `saved for backward[0]`.
 * @param {{leaf?: string, name?: string}|undefined} p
 */
export function outputLabel(p) {
  const leaf = String(p?.leaf ?? "").replace(/\['([^']*)'\]/g, ".$1").replace(/^\./, "");
  return leaf || String(p?.name ?? "");
}

/** What a face of values of no size says (muted, uncoloured: no data). */
export const EMPTY_TEXT = "0 values";

/**
 * Whether a probe's values in `mode` are of no size (shape [0, 4]): their summary's
 * statistics (an l2 of 0 over no values) describe nothing.
 * @param {any} p @param {string} mode
 */
export function isEmpty(p, mode) {
  return p?.summaries?.[mode]?.size === 0;
}

/**
 * Whether a probe's leaf is a Tesseract's input field (`['x (input)']`, modes grad, vjp
 * and all): the cotangent its own VJP handed back for the field, not an output.
 * @param {string|undefined} leaf
 */
export function isInputLeaf(leaf) {
  return String(leaf ?? "").endsWith(" (input)']");
}

/**
 * The probes of a stage's own outputs: a function differentiated inside the program
 * also keeps values for its backward pass (`saved for backward`, graph/saved.py), which
 * are no result of it; its face's statistic and sparkline describe its outputs (a train
 * step's `loss_fn` showed the norm of 20 leaves, 16 of them saved for backward). So
 * does a module's call that writes its variables (a BatchNorm's `mean (new)`,
 * `saved.NEW`): its face is its activation's, not "output ‖grad‖₂"; and a Tesseract's
 * input fields (`isInputLeaf`). A stage with such values only keeps them. Non-finite
 * counts still cover every probe.
 * @param {any[]|undefined} probes
 */
export function ownOutputs(probes) {
  const own = (probes ?? []).filter((p) => {
    const leaf = String(p.leaf ?? "");
    // (nor a Tesseract's input fields, `['x (input)']`: what its VJP handed back)
    return !leaf.includes("saved for backward") && !leaf.endsWith(" (new)']") && !isInputLeaf(leaf);
  });
  return own.length ? own : probes ?? [];
}

/**
 * The non-finite values a node's probes hold in `mode`: `text` ("128 NaN", "3 NaN,
 * 1 +Inf"; "" when none), `total` (one count of several kinds: "4 NaN/Inf"), how
 * many finite values there are, and the statistic's word when none is finite
 * (`kind`: "NaN", or the sign of the infinities).
 */
export function nonfiniteCounts(probes, mode) {
  const sum = { nan: 0, posinf: 0, neginf: 0 };
  let finite = 0;
  for (const p of probes ?? []) {
    const s = p.summaries?.[mode];
    if (!s) continue;
    for (const k of Object.keys(sum)) sum[k] += s[k] ?? 0;
    finite += s.count ?? 0;
  }
  const kind = sum.nan || (sum.posinf && sum.neginf) ? "NaN" : sum.posinf ? "+Inf" : "−Inf";
  const text = nonfiniteText(sum);
  // one count for them all, when they are of several kinds ("2 NaN/Inf")
  const kinds = Object.values(sum).filter((n) => n > 0).length;
  const total = kinds > 1 ? `${sum.nan + sum.posinf + sum.neginf} NaN/Inf` : text;
  return { text, finite, kind, total };
}

/**
 * The characters of the longest face a stage can show holding NaN/Inf beside finite
 * values, its statistic and the counts (`‖grad‖₂ = 0.1973 · 2 NaN`), over every mode
 * its probes hold and every statistic (`computeFaces` picks the same output and
 * counts); 0 when no mode mixes them. The layout makes the box that wide.
 * @param {any[]|undefined} probes @param {any} [node]
 */
export function countedFaceChars(probes, node) {
  const own = ownOutputs(probes);
  const modes = new Set(own.flatMap((p) => Object.keys(p.summaries ?? {})));
  let most = 0;
  for (const mode of modes) {
    const shown = faceOutputs(probes, node, mode);
    const bad = nonfiniteCounts(own.length > 1 ? shown : probes, mode);
    if (!bad.text || bad.finite === 0) continue;
    for (const stat of Object.keys(STATS)) {
      const v = nodeStat(shown, mode, stat);
      if (v != null) most = Math.max(most, `${statSymbol(mode, stat)} = ${fmt(v)} · ${bad.text}`.length);
    }
  }
  return most;
}

/**
 * The characters of the shortest face naming the output it shows that a stage of
 * several outputs must fit: that output's name and statistic, its number to 2
 * significant digits (`[1] ‖grad‖₂ = 0.28`), over every mode its probes hold and
 * every statistic; 0 for a stage of one output. The layout makes the box that wide: at
 * 204 px beside "+ 220 eqns" an optax chain's face dropped its `[1]` and read as the
 * `[0]` its shape and panel named.
 * @param {any[]|undefined} probes @param {any} [node]
 */
export function namedFaceChars(probes, node) {
  const own = ownOutputs(probes);
  if (own.length < 2) return 0;
  const modes = new Set(own.flatMap((p) => Object.keys(p.summaries ?? {})));
  let most = 0;
  for (const mode of modes) {
    const shown = faceOutputs(probes, node, mode);
    const name = outputLabel(shown[0]);
    if (!name) continue;
    for (const stat of Object.keys(STATS)) {
      const v = nodeStat(shown, mode, stat);
      if (v != null) most = Math.max(most, fewerDigits(`${name} ${statSymbol(mode, stat)} = ${fmt(v)}`, 2).length);
    }
  }
  return most;
}

const MODE_WORDS = { primal: "x", tangent: "tan", cotangent: "grad" };
// What a face's non-finite counts are of ("grad: 128 NaN"). Not `x` for primal
// values: "x: 1024 NaN" on a stage of a program whose input is `x` read as "the input
// x holds 1024 NaN" (the parameter table says ‖value‖ too).
const COUNT_WORDS = { ...MODE_WORDS, primal: "value" };

/** What a face value is, e.g. `‖grad‖₂` for the l2 norm of the cotangent. */
export function statSymbol(mode, stat) {
  const m = MODE_WORDS[mode] ?? mode;
  if (stat === "l2") return `‖${m}‖₂`;
  if (stat === "absmax") return `max|${m}|`;
  return `${stat}(${m})`;
}

/**
 * What of a face's text fits in `room` characters beside the expand button: the text,
 * its number to 3 and to 2 significant digits ("‖grad‖₂ = 0.00903", "[1] ‖grad‖₂ = 12"),
 * else the statistic without the output it names (`‖grad‖₂ = 12.41`; the tooltip says
 * which), its number to 3 and to 2 digits again, else its short form (the non-finite counts); nothing rather than a number cut short, and never
 * a number without the statistic's name: `[1] = 0.389` read as the output's value, and
 * `= 0.3892 · 3 NaN` beside its neighbours' `‖grad‖₂ = …` said nothing of what it was.
 *
 * A face holding non-finite values beside finite ones keeps both, the statistic and
 * the count, as long as they fit (one count of several kinds: "‖grad‖₂ = 5.71e+25 ·
 * 2 NaN/Inf"), then the counts alone ("grad: 1 NaN, 1 −Inf", "1 NaN, 1 −Inf", "2
 * NaN/Inf"); never the statistic without the counts: it is over the finite values
 * only, and `denoiser`'s "‖grad‖₂ = 0.1973" read as the norm of a gradient holding 2
 * NaN (the layout makes such boxes wide enough for both, `countedFaceChars`). A
 * softmax's NaN and −Inf cotangent left its face blank.
 * @param {{text: string, short?: string, bad?: string, total?: string, which?: string}} face
 *   `which`: the output named at the start of `text` (`computeFaces`), when it names one
 * @param {number} room
 */
export function fitted(face, room) {
  const bad = face.bad ?? "";
  const total = face.total || bad;
  const tail = ` · ${bad}`;
  const counted = bad !== "" && face.text.endsWith(tail);
  const text = counted ? face.text.slice(0, -tail.length) : face.text;
  const bare = withoutOutput(text, face.which);
  const statistic = namesStatistic(bare);
  // the forms naming the statistic, with the counts while they fit, then with their
  // number to 3 and to 2 significant digits, before any form without it: a character
  // or two short (a "+ 215 eqns" button), a face lost its statistic
  const digits = (forms) => [...forms, ...forms.map((t) => fewerDigits(t, 3)), ...forms.map((t) => fewerDigits(t, 2))];
  // the output shown stays named while its number to 2 digits fits (`[1] ‖grad‖₂ = 7`):
  // a chain's face said "‖grad‖₂ = 7.002" of its `[1]` beside its shape's `[0]`
  const named = counted
    ? digits([face.text, `${text} · ${total}`, `${bare} · ${bad}`, `${bare} · ${total}`])
    : statistic ? [...digits([text]), ...digits([bare])] : [];
  // a face naming no statistic: the counts ("[1] grad: 80 NaN"), "0 values"
  const other = statistic ? [] : [text, bare];
  const short = face.short && face.short !== text ? [face.short] : [];
  const counts = bad ? [bad, total] : [];
  const tried = [...named, ...other, ...short, ...counts];
  return tried.find((t) => t.length <= room) ?? "";
}

/** A face's text without the output it starts with (`[1] ‖grad‖₂ = 2` → `‖grad‖₂ = 2`):
 * `which` when given, else a first word before a statistic. @param {string} text @param {string} [which] */
function withoutOutput(text, which) {
  if (which) return text.startsWith(`${which} `) ? text.slice(which.length + 1) : text;
  return text.replace(/^\S+ (?=\S+ = |\S+: )/, "");
}

/** Whether a face's text says its statistic (`‖grad‖₂ = …`, `value = …`), not only a
 * value (`= 2.6`) or counts. @param {string} text */
function namesStatistic(text) {
  const eq = text.indexOf(" = ");
  return eq > 0 && !/^\[[^\]]*\]$/.test(text.slice(0, eq));
}

/**
 * `text` with its number (after "= ") to `digits` significant digits.
 * @param {string} text @param {number} digits
 */
function fewerDigits(text, digits) {
  return text.replace(/(= )(-?\d+\.\d+)(e[+-]?\d+)?/, (_, eq, mant, exp) => {
    const x = Number(mant + (exp ?? ""));
    return eq + (exp ? x.toExponential(digits - 1).replace(/\.?0+e/, "e") : String(Number(x.toPrecision(digits))));
  });
}
