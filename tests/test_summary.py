"""Tests of sowviz.summary against statistics computed independently in NumPy.

The NumPy reference below follows the rules stated in the module docstring of
`sowviz.summary` (float32 values, subnormals count as zeros, the histogram edge
and bin rule); it never calls the code under test for expected values.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from sowviz import summary as summary_mod
from sowviz import summary_ops
from sowviz.summary import Summary, SummaryOptions, summarize, summarize_tree, to_host
from sowviz.summary_data import Float32Json, SummaryRow
from sowviz.summary_ops import LOG_BINS

ROOT = pathlib.Path(__file__).resolve().parents[1]
F32 = np.float32
F32_MAX = float(np.finfo(F32).max)
F32_EPS = float(np.finfo(F32).eps)
F32_TINY = float(np.finfo(F32).tiny)
BINS = 16  # one static value in the property tests: one compilation per dtype and shape
SHAPES = [(), (7,), (2, 3, 4), (0,)]
SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0]

JSON_KEYS = {
    "shape", "dtype", "size", "complex", "count", "nan", "posinf", "neginf", "zeros",
    "min", "max", "mean", "std", "l2", "absmax", "hist", "loghist",
}  # fmt: skip

# Deterministic whatever profile is loaded: CI must never fail by chance.
settings.register_profile(
    "summary",
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


# --------------------------------------------------------------------------
# NumPy reference


def _rule(vals: np.ndarray, lo: float, hi: float, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """The documented edge and bin rule of sowviz.summary, in float32 NumPy: (edges, bin of
    each value)."""
    lo, hi = F32(lo), F32(hi)
    if lo == hi:
        pad = max(F32(0.5), abs(lo) / F32(1024))
        lo, hi = max(lo - pad, F32(-F32_MAX)), min(hi + pad, F32(F32_MAX))
    m = max(abs(lo), abs(hi))
    scale = F32(2.0 ** (np.frexp(m)[1] - 1)) if m > 0 else F32(1)
    scale = max(scale, F32(F32_TINY / F32_EPS))  # never below tiny/eps (2**-103)
    lo_s, hi_s = lo / scale, hi / scale
    min_width = F32(bins * 8 * F32_EPS)
    if hi_s - lo_s < min_width:
        mid = lo_s / F32(2) + hi_s / F32(2)
        lo = np.clip((mid - min_width / F32(2)) * scale, -F32_MAX, lo).astype(F32)
        hi = np.clip((mid + min_width / F32(2)) * scale, hi, F32_MAX).astype(F32)
        lo_s, hi_s = lo / scale, hi / scale
    width = F32(hi_s - lo_s)
    t = np.arange(bins + 1, dtype=F32) / F32(bins)
    edges = ((lo_s + width * t) * scale).astype(F32)
    edges[0], edges[-1] = lo, hi
    edges = np.clip(edges, lo, hi)
    pos = np.floor((vals.astype(F32) / scale - lo_s) * (F32(bins) / width))
    return edges, np.clip(pos, 0, bins - 1).astype(np.int64)


def log_grid(keys: np.ndarray) -> np.ndarray:
    """Value-space lower edges of float32 log-bin keys: 2**e * (1 + m/4) (exact in float64)."""
    keys = np.asarray(keys, np.int64)
    return np.ldexp(1 + (keys & 3) / 4, (keys >> 2) - 127)


def log_reference(mags: np.ndarray, absmax: float, negs: np.ndarray) -> dict[str, Any]:
    """The fixed log grid by np.histogram over its value-space edges (no bit tricks);
    `negs` are the magnitudes of the negative values among `mags`."""
    top = int(np.searchsorted(log_grid(np.arange(1024)), absmax, side="right")) - 1
    start = max(top - (LOG_BINS - 1), 4)
    edges = log_grid(np.arange(start, start + LOG_BINS + 1))
    return {
        "start": start,
        "edges": edges,
        "counts": np.histogram(mags.astype(np.float64), bins=edges)[0],
        "under": int((mags < edges[0]).sum()),
        "neg": np.histogram(negs.astype(np.float64), bins=edges)[0],
        "under_neg": int((negs < edges[0]).sum()),
    }


def reference(a: np.ndarray, bins: int) -> dict[str, Any]:
    """Expected statistics of `a`, computed in NumPy (moments in float64)."""
    is_complex = np.iscomplexobj(a)
    v = (np.abs(a) if is_complex else a).astype(F32).ravel()
    v = np.where(np.abs(v) < F32_TINY, F32(0), v)  # subnormals are zeros
    fin = np.isfinite(v)
    nonzero = fin & (v != 0)
    f = v[fin].astype(np.float64)
    ref: dict[str, Any] = {
        "count": int(fin.sum()),
        "nan": int(np.isnan(v).sum()),
        "posinf": int((v == np.inf).sum()),
        "neginf": int((v == -np.inf).sum()),
        "zeros": int((fin & ~nonzero).sum()),
        "values": v[fin],
        "mags": np.abs(v[nonzero]),
        "negs": np.abs(v[nonzero & (v < 0)]),
    }
    if f.size:
        ref |= {
            "min": f.min(),
            "max": f.max(),
            "mean": f.mean(),
            "std": f.std(),
            "l2": float(np.sqrt(np.sum(f * f))),
            "absmax": np.abs(f).max(),
        }
    lo, hi = (ref["min"], ref["max"]) if f.size else (0.0, 0.0)
    ref["hist_edges"], idx = _rule(v[fin], lo, hi, bins)
    ref["hist_counts"] = np.bincount(idx, minlength=bins)
    ref["log"] = log_reference(ref["mags"], ref.get("absmax", 0.0), ref["negs"])
    return ref


def _near_edge(values: np.ndarray, edges: np.ndarray, tol: float) -> int:
    if values.size == 0:
        return 0
    return int((np.abs(values[:, None] - edges[None, :].astype(np.float64)) <= tol).any(1).sum())


def assert_histogram_close(values: np.ndarray, edges: np.ndarray, counts: np.ndarray, tol: float):
    """`counts` are np.histogram(values, edges), up to values within `tol` of an edge."""
    assert counts.sum() == values.size
    assert np.all(np.diff(edges.astype(np.float64)) > 0), edges
    expected = np.histogram(values.astype(np.float64), bins=edges.astype(np.float64))[0]
    assert np.abs(counts - expected).sum() <= 2 * _near_edge(values, edges, tol), (counts, expected)


def check_against_reference(s: Summary, a: np.ndarray, bins: int) -> None:
    ref = reference(a, bins)
    h = to_host(s)
    exact = not np.iscomplexobj(a)  # |x| may differ by an ulp between NumPy and XLA
    for k in ("count", "nan", "posinf", "neginf", "zeros"):
        assert int(getattr(h, k)) == ref[k], (k, getattr(h, k), ref[k])
    js = s.to_json()
    json.dumps(js, allow_nan=False)  # valid JSON: no NaN, no infinity
    assert js["complex"] is (not exact)
    assert js["shape"] == list(a.shape) and js["size"] == a.size and js["dtype"] == str(a.dtype)
    if ref["count"] == 0:
        for k in ("min", "max", "mean", "std", "absmax"):
            assert js[k] is None
        assert js["l2"] is None  # no finite value: no norm (was 0.0, round 19)
        assert sum(js["hist"]["counts"]) == 0 and sum(js["loghist"]["counts"]) == 0
    else:
        absmax = ref["absmax"]
        if exact:
            assert float(h.min) == ref["min"] and float(h.max) == ref["max"]
            assert float(h.absmax) == absmax
        else:
            np.testing.assert_allclose(
                [h.min, h.max, h.absmax], [ref["min"], ref["max"], absmax], rtol=1e-6
            )
        # Results below the smallest normal may be flushed to 0 (documented).
        atol = 1e-5 * absmax + F32_TINY
        np.testing.assert_allclose(float(h.mean), ref["mean"], rtol=1e-5, atol=atol)
        np.testing.assert_allclose(float(h.std), ref["std"], rtol=1e-4, atol=atol)
        if ref["l2"] > F32_MAX:
            # inf on the device, the float64 norm in JSON (`summary_data.norm_json`)
            assert float(h.l2) == math.inf and not isinstance(js, Float32Json)
            np.testing.assert_allclose(js["l2"], ref["l2"], rtol=1e-4)
        else:
            np.testing.assert_allclose(float(h.l2), ref["l2"], rtol=1e-5, atol=F32_TINY)
    # hist: the documented rule exactly, and np.histogram up to values on an edge.
    assert h.hist_edges.shape == (bins + 1,) and h.hist_counts.shape == (bins,)
    scale = max(abs(float(h.hist_edges[0])), abs(float(h.hist_edges[-1])))
    tol = 2 * F32_EPS * scale + F32_TINY  # edges below tiny may be flushed to 0
    assert np.all(np.diff(h.hist_edges.astype(np.float64)) > 0), h.hist_edges
    if exact:
        # XLA may fuse lo + width * t into one FMA: edges agree to an ulp of the range.
        np.testing.assert_allclose(h.hist_edges, ref["hist_edges"], rtol=0, atol=tol)
        np.testing.assert_array_equal(h.hist_counts, ref["hist_counts"])
    assert_histogram_close(ref["values"], h.hist_edges, h.hist_counts, tol)
    if ref["count"]:
        # The edges cover the summary's own [min, max] (pinned), whatever NumPy's |x| says.
        assert h.hist_edges[0] <= h.min and h.hist_edges[-1] >= h.max
        floor = max(2.0 ** (np.frexp(scale)[1] - 1), F32_TINY / F32_EPS)
        if ref["max"] - ref["min"] >= 2 * bins * 8 * F32_EPS * floor:
            # Not widened: the edges are linspace(min, max).
            lin = np.linspace(float(h.min), float(h.max), bins + 1)
            np.testing.assert_allclose(h.hist_edges, lin, rtol=0, atol=4 * F32_EPS * scale)
    # loghist: a fixed grid, checked by np.histogram over its value-space edges.
    log = ref["log"]
    assert h.loghist_counts.shape == (LOG_BINS,)
    if exact:
        assert int(h.loghist_start) == log["start"]
        np.testing.assert_array_equal(h.loghist_counts, log["counts"])
        assert int(h.loghist_under) == log["under"]
        # Signed: how many of each bin's values (and of the underflow) are negative.
        np.testing.assert_array_equal(h.loghist_neg, log["neg"])
        assert int(h.loghist_under_neg) == log["under_neg"]
    else:
        assert abs(int(h.loghist_start) - log["start"]) <= 1
        assert int(h.loghist_counts.sum() + h.loghist_under) == ref["mags"].size
        assert int(h.loghist_neg.sum() + h.loghist_under_neg) == 0  # |x| is never negative
    np.testing.assert_allclose(
        s.loghist_edges, np.log10(log_grid(int(h.loghist_start) + np.arange(LOG_BINS + 1)))
    )
    lj = js["loghist"]
    assert sum(lj["counts"]) + lj["under"] == ref["mags"].size
    assert sum(lj["neg"]) + lj["under_neg"] == ref["negs"].size
    assert len(lj["neg"]) == len(lj["counts"])
    assert all(0 <= n <= c for n, c in zip(lj["neg"], lj["counts"], strict=True))
    assert len(lj["edges"]) == (len(lj["counts"]) + 1 if lj["counts"] else 0)
    if lj["counts"]:
        assert lj["counts"][0] > 0 and lj["counts"][-1] > 0  # trimmed to the non-empty span
        assert np.all(np.diff(lj["edges"]) > 0)
        top = np.log10(float(h.absmax))
        assert lj["edges"][-2] <= top + 1e-12 < lj["edges"][-1]  # absmax is in the last bin


# --------------------------------------------------------------------------
# Strategies


def _floats(width: int) -> st.SearchStrategy[float]:
    finite = st.floats(width=width, allow_nan=False, allow_infinity=False, allow_subnormal=False)
    return st.one_of(st.sampled_from(SPECIALS), finite, finite)


def _elements(dtype: Any) -> st.SearchStrategy[Any] | None:
    if dtype in (np.float32, jnp.bfloat16):
        return _floats(32)
    if dtype == np.float16:
        return _floats(16)
    if dtype == np.complex64:
        part = st.one_of(st.sampled_from(SPECIALS), st.floats(-(2.0**60), 2.0**60, width=32))
        return st.builds(complex, part, part)
    return None  # hypothesis' default covers the whole range of ints and bools


@st.composite
def arrays(draw: st.DrawFn, dtype: Any) -> np.ndarray:
    shape = draw(st.sampled_from(SHAPES))
    if dtype == jnp.bfloat16:  # hypothesis has no bfloat16: round float32 values
        return draw(hnp.arrays(np.float32, shape, elements=_elements(dtype))).astype(dtype)
    return draw(hnp.arrays(dtype, shape, elements=_elements(dtype)))


DTYPES = [np.float32, np.float16, jnp.bfloat16, np.int32, np.int8, np.uint8, np.bool_, np.complex64]


# --------------------------------------------------------------------------
# Properties over dtypes and shapes


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@settings(settings.get_profile("summary"))
@given(data=st.data())
def test_matches_numpy(dtype: Any, data: st.DataObject) -> None:
    a = data.draw(arrays(dtype))
    check_against_reference(summarize(a, bins=BINS), a, BINS)


# Inputs hypothesis once found failing, kept as fixed cases: a bf16 mean of 1.68e-39
# (flushed to 0 by XLA), and a complex max whose float32 |x| is an ulp above
# NumPy's (the last edge must cover the summary's own max).
REGRESSIONS = [
    pytest.param(np.array([1.17549e-38, 0, 0, 0, 0, 0, 0], jnp.bfloat16), id="bf16-subnormal-mean"),
    pytest.param(
        np.array([math.nan, 0, 3.4668592e15 + 6.271216e16j, complex(math.nan, 1)], np.complex64),
        id="complex-max-ulp",
    ),
    pytest.param(np.array([1.2e-38, 0, 0], np.float32), id="tiny-range"),
]


@pytest.mark.parametrize("a", REGRESSIONS)
def test_regressions(a: np.ndarray) -> None:
    check_against_reference(summarize(a, bins=BINS), a, BINS)


_X64_SCRIPT = """
import json, numpy as np
from sowviz.summary import summarize
a = np.array([1.0, 2.0, np.nan, 1e300, -1e-300, 2.0**70], np.float64)
s = summarize(a, bins=16)
print(json.dumps({"dtype": str(s.mean.dtype), "js": s.to_json()}))
"""


def test_float64_stays_float64_with_x64() -> None:
    # Nothing in the test session enables x64 (it is process-wide), so run a child.
    import subprocess
    import sys

    env = dict(os.environ, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join([*sys.path, str(ROOT)])
    out = subprocess.run(
        [sys.executable, "-c", _X64_SCRIPT], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    js = got["js"]
    f = np.array([1.0, 2.0, 1e300, -1e-300, 2.0**70])
    assert got["dtype"] == "float64" and js["dtype"] == "float64"
    assert (js["count"], js["nan"], js["max"], js["min"]) == (5, 1, 1e300, -1e-300)
    np.testing.assert_allclose(js["mean"], f.mean(), rtol=1e-12)
    np.testing.assert_allclose(js["std"], (f / 1e300).std() * 1e300, rtol=1e-12)  # 4e299
    assert js["hist"]["edges"][0] == -1e-300 and js["hist"]["edges"][-1] == 1e300
    # float64's own log grid: the largest value's bin holds 1e300 exactly once.
    assert js["loghist"]["edges"][-2] <= 300 < js["loghist"]["edges"][-1]


def test_64bit_numpy_input_without_x64() -> None:
    assert not jax.config.jax_enable_x64
    js = summarize(np.array([2**62, 5, -(2**40)], np.int64)).to_json()
    assert (
        js["dtype"] == "int64" and js["max"] == float(np.float32(2**62)) and js["min"] == -(2**40)
    )
    js = summarize(np.array([2**63 + 5, 1], np.uint64)).to_json()
    assert js["dtype"] == "uint64" and js["max"] == float(np.float32(2**63))
    js = summarize(np.array([1.5, -2.25, np.inf, 0.0], np.float64)).to_json()
    assert js["dtype"] == "float64" and (js["min"], js["max"], js["posinf"]) == (-2.25, 1.5, 1)
    js = summarize(2**40).to_json()  # a Python int is int64 to NumPy
    assert js["max"] == 2.0**40
    for bad in ([1e300, 1.0], [1e-300, 1.0], [1.0, 3.5e38]):
        with pytest.raises(ValueError, match="jax_enable_x64"):
            summarize(np.array(bad, np.float64))
    with pytest.raises(ValueError, match="jax_enable_x64"):
        summarize(np.array([1e300j], np.complex128))
    with pytest.raises(TypeError, match="numeric array"):
        summarize(np.array(["a"]))


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([math.nan] * 6, id="all-nan"),
        pytest.param([0.0] * 6, id="all-zero"),
        pytest.param([-2.5] * 6, id="constant"),
        pytest.param([3e7] * 6, id="constant-large"),
        pytest.param([3e38, -1e38, 1e38, 2.0, math.nan], id="near-limit"),
        pytest.param([3.4e38, 3.4e38, -3.4e38, 1.0], id="l2-overflows"),
        pytest.param([-3.4e38, 3.4e38], id="full-range"),
        pytest.param([1.0, 1.0 + 2**-23, 1.0 + 2**-22], id="few-ulps"),
        pytest.param([math.inf, -math.inf, 0.0, 1e-45], id="no-nonzero-finite"),
        pytest.param([1e-30, 1e30, -1e-30, 5.0], id="wide-logs"),
        pytest.param([1.2e-38, 0.0, 0.0], id="tiny-range"),
        pytest.param([-1.2e-38, 1.2e-38], id="tiny-range-around-zero"),
        pytest.param([2e-38, 3e-38, 2.5e-38], id="tiny-values"),
        pytest.param([1e-20, 2e-20], id="squares-underflow"),
        pytest.param([3e19, -2e19, 1.0], id="squares-overflow"),
    ],
)
def test_edge_cases(values: list[float]) -> None:
    a = np.array(values, F32)
    s = summarize(a, bins=BINS)
    check_against_reference(s, a, BINS)
    h = to_host(s)
    for field in ("mean", "std"):
        assert np.isfinite(getattr(h, field))
    assert np.all(np.isfinite(h.hist_edges)) and np.all(np.isfinite(h.loghist_edges))
    assert np.all(np.diff(h.hist_edges) > 0) and np.all(np.diff(h.loghist_edges) > 0)


def test_constant_lands_in_one_bin_of_a_sensible_range() -> None:
    h = to_host(summarize(np.full((5,), 7.0, F32), bins=4))
    np.testing.assert_array_equal(h.hist_edges, [6.5, 6.75, 7.0, 7.25, 7.5])
    np.testing.assert_array_equal(h.hist_counts, [0, 0, 5, 0])
    assert float(h.std) == 0.0 and float(h.mean) == 7.0


def test_max_lands_in_last_bin_and_min_in_first() -> None:
    a = np.linspace(-1, 3, 101, dtype=F32)
    h = to_host(summarize(a, bins=4))
    np.testing.assert_array_equal(h.hist_counts, [25, 25, 25, 26])
    np.testing.assert_array_equal(h.hist_edges, [-1, 0, 1, 2, 3])


def test_near_limit_moments_do_not_overflow() -> None:
    a = np.array([3e38, 2.9e38, 3.1e38, -3e38], F32)
    h = to_host(summarize(a))
    f = a.astype(np.float64)
    np.testing.assert_allclose(float(h.mean), f.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(h.std), f.std(), rtol=1e-5)
    assert float(h.l2) == math.inf  # the true norm, 5.2e38, is beyond float32
    np.testing.assert_allclose(summarize(a).to_json()["l2"], np.linalg.norm(f), rtol=1e-4)


def test_large_array_moments_are_accurate() -> None:
    a = np.random.default_rng(2).normal(3.0, 2.0, size=(1024, 1024)).astype(F32)
    h = to_host(summarize(a))
    f = a.astype(np.float64)
    np.testing.assert_allclose([h.mean, h.std], [f.mean(), f.std()], rtol=1e-5)
    np.testing.assert_allclose(float(h.l2), np.sqrt(np.sum(f * f)), rtol=1e-5)
    assert int(h.hist_counts.sum()) == a.size


def test_subnormals_count_as_zeros() -> None:
    js = summarize(np.array([1e-45, -1e-40, 0.0, 2.0], F32)).to_json()
    assert js["zeros"] == 3 and sum(js["loghist"]["counts"]) == 1


def test_integer_extremes_and_bool() -> None:
    a = np.array([np.iinfo(np.int32).min, np.iinfo(np.int32).max, 0, -1], np.int32)
    check_against_reference(summarize(a, bins=BINS), a, BINS)
    js = summarize(np.array([True, False, True])).to_json()
    assert (js["count"], js["zeros"], js["max"], js["nan"]) == (3, 1, 1.0, 0)


def test_complex_by_magnitude() -> None:
    js = summarize(np.array([3 + 4j, -5j, 0, complex(math.nan, 1)], np.complex64)).to_json()
    assert js["complex"] is True and js["dtype"] == "complex64"
    assert (js["count"], js["nan"], js["zeros"], js["min"], js["max"]) == (3, 1, 1, 0.0, 5.0)


@pytest.mark.parametrize("shape", [(0,), (2, 0, 3)])
def test_empty(shape: tuple[int, ...]) -> None:
    js = summarize(np.zeros(shape, F32)).to_json()
    assert js["size"] == 0 and js["count"] == 0 and js["shape"] == list(shape)
    json.dumps(js, allow_nan=False)


# --------------------------------------------------------------------------
# Finite arrays match NumPy, and a NaN more changes nothing but the NaN count


PLAIN = [
    pytest.param(np.random.default_rng(3).normal(size=100), id="small"),
    pytest.param(np.random.default_rng(4).normal(2.0, 3.0, size=20_000), id="large"),
    pytest.param(np.array([0.0, 0.0, -0.0, 5.0, -1.0, 0.0]), id="zeros"),
    pytest.param(np.zeros(7), id="all-zero"),
    pytest.param(np.array([3e38, -1e38, 1e38, 2.0]), id="near-limit"),
    pytest.param(np.array([2e38, 1.8e38, 1.9e38]), id="above-2**127"),
    pytest.param(np.array([1.5e-37, 2e-37, 1.2e-37]), id="near-tiny"),
    pytest.param(np.array([1e-30, 1e30, -1e-30, 5.0]), id="wide-logs"),
]


@pytest.mark.parametrize("values", PLAIN)
def test_finite_arrays_match_numpy_and_ignore_a_nan(values: np.ndarray) -> None:
    a = values.astype(F32)
    s = summarize(a)
    check_against_reference(s, a, 64)
    # One NaN more: every statistic over finite values stays the same.
    g = to_host(summarize(np.append(a, F32(np.nan))))
    h = to_host(s)
    assert int(g.nan) == 1 and int(h.nan) == 0
    for k in ("count", "zeros", "min", "max", "absmax"):
        assert getattr(h, k) == getattr(g, k), k
    for k in ("hist_edges", "hist_counts", "loghist_start", "loghist_under", "loghist_counts"):
        np.testing.assert_array_equal(getattr(h, k), getattr(g, k), err_msg=k)
    for k in ("loghist_neg", "loghist_under_neg"):
        np.testing.assert_array_equal(getattr(h, k), getattr(g, k), err_msg=k)
    for k in ("mean", "std", "l2"):
        np.testing.assert_allclose(getattr(h, k), getattr(g, k), rtol=2e-6, err_msg=k)


def test_counts_beyond_int32_products() -> None:
    # Bins are counted by adding an odd number k per element (not 1) and
    # dividing by k modulo 2**32: the sums wrap around int32 many times here.
    a = np.full(600_000, 7.0, F32)
    a[:3] = [1.0, 2.0, 0.0]
    h = to_host(summarize(a, bins=64))
    assert int(h.hist_counts.sum()) == int(h.count) == a.size
    assert int(h.hist_counts[-1]) == 600_000 - 3 and int(h.zeros) == 1
    assert int(h.loghist_counts.max()) == 600_000 - 3
    # Decoded with the inverses as a constant, and (a large table) computed on the device.
    for length in (4100, 4 * summary_ops.CONSTANT_INVERSES_MAX + 3):
        slots = jnp.asarray(np.arange(300_000) % 7 * 3 + length - 21, jnp.int32)
        slots = slots.at[:100_000].set(4000)
        counts = np.asarray(summary_ops.tally_slots([slots], length, a))
        expected = np.bincount(np.asarray(slots), minlength=length)
        np.testing.assert_array_equal(counts, expected)


def test_large_tallies_keep_no_table_sized_constant_in_the_program() -> None:
    # The joint tallies of 16 arrays of 131K values decode 280K slots: their inverses
    # as a constant were 1.1 MB of program, twice, read back from disk in new processes.
    from sowviz.summary_blocks import GROUP_BLOCK, grouped_stats

    flats = [jax.ShapeDtypeStruct((2 * GROUP_BLOCK,), jnp.float32)] * 16
    hlo = jax.jit(lambda xs: grouped_stats(xs, 64, GROUP_BLOCK)).lower(flats).compile().as_text()
    sizes = [
        math.prod(int(d) for d in dims.split(",") if d)
        for dims in re.findall(r"\w+\[([\d,]*)\][^ ]* constant\(", hlo)
    ]
    assert sizes and max(sizes) <= summary_ops.CONSTANT_INVERSES_MAX + 1


@pytest.mark.parametrize("n", [50, 20_000], ids=["stacked-indices", "joint-indices"])
@pytest.mark.parametrize("with_nan", [False, True], ids=["plain", "general"])
def test_summarize_stack_is_vmap_of_summarize(n: int, with_nan: bool) -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, n)).astype(F32)
    x[1] *= 1e4
    x[2, :4] = 0.0
    if with_nan:
        x[1, 3] = np.nan
    stacked = to_host(summary_mod.summarize_stack(x, bins=16))
    vmapped = to_host(jax.vmap(lambda r: summarize(r, bins=16))(x))
    assert stacked.shape == (n,) and stacked.count.shape == (3,)
    for k in ("count", "nan", "zeros", "min", "max", "hist_counts", "loghist_counts"):
        np.testing.assert_array_equal(getattr(stacked, k), getattr(vmapped, k), err_msg=k)
    np.testing.assert_array_equal(stacked.loghist_neg, vmapped.loghist_neg)
    for i in range(3):
        check_against_reference(jax.tree.map(lambda leaf, i=i: leaf[i], stacked), x[i], 16)


# --------------------------------------------------------------------------
# The pytree, JSON and the host transfer


def test_json_shape() -> None:
    js = summarize(np.arange(12, dtype=F32).reshape(3, 4), bins=8).to_json()
    assert set(js) == JSON_KEYS
    assert js["shape"] == [3, 4] and js["dtype"] == "float32" and js["size"] == 12
    assert set(js["hist"]) == {"edges", "counts"} and set(js["loghist"]) == {
        "edges",
        "counts",
        "neg",
        "under",
        "under_neg",
    }
    assert len(js["hist"]["edges"]) == 9 and len(js["hist"]["counts"]) == 8
    # 1..11 on the fixed log grid (4 bins per octave, edges 1, 1.25, 1.5, 1.75, 2, 2.5, ...):
    # from 1's bin (key 508) to 11's (10 <= 11 < 12).
    assert js["loghist"]["counts"] == [1, 0, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1, 2, 2]
    np.testing.assert_allclose(js["loghist"]["edges"], np.log10(log_grid(np.arange(508, 523))))
    assert js["loghist"]["under"] == 0
    for key in ("hist", "loghist"):
        assert all(type(e) is float for e in js[key]["edges"])
        assert all(type(c) is int for c in js[key]["counts"])
    for key in ("count", "nan", "posinf", "neginf", "zeros", "size"):
        assert type(js[key]) is int
    for key in ("min", "max", "mean", "std", "l2", "absmax"):
        assert type(js[key]) is float
    assert (js["min"], js["max"], js["mean"], js["zeros"]) == (0.0, 11.0, 5.5, 1)


def test_all_nan_json_has_nulls() -> None:
    js = summarize(np.full((4,), np.nan, F32)).to_json()
    assert [js[k] for k in ("min", "max", "mean", "std", "absmax")] == [None] * 5
    assert js["l2"] is None and js["nan"] == 4
    json.dumps(js, allow_nan=False)


def test_host_bytes_do_not_grow_with_the_array() -> None:
    small = to_host(summarize(jnp.ones((1024,)), bins=64))
    big = to_host(summarize(jnp.ones((1024, 1024)), bins=64))
    assert small.nbytes == big.nbytes <= 4096
    assert summarize(jnp.ones((1024,))).nbytes == small.nbytes  # same on device


def test_to_host_is_one_device_get(monkeypatch: pytest.MonkeyPatch) -> None:
    tree = {"a": summarize(jnp.ones(3)), "b": [summarize(jnp.zeros((2, 2)))]}
    calls = []
    real = jax.device_get

    def counting(x: Any) -> Any:
        calls.append(x)
        return real(x)

    monkeypatch.setattr(jax, "device_get", counting)
    host = to_host(tree)
    assert len(calls) == 1
    assert isinstance(host["b"][0], Summary)
    assert all(isinstance(leaf, np.ndarray) for leaf in jax.tree.leaves(host))
    assert host["b"][0].to_json()["zeros"] == 4


def test_jit_returns_a_summary() -> None:
    x = np.array([1.0, -2.0, np.inf, 0.5], F32)
    s = jax.jit(lambda x: summarize(x * 2, bins=8))(x)
    assert isinstance(s, Summary) and s.shape == (4,) and s.bins == 8
    check_against_reference(s, x * 2, 8)


def test_vmap_stacks_summaries() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 50)).astype(F32)
    x[1, :5] = np.nan
    s = jax.vmap(lambda r: summarize(r, bins=8))(x)
    assert s.count.shape == (3,) and s.hist_counts.shape == (3, 8) and s.shape == (50,)
    np.testing.assert_array_equal(s.count, [50, 45, 50])
    for i in range(3):
        check_against_reference(jax.tree.map(lambda leaf, i=i: leaf[i], s), x[i], 8)
    with pytest.raises(ValueError, match="stacked"):
        s.to_json()


def test_summarize_tree() -> None:
    tree = {"w": jnp.ones((2, 3)), "b": [jnp.zeros(4), 3.0]}
    out = summarize_tree(tree, SummaryOptions(bins=8))
    assert jax.tree.structure(out, is_leaf=lambda n: isinstance(n, Summary)) == jax.tree.structure(
        tree
    )
    assert out["w"].bins == 8 and out["w"].shape == (2, 3)
    assert out["b"][0].to_json()["zeros"] == 4 and out["b"][1].to_json()["max"] == 3.0
    assert summarize_tree(jnp.ones(2)).bins == 64
    with pytest.raises(TypeError, match=r"\['name'\].*not an array"):
        summarize_tree({"name": "relu"})


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "64", None, 4097, 10**8])
def test_bins_validation(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"bins must be an int >= 1 and <= 4096.*bins=64"):
        SummaryOptions(bins=bad)
    with pytest.raises(ValueError, match="bins must be"):
        summarize(jnp.ones(3), bins=bad)


def test_one_bin() -> None:
    js = summarize(np.array([1.0, 2.0, 3.0], F32), bins=1).to_json()
    assert js["hist"] == {"edges": [1.0, 3.0], "counts": [3]}


# --------------------------------------------------------------------------
# Sharded arrays stay distributed


@pytest.mark.parametrize(
    ("mesh_shape", "spec", "axis_type"),
    [
        ((8,), P("x"), AxisType.Auto),
        ((8,), P(None, "x"), AxisType.Explicit),
        ((4, 2), P("x", "y"), AxisType.Explicit),
        ((4, 2), P(("x", "y")), AxisType.Auto),
    ],
)
def test_sharded_without_gathering(
    mesh_shape: tuple[int, ...], spec: P, axis_type: AxisType
) -> None:
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
    names = ("x", "y")[: len(mesh_shape)]
    mesh = jax.make_mesh(mesh_shape, names, axis_types=(axis_type,) * len(mesh_shape))
    rng = np.random.default_rng(1)
    a = rng.normal(size=(64, 128)).astype(F32)
    a[3, :7] = np.nan
    a[10, 5] = -np.inf
    a[20:22] = 0.0
    x = jax.device_put(a, NamedSharding(mesh, spec))
    hlo = jax.jit(summarize).lower(x).compile().as_text()
    assert "all-gather" not in hlo and "all-to-all" not in hlo
    assert "all-reduce" in hlo  # the partial reductions really are combined across devices
    check_against_reference(jax.jit(summarize)(x), a, 64)


def test_module_exports() -> None:
    assert set(summary_mod.__all__) == {
        "Summary",
        "SummaryOptions",
        "summarize",
        "summarize_tree",
        "to_host",
    }


# --------------------------------------------------------------------------
# Per-iteration statistics (axis 0 is the iteration of a scan/while capture)


def check_rows(s: Summary, x: np.ndarray, bins: int, index: list[int]) -> None:
    """Each kept row of `x` against NumPy, the row histograms over the pooled edges."""
    h = to_host(s)
    it = h.per_iteration
    assert list(it.index) == index and it.iterations == x.shape[0]
    assert it.hist_counts.shape == (len(index), bins)
    js = s.to_json()["per_iteration"]
    json.dumps(js, allow_nan=False)
    pooled = reference(x, bins)
    for j, r in enumerate(index):
        ref = reference(x[r], bins)
        assert int(it.count[j]) == ref["count"] == js["count"][j]
        assert int(it.nonfinite[j]) == ref["nan"] + ref["posinf"] + ref["neginf"]
        if ref["count"] == 0:
            assert js["mean"][j] is None and js["l2"][j] is None
            assert float(it.l2[j]) == 0.0 and float(it.mean[j]) == 0.0  # the fields too
            assert int(it.hist_counts[j].sum()) == 0
            continue
        assert (float(it.min[j]), float(it.max[j])) == (ref["min"], ref["max"])
        assert float(it.absmax[j]) == ref["absmax"] == js["absmax"][j]
        atol = 1e-5 * ref["absmax"] + F32_TINY
        np.testing.assert_allclose(float(it.mean[j]), ref["mean"], rtol=1e-5, atol=atol)
        np.testing.assert_allclose(float(it.std[j]), ref["std"], rtol=1e-4, atol=atol)
        np.testing.assert_allclose(float(it.l2[j]), ref["l2"], rtol=1e-5)
        # The documented bin rule with the POOLED range, exactly.
        _, idx = _rule(ref["values"], pooled["min"], pooled["max"], bins)
        np.testing.assert_array_equal(it.hist_counts[j], np.bincount(idx, minlength=bins))
        assert js["hist_counts"][j] == it.hist_counts[j].tolist()
    # The pooled statistics are those of the whole stack.
    check_against_reference(s, x, bins)


@pytest.mark.parametrize("with_nan", [False, True], ids=["plain", "general"])
def test_per_iteration_matches_numpy(with_nan: bool) -> None:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(6, 5, 40)).astype(F32)
    x[1] *= 100.0
    x[2] += 30.0  # a row whose one-pass variance would cancel
    x[3] = 0.0
    if with_nan:
        x[4, 0, :3] = [np.nan, np.inf, -np.inf]
        x[5] = np.nan  # a row with no finite value
    check_rows(summarize(x, bins=BINS, per_iteration=True), x, BINS, list(range(6)))


def test_per_iteration_rows_are_strided_past_the_cap() -> None:
    x = np.random.default_rng(8).normal(size=(300, 7)).astype(F32) * np.arange(1, 301)[:, None]
    s = summarize(x, bins=64, per_iteration=True)
    cap = summary_mod.MAX_ROW_COUNTS // 64  # 256 rows at 64 bins
    index = np.unique(np.round(np.linspace(0, 299, cap)).astype(int)).tolist()
    assert len(index) == cap and index[0] == 0 and index[-1] == 299
    check_rows(s, x, 64, index)
    assert s.nbytes < 80_000  # bounded whatever the number of iterations


def test_per_iteration_stack_is_per_member() -> None:
    rng = np.random.default_rng(9)
    xs = rng.normal(size=(3, 4, 10)).astype(F32)
    xs[1] *= 1e3
    stacked = to_host(summary_mod.summarize_stack(xs, bins=8, per_iteration=True))
    for i in range(3):
        alone = to_host(summarize(xs[i], bins=8, per_iteration=True))
        member = jax.tree.map(lambda leaf, i=i: leaf[i], stacked)
        for k in ("count", "min", "max", "hist_counts"):
            np.testing.assert_array_equal(
                getattr(member.per_iteration, k), getattr(alone.per_iteration, k), err_msg=k
            )
        np.testing.assert_allclose(member.per_iteration.std, alone.per_iteration.std, rtol=1e-6)


def test_per_iteration_of_a_scan_capture() -> None:
    import sowviz

    def f(w, x):
        def body(h, wi):
            h = sowviz.sow(jnp.tanh(h @ wi), "h")
            return h, None

        h, _ = jax.lax.scan(body, x, w)
        return jnp.sum(h**2) + sowviz.sow(jnp.sum(w), "total")

    w = jax.random.normal(jax.random.PRNGKey(0), (5, 8, 8)).at[2].multiply(10.0)
    x = jnp.ones((3, 8))
    raw = sowviz.save_intermediates(jax.grad(f))(w, x)[1]
    summ = sowviz.save_intermediates(jax.grad(f), summarize=BINS)(w, x)[1]
    for mode in ("primal", "cotangent"):
        stack = np.asarray(raw["h"][mode])
        assert stack.shape == (5, 3, 8)
        check_rows(summ["h"][mode], stack, BINS, list(range(5)))
    assert summ["total"]["primal"].per_iteration is None  # not inside the loop
    assert "per_iteration" not in summ["total"]["primal"].to_json()


def test_per_iteration_captures_of_any_shape_share_one_stack_and_match_numpy() -> None:
    # Captures stacked by a loop of one length are summarised as one stack, whatever
    # their shapes and dtypes: each flattened per iteration and NaN-padded to the
    # widest (each per-shape computation compiled for 0.7 s). The padding is taken
    # off `nan` and each row's `nonfinite`; everything else follows NumPy per member.
    from sowviz.capture import summaries

    rng = np.random.default_rng(21)
    wide = rng.normal(size=(6, 4, 5)).astype(F32)
    wide[1, 0, 0], wide[3, 2, 1], wide[5, 3, 4] = np.nan, np.inf, -np.inf
    narrow = rng.normal(size=(6,)).astype(F32) * F32(1e3)
    narrow[4] = np.nan
    arrays = {
        "wide": wide,
        "narrow": narrow,
        "half": rng.normal(size=(6, 7)).astype(jnp.bfloat16),
        "ints": rng.integers(-5, 5, size=(6, 2, 2)).astype(np.int32),
        "cplx": (rng.normal(size=(6, 3)) + 1j * rng.normal(size=(6, 3))).astype(np.complex64),
        "other_length": rng.normal(size=(4, 3)).astype(F32),  # another loop: its own stack
    }
    values = {(k,): {"primal": jnp.asarray(a)} for k, a in arrays.items()}
    axes = {(k,): {"primal": ("scan",)} for k in arrays}
    packed = jax.jit(lambda v: summaries.summarize_packed(v, {}, BINS, axes))(values)
    out, _ = packed.unpack()
    where = dict(zip(sorted(arrays), packed.regroup.where, strict=True))
    assert len({where[k][0] for k in arrays if k != "other_length"}) == 1
    assert where["other_length"][0] != where["wide"][0]
    for k, a in arrays.items():
        s = out[(k,)]["primal"]
        assert s.shape == a.shape and s.dtype == str(a.dtype)
        if np.iscomplexobj(a):  # rows of magnitudes: float32 |x| may differ by an ulp
            check_against_reference(s, a, BINS)
            np.testing.assert_array_equal(to_host(s).per_iteration.count, np.full(6, 3))
        else:
            check_rows(s, a, BINS, list(range(a.shape[0])))  # pooled and per row


def test_deferred_per_iteration_summaries_equal_in_program_ones_and_share_a_program(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # inspect/Monitor leave per-iteration summaries to a second program (one stack of a
    # loop's captures compiled in the capture program for 0.5 s on XLA:CPU), its stack
    # rounded up to a size class of members and width: padding members and columns
    # count nowhere, and like-sized groups share the compiled program.
    from sowviz.capture import summaries

    rng = np.random.default_rng(22)

    def values(widths, nan=True):
        out = {}
        for i, w in enumerate(widths):
            a = (rng.normal(size=(6, w)) * 10.0 ** rng.integers(-3, 3, size=(6, w))).astype(F32)
            if nan:
                a[1, 0], a[3, -1] = np.nan, -np.inf
            out[(f"a{i}",)] = {"primal": jnp.asarray(a)}
        axes = {k: {"primal": ("scan",)} for k in out}
        return out, axes

    def capture(v, axes, defer):
        return jax.jit(lambda v: summaries.summarize_packed(v, {}, BINS, axes, defer=defer))

    summaries.join_precompiles()
    before = set(summaries._COMPILED)
    v, axes = values([5, 3, 7])
    inline = capture(v, axes, False)(v).unpack()[0]
    packed = capture(v, axes, True)(v)
    assert [type(p).__name__ for p in packed.pending] == ["Iterated"]
    assert packed.pending[0].stack.shape == (3, 6, 7)  # sized: 3 members, width 7
    assert "scatter" not in capture(v, axes, True).lower(v).as_text()  # no summary left in
    done, clean = summaries.finish(packed, jnp.asarray(True))
    assert not bool(clean)  # the data's NaN/Inf are counted by the second program
    deferred = done.unpack()[0]
    for key, a in v.items():
        x, y = to_host(inline[key]["primal"]), to_host(deferred[key]["primal"])
        assert x.shape == y.shape == (6, a["primal"].shape[1])
        for p, q in zip(jax.tree.leaves(x), jax.tree.leaves(y), strict=True):
            np.testing.assert_array_equal(p, q)
        check_rows(deferred[key]["primal"], np.asarray(a["primal"]), BINS, list(range(6)))
    (first,) = set(summaries._COMPILED) - before
    # 9 members of widths up to 9 and 10 of widths up to 10 are one size class
    # (`bucket`: 10 members of width 10): one program, whose padding (whole members,
    # columns) counts nowhere.
    v2, axes2 = values([9, 1, 2, 6, 4, 9, 9, 3, 5], nan=False)
    v3, axes3 = values([10, 6, 6, 1, 2, 3, 4, 5, 7, 8], nan=False)
    for vi, axi in ((v2, axes2), (v3, axes3)):
        packed = capture(vi, axi, True)(vi)
        assert packed.pending[0].stack.shape == (10, 6, 10)
        done, clean = summaries.finish(packed, jnp.asarray(True))
        assert bool(clean)  # the padding's NaN are not the data's
        out = done.unpack()[0]
        for key, a in vi.items():
            check_rows(out[key]["primal"], np.asarray(a["primal"]), BINS, list(range(6)))
    assert len(set(summaries._COMPILED) - before - {first}) == 1  # one for both
    # A large stack keeps its shape (rounded up, it would grow by up to half).
    monkeypatch.setattr(summaries, "ITERATED_SIZED_MAX", 10 * 6 * 10 - 1)
    packed = capture(v2, axes2, True)(v2)
    assert packed.pending[0].stack.shape == (9, 6, 9)
    summaries.finish(packed, jnp.asarray(True))  # joins its compile (no thread left running)


def test_inspects_per_iteration_stacks_take_coarse_classes_of_iterations_too() -> None:
    # `inspect` (once) pads a loop's stack to coarse classes of members, width and
    # iterations (up to the row cap), so loops of other lengths share the program: the
    # padded iterations count nowhere and their statistics are cut off, so every
    # summary is NumPy's. A loop past the cap keeps its length.
    from sowviz import summary as summary_mod
    from sowviz.capture import summaries

    rng = np.random.default_rng(23)

    def values(length, widths):
        out = {}
        for i, w in enumerate(widths):
            a = rng.normal(size=(length, w)).astype(F32) * F32(10.0 ** (i - 1))
            a[length // 2, 0], a[-1, -1] = np.nan, np.inf
            out[(f"a{i}",)] = {"primal": jnp.asarray(a)}
        return out, {k: {"primal": ("scan",)} for k in out}

    def capture(v, axes):
        return jax.jit(
            lambda v: summaries.summarize_packed(v, {}, BINS, axes, defer=True, once=True)
        )(v)

    summaries.join_precompiles()
    keys = []
    for length, widths in ((6, [5, 3, 7]), (11, [2, 9]), (16, [16])):
        v, axes = values(length, widths)
        packed = capture(v, axes)
        (stack,) = packed.pending
        assert stack.stack.shape == (8, 16, 16), (length, widths)
        keys.append(summaries._key(packed.pending, BINS))
        done, clean = summaries.finish(packed, jnp.asarray(True))
        assert not bool(clean)  # the data's NaN/Inf, not the padding's
        out = done.unpack()[0]
        for key, a in v.items():
            x = np.asarray(a["primal"])
            check_rows(out[key]["primal"], x, BINS, list(range(length)))
            js = out[key]["primal"].to_json()
            assert (
                js["nan"] == 1 and js["posinf"] == 1 and js["per_iteration"]["iterations"] == length
            )
    assert len(set(keys)) == 1  # one program for the three loops
    cap = summary_mod.row_cap(BINS)
    v, axes = values(cap + 1, [3])
    assert capture(v, axes).pending[0].stack.shape[1] == cap + 1  # past the cap: as it is


def _concat_sizes(fn, *args) -> list[int]:
    jaxpr = jax.make_jaxpr(fn)(*args)
    sizes = []

    def walk(j):
        for e in j.eqns:
            if e.primitive.name in ("concatenate", "stack"):  # stack: a primitive since JAX 0.12
                sizes.append(math.prod(e.outvars[0].aval.shape))
            for v in e.params.values():
                for sub in v if isinstance(v, (tuple, list)) else (v,):
                    inner = getattr(sub, "jaxpr", sub)  # ClosedJaxpr or Jaxpr
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jaxpr.jaxpr)
    return sizes


def test_large_captures_are_not_copied_into_a_stack() -> None:
    # Stacking copies: on a CPU only small like-shaped arrays are stacked (one
    # computation for many probes); large ones are summarised where they are.
    from sowviz.capture import summaries

    big = summaries.STACK_MAX_ELEMENTS + 1
    values = {
        ("a",): {"primal": jnp.ones((big,)), "cotangent": jnp.ones((big,))},
        ("b",): {"primal": jnp.ones((8, 8)), "cotangent": jnp.ones((8, 8))},
    }
    packed = summaries.summarize_packed(values, {}, 16)
    sizes = _concat_sizes(lambda v: summaries.summarize_packed(v, {}, 16).buffers, values)
    assert max(sizes) < big  # the 8x8 arrays are laid out together; the large one is not
    out, _ = packed.unpack()
    for key, n in ((("a",), big), (("b",), 64)):
        for mode in ("primal", "cotangent"):
            js = out[key][mode].to_json()
            assert (js["count"], js["min"], js["max"], js["std"]) == (n, 1.0, 1.0, 0.0)


@pytest.mark.parametrize("specials", [True, False])
@pytest.mark.parametrize("group_bytes", [1 << 27, 3000])
def test_large_arrays_of_any_shape_share_one_blocked_loop_and_match_numpy(
    monkeypatch: pytest.MonkeyPatch, group_bytes: int, specials: bool
) -> None:
    # On a CPU, large arrays of one accumulation dtype are summarised in blocks by one
    # loop per group (a summary per array compiled for seconds: 4.6 s for 27 arrays
    # of 1-2M elements). Tiny thresholds here: arrays of 1 to 16 blocks, last blocks
    # that overlap the one before (left out), every dtype; with `specials` (NaN and
    # infinities) the masked walk, without them the unmasked one.
    from sowviz.capture import summaries

    if jax.default_backend() != "cpu":
        pytest.skip("blocked summaries are used on a CPU backend")
    monkeypatch.setattr(summaries, "STACK_MAX_ELEMENTS", 100)
    monkeypatch.setattr(summaries, "MIN_GROUPED", 100)
    monkeypatch.setattr(summaries, "GROUP_MAX_BYTES", group_bytes)
    rng = np.random.default_rng(11)

    def wild(n: int) -> np.ndarray:
        a = (rng.normal(1.0, 2.0, size=n) * 10.0 ** rng.integers(-20, 20, size=n)).astype(F32)
        if specials:
            a[[3, n // 2, n - 1]] = [np.nan, np.inf, -np.inf]
        a[[4, 5]] = [1e-40, -0.0]  # a subnormal (a zero) and a negative zero
        return a

    arrays = {
        "exact": wild(512).reshape(2, 256),  # whole blocks
        "ragged": wild(1000).reshape(10, 100),  # a last block overlapping the one before
        "one_and_a_bit": wild(101),  # a block of 64, then one overlapping it mostly
        "half": wild(700).astype(jnp.bfloat16),
        "cplx": (wild(300) + 1j * rng.normal(size=300)).astype(np.complex64),
        "ints": rng.integers(-1000, 1000, size=(20, 20)).astype(np.int32),
        "nan_only": np.full((150,), np.nan if specials else 0.5, F32),
    }
    values = {(k,): {"primal": jnp.asarray(a)} for k, a in arrays.items()}
    summarise = jax.jit(lambda v: summaries.summarize_packed(v, {}, 16).buffers)
    hlo = summarise.lower(values).as_text()
    packed = summaries.summarize_packed(values, {}, 16)
    out, _ = packed.unpack()
    rows, _ = packed.unpack(rows=True)  # as `inspect` reads them: JSON rows per stack
    for k, a in arrays.items():
        check_against_reference(out[(k,)]["primal"], np.asarray(a), 16)
        assert rows[(k,)]["primal"].to_json() == out[(k,)]["primal"].to_json(), k
    where = [w for w in packed.regroup.where if w is not None]
    groups = {g for g, _ in where}
    if group_bytes > 1 << 20:  # one group, in blocks of 64: three loops in all (the
        # unmasked second pass, and the masked walk's two)
        assert all(row is not None for _, row in where)
        assert len(groups) == 1 and hlo.count("stablehlo.while") == 3
    else:  # a group holds at most group_bytes; a larger array is summarised alone
        assert len(groups) > 2 and any(row is None for _, row in where)


@pytest.mark.parametrize("apart", [False, True], ids=["in-program", "layout-program"])
@pytest.mark.parametrize("width", [None, 128, 512])
def test_arrays_of_any_shape_summarised_together_match_numpy(
    monkeypatch: pytest.MonkeyPatch, width: int | None, apart: bool
) -> None:
    # One segmented computation for many shapes and dtypes (NaN padding to whole
    # rows, taken off `nan`): each member still follows the NumPy-checked rules, at
    # the row width the layout chooses (None) and at each one it can take, laid out
    # in the program or (as `inspect` does) by the layout program for `finish`.
    from sowviz.capture import summaries

    if width is not None:
        monkeypatch.setattr(summaries, "SEGMENT_ROWS", (width,))
    rng = np.random.default_rng(3)
    row = summaries.SEGMENT_ROW
    mixed = rng.normal(size=2 * row + 7).astype(np.float32) * np.float32(1e3)
    mixed[[0, 5, row + 1]] = [np.nan, np.inf, -np.inf]
    mixed[9] = 1e-40  # subnormal: a zero
    arrays = {
        "mixed": mixed,
        "row": rng.uniform(-1, 1, size=(2, row // 2)).astype(np.float32),
        "empty": np.zeros((0, 4), np.float32),
        "nan_only": np.full((3,), np.nan, np.float32),
        "scalar_int": np.int32(-7),
        "bools": np.array([True, False, True]),
        "half": rng.normal(size=(5, 3)).astype(jnp.bfloat16),
        "cplx": (rng.normal(size=6) + 1j * rng.normal(size=6)).astype(np.complex64),
        "tiny": np.array([3e-30, -2e-30, 0.0], np.float32),
    }
    values = {(k,): {"primal": jnp.asarray(a)} for k, a in arrays.items()}
    packed = jax.jit(lambda v: summaries.summarize_packed(v, {}, 16, defer=apart, once=apart))(
        values
    )
    if apart:
        assert [type(p) for p in packed.pending] == [summaries.Parts]
        packed, _ = summaries.finish(packed, jnp.asarray(True))
    out, _ = packed.unpack()
    rows, _ = packed.unpack(rows=True)  # for JSON only, as `inspect` reads them
    groups = [g for g in packed.regroup.where if g is not None]
    assert len({g[0] for g in groups}) == 1  # float32 accumulation: one group for all
    for k, a in arrays.items():
        check_against_reference(out[(k,)]["primal"], np.asarray(a), 16)
        # its row of the stack's JSON, converted with the others, is its own JSON
        row, alone = rows[(k,)]["primal"], out[(k,)]["primal"]
        assert isinstance(row, SummaryRow)
        assert row.to_json() == alone.to_json(), k
        assert type(row.to_json()) is type(alone.to_json())


def test_a_layout_takes_narrow_rows_only_when_they_cost_half_as_much() -> None:
    # Rows of 512 for most layouts (like sizes share a compiled program), of 128 for
    # many small arrays (padded to 512 they were four times the values).
    from sowviz.capture import summaries

    assert summaries.row_width([128] * 1016) == 128
    assert summaries.row_width([100] * 50 + [3000]) == 128  # costs 14,208 against 32,256
    assert summaries.row_width([100] * 50 + [3000] * 3) == 512  # 23,424 against 39,168
    assert summaries.row_width([32 * 1024] * 16 + [65536] * 8 + [256] * 8) == 512
    assert summaries.row_width([2048] * 128) == 512  # no padding at any width: fewer rows
    assert summaries.row_width([600, 5, 300, 2]) == 512  # 128 costs 2/3 of 512: kept

    def cost(sizes: list[int], w: int) -> int:
        return sum(-(-max(n, 1) // w) for n in sizes) * (w + summaries.ROW_COST)

    rng = np.random.default_rng(7)
    for _ in range(300):
        sizes = rng.integers(0, 3000, rng.integers(1, 40)).tolist()
        if rng.random() < 0.5:
            sizes = [n % 200 for n in sizes]
        w = summaries.row_width(sizes)
        assert w in summaries.SEGMENT_ROWS
        wider = [v for v in summaries.SEGMENT_ROWS if v > w]
        narrower = [v for v in summaries.SEGMENT_ROWS if v < w]
        assert all(2 * cost(sizes, w) <= cost(sizes, v) for v in wider)
        assert all(2 * cost(sizes, v) > cost(sizes, w) for v in narrower)


def test_signed_log_histogram_matches_numpy() -> None:
    # Negative values in the window, in the underflow, a negative zero and a negative
    # subnormal (both zeros, never negative), in every layout: alone, stacked, segmented.
    a = np.array([-1.0, -3.0, 2.0, 5.0, -0.0, -1e-40, -1e-30, 3e-31, -7.5, np.nan], F32)
    ref = reference(a, 8)["log"]
    assert ref["neg"].sum() == 3 and ref["under_neg"] == 1  # the case is what it says
    h = to_host(summarize(a, bins=8))
    np.testing.assert_array_equal(h.loghist_neg, ref["neg"])
    assert int(h.loghist_under_neg) == ref["under_neg"]
    js = summarize(a, bins=8).to_json()["loghist"]
    first = int(np.flatnonzero(ref["counts"])[0])
    assert js["neg"] == ref["neg"][first : first + len(js["counts"])].tolist()
    assert js["under_neg"] == 1
    stacked = summary_mod.summarize_stack(np.stack([a, -a]), bins=8)
    for i, member in enumerate((a, -a)):
        check_against_reference(jax.tree.map(lambda leaf, i=i: leaf[i], stacked), member, 8)


def assert_same_summaries(inline: dict, deferred: dict, values: dict, bins: int) -> None:
    """Summaries computed in the program and by the second programs: equal, bit for bit,
    with each one's static shape and dtype, and each following the NumPy rules."""
    for key, entry in inline.items():
        a, b = to_host(entry["primal"]), to_host(deferred[key]["primal"])
        assert a.shape == b.shape and a.dtype == b.dtype
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_array_equal(x, y)
        check_against_reference(deferred[key]["primal"], np.asarray(values[key]["primal"]), bins)


