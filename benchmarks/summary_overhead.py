"""Summaries of every sow, computed in the compiled program.

Prints, measured in one run:
* the ratio of `save_intermediates(jax.grad(f), summarize=True)` (capture +
  summaries of every sow, fetched to the host) to `jax.jit(jax.grad(f))` on the
  two MLPs of the capture benchmark (target ≤ 1.25× on CPU, ≤ 1.05× on a GPU),
  once called as a user calls it, its summaries read at every call as `Summary`
  objects (a synchronous round trip: ~200 µs on a GPU, and the host's cutting of
  the stacked summaries per array), and
  once read two calls later with the copy started at once (as `Monitor` does);
* the floor beside them: ``1 + t / jit(grad)`` for ``t`` the least work any summary
  does on as many values (`_mlp.bare_summary`), the capture not counted;
* the bytes moved device→host per captured array and key, for arrays of 1K, 1M
  and 16M elements (target: the same small number, ≤ 4 KB at 64 bins).
Run: `python benchmarks/summary_overhead.py [--quick]`.
"""

from __future__ import annotations

from collections import deque
from functools import partial

import _bench
import jax
import jax.numpy as jnp
import numpy as np
from _mlp import MLP_CASES, block, interleaved_medians, mlp_loss, mlp_params, summary_floor

import sowviz

REPEATS = {"8x512": (20, 3), "64x64": (20, 20)}  # (repeats, calls per repeat)
#: Interleaved measurements per case: this 2-core CPU's runs are bimodal (the same
#: program measured 1.27x and 1.56x in successive processes), so one median alone
#: says little; the row is the median round, its detail every round's ratio.
ROUNDS = 3


def called(wrapped, *args):
    """The user's call: its result, with the summaries read (NumPy) as `Summary` objects."""
    result, _ = wrapped(*args)
    return result


class Pipelined:
    """Summaries read two calls later, their copy started at once (as `Monitor` reads
    them): the device cost of the summaries, with the transfer overlapped."""

    def __init__(self, wrapped, *args):
        self.wrapped, self.args, self.queue = wrapped, args, deque()

    def __call__(self):
        result, packed = self.wrapped.run(*self.args)
        packed.fetch_async()
        self.queue.append(packed)
        if len(self.queue) > 2:
            [np.asarray(b) for b in self.queue.popleft().buffers]  # as the Monitor reads
        return result


def median_round(rounds: list[dict[str, float]], key: str) -> tuple[dict[str, float], str]:
    """The round whose `key` / baseline ratio is the median, and every round's ratio
    (``1 + floor / baseline`` for the floor), lowest first."""
    ratio = (
        (lambda t: 1 + t[key] / t["baseline"])
        if key == "floor"
        else (lambda t: t[key] / t["baseline"])
    )
    ordered = sorted(rounds, key=ratio)
    return ordered[len(ordered) // 2], " · ".join(f"{ratio(t):.2f}x" for t in ordered)


def main(quick: bool = False) -> list[_bench.Row]:
    rows: list[_bench.Row] = []
    print(_bench.platform())
    gpu = jax.devices()[0].platform != "cpu"
    for label, depth, width, batch in MLP_CASES:
        repeats, inner = (3, 1) if quick else REPEATS[label.split()[0]]
        params = mlp_params(depth, width)
        x = jax.random.normal(jax.random.PRNGKey(1), (batch, width))
        baseline = jax.jit(jax.grad(mlp_loss))
        summarised = sowviz.save_intermediates(jax.grad(mlp_loss), summarize=True)
        fns = {
            "baseline": partial(baseline, params, x),
            # what a user pays: the call, its summaries read as `Summary` objects
            # (NumPy already: only the gradients are waited for, not walked as trees)
            "summaries": partial(called, summarised, params, x),
            "pipelined": Pipelined(summarised, params, x),
            # every sow's primal and cotangent, no capture
            "floor": summary_floor(2 * depth * batch * width),
        }
        rounds = [interleaved_medians(fns, repeats, inner) for _ in range(1 if quick else ROUNDS)]
        for key, case in (
            ("summaries", "capture+summaries"),
            ("pipelined", "capture+summaries read 2 calls later (as Monitor)"),
        ):
            t, spread = median_round(rounds, key)
            _bench.emit(
                rows,
                _bench.Row(
                    "summary_overhead",
                    f"{case} / jit(grad), {label}",
                    t[key] / t["baseline"],
                    target="≤ 1.05x" if gpu else "≤ 1.25x",
                    detail=f"({t[key] * 1e6:.0f} µs vs {t['baseline'] * 1e6:.0f} µs, "
                    f"{2 * depth} arrays; rounds {spread})",
                ),
            )
        t, spread = median_round(rounds, "floor")

        _bench.emit(
            rows,
            _bench.Row(
                "summary_overhead",
                f"floor: 1 + (any summary's least work, min/max/sum and one tally "
                f"scatter, on as many values) / jit(grad), {label}",
                1 + t["floor"] / t["baseline"],
                detail=f"({t['floor'] * 1e6:.0f} µs for {2 * depth * batch * width:,} values, "
                f"no capture counted; rounds {spread})",
            ),
        )

    def one(x):
        return jnp.sum(sowviz.sow(jnp.sin(x), "s") ** 2)

    for n in (1_000, 1_000_000) if quick else (1_000, 1_000_000, 16_000_000):
        x = jnp.linspace(-1.0, 1.0, n)
        wrapped = sowviz.save_intermediates(jax.grad(one), summarize=True)
        _, packed = wrapped.run(x)
        block(packed.buffers)
        per = sum(b.nbytes for b in packed.buffers) / 2  # primal + cotangent of one array
        _bench.emit(
            rows,
            _bench.Row(
                "summary_overhead", f"bytes to host per array, {n:,} elements", per, "B", "≤ 4096"
            ),
        )
    return rows


if __name__ == "__main__":
    main(_bench.args(__doc__).quick)
