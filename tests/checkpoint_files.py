"""Small checkpoint directories written for tests: a config, tensors in one file or in shards."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path

import safetensors.torch
import torch

TENSORS = {
    "model.embed_tokens.weight": torch.arange(24, dtype=torch.float32).reshape(6, 4),
    "model.norm.weight": torch.ones(4, dtype=torch.bfloat16),
    "model.layers.0.mlp.weight": torch.randn(3, 4),
    "model.positions": torch.arange(5, dtype=torch.int64),
}


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value))


def make_checkpoint(directory: Path, config: Mapping[str, object] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "config.json", config or {"model_type": "qwen3_next"})
    safetensors.torch.save_file(TENSORS, str(directory / "model.safetensors"))
    return directory


def make_sharded(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "config.json", {"model_type": "qwen3_next"})
    names = sorted(TENSORS)
    shards = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
    for file, part in shards.items():
        safetensors.torch.save_file({n: TENSORS[n] for n in part}, str(directory / file))
    write_json(directory / "model.safetensors.index.json",
               {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}})
    return directory


def write_raw(path: Path, header: dict[str, object], data: bytes, length: int | None = None) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
