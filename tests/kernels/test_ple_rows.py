"""Flash Next's PLE at decode rows in two launches against the torch path they replace
(``tfd.model.ple``): the same table rows and the same conv bits, each history and tail moved past
its row in the pool, a padding lane storing nothing."""

from __future__ import annotations

import attrs
import pytest
import torch

from tfd.model import ple
from tfd.model.ple import PleWeights
from tfd_kernels import ple_rows

EOS = 7
PER = 3  # heads an n-gram size


def weights(n: int, kernel: int = 4, dilation: int = 2, channels: int = 8) -> PleWeights:
    """Only the hash's and the conv's fields matter here. Multipliers near 2^62: the products wrap,
    some negative, so the remainder's sign rule is met."""
    sizes = torch.tensor([101, 103, 107, 109, 113, 127, 131, 137, 139][:(n - 1) * PER])
    offsets = torch.cumsum(sizes, 0) - sizes
    g = torch.Generator().manual_seed(n)
    conv = torch.randn(channels, kernel, generator=g)
    multipliers = (4611686018427387847, 3074457345618258599, 2305843009213693907, 1537228672809129217)[:n]
    return PleWeights(key=conv, value=conv, norm_key=conv, norm_query=conv, norm_conv=conv, conv=conv,
                      table=conv, multipliers=multipliers, sizes=sizes, offsets=offsets, heads_per_ngram=PER,
                      eos=EOS, dilation=dilation, streams=1, width=channels, eps=1e-6)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_table_rows_and_the_moved_histories_are_the_torch_paths(n: int) -> None:
    w, kept = weights(n), n - 1
    # lanes: a history without EOS, EOS as the latest id, as the oldest, all EOS, and a padding lane
    histories = torch.tensor([[3, 4, 5], [3, 4, EOS], [EOS, 4, 5], [EOS, EOS, EOS]])[:, 3 - kept:]
    pool = torch.full((40,), -5, dtype=torch.int64)
    at = torch.tensor([0, 10, 20, 30, -1])
    for lane, row in enumerate(histories):
        pool[at[lane]:at[lane] + kept] = row
    tokens = torch.tensor([9, 2, EOS, 1234567, 5])
    got_pool = pool.clone()
    got = ple_rows.ngram(tokens, got_pool, at, w.multipliers, w.sizes, w.offsets, EOS)
    history = torch.cat((histories, torch.full((1, kept), EOS)))  # the padding lane's: EOS
    assert torch.equal(got, ple.ngram_rows(w, history, tokens))
    assert (tokens * w.multipliers[0] < 0).any()  # wrapped products: the remainder's sign rule is met
    want_pool = pool.clone()
    for lane in range(4):
        want_pool[at[lane]:at[lane] + kept] = torch.cat((history[lane, 1:], tokens[lane:lane + 1]))
    assert torch.equal(got_pool, want_pool)  # the padding lane stored nothing


@pytest.mark.parametrize(("kernel", "dilation"), [(2, 1), (4, 2), (3, 3)])
@pytest.mark.parametrize("channels", [8, 1100])  # within one program's block; past it
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_conv_and_the_moved_tails_are_the_torch_paths(kernel: int, dilation: int, channels: int,
                                                          dtype: torch.dtype) -> None:
    w = weights(3, kernel, dilation, channels)
    w = attrs.evolve(w, conv=w.conv.to(dtype))
    taps, lanes = w.taps, 3
    g = torch.Generator().manual_seed(kernel * dilation)
    tails = torch.randn(lanes * taps * channels + 64, generator=g).to(dtype)
    at = torch.tensor([64 + taps * channels, 64, -1])  # the padding lane reads the pool's first elements
    normed = torch.randn(lanes, channels, generator=g).to(dtype)
    got_tails = tails.clone()
    got = ple_rows.conv(normed, got_tails, at, w.conv, dilation)
    span = torch.arange(taps * channels)
    tail = tails[at.clamp_min(0)[:, None] + span].view(lanes, taps, channels)
    window = torch.cat((tail, normed[:, None]), 1)
    # the padding lane's row is not used (it may read a tail another program is moving)
    assert torch.equal(got[:2], ple._conv(w, window)[:2, 0])
    want_tails = tails.clone()
    for lane in range(2):
        want_tails[at[lane]:at[lane] + taps * channels] = window[lane, 1:].flatten()
    assert torch.equal(got_tails, want_tails)


def test_inputs_that_do_not_fit_are_refused_by_name() -> None:
    w = weights(3)
    with pytest.raises(ValueError, match="n-grams of 5"):
        ple_rows.ngram(torch.zeros(2, dtype=torch.long), torch.zeros(8, dtype=torch.long),
                       torch.zeros(2, dtype=torch.long), (1, 2, 3, 4, 5), torch.ones(8, dtype=torch.long),
                       torch.zeros(8, dtype=torch.long), EOS)
    with pytest.raises(ValueError, match=r"history_at torch\.int32"):
        ple_rows.ngram(torch.zeros(2, dtype=torch.long), torch.zeros(8, dtype=torch.long),
                       torch.zeros(2, dtype=torch.int32), w.multipliers, w.sizes, w.offsets, EOS)
    with pytest.raises(ValueError, match=r"weight \[8, 1\]"):
        ple_rows.conv(torch.zeros(2, 8), torch.zeros(64), torch.zeros(2, dtype=torch.long), torch.zeros(8, 1),
                      1)


@pytest.mark.gpu
def test_on_the_gpu_the_conv_and_the_ids_are_the_torch_paths_bits() -> None:
    """Flash Next's 10,240 channels in bf16, kernel 4 and dilation 3; the ids with its multipliers'
    size: what the span path computes with torch on the same device."""
    w = weights(3, 4, 3, 10240)
    w = attrs.evolve(w, conv=w.conv.bfloat16().cuda(), sizes=w.sizes.cuda(), offsets=w.offsets.cuda())
    lanes, taps = 5, w.taps
    g = torch.Generator().manual_seed(1)
    tails = torch.randn(lanes * taps * 10240, generator=g).bfloat16().cuda()
    at = (torch.arange(lanes) * taps * 10240).cuda()
    at[2] = -1
    normed = torch.randn(lanes, 10240, generator=g).bfloat16().cuda()
    got_tails = tails.clone()
    got = ple_rows.conv(normed, got_tails, at, w.conv, 3)
    span = torch.arange(taps * 10240, device="cuda")
    window = torch.cat((tails[at.clamp_min(0)[:, None] + span].view(lanes, taps, 10240), normed[:, None]), 1)
    live = at >= 0
    assert torch.equal(got[live], ple._conv(w, window)[live, 0])
    tokens = torch.tensor([9, 2, EOS, 1234567, 5], device="cuda")
    pool = torch.tensor([3, 4, 5, EOS, EOS, 4, 1, 2, 3, 4], device="cuda")
    ids = ple_rows.ngram(tokens, pool.clone(), torch.tensor([0, 2, 4, 6, -1], device="cuda"), w.multipliers,
                         w.sizes, w.offsets, EOS)
    history = torch.stack([pool[0:2], pool[2:4], pool[4:6], pool[6:8], torch.full((2,), EOS, device="cuda")])
    assert torch.equal(ids, ple.ngram_rows(w, history, tokens))
