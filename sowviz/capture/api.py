"""`save_intermediates`: trace once, rewrite, compile, cache.

The wrapped function is a `jax.jit` of a function that traces the user's `fn`
to a jaxpr and re-evaluates it with `interpret.evaluate`, so captured values
leave the compiled program as extra outputs. `jax.jit`'s own C++ cache keys on
the arguments' tree structure, shapes, dtypes, weak types and shardings: a
second call with like arguments neither retraces `fn` nor recompiles. Leaves
that are not JAX types (strings, enums, arbitrary objects) are treated as
static and key a separate cache entry; so are Python numbers in a call holding
such a leaf or an Equinox module, as `equinox.filter_jit` splits them.
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
import warnings
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat, _outputs
from .._caller import user_stacklevel
from .._gc import gc_paused
from . import rules as _rules  # noqa: F401  (registers the rules)
from .interpret import evaluate_closed, sow_eqns, sow_location, sows_by_tag, with_barriers
from .mapped import rows_in_order
from .packing import Packed
from .primitive import READ_BEFORE_SOWN, RESERVED_TAG_PREFIX, sow_p, sows_called
from .record import Capture, Options, Recorder, Site
from .summaries import summarize_packed

DuplicatePolicy = Literal["error", "suffix", "stack"]
_DUPLICATES = ("error", "suffix", "stack")
META_KEYS = ("iterations", "taken", "axes")


def _check_options(fn, tag, duplicates, loops, strict) -> tuple[frozenset[str], Any]:
    if not callable(fn):
        raise TypeError(
            f"sowviz.save_intermediates: `fn` must be callable, got {type(fn).__name__}. "
            "Pass the function itself: save_intermediates(jax.grad(loss))."
        )
    tags = (tag,) if isinstance(tag, str) else tuple(tag)
    if not tags or not all(isinstance(t, str) and t for t in tags):
        raise TypeError(
            f"sowviz.save_intermediates: `tag` must be a non-empty string (or a sequence of "
            f"them), got {tag!r}."
        )
    if duplicates not in _DUPLICATES:
        raise ValueError(
            f"sowviz.save_intermediates: unknown `duplicates` policy {duplicates!r}; "
            f"use one of {', '.join(map(repr, _DUPLICATES))}."
        )
    if not (
        loops == "last" or (isinstance(loops, int) and not isinstance(loops, bool) and loops > 0)
    ):
        raise ValueError(
            f"sowviz.save_intermediates: `loops` must be 'last' or a positive int (the "
            f"number of while-loop iterations to keep), got {loops!r}."
        )
    if not isinstance(strict, bool):  # `strict="no"` must not read as true
        raise TypeError(
            f"sowviz.save_intermediates: `strict` must be True or False, got {strict!r}."
        )
    return frozenset(tags), loops


def _is_dynamic(leaf: Any) -> bool:
    """Whether a leaf is traced. Arrays and tracers are; Python numbers are not.

    When every leaf is a JAX type the call goes through `jax.jit`, which traces
    Python numbers itself (`jax.jit` semantics). Arguments with other leaves (an
    Equinox module, a function, a string) take the static path, split as
    `equinox.filter_jit` splits them: there Python numbers are static, so a module
    field such as `eqx.nn.MaxPool2d.init` stays the constant its code expects.
    """
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic)) or (
        hasattr(leaf, "__jax_array__") or hasattr(leaf, "aval")
    )


#: tree structure of `(args, kwargs)` -> whether it holds an Equinox module: a
#: structure is walked once, not at every call of a step.
_HOLDS_MODULE: dict[Any, bool] = {}
_HOLDS_MODULE_MAX = 64


def _holds_equinox_module(args: tuple, kwargs: dict) -> bool:
    """Whether an Equinox module is among the arguments, at any depth. Such arguments
    are split as `equinox.filter_jit` splits them (README, "Capture keys"), though
    `jax.jit` would accept them: a module whose every leaf is a JAX type (an
    `eqx.nn.Dropout` holds a float `p` and a bool `inference`) included."""
    eqx = sys.modules.get("equinox")  # not imported: no argument can be a module
    module = getattr(eqx, "Module", None)
    if module is None:
        return False
    tops = (*args, *kwargs.values())
    if any(isinstance(a, module) for a in tops):  # `fn(model, x)`: no walk
        return True
    if all(_is_dynamic(a) for a in tops):  # `fn(w, x)`: arrays alone
        return False
    treedef = jax.tree_util.tree_structure((args, kwargs))
    try:
        held = _HOLDS_MODULE.get(treedef)
    except TypeError:  # a module's static field that is not hashable
        held = None
    if held is not None:
        return held
    is_module = functools.partial(_is_instance, module)
    leaves = jax.tree_util.tree_leaves((args, kwargs), is_leaf=is_module)
    held = any(map(is_module, leaves))
    if len(_HOLDS_MODULE) >= _HOLDS_MODULE_MAX:
        _HOLDS_MODULE.clear()
    try:
        _HOLDS_MODULE[treedef] = held
    except TypeError:
        pass  # unhashable: walked again next time (the static path says why it fails)
    return held


def _is_instance(kind: type, x: Any) -> bool:
    return isinstance(x, kind)


class SaveIntermediates:
    """The callable returned by `save_intermediates` (see its docstring)."""

    def __init__(
        self,
        fn,
        *,
        tag,
        duplicates,
        loops,
        summarize,
        strict,
        by_tag=False,
        defer=False,
        once=False,
        barriers=True,
        apart=False,
    ):
        tags, loops = _check_options(fn, tag, duplicates, loops, strict)
        self.fn = fn
        self._options = Options(tags=tags, loops=loops, strict=strict)
        self._duplicates = duplicates
        # Internal (inspect): key the result by tag first, so names never mix across tags.
        self._by_tag = by_tag
        # Internal (inspect): small arrays' summaries left to a second program
        # (`summaries.finish`), shared by every program with like sizes.
        self._defer = defer
        # Internal (inspect): compiled for one call, not run at every step: fewer
        # arrays summarised in blocks on a CPU, and with `defer` the small arrays'
        # layout left to a program keyed by their shapes (`summaries.summarize_packed`).
        self._once = once
        # Internal (locate's count re-run): captured values without optimization
        # barriers, so XLA fuses the program as it does the plain one (`interpret._BARRIERS`).
        self._barriers = barriers
        # Internal (a Monitor on a CPU mesh): with `defer`, the small arrays' layout
        # left to `summaries.finish` too (`summaries.summarize_packed`'s `apart`).
        self._apart = apart
        self._summary = _summary_options(summarize)
        self.notes: list[str] = []
        #: {(tag?, name): {mode: Site.axes}} of the last trace (`_traced`)
        self.axes: dict = {}
        self._warned_tags = False  # (`_other_tags`: said once)
        self.trace_count = 0
        self._jitted = jax.jit(self._traced)
        self._static_cache: dict[Hashable, Callable] = {}
        self._static_seen = False
        self._local = threading.local()
        functools.update_wrapper(self, fn, updated=())

    def _traced(self, *args, **kwargs):
        self._local.entered = True
        self.trace_count += 1
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        dynamic = [_is_dynamic(leaf) for leaf in leaves]
        flat = [leaf for leaf, d in zip(leaves, dynamic, strict=True) if d]

        def flat_fn(*dyn):
            it = iter(dyn)
            merged = [next(it) if d else leaf for leaf, d in zip(leaves, dynamic, strict=True)]
            a, k = jax.tree_util.tree_unflatten(treedef, merged)
            # a Python number comes back an array, as from `jax.jit` (BlackJAX's
            # `HMCInfo.num_integration_steps`); other non-JAX leaves are refused
            out = jax.tree_util.tree_map(_python_number_as_array, self.fn(*a, **k))
            bad = _outputs.first_static_path(out)
            if bad is not None:
                raise TypeError(NOT_A_JAX_OUTPUT.format(path=bad[0], kind=bad[1]))
            return out

        _compat.name_trace_after(flat_fn, self.fn)  # a leaked tracer's error names `fn`
        with (
            _compat.capture_tracing(),
            _compat.recording_foreign_sow_treedefs() as foreign_inside,
            sows_called() as called,
        ):
            closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*flat)
        rec = Recorder(self._options)
        with with_barriers(self._barriers):
            outs = evaluate_closed(closed, flat, rec)
        self.notes = list(rec.notes) + self._unreached(called, rec, foreign_inside)
        self.notes += read_before_sown(closed.jaxpr, self._options.tags)
        if not rec.captures:
            self.notes += self._other_tags(closed.jaxpr, called)
        notes = self.notes  # assemble adds what it leaves out
        result = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)
        axes: dict = {}  # {(tag?, name): {mode: Site.axes}}, for per-iteration summaries
        # (and kept for a reader of the raw captures: `nonfinite_counts`, per device)
        self.axes = axes
        if self._by_tag:
            inter = {
                t: assemble(
                    [c for c in rec.captures if c.site.tag == t],
                    self._duplicates,
                    axes,
                    (t,),
                    notes,
                )
                for t in sorted(self._options.tags)
            }
        else:
            inter = assemble(rec.captures, self._duplicates, axes, notes=notes)
        if self._summary is None:
            return result, inter
        depth = 2 if self._by_tag else 1
        return result, _summarize_entries(
            inter,
            self._summary,
            depth=depth,
            axes=axes,
            defer=self._defer,
            once=self._once,
            apart=self._apart,
        )

    def _unreached(self, called: set, rec: Recorder, foreign: dict) -> list[str]:
        """A note (and a warning) per sow that Python called while tracing `fn` but that
        never reached the program: a `custom_vjp`/`custom_jvp` rule that does not call
        the function replaced the code around it, so nothing was captured there; or it
        is inside an in-process Tesseract's `apply_jit` (`INSIDE_TESSERACT`), which
        `foreign` ({name: client}) also says of `tesseract_jax.sow`s."""
        from ..graph.tesseract import tesseract_label

        captured = {(c.site.tag, c.site.name) for c in rec.captures}
        inside = dict(getattr(called, "inside", {}))
        inside.update({("intermediates", n): c for n, c in foreign.items()})
        notes = [
            INSIDE_TESSERACT.format(
                name=name,
                how="sowviz.sow" if (tag, name) in called else "tesseract_jax.sow",
                label=tesseract_label(inside[tag, name], None),
            )
            if (tag, name) in inside
            else NOT_REACHED.format(name=name)
            for tag, name in sorted(called | set(inside))
            if tag in self._options.tags
            and (tag, name) not in captured
            and name not in rec.dropped  # already said (`interpret.UNSUPPORTED`)
        ]
        for note in notes:
            warnings.warn(note, stacklevel=user_stacklevel())
        return notes

    def _other_tags(self, jaxpr: Any, called: set) -> list[str]:
        """A note (and a warning, once) when nothing was captured though `fn` sows under
        other tags than the ones collected (`sow(h, "hidden", tag="debug")` under the
        default `tag`): the result would be `{}`, with no word of why. Not for sowviz's
        own captures (a reserved tag: `inspect` says what it does not draw itself)."""
        tags = self._options.tags
        if any(t.startswith(RESERVED_TAG_PREFIX) for t in tags):
            return []
        other = sows_by_tag(jaxpr)
        for tag, name in called:
            other.setdefault(tag, set()).add(name)
        other = {
            t: names
            for t, names in other.items()
            if t not in tags and not t.startswith(RESERVED_TAG_PREFIX)
        }
        if not other:
            return []
        sown = "; ".join(
            f"tag {t!r}: {', '.join(map(repr, sorted(names)[:4]))}"
            + (", ..." if len(names) > 4 else "")
            for t, names in sorted(other.items())
        )
        want = sorted(tags)
        note = OTHER_TAGS.format(
            want=want[0] if len(want) == 1 else tuple(want),
            sown=sown,
            fix=repr(next(iter(sorted(other)))) if len(other) == 1 else repr(tuple(sorted(other))),
        )
        if not self._warned_tags:  # once per wrapped function
            self._warned_tags = True
            warnings.warn(note, stacklevel=user_stacklevel())
        return [note]

    def traced(self, *args, **kwargs):
        """Under a trace (a program that calls this one): `run`'s result, traced in
        place instead of as a nested program (non-array leaves are constants of the
        trace). XLA inlines a nested program anyway, and its outputs would be new
        values to the caller's trace, which could no longer see a probe that is one of
        its inputs or one of its other results (`_program.shared`)."""
        return self._traced(*args, **kwargs)

    @_compat.api_boundary  # a bad input's traceback ends at the user's call
    def __call__(self, *args, **kwargs):
        """Run `fn`; return `(result, intermediates)` (summaries on the host if summarising)."""
        result, inter = self.run(*args, **kwargs)
        if isinstance(inter, Packed):
            inter = nest(*inter.unpack())
        return result, inter

    @_compat.api_boundary  # a bad input's traceback ends at the user's call
    def run(self, *args, **kwargs):
        """Like calling, but summaries stay packed on the device (`Packed`): start their
        transfer with `.fetch_async()` and read them with `.unpack()` when needed."""
        with gc_paused():  # a first call traces, lowers and compiles
            if self._static_seen or _holds_equinox_module(args, kwargs):
                # Arguments with non-array leaves were seen (a function, a string): go
                # straight to the static path, which handles all-array arguments too.
                # Trying `jax.jit` first would cost a failed dispatch and a filtered
                # traceback (~10 ms) on every call. An Equinox module goes there even
                # when every leaf is a JAX type: `jax.jit` would trace its Python
                # numbers (`Dropout.p`, `.inference`), which its code uses as constants.
                return self._call_with_static(args, kwargs)
            self._local.entered = False
            try:
                return self._jitted(*args, **kwargs)
            except TypeError:
                if getattr(self._local, "entered", True):
                    raise
            self._static_seen = True
            return self._call_with_static(args, kwargs)

    def _call_with_static(self, args, kwargs):
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        static = tuple((i, leaf) for i, leaf in enumerate(leaves) if not _is_dynamic(leaf))
        key = (treedef, static)
        try:
            hash(key)
        except TypeError:
            raise TypeError(_unhashable_message(args, kwargs)) from None
        fn = self._static_cache.get(key)
        if fn is None:
            fn = self._static_cache[key] = jax.jit(self._with_static(treedef, static, len(leaves)))
        positions = {i for i, _ in static}
        return fn(*(leaf for i, leaf in enumerate(leaves) if i not in positions))

    def _with_static(self, treedef, static, n: int):
        """`_traced` on the dynamic leaves only, the static ones closed over."""
        fixed = dict(static)

        def call(*dyn):
            it = iter(dyn)
            merged = [fixed[i] if i in fixed else next(it) for i in range(n)]
            a, k = jax.tree_util.tree_unflatten(treedef, merged)
            return self._traced(*a, **k)

        return call


OTHER_TAGS = (
    "sowviz.save_intermediates: no sow has the tag {want!r}, so nothing was captured; "
    "`fn` sows under other tags ({sown}). Collect them with "
    "`save_intermediates(fn, tag={fix})` (a tuple collects several tags)."
)


NOT_REACHED = (
    "sowviz.save_intermediates: sow {name!r} was called while tracing `fn` but never "
    "reached the program: a custom_jvp/custom_vjp rule replaced the code around it (the "
    "rule does not call the function), so nothing was captured there. Sow the custom "
    "function's output instead."
)


INSIDE_TESSERACT = (
    "sowviz.save_intermediates: `{how}({name!r})` is inside Tesseract `{label}`, which "
    "runs outside the traced program (tesseract-jax calls it through a host callback; "
    "its `apply_jit` is traced only to find its output shapes), so nothing was captured "
    "there, by `sowviz.sow` or `tesseract_jax.sow` alike. Sow the Tesseract's outputs in "
    "your program instead: `out = sowviz.sow(apply_tesseract(...), 'out')`."
)


READ_BEFORE_SOW = (
    "sowviz.save_intermediates: the cotangent of sow {name!r}{where} is all zeros because "
    "the program read the value before sowing it: the gradient flows through those "
    "earlier reads, which bypass the sow, and nothing after it reads the value. If those "
    "reads reach the loss, this is no gradient of the value. Sow it where it is made, "
    "before any use: `h = sowviz.sow(h, {name!r})`."
)


def read_before_sown(jaxpr: Any, tags: frozenset[str]) -> list[str]:
    """A note (and a warning) per sow whose cotangent is a symbolic zero, all leaves, and
    whose value the program read before the sow (`primitive.READ_BEFORE_SOWN`): the
    zeros it records are not the value's gradient. A value sown for the record only
    (`sow(jnp.linalg.norm(w), "wnorm")`, read by nothing else) truly has a zero
    gradient and gets none."""
    notes: dict[int, str] = {}
    for eqn in sow_eqns(jaxpr, tags):
        p = eqn.params
        if (
            eqn.primitive is not sow_p
            or p["index"] not in READ_BEFORE_SOWN
            or p["index"] in notes
            or eqn.invars  # (some leaf has a cotangent)
            or p["mode"][-1:] != ("C",)
            or any(untangent for *_, untangent in p["zeros"])
        ):
            continue
        loc = sow_location(eqn)
        where = f" ({loc.file}:{loc.line})" if loc is not None else ""
        notes[p["index"]] = READ_BEFORE_SOW.format(name=p["name"], where=where)
    for note in notes.values():
        warnings.warn(note, stacklevel=user_stacklevel())
    return list(notes.values())


def _python_number_as_array(x: Any) -> Any:
    return jnp.asarray(x) if isinstance(x, (bool, int, float, complex)) else x


NOT_A_JAX_OUTPUT = (
    "sowviz.save_intermediates: `fn` returned `output{path}`, a {kind}, which is not a "
    "JAX value; a compiled program returns arrays only. Return the arrays alone (for an "
    "Equinox model: `eqx.filter(model, eqx.is_array)`), or use `sowviz.inspect`, `show` "
    "or `Monitor`, which hand such leaves back as `eqx.filter_jit` does."
)

UNHASHABLE = (
    "sowviz.save_intermediates: the argument leaf `{path}` is a {kind}, which is neither "
    "an array (so it cannot be traced) nor hashable (so it cannot be a static value "
    "that keys the compile cache). Make it static and hashable (a tuple instead of a "
    "list-like object, an `eqx.field(static=True)`), close over it with "
    "functools.partial, or pass only the arrays: `params, static = "
    "eqx.partition(model, eqx.is_array)`."
)


def _unhashable_message(args, kwargs) -> str:
    """UNHASHABLE for the first leaf of (args, kwargs) that is neither array nor hashable."""
    for root, tree in (("args", args), ("kwargs", kwargs)):
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            if not _is_dynamic(leaf) and not _hashable(leaf):
                return UNHASHABLE.format(
                    path=root + jax.tree_util.keystr(path), kind=type(leaf).__name__
                )
    return UNHASHABLE.format(path="(unknown)", kind="value")


def _summarize_entries(
    inter: dict,
    options,
    depth: int,
    axes: dict | None = None,
    defer: bool = False,
    once: bool = False,
    apart: bool = False,
) -> Packed:
    """Pack summaries of the mode entries of every name, with meta kept raw.

    `inter` nests `depth` levels of dicts above the entries (`{name: entry}` is 1,
    `{tag: {name: entry}}` is 2); `nest(*packed.unpack())` rebuilds it."""
    entries: dict = {}

    def walk(d: dict, path: tuple) -> None:
        for k, v in d.items():
            if len(path) + 1 < depth:
                walk(v, (*path, k))
            else:
                entries[(*path, k)] = v

    walk(inter, ())
    values = {p: {k: v for k, v in e.items() if k not in META_KEYS} for p, e in entries.items()}
    meta = {p: {k: v for k, v in e.items() if k in META_KEYS} for p, e in entries.items()}
    return summarize_packed(values, meta, options.bins, axes or {}, defer, once, apart)


def nest(summaries: dict, meta: dict) -> dict:
    """Flat `{path: entry}` (from `_summarize_entries`) back to the nested result."""
    out: dict = {}
    for p, e in summaries.items():
        d = out
        for k in p[:-1]:
            d = d.setdefault(k, {})
        d[p[-1]] = {**e, **meta[p]}
    return out


def _hashable(v) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def _summary_options(summarize):
    if summarize is None or summarize is False:
        return None
    from ..summary import SummaryOptions

    if summarize is True:
        return SummaryOptions()
    if isinstance(summarize, SummaryOptions):
        return summarize
    if isinstance(summarize, int) and not isinstance(summarize, bool):
        try:
            return SummaryOptions(bins=summarize)
        except ValueError:  # its message names `bins`, which the caller never wrote
            from ..summary import MAX_BINS

            raise ValueError(
                f"sowviz.save_intermediates: `summarize={summarize!r}` asks for "
                f"{summarize} histogram bins; a number of bins is from 1 to {MAX_BINS}. "
                "Pass summarize=True (64 bins), a number such as summarize=32, or "
                "sowviz.SummaryOptions(...); None or False for no summaries."
            ) from None
    raise TypeError(
        f"sowviz.save_intermediates: `summarize` must be True, a number of bins or "
        f"sowviz.SummaryOptions(...), got {summarize!r}."
    )


# "Duplicate sow name" is tesseract-jax's phrase for this error: code written
# against its save_intermediates that matches on it keeps working.
DUPLICATE = (
    "sowviz: Duplicate sow name {name!r} (sown more than once), so its values would "
    "overwrite each other:\n  first at {a}\n  again at {b}\n"
    "Give each `sow` a unique name, or pass duplicates='suffix' (name_0, name_1, ...) or "
    "duplicates='stack' (stack like-shaped values along a new leading axis)."
)


LINE_LOST = "the `sow` (its line unknown: a library traced its function, keeping no frame of yours)"
DUPLICATE_ONE_LINE = (
    "sowviz: Duplicate sow name {name!r} (sown more than once): {where} ran in {calls} "
    "separate calls of the function holding it, so its values "
    "would overwrite each other. Your code calls that function more than once, or a "
    "library does (diffrax calls a vector field in each stage of a solver step, for the "
    "initial step size, and again in an adjoint's backward solve; optimistix calls a "
    "residual for the solve and again for its derivatives). Pass duplicates='suffix' to "
    "keep each call ({name}_0, {name}_1, ... in program order), duplicates='stack' to "
    "stack like-shaped values along a new leading axis, or give each call a name of "
    "its own."
)


def assemble(
    captures: list[Capture],
    duplicates: str,
    axes: dict | None = None,
    prefix: tuple = (),
    notes: list[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Captures → `{name: {mode: value pytree, "iterations"/"taken": meta}}`.

    With `axes`, also records `axes[(*prefix, name)] = {mode: Site.axes}` (the
    leading axes enclosing constructs added) for names that keep them. Values left
    out (`_foreign_calls`) are said in `notes`, and warned about."""
    notes = [] if notes is None else notes
    by_name: dict[str, list[Capture]] = {}
    for c in rows_in_order(captures):  # (a `lax.map` with `batch_size`: one row per element)
        by_name.setdefault(c.site.name, []).append(c)
    taken = set(by_name)  # suffixed names never take a name the program uses itself
    out: dict[str, dict[str, Any]] = {}
    for name, caps in by_name.items():
        caps = _first_evaluations(caps, notes)
        calls = sorted({c.site.call for c in caps})
        modes = {}
        for c in caps:
            modes.setdefault(c.site.mode, []).append(c)
        repeated = len(calls) > 1 or any(len(v) > 1 for v in modes.values())
        if not repeated:
            out[name] = _entry(caps)
            if axes is not None:
                axes[(*prefix, name)] = {c.site.mode: c.site.axes for c in caps}
        elif duplicates == "error":
            group = next((v for v in modes.values() if len(v) > 1), None)
            if group is None:
                group = [next(c for c in caps if c.site.call == k) for k in calls[:2]]
            raise ValueError(_duplicate_message(name, group[0].site, group[1].site, len(calls)))
        elif duplicates == "suffix":
            numbers = _free_suffixes(name, taken)
            for group in _by_call(caps, notes):
                key = next(numbers)
                taken.add(key)
                out[key] = _entry(group)
                if axes is not None:
                    axes[(*prefix, key)] = {c.site.mode: c.site.axes for c in group}
        else:
            out[name] = _stacked([_entry(g) for g in _by_call(caps, notes)], name)
    return out


