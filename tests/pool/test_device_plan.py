"""A GPU's memory shared out at load: the pool gets what the measured needs leave, or TF_POOL_GIB."""

from __future__ import annotations

import attrs
import pytest

from tfd.engine.graphs import BUCKETS
from tfd.pool.device_plan import GIB, LOGIT_BYTES, DevicePlan, DeviceTooSmall, graph_bytes, planned_bytes
from tfd.pool.layout import Layout, RowPart
from tfd.pool.pages import AUTO_LANES_MOST, Pool
from tfd.pool.pieces import Piece


def plan(planned: float, weights: float = 18, activations: float = 1, graphs: float = 0.5,
         reserve: float = 1) -> DevicePlan:
    return DevicePlan(int(planned * GIB), int(planned * GIB), int(weights * GIB), int(activations * GIB),
                      int(graphs * GIB), int(reserve * GIB), 256)


def test_the_pool_takes_what_the_measured_needs_leave() -> None:
    found = plan(139.5)
    assert found.outside == int(20.5 * GIB)
    assert found.check(None) == found.pool == int(119 * GIB)
    assert found.as_dict()["pool_bytes"] == found.pool


def test_an_explicit_pool_is_taken_up_to_what_is_left() -> None:
    found = plan(40)  # 19.5 GiB left
    assert found.check(int(19.5 * GIB)) == int(19.5 * GIB)  # exactly what is left
    assert found.check(4 * GIB) == 4 * GIB
    with pytest.raises(DeviceTooSmall) as small:
        found.check(int(19.5 * GIB) + 1)
    (problem,) = small.value.problems
    assert problem.startswith("TF_POOL_GIB=19.5 is more than the 19.50 GiB left of 40.00 GiB planned "
                              "(weights 18.00, activations of a 256-row step 1.00, graphs 0.50, "
                              "runtime 0.00, reserve 1.00 GiB)")
    assert "TF_CUDA_MEMORY_LIMIT_GB" in problem


def test_nothing_left_is_refused_naming_the_rows() -> None:
    assert plan(20.5 + 1 / GIB).check(None) == 1  # a byte left is a pool (whether a lane fits is next)
    with pytest.raises(DeviceTooSmall, match=r"nothing is left for the pool of 20\.50 GiB planned"):
        plan(20.5).check(None)
    assert plan(10).pool == 0


def test_what_the_runtime_took_beside_torch_is_not_the_pools() -> None:
    found = attrs.evolve(plan(139.5), runtime=GIB // 2)
    assert found.pool == int(118.5 * GIB) and found.as_dict()["runtime_bytes"] == GIB // 2


def test_the_pool_takes_no_more_than_is_free_once_the_weights_are_in() -> None:
    # 139.5 planned, 20.5 outside: 119 GiB by the plan; 112 GiB free then, less 2.5 still to come
    found = attrs.evolve(plan(139.5), free_before_pool=112 * GIB)
    assert found.pool == int(109.5 * GIB)
    assert attrs.evolve(found, free_before_pool=int(121.5 * GIB)).pool == 119 * GIB  # the plan binds
    assert attrs.evolve(found, free_before_pool=int(121.5 * GIB) + 1).pool == 119 * GIB
    assert attrs.evolve(found, free_before_pool=2 * GIB).pool == 0


def test_a_limit_caps_what_is_free_and_never_raises_it() -> None:
    assert planned_bytes(100 * GIB, None) == 100 * GIB
    assert planned_bytes(100 * GIB, 40 * GIB) == 40 * GIB
    assert planned_bytes(100 * GIB, 100 * GIB) == 100 * GIB
    assert planned_bytes(30 * GIB, 40 * GIB) == 30 * GIB


def test_graphs_cost_a_measured_rows_share_and_logits_a_row() -> None:
    # 1 MiB a row measured over 256 rows; 64 lanes, no drafts: 64 rows.
    assert graph_bytes(256 << 20, 256, 64, 0, 1000) == 64 * ((1 << 20) + 1000 * LOGIT_BYTES)
    # Drafting windows of 4 rows add 4 verify rows a lane.
    assert graph_bytes(256 << 20, 256, 64, 4, 1000) == 5 * 64 * ((1 << 20) + 1000 * LOGIT_BYTES)
    assert graph_bytes(257, 256, 1, 0, 0) == 2  # a row's share rounds up


def layout() -> Layout:
    return Layout(16, [RowPart("layer0.k", (64,), "bfloat16")], [Piece("layer0.state", (256,), "float32")])


@pytest.mark.parametrize("fits", [AUTO_LANES_MOST - 1, AUTO_LANES_MOST, AUTO_LANES_MOST + 1,
                                  4 * AUTO_LANES_MOST])
def test_auto_lanes_stop_at_the_largest_graph(fits: int) -> None:
    shape = layout()
    memory = shape.page_bytes + fits * shape.lane_bytes(32)
    assert shape.plan(32, memory) == fits
    pool = Pool.for_limit(shape, memory, 32)
    assert pool.max_lanes == min(fits, AUTO_LANES_MOST)
    assert pool.pages >= fits * shape.need(32)  # the pages past the lanes' are the prompt cache's
    assert Pool.for_limit(shape, memory, 32, parallel=fits).max_lanes == fits  # an explicit count is kept


def test_the_auto_bound_is_the_largest_decode_graph() -> None:
    assert max(BUCKETS) == AUTO_LANES_MOST