def test_deferred_segment_summaries_equal_in_program_ones() -> None:
    # inspect/Monitor leave small arrays' summaries to a second program keyed by the
    # layout's size class: same numbers as in the program, one compile for like sizes.
    from sowviz.capture import summaries

    rng = np.random.default_rng(11)

    def values(sizes):
        return {
            (f"a{i}",): {"primal": jnp.asarray(rng.normal(size=n).astype(F32) * 10**i)}
            for i, n in enumerate(sizes)
        }

    def both(v):
        inline = jax.jit(lambda v: summaries.summarize_packed(v, {}, 16))(v).unpack()[0]
        packed = jax.jit(lambda v: summaries.summarize_packed(v, {}, 16, defer=True))(v)
        assert packed.pending  # left to the second program
        done, clean = summaries.finish(packed, jnp.asarray(True))
        return inline, done.unpack()[0], bool(clean)

    summaries.join_precompiles()
    before = len(summaries._COMPILED)  # compiled programs, by layout size class
    for sizes in ([700, 3, 512, 1], [600, 5, 300, 2]):  # 5 rows each: one size class
        v = values(sizes)
        inline, deferred, clean = both(v)
        assert clean
        assert_same_summaries(inline, deferred, v, 16)
    assert len(summaries._COMPILED) == before + 1
    v = values([9])
    v[("a0",)]["primal"] = v[("a0",)]["primal"].at[2].set(jnp.inf)
    assert not both(v)[2]  # the second program reports its NaN/Inf counts too


