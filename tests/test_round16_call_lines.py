"""At a big level, a line assigning a name the value of one jnp or library call is a box
named by what it assigns, holding the call (`safe = jnp.where(...)`: `safe` > `where`;
`e_atom = jax.ops.segment_sum(...)`: `e_atom`); `xf = jnp.fft.rfft(x, axis=1)` is one
box `xf` with the transposes its `axis` adds (a returned `irfft` line: `irfft`)."""

import jax
import jax.numpy as jnp
import numpy as np

import sowviz


def _children(graph, node_id):
    return [n.label for n in sorted(graph.nodes, key=lambda n: n.order) if n.parent == node_id]


def _only(graph, label):
    (node,) = (n for n in graph.nodes if n.label == label)
    return node


def _check_stats(summary: dict, values) -> None:
    v = np.asarray(values, np.float64).ravel()
    assert summary["count"] == v.size
    np.testing.assert_allclose(summary["min"], v.min(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(summary["max"], v.max(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(summary["l2"], np.linalg.norm(v), rtol=1e-5, atol=1e-6)


# -- 1. a pair potential's masked lines (a big level) ----------------------------------

_N = 8
_R = jax.random.uniform(jax.random.PRNGKey(0), (_N, 2)) * 4
_IDX = jnp.stack([jnp.roll(jnp.arange(_N), s) for s in (1, 2, 3)], 1)


def _pairs(R, idx):
    n = R.shape[0]
    senders = jnp.repeat(jnp.arange(n), idx.shape[1])
    receivers = idx.reshape(-1)
    mask = receivers < n
    dR = R[senders] - R[jnp.where(mask, receivers, 0)]
    return senders, mask, dR - 4.0 * jnp.round(dR / 4.0)


def _energy(R, idx):
    n = R.shape[0]
    senders = jnp.repeat(jnp.arange(n), idx.shape[1])
    receivers = idx.reshape(-1)
    mask = receivers < n
    Rr = R[jnp.where(mask, receivers, 0)]
    dR = R[senders] - Rr
    dR = dR - 4.0 * jnp.round(dR / 4.0)
    dr2 = jnp.sum(dR**2, -1)
    safe = jnp.where(mask, dr2, 1.0)
    dr = jnp.where(mask, jnp.sqrt(safe), 0.0)
    e_pair = jnp.where(mask, jnp.exp(-dr), 0.0)
    e_atom = jax.ops.segment_sum(e_pair, senders, num_segments=n)
    return 0.5 * jnp.sum(e_atom)


def _plain(R, idx):
    # the same intermediates, computed apart in plain JAX
    senders, mask, dR = _pairs(R, idx)
    dr2 = jnp.sum(dR**2, -1)
    safe = jnp.where(mask, dr2, 1.0)
    dr = jnp.where(mask, jnp.sqrt(safe), 0.0)
    e_pair = jnp.where(mask, jnp.exp(-dr), 0.0)
    return safe, dr, jax.ops.segment_sum(e_pair, senders, num_segments=R.shape[0])


def test_masked_and_segment_lines_are_named_by_what_they_assign():
    ins = sowviz.inspect(_energy, _R, _IDX, mode="grad")
    value, grad = jax.value_and_grad(_energy)(_R, _IDX)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-6)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-5, atol=1e-6)
    g = ins.graph
    top = _children(g, g.root)
    for name in ("dr2", "safe", "dr", "e_pair", "e_atom"):
        assert top.count(name) == 1, top
    # the calls are inside the lines' boxes, not loose beside them
    assert not {"where", "where#2", "sqrt", "segment_sum", "norm"} & set(top), top
    assert _children(g, _only(g, "safe").id) == ["where"]
    assert _children(g, _only(g, "dr").id) == ["sqrt", "where"]
    assert "scatter-add" in _children(g, _only(g, "e_atom").id)
    safe, dr, e_atom = _plain(_R, _IDX)
    for name, want in (("safe", safe), ("dr", dr), ("e_atom", e_atom)):
        _check_stats(ins.probe(name).summaries["primal"], want)
    # d(0.5 * sum(e_atom)) / d e_atom = 0.5 everywhere
    _check_stats(ins.probe("e_atom").summaries["cotangent"], np.full(_N, 0.5))
    # d energy / d dr, from plain JAX: the energy as a function of `dr`
    senders, mask, _ = _pairs(_R, _IDX)

    def from_dr(d):
        e_pair = jnp.where(mask, jnp.exp(-d), 0.0)
        return 0.5 * jnp.sum(jax.ops.segment_sum(e_pair, senders, num_segments=_N))

    _check_stats(ins.probe("dr").summaries["cotangent"], jax.grad(from_dr)(dr))


def _energy_norm(R, idx):
    _, mask, dR = _pairs(R, idx)
    a = dR * 2.0
    b = a + 1.0
    c = jnp.tanh(b)
    d = c * c
    dr = jnp.linalg.norm(dR, axis=-1)
    e = jnp.where(mask, jnp.exp(-dr), 0.0) + jnp.sum(d, -1)
    order = jnp.argsort(e)  # an index: its one stage keeps its name
    return jnp.sum(e[order] * jnp.arange(e.shape[0]))


def test_a_norm_line_is_named_by_what_it_assigns_and_an_index_keeps_its_call():
    ins = sowviz.inspect(_energy_norm, _R, _IDX, mode="grad")
    np.testing.assert_allclose(ins.result[0], _energy_norm(_R, _IDX), rtol=1e-6)
    g = ins.graph
    top = _children(g, g.root)
    assert top.count("dr") == 1 and "norm" not in top, top
    assert "argsort" in top and "order" not in top, top
    _, _, dR = _pairs(_R, _IDX)
    _check_stats(ins.probe("dr").summaries["primal"], jnp.linalg.norm(dR, axis=-1))


# -- 2. an FNO spectral convolution's `axis=` ------------------------------------------

_WS = (jax.random.normal(jax.random.PRNGKey(0), (4, 3, 3)) + 0j).astype(jnp.complex64)
_XS = jax.random.normal(jax.random.PRNGKey(1), (2, 16, 3))


def _spectral_conv(w, x):
    xf = jnp.fft.rfft(x, axis=1)
    full = jnp.zeros_like(xf).at[:, :4].set(jnp.einsum("bmc,mcd->bmd", xf[:, :4], w))
    return jnp.fft.irfft(full, n=x.shape[1], axis=1)


def _fno_loss(w, x):
    return jnp.mean(_spectral_conv(w, x) ** 2)


def test_an_fft_along_an_axis_is_one_box():
    ins = sowviz.inspect(_fno_loss, _WS, _XS, mode="grad")
    value, grad = jax.value_and_grad(_fno_loss)(_WS, _XS)
    np.testing.assert_allclose(ins.result[0], value, rtol=1e-5)
    np.testing.assert_allclose(ins.result[1], grad, rtol=1e-4, atol=1e-6)
    g = ins.graph
    sc = _only(g, "_spectral_conv")
    kids = _children(g, sc.id)
    # no `transpose` of `moveaxis` beside the calls: `xf` holds them and the `rfft`
    # stage, the returned line is one box `irfft` holding them, JAX's `pad` and `irfft`
    assert kids == ["xf", "full", "bmc,mcd->bmd", "full#2", "irfft"], kids
    xf = _only(g, "xf")
    assert _children(g, xf.id) == ["transpose", "rfft", "transpose"]
    assert xf.shapes == ("complex64[2,9,3]",)
    (irfft,) = (n for n in g.nodes if n.label == "irfft" and n.parent == sc.id)
    assert _children(g, irfft.id) == ["transpose", "pad", "irfft", "transpose"]
    # the box's value and gradient are the call's
    x64 = np.asarray(_XS, np.float64)
    xf = np.fft.rfft(x64, axis=1)
    full = np.zeros_like(xf)
    full[:, :4] = np.einsum("bmc,mcd->bmd", xf[:, :4], np.asarray(_WS))
    out = np.fft.irfft(full, n=16, axis=1)
    (probe,) = (p for p in ins.probes if p.node == irfft.id)
    _check_stats(probe.summaries["primal"], out)
    _check_stats(probe.summaries["cotangent"], 2 * out / out.size)
