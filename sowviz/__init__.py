"""sowviz: see inside JAX programs (placeholder; the public API is assembled as modules land)."""

from .capture.primitive import sow as sow

__version__ = "0.1.0"