def test_deferred_large_arrays_equal_in_program_ones_and_compile_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On a CPU, inspect/Monitor leave the large arrays' blocked loop to a second program
    # of its own (keyed by their shapes, kept on disk), not compiled into every capture
    # program; the small arrays' layout keeps its shared program. Same numbers.
    from sowviz.capture import summaries

    if jax.default_backend() != "cpu":
        pytest.skip("large arrays are summarised in blocks on a CPU backend")
    rng = np.random.default_rng(12)
    big = summaries.MIN_GROUPED

    def values(sizes):
        out = {}
        for i, n in enumerate(sizes):
            a = (rng.normal(size=n) * 10.0 ** rng.integers(-5, 5, size=n)).astype(F32)
            a[[1, n // 2]] = [np.nan, -np.inf]
            out[(f"a{i}",)] = {"primal": jnp.asarray(a.astype(jnp.bfloat16) if i == 1 else a)}
        return out

    def capture(v, defer):
        return jax.jit(lambda v: summaries.summarize_packed(v, {}, 16, defer=defer))

    summaries.join_precompiles()
    before = set(summaries._COMPILED)
    v = values([big + 1000, 2 * big, 700, 5, 3 * big + 7])
    inline = capture(v, False)(v).unpack()[0]
    assert "stablehlo.while" in capture(v, False).lower(v).as_text()
    packed = capture(v, True)(v)
    # the large arrays in two groups (blocks of 32K and of 64K), in one second program
    assert [type(p).__name__ for p in packed.pending] == ["Rows", "Blocks", "Blocks"]
    assert [p.block for p in packed.pending[1:]] == [big, 2 * big]
    assert "stablehlo.while" not in capture(v, True).lower(v).as_text()  # loop left out
    done, clean = summaries.finish(packed, jnp.asarray(True))
    assert not bool(clean)  # the NaN/Inf are counted by the second programs
    deferred = done.unpack()[0]
    assert_same_summaries(inline, deferred, v, 16)
    new = set(summaries._COMPILED) - before
    assert sorted(k[1][0] == "blocks" for k in new) == [False, True]  # two programs
    # Other large shapes, like small ones: only the large arrays' program is new.
    v2 = values([big + 2000, 2 * big, 600, 5, 3 * big + 7])
    summaries.finish(capture(v2, True)(v2), jnp.asarray(True))
    newer = set(summaries._COMPILED) - before - new
    assert len(newer) == 1 and next(iter(newer))[1][0] == "blocks"
    # Past the byte budget, none is deferred (the loop stays in the capture program).
    monkeypatch.setattr(summaries, "DEFER_BLOCKS_MAX_BYTES", 4 * big)
    v3 = values([big + 3000, 2 * big, 700, 5, 3 * big + 7])
    assert [type(p).__name__ for p in capture(v3, True)(v3).pending] == ["Rows"]
    assert "stablehlo.while" in capture(v3, True).lower(v3).as_text()


@pytest.mark.parametrize("specials", [True, False])
@pytest.mark.parametrize(
    "dtype,n", [(F32, 1000), (F32, 1024), (jnp.bfloat16, 777), (np.complex64, 300)]
)
def test_blocked_summaries_match_numpy(
    monkeypatch: pytest.MonkeyPatch, dtype: Any, n: int, specials: bool
) -> None:
    # Large arrays on a CPU are summarised in blocks (bounded temporaries); tiny
    # blocks here exercise full blocks, a NaN-padded tail (or none) and the specials.
    from sowviz import summary_blocks

    monkeypatch.setattr(summary_blocks, "BLOCK", 64)
    monkeypatch.setattr(summary_blocks, "MIN_BLOCKED", 100)
    rng = np.random.default_rng(n)
    a = (rng.normal(3.0, 2.0, size=n) * 10.0 ** rng.integers(-30, 30, size=n)).astype(F32)
    if specials:  # else every value finite: the unmasked walk
        a[[5, 70, 140]] = [np.nan, np.inf, -np.inf]
    a[[6, 71, -1]] = [1e-40, 0.0, -3e30]  # a subnormal (a zero), a zero, a big negative
    if dtype == np.complex64:
        a = a + 1j * rng.normal(size=n).astype(F32)
    a = a.astype(dtype)
    if jax.default_backend() == "cpu":
        assert "while" in jax.jit(summarize).lower(a).as_text()  # really blocked
    check_against_reference(summarize(a, bins=BINS), a, BINS)
    rows = a.reshape(-1, 4) if n % 4 == 0 else a[None]  # any shape: flattened into blocks
    check_against_reference(summarize(rows, bins=BINS), rows, BINS)


def test_large_array_summary_temporaries_are_bounded() -> None:
    # XLA:CPU writes out every reduction's input: one piece held ~5x the array in
    # temporaries (inspect's peak memory); blocks hold a few blocks' worth.
    from sowviz import summary_blocks

    if jax.default_backend() != "cpu":
        pytest.skip("blocks are used on a CPU backend")
    x = jax.ShapeDtypeStruct((4 * summary_blocks.MIN_BLOCKED,), jnp.float32)
    compiled = jax.jit(summarize).lower(x).compile()
    nbytes = 4 * x.shape[0]
    assert compiled.memory_analysis().temp_size_in_bytes < nbytes / 2
    if jax.device_count() >= 8:  # a large array on a mesh stays in one piece, ungathered
        mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
        sharded = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P("x")))
        hlo = jax.jit(summarize).lower(sharded).compile().as_text()
        assert "all-gather" not in hlo and "all-to-all" not in hlo


