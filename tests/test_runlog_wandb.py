"""W&B: the same histograms and scalars, logged offline, read back with wandb's own reader
(`wandb leet inspect --json` prints the records of the run's `.wandb` file; no network)."""

from __future__ import annotations

import io
import json
import pathlib
import subprocess
import sys

import pytest

from sowviz.runlog import make_sinks
from sowviz.runlog.naming import probe_tags

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import runlog_script

wandb = pytest.importorskip("wandb")


@pytest.fixture(scope="module")
def run():
    mon = runlog_script.train(4, [], out=io.StringIO())
    return mon.to_dict(with_history=False), list(mon.history)


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    wb = wandb.init(
        project="sowviz-test", dir=str(tmp_path), settings=wandb.Settings(console="off")
    )
    yield wb
    if wandb.run is not None:
        wandb.finish()


def read_history(tmp_path: pathlib.Path) -> list[dict]:
    (path,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    cli = pathlib.Path(sys.executable).parent / "wandb"
    out = subprocess.run(
        [str(cli), "leet", "inspect", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [r["history"] for r in records if r.get("type") == "history"]


def test_histograms_and_scalars_reach_an_offline_run(run, offline, tmp_path):
    model, entries = run
    (sink,) = make_sinks(None, wandb=True)
    assert sink.run is offline
    sink.open(model)
    for e in entries:
        sink.write(e)
    sink.close()
    wandb.finish()
    history = read_history(tmp_path)
    assert [h["item"]["sowviz/step"] for h in history] == [e["step"] for e in entries]
    names = probe_tags(model)
    checked = 0
    for h, e in zip(history, entries, strict=True):
        item = h["item"]
        assert item["sowviz/loss"] == pytest.approx(e["loss"], rel=1e-12)
        for pid, by_mode in e["probes"].items():
            for mode, s in by_mode.items():
                tag = f"sowviz/{names[pid]}/{mode}"
                assert item[f"{tag}/l2"] == pytest.approx(s["l2"], rel=1e-12)
                if sum(s["hist"]["counts"]):
                    assert item[f"{tag}._type"] == "histogram"
                    assert item[f"{tag}.bins"] == s["hist"]["edges"]  # sowviz's own bins
                    assert item[f"{tag}.values"] == s["hist"]["counts"]
                    checked += 1
    assert checked >= 2 * len(entries)


def test_wandb_without_a_run_is_a_clear_error():
    assert wandb.run is None
    with pytest.raises(ValueError, match=r"there is none: call `wandb\.init"):
        make_sinks(None, wandb=True)
    with pytest.raises(TypeError, match="`wandb` must be True or a W&B run"):
        make_sinks(None, wandb="yes")


def test_a_finished_run_stops_the_sink_with_one_warning(run, offline):
    from sowviz.runlog import SinkWarning

    model, entries = run
    (sink,) = make_sinks(None, wandb=True)
    sink.open(model)
    wandb.finish()  # the user ends the run while the Monitor still logs
    sink.write(entries[0])
    with pytest.warns(SinkWarning, match="W&B logger stopped"):
        sink.flush()
    sink.write(entries[1])  # no error, no second warning
    sink.close()


def test_a_monitor_logging_late_loses_no_row_beside_the_user_s_own(run, offline, tmp_path):
    # Summaries reach the host a few steps late (read in batches): with `step=` W&B
    # dropped sowviz's rows behind the user's own `wandb.log` of later steps.
    model, entries = run
    (sink,) = make_sinks(None, wandb=True)
    sink.open(model)
    for i in range(len(entries) + 3):
        wandb.log({"mine/lr": 0.1 * i})  # the user's metric, every step
        if i >= 3:  # sowviz's row of step i - 3 arrives now
            sink.write(entries[i - 3])
            sink.flush()
    sink.close()
    wandb.finish()
    history = read_history(tmp_path)
    ours = [h["item"]["sowviz/step"] for h in history if "sowviz/step" in h["item"]]
    mine = [h["item"]["mine/lr"] for h in history if "mine/lr" in h["item"]]
    assert ours == [e["step"] for e in entries]
    assert mine == pytest.approx([0.1 * i for i in range(len(entries) + 3)])
