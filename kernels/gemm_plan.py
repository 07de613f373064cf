"""The batch-invariant product's fixed choice for a weight shape: its K segments and its tiles.

``plan`` cuts K into segments from the weight's shape alone (never the number of rows: that is what
keeps a row's bits the same in any batch, ``tfd_kernels.gemm``); ``Plan`` then picks, for a number
of rows, the launch form and the tile, which may follow the rows without changing a bit. The tiles
and thresholds below come from H200 sweeps (docs/bench.md).
"""

from __future__ import annotations

import math

import attrs
import triton

# K segments rounded up to two programs per multiprocessor of an H200: in the 9B's decode step 4.63 ms
# against 4.79 with segments rounded down to one (6.57 against 7.02 at 32 lanes), though the products
# replayed alone favoured fewer (.dev probes, docs/bench.md).
TARGET_PROGRAMS = 264
SPREAD_ROWS = 64  # up to this many rows the segments run in programs of their own
# K steps a segment takes at least: a narrow product's segments stop there short of TARGET_PROGRAMS
# (Flash Next's hyper down rows [324, 10240]: 20 segments, 120 programs, 7.7 us at one row on the H200)
SEGMENT_STEPS = 4
# A product of at most NARROW_TILES column tiles (0: none) takes segments of NARROW_STEPS K steps instead:
# twice the programs reading half as much each where a narrow product's few programs wait out their reads
# (the hyper down rows: 120 programs of 64 KB). Ints, so that tfd bench --variant can sweep them (a weight's
# segments, hence its bits, follow them: never the rows).
NARROW_TILES = 0
NARROW_STEPS = 2
SHARED_BYTES = 227 * 1024  # shared memory a program may take on an H200 (232,448 bytes)


@attrs.frozen
class Tiles:
    """One launch form's tile: rows, columns and K step of a program, its warps and pipeline."""

    block_m: int
    block_n: int
    block_k: int
    warps: int = 4
    stages: int = 3

    def programs(self, rows: int, n: int) -> int:
        """Programs of the whole form at this tile over ``rows`` rows of an ``n``-column product."""
        return triton.cdiv(n, self.block_n) * triton.cdiv(rows, self.block_m)


FEW = Tiles(16, 64, 128, 4, 4)  # up to 16 rows: the fastest weight stream at one row
MID = Tiles(32, 64, 128, 4, 4)  # up to 32 rows: 25-30% faster there than 64-row tiles (sweep)
SPREAD = Tiles(64, 64, 128, 4, 4)  # up to SPREAD_ROWS rows: many small programs keep every SM reading
# many rows: large tiles reuse what they read (453-525 TFLOP/s at 8192). 128 x 128 x 64 in 4 stages was 2-6%
# faster on the products alone at 8,192 rows (H100), but in the prefill benches Flash Next's 1 x 1,024 took
# 16% longer, the 35B-A3B's 8 x 1,024 no less, the 80B-A3B's ~5% less (docs/bench.md, fortieth session): kept
WHOLE = Tiles(128, 128, 128, 8, 3)
WHOLE_ONE = Tiles(256, 128, 64, 8, 4)  # many rows, one K segment: one accumulator leaves room for 256 rows
# 65 to 128 rows (a resumed turn's step, a prompt's last chunk): the spread form with taller tiles where the
# whole form would leave most multiprocessors idle or half its one-segment tile padding. H200, qwen3_5-9b's
# products at 128 rows (docs/bench/382b9ac2ac41/gemm-mid-rows.log, us): [4096,4096] 29 against 36,
# [4096,12288] 54 against 85, [24576,4096] 87 against 142; the whole form kept on [10240|12352,4096] (38, 40
# against 45, 52). From 192 rows the whole form wins everywhere.
MIDDLE = Tiles(128, 64, 64, 8, 4)
FEW_PROGRAMS = 64  # whole-form programs under which the middle tile's spread wins (about half the SMs)
# Past the middle tile's rows a product in K segments whose whole form at WHOLE's tile would run fewer
# programs than this (0: never) takes NARROW_WHOLE's, four times as many: a third of an H100's or H200's 132
# multiprocessors. H100, each product alone under a CUDA graph (docs/bench.md, forty-fifth session, us):
# Flash Next's hyper down rows [324, 10240] in 20 segments at 1,024 rows (24 programs) 82.1 -> 49.9 (33 a
# prefill on the H200), [640, 2560] at 1,024 (40) 26.8 -> 20.8; where the whole form runs 96 programs (those
# down rows at 4,096) it wins, 97.4 against 161.9, and at 160 ([2560, 4096] at 1,024) 76.0 against 82.7. The
# same bits (a tile's shape never changes them, tfd_kernels.gemm). An int, so that tfd bench --variant can
# sweep it.
NARROW_WHOLE_PROGRAMS = 44
NARROW_WHOLE = Tiles(64, 64, 128, 4, 3)


