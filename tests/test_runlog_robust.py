"""The run log meeting real scripts: a `log_dir` removed mid-run, a notebook retrying a
Monitor whose first step failed, `log_dir=""`, and TensorBoard/W&B tags of the repeated
equations of a Python loop."""

from __future__ import annotations

import gc
import os
import re
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz.runlog import LogReader, SinkWarning, load, make_sinks


def _mse(w, x):
    return jnp.mean((x @ w) ** 2)


def _not_scalar(w, x):  # the bug a notebook fixes and runs again: grad needs a scalar
    return (x @ w) ** 2


W, X = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3), jnp.linspace(0.5, 2.0, 20).reshape(5, 4)


def _plain_loss(i: int) -> float:
    w, x = np.asarray(W, np.float64), np.asarray(X, np.float64) * (1 + i)
    return float(np.mean((x @ w) ** 2))


def _sink_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, SinkWarning)]


# -- a `log_dir` removed while the Monitor writes ----------------------------------------


@pytest.mark.parametrize("recreated", [False, True], ids=["removed", "replaced"])
def test_a_removed_log_dir_warns_once_per_file_and_the_history_stays(tmp_path, recreated):
    pytest.importorskip("tensorboardX")
    log = tmp_path / "run"
    mon = sowviz.Monitor(_mse, log_dir=log, tensorboard=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            mon.step(W, X * (1 + i))
        mon.flush()
        shutil.rmtree(log)  # a cleanup job, or the user deleting "the old run"
        if recreated:
            log.mkdir()  # and another run made it again: not this Monitor's files
        for i in range(3, 12):
            mon.step(W, X * (1 + i))
        mon.close()
    said = _sink_warnings(caught)
    assert len(said) == 2, said  # one per file: the run log and the TensorBoard events
    run_log, tb = sorted(said, key=lambda s: "TensorBoard" in s)
    assert f"'{log / 'steps.log'}' was deleted" in run_log and f"`log_dir` '{log}'" in run_log
    assert "noticed at step 3" in run_log and "mon.save_html" in run_log
    assert "TensorBoard event file" in tb and str(log / "tensorboard") in tb
    # The history in memory holds every step, with the losses plain NumPy gives.
    assert [e["step"] for e in mon.history] == list(range(12))
    for e in mon.history:
        assert e["loss"] == pytest.approx(_plain_loss(e["step"]), rel=1e-5)
    # nothing written into a directory of the same name made after the removal
    assert not log.exists() or list(log.iterdir()) == []


def test_a_removed_log_dir_is_said_at_close_when_no_step_came_after(tmp_path):
    log = tmp_path / "run"
    mon = sowviz.Monitor(_mse, log_dir=log)
    mon.step(W, X)
    mon.flush()
    shutil.rmtree(log)
    with pytest.warns(SinkWarning, match="noticed at close"):
        mon.close()


def test_a_log_dir_moved_mid_run_keeps_every_step_where_it_went(tmp_path):
    # A rename loses nothing (the open files keep a name): no warning, the log goes on.
    pytest.importorskip("tensorboardX")
    from tensorboard.backend.event_processing import event_accumulator as ea

    mon = sowviz.Monitor(_mse, log_dir=tmp_path / "run", tensorboard=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SinkWarning)
        for i in range(2):
            mon.step(W, X * (1 + i))
        mon.flush()
        (tmp_path / "run").rename(tmp_path / "moved")
        for i in range(2, 5):
            mon.step(W, X * (1 + i))
        mon.close()
    steps = LogReader(tmp_path / "moved").read()
    assert [e["loss"] for e in steps] == pytest.approx([_plain_loss(i) for i in range(5)], 1e-5)
    acc = ea.EventAccumulator(str(tmp_path / "moved" / "tensorboard"))
    acc.Reload()
    assert [s.step for s in acc.Scalars("loss")] == [0, 1, 2, 3, 4]


# -- a Monitor whose first step failed: the next one takes its log -----------------------


def test_a_dropped_monitor_whose_first_step_failed_gives_up_its_log(tmp_path):
    log = tmp_path / "run"
    mon = sowviz.Monitor(_not_scalar, log_dir=log)
    with pytest.raises(TypeError, match="scalar"):
        mon.step(W, X)
    del mon
    gc.collect()
    fixed = sowviz.Monitor(_mse, log_dir=log)  # was FileExistsError "being written by another"
    values = [float(fixed.step(W, X * (1 + i))[0]) for i in range(3)]
    fixed.close()
    assert values == pytest.approx([_plain_loss(i) for i in range(3)], rel=1e-5)
    steps = LogReader(log).read()
    assert [e["step"] for e in steps] == [0, 1, 2]
    assert [e["loss"] for e in steps] == pytest.approx(values, rel=1e-6)


def test_a_monitor_whose_first_step_failed_gives_up_its_log_while_still_held(tmp_path):
    # A notebook keeps the failed Monitor (the cell's variable, the last traceback):
    # running the fixed cell again takes the log, and the old one writes no more there.
    pytest.importorskip("tensorboardX")
    log = tmp_path / "run"
    old = sowviz.Monitor(_mse, log_dir=log, tensorboard=True)
    with pytest.raises(TypeError):
        old.step(W, X.T)  # shapes that do not multiply
    new = sowviz.Monitor(_mse, log_dir=log, tensorboard=True)
    new.step(W, X)
    with pytest.warns(SinkWarning, match="taken by a newer Monitor") as caught:
        old.step(W, X * 2)  # the old one, stepped again: warned once, and never logged
        old.step(W, X * 3)
        old.flush()
    assert len(_sink_warnings(caught)) == 1
    assert [e["step"] for e in old.history] == [0, 1]  # its own history goes on
    new.step(W, X * 4)
    new.close()
    old.close()
    steps = LogReader(log).read()
    assert [e["loss"] for e in steps] == pytest.approx([_plain_loss(0), _plain_loss(3)], rel=1e-5)
    # one event file holds steps: the old Monitor's TensorBoard writer wrote none
    from tensorboard.backend.event_processing import event_accumulator as ea

    files = sorted((log / "tensorboard").glob("events.out.tfevents.*"))
    loss_steps = []
    for f in files:
        acc = ea.EventAccumulator(str(f))
        acc.Reload()
        if "loss" in acc.Tags()["scalars"]:
            loss_steps.append([s.step for s in acc.Scalars("loss")])
    assert loss_steps == [[0, 1]]


def test_a_monitor_that_ran_a_step_or_none_yet_keeps_its_log(tmp_path):
    log = tmp_path / "run"
    first = sowviz.Monitor(_mse, log_dir=log)
    with pytest.raises(FileExistsError, match="being written by another Monitor"):
        sowviz.Monitor(_mse, log_dir=log)  # never stepped: two writers by mistake
    first.step(W, X)
    with pytest.raises(TypeError):
        first.step(W, X.T)  # a later step failing leaves the steps before it
    with pytest.raises(FileExistsError, match="being written by another Monitor"):
        sowviz.Monitor(_mse, log_dir=log)
    first.close()
    assert [e["loss"] for e in LogReader(log).read()] == pytest.approx([_plain_loss(0)], rel=1e-5)


def test_a_dropped_monitor_that_ran_steps_closes_its_log_for_the_next_run(tmp_path):
    log = tmp_path / "run"
    mon = sowviz.Monitor(_mse, log_dir=log)
    for i in range(2):
        mon.step(W, X * (1 + i))
    mon.flush()
    del mon
    gc.collect()
    with pytest.raises(FileExistsError, match="already holds a run log"):
        sowviz.Monitor(_mse, log_dir=log)
    view = load(log)
    assert view.finished  # closed by the refused run: its end record is written
    losses = [e["loss"] for e in view.history]
    assert losses == pytest.approx([_plain_loss(0), _plain_loss(1)], rel=1e-5)


# -- log_dir="" ------------------------------------------------------------------------------


@pytest.mark.parametrize("tensorboard", [False, True])
def test_an_empty_log_dir_is_refused(tmp_path, monkeypatch, tensorboard):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"`log_dir` is the empty string.*`log_dir=None`"):
        sowviz.Monitor(_mse, log_dir=os.environ.get("SOWVIZ_NO_SUCH_VAR", ""))
    with pytest.raises(ValueError, match="empty string"):
        make_sinks("", tensorboard=tensorboard)
    assert list(tmp_path.iterdir()) == []


