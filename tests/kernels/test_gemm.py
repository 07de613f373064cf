"""The batch-invariant GEMM: numerics against torch, and rows that never depend on the batch."""

from __future__ import annotations

import pytest
import torch

from tfd_kernels import conv1d, gemm, gemm_plan, swiglu


def weights(n: int, k: int, dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    return (torch.randn(n, k, generator=torch.Generator().manual_seed(n * 7 + k)) * 0.05).to(device, dtype)


@pytest.mark.parametrize(("m", "n", "k"), [(1, 70, 200), (5, 64, 1024), (9, 130, 96)])
def test_matches_torch_in_fp32(m: int, n: int, k: int) -> None:
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    w = weights(n, k, torch.float32)
    assert torch.allclose(gemm.matmul(x, w), gemm.reference(x, w), rtol=1e-5, atol=1e-5)


def test_bf16_within_rounding() -> None:
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(3)).bfloat16()
    w = weights(96, 512, torch.bfloat16)
    got, want = gemm.matmul(x, w).float(), gemm.reference(x, w).float()
    # Triton's interpreter truncates to bf16 where the device rounds: allow two units in the last place
    assert ((got - want).abs() <= 2 ** -6 * want.abs() + 1e-3).all()


def one_tile(n: int, k: int, tiles: gemm_plan.Tiles) -> gemm_plan.Plan:
    """The plan for an [n, k] weight with ``tiles`` in every form."""
    return gemm_plan.plan(n, k, spread=tiles, whole=tiles, few=tiles, mid=tiles, whole_one=tiles,
                          middle=tiles, narrow=tiles)


def test_plan_follows_the_weight_alone() -> None:
    plan = gemm_plan.plan(4096, 12288)
    assert plan.segments > 1 and plan.segments * plan.k_per_segment >= 12288
    assert (plan.segments - 1) * plan.k_per_segment < 12288  # no empty segment
    assert plan.whole_tiles() == gemm_plan.WHOLE
    head = gemm_plan.plan(248320, 4096)
    assert head.segments == 1  # enough programs already: no partial sums
    assert head.whole_tiles() == gemm_plan.WHOLE_ONE  # one accumulator: the taller tile


@pytest.mark.parametrize(("k", "one_segment"), [(1024, False), (256, True)])
def test_both_launch_forms_give_the_same_bits(k: int, one_segment: bool) -> None:
    # Same tiles in both forms: the interpreter's dot (numpy) sums a tile in an order that follows
    # its shape, where the GPU's MMA does not (that part is the GPU test's).
    tiles = gemm_plan.Tiles(16, 64, 64)
    choice = one_tile(64, k, tiles)
    x = torch.randn(6, k, generator=torch.Generator().manual_seed(6))
    w = weights(64, k, torch.float32)
    assert (choice.segments == 1) == one_segment
    assert torch.equal(gemm.matmul(x, w, spread=True, choice=choice),
                       gemm.matmul(x, w, spread=False, choice=choice))
    # every tile's last program rearmed its arrival counter, so the next product starts from zero
    assert not gemm._counters(x.device, 1).any()


def test_a_row_alone_equals_the_row_in_a_batch() -> None:
    x = torch.randn(7, 512, generator=torch.Generator().manual_seed(7))
    w = weights(80, 512, torch.float32)
    batch = gemm.matmul(x, w)
    for row in (0, 3, 6):
        assert torch.equal(gemm.matmul(x[row:row + 1], w)[0], batch[row])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("spread", [True, False])
def test_the_paired_product_forms_swiglus_middle_as_the_plain_product_then_swiglu(
        dtype: torch.dtype, spread: bool) -> None:
    inner, k = 96, 256
    tiles = gemm_plan.Tiles(16, 64, 64)  # one tile shape in both products and forms (see above)
    choice = one_tile(2 * inner, k, tiles)
    gate_up = weights(2 * inner, k, dtype)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(5)).to(dtype)
    want = swiglu.swiglu(gemm.matmul(x, gate_up, spread=spread, choice=choice))
    got = gemm.matmul(x, swiglu.pair_rows(gate_up), spread=spread, choice=choice, swiglu=True)
    assert got.shape == (5, inner)
    assert torch.equal(got, want)


def test_paired_columns_read_as_the_plain_ones() -> None:
    h = torch.randn(3, 2 * 64, generator=torch.Generator().manual_seed(3))
    paired = swiglu.pair_rows(h.T.contiguous()).T.contiguous()  # the columns a paired product writes
    assert torch.equal(swiglu.swiglu(paired, paired=True), swiglu.swiglu(h))
    with pytest.raises(ValueError, match="multiple of 64"):
        swiglu.pair_rows(torch.zeros(96, 8))


