// Where the graph's view goes: the fit of a first picture, the view after a stage opens
// or closes, and which sides of the drawing lie outside the view. Pure: transforms are
// {k, x, y} (screen = graph * k + (x, y)), boxes {x, y, w, h} in graph units.

/**
 * The least zoom a fit chooses by itself: node labels (12.5 px) stay ≥ 11 px and the
 * smallest text (shapes, values, kind badges: 10-10.5 px) ≥ 9 px. A taller graph is
 * not shrunk further: the view starts at its top (its inputs, where reading starts) and
 * the rest is a drag away. The Fit button still shows the whole graph when asked.
 */
export const READABLE_SCALE = 0.9;
/**
 * The least zoom an opened stage zooms out to, to show it across whole when it is a
 * little wider than the view at READABLE_SCALE (labels 9.4 px, the smallest text 7.9
 * px). A notebook's `parameters` of three layers side by side, opened in a view the
 * detail panel narrowed, started at the view's left and ran past its right: its last
 * layer cut off, and the graph it belongs to pushed out to the left.
 */
export const ACROSS_SCALE = 0.75;
export const MAX_FIT_SCALE = 1.25;
const PAD = 28;

/**
 * The transform fitting `bounds` into a W×H view; below `minScale` it keeps
 * `minScale` and shows the top of the drawing, centred across.
 * @param {{x: number, y: number, w: number, h: number}} b
 * @returns {{k: number, x: number, y: number, clipped: boolean}}
 */
export function fitTransform(b, W, H, { minScale = 0, pad = PAD } = {}) {
  let k = Math.min((W - 2 * pad) / b.w, (H - 2 * pad) / b.h, MAX_FIT_SCALE);
  let y = pad + (H - 2 * pad - b.h * k) / 2 - b.y * k;
  let clipped = false;
  if (k < minScale) {
    k = minScale;
    y = pad - b.y * k;
    clipped = true;
  }
  const x = (W - b.w * k) / 2 - b.x * k;
  return { k, x, y, clipped };
}

/**
 * The view after stage `box` opened (or closed) in place: the stage as a whole when
 * it fits at the current zoom; otherwise zoomed out until it fits, but never below
 * `minScale` (a view zoomed out further, as after Fit, zooms in to it), and then its
 * top-left (the header with its name and the collapse button) in view. Moves as
 * little as it can: `t` already keeps the box where the user clicked it. A stage a
 * little wider than the view at `minScale` zooms out further, to `acrossScale`
 * (ACROSS_SCALE), when that shows it across whole; a wider one keeps `minScale`.
 *
 * `around`: the other boxes drawn. Its neighbours, those beside it in the rows the view
 * then shows, come into view too: zoomed out to their width (not below `minScale`),
 * else the view starts at their left. Opening `rnn` widened its parent `Model`, whose
 * neighbours `y` and `sub` were left cut at the view's left edge.
 * @param {{x: number, y: number, w: number, h: number}} box
 * @param {{k: number, x: number, y: number}} t the current transform
 * @param {number} W @param {number} H
 * @param {{minScale?: number, acrossScale?: number, pad?: number, around?: Iterable<{x: number, y: number, w: number, h: number}>}} [options]
 * @returns {{k: number, x: number, y: number}}
 */
export function showBoxTransform(box, t, W, H, { minScale = READABLE_SCALE, acrossScale = Math.min(minScale, ACROSS_SCALE), pad = 16, around = [] } = {}) {
  const fitK = Math.min((W - 2 * pad) / box.w, (H - 2 * pad) / box.h);
  let k = Math.max(minScale, Math.min(t.k, fitK));
  // across only: a stage taller than the view starts at its top, as reading does
  const acrossK = (W - 2 * pad) / box.w;
  if (acrossK < k && acrossK >= acrossScale) k = acrossK;
  const shown = placeBox(box, t, k, W, H, pad);
  const row = spanAcross(box, around, shown, H);
  if (row.w <= box.w) return shown;
  // zoom out to the row's width, as far as the stage itself and `minScale` allow
  const rowK = Math.max(minScale, Math.min(k, (W - 2 * pad) / row.w));
  const view = rowK < k ? placeBox(box, t, rowK, W, H, pad) : shown;
  return { ...view, x: view.x + rowShift(box, row, view, W, pad) };
}

/** `t` changed to zoom `k`, keeping `box`'s top-left where it was, then moved as little
 * as brings the box into the W×H view (its start first when it is longer). */
function placeBox(box, t, k, W, H, pad) {
  // the box's top-left stays where it is on screen (when the zoom changes, too)
  let x = t.x + box.x * t.k - box.x * k;
  let y = t.y + box.y * t.k - box.y * k;
  const place = (pos, size, span) => {
    // pos: the box's screen start; a box longer than the view starts at its start
    if (size > span - 2 * pad) return pad - pos;
    if (pos + size > span - pad) return span - pad - size - pos;
    if (pos < pad) return pad - pos;
    return 0;
  };
  x += place(x + box.x * k, box.w * k, W);
  y += place(y + box.y * k, box.h * k, H);
  return { k, x, y };
}

/**
 * The horizontal extent (graph units) of `box` and of the boxes of `around` in the rows
 * view `v` shows (those overlapping its height H): {x, w}.
 */
