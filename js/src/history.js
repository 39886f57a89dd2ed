// The Monitor history kept by the front end. Python sends each step once (a custom
// message {"type": "step", "step": Step}); the store appends it and tells listeners.
// Pure apart from the listener callbacks.

export const DEFAULT_LIMIT = 1000;
/** Points of the every-step loss series kept (Python's `_history.LOSS_POINTS`). */
export const LOSS_LIMIT = 2000;

/** An empty history in the model's shape. */
export function emptyHistory(limit = DEFAULT_LIMIT) {
  return { steps: [], loss: [], finite: [], skipped: [], program: [], probes: {}, nonfinite: null, losses: emptyLosses(), limit };
}

function emptyLosses(limit = LOSS_LIMIT) {
  return { steps: [], loss: [], limit };
}

/** A deep enough copy of a model's history, so appending never mutates the model. */
export function copyHistory(h) {
  if (!h) return emptyHistory();
  const probes = {};
  for (const [pid, byMode] of Object.entries(h.probes ?? {})) {
    probes[pid] = {};
    for (const [mode, list] of Object.entries(byMode ?? {})) probes[pid][mode] = [...(list ?? [])];
  }
  return {
    steps: [...(h.steps ?? [])],
    loss: [...(h.loss ?? [])],
    finite: (h.steps ?? []).map((_, i) => h.finite?.[i] ?? null),
    // a step a guarded update skipped (`expect_nonfinite=("gradients",)`): its
    // gradients alone were non-finite, expected; no alarm
    skipped: (h.steps ?? []).map((_, i) => h.skipped?.[i] === true),
    program: (h.steps ?? []).map((_, i) => h.program?.[i] ?? null),
    probes,
    nonfinite: h.nonfinite ?? null,
    nonfinite_steps: h.nonfinite_steps ?? null,
    nonfinite_count: h.nonfinite_count ?? null,
    skipped_steps: h.skipped_steps ?? null,
    skipped_count: h.skipped_count ?? null,
    // every step's loss, recorded or not (`every=N`); null: an older model, whose
    // chart is the recorded steps' `loss`
    losses: h.losses ? { steps: [...(h.losses.steps ?? [])], loss: [...(h.losses.loss ?? [])], limit: h.losses.limit ?? LOSS_LIMIT } : null,
    limit: h.limit ?? DEFAULT_LIMIT,
  };
}

/**
 * The loss chart's series: every step's loss (`history.losses`: a Monitor with
 * `every=N` computes one at every step), else the recorded steps' (an older model).
 * @param {any} h @returns {{steps: number[], loss: (number|null)[]}}
 */
export function lossSeries(h) {
  if (h?.losses?.steps?.length) return h.losses;
  return { steps: h?.steps ?? [], loss: h?.loss ?? [] };
}

/**
 * Adds losses of steps after the series' last (older or repeated steps are dropped:
 * they come in step order); past its limit, every other point of its older half goes
 * (the first point stays), as Python thins it.
 */
export function appendLosses(h, steps, losses) {
  const ls = (h.losses ??= emptyLosses());
  for (let i = 0; i < steps.length; i++) {
    const n = ls.steps.length;
    if (typeof steps[i] !== "number" || (n && steps[i] <= ls.steps[n - 1])) continue;
    ls.steps.push(steps[i]);
    ls.loss.push(typeof losses?.[i] === "number" ? losses[i] : null);
  }
  while (ls.steps.length > Math.max(ls.limit ?? LOSS_LIMIT, 2)) {
    const half = Math.floor(ls.steps.length / 2);
    const keep = (_, i) => i >= half || i % 2 === 0;
    ls.steps = ls.steps.filter(keep);
    ls.loss = ls.loss.filter(keep);
  }
  return h;
}

/** The recorded step of `h` nearest to step `x` (a click on the every-step loss chart). */
export function nearestStep(h, x) {
  let best = null;
  for (const s of h?.steps ?? []) if (best == null || Math.abs(s - x) < Math.abs(best - x)) best = s;
  return best;
}

/**
 * Appends one step, keeping every series aligned with `steps`; drops the oldest past
 * `limit`. An item `{kind: "losses", steps, loss}` (unrecorded steps' losses) goes to
 * the every-step loss series only.
 */
