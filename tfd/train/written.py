"""The trained demo as a checkpoint directory: what ``tfd.demo.build_demo`` writes (config.json,
generation config, tokenizer, its config, chat template) with the trained weights in bf16, plus
``training.json``, the recipe and what came of it."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import torch
from safetensors.torch import save_file

from tfd import __version__
from tfd.demo import SEED, write_files
from tfd.train.corpus import Corpus
from tfd.train.loop import Trained
from tfd.train.recipe import Recipe


def check_out(out: Path) -> None:
    """Refuse (``FileExistsError``, naming it) an ``out`` that holds anything, before training."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"--out {out} already exists and is not an empty directory")


def write(out: Path, trained: Trained, recipe: Recipe, corpus: Corpus, device: torch.device,
          config: Mapping[str, Any]) -> dict[str, Any]:
    """Write the directory ``out``; the training record, as written to ``training.json``.

    Resource handling: written into a temporary directory beside ``out`` and renamed into place,
    so a failure leaves no half-written checkpoint (the temporary one is removed). Refuses an
    ``out`` that is not empty (``check_out``).
    """
    check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        save_file(trained.model.bf16(), staging / "model.safetensors")
        write_files(staging, config)
        weights = hashlib.sha256((staging / "model.safetensors").read_bytes()).hexdigest()
        record = training_record(trained, recipe, corpus, device, weights)
        (staging / "training.json").write_text(json.dumps(record, indent=2) + "\n")
        if out.exists():
            out.rmdir()  # empty, as check_out found it
        os.rename(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return record


def training_record(trained: Trained, recipe: Recipe, corpus: Corpus, device: torch.device,
                    weights: str) -> dict[str, Any]:
    """The recipe, the corpus (its token streams' digest included), the machine, the log lines and
    the validation scores before and after."""
    return {
        "recipe": {**attrs.asdict(recipe), "betas": list(recipe.betas), "warmup": recipe.warmup,
                   "init_seed": SEED, "init": "tfd.families.random_weights at the demo's seed"},
        "corpus": corpus.summary(),
        "steps": trained.steps,
        "stopped_early": trained.steps < recipe.steps,
        "seconds": round(trained.seconds, 3),
        "tokens": trained.steps * recipe.batch * recipe.seq,
        "validation": {"before": attrs.asdict(trained.before), "after": attrs.asdict(trained.after)},
        "log": trained.history,
        "weights_sha256": weights,
        "machine": {"device": device_name(device), "autocast": "bfloat16" if device.type == "cuda" else None,
                    "torch": torch.__version__, "python": platform.python_version(), "tfd": __version__},
    }


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    return platform.processor() or platform.machine()
