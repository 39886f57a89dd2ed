// The table of a group of inputs (the "parameters"): one row per leaf with its value and
// gradient norms, sortable by any column. Pure helpers plus one DOM builder.

import { h } from "./dom.js";
import { fmt } from "./stats.js";
import { chartNorm, nonfiniteText } from "./nonfinite.js";

/**
 * Rows for the input leaves under `id`: name (path below the group), shape, ‖value‖₂,
 * ‖grad‖₂ and their ratio (null when a side is missing).
 * @param {import("./model.js").ModelIndex} index
 * @param {string} id
 */
export function paramRows(index, id) {
  const at = firstReads(index);
  const rows = [];
  const walk = (nid, prefix) => {
    for (const c of index.children.get(nid) ?? []) {
      const n = index.nodes.get(c);
      const name = joinPath(prefix, n.label);
      if (n.kind === "input") rows.push({ ...leafRow(index, c, name), at: at.get(c) ?? Infinity });
      else walk(c, name);
    }
  };
  walk(id, "");
  // in model order: by the first stage that reads each (a Linen model's parameters
  // come alphabetically: `Dense_0` before `conv_init`), the unread last
  return rows.sort((a, b) => a.at - b.at);
}

const reading = new WeakMap();

/**
 * Per input node, its rank among the inputs in the order the program first reads them.
 * @param {import("./model.js").ModelIndex} index
 * @returns {Map<string, number>}
 */
function firstReads(index) {
  let at = reading.get(index);
  if (!at) {
    at = new Map([...readOrder(index, index.nodes.keys())].map(([r], k) => [r, k]));
    reading.set(index, at);
  }
  return at;
}

/**
 * The inputs the nodes `ids` read, each at its first read, in program order: by the
 * `order` of the equation reading it (`read_at`; a model without it: the reading node's
 * own `order`, its reads before its stages'), ties as the nodes list them.
 * @param {import("./model.js").ModelIndex} index
 * @param {Iterable<string>} ids
 * @returns {Map<string, number>}
 */
function readOrder(index, ids) {
  /** @type {Map<string, number>} */
  const first = new Map();
  const nodes = [...ids].map((i) => index.nodes.get(i)).filter((n) => n?.reads?.length);
  for (const n of nodes.sort((a, b) => a.order - b.order)) {
    n.reads.forEach((r, k) => {
      const at = n.read_at?.[k] ?? n.order;
      if (!first.has(r) || at < /** @type {number} */ (first.get(r))) first.set(r, at);
    });
  }
  return new Map([...first].sort((a, b) => a[1] - b[1]));
}

/**
 * Rows for the inputs a stage reads (its own and its stages', `node.reads`): a layer's
 * parameters, named as in the parameters' table (`layers[0].weight`), in the order the
 * program first reads them (a block's `bn1.bias` before its `conv2.kernel`).
 * @param {import("./model.js").ModelIndex} index
 * @param {string} id
 */
export function readRows(index, id) {
  const below = [];
  const todo = [id];
  while (todo.length) {
    const n = /** @type {string} */ (todo.pop());
    below.push(n);
    todo.push(...(index.children.get(n) ?? []));
  }
  const ids = [...readOrder(index, below).keys()].filter((r) => index.nodes.get(r)?.kind === "input");
  return ids.map((c) => {
    // its path below its top-level group (`parameters`), or its own label
    const labels = [];
    let n = index.nodes.get(c);
    while (n?.parent != null && index.nodes.get(n.parent)?.parent != null) {
      labels.unshift(n.label);
      n = index.nodes.get(n.parent);
    }
    const name = labels.length ? labels.reduce(joinPath, "") : index.nodes.get(c)?.label ?? c;
    return leafRow(index, c, name);
  });
}

/**
 * `layers[0]` + `weight` is `layers[0].weight`; + `[1]` is `layers[0][1]`; a Haiku
 * module's path (`mlp/~/linear_0`) + `w` is `mlp/~/linear_0/w`, as Haiku names it.
 * @param {string} prefix @param {string} label
 */
export function joinPath(prefix, label) {
  if (!prefix) return label;
  if (label.startsWith("[")) return `${prefix}${label}`;
  return `${prefix}${prefix.includes("/") ? "/" : "."}${label}`;
}

function leafRow(index, id, name) {
  const n = index.nodes.get(id);
  const p = (index.probesByNode.get(id) ?? [])[0];
  const value = p?.summaries?.primal?.l2 ?? null;
  const cot = p?.summaries?.cotangent;
  // (no finite value: no norm, "—" marked as NaN/Inf; older writers wrote 0.0)
  const grad = cot?.count === 0 ? null : cot?.l2 ?? null;
  // (`type`: the Flax NNX variable holding it, `LoRAParam` beside a frozen `Param`;
  // `noGrad`: why a mode computing gradients gave it none, the probe's `no_cotangent`)
  return {
    id, probe: p?.id ?? null, name, shape: n?.shapes?.[0] ?? "", type: n?.var_type ?? "", value, grad,
    ratio: value && grad != null && !nonfiniteText(cot) ? grad / value : null, noGrad: grad == null ? p?.no_cotangent ?? null : null,
    // the gradient's NaN/Inf counts ("3 NaN"), "" when finite: its ‖grad‖₂ is over the
    // finite values only, or "—" with none
    gradBad: nonfiniteText(cot),
  };
}

