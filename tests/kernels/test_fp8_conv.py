"""The FP8 product with the GDN projection's conv (``fp8_gemm.product(conv=...)``): the product then
``conv1d.decode`` over its first columns, the same bits and tails moved, whether the spread form applies
the conv as each tile stores (its columns whole column tiles; one K segment or several) or it runs after
(a tile across the conv's edge, the whole form, a width past the epilogue's). On the device too, where the
epilogue's taps are explicit fused multiply-adds in a launch that does not contract and conv1d's are
contracted by its compiler: the same bits is what the device test checks."""

from __future__ import annotations

import pytest
import torch
from test_fp8_gemm import random_weight
from test_gemm import conv_pool

from tfd_kernels import conv1d, fp8_gemm, gemm


def check(channels: int, m: int, k: int, spread: bool | None, width: int = 4, n: int = 192,
          device: str = "cpu") -> None:
    w = random_weight(n, k, seed=channels + k, device=device)
    x = (torch.randn(m, k, generator=torch.Generator().manual_seed(m)) / 2).to(device, torch.bfloat16)
    conv_weight = (torch.randn(channels, width, generator=torch.Generator().manual_seed(1)) / 2).to(
        device, torch.bfloat16)
    fused_pool, tail_at = conv_pool(m, channels, width, torch.bfloat16)
    fused_pool, tail_at = fused_pool.to(device), tail_at.to(device)
    plain_pool, first_pool = fused_pool.clone(), fused_pool.clone()
    q, scales = fp8_gemm.quantize(x)
    got = fp8_gemm.product(q, scales, w.data, w.scale_inv, x.dtype, spread=spread,
                           conv=gemm.Conv(conv_weight, fused_pool, tail_at))
    want = fp8_gemm.product(q, scales, w.data, w.scale_inv, x.dtype, spread=spread)
    want[:, :channels] = conv1d.decode(want[:, :channels], conv_weight, plain_pool, tail_at)
    assert torch.equal(got, want), f"m={m}"
    assert torch.equal(fused_pool, plain_pool)  # tails moved the same, the padding lane's untouched
    if m > 1:
        assert not got[1, :channels].any()
    again = fp8_gemm.matmul(x, w.data, w.scale_inv, spread=spread, conv=gemm.Conv(conv_weight, first_pool,
                                                                                  tail_at))
    assert torch.equal(again, got)


# 128 conv columns of 192: two whole 64-column tiles, applied as they store, at one K segment (k 256) and at
# several (k 2048: default_plan's segments); 96: a tile across the conv's edge, so it runs after
@pytest.mark.parametrize(("channels", "k"), [(128, 256), (128, 2048), (96, 256)])
@pytest.mark.parametrize("m", [1, 3])
def test_the_projection_with_its_conv_is_the_product_then_conv1d(channels: int, k: int, m: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    fused = fp8_gemm.takes_conv(gemm.Conv(torch.empty(channels, 4), torch.empty(1), torch.empty(1)), 192,
                                fp8_gemm.SPREAD)
    assert fused == (channels == 128)
    if k == 2048:
        assert fp8_gemm.default_plan(192, k).segments > 1
    if fused:  # applied as the tiles store: nothing runs after
        monkeypatch.setattr(fp8_gemm, "conv_after", lambda *_: pytest.fail("the conv ran after the product"))
    check(channels, m, k, spread=True)


def test_the_whole_form_and_a_wide_conv_run_it_after() -> None:
    check(128, 3, 256, spread=False)
    check(128, 3, 256, spread=True, width=5)  # past gemm.CONV_WIDTH


@pytest.mark.gpu
def test_the_projection_with_its_conv_on_the_device() -> None:
    # qwen3_5-9b's GDN projection in FP8: 8192 conv columns of 12352, decode's rows and the whole form's
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    for m in (1, 3, 17, 32, 64, 80):
        check(8192, m, 4096, None, n=12352, device="cuda")
