// The Monitor history kept by the front end. Python sends each step once (a custom
// message {"type": "step", "step": Step}); the store appends it and tells listeners.
// Pure apart from the listener callbacks.

export const DEFAULT_LIMIT = 1000;

/** An empty history in the model's shape. */
export function emptyHistory(limit = DEFAULT_LIMIT) {
  return { steps: [], loss: [], probes: {}, nonfinite: null, limit };
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
    probes,
    nonfinite: h.nonfinite ?? null,
    limit: h.limit ?? DEFAULT_LIMIT,
  };
}

/** Appends one step, keeping every series aligned with `steps`; drops the oldest past `limit`. */
export function appendStep(h, step) {
  const n = h.steps.length;
  h.steps.push(step.step ?? (n ? h.steps[n - 1] + 1 : 0));
  h.loss.push(typeof step.loss === "number" ? step.loss : null);
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
    for (const byMode of Object.values(h.probes)) for (const list of Object.values(byMode)) list.splice(0, extra);
  }
  return h;
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

/** A store with listeners; one per widget model (shared by all its views). */
export class HistoryStore {
  constructor(history) {
    this.history = copyHistory(history);
    this.listeners = new Set();
  }
  reset(history) {
    this.history = copyHistory(history);
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
