"""Verify windows and their commit: each row the bits of serial decoding, the state after the kept rows
serial decoding's, byte for byte.

Three lanes at different positions (one crossing a page inside its window) and a padding lane run a
window of ``ROWS`` rows in one verify pass; the same tokens run as serial decode steps in a second
pool. Every row's final hidden state must be the serial one; the lanes' committed GDN states and
conv tails (and Flash Next's PLE tail and n-gram history) must be untouched by the verify. Then
each lane keeps a different count of its rows and commits: its state pieces must equal a third
pool's that decoded only those rows, and the next decode step must give both pools the same row.
"""

from __future__ import annotations

import pytest
import tiny_models
import torch

from support import CACHE
from tfd.checkpoint import Checkpoint
from tfd.families.hybrid import HybridModel, load_model
from tfd.model.decode import DecodeMemory
from tfd.model.decode_batch import Columns, DecodeBatch
from tfd.model.memory import LaneMemory, PageRows, Span
from tfd.model.verify import VerifyLanes
from tfd.pool.pages import Lease, Pool

PROMPTS = (9, 14, 21)  # with 4-row pages the second lane's window crosses a page
ROWS = 4
PAD = 1  # the padding lane's place among the lanes


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen4_exp"])
def model(request: pytest.FixtureRequest, device: str) -> HybridModel:
    # on the GPU in bf16: the kernels' paths (the conv a row at a time by conv1d.decode, verify, replay)
    path = tiny_models.save(str(request.param), CACHE / "tiny-plain")
    return load_model(Checkpoint.open(path), device, torch.float32 if device == "cpu" else torch.bfloat16,
                      progress=False)


class Lanes:
    """A pool of small pages with verify buffers, one lane a prompt, prefilled."""

    def __init__(self, model: HybridModel, prompts: list[torch.Tensor]) -> None:
        page_rows = model.layout(4, window=ROWS).smallest_page_rows()
        layout = model.layout(page_rows, window=ROWS)
        self.model = model
        self.window = max(PROMPTS) + 2 * ROWS
        self.device = model.weights.embed.device
        self.pool = Pool(layout, len(prompts) * layout.need(self.window), device=self.device)
        self.memory = DecodeMemory(self.pool, model.dtype)
        self.gdn = model.gdn_layers().layers
        self.ple = model.ple_state() is not None
        self.columns = Columns(len(self.gdn), self.pool.layout.row_pages(self.window), self.ple)
        self.leases: list[Lease] = []
        self.lanes: list[LaneMemory] = []
        for prompt in prompts:
            lease = self.pool.promise(self.window)
            pieces = lease.open(model.init_state)
            lease.take(self.window)
            self.leases.append(lease)
            self.lanes.append(LaneMemory(pieces, lease.page_table))
            model.forward([Span(self.lanes[-1], 0, prompt.to(self.device))], PageRows(self.pool))

    def column(self, lane: int, token: int, position: int) -> list[int]:
        offsets = self.memory.lane_offsets(self.lanes[lane].pieces, self.gdn, ple=self.ple)
        return self.columns.column(token, position, 0, 0.0, 0, offsets, self.leases[lane].row_pages,
                                   self.pool.null_page)

    def decode(self, rows: dict[int, tuple[int, int]]) -> dict[int, torch.Tensor]:
        """One serial decode step: lane -> (token, position); each lane's hidden row."""
        live = sorted(rows)
        columns = [self.column(lane, *rows[lane]) for lane in live]
        batch = DecodeBatch.of(columns, self.columns, self.device)
        hidden = self.model.decode(batch, self.memory)
        return {lane: hidden[i] for i, lane in enumerate(live)}

    def verify(self, tokens: torch.Tensor) -> tuple[torch.Tensor, DecodeBatch, VerifyLanes]:
        """Every lane's window of ``tokens[lane]`` from its prompt's end, a padding lane at ``PAD``."""
        columns, offsets = [], []
        for lane in range(len(PROMPTS)):
            if lane == PAD:
                columns += [self.columns.padding(self.pool.null_page)] * ROWS
                offsets.append(VerifyLanes.padding(len(self.gdn), self.ple))
            columns += [self.column(lane, int(tokens[lane, i]), PROMPTS[lane] + i) for i in range(ROWS)]
            offsets.append(VerifyLanes.lane_offsets(self.lanes[lane].pieces, self.gdn, self.pool.buffer))
        batch = DecodeBatch.of(columns, self.columns, self.device)
        lanes = VerifyLanes.of(ROWS, offsets, self.device, self.ple)
        hidden = self.model.verify(batch, self.memory, lanes).hidden
        return torch.cat((hidden[:PAD * ROWS], hidden[(PAD + 1) * ROWS:])), batch, lanes

    def state(self, lane: int) -> dict[str, torch.Tensor]:
        pieces = self.lanes[lane].pieces
        return {name: pieces[name].clone() for name in pieces
                if name.endswith((".state", ".conv_tail")) or name in ("ple.tail", "ple.history")}


