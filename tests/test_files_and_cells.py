"""Report files (errors naming the user's path, `~`, the command line), `probe()`'s
argument check, the widget's plain-text fallback, and the boxes inside recurrent cells
(values checked against plain JAX)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz import widget as widget_mod


def _square_sum(w):
    return jnp.sum(w**2)


@pytest.fixture(scope="module")
def small():
    return sowviz.inspect(_square_sum, jnp.arange(3.0))


# -- 1. report files ---------------------------------------------------------------------


def test_a_report_into_a_missing_directory_names_it_and_the_fix(small, tmp_path):
    target = tmp_path / "reports" / "loss.html"
    with pytest.raises(FileNotFoundError) as err:
        small.save_html(target)
    assert str(err.value) == (
        f"sowviz: cannot write the report to {target}: the directory {target.parent} does "
        f"not exist (create it first, e.g. `mkdir -p {target.parent}`)"
    )
    assert not (tmp_path / "reports").exists()


def test_a_report_onto_a_directory_says_so_and_leaves_no_temporary_file(small, tmp_path):
    with pytest.raises(IsADirectoryError, match=r"is a directory \(give a file path, e.g\. "):
        small.save_html(tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert list(tmp_path.parent.glob(f".{tmp_path.name}.*.tmp")) == []


def test_a_report_under_a_file_says_the_file_is_no_directory(small, tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError, match="f is a file, not a directory"):
        small.save_html(tmp_path / "f" / "loss.html")


def test_a_home_path_is_expanded(small, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    got = small.save_html("~/loss.html")
    assert pathlib.Path(got) == tmp_path / "loss.html"
    assert (tmp_path / "loss.html").read_text().startswith("<!DOCTYPE html>")
    assert not pathlib.Path("~").exists()


def test_a_monitor_report_into_a_missing_directory_names_it(tmp_path):
    mon = sowviz.Monitor(_square_sum)
    mon.step(jnp.ones(3))
    target = tmp_path / "no" / "mon.html"
    with pytest.raises(FileNotFoundError, match=f"the directory {target.parent} does not"):
        mon.save_html(target)


def test_the_command_line_says_a_missing_directory_in_one_line(tmp_path):
    target = tmp_path / "missing" / "dir" / "x.html"
    run = subprocess.run(
        [sys.executable, "-m", "sowviz", "demo", "--mode", "primal", "-o", str(target)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        f"sowviz demo: cannot write the report to {target}: the directory {target.parent} "
        f"does not exist (create it first, e.g. `mkdir -p {target.parent}`)"
    ]


# -- 2. probe() takes a name ---------------------------------------------------------------


@pytest.mark.parametrize("name", [0, None, 1.5])
def test_probe_of_a_non_string_says_it_takes_a_name(small, name):
    with pytest.raises(TypeError, match=r"^probe\(\) takes a name \(str\).*Got "):
        small.probe(name)


def test_probe_of_a_tuple_of_names_shows_the_path_string(small):
    with pytest.raises(TypeError, match=r"A path is one string, .*`'conv2/weight'`"):
        small.probe(("conv2", "weight"))


def test_probe_of_a_non_string_leaf_says_what_a_leaf_is(small):
    with pytest.raises(TypeError, match=r"`leaf` is a str"):
        small.probe("output", 1)


# -- 3. the widget's text/plain --------------------------------------------------------------


def test_the_widget_s_plain_text_is_useful_from_the_moment_it_is_displayed():
    # `show()` displays the widget before it traces: that bundle is what a notebook keeps.
    w = widget_mod.Inspector(mode="jvp", what="`loss`", title="loss")
    w._set_phase(widget_mod.Phase.TRACING)
    data = w._repr_mimebundle_()[0]
    assert data["text/plain"] == (
        "sowviz Inspector: the stage graph of `loss` in mode 'jvp' (an interactive widget). "
        "To see it, run the notebook in JupyterLab, Jupyter Notebook or VS Code, or write an "
        "offline report with `.save_html('loss.html')`."
    )
    assert "application/vnd.jupyter.widget-view+json" in data


def test_show_s_plain_text_names_the_function():
    w = sowviz.show(_square_sum, jnp.ones(3), mode="primal", warm=())
    text = w._repr_mimebundle_()[0]["text/plain"]
    assert "`_square_sum` in mode 'primal'" in text
    assert "save_html('square_sum.html')" in text


# -- 4. the last line of a library module ---------------------------------------------------


def _lstm_model():
    from flax import nnx

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.rnn = nnx.RNN(nnx.LSTMCell(4, 8, rngs=rngs))

        def __call__(self, x):
            return self.rnn(x)[:, -1]

    return Model(nnx.Rngs(0))


def _lstm_loss(model, x):
    return jnp.mean(model(x) ** 2)


def _lstm_by_hand(cell, x, eps_tanh, eps_h):
    """The LSTM over `x`'s time axis in plain JAX with `eps_tanh[t]` added to step t's
    `tanh(new_c)` and `eps_h[t]` to its `new_h` (so the gradients at zero are the
    cotangents of those values), returning the loss and every step's values."""
    c = h = jnp.zeros((x.shape[0], 8))
    tanhs, hs = [], []
    for t in range(x.shape[1]):
        xt = x[:, t]
        i = jax.nn.sigmoid(cell.ii(xt) + cell.hi(h))
        f = jax.nn.sigmoid(cell.if_(xt) + cell.hf(h))
        g = jnp.tanh(cell.ig(xt) + cell.hg(h))
        o = jax.nn.sigmoid(cell.io(xt) + cell.ho(h))
        c = f * c + i * g
        th = jnp.tanh(c) + eps_tanh[t]
        h = o * th + eps_h[t]
        tanhs.append(th)
        hs.append(h)
    return jnp.mean(h**2), (jnp.stack(tanhs), jnp.stack(hs))


