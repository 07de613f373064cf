"""The grouped-experts kernels: against their torch reference, and a row's bits whatever the batch,
routed experts alone and with the shared expert run beside them as one more expert."""

from __future__ import annotations

import pytest
import torch
from moe_inputs import (
    assert_near,
    assert_rows_as_in_the_batch,
    gate_rows,
    make,
    make_shared,
    router_product,
    rows_alone,
)

from tfd_kernels import moe, moe_plan, router, sigmoid_gate


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "top_k"), [(1, 2), (5, 3), (12, 2), (12, 3)])
def test_matches_the_reference(rows: int, top_k: int, dtype: torch.dtype) -> None:
    inputs = make(rows, top_k, dtype, seed=rows * 10 + top_k)
    out = moe.experts(*inputs)
    assert out.dtype == dtype and out.shape == inputs[0].shape
    assert_near(out, moe.reference(*inputs))


@pytest.mark.parametrize(("rows", "top_k"), [(9, 1), (20, 5)])
def test_experts_and_slots_not_powers_of_two(rows: int, top_k: int) -> None:
    inputs = make(rows, top_k, torch.float32, seed=rows, experts=6)
    assert_near(moe.experts(*inputs), moe.reference(*inputs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_alone_equals_the_row_in_any_batch(dtype: torch.dtype) -> None:
    x, gate_up, down, ids, weights = make(12, 3, dtype, seed=1)
    batch = moe.experts(x, gate_up, down, ids, weights)
    assert torch.equal(batch, rows_alone(x, gate_up, down, ids, weights))
    order = torch.randperm(12, generator=torch.Generator().manual_seed(2))
    assert torch.equal(moe.experts(x[order], gate_up, down, ids[order], weights[order]), batch[order])
    # Row 0 beside rows it never met, choosing other experts in other numbers.
    other_x, _, _, other_ids, other_weights = make(7, 3, dtype, seed=3)
    mixed = moe.experts(torch.cat([other_x[:3], x[:1], other_x[3:]]), gate_up, down,
                        torch.cat([other_ids[:3], ids[:1], other_ids[3:]]),
                        torch.cat([other_weights[:3], weights[:1], other_weights[3:]]))
    assert torch.equal(mixed[3], batch[0])


def test_an_expert_with_several_tiles_of_pairs() -> None:
    """40 rows all choose expert 3: its pairs fill three tiles, the last one part full."""
    x, gate_up, down, ids, weights = make(40, 2, torch.float32, seed=4)
    ids[:, 1] = torch.where(ids[:, 0] == 3, 5, 3)
    out = moe.experts(x, gate_up, down, ids, weights)
    assert_near(out, moe.reference(x, gate_up, down, ids, weights))
    for row in (0, 17, 39):
        alone = moe.experts(x[row:row + 1], gate_up, down, ids[row:row + 1], weights[row:row + 1])
        assert torch.equal(alone[0], out[row])


def test_a_plan_over_several_blocks_places_pairs_as_one_block_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """80 pairs: by default one program compares all pairs; here five count and place (histograms)."""
    x, gate_up, down, ids, weights = make(40, 2, torch.float32, seed=4)
    ids[:, 1] = torch.where(ids[:, 0] == 3, 5, 3)
    shared = make_shared(40, torch.float32, seed=4)
    whole = moe.experts(x, gate_up, down, ids, weights), moe.experts(x, gate_up, down, ids, weights, shared)
    monkeypatch.setattr(moe_plan, "PLAN_BLOCK", 16)
    monkeypatch.setattr(moe_plan, "SCAN_BLOCK", 2)
    assert torch.equal(moe.experts(x, gate_up, down, ids, weights), whole[0])
    assert torch.equal(moe.experts(x, gate_up, down, ids, weights, shared), whole[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_experts_are_summed_in_ascending_id_whatever_the_slot_order(dtype: torch.dtype) -> None:
    x, gate_up, down, ids, weights = make(10, 3, dtype, seed=5)
    out = moe.experts(x, gate_up, down, ids, weights)
    ascending = ids.argsort(dim=1)
    for slots in (ascending, ascending.flip(1), torch.tensor([[2, 0, 1]]).expand(10, 3)):
        moved = moe.experts(x, gate_up, down, ids.gather(1, slots), weights.gather(1, slots))
        assert torch.equal(moved, out)
    assert_near(out, moe.reference(x, gate_up, down, ids, weights))


def test_int32_ids_and_weights_in_the_model_dtype() -> None:
    x, gate_up, down, ids, weights = make(6, 3, torch.bfloat16, seed=6)
    out = moe.experts(x, gate_up, down, ids.int(), weights.bfloat16())
    assert torch.equal(out, moe.experts(x, gate_up, down, ids, weights.bfloat16()))
    assert_near(out, moe.reference(x, gate_up, down, ids, weights.bfloat16()))


def test_rows_past_a_chunk_come_out_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = make(10, 2, torch.float32, seed=7)
    shared = make_shared(10, torch.float32, seed=7, inner=48)
    whole = moe.experts(*inputs), moe.experts(*inputs, shared)
    monkeypatch.setattr(moe, "ROW_CHUNK", 4)
    assert torch.equal(moe.experts(*inputs), whole[0])
    assert torch.equal(moe.experts(*inputs, shared), whole[1])


def _tiles_planned(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pairs a tile of each plan made from now on (moe_plan.plan's block_m)."""
    seen: list[int] = []
    plan = moe_plan.plan

    def spy(tables, ids, experts, shared, block_m, made):  # type: ignore[no-untyped-def]
        seen.append(block_m)
        return plan(tables, ids, experts, shared, block_m, made)

    monkeypatch.setattr(moe_plan, "plan", spy)
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [39, 40])  # 8 experts, top-3: 117 and 120 pairs, each side of 15 an expert
def test_a_prompts_rows_take_wider_tiles_and_the_same_results(rows: int, dtype: torch.dtype,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moe, "PROMPT_PAIRS", 15)
    planned = _tiles_planned(monkeypatch)
    inputs = make(rows, 3, dtype, seed=30 + rows)
    shared = make_shared(rows, dtype, seed=30, inner=48)
    out, with_shared = moe.experts(*inputs), moe.experts(*inputs, shared)
    prompt_m = moe.FP32_PROMPT_M if dtype == torch.float32 else moe.PROMPT_M  # 4-byte tiles fit shared memory
    assert planned == [prompt_m if rows == 40 else moe.BLOCK_M] * 2
    assert_near(out, moe.reference(*inputs))
    assert_near(with_shared, moe.reference(*inputs, shared))
    x, gate_up, down, ids, weights = inputs
    for row in (0, rows // 2, rows - 1):  # one row takes decode's tiles: the same bits
        alone = moe.experts(x[row:row + 1], gate_up, down, ids[row:row + 1], weights[row:row + 1])
        assert torch.equal(alone[0], out[row])


# 8 routed tiles of work in a grid of 9 (10 with the shared expert's, 9 of work): a last group part full with
# work in it, routed alone (5: 5 + 4) and with the shared expert (4: 4 + 4 + 2)
@pytest.mark.parametrize("group", [4, 5])
def test_a_prompts_tiles_in_groups_walking_their_columns_give_the_same_bits(
        group: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moe, "PROMPT_PAIRS", 15)
    sizes = {"hidden": 320, "inner": 160}  # 3 column tiles a launch: the programs' order matters
    inputs, other = make(40, 3, torch.float32, seed=34, **sizes), make(40, 3, torch.float32, seed=35, **sizes)
    shared = make_shared(40, torch.float32, seed=34, hidden=320, inner=96)
    apart = moe.experts(*inputs), moe.experts(*inputs, shared)
    monkeypatch.setattr(moe, "PROMPT_GROUP", group)
    for extra in ((), (shared,)):
        moe.experts(*other, *extra)  # its buffers' memory, reused next, holds another call's middles
        assert torch.equal(moe.experts(*inputs, *extra), apart[len(extra)])


def test_a_prompt_past_a_chunk_plans_each_chunk_in_the_wider_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """40 rows in passes of 24 and 16 rows (72 pairs of 8 experts a full pass: 9 an expert)."""
    monkeypatch.setattr(moe, "PROMPT_PAIRS", 9)
    inputs = make(40, 3, torch.float32, seed=33)
    shared = make_shared(40, torch.float32, seed=33, inner=48)
    whole = moe.experts(*inputs), moe.experts(*inputs, shared)
    monkeypatch.setattr(moe, "ROW_CHUNK", 24)
    planned = _tiles_planned(monkeypatch)
    assert torch.equal(moe.experts(*inputs), whole[0])
    assert torch.equal(moe.experts(*inputs, shared), whole[1])
    assert planned == [moe.FP32_PROMPT_M] * 4  # an fp32 prompt's tiles


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "top_k", "inner"), [(1, 2, 32), (5, 3, 48), (12, 3, 16), (40, 4, 32)])
def test_the_shared_expert_matches_the_reference(rows: int, top_k: int, inner: int,
                                                  dtype: torch.dtype) -> None:
    """The shared expert's inner size as the routed experts', wider, narrower; 160 pairs: past one
    planning block."""
    inputs = make(rows, top_k, dtype, seed=rows + inner)
    shared = make_shared(rows, dtype, seed=rows, inner=inner)
    out = moe.experts(*inputs, shared)
    assert out.dtype == dtype and out.shape == inputs[0].shape
    assert_near(out, moe.reference(*inputs, shared))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "top_k"), [(5, 3), (40, 4)])
def test_the_shared_expert_is_one_expert_more_then_the_gate_kernel(rows: int, top_k: int,
                                                                   dtype: torch.dtype) -> None:
    """Bit for bit: the shared expert's output is a routed expert's of weight 1 holding its weights,
    rounded; the block's output is tfd_kernels.sigmoid_gate's of that on the routed sum."""
    x, gate_up, down, ids, weights = make(rows, top_k, dtype, seed=20 + rows)
    shared = make_shared(rows, dtype, seed=20)
    stacked = torch.cat([gate_up, shared.gate_up[None]]), torch.cat([down, shared.down[None]])
    alone = moe.experts(x, *stacked, torch.full((rows, 1), len(gate_up)), torch.ones(rows, 1))
    want = sigmoid_gate.sigmoid_gate(alone, shared.gate, moe.experts(x, gate_up, down, ids, weights))
    assert torch.equal(moe.experts(x, gate_up, down, ids, weights, shared), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_with_the_shared_expert_a_row_alone_equals_the_row_in_any_batch(dtype: torch.dtype) -> None:
    """33 rows of top-4 plan in three launches (132 pairs), 1, 2 and 5 rows in one."""
    x, gate_up, down, ids, weights = make(33, 4, dtype, seed=21)
    shared = make_shared(33, dtype, seed=21, inner=48)
    batch = moe.experts(x, gate_up, down, ids, weights, shared)
    assert_rows_as_in_the_batch((x, gate_up, down, ids, weights), shared, batch, (1, 2, 5), (3, 32))
    order = torch.randperm(33, generator=torch.Generator().manual_seed(22))
    moved = moe.experts(x[order], gate_up, down, ids[order], weights[order], gate_rows(shared, order))
    assert torch.equal(moved, batch[order])


@pytest.mark.parametrize("normalise", [True, False])
# one row (the choice in the experts' first launch, top_k 3 and 5 not powers of two), 15 pairs (the
# choice in the plan's launch), 160 pairs (past one planning block)
@pytest.mark.parametrize(("rows", "top_k"), [(1, 2), (1, 3), (1, 5), (5, 3), (40, 4)])
def test_routing_from_logits_is_the_routers_choice_then_the_experts(rows: int, top_k: int,
                                                                     normalise: bool) -> None:
    x, gate_up, down, _, _ = make(rows, top_k, torch.bfloat16, seed=rows)
    logits = router_product(rows, 8, torch.bfloat16, seed=rows)
    shared = make_shared(rows, torch.bfloat16, seed=rows)
    logits[0, 3] = logits[0, 5] = 4.0  # a tie: the lower expert wins in both
    ids, weights = router.top_k(logits[:, :8], top_k, normalise, x.dtype)
    for given in (None, shared):
        want = moe.experts(x, gate_up, down, ids, weights, given)
        assert torch.equal(moe.routed(x, gate_up, down, logits[:, :8], top_k, normalise, given), want)
    with pytest.raises(ValueError, match="logits is"):
        moe.routed(x, gate_up, down, logits, top_k, normalise)
    with pytest.raises(ValueError, match="top_k"):
        moe.routed(x, gate_up, down, logits[:, :8], 9, normalise)


@pytest.mark.parametrize("rows", [1, 3])  # the choice in the experts' first launch, then in the plan's
def test_a_choice_made_in_the_launches_writes_the_routers_ids_and_weights(rows: int) -> None:
    x, gate_up, down, _, _ = make(rows, 3, torch.float32, seed=31)
    logits = router_product(rows, 8, torch.float32, seed=31)[:, :8]
    ids = torch.full((rows, 3), -1, dtype=torch.int64)
    weights = torch.zeros(rows, 3)
    shared = make_shared(rows, torch.float32, seed=31)
    moe.experts(x, gate_up, down, ids, weights, shared, choice=(logits, True))
    want_ids, want_weights = router.top_k(logits, 3, True, torch.float32)
    assert torch.equal(ids, want_ids) and torch.equal(weights, want_weights)


def test_routed_rows_are_the_same_in_one_planning_launch_and_past_it() -> None:
    """1 row chooses in the experts' first launch; 2 to 8 rows of top-4 choose and plan in one
    launch; 9 to 32 through the router and one plan launch; 33 through the router and three."""
    assert moe_plan.CHOICE_PAIRS == 32 and moe_plan.PLAN_BLOCK == 128
    x, gate_up, down, _, _ = make(33, 4, torch.float32, seed=23)
    logits = router_product(33, 8, torch.float32, seed=23)
    shared = make_shared(33, torch.float32, seed=23)
    whole = moe.routed(x, gate_up, down, logits[:, :8], 4, True, shared)
    for rows in (1, 2, 8, 9, 32):
        got = moe.routed(x[:rows], gate_up, down, logits[:rows, :8], 4, True, gate_rows(shared, slice(rows)))
        assert torch.equal(got, whole[:rows])


def test_no_rows_and_no_routed_experts() -> None:
    x, gate_up, down, ids, weights = make(0, 2, torch.float32, seed=8)
    assert moe.experts(x, gate_up, down, ids, weights).shape == (0, 64)
    assert moe.experts(x, gate_up, down, ids, weights, make_shared(0, torch.float32, seed=8)).shape == (0, 64)
    x, gate_up, down, ids, weights = make(3, 2, torch.float32, seed=8)
    with pytest.raises(ValueError, match=r"^ids must be \[3, top_k >= 1\]"):
        moe.experts(x, gate_up, down, ids[:, :0], weights[:, :0])


@pytest.mark.parametrize("argument", ["x", "gate_up", "down", "ids", "weights"])
def test_a_wrong_shape_or_dtype_names_the_argument(argument: str) -> None:
    x, gate_up, down, ids, weights = make(3, 2, torch.float32, seed=9)
    wrong = {"x": x.double(), "gate_up": gate_up[:, :-1], "down": down.bfloat16(), "ids": ids.float(),
             "weights": weights[:, :1]}
    right = {"x": x, "gate_up": gate_up, "down": down, "ids": ids, "weights": weights}
    given = right | {argument: wrong[argument]}
    with pytest.raises(ValueError, match=rf"^{argument} "):
        moe.experts(**given)


@pytest.mark.parametrize("part", ["gate_up", "down", "gate"])
def test_a_wrong_shared_expert_names_its_part(part: str) -> None:
    inputs = make(3, 2, torch.float32, seed=9)
    shared = make_shared(3, torch.float32, seed=9)
    wrong = {"gate_up": shared.gate_up[:-1], "down": shared.down.bfloat16(), "gate": shared.gate[:2]}
    with pytest.raises(ValueError, match=rf"^shared\.{part} "):
        moe.experts(*inputs, shared._replace(**{part: wrong[part]}))
