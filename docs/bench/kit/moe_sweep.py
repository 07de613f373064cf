"""Issue 31: the MoE's prompt launches (tfd_kernels.moe, prompt tiles) at the 8 x 1,024-row prefill of the
35B-A3B (256 experts, top 8) and Qwen3-Next-80B-A3B (512, top 10), hidden 2,048, inner 512, a shared expert,
under variants of the prompt constants: each launch's device us (torch.profiler, median of REPEATS calls)
and whether the block's output and norm have the base's bits. On the H100 at 628a66c the two launches took
1.11 + 0.89 ms of the 35B-A3B's 2.2 ms MoE a layer (36% and 22% of the matmul rate).

    PYTHONPATH=/tmp/site python .dev/moe_sweep.py compile N I [VARIANT ...]  (I, I+N, ..: cache warmed)
    PYTHONPATH=/tmp/site python .dev/moe_sweep.py time [VARIANT ...]   (bits against the first named)
    MOE_SHAPES=flash,35b-1 ...: other shapes (SHAPES)
"""

from __future__ import annotations

import os
import statistics
import sys

VARIANTS: dict[str, dict[str, int]] = {
    "base": {},
    "w4": {"PROMPT_WARPS": 4, "PROMPT_DOWN_WARPS": 4},
    "group16": {"PROMPT_GROUP": 16},
    "group64": {"PROMPT_GROUP": 64},
    "gs4": {"PROMPT_GATE_STAGES": 4},
    "gs2": {"PROMPT_GATE_STAGES": 2},
    "gn128s2": {"PROMPT_GATE_N": 128, "PROMPT_GATE_STAGES": 2},
    "gk64s4": {"PROMPT_GATE_K": 64, "PROMPT_GATE_STAGES": 4},
    "gk64s6": {"PROMPT_GATE_K": 64, "PROMPT_GATE_STAGES": 6},
    "gn128k64s4": {"PROMPT_GATE_N": 128, "PROMPT_GATE_K": 64, "PROMPT_GATE_STAGES": 4},
    "ds2": {"PROMPT_DOWN_STAGES": 2},
    "ds4": {"PROMPT_DOWN_STAGES": 4},
    "dn256s2": {"PROMPT_DOWN_N": 256, "PROMPT_DOWN_STAGES": 2},
    "dn64": {"PROMPT_DOWN_N": 64},
    "dk64s4": {"PROMPT_DOWN_K": 64, "PROMPT_DOWN_STAGES": 4},
    "dn256k64s3": {"PROMPT_DOWN_N": 256, "PROMPT_DOWN_K": 64, "PROMPT_DOWN_STAGES": 3},
    "dw4": {"PROMPT_DOWN_WARPS": 4},
    "m128s2": {"PROMPT_M": 128, "PROMPT_GATE_STAGES": 2, "PROMPT_DOWN_STAGES": 2},
    "m128k64s4": {"PROMPT_M": 128, "PROMPT_GATE_K": 64, "PROMPT_DOWN_K": 64, "PROMPT_GATE_STAGES": 4,
                  "PROMPT_DOWN_STAGES": 4},
    "m128gn128k64s3": {"PROMPT_M": 128, "PROMPT_GATE_N": 128, "PROMPT_GATE_K": 64, "PROMPT_GATE_STAGES": 3,
                       "PROMPT_DOWN_N": 256, "PROMPT_DOWN_K": 64, "PROMPT_DOWN_STAGES": 3},
}
# the first round's best (every variant the base's bits)
BEST = {"PROMPT_M": 128, "PROMPT_GATE_N": 128, "PROMPT_GATE_K": 64, "PROMPT_GATE_STAGES": 3,
        "PROMPT_DOWN_N": 256, "PROMPT_DOWN_K": 64, "PROMPT_DOWN_STAGES": 3}
