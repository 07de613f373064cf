"""Learned conversations: kept prompt states written to the disk store, and read back into lanes.

The engine thread ``offer``s each state the prompt cache keeps; a writer thread copies it out
(``tfd.store.copies``, on a stream of its own, after the copies that made it) and writes it to the
``Store``. While a state is being written it is pinned: evicting it from memory only forgets it
there, and its pages are released when the write is done (``settle``, on the engine thread, each
step). At admission the engine thread ``find``s the longest learned state a prompt extends and,
when it is longer than what memory holds, ``restore``s it into the lane just opened (its state
pieces and its rows on its own pages): a damaged or missing file is refused, counted, forgotten, and
the lane prefills from the start.

Threads: the store and its files are behind one lock (the writer holds it for a write, the engine
thread for a read). The engine thread never waits for a write: ``offer`` only queues, and ``find``
answers nothing while the writer holds the lock (the lane prefills, or resumes from memory). The
writer copies out through its own staging buffers; reads have a pinned buffer and a pool of reader
threads of their own.
``close`` lets the writer finish what was offered, then stops it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import attrs
import torch

from tfd.cache.image_bytes import block_bytes, image_of, piece_ranges, row_ranges, scatter, state_pages
from tfd.cache.kept import KeptState
from tfd.cache.prefixes import Prefixes
from tfd.pool.pages import Pool
from tfd.store.checksum import mismatched
from tfd.store.copies import Copier, Device, TorchDevice, host_bytes
from tfd.store.image import BLOCK_ROWS, Image, state_key
from tfd.store.sealed import Writer
from tfd.store.store import Refused, Store

log = logging.getLogger("tfd.learn")
# files read at once when a state is read back (their sums are checked on the device): on one H200
# host 16 threads read 8 MiB files from the page cache at 39 GB/s, 8 at 29, one at 3.7; on another
# (16 cores) 16 threads at 11.6 GB/s, 32 at 16.2, and this read with its copies 92-108 ms against
# 136-140 (docs/bench/13b301f172c2/h2d-and-read.log): reads wait on more than the cores
READ_THREADS = min(32, 2 * (os.cpu_count() or 1))


def reserve(pool: Pool, rows: int) -> int:
    """Bytes of a learned state of ``rows`` rows: its row blocks and its pieces (at most a lane's)."""
    return block_bytes(pool, rows) + pool.layout.state_pages * pool.layout.page_bytes


@attrs.frozen
class Job:
    state: KeptState
    image: Image


def block_rows(image: Image, index: int) -> tuple[int, int]:
    """The rows block ``index`` of ``image`` holds."""
    start = index * BLOCK_ROWS
    return start, min(start + BLOCK_ROWS, image.position)


class Learned:
    """``store`` fed from and read into ``pool``'s pages on ``device``."""

    def __init__(self, store: Store, pool: Pool, device: torch.device,
                 make_device: Callable[[torch.device], Device] = TorchDevice, context: int = 0) -> None:
        self.store = store
        self.pool = pool
        self.lock = threading.Lock()
        self.writes = Copier(make_device(device))
        self.reading = make_device(device)
        # reads land here, pinned; sized at load for a state of ``context`` rows: pinning a gigabyte
        # takes long enough that the first read after a restart should not wait for it
        empty = torch.empty(0, dtype=torch.uint8)
        self.buffer = self.reading.pinned(reserve(pool, context)) if context else empty
        self.readers = ThreadPoolExecutor(READ_THREADS, "tfd-learn-read")
        self.jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.written: queue.SimpleQueue[KeptState] = queue.SimpleQueue()
        self.pending = 0  # offered, not settled (engine thread)
        self.thread = threading.Thread(target=self._write_all, name="tfd-learn", daemon=True)
        self.thread.start()

    # -- the engine thread ---------------------------------------------------------------------

    def offer(self, state: KeptState, prompt: Prefixes) -> None:
        """Write ``state`` (just kept from a lane of ``prompt``) to disk (the writer skips it when the
        store has it already); never waits for the writer."""
        image = image_of(self.pool, state, prompt)
        state.writing = True
        self.pending += 1
        self.jobs.put(Job(state, image))

    def settle(self) -> None:
        """Unpin the states written since; release those evicted meanwhile."""
        while True:
            try:
                state = self.written.get_nowait()
            except queue.Empty:
                return
            self.pending -= 1
            state.writing = False
            if state.dropped:
                state.hold.release()

    def find(self, prompt: Prefixes, head: bool, longer_than: int = 0) -> Image | None:
        """The longest learned state ``prompt`` extends past, longer than ``longer_than`` tokens
        (with the head's rows when ``head``)."""
        keys = [state_key(*key) for key in prompt.resume_keys(longer_than)]
        if not keys or not self.lock.acquire(blocking=False):  # the writer is busy: do not stall a step
            return None
        try:
            return self.store.find(keys, head)
        finally:
            self.lock.release()

    def restore(self, image: Image, pages: Sequence[int], pieces: Mapping[str, torch.Tensor]) -> None:
        """Read ``image`` into a lane just opened (``pages``: its row pages, in row order, up to the
        image's position taken; ``pieces``: its state pieces' views): its files
        read by ``READ_THREADS`` threads into one pinned buffer, each copied to the device as soon as
        it is read (while later ones are read), their word sums checked there, then scattered into
        the lane's pages and pieces. Raises ``Refused`` (counted, forgotten) when its files cannot be
        trusted; the lane's memory then holds nothing to use. Every copy is drained before it
        returns or raises."""
        total = image.bytes
        if self.buffer.numel() < total:  # no copy is in flight from it: each restore drains its own
            self.buffer = self.reading.pinned(total)
        host = self.buffer[:total]
        staged = torch.empty(total, dtype=torch.uint8, device=self.pool.buffer.device)
        sizes = [size for _, size in image.blocks] + [image.piece_bytes]

        def copy(at: int, size: int) -> None:
            self.reading.to_device(host[at:at + size], staged[at:at + size])

        def check(expected: list[int]) -> list[int]:
            self.reading.drain()  # every file's bytes are on the device
            return mismatched(staged, sizes, expected)

        self.reading.begin()  # ``staged`` may reuse memory the compute stream's queued work reads
        try:
            with self.lock:
                self.store.read(image, host_bytes(host), self.readers, copy, check)
        finally:
            self.reading.drain()  # the buffer is free again, error or not
        self.reading.end()
        scatter(self.pool, image, staged, pages, pieces)

    def report(self) -> dict[str, object]:
        with self.lock:
            return {**self.store.report(), "writing": self.pending}

    def evict(self) -> int:
        with self.lock:
            return self.store.evict()

    def close(self) -> None:
        """Finish the writes offered, stop the writer and the readers, and settle."""
        self.jobs.put(None)
        self.thread.join()
        self.readers.shutdown()
        self.settle()

    # -- the writer thread ---------------------------------------------------------------------

    def _write_all(self) -> None:
        while (job := self.jobs.get()) is not None:
            try:
                self._write(job)
            except Refused as refused:
                log.info("a learned state stays in memory: %s (%s)", refused, refused.reason)
            except Exception:
                log.exception("writing a learned state failed; it stays in memory")
            finally:
                self.written.put(job.state)

    def _write(self, job: Job) -> None:
        state, image = job.state, job.image
        pages = state_pages(state)
        pieces = sorted(state.pieces.items())

        def write_pieces(writer: Writer) -> None:
            writer.given(self.writes.save(piece_ranges(pieces), writer.write, after=state.ready))

        def write_block(index: int, writer: Writer) -> None:
            start, end = block_rows(image, index)
            ranges = row_ranges(self.pool, pages, start, end)
            writer.given(self.writes.save(ranges, writer.write, after=state.ready))

        with self.lock:  # the device sums what it copies out: the host only writes
            self.store.write(image, write_pieces, write_block, summed=True)


def state_digest(pool: Pool, state: KeptState) -> str:
    """sha256 of a kept state's bytes (its pieces and rows): the identity's probe."""
    digest = hashlib.sha256()
    for part in (*piece_ranges(sorted(state.pieces.items())),
                 *row_ranges(pool, state_pages(state), 0, state.position)):
        digest.update(host_bytes(part.cpu().contiguous()))
    return digest.hexdigest()
