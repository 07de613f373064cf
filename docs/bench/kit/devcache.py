"""A pytest plugin for this machine (no CUDA): the GPU tests named run their fixtures here, so the tiny
checkpoints they load are written into the test cache (transformers writes them; the device has none that
works beside the carried wheels), then fail at their first CUDA call. Run from the checkout:

    TMPDIR=$PWD/.devcache .venv/bin/python -m pytest -q -p no:cacheprovider -n 0 \
        -p devcache --rootdir . -c pyproject.toml tests/engine/test_device_path.py ...

with `docs/bench/kit` on PYTHONPATH; every failure is expected, the cache is what it leaves.
"""

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Takes back the skip tests/conftest.py puts on ``gpu`` tests where CUDA is absent."""
    for item in items:
        item.own_markers = [m for m in item.own_markers if not (m.name == "skip" and "CUDA" in str(m.kwargs))]