def test_shapes_are_checked_by_name() -> None:
    with pytest.raises(ValueError, match="x is"):
        gemm.matmul(torch.zeros(2, 8), torch.zeros(4, 9))


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(12288, 4096), (4096, 12288), (16448, 4096), (8192, 4096),
                                      (24576, 4096)])  # the last: one K segment, the wider whole tile
def test_rows_are_batch_invariant_on_the_device(n: int, k: int) -> None:
    w = weights(n, k, torch.bfloat16, "cuda")
    x = torch.randn(512, k, device="cuda", dtype=torch.bfloat16)
    whole = gemm.matmul(x, w)
    for m in (1, 2, 3, 8, 16, 33, 64, 65, 128, 511):
        assert torch.equal(gemm.matmul(x[:m], w), whole[:m]), f"rows differ at m={m}"
    got, want = whole.float(), gemm.reference(x, w).float()
    assert ((got - want).abs() <= 2 ** -7 * want.abs() + 2e-3).all()


@pytest.mark.gpu
@pytest.mark.parametrize("inner", [12288, 2048])  # one K segment (the taller whole tile), then two
def test_the_paired_product_gives_the_plain_bits_on_the_device(inner: int) -> None:
    gate_up = weights(2 * inner, 4096, torch.bfloat16, "cuda")
    paired = swiglu.pair_rows(gate_up)
    x = torch.randn(192, 4096, device="cuda", dtype=torch.bfloat16)
    for m in (1, 17, 33, 64, 80, 192):  # every spread tile (80: the middle one), then the whole form
        want = swiglu.swiglu(gemm.matmul(x[:m], gate_up))
        assert torch.equal(gemm.matmul(x[:m], paired, swiglu=True), want), f"differs at m={m}"


def test_the_spread_form_takes_the_middle_rows_where_the_whole_form_would_idle() -> None:
    # qwen3_5-9b's products: up to 64 rows all spread; at 65 to 128 the out and down projections (32
    # whole-form programs) and gate|up (one K segment: its whole tile twice the rows) spread, the GDN
    # and attention projections (80 and 97 programs) stay whole; from 129 rows all whole
    spreads = {(n, k): [gemm_plan.plan(n, k).spreads(m, n) for m in (64, 65, 128, 129)]
               for n, k in ((4096, 4096), (4096, 12288), (24576, 4096), (10240, 4096), (12352, 4096))}
    assert spreads == {(4096, 4096): [True, True, True, False], (4096, 12288): [True, True, True, False],
                       (24576, 4096): [True, True, True, False], (10240, 4096): [True, False, False, False],
                       (12352, 4096): [True, False, False, False]}
    assert gemm_plan.plan(4096, 4096).spread_tiles(100) == gemm_plan.MIDDLE


def test_k_segments_give_two_programs_per_multiprocessor() -> None:
    # decode shapes of qwen3_5-9b: at least gemm_plan.TARGET_PROGRAMS programs of 64 columns where K allows
    for n, k, segments in ((12352, 4096, 2), (10240, 4096, 2), (4096, 4096, 5), (4096, 12288, 5),
                           (2048, 4096, 8), (24576, 4096, 1)):
        assert gemm_plan.plan(n, k).segments == segments, (n, k)


def test_narrow_products_may_take_shorter_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    # Flash Next's hyper down rows [324, 10240]: 6 column tiles, 80 K steps
    assert gemm_plan.plan(324, 10240).segments == 20 and gemm_plan.NARROW_TILES == 0
    monkeypatch.setattr(gemm_plan, "NARROW_TILES", 6)
    assert gemm_plan.plan(324, 10240).segments == 40  # at the bound: two K steps a segment
    assert gemm_plan.plan(384, 10240).segments == 40
    assert gemm_plan.plan(385, 10240).segments == 20  # a seventh tile: past it