export function appendStep(h, step) {
  if (step?.kind === "losses") return appendLosses(h, step.steps ?? [], step.loss ?? []);
  const n = h.steps.length;
  h.steps.push(step.step ?? (n ? h.steps[n - 1] + 1 : 0));
  if (h.losses) appendLosses(h, [h.steps[n]], [step.loss]);
  h.loss.push(typeof step.loss === "number" ? step.loss : null);
  h.finite.push(typeof step.finite === "boolean" ? step.finite : null);
  (h.skipped ??= new Array(n).fill(false)).push(step.skipped === true);
  h.program.push(typeof step.program === "number" ? step.program : null);
  const seen = new Set();
  for (const [pid, byMode] of Object.entries(step.probes ?? {})) {
    h.probes[pid] ??= {};
    for (const [mode, s] of Object.entries(byMode ?? {})) {
      const list = (h.probes[pid][mode] ??= new Array(n).fill(null));
      while (list.length < n) list.push(null);
      list.push(s ?? null);
      seen.add(`${pid}\u0000${mode}`);
    }
  }
  for (const [pid, byMode] of Object.entries(h.probes)) {
    for (const [mode, list] of Object.entries(byMode)) {
      if (!seen.has(`${pid}\u0000${mode}`)) { while (list.length < n) list.push(null); list.push(null); }
    }
  }
  const nf = step.nonfinite;
  if (!h.nonfinite && nf && (nf.forward || nf.backward)) {
    h.nonfinite = { ...nf, step: h.steps[n], forward: nf.forward ?? null, backward: nf.backward ?? null };
  }
  const extra = h.steps.length - (h.limit ?? DEFAULT_LIMIT);
  if (extra > 0) {
    h.steps.splice(0, extra);
    h.loss.splice(0, extra);
    h.finite.splice(0, extra);
    h.skipped?.splice(0, extra);
    h.program.splice(0, extra);
    for (const byMode of Object.values(h.probes)) for (const list of Object.values(byMode)) list.splice(0, extra);
  }
  return h;
}

/**
 * Steps whose loss or gradients held NaN/Inf. The Monitor's `finite` flag says so
 * (it covers the loss, the gradients and the returned values); where a step has no
 * flag (older models), a null loss in a history whose other losses are numbers is
 * a non-finite one (JSON has no NaN, so NaN and ±Inf arrive as null).
 */
export function nonfiniteSteps(h) {
  if (!h?.steps?.length) return [];
  const scalar = (h.loss ?? []).some((v) => typeof v === "number");
  const flagged = h.steps.filter((_, i) => {
    if (h.skipped?.[i] === true) return false; // skipped by a guarded update: no alarm
    const flag = h.finite?.[i];
    if (typeof flag === "boolean") return !flag;
    return scalar && h.loss?.[i] == null;
  });
  // every step found non-finite, recorded or not (a Monitor with every=N checks each):
  // runs [first, last]
  const runs = Array.isArray(h.nonfinite_steps) ? h.nonfinite_steps : [];
  if (!runs.length) return flagged;
  const all = new Set(flagged);
  for (const [a, b] of runs) for (let s = a; s <= b && all.size < MAX_MARKED; s++) all.add(s);
  return [...all].sort((x, y) => x - y);
}

const MAX_MARKED = 10000; // steps marked on a chart (a run NaN for good: the count says the rest)

/** How many steps were non-finite: the Monitor's count of every step, else those marked. */
export function nonfiniteCount(h, marked) {
  return Math.max(typeof h?.nonfinite_count === "number" ? h.nonfinite_count : 0, marked.length);
}

/**
 * How many steps a guarded update skipped (`expect_nonfinite=("gradients",)`): the
 * Monitor's count of every step, else the recorded ones marked.
 */
export function skippedCount(h) {
  const marked = (h?.skipped ?? []).filter((v) => v === true).length;
  return Math.max(typeof h?.skipped_count === "number" ? h.skipped_count : 0, marked);
}

/** Steps at which one probe's summaries (per step, aligned with `steps`) count NaN/Inf. */
export function probeNonfiniteSteps(steps, summaries) {
  return steps.filter((_, i) => {
    const s = summaries?.[i];
    return Boolean(s && ((s.nan ?? 0) > 0 || (s.posinf ?? 0) > 0 || (s.neginf ?? 0) > 0));
  });
}

/** Latest summaries per probe and mode: {pid: {mode: SummaryLite}}. */
export function latestSummaries(h) {
  const out = {};
  if (!h || !h.steps.length) return out;
  for (const [pid, byMode] of Object.entries(h.probes)) {
    for (const [mode, list] of Object.entries(byMode)) {
      const s = list[list.length - 1];
      if (s) (out[pid] ??= {})[mode] = s;
    }
  }
  return out;
}

/** Model with each probe's summaries overlaid by the latest step (shape/dtype/loghist kept). */
export function withLatest(model, h) {
  const latest = latestSummaries(h);
  if (!Object.keys(latest).length) return model;
  const probes = (model.probes ?? []).map((p) => {
    const over = latest[p.id];
    if (!over) return p;
    const summaries = { ...p.summaries };
    for (const [mode, s] of Object.entries(over)) summaries[mode] = { ...(summaries[mode] ?? {}), ...s };
    return { ...p, summaries };
  });
  return { ...model, probes };
}

