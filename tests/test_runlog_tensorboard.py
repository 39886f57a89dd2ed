"""TensorBoard event files, read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import io
import pathlib
import sys

import pytest

from sowviz.runlog import make_sinks
from sowviz.runlog.naming import probe_tags

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import runlog_script

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing import event_accumulator as ea


@pytest.fixture(scope="module")
def run():
    mon = runlog_script.train(6, [], out=io.StringIO())
    return mon.to_dict(with_history=False), list(mon.history)


def read_back(logdir) -> ea.EventAccumulator:
    acc = ea.EventAccumulator(
        str(logdir), size_guidance={ea.HISTOGRAMS: 0, ea.SCALARS: 0, ea.TENSORS: 0}
    )
    acc.Reload()
    return acc


def test_histograms_and_scalars_equal_sowviz_summaries(run, tmp_path):
    model, entries = run
    sinks = make_sinks(tmp_path / "log", tensorboard=True)
    assert [type(s).__name__ for s in sinks] == ["LogSink", "TensorBoardSink"]
    for s in sinks:
        s.open(model)
    for e in entries:
        for s in sinks:
            s.write(e)
    for s in sinks:
        s.close()
    acc = read_back(tmp_path / "log" / "tensorboard")
    tags = acc.Tags()
    names = probe_tags(model)
    checked = 0
    for p in model["probes"]:
        for mode in p["summaries"]:
            tag = f"{names[p['id']]}/{mode}"
            if not any(e["probes"][p["id"]][mode]["hist"]["counts"] for e in entries):
                continue
            assert tag in tags["histograms"], (tag, tags["histograms"])
            events = acc.Histograms(tag)
            assert [ev.step for ev in events] == [e["step"] for e in entries]
            for ev, e in zip(events, entries):
                s = e["probes"][p["id"]][mode]
                h = ev.histogram_value
                # Edges: TensorBoard's min then its bucket limits; counts: its buckets.
                assert [h.min, *h.bucket_limit] == s["hist"]["edges"]
                assert list(h.bucket) == [float(c) for c in s["hist"]["counts"]]
                assert h.num == sum(s["hist"]["counts"])
                checked += 1
            l2 = acc.Scalars(f"{tag}/l2")
            assert [x.value for x in l2] == pytest.approx(
                [e["probes"][p["id"]][mode]["l2"] for e in entries], rel=1e-6
            )
    assert checked >= 2 * len(entries)
    loss = acc.Scalars("loss")
    assert [x.step for x in loss] == [e["step"] for e in entries]
    assert [x.value for x in loss] == pytest.approx([e["loss"] for e in entries], rel=1e-6)
    # Stage labels name the tags: a histogram per stage and mode.
    assert {"layer_0/primal", "layer_0/cotangent"} <= set(tags["histograms"])


def test_tensorboard_directory_alone(run, tmp_path):
    model, entries = run
    (sink,) = make_sinks(None, tensorboard=tmp_path / "tb")
    sink.open(model)
    sink.write(entries[0])
    sink.close()
    acc = read_back(tmp_path / "tb")
    assert [x.step for x in acc.Scalars("loss")] == [0]
    assert not (tmp_path / "tb" / "steps.log").exists()


def test_unwritable_tensorboard_directory(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match=r"TensorBoard directory .* is not writable"):
        make_sinks(None, tensorboard=f / "tb")
