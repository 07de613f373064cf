"""Block-wise FP8 weights as Qwen publishes its ``-FP8`` checkpoints: the CPU reference math.

The format (``quantization_config``: ``quant_method`` "fp8", ``fmt`` "e4m3", ``weight_block_size``
[128, 128], ``activation_scheme`` "dynamic"): a quantized linear weight W [out, in] is stored as
``weight``, float8_e4m3fn [out, in], and ``weight_scale_inv``, float32 [ceil(out/128), ceil(in/128)];
the real weight is ``weight.float() * weight_scale_inv[o // 128, i // 128]`` (the last blocks are
partial when out or in is not a multiple of 128).

Activations are quantized when used, per row in groups of 128 along the input dimension: the
group's scale is its max |x| / 448 (448 is e4m3's largest finite value) and q = x / scale cast to
float8_e4m3fn, so each group's largest |q| is 448. An all-zero group takes scale 1, which gives q = 0
without dividing by zero (as does a group whose max / 448 underflows fp32).

A row times the weight (``linear``): for each 128-wide K block kb in ascending order, the dot
q_x[kb] . q_w[:, kb] in fp32 (products of e4m3 values are exact in fp32), times the factor
(x_scale[kb] * w_scale[o // 128, kb]) in fp32; the blocks' terms summed in ascending kb in fp32, one
addition after another; the sum cast to the activations' dtype.

Every row is computed alone with the same shapes whatever the batch (CPU BLAS picks its kernel by
the number of rows), so a row's result has the same bits alone as inside any batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
import torch.nn.functional as F

BLOCK = 128
E4M3_MAX = 448.0


def blocks(n: int) -> int:
    """The number of BLOCK-wide blocks covering ``n`` (the last one partial where BLOCK does not divide n)."""
    return -(-n // BLOCK)


@attrs.frozen
class Fp8Weight:
    """A linear weight [out, in] in block-wise FP8; checked on construction (ValueError naming the
    field and what is wrong), so a loader builds it straight from the checkpoint's two tensors."""

    data: torch.Tensor  # float8_e4m3fn [out, in]: the checkpoint's `weight`
    scale_inv: torch.Tensor  # float32 [ceil(out/128), ceil(in/128)]: the checkpoint's `weight_scale_inv`

    def __attrs_post_init__(self) -> None:
        check(self.data, self.scale_inv)

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in) of the real weight."""
        return self.data.shape[0], self.data.shape[1]

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The real weight [out, in]: each element times its block's scale, in fp32, cast to ``dtype``."""
        out, inp = self.shape
        return (self.data.float() * _expanded(self.scale_inv, out, inp)).to(dtype)


def check(data: torch.Tensor, scale_inv: torch.Tensor) -> None:
    """Raise ValueError naming what is wrong unless ``data`` and ``scale_inv`` make a block-wise FP8
    weight: data float8_e4m3fn [out, in], scale_inv float32 [ceil(out/128), ceil(in/128)], one device."""
    if data.dtype != torch.float8_e4m3fn:
        raise ValueError(f"data (weight) must be torch.float8_e4m3fn, not {data.dtype}")
    if data.dim() != 2:
        raise ValueError(f"data (weight) must be 2-D [out, in], not of shape {tuple(data.shape)}")
    if scale_inv.dtype != torch.float32:
        raise ValueError(f"scale_inv (weight_scale_inv) must be torch.float32, not {scale_inv.dtype}")
    expected = (blocks(data.shape[0]), blocks(data.shape[1]))
    if tuple(scale_inv.shape) != expected:
        raise ValueError(f"scale_inv (weight_scale_inv) must have shape {expected} for a weight of shape "
                         f"{tuple(data.shape)} in {BLOCK}x{BLOCK} blocks, not {tuple(scale_inv.shape)}")
    if scale_inv.device != data.device:
        raise ValueError(f"scale_inv (weight_scale_inv) is on {scale_inv.device}, data on {data.device}")


@attrs.frozen
class Rows:
    """Output rows of a stored FP8 weight picked and put in a new order, as a loader regroups a
    fused projection (Qwen3-Next's per-key-head ``in_proj_qkvz``): rows cannot move between
    128-row scale blocks, so the product is the stored weight's and its columns are picked after."""

    weight: Fp8Weight
    rows: torch.Tensor  # int64 [n]: the stored weight's output rows, in the order wanted

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.rows.shape[0]), self.weight.shape[1]


Part = torch.Tensor | Fp8Weight | Rows  # a linear weight as a checkpoint stores it (or regrouped)


