"""Cost of the JAX attributes sowviz swaps while it traces, for plain JAX traced
meanwhile: `jax.jit(f).lower(x)` (trace and lower, a new function each time so
nothing is cached) with the swaps closed, installed by another context (a plain
thread while another one traces for sowviz: the wrappers pass through) and open in
this one (the wrappers record).

The swapped attributes (`_compat.recording_named_calls`,
`_compat.recording_vmap_params`) are `ExtendNameStackContextManager.__enter__`,
called once per name pushed (a `jax.named_call`, a `jit`'s name), and
`api.debug_info`, called once per transformation applied: a plain function of
1,000 equations calls them a few times; the second case calls each of them 250
times (250 `named_call`s, 250 `vmap`s).
Run: `python benchmarks/compat_patches.py [--quick]`.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import _bench
import jax
import jax.numpy as jnp

from sowviz import _compat


def plain(n_eqns: int):
    def make():
        def f(x):
            for _ in range(n_eqns // 2):
                x = jnp.sin(x) * 1.0001
            return x

        return f

    return make


def named(n_calls: int):
    def step(x):
        return jnp.sin(x) * 1.0001

    def make():
        def f(x):
            for i in range(n_calls):
                x = jax.named_call(step, name=f"s{i}")(x)
                x = jax.vmap(step)(x)
            return x

        return f

    return make


@contextlib.contextmanager
def installed_elsewhere():
    """The wrappers in place, this context not recording (a plain thread's view)."""
    _compat._NAMED_CALLS.enter()
    _compat._VMAP_PARAMS.enter()
    try:
        yield
    finally:
        _compat._VMAP_PARAMS.leave()
        _compat._NAMED_CALLS.leave()


@contextlib.contextmanager
def open_here():
    with _compat.recording_named_calls(), _compat.recording_vmap_params():
        yield


STATES = {
    "closed": contextlib.nullcontext,
    "installed": installed_elsewhere,
    "open": open_here,
}


def main(quick: bool = False) -> list[_bench.Row]:
    rows = _bench.Rows("compat_patches")
    print(_bench.platform())
    x = jnp.ones((8, 8))
    repeats = 3 if quick else 15
    cases = {"1000-eqn plain": plain(1000), "250 named_call + 250 vmap": named(250)}
    for case, make in cases.items():
        samples: dict[str, list[float]] = {k: [] for k in STATES}
        for _ in range(2):  # warm up
            jax.jit(make()).lower(x)
        for _ in range(repeats):  # alternating, so drift hits all alike
            for state, ctx in STATES.items():
                with ctx():
                    t0 = time.perf_counter()
                    jax.jit(make()).lower(x)
                    samples[state].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in samples.items()}
        rows.add(f"{case}: closed", med["closed"] * 1e3, unit="ms")
        for state in ("installed", "open"):
            rows.add(f"{case}: {state} / closed", med[state] / med["closed"])
    return rows


if __name__ == "__main__":
    main(_bench.args(__doc__).quick)
