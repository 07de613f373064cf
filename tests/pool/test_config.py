"""The pool's settings, per family, from the environment table."""

from __future__ import annotations

import pytest

from tfd.env import FAMILY_SCOPES, Table
from tfd.pool.config import GIB, PAGE_ROWS_WHEN_OFF, PoolConfig
from tfd.pool.layout import Mode
from tfd.pool.pieces import PieceOverPage

TABLE = Table.load()


@pytest.mark.parametrize(("environ", "family", "expected"), [
    ({}, "qwen3_5", PoolConfig(256, Mode.PIECES, None)),
    ({}, "qwen4_exp", PoolConfig(256, Mode.PIECES, None, rows_name="TF_FLASHNEXT_KV_PAGES")),
    ({"TF_STATE_PAGES": "0"}, "qwen3_next", PoolConfig(256, Mode.STATE_RUN, None)),
    ({"TF_KV_PAGES": "0"}, "qwen3_5_moe", PoolConfig(PAGE_ROWS_WHEN_OFF, Mode.ONE_RUN, None)),
    ({"TF_KV_PAGES": "128", "TF_CUDA_MEMORY_LIMIT_GB": "1.5"}, "qwen3_5",
     PoolConfig(128, Mode.PIECES, int(1.5 * GIB))),
    ({"TF_POOL_GIB": "2", "TF_CUDA_MEMORY_LIMIT_GB": "40"}, "qwen3_5",
     PoolConfig(256, Mode.PIECES, 40 * GIB, 2 * GIB)),
    ({"TF_POOL_GIB": "0.001", "TF_KV_PAGES": "0"}, "qwen3_next",
     PoolConfig(PAGE_ROWS_WHEN_OFF, Mode.ONE_RUN, None, int(0.001 * GIB))),
    # Flash Next's own rows win for Flash Next and only for it.
    ({"TF_FLASHNEXT_KV_PAGES": "512", "TF_FLASHNEXT_STATE_PAGES": "0"}, "qwen4_exp",
     PoolConfig(512, Mode.STATE_RUN, None, rows_name="TF_FLASHNEXT_KV_PAGES")),
    ({"TF_FLASHNEXT_KV_PAGES": "512", "TF_FLASHNEXT_STATE_PAGES": "0"}, "qwen3_5",
     PoolConfig(256, Mode.PIECES, None)),
    ({"TF_KV_PAGES": "0"}, "flashnext",
     PoolConfig(PAGE_ROWS_WHEN_OFF, Mode.ONE_RUN, None, rows_name="TF_FLASHNEXT_KV_PAGES")),
])
def test_pool_config(environ: dict[str, str], family: str, expected: PoolConfig) -> None:
    settings = TABLE.read(environ, families=FAMILY_SCOPES)
    assert PoolConfig.from_settings(settings, family) == expected


def test_the_family_rows_must_be_checked_first() -> None:
    settings = TABLE.read({})
    with pytest.raises(LookupError, match="scope flashnext"):
        PoolConfig.from_settings(settings, "qwen4_exp")
    assert PoolConfig.from_settings(settings.check_family("qwen4_exp"), "qwen4_exp").page_rows == 256


@pytest.mark.parametrize(("smallest", "said"), [
    (22, "TF_KV_PAGES=32 is the least that holds it"),  # rounded up to the row's step
    (32, "TF_KV_PAGES=32 is the least that holds it"),
    (8192, "TF_KV_PAGES=8192 is the least that holds it"),  # the row's greatest
    (8193, "no TF_KV_PAGES up to 8192 holds it"),
])
def test_a_page_too_small_is_refused_with_the_least_legal_value(smallest: int, said: str) -> None:
    settings = TABLE.read({"TF_KV_PAGES": "16"})
    config = PoolConfig.from_settings(settings, "qwen3_5")
    error = PieceOverPage("layer0.spare", 65536, 49152, 16, smallest)
    assert config.over_page(error, settings) == ("TF_KV_PAGES=16: the piece layer0.spare needs 65536 bytes, "
                                                 f"more than a page of 49152 bytes (16 rows); {said}")


def test_a_family_row_that_took_the_core_rows_value_names_both() -> None:
    error = PieceOverPage("layer0.spare", 65536, 56832, 16, 22)
    inherited = TABLE.read({"TF_KV_PAGES": "16"}, families=FAMILY_SCOPES)
    config = PoolConfig.from_settings(inherited, "qwen4_exp")
    assert config.over_page(error, inherited) == (
        "TF_FLASHNEXT_KV_PAGES=16 (as TF_KV_PAGES=16): the piece layer0.spare needs 65536 bytes, more than a "
        "page of 56832 bytes (16 rows); TF_FLASHNEXT_KV_PAGES=32 (or TF_KV_PAGES=32) is the least that "
        "holds it")
    own = TABLE.read({"TF_KV_PAGES": "32", "TF_FLASHNEXT_KV_PAGES": "16"}, families=FAMILY_SCOPES)
    assert PoolConfig.from_settings(own, "qwen4_exp").over_page(error, own).startswith(
        "TF_FLASHNEXT_KV_PAGES=16: the piece")  # its own value: the core row is not its source
