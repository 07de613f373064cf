"""Dense attention's prompt rows of many lanes in one pass: each lane's bits as alone, and the
values of softmax attention over its cached prefix and its own rows."""

from __future__ import annotations

import torch

from tfd.model.attention import AttentionWeights, attend, attention_spans, project
from tfd.model.memory import LaneMemory, PromptLanes, Span
from tfd.model.rope import Rotary

HEADS, KV_HEADS, DIM, HIDDEN, PAGE_ROWS, PAGES = 4, 2, 16, 32, 16, 12


def weights() -> AttentionWeights:
    g = torch.Generator().manual_seed(0)
    width = HEADS * 2 * DIM + 2 * KV_HEADS * DIM
    return AttentionWeights(qkv=torch.randn(width, HIDDEN, generator=g) / HIDDEN ** 0.5,
                            o=torch.randn(HIDDEN, HEADS * DIM, generator=g) / (HEADS * DIM) ** 0.5,
                            q_norm=torch.randn(DIM, generator=g) * 0.1,
                            k_norm=torch.randn(DIM, generator=g) * 0.1,
                            heads=HEADS, kv_heads=KV_HEADS, head_dim=DIM, eps=1e-6)


def caches() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    shape = (PAGES + 1, PAGE_ROWS, KV_HEADS, DIM)  # the last page is the null page
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def lanes_of(spans: list[Span]) -> PromptLanes:
    return PromptLanes.of(spans, [], torch.zeros(256, dtype=torch.uint8), PAGE_ROWS, PAGES, torch.float32)


def test_many_lanes_in_one_pass_equal_each_alone_and_attend_their_prefix() -> None:
    w, rotary = weights(), Rotary.of(DIM, 0.5, 10_000.0)
    tables = [torch.tensor(pages, dtype=torch.int32) for pages in ([3, 0, 7], [5, 9], [1, 2, 4, 6])]
    starts, lengths = (20, 0, 33), (21, 17, 20)  # a cached prefix of 20 and 33 rows; lane 1 starts fresh
    spans = [Span(LaneMemory({}, table), start, torch.zeros(n, dtype=torch.long))
             for table, start, n in zip(tables, starts, lengths, strict=True)]
    x = torch.randn(sum(lengths), HIDDEN, generator=torch.Generator().manual_seed(2))
    keys, values = caches()
    together = attention_spans(w, x, lanes_of(spans), keys, values, rotary)
    stored = keys.clone(), values.clone()
    at = 0
    for span, n in zip(spans, lengths, strict=True):
        alone_keys, alone_values = caches()
        alone = attention_spans(w, x[at:at + n], lanes_of([span]), alone_keys, alone_values, rotary)
        assert torch.equal(together[at:at + n], alone)
        # the lane's cache: its prefix as it was, its new rows where its page table puts them
        rows = torch.arange(span.end)
        places = span.lane.page_table[rows // PAGE_ROWS].long(), rows % PAGE_ROWS
        lane_keys, lane_values = stored[0][places], stored[1][places]
        assert torch.equal(lane_keys, alone_keys[places]) and torch.equal(lane_values, alone_values[places])
        cos, sin = rotary.angles(torch.arange(span.start, span.end), x.dtype)
        p = project(w, x[at:at + n], cos, sin, rotary)
        seen = [span.start + i + 1 for i in range(n)]
        want = torch.stack([attend(p.query[i], lane_keys[:seen[i]], lane_values[:seen[i]], DIM ** -0.5)
                            for i in range(n)])
        gated = torch.sigmoid(p.gate.reshape(n, -1)) * want.reshape(n, -1)
        assert torch.allclose(alone, gated @ w.o.T, rtol=1e-4, atol=1e-5)
        at += n
