"""The grouped-experts kernels on a GPU at the released models' sizes: against their reference, and a
row's bits whatever the batch, routed experts alone, with the shared expert, and routed from logits."""

from __future__ import annotations

import pytest
import torch
from moe_inputs import (
    REAL,
    assert_near,
    assert_rows_as_in_the_batch,
    gate_rows,
    make_real,
    make_real_shared,
    router_product,
    rows_alone,
)

from tfd_kernels import moe, moe_plan, router, sigmoid_gate


@pytest.mark.gpu
@pytest.mark.parametrize(("experts", "top_k"), REAL)
@pytest.mark.parametrize("rows", [1, 37, 256])
def test_gpu_real_sizes_match_the_reference(rows: int, experts: int, top_k: int) -> None:
    inputs = make_real(rows, experts, top_k, seed=rows)
    assert_near(moe.experts(*inputs), moe.reference(*inputs))


@pytest.mark.gpu
@pytest.mark.parametrize(("experts", "top_k"), REAL)
def test_gpu_rows_are_the_same_alone_and_in_batches(experts: int, top_k: int) -> None:
    x, gate_up, down, ids, weights = make_real(256, experts, top_k, seed=11)
    batch = moe.experts(x, gate_up, down, ids, weights)
    picked = torch.tensor([0, 1, 100, 255], device="cuda")
    assert torch.equal(rows_alone(x[picked], gate_up, down, ids[picked], weights[picked]), batch[picked])
    sub = slice(17, 50)
    assert torch.equal(moe.experts(x[sub], gate_up, down, ids[sub], weights[sub]), batch[sub])
    order = torch.randperm(256, device="cuda")
    assert torch.equal(moe.experts(x[order], gate_up, down, ids[order], weights[order]), batch[order])


@pytest.mark.gpu
@pytest.mark.parametrize(("experts", "top_k"), REAL)
def test_gpu_the_shared_expert_matches_the_reference_and_rows_are_the_same_in_any_batch(experts: int,
                                                                                         top_k: int) -> None:
    """At 1, 2, 8 and 32 rows: the first rows of 32 as the 32 have them, and as the reference does."""
    x, gate_up, down, ids, weights = make_real(32, experts, top_k, seed=17)
    shared = make_real_shared(32, experts, seed=17)
    batch = moe.experts(x, gate_up, down, ids, weights, shared)
    assert_near(batch, moe.reference(x, gate_up, down, ids, weights, shared))
    assert_rows_as_in_the_batch((x, gate_up, down, ids, weights), shared, batch, (1, 2, 8), (7, 31))


@pytest.mark.gpu
@pytest.mark.parametrize(("experts", "top_k"), REAL)
def test_gpu_routed_with_the_shared_expert_is_the_same_in_one_planning_launch_and_past_it(experts: int,
                                                                                          top_k: int) -> None:
    """1, 2 and 8 rows choose and plan in one launch; 32 through the router kernel and three plan launches."""
    x, gate_up, down, _, _ = make_real(32, experts, top_k, seed=18)
    logits = router_product(32, experts, torch.bfloat16, seed=18, device="cuda")
    shared = make_real_shared(32, experts, seed=18)
    ids, weights = router.top_k(logits[:, :experts], top_k, True, x.dtype)
    whole = moe.routed(x, gate_up, down, logits[:, :experts], top_k, True, shared)
    assert torch.equal(whole, moe.experts(x, gate_up, down, ids, weights, shared))
    for rows in (1, 2, 8):
        got = moe.routed(x[:rows], gate_up, down, logits[:rows, :experts], top_k, True,
                         gate_rows(shared, slice(rows)))
        assert torch.equal(got, whole[:rows])


@pytest.mark.gpu
def test_gpu_the_shared_expert_is_one_expert_more_then_the_gate_kernel() -> None:
    x, gate_up, down, ids, weights = make_real(37, 256, 8, seed=14)
    shared = make_real_shared(37, 256, seed=14)
    stacked = torch.cat([gate_up, shared.gate_up[None]]), torch.cat([down, shared.down[None]])
    ids_e, ones = torch.full((37, 1), 256, device="cuda"), torch.ones(37, 1, device="cuda")
    alone = moe.experts(x, *stacked, ids_e, ones)
    want = sigmoid_gate.sigmoid_gate(alone, shared.gate, moe.experts(x, gate_up, down, ids, weights))
    assert torch.equal(moe.experts(x, gate_up, down, ids, weights, shared), want)


