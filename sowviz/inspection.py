"""`inspect()`: trace → stage graph → probes → mode → capture → model.

The one-way flow of the product, in one place:

1. trace the user's (undifferentiated) `fn` to its primal jaxpr;
2. `graph.build_graph` turns it into stages and picks probe points;
3. `graph.instrument` re-runs the program with a `sow` at every probe point;
4. `modes.transform` differentiates that instrumented function (grad, jvp, ...);
5. `save_intermediates(..., summarize=...)` compiles it, capturing every probe and
   user sow, with statistics computed inside the same program;
6. `Inspection` joins summaries to nodes: the versioned JSON model every view draws.

Nothing here knows about widgets: `widget.py`, `report.py` and `monitor.py`
render `Inspection.to_dict()`.
"""

from __future__ import annotations

import datetime as _dt
import inspect as _pyinspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import jax

from . import _compat
from .capture.api import META_KEYS, SaveIntermediates, nest
from .capture.packing import Packed
from .graph import build_graph, instrument
from .graph.model import StageGraph
from .modes import Mode, check_mode, transform
from .summary import Summary, SummaryOptions

SCHEMA = "sowviz/1"
PROBE_TAG = "sowviz.stage"
Capture = Literal["sows", "stages", "all"]
_CAPTURES = ("sows", "stages", "all")

_OPTION_NAMES = (
    "argnums",
    "tangents",
    "cotangents",
    "bins",
    "title",
    "tag",
    "duplicates",
    "loops",
    "strict",
    "tesseract_names",
)


@dataclass(frozen=True)
class InspectOptions:
    """Options shared by `inspect`, `show` and `Monitor` (all keyword-only there)."""

    mode: Mode = "grad"
    capture: Capture = "stages"
    argnums: int | Sequence[int] = 0
    tangents: Sequence[Any] | None = None
    cotangents: Any = None
    bins: int = 64
    title: str | None = None
    tag: str = "intermediates"
    duplicates: str = "suffix"
    loops: Literal["last"] | int = "last"
    strict: bool = True
    tesseract_names: Any = None

    @classmethod
    def from_kwargs(cls, where: str, mode: Any, capture: Any, options: dict) -> InspectOptions:
        unknown = sorted(set(options) - set(_OPTION_NAMES))
        if unknown:
            raise TypeError(
                f"sowviz.{where}: unknown option(s) {', '.join(map(repr, unknown))}. "
                f"Known options: {', '.join(_OPTION_NAMES)}. (To pass keyword arguments to "
                "your function, bind them first with functools.partial.)"
            )
        if capture not in _CAPTURES:
            raise ValueError(
                f"sowviz.{where}: unknown `capture` {capture!r}; use 'stages' (user sows and "
                "every stage's outputs), 'sows' (user sows only) or 'all' (every equation)."
            )
        return cls(mode=check_mode(mode), capture=capture, **options)


@dataclass(frozen=True)
class Probe:
    """One captured array: where it is drawn and its summary per capture key."""

    id: str
    name: str
    leaf: str
    node: str
    auto: bool
    summaries: dict[str, dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "leaf": self.leaf,
            "node": self.node,
            "auto": self.auto,
            "summaries": self.summaries,
        }


def _arg_names(fn: Callable, args: Sequence[Any]) -> list[str]:
    """Flat input labels like `params['w']`, from the function's parameter names."""
    try:
        params = list(_pyinspect.signature(fn).parameters.values())
        names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        names = []
    out = []
    for i, arg in enumerate(args):
        base = names[i] if i < len(names) else f"arg{i}"
        for path, _ in jax.tree_util.tree_flatten_with_path(arg)[0]:
            out.append(base + jax.tree_util.keystr(path))
    return out


def _out_names(out_shape: Any) -> list[str]:
    return [
        "output" + jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_flatten_with_path(out_shape)[0]
    ]