SECOND: dict[str, dict[str, int]] = {  # around it
    "b_gs4": {"PROMPT_GATE_STAGES": 4},
    "b_dn128s4": {"PROMPT_DOWN_N": 128, "PROMPT_DOWN_STAGES": 4},
    "b_dn128s5": {"PROMPT_DOWN_N": 128, "PROMPT_DOWN_STAGES": 5},
    "b_ds4": {"PROMPT_DOWN_STAGES": 4},
    "b_group16": {"PROMPT_GROUP": 16},
    "b_group8": {"PROMPT_GROUP": 8},
    "b_dn128w4": {"PROMPT_DOWN_N": 128, "PROMPT_DOWN_STAGES": 4, "PROMPT_DOWN_WARPS": 4},
    "b_gk32s6": {"PROMPT_GATE_K": 32, "PROMPT_GATE_STAGES": 6},
    "b_dk32s6": {"PROMPT_DOWN_K": 32, "PROMPT_DOWN_STAGES": 6},
    "b_m64gs4": {"PROMPT_M": 64, "PROMPT_GATE_STAGES": 4},
    "b_gn64s4": {"PROMPT_GATE_N": 64, "PROMPT_GATE_STAGES": 4},
    "b_gs4ds4": {"PROMPT_GATE_STAGES": 4, "PROMPT_DOWN_STAGES": 4},
}
VARIANTS.update({"best": BEST, **{name: {**BEST, **change} for name, change in SECOND.items()}})
# Both rounds ran before b_gs4ds4 became the defaults; every variant starts from the old ones.
OLD = {"PROMPT_M": 64, "PROMPT_GATE_N": 64, "PROMPT_GATE_K": 128, "PROMPT_GATE_STAGES": 3,
       "PROMPT_DOWN_N": 128, "PROMPT_DOWN_K": 128, "PROMPT_DOWN_STAGES": 3, "PROMPT_WARPS": 8,
       "PROMPT_DOWN_WARPS": 8, "PROMPT_GROUP": 32}
VARIANTS = {name: {**OLD, **change} for name, change in VARIANTS.items()}
VARIANTS["defaults"] = {}
# Few pairs an expert (one prompt of 1,024 rows: Flash Next 20, the 35B-A3B 32), where the weights' reading
# is the launches' time: the defaults' tiles against thinner ones (from the defaults; MOE_SHAPES=flash,35b-1).
THIN: dict[str, dict[str, int]] = {
    "t_m64": {"PROMPT_M": 64},
    "t_m64k128": {"PROMPT_M": 64, "PROMPT_GATE_N": 64, "PROMPT_GATE_K": 128, "PROMPT_DOWN_N": 128,
                  "PROMPT_DOWN_K": 128},
    "t_m64k128s5": {"PROMPT_M": 64, "PROMPT_GATE_N": 64, "PROMPT_GATE_K": 128, "PROMPT_GATE_STAGES": 4,
                    "PROMPT_DOWN_N": 128, "PROMPT_DOWN_K": 128, "PROMPT_DOWN_STAGES": 5},
    "t_m32": {"PROMPT_M": 32, "PROMPT_GATE_N": 64, "PROMPT_GATE_K": 128, "PROMPT_GATE_STAGES": 5,
              "PROMPT_DOWN_N": 128, "PROMPT_DOWN_K": 128, "PROMPT_DOWN_STAGES": 4, "PROMPT_WARPS": 4,
              "PROMPT_DOWN_WARPS": 4},
    "t_m32w8": {"PROMPT_M": 32, "PROMPT_GATE_N": 64, "PROMPT_GATE_K": 128, "PROMPT_GATE_STAGES": 5,
                "PROMPT_DOWN_N": 128, "PROMPT_DOWN_K": 128, "PROMPT_DOWN_STAGES": 4},
    "t_m32n128": {"PROMPT_M": 32, "PROMPT_GATE_N": 128, "PROMPT_GATE_K": 64, "PROMPT_GATE_STAGES": 6,
                  "PROMPT_DOWN_N": 256, "PROMPT_DOWN_K": 64, "PROMPT_DOWN_STAGES": 6, "PROMPT_WARPS": 4,
                  "PROMPT_DOWN_WARPS": 4},
    "t_m64s6": {"PROMPT_M": 64, "PROMPT_GATE_STAGES": 6, "PROMPT_DOWN_STAGES": 6},
    "t_group8": {"PROMPT_GROUP": 8},
    "t_group0": {"PROMPT_GROUP": 0},
}
VARIANTS.update(THIN)
# experts, top k, rows, hidden, inner (the shared expert's too)
SHAPES = {"35b-a3b": (256, 8, 8192, 2048, 512), "80b-a3b": (512, 10, 8192, 2048, 512),
          "flash": (512, 10, 1024, 2560, 640), "35b-1": (256, 8, 1024, 2048, 512)}
