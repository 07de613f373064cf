"""The MoE kernels with FP8 expert weights on every path (tfd_kernels.moe, moe_one): a row's bits alone
and in batches of several sizes, through the plan, the router's choice, one row's launches and its one
launch (its down weights and scales asked for early), the block from its input, a prompt's tiles and row
chunks; and every wrong FP8 argument named."""

from __future__ import annotations

import pytest
import torch
from moe_inputs import gate_rows, make_shared, residual_of, router_product
from test_moe_fp8 import floated, fp8_inputs, generator, stack

from tfd_kernels import fp8_gemm, gemm, moe, moe_one, norm


@pytest.mark.parametrize(("shared_kind", "inner"), [("fp8", 192), ("float", 64), (None, 64)])
def test_a_row_alone_equals_the_row_in_any_batch(shared_kind: str | None, inner: int) -> None:
    x, gate_up, down, ids, weights, fp8_shared = fp8_inputs(12, 3, seed=13, inner=inner, shared_inner=128)
    shared = {"fp8": fp8_shared, "float": make_shared(12, x.dtype, seed=13), None: None}[shared_kind]

    def part(rows: slice | torch.Tensor) -> torch.Tensor:
        return moe.experts(x[rows], gate_up, down, ids[rows], weights[rows],
                           None if shared is None else gate_rows(shared, rows))

    batch = part(slice(12))
    for rows in (1, 7):
        assert torch.equal(part(slice(rows)), batch[:rows])
    assert torch.equal(part(slice(11, 12)), batch[11:])
    order = torch.randperm(12, generator=generator(14))
    assert torch.equal(part(order), batch[order])


def test_every_routed_path_gives_a_row_the_bits_of_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Routed from logits: 12 rows of top-3 through the router kernel, 9 choosing in the plan's launch,
    one row in one launch, in two, and through the plan: the rows' bits, the shared expert FP8."""
    x, gate_up, down, _, _, shared = fp8_inputs(12, 3, seed=15)
    logits = router_product(12, 8, x.dtype, seed=15)
    shared = shared._replace(gate=logits[:, 8:])

    def routed(rows: int) -> torch.Tensor:
        return moe.routed(x[:rows], gate_up, down, logits[:rows, :8], 3, True, gate_rows(shared, slice(rows)))

    whole = routed(12)
    assert torch.equal(routed(9), whole[:9]) and torch.equal(routed(2), whole[:2])
    for flag, value in (("ONE_LAUNCH", True), ("ONE_LAUNCH", False), ("ONE_ROW", False)):
        monkeypatch.setattr(moe, flag, value)
        assert torch.equal(routed(1), whole[:1]), (flag, value)


@pytest.mark.parametrize(("inner", "shared_fp8"), [(64, True), (512, True), (64, False)])
def test_one_row_in_one_launch_is_its_launches_one_after_another(monkeypatch: pytest.MonkeyPatch, inner: int,
                                                                 shared_fp8: bool) -> None:
    # inner 512: four K blocks, so the one launch's down programs load their weights and scales before h
    # is ready; the shared expert float beside FP8 routed experts: each tile takes its own kind's branch
    x, gate_up, down, _, _, shared = fp8_inputs(1, 3, seed=16, inner=inner, shared_inner=inner)
    if not shared_fp8:
        shared = floated(shared, x.dtype)
    logits = router_product(1, 8, x.dtype, seed=16)
    stream = residual_of(1, x.dtype, seed=16)
    launches: list[int] = []
    one = moe_one.launch
    monkeypatch.setattr(moe_one, "launch",
                        lambda *args, **kwargs: (launches.append(1), one(*args, **kwargs))[1])
    got = moe.routed_add_zrms(x, gate_up, down, logits[:, :8], 3, True, shared, stream)
    assert launches == [1] and not moe_one.counters(x.device).any()
    monkeypatch.setattr(moe, "ONE_LAUNCH", False)
    want = moe.routed_add_zrms(x, gate_up, down, logits[:, :8], 3, True, shared, stream)
    assert launches == [1] and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    if inner == 512:  # the rest is inner 64's to check (slow at 512 here)
        return
    block = moe.routed(x, gate_up, down, logits[:, :8], 3, True, shared)
    added = norm.add_zrms(stream.x, block, stream.weight, stream.eps)
    assert torch.equal(got[0], added[0]) and torch.equal(got[1], added[1])


