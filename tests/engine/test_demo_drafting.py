"""drafted == plain on the trained demo: 20 prompts, greedy and seeded, 1 to 4 drafts a round.

The demo's head was trained (``tfd train-demo``), so its drafts are often right and rounds keep
several rows: the test also holds that they do, so it covers long accepts, not only rejections.
On the GPU the drafted runs replay captured rounds.
"""

from __future__ import annotations

import pytest
import torch

from tfd.bench.workload import drive
from tfd.checkpoint import Checkpoint
from tfd.demo import build_demo
from tfd.engine.request import Request, Sampling
from tfd.engine.runner import Drafting
from tfd.families.hybrid import HybridModel, load_model

PROMPTS = (
    "def fibonacci(n):\n", "import os\nimport sys\n\n", "class Stack:\n    def __init__(self):\n",
    "for i in range(10):\n    ", "if __name__ == '__main__':\n", "with open(path) as f:\n    ",
    "try:\n    import json\nexcept ImportError:\n", "def __repr__(self):\n        return ",
    "    raise ValueError(", "from collections import ", "    def __eq__(self, other):\n",
    "# Copyright (C) 2001 Python Software Foundation\n", "    @property\n    def name(self):\n",
    "\"\"\"Utilities for ", "    return self._", "def test_", "while True:\n        line = ",
    "    if not isinstance(", "import unittest\n\nclass ", "    except OSError as e:\n",
)
NEW = 24


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def demo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[HybridModel, list[tuple[int, ...]]]:
    """The demo model on the device, and the prompts' token ids."""
    checkpoint = Checkpoint.open(build_demo("qwen3_5", tmp_path_factory.mktemp("demo")))
    dtype = torch.float32 if request.param == "cpu" else torch.bfloat16
    coder = checkpoint.tokenizer()
    return (load_model(checkpoint, str(request.param), dtype, progress=False),
            [tuple(coder.encode(text).ids) for text in PROMPTS])


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_trained_demo_drafts_the_serial_tokens(demo: tuple[HybridModel, list[tuple[int, ...]]],
                                                    temperature: float) -> None:
    model, prompts = demo
    asked = [Request(f"p{i}", ids, NEW, Sampling(temperature, seed=300 + i)) for i, ids in enumerate(prompts)]
    graphs = model.weights.embed.is_cuda
    plain = drive(model, asked, 256, graphs=False).tokens
    for most in (1, 2, 3, 4):
        drafted = drive(model, asked, 256, graphs=graphs, drafting=Drafting(most, 0.0))
        assert drafted.tokens == plain, f"{most} drafts a round"
        counts = drafted.drafts
        # the head predicts: rounds keep a draft a third of the time at least (about half, measured)
        assert counts.accepted >= counts.rounds // 3, f"{most} drafts: {counts}"
