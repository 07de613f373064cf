"""``tfd bench --serve URL``: the load generator against a real daemon (the demo model on the CPU) and
its arithmetic alone: percentiles, a stream's TTFT, TPOT and ITL, Poisson arrivals, the engine
comparison's ratios and gates, the SSE reader and the HTTP client's framings, the flags it refuses."""

from __future__ import annotations

import itertools
import json
import math
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from support import ServedDaemon, clean_environ, started_server
from tfd.bench import versus as gates
from tfd.bench.client import Events, Pool, Target
from tfd.bench.latency import Summary, Timeline, lengths, percentile, poisson_arrivals
from tfd.bench.serve import closed_loop, plan, send
from tfd.bench.serve_record import Load, Outcome, Planned, Server, Spec
from tfd.bench.versus import EngineRun, allowed_tok_s, versus
from tfd.cli import main
from tfd.shapes import Sizes

WAIT_S = 120  # a subprocess run of a few tiny requests against the demo, on a slow busy machine
# torch must stay out of a plain --serve run: the client works on a machine without it, and starts fast
NO_TORCH = ("import sys, atexit; atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules)); "
            "from tfd.cli import main; main(sys.argv[1:])")


@pytest.fixture(scope="module")
def server() -> Iterator[ServedDaemon]:
    with started_server() as daemon:
        yield daemon


def bench(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", NO_TORCH, "bench", "--serve", url, *args],
                          env=clean_environ(), capture_output=True, text=True, timeout=WAIT_S)


def runs(out: Path) -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(out.glob("*.json"))}


