import { test } from "node:test";
import assert from "node:assert/strict";
import { indexModel } from "../src/model.js";
import { edgesByLevel, portsByLevel } from "../src/levels.js";
import { layoutView, GRID_THRESHOLD, HEADER } from "../src/layout.js";

// A residual block: n0 root > n1 x, n2 Net > (n3 stem > n4 conv, n5 block > (n6 conv1,
// n7 add)), n8 out. The model's edges are lifted (Python's); `ends` say which inner
// nodes make and read each value: the stem's conv feeds the block's conv1 and its add.
function resnet({ ends = true } = {}) {
  const node = (id, label, kind, parent) => ({ id, label, kind, parent, order: Number(id.slice(1)), shapes: ["float32[4]"], collapsed: true });
  const edge = (source, target, pairs) => ({ source, target, shape: [4], dtype: "float32", ...(ends && pairs ? { ends: pairs } : {}) });
  return {
    schema: "sowviz/1", title: "t", root: "n0", probes: [],
    nodes: [
      node("n0", "prog", "jit", null), node("n1", "x", "input", "n0"), node("n2", "Net", "scope", "n0"),
      node("n3", "stem", "scope", "n2"), node("n4", "conv", "eqn", "n3"),
      node("n5", "block", "scope", "n2"), node("n6", "conv1", "eqn", "n5"), node("n7", "add", "eqn", "n5"),
      node("n8", "out", "output", "n0"),
    ],
    edges: [
      edge("n1", "n2", [["n1", "n4"]]),
      edge("n3", "n5", [["n4", "n6"], ["n4", "n7"]]),
      edge("n6", "n7"),
      edge("n2", "n8", [["n7", "n8"]]),
    ],
  };
}

const pairs = (edges) => edges.map((e) => [e.source, e.target]).sort();

test("an opened stage gets an entry port per outside source, with an edge to each reader", () => {
  const ix = indexModel(resnet());
  const ports = portsByLevel(ix);
  const block = ports.get("n5");
  assert.deepEqual(block.ports.map((p) => [p.side, p.label]), [["in", "stem"], ["out", "to out"]]);
  const into = block.ports[0].id;
  const out = block.ports[1].id;
  // the skip: the block's input reaches conv1 and the add; the add's value leaves
  assert.deepEqual(pairs(block.edges), [[into, "n6"], [into, "n7"], ["n7", out]].sort());
  // a source farther out is named as the level it was lifted to sees it: `x` in Net and in stem
  assert.deepEqual(ports.get("n2").ports.map((p) => [p.side, p.label]), [["in", "x"], ["out", "to out"]]);
  assert.deepEqual(pairs(ports.get("n2").edges), [[ports.get("n2").ports[0].id, "n3"], ["n5", ports.get("n2").ports[1].id]].sort());
  assert.deepEqual(pairs(ports.get("n3").edges), [[ports.get("n3").ports[0].id, "n4"], ["n4", ports.get("n3").ports[1].id]].sort());
  assert.equal(ports.has("n0"), false); // nothing comes into the program from outside
});

test("layout draws the port edges of opened levels only, with the ports apart from the nodes", () => {
  const ix = indexModel(resnet());
  const levelEdges = edgesByLevel(ix);
  const ports = portsByLevel(ix);
  const lay = layoutView(ix, new Set(["n2", "n5"]), levelEdges, new Map(), ports);
  const intoAdd = lay.edges.filter((e) => e.target === "n7");
  assert.equal(intoAdd.length, 2); // conv1's and the block's input through its port
  assert.ok(intoAdd.every((e) => e.points.length >= 2));
  assert.deepEqual(lay.ports.map((p) => [p.level, p.side, p.label]).sort(), [["n2", "in", "x"], ["n2", "out", "to out"], ["n5", "in", "stem"], ["n5", "out", "to out"]]);
  for (const p of lay.ports) assert.equal(lay.boxes.has(p.id), false);
  // the entry port sits inside its stage, above the children reading from it
  const block = lay.boxes.get("n5");
  const port = lay.ports.find((p) => p.level === "n5" && p.side === "in");
  assert.ok(port.x >= block.x && port.x + port.w <= block.x + block.w && port.y > block.y);
  assert.ok(port.y + port.h < lay.boxes.get("n6").y && port.y + port.h < lay.boxes.get("n7").y);
  const exit = lay.ports.find((p) => p.level === "n5" && p.side === "out");
  assert.ok(exit.y > lay.boxes.get("n7").y + lay.boxes.get("n7").h && exit.y + exit.h <= block.y + block.h);
  // closed, the block draws none of its ports
  const closed = layoutView(ix, new Set(["n2"]), levelEdges, new Map(), ports);
  assert.equal(closed.ports.some((p) => p.level === "n5"), false);
  assert.equal(closed.edges.some((e) => e.target === "n7"), false);
});