def test_numpy_lays_out_float_arrays_as_the_layout_program_does() -> None:
    # On a CPU, `inspect`'s small float arrays are laid out by NumPy (no layout
    # program to compile for a new model's shapes): the same rows, members and
    # padding as the layout program's, a bfloat16 member widened exactly, an empty
    # member one row of NaN; an integer member keeps the program (`summary._values`).
    from sowviz.capture import summaries

    rng = np.random.default_rng(11)
    members = [jnp.asarray(rng.normal(size=s).astype(F32)) for s in [(3, 5), (700,), (0,), (2, 2)]]
    members.append(jnp.asarray(rng.normal(size=(9,)) * 1e30, jnp.bfloat16))
    members[1] = members[1].at[3].set(jnp.inf).at[4].set(jnp.nan)
    parts = summaries._parts(members)
    program = jax.jit(summaries._lay_out_program)((parts,))[0]
    host = summaries._host_layout(parts)
    for got, want in zip(host.__dict__.values(), program.__dict__.values(), strict=True):
        assert isinstance(got, np.ndarray) and got.dtype == np.asarray(want).dtype
        np.testing.assert_array_equal(got, np.asarray(want))  # NaN where NaN
    assert summaries._host_laid((parts,)) == (jax.default_backend() == "cpu")
    assert not summaries._host_laid((summaries._parts([jnp.arange(4)]),))


