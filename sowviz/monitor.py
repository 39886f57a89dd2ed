"""`Monitor`: a headless recorder of a training loop.

`mon.step(*args)` runs ONE compiled program that returns what
`jax.value_and_grad(fn, argnums)(*args)` returns and, packed beside it, the
summaries of every probe and a small all-finite flag vector. Programs come from
the same cache as `inspect` (`_program`): a batch of another shape compiles its
own program (like `jax.jit`), and a shape seen before reuses its program. The
caller gets what the plain program gives on every step, recorded or not: a program
computing in bfloat16/float16/float8 runs the plain program beside the instrumented
one on a recorded step (`_plain_twin`: XLA fuses the two otherwise, and keeps excess
precision inside a fusion), and on several devices a recorded step's results are
placed as the plain program places them (`_program.Runner._as_plain`).

Nothing waits on the host, and no step reads from the device on its own: a
device→host read is a round trip (about 200 µs on a GPU), so reads are batched.
Recorded steps wait on the device until more than `_MAX_PENDING` are in, or the
oldest has waited `throttle` seconds: then one small program gathers the
summaries, flags and losses of all of them into one buffer (`_wire`) and one
read brings them to the host (or at `flush()`). On unrecorded steps (`every > 1`)
the plain program runs and advances a running flag on the device
(`_program.chain_flags`: the first non-finite step so far); it is read once per
`_FLAG_BATCH` unrecorded steps, `_MAX_FLAGS` steps behind the newest (the device
is not stalled), and one read answers for all of them. An unrecorded step's loss
(one number) is charted and logged too: its copy to the host starts as the step
returns (`copy_to_host_async`, nothing waits), and it is taken with the flags, so
the chart and TensorBoard's `loss` have every step while the summaries stay at the
recorded ones; the listeners get the losses in step order, each before the next
recorded step (`_emit_losses`: TensorBoard drops a tag's steps that go back). With
`stop_on_nonfinite=True` the flag is read on every step (one small device→host
sync per step: the price of exactness), and `NonFiniteError` is raised before
`step` returns, so the caller never applies that update.

The first non-finite step is located down to the equation, once, whatever the
recording: a step's arguments stay referenced (on the device, no copy) only while
its flag is unread (at most `_FLAG_BATCH + _MAX_FLAGS` unrecorded steps, or
`_MAX_PENDING` recorded ones), so the first bad step's are still there when its
flag is read; an unrecorded one is re-run with the probes, and then `locate`
re-runs it counting NaN/Inf at every equation (`nonfinite_locate.locate_step`).
Steps are recorded in step order (an earlier step's flag is read before a later
step is recorded), so the first non-finite step recorded is the first of the
run. After that one locate, no arguments are kept.

A Ctrl-C (KeyboardInterrupt) inside `step` loses no step: a recorded step leaves
the queue only once it is read and recorded, an unrecorded step's flag only once it
is read, so a read (or record) the interrupt cut short is completed by the next
`step`, `flush()` or `close()`. The interrupted step itself ran (its number is used,
and it is recorded like any other) but returned nothing. A Ctrl-C while the first
non-finite step is located stops there too (`nonfinite_locate.locate_step`); one that
ends the script leaves the exit hook to write the steps in flight, unlocated, and
exit status 130 (`_close_at_exit`).

A recorded step costs the training thread its share of that read; its summaries
become the JSON-ready entry only when read (`_entry.LazyEntry`: on a sink's
thread, when the view sends, when `history`/`to_dict()` is read), or at once when
a probe or result holds a NaN/Inf (the program's `clean` flag says so), since the
origin rule needs them.

Recording knows no front end: views (`monitor_view.MonitorView`, created
lazily when `mon` is displayed) and sinks (`log_dir`, TensorBoard, W&B, from
`sowviz.runlog`) are listeners with `open(model)`, `write(entry)`, `close()`.
"""

from __future__ import annotations

import atexit
import operator
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from . import _compat, _model, _state, _wire
from . import nonfinite as _nonfinite
from ._caller import user_stacklevel
from ._entry import LazyEntry, program_shapes
from ._history import History
from ._program import CHAIN_START, Out, Traced, runner_for
from ._runtime_errors import library_errors
from .capture.api import nest
from .capture.packing import Packed
from .graph.names import sows_named_as_captured
from .inspection import Inspection, Probe, device_of, join_probes
from .nonfinite_expect import check_expected, gradients_expected, is_finite_loss
from .nonfinite_locate import locate_step as _locate_step
from .nonfinite_locate import reversed_loops as _reversed_loops
from .options import InspectOptions, check_bool, check_int, check_number

_KEEP = object()
_MAX_PENDING = 4  # recorded steps left on the device before one read takes them all
_MAX_FLAGS = 2  # unrecorded steps whose finite flag may still be in flight
_FLAG_BATCH = 4  # unrecorded steps answered by one read of the running flag
_CHAIN_BITS = 32  # unrecorded steps one read can name bad (`_program.chain_flags`)
# On an accelerator a recorded step runs ONE program, its small arrays' summaries
# inline: a second dispatch cost more than the shared program saves in compiling
# (H100, 8x256 MLP, every=1: 1.26-1.30x -> 1.11-1.13x of a plain step). On a CPU
# the shared summary program stays (XLA:CPU compiles the two apart faster).
_INLINE_SUMMARIES = True


_STEP_BACK = (
    "sowviz.Monitor.step: `step={n}` goes back: this Monitor's steps so far end at "
    "{last} (the next is {next}). Step numbers only go up (the history, the run log "
    "and the charts keep steps in order). A run started again from a checkpoint makes "
    "a new Monitor, with a `log_dir` of its own and `start_step=` the checkpoint's step."
)


class NonFiniteError(FloatingPointError):
    """Raised by `Monitor.step` with `stop_on_nonfinite=True`: where NaN/Inf first appeared.

    Raised before `step` returns, so the update of that step is never applied:

        >>> try:                                                  # doctest: +SKIP
        ...     loss, grads = mon.step(params, batch)
        ... except sowviz.NonFiniteError as err:
        ...     print(err); break                 # params are those of the last good step
        ... updates, opt_state = opt.update(grads, opt_state, params)
    """


class NonFiniteWarning(RuntimeWarning):
    """Warned once by a `Monitor` at the first step whose values or gradients hold
    NaN/Inf (unless `stop_on_nonfinite=True`, which raises `NonFiniteError`): where it
    first appeared. `mon.nonfinite` holds the record.

    Silence it, or make it an error, with Python's own filters:

        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error", sowviz.NonFiniteWarning)  # NaN stops here
        ...     mon = sowviz.Monitor(lambda w: jnp.sum(jnp.log(w)))
        ...     _ = mon.step(-jnp.ones(2))
        ...     mon.flush()
        Traceback (most recent call last):
        ...
        sowviz.monitor.NonFiniteWarning: sowviz.Monitor: non-finite values at step 0; ...
    """