/**
 * Why a group's ‖grad‖ column reads "—", in a mode computing gradients: a Flax NNX
 * model's state (`<argument> state`: BatchNorm statistics, RNG counts, counters, never
 * differentiated, as `nnx.grad` leaves them) or an argument that is not differentiated
 * (`frozen` of `trained, frozen = nnx.split(model, nnx.LoRAParam, ...)`); null when
 * some leaf has a gradient or no reason is known.
 * @param {import("./model.js").ModelIndex} index
 * @param {string} id the group's node
 * @param {{grad: number|null, noGrad: string|null}[]} rows
 */
export function gradNote(index, id, rows) {
  if (!index.modes.includes("cotangent") || !rows.length) return null;
  // (a BatchNorm's running mean in training is "unreached": only its new value is read)
  if (!rows.every((r) => r.grad == null && r.noGrad) || !rows.some((r) => r.noGrad === "independent")) return null;
  let top = index.nodes.get(id);
  while (top?.parent != null && index.nodes.get(top.parent)?.parent != null) top = index.nodes.get(top.parent);
  if (top?.label?.endsWith(" state")) {
    return "no gradient: a model's state (variables other than nnx.Param), which sowviz does not differentiate, as nnx.grad does not";
  }
  return "no gradient: not differentiated (an argument outside argnums; mode grad takes argument 0 unless argnums= says otherwise)";
}

/**
 * Each leaf's gradient norm (the cotangent's `l2`) over the Monitor's steps, for the
 * `limit` leaves with the largest latest norm (a run has hundreds of leaves; a chart
 * shows a handful). Non-finite steps: those where some leaf's gradient held NaN/Inf
 * (over every leaf, shown or not).
 * @returns {{series: {id: string, name: string, y: (number|null)[]}[], total: number, nonfinite: number[]}}
 */
export function gradHistory(rows, hist, limit = 8) {
  const steps = hist?.steps ?? [];
  const all = [];
  const bad = new Set();
  for (const r of rows) {
    const list = r.probe ? hist?.probes?.[r.probe]?.cotangent : null;
    if (!list) continue;
    const y = steps.map((_, i) => chartNorm(list[i]));
    list.forEach((s, i) => { if (s && ((s.nan ?? 0) > 0 || (s.posinf ?? 0) > 0 || (s.neginf ?? 0) > 0)) bad.add(i); });
    const last = [...y].reverse().find((v) => v != null) ?? null;
    all.push({ id: r.id, name: r.name, y, last });
  }
  all.sort((a, b) => (b.last ?? -Infinity) - (a.last ?? -Infinity) || a.name.localeCompare(b.name));
  return {
    series: all.slice(0, limit).map(({ id, name, y }) => ({ id, name, y })),
    total: all.length,
    nonfinite: steps.filter((_, i) => bad.has(i)),
  };
}

/** Rows sorted by `key` (numbers: nulls last), `dir` 1 ascending or -1 descending. */
export function sortRows(rows, key, dir) {
  return [...rows].sort((a, b) => {
    const x = a[key];
    const y = b[key];
    if (x == null || y == null) return Number(x == null) - Number(y == null);
    return (typeof x === "number" ? x - y : String(x).localeCompare(String(y))) * dir;
  });
}

