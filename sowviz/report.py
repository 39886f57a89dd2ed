"""Standalone HTML reports: one offline file that draws a sowviz/1 model.

The page inlines the real front-end bundle (``sowviz/static/sowviz.js`` and
``sowviz.css``, read with :mod:`importlib.resources`) and embeds the model as JSON in
``<script type="application/json" data-sowviz-model>``. Loading the bundle mounts every
such model on the page, so this module writes no JavaScript. A Content-Security-Policy
forbids every network request.

Everything taken from the model reaches the page escaped: header text through
:func:`html.escape`, the JSON with ``<``, ``>`` and ``&`` as ``\\u003c``-style escapes
(so neither ``</script>`` nor ``<!--`` can end or confuse the script element), and the
front end builds its DOM with ``textContent`` only.
"""

from __future__ import annotations

import base64
import gzip
import html
import os
import pathlib
import re
import stat
import sys
from importlib import resources

from . import _model
from ._files import atomic_write
from ._model import model_json as model_json
from .summary_data import Float32Json, as_float32_row

__all__ = ["model_json", "render_html", "write_html"]

_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:; connect-src 'none'; worker-src 'none'"
)

_MISSING_BUNDLE = (
    "The front-end bundle `sowviz/static/{name}` is missing. It ships with the package; "
    "in a source checkout build it with `cd js && npm ci && npm run build`."
)

# A `<` that starts `</script`, `<script` or `<!--` would end or confuse the inline
# <script> element; `\x3C` means the same character in every JS string, template and
# regular-expression literal, which is the only place the minified bundle has them.
_SCRIPT_BREAK = re.compile(r"<(?=/script|script|!--)", re.IGNORECASE)
_STYLE_BREAK = re.compile(r"<(?=/style)", re.IGNORECASE)


def _static(name: str) -> str:
    try:
        return resources.files("sowviz").joinpath("static", name).read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise FileNotFoundError(_MISSING_BUNDLE.format(name=name)) from err


def _header(model: dict, title: str) -> str:
    esc = html.escape
    versions = model.get("versions") or {}
    items = [
        ("mode", model.get("mode")),
        ("device", model.get("device")),
        *((name, ver) for name, ver in versions.items()),
        ("created", model.get("created")),
    ]
    meta = "".join(
        f"<div><dt>{esc(str(k))}</dt><dd>{esc(str(v))}</dd></div>"
        for k, v in items
        if v not in (None, "")
    )
    return (
        '<header class="sv-report-header">'
        f"<h1>{esc(title)}</h1>"
        f'<dl class="sv-report-meta">{meta}</dl>'
        "</header>"
    )


def render_html(model: dict, *, title: str | None = None) -> str:
    """One self-contained HTML page drawing ``model`` (a sowviz/1 dict).

    ``title`` defaults to ``model["title"]``. The page makes no network request: the
    bundle, its styles and the model are inline.
    """
    if not isinstance(model, dict):
        raise TypeError(f"`model` must be a sowviz/1 dict, got {type(model).__name__}")
    page_title = str(title if title is not None else model.get("title") or "sowviz report")
    js = _SCRIPT_BREAK.sub(r"\\x3C", _static("sowviz.js"))
    css = _STYLE_BREAK.sub(r"\\3C ", _static("sowviz.css"))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="generator" content="sowviz">\n'
        f"<title>{html.escape(page_title)}</title>\n"
        f"<style>\n{css}\n</style>\n</head>\n"
        '<body class="sowviz-report">\n'
        f"{_header(model, page_title)}\n"
        '<main id="sowviz-root"></main>\n'
        f"{_model_script(model)}\n"
        f'<script type="module">\n{js}\n</script>\n'
        "</body>\n</html>\n"
    )


# Above this many bytes of JSON the model is embedded gzipped (base64): a
# 10,000-equation program's summaries shrink from ~20 MB to ~2 MB.
COMPRESS_ABOVE = 1_000_000


def _model_script(model: dict) -> str:
    text = model_json(_float32_history(model))
    attrs = 'type="application/json" data-sowviz-model data-target="sowviz-root"'
    if len(text) > COMPRESS_ABOVE:
        packed = base64.b64encode(gzip.compress(text.encode("utf-8"), mtime=0)).decode("ascii")
        return f'<script {attrs} data-encoding="gzip-base64">{packed}</script>'
    return f"<script {attrs}>{text}</script>"


