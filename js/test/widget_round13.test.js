// Round 13, found by testers writing real programs: a colour scale stretched by
// smallest-magnitude sentinels, a partly-NaN face read as a whole norm, and a stack's
// children whose labels lost the index that tells them apart.
import { test } from "node:test";
import assert from "node:assert/strict";
import { indexModel } from "../src/model.js";
import { edgesByLevel } from "../src/levels.js";
import { layoutView, leafWidth, toggleText, valueRoom } from "../src/layout.js";
import { computeFaces, fitted } from "../src/faces.js";
import { holdsTinyValue, viridis } from "../src/stats.js";
import { ellipsis } from "../src/dom.js";
import { summary } from "./helpers.js";

// float32's smallest normal number, `jnp.finfo(jnp.float32).tiny`: diffrax's
// `prevbefore(0.0)` under flush-to-zero
const FLT_MIN = 1.1754943508222875e-38;

/** A program `n0` of collapsed stages `n1`…, each with one probe of the given summaries. */
function stages(list) {
  const nodes = [{ id: "n0", label: "prog", kind: "jit", parent: null, order: 0, source: null, shapes: [], primitive: null, n_eqns: 0, collapsed: false }];
  const probes = [];
  list.forEach(({ label, n_eqns = 4, summaries }, i) => {
    const id = `n${i + 1}`;
    nodes.push({ id, label, kind: "scope", parent: "n0", order: i + 1, source: null, shapes: ["float32[4]"], primitive: null, n_eqns, collapsed: true });
    // (each stage holds an equation, so that it has an expand button)
    nodes.push({ id: `${id}e`, label: "mul", kind: "eqn", parent: id, order: i + 1, source: null, shapes: ["float32[4]"], primitive: "mul", n_eqns: 1, collapsed: false });
    probes.push({ id: `p${i}`, name: label, leaf: "", node: id, auto: true, summaries });
  });
  const model = { schema: "sowviz/1", title: "t", mode: "primal", modes: ["primal", "cotangent"], device: "cpu", versions: {}, created: "", root: "n0", nodes, edges: [], probes, notes: [], history: null };
  return indexModel(model);
}

test("smallest-magnitude sentinels never set the colour scale: a reverse-time solve's stages keep their colours", () => {
  // /tmp/s38/diff/r_legend_min.py: 300 of 362 stages hold only ±FLT_MIN (an l2 of
  // 1.175e-38); the inputs' l2 is √3, the output's 4.708
  const tiny = summary({ shape: [], size: 1, count: 1, min: -FLT_MIN, max: -FLT_MIN, absmax: FLT_MIN, l2: FLT_MIN, mean: -FLT_MIN, std: 0 });
  const real = (l2) => summary({ min: 0.5, max: l2, absmax: l2, l2 });
  const list = [
    { label: "y0", summaries: { primal: real(Math.sqrt(3)) } },
    { label: "solve", summaries: { primal: real(4.708) } },
    ...Array.from({ length: 300 }, (_, i) => ({ label: `prevbefore#${i}`, summaries: { primal: tiny } })),
  ];
  const ix = stages(list);
  const { faces, scale } = computeFaces(ix, ["n1", "n2", "n3"], { mode: "primal", stat: "l2" });
  // the scale is the real values', from √3 to 4.708 (it was 1.175e-38 to 4.708) ...
  assert.equal(scale.lo, Math.log10(Math.sqrt(3)));
  assert.equal(scale.hi, Math.log10(4.708));
  // ... and says that smaller values take its lowest colour ("≤ 1.732")
  assert.equal(scale.clippedLo, true);
  assert.equal(scale.clippedHi, false);
  // the input and the output are told apart (both were viridis' top yellow)
  assert.equal(faces.get("n1").colour, viridis(0));
  assert.equal(faces.get("n2").colour, viridis(1));
  // a sentinel stage is coloured, at the bottom, and still reads its own value
  assert.equal(faces.get("n3").colour, viridis(0));
  assert.equal(faces.get("n3").text, "‖x‖₂ = 1.175e-38");
});

test("which summaries are smallest-magnitude sentinels", () => {
  assert.equal(holdsTinyValue({ dtype: "float32", absmax: FLT_MIN }), true);
  assert.equal(holdsTinyValue({ dtype: "float32", min: -FLT_MIN, max: 0 }), true);
  assert.equal(holdsTinyValue({ dtype: "float32", absmax: 1.4e-45 }), true); // a subnormal
  assert.equal(holdsTinyValue({ dtype: "float64", absmax: 2.2250738585072014e-308 }), true);
  assert.equal(holdsTinyValue({ dtype: "float64", absmax: FLT_MIN }), false); // ordinary in float64
  assert.equal(holdsTinyValue({ dtype: "float32", absmax: 2 * FLT_MIN }), false);
  assert.equal(holdsTinyValue({ dtype: "float32", absmax: 1e-30 }), false);
  assert.equal(holdsTinyValue({ dtype: "float32", absmax: 0 }), false); // zeros: no value to set aside
  // float16 gradients under its smallest normal (6.1e-5) are real: loss scaling's case
  assert.equal(holdsTinyValue({ dtype: "float16", absmax: 6e-5 }), false);
  assert.equal(holdsTinyValue(undefined), false);
});

