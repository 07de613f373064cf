"""``tfd bench --compare-hf``: transformers on the same shape and workload, in the same process.

transformers builds the model from the same text config with its own random init (a step's speed
does not depend on the values) in the same dtype on the same device; it uses fla-core's GDN
kernels by itself when that package is installed. The workload is the same: ``streams`` prompts
of ``prompt_tokens`` random ids as one batch (equal lengths, so no padding), ``new_tokens`` each.
Prefill is timed as ``generate`` of one token; decode as the rest of a full ``generate``. Greedy:
sampling costs either side little, and it keeps transformers from stopping early.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from tfd.bench.workload import Workload


@attrs.frozen
class HfTimings:
    prefill_s: float
    decode_s: float  # the new tokens after the first
    fla: bool  # fla-core's kernels were importable

    def decode_tok_s(self, workload: Workload) -> float:
        return workload.streams * (workload.new_tokens - 1) / self.decode_s


def hf_model(config: Mapping[str, Any], dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    import transformers

    fields = {key: value for key, value in config.items() if key != "model_type"}
    hf_config = transformers.AutoConfig.for_model(str(config["model_type"]), **fields)
    with torch.device(device):
        model: torch.nn.Module = transformers.AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            hf_config, dtype=dtype)
    return model.eval()


def has_fla() -> bool:
    try:
        import fla  # noqa: F401
    except ImportError:
        return False
    return True


def run_hf(model: torch.nn.Module, vocab: int, workload: Workload, seed: int = 0) -> HfTimings:
    """Time ``workload`` through ``model.generate`` (a warm-up of a few tokens first)."""
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (workload.streams, workload.prompt_tokens), generator=generator).to(device)
    mask = torch.ones_like(ids)

    def generate(new: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=0)  # type: ignore[operator]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - began

    generate(2)
    prefill = generate(1)
    total = generate(workload.new_tokens)
    return HfTimings(prefill, max(total - prefill, 1e-9), has_fla())
