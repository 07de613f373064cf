"""Every family's FP8 checkpoint against transformers loading the same files dequantized.

transformers (``FineGrainedFP8Config(dequantize=True)``, fp32) multiplies by the dequantized weights
and leaves the activations unrounded; tfd rounds them to e4m3 per row and 128-wide group as the GPU
kernels will. So: with tfd's rounding taken out the two agree as the float checkpoints do
(tests/families/test_parity.py's tolerance), and with it, tfd's greedy choices (its prefill and its
decode rows) are transformers' wherever transformers' choice has the margin to survive the
rounding (below: how those positions are picked).

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
CALIBRATION = 100  # positions whose logits set the margin bound, and are not compared
COMPARED = 20  # positions at least that the margins must allow (decode rows among them)


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


def test_its_greedy_choices_are_transformers_where_the_margins_allow(models: tuple[torch.nn.Module, Path]
                                                                      ) -> None:
    # Along transformers' own greedy continuation of a prompt, tfd's choice at each position (its
    # prefill in chunks, then its decode rows, fed the same tokens) against transformers'. The
    # positions compared are picked by a bound measured apart from them: twice the largest logit
    # difference over the first CALIBRATION positions; every later position whose top-two margin in
    # transformers' logits exceeds it must have the same top token (a smaller margin may swap).
    reference, path = models
    model = loaded(path)
    ids = prompt_ids()
    reference.generation_config.eos_token_id = None
    with torch.no_grad():
        run = reference.generate(ids[None], max_new_tokens=CONTINUATION, do_sample=False,
                                 return_dict_in_generate=True)
        full = run.sequences[0, :-1]
        expected = reference(full[None]).logits[0]
    lanes = LanePool(model, len(full))
    lane = lanes.open()
    hidden = [lanes.forward([Span(lane, start, ids[start:start + 64])]).hidden
              for start in range(0, len(ids), 64)]
    hidden += [lanes.forward([Span(lane, at, full[at:at + 1], decode=True)]).hidden
               for at in range(len(ids), len(full))]
    ours = model.logits(torch.cat(hidden))
    bound = 2 * float((ours - expected)[:CALIBRATION].abs().amax(dim=1).median())
    top = expected.topk(2).values
    compared = torch.nonzero(top[:, 0] - top[:, 1] > bound)[:, 0]
    compared = compared[compared >= CALIBRATION]
    assert len(compared) >= COMPARED and (compared >= len(ids)).any(), \
        f"{len(compared)} positions past {bound:.3g}: {compared.tolist()}"
    assert torch.equal(ours[compared].argmax(dim=-1), expected[compared].argmax(dim=-1))
