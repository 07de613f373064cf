"""drafted == plain: lanes that verify drafts in rounds draw exactly the serial tokens.

Twenty requests run together through the runner (``drive``), greedy and seeded, with drafts of 1 to
4 a round, against the same requests with drafting off, for every family's tiny checkpoint. Two
sources of drafts: the checkpoint's MTP head (random weights: its drafts are mostly wrong, so rounds
keep one row), and a scripted head that is right for a set count of tokens and then wrong, cycling
0, 1, 2, ... so that rounds keep every count of rows from one to all, lanes keeping different counts
in one step. Every run ends with the pool at its census at load (``drive`` raises ``Leak``
otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import tiny_models
import torch

from support import CACHE
from tfd.bench.workload import drive
from tfd.checkpoint import Checkpoint
from tfd.engine.proposer import Absorb
from tfd.engine.request import Request, Sampling
from tfd.engine.runner import Drafting
from tfd.families.hybrid import HybridModel, load_model

STEP_TOKENS = 128  # prompts of 45 rows and more take two steps: their chunks are absorbed apart
Serial = Callable[..., tuple[tuple[int, ...], ...]]


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen4_exp"])
def headed(request: pytest.FixtureRequest, device: str) -> HybridModel:
    # on the GPU in bf16: verify windows through the kernels (verify, replay, the conv a row at a time)
    path: Path = tiny_models.save(str(request.param), CACHE / "tiny-plain", head=True)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    return load_model(Checkpoint.open(path), device, dtype, progress=False)


@pytest.fixture(scope="module")
def serial(headed: HybridModel) -> Serial:
    """The plain (undrafted) tokens of ``requests(temperature, count)`` on ``headed``: the reference
    every test holds its drafted runs to, run once for the module (drive is deterministic)."""
    runs: dict[tuple[float, int], tuple[tuple[int, ...], ...]] = {}

    def tokens(temperature: float, count: int = 20) -> tuple[tuple[int, ...], ...]:
        if (temperature, count) not in runs:
            runs[temperature, count] = drive(headed, requests(temperature, count), STEP_TOKENS,
                                             graphs=False).tokens
        return runs[temperature, count]

    return tokens


def captured(model: HybridModel) -> bool:
    """Drafted runs on the GPU replay captured rounds (and decode steps); the plain ones run eagerly."""
    return model.weights.embed.is_cuda


def requests(temperature: float, count: int = 20) -> list[Request]:
    """``count`` prompts of 7 to 159 tokens (some past a step: their chunks absorbed apart), 11 to 14
    new tokens each, keyed seeds."""
    generator = torch.Generator().manual_seed(11)
    made = []
    for i in range(count):
        length = (7, 30, 75, 140)[i % 4] + i
        prompt = torch.randint(8, tiny_models.VOCAB, (length,), generator=generator)
        made.append(Request(f"r{i}", tuple(prompt.tolist()), 14 - i % 4, Sampling(temperature, seed=90 + i)))
    return made


class ScriptedHead:
    """Drafts the serial continuation for ``right`` tokens then one wrong token, ``right`` cycling
    0 .. ``cycle`` - 1 round by round; notes how many rows each round kept."""

    def __init__(self, serial: dict[tuple[int, ...], tuple[int, ...]], cycle: int) -> None:
        self.serial = serial  # prompt -> its serial tokens
        self.cycle = cycle
        self.seen: dict[int, list[int]] = {}  # a lane's tokens from position 1, as absorbed
        self.rounds = 0
        self.kept: list[int] = []

    def propose(self, absorbs: Sequence[Absorb]) -> list[list[int]]:
        drafts = []
        for absorb in absorbs:
            key = id(absorb.lane)
            if absorb.start == 0:
                self.seen[key] = []
            seen = self.seen[key]
            del seen[absorb.start:]
            seen.extend(absorb.tokens)
            prompt = next(prompt for prompt, tokens in self.serial.items()
                          if (prompt[1:] + tokens)[:len(seen)] == tuple(seen))
            if absorb.start >= len(prompt):  # a round's kept rows, not a prompt chunk's
                self.kept.append(len(absorb.tokens))
            whole = prompt + self.serial[prompt]
            after = whole[absorb.last + 2:absorb.last + 2 + absorb.drafts]  # d_1 goes at last + 2
            right = self.rounds % self.cycle
            self.rounds += 1
            wrong = [(token + 1) % tiny_models.VOCAB for token in after]
            drafts.append([*after[:right], *wrong[right:]])
        return drafts


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_drafts_from_the_head_draw_the_serial_tokens(headed: HybridModel, serial: Serial,
                                                     temperature: float) -> None:
    asked = requests(temperature)
    plain = serial(temperature)
    for most in (1, 2, 3, 4):
        drafted = drive(headed, asked, STEP_TOKENS, graphs=captured(headed),
                        drafting=Drafting(most, 0.0)).tokens
        assert drafted == plain, f"{most} drafts a round"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_partial_accepts_of_every_length_draw_the_serial_tokens(headed: HybridModel, serial: Serial,
                                                                 temperature: float) -> None:
    asked = requests(temperature)
    plain = serial(temperature)
    script = {request.prompt: tokens for request, tokens in zip(asked, plain, strict=True)}
    for most in (1, 2, 3, 4):
        head = ScriptedHead(script, most + 2)  # rights 0 .. most + 1: short, exact and over-long scripts
        drafted = drive(headed, asked, STEP_TOKENS, graphs=captured(headed), drafting=Drafting(most, 0.0),
                        propose=head.propose).tokens
        assert drafted == plain, f"{most} drafts a round"
        kept = sorted(set(head.kept))
        assert kept == list(range(1, most + 2)), f"{most} drafts a round kept {kept}"


def test_lanes_that_leave_mid_round_give_every_page_back(headed: HybridModel, serial: Serial) -> None:
    # a leaving lane may have kept rows past its last token (the scripted head makes rounds keep several);
    # the others' tokens stay serial, and the pool is back at its census at load (drive raises Leak if not)
    asked = requests(0.0)
    plain = serial(0.0)
    head = ScriptedHead({request.prompt: tokens for request, tokens in zip(asked, plain, strict=True)}, 5)
    leaves = {"r0": 3, "r2": 6}
    got = drive(headed, asked, STEP_TOKENS, graphs=captured(headed), leaves=leaves, drafting=Drafting(3, 0.0),
                propose=head.propose).tokens
    for request, tokens, alone in zip(asked, got, plain, strict=True):
        assert tokens == alone[:leaves.get(request.id, len(alone))], request.id


def test_lanes_admitted_past_the_lane_limit_do_not_draft(headed: HybridModel, serial: Serial) -> None:
    # the four requests wait together: a limit under four keeps every lane serial, four lets all draft
    asked = requests(0.0, 4)
    plain = serial(0.0, 4)
    for limit, drafts in ((3, False), (4, True)):
        run = drive(headed, asked, STEP_TOKENS, graphs=captured(headed), drafting=Drafting(2, 0.0, limit))
        assert run.tokens == plain and (run.drafts.rounds > 0) == drafts, f"limit {limit}"
