"""The learned-states store: one identity's kept states on disk, their budgets, and reading them back.

Layout under the root (``--learn-dir``): a directory per identity (``<identity>/``, 0700) holding
``index`` (``tfd.store.index``), ``states/<key>.st`` (a state's words and pieces) and
``blocks/<name>.blk`` (its rows, 256 tokens a block, named by the prefix they belong to, so states
sharing a prefix share its blocks), and a ``used`` file whose time says when the identity was last
opened. Every file is sealed (``tfd.store.sealed``); a state is in the index only once its blocks
and its state file are all on disk.

Budgets: ``budget`` bytes on disk for every identity together (the least recently opened other
identities go first, whole, then this one's least recently used states); ``daily`` bytes written a
day (UTC), after which writes are refused (``DailyBudgetSpent``) and states stay in memory; a
filesystem must keep ``floor`` bytes free. ``verify`` reads each file back after writing it.

Error handling: a write that fails leaves no file under a real name and no index record (its
blocks, if new, are removed); a read that finds a file missing, damaged or not what the index says
raises ``Refused``, after forgetting the state. Not thread-safe: one owner.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, wait
from pathlib import Path
from typing import Any

import attrs

from tfd.store import sealed
from tfd.store.image import Image
from tfd.store.index import Index
from tfd.store.sealed import Corrupt, Reader, Writer


class Refused(Exception):
    """A write the budgets refuse, or a state whose files cannot be trusted; ``reason`` names which."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@attrs.define
class StoreCounts:
    """What the store did: states written and read, reads refused (missing or damaged files), writes
    refused by the budgets (daily, free space), states evicted, bytes written and read."""

    written: int = 0
    read: int = 0
    refused: int = 0
    daily_spent: int = 0
    no_space: int = 0
    evicted: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    read_s: float = 0.0  # spent reading states back, copies to the device included


PieceSource = Callable[[Writer], None]  # writes a state's piece bytes into a sealed file
BlockSource = Callable[[int, Writer], None]  # writes block i's row bytes
FileCheck = Callable[[list[int]], list[int]]  # files' expected word sums -> places of those that differ


