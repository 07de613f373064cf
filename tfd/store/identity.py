"""Which states a server may read: the identity of what computes them.

A learned state is read back only by a server that would have computed the same bytes. Its identity
covers the checkpoint (config.json's bytes; each weight file's name, size and modification time),
the sources of the code that computes states (``tfd_kernels``, ``tfd.model``, ``tfd.families``), the
device and its driver, torch's and triton's versions, the dtype, whether the MTP head drafts (its
rows are then part of a state), and the digest of a probe: a fixed prompt's state computed at load.
The probe catches what the facts miss (a weight rewritten in place with the same time, a compiler
that changed bits). Its hex digest names the identity's directory.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

SOURCES = ("tfd_kernels", "tfd.model", "tfd.families")
FACTS = "facts"  # an identity directory's file: the digest of the facts it covers, the probe's left out
PROBE_TOKENS = 129  # a state kept at 128: two GDN chunks, and a row left to run


def probe_prompt(vocab: int) -> tuple[int, ...]:
    """The probe's prompt: fixed ids spread over the vocabulary."""
    return tuple((37 * i + 11) % vocab for i in range(PROBE_TOKENS))


def sources_digest(packages: Iterable[str] = SOURCES) -> str:
    """sha256 over the Python sources of ``packages`` (found where they import from, a checkout or a
    wheel alike), each file by its package and name. ``tfd_kernels`` is a namespace package: where
    several folders hold it, a name's first file is the one imported, and the one digested."""
    digest = hashlib.sha256()
    for package in packages:
        folders = [Path(folder) for folder in importlib.import_module(package).__path__]
        files: dict[str, Path] = {}
        for folder in folders:
            for path in folder.rglob("*.py") if folder.is_dir() else ():
                files.setdefault(str(path.relative_to(folder)), path)
        if not files:
            raise FileNotFoundError(f"{package}: no sources to digest in {[str(f) for f in folders]}")
        for name, path in sorted(files.items()):
            digest.update(f"{package}/{name}".encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def checkpoint_facts(directory: Path) -> dict[str, object]:
    """config.json's digest and each weight file's name, size and modification time."""
    files = []
    for path in sorted(directory.glob("*.safetensors")):
        status = path.stat()
        files.append([path.name, status.st_size, status.st_mtime_ns])
    config = hashlib.sha256((directory / "config.json").read_bytes()).hexdigest()
    return {"config": config, "weights": files}


def device_facts(device: torch.device) -> dict[str, object]:
    """The device's name and driver, and the versions of torch and triton."""
    facts: dict[str, object] = {"torch": torch.__version__, "device": device.type}
    try:
        import triton

        facts["triton"] = triton.__version__
    except ImportError:
        facts["triton"] = None
    if device.type == "cuda":
        facts["device"] = torch.cuda.get_device_name(device)
        facts["cuda"] = torch.version.cuda
        driver = getattr(torch._C, "_cuda_getDriverVersion", None)
        facts["driver"] = driver() if driver is not None else None
    return facts


def facts(checkpoint: Path, device: torch.device, dtype: torch.dtype, drafts: bool) -> dict[str, object]:
    """Everything the identity covers but the probe."""
    return {"checkpoint": checkpoint_facts(checkpoint), "sources": sources_digest(),
            **device_facts(device), "dtype": str(dtype), "drafts": drafts}


def identity(found: Mapping[str, object], probe: str) -> str:
    """The identity's name: 16 hex digits of the facts and the probe's digest."""
    return facts_digest({**found, "probe": probe})


def facts_digest(found: Mapping[str, object], digits: int = 16) -> str:
    """``digits`` hex digits of the facts alone (``identity``'s without the probe)."""
    return hashlib.sha256(json.dumps(dict(found), sort_keys=True, default=str).encode()).hexdigest()[:digits]


def part_digests(found: Mapping[str, object]) -> dict[str, str]:
    """Each fact's own digest (8 hex digits), by name: two starts' logs show which fact moved."""
    return {name: facts_digest({name: value}, 8) for name, value in sorted(found.items())}


def beside(home: Path, found: Mapping[str, object]) -> list[Path]:
    """Mark the identity directory ``home`` with its facts' digest; the other identity directories
    beside it marked with the same: a server of these very facts wrote them, and its probe's state was
    other bits (the probe did not compute the same at every start), so their states are not read here."""
    mine = facts_digest(found)
    (home / FACTS).write_text(mine + "\n")
    found_beside = []
    for other in sorted(home.parent.iterdir()):
        marker = other / FACTS
        if other != home and marker.is_file() and marker.read_text().strip() == mine:
            found_beside.append(other)
    return found_beside
