"""sowviz's own compiled programs kept on disk, so a new process loads them instead of
compiling them again.

The shared summary program (`capture.summaries.finish`) is the same for every model
with like layout sizes, and XLA:CPU takes 0.6-1.5 s to compile it: most of a small
model's first `inspect` in a fresh process (a notebook kernel just started).
Loading its executable takes about 0.04 s. The user's own programs are not kept
here: JAX's persistent compilation cache is the tool for those, and when it is
configured sowviz leaves this program to it too.

Where: ``$SOWVIZ_CACHE_DIR``, else ``$XDG_CACHE_HOME/sowviz``, else
``~/.cache/sowviz``; ``SOWVIZ_CACHE_DIR=""`` turns the cache off. It is also off
in a multi-process run (`jax.process_count() > 1`).

The key is a SHA-256 of everything the executable depends on: the lowered
StableHLO text (the program, its shapes, dtypes and shardings), the JAX and
jaxlib versions, the backend's platform and version, the devices (ids and
kinds), ``XLA_FLAGS``, and on a CPU the host processor's model and instruction
set (XLA:CPU compiles for the host: an executable from another machine sharing the
directory could crash). A file holds a checksum of its payload, is written
atomically, and one that fails its checksum or fails to load is compiled again
and replaced. At most `MAX_FILES` are kept (least recently used go first).
Loading a file unpickles it, so the directory must be writable by you only
(sowviz creates it with mode 0700), as for JAX's own cache.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pathlib
import platform
import threading
import warnings
from typing import Any

import jax

from . import _compat
from ._files import atomic_write

#: Environment variable naming the directory ("" turns the cache off).
ENV = "SOWVIZ_CACHE_DIR"
#: Files kept at most (each 0.3-3 MB).
MAX_FILES = 32
#: Bumped when the file format or the key changes.
FORMAT = b"sowviz-executable-1\n"
_WARNED = threading.Event()


def cache_dir() -> pathlib.Path | None:
    """The directory of the cache, or None when it is off."""
    env = os.environ.get(ENV)
    if env is not None:
        return pathlib.Path(env).expanduser() if env.strip() else None
    if jax.config.jax_compilation_cache_dir:  # JAX's persistent cache keeps it already
        return None
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = pathlib.Path.home() / ".cache"
        except (RuntimeError, KeyError):  # no home directory to be found: no cache
            return None
    return pathlib.Path(base) / "sowviz"


def compile_cached(lowered: Any) -> Any:
    """``lowered.compile()``, loaded from the cache when an executable of the same key is
    there, else compiled and saved (see the module docstring). Never fails for the
    cache's sake: a cache that cannot be read is compiled past, one that cannot be
    written warns once."""
    directory = cache_dir()
    if directory is None or jax.process_count() > 1 or not _private(directory):
        return lowered.compile()
    device = _compat.default_device()
    path = directory / f"{_key(lowered, device)}.xla"
    loaded = _load(path, lowered, device)
    if loaded is not None:
        return loaded
    compiled = lowered.compile()
    if _compat.compiled_devices(compiled) != {device}:
        return compiled  # kept for one device only: that is what a load can place
    try:
        payload = _compat.serialize_compiled(compiled)
    except Exception:  # a backend or program that cannot be serialised: just not cached
        return compiled
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(path, FORMAT + hashlib.sha256(payload).digest() + payload)
        _prune(directory)
    except OSError as e:
        _warn_once(f"sowviz could not save its compiled summary program in {directory} ({e})")
    return compiled


def _private(directory: pathlib.Path) -> bool:
    """Whether only this user can write in `directory` (a file there is unpickled: one
    that others can write could run their code). Warns once when not."""
    try:
        st = directory.stat()
    except OSError:
        return True  # not there yet: `compile_cached` creates it, mode 0700
    owner = getattr(os, "getuid", None)
    if (owner is not None and st.st_uid != owner()) or st.st_mode & 0o022:
        _warn_once(
            f"sowviz does not load compiled programs from {directory}: others can write there"
        )
        return False
    return True


def _warn_once(what: str) -> None:
    if not _WARNED.is_set():
        _WARNED.set()
        warnings.warn(
            f"{what}; its summary program compiles again in each new process. Set {ENV} to a "
            f'directory only you can write, or {ENV}="" to turn this cache off.',
            stacklevel=3,
        )


def _load(path: pathlib.Path, lowered: Any, device: Any) -> Any | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(FORMAT)
    payload = data[head + 32 :]
    if data[:head] != FORMAT or data[head : head + 32] != hashlib.sha256(payload).digest():
        return None
    try:
        compiled = _compat.load_compiled(payload, lowered, device)
    except Exception:  # written by another jaxlib build, say: compiled again, replaced
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # least recently used goes first in `_prune`
    return compiled


def _prune(directory: pathlib.Path) -> None:
    files = []
    for p in directory.glob("*.xla"):
        with contextlib.suppress(OSError):
            files.append((p.stat().st_mtime, p))
    for _, p in sorted(files)[: max(0, len(files) - MAX_FILES)]:
        with contextlib.suppress(OSError):
            p.unlink()


def _key(lowered: Any, device: Any) -> str:
    h = hashlib.sha256(FORMAT)
    for part in (lowered.as_text(), device.id, *_environment()):
        h.update(str(part).encode())
        h.update(b"\0")
    return h.hexdigest()


@functools.cache
def _environment() -> tuple:
    """What the executable depends on besides its program (once per process)."""
    return (
        *_compat.backend_identity(),
        os.environ.get("XLA_FLAGS", ""),
        _host_cpu() if jax.default_backend() == "cpu" else "",
    )


def _host_cpu() -> str:
    """The host processor's model and instruction set, as far as the OS tells."""
    text = ""
    with contextlib.suppress(OSError):
        text = pathlib.Path("/proc/cpuinfo").read_text(errors="replace")
    wanted = ("model name", "flags", "features", "cpu implementer", "cpu part")
    lines = {
        key.strip().lower(): value.strip()
        for key, _, value in (line.partition(":") for line in text.splitlines())
        if key.strip().lower() in wanted
    }
    return repr((platform.machine(), platform.processor(), sorted(lines.items())))