def test_concurrency_runs_write_what_each_request_saw(server: ServedDaemon, tmp_path: Path) -> None:
    done = bench(server.url(), "--prompt", "16", "--new", "4", "--concurrency", "1,2", "--requests", "4",
                 "--no-drafts", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "torch loaded: False" in done.stdout
    found = runs(tmp_path)
    assert set(found) == {f"tfd-demo-qwen3_5-serve-c{c}-n4x16-4-nodraft" for c in (1, 2)}
    for name, run in found.items():
        assert f"{name}: 4/4 ok" in done.stdout
        assert run["mode"] == "concurrency" and run["concurrency"] in (1, 2) and run["rate"] is None
        assert run["requests"] == run["completed"] == 4 and run["errors"] == {} and run["error_count"] == 0
        assert run["output_tokens_total"] == 4 * 4 and run["prompt_tokens_total"] == 4 * 16
        assert run["model"] == "tfd-demo-qwen3_5" and run["vocab"] == 4096 and run["url"] == server.url()
        assert run["draft"] is False and run["drafted"] == 0 and run["cache"] is False and run["warm"] is True
        assert run["ttft_ms"]["count"] == run["tpot_ms"]["count"] == 4
        assert run["itl_ms"]["count"] == 4 * 3  # serial decoding: a chunk a token
        for summary in ("ttft_ms", "tpot_ms", "itl_ms", "latency_ms"):
            stats = run[summary]
            assert 0 <= stats["min"] <= stats["p50"] <= stats["p90"] <= stats["p99"] <= stats["max"]
        assert run["output_tok_s"] == pytest.approx(16 / run["duration_s"])
        assert run["request_s"] == pytest.approx(4 / run["duration_s"])
        assert run["max_in_flight"] == run["concurrency"]
        assert run["tfd_version"] and run["commit"] and run["date"] and run["client_cpu"] > 0


def test_a_rate_run_drafts_and_counts_every_token(server: ServedDaemon, tmp_path: Path) -> None:
    done = bench(server.url(), "--prompt", "8:24", "--new", "6", "--rate", "50", "--requests", "5",
                 "--seed", "3", "--no-warm", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    (run,) = runs(tmp_path).values()
    assert run["mode"] == "rate" and run["rate"] == 50 and run["concurrency"] is None
    assert run["completed"] == 5 and run["output_tokens_total"] == 5 * 6 and run["prompt_tokens"] == [8, 24]
    assert 5 * 8 <= run["prompt_tokens_total"] <= 5 * 24
    assert run["draft"] is None and run["warm"] is False and run["seed"] == 3
    assert run["drafted"] > 0 and 0 <= run["accepted"] <= run["drafted"]  # the demo's head drafts by default
    assert run["itl_ms"]["count"] <= 5 * 5  # an accepted draft comes in its round's chunk
    assert 1 <= run["max_in_flight"] <= 5


def test_refused_requests_are_counted_by_kind(server: ServedDaemon, tmp_path: Path) -> None:
    done = bench(server.url(), "--prompt", "5000", "--new", "4", "--requests", "3", "--out", str(tmp_path))
    assert done.returncode == 1  # a request failed: the run still ends and is written
    assert "Traceback" not in done.stderr
    (run,) = runs(tmp_path).values()
    assert run["errors"] == {"http 400 context_length_exceeded": 3} and run["completed"] == 0
    assert "context" in run["error_examples"]["http 400 context_length_exceeded"]
    assert run["ttft_ms"]["count"] == 0 and run["ttft_ms"]["p50"] is None and run["output_tokens_total"] == 0
    assert run["warm_errors"] == 1


def test_a_server_that_wants_a_key_refuses_every_request(served: type[ServedDaemon], tmp_path: Path) -> None:
    daemon = served(TF_API_KEYS="sk-bench").start(timeout=120)
    done = bench(daemon.url(), "--prompt", "8", "--new", "2", "--requests", "2", "--no-warm",
                 "--out", str(tmp_path))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "GET /v1/models answered 401" in done.stderr and "vocabulary is unknown" in done.stderr
    (run,) = runs(tmp_path).values()
    (kind,) = run["errors"]
    assert kind.startswith("http 401") and run["errors"][kind] == 2 and run["model"] is None
    keyed = bench(daemon.url(), "--prompt", "8", "--new", "2", "--requests", "2", "--api-key", "sk-bench")
    assert keyed.returncode == 0 and ": 2/2 ok" in keyed.stdout


def test_no_server_is_said_plainly(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert tfd("bench", "--serve", f"http://127.0.0.1:{port}", "--requests", "1") == 1
    assert "no server answered at http://127.0.0.1:" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "said"), [
    (["--serve", "http://h:1", "--streams", "2"], "--streams: not with --serve"),
    (["--serve", "http://h:1", "--gemm"], "--gemm: not with --serve"),
    (["--concurrency", "2"], "--concurrency: only with --serve URL"),
    (["--prompt", "8:16"], "a range only with --serve URL"),
    (["--serve", "http://h:1", "--compare-engine"], "--compare-engine needs --shape NAME"),
    (["--serve", "http://h:1", "--no-drafts", "--drafts", "0"], "--no-drafts and --drafts: give one"),
    (["--serve", "h:1"], "a server is http://host:port"),
])
def test_flags_that_mean_nothing_together_are_refused(args: list[str], said: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert tfd("bench", *args) == 2
    assert said in capsys.readouterr().err


def tfd(*args: str) -> int:
    with pytest.raises(SystemExit) as ended:
        main(list(args))
    return int(ended.value.code or 0)


def test_the_text_prompts_are_the_held_out_files_tokenized_by_the_server(server: ServedDaemon) -> None:
    from tfd.bench.serve import held_out_prompts

    async def read() -> list[tuple[int, ...]]:
        pool = Pool(Target.parse(server.url()))
        try:
            return await held_out_prompts(pool, 64, seed=1, enough=2)
        finally:
            await pool.aclose()

    texts = trio.run(read)
    assert sum(len(ids) >= 64 for ids in texts) == 2 and all(0 <= t < 4096 for ids in texts for t in ids)
    somewhere = Server(Target.parse("http://h:1"), None, None, 4096)
    cut = plan(Load((64, 64), (4, 4)), Spec(3, concurrency=1), somewhere, "k", 3, texts)
    for planned in cut:
        ids = tuple(json.loads(planned.payload)["prompt"])
        assert len(ids) == 64 and any(ids == text[i:i + 64] for text in texts for i in range(len(text) - 63))


# --- the arithmetic ---


def test_percentiles_interpolate_between_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1 and percentile(values, 100) == 4
    assert percentile(values, 50) == 2.5 and percentile(values, 90) == pytest.approx(3.7)
    assert percentile([5.0], 99) == 5 and math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(values, 101)
    summary = Summary.of([0.004, 0.001, 0.003, 0.002])  # seconds in, milliseconds out
    assert (summary.count, summary.min, summary.max, summary.mean) == (4, 1, 4, pytest.approx(2.5))
    assert summary.p50 == pytest.approx(2.5) and summary.p99 == pytest.approx(3.97)
    assert Summary.of([]).as_json()["p50"] is None


def test_a_stream_gives_its_ttft_tpot_and_inter_token_gaps() -> None:
    timeline = Timeline(sent=10.0)
    timeline.add(10.05, 0)  # the opening chunk: no token
    timeline.add(10.1, 1)
    timeline.add(10.15, 2)  # a round with an accepted draft: two tokens in a chunk
    timeline.add(10.2, 1)
    assert timeline.tokens == 4 and timeline.ttft() == pytest.approx(0.1)
    assert timeline.tpot() == pytest.approx(0.1 / 3)  # three tokens after the first in 0.1 s
    assert timeline.itl() == pytest.approx([0.05, 0.05])
    one = Timeline(sent=0.0)
    one.add(0.5, 1)
    assert one.tpot() is None and one.itl() == [] and Timeline(sent=0.0).ttft() is None


def test_poisson_arrivals_are_the_seeds_alone() -> None:
    first = poisson_arrivals(4.0, 200, seed=7)
    assert first == poisson_arrivals(4.0, 200, seed=7) and first != poisson_arrivals(4.0, 200, seed=8)
    assert first[0] == 0 and all(b > a for a, b in itertools.pairwise(first))
    many = poisson_arrivals(4.0, 40_001, seed=1)
    assert many[-1] / 40_000 == pytest.approx(1 / 4.0, rel=0.03)  # mean gap 1/R
    with pytest.raises(ValueError):
        poisson_arrivals(0.0, 3, seed=1)


def test_lengths_and_prompts_are_drawn_within_their_ranges() -> None:
    import random

    assert lengths((5, 5), 3, random.Random(0)) == [5, 5, 5]
    drawn = lengths((2, 9), 500, random.Random(0))
    assert min(drawn) == 2 and max(drawn) == 9
    server = Server(Target.parse("http://h:1"), "m", 100, 50)
    load = Load((3, 6), (2, 2), seed=5)
    cut = plan(load, Spec(4, concurrency=2, draft=True, drafts=1), server, "a", 4, None)
    for planned in cut:
        body = json.loads(planned.payload)
        assert len(body["prompt"]) == planned.prompt_tokens and 3 <= planned.prompt_tokens <= 6
        assert all(0 <= t < 50 for t in body["prompt"]) and body["max_tokens"] == 2
        assert body["stream"] and body["ignore_eos"] and body["return_token_ids"] and body["draft"] is True
        assert body["stream_options"] == {"include_usage": True} and body["cache"] is False
        assert body["model"] == "m" and body["temperature"] == 0
    again = plan(load, Spec(4), server, "a", 4, None)
    assert [json.loads(p.payload)["prompt"] for p in again] == [json.loads(p.payload)["prompt"] for p in cut]
    assert "draft" not in json.loads(again[0].payload)  # the server's default


def run_of(concurrency: int, requests: int, tpot: tuple[float, float, float] = (10.0, 10.0, 10.0),
           ttft_max: float = 100.0, tok_s: float = 1000.0) -> dict[str, Any]:
    """A concurrency run's object with the fields the comparison reads (TPOT mean, p50, p99 in ms)."""
    return {"concurrency": concurrency, "requests": requests, "output_tok_s": tok_s,
            "prompt_tokens_total": requests * 1024, "output_tokens_total": requests * 256,
            "tpot_ms": {"mean": tpot[0], "p50": tpot[1], "p99": tpot[2]}, "ttft_ms": {"max": ttft_max}}


# a burst's streams wait for each other's prompt chunks: their TPOT (12 ms) is above the step's 10
ENGINE = EngineRun(streams=32, drafts=0, step_ms=10.0, token_ms=10.0, ttft_max_s=0.1, prefill_tok_s=20_000.0,
                   decode_tok_s=3_200.0, tpot_ms=12.0)


def test_the_work_model_adds_prefill_and_decode_time() -> None:
    # 128 prompts of 1024 at 20k tok/s (6.5536 s) then 32768 tokens at 3200 tok/s (10.24 s)
    assert allowed_tok_s(128 * 1024, 128 * 256, 20_000.0, 3_200.0) == pytest.approx(32768 / 16.7936)
    assert EngineRun.of({"streams": 2, "drafts": 1, "step_ms": 4.0, "decode_tok_s_per_stream": 400.0,
                         "time_to_first_token_s": {"max": 0.5}, "prefill_tok_s": 9.0,
                         "decode_tok_s": 800.0}).token_ms == pytest.approx(2.5)  # drafts: less than a step
    measured = EngineRun.of({"streams": 2, "step_ms": 4.0, "decode_tok_s_per_stream": 250.0,
                             "time_to_first_token_s": {"max": 0.5}, "prefill_tok_s": 9.0,
                             "decode_tok_s": 500.0, "time_per_output_token_ms": {"mean": 4.5, "max": 5.0}})
    assert (measured.token_ms, measured.tpot_ms) == (pytest.approx(4.0), 4.5)


@pytest.mark.parametrize("held", [True, False])
def test_each_gate_holds_on_one_side_of_its_threshold(held: bool) -> None:
    edge = 0.999 if held else 1.001
    one = versus(run_of(1, 4, tpot=(10 * gates.TPOT_ONE * edge, 10.0, 10.0)), ENGINE)
    assert one.gates == {"tpot": held, "throughput": one.throughput_ratio >= gates.THROUGHPUT,
                         "tpot_tail": True}
    tpot, ttft = gates.TPOT_BURST * edge, gates.TTFT_BURST * edge
    burst = versus(run_of(32, 32, tpot=(10 * tpot, 10.0, 10.0), ttft_max=100 * ttft), ENGINE)
    assert burst.gates == {"tpot": held, "ttft_max": held}  # all at once: no throughput or tail gate
    assert burst.tpot_ratio == pytest.approx(tpot) and burst.ttft_ratio == pytest.approx(ttft)
    assert burst.burst_tpot_ratio == pytest.approx(tpot / 1.2)  # over the engine's TPOT: printed beside
    allowed = allowed_tok_s(128 * 1024, 128 * 256, ENGINE.prefill_tok_s, ENGINE.decode_tok_s)
    share = gates.THROUGHPUT / edge
    tail = (10.0, 10.0, 10 * gates.TAIL * edge)
    replaced = versus(run_of(32, 128, tpot=tail, tok_s=allowed * share), ENGINE)
    assert replaced.gates == {"throughput": held, "tpot_tail": held}  # replaced: no TPOT or TTFT gate
    assert replaced.allowed_tok_s == pytest.approx(allowed)
    assert replaced.throughput_ratio == pytest.approx(share)


# --- the wire ---


def test_events_are_read_across_any_cut_of_the_stream() -> None:
    stream = (b'data: {"a": 1}\n\n: a comment\r\nevent: x\r\ndata: {"b":\r\ndata: 2}\r\n\r\n'
              b'data: [DONE]\n\n')
    for cut in range(1, len(stream)):
        seen: list[tuple[bytes, float]] = []
        events = Events(lambda data, at, seen=seen: seen.append((data, at)))
        events.feed(stream[:cut], 1.0)
        events.feed(stream[cut:], 2.0)
        assert [data for data, _ in seen] == [b'{"a": 1}', b'{"b":\n2}', b"[DONE]"]
    whole: list[bytes] = []
    Events(lambda data, at: whole.append(data)).feed(b'data: {"c": 3}\n\n', 0.0)  # one event a piece
    assert whole == [b'{"c": 3}']


def test_token_chunks_are_counted_without_parsing_and_the_rest_parsed() -> None:
    outcome = Outcome(Planned(1, 3, b""), Timeline(sent=0.0))
    tricky = json.dumps({"choices": [{"text": 'x "token_ids": [1, 2, 3] "usage"', "token_ids": [7, 8]}]})
    outcome.on_event(json.dumps({"choices": [{"text": ""}], "prompt_token_ids": [1, 2]}).encode(), 0.1)
    outcome.on_event(tricky.encode(), 0.2)
    outcome.on_event(json.dumps({"choices": [{"text": "a", "token_ids": [9]}]}).encode(), 0.3)
    outcome.on_event(json.dumps({"choices": [{"text": "", "finish_reason": "length"}],
                                 "tfd": {"drafted": 2, "accepted": 1}}).encode(), 0.4)  # the last chunk
    outcome.on_event(json.dumps({"choices": [], "usage": {"completion_tokens": 3}}).encode(), 0.4)
    outcome.on_event(b"[DONE]", 0.4)
    assert outcome.timeline.counts == [2, 1] and outcome.timeline.arrivals == [0.2, 0.3]
    assert outcome.output_tokens == 3 and (outcome.drafted, outcome.accepted) == (2, 1) and outcome.done
    assert outcome.error is None
    outcome.on_event(b'{"error": {"code": "server_error", "message": "boom"}}', 0.5)
    outcome.on_event(b"not json", 0.6)
    assert (outcome.error, outcome.detail) == ("stream server_error", "boom")  # the first names it


async def test_the_client_reads_every_framing_and_sends_again_on_a_closed_kept_connection(
        nursery: trio.Nursery) -> None:
    replies = [b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
               b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
               b"3;x=1\r\nabc\r\n2\r\nde\r\n0\r\nT: 1\r\n\r\n",
               b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\nno",
               b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nto the end"]
    served: list[int] = []

    async def handle(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(4096)
        served.append(len(served))
        await stream.send_all(replies[len(served) - 1])
        await stream.aclose()  # closed after one answer, though HTTP/1.1 would keep it: the next send fails

    listeners = await nursery.start(trio.serve_tcp, handle, 0)
    port = listeners[0].socket.getsockname()[1]
    pool = Pool(Target.parse(f"http://127.0.0.1:{port}"))
    assert (await pool.exchange("GET", "/a")).body == b"hello"
    pieces: list[bytes] = []
    answer = await pool.exchange("POST", "/b", b"{}", lambda piece, at: pieces.append(piece))
    assert answer.status == 200 and b"".join(pieces) == b"abcde" and answer.body == b""
    refused = await pool.exchange("POST", "/c", b"{}", lambda piece, at: pieces.append(piece))
    assert (refused.status, refused.body) == (404, b"no")  # an error's body comes whole, not to the sink
    assert (await pool.exchange("GET", "/d")).body == b"to the end"
    assert pool.opened == 4 and not pool.idle  # each kept connection found closed, sent again on a new one
    await pool.aclose()


async def test_a_request_past_its_time_is_a_timeout(nursery: trio.Nursery) -> None:
    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    listeners = await nursery.start(trio.serve_tcp, silent, 0)
    pool = Pool(Target.parse(f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"))
    outcomes = await closed_loop(pool, [Planned(1, 1, b"{}")] * 2, 2, 0.2)
    assert [o.error for o in outcomes] == ["timeout", "timeout"] and not pool.idle
    outcome = await send(pool, Planned(1, 1, b"{}"), 0.1)
    assert outcome.error == "timeout" and outcome.ended - outcome.timeline.sent >= 0.1


def test_compare_engine_pairs_each_run_with_the_engine_at_its_concurrency(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    import torch

    from tfd.bench import main as engine_bench
    from tfd.bench.versus import compare

    asked: list[Any] = []

    def bench(model: Any, name: str, size: Sizes, workloads: list[Any], graphs: bool, commit: str
              ) -> list[Any]:
        asked.extend(workloads)
        return [{"shape": name, "streams": w.streams, "prompt_tokens": w.prompt_tokens,
                 "new_tokens": w.new_tokens, "drafts": 0, "step_ms": 10.0, "decode_tok_s_per_stream": 100.0,
                 "decode_tok_s": 100.0 * w.streams, "time_to_first_token_s": {"max": 0.1},
                 "prefill_tok_s": 20_000.0, "time_per_output_token_ms": {"mean": 10.0, "max": 11.0}}
                for w in workloads]

    class Drawn:
        name, sizes = "qwen3_5-9b", Sizes(1, 1, 0)

    monkeypatch.setattr(engine_bench, "random_model", lambda shape, device, head, fp8: (None, Drawn()))
    monkeypatch.setattr(engine_bench, "bench", bench)
    extra = {"mode": "concurrency", "rate": None, "model": "m", "prompt_tokens": [1024, 1024],
             "new_tokens": [256, 256], "draft": None, "drafts": 0, "drafted": 0, "temperature": 0.0}
    runs = [{**run_of(32, 32, tpot=(10.5, 10.0, 11.0), ttft_max=110.0), **extra},
            {**run_of(32, 128), **extra}, {**run_of(1, 8), **extra}]
    args = argparse.Namespace(step_tokens=8192, confidence=0.7, no_graphs=False)
    assert compare(runs, "qwen3_5-9b", args, 0, tmp_path, "abc") == 0
    assert sorted((w.streams, w.prompt_tokens, w.new_tokens, w.temperature) for w in asked) == [
        (1, 1024, 256, 0.0), (32, 1024, 256, 0.0)]  # one engine run a concurrency, at the runs' shape
    table = capsys.readouterr().out
    assert "m-serve-c32-n32x1024-256" in table and "1.050 ok" in table and "1.100 ok" in table
    assert runs[0]["engine"]["gates"] == {"tpot": True, "ttft_max": True}
    assert runs[0]["engine"]["run"] == "qwen3_5-9b-32x1024-256" and runs[2]["engine"]["streams"] == 1
    written = json.loads((tmp_path / "m-serve-c32-n128x1024-256.json").read_text())
    assert set(written["engine"]["gates"]) == {"throughput", "tpot_tail"}
    assert (tmp_path / "qwen3_5-9b-32x1024-256.json").exists()  # the engine's runs beside the server's

    def out_of_memory(shape: str, device: Any, head: bool, fp8: bool) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(engine_bench, "random_model", out_of_memory)
    assert compare(runs, "qwen3_5-9b", args, 0, None, "abc") == 1
    said = capsys.readouterr().err
    assert "ran out of device memory" in said and "TF_CUDA_MEMORY_LIMIT_GB" in said
