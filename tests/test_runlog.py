"""The run log: byte format, writer, reader, thinning, faults, live view, report CLI."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import math
import os
import pathlib
import struct
import subprocess
import sys
import zlib

import jax
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import sowviz
from sowviz.runlog import LogWarning, SinkWarning, load, make_sinks
from sowviz.runlog import format as fmt

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import runlog_script

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run():
    """A real Monitor run: (model without history, the Monitor's entries, the Monitor)."""
    mon = runlog_script.train(12, [], out=io.StringIO())
    return mon.to_dict(with_history=False), list(mon.history), mon


def write_log(log_dir, model, entries, **kw):
    (sink,) = make_sinks(log_dir, **kw)
    sink.open(model)
    for e in entries:
        sink.write(e)
    sink.close()
    return sink


def record_offsets(data: bytes) -> list[int]:
    """Where each record starts, walking the headers by hand (independent of the reader)."""
    offsets, pos = [], 0
    while pos + 12 <= len(data):
        _, length, _ = struct.unpack_from("<4sII", data, pos)
        offsets.append(pos)
        pos += 12 + length
    return offsets


# -- the byte format ---------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(width=32)
    | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=8) | st.dictionaries(st.text(max_size=5), children, max_size=5)
    ),
    max_leaves=40,
)


@given(st.dictionaries(st.text(max_size=5), json_values, max_size=6))
# keys that are the format's own markers (a newer hypothesis found them: they read
# back as a packed dict or an array reference)
@example({"$f": {"": None, "0": None}})
@example({"$f": [None, None]})
@example({"$a": ["<f4", 0, 1]})
@example({"x": {"$a": 1.5, "a": 1.0, "b": 2.0, "c": 3.0, "$$f": 4.0}})
def test_any_entry_round_trips_exactly(entry):
    back = fmt.decode(fmt.encode(entry))
    assert fmt.canonical(back) == fmt.canonical(entry)
    # Types survive too (an int stays an int, a float a float).
    assert json.dumps(back, sort_keys=True, default=str).replace("NaN", "n") == json.dumps(
        entry, sort_keys=True, default=str
    ).replace("NaN", "n")


def test_histograms_are_stored_as_float32_and_int32_when_lossless(run):
    _, entries, _ = run
    e = entries[0]
    payload = fmt.encode(e)
    raw = zlib.decompress(payload)
    (n,) = struct.unpack_from("<I", raw)
    refs = []
    json.loads(raw[4 : 4 + n], object_hook=lambda d: refs.append(d) or d)
    dtypes = {r["$a"][0] for r in refs if "$a" in r}
    assert dtypes <= {"<f4", "<i4"}, dtypes  # sowviz's summaries are float32
    assert fmt.canonical(fmt.decode(payload)) == fmt.canonical(e)


# -- writer and reader -------------------------------------------------------------------


def test_log_reads_back_every_step_and_the_model(run, tmp_path):
    model, entries, mon = run
    sink = write_log(tmp_path / "log", model, entries)
    assert sink.steps_written == len(entries)
    view = load(tmp_path / "log")
    assert view.finished and view.steps_read == len(entries)
    assert [fmt.canonical(e) for e in view.history] == [fmt.canonical(e) for e in entries]
    m = view.model
    want = mon.to_dict()
    assert set(m) == set(want)
    assert m["schema"] == "sowviz/1" and m["nodes"] == json.loads(json.dumps(want["nodes"]))
    assert [p["id"] for p in m["probes"]] == [p["id"] for p in want["probes"]]
    assert m["history"]["steps"] == want["history"]["steps"] == list(range(12))
    assert m["history"]["loss"] == want["history"]["loss"]
    pid = m["probes"][0]["id"]
    mode = next(iter(m["history"]["probes"][pid]))
    assert m["history"]["probes"][pid][mode] == want["history"]["probes"][pid][mode]
    # The model's probes carry the latest step's statistics.
    assert m["probes"][0]["summaries"][mode]["l2"] == entries[-1]["probes"][pid][mode]["l2"]


