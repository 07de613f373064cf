"""Loading checkpoints: refusals before any weight loads, shards, and the family constants."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import tiny_models
import torch
from reference_loop import LanePool
from safetensors.torch import load_file, save_file

from tfd.bench.workload import drive
from tfd.checkpoint import Checkpoint, CheckpointError
from tfd.engine.request import Request, Sampling
from tfd.families.config import Ple
from tfd.families.hybrid import load_model
from tfd.families.qwen4_exp import PleTables
from tfd.model.decode import batches
from tfd.model.memory import Span


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_models.save("qwen4_exp", tmp_path_factory.mktemp("tiny"))


def copy_with(saved: Path, where: Path, change: dict[str, torch.Tensor | None]) -> Path:
    """A copy of the checkpoint with tensors replaced (or removed, for None)."""
    target = where / "changed"
    shutil.copytree(saved, target)
    tensors = load_file(target / "model.safetensors")
    for name, value in change.items():
        if value is None:
            del tensors[name]
        else:
            tensors[name] = value
    save_file(tensors, target / "model.safetensors")
    return target


QKV = "model.layers.0.linear_attn.in_proj_qkv.weight"


def test_a_missing_tensor_is_refused_naming_it(saved: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=f"{QKV}: missing"):
        load_model(Checkpoint.open(copy_with(saved, tmp_path, {QKV: None})))


def test_a_wrong_shape_is_refused_naming_it(saved: Path, tmp_path: Path) -> None:
    changed = copy_with(saved, tmp_path, {QKV: torch.zeros(128, 63)})
    with pytest.raises(CheckpointError, match=rf"{QKV}: shape \[128, 63\], expected \[128, 64\]"):
        load_model(Checkpoint.open(changed))


def test_a_wrong_dtype_is_refused_naming_it(saved: Path, tmp_path: Path) -> None:
    changed = copy_with(saved, tmp_path, {QKV: torch.zeros(128, 64, dtype=torch.int32)})
    with pytest.raises(CheckpointError, match=f"{QKV}: dtype I32, expected BF16 or F16 or F32"):
        load_model(Checkpoint.open(changed))


def test_an_unknown_model_type_is_refused_naming_it(saved: Path, tmp_path: Path) -> None:
    changed = tmp_path / "other"
    shutil.copytree(saved, changed)
    config = json.loads((changed / "config.json").read_text())
    config["model_type"] = "llama"
    (changed / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="model_type 'llama' is not served"):
        load_model(Checkpoint.open(changed))


def test_a_broken_index_is_refused_naming_the_file(saved: Path, tmp_path: Path) -> None:
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(saved / "config.json", sharded)
    tensors = load_file(saved / "model.safetensors")
    names = sorted(tensors)
    save_file({n: tensors[n] for n in names[::2]}, sharded / "a.safetensors")
    save_file({n: tensors[n] for n in names[1::2]}, sharded / "b.safetensors")
    weight_map = {n: "a.safetensors" for n in names[::2]} | {n: "b.safetensors" for n in names[1::2]}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    model = load_model(Checkpoint.open(sharded), dtype=torch.float32, progress=False)
    whole = load_model(Checkpoint.open(saved), dtype=torch.float32, progress=False)
    ids = torch.arange(1, 40)
    outputs = []
    for each in (model, whole):
        lanes = LanePool(each, 40)
        outputs.append(lanes.forward([Span(lanes.open(), 0, ids)]).hidden)
    assert torch.equal(*outputs)

    (sharded / "b.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"lists b.safetensors .* which does not exist"):
        load_model(Checkpoint.open(sharded))


def test_flash_next_ple_constants_are_the_released_ones() -> None:
    # reference/model.md 3.6: the released config's primes, offsets and multipliers.
    released = Ple(layers=(1,), embed=2560, kernel=4, ngram=3, heads_per_ngram=8, vocab_base=20_000_000,
                   divisor=128, seed=1234)
    tables = PleTables.of(released, 248_320, 0)
    assert tables.sizes[:3] == (20000003, 20000023, 20000033)
    assert tables.sizes[-1] == 20000171
    assert tables.offsets[-1] == 300001275
    assert tables.rows == 320_001_536
    assert tables.multipliers == (23703573157769, 20109073645365, 8052911324071)
    assert tables.dim == 160


def test_flash_next_ple_constants_agree_with_the_checkpoint(saved: Path) -> None:
    stored = load_file(saved / "model.safetensors")
    prefix = "model.layers.1.ple.ple_embedding"
    config = json.loads((saved / "config.json").read_text())
    ple = Ple(layers=(1,), embed=config["ple_embed_dim"], kernel=4, ngram=3,
              heads_per_ngram=config["heads_per_ngram"], vocab_base=config["ngram_vocab_size_base"],
              divisor=config["make_ngram_vocab_size_divisible_by"], seed=1234)
    tables = PleTables.of(ple, config["vocab_size"], 0)
    assert tables.multipliers == tuple(stored[f"{prefix}.layer_multipliers"].tolist())
    assert tables.sizes == tuple(stored[f"{prefix}.ngram_heads_vocab_sizes"].tolist())
    assert tables.offsets == tuple(stored[f"{prefix}.ngram_heads_offsets"].tolist())


TABLE = "model.layers.1.ple.ple_embedding.ngram_embedding"


@pytest.mark.parametrize("shards", [4, 8])
def test_a_table_in_shards_loads_when_they_split_it_evenly_and_is_refused_when_not(
        saved: Path, tmp_path: Path, shards: int) -> None:
    """420 rows: 4 shards of 105 load joined into the one table, so the model decodes on the
    batched path (graphs on a GPU) as the one-file checkpoint does, to the same tokens; 8 shards of
    52 would lose the last 4 rows, whose ids the hash still makes, so the load refuses them by name."""
    whole = load_file(saved / "model.safetensors")[f"{TABLE}.shard_0.weight"]
    height = whole.shape[0] // shards
    parts = {f"{TABLE}.shard_{j}.weight": whole[j * height:(j + 1) * height].clone() for j in range(shards)}
    changed = copy_with(saved, tmp_path, {f"{TABLE}.shard_0.weight": None, **parts})
    if whole.shape[0] % shards:
        with pytest.raises(CheckpointError, match=rf"{TABLE}.shard_0.weight: the n-gram table's 420 rows "
                                                  rf"do not split into {shards} equal shards"):
            load_model(Checkpoint.open(changed))
        return
    model = load_model(Checkpoint.open(changed), dtype=torch.float32)
    ple = model.weights.layers[1].ple
    assert ple is not None and torch.equal(ple.table, whole)
    assert batches(model.weights)
    one = load_model(Checkpoint.open(saved), dtype=torch.float32)
    asked = [Request(f"r{i}", tuple(range(9 + i, 60 + 7 * i)), 12, Sampling(0.0)) for i in range(3)]
    assert drive(model, asked, 256, graphs=False).tokens == drive(one, asked, 256, graphs=False).tokens