function spanAcross(box, around, v, H) {
  let lo = box.x;
  let hi = box.x + box.w;
  for (const b of around) {
    const top = v.y + b.y * v.k;
    if (top + b.h * v.k <= 0 || top >= H) continue;
    lo = Math.min(lo, b.x);
    hi = Math.max(hi, b.x + b.w);
  }
  return { x: lo, w: hi - lo };
}

/**
 * The pan across that brings `row` into the view, or as much of it as keeps `box` in
 * view, its left first (where reading starts): the least move that does.
 */
function rowShift(box, row, v, W, pad) {
  const rowLeft = v.x + row.x * v.k;
  const rowRight = rowLeft + row.w * v.k;
  const boxLeft = v.x + box.x * v.k;
  const boxRight = boxLeft + box.w * v.k;
  // the moves that keep the stage in view (0 is one of them); one wider than the
  // view keeps its start
  const fits = boxRight - boxLeft <= W - 2 * pad;
  const least = fits ? Math.min(0, pad - boxLeft) : 0;
  const most = fits ? Math.max(0, W - pad - boxRight) : 0;
  let dx = 0;
  if (rowRight + dx > W - pad) dx = W - pad - rowRight;
  if (rowLeft + dx < pad) dx = pad - rowLeft;
  return Math.min(most, Math.max(least, dx));
}

/**
 * Which sides of the drawing `b` lie past the W×H view by more than `slack` px
 * ("above", "below", "left", "right"), for the hint that there is more to see.
 * @returns {string[]}
 */
export function hiddenSides(b, t, W, H, slack = 12) {
  if (!b || !b.w || !b.h) return [];
  const left = t.x + b.x * t.k;
  const top = t.y + b.y * t.k;
  const right = left + b.w * t.k;
  const bottom = top + b.h * t.k;
  const out = [];
  if (top < -slack) out.push("above");
  if (bottom > H + slack) out.push("below");
  if (left < -slack) out.push("left");
  if (right > W + slack) out.push("right");
  return out;
}

/** The hint's text: "more below · drag to pan" ("" when nothing is hidden; Fit no longer
 * shows every graph whole: it stops at FIT_BUTTON_SCALE);
 * `short`: "more below ↓" (a narrow view, where the whole line was cut and covered nodes). */
export function moreText(sides, short = false) {
  if (!sides.length) return "";
  const words = { above: "above", below: "below", left: "to the left", right: "to the right" };
  const arrows = { above: "↑", below: "↓", left: "←", right: "→" };
  if (short) return `more ${sides.map((s) => arrows[s]).join(" ")}`;
  return `more ${sides.map((s) => words[s]).join(", ")} · drag to pan`;
}

/**
 * The least zoom the Fit button goes to: node labels 9 px, the smallest text 7.2 px.
 * Fit showed any graph whole, however small: a 15-node MLP beside the panel in a
 * notebook cell came out at 5 px text, a nested scan at 3 px. A taller graph is shown
 * across at this zoom from its top; the rest is a drag (or a wheel zoom) away.
 */
export const FIT_BUTTON_SCALE = 0.72;
/** A notebook widget's least height (px), and the share of the window it may grow to. */
export const WIDGET_MIN_HEIGHT = 620;
export const WIDGET_WINDOW_SHARE = 0.85;
/** Stacked (a narrow widget, `styles.css` @container): the graph's least height and the panel's. */
export const STACKED_GRAPH_MIN = 380;
export const STACKED_PANEL_MIN = 340;

/**
 * The notebook widget's height (px) for what it shows. It followed nothing: a fixed
 * 620 px left a tall graph below the fold (or fitted at unreadable sizes) and gave the
 * detail panel, stacked under the graph in a narrow widget, ~85 px.
 * Side by side: as tall as shows the whole graph at READABLE_SCALE, between
 * WIDGET_MIN_HEIGHT and WIDGET_WINDOW_SHARE of the window. Stacked with the panel
 * open: the graph half the window (at least STACKED_GRAPH_MIN) and the panel its
 * content's height, at least STACKED_PANEL_MIN and at most 60 % of the window (a longer
 * one scrolls in the widget); the notebook
 * scrolls past a widget taller than the window, as past any tall output.
 * @param {{chrome: number, foot: number, graphH: number, windowH: number, stacked?: boolean, panelH?: number}} m
 *   chrome: the toolbar, notes, banners and borders; foot: the legend strip under the
 *   graph; graphH: the drawing's height in graph units; panelH: the open panel's
 *   content height (0: closed)
 * @returns {{height: number, drawing: number}} drawing: the graph's height when stacked
 *   with the panel open (0: the layout's own)
 */
export function widgetHeight({ chrome, foot, graphH, windowH, stacked = false, panelH = 0 }) {
  const cap = Math.max(WIDGET_MIN_HEIGHT, Math.round(windowH * WIDGET_WINDOW_SHARE));
  const graph = Math.ceil(graphH * READABLE_SCALE + 2 * PAD) + foot;
  if (!stacked || !panelH) return { height: Math.round(Math.min(cap, Math.max(WIDGET_MIN_HEIGHT, chrome + graph))), drawing: 0 };
  const drawing = Math.max(STACKED_GRAPH_MIN, Math.min(graph, Math.round(windowH * 0.5)));
  const panel = Math.max(STACKED_PANEL_MIN, Math.min(panelH, Math.round(windowH * 0.6)));
  return { height: Math.round(Math.max(WIDGET_MIN_HEIGHT, chrome + drawing + panel)), drawing };
}
