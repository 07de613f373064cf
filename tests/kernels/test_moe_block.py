"""An MoE block at decode: added to the residual and normalised in its last launch, and at one row
in one launch (tfd_kernels.moe_one) with the router's product, its finish spread over column blocks: the
same bits as the launches one after another."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from moe_inputs import REAL, make, make_real, make_real_shared, make_shared, residual_of, router_product

from tfd_kernels import gemm, moe, moe_one, moe_pairs, norm, router


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "top_k"), [(1, 2), (5, 3), (40, 4)])
def test_the_block_added_to_the_residual_and_normalised_is_add_zrms_of_it(rows: int, top_k: int,
                                                                         dtype: torch.dtype) -> None:
    x, gate_up, down, _, _ = make(rows, top_k, dtype, seed=rows)
    logits = router_product(rows, 8, dtype, seed=rows)
    shared = make_shared(rows, dtype, seed=rows)
    residual = residual_of(rows, dtype, seed=rows)
    block = moe.routed(x, gate_up, down, logits[:, :8], top_k, True, shared)
    want = norm.add_zrms(residual.x, block, residual.weight, residual.eps)
    got = moe.routed_add_zrms(x, gate_up, down, logits[:, :8], top_k, True, shared, residual)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not moe_pairs.arrivals(x.device).any()  # one row's last program rearmed the counter it finished on


def test_one_row_gives_the_same_bits_in_its_own_launches_as_through_the_plans(
        monkeypatch: pytest.MonkeyPatch) -> None:
    x, gate_up, down, _, _ = make(1, 3, torch.bfloat16, seed=41)
    logits = router_product(1, 8, torch.bfloat16, seed=41)
    shared = make_shared(1, torch.bfloat16, seed=41)
    residual = residual_of(1, torch.bfloat16, seed=41)
    monkeypatch.setattr(moe, "ONE_ROW", True)
    want = moe.routed_add_zrms(x, gate_up, down, logits[:, :8], 3, True, shared, residual)
    monkeypatch.setattr(moe, "ONE_ROW", False)
    got = moe.routed_add_zrms(x, gate_up, down, logits[:, :8], 3, True, shared, residual)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# (taken, last): down programs take the tile's choice or make it; the shared expert's down programs last
@pytest.mark.parametrize(("taken", "last"), [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize(("top_k", "inner", "down_k"), [(3, 16, None), (2, 24, None), (3, 32, 8)])
def test_one_row_gives_the_same_bits_in_one_launch_as_in_two(monkeypatch: pytest.MonkeyPatch, residual: bool,
                                                             top_k: int, inner: int, down_k: int | None,
                                                             taken: bool, last: bool) -> None:
    # down_k 8: the experts' inner size (32) is four K steps, so the down programs load them before h
    if down_k is not None:
        monkeypatch.setattr(moe, "DOWN_K", down_k)
    monkeypatch.setattr(moe_one, "DOWN_TAKES_CHOICE", taken)
    monkeypatch.setattr(moe_one, "SHARED_DOWN_LAST", last)
    x, gate_up, down, _, _ = make(1, top_k, torch.bfloat16, seed=43 + top_k)
    logits = router_product(1, 8, torch.bfloat16, seed=43 + top_k)
    shared = make_shared(1, torch.bfloat16, seed=43 + top_k, inner=inner)
    stream = residual_of(1, torch.bfloat16, seed=43 + top_k)

    def block() -> tuple[torch.Tensor, ...]:
        if residual:
            return moe.routed_add_zrms(x, gate_up, down, logits[:, :8], top_k, True, shared, stream)
        return (moe.routed(x, gate_up, down, logits[:, :8], top_k, True, shared),)

    launches: list[int] = []
    one = moe_one.launch
    monkeypatch.setattr(moe_one, "launch",
                        lambda *args, **kwargs: (launches.append(1), one(*args, **kwargs))[1])
    monkeypatch.setattr(moe, "ONE_LAUNCH", True)
    got = block()
    assert launches == [1]  # the one launch served it
    assert not moe_one.counters(x.device).any()  # the last program rearmed every counter
    monkeypatch.setattr(moe, "ONE_LAUNCH", False)
    want = block()
    assert launches == [1] and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


# hidden 2,048 (a norm's 4 warps: the launch's) and 2,056 (a norm's 8, Flash Next's 2,560 alike): without the
# residual the one launch serves either; with it, only the first (its norm's warps are the launch's)
@pytest.mark.parametrize("hidden", [2048, 2056])
@pytest.mark.parametrize("residual", [False, True])
def test_one_launch_serves_a_block_without_the_norm_whatever_the_norms_warps(
        monkeypatch: pytest.MonkeyPatch, hidden: int, residual: bool) -> None:
    x, gate_up, down, _, _ = make(1, 2, torch.bfloat16, seed=61, hidden=hidden, inner=16)
    logits = router_product(1, 8, torch.bfloat16, seed=61)
    shared = make_shared(1, torch.bfloat16, seed=61, hidden=hidden, inner=16)
    stream = residual_of(1, torch.bfloat16, seed=61, hidden=hidden)

    def block() -> tuple[torch.Tensor, ...]:
        if residual:
            return moe.routed_add_zrms(x, gate_up, down, logits[:, :8], 2, True, shared, stream)
        return (moe.routed(x, gate_up, down, logits[:, :8], 2, True, shared),)

    launches: list[int] = []
    one = moe_one.launch
    monkeypatch.setattr(moe_one, "launch",
                        lambda *args, **kwargs: (launches.append(1), one(*args, **kwargs))[1])
    got = block()
    assert launches == ([] if residual and hidden == 2056 else [1])
    assert not moe_one.counters(x.device).any()
    monkeypatch.setattr(moe, "ONE_LAUNCH", False)
    want = block()
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize(("rows", "inside", "early", "hidden"),
                         [(1, True, 0, 64), (1, True, 2, 512), (3, True, 0, 64), (1, False, 0, 64)])
def test_the_block_from_its_input_is_the_routers_product_then_the_routed_block(
        monkeypatch: pytest.MonkeyPatch, rows: int, inside: bool, early: int, hidden: int) -> None:
    # at one row the router's product runs in the experts' launch (with 512 columns, four K steps, its
    # first two weights asked for before the launch's wait); else first: the same bits
    monkeypatch.setattr(moe_one, "ROUTER_EARLY", early)
    x, gate_up, down, _, _ = make(rows, 3, torch.bfloat16, seed=47 + rows, hidden=hidden)
    shared = make_shared(rows, torch.bfloat16, seed=47 + rows, hidden=hidden)
    stream = residual_of(rows, torch.bfloat16, seed=47 + rows, hidden=hidden)
    router_weight = (torch.randn(9, hidden, generator=torch.Generator().manual_seed(rows)) / 8).bfloat16()
    logits = gemm.matmul(x, router_weight)
    want = moe.routed_add_zrms(x, gate_up, down, logits[:, :8], 3, True, shared._replace(gate=logits[:, 8:]),
                               stream)
    monkeypatch.setattr(moe, "ROUTER_IN_LAUNCH", inside)
    products: list[int] = []
    product = gemm.matmul
    monkeypatch.setattr(gemm, "matmul",
                        lambda *args, **kwargs: (products.append(1), product(*args, **kwargs))[1])
    got = moe.block_add_zrms(x, router_weight, gate_up, down, 3, True, (shared.gate_up, shared.down), stream)
    assert len(products) == (0 if inside and rows == 1 else 1)  # in the launch at one row, else before it
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not moe_one.counters(x.device).any()  # the router's counters rearmed too
    with pytest.raises(ValueError, match="router_weight"):
        moe.block_add_zrms(x, router_weight[:8], gate_up, down, 3, True, (shared.gate_up, shared.down),
                           stream)


@pytest.mark.parametrize(("rows", "inside", "with_shared"),
                         [(1, True, True), (1, True, False), (1, False, True), (2, True, True)])
def test_the_block_without_a_residual_is_the_routers_product_then_routed(
        monkeypatch: pytest.MonkeyPatch, rows: int, inside: bool, with_shared: bool) -> None:
    # Flash Next's block (its hyper-connection writes the output back): at one row the router's product in
    # the experts' launch, at two rows (or with ROUTER_IN_LAUNCH off) gemm's logits read in place
    x, gate_up, down, _, _ = make(rows, 3, torch.bfloat16, seed=61 + rows, hidden=72)
    shared = make_shared(rows, torch.bfloat16, seed=61 + rows, hidden=72) if with_shared else None
    generator = torch.Generator().manual_seed(61)
    router_weight = (torch.randn(8 + with_shared, 72, generator=generator) / 8).bfloat16()
    logits = gemm.matmul(x, router_weight)
    want = moe.routed(x, gate_up, down, logits[:, :8], 3, True,
                      None if shared is None else shared._replace(gate=logits[:, 8:]))
    monkeypatch.setattr(moe, "ROUTER_IN_LAUNCH", inside)
    products: list[int] = []
    product = gemm.matmul
    monkeypatch.setattr(gemm, "matmul",
                        lambda *args, **kwargs: (products.append(1), product(*args, **kwargs))[1])
    got = moe.block(x, router_weight, gate_up, down, 3, True,
                    None if shared is None else (shared.gate_up, shared.down))
    assert len(products) == (0 if inside and rows == 1 else 1)  # in the launch at one row, else before it
    assert torch.equal(got, want)
    assert not moe_one.counters(x.device).any()
    with pytest.raises(ValueError, match="router_weight"):
        moe.block(x, router_weight[:7], gate_up, down, 3, True, None)


def spread_and_alone(monkeypatch: pytest.MonkeyPatch, block: Callable[[], tuple[torch.Tensor, ...]]
                     ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], list[torch.Tensor]]:
    """``block``'s outputs with the one launch's finish spread over its column blocks, then with its
    last program finishing alone; each launch's ids and weights after it (the choice it wrote)."""
    chosen: list[torch.Tensor] = []
    one = moe_one.launch

    def launch(*args: Any, **kwargs: Any) -> None:
        one(*args, **kwargs)
        chosen.extend((args[9].clone(), args[10].clone()))

    monkeypatch.setattr(moe_one, "launch", launch)
    monkeypatch.setattr(moe_one, "SPREAD_FINISH", True)
    spread = block()
    assert len(chosen) == 2  # the one launch served it
    assert not moe_one.counters(spread[0].device).any()  # every counter rearmed, the column blocks' too
    monkeypatch.setattr(moe_one, "SPREAD_FINISH", False)
    return spread, block(), chosen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_shared", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_one_launch_gives_the_same_bits_with_its_finish_spread_over_column_blocks(
        monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, with_shared: bool, residual: bool) -> None:
    # 16 down columns a program over a row of 72: five column blocks, the last one half past the row
    monkeypatch.setattr(moe, "DOWN_N", 16)
    x, gate_up, down, _, _ = make(1, 3, dtype, seed=53, hidden=72)
    logits = router_product(1, 8, dtype, seed=53)
    shared = make_shared(1, dtype, seed=53, hidden=72) if with_shared else None
    stream = residual_of(1, dtype, seed=53, hidden=72)

    def block() -> tuple[torch.Tensor, ...]:
        if residual:
            return moe.routed_add_zrms(x, gate_up, down, logits[:, :8], 3, True, shared, stream)
        return (moe.routed(x, gate_up, down, logits[:, :8], 3, True, shared),)

    spread, alone, chosen = spread_and_alone(monkeypatch, block)
    assert all(torch.equal(a, b) for a, b in zip(spread, alone, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(chosen[:2], chosen[2:], strict=True))
    ids, weights = router.top_k(logits[:, :8], 3, True, dtype)
    assert torch.equal(chosen[0], ids) and torch.equal(chosen[1], weights)  # the router kernel's choice
    monkeypatch.setattr(moe, "ONE_LAUNCH", False)  # the launches one after another: the same bits
    assert all(torch.equal(a, b) for a, b in zip(spread, block(), strict=True))
    if residual:  # and add_zrms of the block, as routed_add_zrms promises
        routed = moe.routed(x, gate_up, down, logits[:, :8], 3, True, shared)
        want = norm.add_zrms(stream.x, routed, stream.weight, stream.eps)
        assert torch.equal(spread[0], want[0]) and torch.equal(spread[1], want[1])


def test_the_block_from_its_input_spreading_the_finish_gives_the_same_bits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the router's product in the launch too: the last block's program rearms its counters as well
    monkeypatch.setattr(moe, "DOWN_N", 16)
    x, gate_up, down, _, _ = make(1, 3, torch.bfloat16, seed=59, hidden=72)
    shared = make_shared(1, torch.bfloat16, seed=59, hidden=72)
    stream = residual_of(1, torch.bfloat16, seed=59, hidden=72)
    router_weight = (torch.randn(9, 72, generator=torch.Generator().manual_seed(59)) / 8).bfloat16()

    def block() -> tuple[torch.Tensor, ...]:
        return moe.block_add_zrms(x, router_weight, gate_up, down, 3, True, (shared.gate_up, shared.down),
                                  stream)

    spread, alone, _ = spread_and_alone(monkeypatch, block)
    assert all(torch.equal(a, b) for a, b in zip(spread, alone, strict=True))
    logits = gemm.matmul(x, router_weight)
    want = moe.routed_add_zrms(x, gate_up, down, logits[:, :8], 3, True, shared._replace(gate=logits[:, 8:]),
                               stream)
    assert all(torch.equal(a, b) for a, b in zip(spread, want, strict=True))


def test_the_residual_add_past_a_chunk_is_add_zrms_of_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    x, gate_up, down, _, _ = make(7, 2, torch.float32, seed=7)
    logits, shared = router_product(7, 8, torch.float32, seed=7), make_shared(7, torch.float32, seed=7)
    residual = residual_of(7, torch.float32, seed=7)
    want = moe.routed_add_zrms(x, gate_up, down, logits[:, :8], 2, True, shared, residual)
    monkeypatch.setattr(moe, "ROW_CHUNK", 3)  # three passes: the block first, then add_zrms
    got = moe.routed_add_zrms(x, gate_up, down, logits[:, :8], 2, True, shared, residual)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(ValueError, match=r"residual\.x"):
        moe.routed_add_zrms(x, gate_up, down, logits[:, :8], 2, True, shared,
                            residual._replace(x=residual.x[:3]))



@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 32])
def test_gpu_the_block_added_to_the_residual_is_add_zrms_of_it(rows: int) -> None:
    x, gate_up, down, _, _ = make_real(rows, 256, 8, seed=rows)
    logits = router_product(rows, 256, torch.bfloat16, seed=rows, device="cuda")
    shared = make_real_shared(rows, 256, seed=rows)
    residual = residual_of(rows, torch.bfloat16, seed=rows, hidden=2048, device="cuda")
    block = moe.routed(x, gate_up, down, logits[:, :256], 8, True, shared)
    want = norm.add_zrms(residual.x, block, residual.weight, residual.eps)
    got = moe.routed_add_zrms(x, gate_up, down, logits[:, :256], 8, True, shared, residual)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
