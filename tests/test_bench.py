"""`tfd bench`: shapes cut to fit, the traffic a step must move, and runs written as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import attrs
import pytest
import tiny_models
import torch

from support import CACHE, clean_environ, run_tfd
from tfd.bench import roofline
from tfd.bench.profile import by_grid
from tfd.bench.workload import Workload
from tfd.families.config import read_config
from tfd.families.hybrid import expected_tensors
from tfd.shapes import PRESETS, fit, sizes, weight_bytes

REQUIRED = ("shape", "streams", "prompt_tokens", "new_tokens", "decode_tok_s", "prefill_tok_s",
            "roofline_fraction", "matmul_fraction", "copy_gbps", "gpu", "commit")


def test_a_shape_too_big_loses_whole_layer_groups_and_says_so() -> None:
    whole = fit("qwen3_next-80b-a3b", 10**15)
    assert whole.cut is None and whole.config["num_hidden_layers"] == 48
    cut = fit("qwen3_next-80b-a3b", 100 * 2**30)
    assert cut.config["num_hidden_layers"] == 32 and len(cut.config["layer_types"]) == 32
    assert cut.weight_bytes <= 100 * 2**30 and cut.cut is not None and "32 of 48 layers" in cut.cut
    with pytest.raises(ValueError, match="no shape"):
        fit("llama", 2**40)


def test_the_9b_preset_is_nine_billion_parameters() -> None:
    family, config = PRESETS["qwen3_5-9b"]
    assert 8.5e9 < weight_bytes(family, config) / 2 < 9.5e9


def test_a_decode_step_moves_weights_rows_and_states() -> None:
    family, config = PRESETS["qwen3_5-9b"]
    cfg = read_config(family, config)
    weights = sizes(family, config)
    one = roofline.decode_bytes(cfg, weights, lanes=1, context=0)
    embed = cfg.vocab * cfg.hidden * 2
    state = 24 * 32 * 128 * 128 * 4  # 24 GDN layers' fp32 states, read and written
    assert one == pytest.approx(weights.bytes - embed + cfg.hidden * 2 + 2 * state, rel=1e-3)
    rows = roofline.decode_bytes(cfg, weights, lanes=1, context=1000) - one
    assert rows == 8 * 2 * cfg.kv_heads * cfg.head_dim * 2 * 1000  # 8 attention layers' K and V


def test_flash_nexts_ngram_table_is_a_lookup_in_both_rooflines() -> None:
    # a token reads a row a head of its bigram and trigram heads (8 each) of 160 values: 5,120 bytes
    family, config = PRESETS["qwen3_8-flash-next"]
    cfg = read_config(family, config)
    weights = sizes(family, config)
    table = next(shape for name, shape in expected_tensors(family, config, set())[2].items()
                 if name.endswith("ngram_embedding.weight"))
    assert weights.table_params == table[0] * table[1] and weights.table_bytes == 2 * weights.table_params
    assert weights.table_token_bytes == 2 * 8 * table[1] * 2
    multiplied = attrs.evolve(weights, table_bytes=0, table_params=0, table_token_bytes=0)  # the old count
    for lanes in (1, 32):
        skipped = (roofline.decode_bytes(cfg, multiplied, lanes, 0)
                   - roofline.decode_bytes(cfg, weights, lanes, 0))
        assert skipped == weights.table_bytes - lanes * weights.table_token_bytes
    counted = roofline.prefill_flops(cfg, multiplied, 1024) - roofline.prefill_flops(cfg, weights, 1024)
    assert counted == 2 * weights.table_params * 1024
    assert weights.table_bytes == pytest.approx(102.4e9, rel=1e-3)  # the reference's 102.4 GB in bf16
    plain = sizes(*PRESETS["qwen3_5-35b-a3b"])
    assert plain.table_bytes == plain.table_params == plain.table_token_bytes == 0


def test_a_tied_embedding_is_read_whole_as_the_head() -> None:
    family, config = PRESETS["qwen3_5-9b"]
    untied, tied = read_config(family, config), read_config(family, {**config, "tie_word_embeddings": True})
    apart, shared = sizes(family, config), sizes(family, {**config, "tie_word_embeddings": True})
    embed = untied.vocab * untied.hidden * 2
    assert apart.bytes - shared.bytes == embed  # no lm_head tensor
    # untied: the head read and the embedding's one row; tied: the same tensor read whole as the head
    assert roofline.decode_bytes(untied, apart, 1, 0) == roofline.decode_bytes(tied, shared, 1, 0)


def test_experts_no_row_chose_are_not_counted() -> None:
    family, config = PRESETS["qwen3_5-35b-a3b"]
    cfg = read_config(family, config)
    weights = sizes(family, config)
    assert roofline.decode_bytes(cfg, weights, 1, 0) < 0.2 * weights.bytes
    assert roofline.expected_experts(256, 8, 1) == pytest.approx(8)
    assert roofline.expected_experts(256, 8, 10**4) == pytest.approx(256)


def test_fp8_weights_are_counted_as_the_releases_hold_them() -> None:
    # a byte a weight and a float32 scale a 128x128 block, but for what the releases keep in bf16
    family, config = PRESETS["qwen3_next-80b-a3b"]
    bf16, fp8 = sizes(family, config), sizes(family, config, fp8=True)
    assert fp8.params == bf16.params
    kept = 2 * 2 * 151936 * 2048  # the embedding and head stay bf16; routers, norms, scales: a little more
    assert 0 < fp8.bytes - (bf16.bytes + kept) / 2 < 0.003 * bf16.bytes
    assert fp8.expert_bytes == 3 * 512 * 2048 + 4 * 3 * 4 * 16 and bf16.expert_bytes == 2 * 3 * 512 * 2048
    cfg = read_config(family, config)
    saved = roofline.decode_bytes(cfg, bf16, 1, 0) - roofline.decode_bytes(cfg, fp8, 1, 0)
    # 44% of a one-stream step's bytes: the head, the states and the active experts' scales stay
    assert 0.4 * roofline.decode_bytes(cfg, bf16, 1, 0) < saved < 0.5 * roofline.decode_bytes(cfg, bf16, 1, 0)
    # all 48 layers fit 70% of an H200 in FP8; in bf16 they do not
    h200 = int(0.7 * 140 * 2**30)
    assert fit("qwen3_next-80b-a3b", h200, fp8=True).cut is None
    assert fit("qwen3_next-80b-a3b", h200).cut is not None


def test_bench_runs_the_demo_and_writes_each_run(tmp_path: Path) -> None:
    done = run_tfd("bench", "--streams", "1,2", "--prompt", "40", "--new", "4", "--out", str(tmp_path),
                   "--commit", "test", timeout=240, forked=True)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if " x" in line and "decode" in line]
    assert len(lines) == 2, done.stdout
    for streams in (1, 2):
        run = json.loads(next(tmp_path.glob(f"*-{streams}x40-4.json")).read_text())
        assert all(key in run for key in REQUIRED)
        assert run["streams"] == streams and run["commit"] == "test" and run["gpu"] == "cpu"
        assert run["decode_tok_s"] > 0 and run["prefill_tok_s"] > 0 and 0 < run["roofline_fraction"] < 1
        assert 0 < run["time_per_output_token_ms"]["mean"] <= run["time_per_output_token_ms"]["max"]


def test_bench_runs_streams_under_a_json_grammar_beside_plain_ones(tmp_path: Path) -> None:
    done = run_tfd("bench", "--streams", "2", "--prompt", "40", "--new", "12", "--grammar", "none,json",
                   "--out", str(tmp_path), "--commit", "test", timeout=240, forked=True)
    assert done.returncode == 0, done.stderr
    plain = json.loads((tmp_path / next(p.name for p in tmp_path.glob("*-2x40-12.json"))).read_text())
    ruled = json.loads(next(tmp_path.glob("*-2x40-12-json.json")).read_text())
    assert (plain["grammar"], ruled["grammar"]) == ("none", "json") and ruled["decode_steps"] > 0
    assert "grammar json" in done.stdout
    refused = run_tfd("bench", "--grammar", "xml", timeout=60, forked=True)
    assert refused.returncode == 2 and "a grammar is none or json" in refused.stderr


def test_a_streams_time_a_token_runs_from_its_first_token_to_its_last() -> None:
    from tfd.bench.main import tpot_of
    from tfd.bench.workload import Timings, Workload

    timings = Timings(tokens=((1,) * 4, (1,) * 4), prefill_s=0.3, first_token_s=(0.1, 0.3), decode_steps=3,
                      decode_s=0.3, decode_tokens=6, graphs=False, peak_bytes=0, last_token_s=(0.4, 0.9))
    assert tpot_of(Workload(2, 40, 4), timings) == {"mean": pytest.approx(150.0), "max": pytest.approx(200.0)}
    assert tpot_of(Workload(2, 40, 1), timings) is None  # one token a stream: no time between tokens


def test_bench_times_a_second_turn_read_back_from_disk(tmp_path: Path) -> None:
    done = run_tfd("bench", "--conversation", "--prompt", "200", "--new", "4", "--out", str(tmp_path),
                   "--commit", "test", timeout=240, forked=True)
    assert done.returncode == 0, done.stderr
    found = json.loads(next(tmp_path.glob("*-conversation.json")).read_text())
    assert found["commit"] == "test" and found["tokens_equal"] is True
    assert found["turn2_prompt_tokens"] == 200 + 4 + 64 and found["cached_tokens"] == 192
    assert found["bytes_written"] >= found["bytes_read"] > 0 and found["ttft_from_disk_s"] > 0
    assert found["host_read_bytes"] >= found["bytes_read"] and found["host_read_gbps"] > 0
    assert "192 read back" in done.stdout and "the host alone reads the files in" in done.stdout


def test_bench_times_a_second_turn_read_back_beside_other_streams(tmp_path: Path) -> None:
    done = run_tfd("bench", "--conversation", "--streams", "3", "--prompt", "200", "--new", "4", "--out",
                   str(tmp_path), "--commit", "test", timeout=240, forked=True)
    assert done.returncode == 0, done.stderr
    runs = json.loads(next(tmp_path.glob("*-read-beside.json")).read_text())
    assert [run["page_cache"] for run in runs] == [False, True]
    for run in runs:
        assert run["streams"] == 3 and run["tokens_equal"] is True and run["cached_tokens"] == 192
        assert run["bytes_read"] > 0 and run["ttft_s"] > 0 and run["others_gap_before_ms"] > 0
        assert run["steps_during"] >= 0 and run["new_tokens_cold_s"] > 0
    assert "192 read back from disk) beside 2 streams" in done.stdout
    assert "192 read back from the page cache) beside 2 streams" in done.stdout


def test_bench_drafts_and_reports_the_rounds(tmp_path: Path) -> None:
    done = run_tfd("bench", "--prompt", "40", "--new", "12", "--drafts", "0,3", "--temperature", "0",
                   "--rounds", "2", "--out", str(tmp_path), "--commit", "test", timeout=240, forked=True)
    assert done.returncode == 0, done.stderr
    plain = json.loads(next(tmp_path.glob("*-1x40-12.json")).read_text())
    drafted = json.loads(next(tmp_path.glob("*-1x40-12-d3.json")).read_text())
    # the second round runs both workloads again, after the first round's two, on other prompts
    again = json.loads(next(tmp_path.glob("*-1x40-12-d3-r1.json")).read_text())
    assert (plain["round"], drafted["round"], again["round"]) == (0, 0, 1)
    read = json.loads(next(tmp_path.glob("*-summary.json")).read_text())
    summaries = {entry["run"]: entry for entry in read}
    pooled = summaries[f"{drafted['shape']}-1x40-12-d3"]
    assert pooled["runs"] == 2 and "acceptance" not in summaries[f"{drafted['shape']}-1x40-12"]
    both = (drafted["accepted"] + again["accepted"], drafted["drafted"] + again["drafted"])
    assert pooled["acceptance"] == both[0] / both[1]
    assert pooled["decode_tok_s_min"] <= pooled["decode_tok_s_median"] <= pooled["decode_tok_s_max"]
    assert plain["drafts"] == 0 and "rounds" not in plain and plain["temperature"] == 0
    assert drafted["drafts"] == 3 and drafted["confidence"] == 0.7 and 0 < drafted["rounds"] <= 11
    assert 0 <= drafted["accepted"] <= drafted["drafted"] and drafted["decode_tok_s"] > 0
    assert drafted["tokens_per_round"] == (drafted["rounds"] + drafted["accepted"]) / drafted["rounds"]
    assert "drafts: acceptance" in done.stdout


def test_the_flash_next_preset_is_the_released_size_and_cuts_its_table_to_fit() -> None:
    family, config = PRESETS["qwen3_8-flash-next"]
    assert 176e9 < weight_bytes(family, config) / 2 < 178e9  # 125.7 B text + 51.2 B n-gram table
    cut = fit("qwen3_8-flash-next", 97 * 2**30)
    assert cut.config["ngram_vocab_size_base"] == 20_000_000 // 64 and cut.weight_bytes <= 97 * 2**30
    assert cut.cut is not None and "n-gram table 20,000,000 -> 312,500" in cut.cut and "16 of 48" in cut.cut


def test_bench_runs_a_flash_next_checkpoint(tmp_path: Path) -> None:
    model = tiny_models.save_served("qwen4_exp", CACHE / "tiny")
    # Decode runs a step ahead: on the CPU a step computes inside the run before, so the last timed
    # step holds no work; at 3 new tokens that was every timed step (a fraction past 1).
    done = run_tfd("bench", "--streams", "1,2", "--prompt", "20", "--new", "8", "--out", str(tmp_path),
                   "--commit", "test", env={**clean_environ(), "TF_MODEL": str(model)}, timeout=240,
                   forked=True)
    assert done.returncode == 0, done.stderr
    run = json.loads(next(tmp_path.glob("*-2x20-8.json")).read_text())
    assert run["family"] == "qwen4_exp" and run["decode_tok_s"] > 0 and 0 < run["roofline_fraction"] < 1


def test_bench_profiles_each_run_by_phase(tmp_path: Path) -> None:
    # the tiny Qwen3.5 checkpoint (4 layers; the demo's are 8): most of a profiled run's time is torch's
    # parse of its events, a host op each, which the tables here are read from
    model = tiny_models.save_served("qwen3_5", CACHE / "tiny")
    done = run_tfd("bench", "--streams", "2", "--prompt", "40", "--new", "4", "--out", str(tmp_path),
                   "--commit", "test", "--profile", env={**clean_environ(), "TF_MODEL": str(model)},
                   timeout=240, forked=True)
    assert done.returncode == 0, done.stderr
    for phase, steps in (("prefill", 0), ("decode", 32)):
        table = next(tmp_path.glob(f"*-2x40-4-{phase}.txt")).read_text()
        assert f"{steps} decode steps" in table.splitlines()[0]
        assert "aten::" in table  # on the CPU the table lists the host ops


def test_a_profiled_run_follows_an_unprofiled_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its kernels compiled first, so no compile lands in the profile."""
    from tfd.bench import profile as profile_module
    from tfd.bench.workload import Timings

    seen: list[bool] = []

    def spy(model, workload, graphs, seed=0):  # type: ignore[no-untyped-def]
        seen.append(torch.autograd.profiler._is_profiler_enabled)
        return Timings(tokens=(), prefill_s=0.0, first_token_s=(), decode_steps=0, decode_s=0.0,
                       decode_tokens=0, graphs=False, peak_bytes=0)

    monkeypatch.setattr(profile_module, "run", spy)
    model = SimpleNamespace(weights=SimpleNamespace(embed=torch.zeros(1)))
    table = profile_module.kernel_table(model, Workload(1, 4, 2), graphs=False)  # type: ignore[arg-type]
    assert seen == [False, True] and table.startswith("1 streams x 4 prompt tokens, 2 new")


