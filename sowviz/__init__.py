"""sowviz: see inside JAX programs (the public API; assembled as modules land)."""

from .capture.api import SaveIntermediates
from .capture.interpret import CaptureError as CaptureError
from .capture.primitive import sow as sow

__version__ = "0.1.0"


def save_intermediates(
    fn,
    *,
    tag="intermediates",
    duplicates="error",
    loops="last",
    summarize=None,
    strict=True,
) -> SaveIntermediates:
    return SaveIntermediates(
        fn, tag=tag, duplicates=duplicates, loops=loops, summarize=summarize, strict=strict
    )
