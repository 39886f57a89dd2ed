"""The run log's byte format: framed, checksummed records (docs/log-format.md).

A record is a 12-byte header and a payload::

    magic  b"SV" + version byte + kind byte (b"S" a step, b"E" the clean end, b"N"
           unrecorded steps found non-finite, b"L" unrecorded steps' losses); the
           version byte is the format version that brought the record's kind (1 for S
           and E, 2 for N, 3 for L), so a reader of an older version reads every
           record it knows and skips the others
    u32    payload length (little-endian)
    u32    CRC-32 of kind byte + payload (zlib.crc32, little-endian)
    payload  zlib-compressed: u32 JSON length, the JSON, then the array bytes

Numeric lists in a step (histogram edges and counts, shapes) travel as little-endian
typed arrays after the JSON, replaced in it by ``{"$a": [dtype, offset, count]}``:
float32 where that is lossless (sowviz's on-device summaries are float32), else
float64; int32 where the values fit, else int64. A reader therefore gets back exactly
the Python values that were written. One ``os.write`` per record and an appending
file descriptor mean a killed process leaves at most one incomplete record, at the
end, which the reader skips.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

VERSION = 3  # the newest record kind this module reads and writes (`KINDS`)
SIGNATURE = b"SV"
STEP, END, NONFINITE, LOSSES = b"S", b"E", b"N", b"L"
#: The version byte each kind is written with: the format version that brought it.
#: Steps and the end are version 1's, byte for byte, so a version-1 reader (sowviz
#: before session 38) still reads a new log's steps, and skips its `N` records as
#: unreadable bytes (a warning) rather than refusing the whole log.
KINDS = {STEP: 1, END: 1, NONFINITE: 2, LOSSES: 3}
MAGIC = SIGNATURE + bytes([1])  # a version-1 record's first three bytes
HEADER = struct.Struct("<4sII")  # magic+kind, payload length, crc32
# A payload over this is taken for a corrupt length field, not a record.
MAX_PAYLOAD = 32 << 20
LEVEL = 1  # zlib level: 1 is ~2x faster than 6 and only ~5% larger on summaries

_ARRAY = "$a"
_FLOATS = "$f"  # {"$f": [[key, ...], {"$a": ...}]}: a dict's float values, packed
#: A key of the entry's own that starts with this gets one more: the markers above are
#: never a key a step wrote (a sow named "$f" read back as a packed dict).
_ESCAPE = "$"


def _key(k: Any) -> Any:
    return _ESCAPE + k if type(k) is str and k.startswith(_ESCAPE) else k


_PACK_FLOATS = 4  # pack a dict's floats when it has at least this many


def _pack_array(values: list, blobs: list[bytes], offset: list[int]) -> dict | None:
    """`values` as a typed array appended to `blobs`, or None to keep it in the JSON.

    Only lists of all-int or all-float values become arrays (a mixed list, bools or
    None stay JSON, so every value comes back with the type it was written with).
    `struct` rather than NumPy: these lists are short (65 edges), where NumPy's
    per-call cost dominates. Every per-value step runs in C (`_all_of`, `struct`, the
    tuple comparison): a step's ~100 lists of ~65 values went through a Python loop
    per value before.
    """
    n = len(values)
    first = type(values[0])
    if first is float and _all_of(float, values):
        try:
            data, code = struct.pack(f"<{n}f", *values), "<f4"
            exact = struct.unpack(f"<{n}f", data) == tuple(values)
        except OverflowError:  # beyond float32's range
            exact = False
        if not exact:  # not float32-exact (or a NaN): float64 keeps every bit
            data, code = struct.pack(f"<{n}d", *values), "<f8"
    elif first is int and _all_of(int, values):
        try:
            data, code = struct.pack(f"<{n}i", *values), "<i4"
        except struct.error:
            try:
                data, code = struct.pack(f"<{n}q", *values), "<i8"
            except struct.error:  # beyond int64: JSON keeps it
                return None
    else:
        return None
    blobs.append(data)
    ref = {_ARRAY: [code, offset[0], n]}
    offset[0] += len(data)
    return ref


def _all_of(kind: type, values: list) -> bool:
    """Whether every value's type is exactly `kind` (a bool is no int here), in C."""
    return list(map(type, values)).count(kind) == len(values)


_SCALARS = frozenset({float, int, str, bool, type(None)})


def _flatten(x: Any, blobs: list[bytes], offset: list[int]) -> Any:
    t = type(x)
    if t is dict:
        floats = [k for k, v in x.items() if type(v) is float]
        if len(floats) >= _PACK_FLOATS:
            # A summary's statistics (min, max, mean, std, l2, absmax): one typed array
            # rather than ~20 characters of JSON each.
            ref = _pack_array([x[k] for k in floats], blobs, offset)
            out = {
                _key(k): v if type(v) in _SCALARS else _flatten(v, blobs, offset)
                for k, v in x.items()
                if type(v) is not float
            }
            out[_FLOATS] = [floats, ref]  # the keys as written: list items, never markers
            return out
        return {
            _key(k): v if type(v) in _SCALARS else _flatten(v, blobs, offset) for k, v in x.items()
        }
    if t is list or t is tuple:
        if len(x) >= 2:
            ref = _pack_array(x, blobs, offset)
            if ref is not None:
                return ref
        return [v if type(v) in _SCALARS else _flatten(v, blobs, offset) for v in x]
    if isinstance(x, dict):
        return _flatten(dict(x), blobs, offset)
    if hasattr(x, "tolist"):  # numpy scalars and arrays
        return _flatten(x.tolist(), blobs, offset)
    return x


