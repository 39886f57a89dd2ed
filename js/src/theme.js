// Light or dark, following JupyterLab/Notebook when its --jp-* variables are present
// and the operating system (prefers-color-scheme) otherwise. Sets data-sv-theme and
// data-sv-host on the root; styles.css maps those to --sv-* variables.

function jupyterTheme(root) {
  const cs = getComputedStyle(root);
  if (!cs.getPropertyValue("--jp-layout-color0").trim()) return null;
  const flag = document.body?.dataset?.jpThemeLight;
  if (flag === "true") return "light";
  if (flag === "false") return "dark";
  return luminance(cs.getPropertyValue("--jp-layout-color0").trim()) < 0.5 ? "dark" : "light";
}

/** Relative luminance of a CSS colour string (#rgb, #rrggbb or rgb()), 1 when unknown. */
export function luminance(colour) {
  let r;
  let g;
  let b;
  const hex = /^#([0-9a-f]{3}|[0-9a-f]{6})$/i.exec(colour);
  const rgb = /^rgba?\(\s*(\d+)[,\s]+(\d+)[,\s]+(\d+)/i.exec(colour);
  if (hex) {
    const x = hex[1].length === 3 ? hex[1].replace(/./g, "$&$&") : hex[1];
    [r, g, b] = [0, 2, 4].map((i) => parseInt(x.slice(i, i + 2), 16));
  } else if (rgb) {
    [r, g, b] = rgb.slice(1, 4).map(Number);
  } else {
    return 1;
  }
  return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255;
}

/**
 * Applies the theme now and whenever it changes; calls onChange after a change.
 * @returns {() => void} cleanup
 */
export function watchTheme(root, onChange) {
  const media = globalThis.matchMedia?.("(prefers-color-scheme: dark)");
  const apply = () => {
    const jp = jupyterTheme(root);
    const theme = jp ?? (media?.matches ? "dark" : "light");
    const host = jp ? "jupyter" : "standalone";
    const changed = root.dataset.svTheme !== theme || root.dataset.svHost !== host;
    root.dataset.svTheme = theme;
    root.dataset.svHost = host;
    return changed;
  };
  apply();
  const update = () => { if (apply()) onChange?.(); };
  media?.addEventListener?.("change", update);
  const mo = typeof MutationObserver !== "undefined" && document.body ? new MutationObserver(update) : null;
  mo?.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-light", "data-jp-theme-name"] });
  return () => {
    media?.removeEventListener?.("change", update);
    mo?.disconnect();
  };
}

/** Resolved colours for plotly, which cannot read CSS variables. */
export function chartColours(root) {
  const cs = getComputedStyle(root);
  const v = (name, d) => cs.getPropertyValue(name).trim() || d;
  return {
    bg: v("--sv-panel", "#ffffff"),
    fg: v("--sv-fg", "#222222"),
    muted: v("--sv-muted", "#777777"),
    grid: v("--sv-grid", "#e5e5e5"),
    accent: v("--sv-accent", "#1f77b4"),
    bad: v("--sv-bad", "#dc2626"),
    badSoft: v("--sv-bad-soft", "rgba(220, 38, 38, 0.1)"),
    font: v("--sv-font", "system-ui, sans-serif"),
    modes: {
      primal: v("--sv-primal", "#4c78a8"),
      tangent: v("--sv-tangent", "#59a14f"),
      cotangent: v("--sv-cotangent", "#e45756"),
      other: v("--sv-other", "#b279a2"),
    },
  };
}
