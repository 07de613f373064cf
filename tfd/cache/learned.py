"""Learned conversations: kept prompt states written to the disk store, and read back into lanes.

The engine thread ``offer``s each state the prompt cache keeps; a writer thread copies it out
(``tfd.store.copies``, on a stream of its own, after the copies that made it) and writes it to the
``Store``. While a state is being written it is pinned: evicting it from memory only forgets it
there, and its pages are released when the write is done (``settle``, on the engine thread, each
step). At admission the engine thread ``find``s the longest learned state a prompt extends and,
when it is longer than what memory holds, begins reading it back into the lane just opened
(``begin_restore``: its state pieces and its rows on its own pages) and goes on stepping the other
lanes; the lane joins them once the read has ended (``Restoring``): a damaged or missing file is
refused, counted, forgotten, and the lane prefills from the start.

Threads and streams: the store and its files are behind one lock (the writer holds it for a write, the
restore thread for a read back); ``find`` reads the index without it. The engine thread waits for
neither: ``offer`` and ``begin_restore`` only queue. The writer copies out on a stream of its own
through its own staging buffers; a read back runs on the restore thread (one at a time: they share
the pinned buffer), its copies, sums and scatter on a copy stream lent to it from ``streams`` (the
daemon's, made by its trio side at start; else made here, a lane's worth) after the compute stream's
work queued at admission; its files are read by a pool of reader threads. When it ends, what is still
queued on the stream (the scatter; after a failure, copies out of the pinned buffer) goes to
``drains`` (the daemon's trio loop awaits it: ``tfd.engine.drains``; else waited for on the restore
thread), which gives the stream and the buffers back once it is done; the compute stream waits for the
same mark on the device before it touches the lane (``joined``). ``close`` lets the writer finish what
was offered and the reads back end, then stops them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import attrs
import torch

from tfd.cache.image_bytes import block_bytes, image_of, piece_ranges, row_ranges, scatter, state_pages
from tfd.cache.kept import KeptState
from tfd.cache.prefixes import Prefixes
from tfd.pool.pages import Pool
from tfd.store.checksum import mismatched
from tfd.store.copies import Copier, Device, Drain, Streams, TorchDevice, host_bytes
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


@attrs.define
class Restoring:
    """A learned state being read back into a lane (``Learned.begin_restore``)."""

    image: Image
    future: Future[None] = attrs.field(factory=Future, repr=False)
    ready: object = None  # the lent stream's mark after the read's last copy, set before the future ends
    began: float = attrs.field(factory=time.monotonic)  # when it was asked for (monotonic)
    ended: float | None = None  # when its read ended (monotonic), set before the future ends

    def done(self) -> bool:
        """Whether the read has ended: its files read and checked, the scatter into the lane queued on
        its stream (``ready``: what the compute stream waits for, ``Learned.joined``)."""
        return self.future.done()

    def error(self) -> BaseException | None:
        """Why the read failed (None: the state is in the lane); waits for the read to end."""
        return self.future.exception()


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
                 make_device: Callable[[torch.device], Device] = TorchDevice, context: int = 0,
                 lanes: int = 1, streams: Streams | None = None,
                 drains: Callable[[Drain], None] = Drain.wait_and_release) -> None:
        self.store = store
        self.pool = pool
        self.lock = threading.Lock()
        self.writes = Copier(make_device(device))
        # a copy stream for each lane that may read a state back at once: the daemon's, else made here
        self.streams = streams if streams is not None else Streams(lambda: make_device(device), lanes)
        self.drains = drains  # a read back's copies still queued: awaited there, then its buffers go back
        # reads land here, pinned; sized at load for a state of ``context`` rows: pinning a gigabyte
        # takes long enough that the first read after a restart should not wait for it
        empty = torch.empty(0, dtype=torch.uint8)
        self.buffer = self.writes.device.pinned(reserve(pool, context)) if context else empty
        self.buffer_free = threading.Lock()  # held from a read's start until its drain released it
        self.readers = ThreadPoolExecutor(READ_THREADS, "tfd-learn-read")
        # reads back run here, one at a time (they share the pinned buffer), never on the engine thread
        self.restorer = ThreadPoolExecutor(1, "tfd-learn-restore")
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

    def settle(self, least: Callable[[Sequence[int]], list[int]] | None = None) -> None:
        """Unpin the states written since; release those evicted meanwhile. ``least`` (tensor parallel):
        only as many as every rank has written (each writes its offers in the same order), so their
        pages come free at the same step on every rank."""
        count = self.written.qsize()  # this thread alone takes from it: as many are there to take
        for _ in range(count if least is None else least([count])[0]):
            state = self.written.get_nowait()
            self.pending -= 1
            state.writing = False
            if state.dropped:
                state.hold.release()

    def find(self, prompt: Prefixes, head: bool, longer_than: int = 0) -> Image | None:
        """The longest learned state ``prompt`` extends past, longer than ``longer_than`` tokens
        (with the head's rows when ``head``)."""
        keys = [state_key(*key) for key in prompt.resume_keys(longer_than)]
        # without the lock, which a write or a read back holds for seconds: the index's lookups are
        # atomic, and a state forgotten meanwhile is refused by its read (the lane starts fresh)
        return self.store.find(keys, head) if keys else None

    def begin_restore(self, image: Image, pages: Sequence[int], pieces: Mapping[str, torch.Tensor],
                      done: Callable[[], None] = lambda: None) -> Restoring:
        """Start reading ``image`` into a lane just opened (``pages``: its row pages, in row order, up
        to the image's position taken; ``pieces``: its state pieces' views) and return at once; the
        lane's pages and pieces are the read's until ``Restoring.done``, and the compute stream's
        work on them waits for ``Restoring.ready`` (``joined``). On the restore thread, on a copy
        stream lent to this read (after the compute stream's work queued now): its files read by
        ``READ_THREADS`` threads into the pinned buffer, each copied to the device as soon as it is
        read, their word sums checked there, then scattered into the lane. Whatever happens, what is
        still queued on the stream then goes to ``drains`` with the stream and the buffers it uses,
        which go back once it is done. ``done`` is called once the read has ended (from the restore
        thread). Its error (``Restoring.error``): ``Refused`` (counted, forgotten) when the files
        cannot be trusted, or what a failed copy raised; the lane's memory then holds nothing to use."""
        restoring = Restoring(image)
        restoring.future.add_done_callback(lambda _: done())
        self.restorer.submit(self._restore, restoring, pages, pieces, self.writes.device.now())
        return restoring

    def joined(self, restoring: Restoring) -> None:
        """The compute stream's next work sees what ``restoring`` wrote (engine thread, once it is done):
        before the lane runs, or its pages go back or its pieces are made again."""
        self.writes.device.join(restoring.ready)

    def _restore(self, restoring: Restoring, pages: Sequence[int], pieces: Mapping[str, torch.Tensor],
                 after: object) -> None:
        """``begin_restore``'s work, on the restore thread (``after``: the compute stream's mark then)."""
        device = self.streams.lend()
        self.buffer_free.acquire()  # the last read's copies out of the pinned buffer are done
        image, staged = restoring.image, None
        try:
            total = image.bytes
            if self.buffer.numel() < total:
                self.buffer = device.pinned(total)
            host = self.buffer[:total]
            sizes = [size for _, size in image.blocks] + [image.piece_bytes]
            device.begin(after)  # the lane's pages may be ones the compute stream's queued work still reads
            with device.streamed():
                staged = device.buffer(total)

                def copy(at: int, size: int) -> None:
                    device.to_device(host[at:at + size], staged[at:at + size])

                def check(expected: list[int]) -> list[int]:
                    device.drain()  # every file's bytes are on the device
                    return mismatched(staged, sizes, expected)

                with self.lock:
                    self.store.read(image, host_bytes(host), self.readers, copy, check)
                scatter(self.pool, image, staged, pages, pieces)
        except BaseException as caught:  # the lane's (Restoring.error), once what is queued is handed on
            error: BaseException | None = caught
        else:
            error = None
        restoring.ready = device.mark()
        held = [staged]  # the staging buffer lives until the copies out of it are done

        def release() -> None:
            held.clear()
            self.buffer_free.release()
            self.streams.give_back(device)

        try:
            self.drains(Drain(device, restoring.ready, release))
        finally:
            restoring.ended = time.monotonic()
            if error is not None:
                restoring.future.set_exception(error)
            else:
                restoring.future.set_result(None)

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
        self.restorer.shutdown()  # reads back in progress end first: they use the readers
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
