"""One history from several run logs: a run resumed from a checkpoint.

A resumed run writes a log of its own (a `log_dir` holding a log is never appended
to): `runs/exp1` holds steps 0-10149, `runs/exp1-resumed` steps 10000 on
(`Monitor(..., start_step=10000)`: the process died after its step-10000
checkpoint, still logging). `sowviz.load("runs/exp1", "runs/exp1-resumed")` and
`python -m sowviz report runs/exp1 runs/exp1-resumed` read them as one run: the
parts in the order of their first steps, each part's steps from the next part's
first step on replaced by that part's (TensorBoard's `purge_step`: the resumed run
is the one that went on), all of one program (the same probes); the graph drawn is
the last part's. The history's `notes` name the steps replaced. Each part's
`programs` (its steps' shapes) join one list, and a step names its shapes in that
list.
"""

from __future__ import annotations

import dataclasses
import itertools
import pathlib
from typing import Any

from .reader import LogReader

_SAME_START = (
    "sowviz.load: the run logs {earlier!r} and {later!r} both begin at step {step}. They "
    "cannot be joined as one run. Logs are joined as a run resumed from "
    "checkpoints: a later log replaces the earlier logs' steps from its own first step "
    "on, so one of these would replace the other whole, and the logs do not say which "
    "ran later. Two separate runs? Load or report each apart (`sowviz.load({later!r})`, "
    "`python -m sowviz report {later} -o report.html`). A resumed run whose Monitor "
    "counted from {step} again? Leave out the log the other replaced; when resuming, "
    "give the resumed Monitor a `log_dir` of its own (e.g. '{earlier}-resumed') and "
    "`start_step=` the checkpoint's step, so that its steps follow the first log's."
)
_LATE_START = (
    "sowviz.load: the run log {later!r} held no step when it was loaded, read after "
    "{earlier!r}, and its first step is {step}, not after {earlier!r}'s first ({first}). "
    "The logs are read in the order of their first steps: load them again "
    "(`sowviz.load` / `python -m sowviz report` with the same logs)."
)
_INTERLEAVED = (
    "sowviz.load: the run log {earlier!r} gained step {step} after the steps of "
    "{later!r}, which comes after it (read to step {last}): were two runs writing at "
    "once? The logs of a resumed run follow each other (each one's steps replace the "
    "earlier logs' from its first step on). Report the logs apart (`python -m sowviz "
    "report {earlier}`)."
)
_MODES = (
    "sowviz.load: the run logs {a!r} and {b!r} were recorded in different modes "
    "({ma!r} and {mb!r}): their statistics cannot share one chart. Report them apart."
)
_PROBES = (
    "sowviz.load: the run logs {a!r} and {b!r} ran different programs ({why}): one "
    "report draws one graph, and a step's statistics belong to its probes. Join only "
    "logs of one training function (a resumed run); report the others apart."
)


def first_step(log_dir: pathlib.Path) -> int | None:
    """The first step a log holds (None: no step yet): its first recorded step's, or
    the first loss or non-finite flag of an unrecorded step before it. A run resumed
    with `every=N` records its first step at the next multiple of N, and the losses of
    the steps before it, in `L` records written ahead of it, are the resumed run's:
    taken from the first recorded step, the run it replaced kept them (a resumed run
    at a new learning rate read the killed run's losses for 24 steps)."""
    reader = LogReader(log_dir)
    firsts = [entry.get("step") for entry in itertools.islice(reader.steps(settle=False), 1)]
    firsts += [s for s, _ in reader.losses[:1]] + reader.nonfinite_steps[:1]
    firsts = [s for s in firsts if s is not None]
    return min(firsts) if firsts else None


def in_step_order(log_dirs: list[pathlib.Path]) -> list[pathlib.Path]:
    """The logs in the order of their first steps (a log with no step last): a resumed
    run's log named before the one it resumes is read after it all the same."""
    return [d for d, _ in step_order(log_dirs)]


def step_order(log_dirs: list[pathlib.Path]) -> list[tuple[pathlib.Path, int | None]]:
    """`in_step_order`, each log with its first step (None: none yet); `ValueError`
    (`check_starts`) if two begin at one step."""
    if len(log_dirs) == 1:
        return [(log_dirs[0], None)]  # (alone, nothing replaces its steps)
    firsts = [first_step(d) for d in log_dirs]
    order = sorted(range(len(log_dirs)), key=lambda i: (firsts[i] is None, firsts[i] or 0, i))
    parts = [(log_dirs[i], firsts[i]) for i in order]
    for i in range(1, len(parts)):
        check_starts([p for p, _ in parts], [f for _, f in parts], i)
    return parts