@attrs.frozen
class Plan:
    """The fixed choice for one weight shape: how K is cut into segments, and the tiles."""

    segments: int
    k_per_segment: int
    spread: Tiles = SPREAD
    whole: Tiles = WHOLE
    few: Tiles = FEW
    mid: Tiles = MID
    whole_one: Tiles = WHOLE_ONE
    middle: Tiles = MIDDLE
    narrow: Tiles = NARROW_WHOLE

    def whole_tiles(self, element_size: int = 2, rows: int = 0, n: int = 0) -> Tiles:
        """The whole form's tile: taller with one K segment (no second accumulator, where two
        spill on sm_90); the narrow tile for ``rows`` rows of an ``n``-column product in several
        segments that would run fewer than ``NARROW_WHOLE_PROGRAMS`` programs; its K step halved
        while its stages of ``element_size``-byte operands overflow shared memory (fp32 inputs)."""
        tiles = self.whole_one if self.segments == 1 else self.whole
        if self.segments > 1 and rows and tiles.programs(rows, n) < NARROW_WHOLE_PROGRAMS:
            tiles = self.narrow
        while tiles.block_k > 16 and tiles.stages * (tiles.block_m + tiles.block_n) * tiles.block_k \
                * element_size > SHARED_BYTES:
            tiles = attrs.evolve(tiles, block_k=tiles.block_k // 2)
        return tiles

    def spread_tiles(self, rows: int) -> Tiles:
        """The spread form's tile for ``rows`` rows: the smallest row block that holds them."""
        for tiles in (self.few, self.mid, self.spread):
            if rows <= tiles.block_m:
                return tiles
        return self.middle

    def spreads(self, rows: int, n: int, element_size: int = 2) -> bool:
        """Whether ``rows`` rows of an ``n``-column product run in the spread form: up to
        ``SPREAD_ROWS``, and up to the middle tile's rows where the whole form would run one K
        segment (its tile then twice the rows) or fewer than ``FEW_PROGRAMS`` programs."""
        if rows <= SPREAD_ROWS:
            return True
        if rows > self.middle.block_m:
            return False
        whole = self.whole_tiles(element_size)
        return self.segments == 1 or whole.programs(rows, n) < FEW_PROGRAMS


def plan(n: int, k: int, spread: Tiles = SPREAD, whole: Tiles = WHOLE, few: Tiles = FEW, mid: Tiles = MID,
         whole_one: Tiles = WHOLE_ONE, middle: Tiles = MIDDLE, narrow: Tiles = NARROW_WHOLE,
         target: int | None = None) -> Plan:
    """K segments for a weight of shape [n, k]; the same for every number of rows. Segments are
    whole K steps of every tile, as many as make about ``target`` programs (``TARGET_PROGRAMS``)."""
    step = max(t.block_k for t in (spread, whole, few, mid, whole_one, middle, narrow))
    k_tiles = math.ceil(k / step)
    n_tiles = math.ceil(n / spread.block_n)
    steps = NARROW_STEPS if n_tiles <= NARROW_TILES else SEGMENT_STEPS
    segments = max(1, min(math.ceil((target or TARGET_PROGRAMS) / n_tiles), k_tiles // steps))
    per_segment = math.ceil(k_tiles / segments)
    segments = math.ceil(k_tiles / per_segment)  # no segment left empty
    return Plan(segments, per_segment * step, spread, whole, few, mid, whole_one, middle, narrow)