class Monitor:
    """Watch a training loop: per-step summaries of every stage's values and gradients.

    `mon.step(*args)` returns `jax.value_and_grad(fn, argnums)(*args)` (mode
    "grad") for every call, whatever the shapes. Every `every` steps the summaries join
    `mon.history` (the whole run, thinned to `history` entries; step 0 is kept); the
    loss of every step, recorded or not, joins `mon.history.losses` (and the loggers'
    `loss`), read batched with the NaN flags. Non-finite values in the loss and
    gradients are detected on every step: the first is `mon.nonfinite`, located down
    to the equation and its source line by one re-run of that step (seconds, once per
    run, on the training thread; `locate_nonfinite()` returns it); with
    `stop_on_nonfinite=True`, `step` raises `NonFiniteError`.

    Works with no notebook; displaying `mon` in Jupyter shows the live widget, and
    `mon.save_html(path)` writes a report with the history. `log_dir=`,
    `tensorboard=True`, `wandb=True` also write every recorded step there
    (`sowviz.runlog`); `mon.close()` (or the end of the process) closes them, as does
    the end of a `with sowviz.Monitor(...) as mon:` block (also when it raises).
    `start_step` numbers the first step (a run resumed at step 5000 from a checkpoint
    passes `start_step=5000`): the history and the loggers count on from it, and
    `every=N` records the steps whose number is a multiple of N. `mon.step(*args,
    step=n)` numbers one step (an eval Monitor stepped every other training step
    takes the training's numbers). Every step's NaN/Inf counts, recorded or not
    (`mon.history.nonfinite`; a run log's `N` records).

    `expect_nonfinite` names where NaN/Inf are expected, a name or a tuple of them; a
    name that is none of these is a ValueError at the first step, listing the valid
    names:

    - a stage label or a sow name (`("mask",)`: an attention mask's -inf): that node
      and everything inside it are expected, with the kinds of values they pass on;
      a non-finite value they hold raises no alarm when it never reaches a result.
    - `"gradients"`: the update is guarded (dynamic loss scaling: `jmp.DynamicLossScale`,
      optax's `apply_if_finite`, a `jnp.where(all_finite, new, old)` of your own), so
      non-finite gradients are expected: a step whose loss (and, recorded, every
      forward value) is finite while a gradient is not is a *skipped* step, counted in
      `mon.history.skipped` (the model's `history.skipped_count`), with no warning,
      no `NonFiniteError` and no re-run. It silences nothing else: a non-finite loss
      (a non-finite parameter makes one) or forward value is the alarm it always
      was; an unrecorded step with no one-number loss to read is judged non-finite.

    A recorded step's results come from the instrumented program, which XLA fuses
    otherwise than the plain one: a float32 loss can differ from `jax.jit`'s in its
    last few bits. `exact=True` runs the plain program on recorded steps too and
    returns its results (bit for bit `jax.jit`'s, at one plain step more per recorded
    step); the default does so for programs computing in bfloat16/float16/float8,
    where the difference grows (`exact=False`: never).

    Safe to step from several threads (steps are serialised).

    Example:
        >>> mon = sowviz.Monitor(lambda w, x: jnp.sum((x @ w) ** 2))
        >>> value, grad = mon.step(jnp.ones((2, 1)), jnp.ones((3, 2)))
        >>> mon.flush()  # summaries are read asynchronously; this waits for them
        >>> float(value), grad.shape, len(mon.history)
        (12.0, (2, 1), 1)
    """

    @_compat.api_boundary  # a bad input's traceback ends at the user's call
    def __init__(
        self,
        fn: Callable,
        *,
        mode: str = "grad",
        argnums: int | tuple[int, ...] | None = None,
        every: int = 1,
        history: int = 200,
        stop_on_nonfinite: bool = False,
        capture: str = "stages",
        throttle: float = 0.25,
        log_dir: Any = None,
        tensorboard: Any = False,
        wandb: Any = False,
        start_step: int = 0,
        exact: bool | None = None,
        **options: Any,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"sowviz.Monitor: `fn` must be callable, got {type(fn).__name__}.")
        check_int("Monitor", "every", every)
        check_int("Monitor", "history", history, lo=2)
        check_int("Monitor", "start_step", start_step, lo=0)
        self.stop_on_nonfinite = check_bool("Monitor", "stop_on_nonfinite", stop_on_nonfinite)
        self.throttle = check_number("Monitor", "throttle", throttle)
        self._exact = None if exact is None else check_bool("Monitor", "exact", exact)
        self._options = InspectOptions.from_kwargs(
            "Monitor", mode, capture, {"argnums": argnums, **options}
        )
        self._runner = runner_for(fn, self._options)
        self._primal = self._options.mode is _model.Mode.PRIMAL
        self.fn = fn
        self.every = every
        self._history = History(history)
        self._nonfinite: _nonfinite.NonFinite | None = None
        # A recorded step's non-finite values that raised no alarm (masked before any
        # result: a `-inf` attention mask): drawn muted, as `inspect` draws them
        self._quiet: _nonfinite.Origins | None = None
        self.steps = start_step  # the next step's number
        self._lock = threading.RLock()
        # In flight: (step, out, args, parts); args (`Out.split`, rebuilt by
        # `spec.merge`) only until the first non-finite step is located (None after),
        # to re-run and locate that step on its own arguments. `parts`: what the host
        # reads of a recorded step (`_parts`); `out` keeps no result (a step's gradients
        # are not held for the read).
        self._pending: deque[tuple[int, Out, tuple | None, Any]] = deque()
        self._draining = False  # (`history` read by a listener while steps are recorded)
        # Unrecorded steps: (step, the running flag after it, args, its index in the
        # flag's count); not their results (gradients are not held for the read).
        self._flags: deque[tuple[int, Any, tuple | None, int]] = deque()
        self._chain: Any = None  # the running flag (`_program.chain_flags`), on the device
        self._chain_runs = 0  # unrecorded steps it has counted
        self._chain_start: Any = None  # a fresh flag for the plain program (`_plain_chain`)
        # Unrecorded steps' losses: (step, the loss on the device, its copy to the host
        # started) until read with the flags, then (step, float) until handed over in
        # step order (`_emit_losses`)
        self._losses: deque[tuple[int, Any]] = deque()
        self._losses_read: deque[tuple[int, float | None]] = deque()
        self._losses_last = -1  # the last step whose loss was handed over
        # where each program's result holds its loss (`_loss_at`): found once, since
        # `_loss` flattens a train step's whole result (420 µs a step on 500 leaves)
        self._loss_of: weakref.WeakKeyDictionary[Traced, Any] = weakref.WeakKeyDictionary()
        # On a CPU a read of a loss costs ~1 µs: no copy is started ahead of it.
        self._copy_losses = jax.default_backend() != "cpu"
        self._waiting_since = 0.0  # when the oldest pending recorded step was queued
        self._first_flagged: int | None = None  # first unrecorded step whose flag was bad
        self._located = False  # the first non-finite step was located (done once)
        self._traced: Traced | None = None
        self._latest: LazyEntry | None = None  # the latest recorded step
        self._device: str | None = None  # where the latest recorded step ran (`_record`)
        self._listeners: list[Any] = []
        self._failed: set[int] = set()
        self._view: Any = None
        self._view_listener: Any = None
        self._sinks_traced: Traced | None = None  # the program whose model the sinks hold
        # One per distinct set of shapes a recorded step ran (`program_shapes`; the
        # model's `programs`); each history entry says its own (`"program": k`).
        self._programs: list[dict[str, Any]] = []
        self._program_of: weakref.WeakKeyDictionary[Traced, int] = weakref.WeakKeyDictionary()
        self._view_programs = 0  # how many of them the view's model holds
        self._warned_nonfinite = False
        self._closed = False
        self._interrupted_exit = False  # closing at the exit a Ctrl-C made (`_close_at_exit`)
        # (in a job of several processes always: process 0 alone given a `log_dir` waits
        # for the others to learn its outcome, `runlog.make_sinks`)
        if (
            log_dir is not None
            or tensorboard is not False
            or wandb is not False
            or jax.process_count() > 1
        ):
            from .runlog import make_sinks  # only when asked: the recorder needs no sink

            sinks = tuple(make_sinks(log_dir=log_dir, tensorboard=tensorboard, wandb=wandb))
            self._listeners += sinks
            ref = weakref.ref(self)
            atexit.register(lambda: (m := ref()) is not None and m._close_at_exit())
            # A Monitor dropped unclosed (`del mon`) writes nothing more: a newer one
            # given its `log_dir` may take the log (`runlog.writer`). Its sinks' threads
            # keep them, and their lock, alive until then or the exit.
            weakref.finalize(self, _sinks_takeable, sinks, True).atexit = False

    # -- the training step -------------------------------------------------------

    @_compat.api_boundary  # a bad input's traceback ends at the user's call
    def step(self, *args: Any, step: int | None = None, **kwargs: Any) -> Any:
        """One training step: returns `jax.value_and_grad(fn, argnums)(*args)` (for the
        default mode "grad"), with every probe summarised in the same program. State
        that `fn` assigns in its arguments (a Flax NNX model's BatchNorm statistics,
        its dropout RNG counters) is written back, as `nnx.value_and_grad` does.
        Arguments are positional: bind keyword arguments into `fn` with
        `functools.partial` when making the Monitor. It replaces your jitted
        value-and-grad: call it outside `jax.jit` and other transformations (inside one
        it raises a TypeError saying so) and jit only the update.

        `step=n` numbers this step n (later calls count on from n + 1), as
        TensorBoard's `global_step` does: an eval Monitor stepped every other training
        step passes the training step's number, and its charts line up with the
        training's. Numbers only go up (`ValueError` otherwise); with `every=N` the
        steps whose number is a multiple of N are recorded."""
        if kwargs:
            names = ", ".join(f"`{k}`" for k in kwargs)
            raise TypeError(
                f"sowviz.Monitor.step: got keyword argument(s) {names}; a step's arguments "
                "are positional (they are the program's inputs, traced once per shape; "
                "the one keyword is `step=`, the step's number). "
                f"Pass them positionally, or make the Monitor of "
                f"`functools.partial(fn, {next(iter(kwargs))}=...)` for a fixed value."
            )
        with self._lock, library_errors("Monitor.step"):
            if self._closed:
                raise RuntimeError(
                    "sowviz.Monitor.step: this Monitor is closed (`close()`, or the end of "
                    "the process), and its run log and loggers take no more steps. Make a "
                    "new Monitor (with a new `log_dir`) to go on recording, or step this "
                    "one only before closing it."
                )
            if step is not None:
                self.steps = self._numbered(step)
            step = self.steps
            record = step % self.every == 0
            chained = not (record or self.stop_on_nonfinite)
            if chained and self._chain is None:
                self._chain = jax.numpy.asarray(CHAIN_START, jax.numpy.int32)
            try:
                out = self._run(args, record, self._chain if chained else None)
                # what the caller gets: the plain program's results, where they differ
                given = self._plain_twin(args, out) if record else out
            except Exception:
                if self._traced is None:  # no step of this Monitor ran: it wrote nothing
                    _sinks_takeable(self._listeners, True)
                raise
            if out.traced is not self._traced:
                self._new_graph(out.traced)
            # The step's own split of its arguments (`Out.split`: their tree and array
            # leaves, no copy), rebuilt for a re-run: not `args`, whose objects the caller
            # may change before then (`nnx.Optimizer.update` assigns a Flax NNX model's
            # parameters in place, and state is written back below), and the re-run
            # blamed the NaN of a batch on the parameters updated after the step.
            kept = None if self._located else out.split
            if record:
                if not self._pending:
                    self._waiting_since = time.monotonic()
                parts = _parts(out, self._primal, args, given)
                self._pending.append((step, _light(out), kept, parts))
            elif chained:
                self._chain = out.chain
                self._flags.append((step, out.chain, kept, self._chain_runs))
                self._chain_runs += 1
            if not record:
                self._keep_loss(step, out, args)
            # Counted once it is queued: a step interrupted before (Ctrl-C while it
            # compiles or runs) never returned, and its number is the next step's.
            self.steps += 1
            if self.stop_on_nonfinite:
                if not (np.asarray(out.finite).all() and np.asarray(given.finite).all()):
                    self._stop(step, out, record)
                self._flags.clear()
                self._check_losses(keep=_MAX_FLAGS)
            else:
                self._check_flags(keep=_MAX_FLAGS)
            self._drain(keep=_MAX_PENDING)
            if given.state:
                _state.write_back(args, given.traced.state, given.state)
            return given.user_result(self._options.mode)

    def _numbered(self, step: Any) -> int:
        """`step(..., step=n)`'s n, checked: an int no smaller than the next step's
        number (steps are recorded, logged and charted in order)."""
        try:
            n = None if isinstance(step, bool) else operator.index(step)
        except TypeError:
            n = None
        if n is None:
            raise TypeError(
                f"sowviz.Monitor.step: `step` must be an int (the training step's number), "
                f"got {type(step).__name__}."
            )
        if n < self.steps:
            raise ValueError(_STEP_BACK.format(n=n, last=self.steps - 1, next=self.steps))
        return n

    def _plain_twin(self, args: tuple, out: Out) -> Out:
        """A recorded step's results as the caller gets them: `out`'s, or, with
        `exact=True` or when `fn` computes in bfloat16/float16/float8
        (`Traced.low_precision`) and `exact` is not False, the plain program's, run on
        the same arguments. XLA keeps excess precision inside a fusion, and the probes
        fuse the instrumented program otherwise: a bfloat16 loss was 8.795735 where
        `jax.jit(jax.value_and_grad)` and the unrecorded steps gave 8.793303, and a
        10-step adamw loop ended 3.3e-4 away from the plain loop's; in float32 the
        reductions' order alone moves a VAE's loss 9 ulp (260.032867 against
        260.032593). With the plain program's results the training never depends on
        which steps are recorded (the probes' statistics still come from the
        instrumented program)."""
        twin = out.traced.low_precision if self._exact is None else self._exact
        if not twin:
            return out
        return self._run(args, False, self._plain_chain())

    def _run(self, args: tuple, instrumented: bool, chain: Any = None) -> Out:
        o = self._options
        return self._runner.run(
            args,
            where="Monitor.step",
            instrumented=instrumented,
            tangents=o.tangents,
            cotangents=o.cotangents,
            chain=chain,
            inline=_INLINE_SUMMARIES and jax.default_backend() != "cpu",
            steps=True,
            plain_chain=self._plain_chain(),
        )

    def _plain_chain(self) -> Any:
        """The running flag an unrecorded step hands the plain program (None: it gets
        none): a recorded step's results are placed as that program places them
        (`Runner._as_plain`), which compiles it with the same arguments."""
        if self.stop_on_nonfinite:
            return None
        if self._chain is not None:
            return self._chain
        if self._chain_start is None:  # made once: an array made per step cost 20-30 µs
            self._chain_start = jax.numpy.asarray(CHAIN_START, jax.numpy.int32)
        return self._chain_start

    @property
    def nonfinite(self) -> _nonfinite.NonFinite | None:
        """The record of the run's first non-finite step (None: none yet), up to the
        last step taken: steps and flags still waiting to be read are read first."""
        if (self._pending or self._flags) and not self._draining:
            self._flush()
        return self._nonfinite

    @property
    def history(self) -> History:
        """The whole run, thinned to `history` entries (step 0 and the first non-finite
        step kept), up to the last step taken: steps still waiting to be read (a
        recorded step is read with the next few, off the step's path) are read first.
        It held none of a Linen ResNet's first 3 steps until `flush()`. Its
        `nonfinite` counts every non-finite step, recorded or not (`every=N` checks every
        step)."""
        self._catch_up()
        return self._history

    def _catch_up(self) -> None:
        """Read the steps still waiting (recorded steps, flags, losses), so that every
        reader of this Monitor (`history`, `graph`, `to_dict()`, `save_html`, `view()`)
        sees the same steps, up to the last one taken: `to_dict()` once gave a history
        ending at step 16 beside step 20's graph. Not while steps are being recorded
        (a listener reading `history` or the model mid-record gets what is recorded)."""
        waiting = self._pending or self._flags or self._losses or self._losses_read
        if waiting and not self._draining:
            self._flush()

    @_compat.api_boundary  # a bad input's traceback ends at the user's call
    def flush(self) -> None:
        """Read every pending summary and flag and hand them to the views and sinks now."""
        with self._lock:
            self._flush()
            # The user's own flush (a loop's end; not a read of `history` mid-loop): the
            # view's synced model, what a reloaded page draws, catches up too.
            if self._view_listener is not None:
                self._call(self._view_listener, "settle")

    def _flush(self) -> None:
        with self._lock, library_errors("Monitor.flush"):
            was, self._draining = self._draining, True  # (a listener reading `history`)
            try:
                self._check_flags(keep=0)
                self._drain(keep=0)
                self._check_losses(keep=0)  # (stop_on_nonfinite: no flags to read)
            finally:
                self._draining = was
            self._each("flush")

    @_compat.api_boundary  # a bad input's traceback ends at the user's call
    def close(self) -> None:
        """Flush, then close the sinks (log files, TensorBoard, W&B)."""
        with self._lock:
            if self._closed:
                return
            self.flush()
            self._closed = True
            self._each("close")

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        """`with sowviz.Monitor(...) as mon:` closes `mon` at the block's end, also when
        the block raises; then the block's exception is the one that propagates."""
        if exc is None:
            self.close()
            return
        if isinstance(exc, KeyboardInterrupt):  # as at a Ctrl-C's exit: no re-run of seconds
            self._interrupted_exit = True  # to locate a NaN once the user asked to stop
        try:
            self.close()
        except Exception as err:  # (a device gone with the block's error fails the read too)
            self._closed = True
            self._each("close")
            warnings.warn(
                f"sowviz.Monitor: the steps in flight when the `with` block raised "
                f"{type(exc).__name__} could not be read, and were not recorded: "
                f"{type(err).__name__}: {str(err)[:300]}",
                RuntimeWarning,
                stacklevel=2,
            )

    def _close_at_exit(self) -> None:
        """`close()` at the end of the process (the sinks' `atexit` hook). After a Ctrl-C
        (an uncaught KeyboardInterrupt) the steps in flight are still read and written,
        but the first non-finite step is not located (a re-run of seconds, when the user
        asked to stop), and warnings are written to stderr: Python exits with status 1,
        not 130, when a warning is shown at exit after a KeyboardInterrupt (3.11, 3.12)."""
        last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        if not isinstance(last, KeyboardInterrupt):
            self._close_or_say()
            return
        self._interrupted_exit = True
        with warnings.catch_warnings(record=True) as caught:  # (the filters still apply)
            self._close_or_say()
        for w in caught:
            sys.stderr.write(f"sowviz: {w.category.__name__}: {w.message}\n")

    def _close_or_say(self) -> None:
        # At the exit the script's own error has been shown: a device that died with it
        # (a `jax.distributed` peer gone, a collective timed out) fails the read of the
        # steps in flight too, and a second traceback would bury the first. One line.
        try:
            self.close()
        except Exception as err:
            self._closed = True
            self._each("close")
            sys.stderr.write(
                f"sowviz.Monitor: the steps in flight at the exit could not be read, and "
                f"were not recorded: {type(err).__name__}: {str(err)[:300]}\n"
            )

    def _stop(self, step: int, out: Out, recorded: bool) -> None:
        self._flags.clear()  # every earlier step was checked (this mode reads each flag)
        if not recorded:  # the plain program ran: re-run this step instrumented, for the origin
            self._enqueue(step, out.split)
        self._drain(keep=0)  # records this step and locates its equation (`_record`)
        nf = self._nonfinite
        if (nf is None or nf.step != step) and self._skipped_step(step):
            return  # a guarded update's skipped step (`expect_nonfinite=("gradients",)`)
        self._each("flush")
        where = (
            nf.origins
            if nf is not None and nf.origins is not None
            else ((nf.forward, nf.backward) if nf is not None else (None, None))
        )
        raise NonFiniteError(_nonfinite.message(out.traced.graph, step, where))

    def _skipped_step(self, step: int) -> bool:
        """Whether `step`, just recorded, was one a guarded update skipped."""
        runs = self._history.skipped.ranges
        return any(a <= step <= b for a, b in runs)

    # One read of the running flag answers for every unrecorded step up to the one
    # read. `keep`: how many newer steps stay unread (their programs may still run);
    # a read happens once `_FLAG_BATCH` more than that are waiting (flush: keep=0,
    # everything is read). `before`: read every flag of an earlier step, ready or
    # not (a later step is about to be recorded).
    # Interrupt-safe (a Ctrl-C lands in the read or the re-run): the flags leave the
    # queue only once they are read and acted on, so the next call reads them again.
    def _check_flags(self, *, keep: int, before: int | None = None) -> None:
        if before is not None:
            upto = sum(1 for s, *_ in self._flags if s < before)
        elif keep == 0:
            upto = len(self._flags)
        else:
            upto = len(self._flags) - keep if len(self._flags) >= keep + _FLAG_BATCH else 0
        # (runs of more than `_CHAIN_BITS` steps, which a read answers for, in parts)
        while upto > 0:
            part = min(upto, _CHAIN_BITS)
            self._read_flags([self._flags[i] for i in range(part)])
            for _ in range(part):
                self._flags.popleft()
            upto -= part
        self._check_losses(keep=keep, before=before)

    # -- every step's loss -----------------------------------------------------------

    def _keep_loss(self, step: int, out: Out, args: tuple) -> None:
        """An unrecorded step's loss, kept on the device for the next batched read; its
        copy to the host starts now (asynchronous: the step does not wait, and the read
        a few steps later finds it there, not one round trip per loss)."""
        if not self._primal:
            loss = _loss(out.result, False)
        else:
            at = self._loss_of.get(out.traced, _KEEP)
            if at is _KEEP:
                at = self._loss_of[out.traced] = _loss_at(out.result, args)
            loss = at(out.result) if callable(at) else _loss(out.result, True, args)
        if loss is None:
            return
        if self._copy_losses:
            try:
                loss.copy_to_host_async()
            except Exception:  # (an array that cannot: read as it is, with the others)
                pass
        self._losses.append((step, loss))

    def _check_losses(self, *, keep: int, before: int | None = None) -> None:
        """Read the kept losses as `_check_flags` reads flags (`keep`, `before`: the
        same rule), then hand over those in step order (`_emit_losses`).
        Interrupt-safe: a loss leaves `_losses` only once read."""
        if before is not None:
            upto = sum(1 for s, _ in self._losses if s < before)
        elif keep == 0:
            upto = len(self._losses)
        else:
            upto = len(self._losses) - keep if len(self._losses) >= keep + _FLAG_BATCH else 0
        if upto > 0:
            read = [(s, _host_float(v)) for s, v in (self._losses[i] for i in range(upto))]
            self._losses_read.extend(read)
            for _ in range(upto):
                self._losses.popleft()
        self._emit_losses()

    def _emit_losses(self, before: int | None = None) -> None:
        """Hand the read losses over (the history, then the listeners), in step order:
        those before the oldest recorded step still waiting (and before `before`, the
        step `_record` is about to write). TensorBoard drops a tag's earlier steps when
        a step goes back, and the history keeps its series in order."""
        if not self._losses_read:
            return
        bound = self._pending[0][0] if self._pending else None
        if before is not None:
            bound = before if bound is None else min(bound, before)
        ready = [p for p in self._losses_read if bound is None or p[0] < bound]
        # (a read an interrupt cut short, done again: its steps once)
        new = [p for p in ready if p[0] > self._losses_last]
        if new:
            steps, values = [s for s, _ in new], [v for _, v in new]
            self._history.add_losses(steps, values)
            self._each("losses", steps, values)
            self._losses_last = steps[-1]
        for _ in ready:
            self._losses_read.popleft()

    def _read_flags(self, read: list[tuple[int, Any, tuple | None, int]]) -> None:
        """One device→host read of the running flag after the last of `read` (at most
        `_CHAIN_BITS` unrecorded steps in a row): every bad step among them is counted
        (the history, and the sinks' `nonfinite_steps`: a run log's `N` record), and the
        run's first one is re-run with the probes."""
        n, first, bits = (int(v) for v in np.asarray(read[-1][1]))  # the one read
        bad = [r for r in read if n - r[3] <= _CHAIN_BITS and (bits >> (r[3] % _CHAIN_BITS)) & 1]
        if not bad:
            return
        steps = [r[0] for r in bad]
        if gradients_expected(self._options.expect_nonfinite):
            # `expect_nonfinite=("gradients",)`: a step whose loss is finite is one a
            # guarded update skipped (its gradients alone are non-finite); one with no
            # finite loss to tell is a non-finite step, as without it
            losses = self._unrecorded_losses(steps)
            skipped = [s for s in steps if is_finite_loss(losses.get(s))]
            self._history.mark_skipped(skipped)
            bad = [r for r in bad if r[0] not in skipped]
            steps = [r[0] for r in bad]
            if not bad:
                return
        self._history.mark_nonfinite(steps)
        self._each("nonfinite_steps", steps)
        if self._nonfinite is not None or self._first_flagged is not None:
            return  # an earlier step is already the first non-finite one
        step, _, args, _ = next((r for r in bad if r[3] == first), bad[0])
        # First non-finite step, unrecorded: re-run it with the probes (same args).
        if args is None:
            warnings.warn(
                f"sowviz.Monitor: could not re-run step {step}: its arguments were not kept",
                stacklevel=user_stacklevel(),
            )
            self._nonfinite = _nonfinite.NonFinite(step, None, None)
        else:
            self._enqueue(step, args)
        self._first_flagged = step

    def _unrecorded_losses(self, steps: list[int]) -> dict[int, float | None]:
        """The losses of unrecorded `steps` (read already, or read now: their flags
        were, so they are computed)."""
        want = set(steps)
        out = {s: v for s, v in self._losses_read if s in want}
        for s, v in self._losses:
            if s in want and s not in out:
                out[s] = _host_float(v)
        return out

    def _enqueue(self, step: int, kept: tuple) -> None:
        # A re-run joins the recorded steps in step order: the first non-finite step
        # recorded is then the first of the run.
        if any(s == step for s, *_ in self._pending):
            return  # queued by a call that was interrupted before it marked its flags read
        spec, leaves = kept
        args = spec.merge(leaves)  # the step's arguments as it got them
        if any(isinstance(x, jax.Array) and x.is_deleted() for x in leaves):
            warnings.warn(
                f"sowviz.Monitor: could not re-run step {step} to find where its NaN/Inf "
                "was made: its arguments were deleted before the Monitor read the step's "
                "flag (donated to a jitted update: `donate_argnums`). Don't donate them, "
                "or pass `stop_on_nonfinite=True` (the Monitor then checks each step "
                "before it returns, and stops there).",
                stacklevel=user_stacklevel(),
            )
            self._nonfinite = _nonfinite.NonFinite(step, None, None)
            return
        try:
            rerun = self._run(args, True)
        except Exception as err:
            warnings.warn(
                f"sowviz.Monitor: could not re-run step {step}: {err}",
                stacklevel=user_stacklevel(),
            )
            self._nonfinite = _nonfinite.NonFinite(step, None, None)
            return
        at = sum(1 for s, *_ in self._pending if s < step)
        if not self._pending:
            self._waiting_since = time.monotonic()
        # recorded now: its loss comes with its entry, not twice
        self._losses = deque(p for p in self._losses if p[0] != step)
        self._losses_read = deque(p for p in self._losses_read if p[0] != step)
        self._pending.insert(at, (step, _light(rerun), kept, _parts(rerun, self._primal, args)))

    def _drain(self, *, keep: int) -> None:
        """Record the pending steps once more than `keep` wait, or the oldest has waited
        `throttle` seconds (slow or rare recorded steps still reach the views): one
        gather, one read.

        Interrupt-safe: a step leaves `_pending` only once it is read and recorded (a
        read step's host copy replaces its device parts, `_Read`, which keeps what
        `_record` did of it), so a drain a Ctrl-C cut short is completed by the next
        one (the next step, `flush()`, `close()`), with no step lost or recorded twice."""
        if not self._pending:
            return
        if len(self._pending) <= keep and time.monotonic() - self._waiting_since < self.throttle:
            return
        was, self._draining = self._draining, True
        try:
            self._drain_now()
        finally:
            self._draining = was

    def _drain_now(self) -> None:
        # Earlier unrecorded steps first: a bad one is re-run and queued in step order.
        self._check_flags(keep=0, before=self._pending[-1][0])
        unread = [i for i, p in enumerate(self._pending) if not isinstance(p[3], _Read)]
        if unread:
            buf, layout = _wire.gather([self._pending[i][3] for i in unread])
            host = _wire.split(np.asarray(buf), layout)  # the one device→host round trip
            for i, parts in zip(unread, host, strict=True):
                step, out, args, _ = self._pending[i]
                self._pending[i] = (step, out, args, _Read(parts))
        while self._pending:
            step, out, args, read = self._pending[0]
            self._record(step, out, args, read)
            self._pending.popleft()

    def _record(self, step: int, out: Out, args: tuple | None, read: _Read) -> None:
        # `read.parts` are on the host (`_drain`); the summaries become JSON only when
        # read (`_entry.LazyEntry`), unless this step holds a non-finite value: then the
        # origin rule needs them now. Each stage is marked done on `read`: after an
        # interrupt, a second call goes on where the first stopped.
        if read.entry is None:
            host, finite, clean, value = read.parts
            try:
                loss = None if value is None else float(value.reshape(()))
            except (TypeError, ValueError):
                loss = None
            finite = bool(np.all(finite))
            packed = Packed(tuple(host), out.packed.layout, out.packed.regroup)
            # where the step ran, as `inspect` says it (a sharded step: `cpu:0 +7 more`):
            # its finite flags' placement, the capture program's (on a CPU mesh the second
            # programs' summaries stay on one device of it, `summaries.finish`)
            self._device = device_of((out.finite, *out.packed.buffers))
            program = self._program(out.traced, packed)
            entry = LazyEntry(step, loss, finite, (out.traced, packed, self._options), program)
            if not (finite and bool(clean)):
                self._origins(step, entry, out.traced, args)
            read.entry = entry
        entry = read.entry
        if not read.added:
            self._emit_losses(before=step)  # the unrecorded steps before it, first
            self._set_latest(out.traced, entry)
            if self._sinks_traced is not out.traced:
                # Sinks open with the probe list (they name tags and read logs by it),
                # and again when a step runs another program (a batch of another
                # shape): the model then says the shapes of the step just written, as
                # `to_dict()` does.
                self._sinks_traced = out.traced
                for listener in self._listeners:
                    if listener is not self._view_listener:
                        self._call(listener, "open", self._model(with_history=False))
            # The first non-finite step stays in the history whatever the thinning.
            first_bad = self._nonfinite is not None and self._nonfinite.step == step
            self._history.add(entry, pin=first_bad)
            read.added = True
            if self._view_listener is not None and self._view_programs < len(self._programs):
                # A step of a program the view's model lacks: the model travels whole
                # (with this step in its history), so the step's shapes are there.
                self._view_programs = len(self._programs)
                self._call(self._view_listener, "open", self._model())
        for listener in list(self._listeners):
            if any(w is listener for w in read.written):
                continue
            # Sinks and the view convert the entry off this thread / when they send; any
            # other listener gets the dict.
            lazy = getattr(listener, "lazy_entries", False)
            self._call(listener, "write", entry if lazy else entry.materialize())
            read.written.append(listener)

    def _program(self, traced: Traced, packed: Packed) -> int:
        """The index in `programs` of the program `traced` (its shapes, added the first
        time a step runs it): a step of a ragged last batch is drawn with its shapes,
        and the earlier steps with theirs."""
        k = self._program_of.get(traced)
        if k is None:
            # the probes' shapes are static: no summary is converted here
            probes, _ = join_probes(traced, nest(*packed.unpack(rows=True)), self._options)
            shapes = program_shapes(traced.graph, probes)
            k = next((i for i, p in enumerate(self._programs) if p == shapes), None)
            if k is None:
                k = len(self._programs)
                self._programs.append(shapes)
            self._program_of[traced] = k
        return k

    def _origins(self, step: int, lazy: LazyEntry, traced: Traced, args: tuple | None) -> None:
        """A step with a non-finite value: where it was born (`sowviz.nonfinite`); the
        first such step is also located down to the equation on its arguments."""
        entry, probes, finite = lazy.materialize(), lazy.probes() or [], lazy.finite
        graph = traced.graph
        origins = _nonfinite.find(
            probes,
            graph,
            step=step,
            results_finite=finite,
            expect_nonfinite=self._options.expect_nonfinite,
            # (a reverse scan's first iteration is its last index, as `inspect` says)
            reversed_loops=_reversed_loops(traced),
        )
        if origins is None and not finite:
            # No probe saw it (e.g. unscoped top-level code): the results did.
            outputs = [n.id for n in graph.nodes if n.kind == "output"]
            node = outputs[0] if outputs else None
            origins = _nonfinite.Origins(
                step,
                _nonfinite.Origin("forward", node, message="the results are non-finite"),
                None,
                message="the returned values or gradients are non-finite",
            )
        self._quiet = origins if origins is not None and not origins.alarm else None
        if origins is not None and origins.skipped:
            # a guarded update's skipped step (`expect_nonfinite=("gradients",)`):
            # counted apart (`history.skipped`), no alarm
            lazy.skipped = entry["skipped"] = True
        if origins is not None and origins.alarm:
            fwd = origins.forward.node if origins.forward else None
            bwd = (origins.backward.node or origins.backward.reaching) if origins.backward else None
            entry["nonfinite"] = {"forward": fwd, "backward": bwd}
            # (`>=`: the same step again is a record an interrupt cut short, `_drain`)
            if self._nonfinite is None or self._nonfinite.step >= step:
                self._nonfinite = _nonfinite.NonFinite(step, fwd, bwd, origins)
                if not self._located and args is not None and not self._interrupted_exit:
                    # Once per run: the count-only re-run on this step's arguments.
                    spec, leaves = args  # (`Out.split`: rebuilt as the step got them)
                    self._nonfinite = _locate_step(
                        self.fn, spec.merge(leaves), self._options, self._nonfinite
                    )
                    self._located = True
                    self._drop_args()
                # The first non-finite step's entry carries the whole record (the run
                # log's reader and the front end take it from there).
                entry["nonfinite"] = self._nonfinite.to_dict()
                self._warn_nonfinite(graph)

    def _warn_nonfinite(self, graph: Any) -> None:
        # Said once, where a script's user sees it (a notebook's view shows a banner
        # too); with `stop_on_nonfinite=True` the step raises `NonFiniteError` instead.
        nf = self._nonfinite
        if self.stop_on_nonfinite or self._warned_nonfinite or nf is None:
            return
        self._warned_nonfinite = True
        where = nf.origins if nf.origins is not None else (nf.forward, nf.backward)
        then = (
            "Read at the exit after Ctrl-C, so not located down to the equation"
            if self._interrupted_exit and not self._located
            else "Training goes on"
        )
        # gradients alone: loss scaling's overflow, which a guarded update skips
        guarded = (
            nf.origins is not None
            and nf.origins.forward is None
            and nf.origins.backward is not None
        )
        hint = (
            " If the update is guarded (dynamic loss scaling skips such steps), "
            "`expect_nonfinite=('gradients',)` counts them as skipped, with no alarm."
            if guarded
            else ""
        )
        warnings.warn(
            f"sowviz.Monitor: {_nonfinite.message(graph, nf.step, where)}. {then}; "
            "`Monitor(..., stop_on_nonfinite=True)` stops at the first such step, "
            f"before its update is applied.{hint}",
            NonFiniteWarning,
            stacklevel=user_stacklevel(),
        )

    def _drop_args(self) -> None:
        # Located: no step's arguments are needed any more.
        self._pending = deque((s, o, None, g) for s, o, _, g in self._pending)
        self._flags = deque((s, o, None, i) for s, o, _, i in self._flags)

    def locate_nonfinite(self) -> _nonfinite.Origins | None:
        """The origins of the first non-finite step, down to the equation: the Monitor
        locates that step by itself (once, on its arguments), so this only reads the
        steps in flight and returns the stored record (as `Inspection.locate_nonfinite`
        does); None while every step was finite."""
        with self._lock:
            self._check_flags(keep=0)
            self._drain(keep=0)
            return None if self._nonfinite is None else self._nonfinite.origins

    @property
    def _probes(self) -> list[Probe]:
        # The latest recorded step's probes (built from its summaries on first read). A
        # step recorded meanwhile (another thread) forgets its predecessor's, after it
        # became the latest: read again.
        while (latest := self._latest) is not None:
            probes = latest.probes()
            if probes is not None:
                return probes
        return []

    # -- listeners: views and sinks ------------------------------------------------

    def _set_latest(self, traced: Traced, entry: LazyEntry | None) -> None:
        # The step the model draws; the one before keeps its history entry only (its
        # full probes go), once it is no longer the latest (`_probes` reads again).
        previous, self._traced, self._latest = self._latest, traced, entry
        if previous is not None:
            previous.forget_probes()

    def _new_graph(self, traced: Traced) -> None:
        # A new program (first step, or a new shape): the view redraws its graph.
        check_expected("Monitor", traced.graph, self._options.expect_nonfinite)
        if self._traced is None:  # the first step ran: the sinks are this run's now
            _sinks_takeable(self._listeners, False)
        if traced.state_added:
            paths = ", ".join(f"`{p}`" for p in traced.state_added[:4])
            msg = _state.ADDED.format(n=len(traced.state_added), paths=paths)
            warnings.warn(msg, stacklevel=user_stacklevel())
        self._set_latest(traced, None)
        if self._view_listener is not None:
            self._call(self._view_listener, "open", self._model())

    def _each(self, method: str, *args: Any) -> None:
        for listener in list(self._listeners):
            self._call(listener, method, *args)

    def _call(self, listener: Any, method: str, *args: Any) -> None:
        fn = getattr(listener, method, None)
        if fn is None:
            return
        try:
            fn(*args)
        except Exception as err:  # a sink must never stop training
            if id(listener) not in self._failed:
                self._failed.add(id(listener))
                warnings.warn(
                    f"sowviz.Monitor: {type(listener).__name__}.{method} failed ({err!r}); "
                    "training goes on, this sink may miss steps.",
                    RuntimeWarning,
                    stacklevel=user_stacklevel(),
                )

    def view(self) -> Any:
        """The live widget of this monitor (created on first use; needs anywidget)."""
        with self._lock:
            self._catch_up()  # (the view opens on every step taken, as `to_dict()` does)
            if self._view is None:
                from .monitor_view import MonitorView  # the recording path imports no view

                self._view = MonitorView(self, throttle=self.throttle)
                self._view_listener = self._view.listener()
                self._listeners.append(self._view_listener)
                self._view_programs = len(self._programs)
            return self._view

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.view()._repr_mimebundle_(**kwargs)

    # -- the model ---------------------------------------------------------------------

    @property
    def graph(self) -> Any:
        """The stage graph of the latest recorded step's program (None before the first
        step): the one `to_dict()` draws (steps still waiting are read first)."""
        self._catch_up()
        return None if self._traced is None else self._traced.graph

    def to_dict(self, *, with_history: bool = True, created: Any = _KEEP) -> dict[str, Any]:
        """The model: the graph, the latest summaries and (by default) the whole history,
        up to the last step taken (steps still waiting are read first, as `history`
        and `save_html` read them)."""
        with self._lock:
            self._catch_up()
            return self._model(with_history=with_history, created=created)

    def _model(self, *, with_history: bool = True, created: Any = _KEEP) -> dict[str, Any]:
        """`to_dict()` as recorded so far, reading nothing: what the listeners get while
        steps are recorded (they receive the steps still waiting as they are written)."""
        if self._traced is None:
            raise RuntimeError(
                "sowviz.Monitor: nothing recorded yet; call `mon.step(...)` once first."
            )
        ins = Inspection(
            result=None,
            # sows of one name labelled as captured (`dup_0`, `dup_1`), as `inspect`'s
            graph=sows_named_as_captured(self._traced.graph, self._probes),
            probes=self._probes,
            mode=self._options.mode,
            device=self._device or _device(),
            title=self._traced.graph.title,
            nonfinite=self.quiet_nonfinite(),
        )
        d = ins.to_dict() if created is _KEEP else ins.to_dict(created=created)
        d["programs"] = list(self._programs)
        nf = None if self._nonfinite is None else self._nonfinite.to_dict()
        d["history"] = self._history.to_dict(nf) if with_history else None
        return d

    def quiet_nonfinite(self) -> _nonfinite.Origins | None:
        """The drawn (latest) step's non-finite values that raised no alarm (all masked
        before a result), while no step raised one: the model's `"nonfinite"` then says
        "no alarm" as `inspect`'s does, or the front end paints them as a NaN alarm."""
        quiet, latest = self._quiet, self._latest
        if self._nonfinite is not None or quiet is None or latest is None:
            return None
        return quiet if quiet.step == latest.step else None

    @_compat.api_boundary  # a bad input's traceback ends at the user's call
    def save_html(self, path: Any, *, created: Any = _KEEP) -> Any:
        """Write a report with the graph, the latest summaries and the history (atomically),
        and return its path. With no step taken there is nothing to draw: a warning, no
        file (None), since a script's last line should not fail a run resumed at its
        final checkpoint, which takes no step."""
        self.flush()
        with self._lock:
            self._catch_up()
            empty = self._traced is None
        if empty:
            warnings.warn(
                f"sowviz.Monitor.save_html: no step was taken, so there is no program to "
                f"draw; {str(path)!r} was not written. (A run resumed at its final "
                "checkpoint takes none: `python -m sowviz report <log_dir> ...` reports "
                "the run from its logs.)",
                stacklevel=user_stacklevel(),
            )
            return None
        return _model.write("html", self.to_dict(created=created), path)


