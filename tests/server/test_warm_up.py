"""The warm-up's plan: requests that meet each size class the serving path compiles a kernel for."""

from __future__ import annotations

import httpx
import pytest

from support import ServedDaemon
from tfd.engine.config import Limits
from tfd.engine.request import Request
from tfd.engine.sampling import drawn_by_step
from tfd.server.warm_up import GEMM_CLASSES, LONG, NEW, RESUMED, TOGETHER, by_kernel, short, waves
from tfd_kernels.block_choice import MOST_BLOCKS

VOCAB = 4096


def limits(context: int = 32768, step: int = 256, lanes: int = 64) -> Limits:
    return Limits(context=context, step_tokens=step, max_lanes=lanes, queue=0)


def prompt_rows(plan: list[list[object]]) -> list[int]:
    return [len(request.prompt) for wave in plan for request in wave]  # type: ignore[attr-defined]


def test_prompts_alone_meet_each_gemm_class_with_rows_one_sixteen_and_neither() -> None:
    plan = waves(limits(), VOCAB, drafting=True, cache=True)
    alone = [len(wave[0].prompt) for wave in plan if len(wave) == 1 and wave[0].sampling.temperature == 0
             and wave[0].sampling.logprobs is None]
    # the GEMM's tiles: up to 16 rows, 32, 64 (spread), 128 (middle), then the whole form
    assert GEMM_CLASSES == ((1, 16), (17, 32), (33, 64), (65, 128), (129, 256))
    for low, high in GEMM_CLASSES:
        rows = [r for r in alone if low <= r <= high]
        assert any(r % 16 == 0 for r in rows) and any(r % 16 and r != 1 for r in rows), (low, high, rows)
    assert 1 in alone and 256 in alone and 256 + 17 in alone  # a whole step, and past it


@pytest.mark.parametrize("ratio", [2, 4])
def test_with_pooled_keys_prompts_alone_meet_each_class_in_pooled_rows_too(ratio: int) -> None:
    """Sparse attention's indexer takes a prompt's rows over its compress ratio: a prompt of 17 rows
    is 4 pooled ones at a ratio of 4, so the pooled products meet a class only at longer prompts."""
    def pooled_rows(pooled: int) -> list[int]:  # at the GPU's step of 32,768 rows
        plan = waves(limits(step=32768), VOCAB, False, True, pooled)
        return [len(wave[0].prompt) // ratio for wave in plan if len(wave) == 1
                and wave[0].sampling.temperature == 0 and wave[0].sampling.logprobs is None]

    def classes_met(rows: list[int]) -> list[bool]:
        return [any(low <= r <= high and r % 16 == 0 for r in rows)
                and any(low <= r <= high and r % 16 and r != 1 for r in rows) for low, high in GEMM_CLASSES]

    assert all(classes_met(pooled_rows(ratio)))
    assert not all(classes_met(pooled_rows(1)))  # the prompts alone, unscaled, leave classes unmet


