"""The demo's training text: Python's standard library sources as one deterministic token stream.

Every ``*.py`` under the root (by default ``sysconfig.get_paths()["stdlib"]``; third-party
``site-packages``/``dist-packages`` left out, since they differ between machines), in sorted order of
their relative paths, is tokenized with the demo tokenizer; each file's tokens are followed by
``<|endoftext|>`` (id 0). A file goes to validation when the hash of its relative path says so
(about ``VALIDATION`` of them), so the split depends on nothing but the path. Files that are not
UTF-8 are skipped and counted; empty ones too. Windows for training are drawn at seeded random
offsets (``Sampler``); validation reads consecutive windows from the start (``tiles``).
"""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import attrs
import tokenizers
import torch

from tfd.demo import ENDOFTEXT, TOKENIZER

VALIDATION = 0.05  # the share of files held out
_BUCKETS = 10_000
THIRD_PARTY = frozenset({"site-packages", "dist-packages"})


def stdlib_root() -> Path:
    """This interpreter's standard library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path) -> list[str]:
    """The relative POSIX paths of every ``*.py`` under ``root``, sorted; third-party trees left out.

    Raises ``FileNotFoundError`` naming ``root`` when it is not a directory.
    """
    if not root.is_dir():
        raise FileNotFoundError(f"corpus root {root} is not a directory")
    found = (path.relative_to(root) for path in root.rglob("*.py") if path.is_file())
    return sorted(rel.as_posix() for rel in found if rel.parts[0] not in THIRD_PARTY)


def is_validation(relative: str) -> bool:
    """Whether the file at ``relative`` is held out: the first 8 bytes of its path's sha256."""
    bucket = int.from_bytes(hashlib.sha256(relative.encode()).digest()[:8], "little") % _BUCKETS
    return bucket < VALIDATION * _BUCKETS


@attrs.frozen
class Corpus:
    """The two token streams (int32) and what went into them."""

    root: Path
    train: torch.Tensor
    validation: torch.Tensor
    train_files: int
    validation_files: int
    skipped: tuple[str, ...]  # relative paths that are not UTF-8
    empty: int  # files with no text

    @classmethod
    def read(cls, root: Path | None = None, tokenizer: Path = TOKENIZER) -> Corpus:
        """Read and tokenize every source file under ``root`` (default: ``stdlib_root()``).

        Resource handling: files are read one at a time; only their texts and the streams stay in
        memory (about 30 MB of text and 11 M tokens for CPython 3.11's library). An unreadable file
        raises the ``OSError`` naming it.
        """
        root = stdlib_root() if root is None else root
        texts: dict[str, list[str]] = {"train": [], "validation": []}
        skipped: list[str] = []
        empty = 0
        for relative in source_files(root):
            try:
                text = (root / relative).read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                skipped.append(relative)
                continue
            if not text.strip():
                empty += 1
                continue
            texts["validation" if is_validation(relative) else "train"].append(text)
        coder = tokenizers.Tokenizer.from_file(str(tokenizer))
        return cls(root, stream(coder, texts["train"]), stream(coder, texts["validation"]),
                   len(texts["train"]), len(texts["validation"]), tuple(skipped), empty)

    def digest(self) -> str:
        """sha256 of both streams' bytes: two machines trained on the same tokens agree."""
        hashed = hashlib.sha256()
        for tokens in (self.train, self.validation):
            hashed.update(tokens.numpy().tobytes())
        return hashed.hexdigest()

    def summary(self) -> dict[str, object]:
        return {"root": str(self.root), "train_files": self.train_files,
                "validation_files": self.validation_files, "skipped_not_utf8": len(self.skipped),
                "empty_files": self.empty, "train_tokens": int(self.train.numel()),
                "validation_tokens": int(self.validation.numel()), "sha256": self.digest()}


def stream(coder: tokenizers.Tokenizer, texts: Sequence[str]) -> torch.Tensor:
    """The texts' tokens, each text followed by ``<|endoftext|>``, as one int32 tensor."""
    end = torch.tensor([ENDOFTEXT], dtype=torch.int32)
    parts = [piece for encoding in coder.encode_batch(list(texts), add_special_tokens=False)
             for piece in (torch.tensor(encoding.ids, dtype=torch.int32), end)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int32)


class Sampler:
    """``[batch, length]`` windows of ``tokens`` at offsets drawn by a generator seeded with ``seed``."""

    def __init__(self, tokens: torch.Tensor, batch: int, length: int, seed: int, name: str = "train") -> None:
        if tokens.numel() < length:
            raise ValueError(f"the {name} split has {tokens.numel()} tokens, fewer than a window of {length}")
        self.tokens = tokens
        self.batch = batch
        self.offsets = torch.arange(length)
        self.generator = torch.Generator().manual_seed(seed)

    def draw(self) -> torch.Tensor:
        """The next windows, int64 on the CPU."""
        last = self.tokens.numel() - self.offsets.numel()
        starts = torch.randint(0, last + 1, (self.batch,), generator=self.generator)
        return self.tokens[starts[:, None] + self.offsets].long()


def tiles(tokens: torch.Tensor, length: int, most: int, name: str = "validation") -> torch.Tensor:
    """Up to ``most`` consecutive, non-overlapping ``length``-token windows from the start of
    ``tokens``, int64 ``[windows, length]``; refused naming the split when not one fits."""
    count = min(most, tokens.numel() // length)
    if count < 1:
        raise ValueError(f"the {name} split has {tokens.numel()} tokens, fewer than a window of {length}")
    return tokens[:count * length].view(count, length).long()
