"""sowviz's own compiled programs kept on disk, so a new process loads them instead of
compiling them again.

The shared summary program (`capture.summaries.finish`) is the same for every model
with like layout sizes, and XLA:CPU takes 0.6-1.5 s to compile it: most of a small
model's first `inspect` in a fresh process (a notebook kernel just started).
Loading its executable takes about 0.04 s. The programs keyed by one model's probe
shapes (its large arrays' summaries, its small probes' layout) are kept here as
well. The user's own programs are not: JAX's persistent compilation cache is the
tool for those, and when it is configured sowviz leaves its programs to it too.

Where: ``$SOWVIZ_CACHE_DIR``, else ``$XDG_CACHE_HOME/sowviz``, else
``~/.cache/sowviz``; ``SOWVIZ_CACHE_DIR=""`` turns the cache off. It is also off
in a multi-process run (`jax.process_count() > 1`).

The key is a SHA-256 of everything the executable depends on, computed without
tracing the program (tracing and lowering it took 0.13-0.17 s, a fifth to a third of
a small model's first `inspect`): the program's name and argument shapes, dtypes and
options (the caller's key), sowviz's own code (every source file of the package) and
its settings (the UPPER_CASE constants of the modules that build the program, which
benchmarks and tests switch), JAX's trace settings (`_compat.trace_settings`: x64,
precision, promotion, mesh), the JAX and jaxlib versions, the backend's platform and
version, the devices (ids and kinds), ``XLA_FLAGS``, and on a CPU the host
processor's model and instruction set (XLA:CPU compiles for the host: an executable
from another machine sharing the directory could crash). A file holds a checksum of
its payload, is written atomically, and one that fails its checksum or fails to load
is compiled again and replaced. At most `MAX_FILES` are kept (least recently used go
first). Loading a file unpickles it, so the directory must be writable by you only
(sowviz creates it with mode 0700), as for JAX's own cache.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pathlib
import pickle
import platform
import sys
import threading
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import jax

from . import _compat
from ._files import atomic_write

#: Environment variable naming the directory ("" turns the cache off).
ENV = "SOWVIZ_CACHE_DIR"
#: Files kept at most (each 0.3-3 MB).
MAX_FILES = 32
#: Bumped when the file format or the key changes.
FORMAT = b"sowviz-executable-2\n"
#: The modules whose constants shape the programs kept here (by name prefix).
BUILDERS = ("sowviz.capture", "sowviz.summary", "sowviz._concat", "sowviz._wire")
_WARNED = threading.Event()
_PACKAGE = pathlib.Path(__file__).resolve().parent


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


def compile_cached(lower: Callable[[], Any], key: Hashable) -> Any:
    """``lower().compile()``, loaded from the cache when an executable of the same key is
    there (then `lower` is not called), else compiled and saved (see the module
    docstring). `key` names the program and everything its lowering depends on
    beyond sowviz's code and JAX's settings (its argument shapes, dtypes, static
    options), with a stable ``repr``. Never fails for the cache's sake: a cache
    that cannot be read is compiled past, one that cannot be written warns once."""
    directory = cache_dir()
    if directory is None or jax.process_count() > 1 or not _private(directory):
        return lower().compile()
    device = _compat.default_device()
    path = directory / f"{_key(key, device)}.xla"
    loaded = _load(path, device)
    if loaded is not None:
        return loaded
    lowered = lower()
    compiled = lowered.compile()
    if _compat.compiled_devices(compiled) != {device}:
        return compiled  # kept for one device only: that is what a load can place
    try:
        payload = pickle.dumps(
            (lowered.in_tree, lowered.out_tree, _compat.serialize_compiled(compiled))
        )
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


def _load(path: pathlib.Path, device: Any) -> Any | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(FORMAT)
    payload = data[head + 32 :]
    if data[:head] != FORMAT or data[head : head + 32] != hashlib.sha256(payload).digest():
        return None
    try:
        in_tree, out_tree, executable = pickle.loads(payload)
        compiled = _compat.load_compiled(executable, in_tree, out_tree, device)
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


def _key(key: Hashable, device: Any) -> str:
    h = hashlib.sha256(FORMAT)
    parts = (repr(key), device.id, _source(), _settings(), _compat.trace_settings())
    for part in (*parts, *_environment()):
        h.update(str(part).encode())
        h.update(b"\0")
    return h.hexdigest()


@functools.cache
def _source() -> str:
    """A digest of sowviz's source files (once per process): the programs it keeps
    are built by this code."""
    h = hashlib.sha256()
    for p in sorted(_PACKAGE.rglob("*.py")):
        h.update(p.relative_to(_PACKAGE).as_posix().encode() + b"\0")
        with contextlib.suppress(OSError):
            h.update(p.read_bytes())
    return h.hexdigest()


def _settings() -> tuple:
    """The constants (``SEGMENT_ROW``, ``CPU_CHUNK``...) of the modules that build the
    programs kept here, as they are now: benchmarks and tests switch them, and the
    programs they build differ."""
    return tuple(
        (name, key, value)
        for name, module in sorted(sys.modules.items())
        if name.startswith(BUILDERS)
        for key, value in sorted(vars(module).items())
        if key.isupper() and _plain(value)
    )


def _plain(value: Any) -> bool:
    """Whether `value` is a constant whose ``repr`` is the same in every process."""
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return isinstance(value, (bool, int, float, str, type(None)))


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