@pytest.mark.parametrize(("experts", "top_k"), REAL)
def test_gpu_one_row_in_one_launch_is_two_launches_and_replays(monkeypatch: pytest.MonkeyPatch, experts: int,
                                                               top_k: int) -> None:
    x, gate_up, down, _, _ = make_real(1, experts, top_k, seed=23)
    logits = router_product(1, experts, torch.bfloat16, seed=23, device="cuda")
    shared = make_real_shared(1, experts, seed=23)._replace(gate=logits[:, experts:])
    residual = residual_of(1, torch.bfloat16, seed=23, hidden=2048, device="cuda")

    def block() -> tuple[torch.Tensor, torch.Tensor]:
        return moe.routed_add_zrms(x, gate_up, down, logits[:, :experts], top_k, True, shared, residual)

    monkeypatch.setattr(moe, "ONE_LAUNCH", False)
    want = [block()]
    logits.copy_(router_product(1, experts, torch.bfloat16, seed=24, device="cuda"))
    want.append(block())
    monkeypatch.setattr(moe, "ONE_LAUNCH", True)
    logits.copy_(router_product(1, experts, torch.bfloat16, seed=23, device="cuda"))
    block()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = block()
    for seed, expected in zip((23, 24), want, strict=True):
        logits.copy_(router_product(1, experts, torch.bfloat16, seed=seed, device="cuda"))
        graph.replay()
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert not moe_one.counters(x.device).any()


