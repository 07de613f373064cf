"""``tfd bench --serve URL --write-conversation FILE``, a restart, ``--resume-conversation FILE``: turn
two read back from the server's learned states beside other streams, through HTTP, against the demo
daemon on the CPU; the server that still holds the state in memory (no restart) said plainly; the
windows the others' gaps fall in; the flags it refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_bench_serve import tfd

from support import clean_environ, started_server
from tfd.bench.latency import Timeline
from tfd.bench.serve_conversation import READ_SECONDS, Conversation, gaps_per_token, metric
from tfd.bench.serve_record import Outcome, Planned

WAIT_S = 300  # a resume run against the demo on a slow busy machine: warm, others, turn two, two cold turns
PROMPT = 300  # turn one: kept at 256 (its last row rounded down to 64), read back by turn two
NEW = 6


def bench(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tfd", "bench", "--serve", url, *args], env=clean_environ(),
                          capture_output=True, text=True, timeout=WAIT_S)


def test_turn_two_read_back_after_a_restart_beside_other_streams(tmp_path: Path) -> None:
    learn = {"TF_LEARN_CONVERSATIONS": "1", "TF_LEARN_DIR": str(tmp_path / "learned")}
    file, out = tmp_path / "conversation.json", tmp_path / "out"
    with started_server(**learn) as first:
        done = bench(first.url(), "--write-conversation", str(file), "--prompt", str(PROMPT),
                     "--new", str(NEW))
        assert done.returncode == 0, done.stderr
        conversation = Conversation.load(file)
        assert len(conversation.prompt) == PROMPT and len(conversation.reply) == NEW
        assert f"turn two ({PROMPT + NEW + 64} tokens) written to {file}" in done.stdout
        # no restart: the state is still in memory and nothing is read back, which is not what is measured
        same = bench(first.url(), "--resume-conversation", str(file), "--concurrency", "3", "--no-drafts")
        assert same.returncode == 1
        assert "the server read no learned state back" in same.stderr
    with started_server(**learn) as second:  # a new process: its memory is empty, the disk holds the state
        done = bench(second.url(), "--resume-conversation", str(file), "--concurrency", "3", "--no-drafts",
                     "--out", str(out))
        assert done.returncode == 0, done.stderr
    (path,) = out.glob("*.json")
    assert path.name == f"tfd-demo-qwen3_5-serve-resume-c3-{PROMPT + NEW + 64}.json"
    found: dict[str, Any] = json.loads(path.read_text())
    assert found["problems"] == [] and found["tokens_equal"] is True
    assert found["cached_tokens"] == 256 and found["states_read"] == 1
    assert found["bytes_read"] > 0 and found["read_s"] > 0 and found["others"] == 2
    assert found["turn2_prompt_tokens"] == PROMPT + NEW + 64 and found["new_tokens"] == NEW
    assert min(found["new_tokens_cold_s"], found["ttft_s"], found["fresh_ttft_s"]) > 0
    assert found["ttft_over_read_and_new"] == pytest.approx(
        found["ttft_s"] / (found["read_s"] + found["new_tokens_cold_s"]))
    assert found["others_ms_per_token_before"] > 0 and found["others_ms_per_token_after"] > 0
    assert f"resume c3 {PROMPT + NEW + 64} tokens: cached 256" in done.stdout
    assert "tokens equal" in done.stdout


def test_a_file_that_is_not_a_conversation_is_named(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    wrong = tmp_path / "c.json"
    wrong.write_text('{"prompt": [1, 2]}')
    assert tfd("bench", "--serve", "http://127.0.0.1:1", "--resume-conversation", str(wrong),
               "--concurrency", "2") == 1
    assert f"{wrong}: not a conversation tfd bench --write-conversation wrote" in capsys.readouterr().err


def outcome(arrivals: list[float], counts: list[int]) -> Outcome:
    return Outcome(Planned(1, 1, b""), Timeline(0.0, arrivals, counts))


def test_a_gap_counts_in_the_window_its_later_chunk_came_in_a_tokens_share() -> None:
    others = [outcome([1.0, 2.0, 3.0, 5.0], [1, 1, 2, 1]), outcome([2.5, 3.5], [1, 4])]
    # (1, 3]: the chunks at 2.0 and 3.0 (its gap of 1 s carried 2 tokens), and 2.5 has none before it
    assert gaps_per_token(others, 1.0, 3.0) == [1.0, 0.5]
    # (3, 5]: 5.0 (2 s) and 3.5 (1 s over 4 tokens); a chunk at the start is the earlier window's
    assert gaps_per_token(others, 3.0, 5.0) == [2.0, 0.25]
    assert gaps_per_token(others, 5.0, 9.0) == []


def test_a_counter_is_read_by_its_whole_name() -> None:
    text = (f"# HELP x\n{READ_SECONDS[:-6]}_created 17.0\n{READ_SECONDS} 0.25\n"
            'tfd_learned_states_total{kind="read"} 3.0\n')
    assert metric(text, READ_SECONDS) == 0.25
    assert metric(text, 'tfd_learned_states_total{kind="read"}') == 3.0
    assert metric(text, 'tfd_learned_states_total{kind="written"}') == 0.0  # not moved yet


@pytest.mark.parametrize(("args", "said"), [
    (["--write-conversation", "f"], "--write-conversation: only with --serve URL"),
    (["--serve", "http://h:1", "--write-conversation", "f", "--resume-conversation", "f"], "one a call"),
    (["--serve", "http://h:1", "--resume-conversation", "f"], "needs one --concurrency C, C >= 2"),
    (["--serve", "http://h:1", "--resume-conversation", "f", "--concurrency", "1"], "C >= 2"),
    (["--serve", "http://h:1", "--resume-conversation", "f", "--concurrency", "2,4"], "one --concurrency"),
    (["--serve", "http://h:1", "--resume-conversation", "f", "--concurrency", "2", "--prompt", "8"],
     "--prompt: not with --resume-conversation"),
    (["--serve", "http://h:1", "--write-conversation", "f", "--rate", "2"],
     "--rate: not with a conversation"),
    (["--serve", "http://h:1", "--write-conversation", "f", "--concurrency", "2"], "--concurrency: not with"),
    (["--serve", "http://h:1", "--write-conversation", "f", "--prompt", "8:16"], "has one length"),
])
def test_conversation_flags_that_mean_nothing_together_are_refused(
        args: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert tfd("bench", *args) == 2
    assert said in capsys.readouterr().err