@pytest.mark.parametrize("ratio", [2, 4])
def test_with_pooled_keys_prompts_alone_meet_every_sorted_count_of_blocks(ratio: int) -> None:
    """Sparse attention's choice sorts a prompt's complete blocks (its rows over the ratio) padded to
    the next power of two, a variant each up to MOST_BLOCKS: a prompt ends in each, 512 among them
    (the H100's Flash Next demo compiled that one while serving)."""
    def sorted_counts(pooled: int, context: int = 1 << 20) -> set[int]:
        rows = prompt_rows(waves(limits(context=context, step=32768), VOCAB, False, True, pooled))
        return {1 << (r // ratio - 1).bit_length() for r in rows if r >= 2 * ratio}

    every = {1 << k for k in range(1, MOST_BLOCKS.bit_length())}
    assert MOST_BLOCKS == 8192 and 512 in every
    assert every <= sorted_counts(ratio)
    assert not every <= sorted_counts(1)  # without an indexer's prompts the counts are left unmet
    # as far as the context allows: the first power of two past it is not sent
    short_of = sorted_counts(ratio, context=1024 * ratio + NEW)
    assert 1024 in short_of and 2048 not in short_of


def test_every_request_fits_the_context_and_no_wave_outnumbers_the_lanes() -> None:
    for context in (16, 64, 300, LONG + NEW - 1, LONG + NEW, LONG + RESUMED + NEW, 1 << 20):
        for lanes, pooled in ((1, 1), (2, 4), (16, 1), (17, 4), (256, 1)):
            plan = waves(limits(context=context, lanes=lanes), VOCAB, True, True, pooled)
            for wave in plan:
                assert 1 <= len(wave) <= lanes
                for request in wave:
                    assert request.window <= context and request.prompt
                    assert max(request.prompt) < VOCAB
            ids = [request.id for wave in plan for request in wave]
            assert len(set(ids)) == len(ids)


def together(plan: list[list[Request]]) -> set[int]:
    return {len(wave) for wave in plan if len(wave) > 1 and wave[0].sampling.temperature == 0
            and wave[0].sampling.logprobs is None}


def test_lanes_together_as_many_as_the_pool_allows() -> None:
    assert TOGETHER == (2, 3, 16, 17, 32, 33, 64, 65, 128, 129, 256)
    for lanes, more in ((1, set()), (2, set()), (16, set()), (17, set()), (64, set()), (75, {75}),
                        (100, {96, 100}), (256, set()), (431, {416, 431})):
        plan = waves(limits(lanes=lanes), VOCAB, drafting=False, cache=True)
        assert together(plan) == {n for n in TOGETHER if n <= lanes} | more, lanes


def test_lanes_together_meet_each_gemm_class_with_sixteen_and_not() -> None:
    lanes = together(waves(limits(lanes=4096), VOCAB, drafting=False, cache=True))
    for low, high in GEMM_CLASSES:
        counts = [n for n in lanes if low <= n <= high]
        assert any(n % 16 == 0 for n in counts) and any(n % 16 and n != 1 for n in counts), (low, high)


@pytest.mark.parametrize("drafting", [True, False])
def test_cuts_and_logprobs_drafted_and_not(drafting: bool) -> None:
    plan = waves(limits(), VOCAB, drafting=drafting, cache=True)
    sampled = [r for wave in plan for r in wave if r.sampling.temperature or r.sampling.logprobs]
    assert {r.draft for r in sampled} == ({True, False} if drafting else {True})
    assert any(r.sampling.top_k for r in sampled) and any(r.sampling.top_p < 1 for r in sampled)
    assert any(r.sampling.min_p for r in sampled) and any(r.sampling.logprobs for r in sampled)


@pytest.mark.parametrize("drafting", [True, False])
def test_grammar_requests_cut_and_plain_the_plain_in_waves_of_their_own(drafting: bool) -> None:
    # a step of plain grammar lanes is redrawn reading their masks; one beside a cut is drawn on the
    # host: each way compiles its own variant of the draw
    follows = object()
    plan = waves(limits(lanes=2), VOCAB, drafting=drafting, cache=True, grammar=follows)  # type: ignore[arg-type]
    assert not any(r.grammar is not None for wave in waves(limits(), VOCAB, drafting, True) for r in wave)
    waves_with = [wave for wave in plan if any(r.grammar is follows for r in wave)]
    plain = [wave for wave in waves_with if all(r.grammar is follows and drawn_by_step(r.sampling)
                                                for r in wave)]
    assert plain and any(not drawn_by_step(r.sampling) for wave in waves_with for r in wave)
    drawn = [r for wave in plain for r in wave]
    assert {r.sampling.temperature > 0 for r in drawn} == {True, False}
    assert {r.draft for r in drawn} == ({True, False} if drafting else {True})
    assert all(len(wave) <= 2 for wave in plan)


def test_a_long_prompt_and_its_resumed_turn_where_the_context_allows() -> None:
    def longest(context: int, cache: bool = True) -> list[int]:
        return [r for r in prompt_rows(waves(limits(context=context), VOCAB, False, cache)) if r > 300]

    assert longest(LONG + RESUMED + NEW) == [LONG, LONG + RESUMED]  # exactly room for the next turn
    assert longest(LONG + RESUMED + NEW - 1) == [LONG]  # one row short of it
    assert longest(LONG + NEW) == [LONG]
    assert longest(LONG + NEW - 1) == [LONG - 1]  # as long as the context allows
    assert longest(1 << 20, cache=False) == [LONG]  # nothing kept: no resumed turn
    assert longest(300) == []


def test_the_short_warm_up_is_one_request() -> None:
    (wave,) = short(VOCAB)
    (request,) = wave
    assert request.prompt == (0, 1, 2, 3) and request.max_tokens == 2


def test_a_full_warm_up_through_the_daemon(served: type[ServedDaemon]) -> None:
    # The CPU compiles nothing, but the full warm-up's requests take the same path as on a GPU, and
    # the daemon with a client queue of 0 still starts: its own work is not a client's.
    daemon = served(TF_WARM_UP="full", TF_QUEUE_LIMIT="0").start(timeout=600)
    log = daemon.log()
    assert "warm-up (full): " in log and "kernel compiles not counted here" in log
    census = daemon.admin_call("pool")["pool"]["census"]  # type: ignore[index]
    assert not census["lanes"]
    assert daemon.admin_call("learn")["learn"]["memory"]["entries"] == 0  # type: ignore[index]
    # clients queue nothing: a request is refused as the queue being full
    refused = httpx.post(daemon.url() + "/v1/completions", json={"prompt": "def", "max_tokens": 2},
                         timeout=60)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "queue_full"


def test_variants_are_counted_by_kernel_most_first() -> None:
    variants = ["_gemm (('i32', ''),)", "_norm (('*bf16', 'D'),)", "_gemm (('i32', 'D'),)", "_spread"]
    assert by_kernel(variants) == "_gemm x2, _norm x1, _spread x1"
    assert by_kernel([]) == "none"
