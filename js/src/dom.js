// Tiny DOM builders. User strings only ever reach the page through textContent or
// setAttribute, never innerHTML.

const SVG_NS = "http://www.w3.org/2000/svg";

function apply(el, attrs, children) {
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v == null || v === false) continue;
    if (k === "text") el.textContent = String(v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children ?? []) {
    if (c == null || c === false) continue;
    el.append(typeof c === "string" ? document.createTextNode(c) : c);
  }
  return el;
}

/** An HTML element: h("div", {class: "x", text: "hi"}, [children]). */
export function h(tag, attrs, children) {
  return apply(document.createElement(tag), attrs, children);
}

/** An SVG element. */
export function s(tag, attrs, children) {
  return apply(document.createElementNS(SVG_NS, tag), attrs, children);
}

/** Removes every child. */
export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
}

/**
 * Truncates to `n` characters with an ellipsis. A path (`aux.BatchNorm_0.mean`,
 * `new model.bn.var`) keeps its last part when that takes at most half the room:
 * it is what tells two like names apart (`aux.Batch….mean`, `aux.Batch….var`).
 * @param {unknown} text
 * @param {number} n
 */
export function ellipsis(text, n) {
  const t = String(text);
  if (t.length <= n) return t;
  // what tells like labels apart is at their end: a path's last part, a line number
  // (`neg_log_likelihood:31`), a reuse index (`critic#2`), a stack's count (` (×24)`)
  const cut = Math.max(...[".", "/", ":", "#", " (×"].map((c) => t.lastIndexOf(c)));
  const tail = cut > 0 ? t.slice(cut) : "";
  if (tail && tail.length <= Math.floor(n / 2)) return `${t.slice(0, n - 1 - tail.length)}…${tail}`;
  return `${t.slice(0, n - 1)}…`;
}

/** A stored message split at backticks: [{code: false, text}, {code: true, text}, ...]. */
export function messageParts(text) {
  return String(text ?? "").split("`").map((t, i) => ({ code: i % 2 === 1, text: t })).filter((p) => p.text);
}

/** A message with `code` spans (between backticks) as nodes: text and <code>, never HTML. */
export function said(text) {
  return messageParts(text).map((m) => (m.code ? h("code", { text: m.text }) : m.text));
}
