"""The user-facing notebooks run top to bottom in a real Jupyter kernel and say what
they claim (nbclient + this virtual environment's ipykernel, working directory
`notebooks/`). Also: notebooks are committed without outputs."""

from __future__ import annotations

import json
import os
import pathlib
import re
import sys
import time

import pytest
from lab_session import install_kernelspec

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
WIDGET = "application/vnd.jupyter.widget-view+json"
CHECK_CELL = "import sys\nprint('KERNEL-PYTHON', sys.executable)"


def all_notebooks() -> list[pathlib.Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory) -> dict[str, str]:
    """Environment for the kernels: a `python3` kernelspec for *this* interpreter first on
    JUPYTER_PATH, Jupyter's own directories and temp files under a temporary directory,
    and JAX with its default single CPU device (not the test suite's 8 fake ones)."""
    base = tmp_path_factory.mktemp("jupyter")
    prefix = base / "prefix"
    install_kernelspec(prefix)
    spec = json.loads((prefix / "share/jupyter/kernels/python3/kernel.json").read_text())
    assert spec["argv"][0] == sys.executable
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    tmp = base / "tmp"
    tmp.mkdir()
    env.update(
        JUPYTER_PATH=str(prefix / "share/jupyter"),
        JUPYTER_CONFIG_DIR=str(base / "config"),
        JUPYTER_DATA_DIR=str(base / "data"),
        JUPYTER_RUNTIME_DIR=str(base / "runtime"),
        JUPYTER_PLATFORM_DIRS="1",
        IPYTHONDIR=str(base / "ipython"),
        MPLCONFIGDIR=str(base / "mpl"),
        TMPDIR=str(tmp),  # the notebooks' tempfile.mkdtemp() reports land here
        JAX_PLATFORMS="cpu",
        PYDEVD_DISABLE_FILE_VALIDATION="1",
    )
    return env


