import { test } from "node:test";
import assert from "node:assert/strict";
import { dagreLevel, rankBands } from "../src/layout.js";

// A deterministic pseudo-random generator (mulberry32): the same graphs every run.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A DAG of `n` nodes of mixed sizes (tall open groups among cards), edges forward. */
function graph(seed, n = 14) {
  const r = rng(seed);
  const ids = Array.from({ length: n }, (_, i) => `n${i}`);
  const sizes = new Map(ids.map((id) => [id, { w: 150 + Math.floor(r() * 190), h: r() < 0.2 ? 120 + Math.floor(r() * 200) : 62 }]));
  const edges = [];
  for (let i = 1; i < n; i++) {
    const k = 1 + Math.floor(r() * 2);
    for (let j = 0; j < k; j++) {
      const s = Math.floor(r() * i);
      if (!edges.some((e) => e.source === ids[s] && e.target === ids[i])) edges.push({ source: ids[s], target: ids[i], count: 1 });
    }
  }
  return { ids, sizes, edges };
}

/** The layouts of the 25 graphs the tests share, with their seeds. */
function* layouts() {
  for (let seed = 1; seed <= 25; seed++) {
    const { ids, sizes, edges } = graph(seed);
    yield /** @type {const} */ ([seed, dagreLevel(ids, sizes, edges)]);
  }
}

/** Whether the segment a→b passes through the inside of box `q` (shrunk by 1 px). */
function crosses(a, b, q) {
  const x0 = q.x + 1, x1 = q.x + q.w - 1, y0 = q.y + 1, y1 = q.y + q.h - 1;
  for (let t = 0; t <= 1; t += 1 / 200) {
    const x = a.x + (b.x - a.x) * t;
    const y = a.y + (b.y - a.y) * t;
    if (x > x0 && x < x1 && y > y0 && y < y1) return true;
  }
  return false;
}

test("edges pass no box but their own ends, and meet them at the bottom and top", () => {
  let edgesSeen = 0;
  for (const [seed, lay] of layouts()) {
    for (const e of lay.edges) {
      const src = lay.pos.get(e.source);
      const dst = lay.pos.get(e.target);
      if (dst.y < src.y + src.h) continue; // turned upwards by dagre: its own points
      edgesSeen++;
      const pts = e.points;
      assert.equal(pts[0].y, src.y + src.h, `seed ${seed}: ${e.source}→${e.target} leaves its source's bottom`);
      assert.equal(pts[pts.length - 1].y, dst.y, `seed ${seed}: ${e.source}→${e.target} enters its target's top`);
      for (const [id, q] of lay.pos) {
        if (id === e.source || id === e.target) continue;
        for (let i = 0; i + 1 < pts.length; i++) {
          assert.ok(!crosses(pts[i], pts[i + 1], q), `seed ${seed}: ${e.source}→${e.target} crosses ${id}`);
        }
      }
    }
  }
  assert.ok(edgesSeen > 300);
});

test("a rank's band spans its tallest node", () => {
  const pos = new Map([
    ["a", { x: 0, y: 10, w: 10, h: 20 }],
    ["b", { x: 20, y: 0, w: 10, h: 40 }],
    ["c", { x: 0, y: 80, w: 10, h: 20 }],
  ]);
  assert.deepEqual(rankBands(pos), [{ top: 0, bottom: 40 }, { top: 80, bottom: 100 }]);
});

test("a level's extent holds its edges too: none runs outside the stage drawn around it", () => {
  let outside = 0;
  for (const [, lay] of layouts()) {
    for (const e of lay.edges) {
      for (const q of e.points) if (q.x < -0.01 || q.x > lay.w + 0.01 || q.y < -0.01 || q.y > lay.h + 0.01) outside++;
    }
    for (const b of lay.pos.values()) assert.ok(b.x >= -0.01 && b.x + b.w <= lay.w + 0.01 && b.y >= -0.01 && b.y + b.h <= lay.h + 0.01);
  }
  assert.equal(outside, 0);
});
