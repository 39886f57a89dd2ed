// The log-magnitude histogram (`loghist`, bins of log10|x| over the non-zero finite
// values) split by sign for the "signed log" view. Pure: no DOM, no plotly.

/**
 * Whether a summary's `loghist` carries per-bin negative counts (`neg`, same length
 * as `counts`): the signed view needs them (older summaries lack them).
 * @param {import("./types").LogHistogram | null | undefined} lh
 */
export function hasSigned(lh) {
  return !!lh && Array.isArray(lh.neg) && Array.isArray(lh.counts) && lh.neg.length === lh.counts.length;
}

/**
 * Bin centres and widths (log10 units) and, per bin, how many values are positive and
 * how many negative (positives = counts - neg), plus the values below the first bin.
 * Null when `neg` is missing.
 * @param {import("./types").LogHistogram | null | undefined} lh
 * @returns {{x: number[], width: number[], pos: number[], neg: number[], underPos: number, underNeg: number} | null}
 */
export function signedLog(lh) {
  if (!hasSigned(lh)) return null;
  const { edges, counts, neg } = lh;
  const x = [];
  const width = [];
  const pos = [];
  const negs = [];
  for (let i = 0; i < counts.length; i++) {
    const lo = edges[i];
    const hi = edges[i + 1];
    x.push((lo + hi) / 2);
    width.push(hi > lo ? hi - lo : 1);
    const n = Math.max(0, Math.min(neg[i] | 0, counts[i] | 0));
    negs.push(n);
    pos.push((counts[i] | 0) - n);
  }
  const under = lh.under ?? 0;
  const underNeg = Math.min(lh.under_neg ?? 0, under);
  return { x, width, pos, neg: negs, underPos: under - underNeg, underNeg };
}
