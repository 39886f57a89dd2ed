// The NaN/Inf banner [data-role="nonfinite-banner"]: what the stored origins say
// (computed once in Python, never here), a link to each origin, and the
// "Locate the equation" button while locating can add something: no locate ran yet,
// and some pass's origin has no equation. It runs once (a second call returns the
// stored record), and a re-run that found no NaN/Inf keeps the step's own record,
// flagged `not_reproduced`: pressing again would re-run for nothing. Only the widget
// can locate (Python re-runs the step); a saved report shows the button disabled,
// with the reason.

import { h, said } from "./dom.js";

export const LOCATE_REPORT_REASON = "A saved report cannot re-run the program. In Python, call "
  + "Inspection.locate_nonfinite() before save_html(), or use sowviz.show(...) and press this button there.";

const LOOP_KINDS = new Set(["scan", "while"]);

/**
 * Whether a locate would say more, on a record no locate has re-run yet: some pass's
 * origin has no equation, and
 * - its stage holds several equations (which one made it, and its line), or
 * - it is the backward pass (which equation's backward rule made it: only the re-run
 *   tells the classic `jnp.where(x > 0, jnp.sqrt(x), 0.0)` trap apart, with its
 *   double-where fix, even when the stage is the one `sqrt`), or
 * - it lies in a loop (the iteration that made it).
 * A forward origin that is one equation outside loops is named whole already.
 * @param {ReturnType<typeof import("./nonfinite.js").storedOrigins>} rec
 * @param {{nodes: Map<string, {n_eqns: number, kind: string, parent: string|null}>}} index
 */
export function needsLocate(rec, index) {
  if (!rec || rec.notReproduced || rec.located) return false;
  // a Monitor's step that raised no alarm (a masked -inf): its arguments are gone, and
  // the Monitor locates only the step that raised one; the button did nothing
  if (!rec.alarm && rec.step != null) return false;
  return [["forward", rec.forward], ["backward", rec.backward]].some(([pass, p]) => {
    if (!p || p.equation) return false;
    const stage = p.node ?? p.reaching;
    if (stage == null || !index.nodes.has(stage)) return false;
    return (index.nodes.get(stage)?.n_eqns ?? 0) > 1 || pass === "backward" || inLoop(stage, index);
  });
}

/** Whether node `id` lies inside a loop (a scan's or while loop's body). */
function inLoop(id, index) {
  for (let cur = index.nodes.get(id)?.parent; cur != null; cur = index.nodes.get(cur)?.parent) {
    if (LOOP_KINDS.has(index.nodes.get(cur)?.kind ?? "")) return true;
  }
  return false;
}

/**
 * The banner's children.
 * @param {{stored: any, forward: string|null, backward: string|null}} origins
 * @param {any} index the model index (labels, equation counts)
 * @param {{onReveal: (id: string) => void, onLocate?: () => void, locating?: boolean, onShowStep?: (step: number) => void}} actions
 * @returns {HTMLElement[]}
 */
export function bannerParts(origins, index, actions) {
  const rec = origins.stored;
  const label = (id) => index.nodes.get(id)?.label ?? id;
  const head = rec.alarm ? "NaN/Inf detected" : "Non-finite values that never reached a result (no alarm)";
  const parts = [h("strong", { text: rec.step != null ? `${head} at step ${rec.step}.` : `${head}.` })];
  // a Monitor's graph draws its latest step: the way to the step that went wrong
  if (rec.step != null && actions.onShowStep) {
    parts.push(" ", h("button", { type: "button", class: "sv-link", "data-role": "show-step", text: `show step ${rec.step}`, onclick: () => actions.onShowStep?.(rec.step) }));
  }
  for (const pass of ["forward", "backward"]) {
    const p = rec[pass];
    const at = origins[pass];
    if (!p) continue;
    const text = p.message ?? `first at ${label(p.node)}`;
    // the second pass's sentence is set off from the first's "show" link
    const lead = parts.length > 1 ? " · " : " ";
    parts.push(h("span", { "data-pass": pass }, [`${lead}${pass === "forward" ? "Forward" : "Backward"} pass: `, ...said(text), " "]));
    // the link, when the origin is drawn (a Monitor's earlier step holds none of it)
    if (at) parts.push(h("button", { type: "button", class: "sv-link", "data-origin": pass, "data-node": at, text: `show ${label(at)}`, onclick: () => actions.onReveal(at) }));
  }
  // a finite run's loop fills only (no origin of either pass): the record's sentence,
  // which says they were masked
  const fills = !rec.forward && !rec.backward && rec.message;
  if (fills) parts.push(" ", ...said(rec.message));
  else if (rec.removed) parts.push(h("span", { class: "sv-muted", text: " (masked afterwards)" }));
  if (needsLocate(rec, index)) parts.push(locateButton(actions));
  return parts;
}

/** @param {{onLocate?: () => void, locating?: boolean}} actions */
function locateButton({ onLocate, locating = false }) {
  const live = typeof onLocate === "function";
  const btn = h("button", {
    type: "button", class: "sv-btn sv-locate", "data-role": "locate",
    disabled: !live || locating,
    title: live ? "Re-run this step with every equation of the origin stage probed, and name the equation and its source line" : LOCATE_REPORT_REASON,
    text: locating ? "Locating…" : "Locate the equation",
  });
  if (live) btn.addEventListener("click", () => { btn.disabled = true; btn.textContent = "Locating…"; onLocate(); });
  else btn.setAttribute("aria-description", LOCATE_REPORT_REASON);
  return btn;
}
