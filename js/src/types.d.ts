// Types of the "sowviz/1" model (docs/model.md) and of the widget's synced traits.
// The JavaScript is plain ESM with JSDoc that points here.

export type Mode = "primal" | "grad" | "jvp" | "vjp" | "all";

/** Synced traits of `sowviz.widget.Inspector` / `Monitor` (anywidget model). */
export interface WidgetTraits {
  /** The sowviz/1 model as gzipped JSON (a binary buffer); replaced whole after a re-run. */
  model_bytes: DataView | ArrayBuffer | Uint8Array;
  /** The mode the model was computed under; the front end sets it from its dropdown. */
  mode: Mode;
  /** True while Python recomputes after a mode change. */
  busy: boolean;
  /** A message to show (e.g. why a mode change failed); "" for none. */
  error: string;
}

/** Custom messages from Python: Monitor steps, appended to the front end's history. */
export type CustomMessage = StepMessage | StepsMessage;

export interface StepMessage {
  type: "step";
  step: Step;
}

/** Several steps as one binary buffer: a gzipped JSON list of `Step`. */
export interface StepsMessage {
  type: "steps";
  encoding: "gzip-json";
  count: number;
}

export interface Step {
  step: number;
  loss: number | null;
  /** false when the loss, a gradient or a returned value held NaN/Inf */
  finite?: boolean;
  /** probe id -> capture key -> summary of this step */
  probes: Record<string, Record<string, SummaryLite>>;
  nonfinite?: { forward: string | null; backward: string | null } | null;
}

export interface Histogram { edges: number[]; counts: number[] }

export interface SummaryLite {
  size: number; complex?: boolean; count: number;
  nan: number; posinf: number; neginf: number; zeros: number;
  min: number | null; max: number | null; mean: number | null; std: number | null;
  l2: number | null; absmax: number | null;
  hist?: Histogram | null;
}

/** Statistics per iteration of the outermost stacked axis (scan / fori_loop / while). */
export interface PerIteration {
  count: number;
  l2: (number | null)[]; mean: (number | null)[]; std: (number | null)[];
  absmax: (number | null)[]; min: (number | null)[]; max: (number | null)[];
  nonfinite: number[];
  /** one row per iteration, over the pooled `hist.edges` */
  hist_counts: number[][];
}

export interface Summary extends SummaryLite {
  shape: number[]; dtype: string;
  loghist?: Histogram | null;
  per_iteration?: PerIteration | null;
}

export interface Node {
  id: string; label: string; kind: string; parent: string | null; order: number;
  source: { file: string; line: number; function?: string } | null;
  shapes: string[]; primitive: string | null; n_eqns: number; collapsed: boolean;
  /** > 0: a group of this many identical blocks, its children (graph/repeats.py) */
  repeats?: number;
}

export interface Edge { source: string; target: string; shape?: number[]; dtype?: string }

export interface Probe {
  id: string; name: string; leaf: string; node: string; auto: boolean;
  summaries: Record<string, Summary>;
}

export interface History {
  steps: number[];
  loss: (number | null)[];
  /** per step: false when the loss or gradients held NaN/Inf (null: not known) */
  finite?: (boolean | null)[];
  probes: Record<string, Record<string, SummaryLite[]>>;
  nonfinite: { step: number; forward: string | null; backward: string | null } | null;
  /** optional: most steps the front end keeps (Monitor's `history`) */
  limit?: number;
}

export interface SowvizModel {
  schema: "sowviz/1";
  title: string; mode: Mode; modes: string[]; device: string;
  versions: Record<string, string>; created: string; root: string;
  nodes: Node[]; edges: Edge[]; probes: Probe[];
  notes: { level: string; probe?: string; message: string }[];
  history: History | null;
}
