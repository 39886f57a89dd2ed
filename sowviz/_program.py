"""Compile once, reuse everywhere: the program cache behind `inspect`, `show`, `Monitor`.

Arguments are split as `equinox.filter_jit` splits them: array leaves
(`jax.Array`, NumPy arrays and scalars) are traced; every other leaf (functions,
strings, Python numbers, Equinox module fields) is static. The static part and
the tree structure form an `ArgSpec`, passed to `jax.jit` as a static argument,
so `jax.jit`'s own cache keys on exactly what it keys on for `jit` (tree
structure, shapes, dtypes, weak types, shardings) plus the static leaves.

The user's `fn` is traced (`Traced`: jaxpr, stage graph, probe points) once
per argument spec and shapes, inside the first `jax.jit` trace that needs it;
the graph is shared by every mode (`Runner`, one per mode and options) and by
the plain program a Monitor runs on unrecorded steps. Each compiled program
returns an `Out` whose static aux data carries its `Traced`, so the host
learns which graph a result belongs to without a lookup. The summaries of small
arrays run in a second program shared by every program with like sizes
(`capture.summaries.finish`): `Runner.run` dispatches both.

Bounded: per function, 16 argument specs and 8 option sets (LRU); 32 functions,
held through weak references where Python allows (a function that is deleted
drops its programs). For reuse across sessions, enable JAX's persistent
compilation cache: `jax.config.update("jax_compilation_cache_dir", "/path")`. The
shared summary program is kept on disk by sowviz itself (`sowviz._disk_cache`).
"""

from __future__ import annotations

import collections
import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _compat, _concat, _outputs, _state
from . import summary_ops as _ops
from ._args import (
    CLOSED_TRACER,
    TRACED_NUMBERS,
    ArgSpec,
    _is_float,
    _layout,
    _paths,
    _user_tangents,
    module_tangents,
    positional_names,
    split,
    traced_numbers,
)
from ._forwarding import forwarded_inputs
from ._gc import gc_paused
from ._liveness import live_values
from ._model import Mode
from ._runtime_errors import trace_error
from .capture import summaries as _summaries
from .capture.api import SaveIntermediates
from .capture.tallied import Tallied, TalliedRows
from .graph import build_graph, instrument
from .graph.inputs import placed_inputs
from .modes import (
    check_argnums,
    forward_error,
    leaked_trace_error,
    refused_tangent,
    refused_tangent_error,
    tangent_inputs,
    tesseract_endpoint_error,
    transform,
    with_aux,
    with_output_leaves,
)
from .options import InspectOptions
from .summary import Summary, SummaryOptions, all_clean

PROBE_TAG = "sowviz.stage"
_MAX_FAMILIES, _MAX_TRACED, _MAX_RUNNERS = 32, 16, 8


_NO_ARGUMENTS = (
    "sowviz.{where}: `fn` was called with no arguments, so mode 'grad' has nothing to "
    "differentiate (`jax.grad` refuses it too: it differentiates with respect to "
    "argument 0). Pass the parameters as arguments, `sowviz.{where}(loss, params)` "
    "with `def loss(params): ...`, or use mode='primal' to look at the values alone."
)


_STAGED = (
    "sowviz.{where} was called while JAX traces a function (inside `jax.jit`, `vmap`, "
    "`grad`, a `lax.scan` body or another transformation): sowviz compiles and runs a "
    "program of its own and reads its statistics back, which a trace cannot do (the "
    "call would be staged into it). Call it outside the transformation; where you must "
    "call it inside one on concrete values, wrap the call in "
    "`with jax.ensure_compile_time_eval():`."
)


def check_has_arguments(mode: Mode, args: tuple, where: str) -> None:
    """Mode grad needs an argument to differentiate (modes jvp, vjp and all take a
    function of none, as `jax.jvp(f, (), ())` and `jax.vjp(f)` do)."""
    if not args and mode is Mode.GRAD:
        raise TypeError(_NO_ARGUMENTS.format(where=where))


def split_for(options: InspectOptions, args: tuple, where: str) -> tuple[ArgSpec, list]:
    """`split`, with the arguments that are Python floats and differentiated traced
    (`traced_numbers`: `jax.grad(f)(3.0)` traces its 3.0)."""
    return split(args, where, traced_numbers(options.mode, options.argnums, args))


def selected_args(argnums: Any, args: tuple) -> tuple[int, ...] | None:
    """The positions `argnums` selects (None: not given, every argument)."""
    return None if argnums is None else check_argnums(argnums, len(args))


def _named(fn: Callable) -> Callable:
    """`fn` pushing Flax NNX / Equinox module paths into the name stack while traced
    (graph/frameworks.py, when present)."""
    try:
        from .graph.frameworks import named
    except ImportError:
        return fn
    return named(fn)


def _arg_names(fn: Callable, args: tuple, paths: list[str]) -> list[str]:
    """Per leaf: `params['w']` from the function's parameter names."""
    names = positional_names(fn)
    out = []
    for i, arg in enumerate(args):
        base = names[i] if i < len(names) else f"arg{i}"
        out += [base + p for p in _paths(arg)] if jax.tree_util.tree_leaves(arg) else []
    return out or paths


_AUX_PAIR = (
    "sowviz: `has_aux=True`, so `fn` must return a pair `(output, aux)`, as for "
    "`jax.value_and_grad(fn, has_aux=True)`; it returned {what}. Return "
    "`(loss, aux)`, or leave `has_aux` out."
)


def _aux_pair(out: Any) -> tuple[Any, Any]:
    """`fn`'s `(output, aux)`, or a TypeError saying what `has_aux` expects."""
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        what = f"a {type(out).__name__}" + (
            f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""
        )
        raise TypeError(_AUX_PAIR.format(what=what))
    return out[0], out[1]