@pytest.mark.gpu
def test_gpu_flash_nexts_block_in_one_launch_is_two_launches_and_replays(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Flash Next's block at one row: hidden 2,560 (a norm's 8 warps), 512 experts of inner 640, top 10, the
    # shared expert beside them, no residual: the one launch (cf88943) against its two
    x, gate_up, down, _, _ = make(1, 10, torch.bfloat16, seed=31, experts=512, hidden=2560, inner=640,
                                  device="cuda")
    logits = router_product(1, 512, torch.bfloat16, seed=31, device="cuda")
    shared = make_shared(1, torch.bfloat16, seed=31, experts=512, hidden=2560, inner=640,
                         device="cuda")._replace(gate=logits[:, 512:])
    launches: list[int] = []
    one = moe_one.launch
    monkeypatch.setattr(moe_one, "launch",
                        lambda *args, **kwargs: (launches.append(1), one(*args, **kwargs))[1])

    def block() -> torch.Tensor:
        return moe.routed(x, gate_up, down, logits[:, :512], 10, True, shared)

    monkeypatch.setattr(moe, "ONE_LAUNCH", False)
    want = [block()]
    logits.copy_(router_product(1, 512, torch.bfloat16, seed=32, device="cuda"))
    want.append(block())
    assert launches == []
    monkeypatch.setattr(moe, "ONE_LAUNCH", True)
    logits.copy_(router_product(1, 512, torch.bfloat16, seed=31, device="cuda"))
    block()  # compile outside the capture
    assert launches == [1]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = block()
    for seed, expected in zip((31, 32), want, strict=True):
        logits.copy_(router_product(1, 512, torch.bfloat16, seed=seed, device="cuda"))
        graph.replay()
        assert torch.equal(got, expected)
    assert not moe_one.counters(x.device).any()