# -- TensorBoard and W&B tags of a Python loop's repeated equations ---------------------------


def _mlp(params, x):
    for layer in params[:-1]:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def _mlp_loss(params, x, y):
    return jnp.mean((_mlp(params, x) - y) ** 2)


def _mlp_args():
    ks = jax.random.split(jax.random.PRNGKey(0), 3)
    params = [{"w": jax.random.normal(k, (8, 8)) / 3, "b": jnp.zeros(8)} for k in ks]
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 8))
    return params, x, jnp.zeros((4, 8))


def _plain_tanh_outputs(params, x) -> list[np.ndarray]:
    h, out = np.asarray(x, np.float64), []
    for layer in params[:-1]:
        h = np.tanh(h @ np.asarray(layer["w"], np.float64) + np.asarray(layer["b"], np.float64))
        out.append(h)
    return out


def _is(h, want: np.ndarray) -> bool:
    """Whether TensorBoard's histogram `h` is of the values `want`."""
    return (
        h.num == want.size
        and abs(h.min - want.min()) < 1e-6
        and abs(h.max - want.max()) < 1e-6
        and abs(h.sum / h.num - want.mean()) < 1e-6
    )


def test_tensorboard_tags_of_a_loop_are_the_paths_probe_takes(tmp_path):
    pytest.importorskip("tensorboardX")
    from tensorboard.backend.event_processing import event_accumulator as ea

    params, x, y = _mlp_args()
    mon = sowviz.Monitor(_mlp_loss, log_dir=tmp_path / "run", tensorboard=True)
    for _ in range(2):
        mon.step(params, x, y)
    mon.close()
    acc = ea.EventAccumulator(
        str(tmp_path / "run" / "tensorboard"), size_guidance={"histograms": 0}
    )
    acc.Reload()
    tags = acc.Tags()["histograms"]
    assert not [t for t in tags if re.search(r"_p\d+(/|$)", t)]  # no probe ids
    ins = sowviz.inspect(_mlp_loss, params, x, y)
    # every tag names its probe as `Inspection.probe` takes it, spaces as underscores
    # (`x @ w + b`, the return line's box: `x_@_w_+_b`; `naming.probe_tags`)
    paths = {ins.probe_path(p).replace(" ", "_"): p for p in ins.probes}
    for tag in tags:
        stage = tag.rsplit("/", 1)[0]
        assert stage in paths, (stage, sorted(paths))
        assert [e.step for e in acc.Histograms(tag)] == [0, 1]  # the same tag at every step
    # The two layers' tanh outputs, computed apart: each is one tag's histogram, the
    # second layer's named as the graph numbers a repeated label (`tanh`, `tanh#2`).
    found = []
    for want in _plain_tanh_outputs(params, x):
        hits = [
            t
            for t in tags
            if t.endswith("/primal")
            and all(_is(e.histogram_value, want) for e in acc.Histograms(t))
        ]
        assert len(hits) == 1, hits
        found.append(hits[0].removesuffix("/primal"))
    assert found[1] == found[0] + "#2" and found[0].startswith("_mlp/"), found


