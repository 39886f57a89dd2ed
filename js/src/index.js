// Entry point of the bundle (sowviz/static/sowviz.js).
//   default export {initialize, render}: the anywidget front end of sowviz.Inspector/Monitor.
//   mount(el, model, options): the same view outside Jupyter (the HTML report).
// A report page holds <script type="application/json" data-sowviz-model data-target="ID">;
// loading this module mounts every such model (see autoMount), so the Python side
// writes no JavaScript of its own.

import { App } from "./app.js";
import { HistoryStore } from "./history.js";

/**
 * Draws a sowviz/1 model into `el`.
 * @param {HTMLElement} el
 * @param {any} model the model object (or its JSON text)
 * @param {import("./app.js").AppOptions} [options]
 * @returns {MountHandle}
 */
export function mount(el, model, options = {}) {
  const app = new App(el, typeof model === "string" ? JSON.parse(model) : model, options);
  return {
    update: (m) => app.update(typeof m === "string" ? JSON.parse(m) : m),
    pushStep: (step) => app.pushStep(step),
    setStatus: (phase, text) => app.setStatus(phase, text),
    destroy: () => app.destroy(),
  };
}

/**
 * @typedef {Object} MountHandle
 * @property {(model: any) => void} update
 * @property {(step: any) => void} pushStep
 * @property {(phase: import("./types").ViewPhase, text: string) => void} setStatus
 * @property {() => void} destroy
 */

// One history store per widget, shared by all of its views. Keyed by the widget's
// `key` trait: anywidget (0.11) hands `initialize` and each `render` a proxy object of
// its own, so steps stored under the object `initialize` got reached no view (a live
// Monitor's widget never moved past its first step).
const stores = new Map();

/** @param {import("./types").AnyModel} model */
function storeKey(model) {
  return model.get("key") || model;
}

/** @param {import("./types").AnyModel} model */
function storeFor(model) {
  const key = storeKey(model);
  let store = stores.get(key);
  if (!store) {
    store = new HistoryStore(null); // filled from the first decoded model (render)
    stores.set(key, store);
  }
  return store;
}

/**
 * anywidget: per-model state. Monitor steps from Python arrive as
 * {"type": "steps", "encoding": "gzip-json"} with one binary buffer holding a
 * gzipped JSON list of steps, or plainly as {"type": "step", "step": {...}}.
 * Decoding is asynchronous; a chain keeps the steps in order.
 */
/** @param {{model: import("./types").AnyModel}} ctx */
function initialize({ model }) {
  const store = storeFor(model);
  let chain = Promise.resolve();
  /** @param {import("./types").CustomMessage} msg @param {Array<DataView|ArrayBuffer>} [buffers] */
  const onMsg = (msg, buffers) => {
    if (msg && msg.type === "step" && msg.step) {
      chain = chain.then(() => store.push(msg.step));
    } else if (msg && msg.type === "steps" && buffers?.length) {
      const raw = buffers[0];
      const bytes = raw instanceof DataView ? new Uint8Array(raw.buffer, raw.byteOffset, raw.byteLength) : new Uint8Array(raw);
      chain = chain
        .then(() => gunzip(bytes))
        .then((text) => { for (const step of JSON.parse(text)) store.push(step); })
        .catch((err) => console.warn("sowviz: a Monitor update could not be decoded", err));
    }
  };
  model.on("msg:custom", onMsg);
  return () => {
    model.off("msg:custom", onMsg);
    stores.delete(storeKey(model));
  };
}

/** Gunzips bytes to text with the browser's DecompressionStream (no network). */
async function gunzip(bytes) {
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return new Response(stream).text();
}

/**
 * The widget's model: the trait `model`, which Python's serializer sends as gzipped
 * JSON in a binary buffer (a 10,000-equation model is ~20 MB of JSON and ~2 MB
 * gzipped). An empty buffer is an empty model (show() has not filled it yet).
 * @param {import("./types").AnyModel} model the anywidget model
 * @returns {Promise<import("./types").SowvizModel | {nodes: [], edges: [], probes: []}>}
 */
export async function widgetModel(model) {
  const raw = model.get("model");
  if (!raw || !raw.byteLength) return { nodes: [], edges: [], probes: [] };
  const bytes = raw instanceof DataView ? new Uint8Array(raw.buffer, raw.byteOffset, raw.byteLength) : new Uint8Array(raw);
  return JSON.parse(await gunzip(bytes));
}

