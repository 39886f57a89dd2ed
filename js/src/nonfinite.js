// NaN/Inf display helpers. Where non-finite values were born is computed once, in
// Python (sowviz/nonfinite.py), and stored in the model (`model.nonfinite`, or for a
// Monitor `history.nonfinite`, with its step); this module only reads it.
// Pure: works on summaries, the stored record and the index.

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
 * A summary's l2 norm as a chart over steps or iterations plots it: null (a gap, under
 * the chart's NaN/Inf band) when any value is NaN/Inf. Such values have no norm
 * (`jnp.linalg.norm` gives NaN or inf); the l2 over their finite part alone (0 for a
 * gradient that is NaN wherever ReLU let it through, 0.0 for an all-NaN one in logs of
 * older writers) drew the bad step as a dip to 0.
 * @param {{l2?: number|null, count?: number, nan?: number, posinf?: number, neginf?: number}|null|undefined} s
 */
export function chartNorm(s) {
  if (!s || typeof s.l2 !== "number" || nonfiniteCount(s) > 0 || s.count === 0) return null;
  return s.l2;
}

/** A summary's non-finite counts in words: "3 NaN, 1 +Inf" ("" when none). */
export function nonfiniteText(s) {
  return [["nan", "NaN"], ["posinf", "+Inf"], ["neginf", "−Inf"]]
    .filter(([k]) => s?.[k] > 0).map(([k, l]) => `${s[k]} ${l}`).join(", ");
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

function pass(o) {
  if (o == null) return null;
  if (typeof o === "string") return { node: o, reaching: null, equation: null, message: null };
  return {
    node: o.node ?? null,
    reaching: o.reaching ?? null,
    equation: o.equation ?? null,
    message: o.message ?? null,
    // backward: its stage's forward values are non-finite, so its backward only passes
    // the forward pass's NaN on: no origin of its own, marked nowhere
    followsForward: !!o.follows_forward,
  };
}

/**
 * The stored origins, normalised: the model's own record wins, else the Monitor history's
 * (whose older form holds bare node ids). Never recomputed from the summaries.
 * @returns {{step: number|null, forward: any, backward: any, propagators: string[],
 *   expected: string[], removed: boolean, alarm: boolean, located: boolean|null,
 *   notReproduced: boolean, overwritten: boolean, message: string|null}|null}
 */
export function storedOrigins(model, history) {
  const rec = model?.nonfinite ?? history?.nonfinite ?? null;
  if (!rec) return null;
  const forward = pass(rec.forward);
  const backward = pass(rec.backward);
  if (!forward && !backward && !(rec.expected ?? []).length) return null;
  return {
    step: rec.step ?? null,
    forward,
    backward,
    propagators: [...(rec.propagators ?? [])],
    expected: [...(rec.expected ?? [])],
    removed: !!rec.removed,
    alarm: rec.alarm ?? true,
    // the step was re-run down to the equation (null: a record from before the flag)
    located: rec.located ?? null,
    // locate re-ran the step and found no alarm: the step's own record, kept
    notReproduced: !!rec.not_reproduced,
    // only a loop's fill values, every one written over inside the loop (a healthy
    // diffrax solve's +Inf output buffer): nothing to tell, no banner
    overwritten: !!rec.overwritten,
    message: rec.message ?? null,
  };
}

/**
 * The node ids a pass's origin points at: its stage (or, for a backward origin whose
 * making stage is unknown, the node it reached first), and its equation when located;
 * none for a backward record that follows from the forward pass (no origin of its own).
 */
export function originNodes(o) {
  if (!o || o.followsForward) return [];
  return [o.node ?? o.reaching, o.equation?.node].filter((id) => id != null);
}

/**
 * Whether the stored origins are of the values drawn. An Inspection's always are; a
 * Monitor's belong to the step that had them (`storedStep`): on any other step drawn
 * (`drawnStep`), earlier and finite, or later, finite after a skipped update or
 * non-finite from other causes, "starts here" would mark boxes whose values started
 * nothing. The banner still names the step and offers to show it.
 * @param {number|null} storedStep @param {number|null} drawnStep
 */
export function originsOnStep(storedStep, drawnStep) {
  return storedStep == null || drawnStep == null || drawnStep === storedStep;
}

const RANK = { producer: 3, propagator: 2, expected: 1 };

/**
 * Role of every node for drawing: "producer" (an origin, or a stage holding one),
 * "propagator" (passes non-finite values on), "expected" (the user said so).
 * A stage takes the strongest role inside it, so a collapsed stage shows what it hides.
 * @param {ReturnType<typeof storedOrigins>} origins
 * @param {{nodes: Map<string, {parent: string|null}>}} index
 * @returns {Map<string, "producer"|"propagator"|"expected">}
 */
export function nonfiniteRoles(origins, index) {
  const roles = new Map();
  if (!origins) return roles;
  const give = (id, role) => {
    let cur = id;
    while (cur != null && index.nodes.has(cur)) {
      const had = roles.get(cur);
      if (had && RANK[had] >= RANK[role]) break;
      roles.set(cur, role);
      cur = index.nodes.get(cur).parent;
    }
  };
  for (const id of origins.expected) give(id, "expected");
  for (const id of origins.propagators) give(id, "propagator");
  for (const o of [origins.forward, origins.backward]) for (const id of originNodes(o)) give(id, "producer");
  // a backward record that follows from the forward pass names a stage passing it on
  const passing = origins.backward?.followsForward ? origins.backward : null;
  for (const id of [passing?.node, passing?.equation?.node]) if (id != null) give(id, "propagator");
  return roles;
}

/** A short sentence per pass for the banner, from the stored messages. */
export function originSentence(o, passName) {
  if (!o) return null;
  const label = passName === "forward" ? "Forward pass" : "Backward pass";
  return `${label}: ${o.message ?? `first at ${o.node}`}.`;
}

// a stored message split at backticks (its home is dom.js, beside `said`)
export { messageParts } from "./dom.js";
