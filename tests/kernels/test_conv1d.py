"""The causal conv kernels on a fake pool: values against the torch reference, tails moved exactly,
bytes left untouched, a lane's bits alone and in a batch, and prefill split or row by row."""

from __future__ import annotations

import pytest
import torch

from tfd_kernels import conv1d

ALIGN = 256  # the pool places pieces at multiples of this many bytes
WIDTH = 4
# The interpreter casts fp32 to bf16 by truncation, the GPU to nearest: two bf16 steps apart at most.
TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-6}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}
LENGTHS = [5, 1, 0, 37, 2]  # one lane past a row block, some shorter than the tail
CHANNELS = 300  # a partial channel block


def make_pool(lanes: int, channels: int, dtype: torch.dtype, padding: list[int],
              device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Random bytes with a tail a lane at scattered 256-byte-aligned places (gaps between); the
    tails' element offsets into the dtype's view, -1 for padding lanes."""
    gen = torch.Generator().manual_seed(lanes)
    size, item = (WIDTH - 1) * channels, dtype.itemsize
    slot = (size * item // ALIGN + 2) * ALIGN
    pool = torch.randint(0, 256, (lanes * slot + ALIGN,), dtype=torch.uint8, generator=gen)
    tail_at = (torch.randperm(lanes, generator=gen) * slot + ALIGN) // item
    tail_at[padding] = -1
    view = pool.view(dtype)
    for at in tail_at.tolist():
        if at >= 0:
            view[at:at + size] = torch.randn(size, generator=gen).to(dtype)
    return pool.to(device), tail_at.to(device)


def tensors(rows: int, channels: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, channels, generator=gen).to(dtype).to(device)
    weight = (torch.randn(channels, WIDTH, generator=gen) / 2).to(dtype).to(device)
    return x, weight


def bounds(lengths: list[int], device: str) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)


def check_decode(lanes: int, channels: int, dtype: torch.dtype, device: str) -> None:
    pool, tail_at = make_pool(lanes, channels, dtype, [1], device)
    x, weight = tensors(lanes, channels, dtype, device)
    expected = pool.clone()
    ref = conv1d.reference(x, weight, expected.view(dtype), tail_at)
    out = conv1d.decode(x, weight, pool.view(dtype), tail_at)
    live = tail_at >= 0
    torch.testing.assert_close(out[live], ref[live], **TOL[dtype])
    assert not out[~live].any()
    assert torch.equal(pool, expected)  # tails moved exactly, nothing else touched


def check_prefill(lengths: list[int], channels: int, dtype: torch.dtype, device: str) -> None:
    pool, tail_at = make_pool(len(lengths), channels, dtype, [1], device)
    x, weight = tensors(sum(lengths), channels, dtype, device)
    cu_seqlens = bounds(lengths, device)
    expected = pool.clone()
    ref = conv1d.reference_prefill(x, weight, expected.view(dtype), tail_at, cu_seqlens)
    out = conv1d.prefill(x, weight, pool.view(dtype), tail_at, cu_seqlens, max(lengths))
    live = torch.repeat_interleave(tail_at >= 0, torch.tensor(lengths, device=device))
    torch.testing.assert_close(out[live], ref[live], **TOL[dtype])
    assert not out[~live].any()
    assert torch.equal(pool, expected)


def tail(pool: torch.Tensor, at: torch.Tensor, channels: int, dtype: torch.dtype) -> torch.Tensor:
    return pool.view(dtype)[int(at):int(at) + (WIDTH - 1) * channels]


def check_alone(lengths: list[int], channels: int, dtype: torch.dtype, device: str) -> None:
    """Each lane's output and tail bits, alone and in the batch, by prefill and by decode."""
    pool, tail_at = make_pool(len(lengths), channels, dtype, [], device)
    x, weight = tensors(sum(lengths), channels, dtype, device)
    rows, _ = tensors(len(lengths), channels, dtype, device)
    cu_seqlens = bounds(lengths, device)
    batch, stepped = pool.clone(), pool.clone()
    out = conv1d.prefill(x, weight, batch.view(dtype), tail_at, cu_seqlens, max(lengths))
    step = conv1d.decode(rows, weight, stepped.view(dtype), tail_at)
    for lane, (a, b) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True)):
        alone, single = pool.clone(), pool.clone()
        one = conv1d.prefill(x[a:b], weight, alone.view(dtype), tail_at[lane:lane + 1],
                             bounds([b - a], device), b - a)
        assert torch.equal(one, out[a:b])
        assert torch.equal(tail(alone, tail_at[lane], channels, dtype),
                           tail(batch, tail_at[lane], channels, dtype))
        first = conv1d.decode(rows[lane:lane + 1], weight, single.view(dtype), tail_at[lane:lane + 1])
        assert torch.equal(first[0], step[lane])
        assert torch.equal(tail(single, tail_at[lane], channels, dtype),
                           tail(stepped, tail_at[lane], channels, dtype))


