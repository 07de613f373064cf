"""Sealed files: a header, a payload and two checks, written whole or not at all.

A sealed file is ``MAGIC``, a version, its kind, the lengths of a JSON header and of the payload,
the header, the payload, then the CRC-32 of the head and header and the payload's word sum
(``tfd.store.checksum``). ``write`` streams the payload into a temporary name beside the target
(``.tmp-*``), fsyncs it, renames it into place and fsyncs the directory: a crash leaves no half file
under the real name. ``Reader`` refuses (``Corrupt``, naming the file and what is wrong) a file of
another kind or version, a length that is not exactly the one the head gives (truncated, or a byte
appended), a head or header whose CRC does not match, and, once the payload is read, a word sum
that does not match; or it leaves the payload's sum to the caller, whose device holds the bytes
(``expected``). Files are created 0600.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tfd.store.checksum import SUM_BYTES, WordSum
from tfd.store.index import fsync_directory, write_all

MAGIC = b"TFDS"
VERSION = 2  # 1 sealed everything with one sha256
HEAD = struct.Struct("<4sHHIQ")  # magic, version, kind, header bytes, payload bytes
TRAILER = struct.Struct(f"<I{SUM_BYTES}s")  # CRC-32 of the head and header, the payload's word sum
KINDS = {"state": 1, "rows": 2}


class Corrupt(Exception):
    """A sealed file that cannot be trusted: wrong kind or version, wrong length, or a check that
    does not match."""


class Writer:
    """A sealed file being written: ``write`` the payload's pieces in order (``size`` bytes in all),
    then ``commit`` (fsync, rename into place) or ``abort`` (the temporary file removed). A ``with``
    block aborts unless committed. The payload's word sum is summed here as it is written, or, with
    ``summed``, given by the writer of the payload (``given``: its device summed it)."""

    def __init__(self, path: Path, kind: str, header: Mapping[str, Any], size: int, summed: bool = False
                 ) -> None:
        self.path = path
        self.size = size
        self.written = 0
        self.temporary = path.with_name(f".tmp-{path.name}")
        self.temporary.unlink(missing_ok=True)
        head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        self.handle: int | None = os.open(self.temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self.sum = None if summed else WordSum()
        self.given_sum: int | None = None
        fixed = HEAD.pack(MAGIC, VERSION, KINDS[kind], len(head), size)
        self.head_crc = zlib.crc32(fixed + head)
        try:
            write_all(self.handle, fixed + head)
        except BaseException:
            self.abort()
            raise

    def write(self, piece: bytes | memoryview) -> None:
        if self.written + len(piece) > self.size:
            raise ValueError(f"{self.path}: {self.written + len(piece)} payload bytes, its header says "
                             f"{self.size}")
        assert self.handle is not None
        if self.sum is not None:
            self.sum.update(piece)
        write_all(self.handle, piece)
        self.written += len(piece)

    def given(self, payload_sum: int) -> None:
        """The payload's word sum, summed where its bytes were (a writer made with ``summed``)."""
        self.given_sum = payload_sum

    def commit(self) -> None:
        """Seal it: the checks, fsync, the rename into place, the directory fsynced."""
        if self.written != self.size:
            raise ValueError(f"{self.path}: the payload was {self.written} bytes, its header says "
                             f"{self.size}")
        payload_sum = self.sum.total() if self.sum is not None else self.given_sum
        if payload_sum is None:
            raise ValueError(f"{self.path}: its payload's word sum was never given")
        assert self.handle is not None
        try:
            write_all(self.handle, TRAILER.pack(self.head_crc, payload_sum.to_bytes(SUM_BYTES, "little")))
            os.fsync(self.handle)
        except BaseException:
            self.abort()
            raise
        os.close(self.handle)
        self.handle = None
        os.replace(self.temporary, self.path)
        fsync_directory(self.path.parent)

    def abort(self) -> None:
        """Give up: close and remove the temporary file (again: nothing)."""
        if self.handle is not None:
            os.close(self.handle)
            self.handle = None
            self.temporary.unlink(missing_ok=True)

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


