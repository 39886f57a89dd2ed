"""Compile cost of `sowviz.inspect` vs plain JAX, first call and repeated.

For each model: the first `sowviz.inspect(loss, *args)` (grad mode, stage
probes) and the plain `jax.jit(jax.value_and_grad(loss))` first call (both
trace, lower, compile and run), then the identical `inspect` again with new
values of the same shapes, and a first `inspect` of an edited function with
like shapes (a notebook cell run again). Seconds by part come from JAX's own monitoring
events (jaxpr tracing, lowering to MLIR, backend compile, with the shared summary
program's compile in brackets: it runs in a thread beside the capture program's, so
"other" can be negative); "other" is the rest
(sowviz's graph building, the run, the host work).
Targets (issue 15): first inspect ≤ 1.5× plain first call; repeat ≤ 0.3 s.

Models: a small Flax NNX MLP with LayerNorm (split into graphdef/state), an
Equinox MLP (partitioned into arrays/static), programs of 1k and (with
`--big`, slow) 10k equations (named-scope residual layers), and a wide MLP whose
probes are large (1-2M elements).
The same first inspect is also measured in new processes (a notebook kernel
started afresh), once with sowviz's disk cache empty and once with its programs
on disk (`sowviz._disk_cache`), and then for the same model with other widths,
as a user's next model meets it: sowviz's shared programs on disk, the ones keyed by
its own shapes not; the in-process rows run with an
empty cache of their own.
Run: `python benchmarks/inspect_compile.py [--quick] [--big] [--inline-summaries]`;
`--inline-summaries` compiles every summary inside the capture program (the layout
before the second, shared summary program: an A/B switch, best in a fresh process).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager

import _bench
import jax
import jax.numpy as jnp
from jax import monitoring

import sowviz

EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}


#: sowviz's summary programs (the shared one, and the chunk programs of large arrays).
SUMMARY_PROGRAMS = ("_finish_program", "_chunk_first", "_chunk_second")


@contextmanager
def timed_parts():
    parts: dict[str, float] = defaultdict(float)

    def listen(event: str, secs: float, **kw: object) -> None:
        if event in EVENTS:
            parts[EVENTS[event]] += secs
            # the shared summary program's part of it (compiled in a thread, beside
            # the capture program: the parts can add up to more than the total)
            name = str(kw.get("fun_name", ""))
            if EVENTS[event] == "compile" and any(n in name for n in SUMMARY_PROGRAMS):
                parts["summary compile"] += secs
            if EVENTS[event] == "compile":  # by program (`--one`'s breakdown)
                parts["compile:" + name] += secs

    monitoring.register_event_duration_secs_listener(listen)
    t0 = time.perf_counter()
    try:
        yield parts
    finally:
        parts["total"] = time.perf_counter() - t0
        parts["other"] = parts["total"] - sum(parts[k] for k in EVENTS.values())
        parts["by program"] = ", ".join(  # type: ignore[assignment]
            f"{k[8:]} {v:.2f}" for k, v in sorted(parts.items()) if k.startswith("compile:")
        )
        unregister = getattr(monitoring, "unregister_event_duration_listener", None)
        if unregister is not None:
            unregister(listen)


def nnx_case(quick: bool, other: bool = False):
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, d, rngs):
            self.norm = nnx.LayerNorm(d, rngs=rngs)
            self.up = nnx.Linear(d, 4 * d, rngs=rngs)
            self.down = nnx.Linear(4 * d, d, rngs=rngs)

        def __call__(self, x):
            return x + self.down(jax.nn.gelu(self.up(self.norm(x))))

    class Model(nnx.Module):
        def __init__(self, d, n, rngs):
            self.blocks = (
                nnx.List([Block(d, rngs) for _ in range(n)])
                if hasattr(nnx, "List")
                else [Block(d, rngs) for _ in range(n)]
            )
            self.head = nnx.Linear(d, 1, rngs=rngs)

        def __call__(self, x):
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    d = 80 if other else 64
    graphdef, state = nnx.split(Model(d, 2 if quick else 6, nnx.Rngs(0)))

    def loss(state, x):
        return jnp.mean(nnx.merge(graphdef, state)(x) ** 2)

    x = jax.random.normal(jax.random.PRNGKey(1), (32, d))
    return "Flax NNX MLP blocks", loss, (state, x)


def eqx_case(quick: bool, other: bool = False):
    import equinox as eqx

    model = eqx.nn.MLP(64, 64, 200 if other else 256, 2 if quick else 6, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_array)

    def loss(params, x):
        m = eqx.combine(params, static)
        return jnp.mean(jax.vmap(m)(x) ** 2)

    x = jax.random.normal(jax.random.PRNGKey(1), (32, 64))
    return "Equinox MLP", loss, (params, x)


def deep_case(n_eqns: int, other: bool = False):
    n_layers = n_eqns // 4

    def loss(ws, x):
        for i, w in enumerate(ws):
            with jax.named_scope(f"layer_{i}"):
                x = x + jnp.tanh(x @ w + 1.0)
        return jnp.sum(x * x) / x.size

    keys = jax.random.split(jax.random.PRNGKey(0), n_layers)
    d = 20 if other else 16
    ws = [jax.random.normal(k, (d, d)) / 40 for k in keys]
    return (
        f"{n_eqns}-equation program",
        loss,
        (ws, jax.random.normal(jax.random.PRNGKey(1), (8, d))),
    )


def wide_case(quick: bool, other: bool = False):
    """Few stages, large activations: 27 probes of 1-2M elements (`--quick`: 0.5-1M),
    summarised in blocks on a CPU by one loop per group (`summary_blocks`)."""
    layers, batch, width = 4, 512 if quick else 2048, 960 if other else 1024

    def loss(ws, x):
        for i, w in enumerate(ws):
            with jax.named_scope(f"layer_{i}"):
                x = jax.nn.gelu(jax.nn.standardize(x @ w))
        return jnp.mean(x**2)

    keys = jax.random.split(jax.random.PRNGKey(0), layers + 1)
    ws = [jax.random.normal(k, (width, width)) / width**0.5 for k in keys[:layers]]
    x = jax.random.normal(keys[-1], (batch, width))
    return f"MLP {layers}x{width}, batch {batch} (large probes)", loss, (ws, x)


def _fmt(p: dict[str, float]) -> str:
    def part(k: str) -> str:
        shared = p.get("summary compile") if k == "compile" else None
        return f"{k} {p[k]:.2f}" + (f" (summary program {shared:.2f})" if shared else "")

    return ", ".join(part(k) for k in ("trace", "lower", "compile", "other"))


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(name: str, loss, args) -> list[_bench.Row]:
    rows = _bench.Rows("inspect_compile")
    plain_fn = jax.jit(jax.value_and_grad(loss))
    with timed_parts() as plain:
        jax.block_until_ready(plain_fn(*args))
    with timed_parts() as first:
        sowviz.inspect(loss, *args)
    again_args = jax.tree_util.tree_map(lambda a: a * 1.01 if hasattr(a, "shape") else a, args)
    with timed_parts() as again:
        ins = sowviz.inspect(loss, *again_args)
    # Its probes' JSON is made when first read (`Probe.summaries`): what a view pays.
    model = _seconds(ins.to_dict)
    del ins
    # What a repeat cannot go below: the step itself (a large model's is most of it).
    step = min(_seconds(lambda: jax.block_until_ready(plain_fn(*again_args))) for _ in range(3))
    rows.add(
        f"first inspect / plain first call, {name}",
        first["total"] / plain["total"],
        target="≤ 1.5x",
        detail=f"({first['total']:.2f} s [{_fmt(first)}] vs {plain['total']:.2f} s "
        f"[{_fmt(plain)}])",
    )

    # A notebook re-runs a cell with an edited loss: a new function with like shapes
    # (the summaries' program, keyed by size class, is shared; the capture program not).
    def edited(*a):
        return loss(*a) * 1.0

    with timed_parts() as plain2:
        jax.block_until_ready(jax.jit(jax.value_and_grad(edited))(*args))
    with timed_parts() as second:
        sowviz.inspect(edited, *args)
    rows.add(
        f"first inspect of an edited function (like shapes) / plain, {name}",
        second["total"] / plain2["total"],
        target="≤ 1.5x",
        detail=f"({second['total']:.2f} s vs {plain2['total']:.2f} s)",
    )

    # Modes jvp and all (the widget's): their default tangents are made outside the
    # program (made inside, XLA:CPU compiled a kernel per leaf: 64 s at 1,000 equations).
    def fresh(*a):
        return loss(*a) * 1.0

    ones = jax.tree_util.tree_map(jnp.ones_like, args)
    with timed_parts() as plain_jvp:
        jax.block_until_ready(jax.jit(lambda *a: jax.jvp(fresh, a, ones))(*args))
    took = {}
    for mode in ("jvp", "all"):
        with timed_parts() as part:
            sowviz.inspect(lambda *a: loss(*a) * 1.0, *args, mode=mode)
        took[mode] = part["total"]
    rows.add(
        f"first inspect, mode jvp / plain jit(jvp) first call, {name}",
        took["jvp"] / plain_jvp["total"],
        detail=f"({took['jvp']:.2f} s vs {plain_jvp['total']:.2f} s; mode all {took['all']:.2f} s)",
    )
    rows.add(
        f"repeated inspect, {name}",
        again["total"],
        "s",
        target="≤ 0.3 s",
        detail=f"[{_fmt(again)}; the plain step alone {step:.3f} s; then its model, "
        f"to_dict, {model:.3f} s]",
    )
    return rows


def _cases(quick: bool, other: bool = False) -> dict:
    """The models; `other`: the same with other widths (a user's next model)."""
    return {
        "nnx": lambda: nnx_case(quick, other),
        "eqx": lambda: eqx_case(quick, other),
        "deep": lambda: deep_case(200 if quick else 1000, other),
        "wide": lambda: wide_case(quick, other),
    }


def one_process(key: str, quick: bool, other: bool = False) -> None:
    """In this (new) process: plain first call, then first inspect; prints their totals."""
    name, loss, args = _cases(quick, other)[key]()
    jax.block_until_ready(jnp.ones(3) + 1)  # the backend's start, out of both
    plain_fn = jax.jit(jax.value_and_grad(loss))
    with timed_parts() as plain:
        jax.block_until_ready(plain_fn(*args))
    with timed_parts() as first:
        sowviz.inspect(loss, *args)
    print(f"  plain   [{_fmt(plain)}]\n  inspect [{_fmt(first)}]", file=sys.stderr)
    print(f"  inspect's compiles: {first['by program']}", file=sys.stderr)
    print(json.dumps({"name": name, "plain": plain["total"], "inspect": first["total"]}))


def new_process(key: str, quick: bool) -> list[_bench.Row]:
    """First inspect / plain in new processes: disk cache empty, then filled by the first,
    then the same model with other widths (a user's next model: sowviz's shared
    programs on disk, its own not)."""
    rows = _bench.Rows("inspect_compile")
    with tempfile.TemporaryDirectory(prefix="sowviz-bench-cache-") as cache:
        runs = []
        for run in ("empty", "filled", "other"):
            cmd = [sys.executable, __file__, "--one", key] + (["--quick"] if quick else [])
            cmd += ["--other"] if run == "other" else []
            env = dict(os.environ, SOWVIZ_CACHE_DIR=cache)
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    (empty, filled, other) = runs
    rows.add(
        f"first inspect of the next model (other widths) in a new process / plain, {empty['name']}",
        other["inspect"] / other["plain"],
        target="≤ 1.5x",
        detail=f"({other['inspect']:.2f} s vs {other['plain']:.2f} s)",
    )
    rows.add(
        f"first inspect in a new process / plain, summary programs on disk, {empty['name']}",
        filled["inspect"] / filled["plain"],
        target="≤ 1.5x",
        detail=f"({filled['inspect']:.2f} s vs {filled['plain']:.2f} s; disk cache empty: "
        f"{empty['inspect'] / empty['plain']:.2f}x, {empty['inspect']:.2f} s vs "
        f"{empty['plain']:.2f} s)",
    )
    return rows


def main(quick: bool = False, big: bool = False, inline: bool = False) -> list[_bench.Row]:
    from sowviz.capture import summaries

    summaries.DEFER_SEGMENTS = not inline
    print(_bench.platform(), "(summaries inline)" if inline else "")
    rows = _bench.Rows("inspect_compile")
    with tempfile.TemporaryDirectory(prefix="sowviz-bench-cache-") as cache:
        os.environ["SOWVIZ_CACHE_DIR"] = cache  # every in-process row compiles afresh
        cases = [make() for make in _cases(quick).values()]
        if big:
            cases.append(deep_case(10_000))
        for name, loss, args in cases:
            try:
                rows += measure(name, loss, args)
            except Exception as err:  # report and go on: one model must not hide the others
                print(f"inspect_compile | {name}: FAILED {type(err).__name__}: {err}"[:400])
    if not inline:
        for key in _cases(quick):
            try:
                rows += new_process(key, quick)
            except subprocess.CalledProcessError as err:
                print(f"inspect_compile | new process, {key}: FAILED {err.stderr[-400:]}")
    return rows


if __name__ == "__main__":

    def extra(ap):
        ap.add_argument("--big", action="store_true")
        ap.add_argument("--inline-summaries", action="store_true")
        ap.add_argument("--one", choices=("nnx", "eqx", "deep", "wide"), help=argparse.SUPPRESS)
        ap.add_argument("--other", action="store_true", help=argparse.SUPPRESS)

    ns = _bench.args(__doc__, extra)
    if ns.one:
        one_process(ns.one, ns.quick, ns.other)
    else:
        main(ns.quick, ns.big, ns.inline_summaries)
