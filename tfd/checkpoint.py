"""A Hugging Face checkpoint directory: config, family, tensor headers, weights, tokenizer, template.

``Checkpoint.open`` reads ``config.json`` and every safetensors header (``tfd.checkpoint_headers``:
no file is mapped and no weight is read), so a broken checkpoint is refused before anything loads:
a bad config or ``quantization_config`` (``tfd.quantization``), an unknown ``model_type``, a broken
index, a shard that lacks a tensor, a truncated header, offsets that disagree with dtype and shape
or run past the file's end. ``check`` then compares the headers with what a family expects and
lists every problem at once. ``load`` reads the named tensors file by file through
``safetensors.safe_open``. The tokenizer and the chat template (``tfd.chat``) are read when asked
for.

Every refusal is a ``CheckpointError`` whose message names the file or tensor at fault.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs

from tfd.chat import ChatTemplate, find_chat_template
from tfd.checkpoint_headers import CheckpointError as CheckpointError  # its refusals, as before the split
from tfd.checkpoint_headers import TensorInfo, count, read_json_object, read_tensors
from tfd.loading import Progress
from tfd.quantization import FP8, SCALES, BlockFp8, QuantizationRefused, fp8_problems, read_quantization

if TYPE_CHECKING:  # loading weights needs them; reading a config does not
    import tokenizers
    import torch

# config.json model_type -> the family that serves it.
FAMILIES: Mapping[str, str] = MappingProxyType({
    "qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe": "qwen3_5_moe", "qwen3_5_moe_text": "qwen3_5_moe",
    "qwen3_next": "qwen3_next",
    "qwen4_exp": "qwen4_exp", "qwen4_exp_text": "qwen4_exp",
})
FLOAT_DTYPES = frozenset({"F32", "BF16", "F16"})
# Only these are cast by load(dtype=...): integers are ids and 8-bit floats need their scales.
CAST_DTYPES = frozenset({"F32", "BF16", "F16", "F64"})
LISTED_PROBLEMS = 20
# what of a tensor to read (its name and stored shape): (dimension, [(first, past last), ...]), None: all
Take = Callable[[str, tuple[int, ...]], "tuple[int, list[tuple[int, int]]] | None"]


def _as_shape(shape: Iterable[int]) -> tuple[int, ...]:
    return tuple(shape)


@attrs.frozen
class TensorSpec:
    """What a family expects of one tensor; ``dtypes`` None allows any of ``FLOAT_DTYPES``."""

    shape: tuple[int, ...] = attrs.field(converter=_as_shape)
    dtypes: frozenset[str] | None = None


@attrs.frozen
class Config:
    """``root`` is config.json as read; ``text`` is its ``text_config`` over the root, or the root;
    ``quantization``: its ``quantization_config`` read (``tfd.quantization``), None without one."""

    root: Mapping[str, object]
    text: Mapping[str, object]
    family: str
    quantization: BlockFp8 | None = None


@attrs.frozen
class Checkpoint:
    """An opened checkpoint directory whose config and tensor headers were found sound.

    Holds no open file: ``load`` opens each file it reads from and closes it before returning.
    """

    path: Path
    config: Config
    tensors: Mapping[str, TensorInfo]
    eos_ids: tuple[int, ...]

    @classmethod
    def open(cls, path: Path) -> Checkpoint:
        """Read config.json, generation_config.json and every tensor header under ``path``.

        Reads only headers (a few kilobytes a file). Raises ``CheckpointError`` for a missing or
        malformed config, an unknown ``model_type``, no safetensors, or any broken header or index.
        """
        path = Path(path)
        config = _read_config(path / "config.json")
        tensors = read_tensors(path)
        return cls(path, config, MappingProxyType(tensors), _eos_ids(path, config.text))

    @property
    def family(self) -> str:
        return self.config.family

    @property
    def text_config(self) -> Mapping[str, object]:
        return self.config.text

    def check(self, expected: Mapping[str, TensorSpec]) -> None:
        """Refuse headers that differ from ``expected``: one ``CheckpointError`` lists every problem.

        Each line names a tensor that is missing, or whose shape or dtype differs; the list stops
        at ``LISTED_PROBLEMS`` lines and counts the rest. Tensors not expected are allowed.
        """
        problems = []
        for name, spec in expected.items():
            found = self.tensors.get(name)
            if found is None:
                problems.append(f"{name}: missing")
                continue
            if found.shape != tuple(spec.shape):
                problems.append(f"{name}: shape {list(found.shape)}, expected {list(spec.shape)}")
            allowed = FLOAT_DTYPES if spec.dtypes is None else spec.dtypes
            if found.dtype == FP8 and spec.dtypes is None:  # a float weight stored block-wise in FP8
                problems += fp8_problems(self.config.quantization, name, self.tensors)
            elif found.dtype not in allowed:
                problems.append(f"{name}: dtype {found.dtype}, expected {' or '.join(sorted(allowed))}")
        if problems:
            lines = problems[:LISTED_PROBLEMS]
            if len(problems) > LISTED_PROBLEMS:
                lines.append(f"and {len(problems) - LISTED_PROBLEMS} more")
            count = f"{len(problems)} problem" + ("s" if len(problems) > 1 else "")
            raise CheckpointError(f"{self.path}: tensors do not fit the {self.family} family "
                                  f"({count}):\n" + "\n".join(f"  {line}" for line in lines))

    def load(self, names: Iterable[str], device: torch.device | str = "cpu",
             dtype: torch.dtype | None = None, progress: bool | None = None,
             joined: Mapping[str, Sequence[str]] | None = None, take: Take | None = None
             ) -> dict[str, torch.Tensor]:
        """Read the named tensors onto ``device``; floating ones are cast to ``dtype`` when given.
        ``take`` (a tensor's name and stored shape to the dimension and ranges along it to read, or
        None for the whole; tensor parallel's share) reads only those ranges, joined in order.

        ``joined`` maps a new name to named tensors (shards of one table) that are read into
        consecutive rows of one tensor of that name instead: each is copied in as it is read and
        let go, so the device holds the whole once and one shard beside it, never the shards and
        the whole. Its parts must agree past their first dimension and in dtype (``CheckpointError``
        naming the new name before any file opens).

        Opens each file once (in name order, tensors in file order) and closes it before the next.
        Integer and 8-bit float tensors keep their stored dtype. ``progress`` draws a bar on
        standard error (None: only when it is a terminal); a listener set by ``tfd.loading.reporting``
        hears files and bytes read either way. An unknown name raises
        ``CheckpointError`` before any file opens; a file that safetensors refuses raises
        ``CheckpointError`` naming it, and the tensors read so far are dropped.
        """
        import safetensors
        import torch

        joined = joined or {}
        wanted = list(dict.fromkeys([*names, *(part for parts in joined.values() for part in parts)]))
        unknown = [name for name in wanted if name not in self.tensors]
        if unknown:
            shown = ", ".join(unknown[:LISTED_PROBLEMS]) + (", ..." if len(unknown) > LISTED_PROBLEMS else "")
            raise CheckpointError(f"{self.path}: no tensor named {shown}")
        into, rows = self._joins(joined)
        by_file: dict[Path, list[TensorInfo]] = {}
        for name in wanted:
            info = self.tensors[name]
            by_file.setdefault(info.file, []).append(info)
        if progress is None:
            progress = sys.stderr.isatty()
        bar = Progress(sum(self.tensors[n].nbytes for n in wanted), len(by_file),
                       sys.stderr if progress else None)
        loaded: dict[str, torch.Tensor] = {}
        try:
            for file in sorted(by_file):
                try:
                    with safetensors.safe_open(file, framework="pt", device=str(device)) as handle:
                        for info in sorted(by_file[file], key=lambda info: info.start):
                            ranges = None if take is None else take(info.name, tuple(info.shape))
                            tensor = handle.get_tensor(info.name) if ranges is None \
                                else _read_ranges(handle.get_slice(info.name), *ranges)
                            if dtype is not None and info.dtype in CAST_DTYPES:  # FP8 scales: fp32, exact
                                tensor = tensor.to(torch.float32 if info.name.endswith(SCALES) else dtype)
                            if info.name in into:
                                target, first = into[info.name]
                                if target not in loaded:
                                    loaded[target] = tensor.new_empty((rows[target], *tensor.shape[1:]))
                                loaded[target][first:first + tensor.shape[0]].copy_(tensor)
                                del tensor
                            else:
                                loaded[info.name] = tensor
                            bar.advance(info.nbytes)
                    bar.file_done()
                except (safetensors.SafetensorError, OSError) as error:
                    raise CheckpointError(f"{file}: cannot load: {error}") from error
        finally:
            bar.close()
        return {name: loaded[name] for name in [*wanted, *joined] if name not in into}

    def _joins(self, joined: Mapping[str, Sequence[str]]
               ) -> tuple[dict[str, tuple[str, int]], dict[str, int]]:
        """Each joined part's new name and first row there, and each new name's rows."""
        into: dict[str, tuple[str, int]] = {}
        rows: dict[str, int] = {}
        for target, parts in joined.items():
            infos = [self.tensors[part] for part in parts]
            if not infos or len({(info.dtype, info.shape[1:]) for info in infos}) != 1 \
                    or any(len(info.shape) == 0 for info in infos):
                shown = ", ".join(parts[:LISTED_PROBLEMS])
                raise CheckpointError(f"{target}: its parts {shown} do not join: they must share a dtype "
                                      "and every dimension past the first")
            first = 0
            for info in infos:
                into[info.name] = (target, first)
                first += info.shape[0]
            rows[target] = first
        return into, rows

    def load_one(self, name: str, device: torch.device | str = "cpu",
                 dtype: torch.dtype | None = None) -> torch.Tensor:
        """One tensor, as ``load`` reads it, without a progress bar."""
        return self.load([name], device, dtype, progress=False)[name]

    def tokenizer(self) -> tokenizers.Tokenizer:
        """The tokenizer of tokenizer.json; ``CheckpointError`` naming the file when absent or bad."""
        import tokenizers

        path = self.path / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(f"{path}: missing; the checkpoint has no tokenizer")
        try:
            return tokenizers.Tokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises a bare Exception for every parse failure
            raise CheckpointError(f"{path}: not a readable tokenizer: {error}") from error

    def chat_template(self) -> ChatTemplate | None:
        """The checkpoint's chat template (``tfd.chat.find_chat_template``), or None when it has none."""
        return find_chat_template(self.path)


def _read_ranges(stored: Any, dim: int, ranges: Sequence[tuple[int, int]]) -> torch.Tensor:
    """``ranges`` of a safetensors slice along ``dim``, read and joined."""
    import torch

    lead = (slice(None),) * dim
    return torch.cat([stored[(*lead, slice(first, past))] for first, past in ranges], dim).contiguous()


def read_config(path: Path) -> Config:
    """The config of the checkpoint directory ``path`` alone (no tensor headers): for building a
    model of its shapes with random weights. Raises ``CheckpointError`` as ``Checkpoint.open``."""
    return _read_config(Path(path) / "config.json")


def open_checkpoint(path: Path) -> Checkpoint:
    """``Checkpoint.open``: config and headers read and found sound, no weight loaded."""
    return Checkpoint.open(path)


def _read_config(path: Path) -> Config:
    root = read_json_object(path)
    text = root
    nested = root.get("text_config")
    if nested is not None:
        if not isinstance(nested, dict):
            raise CheckpointError(f"{path}: text_config must be an object, not {type(nested).__name__}")
        # A multimodal config keeps some text fields (tie_word_embeddings) only at the top.
        text = {key: value for key, value in root.items() if key != "text_config"} | nested
    model_type = text.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(f"{path}: model_type {model_type!r} is not served; known: "
                              f"{', '.join(FAMILIES)}")
    try:
        quantization = read_quantization(root)
    except QuantizationRefused as refused:
        raise CheckpointError(f"{path}: {refused}") from None
    return Config(MappingProxyType(root), MappingProxyType(text), FAMILIES[str(model_type)], quantization)


def _eos_ids(directory: Path, text: Mapping[str, object]) -> tuple[int, ...]:
    generation_path = directory / "generation_config.json"
    if generation_path.is_file():
        value = read_json_object(generation_path).get("eos_token_id")
        if value is not None:
            return _token_ids(value, generation_path)
    value = text.get("eos_token_id")
    return () if value is None else _token_ids(value, directory / "config.json")


def _token_ids(value: object, path: Path) -> tuple[int, ...]:
    ids = []
    for token in value if isinstance(value, list) else [value]:
        if not isinstance(token, int) or not count(token):
            raise CheckpointError(f"{path}: eos_token_id {value!r} is not a token id or a list of them")
        ids.append(token)
    return tuple(ids)