test("a model saved before `ends` draws as before: no ports", () => {
  const ix = indexModel(resnet({ ends: false }));
  assert.equal(portsByLevel(ix).size, 0);
  const lay = layoutView(ix, new Set(["n2", "n5"]), edgesByLevel(ix), new Map(), portsByLevel(ix));
  assert.deepEqual(lay.ports, []);
  assert.deepEqual(pairs(lay.edges.filter((e) => e.level === "n5")), [["n6", "n7"]]);
});

test("a grid level draws no edges and no ports", () => {
  const m = resnet();
  for (let i = 0; i < GRID_THRESHOLD; i++) {
    m.nodes.push({ id: `g${i}`, label: `neg_${i}`, kind: "eqn", parent: "n5", order: 100 + i, shapes: [], collapsed: true });
  }
  const ix = indexModel(m);
  const lay = layoutView(ix, new Set(["n2", "n5"]), edgesByLevel(ix), new Map(), portsByLevel(ix));
  assert.equal(lay.levels.get("n5").mode, "grid");
  assert.equal(lay.ports.some((p) => p.level === "n5"), false);
  assert.equal(lay.edges.some((e) => e.level === "n5"), false);
});

test("an edge into an opened stage meets its border above the port it goes on as", () => {
  const ix = indexModel(resnet());
  const lay = layoutView(ix, new Set(["n2", "n5"]), edgesByLevel(ix), new Map(), portsByLevel(ix));
  const centre = (p) => p.x + p.w / 2;
  // stem → block: ends on the block's top border at its `stem` port's x
  const into = lay.edges.find((e) => e.source === "n3" && e.target === "n5");
  const port = lay.ports.find((p) => p.level === "n5" && p.side === "in");
  const end = into.points[into.points.length - 1];
  assert.equal(end.y, lay.boxes.get("n5").y);
  assert.ok(Math.abs(end.x - centre(port)) < 0.5, `${end.x} vs ${centre(port)}`);
  // block → out of Net: leaves the block's bottom at its exit port's x
  const from = lay.edges.find((e) => e.level === "n2" && e.source === "n5");
  const exit = lay.ports.find((p) => p.level === "n5" && p.side === "out");
  assert.equal(from.points[0].y, lay.boxes.get("n5").y + lay.boxes.get("n5").h);
  assert.ok(Math.abs(from.points[0].x - centre(exit)) < 0.5, `${from.points[0].x} vs ${centre(exit)}`);
});

test("an entry port stands at the top of its stage even when only a deep child reads it", () => {
  // n2 block > a → b → c; the outside x (n1) is read by c alone, the exit port fed by c
  const node = (id, label, kind, parent) => ({ id, label, kind, parent, order: Number(id.slice(1)), shapes: ["float32[4]"], collapsed: true });
  const edge = (source, target, pairs) => ({ source, target, shape: [4], dtype: "float32", ...(pairs ? { ends: pairs } : {}) });
  const ix = indexModel({
    schema: "sowviz/1", title: "t", root: "n0", probes: [],
    nodes: [
      node("n0", "prog", "jit", null), node("n1", "x", "input", "n0"), node("n2", "block", "scope", "n0"),
      node("n3", "a", "eqn", "n2"), node("n4", "b", "eqn", "n2"), node("n5", "c", "eqn", "n2"),
      node("n6", "out", "output", "n0"),
    ],
    edges: [edge("n1", "n2", [["n1", "n5"]]), edge("n3", "n4"), edge("n4", "n5"), edge("n2", "n6", [["n5", "n6"]])],
  });
  const lay = layoutView(ix, new Set(["n2"]), edgesByLevel(ix), new Map(), portsByLevel(ix));
  const entry = lay.ports.find((p) => p.side === "in");
  const exit = lay.ports.find((p) => p.side === "out");
  for (const id of ["n3", "n4", "n5"]) {
    const b = lay.boxes.get(id);
    assert.ok(entry.y + entry.h <= b.y, `entry port above ${id}`);
    assert.ok(exit.y >= b.y + b.h, `exit port below ${id}`);
  }
  // the stage is no taller than its rows: the pins' own ranks take no room
  const block = lay.boxes.get("n2");
  assert.ok(entry.y - block.y < HEADER + 20, `${entry.y - block.y}`);
});

test("a port is named as the stage's body names the value, and two sources of one label are told apart", () => {
  const model = resnet();
  // the block is a loop whose body calls the stem's value `h`
  model.nodes.find((n) => n.id === "n5").port_names = { n4: "h" };
  let block = portsByLevel(indexModel(model)).get("n5");
  assert.deepEqual(block.ports.map((p) => [p.side, p.label]), [["in", "h"], ["out", "to out"]]);
  assert.match(block.ports[0].title, /^h: from stem, outside block/);
  // without a name: two sources labelled alike (`reshape`) get two ports, numbered
  const two = resnet();
  two.nodes.find((n) => n.id === "n1").label = "stem";
  two.edges.push({ source: "n1", target: "n5", shape: [4], dtype: "float32", ends: [["n1", "n7"]] });
  block = portsByLevel(indexModel(two)).get("n5");
  assert.deepEqual(block.ports.filter((p) => p.side === "in").map((p) => p.label), ["stem", "stem #2"]);
});