def test_many_rows_of_a_narrow_product_take_the_narrow_whole_tile(monkeypatch: pytest.MonkeyPatch) -> None:
    # Flash Next's hyper down rows [324, 10240]: 20 K segments, 3 whole-form column tiles of 128
    down = gemm_plan.plan(324, 10240)
    assert down.segments == 20 and gemm_plan.NARROW_WHOLE_PROGRAMS == 44
    # 14 row tiles of 128 make 42 programs, 15 make 45: the bound
    assert [down.whole_tiles(2, m, 324) for m in (129, 1024, 14 * 128, 14 * 128 + 1, 4096)] == \
        [gemm_plan.NARROW_WHOLE] * 3 + [gemm_plan.WHOLE] * 2
    assert down.whole_tiles(2) == gemm_plan.WHOLE  # no rows given (the form's choice): the usual tile
    one = gemm_plan.plan(324, 256)
    assert one.segments == 1 and one.whole_tiles(2, 1024, 324) == gemm_plan.WHOLE_ONE  # nothing to narrow
    assert gemm_plan.plan(2560, 4096).whole_tiles(2, 1024, 2560) == gemm_plan.WHOLE  # 160 programs
    monkeypatch.setattr(gemm_plan, "NARROW_WHOLE_PROGRAMS", 0)
    assert down.whole_tiles(2, 1024, 324) == gemm_plan.WHOLE  # off
    # segments stay whole K steps of every tile, the narrow one's included
    assert gemm_plan.plan(324, 10240, narrow=gemm_plan.Tiles(64, 64, 256)).k_per_segment % 256 == 0


@pytest.mark.parametrize("m", [40, 130])  # under the narrow tile's rows, and past two of its row blocks
def test_the_narrow_whole_tile_gives_the_whole_forms_bits(m: int, monkeypatch: pytest.MonkeyPatch) -> None:
    tiles, narrow = gemm_plan.Tiles(32, 64, 64), gemm_plan.Tiles(16, 32, 64)
    choice = gemm_plan.plan(64, 1024, spread=tiles, whole=tiles, few=tiles, mid=tiles, whole_one=tiles,
                            middle=tiles, narrow=narrow)
    x = torch.randn(m, 1024, generator=torch.Generator().manual_seed(m))
    w = weights(64, 1024, torch.float32)
    assert choice.segments > 1
    whole = gemm.matmul(x, w, spread=False, choice=choice)
    monkeypatch.setattr(gemm_plan, "NARROW_WHOLE_PROGRAMS", 1 << 20)
    assert choice.whole_tiles(4, m, 64) == narrow
    assert torch.equal(gemm.matmul(x, w, spread=False, choice=choice), whole)


@pytest.mark.gpu
def test_the_narrow_whole_tile_gives_the_same_bits_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    # Flash Next's hyper down rows at a 1,024-row prompt and past the bound (1,793 rows), and a row alone
    w = weights(324, 10240, torch.bfloat16, "cuda")
    x = torch.randn(1900, 10240, device="cuda", dtype=torch.bfloat16)
    monkeypatch.setattr(gemm_plan, "NARROW_WHOLE_PROGRAMS", 0)
    whole = gemm.matmul(x, w)
    monkeypatch.undo()
    assert gemm_plan.NARROW_WHOLE_PROGRAMS == 44
    for m in (1, 129, 1024, 1792, 1793, 1900):
        assert torch.equal(gemm.matmul(x[:m], w), whole[:m]), f"differs at m={m}"


def test_fp32_operands_take_a_shorter_k_step_so_the_stages_fit() -> None:
    for choice in (gemm_plan.plan(4096, 12288), gemm_plan.plan(248320, 4096)):
        wide, narrow = choice.whole_tiles(2), choice.whole_tiles(4)
        assert narrow.block_k == wide.block_k // 2 and narrow.block_m == wide.block_m
        shared = narrow.stages * (narrow.block_m + narrow.block_n) * narrow.block_k * 4
        assert shared <= gemm_plan.SHARED_BYTES


