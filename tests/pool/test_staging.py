"""The device's pinned ring (``tfd.pool.staging``): what lands on the device is what was written,
while copies are still queued behind slow work when the ring wraps over their runs, for a write that
fits the ring where it stands, one that fits only from its start, one the ring's whole size and one
longer than it; a host tensor may change once ``put`` returns; a copy asked for while a graph
captures is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tfd.model.memory import to_device
from tfd.pool.staging import ALIGN, HostStaging, ring_for

pytestmark = pytest.mark.gpu


def test_every_write_lands_whole_while_the_ring_wraps_over_queued_copies() -> None:
    ring = HostStaging(32)  # 8 int32 ids
    # ids: 3 (run 0..12, next at 16) + 3 (16..28, next at 32) then 3 wraps to 0 over the first run;
    # 8 fills the ring whole; 9 is longer than it
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
    assert ring.at == 16  # the long write took torch's cache; 5 ids wrapped to 0 (-> 32), then 4 to 0 (-> 16)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.bfloat16, torch.bool])
def test_a_tensor_put_lands_whole_and_may_change_at_once(dtype: torch.dtype) -> None:
    ring = HostStaging(64)
    shapes = [(3,), (2, 5), (), (64 // torch.empty((), dtype=dtype).element_size(),), (4, 9), (1, 2)]
    dests, expected = [], []
    for i, shape in enumerate(shapes):
        held = (torch.arange(max(1, torch.Size(shape).numel())) + 7 * i).reshape(shape).to(dtype)
        dest = torch.empty(shape, dtype=dtype, device="cuda")
        torch.cuda._sleep(2_000_000)
        ring.put(held, dest)
        expected.append(held.clone())
        held.fill_(0)  # the caller's tensor is free again once put returns
        dests.append(dest)
    torch.cuda.synchronize()
    for dest, want in zip(dests, expected, strict=True):
        assert torch.equal(dest.cpu(), want)
    assert ring.at % ALIGN == 0


def test_to_device_goes_through_the_ring_and_leaves_pinned_tensors_as_they_are() -> None:
    ring = ring_for(torch.device("cuda"))
    before = ring.at
    held = torch.arange(10, dtype=torch.int64)
    on = to_device(held, torch.device("cuda"))
    held += 1
    assert on.cpu().tolist() == list(range(10))
    assert ring.at != before or len(ring.reading) > 0
    pinned = torch.arange(6, dtype=torch.int32).pin_memory()
    at = ring.at
    assert to_device(pinned, torch.device("cuda")).cpu().tolist() == list(range(6))
    assert ring.at == at  # a pinned tensor is copied from where it is


def test_a_copy_asked_for_while_a_graph_captures_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    ring = HostStaging(64)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    dest = torch.zeros(4, dtype=torch.int64, device="cuda")
    with pytest.raises(RuntimeError, match="cannot be captured"):
        ring.put(torch.arange(4, dtype=torch.int64), dest)
    with pytest.raises(RuntimeError, match="cannot be captured"):
        ring.write(torch.zeros(2, dtype=torch.int32, device="cuda"), [1, 2])
    assert ring.at == 0 and not ring.reading


def test_a_write_names_a_destination_it_cannot_fill() -> None:
    ring = HostStaging(32)
    with pytest.raises(ValueError, match=r"dest is torch\.int64"):
        ring.write(torch.zeros(2, dtype=torch.int64, device="cuda"), [1, 2])
    with pytest.raises(ValueError, match=r"expected int32 \[3\]"):
        ring.write(torch.zeros(2, dtype=torch.int32, device="cuda"), [1, 2, 3])
    with pytest.raises(ValueError, match="on a CUDA device"):
        ring.write(torch.zeros(2, dtype=torch.int32), [1, 2])
    with pytest.raises(ValueError, match=r"expected a contiguous torch\.int64 \[2\]"):
        ring.put(torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="held must be a host tensor"):
        ring.put(torch.zeros(2, device="cuda"), torch.zeros(2, device="cuda"))


def test_many_writes_land_each_in_its_table_in_one_copy() -> None:
    ring = HostStaging(64)
    lengths = [3, 1, 16, 5]  # the last two past the ring's 16 ids together: their joined copy is torch's
    dests = [torch.full((n + 2,), -1, dtype=torch.int32, device="cuda") for n in lengths]
    items = [(dest[1:1 + n], np.arange(10 * i, 10 * i + n, dtype=np.int32))
             for i, (n, dest) in enumerate(zip(lengths, dests, strict=True))]
    torch.cuda._sleep(2_000_000)  # still queued when the host moves on
    ring.write_many(items[:2])
    ring.write_many(items[2:])
    torch.cuda.synchronize()
    for (n, dest), (_, values) in zip(zip(lengths, dests, strict=True), items, strict=True):
        assert dest.tolist() == [-1, *values.tolist(), -1], n
    with pytest.raises(ValueError, match="expected int32 \\[2\\]"):
        ring.write_many([(dests[0][:3], np.zeros(2, dtype=np.int32))])
