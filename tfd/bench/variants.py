"""``tfd bench --variant``: kernel switches compared in one process, runs interleaved, tokens compared.

The kernels keep their launch choices as module constants (``tfd_kernels.moe_one.ROUTER_N``,
``tfd_kernels.moe_one.SPREAD_FINISH``, ``tfd_kernels.gemm_plan.TARGET_PROGRAMS``, ...), read when a launch is
made, and so do the model's layers where they choose among launches (``tfd.model.attention``). A
variant names some of them and their values; each run sets its variant's values and every other
named constant back to its default, captures its own graphs (so the launches are made anew), and
times the workload. Variants alternate round by round, so drift on the device lands on all alike,
and each run's tokens are compared with the first variant's: where a switch claims the same bits,
they must be the same tokens.

A constant that Triton compiles into a kernel as a global (a ``tl.constexpr`` object) cannot change
once a kernel is built, so it is refused here: compare it in separate runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import attrs

from tfd.bench.workload import Timings, Workload, run
from tfd.families.hybrid import HybridModel


@attrs.frozen
class Variant:
    name: str
    values: tuple[tuple[str, str, int], ...]  # (module, constant, value)


def parse(spec: str) -> Variant:
    """``NAME=MODULE.CONSTANT=VALUE[,MODULE.CONSTANT=VALUE...]`` (or ``NAME=`` for the defaults): a
    variant of ``kernels`` (or ``tfd.model``, ``tfd.engine``) module constants, each an existing int or
    bool constant, values integers. ValueError names what is wrong."""
    name, sep, rest = spec.partition("=")
    if not sep or not name:
        raise ValueError(f"variant {spec!r}: want NAME=MODULE.CONSTANT=VALUE[,...] or NAME=")
    values = []
    for item in filter(None, rest.split(",")):
        key, sep, text = item.partition("=")
        module_name, _, constant = key.rpartition(".")
        if not sep or not module_name.startswith(("tfd_kernels.", "tfd.model.", "tfd.engine.")):
            raise ValueError(f"variant {name!r}: {item!r} is not tfd_kernels.MODULE.CONSTANT=VALUE "
                             f"(or tfd.model. or tfd.engine.MODULE.CONSTANT=VALUE)")
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            raise ValueError(f"variant {name!r}: no module {module_name}") from None
        current = getattr(module, constant, None)
        if not constant.isupper() or type(current) not in (int, bool):
            kind = "a Triton global, compiled in at first use: compare it in separate runs" \
                if type(current).__name__ == "constexpr" else "not an int or bool constant"
            raise ValueError(f"variant {name!r}: {key} is {kind}")
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"variant {name!r}: {key}={text!r} is not an integer") from None
        values.append((module_name, constant, value))
    return Variant(name, tuple(values))


@contextmanager
def applied(variant: Variant, named: Sequence[tuple[str, str]]) -> Iterator[None]:
    """Inside: ``variant``'s values set, every other of the ``named`` constants at its value from
    before; after: all of them as before."""
    modules = {module: importlib.import_module(module) for module, _ in named}
    before = {(module, constant): getattr(modules[module], constant) for module, constant in named}
    wanted = dict(before) | {(module, constant): value for module, constant, value in variant.values}
    try:
        for (module, constant), value in wanted.items():
            kind = type(before[(module, constant)])
            setattr(modules[module], constant, kind(value))
        yield
    finally:
        for (module, constant), value in before.items():
            setattr(modules[module], constant, value)


def compare(model: HybridModel, shape: str, workload: Workload, variants: Sequence[Variant], rounds: int,
            graphs: bool) -> list[dict[str, Any]]:
    """Each variant's decode step and prefill times over ``rounds`` interleaved runs of ``workload``
    (after one untimed run of two new tokens, which compiles its kernels), and whether its tokens were
    the first variant's in every run; printed a line a variant, returned as objects."""
    named = sorted({(module, constant) for variant in variants for module, constant, _ in variant.values})
    steps: dict[str, list[float]] = {variant.name: [] for variant in variants}
    prefills: dict[str, list[float]] = {variant.name: [] for variant in variants}
    same = dict.fromkeys(steps, True)
    first: tuple[tuple[int, ...], ...] | None = None
    warm = Workload(workload.streams, workload.prompt_tokens, 2, workload.step_tokens)
    for _ in range(rounds):
        for variant in variants:
            with applied(variant, named):
                run(model, warm, graphs, seed=1)
                timings: Timings = run(model, workload, graphs)
            first = timings.tokens if first is None else first
            same[variant.name] &= timings.tokens == first
            steps[variant.name].append(timings.decode_s / max(timings.decode_steps, 1) * 1e3)
            prefills[variant.name].append(timings.prefill_s * 1e3)
    results = []
    for variant in variants:
        times, prefill = steps[variant.name], prefills[variant.name]
        result = {"variant": variant.name, "values": {f"{m}.{c}": v for m, c, v in variant.values},
                  "shape": shape, "streams": workload.streams, "prompt_tokens": workload.prompt_tokens,
                  "new_tokens": workload.new_tokens, "grammar": workload.grammar_name,
                  "drafts": 0 if workload.drafting is None else workload.drafting.most,
                  "step_ms": times, "best_step_ms": min(times),
                  "prefill_ms": prefill, "best_prefill_ms": min(prefill),
                  "same_tokens": same[variant.name]}
        verdict = "the same as" if same[variant.name] else "NOT the same as"
        drafts = f"{result['drafts']} drafts" if result["drafts"] else ""
        named = "".join(f", {what}" for what in (workload.grammar_name, drafts) if what and what != "none")
        print(f"{variant.name} x{workload.streams}{named}: step {min(times):.4f} ms best of "
              f"{' '.join(f'{t:.4f}' for t in times)}; prefill {min(prefill):.1f} ms best of "
              f"{' '.join(f'{t:.1f}' for t in prefill)}; tokens {verdict} {variants[0].name}'s", flush=True)
        results.append(result)
    return results
