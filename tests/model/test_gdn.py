"""GDN's two arithmetics agree: chunked prefill and row-by-row recurrence, from any state."""

from __future__ import annotations

import torch

from tfd.model.gdn import CHUNK, GdnWeights, PromptLanes, gdn, gdn_chunks, gdn_spans
from tfd.model.memory import LaneMemory, Span

KEY_HEADS, VALUE_HEADS, DIM, HIDDEN, KERNEL = 2, 4, 16, 48, 4


def weights() -> GdnWeights:
    g = torch.Generator().manual_seed(0)
    channels = 2 * KEY_HEADS * DIM + VALUE_HEADS * DIM

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) / shape[-1] ** 0.5

    proj = torch.cat((rand(channels, HIDDEN), rand(VALUE_HEADS * DIM, HIDDEN), rand(VALUE_HEADS, HIDDEN),
                      rand(VALUE_HEADS, HIDDEN)))
    return GdnWeights(proj=proj, conv=rand(channels, KERNEL),
                      a_log=torch.rand(VALUE_HEADS, generator=g), dt_bias=torch.zeros(VALUE_HEADS),
                      norm=torch.ones(DIM), out=rand(HIDDEN, VALUE_HEADS * DIM), key_heads=KEY_HEADS,
                      value_heads=VALUE_HEADS, key_dim=DIM, value_dim=DIM, activation="silu", eps=1e-6)


def fresh() -> tuple[torch.Tensor, torch.Tensor]:
    channels = 2 * KEY_HEADS * DIM + VALUE_HEADS * DIM
    return torch.zeros(VALUE_HEADS, DIM, DIM), torch.zeros(KERNEL - 1, channels)


def test_chunked_and_recurrent_agree_across_chunk_boundaries() -> None:
    w = weights()
    x = torch.randn(3 * CHUNK + 17, HIDDEN, generator=torch.Generator().manual_seed(1))
    chunk_state, chunk_tail = fresh()
    row_state, row_tail = fresh()
    start = 5  # not chunk-aligned: the first chunk is short
    chunked = gdn(w, x, chunk_state, chunk_tail, start, decode=False)
    rows = gdn(w, x, row_state, row_tail, start, decode=True)
    torch.testing.assert_close(chunked, rows, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(chunk_state, row_state, rtol=1e-4, atol=1e-5)
    assert torch.equal(chunk_tail, row_tail)  # the conv tail is the same arithmetic either way


def test_prefill_split_at_chunk_multiples_is_bit_equal() -> None:
    w = weights()
    x = torch.randn(2 * CHUNK + 9, HIDDEN, generator=torch.Generator().manual_seed(2))
    one_state, one_tail = fresh()
    whole = gdn(w, x, one_state, one_tail, 0, decode=False)
    split_state, split_tail = fresh()
    parts = [gdn(w, x[a:b], split_state, split_tail, a, decode=False)
             for a, b in ((0, CHUNK), (CHUNK, 2 * CHUNK), (2 * CHUNK, x.shape[0]))]
    assert torch.equal(torch.cat(parts), whole)
    assert torch.equal(split_state, one_state)


def test_the_prompt_kernels_agree_with_the_torch_chunks() -> None:
    """``gdn_chunks`` (Triton, here in the interpreter) against the torch span path, from a state
    and tail that earlier rows left, at an unaligned start; the state and tail move alike."""
    w = weights()
    x = torch.randn(90, HIDDEN, generator=torch.Generator().manual_seed(5))
    state, tail = fresh()
    gdn(w, x[:37], state, tail, 0, decode=False)
    kernel_state, kernel_tail = state.clone(), tail.clone()
    want = gdn(w, x[37:], state, tail, 37, decode=False)
    got = gdn_chunks(w, x[37:], kernel_state, kernel_tail, 37)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    assert torch.allclose(kernel_state, state, rtol=1e-4, atol=1e-5)
    assert torch.equal(kernel_tail, tail)


def test_prompt_rows_of_many_lanes_in_one_pass_equal_each_lane_alone() -> None:
    """``gdn_spans`` over three lanes' prompt rows (states and tails at offsets in one buffer, as in
    the pool) gives each lane the bits ``gdn_chunks`` gives it alone, and moves each lane's state
    and tail alike."""
    w = weights()
    channels = 2 * KEY_HEADS * DIM + VALUE_HEADS * DIM
    state_size, tail_size = VALUE_HEADS * DIM * DIM, (KERNEL - 1) * channels
    buffer = torch.zeros(3 * 4 * (state_size + tail_size) + 1024, dtype=torch.uint8)
    generator = torch.Generator().manual_seed(8)
    lanes, alone = [], []
    for lane in range(3):
        at = lane * 4 * (state_size + tail_size) + 256  # 256-byte aligned, as pool pieces are
        state = buffer[at:at + 4 * state_size].view(torch.float32).view(VALUE_HEADS, DIM, DIM)
        tail = buffer[at + 4 * state_size:at + 4 * (state_size + tail_size)].view(torch.float32)
        state.copy_(torch.randn(state.shape, generator=generator) * 0.1)
        tail.copy_(torch.randn(tail.shape, generator=generator))
        lanes.append(LaneMemory({"g.state": state, "g.conv_tail": tail.view(KERNEL - 1, channels)},
                                torch.tensor([2 * lane, 2 * lane + 1], dtype=torch.int32)))
        alone.append((state.clone(), tail.clone().view(KERNEL - 1, channels)))
    starts, lengths = (0, 37, 64), (70, 30, 5)  # unaligned and aligned starts, a short lane
    spans = [Span(lane, start, torch.zeros(n, dtype=torch.long))
             for lane, start, n in zip(lanes, starts, lengths, strict=True)]
    x = torch.randn(sum(lengths), HIDDEN, generator=generator)
    together = gdn_spans(w, x, PromptLanes.of(spans, ["g"], buffer, 64, 0, torch.float32), "g")
    at = 0
    for (state, tail), start, n, lane in zip(alone, starts, lengths, lanes, strict=True):
        want = gdn_chunks(w, x[at:at + n], state, tail, start)
        assert torch.equal(together[at:at + n], want)
        assert torch.equal(lane.pieces["g.state"], state) and torch.equal(lane.pieces["g.conv_tail"], tail)
        at += n
