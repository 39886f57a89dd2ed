"""`Inspector`: the Jupyter widget view of an inspection model, and `show`.

The widget knows nothing of JAX. It holds the sowviz/1 model and draws it with
the bundled front end (`static/sowviz.js`, the same file the HTML report
inlines). Everything the user clicks runs in the browser; only a change of
`mode` comes back, and the kernel re-runs the inspection through the `rerun`
callback it was given (cached per mode: switching back costs a lookup).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import anywidget
import traitlets

from . import _model
from .inspection import inspect
from .options import InspectOptions

STATIC = pathlib.Path(__file__).parent / "static"


class Inspector(anywidget.AnyWidget):
    """Interactive stage graph of one inspection (returned by `sowviz.show`).

    Example:
        >>> w = sowviz.show(loss, params, batch, mode="grad")   # doctest: +SKIP
        >>> w.save_html("loss.html")                             # doctest: +SKIP
    """

    _esm = STATIC / "sowviz.js"
    _css = STATIC / "sowviz.css"

    model = traitlets.Dict(
        help="dict: the sowviz/1 inspection model drawn by the front end (docs/model.md). "
        "Kept in Python; it travels as `model_bytes`. Default: an empty dict (nothing drawn)."
    )
    model_bytes = traitlets.Bytes(
        b"",
        help="bytes: `model` as gzipped JSON, synced as a binary buffer (a 10,000-equation "
        "model is ~20 MB of JSON, ~2 MB gzipped) and saved with the notebook's widget "
        "state. Set from `model`; do not set it directly. Default b''.",
    ).tag(sync=True)
    mode = traitlets.Unicode(
        "grad",
        help="str: the inspection mode shown ('primal', 'grad', 'jvp', 'vjp', 'all'). Set by "
        "the front end's mode picker; the kernel then re-runs. Default 'grad'.",
    ).tag(sync=True)
    busy = traitlets.Bool(
        False, help="bool: True while the kernel recomputes the model. Default False."
    ).tag(sync=True)
    error = traitlets.Unicode(
        "", help="str: the last error of a re-run, shown by the front end. Default ''."
    ).tag(sync=True)

    def __init__(
        self,
        model: dict[str, Any] | None = None,
        *,
        rerun: Callable[[str], dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        self._rerun = None  # no re-run while traits are initialised
        requested = str(kwargs.pop("mode", "grad"))
        init_mode = (model or {}).get("mode", requested)
        super().__init__(model=model or {}, mode=init_mode, **kwargs)
        self._rerun = rerun

    @traitlets.observe("model")
    def _model_changed(self, change: dict[str, Any]) -> None:
        self.model_bytes = _model.encode_model(change["new"]) if change["new"] else b""

    @traitlets.observe("mode")
    def _mode_changed(self, change: dict[str, Any]) -> None:
        if self._rerun is None or change["new"] == self.model.get("mode"):
            return
        self.busy = True
        try:
            self.model = self._rerun(change["new"])
            self.error = ""
        except Exception as err:  # shown in the widget; the kernel stays usable
            self.error = f"{type(err).__name__}: {err}"
        finally:
            self.busy = False

    def save_html(self, path: str | pathlib.Path, *, created: Any = ...) -> pathlib.Path:
        """Write the current picture as a self-contained offline HTML report (atomically).
        `created=None` leaves the timestamp out; a string pins it."""
        model = self.model if created is ... else {**self.model, "created": created}
        return _model.write("html", model, path)


def show(
    fn: Callable, *args: Any, mode: str = "grad", capture: str = "stages", **options: Any
) -> Inspector:
    """`inspect`, drawn: an `Inspector` widget that displays itself in Jupyter.

    Click a stage for histograms of its primal values, tangents and cotangents;
    switch the mode in the widget to re-run (each mode compiles once; switching
    back is a cache lookup). `.save_html(path)` exports it.

    Example:
        >>> w = sowviz.show(lambda w: jnp.sum(jnp.tanh(w) ** 2), jnp.ones(3))
        >>> w.model["mode"]
        'grad'
    """
    InspectOptions.from_kwargs("show", mode, capture, options)  # fail here, not on a re-run

    def rerun(new_mode: str) -> dict[str, Any]:
        return inspect(fn, *args, mode=new_mode, capture=capture, **options).to_dict()

    return Inspector(rerun(str(mode)), rerun=rerun)
