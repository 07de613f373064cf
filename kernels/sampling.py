"""Keyed Gumbel-max in one pass over the vocabulary: a token per row, no sort, no noise tensor.

Row r draws argmax over tokens t of ``logits[r, t] / temperature[r] + G(seed[r], position[r], t)``
(``tfd.engine.sampling`` states the key and why); temperature <= 0 is greedy, the argmax of the
logits. Ties go to the lower token id. Tokens cut by top-k/top-p/min-p arrive as -inf logits. The
noise is splitmix64's finaliser of the mixed key in wrapping uint64 arithmetic, its top 23 bits made
a uniform in (0, 1) exactly (k + 1/2 over 2^23), then -log(-log(u)), always finite, as
``tfd.engine.sampling.gumbel`` does in torch.

A row may come with a grammar's bitmask (``allowed``: int32 words, token t allowed when bit t % 32
of word t // 32 is set): a token it bars draws as a -inf logit, as ``tfd.engine.grammar.apply``
would bar it, without writing the masked logits.

Memory: reads each row's logits once (fp32, or the model's 2-byte dtype widened to fp32 as it
loads: the values ``logits.float()`` holds, without writing them; unit column stride), writes a
score and an id per slice of ``SLICE`` tokens, then one int64 per row (at its row of ``out``, or
where a row index says: a decode step's draws go to the rows its lanes name, none for padding). The
slices are cut by the vocabulary alone and a row's programs read only that row, so a row's token
never depends on the others.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import pdl

SEED_MIX = 0x9E3779B97F4A7C15
POSITION_MIX = 0xC2B2AE3D27D4EB4F
TOKEN_MIX = 0x165667B19E3779F9
M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB
BLOCK = 2048  # tokens a step of a program's loop
# tokens a program: 122 programs a row for a 248,320-token vocabulary. The hash's 64-bit multiplies
# make the pass compute-bound; 8192-token slices (31 programs) took 12 us a step at one row (H200).
SLICE = 2048


# counts that vary call by call are not specialized on (1, multiples of 16): one variant meets them all; nor
# is the 16-byte alignment of the per-row fields, rows of a packed [fields, rows] tensor (aligned as the rows
# are even or odd: the H100's demo compiled two variants while serving, 2026-12-05)
@triton.jit(do_not_specialize=["offset"],
            do_not_specialize_on_alignment=["temperature", "seeds", "positions"])
def _slice_best(logits, temperature, seeds, positions, offset, best_score, best_id, vocab, row_stride, slices,
                allowed, words, SEED_MIX: tl.constexpr, POSITION_MIX: tl.constexpr, TOKEN_MIX: tl.constexpr,
                M1: tl.constexpr, M2: tl.constexpr, BLOCK: tl.constexpr, SLICE: tl.constexpr,
                BITS: tl.constexpr, MASKED: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row, part = tl.program_id(0), tl.program_id(1)
    t = tl.load(temperature + row)
    if BITS:  # int64 fields holding the fp32 bits in their low half (a decode batch's packed field)
        t = t.to(tl.int32).to(tl.float32, bitcast=True)
    noisy = t > 0
    scale = tl.where(noisy, t, 1.0)
    key = tl.load(seeds + row).to(tl.uint64) * SEED_MIX
    key += (tl.load(positions + row) + offset).to(tl.uint64) * POSITION_MIX
    best = tl.full([], float("-inf"), tl.float32)
    best_at = tl.full([], 0, tl.int64)
    for start in range(part * SLICE, part * SLICE + SLICE, BLOCK):
        ids = start + tl.arange(0, BLOCK)
        live = ids < vocab
        score = tl.load(logits + row * row_stride + ids, mask=live, other=float("-inf")).to(tl.float32)
        score = score / scale
        x = key + ids.to(tl.uint64) * TOKEN_MIX
        x = (x ^ (x >> 30)) * M1
        x = (x ^ (x >> 27)) * M2
        x = x ^ (x >> 31)
        uniform = ((x >> 41).to(tl.float32) + 0.5) * (1.0 / 8388608.0)  # never 1.0 (tfd.engine.sampling)
        score = tl.where(noisy, score - tl.log(-tl.log(uniform)), score)
        if MASKED:  # the grammar's bit for each token: 32 neighbours share a word (one load, cached)
            word = tl.load(allowed + row * words + ids // 32, mask=live, other=0)
            live = live & (((word >> (ids % 32)) & 1) != 0)
        score = tl.where(live, score, float("-inf"))
        top = tl.max(score, axis=0)
        better = top > best  # strictly: an equal score in a later block keeps the lower id
        best_at = tl.where(better, start + tl.argmax(score, axis=0).to(tl.int64), best_at)
        best = tl.where(better, top, best)
    tl.store(best_score + row * slices + part, best)
    tl.store(best_id + row * slices + part, best_at)


@triton.jit(do_not_specialize_on_alignment=["out", "out_rows"])  # a row of a feed, or of a packed field
def _row_best(best_score, best_id, out, out_rows, slices, BLOCK: tl.constexpr, ROWS: tl.constexpr,
              PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0)
    parts = tl.arange(0, BLOCK)
    scores = tl.load(best_score + row * slices + parts, mask=parts < slices, other=float("-inf"))
    top = tl.argmax(scores, axis=0)  # the first slice holding the best: the lower id on a tie
    where = row
    if ROWS:
        where = tl.load(out_rows + row)
    if where >= 0:
        tl.store(out + where, tl.load(best_id + row * slices + top))


LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def keyed_argmax(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
                 positions: torch.Tensor, offset: int = 0, out: torch.Tensor | None = None,
                 out_rows: torch.Tensor | None = None, allowed: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """The drawn token [rows] int64 for ``logits`` [rows, vocab] (fp32, or bf16/fp16 drawn as their
    fp32 values) and per-row temperature (fp32, or int64 holding its fp32 bits in the low half), int64
    seeds and positions, each position keyed plus ``offset`` (any 1-D views; no host sync, so it can
    be captured in a graph), into ``out`` when given (contiguous int64). Row r's token goes to
    ``out[r]``, or with ``out_rows`` (int64 [rows]) to ``out[out_rows[r]]``, nowhere where that is
    below 0 (``out`` is then required and returned whole; the indices must be below its length).
    ``allowed`` (int32 [rows, words], words >= vocab / 32, rows contiguous): the bitmask of the tokens
    each row may draw; the others draw as -inf logits. Two launches: the best of each slice of a
    row's tokens, then the best slice."""
    if logits.dim() != 2 or logits.dtype not in LOGIT_DTYPES or logits.stride(1) != 1:
        raise ValueError(f"logits must be [rows, vocab] fp32, bf16 or fp16 with unit column stride, got "
                         f"{logits.dtype} {list(logits.shape)}")
    rows, vocab = logits.shape
    if tuple(temperature.shape) != (rows,) or temperature.dtype not in (torch.float32, torch.int64):
        raise ValueError(f"temperature is {temperature.dtype} {list(temperature.shape)}, expected float32 "
                         f"(or int64 fp32 bits) [{rows}]")
    for name, t, dtype in (("seeds", seeds, torch.int64), ("positions", positions, torch.int64),
                           ("out_rows", out_rows, torch.int64)):
        if t is not None and (tuple(t.shape) != (rows,) or t.dtype != dtype):
            raise ValueError(f"{name} is {t.dtype} {list(t.shape)}, expected {dtype} [{rows}]")
    words = triton.cdiv(vocab, 32)
    if allowed is not None and (allowed.dim() != 2 or allowed.dtype != torch.int32
                                or allowed.shape[0] != rows or allowed.shape[1] < words
                                or allowed.stride(1) != 1):
        raise ValueError(f"allowed is {allowed.dtype} {list(allowed.shape)}, expected int32 [{rows}, "
                         f"{words} or more] with unit column stride")
    if out is None and out_rows is not None:
        raise ValueError("out_rows names rows of out: give out")
    if out is None:
        out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    elif out.dim() != 1 or (out_rows is None and out.shape[0] != rows) or out.dtype != torch.int64 \
            or out.stride(0) != 1:
        raise ValueError(f"out is {out.dtype} {list(out.shape)}, expected contiguous int64 "
                         f"[{rows if out_rows is None else 'rows named by out_rows'}]")
    if rows == 0:
        return out
    slices = triton.cdiv(vocab, SLICE)
    scores = torch.empty(rows, slices, dtype=torch.float32, device=logits.device)
    ids = torch.empty(rows, slices, dtype=torch.int64, device=logits.device)
    _slice_best[(rows, slices)](logits, temperature.contiguous(), seeds.contiguous(), positions.contiguous(),
                                offset, scores, ids, vocab, logits.stride(0), slices,
                                logits if allowed is None else allowed,
                                0 if allowed is None else allowed.stride(0), SEED_MIX=SEED_MIX,
                                POSITION_MIX=POSITION_MIX, TOKEN_MIX=TOKEN_MIX, M1=M1, M2=M2, BLOCK=BLOCK,
                                SLICE=SLICE, BITS=temperature.dtype == torch.int64,
                                MASKED=allowed is not None,
                                **pdl.options(logits.device))
    _row_best[(rows,)](scores, ids, out, out if out_rows is None else out_rows.contiguous(), slices,
                       BLOCK=max(16, triton.next_power_of_2(slices)), ROWS=out_rows is not None,
                       **pdl.options(scores.device))
    return out
