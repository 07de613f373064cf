"""PLE for one row of many lanes at once (the batched decode step) against each lane's span path:
the same values and the same tails and n-gram histories in the pool, the EOS cut included."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch

from tfd.families.lane_state import PleState
from tfd.model.memory import element_offset
from tfd.model.ple import PleWeights, ngram_ids, ngram_rows, ple, ple_rows
from tfd.pool.layout import Layout
from tfd.pool.pages import Pool

STREAMS, WIDTH, EMBED, KERNEL, DILATION, EOS = 2, 4, 8, 4, 2, 7
SIZES = (11, 13, 17, 19)  # two bigram heads, two trigram heads


def weights() -> PleWeights:
    g = torch.Generator().manual_seed(0)
    wide = STREAMS * WIDTH

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) / 2

    offsets = [sum(SIZES[:i]) for i in range(len(SIZES))]
    return PleWeights(key=draw(wide, EMBED), value=draw(WIDTH, EMBED), norm_key=draw(wide),
                      norm_query=draw(wide), norm_conv=draw(wide), conv=draw(wide, KERNEL),
                      table=draw(sum(SIZES), EMBED // len(SIZES)),
                      multipliers=(1009, 2003, 4001), sizes=torch.tensor(SIZES),
                      offsets=torch.tensor(offsets), heads_per_ngram=2, eos=EOS, dilation=DILATION,
                      streams=STREAMS, width=WIDTH, eps=1e-6)


def lanes(count: int) -> tuple[Pool, list[Mapping[str, torch.Tensor]]]:
    state = PleState(STREAMS * WIDTH, (KERNEL - 1) * DILATION, 2, "float32")
    pool = Pool(Layout(16, [], state.pieces()), 4 * count)
    opened = []
    for lane in range(count):
        lease = pool.promise(1)
        pieces = lease.take_state()
        tail = pieces["ple.tail"]
        tail.copy_(torch.randn(tail.shape, generator=torch.Generator().manual_seed(lane)))
        opened.append(pieces)
    return pool, opened


@pytest.mark.parametrize("history", [[3, 4], [EOS, 4], [3, EOS], [EOS, EOS]])
def test_one_row_hashes_as_the_span_path(history: list[int]) -> None:
    w, tokens = weights(), torch.tensor([5, EOS, 9])
    before = torch.tensor(history)
    want = ngram_ids(w, before, tokens)[0]
    assert torch.equal(ngram_rows(w, before[None], tokens[:1])[0], want)


def test_a_decode_step_of_many_lanes_equals_each_lane_alone() -> None:
    """Four lanes with different histories (EOS among them) and a padding lane in the middle,
    three steps: each lane's output and the pool's bytes as when each lane runs on its own."""
    w = weights()
    histories = [[3, 4], [EOS, 5], [6, EOS], [EOS, EOS]]
    steps = torch.tensor([[9, EOS, 12, 2], [EOS, 8, 1, 5], [4, 4, EOS, 3]])  # a row of tokens a step
    (alone_pool, alone), (batch_pool, batched) = lanes(4), lanes(4)
    for pieces, history in zip(alone + batched, histories * 2, strict=True):
        pieces["ple.history"].copy_(torch.tensor(history))
    padding = 1
    tail_at = torch.tensor([element_offset(batch_pool.buffer, p["ple.tail"]) for p in batched])
    history_at = torch.tensor([element_offset(batch_pool.buffer, p["ple.history"]) for p in batched])
    tail_at = torch.cat((tail_at[:padding], torch.tensor([-1]), tail_at[padding:]))
    history_at = torch.cat((history_at[:padding], torch.tensor([-1]), history_at[padding:]))
    for step, tokens in enumerate(steps):
        stack = torch.randn(4, STREAMS * WIDTH, generator=torch.Generator().manual_seed(100 + step))
        want = torch.cat([ple(w, stack[i:i + 1], tokens[i:i + 1], p["ple.tail"], p["ple.history"])
                          for i, p in enumerate(alone)])
        padded_stack = torch.cat((stack[:padding], torch.randn(1, STREAMS * WIDTH), stack[padding:]))
        padded_tokens = torch.cat((tokens[:padding], torch.tensor([EOS]), tokens[padding:]))
        got = ple_rows(w, padded_stack, padded_tokens, batch_pool.buffer.view(torch.float32), tail_at,
                       batch_pool.buffer.view(torch.int64), history_at)
        assert torch.equal(torch.cat((got[:padding], got[padding + 1:])), want)
        assert torch.equal(batch_pool.buffer, alone_pool.buffer)
