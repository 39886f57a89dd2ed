// Light or dark, following JupyterLab/Notebook when its --jp-* variables are present
// and the operating system (prefers-color-scheme) otherwise. Sets data-sv-theme and
// data-sv-host on the root; styles.css maps those to --sv-* variables.

/**
 * What the page says about its theme, read where the host puts it. JupyterLab marks
 * its body (data-jp-theme-light) and defines --jp-* on :root; anywidget renders into an
 * element JupyterLab attaches only later, so the widget's own root, detached, inherits
 * none of them: it is asked first (a host may theme a region apart), then the page.
 * @param {HTMLElement} root
 */
function pageThemeHints(root) {
  const body = globalThis.document?.body;
  const jpColour = [root, body, globalThis.document?.documentElement]
    .map((el) => (el ? getComputedStyle(el).getPropertyValue("--jp-layout-color0").trim() : ""))
    .find((c) => c) ?? "";
  return {
    jpColour,
    jpLight: body?.dataset?.jpThemeLight ?? null,
    vscodeKind: body?.dataset?.vscodeThemeKind ?? null,
    prefersDark: !!globalThis.matchMedia?.("(prefers-color-scheme: dark)")?.matches,
  };
}

/**
 * The theme and host from the page's hints: JupyterLab's own flag first, then VS Code's
 * theme kind, then the luminance of JupyterLab's background, then the system's choice.
 * @param {{jpColour?: string, jpLight?: string|null, vscodeKind?: string|null, prefersDark?: boolean}} hints
 * @returns {{theme: "light"|"dark", host: "jupyter"|"standalone"}}
 */
export function themeFromHints({ jpColour = "", jpLight = null, vscodeKind = null, prefersDark = false }) {
  const host = jpColour || jpLight === "true" || jpLight === "false" ? "jupyter" : "standalone";
  let dark;
  if (jpLight === "true" || jpLight === "false") dark = jpLight === "false";
  else if (vscodeKind) dark = !vscodeKind.includes("light");
  else if (jpColour) dark = luminance(jpColour) < 0.5;
  else dark = prefersDark;
  return { theme: dark ? "dark" : "light", host };
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

// the attributes a host changes when its theme switches
const THEME_ATTRIBUTES = ["data-jp-theme-light", "data-jp-theme-name", "data-vscode-theme-kind"];

/**
 * Applies the theme now and whenever it changes (the system's choice, JupyterLab's or VS
 * Code's theme switch, the root attached under a region themed apart); calls onChange
 * after a change, and again once the new theme's colours are in: JupyterLab flips its
 * body's flag before the theme's stylesheet applies, and charts drawn on the flag alone
 * took the old colours (white text on white).
 * @returns {() => void} cleanup
 */
export function watchTheme(root, onChange) {
  const media = globalThis.matchMedia?.("(prefers-color-scheme: dark)");
  let colours = null;
  const apply = () => {
    const hints = pageThemeHints(root);
    const { theme, host } = themeFromHints(hints);
    const changed = root.dataset.svTheme !== theme || root.dataset.svHost !== host || colours !== hints.jpColour;
    root.dataset.svTheme = theme;
    root.dataset.svHost = host;
    colours = hints.jpColour;
    return changed;
  };
  apply();
  let live = true;
  const alive = () => live;
  const update = () => { if (live && apply()) onChange?.(); };
  const switched = () => { update(); everyFrame(update, alive, 120); };
  media?.addEventListener?.("change", update);
  const body = globalThis.document?.body;
  const mo = typeof MutationObserver !== "undefined" && body ? new MutationObserver(switched) : null;
  mo?.observe(body, { attributes: true, attributeFilter: THEME_ATTRIBUTES });
  if (!root.isConnected) everyFrame(() => { if (root.isConnected) update(); return root.isConnected; }, alive, 600);
  return () => {
    live = false;
    media?.removeEventListener?.("change", update);
    mo?.disconnect();
  };
}

/**
 * Calls `step` each animation frame, at most `frames` times (120 ≈ 2 s), while `alive()`
 * holds and until `step` returns true.
 * @param {() => boolean|void} step @param {() => boolean} alive @param {number} frames
 */
function everyFrame(step, alive, frames) {
  const frame = globalThis.requestAnimationFrame;
  if (!frame) return;
  const next = (left) => {
    if (!alive() || left <= 0) return;
    if (step() === true) return;
    frame(() => next(left - 1));
  };
  frame(() => next(frames));
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
      tangent: v("--sv-tangent", "#3f8a37"),
      cotangent: v("--sv-cotangent", "#d9423f"),
      other: v("--sv-other", "#a0628f"),
    },
  };
}
