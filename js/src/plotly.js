// A partial plotly.js: the core (scatter) plus bar and heatmap, about a quarter of the
// full 4 MB distribution.
import Plotly from "plotly.js/lib/core";
import bar from "plotly.js/lib/bar";
import heatmap from "plotly.js/lib/heatmap";

Plotly.register([bar, heatmap]);

export default Plotly;