def test_a_layout_of_many_arrays_is_concatenated_in_chunks_on_cpu() -> None:
    # More parts than CPU_CHUNK: concatenated in chunks (fast to compile on a CPU),
    # the same rows as one concatenation, and each member still summarised right.
    from sowviz import _concat
    from sowviz.capture import summaries

    rng = np.random.default_rng(5)
    leaves = [rng.normal(size=(int(n),)).astype(np.float32) for n in rng.integers(1, 900, 150)]
    assert 2 * len(leaves) > _concat.CPU_CHUNK
    rows = jax.jit(lambda ls: summaries._layout(ls, sized=False))(leaves)
    width = rows.flat.shape[1]
    assert width == summaries.row_width([v.size for v in leaves])
    want = np.concatenate([np.concatenate([v, np.full(-v.size % width, np.nan)]) for v in leaves])
    np.testing.assert_array_equal(np.asarray(rows.flat).ravel(), want)
    out = jax.jit(lambda ls: summaries._segmented(ls, 8))(leaves).summary()
    for i in (0, 75, 149):
        assert int(out.count[i]) == leaves[i].size
        np.testing.assert_allclose(float(out.mean[i]), leaves[i].mean(dtype=np.float64), rtol=1e-5)


def test_a_layouts_nan_padding_is_constants_not_kernels_on_cpu() -> None:
    # XLA turns a constant of one repeated value into a broadcast, a kernel compiled per
    # length (10-15 ms each on XLA:CPU): the padding's constants hold one NaN of
    # another payload, so they stay constants, and every NaN still counts as padding.
    from sowviz.capture import summaries

    if jax.default_backend() != "cpu":
        pytest.skip("the fills are constants on a CPU backend")
    rng = np.random.default_rng(6)
    leaves = [rng.normal(size=n).astype(np.float32) for n in (700, 3, 512, 1, 300, 1500, 900)]
    leaves[1][0] = np.nan  # a NaN of the data's own, beside the padding's
    fn = jax.jit(lambda ls: summaries._layout(ls, sized=True))
    hlo = fn.lower(leaves).compile().as_text()
    assert " broadcast(" not in hlo, "a NaN fill compiled as a broadcast kernel"
    rows = fn(leaves)
    pads = np.asarray(rows.pads)
    assert pads[:7].tolist() == [324, 509, 0, 511, 212, 36, 124]
    assert pads[7] == summaries.SEGMENT_ROW  # the size class's padding row
    flat = np.asarray(rows.flat)
    assert np.isnan(flat).sum() == pads.sum() + 1
    padded = [
        np.concatenate([v, np.full(p, np.nan)]) for v, p in zip(leaves, pads[:7], strict=True)
    ]
    want = np.concatenate(padded)
    np.testing.assert_array_equal(flat.ravel()[: want.size], want)
    out = summaries._segment_summary(rows, 8)
    assert np.asarray(out.nan)[:7].tolist() == [0, 1, 0, 0, 0, 0, 0]
    for i, v in enumerate(leaves):
        assert int(out.count[i]) == np.isfinite(v).sum()
        np.testing.assert_allclose(float(out.max[i]), np.nanmax(v), rtol=1e-6)


