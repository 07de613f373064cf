"""A safetensors checkpoint's tensor headers, read without mapping a file or reading a weight.

Our own parse of each file's 8-byte length and the JSON after it (``read_tensors``: the single
file, or the shards an index lists), refusing any inconsistency before anything loads: a broken
index, a shard that lacks a tensor, a truncated header, offsets that disagree with dtype and shape,
run past the file's end or overlap. Every refusal is a ``CheckpointError`` naming the file or
tensor at fault; ``tfd.checkpoint`` builds on these.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import attrs

# Bits per element of every safetensors dtype; the 4- and 6-bit ones pack several to a byte.
DTYPE_BITS: Mapping[str, int] = MappingProxyType({
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F4": 4,
    "F6_E2M3": 6, "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
    "F32": 32, "F64": 64, "I64": 64, "U64": 64, "C64": 64,
})
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(Exception):
    """A checkpoint refused: the message names the file or tensor at fault and the problem."""


@attrs.frozen
class TensorInfo:
    """One tensor's header: ``start`` and ``end`` are absolute byte positions in ``file``."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_json_object(path: Path) -> dict[str, object]:
    """The JSON object in ``path``; ``CheckpointError`` naming it when missing, unreadable or other."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: unreadable: {error}") from error
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path}: not JSON: {error}") from error
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: must hold a JSON object, not {type(value).__name__}")
    return value


def read_tensors(directory: Path) -> dict[str, TensorInfo]:
    """Every tensor's header under ``directory``: its single file's, or its index's shards'."""
    single = directory / SINGLE_FILE
    # Both present: the single file wins, as transformers picks it first.
    if single.is_file():
        return _read_header(single)
    index_path = directory / INDEX_FILE
    if not index_path.is_file():
        raise CheckpointError(f"{directory}: no {SINGLE_FILE} and no {INDEX_FILE}")
    weight_map = read_json_object(index_path).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_path}: weight_map missing or not a non-empty object")
    headers: dict[str, dict[str, TensorInfo]] = {}
    tensors = {}
    for name, file in weight_map.items():
        if not isinstance(file, str) or Path(file).is_absolute() or ".." in Path(file).parts:
            raise CheckpointError(f"{index_path}: tensor {name} maps to {file!r}, not a file "
                                  f"inside the checkpoint")
        if file not in headers:
            if not (directory / file).is_file():
                raise CheckpointError(f"{index_path}: lists {file} (for tensor {name}), "
                                      f"which does not exist")
            headers[file] = _read_header(directory / file)
        info = headers[file].get(name)
        if info is None:
            raise CheckpointError(f"{index_path}: maps tensor {name} to {file}, whose header lacks it")
        tensors[name] = info
    return tensors


def _read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors of one safetensors file, from its header alone; refuses any inconsistency."""
    with path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        length_bytes = handle.read(8)
        if len(length_bytes) < 8:
            raise CheckpointError(f"{path}: truncated: {size} bytes, shorter than a header length")
        (length,) = struct.unpack("<Q", length_bytes)
        if length > MAX_HEADER_BYTES or 8 + length > size:
            raise CheckpointError(f"{path}: truncated or not safetensors: header of {length} bytes "
                                  f"in a file of {size}")
        raw = handle.read(length)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: header is not JSON: {error}") from error
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    data_start, data_size = 8 + length, size - 8 - length
    tensors = {}
    for name, entry in header.items():
        if name != "__metadata__":
            tensors[name] = _tensor_info(path, name, entry, data_start, data_size)
    spans = sorted((info.start, info.end, info.name) for info in tensors.values() if info.nbytes)
    for (_, end, before), (start, _, after) in itertools.pairwise(spans):
        if start < end:
            raise CheckpointError(f"{path}: tensors {before} and {after} overlap")
    return tensors


def _tensor_info(path: Path, name: str, entry: object, data_start: int, data_size: int) -> TensorInfo:
    if not isinstance(entry, dict):
        raise CheckpointError(f"{path}: tensor {name}: header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise CheckpointError(f"{path}: tensor {name}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(count(n) for n in shape):
        raise CheckpointError(f"{path}: tensor {name}: shape {shape!r} is not a list of counts")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(count(n) for n in offsets)):
        raise CheckpointError(f"{path}: tensor {name}: data_offsets {offsets!r} is not two counts")
    begin, end = offsets
    elements = 1
    for n in shape:
        elements *= n
    bits = elements * DTYPE_BITS[str(dtype)]
    if bits % 8 or end - begin != bits // 8:
        raise CheckpointError(f"{path}: tensor {name}: data_offsets {offsets} hold {end - begin} bytes, "
                              f"but {dtype} {shape} needs {bits / 8:g}")
    if end > data_size:
        raise CheckpointError(f"{path}: tensor {name}: data_offsets {offsets} run past the end of "
                              f"the data ({data_size} bytes)")
    return TensorInfo(name, path, str(dtype), tuple(shape), data_start + begin, data_start + end)


def count(value: object) -> bool:
    """Whether ``value`` is a JSON count: an integer (not a bool) of at least 0."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
