"""The pool's pinned ring for page ids (``tfd.pool.staging``): what lands on the device is what was
written, while copies are still queued behind slow work when the ring wraps over their runs, for a
write that fits the ring whole, one that fits only from its start, and one longer than the ring."""

from __future__ import annotations

import pytest
import torch

from tfd.pool.staging import HostStaging

pytestmark = pytest.mark.gpu


def test_every_write_lands_whole_while_the_ring_wraps_over_queued_copies() -> None:
    ring = HostStaging(8)
    # lengths: 3 + 3 then 3 wraps to 0 over the first run; 8 fills the ring whole; 9 is longer than it
    lengths = [3, 3, 3, 2, 8, 1, 9, 5, 4]
    dests = [torch.full((n,), -1, dtype=torch.int32, device="cuda") for n in lengths]
    expected = []
    for i, (n, dest) in enumerate(zip(lengths, dests, strict=True)):
        torch.cuda._sleep(2_000_000)  # the copy waits behind ~1 ms of work: still queued at the next write
        values = list(range(100 * i, 100 * i + n))
        ring.write(dest, values)
        expected.append(values)
    torch.cuda.synchronize()
    assert [dest.tolist() for dest in dests] == expected
    assert ring.at == 4  # the long write took torch's cache; 5 from 1 after it, then 4 wrapped to 0


def test_a_write_names_a_destination_it_cannot_fill() -> None:
    ring = HostStaging(8)
    with pytest.raises(ValueError, match=r"dest is torch\.int64"):
        ring.write(torch.zeros(2, dtype=torch.int64, device="cuda"), [1, 2])
    with pytest.raises(ValueError, match=r"expected int32 \[3\]"):
        ring.write(torch.zeros(2, dtype=torch.int32, device="cuda"), [1, 2, 3])
    with pytest.raises(ValueError, match="on a CUDA device"):
        ring.write(torch.zeros(2, dtype=torch.int32), [1, 2])
