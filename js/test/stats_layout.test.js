import { test } from "node:test";
import assert from "node:assert/strict";
import { fmt, logScale, nodeStat, defaultStat, viridis, holdsFillValue, rangeLabel } from "../src/stats.js";
import { indexModel } from "../src/model.js";
import { edgesByLevel } from "../src/levels.js";
import { layoutView, openEnds, gridLevel, leafWidth, leafNodeWidth, kindWidth, shapeText, SHAPE_X, SHAPE_CHAR, SPARK_ROOM, stageHead, stageHeadWidth, NODE_W, NODE_H, MAX_W, MAX_HEAD_W, GRID_THRESHOLD } from "../src/layout.js";
import { ellipsis } from "../src/dom.js";
import { smallModel } from "./helpers.js";

test("face statistic combines a node's probes", () => {
  const ps = [{ summaries: { cotangent: { l2: 3 } } }, { summaries: { cotangent: { l2: 4 } } }, { summaries: {} }];
  assert.equal(nodeStat(ps, "cotangent", "l2"), 5);
  assert.equal(nodeStat(ps, "primal", "l2"), null);
  assert.deepEqual(defaultStat(["primal", "cotangent"]), { mode: "cotangent", stat: "l2" });
  assert.deepEqual(defaultStat(["primal", "tangent"]), { mode: "tangent", stat: "l2" });
});

test("log colour scale", () => {
  const s = logScale([1, 10, 100, null, 0, -5]);
  assert.equal(s.lo, 0);
  assert.equal(s.hi, 2);
  assert.equal(s.t(10), 0.5);
  assert.equal(s.t(0), 0);
  assert.equal(s.t(null), null);
  assert.equal(s.colour(100), viridis(1));
  assert.equal(viridis(0), "#440154");
  assert.equal(s.clippedLo || s.clippedHi, false);
});

test("a colour scale over many values cuts an outlier back to their 2nd percentile", () => {
  // 49 stages between 0.01 and 1, and one parameter whose gradient is 1e-8
  const vals = [1e-8, ...Array.from({ length: 49 }, (_, i) => 10 ** (-2 + (2 * i) / 48))];
  const s = logScale(vals);
  assert.ok(Math.abs(s.lo - -2) < 1e-9 && Math.abs(s.hi) < 1e-9);
  assert.equal(s.clippedLo, true);
  assert.equal(s.clippedHi, false); // the largest is within a decade of the 98th percentile
  assert.equal(s.t(1e-8), 0); // the outlier takes the end's colour
  assert.equal(s.t(1), 1);
  assert.ok(s.t(0.1) > 0.4 && s.t(0.1) < 0.6); // the rest spread over the scale
  // few values: their exact range
  const few = logScale([1e-8, 1, 10]);
  assert.deepEqual([few.lo, few.hi, few.clippedLo], [-8, 1, false]);
});

test("number formatting", () => {
  assert.equal(fmt(null), "—");
  assert.equal(fmt(3), "3");
  assert.equal(fmt(0.123456), "0.1235");
  assert.equal(fmt(1.5e-7), "1.5e-7");
  assert.equal(fmt(123456.7), "1.235e+5");
  // Not "30430": four digits of a non-integer from 1e4 on, with the exponent showing it.
  assert.equal(fmt(30434.31), "3.043e+4");
  assert.equal(fmt(30430), "30430");
  assert.equal(fmt(9999.6), "1e+4");
  assert.equal(fmt(-9999.6), "-1e+4");
  assert.equal(fmt(9999.4), "9999");
  assert.equal(fmt(Infinity), "+Inf");
});

test("layout: collapsed stages are node-sized, expanded ones hold their children", () => {
  const ix = indexModel(smallModel());
  const le = edgesByLevel(ix);
  const a = layoutView(ix, new Set(), le);
  assert.deepEqual([...a.boxes.keys()].sort(), ["n1", "n2", "n6", "n9"]);
  assert.equal(a.boxes.get("n2").w, NODE_W);
  assert.equal(a.edges.length, 3);
  const b = layoutView(ix, new Set(["n2"]), le);
  const s = b.boxes.get("n2");
  assert.ok(s.expanded && s.h > NODE_H);
  for (const id of ["n3", "n4", "n5"]) {
    const c = b.boxes.get(id);
    assert.ok(c.x >= s.x && c.y >= s.y && c.x + c.w <= s.x + s.w && c.y + c.h <= s.y + s.h, id);
  }
  // the root level comes first: nodes flow top to bottom along edges
  assert.ok(b.boxes.get("n1").y < b.boxes.get("n2").y);
});