def test_a_log_of_an_older_writer_without_programs_reads_as_before(run, tmp_path):
    # Before each step named its program (and model.json listed them): no `programs`,
    # and the history's `program` column says none, so readers draw the model's shapes.
    model, entries, mon = run
    assert [e["program"] for e in entries] == [0] * len(entries)
    assert model["programs"] == mon.to_dict()["programs"]
    old = {k: v for k, v in model.items() if k != "programs"}
    write_log(
        tmp_path / "log", old, [{k: v for k, v in e.items() if k != "program"} for e in entries]
    )
    m = load(tmp_path / "log").model
    assert "programs" not in m
    assert m["history"]["program"] == [None] * len(entries)
    assert m["history"]["steps"] == list(range(12))


def test_bytes_per_step_are_what_the_file_holds(run, tmp_path):
    model, entries, _ = run
    sink = write_log(tmp_path / "log", model, entries)
    size = (tmp_path / "log" / "steps.log").stat().st_size
    assert sink.bytes_written == size
    per_step = size / len(entries)
    n_summaries = sum(len(m) for m in entries[0]["probes"].values())
    # Each summary's JSON is ~1.5 KB (65 edges, 64 counts as text); the log stores
    # ~0.4 KB, histograms as float32/int32 and the whole record zlib-compressed.
    text = len(json.dumps(entries[0]))
    assert per_step < 0.5 * text, (per_step, text, n_summaries)


def _written(log_dir, model, entries):
    """A run log in `log_dir` holding `model` and `entries`, flushed; its open sink."""
    (sink,) = make_sinks(log_dir)
    sink.open(model)
    for e in entries:
        sink.write(e)
    sink.flush()
    return sink


def test_refresh_reads_only_new_complete_records(run, tmp_path):
    model, entries, _ = run
    sink = _written(tmp_path / "log", model, entries[:5])
    view = load(tmp_path / "log")
    assert [e["step"] for e in view.history] == [0, 1, 2, 3, 4] and not view.finished
    assert view.refresh() == []
    # Half a record on disk (a writer caught mid-write): not read, not reported.
    record = fmt.frame(fmt.STEP, fmt.encode(entries[5]))
    with open(tmp_path / "log" / "steps.log", "ab") as f:
        f.write(record[:20])
    assert view.reader.read(settle=False) == []
    with open(tmp_path / "log" / "steps.log", "ab") as f:
        f.write(record[20:])
    assert [e["step"] for e in view.refresh()] == [5]
    for e in entries[6:]:
        sink.write(e)
    sink.close()
    assert [e["step"] for e in view.refresh()] == list(range(6, 12))
    assert view.finished


def test_a_cut_off_tail_is_skipped_with_its_offset(run, tmp_path):
    model, entries, _ = run
    write_log(tmp_path / "log", model, entries)
    path = tmp_path / "log" / "steps.log"
    data = path.read_bytes()
    offsets = record_offsets(data)
    cut = offsets[8] + 30  # in the middle of step 8's record
    path.write_bytes(data[:cut])
    with pytest.warns(LogWarning, match=rf"incomplete record at byte offset {offsets[8]}\b"):
        view = load(tmp_path / "log")
    assert [e["step"] for e in view.history] == list(range(8))
    assert [fmt.canonical(e) for e in view.history] == [fmt.canonical(e) for e in entries[:8]]


def test_flipped_bytes_skip_one_record_and_the_rest_reads(run, tmp_path):
    model, entries, _ = run
    write_log(tmp_path / "log", model, entries)
    path = tmp_path / "log" / "steps.log"
    data = bytearray(path.read_bytes())
    offsets = record_offsets(bytes(data))
    data[offsets[3] + 40] ^= 0xFF  # inside step 3's payload
    data[offsets[3] + 41] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.warns(
        LogWarning, match=rf"corrupt bytes at byte offset {offsets[3]}\b.*{offsets[4]}"
    ):
        view = load(tmp_path / "log")
    assert [e["step"] for e in view.history] == [0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11]
    assert view.finished


def test_a_corrupt_last_record_is_skipped_with_its_offset(run, tmp_path):
    model, entries, _ = run
    write_log(tmp_path / "log", model, entries)
    path = tmp_path / "log" / "steps.log"
    data = bytearray(path.read_bytes())
    offsets = record_offsets(bytes(data))
    last_step = offsets[-2]  # the record before the END marker
    data[last_step + 50] ^= 0xFF
    path.write_bytes(bytes(data[: offsets[-1]]))  # and no clean end
    with pytest.warns(LogWarning, match=rf"corrupt bytes at byte offset {last_step}\b"):
        view = load(tmp_path / "log")
    assert [e["step"] for e in view.history] == list(range(11)) and not view.finished


