import js from "@eslint/js";
import globals from "globals";

export default [
  js.configs.recommended,
  {
    files: ["src/**/*.js", "build.mjs"],
    languageOptions: { ecmaVersion: 2022, sourceType: "module", globals: { ...globals.browser } },
  },
  {
    files: ["test/**/*.js", "build.mjs"],
    languageOptions: { ecmaVersion: 2022, sourceType: "module", globals: { ...globals.node } },
  },
  {
    rules: {
      "no-unused-vars": ["error", { argsIgnorePattern: "^_" }],
      // user strings reach the page through textContent only (see README)
      "no-restricted-properties": ["error",
        { property: "innerHTML", message: "build DOM with dom.js (textContent), never innerHTML" },
        { property: "outerHTML", message: "build DOM with dom.js (textContent), never outerHTML" },
        { property: "insertAdjacentHTML", message: "build DOM with dom.js (textContent)" }],
    },
  },
];