@pytest.mark.gpu
def test_gpu_flash_nexts_block_from_its_input_takes_the_routers_product_in_its_launch() -> None:
    # hidden 2,560, 512 experts of inner 640, top 10 and the shared expert, no residual: the router's
    # [513, 2,560] product in the one launch, gemm's bits, replayed from a CUDA graph
    x, gate_up, down, _, _ = make(1, 10, torch.bfloat16, seed=37, experts=512, hidden=2560, inner=640,
                                  device="cuda")
    shared = make_shared(1, torch.bfloat16, seed=37, experts=512, hidden=2560, inner=640, device="cuda")
    router_weight = (torch.randn(513, 2560, generator=torch.Generator("cuda").manual_seed(37), device="cuda")
                     / 50).bfloat16()
    assert moe_one.takes_router(513, 2560)

    def want() -> torch.Tensor:
        logits = gemm.matmul(x, router_weight)
        return moe.routed(x, gate_up, down, logits[:, :512], 10, True, shared._replace(gate=logits[:, 512:]))

    moe.block(x, router_weight, gate_up, down, 10, True, (shared.gate_up, shared.down))  # compile first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = moe.block(x, router_weight, gate_up, down, 10, True, (shared.gate_up, shared.down))
    for seed in (38, 39):
        x.copy_(torch.randn(1, 2560, generator=torch.Generator("cuda").manual_seed(seed), device="cuda"))
        graph.replay()
        assert torch.equal(got, want())
    assert not moe_one.counters(x.device).any()


