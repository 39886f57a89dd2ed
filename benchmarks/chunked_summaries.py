"""Run time of `inspect`'s large-array summaries: chunks from the host vs the group program.

The 4x1024 MLP's (batch 2048) large arrays, as `inspect` defers them (`Blocks`): 17
of 2048x1024 and 8 of 1024x1024 float32 values (44M in all), and the 4x960's (its
960x960 gradients are shorter than a chunk: each is copied into one). Summarised by the group
program (`summary_blocks.grouped_stats`, keyed by the arrays' shapes: what a next
model of other widths compiles again) and by the chunk programs
(`summary_chunks.stats`, keyed by the chunk size: compiled once), each compiled
first, then alternated, `--reps` times each; the rows are the chunked time over the
group program's (min and median of the pairs). A repeated `inspect` of that model
pays this once per call. Run: `python benchmarks/chunked_summaries.py [--quick]`.
"""

from __future__ import annotations

import statistics
import time

import _bench
import jax
import jax.numpy as jnp

from sowviz.capture import summaries


def main(quick: bool = False, reps: int = 9) -> list[_bench.Row]:
    rows = _bench.Rows("chunked_summaries")
    print(_bench.platform())
    if jax.default_backend() != "cpu":
        print("chunked_summaries | skipped: the chunks serve a CPU backend")
        return rows
    for batch, width in ((512, 512),) if quick else ((2048, 1024), (2048, 960)):
        rows += _case(batch, width, 2 if quick else reps)
    return rows


def _case(batch: int, width: int, reps: int) -> list[_bench.Row]:
    rows = _bench.Rows("chunked_summaries")
    keys = jax.random.split(jax.random.PRNGKey(0), 25)
    shapes = [(batch, width)] * 17 + [(width, width)] * 8
    members = tuple(jax.random.normal(k, s) for k, s in zip(keys, shapes, strict=True))
    jax.block_until_ready(members)
    clean = jnp.asarray(True)

    def pending(chunked: bool):
        return (summaries.Blocks(members, 1 << 16, chunked),)

    def once(chunked: bool) -> float:
        t0 = time.perf_counter()
        regroup = summaries.Regroup(None, (), deferred=(0,), bins=64)
        packed = summaries.Packed((), summaries.pack({}).layout, regroup, pending(chunked))
        done, ok = summaries.finish(packed, clean)
        jax.block_until_ready((done.buffers, ok))
        return time.perf_counter() - t0

    for chunked in (False, True):  # compile (or load) both
        once(chunked)
    group, chunks = [], []
    for _ in range(reps):
        group.append(once(False))
        chunks.append(once(True))
    ratios = [c / g for c, g in zip(chunks, group, strict=True)]
    rows.add(
        f"chunked / group program, the 4x{width} MLP's {len(members)} arrays "
        f"({sum(m.size for m in members):,} values)",
        statistics.median(ratios),
        detail=f"(median of {len(ratios)} alternated pairs; chunks {min(chunks) * 1e3:.1f} ms "
        f"min, {statistics.median(chunks) * 1e3:.1f} median; group {min(group) * 1e3:.1f} "
        f"min, {statistics.median(group) * 1e3:.1f} median; pair ratios "
        f"{min(ratios):.2f}-{max(ratios):.2f})",
    )
    return rows


if __name__ == "__main__":

    def extra(ap):
        ap.add_argument("--reps", type=int, default=9)

    ns = _bench.args(__doc__, extra)
    main(ns.quick, ns.reps)