def _title(fn: Callable) -> str:
    """`fn`'s name; a `functools.partial` of a named function (a step with its static
    arguments bound) by that function's, as `partial(step)`; a callable instance (a
    class with `__call__`, an Equinox or Flax NNX module) by its class, as `Loss`, or
    by the function it wraps (`__wrapped__`: Equinox's `filter_jit` of a function; what
    `checkify.checkify` wraps, not its `checked_fun`)."""
    checked = _compat.checkify_wrapped(fn)
    if checked is not None:
        return _title(checked)
    name = getattr(fn, "__name__", None)
    if isinstance(name, str) and name:
        return name
    inner = getattr(fn, "func", None)
    if isinstance(fn, functools.partial) and inner is not None:
        base = _title(inner)
        return f"partial({base})" if base != "program" else base
    wrapped = getattr(fn, "__wrapped__", None)
    if wrapped is not None and wrapped is not fn and callable(wrapped):
        return _title(wrapped)
    return type(fn).__name__ if callable(fn) else "program"


PYTHON_NUMBER = (
    "{listed} {kind} inside a differentiated argument: sowviz keeps Python numbers in a "
    "pytree static, as `equinox.filter_jit` does, so {its} gradient is None and no "
    "tangent flows into {its} (`jax.grad` would differentiate it). To differentiate it, "
    "pass an array: `jnp.asarray({value!r})`."
)


def _arg_at(layout: Any, k: int) -> int:
    """The positional argument holding leaf `k` (among all the arguments' leaves)."""
    return next(
        (i for i in range(layout.n_args) if k < layout.offsets[i] + layout.arg_trees[i].num_leaves),
        layout.n_args - 1,
    )


