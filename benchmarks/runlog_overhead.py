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
and, in a training loop (`every=1`) with each sink, with the run log and TensorBoard
together, and with none:
- the loop's time per step against the same Monitor's without sinks (blocks of
  steps timed until `mon.flush()` has drained the sinks, the configurations taking
  turns block by block: a sink's thread shares the CPU and the GIL with the loop),
- the sinks' threads' CPU time per recorded step (`Sink.cpu_entries`: building the
  Monitor's entries, once per step whichever sink comes first; `Sink.cpu_writing`:
  encoding and writing), and the training thread's own CPU time per step.
Target: within the Monitor's own budget (fixed host cost ≤ 100 µs per step), off
the step's critical path.
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
from sowviz.runlog.sink import Sink

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


# The training loops timed: Monitor keyword arguments under a short name.
def loop_configs(root: str, kinds: list[str]) -> dict[str, dict]:
    log, tb = os.path.join(root, "mon-log"), os.path.join(root, "mon-tb")
    configs = {
        "none": {},
        "log_dir": {"log_dir": log},
        "tensorboard": {"tensorboard": tb},
        "log_dir+tensorboard": {"log_dir": log + "-both", "tensorboard": True},
        "wandb": {"wandb": True},
    }
    return {k: kw for k, kw in configs.items() if k in ("none", "log_dir+tensorboard", *kinds)}


def sinks_cpu(mon) -> tuple[float, float]:
    """(entries, writing) CPU seconds of `mon`'s sinks' threads so far."""
    sinks = [s for s in mon._listeners if isinstance(s, Sink)]  # (no public accessor)
    return sum(s.cpu_entries for s in sinks), sum(s.cpu_writing for s in sinks)


def loop_costs(steps: int, rounds: int, root: str, kinds: list[str]) -> dict[str, dict]:
    """Per configuration: the median over `rounds` blocks of `steps` training steps of
    the wall time per step (each block ends with `mon.flush()`, so a sink's backlog
    counts against its own block), and CPU seconds per step: the training thread's,
    the sinks' threads' building entries and writing them."""
    params, x = init()
    mons = {
        k: sowviz.Monitor(loss, history=rounds * steps + 10, **kw)
        for k, kw in loop_configs(root, kinds).items()
    }
    p = dict.fromkeys(mons, params)
    for name, mon in mons.items():  # compile, warm up
        for _ in range(3):
            _, g = mon.step(p[name], x)
            jax.block_until_ready(g)
        mon.flush()
    out: dict[str, dict[str, list[float]]] = {k: {} for k in mons}
    for _ in range(rounds):
        for name, mon in mons.items():
            cpu0, t0, main0 = sinks_cpu(mon), time.perf_counter(), time.thread_time()
            for _ in range(steps):
                _, g = mon.step(p[name], x)
                p[name] = sgd(p[name], g)
            jax.block_until_ready(p[name])
            mon.flush()
            wall, main = time.perf_counter() - t0, time.thread_time() - main0
            cpu = [b - a for a, b in zip(cpu0, sinks_cpu(mon), strict=True)]
            for key, v in zip(
                ("wall", "main", "entries", "writing"), (wall, main, *cpu), strict=True
            ):
                out[name].setdefault(key, []).append(v / steps)
    for mon in mons.values():
        mon.close()
    return {k: {key: statistics.median(v) for key, v in d.items()} for k, d in out.items()}


def main(quick: bool = False) -> list[_bench.Row]:
    print(_bench.platform())
    rows = _bench.Rows("runlog_overhead")
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
            rows.add(
                f"{case}: caller's cost per step (sink.write)",
                c["caller_us"],
                "µs",
                target="≤ 100 µs",
            )
            rows.add(
                f"{case}: sink thread's cost per step (encode + write)",
                c["thread_us"],
                "µs",
            )
            if kind != "wandb":
                rows.add(
                    f"{case}: one step's write on its own (median)",
                    write_one_step(kind, model, steps, root) * 1e6,
                    "µs",
                )
                rows.add(
                    f"{case}: bytes per step on disk",
                    c["bytes"],
                    "B",
                    detail=f"({c['bytes'] / n_summaries:.0f} B per summary)",
                )
        with contextlib.ExitStack() as stack:
            if "wandb" in kinds:
                stack.enter_context(wandb_run(root))
            loops = loop_costs(10 if quick else 50, 3 if quick else 6, root, kinds)
        none = loops["none"]
        for kind, c in loops.items():
            if kind == "none":
                continue
            case = f"training loop with {kind}, {DEPTH}x{WIDTH} MLP b{BATCH}, every=1"
            rows.add(
                f"{case}: step / without sinks",
                c["wall"] / none["wall"],
                detail=f"({c['wall'] * 1e6:.0f} µs vs {none['wall'] * 1e6:.0f} µs)",
            )
            rows.add(
                f"{case}: sinks' threads' CPU per recorded step",
                (c["entries"] + c["writing"]) * 1e6,
                "µs",
                detail=f"(building entries {c['entries'] * 1e6:.0f} µs, "
                f"encoding + writing {c['writing'] * 1e6:.0f} µs)",
            )
            rows.add(
                f"{case}: training thread's CPU per step / without sinks",
                c["main"] / none["main"],
                detail=f"({c['main'] * 1e6:.0f} µs vs {none['main'] * 1e6:.0f} µs)",
            )
    return rows


if __name__ == "__main__":
    main(_bench.args(__doc__).quick)
