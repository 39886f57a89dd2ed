"""The one version number of the Python package (pyproject.toml and js/package.json agree;
tests/test_docs.py checks it)."""

__version__ = "0.1.0"
