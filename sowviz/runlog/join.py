"""One history from several run logs: a run resumed from a checkpoint.

A resumed run writes a log of its own (a `log_dir` holding a log is never appended
to): `runs/exp1` holds steps 0-9999, `runs/exp1-resumed` steps 10000 on
(`Monitor(..., start_step=10000)`). `sowviz.load("runs/exp1", "runs/exp1-resumed")`
and `python -m sowviz report runs/exp1 runs/exp1-resumed` read them as one run: the
parts in the order of their first steps, each step after every step of the parts
before it, all of one program (the same probes); the graph drawn is the last
part's. Each part's `programs` (its steps' shapes) join one list, and a step names
its shapes in that list.
"""

from __future__ import annotations

import itertools
import pathlib
from typing import Any

from .reader import LogReader

_OVERLAP = (
    "sowviz.load: the run logs {earlier!r} and {later!r} overlap: {later!r} holds "
    "step {step}, and {earlier!r} already went to step {last}. Logs join into one run "
    "only when each one's steps come after every step of the one before (a run resumed "
    "from a checkpoint at step N, logged with `start_step=N`, after a log that stopped "
    "before step N). Was the run resumed from an older checkpoint than its last "
    "logged step? Report the logs apart (`python -m sowviz report {later}`)."
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
    """The first step a log holds (None: no step yet), from its first record alone."""
    for entry in LogReader(log_dir).steps(settle=False):
        return entry.get("step")
    return None


def in_step_order(log_dirs: list[pathlib.Path]) -> list[pathlib.Path]:
    """The logs in the order of their first steps (a log with no step last): a resumed
    run's log named before the one it resumes is read after it all the same."""
    if len(log_dirs) == 1:
        return log_dirs
    firsts = [first_step(d) for d in log_dirs]
    order = sorted(range(len(log_dirs)), key=lambda i: (firsts[i] is None, firsts[i] or 0, i))
    return [log_dirs[i] for i in order]


def check_overlap(earlier: pathlib.Path, last: int | None, later: pathlib.Path, step: int) -> None:
    """`later`'s `step` must come after every step of the logs before it (up to `last`)."""
    if last is not None and step <= last:
        raise ValueError(
            _OVERLAP.format(earlier=str(earlier), later=str(later), step=step, last=last)
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