class Traced:
    """`fn` traced once at one argument spec and shapes: jaxpr, stage graph, probes."""

    def __init__(self, fn: Callable, options: InspectOptions, spec: ArgSpec, args: tuple):
        self.spec = spec
        _, dyn = split_for(options, args, "inspect")
        paths = _paths(args)
        constant = _state.constant_leaves(args)
        self.layout = _layout(spec, dyn, paths, constant, selected_args(options.argnums, args))
        self.trace_count = 0
        self.has_aux = options.has_aux

        named = _named(fn)
        #: Leaves of the arguments (`tree_leaves` positions) that `fn` assigns in place
        #: (`_state`): their new values leave the program beside its result.
        self.state: tuple[int, ...] = ()
        #: Paths of leaves `fn` added to its arguments (`Module.sow`): never written back.
        self.state_added: tuple[str, ...] = ()
        #: `fn`'s output leaves that are not JAX values (`_outputs`), put back on the host;
        #: `aux_static` those of its `aux` (`has_aux`).
        self.out_static = self.aux_static = _outputs.StaticLeaves()

        def flat_fn(*flat):
            self.trace_count += 1
            merged = spec.merge(flat)
            before = _state.leaves(merged)
            out, aux = _aux_pair(named(*merged)) if options.has_aux else (named(*merged), None)
            out, self.out_static = _outputs.strip(_outputs.number_as_array(out))
            aux, self.aux_static = _outputs.strip(aux)
            self.state, self.state_added, new = _state.compare(before, merged)
            return out, (new, aux)

        _compat.name_trace_after(flat_fn, fn)  # a leaked tracer's error names `fn`
        avals = [
            jax.ShapeDtypeStruct(
                jnp.shape(x),
                jnp.result_type(x),
                weak_type=bool(getattr(jax.typeof(x), "weak_type", False)),  # 3.0 too
                sharding=_compat.explicit_sharding(x),
            )
            for x in dyn
        ]

        def dyn_names() -> list[str]:
            names = _arg_names(fn, args, paths)
            return [names[i] for i in spec.dynamic]

        with (
            _compat.capture_tracing(),
            _compat.recording_foreign_sow_treedefs(),  # `tesseract_jax.sow`'s tree
            _compat.recording_named_calls(),  # where `jax.named_call`s were called
            _compat.recording_vmap_params() as vmapped,  # `jax.vmap(loss)`'s ports
            _compat.traced_as(flat_fn, fn, dyn_names),
        ):
            self.closed, (out_shape, extra_shape) = jax.make_jaxpr(flat_fn, return_shape=True)(
                *avals
            )
        leaked = _compat.closed_over_tracer(self.closed)
        if leaked is not None:  # (the compiled program would refuse it, in JAX's words)
            raise TypeError(CLOSED_TRACER.format(kind=type(leaked).__name__))
        #: `fn` makes or writes a mutable array (`modes.transform` differentiates it so)
        self.refs = _compat.has_refs(self.closed)
        if self.state:
            extra_shape = self._drop_unchanged(spec, out_shape, extra_shape)
        self.out_tree = jax.tree_util.tree_structure((out_shape, extra_shape))
        names = _arg_names(fn, args, paths)
        #: `(argument, name, value)` of each Python float or complex leaf kept static
        #: inside an argument (`{"log_scale": 0.5}`): no input, so no gradient
        #: (`python_number_note`)
        self.static_numbers = tuple(
            (_arg_at(self.layout, k), names[k], v)
            for k, v in self.layout.static
            if type(v) in TRACED_NUMBERS and k < len(names)
        )
        title = options.title or _title(fn)
        tn = options.tesseract_names
        state_inputs = [j for j, leaf in enumerate(spec.dynamic) if leaf in constant]
        # (negative argnums count from the end, as `jax.grad`'s)
        parted = {
            a
            for j in state_inputs
            for a in (self.layout.arg_of[j], self.layout.arg_of[j] - len(args))
        }
        drawn = {a % len(args) for a in options.drawn_parameters(parted)} if args else set()
        # (each leaf's NNX variable type: a LoRA model's frozen `Param` and trained
        # `LoRAParam` read alike in the parameters' table)
        held = [None if v is None else type(v).__name__ for v in _state.holders(args)]
        # inputs drawn as their arguments lie: on an Auto mesh no type says it; a host
        # array lies where a jit `fn` places it (its `in_shardings`)
        by_jit = _compat.jit_input_placements(self.closed)
        placed = [_compat.placement_axes(x) for x in dyn]
        with placed_inputs(
            [a if a is not None else j for a, j in zip(placed, by_jit, strict=True)]
        ):
            self.graph = build_graph(
                self.closed,
                in_names=[names[i] for i in spec.dynamic],
                out_names=["output" + p for p in _paths(out_shape)]
                + [_state.new_value_label(names[k]) for k in self.state]
                + ["aux" + p for p in _paths(extra_shape[1])],
                capture=options.capture,
                title=title,
                tesseract_names=dict(tn) if isinstance(tn, tuple) else tn,
                in_args=self.layout.arg_of,  # inputs grouped per argument; these are "parameters":
                parameters=drawn,
                state_inputs=state_inputs,
                calls=getattr(named, "sowviz_calls", None) if named is not fn else None,
                in_types=[held[i] for i in spec.dynamic],
                vmapped=vmapped,
            )
        #: the names of the sows sowviz's NumPyro hooks made (`numpyro_sites.own_sows`):
        #: the checks of a user's `sow` say nothing of them (`inspection.join_probes`)
        self.own_sows: frozenset[str] = getattr(named, "sowviz_own_sows", frozenset())
        #: the instrumented program, per kind ("forward": every value in the data flow;
        #: "reverse": dead values beside it, `probed_for`; "reverse" and "all" also sow
        #: the graph's `operand_points`), rewritten when first needed
        self._instrumented: dict[str, Callable[..., list]] = {}
        self.n_out = len(jax.tree_util.tree_leaves(out_shape))

    def python_number_note(self, mode: Any, argnums: Any) -> str | None:
        """A note naming the Python numbers inside the arguments `mode` differentiates
        (argument 0 in grad by default, every argument in jvp, vjp and all): static,
        as documented, so their gradient is None where `jax.grad` gives one."""
        mode = Mode(mode)
        if mode is Mode.PRIMAL or not self.static_numbers:
            return None
        n = self.layout.n_args
        chosen = (0 if mode is Mode.GRAD else None) if argnums is None else argnums
        nums = None if chosen is None else set(check_argnums(chosen, n))
        found = [(name, v) for i, name, v in self.static_numbers if nums is None or i in nums]
        if not found:
            return None
        listed = ", ".join(f"`{name}`" for name, _ in found[:4]) + (
            ", ..." if len(found) > 4 else ""
        )
        one = len(found) == 1
        return PYTHON_NUMBER.format(
            listed=listed,
            kind="is a Python number" if one else "are Python numbers",
            its="its" if one else "their",
            value=found[0][1],
        )

    def _drop_unchanged(self, spec: ArgSpec, out_shape: Any, extra_shape: Any) -> Any:
        """Leave out of `state` (and of the program's outputs) the leaves `fn` returned
        as they came in: an NNX transform (`nnx.jit`, `nnx.cond`) hands every variable
        back as a new value, so identity alone said "changed" (`_forwarding`)."""
        new, aux = extra_shape
        first = len(jax.tree_util.tree_leaves(out_shape))
        forwarded = forwarded_inputs(self.closed)
        dynamic = {leaf: j for j, leaf in enumerate(spec.dynamic)}
        keep = [  # a leaf that came in static (a Python number) cannot be forwarded
            dynamic.get(leaf) is None or forwarded[first + k] != dynamic[leaf]
            for k, leaf in enumerate(self.state)
        ]
        if all(keep):
            return extra_shape
        outvars = list(_compat.jaxpr_and_consts(self.closed)[0].outvars)
        dropped = {first + k for k, kept in enumerate(keep) if not kept}
        self.closed = _compat.with_outputs(
            self.closed, [v for k, v in enumerate(outvars) if k not in dropped]
        )
        self.state = tuple(leaf for leaf, kept in zip(self.state, keep, strict=True) if kept)
        return tuple(x for x, kept in zip(new, keep, strict=True) if kept), aux

    @functools.cached_property
    def low_precision(self) -> bool:
        """`fn` computes in a float narrower than float32 somewhere (bfloat16, float16,
        float8): its instrumented program's results may then differ from the plain
        program's at rounding level (XLA keeps excess precision inside a fusion, and
        the probes fuse it otherwise). A Monitor's recorded step runs both then."""
        return _compat.computes_in_low_precision(self.closed)

    def plain(self, dyn: list) -> Any:
        """`fn`'s output and `(its arguments' new state (`state`'s values), its aux)`."""
        return self._outputs(_compat.eval_jaxpr(self.closed.jaxpr, self.closed.consts, *dyn))

    def probed(self, dyn: list) -> Any:
        """`plain` with every probe point tagged."""
        return self._outputs(self._rewritten("forward")(*dyn))

    def _rewritten(self, kind: str) -> Callable[..., list]:
        found = self._instrumented.get(kind)
        if found is None:  # two threads may both build it: the same program either way
            live = self.live if kind == "reverse" else None
            points = self.graph.probe_points
            if kind != "forward":  # (a Tesseract's VJP per input field: with cotangents)
                points = (*points, *self.graph.operand_points)
            found = instrument(self.closed, points, tag=PROBE_TAG, detached=live)
            self._instrumented[kind] = found
        return found

    @functools.cached_property
    def live(self) -> dict | None:
        """Per sub-program path, the values that reach `fn`'s output (`_liveness`): the
        probes of the others are sown beside the data flow in grad and vjp modes, and
        their panels say so (`inspection.no_cotangent_reasons`)."""
        n_outs = len(self.closed.out_avals)
        return live_values(self.closed, [k < self.n_out for k in range(n_outs)])

    def probed_for(self, mode: Mode | str) -> Callable[[list], Any]:
        """`probed` for a program of `mode`. In grad and vjp modes the values that do not
        reach `fn`'s output are probed beside the data flow, their primal only
        (`_liveness`): their cotangent is zero, and keeping their tangent alive hands
        a symbolic-zero cotangent to rules that plain JAX never gives one. In grad, vjp
        and all modes a Tesseract's input fields are probed too (`operand_points`)."""
        if Mode(mode) is Mode.ALL:  # (every value in the data flow, as `probed`)
            linear = self._rewritten("all")
            return lambda dyn: self._outputs(linear(*dyn))
        if Mode(mode) not in (Mode.GRAD, Mode.VJP):
            return self.probed
        probed = self._rewritten("reverse")
        return lambda dyn: self._outputs(probed(*dyn))

    def _outputs(self, outs: list) -> Any:
        # An output the program makes as a constant (Equinox BatchNorm's
        # `jnp.array(False)` in its new state) is a jaxpr literal, which evaluates to
        # a Python scalar: an array again, as `jax.jit` returns it.
        outs = [
            jnp.asarray(o, aval.dtype) if _outputs.not_jax(o) else o
            for o, aval in zip(outs, self.closed.out_avals, strict=True)
        ]
        return jax.tree_util.tree_unflatten(self.out_tree, outs)