def _sinks_takeable(listeners: Any, takeable: bool) -> None:
    """Whether a newer Monitor given the same `log_dir` may take these sinks' log: while
    every step tried has failed (nothing was written: a notebook re-runs the cell with
    the loss fixed), or once the Monitor is gone; never once a step has run."""
    for sink in listeners:
        if hasattr(sink, "takeable"):
            sink.takeable = takeable


def _parts(out: Out, primal: bool, args: tuple, given: Out | None = None) -> tuple:
    """What the host reads of a recorded step: its summary buffers, its finite flags,
    its clean flag and its loss (`_loss`), the loss the caller got (`given`'s:
    `Monitor._plain_twin`)."""
    result = (out if given is None else given).result
    return (out.packed.buffers, out.finite, out.clean, _loss(result, primal, args))


def _loss(result: Any, primal: bool, args: tuple = ()) -> jax.Array | None:
    """The step's loss, charted and logged. In the differentiating modes the value
    (`result[0]` of the value and gradients, or the output itself) when it is one
    number. In mode "primal" (a whole train step): the one floating-point number named
    `loss` anywhere in what it returns (a metrics dict: `state, {"loss": l, ...}`),
    else the output itself when it is one number, else among the returned tuple's
    elements that are one floating-point number the one that is not an argument
    returned updated in its place (`(theta, opt_state, loss)` of `(theta, opt_state,
    x, y)` with a one-number `theta`), the first when several are new (`loss, acc`).
    None when that leaves nothing or more than one named `loss`."""
    if not primal:
        value = result[0] if isinstance(result, tuple) else result
        return value if isinstance(value, jax.Array) and value.size == 1 else None
    leaves, treedef = jax.tree_util.tree_flatten(result)
    named = [leaves[k] for k in _named_loss_leaves(treedef) if _one_float(leaves[k])]
    if named:
        return named[0] if len(named) == 1 else None
    if _one_float(result):
        return result
    if not isinstance(result, (tuple, list)):
        return None
    ones = [(i, v) for i, v in enumerate(result) if _one_float(v)]
    # a train step returns its state where it takes it: `(theta, opt_state, loss)` of
    # `(theta, opt_state, x, y)`
    new = [v for i, v in ones if not (i < len(args) and _same_type(v, args[i]))]
    return new[0] if new else None