def run_notebook(path: pathlib.Path, env: dict[str, str]):
    """Execute a copy of the notebook (plus a cell naming the kernel's interpreter)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(CHECK_CELL))
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=240,
        startup_timeout=120,
        allow_errors=False,
        # nbclient's default waits 4 s for a cell's output after its reply, then drops
        # the rest without an error: a slow machine would lose output silently.
        iopub_timeout=60,
        raise_on_iopub_timeout=True,
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    start = time.monotonic()
    client.execute(env=env)
    return nb, time.monotonic() - start


def text_of(nb) -> str:
    """All stream and text/plain output of the code cells, in order. Streams join as
    they were written: the kernel sends a line in two messages when its flush timer
    falls between a `print`'s writes (CI once read "keys under grad:" and
    " ['cotangent', 'primal']" as two outputs), so only rich outputs get lines of
    their own."""
    text = ""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                text += out.text
            elif out.output_type in ("execute_result", "display_data"):
                sep = "" if not text or text.endswith("\n") else "\n"
                text += sep + out.data.get("text/plain", "") + "\n"
        if text and not text.endswith("\n"):
            text += "\n"
    return text


def test_text_of_joins_a_line_split_across_stream_messages():
    import nbformat.v4 as v4

    nb = v4.new_notebook()
    cell = v4.new_code_cell("print('keys under grad:', ['a'])")
    cell.outputs = [
        v4.new_output("stream", name="stdout", text="keys under grad:"),
        v4.new_output("stream", name="stdout", text=" ['a']\n"),
        v4.new_output("execute_result", data={"text/plain": "42"}, execution_count=1),
    ]
    nb.cells = [cell, v4.new_code_cell("print('next')")]
    nb.cells[1].outputs = [v4.new_output("stream", name="stdout", text="next\n")]
    assert text_of(nb) == "keys under grad: ['a']\n42\nnext\n"


def silent_printers(nb) -> list[int]:
    """Indices of the code cells that call `print` yet have no output at all."""
    return [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and "print(" in cell.source and not cell.get("outputs")
    ]


def n_widgets(nb) -> int:
    return sum(
        1
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if out.output_type in ("execute_result", "display_data") and WIDGET in out.data
    )


def errors_of(nb) -> list[str]:
    return [
        f"{out.ename}: {out.evalue}"
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if out.output_type == "error"
    ]


def stderr_of(nb) -> str:
    return "".join(
        out.text
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if out.output_type == "stream" and out.name == "stderr"
    )


# ----------------------------------------------------------------- what each one shows


def check_quickstart(nb, text, env):
    assert "keys under grad: ['cotangent', 'primal']" in text
    assert "keys under jvp: ['primal', 'tangent']" in text
    for key in ("cotangent", "cotangent.tangent", "primal", "primal.tangent"):
        assert re.search(rf"^{re.escape(key)}\s+shape \(", text, re.M), key
    assert "modes captured: ['primal', 'cotangent']" in text
    for layer in ("dense_0", "dense_1", "dense_2"):
        assert re.search(rf"^{layer}\s+scope\s+\[64, ", text, re.M), layer
    # every parameter leaf with its value and gradient norms
    assert len(re.findall(r"^dense_\d\.[wb]\s+\d+\.\d{4}\s+\d\.\d{3}e[-+]\d+$", text, re.M)) == 6
    assert n_widgets(nb) == 5  # show() in every mode


def check_nan_hunting(nb, text, env):
    assert re.search(r"grad\['dense_0'\]\['w'\]\s+NaNs: 24 / 24", text)
    # the stage level already sees it: the last NaN cotangent is that of the `mean` in
    # `rms_norm` (a box of its own), read by `sqrt`; every equation probed, its `div`
    assert "backward origin: mean (scope)" in text
    assert "its cotangent comes from the backward pass of: sqrt (eqn)" in text
    assert "The NaN is born in: ['sqrt'] inside mean" in text
    assert "origins after the fix: (None, None)" in text
    assert "forward origin:  log_energy (scope)" in text
    # the Monitor's rule agrees with the zoom above: sqrt's backward rule makes the NaN
    # (inside rms_norm), and the first non-finite cotangent is that of the `mean` box
    # and names the gradients it reached: dense_0's two, as the notebook's count says
    assert re.search(
        r"^NonFiniteError: non-finite values at step 0; backward pass: born in the backward"
        r" of `sqrt` in `rms_norm` at \S+:\d+, reaching `mean` \(\S+:\d+\); `sqrt`'s"
        r" derivative 0\.5 / sqrt\(x\) is infinite at x = 0, and only there: its input is"
        r" exactly 0\. Fix: `jnp\.sqrt\(jnp\.maximum\(x, eps\)\)`, or the double-where trick:"
        r" .*; non-finite gradient of `parameters/dense_0/b`, `parameters/dense_0/w`$",
        text,
        re.M,
    )
    assert re.search(r"grad\['dense_1'\]\['w'\]\s+NaNs: 0 / 8", text)
    assert "stage: rms_norm | equation: sqrt" in text
    # the widget's locate (the banner's button) names the same equation
    assert re.search(r"^born in the backward of `sqrt` in `rms_norm` at \S+:\d+", text, re.M)
    assert n_widgets(nb) == 2  # capture="all", then the stages with `w.locate()`


def check_tesseract_pipeline(nb, text, env):
    assert "('scale', 'tesseract')" in text and "('softplus_norm', 'tesseract')" in text
    # the stage's one output read, by its field: `scale['y']`
    assert re.search(r"^scale\['y'\]\s+primal\s+\[8\]\s+-1\.5000\s+2\.5000", text, re.M)
    assert re.search(r"^softplus_norm\['z'\]\s+cotangent\s+\[8\]\s+0\.1000\s+0\.1000", text, re.M)
    assert n_widgets(nb) == 1


def check_training_monitor(nb, text, env):
    assert "steps run: 300, kept in history: 60" in text
    m = re.search(r"loss: ([\d.]+) \(step 0\) -> ([\d.]+) \(step 295\)", text)
    assert m and float(m.group(2)) < 0.1 * float(m.group(1))
    assert "non-finite values seen: None" in text
    report = pathlib.Path(re.search(r"^(\S+training\.html) ", text, re.M).group(1))
    assert report.is_relative_to(env["TMPDIR"]) and report.stat().st_size > 100_000
    assert "data-sowviz-model" in report.read_text(encoding="utf-8")
    assert n_widgets(nb) == 1  # the monitor itself


def check_reports(nb, text, env):
    assert "embedded model: sowviz/1 | MLP classifier | grad" in text
    assert "external scripts or styles: []" in text
    assert "connect-src 'none'" in text
    assert "modes in the widget's model: jvp ['primal', 'tangent']" in text
    for name in ("classifier.html", "classifier_jvp.html"):
        (path,) = pathlib.Path(env["TMPDIR"]).glob(f"sowviz-reports-*/{name}")
        assert path.stat().st_size > 100_000
    assert re.search(r"^dense_0\s+\|dL/d out\| = \d", text, re.M)
    assert n_widgets(nb) == 1


CHECKS = {
    "01_quickstart.ipynb": check_quickstart,
    "02_nan_hunting.ipynb": check_nan_hunting,
    "03_tesseract_pipeline.ipynb": check_tesseract_pipeline,
    "04_training_monitor.ipynb": check_training_monitor,
    "05_reports.ipynb": check_reports,
}


def test_every_notebook_has_checks():
    assert sorted(CHECKS) == [p.name for p in all_notebooks()]


@pytest.mark.parametrize("path", all_notebooks(), ids=lambda p: p.stem)
def test_notebook_is_stripped(path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


@pytest.mark.parametrize("path", all_notebooks(), ids=lambda p: p.stem)
def test_notebook_runs(path, kernel_env, monkeypatch):
    from jupyter_client.kernelspec import KernelSpecManager

    # nbclient looks the kernelspec up in this process: the same directories as the kernel.
    for key in ("JUPYTER_PATH", "JUPYTER_DATA_DIR", "JUPYTER_CONFIG_DIR"):
        monkeypatch.setenv(key, kernel_env[key])
    assert KernelSpecManager().get_kernel_spec("python3").argv[0] == sys.executable
    nb, elapsed = run_notebook(path, kernel_env)
    lost = silent_printers(nb)
    if lost:
        # CI once missed a printing cell's output (ipykernel 7.4; no error, no IOPub
        # timeout, never seen here). A cell with no output at all is the kernel's I/O
        # lost on the way, not the notebook failing: its checks run on a second,
        # complete execution (a partly different output still fails them).
        print(f"{path.name}: no output from cells {lost}; executing it again")
        nb, elapsed = run_notebook(path, kernel_env)
        assert silent_printers(nb) == [], "the kernel lost a cell's output twice"
    assert errors_of(nb) == []
    text = text_of(nb)
    print(text)  # shown by pytest when a check below fails
    # it ran in this virtual environment's interpreter
    (kernel_python,) = re.findall(r"^KERNEL-PYTHON (.+)$", text, re.M)
    assert os.path.samefile(kernel_python, sys.executable)
    assert "Traceback" not in stderr_of(nb)
    CHECKS[path.name](nb, text, kernel_env)
    print(f"{path.name}: {elapsed:.1f}s")


MLP_CELL = """import jax, jax.numpy as jnp, sowviz
def mlp(params, x):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]
def loss(params, x, y):
    return jnp.mean((mlp(params, x) - y) ** 2)
