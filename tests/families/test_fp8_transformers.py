"""Every family's FP8 checkpoint against transformers loading the same files dequantized.

transformers (``FineGrainedFP8Config(dequantize=True)``, fp32) multiplies by the dequantized weights
and leaves the activations unrounded; tfd rounds them to e4m3 per row and 128-wide group as the GPU
kernels will. So: with tfd's rounding taken out the two agree as the float checkpoints do
(tests/families/test_parity.py's tolerance), and with it, tfd's greedy choices (its prefill and its
decode rows) are transformers' wherever transformers' choice has the margin to survive the
rounding (below: how those positions are picked, by the rounding's own size at each).

Where transformers cannot read a weight in FP8 (it misreads a weight whose rows run past whole
128-row blocks into a partial one, and its dequantizing load reads fused FP8 experts' scales not at
all), the checkpoint keeps that weight in bf16 or stores the experts one by one with whole blocks,
as released checkpoints do; tests/families/test_fp8_families.py covers those weights against a
dequantized twin instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_models
import torch
from reference_loop import LanePool

from tfd.checkpoint import Checkpoint
from tfd.families.hybrid import HybridModel, load_model
from tfd.model import fp8
from tfd.model.memory import Span
from tfd.quantization import BlockFp8

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers loads FP8 checkpoints only with it

BASE_KEPT = ["lm_head", "embed_tokens", "mlp.gate", "mlp.shared_expert_gate", "in_proj_b", "in_proj_a",
             "in_proj_ba"]
# per family, what transformers cannot read in FP8 at these tiny shapes (or keeps unconverted itself)
KEPT = {"qwen3_5": [], "qwen3_5_moe": [], "qwen3_next": ["in_proj_qkvz"],  # 192 rows: 128 and a partial 64
        "qwen4_exp": ["block_inject_weight", "indexer.index_qk_proj"]}  # Flash Next's own: kept; 144 rows
TOLERANCE = 1e-4  # tests/families/test_parity.py's: max |ours - reference| / max |reference|
PROMPT = 300
CONTINUATION = 32
COMPARED = 50  # positions at least that the margins must allow (decode rows among them)


def checkpoint(family: str, root: Path) -> Path:
    """The family's tiny checkpoint (experts 128 wide, stored one by one) in FP8 but for ``KEPT``."""
    kept = BASE_KEPT + KEPT[family]
    rule = BlockFp8(tuple(kept))

    def converted(name: str) -> bool:
        module = name.removesuffix(".weight")
        return name.endswith(".weight") and rule.converted(module) and not name.endswith("conv1d.weight") \
            and ".ngram_embedding." not in name

    source = tiny_models.save(family, root / "source", expert_inner=128)
    quantization = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                    "weight_block_size": [128, 128], "modules_to_not_convert": kept}
    tiny_models.fp8_copy(source, root / "fp8", converted, quantization, fuse=False)
    return root / "fp8"


@pytest.fixture(scope="module", params=tiny_models.FAMILIES)
def models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[torch.nn.Module, Path]:
    path = checkpoint(request.param, tmp_path_factory.mktemp(f"fp8-hf-{request.param}"))
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        path, quantization_config=transformers.FineGrainedFP8Config(dequantize=True), dtype=torch.float32)
    return reference.eval(), path


def loaded(path: Path) -> HybridModel:
    return load_model(Checkpoint.open(path), "cpu", torch.float32, progress=False)


def prompt_ids() -> torch.Tensor:
    ids = torch.randint(0, tiny_models.VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(11))
    ids[[40, 41, 150]] = tiny_models.EOS  # PLE's n-gram context stops after an EOS
    return ids


def prompt_logits(model: HybridModel, ids: torch.Tensor) -> torch.Tensor:
    lanes = LanePool(model, len(ids))
    return model.logits(lanes.forward([Span(lanes.open(), 0, ids)]).hidden)


def test_unrounded_its_logits_are_transformers(models: tuple[torch.nn.Module, Path],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    reference, path = models
    ids = prompt_ids()
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
    monkeypatch.setattr(fp8, "linear", lambda x, w: (x.float() @ w.dequantized().T).to(x.dtype))
    ours = prompt_logits(loaded(path), ids)
    assert (ours - expected).abs().max() < TOLERANCE * expected.abs().max()


def test_its_greedy_choices_are_transformers_where_the_margins_allow(
        models: tuple[torch.nn.Module, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    # Along transformers' own greedy continuation of a prompt, tfd's choice at each position (its
    # prefill in chunks, then its decode rows, fed the same tokens) against transformers'. What may
    # part them is tfd's rounding of the activations, which transformers does not do: at each position
    # its size is measured on tfd's side alone (the largest change of a logit when the rounding is
    # taken out), and every position whose top-two margin in transformers' logits exceeds twice that
    # (and the unrounded paths' own difference) must have transformers' top token. Measured: 65-142 of
    # 331 positions a family, 3-12 of them decode rows, none differ.
    reference, path = models
    ids = prompt_ids()
    reference.generation_config.eos_token_id = None
    with torch.no_grad():
        run = reference.generate(ids[None], max_new_tokens=CONTINUATION, do_sample=False,
                                 return_dict_in_generate=True)
        full = run.sequences[0, :-1]
        expected = reference(full[None]).logits[0]
    ours = walked(loaded(path), ids, full)
    monkeypatch.setattr(fp8, "linear", lambda x, w: (x.float() @ w.dequantized().T).to(x.dtype))
    rounding = (ours - walked(loaded(path), ids, full)).abs().amax(dim=1)
    top = expected.topk(2).values
    allowed = top[:, 0] - top[:, 1] > 2 * rounding + 2 * TOLERANCE * expected.abs().max()
    compared = torch.nonzero(allowed)[:, 0]
    assert len(compared) >= COMPARED and (compared >= len(ids)).any(), compared.tolist()
    assert torch.equal(ours[compared].argmax(dim=-1), expected[compared].argmax(dim=-1))


def walked(model: HybridModel, ids: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """``model``'s logits along ``full``: ``ids`` prefilled in 64-row chunks, then a decode row a token."""
    lanes = LanePool(model, len(full))
    lane = lanes.open()
    hidden = [lanes.forward([Span(lane, start, ids[start:start + 64])]).hidden
              for start in range(0, len(ids), 64)]
    hidden += [lanes.forward([Span(lane, at, full[at:at + 1], decode=True)]).hidden
               for at in range(len(ids), len(full))]
    return model.logits(torch.cat(hidden))
