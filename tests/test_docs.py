"""Docstring examples of the public API run, and the version is one number everywhere."""

import doctest
import json
import pathlib

import jax
import jax.numpy as jnp
import pytest
import tomllib

import sowviz
import sowviz.summary

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("module", [sowviz, sowviz.summary], ids=lambda m: m.__name__)
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
