"""The store's rows of the environment table (TF_LEARN_*, TF_IMPRINT_VERIFY), read once."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from tfd.env import Settings
from tfd.pool.config import GIB
from tfd.store.store import Store


def learn_directory(settings: Settings, environ: Mapping[str, str]) -> Path:
    """TF_LEARN_DIR, else systemd's StateDirectory=, else the XDG state home."""
    explicit = settings.optional("TF_LEARN_DIR", str)
    if explicit:
        return Path(explicit)
    if environ.get("STATE_DIRECTORY"):
        return Path(environ["STATE_DIRECTORY"].split(":")[0]) / "learned"
    if environ.get("XDG_STATE_HOME"):
        return Path(environ["XDG_STATE_HOME"]) / "tfd" / "learned"
    return Path.home() / ".local" / "state" / "tfd" / "learned"


@attrs.frozen
class StoreConfig:
    """``enabled``: prompt states are learned on disk (TF_LEARN_CONVERSATIONS) under ``root``, within
    ``budget`` bytes, ``daily`` bytes written a day and ``floor`` bytes left free; ``verify``: each
    file read back once written."""

    enabled: bool
    root: Path
    budget: int
    daily: int
    floor: int
    verify: bool

    @classmethod
    def from_settings(cls, settings: Settings, environ: Mapping[str, str]) -> StoreConfig:
        return cls(settings.value("TF_LEARN_CONVERSATIONS", bool), learn_directory(settings, environ),
                   int(settings.value("TF_LEARN_GIB", float) * GIB),
                   int(settings.value("TF_LEARN_DAILY_GIB", float) * GIB),
                   int(settings.value("TF_LEARN_MIN_FREE_GIB", float) * GIB),
                   settings.value("TF_IMPRINT_VERIFY", bool))

    def open(self, identity: str) -> Store:
        """The store of ``identity``'s learned states (its directory made when missing)."""
        return Store(self.root, identity, self.budget, self.daily, self.floor, self.verify)