@pytest.mark.gpu
@pytest.mark.parametrize(("experts", "top_k"), REAL)
@pytest.mark.parametrize("rows", [1, 4, 12, 32])  # the choice in the plan's launch, then past it
def test_gpu_routing_from_logits_is_the_routers_choice_then_the_experts(rows: int, experts: int,
                                                                         top_k: int) -> None:
    x, gate_up, down, _, _ = make_real(rows, experts, top_k, seed=15)
    logits = torch.randn(rows, experts, device="cuda", dtype=torch.bfloat16)
    ids, weights = router.top_k(logits, top_k, True, x.dtype)
    assert torch.equal(moe.routed(x, gate_up, down, logits, top_k, True),
                       moe.experts(x, gate_up, down, ids, weights))


@pytest.mark.gpu
def test_gpu_routing_is_the_same_on_both_sides_of_one_planning_block() -> None:
    # 4 rows of top-8 choose and plan in one launch, 5 through the router kernel: the same bits
    # (fp32, where a softmax summed in another order would show)
    assert moe_plan.CHOICE_PAIRS == 32
    x, gate_up, down, _, _ = make_real(5, 256, 8, seed=16)
    x, gate_up, down = x.float(), gate_up.float(), down.float()
    logits = torch.randn(5, 256, device="cuda")
    assert torch.equal(moe.routed(x[:4], gate_up, down, logits[:4], 8, True),
                       moe.routed(x, gate_up, down, logits, 8, True)[:4])


