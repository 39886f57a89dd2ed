"""Zoo models. Each module builds one model family at a small size with random
initialisation and synthetic data (no downloads) and exposes `case()`, a `ZooCase`:
the undifferentiated function and the arguments a user would pass to sowviz."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ZooCase:
    """One model as a user meets it: `fn(*args)`, inspected in `mode`."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    mode: str = "grad"
    notes: dict[str, Any] = field(default_factory=dict)
