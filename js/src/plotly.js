// A partial plotly.js: the core (scatter) plus bar and heatmap, about a quarter of the
// full 4 MB distribution. It is set up on first use (the first chart), not when the
// bundle loads: its module setup took 50-130 ms of every report's first draw, which
// shows no chart. esbuild bundles these `require` calls (lazily run CommonJS modules).
/* global require */

let plotly = null;

function get() {
  if (!plotly) {
    plotly = require("plotly.js/lib/core");
    plotly.register([require("plotly.js/lib/bar"), require("plotly.js/lib/heatmap")]);
  }
  return plotly;
}

/** The two calls the charts make. */
export default {
  react: (...args) => get().react(...args),
  purge: (el) => get().purge(el),
};
