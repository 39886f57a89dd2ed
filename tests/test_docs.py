"""Docstring examples of the public API run, and the version is one number everywhere."""

import doctest
import json
import pathlib

import jax
import jax.numpy as jnp
import pytest
import tomllib

import sowviz
import sowviz._api
import sowviz.inspection
import sowviz.monitor
import sowviz.summary
import sowviz.widget

ROOT = pathlib.Path(__file__).resolve().parents[1]


MODULES = [sowviz, sowviz._api, sowviz.inspection, sowviz.monitor, sowviz.widget, sowviz.summary]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
    globs = {"jax": jax, "jnp": jnp, "sowviz": sowviz, **vars(module)}
    result = doctest.testmod(module, globs=globs, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.attempted > 0
    assert result.failed == 0


def test_every_public_name_has_a_docstring_with_an_example():
    for name in sowviz.__all__:
        obj = getattr(sowviz, name)
        doc = obj.__doc__ or ""
        assert doc.strip(), name
        if callable(obj) and not isinstance(obj, type):
            assert ">>>" in doc, f"{name} has no example"


def test_one_version_number():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package = json.loads((ROOT / "js" / "package.json").read_text())
    assert sowviz.__version__ == pyproject["project"]["version"] == package["version"]
    model = sowviz.inspect(lambda x: jnp.sum(x**2), jnp.ones(2)).to_dict()
    assert model["versions"]["sowviz"] == sowviz.__version__


def test_readme_quick_start_runs(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert (tmp_path / "loss.html").exists()
    assert namespace["inter"]["hidden"]["cotangent"].shape == (32, 16)


def test_the_recording_path_needs_no_front_end(tmp_path):
    """A training script: no anywidget, no notebook. The widget names say why on use."""
    import subprocess
    import sys

    script = f"""
import sys
sys.modules["anywidget"] = None  # importing it now fails
import jax.numpy as jnp, sowviz
mon = sowviz.Monitor(lambda w, x: jnp.sum((x @ w) ** 2))
value, grad = mon.step(jnp.ones((2, 1)), jnp.ones((3, 2)))
mon.save_html({str(tmp_path / "m.html")!r})
print(float(value), len(mon.history), "anywidget" in sys.modules and sys.modules["anywidget"])
try:
    sowviz.show
except ImportError as err:
    print("show:", isinstance(err, ImportError))
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["12.0", "1", "None", "show:", "True"]
    assert (tmp_path / "m.html").exists()


def test_pipeline_modules_import_no_view():
    """Dependencies point one way: the pipeline and the recorder import no view at module
    level (the Monitor creates its widget lazily, only when it is displayed), and nothing
    imports the package root."""
    import ast

    views = {"report", "widget", "monitor_view", "anywidget", "traitlets"}
    for name in ("inspection", "monitor", "_program", "_model", "modes", "options"):
        tree = ast.parse((ROOT / "sowviz" / f"{name}.py").read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                mods = {(node.module or "").split(".")[-1], *(a.name for a in node.names)}
                assert not (mods & views), (name, ast.dump(node))
                assert not (node.level == 1 and node.module is None and "__version__" in mods)
            elif isinstance(node, ast.Import):
                assert not ({a.name.split(".")[0] for a in node.names} & views), name
