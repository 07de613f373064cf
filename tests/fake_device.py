"""A fake device for the copy layer's error paths: copies are queued, and run only when waited for
(a mark before them, or a drain); copy number ``refuse`` (counting from 1) raises."""

from __future__ import annotations

import torch


class FakeDevice:
    """Copies queued, done only when waited for; copy number ``refuse`` (from 1) raises."""

    def __init__(self, refuse: int | None = None) -> None:
        self.refuse = refuse
        self.queued: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.done = 0  # copies run, in queue order
        self.count = 0
        self.began = self.ended = 0

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.zeros(nbytes, dtype=torch.uint8)

    def begin(self, after: object = None) -> None:
        self.began += 1

    def end(self) -> None:
        self.ended += 1

    def to_host(self, source: torch.Tensor, target: torch.Tensor) -> None:
        self._queue(source, target)

    def to_device(self, source: torch.Tensor, target: torch.Tensor) -> None:
        self._queue(source, target)

    def _queue(self, source: torch.Tensor, target: torch.Tensor) -> None:
        self.count += 1
        if self.count == self.refuse:
            raise RuntimeError(f"copy {self.count} refused")
        self.queued.append((source, target))

    def mark(self) -> object:
        return len(self.queued)

    def wait(self, mark: object) -> None:
        assert isinstance(mark, int)
        while self.done < mark:
            source, target = self.queued[self.done]
            target.copy_(source)
            self.done += 1

    def drain(self) -> None:
        self.wait(len(self.queued))

    @property
    def pending(self) -> int:
        return len(self.queued) - self.done