/**
 * Model with each probe's summaries overlaid by recorded step `step` (a step number in
 * `h.steps`; null or the latest step: `withLatest`). A past step's history keeps the
 * per-step statistics and histogram only: the latest step's log histogram and
 * per-iteration rows are dropped, not shown under another step's name, and a probe
 * the step has no summary of shows no data.
 * @param {any} model @param {any} h @param {number|null} step
 */
export function withStep(model, h, step) {
  const n = h?.steps?.length ?? 0;
  const i = step == null ? -1 : (h?.steps ?? []).indexOf(step);
  // the shapes of the program the step ran (a ragged last batch ran another)
  const program = n ? h.program?.[i < 0 ? n - 1 : i] : null;
  if (i < 0 || i === n - 1) return withProgram(withLatest(model, h), program);
  const probes = (model.probes ?? []).map((p) => {
    const summaries = {};
    for (const [mode, base] of Object.entries(p.summaries ?? {})) {
      const s = h.probes[p.id]?.[mode]?.[i];
      if (s) summaries[mode] = { ...base, ...s, loghist: null, per_iteration: null };
    }
    return { ...p, summaries };
  });
  return withProgram({ ...model, probes }, program);
}

/**
 * Model drawn with the shapes of `model.programs[k]` (a Monitor keeps one per set of
 * shapes its steps ran; each history step names its own): each node's `shapes` and
 * each probe's `shape` and `size`. The graph is the latest program's: a step of
 * another batch size was described with the last batch's shapes beside its own
 * counts. No such program (an older model, or none said): the model as it is.
 * @param {any} model @param {number|null|undefined} k
 */
export function withProgram(model, k) {
  const prog = typeof k === "number" ? model?.programs?.[k] : null;
  if (!prog) return model;
  const shapes = prog.nodes ?? {};
  const nodes = (model.nodes ?? []).map((n) => (Array.isArray(shapes[n.id]) ? { ...n, shapes: shapes[n.id] } : n));
  const probes = (model.probes ?? []).map((p) => {
    const own = prog.probes?.[p.id];
    if (!own || !Array.isArray(own.shape)) return p;
    const summaries = {};
    for (const [mode, s] of Object.entries(p.summaries ?? {})) summaries[mode] = { ...s, shape: own.shape, size: own.size };
    return { ...p, summaries };
  });
  return { ...model, nodes, probes };
}

/** The step a view shows: `wanted` when the history still holds it, else the latest (null). */
export function shownStep(h, wanted) {
  if (wanted == null || !h?.steps?.length) return null;
  const i = h.steps.indexOf(wanted);
  return i < 0 || i === h.steps.length - 1 ? null : wanted;
}

/** Step `i` of history `h` as the step message that appended it. */
export function stepAt(h, i) {
  const probes = {};
  for (const [pid, byMode] of Object.entries(h.probes ?? {})) {
    for (const [mode, list] of Object.entries(byMode ?? {})) {
      if (list?.[i] != null) (probes[pid] ??= {})[mode] = list[i];
    }
  }
  const nonfinite = h.nonfinite?.step === h.steps[i] ? h.nonfinite : undefined;
  return { step: h.steps[i], loss: h.loss[i], finite: h.finite?.[i] ?? null, skipped: h.skipped?.[i] === true, program: h.program?.[i] ?? null, probes, nonfinite };
}

/** A store with listeners; one per widget model (shared by all its views). */
export class HistoryStore {
  constructor(history) {
    this.history = copyHistory(history);
    this.listeners = new Set();
  }
  reset(history) {
    const before = this.history;
    this.history = copyHistory(history);
    // Steps pushed while this model was on its way are newer than its history: the
    // Monitor sent them after it, and decoding a model takes longer than a step. They
    // were lost (a live chart missed steps 2 and 3 of 6).
    const n = this.history.steps.length;
    const last = n ? this.history.steps[n - 1] : -Infinity;
    before?.steps?.forEach((s, i) => { if (s > last) appendStep(this.history, stepAt(before, i)); });
    // (and the unrecorded steps' losses after the model's own: `appendLosses` keeps
    // the newer ones only)
    if (before?.losses && this.history.losses) appendLosses(this.history, before.losses.steps, before.losses.loss);
    this.emit();
  }
  push(step) {
    appendStep(this.history, step);
    this.emit();
  }
  subscribe(fn) {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }
  emit() {
    for (const fn of this.listeners) fn(this.history);
  }
}
