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

/**
 * A note's class suffix by its level: an "info" note (what was probed how) is no alarm,
 * so it has no ⚠ as a warning has.
 * @param {string} level
 */
export function noteClass(level) {
  return level === "error" ? "error" : level === "info" ? "info" : "warning";
}

/** An HTML element: h("div", {class: "x", text: "hi"}, [children]). */
export function h(tag, attrs, children) {
  return apply(document.createElement(tag), attrs, children);
}

/** An SVG element. */
export function s(tag, attrs, children) {
  return apply(document.createElementNS(SVG_NS, tag), attrs, children);
}

/**
 * A message's `backticked` names as code: its parts, each `{code, text}`, split at the
 * backticks (a lone one stays as written). Nothing is parsed as HTML: `withCode` makes
 * each part a text node, so a user's `<b>` in a file name shows as those characters.
 * @param {string} text
 * @returns {{code: boolean, text: string}[]}
 */
export function codeSpans(text) {
  const parts = [];
  const re = /`([^`]+)`/g;
  let last = 0;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    if (m.index > last) parts.push({ code: false, text: text.slice(last, m.index) });
    parts.push({ code: true, text: m[1] });
    last = re.lastIndex;
  }
  if (last < text.length) parts.push({ code: false, text: text.slice(last) });
  return parts;
}

/** `codeSpans` as DOM children: text nodes and `<code>` elements (textContent only).
 * @param {string} text */
export function withCode(text) {
  return codeSpans(text).map((p) => (p.code ? h("code", { text: p.text }) : p.text));
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
  const head = cut > 0 ? t.slice(0, cut) : t;
  const index = head.match(INDEX_END)?.[0] ?? "";
  if (index && index.length < head.length) return keepingIndex(head, index, tail, n);
  if (tail && tail.length <= Math.floor(n / 2)) return `${t.slice(0, n - 1 - tail.length)}…${tail}`;
  return `${t.slice(0, n - 1)}…`;
}

// The indices ending a path (`attention_blocks[0]`, `blocks[0–2]`, `down[1][0]`).
const INDEX_END = /(\[\d+(?:[–-]\d+)?\])+$/;
// The fewest characters of a path kept before its index and tail.
const PATH_KEPT = 4;

/**
 * `ellipsis` of a label whose path ends in an index (`head`, ending in `index`),
 * before its `tail`: the index is never cut, as it is all that tells a stack's
 * children apart (`attention_blocks[0]: AttentionBlock` and `[1]` both read
 * `attention_blocks…: AttentionBlock`). The path's middle goes first
 * (`attention_blo…[0]: AttentionBlock`), then the tail's end, which siblings share
 * (`layers[0]: Con…`), then the path's end before its index.
 * @param {string} head @param {string} index @param {string} tail @param {number} n
 */
function keepingIndex(head, index, tail, n) {
  const path = head.slice(0, head.length - index.length);
  const kept = index + tail;
  // (with a few of the path's characters: `d…[1][0].resnet` said little)
  if (tail.length <= Math.floor(n / 2) && kept.length + 1 + PATH_KEPT <= n) return `${path.slice(0, n - 1 - kept.length)}…${kept}`;
  if (head.length + 2 <= n) return `${head}${tail.slice(0, n - 1 - head.length)}…`;
  if (index.length + 2 <= n) return `${path.slice(0, n - 1 - index.length)}…${index}`;
  return `${head.slice(0, n - 1)}…`;
}

/** A stored message split at backticks: [{code: false, text}, {code: true, text}, ...]. */
export function messageParts(text) {
  return String(text ?? "").split("`").map((t, i) => ({ code: i % 2 === 1, text: t })).filter((p) => p.text);
}

/** A message with `code` spans (between backticks) as nodes: text and <code>, never HTML. */
export function said(text) {
  return messageParts(text).map((m) => (m.code ? h("code", { text: m.text }) : m.text));
}