def test_an_nnx_lstm_cell_s_last_line_carries_its_values():
    model = _lstm_model()
    x = jax.random.normal(jax.random.key(1), (2, 6, 4))
    ins = sowviz.inspect(_lstm_loss, model, x)
    g = ins.graph
    cell = next(n for n in g.nodes if n.label == "cell")
    boxes = {n.label: n.id for n in g.children(cell.id) if n.kind == "eqn"}
    probed = {p.node for p in ins.probes}
    # every box the cell draws of its own carries data, its last line's too
    assert {n.id for n in g.children(cell.id)} <= probed
    zeros = jnp.zeros((6, 2, 8))
    cell_mod = model.rnn.cell
    (_, (tanhs, hs)) = _lstm_by_hand(cell_mod, x, zeros, zeros)
    d_tanh, d_h = jax.grad(lambda a, b: _lstm_by_hand(cell_mod, x, a, b)[0], (0, 1))(zeros, zeros)
    for label, value, cot in (("tanh", tanhs, d_tanh), ("mul", hs, d_h)):
        (p,) = [p for p in ins.probes if p.node == boxes[label]]
        s = p.summaries
        np.testing.assert_allclose(s["primal"]["l2"], np.linalg.norm(value), rtol=1e-5)
        np.testing.assert_allclose(s["primal"]["max"], np.max(value), rtol=1e-5)
        np.testing.assert_allclose(s["cotangent"]["l2"], np.linalg.norm(cot), rtol=1e-4)


# -- 5. work between two calls of one function ----------------------------------------------


def _gru_loss(cell, xs):
    h, _ = jax.lax.scan(lambda h, x: (cell(x, h), None), jnp.zeros(8), xs)
    return jnp.sum(h**2)


def test_an_equinox_gru_s_recurrent_matmul_is_no_part_of_a_split_box():
    eqx = pytest.importorskip("equinox")
    cell = eqx.nn.GRUCell(2, 8, key=jax.random.PRNGKey(0))
    xs = jax.random.normal(jax.random.PRNGKey(1), (10, 2))
    ins = sowviz.inspect(_gru_loss, cell, xs)
    g = ins.graph
    gru = next(n for n in g.nodes if n.label == "GRUCell")
    kids = g.children(gru.id)
    # `weight_ih @ input + bias` then its split; `weight_hh @ hidden` then its split:
    # each matmul a box of its own, beside the other, in no box named `split`
    assert [n.label for n in kids][:5] == ["dot_general", "add", "split", "dot_general", "split"]
    assert {n.kind for n in kids} == {"eqn"}
    assert [n.shapes for n in kids if n.label == "dot_general"] == [("float32[24]",)] * 2
    np.testing.assert_allclose(ins.result[0], _gru_loss(cell, xs), rtol=1e-6)


def test_per_leaf_work_between_runs_of_one_call_still_joins_them():
    from sowviz.graph.names import _per_leaf

    # `tree.map(lambda g: clip(g) * 2, grads)`: clip, mul, clip, mul
    keys = ["clip", "clip", None, "clip", "clip", None]
    prims = ["max", "min", "mul", "max", "min", "mul"]
    assert _per_leaf(prims, keys, 1, 3)
    # `tree.map(lambda g: clip(g * 2), grads)`: mul, clip, mul, clip
    keys = [None, "clip", None, "clip"]
    assert _per_leaf(["mul", "clamp", "mul", "clamp"], keys, 1, 3)
    # a GRU cell: `split(W_ih @ x + b)`, `split(W_hh @ h)`, then the gates
    keys = [None, None, "split", None, "split", None, None]
    prims = ["dot_general", "add", "split", "dot_general", "split", "add", "logistic"]
    assert not _per_leaf(prims, keys, 2, 4)
