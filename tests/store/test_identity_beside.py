"""An identity directory marks the facts it covers (the probe's state left out), so a start whose probe
computed other bits than an earlier start's, under the very same facts, finds that start's directory
beside its own and says so, where a start under other facts (another checkpoint, code or device)
finds nothing."""

from __future__ import annotations

from pathlib import Path

from tfd.store.identity import FACTS, beside, facts_digest, identity, part_digests

FOUND = {"checkpoint": {"config": "c0", "weights": []}, "sources": "s0", "device": "cuda", "dtype": "bf16",
         "drafts": True}


def home(root: Path, found: dict[str, object], probe: str) -> Path:
    directory = root / identity(found, probe)
    directory.mkdir(parents=True)
    return directory


def test_a_directory_of_the_same_facts_and_another_probe_is_found_beside(tmp_path: Path) -> None:
    first = home(tmp_path, FOUND, "probe-a")
    assert beside(first, FOUND) == []  # the first start: nothing else
    assert (first / FACTS).read_text() == facts_digest(FOUND) + "\n"
    again = tmp_path / identity(FOUND, "probe-a")
    assert again == first and beside(again, FOUND) == []  # the same probe again: the same directory
    moved = home(tmp_path, FOUND, "probe-b")
    assert beside(moved, FOUND) == [first]  # the probe computed other bits under the same facts
    other = {**FOUND, "sources": "s1"}  # other code: its own identities, none beside
    assert beside(home(tmp_path, other, "probe-b"), other) == []
    unmarked = tmp_path / "written-before-markers"
    unmarked.mkdir()
    assert beside(moved, FOUND) == [first]  # a directory without a marker is not counted


def test_each_fact_has_a_digest_of_its_own() -> None:
    parts = part_digests(FOUND)
    assert list(parts) == sorted(FOUND) and all(len(digest) == 8 for digest in parts.values())
    moved = part_digests({**FOUND, "sources": "s1"})
    assert [name for name in parts if parts[name] != moved[name]] == ["sources"]
