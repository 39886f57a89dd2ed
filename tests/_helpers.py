"""Small helpers several test files share."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType

TESTS = pathlib.Path(__file__).parent


def marked_line(path: str | pathlib.Path, marker: str) -> int:
    """The line of file `path` that ends with `marker` (a comment beside an origin)."""
    lines = pathlib.Path(path).read_text().splitlines()
    (found,) = [i for i, t in enumerate(lines, 1) if t.endswith(marker)]
    return found


def frontend_models() -> ModuleType:
    """`tests/fixtures/frontend_models.py`: hand-written models for the front end."""
    spec = importlib.util.spec_from_file_location(
        "frontend_models", TESTS / "fixtures" / "frontend_models.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