@attrs.frozen
class Joined:
    """Linear weights stacked along ``out`` whose parts a checkpoint stores apart and not alike (FP8
    beside float: Qwen's releases keep a GDN layer's b and a rows in bf16): the product is each
    part's, side by side, so each row's bits are its parts' own."""

    parts: tuple[Part, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return sum(part.shape[0] for part in self.parts), self.parts[0].shape[1]


Weight = Part | Joined  # what a linear layer multiplies by


def join(parts: Sequence[Part]) -> Weight:
    """``parts`` stacked along ``out`` as one weight: one tensor when all are tensors (as before),
    else ``Joined`` (each part multiplied on its own). Neighbours merge into one product where the
    numbers stay the same: tensors; ``Rows`` of one stored weight; FP8 weights whose upper one fills
    whole 128-row blocks (its blocks line up with the stacked weight's)."""
    tensors = [part for part in parts if isinstance(part, torch.Tensor)]
    if len(tensors) == len(parts):
        return torch.cat(tensors)
    merged: list[Part] = []
    for part in parts:
        last = merged[-1] if merged else None
        if isinstance(part, Rows) and isinstance(last, Rows) and last.weight is part.weight:
            merged[-1] = Rows(part.weight, torch.cat((last.rows, part.rows)))
        elif isinstance(part, torch.Tensor) and isinstance(last, torch.Tensor):
            merged[-1] = torch.cat((last, part))
        elif isinstance(part, Fp8Weight) and isinstance(last, Fp8Weight) and last.shape[0] % BLOCK == 0:
            merged[-1] = _one_weight(Joined((last, part)))  # whole blocks above: the same scales, one product
        else:
            merged.append(part)
    return merged[0] if len(merged) == 1 else Joined(tuple(merged))


@attrs.frozen
class Fp8Experts:
    """MoE experts' weights stacked, each [out, in] in block-wise FP8: ``data`` float8_e4m3fn
    [experts, out, in], ``scale_inv`` float32 [experts, ceil(out/128), ceil(in/128)] (transformers'
    fused ``gate_up_proj`` with ``gate_up_proj_scale_inv``). Checked on construction."""

    data: torch.Tensor
    scale_inv: torch.Tensor

    def __attrs_post_init__(self) -> None:
        if self.data.dim() != 3 or self.scale_inv.dim() != 3 or self.data.shape[0] != self.scale_inv.shape[0]:
            raise ValueError(f"data [experts, out, in] and scale_inv [experts, ...] must be 3-D with as many "
                             f"experts, not {tuple(self.data.shape)} and {tuple(self.scale_inv.shape)}")
        check(self.data[0], self.scale_inv[0])

    @property
    def shape(self) -> tuple[int, int, int]:
        """(experts, out, in)."""
        return self.data.shape[0], self.data.shape[1], self.data.shape[2]

    def __getitem__(self, expert: int) -> Fp8Weight:
        return Fp8Weight(self.data[expert], self.scale_inv[expert])

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.stack([self[e].dequantized(dtype) for e in range(self.shape[0])])


Experts = torch.Tensor | Fp8Experts  # [experts, out, in], stacked


def stacked(weights: Sequence[Weight]) -> Experts:
    """Experts stored one by one, stacked: a tensor when all are tensors; ``Fp8Experts`` when all are
    FP8, an expert's parts (gate rows, then up rows) joined where each part but the last fills whole
    128-row blocks (then the blocks line up: the same scales, the same numbers). ValueError else."""
    if all(isinstance(weight, torch.Tensor) for weight in weights):
        return torch.stack(weights)  # type: ignore[arg-type]
    whole = [_one_weight(weight) for weight in weights]
    return Fp8Experts(torch.stack([w.data for w in whole]), torch.stack([w.scale_inv for w in whole]))


def _one_weight(weight: Weight) -> Fp8Weight:
    """``weight`` as one ``Fp8Weight``; ValueError where it is not FP8 or its parts' blocks do not line up."""
    if isinstance(weight, Fp8Weight):
        return weight
    parts = weight.parts if isinstance(weight, Joined) else (weight,)
    if not all(isinstance(part, Fp8Weight) for part in parts):
        raise ValueError("an expert's weights are partly FP8 and partly not: stacked experts are all one or "
                         "the other")
    if any(part.shape[0] % BLOCK for part in parts[:-1]):
        raise ValueError(f"an expert's gate rows ({parts[0].shape[0]}) are not whole {BLOCK}-row blocks, so "
                         f"its gate and up blocks cannot be stacked as one FP8 weight")
    return Fp8Weight(torch.cat([part.data for part in parts]),  # type: ignore[union-attr]
                     torch.cat([part.scale_inv for part in parts]))  # type: ignore[union-attr]


def holds_fp8(record: object) -> bool:
    """Whether ``record`` (an attrs record of weights or a tuple of them, walked through) holds FP8."""
    if isinstance(record, (Fp8Weight, Fp8Experts, Rows)):
        return True
    if isinstance(record, Joined):
        return any(holds_fp8(part) for part in record.parts)
    if isinstance(record, tuple):
        return any(holds_fp8(item) for item in record)
    fields = getattr(type(record), "__attrs_attrs__", ())
    return any(holds_fp8(getattr(record, field.name)) for field in fields)


def quantize_weight(w: torch.Tensor) -> Fp8Weight:
    """``w`` [out, in] (a floating dtype, finite) in block-wise FP8: per 128x128 block (the last ones
    partial), scale = the block's max |w| / 448 (1 for an all-zero block), data = w / scale clamped to
    +-448 and cast to float8_e4m3fn. This is how tests turn tiny bf16 checkpoints into FP8 ones."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a 2-D floating tensor [out, in], not {w.dtype} {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("w has non-finite values, which have no FP8 scale")
    out, inp = w.shape
    values = w.float()
    # Zero padding to whole blocks changes no block's max, so partial blocks need no case of their own.
    padded = F.pad(values, (0, -inp % BLOCK, 0, -out % BLOCK))
    amax = padded.view(blocks(out), BLOCK, blocks(inp), BLOCK).abs().amax(dim=(1, 3))
    scale = _scales(amax)
    # The clamp catches a quotient one fp32 rounding above 448, which e4m3fn has no value for.
    data = (values / _expanded(scale, out, inp)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return Fp8Weight(data, scale)


def quantize_experts(w: torch.Tensor) -> Fp8Experts:
    """Stacked experts ``w`` [experts, out, in], each quantized by ``quantize_weight``."""
    if w.dim() != 3:
        raise ValueError(f"w must be 3-D [experts, out, in], not of shape {tuple(w.shape)}")
    each = [quantize_weight(expert) for expert in w]
    return Fp8Experts(torch.stack([e.data for e in each]), torch.stack([e.scale_inv for e in each]))


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [rows, in] (fp32, bf16 or fp16) quantized per row in 128-wide groups: (q float8_e4m3fn
    [rows, in], scales float32 [rows, ceil(in/128)]) with x ~= q * scales[r, i // 128]. Each element's
    result depends only on its own group (a max and a division, both exact or correctly rounded), so
    all rows at once is row-invariant."""
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x must be a 2-D floating tensor [rows, in], not {x.dtype} {tuple(x.shape)}")
    rows, inp = x.shape
    values = x.float()
    padded = F.pad(values, (0, -inp % BLOCK))
    scales = _scales(padded.view(rows, blocks(inp), BLOCK).abs().amax(dim=2))
    # Same clamp as the weight's: the division may land one fp32 rounding above 448.
    q = (values / scales.repeat_interleave(BLOCK, dim=1)[:, :inp]).clamp(-E4M3_MAX, E4M3_MAX)
    return q.to(torch.float8_e4m3fn), scales


def linear(x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """``x`` [rows, in] times the FP8 weight ``w`` [out, in], transposed: [rows, out] in x.dtype, by the
    module's math (activations quantized per row and group, K blocks summed in order in fp32). Each row
    is computed alone, so its bits never depend on the other rows."""
    out, inp = w.shape
    if x.dim() != 2 or x.shape[1] != inp:
        raise ValueError(f"x must be [rows, {inp}] for a weight of shape {w.shape}, not {tuple(x.shape)}")
    if x.shape[0] == 0:
        return x.new_zeros((0, out))
    k_blocks = blocks(inp)
    q, x_scales = quantize_rows(x)
    # Once per call, not per row: the weight's values as [kb, out, 128] (zero columns pad the last K
    # block; they add exact zeros) and its scales per output row as [kb, out].
    w_blocks = F.pad(w.data.float(), (0, -inp % BLOCK)).view(out, k_blocks, BLOCK).transpose(0, 1)
    w_blocks = w_blocks.contiguous()
    w_scales = w.scale_inv.repeat_interleave(BLOCK, dim=0)[:out].T.contiguous()
    q_blocks = F.pad(q.float(), (0, -inp % BLOCK)).view(-1, k_blocks, BLOCK, 1)
    rows = [_row(q_row, s_row, w_blocks, w_scales) for q_row, s_row in zip(q_blocks, x_scales, strict=True)]
    return torch.stack(rows).to(x.dtype)


def _row(q: torch.Tensor, x_scales: torch.Tensor, w_blocks: torch.Tensor,
         w_scales: torch.Tensor) -> torch.Tensor:
    """One row's [out] fp32 result from its q [kb, 128, 1] and scales [kb]; the same shapes for every
    row, so the same kernels and the same bits whatever the batch."""
    # Each K block's dot, all blocks in one batched product: [kb, out].
    dots = torch.bmm(w_blocks, q).squeeze(-1)
    # The two scales multiplied first: one fp32 factor per (K block, output), rounded once.
    terms = dots * (x_scales[:, None] * w_scales)
    # K blocks added one after another in ascending order (a tree-shaped sum would round differently).
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


def _scales(amax: torch.Tensor) -> torch.Tensor:
    """max |v| / 448 per block or group; 1 where that is 0 (an all-zero group, or a max so small the
    quotient underflows), so the division gives q = 0 (or a value e4m3 rounds to 0) rather than NaN."""
    scale = amax / E4M3_MAX
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _expanded(scale: torch.Tensor, out: int, inp: int) -> torch.Tensor:
    """A [ceil(out/128), ceil(in/128)] block scale spread to one value per element of [out, in]."""
    return scale.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)[:out, :inp]
