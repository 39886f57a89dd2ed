"""Per zoo model: equations, `inspect` time, plain first-call time, report size.

Run from the repository root: `python -m tests.zoo.measure` (add `--json` for a
machine-readable line per model, `--only NAME` for one model, `--new-processes` to
measure each model in a process of its own, after one warm-up `inspect`, as a kernel
started afresh would: in one process, a model's plain first call and its `inspect`
find XLA, JAX and sowviz warm from the models before it). Times are wall-clock seconds of a first call in
this process (tracing + compiling + running), so they include compilation, which is
what a user waits for. "plain" is the same mode without sowviz:
`jit(value_and_grad)` for grad (Equinox's `filter_jit(filter_value_and_grad)`, the
same thing for module arguments), `jit(jvp)` for jvp.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp

import sowviz

from .models import ZooCase, eqx_models, linen_scan, nnx_lm, ode


def count_eqns(jaxpr) -> int:
    """Equations of a jaxpr, counting those of every sub-jaxpr (jit, scan, while,
    cond branches, remat, custom rules) once where they appear."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0
    for eqn in jaxpr.eqns:
        total += 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else (value,):
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    total += count_eqns(sub)
    return total


def cases() -> list[ZooCase]:
    out = [
        nnx_lm.case(),
        linen_scan.case(),
        eqx_models.mlp_case(),
        eqx_models.cnn_case(),
        ode.rk4_case(),
        ode.newton_case(),
    ]
    try:
        from .models import tesseract_pipeline

        out.append(tesseract_pipeline.case())
    except ImportError as e:  # tesseract-jax missing: say so, measure the rest
        print(f"(tesseract pipeline skipped: {e})", file=sys.stderr)
    return out


def _plain(case: ZooCase):
    if case.mode == "grad":
        return eqx.filter_jit(eqx.filter_value_and_grad(case.fn))
    if case.mode == "jvp":
        tangents = jax.tree.map(jnp.ones_like, case.args)
        return eqx.filter_jit(lambda *a: jax.jvp(case.fn, a, tangents))
    raise ValueError(case.mode)


def _timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    jax.block_until_ready(jax.tree.leaves(eqx.filter(out, eqx.is_array)))
    return out, time.perf_counter() - t


def measure(case: ZooCase, tmp: Path) -> dict:
    eqns = count_eqns(eqx.filter_make_jaxpr(case.fn)(*case.args)[0])
    _, plain_s = _timed(_plain(case), *case.args)
    ins, inspect_s = _timed(lambda *a: sowviz.inspect(case.fn, *a, mode=case.mode), *case.args)
    path = Path(ins.save_html(tmp / f"{case.name}.html"))
    return {
        "model": case.name,
        "mode": case.mode,
        "eqns": eqns,
        "nodes": len(ins.graph.nodes),
        "probes": len(ins.probes),
        "inspect_s": round(inspect_s, 3),
        "plain_first_call_s": round(plain_s, 3),
        "ratio": round(inspect_s / plain_s, 2),
        "report_kb": round(path.stat().st_size / 1024, 1),
    }


def _in_new_processes(names: list[str]) -> tuple[list[dict], list[tuple[str, str]]]:
    """`measure` of each model in a process of its own (`--only NAME --json`)."""
    rows, failed = [], []
    root = Path(__file__).resolve().parents[2]
    for name in names:
        cmd = [sys.executable, "-m", "tests.zoo.measure", "--only", name, "--json"]
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        got = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not got:
            failed.append((name, (done.stdout + done.stderr).strip().splitlines()[-1:]))
        rows += got
    return rows, failed


def main(argv: list[str]) -> int:
    only = argv[argv.index("--only") + 1] if "--only" in argv else None
    if "--new-processes" in argv:
        rows, failed = _in_new_processes([c.name for c in cases()])
        return _report(rows, failed, argv)
    # Warm sowviz and JAX up once so the first model does not pay for imports.
    sowviz.inspect(lambda w: jnp.sum(jnp.tanh(w) ** 2), jnp.ones(3))
    rows, failed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases():
            if only is not None and case.name != only:
                continue
            try:
                rows.append(measure(case, Path(tmp)))
            except Exception as e:  # a failing model is reported, the others still measured
                failed.append((case.name, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"))
    return _report(rows, failed, argv)


def _report(rows: list[dict], failed: list, argv: list[str]) -> int:
    if "--json" in argv:
        for r in rows:
            print(json.dumps(r))
    else:
        print(f"JAX {jax.__version__}, {jax.devices()[0].platform}")
        head = [
            "model",
            "mode",
            "eqns",
            "nodes",
            "probes",
            "inspect_s",
            "plain_first_call_s",
            "ratio",
            "report_kb",
        ]
        widths = [max(len(h), *(len(str(r[h])) for r in rows)) if rows else len(h) for h in head]
        print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
        for r in rows:
            print("  ".join(str(r[h]).ljust(w) for h, w in zip(head, widths, strict=True)))
    for name, err in failed:
        print(f"FAILED {name}: {err}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