def _float32_history(model: dict) -> dict:
    """`model` with the history rows of its float32 summaries marked float32
    (`as_float32_row`): a 200-step Monitor run of a small MLP was a 6.6 MB report, its
    history's floats written with 17 digits (`-0.0960800051689148` for `-0.09608`), 3.4 MB
    of the 4 MB of gzip. Only summaries marked float32 (`Float32Json`) qualify: a model
    read back from JSON keeps every digit it has."""
    history = model.get("history") if isinstance(model, dict) else None
    if not isinstance(history, dict) or not history.get("probes"):
        return model
    float32 = {
        (p.get("id"), mode)
        for p in model.get("probes") or ()
        for mode, s in (p.get("summaries") or {}).items()
        if isinstance(s, Float32Json)
    }
    if not float32:
        return model
    probes = {
        pid: {
            mode: [as_float32_row(r) for r in rows] if (pid, mode) in float32 else rows
            for mode, rows in by_mode.items()
        }
        for pid, by_mode in history["probes"].items()
    }
    return {**model, "history": {**history, "probes": probes}}


def write_html(model: dict, path: str | pathlib.Path, *, title: str | None = None) -> pathlib.Path:
    """Writes :func:`render_html` to ``path`` (UTF-8) atomically and returns the path.

    The page goes to a temporary file in the same directory, which then replaces
    ``path`` (:func:`os.replace`): a failed write leaves any previous report intact.
    ``~`` is expanded; an unwritable path raises an ``OSError`` naming ``path`` and the
    fix (a missing directory: create it). An existing file is replaced only when it is
    an earlier sowviz report (:func:`replaceable`), writable, and a symlink is written
    through."""
    page = render_html(model, title=title).encode("utf-8")
    return atomic_write(path, page, what="the report", may_replace=replaceable)


# Every report sowviz has written says so in its head (`render_html`'s generator meta),
# a few hundred bytes in; reading this much finds it in any of them.
_MARKER = b'<meta name="generator" content="sowviz'
_MARKER_WITHIN = 4096

_NOT_A_REPORT = (
    "sowviz: will not write the report to {path}: that file exists and is not a sowviz "
    "HTML report ({kind}), and writing would replace it. `save_html` replaces only an "
    "earlier sowviz report (as `savefig` replaces a figure). Choose another path (e.g. "
    "{example!r}), or delete the file first if it should go."
)
_LIVE_LOG = (
    "sowviz: will not write the report to {path}: it is a file of the run log a Monitor "
    "is writing in `log_dir` {log_dir!r}, and the report would replace it (the logged "
    "steps would be lost). Write the report beside the log instead (e.g. to {example!r})."
)


def replaceable(target: pathlib.Path) -> None:
    """Raise `FileExistsError` unless the existing file `target` may be replaced by a
    report: an earlier sowviz report, or an empty file. `save_html("train.py")` (or a
    run's own `steps.log`, a tab completion away from `steps.html`) replaced the user's
    file without a word."""
    # A Monitor of this process writing a run log has imported its writer.
    writer = sys.modules.get("sowviz.runlog.writer")
    log_dir = writer.writing_log_dir(target) if writer is not None else None
    if log_dir is not None:
        example = str(log_dir.parent / f"{log_dir.name}.html")
        raise FileExistsError(_LIVE_LOG.format(path=target, log_dir=str(log_dir), example=example))
    try:
        st = os.stat(target)
        if stat.S_ISREG(st.st_mode) and st.st_size == 0:
            return  # `touch report.html`: nothing to lose
        if stat.S_ISREG(st.st_mode):  # (reading a FIFO or a device could block)
            with open(target, "rb") as f:
                if _MARKER in f.read(_MARKER_WITHIN):
                    return
            kind = f"a file of {st.st_size:,} bytes not written by sowviz"
        else:
            kind = "not a regular file"
    except OSError as err:  # unreadable: it cannot be told from a report
        kind = f"it cannot be read: {err.strerror or err}"
    if target.suffix.lower() in (".html", ".htm"):
        example = str(target.with_name(f"{target.stem}-sowviz.html"))
    else:
        example = str(target.with_suffix(".html"))
    raise FileExistsError(_NOT_A_REPORT.format(path=target, kind=kind, example=example))


_model.register_writer("html", write_html)