@pytest.mark.parametrize("block_rows", [4, 8])
def test_large_layouts_are_summarised_in_row_blocks_equal_to_one_piece(
    monkeypatch: pytest.MonkeyPatch, block_rows: int
) -> None:
    # On a CPU a layout of many rows is walked in blocks of rows (two loops, no
    # full-size temporaries): the same per-row arithmetic, so the same numbers as one
    # piece (counts exactly; a row's float sums may round differently), and each
    # member still follows the NumPy-checked rules.
    # Members span blocks, start mid-block, and hold NaN, Inf, subnormals and zeros.
    from sowviz.capture import summaries

    if jax.default_backend() != "cpu":
        pytest.skip("row blocks are used on a CPU backend")
    rng = np.random.default_rng(block_rows)
    row = summaries.SEGMENT_ROW
    leaves = [
        (rng.normal(size=n) * 10.0 ** rng.integers(-20, 20, size=n)).astype(F32)
        for n in (5 * row + 3, 7, row, 3 * row - 1, 1, 11 * row + 100)
    ]
    leaves[0][[0, 700, 1500, 2000]] = [np.nan, np.inf, np.inf, -np.inf]  # +Inf apart from -Inf
    leaves[3][[1, 2, 3]] = [1e-40, -0.0, 0.0]
    leaves[5][:] = np.where(rng.random(leaves[5].size) < 0.01, np.nan, leaves[5])
    rows = summaries._layout(leaves, sized=True)
    assert rows.flat.shape[0] % block_rows == 0 and rows.flat.shape[0] > 2 * block_rows

    def summary(r):
        return summaries._segment_summary(r, 16)

    whole = jax.jit(summary)(rows)
    monkeypatch.setattr(summary_ops, "SEGMENT_BLOCK_ROWS", block_rows)
    monkeypatch.setattr(summary_ops, "SEGMENT_MIN_BLOCK_ROWS", 2)
    monkeypatch.setattr(summary_ops, "SEGMENT_BLOCKED_OVER", 0)
    assert summary_ops.segment_block_rows(*rows.flat.shape) == block_rows
    in_blocks = jax.jit(lambda r: summaries._segment_summary(r, 16))  # traced anew
    assert in_blocks.lower(rows).as_text().count("stablehlo.while") == 2
    blocked = in_blocks(rows)
    pairs = zip(jax.tree.leaves(whole.summary()), jax.tree.leaves(blocked.summary()), strict=True)
    for x, y in pairs:
        x, y = np.asarray(x), np.asarray(y)
        if np.issubdtype(x.dtype, np.integer):  # counts, both histograms: exact
            np.testing.assert_array_equal(x, y)
        else:  # a row's sum may round differently in a block (XLA's reduction order)
            np.testing.assert_allclose(x, y, rtol=1e-5)
    for i, leaf in enumerate(leaves):
        member = jax.tree.map(lambda a, i=i: a[i], blocked.summary())
        check_against_reference(dataclasses.replace(member, shape=leaf.shape), leaf, 16)