@jax.tree_util.register_pytree_node_class
class Out:
    """A compiled program's output: the mode's result, the packed summaries (None for
    the plain program), an all-finite flag of the results, `clean` (no probe counts
    a NaN/Inf; None for the plain program) and `state`, the new values of the argument
    leaves `fn` assigns in place (`Traced.state`); its `Traced` rides as static aux."""

    #: The call's arguments as `Runner.run` split them, `(ArgSpec, array leaves)`, set on
    #: its result (None otherwise): `spec.merge(leaves)` rebuilds them as the program got
    #: them, even after the caller changed its objects in place (a Flax NNX model
    #: updated by `nnx.Optimizer.update`), at no cost per call (`Monitor`'s re-run).
    split: tuple[Any, list] | None = None

    def __init__(
        self,
        result: Any,
        packed: Any,
        finite: Any,
        clean: Any,
        traced: Traced,
        notes: tuple,
        chain: Any = None,
        state: tuple = (),
        aux: Any = None,
    ):
        self.result, self.packed, self.finite, self.clean = result, packed, finite, clean
        self.traced, self.notes = traced, notes
        # The plain program's running flag (`chain_flags`), when given one.
        self.chain = chain
        self.state = state
        # `fn`'s aux output (`has_aux`), None without it.
        self.aux = aux

    def tree_flatten(self):
        children = (self.result, self.packed, self.finite, self.clean, self.chain, self.state)
        return (*children, self.aux), (self.traced, self.notes)

    @classmethod
    def tree_unflatten(cls, static, children):
        result, packed, finite, clean, chain, state, aux = children
        return cls(result, packed, finite, clean, *static, chain=chain, state=state, aux=aux)

    def user_result(self, mode: Any) -> Any:
        """The result as the caller gets it: with `has_aux`, `aux` placed as JAX's
        `has_aux` transforms place it (`modes.with_aux`)."""
        return self.result if not self.traced.has_aux else with_aux(mode, self.result, self.aux)


@jax.tree_util.register_pytree_node_class
class Shared:
    """A program's output tree without its repeated leaves (`shared`)."""

    def __init__(self, leaves: list, treedef: Any, aliases: tuple):
        self.leaves, self.treedef, self.aliases = leaves, treedef, aliases

    def tree_flatten(self):
        return self.leaves, (self.treedef, self.aliases)

    @classmethod
    def tree_unflatten(cls, aux, leaves):
        return cls(list(leaves), *aux)