/** anywidget: one view. It mounts once the model is decoded, so the first picture
 * is the real one (colours, mode, fit), never an empty graph redrawn a moment later.
 * While Python traces, compiles or runs, the status line says so (traits `phase`, `status`).
 * @param {{model: import("./types").AnyModel, el: HTMLElement}} ctx */
async function render({ model, el }) {
  const store = storeFor(model);
  let first;
  try {
    first = await widgetModel(model);
  } catch (err) {
    first = { nodes: [], edges: [], probes: [] };
    console.warn("sowviz: the model could not be decoded", err);
  }
  if (first.history && !store.history?.steps?.length) store.reset(first.history);
  // A model not there yet (a Monitor before its first step, a show() that failed) is in
  // the widget's mode: the picker read "primal", its first option
  const moded = (m) => (m.mode ? m : { ...m, mode: model.get("mode") });
  const handle = mount(el, moded(first), {
    store,
    onModeChange: (mode) => {
      model.set("mode", /** @type {import("./types").Mode} */ (mode));
      model.save_changes();
    },
    onLocate: model.get("can_locate") ? () => model.send(/** @type {import("./types").LocateMessage} */ ({ type: "locate" })) : undefined,
  });
  // A new model is decoded, then drawn: until it is, the status says "drawing…" (once
  // Python is "ready" it has nothing more to say; a switch back to a mode computed
  // before spends its time here, and said "tracing…" though nothing was traced).
  let drawing = false;
  const onStatus = () => {
    const phase = model.get("phase") ?? "ready";
    if (drawing && phase === "ready") handle.setStatus("drawing", "drawing…");
    else handle.setStatus(phase, model.get("status") ?? "");
  };
  onStatus();
  // Decoding is asynchronous: only the newest model is drawn.
  let latest = 0;
  const onModel = () => {
    const mine = ++latest;
    drawing = true;
    onStatus();
    widgetModel(model)
      .then(async (m) => {
        if (mine !== latest) return;
        await nextPaint(); // the status line shows before the (synchronous) drawing
        if (mine !== latest) return;
        handle.update(moded(m));
        drawing = false;
        onStatus();
      })
      .catch((err) => { drawing = false; handle.setStatus("error", String(err)); });
  };
  model.on("change:model", onModel);
  model.on("change:phase", onStatus);
  model.on("change:status", onStatus);
  return () => {
    model.off("change:model", onModel);
    model.off("change:phase", onStatus);
    model.off("change:status", onStatus);
    handle.destroy();
  };
}

/** Resolves once the browser has painted (a frame, then a task after it). */
function nextPaint() {
  return new Promise((resolve) => {
    if (typeof requestAnimationFrame === "undefined") { setTimeout(resolve, 0); return; }
    requestAnimationFrame(() => setTimeout(resolve, 0));
  });
}

/** Mounts every embedded report model on the page (once each). */
export async function autoMount(doc = globalThis.document) {
  if (!doc?.querySelectorAll) return;
  for (const script of /** @type {NodeListOf<HTMLScriptElement>} */ (doc.querySelectorAll('script[type="application/json"][data-sowviz-model]'))) {
    if (script.dataset.mounted) continue;
    script.dataset.mounted = "true";
    const target = doc.getElementById(script.dataset.target ?? "") ?? script.parentElement;
    mount(target, await modelText(script), { standalone: true });
  }
  globalThis.__sowviz_ready = true;
}

/**
 * The model's JSON text. Large reports embed it gzipped and base64-encoded
 * (data-encoding="gzip-base64"): summaries compress about tenfold, and
 * DecompressionStream needs no network, so the page still works from file://.
 * @param {HTMLScriptElement} script
 */
export async function modelText(script) {
  if (script.dataset.encoding !== "gzip-base64") return script.textContent;
  return gunzip(fromBase64(script.textContent.trim()));
}

/** The bytes of base64 text. A plain loop: `Uint8Array.from(atob(t), mapper)` calls the
 * mapper per byte and took ~10x longer (0.1-0.4 s for a 2 MB report). */
function fromBase64(text) {
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

if (globalThis.document?.querySelector?.('script[type="application/json"][data-sowviz-model]')) {
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", () => autoMount(), { once: true });
  else autoMount();
}

export default { initialize, render };