class _Run:
    """What `WandbSink` calls of a W&B run: `define_metric` and `log` (rows kept)."""

    def __init__(self):
        self.rows = []

    def define_metric(self, *args, **kwargs):
        pass

    def log(self, row):
        self.rows.append(row)


def test_wandb_keys_of_a_loop_are_the_same_paths():
    pytest.importorskip("wandb")
    from sowviz.runlog.naming import probe_tags

    params, x, y = _mlp_args()
    run = _Run()
    mon = sowviz.Monitor(_mlp_loss, wandb=run)
    mon.step(params, x, y)
    mon.close()
    (row,) = run.rows
    names = probe_tags(mon.to_dict(with_history=False))
    ins = sowviz.inspect(_mlp_loss, params, x, y)
    for want in _plain_tanh_outputs(params, x):
        (probe,) = [p for p in ins.probes if _is_summary(p.summaries["primal"], want)]
        key = f"sowviz/{ins.probe_path(probe)}/primal/l2"
        assert key == f"sowviz/{names[probe.id]}/primal/l2"
        assert row[key] == pytest.approx(np.linalg.norm(want), rel=1e-5)


def _is_summary(s: dict, want: np.ndarray) -> bool:
    return (
        s["count"] == want.size
        and abs(s["min"] - want.min()) < 1e-6
        and abs(s["max"] - want.max()) < 1e-6
    )


# -- Ctrl-C just after a NaN step ----------------------------------------------------------

_CTRL_C_AFTER_A_NAN_STEP = """
import sys
import jax.numpy as jnp
import sowviz

def loss(w, x):
    return jnp.mean(jnp.log(x @ w) ** 2)  # NaN where `x @ w` <= 0

mon = sowviz.Monitor(loss, log_dir=sys.argv[1], throttle=3600.0)
for i in range(4):  # step 3 is NaN; all 4 wait on the device, unread
    x = jnp.full((4, 3), 0.5 * (1 + i)).at[0, 0].set(-9.0 if i == 3 else 0.5 * (1 + i))
    mon.step(jnp.ones((3, 2)), x)
raise KeyboardInterrupt  # Ctrl-C, right after the NaN step
"""