test("layout: a collapsed node is as wide as its label needs, within bounds", () => {
  assert.equal(leafWidth("mlp"), NODE_W);
  assert.equal(leafWidth(undefined), NODE_W);
  assert.equal(leafWidth("x".repeat(400)), MAX_W);
  // a stack's label keeps its range: its "(×3)" is not drawn, so not measured
  const stack = "checkpoint(blocks[0–2]: EBlock)";
  assert.ok(stack.length <= Math.floor((leafWidth(`${stack} (×3)`) - 92) / 7.4));
  // graph.js's label room beside a sparkline ((w - 92) / 7.4 characters) holds these whole
  for (const label of ["Optimizer.update", "TransformerLM (backward)", "clip_by_global_norm"]) {
    const room = Math.floor((leafWidth(label) - 92) / 7.4);
    assert.equal(ellipsis(label, room), label);
  }
});

test("layout: big levels use the program-order grid", () => {
  const ids = Array.from({ length: GRID_THRESHOLD + 1 }, (_, i) => `n${i}`);
  const sizes = new Map(ids.map((id) => [id, { w: NODE_W, h: NODE_H }]));
  const g = gridLevel(ids, sizes, [{ source: "n0", target: "n1" }]);
  assert.equal(g.mode, "grid");
  assert.equal(g.hiddenEdges, 1);
  const p0 = g.pos.get("n0");
  const p1 = g.pos.get("n1");
  assert.ok(p1.x > p0.x && p1.y === p0.y);
  assert.ok(g.w < g.h * 3 && g.h < g.w * 3);
});

test("layout: an empty model lays out to nothing without throwing", () => {
  const ix = indexModel({});
  const out = layoutView(ix, new Set(), edgesByLevel(ix));
  assert.equal(out.boxes.size, 0);
  assert.deepEqual(out.bounds, { x: 0, y: 0, w: 0, h: 0 });
});

test("layout: an expanded stage's header holds its whole label, whatever its contents", () => {
  const ix = indexModel(smallModel());
  const le = edgesByLevel(ix);
  const node = ix.nodes.get("n2");
  node.label = "checkpoint(blocks[1]: Block)";
  const box = layoutView(ix, new Set(["n2"]), le).boxes.get("n2");
  assert.ok(box.w >= stageHeadWidth(node) && stageHeadWidth(node) > NODE_W);
  const head = stageHead(node, box.w);
  assert.equal(ellipsis(node.label, head.labelChars), node.label);
  assert.ok(head.showKind);
  // the value is dropped before the label is cut; past MAX_HEAD_W the label is cut
  const withValue = stageHead(node, box.w, "1.234e-5");
  assert.equal(withValue.labelChars, node.label.length);
  // a longer label keeps all its characters and drops the kind instead
  node.label = "checkpoint(layers[11]: TransformerBlock)";
  const long = stageHead(node, layoutView(ix, new Set(["n2"]), le).boxes.get("n2").w);
  assert.equal(ellipsis(node.label, long.labelChars), node.label);
  node.label = "x".repeat(200);
  assert.equal(stageHeadWidth(node), MAX_HEAD_W);
  const cut = stageHead(node, MAX_HEAD_W, "1.2");
  assert.ok(cut.labelChars < 200 && !cut.showKind && !cut.showValue);
});

test("openEnds: an edge meets an open group on its top or bottom border, a closed node where dagre put it", () => {
  const group = { x: 100, y: 100, w: 200, h: 400, expanded: true };
  // dagre aimed at the centre: down the right side, into the side halfway down
  const into = [{ x: 400, y: 20 }, { x: 330, y: 150 }, { x: 300, y: 300 }];
  const e = openEnds(into, undefined, group);
  const end = e[e.length - 1];
  assert.equal(end.y, group.y);
  assert.ok(end.x >= group.x && end.x <= group.x + group.w, `end x ${end.x}`);
  assert.ok(e.slice(0, -1).every((p) => p.y < group.y), "no point inside the group");
  assert.deepEqual(e[0], into[0]);
  // out of the open group: from its bottom border
  const out = openEnds([{ x: 100, y: 300 }, { x: 60, y: 520 }, { x: 40, y: 600 }], group, undefined);
  assert.equal(out[0].y, group.y + group.h);
  assert.ok(out[0].x >= group.x + 14 && out[0].x <= group.x + group.w - 14, `start x ${out[0].x}`);
  assert.deepEqual(out[out.length - 1], { x: 40, y: 600 });
  // closed boxes: unchanged
  const closed = { ...group, expanded: false };
  assert.deepEqual(openEnds(into, closed, closed), into);
});

