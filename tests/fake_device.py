"""A fake device for the copy layer's error paths: work is queued, and runs only when waited for (a
mark before it, or a drain); copy number ``refuse`` (counting from 1; a gather is a copy) raises."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence

import torch

from tfd.store.checksum import word_sum


class FakeDevice:
    """Work queued, done only when waited for; copy number ``refuse`` (from 1) raises."""

    def __init__(self, refuse: int | None = None) -> None:
        self.refuse = refuse
        self.queued: list[Callable[[], None]] = []
        self.done = 0  # queued work run, in queue order
        self.count = 0  # copies asked for
        self.began = self.ended = 0
        self.joined: list[object] = []  # marks the compute stream was made to wait for
        self.waiters: list[str] = []  # the threads that waited for this device's work, by name

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.zeros(nbytes, dtype=torch.uint8)

    def buffer(self, nbytes: int) -> torch.Tensor:
        return torch.zeros(nbytes, dtype=torch.uint8)

    def begin(self, after: object = None) -> None:
        self.began += 1

    def end(self) -> None:
        self.ended += 1

    def join(self, mark: object) -> None:
        self.joined.append(mark)

    def gather(self, sources: Sequence[torch.Tensor], target: torch.Tensor) -> None:
        parts = list(sources)
        self._copy(lambda: torch.cat(parts, out=target))

    def word_sum(self, data: torch.Tensor, first_word: int) -> Callable[[], int]:
        found: list[int] = []
        self.queued.append(lambda: found.append(word_sum(data, first_word)))

        def total() -> int:
            assert found, "a word sum read before the work that makes it ran"
            return found[0]

        return total

    def to_host(self, source: torch.Tensor, target: torch.Tensor) -> None:
        self._copy(lambda: target.copy_(source))

    def to_device(self, source: torch.Tensor, target: torch.Tensor) -> None:
        self._copy(lambda: target.copy_(source))

    def streamed(self) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext()  # the CPU's work runs where it is called

    def now(self) -> object:
        return None

    def _copy(self, work: Callable[[], object]) -> None:
        self.count += 1
        if self.count == self.refuse:
            raise RuntimeError(f"copy {self.count} refused")

        def run() -> None:
            work()

        self.queued.append(run)

    def mark(self) -> object:
        return len(self.queued)

    def wait(self, mark: object) -> None:
        assert isinstance(mark, int)
        self.waiters.append(threading.current_thread().name)
        while self.done < mark:
            self.queued[self.done]()
            self.done += 1

    def drain(self) -> None:
        self.wait(len(self.queued))

    @property
    def pending(self) -> int:
        return len(self.queued) - self.done