def _loss_at(result: Any, args: tuple) -> Any:
    """Where `_loss` finds a train step's loss in `result` (mode "primal"), as a
    function of a result of the same program (`_loss` decides by the structure and the
    arguments' shapes and dtypes, which a program fixes): `result[2]` of `(params,
    opt_state, loss)` rather than flattening 500 parameter leaves at every step.
    `_no_loss` when it finds none, None when the path has a key of a custom pytree
    (then `_loss` runs at every step)."""
    loss = _loss(result, True, args)
    if loss is None:
        return _no_loss
    found = [p for p, x in jax.tree_util.tree_flatten_with_path(result)[0] if x is loss]
    getters = []
    for key in found[0] if len(found) == 1 else ():
        if isinstance(key, jax.tree_util.SequenceKey):
            getters.append(operator.itemgetter(key.idx))
        elif isinstance(key, jax.tree_util.DictKey):
            getters.append(operator.itemgetter(key.key))
        elif isinstance(key, jax.tree_util.GetAttrKey):
            getters.append(operator.attrgetter(key.name))
        else:
            return None
    if len(found) != 1:
        return None

    def at(r: Any) -> Any:
        for get in getters:
            r = get(r)
        return r

    try:
        return at if at(result) is loss else None
    except Exception:  # (a pytree whose keys do not index it)
        return None