def test_segment_blocks_divide_the_rows() -> None:
    # Blocks never overlap: a power of two dividing the row count, at most
    # SEGMENT_BLOCK_ROWS; one piece for small layouts, odd row counts, or off a CPU.
    top, w = summary_ops.SEGMENT_BLOCK_ROWS, 512
    big = summary_ops.SEGMENT_BLOCKED_OVER // w  # rows of the largest one-piece layout
    if jax.default_backend() != "cpu":
        assert summary_ops.segment_block_rows(64 * big, w) == 0
        return
    assert summary_ops.segment_block_rows(big, w) == 0
    assert summary_ops.segment_block_rows(7 * big, w) == top
    assert summary_ops.segment_block_rows(7 * big, w // 8) == 0  # few values: one piece
    assert summary_ops.segment_block_rows(65 * 32, w) == 32  # 2080 rows: 65 blocks of 32
    assert summary_ops.segment_block_rows(7 * big + 1, w) == 0  # odd: no power of two fits


@pytest.mark.parametrize("offset,spread", [(0.0, 1.0), (1e3, 1e-3), (-1e6, 2.0), (3.0, 0.0)])
def test_l2_from_the_centred_sums_is_accurate_on_every_path(offset, spread) -> None:
    """``l2`` follows from the centred sums (`summary_ops.squares`), with no reduction of
    the squares of its own; far from zero (mean >> spread) that leans on ``n * mean**2``.
    Every path that computes it is checked against float64: one piece (pooled and per
    row), the segmented layout and the blocked loop."""
    from sowviz.capture import summaries
    from sowviz.summary_blocks import GROUP_BLOCK, grouped_stats

    rng = np.random.default_rng(7)

    def data(*shape):
        return (offset + spread * rng.normal(size=shape)).astype(F32)

    def norm(a):
        return np.sqrt(np.sum(a.astype(np.float64) ** 2))

    a = data(6, 50)
    one = to_host(summarize(a, per_iteration=True))
    np.testing.assert_allclose(float(one.l2), norm(a), rtol=1e-5)
    np.testing.assert_allclose(one.per_iteration.l2, [norm(r) for r in a], rtol=1e-5)
    small = [data(n) for n in (3, 700, 64)]
    seg = jax.jit(lambda xs: summaries._segmented(xs, 16))(small).summary()
    np.testing.assert_allclose(seg.l2, [norm(x) for x in small], rtol=1e-5)
    large = [data(GROUP_BLOCK + 5), data(2 * GROUP_BLOCK)]
    raw = jax.jit(lambda xs: grouped_stats(xs, 16, GROUP_BLOCK))(large)
    for xp in (jnp, np):  # finished in a program or on the host
        blocked = summary_ops.pooled_fields(jax.tree.map(xp.asarray, raw), 16, xp)
        np.testing.assert_allclose(blocked["l2"], [norm(x) for x in large], rtol=1e-5)


# --------------------------------------------------------------------------
# Explicit meshes: small arrays split over Explicit axes join the shared summaries


def _explicit_mesh_values(rng: np.random.Generator) -> tuple[Any, dict, dict]:
    """Values on a 2x4 mesh with Explicit axes (`jax.make_mesh`'s default): split over
    one axis, over both, replicated, and one off the mesh; with their gathered NumPy."""
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    arrays = {
        "both": (rng.normal(size=(16, 8)), P("data", "model")),
        "rows": (rng.normal(size=(8, 3)) * 100.0, P("data")),
        "cols": (rng.normal(size=(5, 4)) - 3.0, P(None, "model")),
        "replicated": (rng.normal(size=(5, 7)), P()),
        "ints": (rng.integers(-9, 9, size=(4, 4)), P("data")),
    }
    values, gathered = {}, {}
    for k, (a, spec) in arrays.items():
        a = a.astype(np.int32 if a.dtype.kind == "i" else F32)
        if a.dtype == F32:
            a.flat[3], a.flat[-1] = np.nan, -np.inf
        values[(k,)] = {"primal": jax.device_put(a, NamedSharding(mesh, spec))}
        gathered[(k,)] = a
    values[("off_mesh",)] = {"primal": jnp.linspace(-1.0, 2.0, 9)}
    gathered[("off_mesh",)] = np.linspace(-1.0, 2.0, 9, dtype=F32)
    return values, gathered, {}


@pytest.mark.parametrize("defer", [False, True], ids=["in_program", "deferred"])
def test_small_arrays_split_over_explicit_axes_share_the_segmented_summary(defer: bool) -> None:
    # On an explicit mesh every small array was summarised apart, per shape and sharding,
    # inside the capture program (a `shard_map` step's first `inspect` compiled 4-6x as
    # long as on an Auto mesh). Now they are gathered into the one segmented layout,
    # whatever their sharding, and their statistics are those of the whole array.
    from sowviz.capture import summaries

    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
    values, gathered, axes = _explicit_mesh_values(np.random.default_rng(31))
    capture = jax.jit(
        lambda v: summaries.summarize_packed(v, {}, BINS, axes, defer=defer, once=defer)
    )
    packed = capture(values)
    assert len({w[0] for w in packed.regroup.where}) == 1  # one group for all of them
    if defer:  # `inspect`'s way: left to the shared summary program, as on an Auto mesh
        assert [type(p) for p in packed.pending] == [summaries.Parts]
        packed, _ = summaries.finish(packed, jnp.asarray(True))
    else:  # no summary per shape left in the capture program: the same as off the mesh
        unmeshed = {k: {"primal": jnp.asarray(a)} for k, a in gathered.items()}
        count = lambda v: capture.lower(v).as_text().count("stablehlo.scatter")  # noqa: E731
        assert count(values) == count(unmeshed)
    out, _ = packed.unpack()
    for key, a in gathered.items():
        check_against_reference(out[key]["primal"], a, BINS)


def test_small_per_iteration_captures_split_over_explicit_axes_share_a_stack() -> None:
    # A loop's captures on an explicit mesh (split over its axes) join the stack of their
    # iteration count, as unmeshed ones do, instead of a summary per shape and sharding.
    from sowviz.capture import summaries

    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    rng = np.random.default_rng(32)
    specs = {"a": ((6, 8, 4), P(None, "model")), "b": ((6, 2, 4), P(None, "data", "model"))}
    specs |= {"c": ((6, 5), P())}
    values, gathered = {}, {}
    for k, (shape, spec) in specs.items():
        a = (rng.normal(size=shape) * 10.0 ** rng.integers(-2, 3, size=shape)).astype(F32)
        a[1].flat[0], a[4].flat[-1] = np.nan, np.inf
        values[(k,)] = {"primal": jax.device_put(a, NamedSharding(mesh, spec))}
        gathered[(k,)] = a
    axes = {k: {"primal": ("scan",)} for k in values}
    for defer in (False, True):
        packed = jax.jit(lambda v, d=defer: summaries.summarize_packed(v, {}, BINS, axes, defer=d))(
            values
        )
        assert len({w[0] for w in packed.regroup.where}) == 1, defer
        if defer:
            assert [type(p) for p in packed.pending] == [summaries.Iterated]
            packed, _ = summaries.finish(packed, jnp.asarray(True))
        out, _ = packed.unpack()
        for key, a in gathered.items():
            check_rows(out[key]["primal"], a, BINS, list(range(6)))


def test_a_large_array_split_over_explicit_axes_is_summarised_where_it_lies() -> None:
    # Only small arrays are gathered into the layout: a large one split over Explicit
    # axes keeps its summary distributed (no all-gather), its values NumPy's.
    from sowviz.capture import summaries

    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    a = np.random.default_rng(33).normal(size=(64, 2048)).astype(F32)  # > SEGMENT_MAX_ELEMENTS
    a[7, :5] = np.nan
    values = {("big",): {"primal": jax.device_put(a, NamedSharding(mesh, P("data")))}}
    capture = jax.jit(lambda v: summaries.summarize_packed(v, {}, BINS))
    hlo = capture.lower(values).compile().as_text()
    assert "all-gather" not in hlo and "all-to-all" not in hlo
    out, _ = capture(values).unpack()
    check_against_reference(out[("big",)]["primal"], a, BINS)


def test_only_arrays_split_over_explicit_axes_need_a_placed_tally() -> None:
    # `summary_ops.replicated`: a value on an explicit mesh whose type names no axis
    # counts its slots as an unmeshed one (the fast tally); a split one is told where
    # its small result goes. Both count what NumPy counts.
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    slots = np.random.default_rng(34).integers(0, 10, size=(8, 8)).astype(np.int32)
    want = np.bincount(slots.ravel(), minlength=10)
    for spec, placed in ((P(), False), (P("data", "model"), True)):
        x = jax.device_put(slots, NamedSharding(mesh, spec))
        assert bool(summary_ops.replicated(x)) is placed
        got = jax.jit(lambda s: summary_ops.tally_slots([s], 10, s))(x)
        np.testing.assert_array_equal(got, want)
    assert summary_ops.replicated(jnp.asarray(slots)) == {}


def test_inspect_on_an_explicit_mesh_summarises_as_on_an_auto_mesh_and_as_numpy() -> None:
    # The same program on a mesh of Explicit axes and of Auto axes: every probe's
    # statistics agree (the Explicit mesh's small sharded values are gathered into the
    # shared summaries, as XLA gathers them on the Auto one), and equal NumPy's of the
    # gathered values.
    import sowviz

    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
    rng = np.random.default_rng(35)
    w_np = rng.normal(size=(8, 16)).astype(F32)
    x_np = rng.normal(size=(4, 8)).astype(F32)

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    got = {}
    for kind in (AxisType.Explicit, AxisType.Auto):
        mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind,) * 2)
        w = jax.device_put(w_np, NamedSharding(mesh, P()))
        x = jax.device_put(x_np, NamedSharding(mesh, P("data", None)))
        got[kind] = {p.name: p.summaries for p in sowviz.inspect(loss, w, x).probes}
    assert got[AxisType.Explicit].keys() == got[AxisType.Auto].keys()
    for name, by_mode in got[AxisType.Explicit].items():
        for mode, s in by_mode.items():
            other = got[AxisType.Auto][name][mode]
            for key in ("count", "nan", "zeros", "min", "max", "absmax"):
                assert s[key] == other[key], (name, mode, key)
            for key in ("mean", "std", "l2"):  # sharded sums: another order
                np.testing.assert_allclose(s[key], other[key], rtol=1e-5, atol=1e-7)
    tanh = np.tanh(x_np.astype(np.float64) @ w_np.astype(np.float64))
    dtanh = 2 * tanh / tanh.size  # d mean(t**2) / dt
    for mode, want in (("primal", tanh), ("cotangent", dtanh)):
        s = got[AxisType.Explicit]["tanh"][mode]
        assert s["count"] == want.size and s["shape"] == [4, 16]
        np.testing.assert_allclose([s["min"], s["max"]], [want.min(), want.max()], rtol=1e-5)
        np.testing.assert_allclose(
            [s["mean"], s["std"], s["l2"]],
            [want.mean(), want.std(), np.linalg.norm(want)],
            rtol=1e-4,
            atol=1e-7,
        )


