"""Every setting with the Qwen3.5 demo: a start ends in READY and a chat, or a refusal by name.

The cases and how they are chosen: tests/server/start_cases.py; how a start is run and judged:
tests/server/starts.py. Flash Next's demo has its own file, so the two run in parallel.
"""

from __future__ import annotations

import re

import pytest
import torch
from start_cases import cases
from starts import Case, check, start

from tfd.env import Table

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="the start test is the CPU's: on a GPU each start compiles and plans")


@pytest.mark.parametrize("case", cases(Table.load(), "qwen3_5"), ids=lambda case: case.name)
def test_a_start_is_ready_or_refused_by_name(case: Case) -> None:
    check(case)


def test_a_refusal_planted_as_a_plain_exception_fails_the_start_by_the_cases_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tfd.pool.config import PoolConfig

    case = Case("qwen3_5", {"TF_KV_PAGES": "16"})
    check(case)  # refused by name: exit 2 naming TF_KV_PAGES

    def planted(*args: object) -> str:
        raise RuntimeError("planted: the refusal of a piece over a page, raised as a plain exception")

    monkeypatch.setattr(PoolConfig, "over_page", planted)
    with pytest.raises(AssertionError) as failed:
        check(case)
    assert str(failed.value).startswith("TF_DEMO=qwen3_5 TF_KV_PAGES=16: raised instead of exiting")
    assert "RuntimeError: planted" in str(failed.value)


def test_a_planted_refusal_naming_no_row_or_exiting_1_fails_the_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tfd.env import SettingsRefused
    from tfd.server import service

    case = Case("qwen3_5", {"TF_POOL_GIB": "16384"})
    check(case)  # refused by name: more than the host has

    def unnamed(*args: object) -> None:
        raise SettingsRefused(["the pool is too large"])

    monkeypatch.setattr(service, "check_host_pool", unnamed)
    with pytest.raises(AssertionError, match="TF_POOL_GIB=16384: exited 2 without naming a row the case"):
        check(case)

    def failing(*args: object) -> None:
        raise OSError("planted: the host's memory could not be read")

    monkeypatch.setattr(service, "check_host_pool", failing)
    with pytest.raises(AssertionError, match=r"TF_POOL_GIB=16384: exited 1 \(before READY\)"):
        check(case)


def test_learning_needs_a_prompt_cache_that_holds_the_identity_probes_state() -> None:
    refused = start(Case("qwen3_5", {"TF_LEARN_CONVERSATIONS": "1", "TF_PROMPT_CACHE_GIB": "0.000001"}))
    assert refused.status == 2, refused.stderr
    found = re.search(r"TF_PROMPT_CACHE_GIB=1e-06: the identity probe's kept state needs \S+ GiB; "
                      r"TF_LEARN_CONVERSATIONS=1 needs TF_PROMPT_CACHE_GIB=(\S+) or more", refused.stderr)
    assert found, refused.stderr
    assert "warm-up (" not in refused.stderr  # refused before the warm-up, which takes minutes on a GPU
    least = float(found.group(1))
    check(Case("qwen3_5", {"TF_LEARN_CONVERSATIONS": "1", "TF_PROMPT_CACHE_GIB": f"{least:g}"}))
    below = f"{least - 1e-4:g}"  # the refusal's least is rounded up to 0.0001 GiB
    under = start(Case("qwen3_5", {"TF_LEARN_CONVERSATIONS": "1", "TF_PROMPT_CACHE_GIB": below}))
    assert under.status == 2 and "the identity probe's kept state needs" in under.stderr, under.stderr


@pytest.mark.parametrize(("pool", "row", "said"), [
    ("0.005", "TF_CONTEXT", r"TF_CONTEXT=4096: one lane .* holds none; TF_CONTEXT=(\d+) is the most a lane"),
    ("0.05", "TF_PARALLEL", r"TF_PARALLEL=64: .*; TF_PARALLEL=(\d+) is the most"),
])
def test_the_most_a_refusal_names_starts_and_one_more_is_refused(pool: str, row: str, said: str) -> None:
    asked = {"TF_PARALLEL": "64"} if row == "TF_PARALLEL" else {}
    refused = start(Case("qwen3_5", {"TF_POOL_GIB": pool, **asked}))
    found = re.search(said, refused.stderr)
    assert refused.status == 2 and found, refused.stderr
    most = int(found.group(1))
    check(Case("qwen3_5", {"TF_POOL_GIB": pool, row: str(most)}))
    over = start(Case("qwen3_5", {"TF_POOL_GIB": pool, row: str(most + 1)}))
    assert over.status == 2 and f"{row}={most + 1}: " in over.stderr, over.stderr