def _no_loss(result: Any) -> None:
    return None


def _same_type(value: jax.Array, arg: Any) -> bool:
    """`arg` is an array of `value`'s shape and dtype (a parameter returned updated)."""
    return (
        isinstance(arg, (jax.Array, np.ndarray))
        and arg.shape == value.shape
        and arg.dtype == value.dtype
    )


#: treedef -> the positions of its leaves named `loss`: a train step returns one
#: structure step after step, and walking its paths at each recorded step cost 167 µs
#: on 500 parameter leaves (with this, 80 µs: most of it flattening the result)
_NAMED_LOSS: dict[Any, tuple[int, ...]] = {}


def _named_loss_leaves(treedef: Any) -> tuple[int, ...]:
    found = _NAMED_LOSS.get(treedef)
    if found is None:
        if len(_NAMED_LOSS) > 64:  # a long session of many programs
            _NAMED_LOSS.clear()
        try:
            dummy = jax.tree_util.tree_unflatten(treedef, range(treedef.num_leaves))
            paths = [path for path, _ in jax.tree_util.tree_leaves_with_path(dummy)]
        except Exception:  # (an odd pytree: no loss by name, the positional rule decides)
            paths = []
        found = _NAMED_LOSS[treedef] = tuple(k for k, p in enumerate(paths) if _named_loss(p))
    return found


