"""The learned-states store on real files: states written and read back (after a reopen too), blocks
of a shared prefix stored once; every kind of damage refused, counted and forgotten; the disk
budget (other identities first, then the least recently used), the daily budget, the free-space
floor, read-back verification; directories 0700, files 0600."""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tfd.store import sealed
from tfd.store.checksum import mismatched
from tfd.store.image import Image
from tfd.store.sealed import Writer
from tfd.store.store import Refused, Store

MIB = 1 << 20
DAY = 86400.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def block_bytes(name: str, size: int) -> bytes:
    seed = sum(name.encode())
    return bytes((seed + i) % 251 for i in range(size))


def image(key: str, blocks: list[str], block: int = 4096, pieces: int = 3000, head: bool = False) -> Image:
    return Image(key, 256 * len(blocks), head, (("layer0.state", pieces - 100), ("layer0.conv_tail", 100)),
                 tuple((name, block) for name in blocks))


def write(store: Store, made: Image) -> bool:
    def pieces(writer: Writer) -> None:
        writer.write(block_bytes(made.key, made.piece_bytes))

    def blocks(i: int, writer: Writer) -> None:
        name, size = made.blocks[i]
        writer.write(block_bytes(name, size))

    return store.write(made, pieces, blocks)


def read(store: Store, made: Image, threads: int = 1) -> tuple[bytes, list[bytes]]:
    """The state's pieces and each block's bytes, as the store reads them back (``threads`` files at
    once); each file is handed on in order, once read."""
    into = bytearray(made.bytes)
    handed: list[tuple[int, int]] = []
    with ThreadPoolExecutor(threads) as readers:
        store.read(made, memoryview(into), readers if threads > 1 else None,
                   lambda at, size: handed.append((at, size)))
    sizes = [size for _, size in made.blocks] + [made.piece_bytes]
    assert handed == [(sum(sizes[:i]), size) for i, size in enumerate(sizes)]
    blocks, at = [], 0
    for _, size in made.blocks:
        blocks.append(bytes(into[at:at + size]))
        at += size
    return bytes(into[at:]), blocks


def opened(root: Path, identity: str = "aaaa", clock: Clock | None = None, budget: int = 64 * MIB,
           daily: int = 64 * MIB, floor: int = 0, verify: bool = False) -> Store:
    return Store(root, identity, budget, daily, floor, verify, clock or Clock())


def test_a_state_reads_back_after_a_reopen(tmp_path: Path) -> None:
    store = opened(tmp_path)
    first, second = image("k1", ["b0", "b1"]), image("k2", ["b0", "b1", "b2"])  # a shared prefix
    assert write(store, first) and write(store, second) and not write(store, first)
    assert sorted(p.name for p in (store.home / "blocks").iterdir()) == ["b0.blk", "b1.blk", "b2.blk"]
    again = opened(tmp_path)
    assert again.find(["k9", "k2", "k1"], head=False) == second
    state, blocks = read(again, second, threads=3)
    assert state == block_bytes("k2", second.piece_bytes)
    assert blocks == [block_bytes(name, size) for name, size in second.blocks]
    assert again.counts.read == 1 and again.counts.bytes_read == 3 * 4096 + 3000
    modes = {stat.S_IMODE(os.stat(p).st_mode) for p in store.home.rglob("*")} | {
        stat.S_IMODE(os.stat(store.home).st_mode)}
    assert modes == {0o700, 0o600}


def test_a_drafting_lane_finds_only_states_with_the_heads_rows(tmp_path: Path) -> None:
    store = opened(tmp_path)
    write(store, image("plain", ["b0"]))
    write(store, image("headed", ["h0"], head=True))
    assert store.find(["plain"], head=True) is None
    assert store.find(["plain", "headed"], head=True) == image("headed", ["h0"], head=True)
    assert store.find(["headed"], head=False) is not None