def conv_pool(lanes: int, channels: int, width: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A pool view with each lane's conv tail at its own offset (lane 1 padding, offset -1)."""
    gen = torch.Generator().manual_seed(lanes)
    size = (width - 1) * channels
    pool = torch.randn(lanes * size + 64, generator=gen).to(dtype)
    tail_at = torch.tensor([64 + lane * size for lane in range(lanes)], dtype=torch.int64)
    if lanes > 1:
        tail_at[1] = -1
    return pool, tail_at


def check_projection_conv(channels: int, m: int, spread: bool, width: int, seed: int,
                          early: bool = False) -> None:
    """The [192, 256] product with its conv over the first ``channels`` columns is the product then
    conv1d.decode: the same bits and tails moved, the padding lane's untouched."""
    n, k = 192, 256
    tiles = gemm_plan.Tiles(16, 64, 64)
    choice = one_tile(n, k, tiles)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
    w = weights(n, k, torch.float32)
    conv_weight = torch.randn(channels, width, generator=torch.Generator().manual_seed(1)) / 2
    fused_pool, tail_at = conv_pool(m, channels, width, torch.float32)
    plain_pool = fused_pool.clone()
    got = gemm.matmul(x, w, spread=spread, choice=choice, conv=gemm.Conv(conv_weight, fused_pool, tail_at),
                      early=early)
    want = gemm.matmul(x, w, spread=spread, choice=choice)
    want[:, :channels] = conv1d.decode(want[:, :channels], conv_weight, plain_pool, tail_at)
    assert torch.equal(got, want)
    assert torch.equal(fused_pool, plain_pool)  # tails moved the same, the padding lane's untouched
    assert not got[1, :channels].any()


@pytest.mark.parametrize(("channels", "m", "spread"),
                         [(128, 5, True), (128, 20, True), (96, 5, True), (128, 70, False)])
def test_the_projection_with_its_conv_is_the_product_then_conv1d(channels: int, m: int, spread: bool) -> None:
    # 128 of 192 columns: whole spread tiles, applied as they store; 96: a tile across the edge, so the
    # conv runs after; 70 rows: the whole form, conv after. Either way conv1d.decode's bits and tails.
    check_projection_conv(channels, m, spread, 4, seed=m)


@pytest.mark.gpu
def test_the_projection_with_its_conv_on_the_device() -> None:
    # qwen3_5-9b's GDN projection: 8192 conv columns of 12352; every spread tile size, then the whole form
    w = weights(12352, 4096, torch.bfloat16, "cuda")
    conv_weight = (torch.randn(8192, 4, device="cuda") / 2).bfloat16()
    for m in (1, 3, 17, 33, 64, 80):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        pool, tail_at = conv_pool(m, 8192, 4, torch.bfloat16)
        pool, tail_at = pool.cuda(), tail_at.cuda()
        plain = pool.clone()
        got = gemm.matmul(x, w, conv=gemm.Conv(conv_weight, pool, tail_at))
        want = gemm.matmul(x, w)
        want[:, :8192] = conv1d.decode(want[:, :8192], conv_weight, plain, tail_at)
        assert torch.equal(got, want) and torch.equal(pool, plain), f"differs at m={m}"


@pytest.mark.parametrize("steps", [1, 2, 4, 6])  # 6: more than a program holds (MOST_EARLY), so 4
def test_weights_asked_for_before_the_wait_give_the_same_bits(steps: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # a plain product at few rows and the projection with its conv, one segment of six K steps
    n, k, width, channels = 192, 384, 4, 128
    tiles = gemm_plan.Tiles(16, 64, 64)
    choice = one_tile(n, k, tiles)
    assert choice.k_per_segment // tiles.block_k == 6 and gemm.MOST_EARLY == 4
    monkeypatch.setattr(gemm, "EARLY_STEPS", steps)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(3))
    w = weights(n, k, torch.float32)
    conv_weight = torch.randn(channels, width, generator=torch.Generator().manual_seed(1)) / 2
    pool, tail_at = conv_pool(5, channels, width, torch.float32)
    early_pool = pool.clone()
    want = gemm.matmul(x, w, choice=choice), gemm.matmul(x, w, choice=choice,
                                                           conv=gemm.Conv(conv_weight, pool, tail_at))
    got = (gemm.matmul(x, w, choice=choice, early=True),
           gemm.matmul(x, w, choice=choice, conv=gemm.Conv(conv_weight, early_pool, tail_at), early=True))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(early_pool, pool)


@pytest.mark.gpu
@pytest.mark.parametrize("steps", [1, 2, 4])
def test_weights_asked_for_before_the_wait_on_the_device(steps: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # the 35B-A3B's GDN projection with its conv and its attention qkv product, one row, four and 32
    monkeypatch.setattr(gemm, "EARLY_STEPS", steps)
    w = weights(12352, 2048, torch.bfloat16, "cuda")
    qkv = weights(9216, 2048, torch.bfloat16, "cuda")
    conv_weight = (torch.randn(8192, 4, device="cuda") / 2).bfloat16()
    for m in (1, 4, 32):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        pool, tail_at = conv_pool(m, 8192, 4, torch.bfloat16)
        pool, tail_at = pool.cuda(), tail_at.cuda()
        early_pool = pool.clone()
        want = gemm.matmul(x, w, conv=gemm.Conv(conv_weight, pool, tail_at)), gemm.matmul(x, qkv)
        got = (gemm.matmul(x, w, conv=gemm.Conv(conv_weight, early_pool, tail_at), early=True),
               gemm.matmul(x, qkv, early=True))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"differs at m={m}"
        assert torch.equal(early_pool, pool)


@pytest.mark.parametrize("width", [2, 3, 4, 5])
def test_the_conv_read_with_the_partials_gives_conv1d_bits(width: int) -> None:
    # a tile's last program asks for the tail rows and weights with the partials (widths up to 4; 5 runs
    # conv1d.decode after the product): conv1d.decode's bits and tails, the padding lane's untouched
    check_projection_conv(128, 5, True, width, seed=width, early=True)