class Pipeline:
    """Everything static about inspecting `fn` at arguments like `args`: the graph,
    the instrumented and transformed program, and the compiled capture."""

    def __init__(self, fn: Callable, args: Sequence[Any], options: InspectOptions):
        if not callable(fn):
            raise TypeError(
                f"sowviz: `fn` must be callable, got {type(fn).__name__}; pass the function "
                "and its arguments: sowviz.inspect(loss, params, batch)."
            )
        self.fn, self.options = fn, options
        self._plain: Callable | None = None
        leaves, self.in_tree = jax.tree_util.tree_flatten(tuple(args))

        def flat_fn(*flat):
            return fn(*jax.tree_util.tree_unflatten(self.in_tree, flat))

        with _compat.capturing(True):
            closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*leaves)
        self.out_tree = jax.tree_util.tree_structure(out_shape)
        title = options.title or getattr(fn, "__name__", None) or "program"
        self.graph: StageGraph = build_graph(
            closed,
            in_names=_arg_names(fn, args),
            out_names=_out_names(out_shape),
            capture=options.capture,
            title=title,
            tesseract_names=options.tesseract_names,
        )
        probed = instrument(closed, self.graph.probe_points, tag=PROBE_TAG)

        def instrumented(*a):
            flat = jax.tree_util.tree_leaves(a)
            return jax.tree_util.tree_unflatten(self.out_tree, probed(*flat))

        self.transformed = transform(
            instrumented,
            options.mode,
            n_args=len(args),
            argnums=options.argnums,
            tangents=options.tangents,
            cotangents=options.cotangents,
        )
        self.capture = SaveIntermediates(
            self.transformed,
            tag=(PROBE_TAG, options.tag),
            duplicates=options.duplicates,
            loops=options.loops,
            summarize=SummaryOptions(bins=options.bins),
            strict=options.strict,
            by_tag=True,
        )

    def run_plain(self, *args: Any) -> Any:
        """The same mode's result from the un-instrumented program, with no summaries:
        what a Monitor runs on the steps it does not record."""
        if self._plain is None:
            self._plain = jax.jit(
                transform(
                    self.fn,
                    self.options.mode,
                    n_args=len(args),
                    argnums=self.options.argnums,
                    tangents=self.options.tangents,
                    cotangents=self.options.cotangents,
                )
            )
        return self._plain(*args)

    def run(self, *args: Any) -> tuple[Any, Packed]:
        """One compiled call: the mode's result and the packed summaries (still on device)."""
        return self.capture.run(*args)

    def probes(self, summaries: dict[str, dict[str, Any]]) -> tuple[list[Probe], list[str]]:
        """Join host summaries (`{tag: {name: {mode: tree of Summary}}}`) to graph nodes."""
        probes: list[Probe] = []
        notes: list[str] = []
        user = summaries.get(self.options.tag, {})
        stage = summaries.get(PROBE_TAG, {})
        for name, entry in stage.items():
            probes.extend(self._probes_of(name, name, entry, auto=True, start=len(probes)))
        for name, entry in user.items():
            node = self._sow_node(name)
            if node is None:
                notes.append(f"sow {name!r} has no node in the primal program; it is not drawn.")
                continue
            probes.extend(self._probes_of(name, node, entry, auto=False, start=len(probes)))
        reached = {p.node for p in probes if not p.auto}
        for name, nodes in self.graph.sow_nodes_all.items():
            for node in nodes:
                if node not in reached:
                    where = self.graph.node(node).source
                    notes.append(
                        f"sow {name!r}{f' at {where}' if where else ''} was not reached under "
                        f"mode {self.options.mode!r}: a custom_jvp/custom_vjp rule replaced the "
                        "code around it (its rule does not call the function), so nothing "
                        "flowed through it. Sow the custom function's output instead."
                    )
        order = {n.id: n.order for n in self.graph.nodes}
        probes.sort(key=lambda p: (order.get(p.node, 0), not p.auto, p.name, p.leaf))
        probes = [replace(p, id=f"p{i}") for i, p in enumerate(probes)]
        expected = _expected_modes(self.options.mode)
        for p in probes:
            missing = [m for m in expected if m not in p.summaries]
            if missing and not p.auto:
                notes.append(
                    f"{p.name}{p.leaf}: no {', '.join(missing)} — the value does not depend on "
                    "the differentiated inputs, or a custom derivative rule replaced the code "
                    "that computes it."
                )
        return probes, notes

    def _sow_node(self, name: str) -> str | None:
        if name in self.graph.sow_nodes:
            return self.graph.sow_nodes[name]
        base, _, idx = name.rpartition("_")
        if idx.isdigit() and base in self.graph.sow_nodes_all:
            nodes = self.graph.sow_nodes_all[base]
            return nodes[int(idx)] if int(idx) < len(nodes) else None
        return None

    def _probes_of(self, name, node, entry, *, auto, start) -> list[Probe]:
        per_leaf: dict[str, dict[str, Any]] = {}
        for mode, tree in entry.items():
            if mode in META_KEYS:
                continue
            for path, s in jax.tree_util.tree_flatten_with_path(
                tree, is_leaf=lambda x: isinstance(x, Summary)
            )[0]:
                if isinstance(s, Summary):
                    per_leaf.setdefault(jax.tree_util.keystr(path), {})[mode] = s.to_json()
        return [
            Probe(f"p{start + i}", name if not auto else self._label(node), leaf, node, auto, sums)
            for i, (leaf, sums) in enumerate(per_leaf.items())
        ]

    def _label(self, node_id: str) -> str:
        return self.graph.node(node_id).label


