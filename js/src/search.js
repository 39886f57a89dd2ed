// Search: which nodes match a query typed in [data-role="search"].
// A query is whitespace-separated terms, all of which must match (case-insensitive):
//   word          substring of the label, kind, primitive or a probe name on the node
//   kind:scan     the node's kind is exactly "scan"
//   is:nonfinite  the node's own values hold NaN/Inf ("is:nan" works too)
//   is:probe      the node carries a probe

/** @returns {Array<{field: string, value: string}>} */
export function parseQuery(query) {
  return String(query ?? "")
    .toLowerCase()
    .split(/\s+/)
    .filter(Boolean)
    .map((t) => {
      const m = /^(kind|is):(.+)$/.exec(t);
      return m ? { field: m[1], value: m[2] } : { field: "text", value: t };
    });
}

/** The lower-cased text a node is searched by. */
export function haystack(index, id) {
  const n = index.nodes.get(id);
  const parts = [n.label, n.kind, n.primitive ?? ""];
  for (const p of index.probesByNode.get(id) ?? []) parts.push(p.name ?? "", p.leaf ?? "");
  return parts.join("\u0000").toLowerCase();
}

export function matchesNode(index, id, terms, cache) {
  if (!terms.length) return false;
  let text = cache?.get(id);
  if (text === undefined) {
    text = haystack(index, id);
    cache?.set(id, text);
  }
  const n = index.nodes.get(id);
  return terms.every((t) => {
    if (t.field === "kind") return n.kind.toLowerCase() === t.value;
    if (t.field === "is") {
      if (t.value === "nonfinite" || t.value === "nan" || t.value === "inf") return index.nonfinite.has(id);
      if (t.value === "probe") return index.probesByNode.has(id);
      return false;
    }
    return text.includes(t.value);
  });
}

/**
 * All nodes matching `query`, in program order; the root is never a match.
 * @returns {string[]}
 */
export function searchNodes(index, query, cache) {
  const terms = parseQuery(query);
  if (!terms.length) return [];
  const out = [];
  for (const n of index.nodes.values()) {
    if (n.id !== index.root && matchesNode(index, n.id, terms, cache)) out.push(n.id);
  }
  return out.sort((a, b) => index.nodes.get(a).order - index.nodes.get(b).order);
}

/** `TransformerLM › layers[0] › attn`: where a search result sits (its ancestors below the root). */
export function parentPath(index, id) {
  const out = [];
  let p = index.nodes.get(id)?.parent;
  while (p && p !== index.root) {
    out.push(index.nodes.get(p)?.label ?? p);
    p = index.nodes.get(p)?.parent;
  }
  return out.length ? ` in ${out.reverse().join(" › ")}` : "";
}

/**
 * `hits` with the stages a user means first: stages that hold work (a module, a scan,
 * a call), then equations and other nodes, then argument leaves and their groups
 * (`parameters › blocks[0] › attn`), each in program order. Enter opens the first:
 * "attn" opened the parameter group `attn`, not the `attn: MultiheadAttention` module.
 * @param {import("./model.js").ModelIndex} index @param {string[]} hits
 */
export function rankHits(index, hits) {
  const tier = (/** @type {string} */ id) => {
    const n = index.nodes.get(id);
    if (!n || n.leaves || n.kind === "input" || n.kind === "output") return 2;
    return (index.children.get(id)?.length ?? 0) > 0 ? 0 : 1;
  };
  // (Array sort is stable: program order within a tier)
  return hits.map((id) => [tier(id), id]).sort((a, b) => Number(a[0]) - Number(b[0])).map((p) => String(p[1]));
}
