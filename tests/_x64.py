"""Run a snippet in a child process with ``jax_enable_x64`` (a process-wide switch)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any


def run_x64(code: str) -> Any:
    """The JSON the snippet prints last, run on the CPU with x64 on."""
    env = dict(os.environ, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join([*sys.path, str(pathlib.Path(__file__).parents[1])])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])
