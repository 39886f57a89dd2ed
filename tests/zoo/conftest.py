"""Zoo fixtures: each model is built once per module; tests that need a library the
venv lacks are skipped with the reason (the `test` extra installs all of them)."""

from __future__ import annotations

import pytest


def need(module: str, why: str):
    """`pytest.importorskip` with the reason spelled out."""
    return pytest.importorskip(module, reason=f"{module} is not installed: {why}")


@pytest.fixture
def report(page, tmp_path):
    """`report(ins)`: write `ins`'s report and open it in Chromium (see checks.report_opens)."""
    from .checks import report_opens

    return lambda ins: report_opens(page, ins, tmp_path)
