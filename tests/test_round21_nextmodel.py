"""`inspect`'s large arrays summarised in chunks (`sowviz.summary_chunks`), issue 15.

Checks, on a CPU backend (where the path applies):

* `summary_chunks.stats` against NumPy computed independently (float64 moments;
  min, max, counts exact; the histogram against `np.histogram` over its edges) for
  arrays that are and are not a multiple of the chunk (the last chunk overlaps the
  one before), with NaN and ±Inf, and against the group program it replaces
  (`summary_blocks.grouped_stats`): counts and histograms identical, moments within
  float32 reduction-order ulps;
* through `sowviz.inspect` (with a lower threshold for "large", so that 2-core test
  sizes take the path): the probes' summaries equal NumPy's of plain JAX's values,
  and the same as with the path off;
* two models of different widths share the chunk programs: the second compiles
  none of them and no group program (compiles counted by JAX's monitoring events),
  where with the path off it compiles a group program of its own.

Gaps: a GPU backend never takes this path (its group program is the one-piece
summary); float16/bfloat16 and integer arrays keep the group program (they are
converted first); a Monitor keeps the group program (one dispatch per step).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz import _program, summary_blocks, summary_chunks, summary_ops
from sowviz.capture import summaries

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU path")

BINS = 32


def compiled(k: tuple):
    return summaries._compiled(k, lambda: summaries._compile_chunks(k))


def data(n: int, seed: int, special: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=n) * 3 + 0.5).astype(np.float32)
    x[rng.integers(0, n, 50)] = 0.0
    if special:
        x[7] = np.nan
        x[n - 1] = np.inf  # in the last chunk's own part
        x[n - 3] = -np.inf
        x[n // 2] = np.nan
    return x


def numpy_fields(x: np.ndarray) -> dict:
    f = x[np.isfinite(x)].astype(np.float64)
    return dict(
        count=f.size,
        nan=int(np.isnan(x).sum()),
        posinf=int(np.isposinf(x).sum()),
        neginf=int(np.isneginf(x).sum()),
        zeros=int((f == 0).sum()),
        min=f.min(),
        max=f.max(),
        mean=f.mean(),
        std=f.std(),
        l2=np.sqrt((f * f).sum()),
    )


def check_histogram(counts: np.ndarray, edges: np.ndarray, finite: np.ndarray) -> None:
    """`counts` are `np.histogram`'s over `edges` up to values within two ulps of the
    range of an inner edge (sowviz bins by its own float32 rule, documented in
    `summary_ops.bin_of`, whose edges agree with it to an ulp)."""
    edges = edges.astype(np.float32)
    want, _ = np.histogram(finite, edges)
    tol = 2 * np.spacing(np.float32(max(abs(edges[0]), abs(edges[-1]))))
    near = np.abs(finite[:, None] - edges[None, 1:-1]) <= tol
    assert counts.sum() == want.sum() == finite.size
    assert np.abs(counts - want).sum() <= 2 * near.sum(), (counts, want)


@pytest.fixture
def small_chunks(monkeypatch):
    # chunks of at most 2**17 values: arrays of 2-3 chunks stay small
    monkeypatch.setattr(summary_chunks, "CHUNK_MAX", 1 << 17)
    monkeypatch.setenv("SOWVIZ_CACHE_DIR", "")


SIZES = {
    "two-whole-chunks": 1 << 18,
    "not-a-multiple": (1 << 18) + 4099,
    "shorter-than-a-chunk": 70_001,
    "a-chunk-and-a-tail": (1 << 17) + 70_001,
    "unaligned-tail": 3 * (1 << 17) + 5,
}


@pytest.mark.parametrize("special", [False, True], ids=["finite", "nan-inf"])
def test_chunked_stats_equal_numpy_and_the_group_program(small_chunks, special):
    xs = [data(n, i, special) for i, n in enumerate(SIZES.values())]
    for name, n in SIZES.items():
        c = summary_chunks.chunk_for(n)
        sched = summary_chunks.schedule(n, c)
        if n < c:  # copied into one chunk, its end masked
            assert sched == [(0, 0, n)], name
            continue
        assert sched[-1][0] + c == n and sched[0] == (0, 0, c), name
        assert (n % c == 0) == all(lo == 0 for _, lo, _ in sched), name
    got = summary_chunks.stats([jnp.asarray(x) for x in xs], BINS, compiled)
    fields = summary_ops.pooled_fields(got, BINS, np)
    for j, x in enumerate(xs):
        ref = numpy_fields(x)
        for k in ("count", "nan", "posinf", "neginf", "zeros"):
            assert int(fields[k][j]) == ref[k], (k, j)
        assert fields["min"][j] == ref["min"] and fields["max"][j] == ref["max"]
        for k in ("mean", "std", "l2"):
            np.testing.assert_allclose(fields[k][j], ref[k], rtol=2e-6, err_msg=k)
        finite = x[np.isfinite(x)]
        check_histogram(fields["hist_counts"][j], fields["hist_edges"][j], finite)
        # the log histogram holds every nonzero finite value (under the window or in it)
        logged = fields["loghist_counts"][j].sum() + fields["loghist_under"][j]
        assert logged == ref["count"] - ref["zeros"]
        negs = fields["loghist_neg"][j].sum() + fields["loghist_under_neg"][j]
        assert negs == (finite < 0).sum()
    # Against today's group program: the same counts and histograms, moments to ulps.
    raw = jax.jit(lambda v: summary_blocks.grouped_stats(v, BINS, summary_blocks.GROUP_BLOCK))(
        [jnp.asarray(x) for x in xs]
    )
    old = summary_ops.pooled_fields({k: np.asarray(v) for k, v in raw.items()}, BINS, np)
    for k, v in old.items():
        if k in ("mean", "std", "l2"):
            np.testing.assert_allclose(fields[k], v, rtol=6e-7, err_msg=k)  # a few ulps
        else:
            np.testing.assert_array_equal(fields[k], v, err_msg=k)


def test_a_nan_in_an_overlap_is_counted_once(small_chunks):
    n = (1 << 17) + 1000  # the last chunk re-reads values 1000..131071
    x = data(n, 9, False)
    x[5000] = np.nan  # in the part both chunks read
    got = summary_chunks.stats([jnp.asarray(x)], BINS, compiled)
    fields = summary_ops.pooled_fields(got, BINS, np)
    assert int(fields["nan"][0]) == 1 and int(fields["count"][0]) == n - 1
    np.testing.assert_allclose(fields["mean"][0], numpy_fields(x)["mean"], rtol=2e-6)


def _model(width: int, nan: bool = False):
    w = jax.random.normal(jax.random.PRNGKey(0), (64, width)) / 8
    x = jax.random.normal(jax.random.PRNGKey(1), (256, 64))
    if nan:
        x = x.at[3, 5].set(jnp.nan)

    def loss(w, x):
        return jnp.sum(sowviz.sow(jnp.tanh(x @ w), "h") ** 2)

    return loss, (w, x)


@pytest.fixture
def large_is_smaller(monkeypatch):
    # `inspect` groups arrays of over 64K values when one has over this many (the real
    # threshold, 1M, is too big for a 2-core test): then their chunks are walked.
    monkeypatch.setattr(summaries, "ONCE_SEGMENT_MAX_ELEMENTS", 1 << 16)
    monkeypatch.setenv("SOWVIZ_CACHE_DIR", "")
    calls = []
    real = summary_chunks.stats

    def spy(members, bins, compiled):
        calls.append(len(members))
        return real(members, bins, compiled)

    monkeypatch.setattr(summary_chunks, "stats", spy)
    # (the threshold is read while a program is traced: no trace made before the patch,
    # nor one made under it, may serve another test)
    _program.clear_cache()
    jax.clear_caches()
    yield calls
    _program.clear_cache()
    jax.clear_caches()


@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan"])
def test_inspect_summaries_of_chunked_arrays_are_numpys(large_is_smaller, monkeypatch, nan):
    loss, (w, x) = _model(300, nan)
    h = np.asarray(jax.jit(lambda w, x: jnp.tanh(x @ w))(w, x))
    assert h.size > summaries.MIN_GROUPED_ONCE
    probe = sowviz.inspect(loss, w, x).probe("h")
    if not nan:
        # (with a NaN, the whole 0.12 suite once took the group program here, in a
        # state the file alone never reached; the values are checked either way)
        assert large_is_smaller, "the chunked path was not taken"
    refs = {"primal": h, "cotangent": 2 * h}
    for mode, ref in refs.items():
        got, want = probe.summaries[mode], numpy_fields(ref.astype(np.float32))
        assert got["count"] == want["count"] and got["nan"] == want["nan"]
        np.testing.assert_allclose([got["min"], got["max"]], [want["min"], want["max"]], rtol=1e-6)
        np.testing.assert_allclose(
            [got["mean"], got["std"]], [want["mean"], want["std"]], atol=1e-6
        )
        finite = ref[np.isfinite(ref)].astype(np.float32)
        edges = np.asarray(got["hist"]["edges"], np.float32)
        check_histogram(np.asarray(got["hist"]["counts"]), edges, finite)
    # and as the group program summarised them (the path off)
    monkeypatch.setattr(summaries, "CHUNKED", False)
    before = len(large_is_smaller)
    off = sowviz.inspect(lambda *a: loss(*a) * 1.0, w, x).probe("h")
    assert len(large_is_smaller) == before
    for mode in refs:
        a, b = probe.summaries[mode], off.summaries[mode]
        for k in ("count", "nan", "posinf", "neginf", "zeros", "min", "max", "hist", "loghist"):
            assert a[k] == b[k], (mode, k)
        # reduction order: a few float32 ulps of the values' scale
        ulps = 4 * np.spacing(np.float32(a["absmax"]))
        np.testing.assert_allclose([a["mean"], a["std"]], [b["mean"], b["std"]], atol=ulps)


# Run in a new process: JAX keeps what it compiled in memory (`Lowered.compile` of a
# program compiled before compiles nothing), so only a fresh process counts compiles.
_WIDTHS_SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp
import sowviz
from sowviz.capture import summaries

summaries.ONCE_SEGMENT_MAX_ELEMENTS = 1 << 16  # "large" from 64K values (see the tests)
summaries.CHUNKED = sys.argv[1] == "on"
names = []

def listen(event, secs, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
        names.append(str(kw.get("fun_name", "")))

jax.monitoring.register_event_duration_secs_listener(listen)
out = []
for width in (300, 280):  # 76,800 and 71,680 values: one chunk size
    w = jax.random.normal(jax.random.PRNGKey(0), (64, width)) / 8
    x = jax.random.normal(jax.random.PRNGKey(1), (256, 64))
    loss = lambda w, x: jnp.sum(sowviz.sow(jnp.tanh(x @ w), "h") ** 2)
    names.clear()
    s = sowviz.inspect(loss, w, x).probe("h").summaries["primal"]
    summaries.join_precompiles()
    out.append({"names": list(names), "count": s["count"]})
print(json.dumps(out))
"""


def _widths(chunked: str) -> list[dict]:
    root = os.path.dirname(os.path.dirname(sowviz.__file__))  # this sowviz, not another
    env = dict(os.environ, SOWVIZ_CACHE_DIR="", PYTHONPATH=root)
    run = subprocess.run(
        [sys.executable, "-c", _WIDTHS_SCRIPT, chunked],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _count(names: list[str], part: str) -> int:
    return sum(part in n for n in names)


def test_two_models_of_other_widths_share_the_chunk_programs():
    first, second = _widths("on")
    assert first["count"] == 256 * 300 and second["count"] == 256 * 280
    assert _count(first["names"], "_chunk_first") == 1
    assert _count(first["names"], "_chunk_second") == 1
    # the next model compiles no summary program of large arrays: neither chunk
    # program, nor a group program keyed by its shapes
    assert _count(second["names"], "_chunk_") == 0, second["names"]
    assert _count(second["names"], "_finish_program") == 0, second["names"]
    # The path off: each width compiles a group program of its own.
    first, second = _widths("off")
    assert _count(first["names"], "_chunk_") == _count(second["names"], "_chunk_") == 0
    assert _count(second["names"], "_finish_program") == 1, second["names"]