def encode(entry: dict[str, Any]) -> bytes:
    """One step as a record payload (before framing)."""
    blobs: list[bytes] = []
    text = json.dumps(_flatten(entry, blobs, [0]), separators=(",", ":"), allow_nan=True)
    raw = text.encode("utf-8")
    return zlib.compress(struct.pack("<I", len(raw)) + raw + b"".join(blobs), LEVEL)


def decode(payload: bytes) -> dict[str, Any]:
    raw = zlib.decompress(payload)
    (n,) = struct.unpack_from("<I", raw)
    blob = memoryview(raw)[4 + n :]

    def hook(d: dict) -> Any:
        if len(d) == 1 and _ARRAY in d:
            dtype, off, count = d[_ARRAY]
            return np.frombuffer(blob, dtype=np.dtype(dtype), count=count, offset=off).tolist()
        floats = d.pop(_FLOATS, None)
        if any(k.startswith(_ESCAPE) for k in d):
            d = {k[1:] if k.startswith(_ESCAPE) else k: v for k, v in d.items()}
        if floats is not None:
            keys, values = floats
            d.update(zip(keys, values, strict=True))
        return d

    return json.loads(bytes(raw[4 : 4 + n]).decode("utf-8"), object_hook=hook)


def frame(kind: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(kind + payload)
    return HEADER.pack(SIGNATURE + bytes([KINDS[kind]]) + kind, len(payload), crc) + payload


def _plausible(magic: bytes, length: int) -> bool:
    """A header this reader knows (`KINDS`), or one of a newer format version (a
    newer sowviz wrote the log: its record is yielded, for the reader to skip with a
    warning that says so, rather than taken for corrupt bytes)."""
    if magic[:2] != SIGNATURE or length > MAX_PAYLOAD:
        return False
    version, kind = magic[2], magic[3:]
    return KINDS.get(kind) == version or version > VERSION


@dataclass(frozen=True)
class Record:
    offset: int  # byte offset of the record's header in the file
    end: int  # byte offset just past the record
    kind: bytes
    payload: bytes
    version: int = 1  # the header's version byte (`KINDS`)


@dataclass(frozen=True)
class Corrupt:
    offset: int  # where the unreadable bytes start
    resumed: int | None  # where the next good record starts (None: nothing more)


def scan(data: bytes, base: int) -> Iterator[Record | Corrupt | int]:
    """Walk `data` (the file from byte `base` on): yields Records, Corrupt spans, and
    finally the offset (absolute) of an incomplete tail, or of the end of `data`.

    A record whose header or payload is cut short at the end of `data` is incomplete,
    not corrupt: a writer may still be appending it. A bad magic or checksum is
    corrupt: the scan resumes at the next offset where a whole, valid record starts.
    """
    pos, n = 0, len(data)
    while pos < n:
        if n - pos < HEADER.size:
            break
        magic, length, crc = HEADER.unpack_from(data, pos)
        if _plausible(magic, length):
            end = pos + HEADER.size + length
            if end > n:
                break  # incomplete: wait for more bytes
            payload = bytes(data[pos + HEADER.size : end])
            if zlib.crc32(magic[3:] + payload) == crc:
                yield Record(base + pos, base + end, magic[3:], payload, magic[2])
                pos = end
                continue
        nxt = _resync(data, pos + 1)
        yield Corrupt(base + pos, None if nxt is None else base + nxt)
        if nxt is None:
            return
        pos = nxt
    yield base + pos


def _resync(data: bytes, start: int) -> int | None:
    """The next offset >= start where a complete record with a valid checksum begins."""
    pos = start
    while True:
        pos = data.find(SIGNATURE, pos)
        if pos < 0 or len(data) - pos < HEADER.size:
            return None
        magic, length, crc = HEADER.unpack_from(data, pos)
        end = pos + HEADER.size + length
        if _plausible(magic, length) and end <= len(data):
            if zlib.crc32(magic[3:] + bytes(data[pos + HEADER.size : end])) == crc:
                return pos
        pos += 1


def canonical(entry: dict[str, Any]) -> str:
    """A stable text form of an entry (sorted keys, NaN spelled out) for digests."""

    def norm(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return repr(x)
        if isinstance(x, dict):
            return {str(k): norm(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [norm(v) for v in x]
        if hasattr(x, "tolist"):
            return norm(x.tolist())
        return x

    return json.dumps(norm(entry), sort_keys=True, separators=(",", ":"))
