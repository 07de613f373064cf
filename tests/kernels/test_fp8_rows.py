"""Rows quantized where they are made (``tfd_kernels.fp8_rows``): a norm, the GDN output norm, SwiGLU's
middle and attention decode's merge, asked for their result's FP8 rows too, store the same values as
without, and rows with the bits ``fp8_gemm.quantize`` gives those values; a product from them is
``matmul``'s. Each producer on both sides of where its programs stop holding whole 128-wide groups, which
it refuses by name."""

from __future__ import annotations

import pytest
import torch
from test_paged_attention import paged, queries

from tfd.model import ops
from tfd.model.fp8 import Fp8Weight, Joined, Rows
from tfd_kernels import fp8_gemm, fp8_rows, norm, paged_attention, swiglu
from tfd_kernels.paged_attention import partials_for


def rand(*shape: int, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def rows_for(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    flat = values.reshape(values.shape[0], -1)
    return fp8_rows.empty_rows(flat.shape[0], flat.shape[1], flat.device)


def assert_quantized(rows: tuple[torch.Tensor, torch.Tensor], values: torch.Tensor) -> None:
    """``rows`` hold ``quantize``'s bits of ``values`` (flattened to [rows, width])."""
    q, scales = fp8_gemm.quantize(values.reshape(values.shape[0], -1))
    assert torch.equal(rows[0].view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(rows[1], scales)


# one group, a power of two of them, three in a block of 512
@pytest.mark.parametrize("width", [128, 256, 384])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_norms_write_the_rows_quantize_gives_their_result(width: int, dtype: torch.dtype) -> None:
    x, w = rand(4, width, dtype=dtype), rand(width, seed=1, dtype=dtype) * 0.1
    delta = rand(4, width, seed=2, dtype=dtype)
    x[1] = 0  # an all-zero row: scale 1, codes 0
    x[2, :128] *= 300  # a row whose first group dominates its norm: the others' scales far smaller
    rows = rows_for(x)
    out = norm.zrms(x, w, 1e-6, rows=rows)
    assert torch.equal(out, norm.zrms(x, w, 1e-6))
    assert_quantized(rows, out)
    rows = rows_for(x)
    total, out = norm.add_zrms(x, delta, w, 1e-6, rows=rows)
    want_total, want_out = norm.add_zrms(x, delta, w, 1e-6)
    assert torch.equal(total, want_total) and torch.equal(out, want_out)
    assert_quantized(rows, out)


def test_norms_refuse_rows_of_part_groups_by_name() -> None:
    x, w = rand(2, 192), rand(192, seed=1)
    assert norm.quantizes(128) and norm.quantizes(384) and not norm.quantizes(192)
    with pytest.raises(ValueError, match="a norm quantizes whole rows of a multiple of 128 columns, not 192"):
        norm.zrms(x, w, 1e-6, rows=rows_for(x))
    with pytest.raises(ValueError, match="not 192"):
        norm.add_zrms(x, x, w, 1e-6, rows=rows_for(x))
    x, w = rand(2, 256), rand(128, seed=1)
    with pytest.raises(ValueError, match="in groups of 128"):
        norm.zrms(x, w, 1e-6, group=128, rows=rows_for(x))
    with pytest.raises(ValueError, match=r"rows must be float8_e4m3fn \[2, 256\]"):
        norm.zrms(x, torch.cat([w, w]), 1e-6, rows=fp8_rows.empty_rows(2, 128, x.device))


# heads of 32 make a program's four heads one group; of 256, each head two; 3 and 6 heads leave a program's
# last heads (and groups) outside the row
@pytest.mark.parametrize(("heads", "width"), [(4, 32), (3, 32), (6, 64), (3, 128), (2, 256)])
def test_the_gated_norm_writes_the_rows_quantize_gives_its_result(heads: int, width: int) -> None:
    x, gate, w = rand(3, heads, width), rand(3, heads, width, seed=1), 1 + rand(width, seed=2) * 0.1
    x[0, 0] *= 1000
    rows = rows_for(x)
    out = norm.gated_rms(x, gate, w, 1e-6, "silu", rows=rows)
    assert torch.equal(out, norm.gated_rms(x, gate, w, 1e-6, "silu"))
    assert_quantized(rows, out)


def test_the_gated_norm_refuses_heads_that_cut_groups_by_name() -> None:
    assert norm.gated_quantizes(32) and norm.gated_quantizes(128) and not norm.gated_quantizes(16)
    assert not norm.gated_quantizes(96)  # whole groups a program, but not a power of two: padded blocks
    for width in (16, 96):
        x = rand(2, 4, width)
        with pytest.raises(ValueError, match=f"not {width}"):
            norm.gated_rms(x, x, torch.ones(width, dtype=x.dtype), 1e-6, "silu", rows=rows_for(x))


# a block of 1,024 columns: one group, exactly one block, a block and a part group after it; paired layouts
@pytest.mark.parametrize(("inner", "paired"), [(128, False), (1024, False), (1100, False), (1056, True)])
def test_swiglu_writes_the_rows_quantize_gives_its_middle(inner: int, paired: bool) -> None:
    h = rand(3, 2 * inner) * 4
    h[1] = 0
    rows = fp8_rows.empty_rows(3, inner, h.device)
    out = swiglu.swiglu(h, paired=paired, rows=rows)
    assert torch.equal(out, swiglu.swiglu(h, paired=paired))
    assert_quantized(rows, out)


def test_a_product_of_quantized_rows_is_matmuls() -> None:
    x = rand(5, 384)
    data = rand(256, 384, seed=1).to(torch.float8_e4m3fn)
    scale_inv = rand(2, 3, seed=2, dtype=torch.float32).abs()
    q, scales = fp8_gemm.quantize(x)
    want = fp8_gemm.matmul(x, data, scale_inv)
    assert torch.equal(fp8_gemm.product(q, scales, data, scale_inv, x.dtype), want)
    with pytest.raises(ValueError, match="q must be float8_e4m3fn"):
        fp8_gemm.product(x, scales, data, scale_inv, x.dtype)
    with pytest.raises(ValueError, match=r"q_scales must be float32 \[5, 3\]"):
        fp8_gemm.product(q, scales[:, :2], data, scale_inv, x.dtype)


def test_linear_reads_fp8_rows_for_fp8_weights_and_their_values_for_the_rest() -> None:
    x = rand(3, 256)
    rows = ops.Fp8Rows(x, *fp8_gemm.quantize(x))
    fp8 = Fp8Weight(rand(256, 256, seed=1).to(torch.float8_e4m3fn),
                    rand(2, 2, seed=2, dtype=torch.float32).abs())
    plain = rand(64, 256, seed=3)
    want = fp8_gemm.matmul(x, fp8.data, fp8.scale_inv)
    assert torch.equal(ops.linear(rows, fp8), want)
    assert torch.equal(ops.linear(rows, plain), ops.linear(x, plain))
    joined = torch.cat([want, ops.linear(x, plain)], dim=-1)
    assert torch.equal(ops.linear(rows, Joined((fp8, plain))), joined)
    picked = torch.tensor([5, 0, 130])
    assert torch.equal(ops.linear(rows, Rows(fp8, picked)), want[:, picked])
    assert ops.reads_fp8(fp8) and ops.reads_fp8(Joined((plain, fp8))) and ops.reads_fp8(Rows(fp8, picked))
    assert not ops.reads_fp8(plain) and not ops.reads_fp8(None)
    assert ops.values_of(rows) is x and ops.values_of(x) is x


# heads of 128 (one group each) and 256 (two), a lane of no keys among them (zeros: scale 1), gated or not
@pytest.mark.parametrize(("head_dim", "gated"), [(128, True), (256, False)])
def test_attention_decode_writes_the_rows_quantize_gives_its_output(head_dim: int, gated: bool) -> None:
    lengths = [5, 0, 19]
    c = paged(lengths, kv_heads=1, dtype=torch.bfloat16, heads=2, head_dim=head_dim)
    q_gate = queries(3, torch.bfloat16, heads=2, head_dim=2 * head_dim, seed=5)
    q, gate = q_gate[..., :head_dim], q_gate[..., head_dim:]
    partials = partials_for(3, 2, head_dim, c.table.shape[1] * c.k.shape[1], q.device)
    length = torch.tensor(lengths, dtype=torch.int32)

    def run(rows: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        empty = torch.empty(q.shape, dtype=q.dtype)
        return paged_attention.decode(q, c.k, c.v, c.table, length, c.scale, empty, partials,
                                      gate=gate if gated else None, rows=rows)

    rows = fp8_rows.empty_rows(3, 2 * head_dim, q.device)
    out = run(rows)
    assert torch.equal(out, run(None))
    assert_quantized(rows, out)


def test_attention_decode_refuses_heads_that_cut_groups_by_name() -> None:
    assert paged_attention.quantizes(256) and not paged_attention.quantizes(64)
    c = paged([3], kv_heads=1, dtype=torch.bfloat16, heads=2, head_dim=64)
    q = queries(1, torch.bfloat16, heads=2, head_dim=64)
    partials = partials_for(1, 2, 64, c.table.shape[1] * c.k.shape[1], q.device)
    with pytest.raises(ValueError, match="rows: heads of 64 are not whole 128-wide groups"):
        paged_attention.decode(q, c.k, c.v, c.table, torch.tensor([3], dtype=torch.int32), c.scale,
                               torch.empty(q.shape, dtype=q.dtype), partials,
                               rows=fp8_rows.empty_rows(1, 128, q.device))