def _duplicate_message(name: str, a: Site, b: Site, calls: int) -> str:
    """DUPLICATE, or DUPLICATE_ONE_LINE when both calls come from one line of code, or
    from lines a library's trace lost (`interpret.sow_location`)."""
    if a.location != b.location:
        return DUPLICATE.format(
            name=name, a=a.location or "unknown location", b=b.location or "unknown location"
        )
    where = f"the `sow` reached from {a.location}" if a.location is not None else LINE_LOST
    return DUPLICATE_ONE_LINE.format(name=name, where=where, calls=calls)


def _first_evaluations(caps: list[Capture], notes: list[str]) -> list[Capture]:
    """`caps` with one capture per `sow` call and key, all of one evaluation. A call
    captured again is one traced `sow` that a library evaluates again (a custom
    derivative rule re-running the function for its derivatives: optimistix's implicit
    adjoint at the solution, the adjoint solve of `jax.experimental.ode.odeint`), not a
    second call, so no duplicate name either. Its primal and derivatives are kept from
    one evaluation (`Site.evaluation`, `_evaluation_kept`), the first in program order
    within it; a cotangent is never paired with another evaluation's primal. Said in
    `notes` for the user's own sows."""
    groups: dict[int, dict[int, list[Capture]]] = {}
    for c in caps:
        if c.site.call >= 0:  # tesseract_jax.sow's calls have no number
            groups.setdefault(c.site.call, {}).setdefault(c.site.evaluation, []).append(c)
    chosen = {call: _evaluation_kept(by_eval) for call, by_eval in groups.items()}
    kept: list[Capture] = []
    seen: set[tuple[int, str]] = set()
    again = 0
    for c in caps:
        key = (c.site.call, c.site.mode)
        if c.site.call >= 0 and (key in seen or c.site.evaluation != chosen[c.site.call]):
            again += 1
            continue
        seen.add(key)
        kept.append(c)
    site = caps[0].site
    if again and not site.tag.startswith(RESERVED_TAG_PREFIX):
        later = any(next(iter(groups[k])) != e for k, e in chosen.items())
        note = (DIFFERENTIATED_AGAIN if later else EVALUATED_AGAIN).format(
            name=site.name, where=site.location or "unknown location", n=again
        )
        if note not in notes:
            notes.append(note)
    return kept


