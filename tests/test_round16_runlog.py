"""Round 16 (training scripts in a terminal): a run resumed with `every=N` replaces the
killed run's steps from its first step taken, not its first recorded one; a resumed
Monitor with no step left warns at `save_html`; the busy-log error names the user's path."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

import sowviz


def _loss(w, x):
    return jnp.sum((w * x) ** 2)


def _run(log_dir, start, stop, x, every):
    mon = sowviz.Monitor(_loss, log_dir=log_dir, every=every, start_step=start)
    for _ in range(start, stop):
        mon.step(jnp.ones(3), x)
    mon.close()


def test_a_run_resumed_with_every_n_replaces_the_killed_runs_losses_from_its_start(tmp_path):
    # The killed run took steps 0-14 (loss 3.0, recorded at 0, 5, 10); the resumed run
    # goes on from the step-7 checkpoint another way (loss 12.0, recorded at 10). Its
    # steps 7-9 are in its log as unrecorded losses, ahead of step 10's record: the
    # join took the resumed log's start from step 10 and kept the dead run's 7-9.
    a, b = tmp_path / "run", tmp_path / "run-resumed"
    _run(a, 0, 15, jnp.full(3, 1.0), every=5)
    _run(b, 7, 15, jnp.full(3, 2.0), every=5)
    expected = {s: float(_loss(jnp.ones(3), jnp.full(3, 1.0 if s < 7 else 2.0))) for s in range(15)}
    for logs in ((a, b), (b, a)):  # (the order given does not matter)
        view = sowviz.load(*logs)
        losses = view.model["history"]["losses"]
        got = dict(zip(losses["steps"], losses["loss"], strict=True))
        assert got == expected
        (note,) = view.replaced
        assert (note.at, note.first, note.last, note.count) == (7, 7, 14, 1)
        assert "its first step logged: 7" in note.message and "steps 7-14" in note.message


def test_a_resumed_monitor_with_no_step_left_warns_at_save_html(tmp_path):
    mon = sowviz.Monitor(_loss, log_dir=tmp_path / "run-resumed", start_step=10)
    report = tmp_path / "report.html"
    with pytest.warns(UserWarning, match="no step was taken") as caught:
        assert mon.save_html(report) is None
    assert str(report) in str(caught[0].message)
    assert not report.exists()
    mon.close()


def test_the_busy_log_error_suggests_a_path_beside_the_users(tmp_path):
    log = tmp_path / "exp7"
    first = sowviz.Monitor(_loss, log_dir=log)
    first.step(jnp.ones(3), jnp.ones(3))
    with pytest.raises(FileExistsError, match="being written by another Monitor") as err:
        sowviz.Monitor(_loss, log_dir=log)
    assert f"'{log}-eval'" in str(err.value) and "runs/exp1" not in str(err.value)
    first.close()
