"""First `inspect` of nested loops vs plain JAX's first call (issue 15, "compile less").

The program has BlackJAX NUTS's shape in plain JAX: a `lax.scan` of sampler steps,
each an outer `while_loop` (the tree doubling) around an inner `while_loop` (the
leapfrog steps), whose bodies call a few dozen small functions (stages, each probed:
hundreds of probes of one or two elements inside the loops). With one carried value
per probe in every while loop and one stacked output per probe in the scan, the
capture program compiled 7-8x longer than the plain one (NUTS itself, 20 steps: 10.7 s
against 0.8 s); its captures now ride in one buffer per dtype (`capture.packing.Carried`)
and leave the program as that buffer, through any `jit` or `remat` around the loop too
(`capture.packing.Passed`: cut inside a diffrax solve's `jit`, each capture was a
kernel of its own, and its first `inspect` took 1.8x longer than with no buffer).

Rows: per case, the first `inspect` (mode primal: trace, compile, run, summaries) over
`jax.jit(fn)`'s first call, both measured in this process, and the capture program's
XLA compile over the plain program's (JAX's own compile events). sowviz's disk cache
starts empty here (`SOWVIZ_CACHE_DIR`, a new temporary folder, unless set).
Run: `python benchmarks/loops_compile.py [--quick]`.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import defaultdict

os.environ.setdefault("SOWVIZ_CACHE_DIR", tempfile.mkdtemp(prefix="sowviz-loops-"))

import _bench
import jax
import jax.numpy as jnp
from jax import lax, monitoring

import sowviz

COMPILE = "/jax/core/compile/backend_compile_duration"


def nuts_shaped(width: int, steps: int | None):
    """`steps` sampler steps in a scan (None: one step alone), each with `width` helper
    stages per leapfrog step."""

    def grad_logp(q):
        return -q * jnp.array([1.0, 0.5])

    def kinetic(p):
        return 0.5 * jnp.sum(p * p)

    def energy(q, p):
        return 0.5 * jnp.sum(q * q * jnp.array([1.0, 0.5])) + kinetic(p)

    def leapfrog(q, p, eps):
        p = p + 0.5 * eps * grad_logp(q)
        q = q + eps * p
        return q, p + 0.5 * eps * grad_logp(q)

    def helper(k):
        def h(q, p):
            return jnp.tanh(q * (1.0 + 0.01 * k)) + 0.1 * p

        h.__name__ = f"helper_{k}"
        return h

    helpers = [helper(k) for k in range(width)]

    def turning(q, p):  # a U-turn check: a cond, as NUTS's
        return lax.cond(jnp.dot(q, p) < 0, lambda: kinetic(p), lambda: energy(q, p))

    def integrate(q, p, eps, n):
        def body(c):
            i, q, p, e = c
            q, p = leapfrog(q, p, eps)
            for h in helpers:
                q = q + 1e-3 * h(q, p)
            return i + 1, q, p, e + energy(q, p) + turning(q, p)

        return lax.while_loop(lambda c: c[0] < n, body, (0, q, p, jnp.zeros(())))

    def build_tree(key, q):
        def body(c):
            d, q, p, e = c
            _, q, p, e2 = integrate(q, p, 0.1, d + 1)
            for h in helpers[: max(1, width // 2)]:
                p = p + 1e-3 * h(p, q)
            return d + 1, q, p, e + e2

        p = jax.random.normal(key, (2,))
        cond = lambda c: (c[0] < 4) & (c[3] < 50.0)  # noqa: E731
        return lax.while_loop(cond, body, (0, q, p, jnp.zeros(())))

    def one(key, q):
        return build_tree(key, q)[1]

    def loop(key, q):
        def body(q, k):
            q = one(k, q)
            return q, q

        return lax.scan(body, q, jax.random.split(key, steps))[1]

    return one if steps is None else loop


def compiled(fn) -> tuple[float, dict[str, float]]:
    """Seconds `fn()` took, and the XLA compile seconds per program it compiled."""
    parts: dict[str, float] = defaultdict(float)

    def listen(event: str, secs: float, **kw: object) -> None:
        if event == COMPILE:
            parts[str(kw.get("fun_name", ""))] += secs

    monitoring.register_event_duration_secs_listener(listen)
    t0 = time.perf_counter()
    try:
        jax.block_until_ready(fn())
    finally:
        took = time.perf_counter() - t0
        unregister = getattr(monitoring, "unregister_event_duration_listener", None)
        if unregister is not None:
            unregister(listen)
    return took, dict(parts)


def main(quick: bool = False) -> list[_bench.Row]:
    rows: list[_bench.Row] = []
    print(_bench.platform())
    width, steps = (3, 4) if quick else (12, 20)
    key, q = jax.random.PRNGKey(0), jnp.array([1.0, -0.5])
    for label, n in (("one step", None), (f"scan of {steps} steps", steps)):
        fn = nuts_shaped(width, n)
        plain, plain_parts = compiled(lambda fn=fn: jax.jit(fn)(key, q))
        got: dict = {}

        def first_inspect(fn=fn, got=got):
            got["ins"] = sowviz.inspect(fn, key, q, mode="primal")
            return got["ins"].result

        first, parts = compiled(first_inspect)
        capture = sum(v for k, v in parts.items() if "_instrumented_program" in k)
        summary = sum(v for k, v in parts.items() if "_finish_program" in k)
        probes = len(got["ins"].probes)
        case = f"NUTS-shaped nested while loops, {label}, {probes} probes"
        _bench.emit(
            rows,
            _bench.Row(
                "loops_compile",
                f"first inspect / plain first call, {case}",
                first / plain,
                target="≤ 1.5x",
                detail=f"({first:.2f} s vs {plain:.2f} s)",
            ),
        )
        _bench.emit(
            rows,
            _bench.Row(
                "loops_compile",
                f"capture program compile / plain compile, {case}",
                capture / max(sum(plain_parts.values()), 1e-9),
                detail=f"({capture:.2f} s vs {sum(plain_parts.values()):.2f} s; "
                f"summary program {summary:.2f} s)",
            ),
        )
    return rows


if __name__ == "__main__":
    main(_bench.args(__doc__).quick)
