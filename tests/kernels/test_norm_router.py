"""The add, norm and router product in one launch: the same bits as add_zrms then the router's product."""

from __future__ import annotations

import pytest
import torch

from kernels import norm_router


def inputs(width: int, n: int, dtype: torch.dtype, seed: int, device: str = "cpu"
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device)

    return (randn(1, width).to(dtype), randn(1, width).to(dtype), (randn(width) * 0.1).to(dtype),
            (randn(n, width) * width ** -0.5).to(dtype))


def assert_same(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    for name, a, b in zip(("total", "normed", "logits"), got, want, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("width", "n"), [(64, 9), (512, 65), (256, 33)])
def test_one_launch_is_add_zrms_then_the_product(width: int, n: int, dtype: torch.dtype) -> None:
    x, delta, weight, router = inputs(width, n, dtype, seed=width + n)
    want = norm_router.reference(x, delta, weight, 1e-6, router)
    assert_same(norm_router.add_zrms_router(x, delta, weight, 1e-6, router), want)
    # again: the tiles' counters were rearmed
    assert_same(norm_router.add_zrms_router(x, delta, weight, 1e-6, router), want)


def test_without_preloaded_tiles_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    x, delta, weight, router = inputs(512, 40, torch.float32, seed=3)
    want = norm_router.add_zrms_router(x, delta, weight, 1e-6, router)
    monkeypatch.setattr(norm_router, "PRELOAD", 0)
    assert_same(norm_router.add_zrms_router(x, delta, weight, 1e-6, router), want)


def test_wrong_inputs_are_named() -> None:
    x, delta, weight, router = inputs(64, 9, torch.float32, seed=1)
    with pytest.raises(ValueError, match="router_weight"):
        norm_router.add_zrms_router(x, delta, weight, 1e-6, router[:, :32])
    with pytest.raises(ValueError, match="x"):
        norm_router.add_zrms_router(x.expand(2, -1), delta, weight, 1e-6, router)
    assert not norm_router.takes(2, router)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [257, 513, 129])
@pytest.mark.parametrize("early", [0, 1])
def test_gpu_real_sizes_are_add_zrms_then_the_product(n: int, early: int, monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    monkeypatch.setattr(norm_router, "EARLY", early)
    for seed in range(3):
        x, delta, weight, router = inputs(2048, n, torch.bfloat16, seed=seed, device="cuda")
        assert_same(norm_router.add_zrms_router(x, delta, weight, 1e-6, router),
                    norm_router.reference(x, delta, weight, 1e-6, router))
