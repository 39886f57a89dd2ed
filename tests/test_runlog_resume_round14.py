"""Round 14: a run resumed from a checkpoint older than its log's last step (the process
died after checkpointing, still logging) joins its first log: the later log's steps
replace the earlier log's from its first step on (TensorBoard's `purge_step`), and
the joined history says which steps were replaced."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz.__main__ import main
from sowviz.runlog import LogReader

W = np.ones(3, np.float32)


def _sq(w, x):
    return jnp.sum((x * w) ** 2)


def _first_batch(step):
    return np.full(3, float(step), np.float32)


def _resumed_batch(step):
    # other values than the first log's at the same step: which log a step came from
    # shows in its loss
    return np.full(3, step + 0.5, np.float32)


def _want_loss(batch):
    """The loss apart from sowviz: plain NumPy."""
    return float(np.sum((batch * W) ** 2))


def _train(log_dir, steps, start, batch, **kw):
    mon = sowviz.Monitor(_sq, log_dir=log_dir, start_step=start, **kw)
    for s in steps:
        mon.step(jnp.asarray(W), jnp.asarray(batch(s)))
    mon.close()


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """`exp` logged steps 0-7 after its step-5 checkpoint; `exp-resumed` goes on from 5."""
    root = tmp_path_factory.mktemp("crash")
    _train(root / "exp", range(0, 8), 0, _first_batch)
    _train(root / "exp-resumed", range(5, 10), 5, _resumed_batch)
    return root


def _want_losses():
    return [_want_loss(_first_batch(s) if s < 5 else _resumed_batch(s)) for s in range(10)]


@pytest.mark.parametrize("names", [("exp", "exp-resumed"), ("exp-resumed", "exp")])
def test_the_resumed_log_replaces_the_steps_from_its_first_on(crashed, names):
    run = sowviz.load(*(crashed / n for n in names))
    assert run.history.steps == list(range(10))
    assert [e["loss"] for e in run.history] == pytest.approx(_want_losses())
    assert run.steps_read == 10
    (r,) = run.replaced
    assert (r.log, r.by, r.at, r.first, r.last, r.count) == (
        crashed / "exp",
        crashed / "exp-resumed",
        5,
        5,
        7,
        3,
    )
    model = run.model
    assert model["history"]["steps"] == list(range(10))
    assert model["history"]["loss"] == pytest.approx(_want_losses())
    notes = [n["message"] for n in model["notes"] if "resumed the run" in n["message"]]
    assert notes == [r.message]
    assert "resumed the run (its first step logged: 5): its steps replace steps 5-7 of " in (
        r.message
    )
    assert "(3 recorded steps), which the history leaves out" in r.message


def test_report_cli_joins_them_and_says_what_was_replaced(crashed, tmp_path, capsys):
    out = tmp_path / "joined.html"
    args = ["report", str(crashed / "exp"), str(crashed / "exp-resumed"), "-o", str(out)]
    assert main(args) == 0
    said = capsys.readouterr().out
    assert "10 steps read" in said
    assert "note: " in said and "replace steps 5-7 of " in said
    html = out.read_text()
    assert '"steps":[0,1,2,3,4,5,6,7,8,9]' in html
    assert "its first step logged: 5" in html


def test_logs_that_follow_each_other_replace_nothing(crashed, tmp_path):
    _train(tmp_path / "later", range(8, 11), 8, _first_batch)
    run = sowviz.load(crashed / "exp", tmp_path / "later")
    assert run.history.steps == list(range(11))
    assert run.replaced == []
    assert not any("resumed the run" in n["message"] for n in run.model.get("notes") or [])


def test_three_parts_each_replaced_from_the_next_ones_first_step(crashed, tmp_path):
    # resumed again, from step 8, after `exp-resumed` had logged step 9
    _train(tmp_path / "again", range(8, 12), 8, _first_batch)
    run = sowviz.load(tmp_path / "again", crashed / "exp", crashed / "exp-resumed")
    assert run.history.steps == list(range(12))
    want = _want_losses()[:8] + [_want_loss(_first_batch(s)) for s in range(8, 12)]
    assert [e["loss"] for e in run.history] == pytest.approx(want)
    got = [(r.log.name, r.by.name, r.first, r.last, r.count) for r in run.replaced]
    assert got == [("exp", "exp-resumed", 5, 7, 3), ("exp-resumed", "again", 8, 9, 2)]


def _log_of(w, x):
    return jnp.sum(jnp.log(x) * w)


def _bad_batch(step, bad):
    x = np.full(4, 1.0 + step, np.float32)
    if step in bad:
        x[0] = -1.0
    return x


def test_the_replaced_steps_nonfinite_ones_are_left_out(tmp_path):
    # 3 kept; 6 (recorded) and 7 (unrecorded: every=2) replaced: the resumed run
    # records steps 6 and 8 (every=2 records the even ones), and is finite
    bad = {3, 6, 7}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sowviz.NonFiniteWarning)
        mon = sowviz.Monitor(_log_of, every=2, log_dir=tmp_path / "exp")
        for s in range(9):
            mon.step(jnp.ones(4), jnp.asarray(_bad_batch(s, bad)))
        mon.close()
        mon = sowviz.Monitor(_log_of, every=2, log_dir=tmp_path / "exp-resumed", start_step=5)
        for s in range(5, 9):
            mon.step(jnp.ones(4), jnp.asarray(_bad_batch(s, set())))
        mon.close()
    # (the first log noted step 7 in an N record: its replaced steps' records go too)
    reader = LogReader(tmp_path / "exp")
    reader.read()
    assert 7 in reader.nonfinite_steps
    with np.errstate(invalid="ignore"):  # the non-finite steps kept, apart from sowviz
        want = [s for s in range(5) if not np.isfinite(np.log(_bad_batch(s, bad))).all()]
    assert want == [3]
    run = sowviz.load(tmp_path / "exp", tmp_path / "exp-resumed")
    history = run.model["history"]
    assert history["nonfinite_steps"] == [[3, 3]] and history["nonfinite_count"] == 1
    assert run.nonfinite["step"] == 3  # (the first bad step: re-run, then recorded)
    assert history["steps"] == [0, 2, 3, 4, 6, 8]
    assert history["finite"] == [True, True, False, True, True, True]
    # from step 5, the resumed run's first (its loss logged unrecorded), not 6, its first
    # recorded: step 5's loss is the resumed run's (round 16)
    assert [(r.at, r.first, r.last, r.count) for r in run.replaced] == [(5, 5, 8, 2)]


def test_a_resumed_log_that_begins_while_followed_replaces_the_steps_read(crashed, tmp_path):
    # loaded while the resumed run had logged nothing yet: the first log is read to its
    # end, then the resumed run's first step replaces the steps read from there on
    mon = sowviz.Monitor(_sq, log_dir=tmp_path / "exp-resumed", start_step=5)
    run = sowviz.load(crashed / "exp", tmp_path / "exp-resumed")
    assert run.history.steps == list(range(8)) and run.replaced == []
    for s in range(5, 10):
        mon.step(jnp.asarray(W), jnp.asarray(_resumed_batch(s)))
    mon.flush()
    new = run.refresh()
    assert [e["step"] for e in new] == [5, 6, 7, 8, 9]  # new: the resumed log's
    assert [e["loss"] for e in new] == pytest.approx(_want_losses()[5:])
    assert run.history.steps == list(range(10)) and run.steps_read == 10
    assert [e["loss"] for e in run.history] == pytest.approx(_want_losses())
    assert [(r.first, r.last, r.count) for r in run.replaced] == [(5, 7, 3)]
    assert run.refresh() == []
    mon.close()


def test_two_logs_beginning_at_one_step_are_refused(crashed, tmp_path, capsys):
    _train(tmp_path / "twice", range(5, 7), 5, _first_batch)  # resumed twice from 5
    with pytest.raises(ValueError, match=r"both begin at step 5\..*Leave out the log"):
        sowviz.load(crashed / "exp", crashed / "exp-resumed", tmp_path / "twice")
    assert main(["report", str(crashed / "exp-resumed"), str(tmp_path / "twice")]) == 2
    assert "both begin at step 5" in capsys.readouterr().err


def test_a_followed_log_beginning_before_the_one_it_follows_is_refused(crashed, tmp_path):
    mon = sowviz.Monitor(_sq, log_dir=tmp_path / "late", start_step=0)
    run = sowviz.load(crashed / "exp-resumed", tmp_path / "late")
    mon.step(jnp.asarray(W), jnp.asarray(_first_batch(0)))
    mon.flush()
    with pytest.raises(ValueError, match=r"held no step when it was loaded.*first step is 0"):
        run.refresh()
    mon.close()


def test_an_earlier_log_written_after_a_later_one_was_read_is_refused(tmp_path):
    # two runs writing at once: the earlier log's new step comes after the later's
    first = sowviz.Monitor(_sq, log_dir=tmp_path / "a")
    for s in range(3):
        first.step(jnp.asarray(W), jnp.asarray(_first_batch(s)))
    first.flush()
    _train(tmp_path / "b", range(5, 7), 5, _first_batch)
    run = sowviz.load(tmp_path / "a", tmp_path / "b")
    assert run.history.steps == [0, 1, 2, 5, 6]
    first.step(jnp.asarray(W), jnp.asarray(_first_batch(3)))
    first.flush()
    with pytest.raises(ValueError, match=r"'.*a' gained step 3 after the steps of .*two runs"):
        run.refresh()
    first.close()


def test_logs_of_different_programs_are_still_refused(crashed, tmp_path):
    mon = sowviz.Monitor(lambda w: jnp.sum(jnp.sin(w)), log_dir=tmp_path / "other", start_step=6)
    mon.step(jnp.ones(3))
    mon.close()
    with pytest.raises(ValueError, match="ran different programs"):
        sowviz.load(crashed / "exp", tmp_path / "other")