test("fill values (a dtype's largest finite magnitude) never set a colour scale", () => {
  // jnp.finfo(float32).min as the JSON carries it, and float16's
  assert.equal(holdsFillValue({ dtype: "float32", absmax: 3.4028235e38 }), true);
  assert.equal(holdsFillValue({ dtype: "float32", min: -3.4028234663852886e38, max: 2 }), true);
  assert.equal(holdsFillValue({ dtype: "float16", absmax: 65504 }), true);
  assert.equal(holdsFillValue({ dtype: "float16", absmax: 40000 }), false); // under JAX's fill (0.7·max)
  assert.equal(holdsFillValue({ dtype: "float32", absmax: 65504 }), false);
  assert.equal(holdsFillValue({ dtype: "float8_e4m3fn", absmax: 448 }), false); // saturating casts
  assert.equal(holdsFillValue(undefined), false);
  // four fill stages among 40: more than the 2% the percentile cut leaves out
  const vals = Array.from({ length: 40 }, (_, i) => 2.8 + (14.8 * i) / 39);
  const fills = [3.4e38, 3.4e38, 3.4e38, 3.4e38];
  const mixed = logScale([...vals, ...fills]);
  assert.ok(mixed.hi > 38); // what the legend showed
  const s = logScale(vals, fills);
  assert.ok(Math.abs(10 ** s.lo - 2.8) < 1e-9 && Math.abs(10 ** s.hi - 17.6) < 1e-9);
  assert.equal(s.clippedHi, true); // "≥ 17.6": the fills lie past the top
  assert.equal(s.t(3.4e38), 1);
  assert.ok(s.t(7) > 0.3 && s.t(7) < 0.7);
  // only fill values: they are all there is to scale
  const only = logScale([], [1e38, 3.4e38]);
  assert.deepEqual([only.clippedLo, only.clippedHi], [false, false]);
  assert.ok(only.hi > 38);
});

test("a slider's label names its value and the range it is taken from", () => {
  assert.equal(rangeLabel(2, 0, 2), "2 of 0–2"); // the last of 3 iterations
  assert.equal(rangeLabel(10, 8, 12), "10 of 8–12"); // blocks by their own numbers
});

test("JAX's masked-logit fill (-0.7 · finfo.max) is a fill value too, in every float dtype", () => {
  // |jax._src.nn.functions._get_large_negative(dtype)| as JAX 0.12 computes it (float64:
  // float32's, JAX caps it there); a greedy decoder's legend ran to 3.403e+38
  assert.equal(holdsFillValue({ dtype: "float32", absmax: 2.381976325057654e38 }), true);
  assert.equal(holdsFillValue({ dtype: "float32", absmax: 2.3819763e38 }), true); // as the JSON carries it
  assert.equal(holdsFillValue({ dtype: "float32", min: -2.3819763e38, max: 0.04 }), true);
  assert.equal(holdsFillValue({ dtype: "bfloat16", absmax: 2.3660258324971503e38 }), true);
  assert.equal(holdsFillValue({ dtype: "float16", absmax: 45856 }), true);
  assert.equal(holdsFillValue({ dtype: "float64", absmax: 2.381976325057654e38 }), true);
  // ordinary large values are not: float32 far from overflow, float64 past float32's range
  assert.equal(holdsFillValue({ dtype: "float32", absmax: 1e38 }), false);
  assert.equal(holdsFillValue({ dtype: "float64", absmax: 1e39 }), false);
  assert.equal(holdsFillValue({ dtype: "float64", absmax: 3.4028234663852886e38 }), false);
});

test("a primal run colours by primal values, whatever other values its probes hold", () => {
  // a sow under an inner jax.grad holds a cotangent in a primal run: modes lists it
  assert.deepEqual(defaultStat(["primal", "cotangent"], "primal"), { mode: "primal", stat: "l2" });
  assert.deepEqual(defaultStat(["primal", "cotangent"], "grad"), { mode: "cotangent", stat: "l2" });
  assert.deepEqual(defaultStat(["primal", "cotangent"], "vjp"), { mode: "cotangent", stat: "l2" });
  assert.deepEqual(defaultStat(["primal", "tangent", "cotangent"], "jvp"), { mode: "tangent", stat: "l2" });
  assert.deepEqual(defaultStat(["primal", "tangent", "cotangent"], "all"), { mode: "cotangent", stat: "l2" });
  // the mode's values nowhere (a grad run whose probes all sit beside the data flow)
  assert.deepEqual(defaultStat(["primal"], "grad"), { mode: "primal", stat: "l2" });
  // an older model without its mode: the backward quantity, as before
  assert.deepEqual(defaultStat(["primal", "cotangent"]), { mode: "cotangent", stat: "l2" });
});

test("a collapsed node is wide enough for its sharded type beside the sparkline", () => {
  const node = { label: "relu", kind: "custom", shapes: ["float32[64@data,32@model]"] };
  const w = leafNodeWidth(node);
  // graph.js: the type starts after the kind badge and ends before the sparkline
  const room = Math.floor((w - SHAPE_X - kindWidth("custom") - SPARK_ROOM) / SHAPE_CHAR);
  assert.ok(shapeText(node).length <= room, `${shapeText(node)} in ${room} characters`);
  assert.equal(shapeText(node), "f32[64@data,32@model]");
  // a short type keeps the label's width; a huge one stops at MAX_W
  assert.equal(leafNodeWidth({ label: "mlp", kind: "eqn", shapes: ["float32[4]"] }), NODE_W);
  assert.equal(leafNodeWidth({ label: "x", kind: "eqn", shapes: [`float32[${"9,".repeat(80)}9]`] }), MAX_W);
});