@pytest.mark.gpu
@pytest.mark.parametrize(("experts", "top_k"), REAL)
@pytest.mark.parametrize(("router_n", "from_partials", "taken", "last", "early"), [
    (0, True, True, False, 0), (0, False, True, False, 0), (32, True, True, False, 0),
    (16, True, True, False, 0), (32, True, False, False, 0), (32, True, True, True, 0),
    (32, True, True, False, 1), (32, True, True, False, 2)])
def test_gpu_the_block_from_its_input_in_one_launch_is_the_routers_product_then_the_block(
        experts: int, top_k: int, router_n: int, from_partials: bool, taken: bool, last: bool,
        early: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # the router's tiles of any width, its logits summed by tiles or by every choosing program, the down
    # programs taking the tile's choice or making it, the shared expert's down programs first or last, the
    # router's first weights asked for before the wait or not: same bits
    monkeypatch.setattr(moe_one, "ROUTER_N", router_n)
    monkeypatch.setattr(moe_one, "ROUTER_EARLY", early)
    monkeypatch.setattr(moe_one, "FROM_PARTIALS", from_partials)
    monkeypatch.setattr(moe_one, "DOWN_TAKES_CHOICE", taken)
    monkeypatch.setattr(moe_one, "SHARED_DOWN_LAST", last)
    x, gate_up, down, _, _ = make_real(1, experts, top_k, seed=29)
    shared = make_real_shared(1, experts, seed=29)
    residual = residual_of(1, torch.bfloat16, seed=29, hidden=2048, device="cuda")
    router_weight = (torch.randn(experts + 1, 2048, device="cuda") / 45).bfloat16()

    def want() -> tuple[torch.Tensor, torch.Tensor]:
        logits = gemm.matmul(x, router_weight)
        return moe.routed_add_zrms(x, gate_up, down, logits[:, :experts], top_k, True,
                                   shared._replace(gate=logits[:, experts:]), residual)

    moe.block_add_zrms(x, router_weight, gate_up, down, top_k, True, (shared.gate_up, shared.down), residual)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = moe.block_add_zrms(x, router_weight, gate_up, down, top_k, True, (shared.gate_up, shared.down),
                                 residual)
    for seed in (30, 31):
        x.copy_(torch.randn(1, 2048, generator=torch.Generator("cuda").manual_seed(seed), device="cuda"))
        graph.replay()
        expected = want()
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert not moe_one.counters(x.device).any()