def test_kernels_are_told_apart_by_their_launch_grid() -> None:
    def kernel(name: str, grid: list[int], ts: float, dur: float) -> dict[str, object]:
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
                "args": {"grid": grid, "block": [128, 1, 1]}}

    # listed out of order; the second product starts (dependent launch) 4 us before the first ends, the
    # third 1 us after the second ends, _rows 1 us after that: own times 12, 9 (13 less the 4 it shared),
    # 7.5 and 4.5 us (each with the gap it waited out)
    trace = {"traceEvents": [
        kernel("_spread", [32, 1, 8], 22.0, 6.5), kernel("_spread", [193, 1, 2], 0.0, 12.0),
        kernel("_spread", [193, 1, 2], 8.0, 13.0), kernel("_rows", [8, 32, 1], 29.5, 3.5),
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 1.0, "dur": 50.0, "args": {}},  # host op
    ]}
    lines = by_grid(trace, rows=3).splitlines()
    assert lines[0].split() == ["kernel", "grid", "calls", "total", "us", "mean", "us", "own", "us"]
    assert lines[1].split() == ["_spread", "[193,", "1,", "2]", "2", "25.0", "12.50", "10.50"]
    assert lines[2].split() == ["_spread", "[32,", "1,", "8]", "1", "6.5", "6.50", "7.50"]
    assert lines[3].split() == ["_rows", "[8,", "32,", "1]", "1", "3.5", "3.50", "4.50"]
    assert len(lines) == 4  # three rows asked for; aten::add never counted