def damage(store: Store, made: Image, how: str) -> None:
    state = store.home / "states" / f"{made.key}.st"
    block = store.home / "blocks" / f"{made.blocks[-1][0]}.blk"
    if how == "flip":
        data = bytearray(block.read_bytes())
        data[len(data) // 2] ^= 0x04
        block.write_bytes(bytes(data))
    elif how == "truncate":
        state.write_bytes(state.read_bytes()[:-1])
    elif how == "append":
        block.write_bytes(block.read_bytes() + b"\0")
    elif how == "swap":  # two blocks' files exchanged
        other = store.home / "blocks" / f"{made.blocks[0][0]}.blk"
        a, b = block.read_bytes(), other.read_bytes()
        block.write_bytes(b)
        other.write_bytes(a)
    elif how == "delete":
        block.unlink()


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("how", ["flip", "truncate", "append", "swap", "delete"])
def test_damage_is_refused_counted_and_forgotten(tmp_path: Path, how: str, threads: int) -> None:
    store = opened(tmp_path)
    made = image("k1", ["b0", "b1"])
    write(store, made)
    damage(store, made, how)
    with pytest.raises(Refused) as refused:
        read(store, made, threads)
    assert refused.value.reason == "Corrupt" and store.counts.refused == 1
    assert store.find(["k1"], head=False) is None and not (store.home / "states" / "k1.st").exists()
    assert write(store, made)  # written again, it reads back
    assert read(store, made)[0] == block_bytes("k1", made.piece_bytes)


def test_what_the_hand_on_raises_goes_through_and_the_state_stays(tmp_path: Path) -> None:
    store = opened(tmp_path)
    made = image("k1", ["b0", "b1", "b2"])
    write(store, made)

    def refuse(at: int, size: int) -> None:
        if at:
            raise RuntimeError("the device refused a copy")

    with ThreadPoolExecutor(2) as readers, pytest.raises(RuntimeError, match="refused a copy"):
        store.read(made, memoryview(bytearray(made.bytes)), readers, refuse)
    assert store.counts.refused == 0 and store.find(["k1"], head=False) == made


@pytest.mark.parametrize("how", ["flip", None])
def test_the_callers_check_of_the_sums_refuses_a_flipped_byte(tmp_path: Path, how: str | None) -> None:
    # the store reads without summing; the caller sums the bytes where they went (here: the host)
    store = opened(tmp_path)
    made = image("k1", ["b0", "b1"])
    write(store, made)
    if how:
        damage(store, made, how)
    into = bytearray(made.bytes)
    sizes = [size for _, size in made.blocks] + [made.piece_bytes]

    def check(expected: list[int]) -> list[int]:
        return mismatched(torch.frombuffer(into, dtype=torch.uint8), sizes, expected)

    if how is None:
        store.read(made, memoryview(into), check=check)
        assert bytes(into[made.bytes - made.piece_bytes:]) == block_bytes("k1", made.piece_bytes)
        return
    with pytest.raises(Refused, match=r"b1\.blk: its payload's word sum does not match"):
        store.read(made, memoryview(into), check=check)
    assert store.counts.refused == 1 and store.find(["k1"], head=False) is None


def test_another_identity_never_reads_this_ones_states(tmp_path: Path) -> None:
    write(opened(tmp_path, "aaaa"), image("k1", ["b0"]))
    assert opened(tmp_path, "bbbb").find(["k1"], head=False) is None
    assert opened(tmp_path, "aaaa").find(["k1"], head=False) is not None


def test_the_budget_evicts_other_identities_then_the_oldest_states(tmp_path: Path) -> None:
    clock = Clock()
    other = opened(tmp_path, "bbbb", clock)
    write(other, image("old", ["o0", "o1"], block=MIB))
    clock.now += 10
    store = opened(tmp_path, "aaaa", clock, budget=5 * MIB)
    for i in range(6):
        clock.now += 1
        write(store, image(f"k{i}", [f"b{i}"], block=MIB))
        size = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
        assert size <= 5 * MIB
    assert not (tmp_path / "bbbb").exists()  # the other identity went first, whole
    kept = sorted(entry["key"] for entry in store.index)
    assert kept == ["k2", "k3", "k4", "k5"] and store.counts.evicted == 2
    with pytest.raises(Refused, match="more than the"):
        write(store, image("huge", ["h"], block=6 * MIB))


def test_the_daily_budget_refuses_writes_until_the_next_day(tmp_path: Path) -> None:
    clock = Clock()
    store = opened(tmp_path, clock=clock, daily=2 * 4096 + 6000)
    assert write(store, image("k1", ["b0"])) and write(store, image("k2", ["b1"]))
    with pytest.raises(Refused) as refused:
        write(store, image("k3", ["b2"]))
    assert refused.value.reason == "DailyBudgetSpent" and store.counts.daily_spent == 1
    assert opened(tmp_path, clock=clock, daily=2 * 4096 + 6000).report()["daily_budget_left"] == 0
    clock.now += DAY
    assert write(store, image("k3", ["b2"]))


def test_the_free_space_floor_refuses_writes(tmp_path: Path) -> None:
    store = opened(tmp_path, floor=1 << 62)
    with pytest.raises(Refused) as refused:
        write(store, image("k1", ["b0"]))
    assert refused.value.reason == "NoSpace" and store.counts.no_space == 1
    assert not list((store.home / "blocks").iterdir())


def test_verify_reads_every_file_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[str] = []
    real = sealed.read
    monkeypatch.setattr(sealed, "read", lambda path, kind: checked.append(path.name) or real(path, kind))
    write(opened(tmp_path, verify=True), image("k1", ["b0", "b1"]))
    assert checked == ["b0.blk", "b1.blk", "k1.st"]


def test_a_failing_source_leaves_no_file_and_no_record(tmp_path: Path) -> None:
    store = opened(tmp_path)
    made = image("k1", ["b0", "b1"])

    def pieces(writer: Writer) -> None:
        raise OSError("device copy failed")

    def blocks(i: int, writer: Writer) -> None:
        writer.write(block_bytes(made.blocks[i][0], made.blocks[i][1]))

    with pytest.raises(OSError, match="device copy failed"):
        store.write(made, pieces, blocks)
    assert not list((store.home / "blocks").iterdir()) and not list((store.home / "states").iterdir())
    assert opened(tmp_path).find(["k1"], head=False) is None
