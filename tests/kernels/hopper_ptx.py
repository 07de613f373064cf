"""Compiles tfd's kernels for Hopper (sm_90) on this machine, without a GPU: Triton's compiler and the
ptxas it ships need none. Run by test_hopper_ptx.py in a process of its own (TRITON_INTERPRET off:
under the interpreter ``@triton.jit`` makes interpreted functions, which do not compile). Prints
one JSON object: each case's name with the PTX instructions that matter here, or its error."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tfd_kernels import (
    block_choice,
    block_scores,
    cache_write,
    conv1d,
    gemm,
    hyper,
    hyper_mix,
    index_pool,
    lane_rows,
    moe_plan,
    moe_sum,
    norm,
    paged_attention,
    ple_rows,
    rope,
    router,
    sampling,
    sigmoid_gate,
    sparse_attention,
    step_inputs,
    swiglu,
)

HOPPER = GPUTarget("cuda", 90, 32)


@triton.jit
def contracted(stack, output, weights, out, width, BLOCK: tl.constexpr):
    """The hyper write before its product was widened through its bits: the compiler contracts it."""
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    dtype = out.dtype.element_ty
    value = tl.load(output + cols, mask=mask, other=0.0).to(tl.float32)
    added = (value * tl.load(weights).to(tl.float32)).to(dtype).to(tl.float32)
    base = tl.load(stack + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + cols, (base + added).to(dtype), mask=mask)


def signature(fn: Any, pointers: dict[str, str], constexprs: dict[str, Any], scalars: dict[str, str]
              ) -> dict[str, str]:
    """Each argument's type: the pointers' and scalars' given, other scalars i32, constexprs marked."""
    names = fn.arg_names
    return {name: "constexpr" if name in constexprs else pointers.get(name) or scalars.get(name, "i32")
            for name in names}


# name: (kernel, pointer types, constexprs, non-i32 scalars, compile options)
Case = tuple[Any, dict[str, str], dict[str, Any], dict[str, str], dict[str, Any]]
BF16 = "*bf16"
FP8 = "*fp8e4nv"


def mix_apart(columns: int, warps: int, tma: bool) -> Case:
    """``hyper_mix._mix_apart`` at Flash Next's 4 streams, the prompt's row tile and K step, ``columns`` a
    stream, its up rows by pointers or through a tensor descriptor of those tiles."""
    tiles = f"tensordesc<bf16[{columns}, {hyper_mix.MIX_K}]>" if tma else BF16
    return (hyper_mix._mix_apart,
            {**dict.fromkeys(("projected", "up", "normed", "out", "weights"), BF16), "up_tiles": tiles},
            dict(STREAMS=4, INJECTS=True, BLOCK_R=hyper_mix.MIX_PROMPT_ROWS, BLOCK_C=columns,
                 BLOCK_K=hyper_mix.MIX_K, WIDEN=False, TMA=tma, PDL=True),
            dict(streams="fp32"), dict(num_warps=warps, num_stages=hyper_mix.MIX_PROMPT_STAGES))