def test_a_variant_names_kernel_constants_and_refuses_the_rest() -> None:
    from tfd.bench.variants import parse

    variant = parse("narrow=tfd_kernels.moe_one.ROUTER_N=16,tfd_kernels.moe_one.SPREAD_FINISH=0")
    assert variant.name == "narrow"
    assert variant.values == (("tfd_kernels.moe_one", "ROUTER_N", 16),
                              ("tfd_kernels.moe_one", "SPREAD_FINISH", 0))
    assert parse("main=").values == ()
    assert parse("off=tfd.engine.grammar_masks.FILL_HANDOFF=0").values == \
        (("tfd.engine.grammar_masks", "FILL_HANDOFF", 0),)
    for spec, named in (("x=tfd_kernels.nothing.A=1", "no module tfd_kernels.nothing"),
                        ("x=tfd_kernels.moe_one.NOPE=1", "tfd_kernels.moe_one.NOPE is not an int or bool"),
                        ("x=tfd_kernels.router.TWO_LEVEL=0", "separate runs"),
                        ("x=tfd_kernels.moe_one.ROUTER_N=wide", "'wide' is not an integer"),
                        ("x=tfd.env.TABLE=1", "is not tfd_kernels.MODULE.CONSTANT=VALUE"),
                        ("=tfd_kernels.moe_one.ROUTER_N=1", "want NAME=")):
        with pytest.raises(ValueError, match=named):
            parse(spec)


