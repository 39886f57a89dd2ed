"""`Inspector`: the Jupyter widget view of an inspection model, and `show`.

The widget knows nothing of JAX. It holds the sowviz/1 model and draws it with
the bundled front end (`static/sowviz.js`, the same file the HTML report
inlines). Everything the user clicks runs in the browser; only a change of
`mode` and the banner's "Locate the equation" button come back, and the kernel
re-runs the inspection (cached per mode: switching back costs a lookup).

The contract with the front end (js/src/types.d.ts mirrors it):
- `model` is the one synced copy of the model. Its serializer sends it as gzipped
  JSON in a binary buffer (a 10,000-equation model is ~20 MB of JSON, ~2 MB
  gzipped), encoded by `_model.encode_model`, the model's one serialiser.
- `mode` (an Enum of `_model.Mode` values), `phase` (an Enum of `Phase` values) and
  `status` (the line the front end shows while the kernel works, or the error).
- Custom messages: `{"type": "locate"}` from the front end; `{"type": "steps"}`
  (Monitor steps, a gzipped JSON buffer) to it.
"""

from __future__ import annotations

import gzip
import json
import pathlib
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import anywidget
import traitlets

from . import _compat, _model, _state
from ._model import Mode
from ._program import _title as program_title  # the title `inspect` gives
from ._progress import Phase, phases
from .inspection import Inspection, inspect, prepare
from .options import InspectOptions, options_for_every_mode

STATIC = pathlib.Path(__file__).parent / "static"

#: Modes `show()` compiles in the background once its picture is drawn (its `warm=`
#: default), so the widget's first switch to one costs a run, not a compile: "all"
#: shows every key (the NNX LM of tests/zoo switched to it in 1.9 s, 0.8-1.7 s for
#: the others; issue 15's target is 1 s).
WARM_MODES: tuple[str, ...] = ("all",)
#: One background compile at a time, whatever the number of widgets (a loop of
#: `show()` calls must not start a compile per widget at once).
_ONE_WARM_AT_A_TIME = threading.Lock()

#: What the status line says in each phase (`{what}`: the function's name or the task).
STATUS = {
    Phase.TRACING: "tracing {what}…",
    Phase.COMPILING: "compiling {what} with XLA…",
    Phase.RUNNING: "running {what}…",
    Phase.LOCATING: "locating the equation: re-running {what} with every equation probed…",
}
FIXED_MODE = (
    "This view cannot run its program again in mode '{mode}': a Monitor records in the "
    "mode it was made with (`sowviz.Monitor(fn, mode=...)`), and a model drawn as given has "
    "no program. Choose '{shown}' again, or call `sowviz.show(fn, ...)` to inspect a step "
    "in another mode."
)
NO_PROGRAM = (
    "Locating needs the program, and this widget draws a stored model (a Monitor's or a "
    "run log's). Call `sowviz.show(fn, *args)` and press the button there, or "
    "`sowviz.inspect(fn, *args).locate_nonfinite()`."
)


#: The widget's `text/plain` output: what a notebook viewer without the widget's
#: JavaScript shows (GitHub, nbviewer, a terminal), and what the notebook keeps.
PLAIN_TEXT = (
    "sowviz Inspector: the stage graph of `{title}` in mode '{mode}' (an interactive "
    "widget). To see it, run the notebook in JupyterLab, Jupyter Notebook or VS Code, "
    "or write an offline report with `.save_html('{file}')`."
)


def _file_name(title: str) -> str:
    """A report file name for `title` (`loss` -> 'loss.html')."""
    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in title).strip("_")
    return f"{stem or 'report'}.html"


def _model_to_json(model: dict[str, Any], widget: Any) -> bytes:
    """The `model` trait's serializer: gzipped JSON bytes, which ipywidgets sends as a
    binary buffer (b'' for the empty model). Cached: `get_state` runs on every display."""
    if not model:
        return b""
    cached = getattr(widget, "_encoded", None)
    if cached is not None and cached[0] is model:
        return cached[1]
    data = _model.encode_model(model)
    widget._encoded = (model, data)
    return data


def _model_from_json(data: Any, widget: Any) -> dict[str, Any]:
    """The inverse (the front end never sets `model`; kept so the trait round-trips)."""
    if isinstance(data, dict):
        return data
    raw = bytes(data or b"")
    return json.loads(gzip.decompress(raw)) if raw else {}


