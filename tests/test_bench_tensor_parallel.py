"""``tfd bench --tensor-parallel N`` on the CPU: two processes over gloo run the demo's workloads; rank 0
alone prints and writes, each run says its size, its step's sums timed alone and the roofline without
them, counted on one rank's share of the weights; sizes and flags that cannot run are refused by name."""

from __future__ import annotations

import json
import math
from pathlib import Path

from support import run_tfd

MODULE = "tfd.bench.tensor_parallel"


def ranks_running() -> list[str]:
    """Command lines of bench ranks still alive on this machine."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if MODULE in text:
            found.append(text)
    return found


def test_two_ranks_run_the_workloads_and_rank_0_writes_them(tmp_path: Path) -> None:
    alone, split = tmp_path / "alone", tmp_path / "split"
    done = run_tfd("bench", "--streams", "1,2", "--prompt", "40", "--new", "4", "--tensor-parallel", "2",
                   "--out", str(split), "--commit", "test", timeout=300, forked=True)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if " x" in line and "decode" in line]
    assert len(lines) == 2 and all("tensor parallel 2 (sums" in line for line in lines), done.stdout
    assert "rank 1" in done.stderr  # its log, its lines naming it; nothing of its own on stdout
    done = run_tfd("bench", "--streams", "1,2", "--prompt", "40", "--new", "4", "--tensor-parallel", "1",
                   "--out", str(alone), "--commit", "test", timeout=300, forked=True)
    assert done.returncode == 0, done.stderr
    for streams in (1, 2):
        one = json.loads(next(alone.glob(f"*-{streams}x40-4.json")).read_text())
        assert one["tensor_parallel"] == 1 and "reduce_ms" not in one
        run = json.loads(next(split.glob(f"*-{streams}x40-4.json")).read_text())
        assert run["tensor_parallel"] == 2 and run["decode_tok_s"] > 0 and run["reduce_ms"] > 0
        # the sums timed alone may take a step's time on a busy CPU: then no fraction without them (NaN)
        without = run["roofline_fraction_without_reduce"]
        assert run["roofline_fraction"] > 0 and (math.isnan(without) or without > run["roofline_fraction"])
        # a rank holds half of every split weight and all of the rest (embeddings, norms): between
        # half the whole and the whole
        assert one["weight_gib"] / 2 < run["weight_gib"] < one["weight_gib"]
        assert one["bytes_per_step"] / 2 < run["bytes_per_step"] < one["bytes_per_step"]
    assert ranks_running() == []


def test_sizes_and_flags_the_ranks_cannot_run_are_refused_by_name() -> None:
    done = run_tfd("bench", "--streams", "1", "--prompt", "8", "--new", "2", "--tensor-parallel", "4",
                   timeout=120, forked=True)
    assert done.returncode == 1
    assert "--tensor-parallel 4: the 2 key-value heads (num_key_value_heads) do not split into 4" \
        in done.stderr
    for flags, named in ((["--profile"], "--profile"), (["--compare-hf"], "--compare-hf")):
        done = run_tfd("bench", "--tensor-parallel", "2", *flags, timeout=60, forked=True)
        assert done.returncode == 2 and f"--tensor-parallel 2: not with {named} yet" in done.stderr
    done = run_tfd("bench", "--tensor-parallel", "2", "--serve", "http://127.0.0.1:9", timeout=60,
                   forked=True)
    assert done.returncode == 2 and "--tensor-parallel: not with --serve" in done.stderr
    assert ranks_running() == []
