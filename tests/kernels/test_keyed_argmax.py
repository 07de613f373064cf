"""The one-pass keyed Gumbel-max kernel draws what the torch form draws, row by row."""

from __future__ import annotations

import pytest
import torch
from keyed_noise import seed_hashing_to

from tfd.engine import grammar_masks
from tfd.engine.sampling import draw
from tfd_kernels import sampling
from tfd_kernels.sampling import BLOCK, SLICE, keyed_argmax

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _draws(rows: int, vocab: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator) * 2
    logits[1, 5] = float("-inf")  # a cut token
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.6, 0.0, 1.0][:rows])
    seeds = torch.tensor([3, -7, 2**62, 11, 5, 1 << 40][:rows], dtype=torch.int64)
    positions = torch.tensor([0, 9, 100_000, 4, 1, 77][:rows], dtype=torch.int64)
    return logits, temperature, seeds, positions


@pytest.mark.parametrize("vocab", [50, BLOCK + 777, 2 * SLICE + 777])
def test_the_kernel_draws_as_torch(vocab: int) -> None:
    logits, temperature, seeds, positions = _draws(6, vocab, vocab)
    expected = draw(logits, temperature, seeds, positions)  # CPU: the torch form
    moved = (x.to(DEVICE) for x in (logits, temperature, seeds, positions))
    assert keyed_argmax(*moved).cpu().tolist() == expected.tolist()


@pytest.mark.parametrize("blocks", [1, 4])  # blocks a slice: the shipped slice, and a loop inside one
def test_ties_go_to_the_lower_id_across_blocks_and_slices(blocks: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampling, "SLICE", blocks * BLOCK)
    slice_ = blocks * BLOCK
    logits = torch.zeros(1, slice_ + 10)
    logits[0, [slice_ + 3, BLOCK + 1, 7]] = 4.0
    one = torch.zeros(1, dtype=torch.int64)
    got = keyed_argmax(logits.to(DEVICE), torch.zeros(1).to(DEVICE), one.to(DEVICE), one.to(DEVICE))
    assert got.item() == 7


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_narrow_logits_draw_as_their_fp32_values_at_an_offset_position(dtype: torch.dtype) -> None:
    # the decode step draws from the head's own dtype at position + 1, with no widened copy
    logits, temperature, seeds, positions = _draws(6, BLOCK + 777, 3)
    narrow = logits.to(dtype)
    expected = draw(narrow.float(), temperature, seeds, positions + 1)
    assert draw(narrow, temperature, seeds, positions, offset=1).tolist() == expected.tolist()
    moved = (x.to(DEVICE) for x in (narrow, temperature, seeds, positions))
    assert keyed_argmax(*moved, offset=1).cpu().tolist() == expected.tolist()
    assert expected.tolist() != draw(narrow.float(), temperature, seeds, positions).tolist()
    into = torch.full((6,), -1, dtype=torch.int64, device=DEVICE)  # the decode step draws into its feed
    moved = (x.to(DEVICE) for x in (narrow, temperature, seeds, positions))
    assert keyed_argmax(*moved, offset=1, out=into) is into and into.cpu().tolist() == expected.tolist()


def test_draws_go_to_the_named_rows_and_the_temperature_may_come_as_its_bits() -> None:
    # a decode step's batch holds the temperature's fp32 bits in an int64 field and names the feed
    # row each lane's draw goes to; a padding lane (-1) writes nothing
    logits, temperature, seeds, positions = _draws(6, BLOCK + 777, 5)
    expected = draw(logits, temperature, seeds, positions).tolist()
    bits = temperature.view(torch.int32).to(torch.int64)
    rows = torch.tensor([7, 2, -1, 0, 9, 4], dtype=torch.int64)
    want = [-5] * 11
    for row, token in zip(rows.tolist(), expected, strict=True):
        if row >= 0:
            want[row] = token
    for form, device in ((draw, "cpu"), (keyed_argmax, DEVICE)):  # the torch form, the kernel
        into = torch.full((11,), -5, dtype=torch.int64, device=device)
        moved = [x.to(device) for x in (logits, bits, seeds, positions)]
        assert form(*moved, out=into, out_rows=rows.to(device)) is into
        assert into.cpu().tolist() == want
    with pytest.raises(ValueError, match="give out"):
        keyed_argmax(logits, temperature, seeds, positions, out_rows=rows)


