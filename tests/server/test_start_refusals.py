"""The refusals a start makes from the model and the settings together, on both sides of each line."""

from __future__ import annotations

import pytest
import torch

from tfd.env import SettingsRefused, Table
from tfd.server.start_refusals import refusing_oom
from tfd.store.identity import PROBE_TOKENS

TABLE = Table.load()


def test_learning_needs_a_context_that_holds_the_identity_probe_and_a_cache() -> None:
    # the table's rule (env/learn.toml's needs), refused as the environment is read
    TABLE.read({"TF_LEARN_CONVERSATIONS": "1", "TF_CONTEXT": str(PROBE_TOKENS + 1)})
    TABLE.read({"TF_CONTEXT": "16"})  # learning off: no probe
    TABLE.read({"TF_LEARN_CONVERSATIONS": "1", "TF_PROMPT_CACHE_GIB": "0.01"})
    with pytest.raises(SettingsRefused) as refused:
        TABLE.read({"TF_LEARN_CONVERSATIONS": "1", "TF_CONTEXT": str(PROBE_TOKENS),
                    "TF_PROMPT_CACHE_GIB": "0"})
    assert str(refused.value).splitlines()[1:] == [
        "  TF_LEARN_CONVERSATIONS=1 requires TF_PROMPT_CACHE_GIB above 0: learned states are the prompt "
        "cache's, written to disk",
        f"  TF_CONTEXT={PROBE_TOKENS}: TF_LEARN_CONVERSATIONS=1 needs TF_CONTEXT={PROBE_TOKENS + 1} or more "
        f"(the identity probe is a {PROBE_TOKENS}-token prompt and a token)"]


def test_the_tables_bound_on_the_context_is_the_probes_length() -> None:
    needs = {need.row: need for need in TABLE.by_name()["TF_LEARN_CONVERSATIONS"].needs}
    assert needs["TF_CONTEXT"].at_least == PROBE_TOKENS + 1
    assert f"a {PROBE_TOKENS}-token prompt" in needs["TF_CONTEXT"].why


def test_out_of_memory_on_either_device_is_a_refusal_and_other_errors_are_not() -> None:
    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")
    for error, said in ((torch.OutOfMemoryError("CUDA out of memory"), "the device ran out of memory"),
                        (cpu, "the host ran out of memory")):
        with pytest.raises(SettingsRefused, match=f"{said} allocating the pool: lower TF_POOL_GIB"), \
                refusing_oom("allocating the pool"):
            raise error
    with pytest.raises(RuntimeError, match="a bug"), refusing_oom("allocating the pool"):
        raise RuntimeError("a bug")  # not memory: the traceback it is