def _expected_modes(mode: str) -> tuple[str, ...]:
    return {
        "primal": ("primal",),
        "grad": ("primal", "cotangent"),
        "vjp": ("primal", "cotangent"),
        "jvp": ("primal", "tangent"),
        "all": ("primal", "tangent", "cotangent"),
    }[mode]


def _device_of(packed: Packed) -> str:
    for b in packed.buffers:
        devices = getattr(b, "devices", None)
        if devices is not None:
            ds = sorted(devices(), key=lambda d: d.id)
            first = ds[0]
            more = f" +{len(ds) - 1} more" if len(ds) > 1 else ""
            return f"{first.platform}:{first.id}{more} ({first.device_kind})"
    d = jax.devices()[0]
    return f"{d.platform}:{d.id} ({d.device_kind})"


@dataclass
class Inspection:
    """The result of `sowviz.inspect`: the mode's result, the stage graph, and the
    summaries of every probe. `to_dict()`/`to_json()` give the versioned model."""

    result: Any
    graph: StageGraph
    probes: list[Probe]
    mode: str
    device: str
    title: str
    notes: list[dict[str, Any]] = field(default_factory=list)
    created: str = field(
        default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    )
    history: dict[str, Any] | None = None

    @property
    def modes(self) -> list[str]:
        seen: list[str] = []
        for p in self.probes:
            for m in p.summaries:
                if m not in seen:
                    seen.append(m)
        order = ["primal", "tangent", "cotangent"]
        return sorted(seen, key=lambda m: (order.index(m) if m in order else 3, m))

    def __repr__(self) -> str:
        return (
            f"Inspection(title={self.title!r}, mode={self.mode!r}, nodes={len(self.graph.nodes)}, "
            f"probes={len(self.probes)}, device={self.device!r})"
        )

    def to_dict(self) -> dict[str, Any]:
        from . import __version__

        g = self.graph.to_dict()
        return {
            "schema": SCHEMA,
            "title": self.title,
            "mode": self.mode,
            "modes": self.modes,
            "device": self.device,
            "versions": {"sowviz": __version__, "jax": jax.__version__},
            "created": self.created,
            "root": g["root"],
            "nodes": g["nodes"],
            "edges": g["edges"],
            "probes": [p.to_dict() for p in self.probes],
            "notes": [*g["notes"], *self.notes],
            "history": self.history,
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def probe(self, name: str, leaf: str = "") -> Probe:
        """The probe called `name` (a sow name or a stage label)."""
        for p in self.probes:
            if p.name == name and p.leaf == leaf:
                return p
        known = sorted({p.name for p in self.probes})
        raise KeyError(f"no probe named {name!r}{leaf}; probes: {', '.join(known[:20])}")

    def save_html(self, path: str) -> Any:
        """Write a self-contained, offline HTML report of this inspection; returns its path."""
        from .report import write_html

        return write_html(self.to_dict(), path)

    def _repr_html_(self) -> str:
        return (
            f"<p>sowviz.Inspection of <code>{_escape(self.title)}</code> ({self.mode}): "
            f"{len(self.graph.nodes)} nodes, {len(self.probes)} probes. Use <code>sowviz.show(...)</code> "
            "for the interactive view.</p>"
        )


def _escape(s: str) -> str:
    import html

    return html.escape(s)


def inspect_with(pipeline: Pipeline, args: Sequence[Any]) -> Inspection:
    result, packed = pipeline.run(*args)
    summaries = nest(*packed.unpack())
    probes, notes = pipeline.probes(summaries)
    notes.extend(pipeline.capture.notes)
    return Inspection(
        result=result,
        graph=pipeline.graph,
        probes=probes,
        mode=pipeline.options.mode,
        device=_device_of(packed),
        title=pipeline.graph.title,
        notes=[{"level": "warning", "probe": None, "message": m} for m in notes],
    )


def inspect(
    fn: Callable, *args: Any, mode: Mode = "grad", capture: Capture = "stages", **options: Any
) -> Inspection:
    opts = InspectOptions.from_kwargs("inspect", mode, capture, options)
    return inspect_with(Pipeline(fn, args, opts), args)


__all__ = ["InspectOptions", "Inspection", "Pipeline", "Probe", "inspect"]