@pytest.mark.gpu
def test_gpu_a_prompts_tiles_give_a_row_the_bits_of_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """256 experts of top-8: rows averaging PROMPT_PAIRS pairs an expert take the prompt's tiles (PROMPT_M
    pairs, K steps of PROMPT_GATE_K and PROMPT_DOWN_K), one row fewer decode's 16-pair tiles in steps of
    GATE_K and DOWN_K; with the shared expert too."""
    rows = moe.PROMPT_PAIRS * 256 // 8  # 512 at 16 pairs
    x, gate_up, down, ids, weights = make_real(rows, 256, 8, seed=19)
    shared = make_real_shared(rows, 256, seed=19)
    for whole, part in ((None, None), (shared, gate_rows(shared, slice(rows - 1)))):
        prompt = moe.experts(x, gate_up, down, ids, weights, whole)
        fewer = moe.experts(x[:rows - 1], gate_up, down, ids[:rows - 1], weights[:rows - 1], part)
        assert torch.equal(fewer, prompt[:rows - 1])
    picked = torch.tensor([0, rows // 2, rows - 1], device="cuda")
    assert torch.equal(rows_alone(x[picked], gate_up, down, ids[picked], weights[picked]),
                       moe.experts(x, gate_up, down, ids, weights)[picked])
    for group in (8, 0 if moe.PROMPT_GROUP else 5):  # the programs' order changes no bits
        monkeypatch.setattr(moe, "PROMPT_GROUP", group)
        assert torch.equal(moe.experts(x, gate_up, down, ids, weights, shared), prompt)


@pytest.mark.gpu
def test_gpu_prefill_past_a_chunk_keeps_every_row() -> None:
    rows = moe.ROW_CHUNK + 300
    x, gate_up, down, ids, weights = make_real(rows, 256, 8, seed=12)
    out = moe.experts(x, gate_up, down, ids, weights)
    picked = torch.tensor([0, moe.ROW_CHUNK - 1, moe.ROW_CHUNK, rows - 1], device="cuda")
    assert torch.equal(rows_alone(x[picked], gate_up, down, ids[picked], weights[picked]), out[picked])
    assert_near(out[picked], moe.reference(x[picked], gate_up, down, ids[picked], weights[picked]))


@pytest.mark.gpu
def test_gpu_a_captured_graph_replays_new_routes() -> None:
    x, gate_up, down, ids, weights = make_real(64, 256, 8, seed=13)
    moe.experts(x, gate_up, down, ids, weights)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe.experts(x, gate_up, down, ids, weights)
    fresh_x, _, _, fresh_ids, fresh_weights = make_real(64, 256, 8, seed=14)
    x.copy_(fresh_x)
    ids.copy_(fresh_ids)
    weights.copy_(fresh_weights)
    graph.replay()
    assert torch.equal(out, moe.experts(fresh_x, gate_up, down, fresh_ids, fresh_weights))


@pytest.mark.gpu
def test_gpu_a_captured_decode_step_with_the_shared_expert_replays_new_rows() -> None:
    x, gate_up, down, _, _ = make_real(1, 256, 8, seed=19)
    logits = router_product(1, 256, torch.bfloat16, seed=19, device="cuda")
    shared = make_real_shared(1, 256, seed=19)._replace(gate=logits[:, 256:])
    moe.routed(x, gate_up, down, logits[:, :256], 8, True, shared)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe.routed(x, gate_up, down, logits[:, :256], 8, True, shared)
    fresh_x = torch.randn(1, 2048, device="cuda").bfloat16()
    fresh_logits = router_product(1, 256, torch.bfloat16, seed=20, device="cuda")
    x.copy_(fresh_x)
    logits.copy_(fresh_logits)
    graph.replay()
    fresh_shared = shared._replace(gate=fresh_logits[:, 256:])
    assert torch.equal(out, moe.routed(fresh_x, gate_up, down, fresh_logits[:, :256], 8, True, fresh_shared))


def _exact_inputs(rows: int, experts: int, top_k: int, hidden: int = 256, inner: int = 128
                  ) -> tuple[torch.Tensor, ...]:
    """Inputs whose every step before a weighted term is exact in fp32 in any order: x in {1, 2}, gate
    weights in {0, 1} (gates of 110 and more: silu(g) = g, exp(-g) is 0), up weights mostly 0 and +-1,
    down weights in {-1, 0, 1} (integer sums under 2^24), routing weights random; the kernels' terms are
    then the reference's fp32 values, and only how each is rounded before the sum decides the bits."""
    gen = torch.Generator("cuda").manual_seed(rows + top_k)

    def pick(values: list[float], odds: list[float], *shape: int) -> torch.Tensor:
        chosen = torch.multinomial(torch.tensor(odds, dtype=torch.float32, device="cuda"),
                                   int(torch.tensor(shape).prod()), True, generator=gen)
        return torch.tensor(values, device="cuda")[chosen].view(*shape).bfloat16()

    x = pick([1.0, 2.0], [1, 1], rows, hidden)
    gate = pick([0.0, 1.0], [1, 3], experts, inner, hidden)
    up = pick([-1.0, 0.0, 1.0], [1, 62, 1], experts, inner, hidden)
    down = pick([-1.0, 0.0, 1.0], [1, 1, 1], experts, hidden, inner)
    ids = torch.rand(rows, experts, generator=gen, device="cuda").argsort(dim=1)[:, :top_k]
    weights = torch.rand(rows, top_k, generator=gen, device="cuda") + 0.1
    return x, torch.cat([gate, up], dim=1), down, ids, weights


def _unrounded(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ids: torch.Tensor,
               weights: torch.Tensor) -> torch.Tensor:
    """``_exact_inputs``' block output with each row's weighted terms summed in fp32 unrounded."""
    inner = down.shape[2]
    total = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for row, chosen in enumerate(ids.tolist()):
        for slot in sorted(range(len(chosen)), key=lambda s: (chosen[s], s)):
            both = gate_up[chosen[slot]].float() @ x[row].float()
            h = (both[:inner] * both[inner:]).bfloat16().float()  # silu(g) = g at these gates
            total[row] += weights[row, slot].float() * (down[chosen[slot]].float() @ h)
    return total.bfloat16()


@pytest.mark.gpu
@pytest.mark.parametrize("rounded", [True, False])
@pytest.mark.parametrize("rows", [1, 5, moe.PROMPT_PAIRS * 8 // 3, moe.PROMPT_PAIRS * 8 // 3 + 1])
def test_gpu_each_weighted_term_is_rounded_to_the_model_dtype_before_the_sum(
        rows: int, rounded: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode's tiles (1, 5 and 42 rows of top-3 over 8 experts: 15.75 pairs an expert) and a prompt's
    (43 rows: 16.1), and at one row the block's one launch from the router's logits: the kernels store
    each weighted term in bf16 and sum those in fp32, the reference's bits, where summing the unrounded
    terms gives other bits (so the inputs tell the two apart); with ``TERMS_ROUNDED`` off, those."""
    monkeypatch.setattr(moe, "TERMS_ROUNDED", rounded)
    x, gate_up, down, ids, weights = _exact_inputs(rows, 8, 3)
    logits = torch.randn(1, 8, generator=torch.Generator("cuda").manual_seed(5), device="cuda")
    chosen, chosen_weights = router.top_k(logits, 3, True, x.dtype)  # the launch's own choice
    cases = [(moe.experts(x, gate_up, down, ids, weights), ids, weights)]
    if rows == 1:
        cases.append((moe.routed(x, gate_up, down, logits, 3, True), chosen, chosen_weights))
    for got, got_ids, got_weights in cases:
        assert torch.equal(got, moe.reference(x, gate_up, down, got_ids, got_weights))
        assert torch.equal(got, _unrounded(x, gate_up, down, got_ids, got_weights)) is not rounded
