// Histograms over Monitor steps: every step has its own bin edges, so they are
// resampled onto one common grid before they form a heatmap. Pure.

/**
 * Redistributes `counts` (on `edges`) onto `grid` edges, spreading each bin's count
 * uniformly over its width. Mass inside the grid's range is conserved; a zero-width
 * bin (constant array) puts its whole count into the grid bin containing it.
 * @param {number[]} edges  length n+1, ascending
 * @param {number[]} counts length n
 * @param {number[]} grid   length m+1, ascending
 * @returns {number[]} length m
 */
export function resampleHistogram(edges, counts, grid) {
  const m = grid.length - 1;
  const out = new Array(Math.max(m, 0)).fill(0);
  if (m <= 0 || !edges || !counts) return out;
  let j = 0;
  for (let i = 0; i < counts.length; i++) {
    const c = counts[i];
    if (!c) continue;
    const lo = edges[i];
    const hi = edges[i + 1];
    if (!Number.isFinite(lo) || !Number.isFinite(hi)) continue;
    if (hi <= lo) {
      const k = binOf(grid, lo);
      if (k >= 0) out[k] += c;
      continue;
    }
    while (j > 0 && grid[j] > lo) j--;
    while (j < m && grid[j + 1] <= lo) j++;
    for (let k = j; k < m && grid[k] < hi; k++) {
      const overlap = Math.min(hi, grid[k + 1]) - Math.max(lo, grid[k]);
      if (overlap > 0) out[k] += (c * overlap) / (hi - lo);
    }
  }
  return out;
}

/** Index of the grid bin holding x (the last bin is closed), or -1 outside. */
export function binOf(grid, x) {
  const m = grid.length - 1;
  if (m < 1 || x < grid[0] || x > grid[m]) return -1;
  let lo = 0;
  let hi = m;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (grid[mid] <= x) lo = mid; else hi = mid;
  }
  return lo;
}

/**
 * Evenly spaced edges spanning every histogram's range.
 * @param {Array<{edges: number[]} | null | undefined>} hists
 * @returns {number[] | null} null when no histogram has a finite range
 */
export function commonGrid(hists, bins = 64) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const h of hists) {
    const e = h?.edges;
    if (!e || e.length < 2) continue;
    if (Number.isFinite(e[0])) lo = Math.min(lo, e[0]);
    if (Number.isFinite(e[e.length - 1])) hi = Math.max(hi, e[e.length - 1]);
  }
  if (!(lo <= hi)) return null;
  if (lo === hi) { lo -= 0.5; hi += 0.5; }
  const grid = new Array(bins + 1);
  for (let i = 0; i <= bins; i++) grid[i] = lo + ((hi - lo) * i) / bins;
  grid[bins] = hi;
  return grid;
}

/**
 * Heatmap data: z[bin][step] = fraction of that step's values in the bin.
 * @param {Array<{edges: number[], counts: number[]} | null>} hists one per step
 * @returns {{grid: number[], centers: number[], z: number[][]} | null}
 */
export function histogramHeatmap(hists, bins = 64) {
  const grid = commonGrid(hists, bins);
  if (!grid) return null;
  const cols = hists.map((h) => {
    if (!h) return new Array(bins).fill(null);
    const r = resampleHistogram(h.edges, h.counts, grid);
    const total = r.reduce((a, b) => a + b, 0);
    return total > 0 ? r.map((v) => v / total) : r;
  });
  const z = [];
  for (let k = 0; k < bins; k++) z.push(cols.map((c) => c[k]));
  const centers = grid.slice(0, -1).map((g, k) => (g + grid[k + 1]) / 2);
  return { grid, centers, z };
}