def _evaluation_kept(by_eval: dict[int, list[Capture]]) -> int:
    """The evaluation of one `sow` call whose values its name holds: the first in
    program order with a cotangent (a gradient reached the value there), else the
    first. A library's backward rule can evaluate the function again to differentiate
    it (`odeint`'s adjoint solve), where the forward pass's evaluations have no
    cotangent: its primal values are then that evaluation's, the cotangent's own."""
    with_cotangent = [
        e for e, caps in by_eval.items() if any("cotangent" in c.site.mode for c in caps)
    ]
    return with_cotangent[0] if with_cotangent else next(iter(by_eval))


EVALUATED_AGAIN = (
    "sowviz: the sow {name!r} (from {where}) was evaluated {n} more time(s) after its "
    "first evaluation, by one traced call: a library ran the function holding it again "
    "(optimistix's implicit adjoint at the solution, an implicit solver for its "
    "Jacobian). Those re-evaluations are left out: {name!r} holds the first one's "
    "values, the forward pass's, and their derivatives."
)

DIFFERENTIATED_AGAIN = (
    "sowviz: the sow {name!r} (from {where}) was evaluated more than once by one traced "
    "call: a library ran the function holding it again to differentiate it (a custom "
    "derivative rule: the adjoint solve of `jax.experimental.ode.odeint`, optimistix's "
    "implicit adjoint at the solution). Its cotangent exists only there, so {name!r} "
    "holds that evaluation: primal values where the library evaluated the function for "
    "the derivatives (not the forward pass's), and their cotangents. The forward "
    "pass's evaluations, which have no cotangent, and any other re-evaluations ({n} "
    "captured value(s)) are left out. To see the forward pass's values, capture "
    "without differentiating."
)


