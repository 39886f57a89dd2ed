"""Round 13 (training scripts run from a terminal): every non-finite step counted,
whether recorded or not; a resumed run's logs joined into one; `step(..., step=n)`."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz.__main__ import main
from sowviz.runlog import LogReader, LogWarning
from sowviz.runlog import format as fmt

# Steps whose batch holds a negative number: log(x) is NaN there, and so are the loss
# and the gradient. Scattered (and past 32 unrecorded steps: the running flag's bits
# wrap) so that every=5 records only some of them.
BAD = {3, 7, 8, 9, 13, 21, 22, 41, 42, 43, 44, 45, 46, 58}
N_STEPS = 60


def _loss(w, x):
    return jnp.sum(jnp.log(x) * w)


def _batch(step):
    x = np.full(4, 1.0 + step, np.float32)
    if step in BAD:
        x[step % 4] = -1.0
    return x


def _expected_bad():
    """The non-finite steps, found apart from sowviz: plain NumPy on each batch."""
    with np.errstate(invalid="ignore"):
        return sorted(s for s in range(N_STEPS) if not np.isfinite(np.log(_batch(s))).all())


def _runs(steps):
    """Runs of consecutive steps as [first, last]."""
    out = []
    for s in steps:
        if out and out[-1][1] == s - 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return out


@pytest.fixture(scope="module")
def every5(tmp_path_factory):
    log = tmp_path_factory.mktemp("nan") / "run"
    mon = sowviz.Monitor(_loss, every=5, log_dir=log)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sowviz.NonFiniteWarning)
        for s in range(N_STEPS):
            mon.step(jnp.ones(4), _batch(s))
        mon.close()
    return mon, log


def test_every_unrecorded_nonfinite_step_is_counted(every5):
    mon, _ = every5
    want = _expected_bad()
    assert want == sorted(BAD)  # (the batches are what the test means)
    assert mon.history.steps == [0, 3, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55]  # 3: re-run
    assert mon.history.nonfinite.ranges == _runs(want)
    assert mon.history.nonfinite.count == len(want) == 14
    hist = mon.to_dict()["history"]
    assert hist["nonfinite_steps"] == _runs(want)
    assert hist["nonfinite_count"] == 14
    assert mon.nonfinite.step == 3


def test_the_log_names_the_unrecorded_nonfinite_steps(every5):
    _, log = every5
    want = _expected_bad()
    recorded = {e["step"] for e in LogReader(log).read()}
    reader = LogReader(log)
    reader.read()
    # the N records name the bad unrecorded steps (step 3 as well: re-run, then recorded)
    assert sorted(set(reader.nonfinite_steps)) == sorted(set(want) - (recorded - {3}))
    data = (log / "steps.log").read_bytes()
    kinds = [(r.kind, r.version) for r in fmt.scan(data, 0) if isinstance(r, fmt.Record)]
    # steps and the end keep format 1's header (an older reader reads them); N is format 2,
    # L (the unrecorded steps' losses) format 3
    assert {k for k in kinds} == {(b"S", 1), (b"N", 2), (b"L", 3), (b"E", 1)}
    # batched: one record per read of the running flag, never one per step
    assert kinds.count((b"N", 2)) < len(set(want) - recorded)
    hist = sowviz.load(log).model["history"]
    assert hist["nonfinite_steps"] == _runs(want)
    assert hist["nonfinite_count"] == 14


def test_report_cli_counts_them(every5, tmp_path):
    _, log = every5
    out = tmp_path / "r.html"
    assert main(["report", str(log), "-o", str(out)]) == 0
    assert '"nonfinite_count":14' in out.read_text()


def test_a_record_of_a_newer_format_is_skipped_with_a_warning(every5, tmp_path):
    _, log = every5
    (tmp_path / "model.json").write_bytes((log / "model.json").read_bytes())
    data = (log / "steps.log").read_bytes()
    newer = bytearray(fmt.frame(fmt.STEP, fmt.encode({"x": 1})))
    newer[2] = fmt.VERSION + 1  # (a kind a newer sowviz writes)
    newer[3:4] = b"Z"
    import zlib

    newer[8:12] = zlib.crc32(b"Z" + bytes(newer[12:])).to_bytes(4, "little")
    (tmp_path / "steps.log").write_bytes(bytes(newer) + data)
    newest = fmt.VERSION + 1
    with pytest.warns(LogWarning, match=f"newer format .*version {newest}.*Upgrade sowviz"):
        steps = LogReader(tmp_path).read()
    assert [e["step"] for e in steps] == [e["step"] for e in LogReader(log).read()]


def test_nonfinite_steps_merge_into_runs():
    from sowviz._history import NonfiniteSteps

    nf = NonfiniteSteps()
    for s in (5, 3, 7, 4, 6, 6, 10, 12, 11, 1):
        nf.add(s)
    assert nf.ranges == [[1, 1], [3, 7], [10, 12]]
    assert nf.count == 9 and nf.first == 1


# -- a resumed run's logs, joined ------------------------------------------------------


def _sq(w, x):
    return jnp.sum((x * w) ** 2)


def _train(log_dir, steps, start):
    mon = sowviz.Monitor(_sq, log_dir=log_dir, start_step=start)
    losses = [float(mon.step(jnp.ones(3), jnp.full(3, float(s)))[0]) for s in steps]
    mon.close()
    return losses


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    first = _train(root / "exp", range(0, 5), 0)
    second = _train(root / "exp-resumed", range(5, 9), 5)
    return root, first + second


def test_load_joins_a_resumed_run(resumed):
    root, losses = resumed
    # named in either order: read in the order of their first steps
    run = sowviz.load(root / "exp-resumed", root / "exp")
    assert run.history.steps == list(range(9))
    want = [3 * float(s) ** 2 for s in range(9)]  # sum((s * 1)^2) over 3 elements
    assert [e["loss"] for e in run.history] == pytest.approx(want)
    assert losses == pytest.approx(want)
    model = run.model
    assert model["history"]["program"] == [0] * 9 and len(model["programs"]) == 1


def test_report_cli_takes_several_log_dirs(resumed, tmp_path, capsys):
    root, _ = resumed
    out = tmp_path / "joined.html"
    assert main(["report", str(root / "exp"), str(root / "exp-resumed"), "-o", str(out)]) == 0
    assert "9 steps read" in capsys.readouterr().out
    assert '"steps":[0,1,2,3,4,5,6,7,8]' in out.read_text()


def test_overlapping_logs_join_the_later_replacing(resumed, tmp_path, capsys):
    # (round 14: they were refused; a resumed run's log replaces the steps from its
    # first on, as TensorBoard's purge_step: tests/test_runlog_resume_round14.py)
    root, _ = resumed
    _train(tmp_path / "again", range(3, 6), 3)  # resumed from an older checkpoint
    run = sowviz.load(root / "exp", tmp_path / "again")
    assert run.history.steps == list(range(6))
    assert [(r.first, r.last, r.count) for r in run.replaced] == [(3, 4, 2)]
    out = tmp_path / "x.html"
    assert main(["report", str(root / "exp"), str(tmp_path / "again"), "-o", str(out)]) == 0
    assert "replace steps 3-4 of " in capsys.readouterr().out


def test_logs_of_different_programs_are_refused(resumed, tmp_path):
    root, _ = resumed
    mon = sowviz.Monitor(lambda w: jnp.sum(jnp.sin(w)), log_dir=tmp_path / "other", start_step=20)
    mon.step(jnp.ones(3))
    mon.close()
    with pytest.raises(ValueError, match="ran different programs"):
        sowviz.load(root / "exp", tmp_path / "other")


# -- step numbers given ----------------------------------------------------------------


def test_step_numbers_given_line_up_with_the_training(tmp_path):
    ev = sowviz.Monitor(_sq, mode="primal", log_dir=tmp_path / "eval")
    for s in (1, 3, 5, 7):
        out = ev.step(jnp.ones(3), jnp.full(3, float(s)), step=s)
        assert float(out) == 3 * s**2
    ev.step(jnp.ones(3), jnp.ones(3))  # counts on
    ev.close()
    assert ev.history.steps == [1, 3, 5, 7, 8]
    assert [e["step"] for e in LogReader(tmp_path / "eval").read()] == [1, 3, 5, 7, 8]
    with pytest.raises(RuntimeError, match="closed"):
        ev.step(jnp.ones(3), jnp.ones(3), step=9)


def test_step_numbers_given_only_go_up():
    mon = sowviz.Monitor(_sq, every=2)
    mon.step(jnp.ones(3), jnp.ones(3), step=4)
    with pytest.raises(ValueError, match=r"`step=3` goes back: .* end at 4 \(the next is 5\)"):
        mon.step(jnp.ones(3), jnp.ones(3), step=3)
    with pytest.raises(TypeError, match="`step` must be an int"):
        mon.step(jnp.ones(3), jnp.ones(3), step=5.0)
    mon.step(jnp.ones(3), jnp.ones(3), step=np.int64(6))
    mon.step(jnp.ones(3), jnp.ones(3), step=7)  # not a multiple of every=2: not recorded
    assert mon.history.steps == [4, 6]


def test_the_live_widget_counts_the_unrecorded_nonfinite_steps():
    # the Monitor's widget learns of an unrecorded bad step from the whole model it is
    # sent next (its steps-only updates carry recorded steps)
    mon = sowviz.Monitor(_loss, every=5)
    view = mon.view()
    view.send = lambda msg, buffers=None: None  # (no front end: the model is what is sent)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sowviz.NonFiniteWarning)
        for s in range(N_STEPS):
            mon.step(jnp.ones(4), _batch(s))
        mon.flush()
    history = view.model["history"]
    assert history["nonfinite_steps"] == _runs(_expected_bad())
    assert history["nonfinite_count"] == len(_expected_bad())
    mon.close()
