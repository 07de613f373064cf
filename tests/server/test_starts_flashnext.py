"""Every setting with the Flash Next demo: a start ends in READY and a chat, or a refusal by name.

The cases and how they are chosen: tests/server/start_cases.py; how a start is run and judged:
tests/server/starts.py. Qwen3.5's demo has its own file, so the two run in parallel.
"""

from __future__ import annotations

import pytest
import torch
from start_cases import cases
from starts import Case, check

from tfd.env import Table

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="the start test is the CPU's: on a GPU each start compiles and plans")


@pytest.mark.parametrize("case", cases(Table.load(), "flashnext"), ids=lambda case: case.name)
def test_a_start_is_ready_or_refused_by_name(case: Case) -> None:
    check(case)