def _free_suffixes(name: str, taken: set[str]) -> Iterator[str]:
    """`name_0`, `name_1`, ... in order, skipping names already taken."""
    for i in itertools.count():
        if f"{name}_{i}" not in taken:
            yield f"{name}_{i}"


def _by_call(caps: list[Capture], notes: list[str]) -> list[list[Capture]]:
    """Group captures into one group per `sow` call, in program order."""
    groups: dict[int, list[Capture]] = {}
    foreign: dict[str, list[Capture]] = {}
    for c in caps:
        if c.site.call >= 0:
            groups.setdefault(c.site.call, []).append(c)
        else:
            foreign.setdefault(c.site.mode, []).append(c)
    return [groups[k] for k in sorted(groups)] + _foreign_calls(foreign, notes)


FOREIGN_UNPAIRED = (
    "sowviz: `tesseract_jax.sow` was called {calls} times with the name {name!r}, "
    "and only {n} of those calls sowed a {mode} (a call whose value does not reach "
    "the output has none). Its sows carry no call number, so which calls those are "
    "is unknown, and the {mode}s of {name!r} were left out. Give each call a name of "
    "its own, or use `sowviz.sow`, whose calls stay distinct."
)


def _foreign_calls(by_mode: dict[str, list[Capture]], notes: list[str]) -> list[list[Capture]]:
    """`tesseract_jax.sow`'s captures of one name, one group per call.

    Its sows have no call number, so the n-th capture of each mode is call n. A
    gradient's program runs backwards, so its cotangents come in reverse order. A
    mode sown by fewer calls than the primal cannot be paired, and is left out."""
    if not by_mode:
        return []
    calls = max(len(caps) for caps in by_mode.values())
    ordered = []
    for mode, caps in by_mode.items():
        if len(caps) == calls:
            ordered.append(caps[::-1] if mode == "cotangent" else caps)
            continue
        note = FOREIGN_UNPAIRED.format(calls=calls, name=caps[0].site.name, n=len(caps), mode=mode)
        notes.append(note)
        warnings.warn(note, stacklevel=user_stacklevel())
    return [list(call) for call in zip(*ordered, strict=True)]


def _entry(caps: list[Capture]) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    for c in caps:
        site = c.site
        n = site.treedef.num_leaves
        full: list[Any] = [None] * n
        for i, v in zip(site.leaves, c.values, strict=True):
            full[i] = v
        entry[site.mode] = jax.tree_util.tree_unflatten(site.treedef, full)
        for k, v in c.meta.items():
            entry.setdefault(k, v)
    return entry


def _stacked(entries: list[dict[str, Any]], name: str) -> dict[str, Any]:
    keys = [k for k in entries[0] if all(k in e for e in entries)]
    out = {}
    for k in keys:
        try:
            out[k] = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *(e[k] for e in entries))
        except (ValueError, TypeError) as err:
            raise ValueError(
                f"sowviz: duplicates='stack' cannot stack the values sown as {name!r} "
                f"({k}): they differ in structure or shape ({err}). Use duplicates='suffix'."
            ) from None
    return out
