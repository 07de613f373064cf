"""Serving a model: what fits at start, READY after the warm-up, admin lanes and cancel, metrics."""

from __future__ import annotations

import json
import re
import signal
import tempfile
from pathlib import Path

import httpx
import pytest
import tiny_models

from support import CACHE, clean_environ, run_tfd, started_server, tiny_server


def served_model() -> Path:
    return tiny_models.save_served("qwen3_5", CACHE / "tiny")


@pytest.mark.parametrize("demo, row", [("qwen3_5", "TF_KV_PAGES"), ("flashnext", "TF_FLASHNEXT_KV_PAGES")])
def test_a_page_too_small_for_a_piece_is_refused_naming_the_least_value_that_holds_it(demo: str, row: str
                                                                                      ) -> None:
    env = clean_environ(TF_DEMO=demo, TF_PORT="0", TF_ADMIN_SOCKET=tempfile.mktemp(dir="/tmp"), **{row: "16"})
    done = run_tfd("serve", env=env, timeout=120, forked=True)
    assert done.returncode == 2, done.stderr  # a configuration refusal, not a crash
    assert "Traceback" not in done.stderr
    found = re.search(rf"{row}=16: the piece \S+ needs \d+ bytes, more than a page of \d+ bytes \(16 rows\); "
                      rf"{row}=(\d+) is the least that holds it", done.stderr)
    assert found, done.stderr
    assert int(found.group(1)) % 16 == 0 and int(found.group(1)) > 16  # a value the row accepts
    if demo == "qwen3_5":  # the demo's spare state is 65,536 bytes: 32 rows hold it, and serve
        assert found.group(1) == "32"
        del env[row]
        # the command line
        flagged = run_tfd("serve", "--kv-pages", "16", env=env, timeout=120, forked=True)
        assert flagged.returncode == 2 and "TF_KV_PAGES=32 is the least that holds it" in flagged.stderr
        with started_server(TF_KV_PAGES="32") as daemon:
            reply = httpx.post(daemon.url() + "/v1/completions", json={"prompt": "def", "max_tokens": 2},
                               timeout=60)
            assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2


def test_a_parallel_or_context_that_does_not_fit_is_refused_naming_what_fits() -> None:
    env = clean_environ(TF_MODEL=str(served_model()), TF_POOL_GIB="0.01", TF_PORT="0",
                        TF_ADMIN_SOCKET=tempfile.mktemp(dir="/tmp"))
    done = run_tfd("serve", env={**env, "TF_PARALLEL": "4000"}, timeout=120, forked=True)
    assert done.returncode == 2, done.stderr
    found = re.search(r"TF_PARALLEL=4000: (\d+) lanes of 4096 tokens fit the pool's 0.01 GiB "
                      r"\(TF_POOL_GIB=0.01\); TF_PARALLEL=(\d+) is the most", done.stderr)
    assert found and found.group(1) == found.group(2), done.stderr
    done = run_tfd("serve", env={**env, "TF_CONTEXT": "4000000"}, timeout=120, forked=True)
    assert done.returncode == 2, done.stderr
    assert ("TF_CONTEXT=4000000: past the model's 4096 positions (max_position_embeddings in its "
            "config.json); TF_CONTEXT=4096 is the most") in done.stderr  # both problems, each on its line
    assert "TF_CONTEXT=4000000: one lane of 4000000 tokens needs" in done.stderr
    assert re.search(r"the pool's 0.01 GiB \(TF_POOL_GIB=0.01\) holds none; TF_CONTEXT=\d+ is the most a "
                     r"lane", done.stderr)
    del env["TF_POOL_GIB"]  # the CPU's default pool, named as such
    done = run_tfd("serve", env={**env, "TF_CONTEXT": "4000000"}, timeout=120, forked=True)
    assert done.returncode == 2, done.stderr
    assert "the pool's 0.25 GiB (TF_POOL_GIB's CPU default 0.25) holds none" in done.stderr


def test_ready_comes_after_loading_and_a_warm_up(tmp_path: Path) -> None:
    with tiny_server() as daemon:
        fields = [field for _, field in daemon.messages]
        steps = ("STATUS=starting", "STATUS=loading the model", "STATUS=building the engine",
                 "STATUS=warming up", "READY=1")
        order = [next(i for i, f in enumerate(fields) if f.startswith(step)) for step in steps]
        assert order == sorted(order)
        assert "warm-up (short): 1 requests in " in daemon.log()
        health = daemon.get("/health").json()
        assert health["state"] == "ready" and health["model"] == "qwen3_5-served"


def test_admin_lanes_and_cancel(tmp_path: Path) -> None:
    with tiny_server() as daemon:
        body = {"prompt": "def f(x):", "max_tokens": 3000, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", daemon.url() + "/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            listed = daemon.admin_call("lanes")["lanes"]["lanes"]  # type: ignore[index]
            assert len(listed) == 1 and listed[0]["phase"] == "decode"
            request = listed[0]["request"]
            assert daemon.admin_call_args("cancel", [request]) == {"ok": True, "cancel": {"request": request}}
            events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert events[-1]["choices"][0]["finish_reason"] == "cancelled"
        missing = daemon.admin_call_args("cancel", ["nope"])
        assert missing["ok"] is False and missing["error"]["code"] == "not_found"  # type: ignore[index]


def test_metrics_count_tokens_steps_and_pages(tmp_path: Path) -> None:
    with tiny_server() as daemon:
        body = {"prompt": "abc", "max_tokens": 5, "ignore_eos": True}
        httpx.post(daemon.url() + "/v1/completions", json=body, timeout=60)
        text = daemon.get("/metrics").text
        assert re.search(r'^tfd_tokens_total\{kind="generated"\} 5\.0$', text, re.M)
        assert re.search(r'^tfd_requests_finished_total\{reason="length"\} 1\.0$', text, re.M)
        assert re.search(r"^tfd_time_to_first_token_seconds_count 1\.0$", text, re.M)
        steps = float(re.search(r"^tfd_step_seconds_count (\S+)$", text, re.M)[1])  # type: ignore[index]
        assert steps >= 5  # the warm-up's and this request's
        free = float(re.search(r'^tfd_pool_pages\{state="free"\} (\S+)$', text, re.M)[1])  # type: ignore[index]
        held = float(re.search(r'^tfd_pool_pages\{state="held"\} (\S+)$', text, re.M)[1])  # type: ignore[index]
        assert held == 0 and free > 0
        assert re.search(r'^tfd_lanes\{state="running"\} 0\.0$', text, re.M)


def test_sigterm_drains_a_running_request_to_its_end(tmp_path: Path) -> None:
    with tiny_server() as daemon:
        body = {"prompt": "def f(x):", "max_tokens": 40, "stream": True, "ignore_eos": True, "temperature": 0,
                "stream_options": {"include_usage": True}}
        with httpx.stream("POST", daemon.url() + "/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            daemon.signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["usage"]["completion_tokens"] == 40  # finished, not cut
        url = daemon.url()
        assert daemon.wait() == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health")