def test_a_large_layout_on_an_explicit_mesh_is_summarised_as_numpy() -> None:
    # A layout of replicated values on an explicit mesh (a Monitor's, laid out in its
    # capture program) is summarised in one piece: the CPU's blocks write each block's
    # rows into unmeshed buffers, which explicit sharding refuses (ShardingTypeError).
    from sowviz.capture import summaries

    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    rng = np.random.default_rng(36)
    leaves = [rng.normal(size=(600, 1024)).astype(F32) for _ in range(2)]
    leaves[1][5, :3] = np.nan
    rows = jax.jit(lambda ls: summaries._layout(ls, sized=False))(leaves)
    assert rows.flat.size > summary_ops.SEGMENT_BLOCKED_OVER  # blocked, were it unmeshed
    placed = jax.tree.map(lambda a: jax.device_put(a, NamedSharding(mesh, P())), rows)
    got = jax.jit(lambda r: summaries._segment_summary(r, BINS))(placed).summary()
    for i, a in enumerate(leaves):
        member = jax.tree.map(lambda x, i=i: x[i], got)
        check_against_reference(dataclasses.replace(member, shape=a.shape), a, BINS)


def test_an_l2_past_float32_is_the_true_norm_in_json_not_float32_max() -> None:
    # An attention mask filled with -0.7 * float32 max (as `jax.nn.dot_product_attention`
    # and Flax's attention fill it) has a norm past float32's range: it read exactly
    # float32 max (3.4028e38), a false value, in every report. It is inf on the device,
    # as `jnp.linalg.norm` says, and the float64 norm in JSON, in every path there.
    import sowviz
    from sowviz._model import model_json

    big = F32(-0.7 * F32_MAX)
    x = np.full((16,), big, F32)
    want = np.linalg.norm(x.astype(np.float64))  # 9.53e38
    assert float(jnp.linalg.norm(jnp.asarray(x))) == math.inf
    s = summarize(x)
    assert float(s.l2) == math.inf
    js = s.to_json()
    np.testing.assert_allclose(js["l2"], want, rtol=1e-6)
    json.dumps(js, allow_nan=False)
    np.testing.assert_allclose([js["mean"], js["std"]], [float(big), 0.0], rtol=1e-6)
    # per iteration: the row that overflows, and one that does not (rows are summed in
    # units of the pooled scale, 2**127 here: a row of values below ~1e19 would have
    # its squares flushed to 0 there)
    rows = np.stack([x, np.linspace(-1e30, 1e30, 16, dtype=F32)])
    per = summarize(rows, per_iteration=True).to_json()["per_iteration"]
    np.testing.assert_allclose(
        per["l2"], np.linalg.norm(rows.astype(np.float64), axis=1), rtol=1e-5
    )

    # inspect: the masked scores' summary is finished on the host, and the model's JSON
    # (float32 values written short) holds the float64 norm
    scores = jax.random.normal(jax.random.PRNGKey(0), (4, 8))
    mask = np.tril(np.ones((4, 8), bool))

    def attend(s):
        filled = jnp.where(mask, s, jnp.full(s.shape, big))
        return jnp.sum(jax.nn.softmax(sowviz.sow(filled, "masked"), -1) * s)

    ins = sowviz.inspect(attend, scores, mode="grad")
    got = ins.probe("masked").summaries["primal"]
    filled = np.where(mask, np.asarray(scores), big).astype(np.float64)
    np.testing.assert_allclose(got["l2"], np.linalg.norm(filled), rtol=1e-4)
    np.testing.assert_allclose([got["mean"], got["std"]], [filled.mean(), filled.std()], rtol=1e-4)
    (probe,) = [p for p in json.loads(model_json(ins.to_dict()))["probes"] if p["name"] == "masked"]
    np.testing.assert_allclose(
        probe["summaries"]["primal"]["l2"], np.linalg.norm(filled), rtol=1e-4
    )


def test_stack_rows_stats_are_their_rows_json_statistics_and_histogram() -> None:
    # `SummaryRow.stats_json` (a Monitor step's entry) is built for the whole stack at
    # once; each row must be exactly its `to_json()`'s statistics and histogram, also
    # for a row with no finite value (None, l2 too) and one whose l2 leaves float32's
    # range (the float64 norm, `norm_json`).
    big = np.float32(-0.7) * np.finfo(np.float32).max
    x = np.random.default_rng(5).normal(size=(6, 16)).astype(np.float32)
    x[1], x[2], x[3, :4], x[4, :5] = np.nan, big, np.inf, -np.inf
    stack = to_host(jax.vmap(lambda v: summarize(v, bins=4))(jnp.asarray(x)))
    from sowviz.summary_data import stack_rows

    rows = stack_rows(stack)
    for j in range(len(x)):
        row = SummaryRow(rows, j, (16,), "float32", False)
        full, got = row.to_json(), row.stats_json()
        assert type(got) is dict
        assert json.dumps(got) == json.dumps({k: full[k] for k in (*summary_mod.STAT_KEYS, "hist")})
        finite = x[j][np.isfinite(x[j])]
        assert got["count"] == finite.size
        assert got["hist"]["counts"] == stack.hist_counts[j].tolist()
    assert rows.stats(1)["min"] is None and rows.stats(1)["l2"] is None
    want = math.sqrt(16) * abs(float(big))  # float64: past float32's largest
    assert rows.stats(2)["l2"] == pytest.approx(want, rel=1e-4)
    assert rows.stats(2)["l2"] > float(np.finfo(np.float32).max)


def test_summary_stats_json_is_its_json_statistics_and_histogram() -> None:
    # A summary of its own (one with per-iteration statistics: a scan's stage) gives a
    # Monitor's step its statistics and histogram without its loghist and per-iteration
    # JSON; the same values, types and order as `to_json()`'s.
    x = np.random.default_rng(6).normal(size=(5, 12)).astype(np.float32)
    x[2] = np.nan
    x[0, 0] = np.inf
    s = to_host(summarize(jnp.asarray(x), bins=4, per_iteration=True))
    full, got = s.to_json(), s.stats_json()
    assert "per_iteration" in full and type(got) is dict
    assert list(got) == [*summary_mod.STAT_KEYS, "hist"]
    assert json.dumps(got) == json.dumps({k: full[k] for k in got})
    finite = x[np.isfinite(x)]
    assert (got["count"], got["nan"], got["posinf"]) == (finite.size, 12, 1)
    assert (got["min"], got["max"]) == (float(finite.min()), float(finite.max()))
    empty = to_host(summarize(jnp.full((3,), jnp.nan), bins=4)).stats_json()
    assert [empty[k] for k in ("count", "min", "l2", "absmax")] == [0, None, None, None]
    with pytest.raises(ValueError, match="stats_json needs one summary"):
        to_host(jax.vmap(lambda v: summarize(v, bins=4))(jnp.asarray(x))).stats_json()


def test_a_steps_stacks_of_one_dtype_are_finished_by_one_numpy_pass_and_match_numpy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The host finishes what the summary programs leave (mean, std, l2, the histogram's
    # edges, the log window): about sixty NumPy calls a stack whatever its members,
    # which on a recorded Monitor step's few dozen values cost more than the values'
    # arithmetic. A step's stacks of one dtype (its segmented layout, its grouped large
    # arrays, its per-iteration stack) are finished by one pass over all their members,
    # each member's statistics those of NumPy, bit for bit those of its stack alone.
    from sowviz.capture import summaries, tallied

    if jax.default_backend() != "cpu":
        pytest.skip("grouped summaries of large arrays are used on a CPU backend")
    monkeypatch.setattr(summaries, "STACK_MAX_ELEMENTS", 100)
    monkeypatch.setattr(summaries, "MIN_GROUPED", 100)
    rng = np.random.default_rng(31)
    arrays = {
        "small": rng.normal(size=(3, 4)).astype(F32),
        "tiny": rng.normal(size=(7,)).astype(F32) * F32(1e-3),
        "ints": rng.integers(-9, 9, size=(5,)).astype(np.int32),
        "large": rng.normal(size=(300,)).astype(F32) * F32(1e4),
        "square": rng.normal(size=(20, 20)).astype(F32),
        "loop": rng.normal(size=(5, 6)).astype(F32),
    }
    arrays["small"][1, 2], arrays["large"][7], arrays["square"][3, 3] = np.nan, np.inf, -np.inf
    arrays["tiny"][:] = np.nan  # a member with no finite value
    values = {(k,): {"primal": jnp.asarray(a)} for k, a in arrays.items()}
    axes = {("loop",): {"primal": ("scan",)}}
    packed = summaries.summarize_packed(values, {}, BINS, axes)
    stacks = packed.unpack(regroup=False)["groups"]
    assert sorted(type(g).__name__ for g in stacks) == ["Tallied", "TalliedRows", "TalliedRows"]

    calls = []
    moment_fields = summary_ops.moment_fields
    monkeypatch.setattr(
        summary_ops, "moment_fields", lambda *a, **k: calls.append(1) or moment_fields(*a, **k)
    )
    out, _ = packed.unpack()
    assert len(calls) == 1  # one pass for the three stacks (one each, before)
    for k, a in arrays.items():
        s = out[(k,)]["primal"]
        if k == "loop":
            check_rows(s, a, BINS, list(range(a.shape[0])))
        else:
            check_against_reference(s, a, BINS)
    # as `inspect` reads them: rows of the stacks, each what its full summary says
    rows, _ = packed.unpack(rows=True)
    made = [r for r in (rows[(k,)]["primal"] for k in arrays) if isinstance(r, SummaryRow)]
    assert len(made) >= 3
    for r in made:
        assert r == SummaryRow(r.rows, r.index, r.shape, r.dtype, r.is_complex)
    for k in arrays:
        assert rows[(k,)]["primal"].to_json() == out[(k,)]["primal"].to_json()
    # each stack's fields exactly what it makes alone
    monkeypatch.setattr(summary_ops, "moment_fields", moment_fields)
    for joint, alone in zip(tallied.finished(list(stacks)), stacks, strict=True):
        for p, q in zip(jax.tree.leaves(joint), jax.tree.leaves(alone.summary()), strict=True):
            assert p.dtype == q.dtype and p.tobytes() == q.tobytes()