def _named_loss(path: tuple) -> bool:
    """The last key of `path` is `loss` (a dict key, an attribute or a NamedTuple field)."""
    if not path:
        return False
    key = path[-1]
    name = getattr(key, "key", None) or getattr(key, "name", None)
    return isinstance(name, str) and name == "loss"


def _one_float(x: Any) -> bool:
    return (
        isinstance(x, jax.Array)
        and x.size == 1
        and jax.numpy.issubdtype(x.dtype, jax.numpy.floating)
    )


class _Read:
    """A pending step's parts on the host, and how far `Monitor._record` got with it:
    its entry built, added to the history, written to which listeners."""

    __slots__ = ("added", "entry", "parts", "written")

    def __init__(self, parts: tuple) -> None:
        self.parts = parts
        self.entry: LazyEntry | None = None
        self.added = False
        self.written: list[Any] = []


def _host_float(loss: Any) -> float | None:
    """A loss read to the host (its copy started at its step: `Monitor._keep_loss`)."""
    try:
        return float(np.asarray(loss).reshape(()))
    except (TypeError, ValueError):
        return None


def _light(out: Out) -> Out:
    """`out` without its result: a pending step must not hold its gradients."""
    return Out(None, out.packed, out.finite, out.clean, out.traced, out.notes)


def _device() -> str:
    d = jax.devices()[0]
    return f"{d.platform}:{d.id} ({d.device_kind})"