def test_ctrl_c_after_a_nan_step_exits_as_interrupted_with_every_step_logged(tmp_path):
    # The Monitor's exit hook re-ran step 3 to locate its NaN and warned at exit: a
    # warning at the exit of an interrupted script makes Python exit with status 1 (not
    # 130), attributed to `sys:1`. Its steps are written; the locate is skipped.
    import signal
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "train.py"
    script.write_text(_CTRL_C_AFTER_A_NAN_STEP)
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "log")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert r.returncode == -signal.SIGINT, r.stderr  # (status 130 in a shell)
    assert "sys:1" not in r.stderr
    said = [line for line in r.stderr.splitlines() if line.startswith("sowviz: ")]
    assert len(said) == 1 and "NonFiniteWarning" in said[0] and "step 3" in said[0], said
    assert "Ctrl-C" in said[0] and "`log`" in said[0]
    run = load(tmp_path / "log")
    assert run.finished and [e["step"] for e in run.history] == [0, 1, 2, 3]
    want = []
    for i in range(4):
        x = np.full((4, 3), 0.5 * (1 + i))
        x[0, 0] = -9.0 if i == 3 else 0.5 * (1 + i)
        with np.errstate(invalid="ignore"):
            want.append(np.mean(np.log(x @ np.ones((3, 2))) ** 2))
    np.testing.assert_allclose([e["loss"] for e in run.history], want, rtol=1e-5)
    assert run.model["history"]["nonfinite"]["step"] == 3


# -- random-number plumbing in TensorBoard / W&B ---------------------------------------------


def _dropout_loss(w, x, key):
    h = jnp.tanh(x @ w)
    keep = jax.random.bernoulli(key, 0.75, h.shape)  # as a dropout layer draws its mask
    return jnp.mean(jnp.where(keep, h / 0.75, 0.0) ** 2)


def test_a_samplers_internals_get_no_tag_and_the_run_log_keeps_them(tmp_path):
    # Flax NNX's Dropout gave TensorBoard `MLP/dropout/bernoulli/uniform/
    # convert_element_type/[0]/primal` (the scalar 0.0, every step) and three more such
    # tags per dropout layer: `jax.random.uniform`'s draws and constant bounds.
    pytest.importorskip("wandb")

    key = jax.random.key(0)
    run = _Run()
    mon = sowviz.Monitor(_dropout_loss, argnums=0, wandb=run, log_dir=tmp_path / "log")
    mon.step(W, X, key)
    mon.close()
    (row,) = run.rows
    assert not [k for k in row if "uniform" in k or "convert_element_type" in k], list(row)
    model = mon.to_dict(with_history=False)
    nodes = {n["id"]: n for n in model["nodes"]}
    tags = sowviz.runlog.naming.probe_tags(model)
    left = [p for p in model["probes"] if p["id"] in tags.left_out]
    assert len(left) >= 3  # the draws and the two converted bounds, at least

    def labels_above(node):
        out = []
        while node is not None:
            out.append(nodes[node]["label"])
            node = nodes[node].get("parent")
        return out

    for p in left:
        assert "uniform" in labels_above(p["node"]) and tags[p["id"]] not in str(list(row))
    # every other probe is there; the user's own stages with their values
    for p in model["probes"]:
        if p["id"] not in tags.left_out:
            assert f"sowviz/{tags[p['id']]}/primal/l2" in row
    want = np.linalg.norm(np.tanh(np.asarray(X, np.float64) @ np.asarray(W, np.float64)))
    assert row["sowviz/h/primal/l2"] == pytest.approx(want, rel=1e-5)  # `h = jnp.tanh(…)`
    # the run log keeps every probe, the sampler's too
    (entry,) = load(tmp_path / "log").history
    assert {p["id"] for p in left} <= set(entry["probes"])


def test_a_log_dir_under_home_is_written_and_read_there(tmp_path, monkeypatch):
    """`log_dir="~/runs/exp"` lands in the home directory (it made a directory named
    `~` under the working directory), and `sowviz.load` reads it from there."""
    import jax.numpy as jnp

    import sowviz

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    mon = sowviz.Monitor(lambda w: jnp.sum(w**2), log_dir="~/runs/exp")
    mon.step(jnp.arange(3.0))
    mon.close()
    assert (home / "runs" / "exp" / "model.json").is_file()
    assert not (work / "~").exists()
    assert [e["loss"] for e in sowviz.load("~/runs/exp").history] == [5.0]