CASES: dict[str, Case] = {
    "contracted": (contracted, dict.fromkeys(("stack", "output", "weights", "out"), BF16), dict(BLOCK=1024),
                   {}, {}),
    "hyper.write": (hyper._write, dict.fromkeys(("stack", "output", "weights", "out"), BF16),
                    dict(STREAMS=4, BLOCK=1024, PDL=True), {}, {}),
    "hyper.write_norm": (hyper._write_norm,
                         dict.fromkeys(("stack", "output", "weights", "norm", "out", "normed"), BF16),
                         dict(BLOCK=4096, PDL=True), dict(eps="fp32"), {}),
    "hyper_mix.mix": (hyper_mix._mix, dict.fromkeys(("projected", "up", "normed", "out", "weights"), BF16),
                  dict(STREAMS=4, INJECTS=True, BLOCK_R=16, BLOCK_C=16, BLOCK_K=64, WIDEN=False, EARLY=True,
                       PDL=True),
                  dict(streams="fp32"), {}),
    "hyper_mix.mix_apart": mix_apart(32, 4, tma=False),
    # the up rows through a tensor descriptor (a host TensorDescriptor's type)
    "hyper_mix.mix_apart.tma": mix_apart(32, 8, tma=True),
    # the default: 64 columns a stream at 4 warps, by descriptor
    "hyper_mix.mix_apart.tma64": mix_apart(hyper_mix.MIX_APART_COLUMNS, hyper_mix.MIX_PROMPT_WARPS, tma=True),
    "sigmoid_gate.base": (sigmoid_gate._sigmoid_gate, dict.fromkeys(("x", "gate", "base", "out"), BF16),
                          dict(HAS_BASE=True, BLOCK=1024, PDL=True), {}, {}),
    "moe_sum.combine": (moe_sum._combine, dict(buf=BF16, out=BF16, gate=BF16),
                        dict(TOP_K=8, SHARED=True, BLOCK_N=512, PDL=True), {}, {}),
    "norm.zrms": (norm._zrms, dict.fromkeys(("x", "weight", "out"), BF16),
                  dict(BLOCK=4096, EARLY=True, QUANTIZE=False, EXACT_CAST=False, PDL=True), dict(eps="fp32"),
                  {}),
    # the decode rows written quantized too for an FP8 product (tfd_kernels.fp8_rows)
    "norm.zrms.fp8": (norm._zrms, {**dict.fromkeys(("x", "weight", "out"), BF16), "q": FP8,
                                   "scales": "*fp32"},
                      dict(BLOCK=4096, EARLY=True, QUANTIZE=True, EXACT_CAST=False, PDL=True),
                      dict(eps="fp32"), {}),
    "rope.norm_rope": (rope._norm_rope,
                       dict.fromkeys(("x", "weight", "cos", "sin", "out", "y", "y_weight", "y_out"), BF16),
                       dict(BLOCK=128, LOADS_FIRST=True, PDL=True), dict(eps="fp32"), {}),
    "index_pool.store": (index_pool._store, dict(keys=BF16, index=BF16, page_table="*i32", lengths="*i64"),
                         dict(BLOCK=128, PDL=True), {}, {}),
    "index_pool.pool": (index_pool._pool,
                        {**dict.fromkeys(("index", "pooled", "weight", "cos", "sin", "scratch"), BF16),
                         "page_table": "*i32", "lengths": "*i64"},
                        dict(RATIO=4, BLOCK=128, LOADS_FIRST=True, PDL=True), dict(eps="fp32"), {}),
    "sparse_attention.segment": (sparse_attention._segment,
                                 {**dict.fromkeys(("q", "k_cache", "v_cache"), BF16), "partials": "*fp32",
                                  **dict.fromkeys(("page_table", "lane_of", "positions", "counts"), "*i32")},
                                 dict(PAGE_ROWS=64, GROUP=12, GROUP_PAD=16, HEAD_DIM=256, SEG=64, BLOCK_N=32,
                                      WIDEN=False, PDL=True), dict(scale_log2="fp32"), dict(num_warps=4)),
    "block_choice.long": (block_choice._choose_long,
                          dict(scores="*fp32", positions="*i64", out="*i32", counts="*i32"),
                          dict(BEST=512, BLOCK=4, BLOCK_PAD=4, WIDTH=2051, WIDTH_PAD=4096, CHUNK=2048,
                               PDL=True), {}, dict(num_warps=8)),
    "ple_rows.ngram": (ple_rows._ngram,
                       dict.fromkeys(("tokens", "histories", "history_at", "sizes", "offsets", "ids"),
                                     "*i64"),
                       dict(N=3, PER=8, PER_PAD=8, PDL=True), dict.fromkeys(("m0", "m1", "m2", "m3"), "i64"),
                       {}),
    "ple_rows.conv": (ple_rows._conv,
                      dict(normed=BF16, tails=BF16, tail_at="*i64", weight=BF16, out="*fp32"),
                      dict(KERNEL=4, DILATION=3, TAPS=9, BLOCK=1024, PDL=True), {},
                      dict(enable_fp_fusion=False)),
    "swiglu": (swiglu._swiglu, dict.fromkeys(("h", "out"), BF16),
               dict(BLOCK=1024, PAIRED=True, PAIR=32, QUANTIZE=False, EXACT_CAST=False, PDL=True), {},
               {}),
    "swiglu.fp8": (swiglu._swiglu, {**dict.fromkeys(("h", "out"), BF16), "q": FP8, "scales": "*fp32"},
                   dict(BLOCK=1024, PAIRED=False, PAIR=32, QUANTIZE=True, EXACT_CAST=False, PDL=True), {},
                   {}),
    "cache_write": (cache_write._write,
                    {**dict.fromkeys(("k", "v", "k_cache", "v_cache"), BF16), "page_table": "*i32",
                     "lengths": "*i32"}, dict(HEAD_DIM=256, BLOCK=256, PDL=True), {}, {}),
    "lane_rows": (lane_rows._store, dict(values=BF16, into=BF16, at="*i64"), dict(BLOCK=1024, PDL=True),
                  {}, {}),
    "norm.add_zrms": (norm._add_zrms, dict.fromkeys(("x", "delta", "total", "out", "weight"), BF16),
                      dict(BLOCK=4096, EARLY=True, QUANTIZE=False, EXACT_CAST=False, PDL=True),
                      dict(eps="fp32"), {}),
    "norm.add_zrms.fp8": (norm._add_zrms, {**dict.fromkeys(("x", "delta", "total", "out", "weight"), BF16),
                                           "q": FP8, "scales": "*fp32"},
                          dict(BLOCK=4096, EARLY=True, QUANTIZE=True, EXACT_CAST=False, PDL=True),
                          dict(eps="fp32"), {}),
    "norm.gated": (norm._gated, {**dict.fromkeys(("x", "out"), BF16), "gate": BF16, "weight": "*fp32"},
                   dict(ACTIVATION=0, HEADS=4, BLOCK=128, EARLY=True, QUANTIZE=False, EXACT_CAST=False,
                        PDL=True), dict(eps="fp32"), {}),
    "norm.gated.fp8": (norm._gated, {**dict.fromkeys(("x", "out"), BF16), "gate": BF16, "weight": "*fp32",
                                     "q": FP8, "scales": "*fp32"},
                       dict(ACTIVATION=0, HEADS=4, BLOCK=128, EARLY=True, QUANTIZE=True, EXACT_CAST=False,
                            PDL=True), dict(eps="fp32"), {}),
    # attention's decode merge writing its rows quantized for an FP8 out projection (heads of 256)
    "paged_attention.merge.fp8": (paged_attention._decode_merge,
                                  {"partials": "*fp32", "lengths": "*i32", "out": BF16, "gate": BF16,
                                   "q": FP8, "scales": "*fp32"},
                                  dict(HEAD_DIM=256, SHORT=16, SHORT_KEYS=256, SEG=256, BLOCK_S=16,
                                       GATED=True, FIRST=True, QUANTIZE=True, EXACT_CAST=False, PDL=True),
                                  {}, {}),
    # QSA decode rows' merge (tfd_kernels.sparse_attention, segments only, gated; q and scales unread)
    "paged_attention.merge.sparse": (paged_attention._decode_merge,
                                     {"partials": "*fp32", "lengths": "*i32", "out": BF16, "gate": BF16,
                                      "q": BF16, "scales": BF16},
                                     dict(HEAD_DIM=256, SHORT=64, SHORT_KEYS=0, SEG=64, BLOCK_S=64,
                                          GATED=True, FIRST=True, QUANTIZE=False, EXACT_CAST=False, PDL=True),
                                     {}, {}),
    "conv1d.decode": (conv1d._decode,
                      dict.fromkeys(("x", "weight", "tails", "out"), BF16) | {"tail_at": "*i64"},
                      dict(WIDTH=4, BLOCK_C=256, BLOCK_W=4, PDL=True), {}, {}),
    "hyper.gates": (hyper._gates, dict.fromkeys(("projected", "mixed", "weights"), BF16),
                    dict(INJECTS=True, BLOCK=1024, PDL=True), dict(streams="fp32"), {}),
    "hyper.block_input": (hyper._block_input, dict.fromkeys(("up", "normed", "out"), BF16),
                          dict(STREAMS=4, BLOCK=1024, PDL=True), {}, {}),
    # a 1k context's 512 blocks: 8,192 (the most a program sorts) took three minutes to compile here
    "block_choice.sorted": (block_choice._choose,
                            dict(scores="*fp32", positions="*i64", out="*i32", counts="*i32"),
                            dict(BEST=512, BLOCK=4, BLOCK_PAD=4, WIDTH=2051, WIDTH_PAD=4096, SORTED=512,
                                 PDL=True), {}, {}),
    "router.top_k": (router._top_k, dict(logits="*fp32", chosen="*i32", weights="*fp32"),
                     dict(K=10, NORM=True, BLOCK=512, BLOCK_K=16, PDL=True), {}, {}),
    "conv1d.prefill": (conv1d._prefill,
                       {**dict.fromkeys(("x", "weight", "tails", "out"), BF16), "tail_at": "*i64",
                        "cu_seqlens": "*i32"},
                       dict(WIDTH=4, BLOCK_T=16, BLOCK_C=256, BLOCK_W=4, PDL=True), {}, {}),
    "conv1d.verify": (conv1d._verify,
                      {**dict.fromkeys(("x", "weight", "tails", "out"), BF16), "tail_at": "*i64",
                       "rows_at": "*i64"}, dict(WIDTH=4, BLOCK_T=4, BLOCK_C=64, BLOCK_W=4, PDL=True), {}, {}),
    "conv1d.rebuild": (conv1d._rebuild, dict(tails=BF16, tail_at="*i64", rows_at="*i64", keep="*i64"),
                       dict(WIDTH=4, BLOCK_C=256, BLOCK_W=4, PDL=True), {}, {}),
    "gemm.whole": (gemm._whole, dict.fromkeys(("x", "w", "out"), BF16),
                   dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, WIDEN=False, ONE_SEGMENT=False, TMA=False,
                        GROUP=8, SWIGLU=False, PAIR=32, PDL=True), {}, dict(num_warps=8, num_stages=3)),
    "step_inputs.gather": (step_inputs._gather,
                           {**dict.fromkeys(("embed", "cos_table", "sin_table", "x", "cos", "sin"), BF16),
                            "packed": "*i64", "table": "*i32", "lengths": "*i32", "feed": "*i64"},
                           dict(EMBED_TILES=4, BLOCK=1024, BLOCK_D=64, FEED=True, PDL=True), {}, {}),
    "rope.norm_rope_store": (rope._norm_rope_store,
                             {**dict.fromkeys(("x", "weight", "cos", "sin", "out", "y", "y_weight", "v",
                                               "k_cache", "v_cache"), BF16),
                              "page_table": "*i32", "lengths": "*i32"},
                             dict(BLOCK=256, LOADS_FIRST=True, PDL=True), dict(eps="fp32"), {}),
    "moe_sum.combine_add_zrms": (moe_sum._combine_add_zrms,
                                 dict.fromkeys(("buf", "gate", "residual", "total", "out", "weight"), BF16),
                                 dict(TOP_K=8, SHARED=True, BLOCK=2048, PDL=True), dict(eps="fp32"), {}),
    "sparse_attention": (sparse_attention._sparse,
                         {**dict.fromkeys(("q", "k_cache", "v_cache", "out"), BF16), "page_table": "*i32",
                          "lane_of": "*i32", "positions": "*i32", "counts": "*i32"},
                         dict(PAGE_ROWS=256, GROUP=12, GROUP_PAD=16, HEAD_DIM=256, BLOCK_N=64, WIDEN=False,
                              PDL=True), dict(scale_log2="fp32"), dict(num_warps=4)),
    "sampling.slice_best": (sampling._slice_best,
                            {"logits": "*fp32", "temperature": "*fp32", "seeds": "*i64", "positions": "*i64",
                             "best_score": "*fp32", "best_id": "*i64", "allowed": "*i32"},
                            dict(SEED_MIX=sampling.SEED_MIX, POSITION_MIX=sampling.POSITION_MIX,
                                 TOKEN_MIX=sampling.TOKEN_MIX, M1=sampling.M1, M2=sampling.M2,
                                 BLOCK=sampling.BLOCK, SLICE=sampling.SLICE, BITS=False, MASKED=True,
                                 PDL=True),
                            dict(offset="i64"), {}),
    "sampling.row_best": (sampling._row_best,
                          dict(best_score="*fp32", best_id="*i64", out="*i64", out_rows="*i64"),
                          dict(BLOCK=128, ROWS=True, PDL=True), {}, {}),
    # counts left unspecialized (do_not_specialize): the names must be the kernels' own
    "gemm.spread": (gemm._spread,
                    {**dict.fromkeys(("x", "w", "out", "conv_weight", "tails", "tail_at"), BF16),
                     "partials": "*fp32", "counters": "*i32"},
                    dict(SEGMENTS=2, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, WIDEN=False, SWIGLU=False, PAIR=32,
                         CONV=False, WIDTH=2, EARLY=1, PDL=True), {}, dict(num_warps=4, num_stages=4)),
    "block_scores.scores": (block_scores._scores,
                            {**dict.fromkeys(("q", "pooled"), BF16), "page_table": "*i32", "lane_of": "*i32",
                             "complete": "*i64", "out": "*fp32"},
                            dict(ENTRIES=64, HEADS=4, DIM=128, DIM_PAD=128, BLOCKS=32, PDL=True),
                            dict(root="fp32"), {}),
    "moe_plan.count": (moe_plan._count, dict(ids="*i32", hist="*i32"), dict(BINS=512, BLOCK_P=256, PDL=True),
                       {}, {}),
    "moe_plan.scan": (moe_plan._scan, dict(hist="*i32", layout="*i32"),
                      dict(BINS=512, BLOCK_B=8, BLOCK_M=16, PDL=True), {}, {}),
    "moe_plan.place": (moe_plan._place,
                       dict.fromkeys(("ids", "hist", "layout", "pair_at", "dest_at"), "*i32"),
                       dict(BINS=512, BLOCK_P=256, SLOTS=16, PDL=True), {}, {}),
}
INSTRUCTIONS = re.compile(r"\b((?:fma|add|mul)\.rn\.(?:bf16|f32)|(?:fma|add|mul)\.(?:bf16|f32))\b")


def counted(source: ASTSource, options: dict[str, Any], instructions: re.Pattern[str]) -> dict[str, Any]:
    """``source`` compiled for Hopper with ``options``: how often each PTX instruction
    ``instructions`` finds appears, or ``{"error": ...}`` (reported by name to the test, which fails
    on it). What the tests' own compile scripts share with this one."""
    try:
        kernel = triton.compile(source, target=HOPPER, options=options)
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"[:2000]}
    found = instructions.findall(kernel.asm["ptx"])
    return {op: found.count(op) for op in sorted(set(found))}


def compiled(name: str) -> dict[str, Any]:
    fn, pointers, constexprs, scalars, options = CASES[name]
    source = ASTSource(fn=fn, signature=signature(fn, pointers, constexprs, scalars), constexprs=constexprs)
    found = counted(source, {"enable_fp_fusion": True, **options}, INSTRUCTIONS)
    return found if "error" in found else {"instructions": found}


if __name__ == "__main__":
    json.dump({name: compiled(name) for name in (sys.argv[1:] or CASES)}, sys.stdout)