def check_starts(logs: list[pathlib.Path], firsts: list[int | None], part: int) -> None:
    """Part `part` begins (`firsts`; None: no step yet) after every part before it
    and before every part after it: each part replaces the steps of the parts before
    it from its first step on, so a part beginning at another's step would replace
    it whole (which ran later, the logs do not say)."""
    step = firsts[part]
    if step is None:
        return
    for i, first in enumerate(firsts):
        if first is None or i == part or (first < step if i < part else first > step):
            continue
        earlier, later = (i, part) if i < part else (part, i)
        if first == step:
            raise ValueError(
                _SAME_START.format(earlier=str(logs[earlier]), later=str(logs[later]), step=step)
            )
        raise ValueError(
            _LATE_START.format(
                earlier=str(logs[earlier]),
                later=str(logs[later]),
                step=firsts[later],
                first=firsts[earlier],
            )
        )


def cut_at(
    logs: list[pathlib.Path], firsts: list[int | None], part: int
) -> tuple[int, pathlib.Path] | None:
    """Where part `part`'s steps end, as the first step of the next part that has one
    (and that part's log): its steps from there on are replaced. None: nothing after
    it has begun."""
    for i in range(part + 1, len(firsts)):
        if firsts[i] is not None:
            return firsts[i], logs[i]
    return None


def check_in_order(earlier: pathlib.Path, step: int, later: pathlib.Path, last: int) -> None:
    """`earlier`'s `step`, read after `later`'s steps (up to `last`), must come after them."""
    if step <= last:
        raise ValueError(
            _INTERLEAVED.format(earlier=str(earlier), later=str(later), step=step, last=last)
        )


@dataclasses.dataclass(frozen=True)
class Replaced:
    """The steps `first`-`last` (`count` of them recorded, the others' losses logged) of
    the run log `log`, replaced by those of `by`, the log that resumed the run, from
    `at`, its first step logged (recorded, or an unrecorded step's loss: the Monitor's
    `start_step`)."""

    log: pathlib.Path
    by: pathlib.Path
    at: int
    first: int
    last: int
    count: int

    @property
    def message(self) -> str:
        span = (
            f"step {self.first}" if self.first == self.last else f"steps {self.first}-{self.last}"
        )
        recorded = {0: "no recorded step", 1: "1 recorded step"}.get(
            self.count, f"{self.count} recorded steps"
        )
        return (
            f"{str(self.by)!r} resumed the run (its first step logged: {self.at}): its "
            f"steps replace {span} of {str(self.log)!r} ({recorded}), which the history "
            "leaves out"
        )


def check_compatible(parts: list[tuple[pathlib.Path, dict[str, Any] | None]]) -> None:
    """Every part's model (`model.json`; None: not written yet) is of one program: the
    same mode and the same probes (id, node and name), so a step's statistics mean the
    same in each."""
    known = [(d, m) for d, m in parts if m]
    for (a, ma), (b, mb) in itertools.pairwise(known):
        if ma.get("mode") != mb.get("mode"):
            raise ValueError(
                _MODES.format(a=str(a), b=str(b), ma=ma.get("mode"), mb=mb.get("mode"))
            )
        pa, pb = _probes(ma), _probes(mb)
        if pa != pb:
            why = _probes_differ(pa, pb)
            raise ValueError(_PROBES.format(a=str(a), b=str(b), why=why))


def _probes(model: dict[str, Any]) -> dict[str, tuple]:
    return {p["id"]: (p.get("node"), p.get("name")) for p in model.get("probes", [])}


def _probes_differ(pa: dict[str, tuple], pb: dict[str, tuple]) -> str:
    if pa.keys() != pb.keys():
        return f"{len(pa)} probes and {len(pb)}"
    pid = next(k for k in pa if pa[k] != pb[k])
    return f"probe {pid} is {pa[pid][1] or pa[pid][0]!r} in one, {pb[pid][1] or pb[pid][0]!r} in the other"


class Programs:
    """The parts' `programs` (each step's shapes) as one list: `index(part, k)` is where
    part `part`'s program `k` is in `joined`. A part's list only grows at its end (a new
    batch shape), and parts are joined in order, so an index once given stays."""

    def __init__(self, n_parts: int) -> None:
        self._lists: list[list[dict[str, Any]]] = [[] for _ in range(n_parts)]
        self.joined: list[dict[str, Any]] = []
        self._maps: list[list[int]] = [[] for _ in range(n_parts)]

    def set(self, part: int, programs: list[dict[str, Any]]) -> None:
        self._lists[part] = list(programs)
        self.joined, self._maps = [], []
        for progs in self._lists:
            here = []
            for p in progs:
                k = next((i for i, q in enumerate(self.joined) if q == p), None)
                if k is None:
                    k = len(self.joined)
                    self.joined.append(p)
                here.append(k)
            self._maps.append(here)

    def index(self, part: int, k: Any) -> Any:
        m = self._maps[part]
        return m[k] if isinstance(k, int) and 0 <= k < len(m) else k
