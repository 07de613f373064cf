"""A pytest plugin (``-p segments_on``, .dev on PYTHONPATH): QSA decode rows in segments
(``tfd_kernels.sparse_attention.DECODE_SEGMENTS``) for the whole run, in every xdist worker, so the model-level
GPU tests run the path a variant would."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    from tfd_kernels import sparse_attention

    sparse_attention.DECODE_SEGMENTS = 1