def write(path: Path, kind: str, header: Mapping[str, Any], payload: bytes) -> None:
    """Write ``path`` sealed, ``payload`` after ``header``."""
    with Writer(path, kind, header, len(payload)) as writer:
        writer.write(payload)
        writer.commit()


class Reader:
    """An open sealed file: its head, ``header`` and length checked at open; ``readinto`` reads the
    payload in order into views; ``finish`` checks that all of it was read and, with ``check``, its
    word sum (else the caller checks the bytes against ``expected``). What was read must not be used
    before it is checked. Closes on ``finish``, on ``close`` and when leaving a ``with`` block."""

    def __init__(self, path: Path, kind: str, check: bool = True) -> None:
        self.path = path
        self.sum = WordSum() if check else None
        self.handle = open(path, "rb")  # noqa: SIM115 - closed by finish or close
        try:
            total = os.fstat(self.handle.fileno()).st_size
            fixed = self.handle.read(HEAD.size)
            if len(fixed) < HEAD.size:
                raise Corrupt(f"{path}: {total} bytes, shorter than a sealed file's head")
            magic, version, found, head_size, self.size = HEAD.unpack(fixed)
            if magic != MAGIC or version != VERSION or found != KINDS[kind]:
                raise Corrupt(f"{path}: not a sealed {kind} file of version {VERSION}")
            if total != HEAD.size + head_size + self.size + TRAILER.size:
                raise Corrupt(f"{path}: {total} bytes, its head says "
                              f"{HEAD.size + head_size + self.size + TRAILER.size}")
            head = self.handle.read(head_size)
            head_crc, payload_sum = TRAILER.unpack(os.pread(self.handle.fileno(), TRAILER.size,
                                                            total - TRAILER.size))
            if zlib.crc32(fixed + head) != head_crc:
                raise Corrupt(f"{path}: its head's CRC-32 does not match: it changed after it was written")
            self.expected = int.from_bytes(payload_sum, "little")
            header = json.loads(head)
            if not isinstance(header, dict):
                raise Corrupt(f"{path}: its header is not a JSON object")
            self.header: dict[str, Any] = header
        except ValueError:
            self.handle.close()
            raise Corrupt(f"{path}: its header is not JSON") from None
        except BaseException:
            self.handle.close()
            raise
        self.left = self.size

    def readinto(self, view: memoryview) -> None:
        """The next ``len(view)`` payload bytes into ``view``."""
        if len(view) > self.left:
            raise Corrupt(f"{self.path}: asked for {len(view)} bytes past the payload's end")
        if self.handle.readinto(view) != len(view):
            raise Corrupt(f"{self.path}: the payload ended early")
        if self.sum is not None:
            self.sum.update(view)
        self.left -= len(view)

    def read(self) -> bytes:
        """The rest of the payload."""
        data = self.handle.read(self.left)
        if len(data) != self.left:
            raise Corrupt(f"{self.path}: the payload ended early")
        if self.sum is not None:
            self.sum.update(data)
        self.left = 0
        return data

    def finish(self) -> None:
        """``Corrupt`` unless the whole payload was read and (checking) its word sum matches; closes
        the file."""
        try:
            if self.left:
                raise Corrupt(f"{self.path}: {self.left} payload bytes were not read")
            if self.sum is not None and self.sum.total() != self.expected:
                raise Corrupt(mismatch(self.path))
        finally:
            self.handle.close()

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()


def mismatch(path: Path) -> str:
    """What a payload whose word sum does not match says."""
    return f"{path}: its payload's word sum does not match: it changed after it was written"


def read(path: Path, kind: str) -> tuple[dict[str, Any], bytes]:
    """The header and payload of sealed ``path``, checked; ``Corrupt`` when it cannot be trusted."""
    with Reader(path, kind) as reader:
        payload = reader.read()
        reader.finish()
    return reader.header, payload


def remove(path: Path) -> None:
    """Delete ``path`` if it is there."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