k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
params = {"w1": jax.random.normal(k1, (8, 32)) * 0.3, "b1": jnp.zeros(32),
          "w2": jax.random.normal(k2, (32, 1)) * 0.3, "b2": jnp.zeros(1)}
x = jax.random.normal(k3, (64, 8)); y = jnp.sin(x[:, :1])
ins = sowviz.inspect(loss, params, x, y)
mlp_id = [n.id for n in ins.graph.nodes if n.label == "mlp"][0]
print("MLP-BOXES", [n.label for n in ins.graph.nodes if n.parent == mlp_id])
h = [n for n in ins.graph.nodes if n.label == "h"][0]
print("H-SOURCE", h.source.file, h.source.line)
expected = jax.nn.relu(x @ params["w1"] + params["b1"])
print("H-L2-MATCHES", bool(jnp.allclose(ins.probe("h").summaries["primal"]["l2"],
                                        jnp.linalg.norm(expected), rtol=1e-5)))
"""


def test_a_notebook_cells_lines_are_boxes_named_by_the_code(tmp_path, kernel_env):
    """In a real kernel, a cell's function is drawn by its lines (`h`, `h @ w2 + b2`),
    as the same code in a file is. ipykernel names a cell's code
    `/tmp/ipykernel_<pid>/<hash>.py`; the graph's locations carry IPython's short name
    for it (`In [1]`), which is no file `linecache` knows: every line read as
    unreadable, and `mlp` was drawn as its seven primitives."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(MLP_CELL)]
    path = tmp_path / "mlp.ipynb"
    nbformat.write(nb, path)
    ran, _ = run_notebook(path, kernel_env)
    text = text_of(ran)
    assert "MLP-BOXES ['h', 'h @ w2 + b2']" in text, text
    assert re.search(r"^H-SOURCE In ?\[\d+\] 3$", text, re.M), text
    assert "H-L2-MATCHES True" in text, text
