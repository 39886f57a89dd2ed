"""TensorBoard event files (written with tensorboardX), read back with TensorBoard's own
EventAccumulator, and their record checksums checked with TensorBoard's own CRC-32C."""

from __future__ import annotations

import importlib
import io
import pathlib
import struct
import sys
import warnings

import numpy as np
import pytest

from sowviz.runlog import make_sinks
from sowviz.runlog.naming import probe_tags

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import runlog_script

pytest.importorskip("tensorboard")
pytest.importorskip("tensorboardX")
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c


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
    checked = constant = 0
    for p in model["probes"]:
        for mode in p["summaries"]:
            tag = f"{names[p['id']]}/{mode}"
            if not any(e["probes"][p["id"]][mode]["hist"]["counts"] for e in entries):
                continue
            assert tag in tags["histograms"], (tag, tags["histograms"])
            events = acc.Histograms(tag)
            assert [ev.step for ev in events] == [e["step"] for e in entries]
            for ev, e in zip(events, entries, strict=True):
                s = e["probes"][p["id"]][mode]
                h = ev.histogram_value
                assert h.num == sum(s["hist"]["counts"])
                if s["min"] == s["max"]:
                    # A constant array (zero biases at step 0): one bucket at its value,
                    # not sowviz's bins widened around it.
                    assert (h.min, h.max, list(h.bucket_limit)) == (s["min"],) * 2 + ([s["min"]],)
                    assert list(h.bucket) == [h.num]
                    constant += 1
                    continue
                # Edges: TensorBoard's min then its bucket limits; counts: its buckets.
                assert [h.min, *h.bucket_limit] == s["hist"]["edges"]
                assert (h.min, h.max) == (s["min"], s["max"])
                assert list(h.bucket) == [float(c) for c in s["hist"]["counts"]]
                checked += 1
            l2 = acc.Scalars(f"{tag}/l2")
            assert [x.value for x in l2] == pytest.approx(
                [e["probes"][p["id"]][mode]["l2"] for e in entries], rel=1e-6
            )
    assert checked >= 2 * len(entries) and constant >= 1
    loss = acc.Scalars("loss")
    assert [x.step for x in loss] == [e["step"] for e in entries]
    assert [x.value for x in loss] == pytest.approx([e["loss"] for e in entries], rel=1e-6)
    # Stage labels name the tags: a histogram per stage and mode.
    assert {"layer_0/primal", "layer_0/cotangent"} <= set(tags["histograms"])
    # A parameter by its path: every layer has a `w`, so its name alone says nothing.
    assert {"parameters/[0]/w/primal", "parameters/[3]/w/cotangent"} <= set(tags["histograms"])
    assert not any(t.rsplit("_p", 1)[-1].isdigit() for t in names.values()), names


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


def records(path: pathlib.Path) -> list[bytes]:
    """The records of a TFRecord file, each checksum checked with TensorBoard's own
    pure-Python masked CRC-32C (the writer uses the compiled `crc32c` package)."""
    data, out, i = path.read_bytes(), [], 0
    while i < len(data):
        header = data[i : i + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[i + 8 : i + 12])
        body = data[i + 12 : i + 12 + length]
        (body_crc,) = struct.unpack("<I", data[i + 12 + length : i + 16 + length])
        assert header_crc == masked_crc32c(header)
        assert body_crc == masked_crc32c(body)
        out.append(body)
        i += 16 + length
    return out


def test_records_checksums_and_live_flush(run, tmp_path):
    from tensorboard.compat.proto import event_pb2

    model, entries = run
    (sink,) = make_sinks(None, tensorboard=tmp_path / "tb")
    sink.open(model)
    for e in entries[:3]:
        sink.write(e)
    # A live TensorBoard sees every step handed over before `flush`, the run still open.
    sink.flush()
    assert [x.step for x in read_back(tmp_path / "tb").Scalars("loss")] == [0, 1, 2]
    for e in entries[3:]:
        sink.write(e)
    sink.close()
    (path,) = (tmp_path / "tb").iterdir()
    assert path.name.startswith("events.out.tfevents.")
    events = [event_pb2.Event.FromString(r) for r in records(path)]
    assert events[0].file_version == "brain.Event:2"
    assert [ev.step for ev in events[1:]] == [e["step"] for e in entries]


def test_two_writers_in_one_directory_keep_separate_files(run, tmp_path):
    model, entries = run
    sinks = [make_sinks(None, tensorboard=tmp_path / "tb")[0] for _ in range(2)]
    for i, s in enumerate(sinks):
        s.open(model)
        s.write({**entries[0], "step": 10 * i})
        s.close()
    assert len(list((tmp_path / "tb").iterdir())) == 2
    assert sorted(x.step for x in read_back(tmp_path / "tb").Scalars("loss")) == [0, 10]