def test_variants_run_interleaved_and_compare_tokens(tmp_path: Path) -> None:
    done = run_tfd("bench", "--streams", "1", "--prompt", "20", "--new", "4", "--rounds", "2", "--grammar",
                   "none,json", "--variant", "main=", "--variant", "narrow=tfd_kernels.moe_one.ROUTER_N=16",
                   "--out", str(tmp_path), timeout=240, forked=True)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "step" in line and "best of" in line]
    assert [line.split(":")[0] for line in lines] == \
        ["main x1", "narrow x1", "main x1, json", "narrow x1, json"], done.stdout
    assert all("tokens the same as main's" in line for line in lines)  # the CPU path runs no kernel
    plain, json_runs = (json.loads(next(tmp_path.glob(f"*-1x20-4{grammar}-variants.json")).read_text())
                        for grammar in ("", "-json"))
    assert [run["grammar"] for run in plain + json_runs] == ["none", "none", "json", "json"]  # a file each
    runs = plain
    assert [run["variant"] for run in runs] == ["main", "narrow"] and runs[0]["shape"] == runs[1]["shape"]
    assert runs[1]["values"] == {"tfd_kernels.moe_one.ROUTER_N": 16} and len(runs[1]["step_ms"]) == 2
    assert len(runs[1]["prefill_ms"]) == 2 and min(runs[1]["prefill_ms"]) == runs[1]["best_prefill_ms"]
    assert all(run["same_tokens"] and run["best_step_ms"] > 0 and run["best_prefill_ms"] > 0 for run in runs)
    refused = run_tfd("bench", "--variant", "x=tfd_kernels.moe_one.NOPE=1", timeout=120, forked=True)
    assert refused.returncode == 2 and "NOPE" in refused.stderr


def test_a_variant_is_set_only_inside_its_run() -> None:
    from tfd.bench.variants import applied, parse
    from tfd_kernels import moe_one

    named = [("tfd_kernels.moe_one", "ROUTER_N"), ("tfd_kernels.moe_one", "SPREAD_FINISH")]
    with applied(parse("n=tfd_kernels.moe_one.ROUTER_N=16"), named):
        assert moe_one.ROUTER_N == 16 and moe_one.SPREAD_FINISH is True  # the other named one at its default
    with applied(parse("s=tfd_kernels.moe_one.SPREAD_FINISH=0"), named):
        assert moe_one.ROUTER_N == 32 and moe_one.SPREAD_FINISH is False
    assert moe_one.ROUTER_N == 32 and moe_one.SPREAD_FINISH is True