test("a face holding NaN beside finite values says the count, in a box laid out wide enough", () => {
  // /tmp/s38/diff/r_nan_face.py: `denoiser`'s cotangent, 126 finite values and 2 NaN,
  // whose finite values' l2 is 0.19725555 (numpy, over the finite entries)
  const cot = summary({ shape: [64, 2], size: 128, count: 126, nan: 2, l2: 0.19725555181503296 });
  const ix = stages([
    { label: "denoiser", n_eqns: 11, summaries: { primal: summary({ shape: [64, 2], size: 128, count: 126, nan: 2, l2: 5.5535 }), cotangent: cot } },
    { label: "mean", n_eqns: 4, summaries: { primal: summary(), cotangent: summary({ l2: 1 }) } },
  ]);
  const { faces } = computeFaces(ix, ["n1", "n2"], { mode: "cotangent", stat: "l2" });
  const face = faces.get("n1");
  assert.equal(face.text, "‖grad‖₂ = 0.1973 · 2 NaN");
  const lay = layoutView(ix, new Set(), edgesByLevel(ix));
  const box = lay.boxes.get("n1");
  // graph.js's room right of its "+ 11 eqns" button holds the statistic and the count
  // (at 204 px it held 17 characters, and the face read "‖grad‖₂ = 0.1973")
  const toggle = toggleText(ix.nodes.get("n1"), 1);
  assert.equal(toggle, "+ 11 eqns");
  assert.ok(valueRoom(box.w, toggle) >= face.text.length, `${box.w} px`);
  assert.equal(fitted(face, valueRoom(box.w, toggle)), "‖grad‖₂ = 0.1973 · 2 NaN");
  // every statistic of every mode fits: primal's and `max|grad|`'s too
  for (const mode of ["primal", "cotangent"]) {
    for (const stat of ["l2", "absmax", "std"]) {
      const f = computeFaces(ix, ["n1"], { mode, stat }).faces.get("n1");
      assert.equal(fitted(f, valueRoom(box.w, toggle)), f.text, `${mode} ${stat}`);
    }
  }
  // a finite face's box keeps the label's width
  assert.equal(lay.boxes.get("n2").w, leafWidth("mean"));
});

test("a partly-NaN statistic is never shown without its count, at any room", () => {
  const ix = stages([{ label: "denoiser", summaries: { cotangent: summary({ count: 126, nan: 2, l2: 0.19725555 }) } }]);
  const face = computeFaces(ix, ["n1"], { mode: "cotangent", stat: "l2" }).faces.get("n1");
  for (let room = 0; room <= 40; room++) {
    const t = fitted(face, room);
    assert.ok(t.length <= room, `${room}: "${t}"`);
    // the statistic with the count, or the count alone, or nothing
    assert.ok(t === "" || /2 NaN$/.test(t), `${room}: "${t}"`);
  }
  assert.equal(fitted(face, 17), "grad: 2 NaN"); // it read "‖grad‖₂ = 0.1973"
});

test("an elided label keeps the index that tells a stack's children apart", () => {
  // /tmp/s38/eqx/r_stack_elide.py: both read `attention_blocks…: AttentionBlock` in a
  // MAX_W box (33 characters beside the sparkline)
  const a = "attention_blocks[0]: AttentionBlock";
  const b = "attention_blocks[1]: AttentionBlock";
  const room = Math.floor((leafWidth(a) - 92) / 7.4);
  assert.equal(room, 33);
  assert.equal(ellipsis(a, room), "attention_blo…[0]: AttentionBlock");
  assert.equal(ellipsis(b, room), "attention_blo…[1]: AttentionBlock");
  for (let n = 6; n < a.length; n++) {
    const [ea, eb] = [ellipsis(a, n), ellipsis(b, n)];
    assert.ok(ea.length <= n, `${n}: ${ea}`);
    assert.ok(ea.includes("[0]") && eb.includes("[1]"), `${n}: ${ea} / ${eb}`);
  }
  // the class is cut before the index when the index and the class do not fit together
  assert.equal(ellipsis("layers[12]: Conv2dWithAVeryLongName", 16), "layers[12]: Con…");
  // nested indices and a stack's range stay whole
  assert.equal(ellipsis("down_blocks[1][0].resnet", 15), "down_blo…[1][0]");
  assert.equal(ellipsis("down_blocks[1][0].resnet", 20), "down_b…[1][0].resnet");
  assert.ok(ellipsis("checkpoint(blocks[0–2]: EBlock)", 25).includes("[0–2]"));
  // labels without an index are cut as before
  assert.equal(ellipsis("aux.BatchNorm_0.mean", 15), "aux.Batch….mean");
});
