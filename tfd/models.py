"""Which checkpoint a command uses, and loading it: TF_MODEL, else TF_SHAPE (random weights), else
the demo named by TF_DEMO.

The family's rows of the environment table are checked here, between reading config.json and
loading any weight (``Settings.check_family``), so a bad value of another family's row never
stops this start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

import attrs
import tokenizers
import torch

from tfd.chat import ChatTemplate, ChatTemplateError, find_chat_template
from tfd.checkpoint import Checkpoint, CheckpointError, read_config
from tfd.demo import build_demo, default_dtype
from tfd.env import Settings, SettingsRefused
from tfd.families.hybrid import HybridModel, load_model
from tfd.model.parallel import Parallel
from tfd.quantization import report
from tfd.shapes import Shape, fit, weight_budget, write_shape

log = logging.getLogger("tfd.models")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cache_directory(settings: Settings, environ: Mapping[str, str]) -> Path:
    explicit = settings.optional("TF_CACHE_DIR", str)
    if explicit:
        return Path(explicit)
    if environ.get("CACHE_DIRECTORY"):  # systemd's CacheDirectory=
        return Path(environ["CACHE_DIRECTORY"].split(":")[0])
    if environ.get("XDG_CACHE_HOME"):
        return Path(environ["XDG_CACHE_HOME"]) / "tfd"
    return Path.home() / ".cache" / "tfd"


def model_directory(settings: Settings, environ: Mapping[str, str], device: torch.device | None = None
                    ) -> tuple[Path, Shape | None]:
    """TF_MODEL; else TF_SHAPE written as a directory without weights (cut to fit ``device``), with
    its shape; else the demo TF_DEMO, built at first use."""
    explicit = settings.optional("TF_MODEL", str)
    if explicit:
        return Path(explicit), None
    preset = settings.optional("TF_SHAPE", str)
    if preset is not None:
        fp8 = settings.value("TF_DTYPE", str) == "fp8"
        shape = fit(preset, weight_budget(device or torch.device("cpu")), fp8)
        return write_shape(shape, cache_directory(settings, environ)), shape
    return build_demo(settings.value("TF_DEMO", str), cache_directory(settings, environ)), None


def check_fp8_device(device: torch.device, path: Path | str) -> None:
    """``CheckpointError`` unless FP8 weights (``path``'s) can run on ``device``: the CPU's reference
    products, CUDA's kernels (``tfd_kernels.fp8_gemm``, the MoE kernels' FP8 experts)."""
    if device.type not in ("cpu", "cuda"):
        raise CheckpointError(f"{path}: block-wise FP8 weights run on the CPU and CUDA only (tfd has no FP8 "
                              f"product on {device.type}); serve the bf16 weights")


@attrs.frozen
class Loaded:
    path: Path
    family: str
    model: HybridModel
    settings: Settings  # with the family's rows checked
    tokenizer: tokenizers.Tokenizer
    template: ChatTemplate | None
    eos_ids: tuple[int, ...]
    seconds: float
    shape: Shape | None = None  # TF_SHAPE: a released model's shape, its weights random
    random_weights: bool = False


def load(settings: Settings, environ: Mapping[str, str], device: torch.device,
         random_weights: bool = False, parallel: Parallel | None = None) -> Loaded:
    """Open, check and load the model a command asked for; ``random_weights`` takes only the
    checkpoint's config.json and tokenizer and draws the weights; ``parallel``: this rank's share.

    Raises ``CheckpointError`` for a checkpoint refused before any weight loads, and
    ``SettingsRefused`` for a bad row of the checkpoint's family.
    """
    began = time.monotonic()
    name = settings.value("TF_DTYPE", str)
    fp8 = name == "fp8"
    path, shape = model_directory(settings, environ, device)
    if shape is not None:
        random_weights = True
        if shape.cut:
            log.warning("shape %s", shape.cut)
    config = read_config(path)
    settings = settings.check_family(config.family)
    override = settings.optional("TF_CHAT_TEMPLATE", str)
    try:  # before the weights: a template that will not do is refused in seconds, not after a load
        template = find_chat_template(path, None if override is None else Path(override))
    except ChatTemplateError as error:
        if override is None:
            raise
        raise SettingsRefused([f"TF_CHAT_TEMPLATE={override}: {error}"]) from None
    dtype = default_dtype(device) if name in ("auto", "fp8") else DTYPES[name]
    if fp8 and shape is None:
        raise SettingsRefused([f"TF_DTYPE=fp8: draws a shape's weights in FP8 (TF_SHAPE); {path} is a "
                               f"checkpoint, whose FP8 weights come with its quantization_config"])
    if fp8 or config.quantization is not None:
        check_fp8_device(device, path)
    if random_weights:
        head = int(config.text.get("mtp_num_hidden_layers", 0) or 0) > 0  # type: ignore[call-overload]
        model = HybridModel.random(config.family, config.text, dtype=dtype, device=device, head=head, fp8=fp8,
                                   parallel=parallel)
        checkpoint = None
        log.warning("the weights of %s are RANDOM (%s): its replies are noise, for measuring the server",
                    shape.name if shape is not None else path, "TF_SHAPE" if shape is not None
                    else "--random-weights")
    else:
        checkpoint = Checkpoint.open(path)
        model = load_model(checkpoint, device, dtype, parallel=parallel)
        if config.quantization is not None:
            log.info("block-wise FP8: %s", report(checkpoint.tensors))
    seconds = time.monotonic() - began
    log.info("loaded %s (%s, %d layers%s) from %s in %.2fs", config.family, str(dtype).removeprefix("torch."),
             model.cfg.layers, ", random weights" if random_weights else "", path, seconds)
    tokenizer_path = path / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise CheckpointError(f"{tokenizer_path}: missing; the checkpoint has no tokenizer")
    eos = checkpoint.eos_ids if checkpoint is not None else model.cfg.eos
    return Loaded(path, config.family, model, settings, tokenizers.Tokenizer.from_file(str(tokenizer_path)),
                  template, eos, seconds, shape, random_weights)
