"""The index of one identity's learned states: an append-only file of records that survives a crash.

Each record is a header (magic, version, payload length), a JSON payload and the first 16 bytes of
the payload's sha256. ``append`` writes one record and fsyncs the file, so a record is either whole
on disk or, when the process dies mid-write, a torn tail: ``Index.open`` reads records up to the
first one that is short or whose digest does not match, ignores the rest, and cuts the file there
before appending again. ``rewrite`` replaces the file with the live records only, written to a
temporary name, fsynced, then renamed over it (and the directory fsynced), so a crash leaves the old
file or the new one, never half of one. Files are created 0600.

A record is ``{"op": "put", ...}`` (a state learned: its entry), ``{"op": "drop", "key": ...}``
(a state forgotten) or ``{"op": "use", "key": ..., "at": ...}`` (a state read: its last use); the
entries live after replaying them in order. Not thread-safe: one writer, the store.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

MAGIC = b"TFDI"
VERSION = 1
HEADER = struct.Struct("<4sHI")  # magic, version, payload bytes
DIGEST = 16
MAX_PAYLOAD = 1 << 24  # a record longer than this is corruption, not an entry


def _checked(payload: bytes) -> bytes:
    return hashlib.sha256(payload).digest()[:DIGEST]


def encode(record: Mapping[str, Any]) -> bytes:
    """One record's bytes: header, JSON payload, digest."""
    payload = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    return HEADER.pack(MAGIC, VERSION, len(payload)) + payload + _checked(payload)


def decode(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The whole records at the start of ``data`` and where the first torn or corrupt one starts."""
    records, at = [], 0
    while at + HEADER.size <= len(data):
        magic, version, length = HEADER.unpack_from(data, at)
        end = at + HEADER.size + length + DIGEST
        if magic != MAGIC or version != VERSION or length > MAX_PAYLOAD or end > len(data):
            break
        payload = data[at + HEADER.size:at + HEADER.size + length]
        if data[end - DIGEST:end] != _checked(payload):
            break
        try:
            record = json.loads(payload)
        except ValueError:
            break
        if not isinstance(record, dict):
            break
        records.append(record)
        at = end
    return records, at


def write_all(handle: int, data: bytes | memoryview) -> None:
    """``os.write`` until every byte is written (a write may take fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(handle, view):]


def fsync_directory(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` durable."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


class Index:
    """The index file at ``path``: its live entries by key, and the records appended since."""

    def __init__(self, path: Path, entries: dict[str, dict[str, Any]], records: int, torn: int) -> None:
        self.path = path
        self.entries = entries  # key: its put record, its "used" time updated by use records
        self.records = records  # records in the file (live or not): rewrite when far past the entries
        self.torn = torn  # bytes of a torn tail found and cut at open

    @classmethod
    def open(cls, path: Path) -> Index:
        """Read ``path`` (missing: empty), replay its whole records, cut a torn tail."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        records, good = decode(data)
        if good < len(data):
            with open(path, "r+b") as handle:
                handle.truncate(good)
                os.fsync(handle.fileno())
        entries: dict[str, dict[str, Any]] = {}
        for record in records:
            _replay(entries, record)
        return cls(path, entries, len(records), len(data) - good)

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record and fsync it; replay it into the entries. A new file is made 0600."""
        data = encode(record)
        created = not self.path.exists()
        handle = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            write_all(handle, data)
            os.fsync(handle)
        finally:
            os.close(handle)
        if created:
            fsync_directory(self.path.parent)
        _replay(self.entries, dict(record))
        self.records += 1

    def rewrite(self) -> None:
        """The file with only the live entries: written beside it, fsynced, renamed over it."""
        part = self.path.with_name(self.path.name + ".part")
        data = b"".join(encode(entry) for entry in self.entries.values())
        part.unlink(missing_ok=True)  # one a crash left keeps its own mode: made anew, 0600
        handle = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            write_all(handle, data)
            os.fsync(handle)
        finally:
            os.close(handle)
        os.replace(part, self.path)
        fsync_directory(self.path.parent)
        self.records = len(self.entries)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.entries.values())


def _replay(entries: dict[str, dict[str, Any]], record: dict[str, Any]) -> None:
    op, key = record.get("op"), record.get("key")
    if not isinstance(key, str):
        return
    if op == "put":
        entries[key] = record
    elif op == "drop":
        entries.pop(key, None)
    elif op == "use" and key in entries:
        entries[key] = {**entries[key], "used": record.get("at")}