REPEATS = 10


def inputs(experts: int, rows: int, hidden: int, inner: int):  # type: ignore[no-untyped-def]
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape: int, scale: float = 0.02) -> torch.Tensor:
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).bfloat16()
    return (rand(rows, hidden, scale=1.0), rand(experts + 1, hidden), rand(experts, 2 * inner, hidden),
            rand(experts, hidden, inner), rand(2 * inner, hidden), rand(hidden, inner),
            rand(rows, hidden, scale=1.0), rand(hidden, scale=1.0))


def call(args, top_k: int):  # type: ignore[no-untyped-def]
    from tfd_kernels import moe
    x, router, gate_up, down, shared_gate_up, shared_down, residual, weight = args
    return moe.block_add_zrms(x, router, gate_up, down, top_k, True, (shared_gate_up, shared_down),
                              moe.Residual(residual, weight, 1e-6))


def applied(name: str) -> dict[str, int]:
    from tfd_kernels import moe
    before = {key: getattr(moe, key) for key in VARIANTS[name]}
    for key, value in VARIANTS[name].items():
        setattr(moe, key, value)
    return before


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from tfd_kernels import moe
    mode = sys.argv[1]
    if mode == "compile":
        step, first = int(sys.argv[2]), int(sys.argv[3])
        names = (sys.argv[4:] or list(VARIANTS))[first::step]
    else:
        names = sys.argv[2:] or list(VARIANTS)
    chosen = os.environ.get("MOE_SHAPES", "35b-a3b,80b-a3b").split(",")
    for shape in chosen:
        experts, top_k, rows, hidden, inner = SHAPES[shape]
        args = inputs(experts, rows, hidden, inner)
        want = None
        if mode == "time":
            before = applied(names[0])  # the first variant named: the bits the others are held to
            want = [t.clone() for t in call(args, top_k)]
            for key, value in before.items():
                setattr(moe, key, value)
        for name in names:
            before = applied(name)
            try:
                got = call(args, top_k)
                torch.cuda.synchronize()
                if mode == "compile":
                    continue
                same = all(torch.equal(a, b) for a, b in zip(got, want or [], strict=True))
                for _ in range(2):
                    call(args, top_k)
                with profile(activities=[ProfilerActivity.CUDA]) as profiled:
                    for _ in range(REPEATS):
                        call(args, top_k)
                    torch.cuda.synchronize()
                launches: dict[str, list[float]] = {}
                for event in profiled.events():
                    if event.device_type.name == "CUDA":
                        launches.setdefault(event.name, []).append(event.time_range.elapsed_us())
                parts = {key: statistics.median(times) for key, times in launches.items()
                         if len(times) >= REPEATS}
                main_parts = {key: value for key, value in parts.items()
                              if key in ("_gate_up", "_down") or "combine" in key}
                total = sum(parts.values())
                print(f"{shape} {name:<16} total {total:8.1f} us  " +
                      "  ".join(f"{key} {value:7.1f}" for key, value in main_parts.items()) +
                      ("" if same else "  DIFF"), flush=True)
            except Exception as error:  # a variant that does not fit (shared memory, registers) is a line
                print(f"{shape} {name:<16} fails: {str(error)[:160]}", flush=True)
            finally:
                for key, value in before.items():
                    setattr(moe, key, value)
        del args
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