def shared(tree: Any, inputs: Any) -> Any:
    """Under a trace: `tree` without its leaves that are one of `inputs`' leaves or an
    earlier leaf (the same traced value), as a `Shared` that `restored` completes on
    the host. XLA gives every output a buffer of its own, copying an input or a value
    returned twice into it: in a capture program, the parameters (probed as they are)
    and their gradients (the mode's result and a probe) were 500 copies in the
    1,000-equation program, each a kernel to compile."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    ins = {id(x): k for k, x in enumerate(jax.tree_util.tree_leaves(inputs))}
    first: dict[int, int] = {}
    kept, aliases = [], []
    for i, x in enumerate(leaves):
        if not isinstance(x, jax.core.Tracer):
            kept.append(x)
        elif id(x) in ins:
            aliases.append((i, True, ins[id(x)]))
        elif id(x) in first:
            aliases.append((i, False, first[id(x)]))
        else:
            first[id(x)] = i
            kept.append(x)
    return Shared(kept, treedef, tuple(aliases)) if aliases else tree


def restored(out: Any, inputs: Any) -> Any:
    """`out` (a program's output) with the leaves `shared` left out put back: the
    `inputs` leaf (the call's arguments, as the program saw them) or the earlier leaf."""
    if not isinstance(out, Shared):
        return out
    ins = jax.tree_util.tree_leaves(inputs)
    alias = {i: (is_input, j) for i, is_input, j in out.aliases}
    kept = iter(out.leaves)
    full: list = []
    for i in range(len(out.leaves) + len(alias)):
        if i not in alias:
            full.append(next(kept))
        else:
            is_input, j = alias[i]
            x = ins[j] if is_input else full[j]
            full.append(x if isinstance(x, jax.Array) else jnp.asarray(x))
    return jax.tree_util.tree_unflatten(out.treedef, full)


#: A fresh running flag for `Runner.run(..., chain=)`: (runs so far, first bad run or -1,
#: which of the last 32 runs were bad: bit `run % 32`).
CHAIN_START = (0, -1, 0)


def chain_flags(chain: Any, finite: Any) -> Any:
    """The running flag after one more run: ``[n + 1, first, bits]`` from ``[n, first,
    bits]``, where `first` becomes n if this run's `finite` vector has a False and no run
    had before, and bit ``n % 32`` of `bits` says whether this run's had one (so a read
    names every bad run among the last 32, not only the first: `Monitor` counts them).
    Chained from step to step on the device, it answers for every step since the last
    read in one transfer (a read is a round trip: ~200 µs on a GPU)."""
    n, first, bits = chain[0], chain[1], chain[2]
    bad = ~jnp.all(finite)
    bit = jnp.left_shift(jnp.int32(1), n % 32)
    bits = jnp.where(bad, bits | bit, bits & ~bit)
    return jnp.stack([n + 1, jnp.where((first < 0) & bad, n, first), bits])


#: Leaves of at most this many elements are stacked with like leaves (same shape,
#: dtype and sharding) for the finite test: one reduction per kind of leaf instead of
#: one per leaf. Each reduction is a kernel (a launch per step on a GPU, where a
#: 250-layer model's flags were 250 kernels); larger leaves keep their own, since a
#: stack of them could be a copy.
STACK_MAX = 1 << 18
#: On a CPU a "kernel" is a loop, not a launch, and a stack is a copy: only leaves up to
#: this many elements are stacked there. A Monitor's unrecorded step of a 3x128 MLP
#: (16K-element weights) paid 55-90 µs for the copy, over a 150 µs step; 250 leaves of
#: 4 to 16 elements still gain from one reduction (70 µs against 160-210 unstacked).
CPU_STACK_MAX = 1 << 12


def _stack_max() -> int:
    return CPU_STACK_MAX if jax.default_backend() == "cpu" else STACK_MAX


def all_finite(tree: Any, *, pooled: bool = False) -> Any:
    """No NaN nor ±Inf in each leaf of `tree` (integer leaves are always finite): one small
    bool vector, fused into the step, in `finite_order(tree)`'s order (like leaves
    together). Its readers ask whether every entry is true (the Monitor's chain, a
    recorded step), so it is not put back in leaf order: that was a gather, a kernel of
    its own in every program.

    With `pooled`, on a CPU, an entry flags a group of leaves instead (`_pooled_finite`):
    fewer kernels to compile, for a copy of the small leaves at every run (the capture
    programs, compiled at every first `inspect`)."""
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return jnp.ones((0,), bool)
    if pooled and jax.default_backend() == "cpu":
        return _pooled_finite(leaves)
    parts = [
        _nan_if_not_finite(leaves[idx[0]])
        if len(idx) == 1
        else _nan_if_not_finite(_concat.stack([leaves[i] for i in idx]), True)
        for idx in _finite_kinds(leaves)
    ]
    # sum(x * 0) is NaN exactly when x holds a NaN or ±Inf (IEEE: Inf * 0 is NaN), and
    # 0 otherwise: one fused reduction per kind of leaf and one test for all of them,
    # where all(isfinite(x)) was two kernels per leaf on XLA:CPU (a mask, then a
    # reduce-window over it).
    return jnp.isfinite(jnp.concatenate(parts))


def _pooled_finite(leaves: list) -> Any:
    """One flag per float dtype for the small leaves (up to `STACK_MAX` elements, not on
    an explicit mesh), copied into one buffer by memcpy (`_concat`) and tested by one
    reduction, and one flag per other float leaf. XLA:CPU compiles every distinct
    reduction as a kernel of its own (5-10 ms each): an Equinox MLP's gradients were six
    of its capture program's 14 kernels, and its first `inspect` 0.154 s against 0.123 s
    without them (NNX: 0.347 s against 0.274)."""
    pools: dict[Any, list] = {}
    parts = []
    for x in leaves:
        if not _is_float(x):
            continue
        if 0 < np.size(x) <= STACK_MAX and not _ops.replicated(x):
            pools.setdefault(x.dtype, []).append(jax.lax.reshape(x, (np.size(x),)))
        else:
            parts.append(_nan_if_not_finite(x))
    parts += [_nan_if_not_finite(_concat.concatenate(flats)) for flats in pools.values()]
    return jnp.isfinite(jnp.concatenate(parts)) if parts else jnp.ones((0,), bool)


def finite_order(tree: Any) -> list[int]:
    """Which leaf of `tree` (in `tree_leaves` order) each entry of `all_finite` flags."""
    return [i for idx in _finite_kinds(jax.tree_util.tree_leaves(tree)) for i in idx]


def _finite_kinds(leaves: list) -> list[list[int]]:
    """`leaves`' indices by kind: like small float leaves (shape, dtype, sharding)
    together, reduced as one stack; others alone."""
    kinds: dict[Any, list[int]] = {}
    most = _stack_max()
    for i, x in enumerate(leaves):
        like = _is_float(x) and 0 < np.size(x) <= most
        key = (np.shape(x), x.dtype, getattr(jax.typeof(x), "sharding", None)) if like else i
        kinds.setdefault(key, []).append(i)
    return list(kinds.values())


def _nan_if_not_finite(x: Any, stacked: bool = False) -> Any:
    """float32 NaN if `x` holds a NaN or ±Inf, else 0 (integers: 0), of shape (1,); or,
    if `stacked`, one per entry of `x`'s leading axis."""
    if not _is_float(x):
        return jnp.zeros((1,), jnp.float32)
    s = jnp.sum(x * 0, axis=tuple(range(1 if stacked else 0, x.ndim)))
    if jnp.iscomplexobj(s):
        s = s.real + s.imag
    return s.astype(jnp.float32).reshape(-1)


def probes_clean(packed: Any) -> Any:
    """On the device: no summary in `packed` counts a NaN or ±Inf. One bool, so the
    host learns whether a recorded step needs the non-finite origin rule without
    converting its summaries."""
    sums = [  # the summaries computed in this program (deferred ones check themselves)
        s
        for s in jax.tree_util.tree_leaves(packed.unpack(regroup=False), is_leaf=_is_summary)
        if _is_summary(s)
    ]
    return all_clean(sums)


def _is_summary(x: Any) -> bool:
    return isinstance(x, (Summary, Tallied, TalliedRows))


class Family:
    """Everything cached for one function: its traces and its runners."""

    def __init__(self, get_fn: Callable[[], Callable | None]):
        self._get_fn = get_fn
        self._lock = threading.RLock()
        self._traced: collections.OrderedDict[Any, Traced] = collections.OrderedDict()
        self.runners: collections.OrderedDict[Any, Runner] = collections.OrderedDict()
        self.local = threading.local()

    def traced(self, options: InspectOptions, spec: ArgSpec, dyn: list) -> Traced:
        # JAX's settings too (`jax.enable_x64`, default matmul precision), as `jax.jit`
        # keys its traces: a trace made under one is not the program under another.
        args = getattr(self.local, "args", None)
        key = (options.graph_key(), spec, tuple(_aval_key(x) for x in dyn), _compat.trace_context())
        # and where an Auto mesh placed the arguments, in no type (nor in `dyn`, tracers
        # under `jax.jit`): the graph draws its inputs so (`placed_inputs`)
        placed = args is not None and not _one_device()
        key += (placement_key(split_for(options, args, "inspect")[1]) if placed else (),)
        with self._lock:
            t = self._traced.get(key)
            if t is not None:
                self._traced.move_to_end(key)
                return t
            fn = self._get_fn()
            if fn is None or args is None:
                raise RuntimeError("sowviz: the inspected function was garbage-collected.")
            t = self._traced[key] = Traced(fn, options, spec, args)
            while len(self._traced) > _MAX_TRACED:
                self._traced.popitem(last=False)
            return t

    def runner(self, options: InspectOptions) -> Runner:
        key = options.program_key()
        with self._lock:
            r = self.runners.get(key)
            if r is None:
                r = self.runners[key] = Runner(self, options)
                while len(self.runners) > _MAX_RUNNERS:
                    self.runners.popitem(last=False)
            self.runners.move_to_end(key)
            return r


def _placed_key(x: Any) -> tuple:
    """`_aval_key` and where `x` lies (a committed array's sharding)."""
    committed = isinstance(x, jax.Array) and x.committed
    return (*_aval_key(x), x.sharding if committed else None)


def _placed_as(shardings: tuple, outputs: Any, inputs: Any) -> Any:
    """Under a trace: `outputs` with each leaf constrained to its sharding in `shardings`
    (`Runner._as_plain`), but for an input returned as it is (placed as it came, and
    kept an alias, `shared`) and a value whose type carries its sharding (an Explicit
    mesh axis, which `with_sharding_constraint` refuses, and which fixes it anyway)."""
    leaves, treedef = jax.tree_util.tree_flatten(outputs)
    if len(leaves) != len(shardings):  # (the same tree as the plain program's, or left)
        return outputs
    ins = {id(x) for x in jax.tree_util.tree_leaves(inputs)}
    placed = [
        x
        if id(x) in ins or s is None or _compat.explicit_sharding(x) is not None
        else jax.lax.with_sharding_constraint(x, s)
        for x, s in zip(leaves, shardings, strict=True)
    ]
    return jax.tree_util.tree_unflatten(treedef, placed)


def placement_key(dyn: list) -> tuple:
    """Per concrete dynamic leaf, the mesh axes it lies along (`Traced` draws them);
    nothing on a machine of one device (a Monitor asks at every step)."""
    if _one_device():
        return ()
    return tuple(_compat.placement_axes(x) for x in dyn)


@functools.cache
def _one_device() -> bool:
    return jax.device_count() == 1


def _aval_key(x: Any) -> tuple:
    # `jax.typeof`, not `.aval`: the arguments may be NumPy arrays or Python scalars
    # (a data loader's batch), which `jax.jit` takes as they are.
    aval = jax.typeof(x)
    return (aval.shape, aval.dtype, getattr(aval, "weak_type", False), _compat.explicit_sharding(x))


class Runner:
    """The compiled programs of one function under one set of options."""

    def __init__(self, family: Family, options: InspectOptions):
        self.family, self.options = family, options
        self._instrumented = jax.jit(self._instrumented_program, static_argnums=(0, 3, 4, 5, 6))
        self._plain = jax.jit(self._plain_program, static_argnums=0)
        #: the plain program's output shardings per argument layout (`_as_plain`)
        self._plain_placed: collections.OrderedDict[Any, tuple | None] = collections.OrderedDict()

    def _transformed(self, traced: Traced, run: Callable, placed: Any = None) -> Callable:
        return transform(
            run, traced.layout, self.options.mode, self.options.argnums, placed, traced.refs
        )

    def _placements(self) -> list | None:
        """Per dyn leaf of the arguments being traced, its sharding when it is committed
        to several devices (else None): where the instrumented program puts gradients."""
        args = self.family.local.args
        if args is None or jax.device_count() == 1:
            return None
        _, concrete = split_for(self.options, args, "inspect")  # split once already: no error
        # (not one sharded over Explicit mesh axes, `jax.make_mesh`'s default: its
        # gradient's type carries its sharding already, and `with_sharding_constraint`
        # refuses Explicit axes)
        placed = [
            x.sharding
            if isinstance(x, jax.Array)
            and x.committed
            and len(x.sharding.device_set) > 1
            and _compat.explicit_sharding(x) is None
            else None
            for x in concrete
        ]
        return placed if any(p is not None for p in placed) else None

    def _instrumented_program(
        self,
        spec: ArgSpec,
        dyn: list,
        extra: tuple,
        inline: bool = False,
        steps: bool = False,
        as_plain: tuple | None = None,
        placement: tuple = (),
    ) -> Out:
        # `placement` (`placement_key`) only keys the trace: an Auto mesh's placement is
        # in no type, and jit traced anew for none, which kept a stale graph and
        # `_placements` (the first call's, for arguments placed otherwise now)
        o = self.options
        traced = self.family.traced(o, spec, dyn)
        placements = self._placements()
        placed = None if as_plain is not None else placements
        fn = self._transformed(traced, traced.probed_for(o.mode), placed)
        capture = SaveIntermediates(
            fn,
            tag=(PROBE_TAG, o.tag),
            duplicates=o.duplicates,
            loops=o.loops,
            summarize=SummaryOptions(bins=o.bins),
            strict=o.strict,
            by_tag=True,
            defer=_summaries.DEFER_SEGMENTS and not inline,
            # a Monitor's program runs at every step: faster summaries for a longer
            # compile; `inspect` pays every compile at its first call
            once=not steps,
            # on a CPU mesh, the layout too is left to `finish` (one device of it)
            apart=placements is not None and jax.default_backend() == "cpu",
        )
        # inline: a nested jit hides aliases
        (result, (state, aux)), packed = capture.traced(dyn, extra)
        if as_plain is not None:
            result, state, aux = _placed_as(as_plain, (result, state, aux), (dyn, extra))
        notes = tuple(capture.notes)
        finite = all_finite(result, pooled=True)
        out = Out(result, packed, finite, probes_clean(packed), traced, notes, state=state, aux=aux)
        return shared(out, (dyn, extra))

    def _plain_program(self, spec: ArgSpec, dyn: list, extra: tuple, chain: Any) -> Out:
        traced = self.family.traced(self.options, spec, dyn)
        result, (state, aux) = self._transformed(traced, traced.plain)(dyn, extra)
        finite = all_finite(result)
        chain = None if chain is None else chain_flags(chain, finite)
        return Out(result, None, finite, None, traced, (), chain, state, aux)

    def _tesseract(self, client: Any) -> str:
        """The label of a Tesseract stage (the graph's `tesseract_names` applied)."""
        from .graph.tesseract import tesseract_label

        tn = self.options.tesseract_names
        return tesseract_label(client, dict(tn) if isinstance(tn, tuple) else tn)

    def run(
        self,
        args: tuple,
        *,
        where: str,
        instrumented: bool = True,
        tangents: Any = None,
        cotangents: Any = None,
        chain: Any = None,
        inline: bool = False,
        steps: bool = False,
        plain_chain: Any = None,
    ) -> Out:
        """One compiled call on `args` (dispatch only, when the program exists).
        `tangents`/`cotangents` are this call's values (arguments of the program). The
        plain program also advances a running flag `chain` (`chain_flags`) if given.
        `inline`: every summary in the one program, none deferred to the shared second
        program (`capture.summaries.finish`): a program of its own, but one dispatch
        per call instead of two (see `Monitor`). `steps`: a program run at every step
        (`Monitor`): on a CPU its mid-sized arrays are summarised in blocks, faster to
        run and longer to compile (`capture.summaries.MIN_GROUPED`), and on several
        devices its results placed as the plain program places them (`_as_plain`; its
        unrecorded steps run with `plain_chain`)."""
        check_has_arguments(self.options.mode, args, where)
        spec, dyn = split_for(self.options, args, where)
        self.family.local.args = args
        try:
            extra = self._extra(spec, dyn, tangents, cotangents, where)
            with gc_paused():  # a first call traces, lowers and compiles
                if not instrumented:
                    out = self._with_statics(self._plain(spec, dyn, extra, chain))
                    out.split = (spec, dyn)
                    return out
                placed = self._as_plain(spec, dyn, extra, plain_chain) if steps else None
                at = placement_key(dyn)
                out = self._instrumented(spec, dyn, extra, inline, steps, placed, at)
                out = restored(out, (dyn, extra))
        except (TypeError, RuntimeError) as err:
            calls_vjp = lambda: self._calls_custom_vjp(spec, dyn)  # noqa: E731
            said, named = self._refused_tangent(spec, dyn, err, tangents is None)
            said = said or tesseract_endpoint_error(self.options.mode, err, self._tesseract)
            if not named:  # (mode all through a `custom_vjp`: `forward_error` says it)
                said = forward_error(self.options.mode, err, calls_vjp) or said
            said = said or leaked_trace_error(err)
            if said is None:
                raise
            raise said from err
        except Exception as err:
            said = trace_error(err)
            if said is None:
                raise
            raise said from err
        finally:
            self.family.local.args = None
        if _compat.staging_now():
            # (checked here, not first: traced arguments and traced values the function
            # closes over get their own, more precise messages above; this call of the
            # compiled program was staged into the caller's trace, its results tracers)
            raise TypeError(_STAGED.format(where=where))
        if out.packed.pending:
            # (a Monitor's step leaves a CPU mesh's summaries on the device they ran on:
            # its gather takes the step's other parts there, `_wire.gather`)
            packed, clean = _summaries.finish(out.packed, out.clean, home=not steps)
            out = Out(
                out.result,
                packed,
                out.finite,
                clean,
                out.traced,
                out.notes,
                None,
                out.state,
                out.aux,
            )
        out = self._with_statics(out)
        out.split = (spec, dyn)
        return out

    def _as_plain(self, spec: ArgSpec, dyn: list, extra: tuple, chain: Any) -> tuple | None:
        """Where the plain program puts its results (result, state and aux leaves; None on
        one device): a Monitor's recorded steps return theirs there too. XLA lays out a
        program's outputs by the whole program, and the probes changed its choice (an
        `embed` split P('tensor', 'fsdp') got its gradient as P(None, 'fsdp') from the
        plain program, as from `jax.jit(jax.value_and_grad)`, and as P('tensor',
        'fsdp') from the instrumented one): with `every=2` the layouts alternated, and
        a jitted optimizer update compiled twice. The plain program is compiled for this
        (once per layout, and the Monitor's unrecorded steps then find it compiled)."""
        if _one_device():
            return None
        # (keyed first: `_placements` splits the arguments again, ~35 µs per recorded
        # step of a TP Monitor; what it finds depends only on what `_placed_key` says
        # of each leaf, its type and sharding, so "none placed" is kept under it too)
        key = (spec, tuple(_placed_key(x) for x in dyn), chain is None)
        try:
            return self._plain_placed[key]
        except KeyError:
            pass
        found = None
        if self._placements() is not None:
            compiled = self._plain.lower(spec, dyn, extra, chain).compile()
            out = compiled.output_shardings
            found = tuple(jax.tree_util.tree_leaves((out.result, out.state, out.aux)))
        self._plain_placed[key] = found
        while len(self._plain_placed) > _MAX_TRACED:
            self._plain_placed.popitem(last=False)
        return found

    def _calls_custom_vjp(self, spec: ArgSpec, dyn: list) -> bool:
        """Whether `fn`'s program calls a `jax.custom_vjp` function (for an error's
        words: False if it cannot even be traced)."""
        try:
            return _compat.calls_custom_vjp(self.family.traced(self.options, spec, dyn).closed)
        except Exception:
            return False

    def _refused_tangent(
        self, spec: ArgSpec, dyn: list, err: Exception, default: bool
    ) -> tuple[RuntimeError | None, bool]:
        """Equinox's refusal of a tangent (`refused_tangent`) said in sowviz's words,
        and whether it names the arguments whose tangent alone is refused (one JVP trace
        each, no compile: an error's cost); None for another error. `default`: the
        tangents are sowviz's defaults."""
        if not refused_tangent(err):
            return None, False
        names = positional_names(self.family._get_fn() or (lambda: None))
        try:
            traced = self.family.traced(self.options, spec, dyn)
        except Exception:  # (then the words without the argument)
            return refused_tangent_error(self.options.mode, err, names, [], [], default), False
        layout, closed = traced.layout, traced.closed
        args = sorted({layout.arg_of[j] for j in layout.floating})
        refused = [i for i in args if self._refuses(closed, layout, dyn, i)]
        names = names[: layout.n_args] + [f"arg{i}" for i in range(len(names), layout.n_args)]
        said = refused_tangent_error(self.options.mode, err, names, refused, args, default)
        return said, bool(refused)

    @staticmethod
    def _refuses(closed: Any, layout: Any, dyn: list, i: int) -> bool:
        """Whether a tangent on argument `i` alone makes `fn`'s JVP raise Equinox's
        refusal (traced abstractly, `jax.eval_shape`)."""
        pos = [j for j in layout.floating if layout.arg_of[j] == i]

        def jvp(*flat: Any) -> Any:
            def f(*vals: Any) -> Any:
                merged = list(flat)
                for j, v in zip(pos, vals, strict=True):
                    merged[j] = v
                return _compat.eval_jaxpr(closed.jaxpr, closed.consts, *merged)

            vals = tuple(flat[j] for j in pos)
            return jax.jvp(f, vals, vals)

        avals = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in dyn]
        try:
            jax.eval_shape(jvp, *avals)
        except Exception as err:  # (another failure: not this argument's refusal)
            return refused_tangent(err)
        return False

    def _with_statics(self, out: Out) -> Out:
        """`out` with the non-JAX leaves of `fn`'s output put back into its result and aux."""
        static = out.traced.out_static
        if static.positions:
            out.result = with_output_leaves(self.options.mode, out.result, static.restore)
        out.aux = out.traced.aux_static.restore(out.aux)
        return out

    def compile(
        self, args: tuple, *, where: str, tangents: Any = None, cotangents: Any = None
    ) -> None:
        """Compile the instrumented program `run` calls on `args`, without running it
        and its second programs (which compile in threads of their own, `precompile`;
        this waits for them): a later `run` on like arguments then only dispatches.
        jit's caches take the compiled program, so a `run` racing this one compiles it
        again rather than waiting (the widget waits)."""
        check_has_arguments(self.options.mode, args, where)
        spec, dyn = split_for(self.options, args, where)
        self.family.local.args = args
        try:
            extra = self._extra(spec, dyn, tangents, cotangents, where)
            with gc_paused():
                at = placement_key(dyn)
                self._instrumented.lower(spec, dyn, extra, False, False, None, at).compile()
        finally:
            self.family.local.args = None
        _summaries.join_precompiles()

    def _extra(self, spec: ArgSpec, dyn: list, tangents: Any, cotangents: Any, where: str):
        """The program's inputs besides `dyn`: this call's tangents (the user's, or the
        mode's defaults, made outside the program) and cotangents."""
        layout_of = lambda: self.family.traced(self.options, spec, dyn).layout  # noqa: E731
        args = getattr(self.family.local, "args", None)
        if args is not None:
            tangents = module_tangents(args, tangents)
        user = _user_tangents(spec, dyn, tangents, where, layout_of)
        tangents = tangent_inputs(self.options.mode, user, layout_of, dyn)
        return (tangents, cotangents)


# -- the global cache, keyed on the function's identity ---------------------------------

_FAMILIES: collections.OrderedDict[Any, Family] = collections.OrderedDict()
_LOCK = threading.Lock()


def _fn_key(fn: Callable) -> tuple[Any, Callable[[], Callable | None]]:
    """A key for `fn` that does not keep it alive where Python allows, and a getter."""
    self_ = getattr(fn, "__self__", None)
    func = getattr(fn, "__func__", None)
    if self_ is not None and func is not None:  # a bound method: a new object per access
        try:
            rf, rs = weakref.ref(func), weakref.ref(self_)
            hash(rs)
        except TypeError:
            return ("strong", func, id(self_)), lambda: fn  # `fn` holds `self_` alive
        return (
            "method",
            rf,
            rs,
        ), lambda: None if rf() is None or rs() is None else rf().__get__(rs())
    try:
        r = weakref.ref(fn)
        hash(r)
    except TypeError:
        # Unhashable (an Equinox module holding arrays, `eqx.filter_value_and_grad(loss)`):
        # by identity, the family holding it alive so the id cannot be reused.
        return ("strong", id(fn)), lambda: fn
    return ("ref", r), r


def runner_for(fn: Callable, options: InspectOptions) -> Runner:
    """The cached `Runner` of `fn` under `options` (created on first use)."""
    if not callable(fn):
        raise TypeError(
            f"sowviz: `fn` must be callable, got {type(fn).__name__}; pass the function "
            "and its arguments: sowviz.inspect(loss, params, batch)."
        )
    key, get = _fn_key(fn)
    with _LOCK:
        fam = _FAMILIES.get(key)
        if fam is None:
            for k in [k for k in _FAMILIES if k[0] != "strong" and _dead(k)]:
                del _FAMILIES[k]
            fam = _FAMILIES[key] = Family(get)
            while len(_FAMILIES) > _MAX_FAMILIES:
                _FAMILIES.popitem(last=False)
        _FAMILIES.move_to_end(key)
    return fam.runner(options)


def _dead(key: tuple) -> bool:
    return any(isinstance(r, weakref.ref) and r() is None for r in key[1:])


def clear_cache() -> None:
    """Forget every cached trace and compiled program."""
    with _LOCK:
        _FAMILIES.clear()