def check_split(rows: int, cut: int, channels: int, dtype: torch.dtype, device: str) -> None:
    """A prefill cut in two, and decode a row at a time, give one prefill's outputs and tail bits."""
    pool, tail_at = make_pool(1, channels, dtype, [], device)
    x, weight = tensors(rows, channels, dtype, device)
    whole = pool.clone()
    out = conv1d.prefill(x, weight, whole.view(dtype), tail_at, bounds([rows], device), rows)
    parts = pool.clone()
    pieces = [conv1d.prefill(x[a:b], weight, parts.view(dtype), tail_at, bounds([b - a], device), b - a)
              for a, b in ((0, cut), (cut, rows))]
    assert torch.equal(torch.cat(pieces), out)
    assert torch.equal(parts, whole)
    steps = pool.clone()
    rowwise = [conv1d.decode(x[r:r + 1], weight, steps.view(dtype), tail_at) for r in range(rows)]
    assert torch.equal(torch.cat(rowwise), out)
    assert torch.equal(steps, whole)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_matches_reference_and_moves_only_live_tails(dtype: torch.dtype) -> None:
    check_decode(4, CHANNELS, dtype, "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_matches_reference_and_moves_only_live_tails(dtype: torch.dtype) -> None:
    check_prefill(LENGTHS, CHANNELS, dtype, "cpu")


def test_a_lane_alone_is_the_lane_in_a_batch() -> None:
    check_alone(LENGTHS, CHANNELS, torch.bfloat16, "cpu")


def test_prefill_split_and_row_by_row_are_one_prefill() -> None:
    check_split(7, 2, CHANNELS, torch.bfloat16, "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_over_the_pool_is_the_lane_conv(dtype: torch.dtype) -> None:
    pool, tail_at = make_pool(1, CHANNELS, dtype, [], "cpu")
    x, weight = tensors(6, CHANNELS, dtype, "cpu")
    at = int(tail_at[0])
    tail = pool.view(dtype)[at:at + (WIDTH - 1) * CHANNELS].view(WIDTH - 1, CHANNELS).clone()
    expected = conv1d.reference_lane(x, weight, tail)
    out = conv1d.reference_prefill(x, weight, pool.view(dtype), tail_at, bounds([6], "cpu"))
    assert torch.equal(out, expected)
    assert torch.equal(pool.view(dtype)[at:at + tail.numel()], tail.flatten())


def test_launchers_name_the_bad_argument() -> None:
    pool, tail_at = make_pool(2, CHANNELS, torch.bfloat16, [], "cpu")
    x, weight = tensors(2, CHANNELS, torch.bfloat16, "cpu")
    view = pool.view(torch.bfloat16)
    with pytest.raises(ValueError, match="weight"):
        conv1d.decode(x, weight[:-1], view, tail_at)
    with pytest.raises(ValueError, match="tails"):
        conv1d.decode(x, weight, pool.view(torch.float16), tail_at)
    with pytest.raises(ValueError, match="tail_at"):
        conv1d.decode(x, weight, view, tail_at.int())
    with pytest.raises(ValueError, match="cu_seqlens"):
        conv1d.prefill(x, weight, view, tail_at, bounds([1, 1], "cpu").long(), 1)


@pytest.mark.gpu
def test_real_sizes_on_gpu() -> None:
    channels = 2 * 16 * 128 + 64 * 128
    check_decode(64, channels, torch.bfloat16, "cuda")
    check_prefill([1, 3, 0, 700, 129, 64, 2, 17], channels, torch.bfloat16, "cuda")
    check_alone([3, 40, 1, 17], channels, torch.bfloat16, "cuda")
    check_split(300, 128, channels, torch.bfloat16, "cuda")


@pytest.mark.gpu
def test_decode_replays_in_a_cuda_graph() -> None:
    channels, lanes, dtype = 8192 + 2 * 2048, 16, torch.bfloat16
    pool, tail_at = make_pool(lanes, channels, dtype, [1], "cuda")
    x, weight = tensors(lanes, channels, dtype, "cuda")
    eager = pool.clone()
    expected = conv1d.decode(x, weight, eager.view(dtype), tail_at)
    conv1d.decode(x, weight, pool.clone().view(dtype), tail_at)  # compiles outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = conv1d.decode(x, weight, pool.view(dtype), tail_at)
    graph.replay()
    assert torch.equal(out, expected)
    assert torch.equal(pool, eager)


def test_rows_of_a_wider_projection_are_read_in_place() -> None:
    # the conv input is the first columns of the GDN projection: its rows sit at the projection's stride
    lengths = [3, 6]
    x, weight = tensors(sum(lengths), CHANNELS, torch.float32, "cpu")
    wide = torch.cat([x, torch.full((x.shape[0], 17), float("nan"))], dim=1)
    for rows, call in ((x.shape[0], "decode"), (len(lengths), "prefill")):
        outs, pools = [], []
        for given in (x, wide[:, :CHANNELS]):
            pool, tail_at = make_pool(rows, CHANNELS, torch.float32, [], "cpu")
            if call == "decode":
                outs.append(conv1d.decode(given, weight, pool.view(torch.float32), tail_at))
            else:
                outs.append(conv1d.prefill(given, weight, pool.view(torch.float32), tail_at,
                                           bounds(lengths, "cpu"), max(lengths)))
            pools.append(pool)
        assert not wide[:, :CHANNELS].is_contiguous()
        assert torch.equal(outs[0], outs[1]) and torch.equal(pools[0], pools[1]), call


def check_verify(lanes: int, rows: int, channels: int, dtype: torch.dtype, device: str) -> None:
    """Verify windows give decode's bits row by row and leave the tails; the rebuild after keeping
    k rows leaves each tail as decoding k rows does; the torch forms agree."""
    tails, tail_at = make_pool(lanes, channels, dtype, [1], device)
    base = tails.numel() // dtype.itemsize  # each lane's window inputs after the tails
    pool = torch.cat((tails, torch.zeros(lanes * rows * channels * dtype.itemsize, dtype=torch.uint8,
                                         device=device)))
    rows_at = torch.where(tail_at >= 0, base + torch.arange(lanes, device=device) * rows * channels, -1)
    x, weight = tensors(lanes * rows, channels, dtype, device)
    view = pool.view(dtype)
    before = pool.clone()
    out = conv1d.verify(x, weight, view, tail_at, rows_at)
    held = before.clone()
    ref = conv1d.reference_verify(x, weight, held.view(dtype), tail_at, rows_at)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    assert torch.equal(pool, held)  # the inputs kept, the tails untouched (bytes: the pool holds NaNs)
    keep = torch.arange(lanes, dtype=torch.int32, device=device) % rows + 1  # every count from 1
    # two layers in one launch (offsets [layers, lanes]): the second a copy of the first past its end
    doubled, shift = torch.cat((pool, pool)), pool.numel() // dtype.itemsize

    def layers(at: torch.Tensor) -> torch.Tensor:
        return torch.stack((at, torch.where(at >= 0, at + shift, -1)))

    conv1d.rebuild(doubled.view(dtype), layers(tail_at), layers(rows_at), keep, WIDTH, channels)
    conv1d.rebuild(view, tail_at, rows_at, keep, WIDTH, channels)
    assert torch.equal(doubled, torch.cat((pool, pool)))
    conv1d.reference_rebuild(held.view(dtype), tail_at, rows_at, keep, WIDTH, channels)
    assert torch.equal(pool, held)
    serial = before.clone()
    for lane, (at, count) in enumerate(zip(tail_at.tolist(), keep.tolist(), strict=True)):
        if at < 0:
            continue
        one = tail_at[lane:lane + 1]
        decoded = [conv1d.decode(x[lane * rows + r:lane * rows + r + 1], weight, serial.view(dtype), one)
                   for r in range(rows)]
        assert torch.equal(torch.cat(decoded), out[lane * rows:(lane + 1) * rows])
        serial = before.clone()
        for r in range(count):
            conv1d.decode(x[lane * rows + r:lane * rows + r + 1], weight, serial.view(dtype), one)
        size = (WIDTH - 1) * channels
        assert torch.equal(serial.view(dtype)[at:at + size], view[at:at + size]), f"lane {lane}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_windows_are_decode_rows_and_the_rebuild_is_the_kept_rows_decoded(dtype: torch.dtype) -> None:
    check_verify(4, 4, CHANNELS, dtype, "cpu")


@pytest.mark.gpu
def test_verify_windows_and_rebuild_on_gpu() -> None:
    check_verify(8, 4, 8192, torch.bfloat16, "cuda")