def test_the_block_from_its_input_takes_fp8_experts_beside_the_float_router() -> None:
    x, gate_up, down, _, _, shared = fp8_inputs(3, 3, seed=17)
    router_weight = (torch.randn(9, 64, generator=generator(17)) / 8).to(x.dtype)
    logits = gemm.matmul(x, router_weight)
    parts = (shared.gate_up, shared.down)
    for rows in (1, 3):  # the router's product in the experts' one launch, then before them
        stream = residual_of(rows, x.dtype, seed=17)
        want = moe.routed_add_zrms(x[:rows], gate_up, down, logits[:rows, :8], 3, True,
                                   shared._replace(gate=logits[:rows, 8:]), stream)
        got = moe.block_add_zrms(x[:rows], router_weight, gate_up, down, 3, True, parts, stream)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(ValueError, match="router_weight"):  # the router stays a float product
        moe.block_add_zrms(x, stack(router_weight).data, gate_up, down, 3, True, parts, stream)


def test_the_block_reads_x_quantized_by_its_maker_instead_of_quantizing_it(monkeypatch: pytest.MonkeyPatch
                                                                          ) -> None:
    # one row (the one launch), three (the grouped launches), three in passes of two rows (row chunks)
    x, gate_up, down, _, _, shared = fp8_inputs(3, 3, seed=21)
    router_weight = (torch.randn(9, 64, generator=generator(21)) / 8).to(x.dtype)
    parts = (shared.gate_up, shared.down)

    def block(rows: int, x_rows: tuple[torch.Tensor, torch.Tensor] | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        return moe.block_add_zrms(x[:rows], router_weight, gate_up, down, 3, True, parts,
                                  residual_of(rows, x.dtype, seed=21), x_rows)

    wants = {rows: block(rows) for rows in (1, 3)}
    made = {rows: fp8_gemm.quantize(x[:rows]) for rows in (1, 3)}

    def refused(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise AssertionError("x quantized again")

    monkeypatch.setattr(fp8_gemm, "quantize", refused)
    monkeypatch.setattr(moe_one, "quantize", refused)
    for chunk in (moe.ROW_CHUNK, 2):
        monkeypatch.setattr(moe, "ROW_CHUNK", chunk)
        for rows in (1, 3):
            got, want = block(rows, made[rows]), wants[rows]
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(ValueError, match=r"rows must be float8_e4m3fn \[1, 64\]"):
        block(1, made[3])


def test_prompt_tiles_and_chunks_give_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt's wider column tiles and warps (FP8 tiles are FP8_M pairs either way), and 10 rows in
    passes of 4: the same bits."""
    x, gate_up, down, ids, weights, shared = fp8_inputs(10, 2, seed=18)
    stream = residual_of(10, x.dtype, seed=18)
    whole = moe.experts(x, gate_up, down, ids, weights, shared)
    monkeypatch.setattr(moe, "PROMPT_PAIRS", 2)
    assert torch.equal(moe.experts(x, gate_up, down, ids, weights, shared), whole)
    monkeypatch.setattr(moe, "ROW_CHUNK", 4)
    assert torch.equal(moe.experts(x, gate_up, down, ids, weights, shared), whole)
    logits = router_product(10, 8, x.dtype, seed=18)
    want = moe.routed_add_zrms(x, gate_up, down, logits[:, :8], 2, True, shared, stream)  # three passes
    monkeypatch.setattr(moe, "ROW_CHUNK", moe.ROW_CHUNK * 4)
    got = moe.routed_add_zrms(x, gate_up, down, logits[:, :8], 2, True, shared, stream)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_no_rows_give_no_rows() -> None:
    x, gate_up, down, ids, weights, shared = fp8_inputs(0, 2, seed=19)
    assert moe.experts(x, gate_up, down, ids, weights, shared).shape == (0, 64)


def _replaced(w: moe.Fp8Stack, **fields: torch.Tensor) -> moe.Fp8Stack:
    return moe.Fp8Stack(fields.get("data", w.data), fields.get("scale_inv", w.scale_inv))


def test_wrong_fp8_weights_name_the_argument_and_field() -> None:
    x, gate_up, down, ids, weights, shared = fp8_inputs(3, 2, seed=20, inner=192, shared_inner=64)
    meta = torch.empty(0, device="meta")
    routed = {
        "gate_up.data": _replaced(gate_up, data=gate_up.data.to(torch.float8_e5m2)),
        "gate_up.scale_inv": _replaced(gate_up, scale_inv=gate_up.scale_inv[:, :2]),  # 2 * 192 rows: 3 blocks
        "down.data": _replaced(down, data=down.data[:, :32]),  # hidden 32, not 64
        "down.scale_inv": _replaced(down, scale_inv=down.scale_inv.double()),
    }
    for name, wrong in routed.items():
        given = {"gate_up": gate_up, "down": down} | {name.split(".")[0]: wrong}
        with pytest.raises(ValueError, match=rf"^{name} must be"):
            moe.experts(x, **given, ids=ids, weights=weights)
    strided = torch.empty(64, 256, dtype=torch.float8_e4m3fn)[:, ::2]  # [hidden, 128], every other column
    parts = {
        "shared.gate_up.data": ("gate_up", _replaced(shared.gate_up, data=shared.gate_up.data[:100])),
        "shared.gate_up.scale_inv": ("gate_up", _replaced(shared.gate_up, scale_inv=shared.gate_up.scale_inv[
            [0, 0]])),  # two blocks of rows where 2 * 64 rows make one
        "shared.down.data": ("down", _replaced(shared.down, data=strided)),
        "shared.down.scale_inv": ("down", _replaced(shared.down, scale_inv=shared.down.scale_inv[:, :0])),
    }
    for name, (part, wrong) in parts.items():
        with pytest.raises(ValueError, match=rf"^{name.replace('.', '[.]')} must be"):
            moe.experts(x, gate_up, down, ids, weights, shared._replace(**{part: wrong}))
    with pytest.raises(ValueError, match=r"^down\.scale_inv is on meta"):
        moe.experts(x, gate_up, _replaced(down, scale_inv=meta.new_empty(down.scale_inv.shape)), ids, weights)
    with pytest.raises(ValueError, match=r"^gate_up must be a tensor in torch\.bfloat16 or an Fp8Stack"):
        moe.experts(x, (gate_up.data, gate_up.scale_inv), down, ids, weights)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^gate_up must be \[8, 384, 64\] in torch\.bfloat16"):
        moe.experts(x, gate_up.data, down, ids, weights)  # fp8 data without its scales


@pytest.mark.parametrize(("gate_n", "down_n"), [(64, 128), (16, 32)])
def test_fp8_decode_tiles_of_other_widths_give_the_same_bits(monkeypatch: pytest.MonkeyPatch, gate_n: int,
                                                           down_n: int) -> None:
    """The FP8 decode and one-row column tiles (``moe.FP8_GATE_N``, ``FP8_DOWN_N``: what a sweep on the
    device may choose) change no bits, in one launch and through the plan; the float tiles' constants
    stay bf16's."""
    x, gate_up, down, ids, weights, shared = fp8_inputs(5, 2, seed=21)
    logits = router_product(5, 8, x.dtype, seed=21)
    stream = residual_of(1, x.dtype, seed=21)

    def both() -> tuple[torch.Tensor, ...]:
        return (moe.experts(x, gate_up, down, ids, weights, shared),
                *moe.routed_add_zrms(x[:1], gate_up, down, logits[:1, :8], 2, True,
                                     gate_rows(shared, slice(1)), stream))

    want = both()
    monkeypatch.setattr(moe, "FP8_GATE_N", gate_n)
    monkeypatch.setattr(moe, "FP8_DOWN_N", down_n)
    monkeypatch.setattr(moe, "FP8_GATE_STAGES", 8)
    got = both()
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert (moe.GATE_N, moe.DOWN_N) == (32, 64)
