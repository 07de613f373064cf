"""The learned states' index: records survive a reopen; a torn or corrupt tail is ignored and cut, and
appending goes on after it; a rewrite keeps only the live entries; files are 0600."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tfd.store.index import HEADER, Index, encode


def put(key: str, position: int) -> dict[str, object]:
    return {"op": "put", "key": key, "position": position, "bytes": 1000 + position}


def test_records_replay_after_a_reopen(tmp_path: Path) -> None:
    index = Index.open(tmp_path / "index")
    assert not index.entries and index.torn == 0
    for key, position in (("a", 64), ("b", 128), ("c", 192)):
        index.append(put(key, position))
    index.append({"op": "drop", "key": "b"})
    index.append({"op": "use", "key": "a", "at": 7.5})
    again = Index.open(tmp_path / "index")
    assert again.entries == {"a": {**put("a", 64), "used": 7.5}, "c": put("c", 192)}
    assert again.records == 5
    assert stat.S_IMODE(os.stat(tmp_path / "index").st_mode) == 0o600


@pytest.mark.parametrize("cut", [1, HEADER.size - 1, HEADER.size, HEADER.size + 5, -1])
def test_a_torn_last_record_is_ignored_and_cut(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "index"
    index = Index.open(path)
    index.append(put("a", 64))
    whole = path.stat().st_size
    record = encode(put("b", 128))
    with open(path, "ab") as handle:  # the process died while writing the second record
        handle.write(record[:cut])
    reopened = Index.open(path)
    assert list(reopened.entries) == ["a"] and reopened.torn == len(record[:cut])
    assert path.stat().st_size == whole  # cut, so the next record follows the last whole one
    reopened.append(put("c", 192))
    assert list(Index.open(path).entries) == ["a", "c"]


def test_a_corrupt_record_ends_the_read(tmp_path: Path) -> None:
    path = tmp_path / "index"
    index = Index.open(path)
    for key, position in (("a", 64), ("b", 128), ("c", 192)):
        index.append(put(key, position))
    data = bytearray(path.read_bytes())
    second = len(encode(put("a", 64)))
    data[second + HEADER.size + 3] ^= 0x20  # a flipped bit in the second record's payload
    path.write_bytes(bytes(data))
    reopened = Index.open(path)
    assert list(reopened.entries) == ["a"] and reopened.torn == len(data) - second


def test_a_rewrite_keeps_the_live_entries_only(tmp_path: Path) -> None:
    path = tmp_path / "index"
    index = Index.open(path)
    for i in range(20):
        index.append(put(f"k{i}", 64 * (i + 1)))
    for i in range(15):
        index.append({"op": "drop", "key": f"k{i}"})
    index.append({"op": "use", "key": "k19", "at": 3.0})
    before = path.stat().st_size
    (tmp_path / "index.part").write_bytes(b"left by a crash mid-rewrite")
    index.rewrite()
    assert path.stat().st_size < before and not (tmp_path / "index.part").exists()
    reopened = Index.open(path)
    assert reopened.records == 5 and reopened.entries == index.entries
    assert reopened.entries["k19"]["used"] == 3.0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