def prompts_and_tokens() -> tuple[list[torch.Tensor], torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(8, tiny_models.VOCAB, (n,), generator=generator) for n in PROMPTS]
    return prompts, torch.randint(8, tiny_models.VOCAB, (len(PROMPTS), ROWS + 1), generator=generator)


def serial(model: HybridModel, prompts: list[torch.Tensor], tokens: torch.Tensor, steps: list[int]
           ) -> tuple[Lanes, list[list[torch.Tensor]]]:
    """A pool whose lanes decoded ``steps[lane]`` rows of ``tokens[lane]`` one step at a time."""
    lanes = Lanes(model, prompts)
    rows: list[list[torch.Tensor]] = [[] for _ in PROMPTS]
    for step in range(max(steps)):
        going = {lane: (int(tokens[lane, step]), PROMPTS[lane] + step)
                 for lane in range(len(PROMPTS)) if step < steps[lane]}
        for lane, row in lanes.decode(going).items():
            rows[lane].append(row)
    return lanes, rows


def test_verify_rows_are_serial_decode_rows_and_leave_the_state(model: HybridModel) -> None:
    prompts, tokens = prompts_and_tokens()
    _, want = serial(model, prompts, tokens, [ROWS] * len(PROMPTS))
    lanes = Lanes(model, prompts)
    before = [lanes.state(lane) for lane in range(len(PROMPTS))]
    got, _, _ = lanes.verify(tokens)
    for lane in range(len(PROMPTS)):
        assert torch.equal(got[lane * ROWS:(lane + 1) * ROWS], torch.stack(want[lane])), f"lane {lane}"
        after = lanes.state(lane)
        assert all(torch.equal(after[name], before[lane][name]) for name in after), f"lane {lane} moved"


@pytest.mark.parametrize("keeps", [(1, 4, 2), (3, 1, 4), (2, 3, 1)])
def test_commit_leaves_the_state_of_the_kept_rows(model: HybridModel, keeps: tuple[int, int, int]) -> None:
    # every keep from 1 to ROWS lands on some lane; the padding lane sits between them
    prompts, tokens = prompts_and_tokens()
    want, _ = serial(model, prompts, tokens, list(keeps))
    lanes = Lanes(model, prompts)
    _, batch, verify_lanes = lanes.verify(tokens)
    keep = list(keeps)
    keep.insert(PAD, 1)
    model.commit(batch, lanes.memory, verify_lanes, torch.tensor(keep, dtype=torch.int32).to(lanes.device))
    for lane in range(len(PROMPTS)):
        got, expected = lanes.state(lane), want.state(lane)
        differ = [name for name in got if not torch.equal(got[name], expected[name])]
        assert not differ, f"lane {lane} keeping {keeps[lane]}: {differ}"
    # the next row reads the kept rows' keys and the committed state: the same in both pools
    following = {lane: (int(tokens[lane, kept]), PROMPTS[lane] + kept) for lane, kept in enumerate(keeps)}
    after_commit, after_serial = lanes.decode(following), want.decode(following)
    assert all(torch.equal(after_commit[lane], after_serial[lane]) for lane in after_serial)
