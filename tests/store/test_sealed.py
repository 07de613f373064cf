"""Sealed files: what was written reads back; a flipped byte, a truncation, an appended byte, another
kind, or a file swapped for another is refused by name; a crash mid-write leaves no file under the
real name; files are 0600."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tfd.store import sealed
from tfd.store.sealed import Corrupt, Reader, Writer


def written(tmp_path: Path, name: str = "a.st", payload: bytes = bytes(range(256)) * 40) -> Path:
    path = tmp_path / name
    sealed.write(path, "state", {"position": 64, "name": name}, payload)
    return path


def test_what_was_written_reads_back(tmp_path: Path) -> None:
    path = written(tmp_path)
    header, payload = sealed.read(path, "state")
    assert header == {"position": 64, "name": "a.st"} and payload == bytes(range(256)) * 40
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["a.st"]  # no temporary file left


def test_the_payload_reads_into_views_in_pieces(tmp_path: Path) -> None:
    path = written(tmp_path)
    out = bytearray(10240)
    with Reader(path, "state") as reader:
        view = memoryview(out)
        for start in range(0, reader.size, 3000):
            reader.readinto(view[start:start + 3000])
        reader.finish()
    assert bytes(out) == bytes(range(256)) * 40


def damaged(path: Path, how: str, other: Path) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0x01
    elif how == "truncate":
        del data[-7:]
    elif how == "append":
        data.append(0)
    elif how == "swap":
        data = bytearray(other.read_bytes())
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("how", "says"), [("flip", "word sum does not match"), ("truncate", "its head says"),
                                           ("append", "its head says")])
def test_a_damaged_file_is_refused(tmp_path: Path, how: str, says: str) -> None:
    path, other = written(tmp_path), written(tmp_path, "b.st", b"another state")
    damaged(path, how, other)
    with pytest.raises(Corrupt, match=says):
        sealed.read(path, "state")


def test_every_flipped_bit_anywhere_is_refused(tmp_path: Path) -> None:
    path = written(tmp_path, payload=b"a short state")
    whole = path.read_bytes()
    for bit in range(8 * len(whole)):
        data = bytearray(whole)
        data[bit // 8] ^= 1 << bit % 8
        path.write_bytes(bytes(data))
        with pytest.raises(Corrupt):
            sealed.read(path, "state")


def test_a_file_of_another_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Corrupt, match="not a sealed rows file"):
        sealed.read(written(tmp_path), "rows")


def test_a_swapped_file_reads_as_the_other_one(tmp_path: Path) -> None:
    # a whole file put in another's place is sealed itself: its header names what it is
    path, other = written(tmp_path, "a.st"), written(tmp_path, "b.st")
    damaged(path, "swap", other)
    header, _ = sealed.read(path, "state")
    assert header["name"] == "b.st"  # the store compares the header with what its index expects


def test_a_write_that_fails_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "c.blk"
    with Writer(path, "rows", {}, 100) as writer:
        writer.write(b"x" * 60)
        with pytest.raises(ValueError, match="the payload was 60 bytes, its header says 100"):
            writer.commit()
    assert list(tmp_path.iterdir()) == []
