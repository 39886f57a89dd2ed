// Builds sowviz/static/sowviz.js (ESM, minified) and sowviz/static/sowviz.css.
//   node build.mjs           one build, prints sizes
//   node build.mjs --watch   rebuild on change
import * as esbuild from "esbuild";
import { readFileSync, statSync } from "node:fs";
import { gzipSync } from "node:zlib";
import { fileURLToPath } from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const outdir = path.join(here, "..", "sowviz", "static");
const watch = process.argv.includes("--watch");

const common = {
  bundle: true,
  minify: true,
  legalComments: "none",
  target: ["es2020", "chrome90", "firefox90", "safari15"],
  logLevel: "warning",
};

const js = {
  ...common,
  entryPoints: [path.join(here, "src", "index.js")],
  outfile: path.join(outdir, "sowviz.js"),
  format: "esm",
  // plotly's registry imports maplibre's stylesheet for map traces we do not ship
  loader: { ".css": "empty" },
  define: { "process.env.NODE_ENV": '"production"', global: "globalThis" },
};

const css = {
  ...common,
  entryPoints: [path.join(here, "src", "styles.css")],
  outfile: path.join(outdir, "sowviz.css"),
};

function report() {
  for (const f of ["sowviz.js", "sowviz.css"]) {
    const p = path.join(outdir, f);
    const raw = statSync(p).size;
    const gz = gzipSync(readFileSync(p)).length;
    console.log(`${f}: ${(raw / 1024).toFixed(1)} KiB raw, ${(gz / 1024).toFixed(1)} KiB gzip`);
  }
}

if (watch) {
  const a = await esbuild.context(js);
  const b = await esbuild.context(css);
  await Promise.all([a.watch(), b.watch()]);
  console.log("watching js/src …");
} else {
  await Promise.all([esbuild.build(js), esbuild.build(css)]);
  report();
}
