"""The kernels compile for Hopper on a machine without a GPU, and their PTX rounds where the torch
composition rounds: a product rounded before it is added takes no fused multiply-add (on the H200
Triton contracted the hyper write's into one bf16 fma, a third of its elements one unit off torch's),
and the PLE conv's fp32 products and sums stay apart. The interpreter runs none of this: an error
in a kernel the CPU tests interpret would otherwise first show on the device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support import compiled_for_hopper

SCRIPT = Path(__file__).with_name("hopper_ptx.py")
ROUNDED_THEN_ADDED = ("hyper.write", "hyper.write_norm", "sigmoid_gate.base", "moe_sum.combine",
                      "rope.norm_rope", "index_pool.pool")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every case of hopper_ptx.py, compiled in a process without the interpreter (its own cache)."""
    return compiled_for_hopper([str(SCRIPT)], tmp_path_factory.mktemp("triton"))


def test_every_kernel_compiles_for_hopper(compiled: dict[str, Any]) -> None:
    failed = {name: case["error"] for name, case in compiled.items() if "error" in case}
    assert not failed, failed


def test_a_rounded_product_before_an_add_is_never_contracted(compiled: dict[str, Any]) -> None:
    # the form the hyper write had: a bf16 fma, so this check can fail
    assert compiled["contracted"]["instructions"].get("fma.rn.bf16", 0) > 0
    for name in ROUNDED_THEN_ADDED:
        assert "fma.rn.bf16" not in compiled[name]["instructions"], name


def test_the_ple_conv_keeps_its_products_and_sums_apart(compiled: dict[str, Any]) -> None:
    instructions = compiled["ple_rows.conv"]["instructions"]
    assert not any(op.startswith("fma") for op in instructions), instructions
    assert instructions.get("mul.rn.f32", 0) and instructions.get("add.rn.f32", 0)
