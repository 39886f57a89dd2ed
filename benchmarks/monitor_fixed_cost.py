"""The Monitor's fixed host cost per step, `every=1`, on tiny models (issue 15).

One process with 8 host CPU devices (``--xla_force_host_platform_device_count=8``,
set before JAX starts), two models whose step is well under a millisecond of device
work, so that what the Monitor adds is host work:

* a 3x16 MLP, batch 4, its arguments on one device;
* a 2-D tensor-parallel `shard_map` MLP on a 4x2 mesh (``data``, ``model``): the
  first layer's weight split over ``model`` by columns, the second's by rows (a
  `psum` over ``model``), the batch split over ``data`` (a `psum` of the loss).

Per model, blocks of `BLOCK` steps of the plain `jax.jit(jax.value_and_grad(loss))`
step and of `Monitor.step` (recorded, `every=1`; and unrecorded, `every` larger than
the run) alternate, each step waiting for its gradients (as a loop applying them
does), a Monitor block ending with `flush` (its summaries read); medians over the
blocks. Printed: the ratio to the plain step and the host cost per step over it in
µs. Targets: ≤ 1.2x and ≤ 100 µs per step.

Run it in a process of its own: `python benchmarks/monitor_fixed_cost.py [--quick]`
(`--profile` prints a cProfile of the recorded steps of each model, `--wire` times the
read's gather of their parts, `--breakdown` splits a recorded step's time between the
programs it runs and the host Python around them). The TP model is `tests/_tp_model.py`, which the tests
check against NumPy.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import collections
import cProfile
import functools
import pstats
import sys
import time
import timeit

import _bench
import jax
import jax.numpy as jnp
from _mlp import interleaved_medians

import sowviz

sys.path.insert(0, str(_bench.ROOT / "tests"))  # the model the tests check
from _tp_model import tp_mesh, tp_model

#: Steps per timed block.
BLOCK = 10


def mlp_loss(params, x):
    h = x
    for i, p in enumerate(params):
        with jax.named_scope(f"layer_{i}"):
            h = jnp.tanh(h @ p["w"] + p["b"])
    return jnp.mean(h**2)


def mlp_case():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = [{"w": jax.random.normal(k, (16, 16)) / 4, "b": jnp.zeros(16)} for k in keys]
    return mlp_loss, (params, jax.random.normal(jax.random.PRNGKey(1), (4, 16)))


def tp_case():
    """The 2-D tensor-parallel `shard_map` MLP (`tests/_tp_model.py`, which the tests
    check against NumPy), its arguments placed on the mesh."""
    loss, params, x = tp_model(tp_mesh())
    return loss, (params, x)


CASES = {"3x16 MLP b4, one device": mlp_case, "2-D TP shard_map MLP, 4x2 mesh": tp_case}


def _waited(step, args):
    """One step, waiting for its gradients (as a loop that applies them does)."""
    _, g = step(*args)
    return jax.block_until_ready(g)


def measure(make, steps: int) -> dict[str, float]:
    loss, args = make()
    plain = jax.jit(jax.value_and_grad(loss))
    rec = sowviz.Monitor(loss, every=1, history=8)
    unrec = sowviz.Monitor(loss, every=10**9, history=8)
    fns = {
        name: functools.partial(_waited, step, args)
        for name, step in (("plain", plain), ("recorded", rec.step), ("unrecorded", unrec.step))
    }
    med = interleaved_medians(
        fns,
        max(steps // BLOCK, 1),
        BLOCK,
        settle={"recorded": rec.flush, "unrecorded": unrec.flush},
    )
    rec.close()
    unrec.close()
    return med


def profile(make, steps: int) -> None:
    loss, args = make()
    mon = sowviz.Monitor(loss, every=1, history=8)
    for _ in range(5):
        _waited(mon.step, args)
    mon.flush()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(steps):
        _waited(mon.step, args)
    mon.flush()
    pr.disable()
    pstats.Stats(pr).sort_stats("cumtime").print_stats(30)


def wire(make, label: str, rows: _bench.Rows) -> None:
    """The read's own host work (`--wire`): `_wire.gather` of the parts a read of
    recorded steps takes, where its buffer lies, and `_wire._one_of`'s walk of their
    leaves against building (and hashing) a cache key of their placements."""
    from sowviz import _wire

    gathered = []
    real = _wire.gather

    def spy(tree):
        gathered.append(tree)
        return real(tree)

    loss, args = make()
    mon = sowviz.Monitor(loss, every=1, history=8)
    _wire.gather = spy
    try:
        for _ in range(12):
            _waited(mon.step, args)
        mon.flush()
    finally:
        _wire.gather = real
        mon.close()
    tree = gathered[-1]
    leaves = _wire._leaves(tree)[0]
    buf, _ = real(tree)

    def key():
        return hash(tuple((v.sharding, v.committed) for v in leaves if isinstance(v, jax.Array)))

    for name, fn in (
        ("gather", lambda: jax.block_until_ready(real(tree)[0])),
        ("_one_of", lambda: _wire._one_of(leaves)),
        ("a placement key instead", key),
    ):
        t = min(timeit.repeat(fn, number=200, repeat=7)) / 200
        rows.add(
            f"{name} of a read's {len(leaves)} parts, {label}",
            t * 1e6,
            "µs",
            detail=f"(buffer on {len(buf.devices())} device(s))" if name == "gather" else "",
        )


def breakdown(make, label: str, steps: int, rows: _bench.Rows) -> None:
    """Where a recorded step's time goes (`--breakdown`, session 46): per step, the
    capture program's call, the program gathering a CPU mesh's summaries onto one
    device (`summaries._whole`), the summary programs (`summaries.finish`), the read
    (one per `_MAX_PENDING` steps: gather, transfer, record), and the rest: host
    Python. On a CPU backend a program's call runs much of its work before it returns
    (its "device" is these cores), so the calls are device work here, not dispatch."""
    from sowviz.capture import summaries

    loss, args = make()
    mon = sowviz.Monitor(loss, every=1, history=8)
    for _ in range(10):  # compiled, and the one-device plans decided
        _waited(mon.step, args)
    mon.flush()
    spent: collections.Counter = collections.Counter()

    def timed(fn, what):
        def call(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[what] += time.perf_counter() - t

        return call

    runner, plans, compiled = mon._runner, dict(summaries._PLANS), dict(summaries._COMPILED)
    real_run = runner._instrumented
    runner._instrumented = timed(real_run, "capture program")
    for key, plan in plans.items():
        if plan is not None and plan.whole is not None:
            whole = timed(plan.whole, "one-device gather program")
            summaries._PLANS[key] = summaries._OneDevicePlan(plan.device, whole, plan.specs)
    for key, c in compiled.items():
        summaries._COMPILED[key] = timed(c, "summary programs")
    mon._drain_now = timed(mon._drain_now, "read")
    try:
        t0 = time.perf_counter()
        for _ in range(steps):
            _waited(mon.step, args)
        mon.flush()
        total = time.perf_counter() - t0
    finally:
        runner._instrumented = real_run  # (the next Monitor of `loss` shares `runner`)
        summaries._PLANS.update(plans)
        summaries._COMPILED.update(compiled)
        mon.close()
    for what in ("capture program", "one-device gather program", "summary programs", "read"):
        rows.add(f"recorded step: {what}, {label}", spent[what] / steps * 1e6, "µs")
    rows.add(
        f"recorded step: host Python and the wait, {label}",
        (total - sum(spent.values())) / steps * 1e6,
        "µs",
        detail=f"(of {total / steps * 1e6:.0f} µs a step)",
    )


def plan_cost(make, label: str, rows: _bench.Rows) -> None:
    """`--breakdown`: the host Python of `summaries._on_one_device` on a recorded step's
    real inputs, its plan found in the cache (`_one_device_plan`, session 46) against
    decided at every call (as before), the gather program's call left out (it returns
    its real output, computed once)."""
    from sowviz.capture import summaries

    seen = []
    real, real_whole = summaries._on_one_device, summaries._whole

    def spy(pending, clean):
        seen.append((pending, clean))
        return real(pending, clean)

    loss, args = make()
    mon = sowviz.Monitor(loss, every=1, history=8)
    summaries._on_one_device = spy
    try:
        for _ in range(3):
            _waited(mon.step, args)
        mon.flush()
    finally:
        summaries._on_one_device = real
        mon.close()
    pending, clean = seen[-1]
    plan = summaries._one_device_plan(pending, clean, *reversed(jax.tree.flatten((pending, clean))))
    if plan is None:  # (one device: nothing to decide)
        return
    out = jax.block_until_ready(plan.whole(pending, plan.specs) if plan.whole else pending)
    summaries._whole = lambda _: lambda *a: out
    try:

        def decided():
            summaries._PLANS.clear()
            return real(pending, clean)

        t = {
            name: min(timeit.repeat(fn, number=200, repeat=7)) / 200
            for name, fn in (("decided", decided), ("found", lambda: real(pending, clean)))
        }
    finally:
        summaries._whole = real_whole
        summaries._PLANS.clear()
    rows.add(
        f"_on_one_device host Python, plan found / decided, {label}",
        t["found"] / t["decided"],
        detail=f"({t['found'] * 1e6:.1f} vs {t['decided'] * 1e6:.1f} µs)",
    )


def main(
    quick: bool = False, prof: bool = False, wires: bool = False, split: bool = False
) -> list[_bench.Row]:
    print(_bench.platform())
    if jax.device_count() < 8:
        raise RuntimeError(
            "monitor_fixed_cost needs 8 devices: run it in a process of its own (it sets "
            "XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts)."
        )
    rows = _bench.Rows("monitor_fixed_cost")
    steps = 50 if quick else 500
    for label, make in CASES.items():
        if prof:
            print(f"--- cProfile, {label}, every=1")
            profile(make, steps)
        if wires:
            wire(make, label, rows)
        if split:
            breakdown(make, label, steps, rows)
            plan_cost(make, label, rows)
        med = measure(make, steps)
        plain = med["plain"]
        for name in ("recorded", "unrecorded"):
            what = "every=1" if name == "recorded" else "unrecorded steps"
            rows.add(
                f"Monitor / plain step, {label}, {what}",
                med[name] / plain,
                target="≤ 1.2x" if name == "recorded" else "",
                detail=f"({med[name] * 1e6:.0f} µs vs plain {plain * 1e6:.0f} µs)",
            )
            rows.add(
                f"host cost per step over plain, {label}, {what}",
                (med[name] - plain) * 1e6,
                "µs",
                target="≤ 100 µs",
            )
    return rows


if __name__ == "__main__":

    def extra(ap):
        ap.add_argument("--profile", action="store_true", help="cProfile")
        ap.add_argument("--wire", action="store_true", help="the read's gather, timed")
        ap.add_argument("--breakdown", action="store_true", help="a recorded step, split")

    ns = _bench.args(__doc__, extra)
    main(ns.quick, ns.profile, ns.wire, ns.breakdown)
