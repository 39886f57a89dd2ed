"""Assertions shared by the zoo tests: results against plain JAX, stage probes
against independently computed intermediates, reports in Chromium.

Everything here compares sowviz's output with values computed by the libraries
themselves (`jax.value_and_grad`, `eqx.filter_value_and_grad`, `nnx.value_and_grad`,
`jax.jvp`, `jax.vjp`), never with numbers written into a test.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import numpy as np

RTOL = 1e-5  # results vs plain JAX (the bar)
STAT_RTOL = 1e-4  # on-device float32 statistics (l2 of a whole array) vs NumPy float64


def _normalise(tree: Any) -> Any:
    """Gradients of a module as the arrays they hold: an NNX module becomes its
    `nnx.State` of `Param`s (what `nnx.value_and_grad` returns), an Equinox module
    keeps only its inexact-array leaves (what `eqx.filter_value_and_grad` fills)."""
    try:
        from flax import nnx
    except ImportError:  # pragma: no cover - flax is in the test extra
        nnx = None
    if nnx is not None and isinstance(tree, nnx.Module):
        return nnx.state(tree, nnx.Param)
    try:
        import equinox as eqx
    except ImportError:  # pragma: no cover
        return tree
    if isinstance(tree, eqx.Module):
        return eqx.filter(tree, eqx.is_inexact_array)
    return tree


def flat(tree: Any) -> dict[str, np.ndarray]:
    """`{pytree path: array}` of the array leaves (None and float0 leaves dropped)."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(_normalise(tree))[0]:
        if leaf is None or getattr(leaf, "dtype", None) == jax.dtypes.float0:
            continue
        out[jax.tree_util.keystr(path)] = np.asarray(leaf)
    return out


def assert_close(got: Any, want: Any, *, rtol: float = RTOL, what: str = "value") -> None:
    """Same array leaves at the same paths, equal to `rtol`, with an absolute floor of
    `rtol` times the largest magnitude in the whole tree: a gradient that is zero in
    exact arithmetic (an attention key bias) is rounding noise in both programs."""
    g, w = flat(got), flat(want)
    assert sorted(g) == sorted(w), f"{what}: leaves differ: got {sorted(g)}, want {sorted(w)}"
    scale = max((float(np.max(np.abs(v))) for v in w.values() if v.size), default=0.0)
    for k in w:
        assert g[k].shape == w[k].shape, f"{what}{k}: shape {g[k].shape} != {w[k].shape}"
        np.testing.assert_allclose(g[k], w[k], rtol=rtol, atol=rtol * scale, err_msg=f"{what}{k}")


def assert_value_and_grad(result: Any, value: Any, grads: Any) -> None:
    got_value, got_grads = result
    assert_close(got_value, value, what="value")
    assert_close(got_grads, grads, what="grad")


# -- stage probes ------------------------------------------------------------------


def probes_carrying(ins, primal: Any, *, rtol: float = STAT_RTOL) -> list:
    """The probes whose primal summary is this array's (same shape, l2, mean): how a
    test finds the stage that computed a value without relying on stage names."""
    primal = np.asarray(primal, np.float64)
    l2, mean = float(np.linalg.norm(primal)), float(primal.mean()) if primal.size else 0.0
    found = []
    for p in ins.probes:
        s = p.summaries.get("primal")
        if not s or list(s["shape"]) != list(primal.shape) or s.get("l2") is None:
            continue
        if np.isclose(s["l2"], l2, rtol=rtol, atol=1e-6) and np.isclose(
            s["mean"], mean, rtol=rtol, atol=rtol * (l2 / max(primal.size, 1) ** 0.5 + 1e-12)
        ):
            found.append(p)
    return found


def assert_stage(ins, primal: Any, *, key: str, expected: Any, rtol: float = STAT_RTOL) -> None:
    """A probe carries `primal`, and its `key` summary ("tangent"/"cotangent") has the
    l2 norm and mean of `expected`, an independently computed derivative."""
    found = probes_carrying(ins, primal)
    shape = np.shape(primal)
    assert found, (
        f"no probe carries the primal value of shape {shape} "
        f"(probes: {[(p.name, p.leaf, p.summaries.get('primal', {}).get('shape')) for p in ins.probes]})"
    )
    expected = np.asarray(expected, np.float64)
    want_l2 = float(np.linalg.norm(expected))
    for p in found:
        s = p.summaries.get(key)
        assert s is not None, f"probe {p.name}{p.leaf} has no {key}; it has {sorted(p.summaries)}"
        assert list(s["shape"]) == list(expected.shape), (p.name, s["shape"], expected.shape)
        np.testing.assert_allclose(
            s["l2"], want_l2, rtol=rtol, atol=1e-7, err_msg=f"{key} l2 of {p.name}{p.leaf}"
        )
        np.testing.assert_allclose(
            s["mean"],
            expected.mean(),
            rtol=rtol,
            atol=rtol * want_l2 / max(expected.size, 1) ** 0.5 + 1e-9,
            err_msg=f"{key} mean of {p.name}{p.leaf}",
        )


# -- reports -----------------------------------------------------------------------


def node_paths(graph, kind: str) -> dict[str, Any]:
    """The `kind` nodes by path: their labels and their groups', root left out,
    joined by "/" (`new model/bn/mean`)."""
    nodes = {n.id: n for n in graph.nodes}
    out = {}
    for n in graph.nodes:
        if n.kind != kind:
            continue
        labels, cur = [], n
        while cur.parent is not None:
            labels.append(cur.label)
            cur = nodes[cur.parent]
        out["/".join(reversed(labels))] = n
    return out


def report_opens(page, ins, tmp_path: pathlib.Path) -> pathlib.Path:
    """Write the report, open it from file:// in Chromium with the network blocked, and
    require a drawn graph with probes and no console errors."""
    path = pathlib.Path(ins.save_html(tmp_path / "report.html"))
    pg = page.open_report(path)
    nodes = pg.locator("[data-node-id]")
    assert nodes.count() >= 3, "the report draws no graph"
    assert pg.locator('[data-has-probe="true"]').count() >= 1
    # open one probed node (a collapsed one: an open stage's middle is its children's and
    # edges'): its detail shows one chart per captured mode
    pg.locator('.sv-node[data-has-probe="true"]').first.click()
    detail = pg.locator('[data-role="detail"]')
    detail.wait_for(state="visible")
    assert page.errors == [], page.errors
    assert page.requests == [], page.requests
    return path
