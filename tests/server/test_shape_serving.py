"""`tfd serve --shape` on a GPU: the pool sized from the device, random weights said loudly.

These start the 9B shape on the device (about 18 GiB of random weights drawn there); skipped without
CUDA. The pool's arithmetic is tested on the CPU (tests/pool/test_device_plan.py).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from support import ServedDaemon

pytestmark = pytest.mark.gpu
GIB = 1 << 30
START_S = 900  # drawing 18 GiB, measuring a step, capturing graphs, and a full warm-up from cold


def device(daemon: ServedDaemon) -> dict[str, Any]:
    report = daemon.admin_call("pool")["pool"]["report"]  # type: ignore[index]
    assert isinstance(report, dict)
    return report


def left(plan: dict[str, int]) -> int:
    """What a plan leaves the pool: the planned bytes less the rest, and no more than was free."""
    still = plan["activation_bytes"] + plan["graph_bytes"] + plan["reserve_bytes"]
    return min(plan["planned_bytes"] - plan["weight_bytes"] - plan["runtime_bytes"] - still,
               plan["free_before_pool_bytes"] - still)


def test_the_9b_shape_fills_the_device_and_says_its_weights_are_random(served: type[ServedDaemon]) -> None:
    daemon = served(TF_SHAPE="qwen3_5-9b").start(timeout=START_S)
    report = device(daemon)
    plan = report["device"]
    assert plan["weight_bytes"] > 16 * GIB and plan["activation_bytes"] > 0 and plan["graph_bytes"] > 0
    assert report["pool_bytes"] <= plan["pool_bytes"] == left(plan)
    assert report["lanes_that_fit"] >= 64 and report["window"] == 4096
    assert plan["free_after_warm_up_bytes"] > 0
    models = httpx.get(daemon.url() + "/v1/models", timeout=30).json()["data"]
    assert models[0]["id"] == "qwen3_5-9b-random" and models[0]["random_weights"] is True
    assert "RANDOM" in daemon.log()
    reply = httpx.post(daemon.url() + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 8
    daemon.close()
    limited = served(TF_SHAPE="qwen3_5-9b", TF_CUDA_MEMORY_LIMIT_GB="40").start(timeout=START_S)
    capped = device(limited)["device"]
    assert capped["planned_bytes"] == 40 * GIB and capped["pool_bytes"] == left(capped)
    assert capped["pool_bytes"] < plan["pool_bytes"] / 3
