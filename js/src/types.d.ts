// Types of the "sowviz/1" model (docs/model.md) and of the widget's synced traits.
// The JavaScript is plain ESM with JSDoc that points here.

export type Mode = "primal" | "grad" | "jvp" | "vjp" | "all";

/** What the kernel is doing (`sowviz._progress.Phase`). */
export type Phase = "ready" | "tracing" | "compiling" | "running" | "locating" | "error";

/** The status a view shows: Python's phase, or "drawing" while a new model is drawn. */
export type ViewPhase = Phase | "drawing";

/** Synced traits of `sowviz.widget.Inspector` / `MonitorView` (anywidget model). */
export interface WidgetTraits {
  /** The sowviz/1 model: the serializer sends gzipped JSON as a binary buffer (empty: no model yet). */
  model: DataView | ArrayBuffer | Uint8Array;
  /** The mode the model was computed under (`_model.Mode`); the front end sets it from its dropdown. */
  mode: Mode;
  /** What the kernel is doing; "ready" when the model is current. */
  phase: Phase;
  /** The status line while working, or the error message (what went wrong and the fix) in phase "error". */
  status: string;
  /** The kernel can re-run the step to locate the NaN/Inf equation (the banner's button). */
  can_locate: boolean;
  /** The widget's own id: its views share one Monitor history under it. */
  key: string;
}

/** The part of anywidget's model the front end uses, typed by trait name. */
export interface AnyModel {
  get<K extends keyof WidgetTraits>(name: K): WidgetTraits[K];
  set<K extends keyof WidgetTraits>(name: K, value: WidgetTraits[K]): void;
  save_changes(): void;
  send(content: MessageToPython, callbacks?: unknown, buffers?: ArrayBuffer[]): void;
  on(event: `change:${keyof WidgetTraits}` | "msg:custom", callback: (...args: any[]) => void): void;
  off(event: `change:${keyof WidgetTraits}` | "msg:custom", callback?: (...args: any[]) => void): void;
}

/** Custom messages from Python: Monitor steps, appended to the front end's history. */
export type CustomMessage = StepMessage | StepsMessage;

/** Custom messages to Python. */
export type MessageToPython = LocateMessage;

/** The banner's button: Python runs `Inspection.locate_nonfinite()` and sends the new model. */
export interface LocateMessage {
  type: "locate";
}

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
  /** which of the model's `programs` (shapes) the step ran */
  program?: number | null;
  /** probe id -> capture key -> summary of this step */
  probes: Record<string, Record<string, SummaryLite>>;
  nonfinite?: { forward: string | null; backward: string | null } | null;
}

export interface Histogram { edges: number[]; counts: number[] }

/** `loghist`: bins of log10|x| over the non-zero finite values. `neg` (when present): how
 * many of each bin's values are negative (positives = counts - neg); `under`/`under_neg`:
 * non-zero values below the first bin (all / negative ones). */
export interface LogHistogram extends Histogram { under?: number; neg?: number[]; under_neg?: number }

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
  loghist?: LogHistogram | null;
  per_iteration?: PerIteration | null;
}

export interface Node {
  id: string; label: string; kind: string; parent: string | null; order: number;
  source: { file: string; line: number; function?: string } | null;
  shapes: string[]; primitive: string | null; n_eqns: number; collapsed: boolean;
  /** > 0: a group of this many identical blocks, its children (graph/repeats.py) */
  repeats?: number;
  /** a group's blocks, where stages of other work lie between them (else its children but equations) */
  blocks?: string[];
  /** the input nodes (parameters) its own equations read */
  reads?: string[];
  /** per input in `reads`, the `order` of the equation that first reads it */
  read_at?: number[];
  /** what its body calls a value entering it, by the value's producer (an edge end) */
  port_names?: Record<string, string>;
  /** a Tesseract's static inputs: schema field -> value as Python writes it */
  static_inputs?: Record<string, string>;
  /** a group of an argument's (or a result's) leaves: their kind and number (model.js) */
  leaves?: { kind: string; count: number };
  /** optional: the collectives its equations call, its stages' included (`psum`, `all_gather`) */
  collectives?: string[];
}

export interface Edge {
  source: string; target: string; shape?: number[]; dtype?: string;
  /** the (maker, reader) pairs of inner nodes a lifted edge stands for (docs/model.md) */
  ends?: [string, string][];
}

export interface Probe {
  id: string; name: string; leaf: string; node: string; auto: boolean;
  summaries: Record<string, Summary>;
  /** optional: why a stage probe has no cotangent in a mode computing them: "unreached"
   * (its value does not reach the differentiated output: its gradient is zero) or
   * "independent" (no tangent reaches it), "stopped" (it depends on the differentiated
   * arguments, but an equation of zero derivative, `stop_gradient`, cut its tangent),
   * "custom_rule" (it is computed inside a `jax.custom_vjp`/`custom_jvp` function, whose
   * gradient is its rule's); absent otherwise, and in older models */
  no_cotangent?: "unreached" | "independent" | "stopped" | "custom_rule";
  /** with "stopped": the equation that cut it and its line */
  stopped_by?: { primitive: string; source: { file: string; line: number; function: string } | null };
  /** with "custom_rule": the outermost custom derivative function around the value */
  custom_rule?: { kind: "custom_vjp" | "custom_jvp"; function: string | null; source: { file: string; line: number | null } | null };
  /** optional: per capture key, the leading axes of its summary's shape that enclosing
   * constructs added, outermost first: "mesh:<axis>" (a shard_map's mesh axis: one
   * slice per device), "scan" or "while" (a loop's iterations) */
  axes?: Record<string, string[]>;
}

export interface History {
  steps: number[];
  loss: (number | null)[];
  /** per step: false when the loss or gradients held NaN/Inf (null: not known) */
  finite?: (boolean | null)[];
  /** per step: which of the model's `programs` it ran (null: not said, an older model) */
  program?: (number | null)[];
  probes: Record<string, Record<string, SummaryLite[]>>;
  nonfinite: { step: number; forward: string | null; backward: string | null } | null;
  /** optional: every step's loss, recorded or not (`every=N`), thinned; null/absent: an older model */
  losses?: { steps: number[]; loss: (number | null)[]; limit?: number } | null;
  /** optional: most steps the front end keeps (Monitor's `history`) */
  limit?: number;
}

export interface SowvizModel {
  schema: "sowviz/1";
  title: string; mode: Mode; modes: string[]; device: string;
  versions: Record<string, string>; created: string; root: string;
  nodes: Node[]; edges: Edge[]; probes: Probe[];
  notes: { level: string; probe?: string; node?: string; nodes?: string[]; message: string }[];
  history: History | null;
  /** Monitor only: one per set of shapes its steps ran (`History.program` names one) */
  programs?: Program[];
}

/** The shapes of one program a Monitor ran: node id -> `shapes`, probe id -> shape and size. */
export interface Program {
  nodes: Record<string, string[]>;
  probes: Record<string, { shape: number[]; size: number }>;
}
