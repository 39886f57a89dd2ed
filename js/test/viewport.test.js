import { test } from "node:test";
import assert from "node:assert/strict";
import { READABLE_SCALE, fitTransform, hiddenSides, moreText, showBoxTransform } from "../src/viewport.js";

const screen = (b, t) => ({ left: t.x + b.x * t.k, top: t.y + b.y * t.k, right: t.x + (b.x + b.w) * t.k, bottom: t.y + (b.y + b.h) * t.k });

test("a first picture keeps text readable: a tall graph is not shrunk below it, and shows its top", () => {
  // node labels are 12.5 px and the smallest text 10-10.5 px: ≥ 9 px on screen
  assert.ok(10 * READABLE_SCALE >= 9 && 12.5 * READABLE_SCALE >= 11);
  const tall = { x: 0, y: 0, w: 400, h: 2000 };
  const f = fitTransform(tall, 900, 550, { minScale: READABLE_SCALE });
  assert.equal(f.k, READABLE_SCALE);
  assert.equal(f.clipped, true);
  assert.equal(screen(tall, f).top, 28); // the inputs, where reading starts
  // asked for (Fit): the whole graph, however small
  const all = fitTransform(tall, 900, 550);
  assert.ok(all.k < 0.3 && !all.clipped);
  const s = screen(tall, all);
  assert.ok(s.top >= 0 && s.bottom <= 550);
  // a small graph is fitted whole, centred, never blown up past 1.25
  const small = fitTransform({ x: 0, y: 0, w: 200, h: 100 }, 900, 550, { minScale: READABLE_SCALE });
  assert.equal(small.k, 1.25);
  assert.equal(small.clipped, false);
});

test("an opened stage comes into view at a readable zoom, its header first", () => {
  const W = 900;
  const H = 550;
  // after a whole-graph Fit (k 0.25) a stage opens far down: zoom in to readable
  const box = { x: 100, y: 3000, w: 600, h: 1500 };
  const t = showBoxTransform(box, { k: 0.25, x: 0, y: -500 }, W, H, { minScale: READABLE_SCALE });
  assert.equal(t.k, READABLE_SCALE);
  const s = screen(box, t);
  assert.ok(s.top >= 0 && s.top <= 40, `header in view: ${s.top}`);
  assert.ok(s.left >= 0 && s.left < W);
  // a stage that fits at the current zoom is shown whole, the zoom kept
  const fits = { x: 0, y: 800, w: 300, h: 300 };
  const t2 = showBoxTransform(fits, { k: 1, x: 0, y: 0 }, W, H, { minScale: READABLE_SCALE });
  assert.equal(t2.k, 1);
  const s2 = screen(fits, t2);
  assert.ok(s2.top >= 0 && s2.bottom <= H, JSON.stringify(s2));
  // zoomed far in: zooms out until it fits (not below readable)
  const t3 = showBoxTransform(fits, { k: 3, x: 0, y: 0 }, W, H, { minScale: READABLE_SCALE });
  assert.ok(t3.k < 3 && t3.k >= READABLE_SCALE);
  const s3 = screen(fits, t3);
  assert.ok(s3.top >= 0 && s3.bottom <= H);
  // already in view and fitting: nothing moves
  const here = { x: 100, y: 100, w: 200, h: 100 };
  assert.deepEqual(showBoxTransform(here, { k: 1, x: 0, y: 0 }, W, H), { k: 1, x: 0, y: 0 });
});

test("the view says which sides of the drawing lie outside it", () => {
  const b = { x: 0, y: 0, w: 400, h: 2000 };
  assert.deepEqual(hiddenSides(b, { k: 1, x: 100, y: 28 }, 900, 550), ["below"]);
  assert.deepEqual(hiddenSides(b, { k: 1, x: 100, y: -800 }, 900, 550), ["above", "below"]);
  assert.deepEqual(hiddenSides(b, { k: 0.2, x: 100, y: 28 }, 900, 550), []);
  assert.equal(moreText(["below"]), "more below · drag to pan");
  assert.equal(moreText([]), "");
  assert.equal(moreText(["below", "right"], true), "more ↓ →");
  assert.equal(moreText([], true), "");
});
