"""The cost of a Monitor's `log_dir=`, `tensorboard=True` and W&B logging, per recorded step.

For each sink, on the entries of a real Monitor run (a 4-layer MLP: 10 probes, 20
summaries per step):
- the caller's cost per step (`sink.write`: what the training step pays; the
  encoding and writing happen on the sink's thread),
- the sink thread's cost per step (encode + write, measured as the time to drain
  N steps),
- bytes per step on disk (the run log; TensorBoard's event file),
- for the two file sinks, the write of one step on its own (median over steps of
  `sink._write(entry)` called directly: encode, checksum, write; the number the sink
  thread's cost approaches on an idle machine),
and the monitored step with each sink vs the same Monitor without (median step
time, interleaved). Target: within the Monitor's own budget (fixed host cost
≤ 100 µs per step), off the step's critical path.
Run: `python benchmarks/runlog_overhead.py [--quick]`.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import statistics
import tempfile
import time

import _bench
import jax
import jax.numpy as jnp

import sowviz
from sowviz.runlog import make_sinks

WIDTH, DEPTH, BATCH = 64, 4, 32


def loss(params, x):
    h = x
    for i, w in enumerate(params):
        with jax.named_scope(f"layer_{i}"):
            h = jnp.tanh(h @ w)
    return jnp.mean(h**2)


def init():
    keys = jax.random.split(jax.random.PRNGKey(0), DEPTH)
    params = [jax.random.normal(k, (WIDTH, WIDTH)) / WIDTH**0.5 for k in keys]
    return params, jax.random.normal(jax.random.PRNGKey(1), (BATCH, WIDTH))


def sgd(params, grads):
    return jax.tree_util.tree_map(lambda p, g: p - 1e-3 * g, params, grads)


def entries(n: int):
    params, x = init()
    mon = sowviz.Monitor(loss, history=n + 10)
    for _ in range(n):
        _, g = mon.step(params, x)
        params = sgd(params, g)
    mon.flush()
    return mon.to_dict(with_history=False), list(mon.history)


@contextlib.contextmanager
def wandb_run(root: str):
    import wandb

    os.environ["WANDB_MODE"] = "offline"
    os.environ["WANDB_SILENT"] = "true"
    run = wandb.init(project="sowviz-bench", dir=root, settings=wandb.Settings(console="off"))
    try:
        yield run
    finally:
        wandb.finish()


def sink_costs(kind: str, model, steps, root: str) -> dict[str, float]:
    log = os.path.join(root, kind)
    if kind == "log_dir":
        (sink,) = make_sinks(log)
    elif kind == "tensorboard":
        (sink,) = make_sinks(None, tensorboard=log)
    else:
        (sink,) = make_sinks(None, wandb=True)
    sink.open(model)
    sink.flush()
    t0 = time.perf_counter()
    caller = []
    for e in steps:
        c0 = time.perf_counter()
        sink.write(e)
        caller.append(time.perf_counter() - c0)
    sink.flush()
    total = time.perf_counter() - t0
    sink.close()
    if kind == "log_dir":
        size = (pathlib.Path(log) / "steps.log").stat().st_size  # model.json is once per run
    else:
        size = sum(f.stat().st_size for f in pathlib.Path(log).rglob("*") if f.is_file())
    return {
        "caller_us": statistics.median(caller) * 1e6,
        "thread_us": total / len(steps) * 1e6,
        "bytes": size / len(steps) if kind != "wandb" else float("nan"),
    }


def write_one_step(kind: str, model, steps, root: str) -> float:
    """Median seconds of one step's `_write` (encode + checksum + write), called on this
    thread while the sink's own thread idles."""
    log = os.path.join(root, f"{kind}-micro")
    (sink,) = make_sinks(log) if kind == "log_dir" else make_sinks(None, tensorboard=log)
    sink._open(model)
    times = []
    for e in steps:
        t0 = time.perf_counter()
        sink._write(e)
        times.append(time.perf_counter() - t0)
    sink.close()
    return statistics.median(times)


def step_times(steps: int, root: str, kinds: list[str]) -> dict[str, float]:
    params, x = init()
    mons = {"none": sowviz.Monitor(loss, history=steps + 10)}
    for k in kinds:
        kw = {
            "log_dir": {"log_dir": os.path.join(root, "mon-log")},
            "tensorboard": {"tensorboard": os.path.join(root, "mon-tb")},
            "wandb": {"wandb": True},
        }[k]
        mons[k] = sowviz.Monitor(loss, history=steps + 10, **kw)
    p = dict.fromkeys(mons, params)
    for name, mon in mons.items():  # compile, warm up
        for _ in range(3):
            _, g = mon.step(p[name], x)
            jax.block_until_ready(g)
    times: dict[str, list[float]] = {k: [] for k in mons}
    for _ in range(steps):
        for name, mon in mons.items():
            t0 = time.perf_counter()
            _, g = mon.step(p[name], x)
            p[name] = sgd(p[name], g)
            jax.block_until_ready(p[name])
            times[name].append(time.perf_counter() - t0)
    for mon in mons.values():
        mon.close()
    return {k: statistics.median(v) for k, v in times.items()}


def main(quick: bool = False) -> list[_bench.Row]:
    print(_bench.platform())
    rows: list[_bench.Row] = []
    n = 20 if quick else 200
    model, steps = entries(n)
    n_probes = len(model["probes"])
    n_summaries = sum(len(m) for m in steps[0]["probes"].values())
    kinds = ["log_dir", "tensorboard"]
    try:
        import wandb  # noqa: F401

        kinds.append("wandb")
    except ImportError:
        print("wandb is not installed: skipping its rows")
    with tempfile.TemporaryDirectory() as root:
        for kind in kinds:
            with wandb_run(root) if kind == "wandb" else contextlib.nullcontext():
                c = sink_costs(kind, model, steps, root)
            case = f"{kind}, {n_probes} probes ({n_summaries} summaries)"
            _bench.emit(
                rows,
                _bench.Row(
                    "runlog_overhead",
                    f"{case}: caller's cost per step (sink.write)",
                    c["caller_us"],
                    "µs",
                    target="≤ 100 µs",
                ),
            )
            _bench.emit(
                rows,
                _bench.Row(
                    "runlog_overhead",
                    f"{case}: sink thread's cost per step (encode + write)",
                    c["thread_us"],
                    "µs",
                ),
            )
            if kind != "wandb":
                _bench.emit(
                    rows,
                    _bench.Row(
                        "runlog_overhead",
                        f"{case}: one step's write on its own (median)",
                        write_one_step(kind, model, steps, root) * 1e6,
                        "µs",
                    ),
                )
                _bench.emit(
                    rows,
                    _bench.Row(
                        "runlog_overhead",
                        f"{case}: bytes per step on disk",
                        c["bytes"],
                        "B",
                        detail=f"({c['bytes'] / n_summaries:.0f} B per summary)",
                    ),
                )
        with contextlib.ExitStack() as stack:
            if "wandb" in kinds:
                stack.enter_context(wandb_run(root))
            med = step_times(20 if quick else 100, root, kinds)
        for kind in kinds:
            _bench.emit(
                rows,
                _bench.Row(
                    "runlog_overhead",
                    f"monitored step with {kind} / without, {DEPTH}x{WIDTH} MLP b{BATCH}",
                    med[kind] / med["none"],
                    detail=f"({med[kind] * 1e6:.0f} µs vs {med['none'] * 1e6:.0f} µs)",
                ),
            )
    return rows


if __name__ == "__main__":
    main(_bench.args(__doc__).quick)
