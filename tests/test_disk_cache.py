"""The shared summary program and the probes' layout program are kept on disk: a new
process loads them, and its summaries equal those of freshly compiled ones
(`sowviz._disk_cache`)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz import _disk_cache, _program
from sowviz.capture import summaries

SCRIPT = """
import json, sys
import os
import jax, jax.numpy as jnp
from jax import monitoring
import sowviz
from sowviz.capture import summaries
summaries.HOST_LAYOUT = os.environ.get("HOST_LAYOUT") == "1"

compiled, traced = [], []
def listen(event, secs, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
        compiled.append(str(kw.get("fun_name", "")))
    if event == "/jax/core/compile/jaxpr_trace_duration":
        traced.append(str(kw.get("fun_name", "")))
monitoring.register_event_duration_secs_listener(listen)

def loss(w, x):
    with jax.named_scope("hidden"):
        h = jnp.tanh(x @ w[0])
    with jax.named_scope("out"):
        y = h @ w[1]
    return jnp.mean(y ** 2)

k = jax.random.split(jax.random.PRNGKey(0), 3)
w = [jax.random.normal(k[0], (8, 16)), jax.random.normal(k[1], (16, 4))]
x = jax.random.normal(k[2], (32, 8))
probes = sowviz.inspect(loss, w, x).to_dict()["probes"]
print(json.dumps({"finish_compiles": sum("_finish_program" in n for n in compiled),
                  "finish_traces": sum("_finish_program" in n for n in traced),
                  "layout_compiles": sum("_lay_out_program" in n for n in compiled),
                  "layout_traces": sum("_lay_out_program" in n for n in traced),
                  "probes": probes}, sort_keys=True))
"""


def _run(cache: str, host_layout: bool = False) -> dict:
    env = dict(os.environ, SOWVIZ_CACHE_DIR=cache, HOST_LAYOUT=str(int(host_layout)))
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_new_process_loads_the_summary_program_and_summarises_alike(tmp_path) -> None:
    # A notebook kernel restarted: the second process compiles its own capture program
    # but loads the shared summary program and the layout program, without even
    # tracing them; a process with the cache off compiles them all.
    first = _run(str(tmp_path))
    assert first["finish_compiles"] == first["finish_traces"] == 1
    assert first["layout_compiles"] == first["layout_traces"] == 1
    files = sorted(tmp_path.glob("*.xla"))
    assert len(files) == 2
    second = _run(str(tmp_path))
    assert second["finish_compiles"] == second["finish_traces"] == 0
    assert second["layout_compiles"] == second["layout_traces"] == 0
    uncached = _run("")
    assert uncached["finish_compiles"] == uncached["layout_compiles"] == 1
    assert second["probes"] == uncached["probes"] == first["probes"]
    assert sorted(tmp_path.glob("*.xla")) == files


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="NumPy lays out on a CPU only")
def test_on_a_cpu_the_layout_is_no_program_and_summarises_alike(tmp_path) -> None:
    # On a CPU, NumPy lays the small probes out: no layout program is traced,
    # compiled or kept, and every summary is what the layout program's rows give.
    host = _run(str(tmp_path), host_layout=True)
    assert host["layout_compiles"] == host["layout_traces"] == 0
    assert host["finish_compiles"] == 1
    assert len(list(tmp_path.glob("*.xla"))) == 1
    assert host["probes"] == _run("")["probes"]


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """sowviz and JAX with nothing compiled in memory, the disk cache in `tmp_path`."""
    monkeypatch.setenv(_disk_cache.ENV, str(tmp_path))
    monkeypatch.setattr(summaries, "HOST_LAYOUT", False)  # both programs on disk
    monkeypatch.setattr(summaries, "_COMPILED", {})
    monkeypatch.setattr(summaries, "_STARTED", set())
    _program.clear_cache()
    jax.clear_caches()
    return tmp_path


def _summaries_of(x: jax.Array) -> list:
    def f(x):
        with jax.named_scope("layer"):
            y = jnp.cos(x) * 2.0
        return jnp.sum(y**2)

    return sowviz.inspect(f, x).to_dict()["probes"]


def _forget() -> None:
    summaries._COMPILED.clear()
    summaries._STARTED.clear()
    _program.clear_cache()
    jax.clear_caches()


def test_a_corrupt_file_is_compiled_past_and_replaced(fresh) -> None:
    x = jnp.linspace(-3.0, 3.0, 96).reshape(8, 12)
    want = _summaries_of(x)
    paths = sorted(fresh.glob("*.xla"))  # the layout program and the summary program
    assert len(paths) == 2
    for path in paths:
        good = path.read_bytes()
        path.write_bytes(good[:-100] + b"\0" * 100)  # fails its checksum
        _forget()
        assert _summaries_of(x) == want
        assert path.read_bytes() != good[:-100] + b"\0" * 100
        assert path.read_bytes()[: len(_disk_cache.FORMAT)] == _disk_cache.FORMAT
        path.write_bytes(_disk_cache.FORMAT + b"x" * 40)  # too short to hold a payload
        _forget()
        assert _summaries_of(x) == want
    # the values themselves, against NumPy
    (probe,) = [p for p in want if p["name"] == "layer"]
    y = np.cos(np.asarray(x, np.float64)) * 2.0
    np.testing.assert_allclose(probe["summaries"]["primal"]["mean"], y.mean(), rtol=1e-5)


def _cumsum(n: int):
    return jax.jit(lambda v: jnp.cumsum(v) * 3).lower(jax.ShapeDtypeStruct((n,), jnp.float32))


def test_a_hit_is_loaded_without_lowering_and_the_files_are_bounded(fresh, monkeypatch) -> None:
    device = jax.devices()[0]

    def key(n: int) -> str:
        return _disk_cache._key(("cumsum", n), device)

    monkeypatch.setattr(_disk_cache, "MAX_FILES", 2)
    for age, n in enumerate((5, 6, 7)):
        compiled = _disk_cache.compile_cached(lambda n=n: _cumsum(n), ("cumsum", n))
        np.testing.assert_allclose(compiled(jnp.ones(n)), np.cumsum(np.ones(n)) * 3)
        # distinct ages, oldest first (files written within one clock tick tie)
        os.utime(fresh / f"{key(n)}.xla", (1e9 + age, 1e9 + age))
    assert {p.name for p in fresh.glob("*.xla")} == {f"{key(n)}.xla" for n in (6, 7)}
    loaded = _disk_cache.compile_cached(lambda: pytest.fail("lowered again"), ("cumsum", 7))
    np.testing.assert_allclose(loaded(jnp.arange(7.0)), np.cumsum(np.arange(7.0)) * 3)


def test_the_key_follows_the_program_the_code_its_settings_and_jax_settings(monkeypatch) -> None:
    device = jax.devices()[0]
    base = _disk_cache._key(("cumsum", 5), device)
    assert _disk_cache._key(("cumsum", 5), device) == base
    assert _disk_cache._key(("cumsum", 6), device) != base
    with jax.numpy_rank_promotion("raise"):  # a JAX setting that tracing reads
        assert _disk_cache._key(("cumsum", 5), device) != base
    with monkeypatch.context() as m:  # a constant of the code that builds the program
        m.setattr(summaries, "SEGMENT_ROW", summaries.SEGMENT_ROW * 2)
        assert _disk_cache._key(("cumsum", 5), device) != base
    with monkeypatch.context() as m:  # other sowviz code
        m.setattr(_disk_cache, "_source", lambda: "edited")
        assert _disk_cache._key(("cumsum", 5), device) != base
    assert _disk_cache._key(("cumsum", 5), device) == base


def _no_home(cls):
    raise RuntimeError("Could not determine home directory.")


def test_where_the_cache_lives_and_when_it_is_off(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(_disk_cache.ENV, "")
    assert _disk_cache.cache_dir() is None
    monkeypatch.delenv(_disk_cache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _disk_cache.cache_dir() == tmp_path / "sowviz"
    monkeypatch.delenv("XDG_CACHE_HOME")
    with monkeypatch.context() as m:
        m.setattr(pathlib.Path, "home", classmethod(_no_home))
        assert _disk_cache.cache_dir() is None  # no home directory: off, not an error
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))
    try:  # JAX's own persistent cache keeps the program: sowviz's stays off
        assert _disk_cache.cache_dir() is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_an_unwritable_cache_warns_once_and_still_compiles(tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(_disk_cache.ENV, str(blocker / "cache"))
    monkeypatch.setattr(_disk_cache, "_WARNED", type(_disk_cache._WARNED)())

    def low():
        return jax.jit(lambda v: v * 2).lower(jax.ShapeDtypeStruct((3,), jnp.float32))

    with pytest.warns(UserWarning, match="SOWVIZ_CACHE_DIR"):
        compiled = _disk_cache.compile_cached(low, "double")
    np.testing.assert_allclose(compiled(jnp.ones(3)), 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _disk_cache.compile_cached(low, "double")


def test_a_directory_others_can_write_is_not_loaded_from(tmp_path, monkeypatch) -> None:
    # A file there is unpickled: one that another user could have written is not read.
    monkeypatch.setenv(_disk_cache.ENV, str(tmp_path))

    def low():
        return jax.jit(lambda v: v + 5).lower(jax.ShapeDtypeStruct((2,), jnp.float32))

    _disk_cache.compile_cached(low, "plus five")
    assert len(list(tmp_path.glob("*.xla"))) == 1
    monkeypatch.setattr(_disk_cache, "_load", lambda *a: pytest.fail("loaded"))
    tmp_path.chmod(0o777)
    monkeypatch.setattr(_disk_cache, "_WARNED", type(_disk_cache._WARNED)())
    with pytest.warns(UserWarning, match="others can write"):
        compiled = _disk_cache.compile_cached(low, "plus five")
    np.testing.assert_allclose(compiled(jnp.ones(2)), 6.0)
