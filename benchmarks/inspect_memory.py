"""Peak memory of `sowviz.inspect` vs a plain `jax.jit(jax.value_and_grad(loss))` run.

An elementwise residual network on activations of `--elements` elements (50M by
default, 200 MB each in float32), each layer a named scope (so `inspect` probes
every stage in grad mode: primal and cotangent). Each measurement runs in a
fresh child process; the peak is the device's `peak_bytes_in_use` where the
backend reports it (GPU), else the process' resident-set high-water mark.
Target (issue 15): inspect's peak increase ≤ 2× the plain run's.
Run: `python benchmarks/inspect_memory.py [--quick]`.
"""

from __future__ import annotations

import json
import subprocess
import sys

import _bench

LAYERS = 6


def _child(kind: str, elements: int) -> None:
    import jax
    import jax.numpy as jnp

    import sowviz

    width = 1000
    batch = elements // width

    def loss(params, x):
        h = x
        for i, (a, b) in enumerate(params):
            with jax.named_scope(f"layer_{i}"):
                h = h + jnp.tanh(h * a + b)
        return jnp.mean(h * h)

    params = [(jnp.full((width,), 0.5), jnp.full((width,), 0.1)) for _ in range(LAYERS)]
    x = jax.random.normal(jax.random.PRNGKey(0), (batch, width))
    # A device peak (GPU) cannot be reset, so there the first call is measured (compile
    # allocates next to nothing on the device); the process high-water mark (CPU) can,
    # so there compiling's host memory is kept out by a first call before measuring.
    warm = not _bench.device_peak_available()
    if kind == "plain":
        step = jax.jit(jax.value_and_grad(loss))
        if warm:
            jax.block_until_ready(step(params, x))
        peak, how = _bench.peak_memory(lambda: step(params, x))
    else:
        if warm:
            sowviz.inspect(loss, params, x)  # compiled, cached for the second call
        peak, how = _bench.peak_memory(lambda: sowviz.inspect(loss, params, x).result)
    print(json.dumps({"peak": peak, "how": how, "input_bytes": x.nbytes}))


def main(quick: bool = False, elements: int | None = None) -> list[_bench.Row]:
    rows: list[_bench.Row] = []
    n = elements or (2_000_000 if quick else 50_000_000)
    got = {}
    for kind in ("plain", "inspect"):
        out = subprocess.run(
            [sys.executable, __file__, "--child", kind, "--elements", str(n)],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise RuntimeError(f"{kind} child failed:\n{out.stderr[-3000:]}")
        got[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    plain, ins = got["plain"]["peak"], got["inspect"]["peak"]
    _bench.emit(
        rows,
        _bench.Row(
            "inspect_memory",
            f"peak increase inspect / plain, {n / 1e6:g}M-element activations",
            ins / max(plain, 1),
            target="≤ 2x",
            detail=f"(+{ins / 1e9:.2f} GB vs +{plain / 1e9:.2f} GB; input "
            f"{got['plain']['input_bytes'] / 1e9:.2f} GB; {got['plain']['how']})",
        ),
    )
    return rows


if __name__ == "__main__":

    def extra(ap):
        ap.add_argument("--child", choices=("plain", "inspect"))
        ap.add_argument("--elements", type=int)

    ns = _bench.args(__doc__, extra)
    if ns.child:
        _child(ns.child, ns.elements)
    else:
        main(ns.quick, ns.elements)