# -- bad input and faults ------------------------------------------------------------


def test_unwritable_log_dir_fails_at_construction(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(ValueError, match=r"`log_dir` .*file/run.* cannot hold a run log"):
        make_sinks(not_a_dir / "run")
    with pytest.raises(ValueError, match=r"`log_dir` .* cannot hold a run log"):
        make_sinks("/proc/sowviz-run")
    with pytest.raises(ValueError, match="`tensorboard=True` writes beside the run log"):
        make_sinks(None, tensorboard=True)


def test_an_existing_log_is_never_appended_to(run, tmp_path):
    model, entries, _ = run
    write_log(tmp_path / "log", model, entries[:2])
    with pytest.raises(FileExistsError, match="already holds a run log") as err:
        make_sinks(tmp_path / "log")
    # a run resumed from a checkpoint meets this: the message says what to do then
    assert f"'{tmp_path / 'log'}-resumed'" in str(err.value) and "start_step=" in str(err.value)
    write_log(tmp_path / "log", model, entries[:3], overwrite=True)
    assert load(tmp_path / "log").steps_read == 3


def test_a_full_disk_warns_once_and_never_raises(run, tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    model, entries, _ = run
    log = tmp_path / "log"
    log.mkdir()
    (log / "steps.log").symlink_to("/dev/full")  # every write: ENOSPC
    (sink,) = make_sinks(log)
    sink.open(model)
    sink.write(entries[0])  # hands over; the failure happens on the writer thread
    with pytest.warns(SinkWarning, match=r"run log stopped .*No space left on device"):
        sink.flush()
    assert sink.disabled
    for e in entries[2:]:  # no second warning, no error
        sink.write(e)
    sink.close()


# -- the whole run, bounded ------------------------------------------------------------


def test_a_20000_step_log_reads_back_bounded_from_step_0(run, tmp_path):
    model, entries, _ = run
    pid = next(iter(entries[0]["probes"]))
    small = {pid: {"primal": entries[0]["probes"][pid]["primal"]}}
    bad = 7919
    (sink,) = make_sinks(tmp_path / "log")
    sink.open(model)
    for step in range(20_000):
        e = {"step": step, "loss": 1.0 / (step + 1), "finite": step != bad, "probes": small}
        if step == bad:
            e["nonfinite"] = {"forward": "n1", "backward": None}
        sink.write(e)
    sink.close()
    view = load(tmp_path / "log", history=100)
    assert view.steps_read == 20_000
    steps = [e["step"] for e in view.history]
    assert len(steps) <= 101  # the limit, plus the pinned first non-finite step
    assert steps[0] == 0 and bad in steps and steps == sorted(steps)
    assert steps[-50:] == list(range(19_950, 20_000))  # the recent half, every step
    assert view.model["history"]["nonfinite"] == {"step": bad, "forward": "n1", "backward": None}
    with pytest.raises(ValueError, match="`history` must be an int >= 2"):
        load(tmp_path / "log", history=1)


class _Tracked(dict):
    """A decoded step that counts how many of its kind are alive."""

    alive = 0

    def __init__(self, *a):
        super().__init__(*a)
        type(self).alive += 1

    def __del__(self):
        type(self).alive -= 1


def test_loading_holds_the_history_not_the_log(run, tmp_path, monkeypatch):
    # `load` decoded every record into one list before the history thinned it: 10 GB for
    # a 98,633-step log. Steps are now handed to the history one at a time.
    from sowviz._history import History
    from sowviz.runlog import reader

    model, entries, _ = run
    n, limit = 400, 20
    written = [{**entries[i % len(entries)], "step": i} for i in range(n)]
    write_log(tmp_path / "log", model, written)
    most = [0]
    real = reader.fmt.decode

    def decode(payload):
        e = _Tracked(real(payload))
        most[0] = max(most[0], _Tracked.alive)
        return e

    monkeypatch.setattr(reader.fmt, "decode", decode)
    view = load(tmp_path / "log", history=limit)
    assert view.steps_read == n
    # the history's entries, the newest (`_latest`) and the one being decoded
    assert most[0] <= limit + 2
    # the same steps as thinning the whole log read at once, and exactly what was written
    want = History(limit)
    for e in written:
        want.add(e)
    assert [e["step"] for e in view.history] == want.steps
    assert [fmt.canonical(e) for e in view.history] == [fmt.canonical(e) for e in want]
    assert view.finished


def test_records_longer_than_a_read_chunk_and_a_corrupt_one_between(run, tmp_path, monkeypatch):
    # The reader takes the file a chunk at a time and grows the chunk for a record longer
    # than it (up to the format's 32 MiB), or for corrupt bytes it must skip.
    from sowviz.runlog import reader

    model, entries, _ = run
    write_log(tmp_path / "log", model, entries)
    path = tmp_path / "log" / "steps.log"
    data = bytearray(path.read_bytes())
    offsets = record_offsets(bytes(data))
    assert min(b - a for a, b in itertools.pairwise(offsets)) > 200
    data[offsets[5] + 40] ^= 0xFF  # inside step 5's payload
    path.write_bytes(bytes(data))
    monkeypatch.setattr(reader, "CHUNK", 100)  # every record is longer
    r = reader.LogReader(tmp_path / "log")
    got = []
    with pytest.warns(LogWarning, match=rf"corrupt bytes at byte offset {offsets[5]}\b"):
        for e in r.steps():
            got.append(e)
            if e["step"] == 2:
                break  # stopped early: the next call goes on after step 2
        got += r.steps()
    assert [e["step"] for e in got] == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    assert [fmt.canonical(e) for e in got] == [fmt.canonical(e) for e in entries if e["step"] != 5]
    assert r.finished and r.offset == len(data)


def test_a_displayed_view_behind_by_more_than_its_history_resends_the_model(run, tmp_path):
    # Steps read for the widget wait in an outbox until the next poll: more than the
    # history holds go as the (thinned) model instead, so the outbox stays bounded too.
    model, entries, _ = run
    sink = _written(tmp_path / "log", model, entries[:3])
    view = load(tmp_path / "log", history=4)
    widget = view.widget
    sent = []
    widget.send = lambda msg, buffers=None: sent.append(msg)
    for e in entries[3:5]:
        sink.write(e)
    sink.flush()
    assert view.poll() == 2 and [m["count"] for m in sent] == [2]  # a few: sent as steps
    for e in entries[5:]:
        sink.write(e)
    sink.close()
    view._read()  # read while not polled (more than 4 steps)
    assert len(view._outbox) <= 4
    view.poll()
    assert [m["count"] for m in sent] == [2]  # no steps message: the model, whole
    assert widget.model["history"]["steps"] == [e["step"] for e in view.history]
    assert widget.model["history"]["steps"][-1] == 11


# -- the live view -------------------------------------------------------------------------


def test_the_displayed_view_sends_new_steps_as_the_monitor_does(run, tmp_path):
    model, entries, _ = run
    sink = _written(tmp_path / "log", model, entries[:3])
    view = load(tmp_path / "log")
    widget = view.widget
    assert widget.model["history"]["steps"] == [0, 1, 2]
    sent = []
    widget.send = lambda msg, buffers=None: sent.append((msg, buffers))
    bundle = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle[0]
    try:
        for e in entries[3:]:
            sink.write(e)
        sink.close()
        view._thread.join(timeout=20)  # follows until the log's clean end
        assert not view._thread.is_alive()
    finally:
        view.stop()
    steps = []
    for msg, buffers in sent:
        assert msg["type"] == "steps" and msg["encoding"] == "gzip-json"
        decoded = json.loads(gzip.decompress(buffers[0]))
        assert len(decoded) == msg["count"]
        steps += [d["step"] for d in decoded]
        for d in decoded:
            want = json.loads(sowviz.report.model_json(entries[d["step"]]))
            assert d == want
    assert steps == list(range(3, 12))


def test_view_before_the_script_wrote_anything(tmp_path, run):
    model, entries, _ = run
    (tmp_path / "log").mkdir()
    view = load(tmp_path / "log")
    assert view.model == {} and len(view.history) == 0
    with pytest.raises(FileNotFoundError, match=r"model\.json is missing"):
        view.save_html(tmp_path / "r.html")
    widget = view.widget
    assert widget.model == {}
    (sink,) = make_sinks(tmp_path / "log", overwrite=True)
    sink.open(model)
    sink.write(entries[0])
    sink.close()
    view.poll()  # the model travels whole once it exists
    assert widget.model["history"]["steps"] == [0]
    with pytest.raises(FileNotFoundError, match="holds no run log"):
        load(tmp_path / "missing")


# -- a training script killed mid-run --------------------------------------------------


def test_sigkill_mid_run_leaves_every_complete_step(tmp_path):
    log = tmp_path / "log"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "runlog_script.py"), str(log), "100000"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    printed: dict[int, str] = {}
    followed: list[dict] = []
    view = None
    try:
        for line in proc.stdout:
            _, step, digest = line.split()
            printed[int(step)] = digest
            if view is None and (log / "model.json").exists():
                view = load(log)
                followed += list(view.history)
            elif view is not None:
                followed += view.refresh()  # a reader following while the script writes
            if len(printed) >= 40:
                break
    finally:
        proc.kill()  # SIGKILL
        proc.wait()
    assert proc.returncode == -9
    # The digests the script printed after each kill-free handover.
    for line in proc.stdout.read().splitlines():
        if line.startswith("STEP"):
            _, step, digest = line.split()
            printed[int(step)] = digest
    proc.stdout.close()
    with _maybe_warns():
        final = load(log)
    got = list(final.history)
    assert not final.finished
    steps = [e["step"] for e in got]
    assert steps == list(range(len(steps)))  # every complete step, from 0, none skipped
    assert len(steps) >= 20
    for e in got:
        if e["step"] in printed:
            assert runlog_script.digest(e) == printed[e["step"]]
    # All but the last few handed-over steps (still queued at the kill) are on disk.
    assert len(steps) >= max(printed) + 1 - 256
    # What the follower saw is a prefix of the final read, equal record for record.
    assert [fmt.canonical(e) for e in followed] == [fmt.canonical(e) for e in got[: len(followed)]]
    assert followed and followed[0]["step"] == 0


class _maybe_warns:
    """A SIGKILL may land between records (no warning) or inside one (a cut-off tail)."""

    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings(record=True)
        self.caught = self._cm.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._cm.__exit__(*exc)
        for w in self.caught:
            assert issubclass(w.category, LogWarning), w
            assert "incomplete record at byte offset" in str(w.message)


# -- the report --------------------------------------------------------------------------


@pytest.mark.browser
def test_report_cli_writes_the_whole_run_and_it_opens(run, tmp_path, page):
    model, entries, _ = run
    write_log(tmp_path / "log", model, entries)
    out = tmp_path / "report.html"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "sowviz",
            "report",
            str(tmp_path / "log"),
            "-o",
            str(out),
            "--history",
            "6",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "12 steps read, 6 kept" in r.stdout
    pg = page.open_report(out)
    embedded = pg.evaluate(
        "() => JSON.parse(document.querySelector('script[data-sowviz-model]').textContent)"
    )
    steps = embedded["history"]["steps"]
    assert steps[0] == 0 and len(steps) <= 6 and steps[-3:] == [9, 10, 11]
    label = next(p["name"] for p in model["probes"] if p["name"].startswith("layer_"))
    pg.locator('[data-kind="scope"]', has_text=label).first.click()
    detail = pg.locator('[data-role="detail"]')
    detail.wait_for(state="visible")
    heat = detail.locator('[data-history="heatmap"]').first
    heat.wait_for(state="attached")
    xs = heat.evaluate("el => el.data && el.data[0] && Array.from(el.data[0].x || [])")
    assert xs == steps, xs  # the history chart starts at step 0
    pg.screenshot(path=str(tmp_path / "report.png"))
    if os.environ.get("SOWVIZ_KEEP_SCREENSHOTS"):
        import shutil

        shutil.copy(tmp_path / "report.png", os.environ["SOWVIZ_KEEP_SCREENSHOTS"])
    assert page.errors == [] and page.requests == []


def test_report_cli_on_a_missing_log(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "sowviz",
            "report",
            str(tmp_path / "nope"),
            "-o",
            str(tmp_path / "r.html"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 2 and "is not a directory" in r.stderr
    assert not (tmp_path / "r.html").exists()


def test_nan_loss_round_trips(run, tmp_path):
    model, entries, _ = run
    bad = {
        **entries[0],
        "step": 99,
        "loss": math.nan,
        "nonfinite": {"forward": "n1", "backward": None},
    }
    write_log(tmp_path / "log", model, [entries[0], bad])
    view = load(tmp_path / "log")
    assert math.isnan(view.history[1]["loss"])
    assert view.model["history"]["nonfinite"] == {"step": 99, "forward": "n1", "backward": None}


# -- through the Monitor, as a user meets it ----------------------------------------------


def test_monitor_log_dir_reads_back_what_the_monitor_held(tmp_path):
    params = runlog_script.init()
    x, y = runlog_script.batch()
    mon = sowviz.Monitor(runlog_script.loss, log_dir=tmp_path / "log", tensorboard=True)
    for _ in range(5):
        _, grads = mon.step(params, x, y)
        params = [{k: p[k] - 0.05 * g[k] for k in p} for p, g in zip(params, grads, strict=True)]
    mon.close()
    view = load(tmp_path / "log")
    assert view.finished
    assert [fmt.canonical(e) for e in view.history] == [fmt.canonical(e) for e in mon.history]
    want = mon.to_dict()
    got = view.model
    assert [p["id"] for p in got["probes"]] == [p["id"] for p in want["probes"]]
    assert {p["name"] for p in got["probes"]} >= {"layer_0", "layer_3"}
    assert got["history"]["steps"] == want["history"]["steps"] == [0, 1, 2, 3, 4]
    assert list((tmp_path / "log" / "tensorboard").glob("events.out.tfevents.*"))


def test_monitor_with_an_unwritable_log_dir_fails_at_construction(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match=r"`log_dir` .* cannot hold a run log"):
        sowviz.Monitor(runlog_script.loss, log_dir=f / "run")


def test_monitor_keeps_training_on_a_full_disk(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    log = tmp_path / "log"
    log.mkdir()
    (log / "steps.log").symlink_to("/dev/full")
    params = runlog_script.init()
    x, y = runlog_script.batch()
    plain = jax.jit(jax.value_and_grad(runlog_script.loss))
    mon = sowviz.Monitor(runlog_script.loss, log_dir=log)
    with pytest.warns(SinkWarning, match="No space left on device") as caught:
        for _ in range(4):
            value, _ = mon.step(params, x, y)
            want, _ = plain(params, x, y)
            assert float(value) == pytest.approx(float(want), rel=1e-6)
            mon.flush()
        mon.close()
    assert sum(issubclass(w.category, SinkWarning) for w in caught) == 1
    assert [e["step"] for e in mon.history] == [0, 1, 2, 3]


def test_the_view_picks_up_a_rewritten_model(run, tmp_path):
    model, entries, _ = run
    (sink,) = make_sinks(tmp_path / "log")
    sink.open({**model, "probes": []})  # the graph first, before the probe list is known
    sink.write(entries[0])
    sink.flush()
    view = load(tmp_path / "log")
    widget = view.widget
    assert view.model["probes"] == [] and widget.model["probes"] == []
    sink.open(model)  # the Monitor opens its sinks again once the probes are known
    sink.write(entries[1])
    sink.close()
    view.poll()
    assert [p["id"] for p in widget.model["probes"]] == [p["id"] for p in model["probes"]]
    assert widget.model["history"]["steps"] == [0, 1]


def test_report_cli_on_a_directory_that_is_no_run_log(tmp_path, capsys):
    from sowviz.__main__ import main

    # the Monitor's `tensorboard/` subdirectory, given instead of its `log_dir`
    tb = tmp_path / "exp1" / "tensorboard"
    tb.mkdir(parents=True)
    (tb / "events.out.tfevents.1.host").write_bytes(b"")
    assert main(["report", str(tb), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "is not a Monitor's run log" in err and "tensorboard --logdir" in err
    assert str(tmp_path / "exp1") in err and "sowviz report: sowviz:" not in err
    # a run that has recorded nothing yet: its empty steps.log, no model
    run = tmp_path / "early"
    run.mkdir()
    (run / "steps.log").write_bytes(b"")
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 2
    assert "the run wrote no model yet" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()
    # no command: the help, and the exit status of a usage error
    assert main([]) == 2
    assert "commands:" in capsys.readouterr().err


def test_two_writers_of_one_log_dir_are_refused_at_construction(run, tmp_path):
    # A second Monitor given the same `log_dir` (before either recorded a step) would
    # interleave its steps with the first's: refused, naming the fix.
    model, entries, _ = run
    (first,) = make_sinks(tmp_path / "log")
    with pytest.raises(FileExistsError, match="being written by another Monitor"):
        make_sinks(tmp_path / "log")
    first.open(model)
    for e in entries[:2]:
        first.write(e)
    first.close()
    assert [e["step"] for e in load(tmp_path / "log").history] == [e["step"] for e in entries[:2]]
    with pytest.raises(FileExistsError, match="already holds a run log"):
        make_sinks(tmp_path / "log")


def test_a_log_that_recorded_no_step_is_taken_by_the_next_run(run, tmp_path):
    # A script that stopped before its first recorded step (a typo, a step that fails
    # to trace) left an end record and nothing else: running it again, fixed, works.
    model, entries, _ = run
    write_log(tmp_path / "log", model, [])
    assert (tmp_path / "log" / "steps.log").stat().st_size > 0
    write_log(tmp_path / "log", model, entries[:3])
    view = load(tmp_path / "log")
    assert view.steps_read == 3 and view.finished


def test_a_log_cut_off_inside_its_first_step_is_kept(run, tmp_path):
    # An incomplete record is a step being written (or cut by a kill): never replaced.
    model, entries, _ = run
    write_log(tmp_path / "log", model, entries[:1])
    steps = tmp_path / "log" / "steps.log"
    first = record_offsets(steps.read_bytes())[1]
    steps.write_bytes(steps.read_bytes()[: first - 5])
    with pytest.raises(FileExistsError, match="already holds a run log"):
        make_sinks(tmp_path / "log")


# -- the cost of encoding a step ---------------------------------------------------------


def numpy_step(bins: int, probes: int = 3) -> dict:
    """A Monitor-shaped step whose histograms have `bins` bins, from NumPy arrays (the
    values a reader must give back exactly)."""
    rng = np.random.default_rng(bins)
    out = {}
    for k in range(probes):
        by_mode = {}
        for mode in ("primal", "cotangent"):
            values = rng.normal(size=1000).astype(np.float32)
            counts, edges = np.histogram(values, bins=bins)
            by_mode[mode] = {
                "count": 1000,
                "nan": 0,
                "zeros": 0,
                "min": float(values.min()),
                "max": float(values.max()),
                "mean": float(values.mean()),
                "std": float(values.std()),
                "l2": float(np.linalg.norm(values.astype(np.float64))),
                "absmax": float(np.abs(values).max()),
                "hist": {"edges": edges.astype(np.float32).tolist(), "counts": counts.tolist()},
            }
        out[f"p{k}"] = by_mode
    return {"step": 3, "loss": 0.25, "finite": True, "probes": out}


def python_lines(fn, *modules) -> int:
    """How many lines of Python in `modules`' files run during `fn()` (a loop's body
    counts once per iteration)."""
    files = {m.__file__ for m in modules}
    count = 0

    def local(frame, event, arg):
        nonlocal count
        count += event == "line"
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename in files else None

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(old)
    return count


def test_encoding_a_step_runs_no_python_loop_per_value():
    # The work per step is per array (a dict or list in the step), not per number: a
    # step with 64x more histogram bins runs the same lines of Python. (A step's ~100
    # lists of ~65 values were checked in a Python loop, value by value.)
    few, many = numpy_step(16), numpy_step(1024)
    assert python_lines(lambda: fmt.encode(few), fmt) == python_lines(lambda: fmt.encode(many), fmt)
    for step in (few, many):
        back = fmt.decode(fmt.encode(step))
        for pid, by_mode in step["probes"].items():
            for mode, s in by_mode.items():
                got = back["probes"][pid][mode]
                # exactly the NumPy values, with their types: float32 edges, int counts
                np.testing.assert_array_equal(
                    np.asarray(got["hist"]["edges"], np.float32), s["hist"]["edges"]
                )
                assert got["hist"]["counts"] == s["hist"]["counts"]
                assert all(type(c) is int for c in got["hist"]["counts"])
                assert [got[k] for k in ("min", "max", "mean", "std", "l2")] == [
                    s[k] for k in ("min", "max", "mean", "std", "l2")
                ]


def test_sinks_count_their_threads_cpu_building_entries_apart_from_writing(tmp_path):
    # A Monitor hands its sinks lazy entries, built on the first sink's thread: the
    # sinks' CPU time says how much of their cost is that and how much their writing.
    import time

    class Lazy:
        def __init__(self, entry, cpu):
            self.entry, self.cpu = entry, cpu

        def materialize(self):
            start = time.thread_time()
            while time.thread_time() - start < self.cpu:
                pass
            return self.entry

    step = numpy_step(64)
    (sink,) = make_sinks(tmp_path / "log")
    sink.open({"probes": []})
    sink.write(Lazy(step, 0.05))
    sink.close()
    assert sink.cpu_entries >= 0.05
    assert 0 < sink.cpu_writing < 0.05
    assert [fmt.canonical(e) for e in load(tmp_path / "log").history] == [fmt.canonical(step)]


def stacked_rows(members: int) -> tuple[np.ndarray, list]:
    """`members` float32 arrays of 50 values (one all NaN: no finite value; one with
    infinities), summarised as one stack, and its members as `SummaryRow`s."""
    from sowviz.summary import summarize, to_host
    from sowviz.summary_data import SummaryRow, stack_rows

    x = np.random.default_rng(members).normal(size=(members, 50)).astype(np.float32)
    x[3], x[5, :3], x[7, :2] = np.nan, np.inf, 0.0
    stack = to_host(jax.vmap(lambda v: summarize(v, bins=8))(jax.numpy.asarray(x)))
    rows = stack_rows(stack)
    return x, [SummaryRow(rows, j, (50,), "float32", False) for j in range(members)]


def test_a_monitor_entry_builds_its_stacks_statistics_without_python_per_row_or_value():
    # A recorded step keeps each summary's statistics and histogram (`_entry`): built
    # for a whole stack at once, a row costs its call (3 lines: `stats_json`, `stats`),
    # nothing per field or value. Each row's whole JSON was built (its loghist lists
    # too, ~25 lines a row) and mostly thrown away, on the sinks' thread holding the GIL.
    from sowviz import _entry, summary_data
    from sowviz.inspection import Probe

    def entry_lines(members: int) -> int:
        _, rows = stacked_rows(members)
        probes = [Probe(f"p{j}", "w", "", "n1", True, {"primal": r}) for j, r in enumerate(rows)]
        return python_lines(lambda: [_entry.lite_summaries(p) for p in probes], summary_data)

    per_row = (entry_lines(256) - entry_lines(16)) / 240
    assert per_row <= 3, f"{per_row} lines of summary_data per row of a stack"
    x, rows = stacked_rows(64)
    for j, row in enumerate(rows):
        (got,) = _entry.lite_summaries(Probe("p", "w", "", "n1", True, {"primal": row})).values()
        v = x[j]
        finite = v[np.isfinite(v)]
        assert list(got) == [*sowviz.summary.STAT_KEYS, "hist"]
        assert type(got) is dict  # not `Float32Json`: an entry's floats are plain ones
        assert [got[k] for k in ("count", "nan", "posinf", "neginf", "zeros")] == [
            finite.size,
            np.isnan(v).sum(),
            np.isposinf(v).sum(),
            np.isneginf(v).sum(),
            (v == 0).sum(),
        ]
        assert all(type(got[k]) is int for k in ("count", "nan", "posinf", "neginf", "zeros"))
        stack = row.rows._stack
        if finite.size == 0:
            # (l2 too: no finite value, no norm; was 0.0 until round 19)
            assert [got[k] for k in ("min", "max", "mean", "std", "l2", "absmax")] == [None] * 6
        else:
            assert (got["min"], got["max"]) == (float(finite.min()), float(finite.max()))
            assert got["absmax"] == float(np.abs(finite).max())
            for k, want in [("mean", finite.mean()), ("std", finite.std())]:
                assert got[k] == float(getattr(stack, k)[j])
                assert got[k] == pytest.approx(float(want), rel=1e-5, abs=1e-6)
            assert got["l2"] == pytest.approx(float(np.linalg.norm(finite.astype(np.float64))))
        assert got["hist"] == {
            "edges": stack.hist_edges[j].tolist(),
            "counts": stack.hist_counts[j].tolist(),
        }
        assert sum(got["hist"]["counts"]) == finite.size
        full = row.to_json()  # the summary's own JSON: the same values, the same types
        assert json.dumps(got) == json.dumps({k: full[k] for k in got})