def test_missing_packages(tmp_path, monkeypatch):
    tb_sink = importlib.import_module("sowviz.runlog.tb_sink")
    monkeypatch.setitem(sys.modules, "crc32c", None)  # `import crc32c` fails
    with pytest.warns(RuntimeWarning, match=r"`crc32c` package is not installed"):
        tb_sink.TensorBoardSink(tmp_path / "slow").close()
    monkeypatch.setitem(sys.modules, "tensorboardX.event_file_writer", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ImportError, match=r"pip install 'sowviz\[tensorboard\]'"):
            make_sinks(None, tensorboard=tmp_path / "tb")


def _listing(d: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_a_refused_log_dir_gets_no_event_file(run, tmp_path):
    # The TensorBoard sink was made before the run log refused the directory: a refused
    # second run left an empty event file in the first run's tensorboard/.
    model, entries = run
    log = tmp_path / "log"
    (first, tb) = make_sinks(log, tensorboard=True)
    for s in (first, tb):
        s.open(model)
        s.write(entries[0])
    tb.close()  # the first run's TensorBoard file is complete; its run log still open
    before = _listing(log / "tensorboard")
    assert len(before) == 1
    with pytest.raises(FileExistsError, match="being written by another Monitor"):
        make_sinks(log, tensorboard=True)
    assert _listing(log / "tensorboard") == before
    first.close()
    with pytest.raises(FileExistsError, match="already holds a run log"):
        make_sinks(log, tensorboard=True)
    assert _listing(log / "tensorboard") == before
    assert [x.step for x in read_back(log / "tensorboard").Scalars("loss")] == [entries[0]["step"]]


def test_writing_a_step_runs_no_python_loop_per_bucket(tmp_path):
    # The histograms' bins go into the protos whole (converted in C): a step with 64x
    # more bins runs the same lines of Python, and TensorBoard reads back exactly the
    # NumPy histograms (a Python loop per bucket was most of a step's write).
    from test_runlog import numpy_step, python_lines

    from sowviz.runlog import naming, tb_sink

    few, many = numpy_step(16), numpy_step(1024)
    (sink,) = make_sinks(None, tensorboard=tmp_path / "tb")
    sink._open({})  # called here, on this thread, so that its lines can be counted
    lines = [python_lines(lambda e=e: sink._write(e), tb_sink, naming) for e in (few, many)]
    assert lines[0] == lines[1], lines
    sink.close()
    acc = read_back(tmp_path / "tb")
    for pid, by_mode in many["probes"].items():
        for mode, s in by_mode.items():
            few_h, many_h = (h.histogram_value for h in acc.Histograms(f"{pid}/{mode}"))
            for h, step in ((few_h, few), (many_h, many)):
                s = step["probes"][pid][mode]
                edges = np.asarray(s["hist"]["edges"], np.float64)
                counts = np.asarray(s["hist"]["counts"], np.float64)
                assert (h.min, h.max, h.num) == (edges[0], edges[-1], counts.sum())
                np.testing.assert_array_equal(h.bucket_limit, edges[1:])
                np.testing.assert_array_equal(h.bucket, counts)
                assert h.sum == s["mean"] * counts.sum()
                assert h.sum_squares == (s["std"] ** 2 + s["mean"] ** 2) * counts.sum()


def test_an_all_nan_stage_logs_a_nan_l2_not_zero(tmp_path):
    """A stage whose values are all NaN at one step: its l2 scalar is NaN there (the l2
    of finite values would be the 0.0 of an empty sum: the curve dipped to 0); a stage
    partly finite keeps its finite values' l2."""
    import jax
    import jax.numpy as jnp

    import sowviz

    def loss(w, x, shift):
        pred = x @ w
        return jnp.mean(jnp.log(jnp.abs(pred) + shift))

    w = jnp.ones((4, 1))
    x = jax.random.normal(jax.random.PRNGKey(0), (8, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mon = sowviz.Monitor(loss, log_dir=tmp_path / "log", tensorboard=True)
        for s in range(3):
            mon.step(w, x, jnp.float32(-100.0 if s == 1 else 1.0))  # step 1: log(<0)
        mon.close()
    acc = read_back(tmp_path / "log" / "tensorboard")
    l2 = {e.step: e.value for e in acc.Scalars("log/primal/l2")}
    want = float(jnp.linalg.norm(jnp.log(jnp.abs(x @ w) + 1.0)))
    np.testing.assert_allclose([l2[0], l2[2]], [want, want], rtol=1e-5)
    assert np.isnan(l2[1])
    assert {e.step: e.value for e in acc.Scalars("log/primal/nonfinite")}[1] == 8.0