def test_a_row_draws_the_same_alone() -> None:
    logits, temperature, seeds, positions = (x.to(DEVICE) for x in _draws(6, 300, 1))
    together = keyed_argmax(logits, temperature, seeds, positions)
    alone = [keyed_argmax(logits[i:i + 1], temperature[i:i + 1], seeds[i:i + 1], positions[i:i + 1]).item()
             for i in range(6)]
    assert together.tolist() == alone


def test_refuses_what_it_cannot_read() -> None:
    logits = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="seeds"):
        keyed_argmax(logits, torch.zeros(2), torch.zeros(2), torch.zeros(2, dtype=torch.int64))


@pytest.mark.gpu
def test_a_real_vocabulary_on_the_device() -> None:
    # the GPU's uint64 hash and log against the torch form on the CPU (a flip needs two scores
    # within an ulp of each other at the top of 248,320)
    logits, temperature, seeds, positions = _draws(6, 248_320, 7)
    expected = draw(logits, temperature, seeds, positions)
    got = keyed_argmax(*(x.cuda() for x in (logits, temperature, seeds, positions)))
    assert got.cpu().tolist() == expected.tolist()


def _masks(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Random grammar bitmasks, each row allowing a few tokens about the 32-token word boundaries."""
    generator = torch.Generator().manual_seed(seed)
    words = (vocab + 31) // 32
    bits = torch.rand(rows, words * 32, generator=generator) < 0.05
    bits[:, 31], bits[:, 32] = True, torch.arange(rows) % 2 == 0  # a word's last bit, the next one's first
    bits[0] = False
    bits[0, vocab - 1] = True  # one token allowed: the last of the vocabulary
    packed = (bits.view(rows, words, 32).long() << torch.arange(32)).sum(-1)
    return packed.to(torch.int64).where(packed < 2**31, packed - 2**32).to(torch.int32)


@pytest.mark.parametrize("vocab", [33, BLOCK + 777, 2 * SLICE + 31])  # a word partly past the vocabulary
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_grammar_mask_bars_as_minus_infinity_logits(vocab: int, dtype: torch.dtype) -> None:
    # the draw reads a grammar's bitmask as it goes: the tokens drawn are those of the masked copy
    logits, temperature, seeds, positions = _draws(6, vocab, vocab)
    logits = logits.to(dtype)
    allowed = _masks(6, vocab, vocab)
    masked = grammar_masks.apply(logits.float(), allowed)
    expected = draw(masked, temperature, seeds, positions)
    assert expected.tolist() != draw(logits, temperature, seeds, positions).tolist()  # the mask matters
    assert expected[0].item() == vocab - 1
    assert draw(logits, temperature, seeds, positions, allowed=allowed).tolist() == expected.tolist()
    moved = [x.to(DEVICE) for x in (logits, temperature, seeds, positions)]
    got = keyed_argmax(*moved, allowed=allowed.to(DEVICE))
    assert got.cpu().tolist() == expected.tolist()
    wide = torch.cat([allowed, torch.zeros(6, 3, dtype=torch.int32)], dim=1)  # a buffer's extra words
    assert keyed_argmax(*moved, allowed=wide.to(DEVICE)).cpu().tolist() == expected.tolist()
    with pytest.raises(ValueError, match="allowed"):
        keyed_argmax(*moved, allowed=allowed[:, :-1].to(DEVICE))


def test_the_kernel_draws_as_torch_where_the_hash_is_at_its_top() -> None:
    # a seed whose token 0 at position 0 hashes to all ones (keyed_noise): its noise is
    # the largest there is, finite; barred, the next best allowed token draws, as torch's form draws
    seed = torch.tensor([seed_hashing_to((1 << 64) - 1)] * 2)
    logits, temperature = torch.tensor([[0.0, -3.0, -4.0]] * 2), torch.ones(2)
    positions = torch.zeros(2, dtype=torch.int64)
    allowed = torch.tensor([[0b111], [0b110]], dtype=torch.int32)
    expected = draw(logits, temperature, seed, positions, allowed=allowed)
    assert expected[0].item() == 0 and expected[1].item() in (1, 2)
    moved = [x.to(DEVICE) for x in (logits, temperature, seed, positions)]
    assert keyed_argmax(*moved, allowed=allowed.to(DEVICE)).cpu().tolist() == expected.tolist()
