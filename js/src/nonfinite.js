// Where NaN/Inf show up, and where they first appeared.
// Pure: works on summaries and the index only.

/** A capture key is backward when it holds a cotangent anywhere ("cotangent", "cotangent.tangent"). */
export function isBackwardKey(key) {
  return String(key).split(".").includes("cotangent");
}

/** Number of NaN and ±Inf values in a summary (0 for a missing summary). */
export function nonfiniteCount(s) {
  if (!s) return 0;
  return (s.nan | 0) + (s.posinf | 0) + (s.neginf | 0);
}

/**
 * Whether a node's own probes hold non-finite values, split by pass.
 * @param {Array<{summaries: Record<string, any>}>} probes
 */
export function nodeNonfinite(probes) {
  let forward = false;
  let backward = false;
  for (const p of probes) {
    for (const [key, s] of Object.entries(p.summaries ?? {})) {
      if (nonfiniteCount(s) > 0) {
        if (isBackwardKey(key)) backward = true;
        else forward = true;
      }
    }
  }
  return { forward, backward };
}

/**
 * The nodes where non-finite values first appear.
 *
 * Forward pass: values are produced in program order, and a stage's output exists only
 * once its last child ran, so nodes compare by `exit` (largest `order` in their
 * subtree); the smallest wins, the deeper node on a tie (it produced the value).
 * Backward pass: runs in reverse, so the largest `exit` wins, the shallower node on a
 * tie (the stage's output cotangent exists before its children's).
 * For leaves `exit == order`, so this is "first / last in program order".
 *
 * @param {import("./model.js").ModelIndex} index
 * @returns {{forward: string|null, backward: string|null}}
 */
export function nonfiniteOrigins(index) {
  let forward = null;
  let backward = null;
  const key = (id) => [index.exit.get(id) ?? index.nodes.get(id).order, -(index.depth.get(id) ?? 0)];
  const less = (a, b) => a[0] < b[0] || (a[0] === b[0] && a[1] < b[1]);
  for (const [id, f] of index.nonfinite) {
    const k = key(id);
    if (f.forward && (forward === null || less(k, key(forward)))) forward = id;
    if (f.backward && (backward === null || less(key(backward), k))) backward = id;
  }
  return { forward, backward };
}
