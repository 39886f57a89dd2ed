import { test } from "node:test";
import assert from "node:assert/strict";
import { FIT_BUTTON_SCALE, READABLE_SCALE, STACKED_GRAPH_MIN, STACKED_PANEL_MIN, WIDGET_MIN_HEIGHT, fitTransform, widgetHeight } from "../src/viewport.js";
import { roundingNoise } from "../src/charts.js";

test("the widget's height follows the graph between 620 px and 85 % of the window", () => {
  const m = { chrome: 50, foot: 40, windowH: 1000 };
  assert.equal(widgetHeight({ ...m, graphH: 200 }).height, WIDGET_MIN_HEIGHT);
  // 600 graph units at the readable zoom with its padding: 50 + 540 + 56 + 40
  assert.equal(widgetHeight({ ...m, graphH: 600 }).height, 686);
  assert.equal(widgetHeight({ ...m, graphH: 5000 }).height, 850);
});

test("stacked under the graph (a narrow widget), the open panel gets room of its own", () => {
  const m = { chrome: 150, foot: 90, windowH: 900, stacked: true };
  const closed = widgetHeight({ ...m, graphH: 1150 });
  const open = widgetHeight({ ...m, graphH: 1150, panelH: 1400 });
  assert.equal(open.drawing, 450); // half the window
  assert.equal(open.height, 150 + 450 + 540); // the panel: 60 % of the window, the rest scrolls
  assert.ok(open.height - closed.height >= STACKED_PANEL_MIN - 100);
  const small = widgetHeight({ ...m, graphH: 100, panelH: 120, windowH: 500 });
  assert.equal(small.drawing, STACKED_GRAPH_MIN);
  assert.equal(small.height, 150 + STACKED_GRAPH_MIN + STACKED_PANEL_MIN);
});

test("Fit stops where node labels reach 9 px; a first picture at 9 px for the smallest text", () => {
  assert.ok(12.5 * FIT_BUTTON_SCALE >= 9 - 1e-9 && FIT_BUTTON_SCALE < READABLE_SCALE);
  const f = fitTransform({ x: 0, y: 0, w: 600, h: 1150 }, 600, 530, { minScale: FIT_BUTTON_SCALE });
  assert.equal(f.k, FIT_BUTTON_SCALE);
  assert.ok(f.clipped);
});

test("a mean at rounding-noise level next to its values is told apart from a signal", () => {
  // a LayerNorm's per-block cotangent mean beside values ~1e-2
  assert.equal(roundingNoise([-1.2e-11, 0.8e-11, -0.4e-11, 1e-11], [0.02, 0.03, 0.025, 0.02]), true);
  assert.equal(roundingNoise([0, 0, 0], [0, 0, 0]), true);
  assert.equal(roundingNoise([1e-4, -2e-4], [0.02, 0.03]), false);
  assert.equal(roundingNoise([null, null], [1, 1]), false);
  assert.equal(roundingNoise([1e-9], [0]), false);
});
