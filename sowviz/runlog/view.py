"""`sowviz.load(log_dir)`: a live view of a run log.

The view reads every complete step (`refresh()` reads the new ones), keeps the whole
run bounded in memory (the Monitor's own `History`: recent steps all kept, older
ones thinned, step 0 and the first non-finite step never dropped; steps are decoded
and handed to the history one at a time, so reading a log of any length takes the
memory of the history, not of the log), gives the sowviz/1 model with its history
(the shape `Monitor.to_dict()` has), writes reports, and displays in Jupyter as the
`Inspector` widget. While displayed, a background thread polls the log and sends new
steps to the front end as the Monitor does (`{"type": "steps"}` messages carrying a
gzipped JSON buffer), so a training script's steps appear without re-running the cell.
"""

from __future__ import annotations

import copy
import gzip
import os
import pathlib
import threading
from typing import Any

from .. import _compat
from .._history import History, losses_item
from . import join as _join
from .reader import LogReader
from .writer import MODEL_FILE, STEPS_FILE

POLL_S = 0.5  # how often a displayed view looks for new steps


class RunLogView:
    """A run log read back: `history`, `model`, `refresh()`, `save_html()`, the widget.

    Example:
        >>> run = sowviz.load("runs/exp1")      # doctest: +SKIP
        >>> run                                 # doctest: +SKIP
        >>> run.history[0]["step"]              # doctest: +SKIP
        0
        >>> run.save_html("exp1.html")          # doctest: +SKIP
    """

    def __init__(
        self, log_dir: str | os.PathLike, *more: str | os.PathLike, history: int = 200
    ) -> None:
        if not isinstance(history, int) or isinstance(history, bool) or history < 2:
            raise ValueError(f"sowviz.load: `history` must be an int >= 2, got {history!r}.")
        # A resumed run's logs after the one it resumes (`join`): read in step order,
        # each one's steps from the next one's first step on replaced by the next one's,
        # the last one followed live, its graph drawn.
        found = [LogReader(d).path for d in (log_dir, *more)]
        twice = next((d for i, d in enumerate(found) if d.resolve() in _resolved(found[:i])), None)
        if twice is not None:
            raise ValueError(
                f"sowviz.load: the run log {str(twice)!r} is named twice: name each part "
                "of a resumed run once."
            )
        parts = _join.step_order(found)
        self.readers = [LogReader(d) for d, _ in parts]
        self.reader = self.readers[-1]
        self.log_dir = self.reader.path
        self.log_dirs = [r.path for r in self.readers]
        self._firsts = [first for _, first in parts]  # each part's first step (None: none yet)
        self._programs = _join.Programs(len(self.readers))
        self._earlier_models = [r.model() for r in self.readers[:-1]]
        for i, m in enumerate(self._earlier_models):
            self._programs.set(i, (m or {}).get("programs") or [])
        self._last: tuple[int, int] | None = None  # (part, step) of the last step read
        self._read_to: list[int | None] = [None] * len(self.readers)  # each part's last step
        # each part's steps replaced by a later part's: [first, last, how many]
        self._replaced: dict[int, list[int]] = {}
        self.history = History(history)
        self.steps_read = 0
        self.nonfinite: dict[str, Any] | None = None  # the first step with NaN/Inf
        self._base: dict[str, Any] | None = None
        self._base_stamp: tuple[int, int] | None = None  # model.json's (mtime_ns, size)
        self._latest: dict[str, Any] | None = None
        self._lock = threading.RLock()
        self._widget = None
        self._sent_model = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._outbox: list[dict[str, Any]] = []  # read, not yet sent to the widget
        self._read()

    def __repr__(self) -> str:
        state = "finished" if self.finished else "open"
        where = (
            f"run log {str(self.log_dir)!r}"
            if len(self.log_dirs) == 1
            else f"run logs {', '.join(repr(str(d)) for d in self.log_dirs)}"
        )
        return f"<sowviz {where}: {self.steps_read} steps read ({len(self.history)} kept), {state}>"

    @property
    def finished(self) -> bool:
        """True once the writer closed the log (no more steps will come)."""
        return self.reader.finished

    def refresh(self) -> list[dict[str, Any]]:
        """Read the steps appended since the last read; returns them (oldest first).

        The list holds every new step at once: to catch up on a long log without
        keeping it, read through `history` (the view's own reads keep only that)."""
        new: list[dict[str, Any]] = []
        self._read(new.append)
        return new

    def _read(self, also: Any = None) -> int:
        """Read the new steps one at a time into the history (and `also`); how many."""
        with self._lock:
            self._load_model()
            seen = [r.offset for r in self.readers]  # what earlier reads took
            took: list[dict[str, Any]] = []
            while True:
                try:
                    return self._take(also if also is None else took.append, seen)
                except _ReadAgain:
                    # A log that held no step when loaded began at a step the logs
                    # before it were already read past: the history is read again
                    # without their steps it replaces (once per such log). What `also`
                    # gets is the steps new since the last read, as they now stand.
                    self._restart()
                    took.clear()
                finally:
                    if also is not None:
                        for e in took:
                            also(e)
                        took.clear()

    def _take(self, also: Any, seen: list[int]) -> int:
        """`_read`'s work: the new steps (those past `seen`, each reader's offset before
        this read) also go to `also`."""
        n = 0
        for part, e in self._new_steps():
            for earlier in range(part):  # (a part's last losses: before the next's steps)
                self._take_losses(earlier, None)
            self._take_losses(part, e.get("step"))  # the unrecorded steps before it
            first_bad = self.nonfinite is None and bool(e.get("nonfinite"))
            if first_bad:
                self.nonfinite = {"step": e["step"], **e["nonfinite"]}
            self.history.add(e, pin=first_bad)  # as the Monitor does
            self._latest = e
            self.steps_read += 1
            if self.readers[part].offset <= seen[part]:
                continue  # read before a `_restart`: not new
            n += 1
            if self._widget is not None and self._sent_model:
                self._outbox.append(e)
                if len(self._outbox) > self.history.limit:
                    # More than the history holds: the widget gets the model whole
                    # (the thinned history) instead of every step.
                    self._outbox.clear()
                    self._sent_model = False
            if also is not None:
                also(e)
        for part in range(len(self.readers)):
            self._take_losses(part, None)
        for part, reader in enumerate(self.readers):
            # (the unrecorded steps found non-finite: counted, not kept as steps;
            # those a later part replaced, left out)
            unrecorded, reader.nonfinite_steps = reader.nonfinite_steps, []
            cut = _join.cut_at(self.log_dirs, self._firsts, part)
            self.history.mark_nonfinite(s for s in unrecorded if cut is None or s < cut[0])
        return n

    def _take_losses(self, part: int, before: Any) -> None:
        """Part `part`'s unrecorded steps' losses read so far (`L` records), those
        before step `before` (None: all), into the history's every-step loss series
        (and the widget's outbox), in step order; those a later part replaced, left
        out."""
        reader = self.readers[part]
        if not reader.losses:
            return
        if isinstance(before, int):
            k = next((i for i, (s, _) in enumerate(reader.losses) if s >= before), None)
        else:
            k = None
        taken = reader.losses if k is None else reader.losses[:k]
        reader.losses = [] if k is None else reader.losses[k:]
        cut = _join.cut_at(self.log_dirs, self._firsts, part)
        gone = [s for s, _ in taken if cut is not None and s >= cut[0]]
        if gone:  # (the note's span counts them: the losses of the steps replaced)
            got = self._replaced.setdefault(part, [gone[0], gone[-1], 0])
            got[0], got[1] = min(got[0], gone[0]), max(got[1], gone[-1])
        taken = [(s, v) for s, v in taken if cut is None or s < cut[0]]
        if not taken:
            return
        steps, losses = [s for s, _ in taken], [v for _, v in taken]
        self.history.add_losses(steps, losses)
        if self._widget is not None and self._sent_model:
            self._outbox.append(losses_item(steps, losses))

    def _restart(self) -> None:
        """Forget every step read (`_ReadAgain`): the logs are read again from their
        starts, each part's first step now known."""
        readers = []
        for old in self.readers:
            reader = LogReader(old.path)
            reader._warned = old._warned  # (a corrupt span is reported once)
            readers.append(reader)
        self.readers, self.reader = readers, readers[-1]
        self._last = None
        self._read_to = [None] * len(readers)
        self._replaced = {}
        self.history = History(self.history.limit)
        self.steps_read = 0
        self.nonfinite = None
        self._latest = None
        self._outbox.clear()
        self._sent_model = False  # a displayed widget gets the model whole

    def _new_steps(self) -> Any:
        """Every step appended since the last read, part by part, with its part; a
        part's step numbers its program in the joined list. A part's steps from the
        next part's first step on are replaced (left out, counted in `replaced`);
        those kept come after every step of the parts before it."""
        for part, reader in enumerate(self.readers):
            for e in reader.steps():
                step = e.get("step")
                if isinstance(step, int):
                    if self._firsts[part] is None:
                        self._begins(part, step)
                    cut = _join.cut_at(self.log_dirs, self._firsts, part)
                    if cut is not None and step >= cut[0]:
                        got = self._replaced.setdefault(part, [step, step, 0])
                        got[0], got[1], got[2] = min(got[0], step), max(got[1], step), got[2] + 1
                        continue
                    if self._last is not None and self._last[0] != part:
                        later = self.log_dirs[self._last[0]]
                        _join.check_in_order(reader.path, step, later, self._last[1])
                    self._last = (part, step)
                    self._read_to[part] = step
                if len(self.readers) > 1 and "program" in e:
                    e["program"] = self._programs.index(part, e["program"])
                yield part, e

    def _begins(self, part: int, step: int) -> None:
        """Part `part`, which held no step when loaded, begins at `step`: it replaces
        the steps of the parts before it from there on (`_ReadAgain` if some were read)."""
        firsts = [*self._firsts[:part], step, *self._firsts[part + 1 :]]
        _join.check_starts(self.log_dirs, firsts, part)  # (refused: the parts stay as read)
        self._firsts = firsts
        if any(last is not None and last >= step for last in self._read_to[:part]):
            raise _ReadAgain

    @property
    def replaced(self) -> list[_join.Replaced]:
        """The steps of each log that a later log replaced (the run resumed from a
        checkpoint before the earlier log's last step), oldest first."""
        out = []
        with self._lock:
            for part, (first, last, count) in sorted(self._replaced.items()):
                cut = _join.cut_at(self.log_dirs, self._firsts, part)
                assert cut is not None  # (only a part with a later one has steps replaced)
                at, by = cut
                out.append(_join.Replaced(self.log_dirs[part], by, at, first, last, count))
        return out

    def _load_model(self) -> None:
        """(Re)read model.json when it changed: the Monitor writes it when the graph is
        traced and again once the probe list is known."""
        try:
            st = (self.log_dir / MODEL_FILE).stat()
        except FileNotFoundError:
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._base_stamp:
            model = self.reader.model()
            if model is not None:
                if len(self.readers) > 1:
                    parts = [*self._earlier_models, model]
                    _join.check_compatible(list(zip(self.log_dirs, parts, strict=True)))
                    self._programs.set(len(self.readers) - 1, model.get("programs") or [])
                self._base, self._base_stamp = model, stamp
                self._sent_model = False  # a displayed widget gets the new model whole

    @property
    def model(self) -> dict[str, Any]:
        """The sowviz/1 model with the history, as `Monitor.to_dict()` gives it."""
        with self._lock:
            if self._base is None:
                self._load_model()
            if self._base is None:
                return {}
            d = copy.deepcopy(self._base)
            if self._latest is not None:
                for p in d.get("probes", []):
                    latest = self._latest["probes"].get(p["id"])
                    if latest:
                        p["summaries"] = _merge(p.get("summaries", {}), latest)
            d["history"] = self._history_dict()
            if len(self.readers) > 1:
                d["programs"] = list(self._programs.joined)
            replaced = self.replaced
            if replaced:  # the history says which steps of which log it left out
                d["notes"] = [
                    *(d.get("notes") or []),
                    *({"level": "info", "message": r.message} for r in replaced),
                ]
            d["nonfinite"] = self._drawn_record(d.get("nonfinite"))
            return d

    def _drawn_record(self, rec: dict[str, Any] | None) -> dict[str, Any] | None:
        """model.json's record as the drawn (latest) step's. An alarm's is the
        history's to draw. A "no alarm" one (`Monitor.quiet_nonfinite`: an intended
        `-inf` mask, written with model.json at the first step) holds while no step raised
        an alarm and the drawn step holds non-finite values too: a program's mask is
        there every step, and without the record the front end painted it as an alarm."""
        if rec is None or rec.get("alarm", True):
            return rec
        if self.nonfinite is not None or self._latest is None:
            return None
        if not _holds_nonfinite(self._latest):
            return None
        return {**rec, "step": self._latest.get("step")}

    def _history_dict(self) -> dict[str, Any]:
        return self.history.to_dict(self.nonfinite)

    def save_html(self, path: str | os.PathLike, *, title: str | None = None) -> pathlib.Path:
        """Write the whole run's report (read to the end of the log first); atomic."""
        from ..report import write_html

        self._read()
        model = self.model
        if not model:
            raise FileNotFoundError(_no_model(pathlib.Path(self.log_dir)))
        return write_html(model, path, title=title)

    # -- the live widget ------------------------------------------------------------------

    @property
    def widget(self):
        """The `Inspector` widget drawing this log; it follows the log while displayed."""
        if self._widget is None:
            from ..widget import Inspector

            self._widget = Inspector(model=self.model)
            self._sent_model = bool(self._widget.model)
        return self._widget

    def _repr_mimebundle_(self, **kwargs: Any):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        self.follow()
        return bundle

    def follow(self, interval: float = POLL_S) -> None:
        """Start the background thread that sends new steps to the widget."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._follow, args=(interval,), name="sowviz-follow", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop following the log."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _follow(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.poll()
            if self.finished:
                return

    def poll(self) -> int:
        """One follow step: read new steps and push them to the widget. Returns how many."""
        widget = self.widget
        self._read()
        with self._lock:
            new, self._outbox = self._outbox, []
        if not self._sent_model:
            # The script had not written its model yet: it travels whole, with the
            # history so far, once it exists.
            model = self.model
            if model:
                widget.model = model
                self._sent_model = True
            return len(new)
        if new:
            widget.send(
                {"type": "steps", "encoding": "gzip-json", "count": len(new)},
                buffers=[encode_steps(new)],
            )
        return len(new)


class _ReadAgain(Exception):
    """`RunLogView._read`: the history must be read again (`_begins`)."""


def _resolved(paths: list[pathlib.Path]) -> set[pathlib.Path]:
    return {p.resolve() for p in paths}


def _merge(full: dict[str, dict], latest: dict[str, dict]) -> dict[str, dict]:
    """Latest per-step summaries over the model's first full ones: shape and dtype kept,
    statistics replaced, and fields the step lacks (the log-histogram) dropped rather
    than shown stale."""
    out = {}
    for mode, lite in latest.items():
        base = full.get(mode, {})
        keep = {k: base[k] for k in ("shape", "dtype", "size", "complex") if k in base}
        out[mode] = {**keep, **lite}
    return out


def _no_model(log_dir: pathlib.Path) -> str:
    """Why `log_dir` has no report yet: a run that recorded nothing yet (or an empty
    directory a run is about to use), or a directory that is no run log at all (its
    `tensorboard/` subdirectory, say)."""
    if (log_dir / STEPS_FILE).exists() or not any(log_dir.iterdir()):
        return (
            f"sowviz: {log_dir}/{MODEL_FILE} is missing: the run wrote no model yet (it "
            "appears when the Monitor's first recorded step reaches the host)."
        )
    what = f"sowviz: {log_dir} is not a Monitor's run log (it holds no {STEPS_FILE})"
    if any(log_dir.glob("events.out.tfevents.*")):
        what += (
            f": it holds TensorBoard event files, which `tensorboard --logdir {log_dir}` "
            f"shows; the run log is the `log_dir` given to the Monitor ({log_dir.parent}?)"
        )
    return what + ". Pass the `log_dir` given to `sowviz.Monitor(..., log_dir=...)`."


@_compat.api_boundary  # a bad input's traceback ends at the user's call
def load(log_dir: str | os.PathLike, *more: str | os.PathLike, history: int = 200) -> RunLogView:
    """A live view of the run log a `Monitor(..., log_dir=...)` writes.

    `history` bounds the steps kept in memory (thinned, never losing step 0); the log
    on disk keeps every step. Displayed in Jupyter, the view is the widget and follows
    the log as the script appends to it. The format: docs/log-format.md.

    Several logs are one run resumed from checkpoints (`load("runs/exp1",
    "runs/exp1-resumed")`: the resumed Monitor was given `start_step=`): read in the
    order of their first steps, the last one followed, each log's steps from the next
    log's first step on replaced by the next log's (a run resumed from a checkpoint
    older than the log's last step: the model's `notes` and the view's `replaced` say
    which); `ValueError` if two begin at one step or they ran different programs
    (`sowviz.runlog.join`).

    Example:
        >>> mon = sowviz.Monitor(loss, log_dir="runs/exp1")   # doctest: +SKIP
        >>> run = sowviz.load("runs/exp1")     # e.g. in a notebook, while it trains  # doctest: +SKIP
        >>> run                                # the widget; new steps appear  # doctest: +SKIP
        >>> [e["step"] for e in run.history][:3]              # doctest: +SKIP
        [0, 1, 2]
        >>> run.save_html("exp1.html")         # the whole run's report  # doctest: +SKIP
    """
    return RunLogView(log_dir, *more, history=history)


def encode_steps(steps: list[dict[str, Any]]) -> bytes:
    """Steps as gzipped JSON (NaN/Inf as null): the payload of one front-end update,
    as the Monitor sends it."""
    from ..report import model_json

    return gzip.compress(model_json(steps).encode("utf-8"), mtime=0)


def _holds_nonfinite(entry: dict[str, Any]) -> bool:
    """Whether a logged step's statistics count a NaN or an infinity anywhere."""
    return any(
        stats.get(k)
        for probe in entry.get("probes", {}).values()
        for stats in probe.values()
        if isinstance(stats, dict)
        for k in ("nan", "posinf", "neginf")
    )