/** `name` with a zero-width break opportunity after each `.` and before each `[`. */
export function breakable(name) {
  return name.replace(/\./g, ".\u200b").replace(/\[/g, "\u200b[").replace(/^\u200b/, "");
}

const COLUMNS = [["name", "name"], ["shape", "shape"], ["value", "‖value‖₂"], ["grad", "‖grad‖₂"], ["ratio", "grad/value"]];

/**
 * The sortable table; clicking a row reveals its leaf. A `type` column when a leaf is a
 * Flax NNX variable's; `note` (`gradNote`) under the title.
 * @param {string|null} [note]
 */
export function paramTable(rows, onReveal, title = `${rows.length} leaves`, note = null) {
  let key = ""; // as given (model order) until a column is picked
  let dir = 1;
  const typed = rows.some((r) => r.type);
  const columns = typed ? [COLUMNS[0], ["type", "type"], ...COLUMNS.slice(1)] : COLUMNS;
  const body = h("tbody");
  const head = h("tr", {}, columns.map(([k, label]) => {
    const th = h("th", { "data-sort": k, title: "sort", text: label, tabindex: "0" });
    const click = () => {
      dir = key === k ? -dir : k === "name" || k === "shape" || k === "type" ? 1 : -1;
      key = k;
      fill();
    };
    th.addEventListener("click", click);
    th.addEventListener("keydown", (ev) => { if (ev.key === "Enter") click(); });
    return th;
  }));
  const fill = () => {
    body.replaceChildren(...(key ? sortRows(rows, key, dir) : rows).map((r) => {
      const tr = h("tr", { "data-node": r.id }, [
        // whole, breakable after its path's dots (`layers[0].attn.key.bias` and
        // `layers[0].attn.query.bias` differ in the middle: no cut keeps both apart)
        h("td", {}, [h("button", { type: "button", class: "sv-link", text: breakable(r.name), title: r.name, onclick: () => onReveal(r.id) })]),
        ...(typed ? [h("td", { class: "sv-muted", text: r.type, "data-role": "var-type" })] : []),
        h("td", { class: "sv-muted", text: shortShape(r.shape), title: r.shape }),
        h("td", { text: fmt(r.value) }),
        h("td", r.gradBad ? {
          class: "sv-bad", text: fmt(r.grad), "data-nonfinite": "true",
          title: r.grad == null ? `no finite value (${r.gradBad})` : `${r.gradBad}: the norm of the finite values`,
        } : { text: fmt(r.grad) }),
        h("td", { text: fmt(r.ratio) }),
      ]);
      return tr;
    }));
    for (const th of head.children) th.setAttribute("aria-sort", th.dataset.sort === key ? (dir > 0 ? "ascending" : "descending") : "none");
  };
  fill();
  return h("div", { class: "sv-params" }, [
    h("h4", { class: "sv-section", text: title }),
    ...(note ? [h("p", { class: "sv-muted", text: note, "data-role": "grad-note" })] : []),
    h("table", { class: "sv-stats sv-param-table", "data-role": "param-table" }, [h("thead", {}, [head]), body]),
  ]);
}

/** `f32[4,8]` for `float32[4,8]`: the table is narrow. */
function shortShape(shape) {
  return String(shape).replace(/^float/, "f").replace(/^bfloat/, "bf").replace(/^int/, "i");
}

/** The number of values of a type as the model writes it (`float32[64@data,32]`: 2048;
 * `float32[]`: 1), or null when it is not one. @param {string} shape */
export function shapeSize(shape) {
  const m = /\[([^\]]*)\]\s*$/.exec(String(shape));
  if (!m) return null;
  if (!m[1].trim()) return 1;
  let n = 1;
  for (const d of m[1].split(",")) {
    const v = Number.parseInt(d, 10);
    if (!Number.isFinite(v)) return null;
    n *= v;
  }
  return n;
}

/**
 * A group of leaves' tooltip lines (a node with `leaves`): how many, how many values in
 * all, and its `top` largest leaves by name, then "+N more". It listed every leaf's bare
 * type, 53 lines of `float32[32]` for a small transformer, taller than the screen.
 * @param {import("./model.js").ModelIndex} index @param {string} id @param {number} [top]
 * @returns {string[]}
 */
export function leafSummary(index, id, top = 5) {
  /** @type {{name: string, shape: string, size: number | null, order: number}[]} */
  const leaves = [];
  /** @param {string} nid @param {string} prefix */
  const walk = (nid, prefix) => {
    for (const c of index.children.get(nid) ?? []) {
      const n = index.nodes.get(c);
      if (!n) continue;
      const name = joinPath(prefix, n.label);
      if (n.kind === "input" || n.kind === "output") {
        const shape = n.shapes?.[0] ?? "";
        leaves.push({ name, shape, size: shapeSize(shape), order: leaves.length });
      } else walk(c, name);
    }
  };
  walk(id, "");
  const known = leaves.filter((l) => l.size != null);
  const total = known.reduce((a, l) => a + /** @type {number} */ (l.size), 0);
  const kind = index.nodes.get(id)?.leaves?.kind ?? "input";
  const head = `${leaves.length} ${kind} lea${leaves.length === 1 ? "f" : "ves"}`
    + (known.length ? ` · ${total.toLocaleString("en-US")} values${known.length < leaves.length ? " (of those with a known shape)" : ""}` : "");
  const big = [...leaves].sort((a, b) => (b.size ?? -1) - (a.size ?? -1) || a.order - b.order).slice(0, top);
  const lines = [head, leaves.length > big.length ? "largest:" : "leaves:", ...big.map((l) => `  ${l.name}  ${l.shape}`)];
  if (leaves.length > big.length) lines.push(`  +${leaves.length - big.length} more${kind === "input" ? " (its panel lists them all)" : ""}`);
  return lines;
}
