"""Where the GPU time of summaries goes: per-kernel device time from `jax.profiler`.

Prints, on a GPU (on a CPU there is no device timeline, and it says so):
* the device time and kernels per call of `jax.jit(jax.grad(f))` and of
  `save_intermediates(jax.grad(f), summarize=True).run` on the 8x512 MLP of the
  capture benchmark, with the largest kernels of each;
* with `--variants`, the summary of 16 stacked arrays of 256x512 (that MLP's
  activations) counted each way considered for the histograms: the shipped joint
  (linear x log) scatter, one scatter per histogram, K private copies of the table
  (fewer colliding updates, then a sum), copies interleaved in the table, and no
  histogram at all (the floor). Each variant is checked against the shipped one.
Run: `python benchmarks/gpu_kernels.py [--quick] [--variants]`.
"""

from __future__ import annotations

import collections
import functools
import glob
import tempfile

import _bench
import jax
import jax.numpy as jnp
import numpy as np
from _mlp import mlp_loss, mlp_params

import sowviz
from sowviz import summary_ops


def device_time(fn, calls: int = 10) -> tuple[float, float, list[tuple[str, float]]]:
    """(device µs per call, kernels per call, the six largest kernels) of `fn()`."""
    from jax.profiler import ProfileData

    for _ in range(3):
        jax.block_until_ready(fn())
    where = tempfile.mkdtemp()
    with jax.profiler.trace(where):
        for _ in range(calls):
            jax.block_until_ready(fn())
    data = ProfileData.from_file(glob.glob(where + "/**/*.xplane.pb", recursive=True)[0])
    ns: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if "tream" in line.name:  # the CUDA streams' kernels and copies
                for ev in line.events:
                    ns[ev.name] += ev.duration_ns
                    count[ev.name] += 1
    top = [(k, v / calls / 1e3) for k, v in ns.most_common(6)]
    return sum(ns.values()) / calls / 1e3, sum(count.values()) / calls, top


def _print(name: str, got: tuple) -> None:
    us, kernels, top = got
    print(f"{name}: {us:.1f} µs of device time per call, {kernels:.0f} kernels")
    for k, v in top:
        print(f"    {v:7.1f} µs  {k[:90]}")


# -- histogram counting variants (same signature as summary_ops.count, rows=None) ----


def _separate(idx, lslot, n_lin, n_log, rows, like):
    B, nd = idx.shape[0], idx.ndim
    member = summary_ops._b(jnp.arange(B, dtype=jnp.int32), nd)
    width = n_lin + n_log
    parts = [member * width + idx, member * width + n_lin + lslot]
    c = summary_ops.tally_slots(parts, B * width, like).reshape(B, width)
    return c[:, None, :n_lin], c[:, n_lin:]


def _private(idx, lslot, n_lin, n_log, rows, like, copies: int, interleaved: bool):
    B, nd = idx.shape[0], idx.ndim
    member = summary_ops._b(jnp.arange(B, dtype=jnp.int32), nd)
    width = n_lin * n_log
    copy = jax.lax.broadcasted_iota(jnp.int32, idx.shape, nd - 1) % copies
    joint = member * width + idx * n_log + lslot
    slot = joint * copies + copy if interleaved else copy * B * width + joint
    c = summary_ops.tally_slots([slot], copies * B * width, like)
    if interleaved:
        c = c.reshape(B, n_lin, n_log, copies).sum(3, dtype=jnp.int32)
    else:
        c = c.reshape(copies, B, n_lin, n_log).sum(0, dtype=jnp.int32)
    return jnp.sum(c, 2, dtype=jnp.int32)[:, None, :], jnp.sum(c, 1, dtype=jnp.int32)


def _none(idx, lslot, n_lin, n_log, rows, like):
    keep = (jnp.sum(idx) + jnp.sum(lslot)).astype(jnp.int32) * 0  # the indices still computed
    B = idx.shape[0]
    return jnp.zeros((B, 1, n_lin), jnp.int32) + keep, jnp.zeros((B, n_log), jnp.int32)


VARIANTS = {
    "joint scatter (shipped)": summary_ops.count,
    "one scatter per histogram": _separate,
    "4 private copies": functools.partial(_private, copies=4, interleaved=False),
    "4 copies interleaved": functools.partial(_private, copies=4, interleaved=True),
    "no histograms (floor)": _none,
}


def variants(calls: int) -> None:
    v = jax.random.normal(jax.random.PRNGKey(0), (16, 1, 256, 512))
    shipped = summary_ops.count
    ref = None
    try:
        for name, count in VARIANTS.items():
            summary_ops.count = count  # read by summary_ops.stats while it is traced
            fn = jax.jit(lambda v: summary_ops.stats(v, 64, None)[0])
            out = jax.device_get(fn(v))
            ref = out if ref is None else ref
            same = all(np.array_equal(out[k], ref[k], equal_nan=True) for k in out)
            tag = "" if same or count is _none else "  (DIFFERENT COUNTS)"
            _print(
                f"summary of 16x256x512, {name}{tag}", device_time(functools.partial(fn, v), calls)
            )
    finally:
        summary_ops.count = shipped


def main(quick: bool = False, with_variants: bool = False) -> list[_bench.Row]:
    print(_bench.platform())
    if jax.devices()[0].platform != "gpu":
        print("gpu_kernels: no GPU here (no device timeline to read); nothing measured")
        return []
    calls = 3 if quick else 10
    params, x = mlp_params(8, 512), jax.random.normal(jax.random.PRNGKey(1), (256, 512))
    plain = jax.jit(jax.grad(mlp_loss))
    summarised = sowviz.save_intermediates(jax.grad(mlp_loss), summarize=True)
    base = device_time(lambda: plain(params, x), calls)
    with_summaries = device_time(lambda: summarised.run(params, x), calls)
    _print("jit(grad), 8x512 MLP b256", base)
    _print("capture + summaries, 8x512 MLP b256", with_summaries)
    rows: list[_bench.Row] = []
    _bench.emit(
        rows,
        _bench.Row(
            "gpu_kernels",
            "device time, capture+summaries / jit(grad), 8x512 MLP b256",
            with_summaries[0] / base[0],
            target="≤ 1.05x",
            detail=f"({with_summaries[0]:.0f} µs in {with_summaries[1]:.0f} kernels vs "
            f"{base[0]:.0f} µs in {base[1]:.0f})",
        ),
    )
    if with_variants:
        variants(calls)
    return rows


if __name__ == "__main__":
    ns = _bench.args(
        __doc__,
        lambda ap: ap.add_argument("--variants", action="store_true", help="histogram A/B"),
    )
    main(ns.quick, ns.variants)
