"""The runner's decode run one step ahead: the tokens and the pool are what steps run one by one give.

Plain decode steps launch the next step before the host reads their draw; a request that asks for
logprobs takes the step-by-step path, so the two paths are compared on the same requests. A lane that
leaves while the step ahead ran its row (a cancel, a stop) must leave the others' tokens and the
pool as they would be without it.
"""

from __future__ import annotations

import attrs
import pytest
import tiny_models
import torch

from support import CACHE
from tfd.bench.workload import drive
from tfd.checkpoint import Checkpoint
from tfd.engine.request import Request, Sampling
from tfd.families.hybrid import HybridModel, load_model

STEP_TOKENS = 256


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next", "qwen4_exp"])
def model(request: pytest.FixtureRequest) -> HybridModel:
    path = tiny_models.save(str(request.param), CACHE / "tiny-plain")
    return load_model(Checkpoint.open(path), "cpu", torch.float32, progress=False)


def requests(count: int, max_tokens: int = 12, logprobs: int | None = None) -> list[Request]:
    generator = torch.Generator().manual_seed(7)
    made = []
    for i in range(count):
        prompt = torch.randint(8, tiny_models.VOCAB, (9 + 13 * i,), generator=generator)
        made.append(Request(f"r{i}", tuple(prompt.tolist()), max_tokens - i,
                            Sampling(1.0, seed=40 + i, logprobs=logprobs)))
    return made


def test_the_step_ahead_draws_what_steps_one_by_one_draw(model: HybridModel) -> None:
    assert model.batches_decode
    ahead = drive(model, requests(4), STEP_TOKENS, graphs=False).tokens
    one_by_one = drive(model, requests(4, logprobs=1), STEP_TOKENS, graphs=False).tokens
    assert [len(tokens) for tokens in ahead] == [12, 11, 10, 9]
    assert ahead == one_by_one


def run_leaving(model: HybridModel, asked: list[Request], leaves: dict[str, int]) -> dict[str, list[int]]:
    """Each request's tokens, run together; request ``leaves[id]`` is cancelled once it has that many
    (the engine's cancel). ``drive`` raises ``Leak`` unless the pool is back at its census at load."""
    tokens = drive(model, asked, STEP_TOKENS, graphs=False, leaves=leaves).tokens
    return {request.id: list(drawn) for request, drawn in zip(asked, tokens, strict=True)}


def test_a_lane_that_leaves_mid_decode_changes_nothing_else(model: HybridModel) -> None:
    asked = [attrs.evolve(r, max_tokens=10) for r in requests(3)]
    together = run_leaving(model, asked, {"r1": 4})  # the pool at load after, or drive raises Leak
    assert len(together["r1"]) == 4
    for request in (asked[0], asked[2]):
        alone = run_leaving(model, [request], {})
        assert together[request.id] == alone[request.id]
    alone_r1 = run_leaving(model, [asked[1]], {})
    assert alone_r1["r1"][:4] == together["r1"]