class Store:
    def __init__(self, root: Path, identity: str, budget: int, daily: int, floor: int,
                 verify: bool = False, clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self.identity = identity
        self.budget, self.daily, self.floor, self.verify = budget, daily, floor, verify
        self.clock = clock
        self.home = root / identity
        for directory in (root, self.home, self.home / "states", self.home / "blocks"):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(directory, 0o700)
        (self.home / "used").touch(mode=0o600)
        os.utime(self.home / "used", (clock(), clock()))
        self.index = Index.open(self.home / "index")
        self.counts = StoreCounts()
        self.today, self.spent = self._day(), 0
        try:  # today's writes so far, as the last run left them
            day = json.loads((self.home / "daily").read_text())
            if day.get("day") == self.today and isinstance(day.get("spent"), int):
                self.spent = day["spent"]
        except (OSError, ValueError):
            pass

    # -- what is there -------------------------------------------------------------------------

    def find(self, keys: Sequence[str], head: bool) -> Image | None:
        """The first of ``keys`` (longest prefix first) the store holds, with the head's rows when
        ``head``."""
        for key in keys:
            entry = self.index.entries.get(key)
            if entry is not None and (entry["image"]["head"] or not head):
                return Image.of(entry["image"])
        return None

    @property
    def bytes(self) -> int:
        """Bytes of this identity's states and blocks (blocks shared by states counted once)."""
        states: int = sum(entry["state_bytes"] for entry in self.index)
        return states + sum(self._blocks().values())

    def report(self) -> dict[str, object]:
        self._roll()
        return {"dir": str(self.home), "entries": len(self.index.entries), "bytes": self.bytes,
                "budget": self.budget, "daily_budget_left": max(0, self.daily - self.spent),
                **attrs.asdict(self.counts)}

    # -- writing -------------------------------------------------------------------------------

    def write(self, image: Image, pieces: PieceSource, blocks: BlockSource, summed: bool = False) -> bool:
        """Write ``image``: its blocks not on disk yet, its state file, then its index record. False
        when it was there already (with the head's rows, or this one has none); ``Refused``
        (counted) when a budget refuses it; what the sources or the disk raise, after removing what
        this write made. ``summed``: the sources give each payload's word sum (``Writer.given``)."""
        known = self.index.entries.get(image.key)
        if known is not None and (known["image"]["head"] or not image.head):
            return False
        if known is not None:  # the same prefix without the head's rows: this one serves more lanes
            self.forget(image.key)
        self._roll()
        have = self._blocks()
        new = [(i, name, size) for i, (name, size) in enumerate(image.blocks) if name not in have]
        size = image.piece_bytes + sum(size for _, _, size in new)
        if self.spent + size > self.daily:
            self.counts.daily_spent += 1
            raise Refused("DailyBudgetSpent", f"today's {self.daily} bytes of writes are spent "
                                              f"({self.spent} written); the state stays in memory")
        self._make_room(size)
        if shutil.disk_usage(self.home).free - size < self.floor:
            self.counts.no_space += 1
            raise Refused("NoSpace", f"{self.home}: writing {size} bytes would leave less than {self.floor} "
                                     "bytes free")
        made: list[Path] = []
        try:
            for i, name, length in new:
                path = self._block(name)
                with Writer(path, "rows", {"name": name, "bytes": length}, length, summed) as writer:
                    blocks(i, writer)
                    writer.commit()
                made.append(path)
                self._check_written(path, "rows")
            path = self.home / "states" / f"{image.key}.st"
            with Writer(path, "state", image.words(), image.piece_bytes, summed) as writer:
                pieces(writer)
                writer.commit()
            made.append(path)
            self._check_written(path, "state")
            now = self.clock()
            state_bytes = path.stat().st_size
            self.index.append({"op": "put", "key": image.key, "image": image.words(),
                               "state_bytes": state_bytes, "bytes": size, "written": now, "used": now})
        except BaseException:
            for path in made:
                sealed.remove(path)
            raise
        self.spent += size
        self._note_spent()
        self.counts.written += 1
        self.counts.bytes_written += size
        return True

    # -- reading -------------------------------------------------------------------------------

    def read(self, image: Image, into: memoryview, readers: Executor | None = None,
             each: Callable[[int, int], None] | None = None, check: FileCheck | None = None) -> None:
        """Read ``image`` into ``into`` (``image.bytes`` long): its blocks in order, then its pieces,
        by ``readers``' threads (else this one), each file's head checked. ``each(offset, size)`` is
        called here, in order, with each file's place in ``into`` once that file is read, while later
        ones are read (the caller copies it on). Each payload's word sum is checked on the host as it
        is read, or, with ``check``, by it once all are read: given each file's expected sum, it
        gives the places of the files whose bytes do not sum to it. ``Refused`` (counted, the state
        forgotten) when a file is missing, damaged, or is another state's: ``into`` then holds nothing
        to trust; what ``each`` or ``check`` raise goes through, after every read has stopped."""
        began = time.perf_counter()
        files = [(self._block(name), "rows", {"name": name, "bytes": size}, size)
                 for name, size in image.blocks]
        files.append((self.home / "states" / f"{image.key}.st", "state", image.words(), image.piece_bytes))
        places, at = [], 0
        for path, kind, header, size in files:
            places.append((at, path, kind, header, into[at:at + size]))
            at += size
        if at != len(into):
            raise ValueError(f"reading {image.key}: {len(into)} bytes given, the image holds {at}")
        on_host = check is None
        pending: list[Future[int]] = []
        if readers:  # the state file first: one thread reads its pieces while the others read the blocks
            last = readers.submit(_read_one, *places[-1][1:], on_host)
            pending = [readers.submit(_read_one, *place[1:], on_host) for place in places[:-1]] + [last]
        try:
            try:
                expected = []
                for number, place in enumerate(places):
                    expected.append(pending[number].result() if pending else _read_one(*place[1:], on_host))
                    if each is not None:
                        each(place[0], len(place[4]))
            finally:
                for future in pending:  # no thread may still write into ``into`` once this returns
                    future.cancel()
                wait(pending)
            if check is not None and (wrong := check(expected)):
                raise Corrupt(sealed.mismatch(places[wrong[0]][1]))
        except (Corrupt, OSError) as error:
            self.counts.refused += 1
            self.forget(image.key)
            raise Refused("Corrupt", str(error)) from error
        self.counts.read += 1
        self.counts.bytes_read += at
        self.counts.read_s += time.perf_counter() - began
        self.index.append({"op": "use", "key": image.key, "at": self.clock()})

    # -- forgetting ----------------------------------------------------------------------------

    def forget(self, key: str) -> None:
        """Drop a state: its index record, its state file, and the blocks no other state uses."""
        entry = self.index.entries.get(key)
        if entry is None:
            return
        self.index.append({"op": "drop", "key": key})
        sealed.remove(self.home / "states" / f"{key}.st")
        live = self._blocks()
        for name, _ in entry["image"]["blocks"]:
            if name not in live:
                sealed.remove(self._block(name))
        if self.index.records > 4 * len(self.index.entries) + 64:
            self.index.rewrite()

    def evict(self) -> int:
        """Forget every state of this identity; how many there were."""
        keys = list(self.index.entries)
        for key in keys:
            self.forget(key)
        self.counts.evicted += len(keys)
        return len(keys)

    def _make_room(self, size: int) -> None:
        """Within the budget with ``size`` more bytes: other identities first (least recently opened,
        whole), then this one's least recently used states."""
        used = _directory_bytes(self.root)
        others = sorted((d for d in self.root.iterdir() if d.is_dir() and d != self.home),
                        key=lambda d: _used(d))
        for other in others:
            if used + size <= self.budget:
                return
            freed = _directory_bytes(other)
            shutil.rmtree(other, ignore_errors=True)
            used -= freed
        for entry in sorted(self.index, key=lambda e: e.get("used", 0)):
            if used + size <= self.budget:
                return
            before = self.bytes
            self.forget(entry["key"])
            self.counts.evicted += 1
            used -= before - self.bytes
        if used + size > self.budget:
            raise Refused("OverBudget", f"a state of {size} bytes is more than the {self.budget}-byte budget")

    def _blocks(self) -> dict[str, int]:
        """Every block the index's states use, with its bytes."""
        return {name: size for entry in self.index for name, size in entry["image"]["blocks"]}

    def _block(self, name: str) -> Path:
        return self.home / "blocks" / f"{name}.blk"

    def _check_written(self, path: Path, kind: str) -> None:
        """With ``verify``, read the file back whole: its digest must hold."""
        if self.verify:
            sealed.read(path, kind)

    def _note_spent(self) -> None:
        """Today's bytes written, for the next run (written beside and renamed over)."""
        part = self.home / ".daily"
        part.write_text(json.dumps({"day": self.today, "spent": self.spent}))
        os.chmod(part, 0o600)
        os.replace(part, self.home / "daily")

    def _roll(self) -> None:
        if self._day() != self.today:
            self.today, self.spent = self._day(), 0

    def _day(self, at: float | None = None) -> str:
        moment = self.clock() if at is None else at
        return datetime.datetime.fromtimestamp(moment, datetime.UTC).date().isoformat()


def _read_one(path: Path, kind: str, header: dict[str, Any], into: memoryview, on_host: bool) -> int:
    """One sealed file's payload into ``into``: its header must be ``header``, its word sum (checked
    here when ``on_host``) is returned."""
    with Reader(path, kind, on_host) as reader:
        if reader.header != header:
            raise Corrupt(f"{path}: holds {reader.header.get('key') or reader.header.get('name')}, "
                          f"not {header.get('key') or header.get('name')}")
        reader.readinto(into)
        reader.finish()
    return reader.expected


def _used(directory: Path) -> float:
    try:
        return (directory / "used").stat().st_mtime
    except OSError:
        return 0.0


def _directory_bytes(directory: Path) -> int:
    total = 0
    for base, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.stat(os.path.join(base, name)).st_size
            except OSError:
                continue
    return total
