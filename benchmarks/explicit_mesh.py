"""First `sowviz.inspect` on a mesh with Explicit axes vs the same mesh with Auto axes
(issue 15: Explicit within 1.3x of Auto).

`jax.make_mesh` gives Explicit axes by default: a value's type then carries its
sharding (`float32[64@data,8]`). Each measurement runs in a new process with 8 host
CPU devices (``--xla_force_host_platform_device_count=8``) and an empty sowviz disk
cache of its own, so every program compiles: the plain `jax.jit` first call, then the
first `inspect`. Explicit and Auto runs alternate; the median of the runs is reported,
with the seconds XLA spent compiling (`backend_compile`, from JAX's monitoring events;
the summary programs compile in a thread beside the capture program, so they can add
up to more than the total).

Cases (those of the issue):

* `shard_map step`: a data-parallel `shard_map` training step (value_and_grad and
  pmean inside, an SGD update outside) over a 1-d mesh of 8, inspected in mode primal;
* `grad, sharded input`: ``jnp.mean(jnp.tanh(x @ w) ** 2)`` in mode grad on a 2x4 mesh,
  `x` split over ``data``, `w` replicated.

Run: `python benchmarks/explicit_mesh.py [--quick] [--runs 3]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

import _bench

CASES = ("shard_map step", "grad, sharded input")
AXES = ("explicit", "auto")
DEVICES = 8
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _mesh(shape: tuple[int, ...], names: tuple[str, ...], axes: str):
    import jax
    from jax.sharding import AxisType

    kind = AxisType.Explicit if axes == "explicit" else AxisType.Auto
    return jax.make_mesh(shape, names, axis_types=(kind,) * len(shape))


def shard_map_case(axes: str):
    """The data-parallel step: its function, arguments, the plain JAX it is compared
    with, and the inspected mode."""
    import functools

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = _mesh((DEVICES,), ("data",), axes)

    def loss(params, x, y):
        w1, w2 = params
        return jnp.mean((jax.nn.relu(x @ w1) @ w2 - y) ** 2)

    @functools.partial(
        jax.shard_map, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P())
    )
    def dp_grads(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.lax.pmean(value, "data"), jax.lax.pmean(grads, "data")

    def train_step(params, x, y):
        value, grads = dp_grads(params, x, y)
        return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), value

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = (
        jax.random.normal(keys[0], (8, 32)) / 3,
        jax.random.normal(keys[1], (32, 1)) / 6,
    )
    x = jax.random.normal(keys[2], (64, 8))
    x, y = (jax.device_put(a, NamedSharding(mesh, P("data"))) for a in (x, x[:, :1]))
    return train_step, (params, x, y), jax.jit(train_step), "primal"


def grad_case(axes: str):
    """A loss of a data-sharded input and a replicated weight, in mode grad."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = _mesh((2, 4), ("data", "model"), axes)

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    place = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    w = place(jax.random.normal(jax.random.PRNGKey(0), (8, 16)), P())
    x = place(jax.random.normal(jax.random.PRNGKey(1), (4, 8)), P("data", None))
    return loss, (w, x), jax.jit(jax.value_and_grad(loss)), "grad"


def one_process(case: str, axes: str) -> None:
    """In this (new) process: the plain first call, then the first `inspect`; prints
    their seconds and XLA's compile seconds as JSON."""
    import jax
    from jax import monitoring

    import sowviz

    compiled: dict[str, float] = defaultdict(float)
    phase = ["plain"]

    def listen(event: str, secs: float, **kw: object) -> None:
        if event == COMPILE_EVENT:
            compiled[phase[0]] += secs

    fn, args, plain, mode = (shard_map_case if case == CASES[0] else grad_case)(axes)
    jax.block_until_ready(jax.numpy.ones(3) + 1)  # the backend's start, out of both
    monitoring.register_event_duration_secs_listener(listen)
    t0 = time.perf_counter()
    jax.block_until_ready(plain(*args))
    plain_s = time.perf_counter() - t0
    phase[0] = "inspect"
    t0 = time.perf_counter()
    sowviz.inspect(fn, *args, mode=mode)
    inspect_s = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "plain": plain_s,
                "inspect": inspect_s,
                "plain_compile": compiled["plain"],
                "inspect_compile": compiled["inspect"],
            }
        )
    )


def _child(case: str, axes: str) -> dict:
    """`one_process` in a new process with 8 host devices and an empty disk cache."""
    flags = os.environ.get("XLA_FLAGS", "")
    with tempfile.TemporaryDirectory(prefix="sowviz-bench-cache-") as cache:
        env = dict(
            os.environ,
            SOWVIZ_CACHE_DIR=cache,
            JAX_PLATFORMS="cpu",
            XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={DEVICES}".strip(),
        )
        cmd = [sys.executable, __file__, "--one", case, "--axes", axes]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(case: str, runs: int) -> list[_bench.Row]:
    """`runs` new processes per kind of axes, alternating; medians."""
    got: dict[str, list[dict]] = {axes: [] for axes in AXES}
    for _ in range(runs):
        for axes in AXES:
            got[axes].append(_child(case, axes))

    def median(axes: str, key: str) -> float:
        return statistics.median(r[key] for r in got[axes])

    rows: list[_bench.Row] = []
    ex, au = (median(a, "inspect") for a in AXES)
    ex_c, au_c = (median(a, "inspect_compile") for a in AXES)
    # (on a shared machine the fastest run is the least disturbed)
    ex_min, au_min = (min(r["inspect"] for r in got[a]) for a in AXES)
    _bench.emit(
        rows,
        _bench.Row(
            "explicit_mesh",
            f"first inspect, Explicit / Auto axes, {case}",
            ex / au,
            target="≤ 1.3x",
            detail=f"({ex:.2f} s vs {au:.2f} s; XLA compile {ex_c:.2f} s vs {au_c:.2f} s; "
            f"fastest runs {ex_min:.2f} s vs {au_min:.2f} s)",
        ),
    )
    for axes in AXES:
        plain = median(axes, "plain")
        _bench.emit(
            rows,
            _bench.Row(
                "explicit_mesh",
                f"first inspect / plain first call, {axes.capitalize()} axes, {case}",
                median(axes, "inspect") / plain,
                detail=f"({median(axes, 'inspect'):.2f} s vs {plain:.2f} s)",
            ),
        )
    return rows


def main(quick: bool = False, runs: int | None = None) -> list[_bench.Row]:
    runs = runs or (1 if quick else 3)
    print(f"{_bench.platform()}; children: {DEVICES} host CPU devices, {runs} run(s) each")
    rows: list[_bench.Row] = []
    for case in CASES:
        try:
            rows += measure(case, runs)
        except subprocess.CalledProcessError as err:  # report and go on
            print(f"explicit_mesh | {case}: FAILED {err.stderr[-400:]}")
    return rows


if __name__ == "__main__":

    def extra(ap):
        ap.add_argument("--runs", type=int, default=None, help="new processes per kind (3)")
        ap.add_argument("--one", choices=CASES, help=argparse.SUPPRESS)
        ap.add_argument("--axes", choices=AXES, help=argparse.SUPPRESS)

    ns = _bench.args(__doc__, extra)
    if ns.one:
        one_process(ns.one, ns.axes)
    else:
        main(ns.quick, ns.runs)
