// A group of identical repeated blocks (node.repeats > 0, sowviz/graph/repeats.py): its
// children are the blocks, and any equations between them. The detail panel charts each block's probe statistics over the
// blocks (‖·‖₂, mean, max|·| per block, like the per-iteration charts of a scan) and the
// histogram of one chosen block (a slider), with a button that reveals that block
// (repeatview.js). Pure: no DOM, no plotly.

import { orderModes } from "./model.js";
import { nonfiniteCount } from "./nonfinite.js";

const KEYS = ["l2", "mean", "absmax", "min", "max", "std"];

/**
 * Per block of the group `id`, its probe (the one with `leaf`, else its first stage
 * probe) and, per capture key, each statistic as one array over the blocks (null where
 * a block has no such value).
 * @param {import("./model.js").ModelIndex} index
 * @param {string} id
 * @param {string | null} leaf
 */
export function repeatStats(index, id, leaf = null) {
  // Equations between the blocks (a loop's slice before each call) are no blocks; nor
  // is other work the group names (`layer · gelu`: its `gelu`s, `node.blocks` says).
  const named = index.nodes.get(id)?.blocks ?? [];
  const kids = named.length ? named
    : (index.children.get(id) ?? []).filter((c) => index.nodes.get(c)?.kind !== "eqn");
  // A block without that leaf charts the value of the group's own type: a Python loop's
  // last pass, its new cache read by no one, shows its one value with no leaf (`[1]` in
  // the passes before it), which is no reason to chart their caches instead.
  const own = index.probesByNode.get(id)?.find((p) => p.leaf === leaf);
  const want = typeOf(own);
  const blocks = kids.map((c) => {
    const ps = index.probesByNode.get(c) ?? [];
    const probe = (leaf != null ? ps.find((p) => p.auto && p.leaf === leaf) : null)
      ?? (want != null ? ps.find((p) => p.auto && typeOf(p) === want) : null)
      ?? ps.find((p) => p.auto) ?? ps[0] ?? null;
    return { id: c, label: index.nodes.get(c)?.label ?? c, probe };
  });
  const modes = orderModes([...new Set(blocks.flatMap((b) => Object.keys(b.probe?.summaries ?? {})))]);
  /** @type {Record<string, Record<string, (number|null)[]>>} */
  const series = {};
  for (const mode of modes) {
    const col = (k) => blocks.map((b) => {
      const v = b.probe?.summaries?.[mode]?.[k];
      return typeof v === "number" && Number.isFinite(v) ? v : null;
    });
    series[mode] = Object.fromEntries(KEYS.map((k) => [k, col(k)]));
    series[mode].nonfinite = blocks.map((b) => nonfiniteCount(b.probe?.summaries?.[mode]));
  }
  return { blocks, modes, series };
}

/**
 * A probe's value type as its first summary gives it (`float32[4]`), or null.
 * @param {any} probe
 */
function typeOf(probe) {
  const s = Object.values(probe?.summaries ?? {})[0];
  return s && s.dtype != null && Array.isArray(s.shape) ? `${s.dtype}[${s.shape.join(",")}]` : null;
}