def _in_kernel() -> Any:
    """The running IPython kernel shell, or None (a script, a test, a plain IPython)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    ip = get_ipython()
    return ip if ip is not None and getattr(ip, "kernel", None) is not None else None


def display_now(widget: Inspector) -> None:
    """Display `widget` in the running kernel's current cell before the work starts,
    so the status line shows while `show()` traces and compiles (a kernel sends widget
    updates while a cell runs). Nothing outside a kernel. Tests replace this."""
    ip = _in_kernel()
    if ip is None:
        return
    from IPython.display import display

    display(widget)
    widget._shown_in_cell = ip.execution_count  # the cell's own result: not shown twice


class Inspector(anywidget.AnyWidget):
    """Interactive stage graph of one inspection (returned by `sowviz.show`).

    Example:
        >>> w = sowviz.show(loss, params, batch, mode="grad")   # doctest: +SKIP
        >>> w.save_html("loss.html")                             # doctest: +SKIP
    """

    _esm = STATIC / "sowviz.js"
    _css = STATIC / "sowviz.css"

    model = traitlets.Dict(
        help="dict: the sowviz/1 inspection model drawn by the front end (docs/model.md). "
        "Synced as gzipped JSON in a binary buffer (and saved so with the notebook's widget "
        "state). Default: an empty dict (nothing drawn yet)."
    ).tag(sync=True, to_json=_model_to_json, from_json=_model_from_json)
    mode = traitlets.Enum(
        [m.value for m in Mode],
        default_value=Mode.GRAD.value,
        help="str: the inspection mode shown, one of `_model.Mode`'s values ('primal', "
        "'grad', 'jvp', 'vjp', 'all'). Set by the front end's mode picker; the kernel then "
        "re-runs. Default 'grad'.",
    ).tag(sync=True)
    phase = traitlets.Enum(
        [p.value for p in Phase],
        default_value=Phase.READY.value,
        help="str: what the kernel is doing, one of `_progress.Phase`'s values: 'tracing', "
        "'compiling', 'running', 'locating' while it works, then 'ready' or 'error'. "
        "Default 'ready'.",
    ).tag(sync=True)
    status = traitlets.Unicode(
        "",
        help="str: the status line for `phase` ('compiling loss with XLA…'), or the error "
        "message (what went wrong and how to fix it) when `phase` is 'error'. Shown as "
        "text. Default ''.",
    ).tag(sync=True)
    can_locate = traitlets.Bool(
        False,
        help="bool: the kernel can re-run this inspection to name the equation where NaN/Inf "
        "were born (the banner's 'Locate the equation' button). Default False.",
    ).tag(sync=True)
    key = traitlets.Unicode(
        help="str: this widget's own id (random). The front end keeps one Monitor history "
        "per widget, shared by its views, under it: anywidget hands `initialize` and each "
        "`render` a model object of their own, so the object is no key.",
    ).tag(sync=True)

    @traitlets.default("key")
    def _key(self) -> str:
        return uuid.uuid4().hex

    def __init__(
        self,
        model: dict[str, Any] | None = None,
        *,
        rerun: Callable[[str], Inspection] | None = None,
        what: str = "the program",
        title: str = "",
        **kwargs: Any,
    ) -> None:
        self._rerun = None  # no re-run while traits are initialised
        self._title = title  # the title before the model comes (`show` displays first)
        self._inspection: Inspection | None = None
        self._shown_in_cell: int | None = None
        self._what = what
        requested = Mode(kwargs.pop("mode", Mode.GRAD)).value
        init_mode = (model or {}).get("mode", requested)
        super().__init__(model=model or {}, mode=init_mode, **kwargs)
        self._rerun = rerun
        self._warming: dict[str, threading.Event] = {}  # set once compiled (or failed)
        # modes whose program is compiled (shown before, or warmed): a switch to one
        # traces and compiles nothing, so its status starts at "running", not "tracing"
        self._compiled: set[str] = set()
        self.can_locate = rerun is not None
        self.on_msg(self._on_message)

    @property
    def inspection(self) -> Inspection | None:
        """The `Inspection` drawn now (None for a model given directly, e.g. a Monitor's)."""
        return self._inspection

    def __repr__(self) -> str:  # the model is large: never in the repr
        title = self.model.get("title", "")
        return f"{type(self).__name__}(title={title!r}, mode={self.mode!r}, phase={self.phase!r})"

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """anywidget's bundle with a `text/plain` that outlives this kernel: a notebook
        saves the bundle as the widget's output at display time, when `show()` has only
        begun (`repr` then says phase 'tracing' forever), and a viewer without the
        widget's JavaScript (GitHub, nbviewer, a terminal) shows only that text."""
        bundle = super()._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        if isinstance(data, dict):
            data["text/plain"] = self._plain_text()
        return bundle

    def _plain_text(self) -> str:
        """What this is, which function, which mode, and how to see it."""
        title = self.model.get("title") or self._title or "the program"
        mode = self.model.get("mode") or self.mode
        return PLAIN_TEXT.format(title=title, mode=mode, file=_file_name(title))

    def _ipython_display_(self) -> None:
        # `show()` displays the widget before it computes; the cell's own result (the same
        # widget) is then not drawn a second time. Any later display draws it.
        ip = _in_kernel()
        if ip is not None and self._shown_in_cell == ip.execution_count:
            self._shown_in_cell = None
            return
        from IPython.display import display

        bundle = self._repr_mimebundle_()  # anywidget gives (data, metadata)
        data, metadata = bundle if isinstance(bundle, tuple) else (bundle, None)
        display(data, metadata=metadata, raw=True)

    # -- work in the kernel, with the status line ---------------------------------------

    def _set_phase(self, phase: Phase, status: str | None = None) -> None:
        """`phase` and its status line, sent to the front end as one update."""
        with self.hold_sync():
            self.status = (
                STATUS.get(phase, "").format(what=self._what) if status is None else status
            )
            self.phase = phase.value

    def _work(
        self, start: Phase, job: Callable[[], Inspection | dict], *, raise_errors: bool
    ) -> bool:
        """Run `job` with the status line following its phases; install the inspection
        (or the model) it returns. On an error the status says what went wrong; it is
        raised only if asked."""
        self._set_phase(start)
        try:
            with phases(self._set_phase, start=start):
                got = job()
        except Exception as err:  # shown in the widget; the kernel stays usable
            self._set_phase(Phase.ERROR, f"{type(err).__name__}: {err}")
            if raise_errors:
                raise
            return False
        if isinstance(got, Inspection):
            self._inspection = got
            got = got.to_dict()
        self.model = got
        self._set_phase(Phase.READY, "")
        return True

    def _compute(self, mode: str, *, raise_errors: bool) -> bool:
        assert self._rerun is not None
        rerun = self._rerun
        start = Phase.RUNNING if mode in self._compiled else Phase.TRACING
        done = self._work(start, lambda: rerun(mode), raise_errors=raise_errors)
        if done:
            self._compiled.add(mode)
        return done

    def _warm(self, modes: Sequence[str], compile_mode: Callable[[str], None]) -> None:
        """Compile `modes` (those not shown nor warmed before) one after another in a
        background thread, with `compile_mode` (`inspection.prepare`), so that a switch
        to one costs a run. A switch to a mode still compiling waits for it instead of
        compiling it twice. A failure is left for the switch to meet and show."""
        todo = [m for m in modes if m != self.model.get("mode") and m not in self._warming]
        if not todo:
            return
        done = {m: threading.Event() for m in todo}
        self._warming.update(done)

        def work() -> None:
            for m in todo:
                try:
                    with _ONE_WARM_AT_A_TIME:
                        # Not once the interpreter exits (its main thread has ended):
                        # exit waits for this thread, and a compile would delay it.
                        if threading.main_thread().is_alive():
                            compile_mode(m)
                            self._compiled.add(m)
                except Exception:  # the switch compiles again and shows what went wrong
                    pass
                finally:
                    done[m].set()

        # Not a daemon: interpreter exit waits for a compile in flight instead of killing it.
        threading.Thread(target=work, name="sowviz-warm-modes").start()

    def _wait_warm(self, mode: str, timeout: float | None = None) -> bool:
        """Wait until `mode`'s background compile (if any) is over; False on timeout."""
        event = self._warming.get(mode)
        return True if event is None else event.wait(timeout)

    @traitlets.observe("mode")
    def _mode_changed(self, change: dict[str, Any]) -> None:
        if not self.model.get("mode"):  # nothing shown yet (a Monitor before its first step)
            return
        if change["new"] == self.model.get("mode"):  # back to the mode shown: nothing to run
            if self.phase == Phase.ERROR.value:
                self._set_phase(Phase.READY, "")
            return
        if self._rerun is None:  # a Monitor's view, a model given: said, not left "switching"
            shown = self.model.get("mode", "?")
            self._set_phase(Phase.ERROR, FIXED_MODE.format(mode=change["new"], shown=shown))
            return
        if not self._wait_warm(change["new"], timeout=0):
            self._set_phase(Phase.COMPILING)
            self._wait_warm(change["new"])
        self._compute(change["new"], raise_errors=False)

    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "locate":
            self.locate()

    def locate(self) -> Any:
        """What the banner's "Locate the equation" button runs: `Inspection.locate_nonfinite`
        on the inspection shown (a re-run with every equation probed), then redraws so the
        banner names the equation and its source line. Returns the origins (None when
        every value is finite); errors are shown in the status line."""
        ins = self._inspection
        if ins is None:
            self._set_phase(Phase.ERROR, NO_PROGRAM)
            return None

        def job() -> Inspection:
            ins.locate_nonfinite()
            return ins

        self._work(Phase.LOCATING, job, raise_errors=False)
        return ins.nonfinite

    def save_html(self, path: str | pathlib.Path, *, created: Any = ...) -> pathlib.Path:
        """Write the current picture as a self-contained offline HTML report (atomically).
        `created=None` leaves the timestamp out; a string pins it."""
        model = self.model if created is ... else {**self.model, "created": created}
        return _model.write("html", model, path)


@_compat.api_boundary  # a bad input's traceback ends at the user's call
def show(
    fn: Callable,
    *args: Any,
    mode: str = "grad",
    capture: str = "stages",
    warm: Sequence[str] | None = None,
    **options: Any,
) -> Inspector:
    """`inspect`, drawn: an `Inspector` widget that displays itself in Jupyter.

    In a notebook the widget appears at once with a status line (tracing, compiling,
    running) and fills in when the model is ready; an error is shown there too, and
    raised. Click a stage for histograms of its primal values, tangents and
    cotangents; switch the mode in the widget to re-run (each mode compiles once;
    switching back is a cache lookup). Every mode runs on the arguments as they were
    given (a Flax NNX model trained in place since is not read again; to see it as it
    is now, call `show` again). `.save_html(path)` exports it.

    Once the picture is drawn, the modes in `warm` (default `WARM_MODES`: "all")
    compile in a background thread, so the first switch to one costs a run; `warm=()`
    compiles nothing ahead (on a busy machine, or to keep the kernel's CPU).

    Example:
        >>> w = sowviz.show(lambda w: jnp.sum(jnp.tanh(w) ** 2), jnp.ones(3))
        >>> w.model["mode"], w.phase
        ('grad', 'ready')
    """
    opts = InspectOptions.from_kwargs("show", mode, capture, options)  # fail here, not later
    ahead = _warm_modes(WARM_MODES if warm is None else warm)

    # A mode switch or a background compile runs later, or in another thread, where a
    # `with jax.enable_x64(True):` around this call no longer holds: they re-enter it.
    x64 = _compat.x64_enabled()
    # Every mode shows the arguments as they are now, not a Flax NNX model trained in
    # place since (the same mode's picture changed after a few optimizer steps).
    args = _state.snapshot(args)

    # (`show` takes `tangents`, `cotangents` and `argnums` for whichever mode uses them)
    def rerun(new_mode: str) -> Inspection:
        gone = _state.deleted_leaf(args)
        if gone is not None:
            raise ValueError(_state.DELETED.format(path=f"args{gone}", mode=new_mode))
        with _compat.x64(x64), options_for_every_mode():
            return inspect(fn, *args, mode=new_mode, capture=capture, **options)

    def compile_mode(new_mode: str) -> None:
        with _compat.x64(x64), options_for_every_mode():
            prepare(fn, *args, mode=new_mode, capture=capture, **options)

    name = getattr(fn, "__name__", None) or type(fn).__name__
    what = f"`{name}`" if name != "<lambda>" else "the function"
    title = opts.title or program_title(fn)
    widget = Inspector(rerun=rerun, mode=opts.mode, what=what, title=title)
    widget._set_phase(Phase.TRACING)  # what the cell shows from the first moment
    display_now(widget)
    widget._compute(Mode(opts.mode).value, raise_errors=True)
    widget._warm(ahead, compile_mode)
    return widget


def _warm_modes(warm: Any) -> tuple[str, ...]:
    """`show`'s `warm=` as mode names, or a ValueError saying what is accepted."""
    names = [m.value for m in Mode]
    if not isinstance(warm, (list, tuple)) or not all(m in names for m in warm):
        raise ValueError(
            f"sowviz.show: `warm` must be a sequence of mode names from {names} (the modes "
            f"to compile in the background once the picture is drawn), or () for none; "
            f"got {warm!r}."
        )
    return tuple(warm)
