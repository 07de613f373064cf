"""The GDN prefill kernels on a fake pool: values against their torch reference (and that reference against
the model's chunked rule), bytes left untouched, and exact bits across a split at a chunk boundary and
for a lane alone or in a batch; at small head dims (one key piece) and wide ones (two, the second
masked, as at the real dims), and for batches of more chunks than cdiv(rows, CHUNK) + lanes."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import pytest
import torch
from gdn_shapes import ALIGN, TOL, Dims

from tfd.model import GDN_CHUNK
from tfd.model.gdn import chunked
from tfd_kernels import gdn_chunk, gdn_prefill

# 1500 rows of carried state, tf32x3 products and the GPU's approximate exp; the interpreter was within
# 2e-7 on outputs and 1e-6 on states at these sizes (bf16)
REAL_TOL = {"rtol": 1e-4, "atol": 1e-5}


@attrs.frozen
class Lane:
    start: int  # absolute position of its first row
    rows: int
    padding: bool = False


TINY = Dims(key_heads=2, value_heads=4, key_dim=16, value_dim=32)
ODD = Dims(key_heads=1, value_heads=3, key_dim=12, value_dim=40)  # masked key dims, two value blocks
# Key and value dims in two pieces of gdn_chunk.PIECE, the second part masked; three value blocks.
WIDE = Dims(key_heads=1, value_heads=2, key_dim=96, value_dim=80)
REAL = Dims(key_heads=16, value_heads=32, key_dim=128, value_dim=128)
# Aligned and unaligned starts, a lane within one chunk, a single row, padding.
MIXED = [Lane(0, 150), Lane(37, 100), Lane(70, 20), Lane(5, 1), Lane(3, 30, padding=True)]
REAL_LANES = [Lane(0, 700), Lane(37, 64), Lane(1000, 1500)]
# Two rows across a multiple of the chunk are two chunks: 14 chunks in 16 rows of 9 lanes.
STRADDLING = [*[Lane(64 * n + 63, 2) for n in range(6)], Lane(127, 2), Lane(5, 0), Lane(62, 2, padding=True)]


@attrs.frozen
class Batch:
    """A launch's inputs: q, k, v as views of one conv output [rows, q | k | v]; the lanes' bounds."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    cu_seqlens: torch.Tensor
    starts: torch.Tensor
    max_rows: int

    def run(self, rule: str, dims: Dims, pool: torch.Tensor, state_at: torch.Tensor) -> torch.Tensor:
        """``prefill`` or ``reference`` on this batch, the states at ``state_at`` in ``pool``."""
        return getattr(gdn_prefill, rule)(self.q, self.k, self.v, self.g, self.beta, pool.view(torch.float32),
                                          state_at, self.cu_seqlens, self.starts, dims.scale, self.max_rows)

    def part(self, spans: list[tuple[int, int]]) -> Batch:
        """Rows ``begin .. end`` of lane b (``spans[b]``) at their positions, as a batch of their own."""
        bounds = self.cu_seqlens.tolist()
        picks = [slice(bounds[b] + begin, bounds[b] + end) for b, (begin, end) in enumerate(spans)]
        q, k, v, g, beta = (torch.cat([t[pick] for pick in picks]) for t in
                            (self.q, self.k, self.v, self.g, self.beta))
        counts = [end - begin for begin, end in spans]
        starts = self.starts + torch.tensor([begin for begin, _ in spans], device=q.device)
        return Batch(q, k, v, g, beta, _cu(counts, q.device), starts, max(counts))


def _cu(counts: list[int], device: str | torch.device) -> torch.Tensor:
    return torch.tensor([0, *counts], dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)


def make_batch(dims: Dims, lanes: list[Lane], dtype: torch.dtype, device: str) -> Batch:
    gen = torch.Generator().manual_seed(sum(lane.rows for lane in lanes))
    rows = sum(lane.rows for lane in lanes)
    key_width = dims.key_heads * dims.key_dim
    mixed = torch.randn(rows, 2 * key_width + dims.value_heads * dims.value_dim, generator=gen)
    q, k, v = mixed.to(dtype).to(device).split([key_width, key_width, dims.value_heads * dims.value_dim], -1)
    g = -torch.rand(rows, dims.value_heads, generator=gen) * 0.3  # slow decay: state carries over chunks
    beta = torch.rand(rows, dims.value_heads, generator=gen)
    keys, values = (dims.key_heads, dims.key_dim), (dims.value_heads, dims.value_dim)
    counts = [lane.rows for lane in lanes]
    return Batch(q.unflatten(-1, keys), k.unflatten(-1, keys), v.unflatten(-1, values), g.to(device),
                 beta.to(device), _cu(counts, device),
                 torch.tensor([lane.start for lane in lanes], device=device), max(counts))


def make_pool(dims: Dims, lanes: list[Lane], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Random bytes holding each lane's state, scattered, 256-byte aligned, with gaps; the states' element
    offsets into the fp32 view, -1 for padding lanes."""
    gen = torch.Generator().manual_seed(len(lanes))
    slot = (dims.state * 4 // ALIGN + 2) * ALIGN
    pool = torch.randint(0, 256, (len(lanes) * slot + ALIGN,), dtype=torch.uint8, generator=gen)
    offsets = (torch.randperm(len(lanes), generator=gen) * slot + ALIGN) // 4
    offsets[[b for b, lane in enumerate(lanes) if lane.padding]] = -1
    view = pool.view(torch.float32)
    for at in offsets.tolist():  # states hold small numbers; the gaps keep their noise
        if at >= 0:
            view[at:at + dims.state] = torch.randn(dims.state, generator=gen) * 0.1
    return pool.to(device), offsets.to(device)


def states(pool: torch.Tensor, at: torch.Tensor, dims: Dims) -> torch.Tensor:
    """Each live lane's state as a row."""
    view = pool.view(torch.float32)
    return torch.stack([view[a:a + dims.state] for a in at.tolist() if a >= 0] or [view.new_zeros(0)])


def splice(into: torch.Tensor, src: torch.Tensor, at: torch.Tensor, dims: Dims) -> torch.Tensor:
    """``into`` with the live states copied from ``src``: equal to src iff nothing else moved."""
    out = into.clone()
    for a in at.tolist():
        if a >= 0:
            out[4 * a:4 * (a + dims.state)] = src[4 * a:4 * (a + dims.state)]
    return out


def lane_rows(lanes: list[Lane], device: str) -> torch.Tensor:
    """Which rows belong to live lanes."""
    return torch.cat([torch.full((lane.rows,), not lane.padding) for lane in lanes]).to(device)


@attrs.frozen
class Launch:
    """One prefill of a batch on a fresh pool: what each check begins with, made once a test where a test
    makes several checks of one batch (the same inputs give the same bits)."""

    batch: Batch
    pool: torch.Tensor  # as made, before the launch: each check clones it
    state_at: torch.Tensor
    out: torch.Tensor
    after: torch.Tensor  # the pool the launch left


def launched(dims: Dims, lanes: list[Lane], dtype: torch.dtype, device: str) -> Launch:
    batch = make_batch(dims, lanes, dtype, device)
    pool, state_at = make_pool(dims, lanes, device)
    after = pool.clone()
    out = batch.run("prefill", dims, after, state_at)
    return Launch(batch, pool, state_at, out, after)


def check_values(dims: Dims, lanes: list[Lane], dtype: torch.dtype, device: str,
                 tol: dict[str, float], launch: Launch | None = None) -> None:
    launch = launch or launched(dims, lanes, dtype, device)
    batch, state_at, out, pool = launch.batch, launch.state_at, launch.out, launch.after
    expected = launch.pool.clone()
    ref = batch.run("reference", dims, expected, state_at)
    live = lane_rows(lanes, device)
    torch.testing.assert_close(out[live], ref[live], **tol)
    assert not out[~live].any()
    torch.testing.assert_close(states(pool, state_at, dims), states(expected, state_at, dims), **tol)
    assert torch.equal(splice(expected, pool, state_at, dims), pool)
    empty = state_at[[b for b, lane in enumerate(lanes) if lane.rows == 0 and not lane.padding]]
    assert torch.equal(states(pool, empty, dims), states(expected, empty, dims))  # no rows: the same bits


def check_split(dims: Dims, lanes: list[Lane], dtype: torch.dtype, device: str,
                launch: Launch | None = None) -> None:
    """Each lane in two launches, cut at the last multiple of the chunk within its rows."""
    launch = launch or launched(dims, lanes, dtype, device)
    batch, state_at, out, whole = launch.batch, launch.state_at, launch.out, launch.after
    pool = launch.pool.clone()
    cuts = [max(0, (lane.start + lane.rows - 1) // GDN_CHUNK * GDN_CHUNK - lane.start) for lane in lanes]
    assert any(0 < cut < lane.rows for cut, lane in zip(cuts, lanes, strict=True))
    head = batch.part([(0, cut) for cut in cuts])
    tail = batch.part([(cut, lane.rows) for cut, lane in zip(cuts, lanes, strict=True)])
    first = head.run("prefill", dims, pool, state_at)
    second = tail.run("prefill", dims, pool, state_at)  # from the states the first launch left
    a, b = head.cu_seqlens.tolist(), tail.cu_seqlens.tolist()
    joined = [part for lane in range(len(lanes)) for part in
              (first[a[lane]:a[lane + 1]], second[b[lane]:b[lane + 1]])]
    assert torch.equal(torch.cat(joined), out)
    assert torch.equal(pool, whole)


def check_alone(dims: Dims, lanes: list[Lane], dtype: torch.dtype, device: str,
                launch: Launch | None = None) -> None:
    """Each lane launched by itself gives the bits it had in the batch: outputs and state."""
    launch = launch or launched(dims, lanes, dtype, device)
    batch, pool, state_at = launch.batch, launch.pool, launch.state_at
    out, together = launch.out, launch.after
    bounds = batch.cu_seqlens.tolist()
    for b, lane in enumerate(lanes):
        alone = pool.clone()
        one = Batch(*(t[bounds[b]:bounds[b + 1]] for t in (batch.q, batch.k, batch.v, batch.g, batch.beta)),
                    _cu([lane.rows], device), batch.starts[b:b + 1], lane.rows)
        at = state_at[b:b + 1]
        assert torch.equal(one.run("prefill", dims, alone, at), out[bounds[b]:bounds[b + 1]])
        if not lane.padding:
            assert torch.equal(states(alone, at, dims), states(together, at, dims))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_matches_reference_and_touches_only_live_states(dtype: torch.dtype) -> None:
    check_values(TINY, MIXED, dtype, "cpu", TOL)


def test_grouped_heads_odd_dims_and_an_empty_lane() -> None:
    check_values(ODD, [Lane(50, 80), Lane(9, 0), Lane(64, 3)], torch.float32, "cpu", TOL)


def test_wide_heads_in_pieces() -> None:
    lanes = [Lane(0, 130), Lane(37, 90), Lane(64, 1), Lane(3, 20, padding=True)]
    launch = launched(WIDE, lanes, torch.bfloat16, "cpu")  # the whole batch's pass, once for the three
    check_values(WIDE, lanes, torch.bfloat16, "cpu", TOL, launch)
    check_split(WIDE, lanes, torch.bfloat16, "cpu", launch)
    check_alone(WIDE, lanes, torch.bfloat16, "cpu", launch)


def test_more_chunks_than_rows_over_the_chunk_plus_lanes() -> None:
    rows = sum(lane.rows for lane in STRADDLING)
    assert -(-rows // GDN_CHUNK) + len(STRADDLING) < 14  # phase one's grid must bound the chunks otherwise
    check_values(TINY, STRADDLING, torch.float32, "cpu", TOL)
    launch = launched(TINY, STRADDLING, torch.bfloat16, "cpu")  # the whole batch's pass, once for both
    check_split(TINY, STRADDLING, torch.bfloat16, "cpu", launch)
    check_alone(TINY, STRADDLING, torch.bfloat16, "cpu", launch)


def test_reference_is_the_model_chunked_rule() -> None:
    dims, lane = TINY, Lane(37, 150)
    batch = make_batch(dims, [lane], torch.float32, "cpu")
    ratio = dims.value_heads // dims.key_heads

    def prepared(x: torch.Tensor) -> torch.Tensor:  # as tfd.model.gdn.gdn prepares q and k
        return (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(ratio, dim=1)

    state = torch.randn(dims.value_heads, dims.key_dim, dims.value_dim) * 0.1
    pool = torch.cat((torch.zeros(64), state.flatten(), torch.zeros(64)))
    expected = chunked(prepared(batch.q) * dims.scale, prepared(batch.k), batch.v, batch.g, batch.beta, state,
                       lane.start)
    out = batch.run("reference", dims, pool, torch.tensor([64]))
    assert gdn_prefill.CHUNK == GDN_CHUNK
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(pool[64:64 + dims.state], state.flatten(), **TOL)


def test_a_split_at_a_chunk_boundary_is_one_pass_bit_for_bit() -> None:
    check_split(TINY, [Lane(37, 150), Lane(0, 100), Lane(64, 70), Lane(3, 30, padding=True)], torch.bfloat16,
                "cpu")


def test_a_lane_alone_is_the_lane_in_a_batch() -> None:
    check_alone(TINY, [Lane(37, 100), Lane(0, 70), Lane(5, 1), Lane(9, 0), Lane(3, 30, padding=True)],
                torch.bfloat16, "cpu")


def test_launcher_names_the_bad_argument() -> None:
    lanes = [Lane(0, 4), Lane(2, 3)]
    batch = make_batch(TINY, lanes, torch.float32, "cpu")
    pool, state_at = make_pool(TINY, lanes, "cpu")
    view = pool.view(torch.float32)
    args = attrs.asdict(batch, recurse=False)

    def call(**change: object) -> None:
        given = {**args, "states": view, "state_at": state_at, "scale": TINY.scale, **change}
        gdn_prefill.prefill(**given)  # type: ignore[arg-type]

    for name, bad in (("k", batch.k.bfloat16()), ("g", batch.g[:, :3]), ("beta", batch.beta.double()),
                      ("states", pool), ("state_at", state_at.int()), ("cu_seqlens", batch.cu_seqlens.long()),
                      ("starts", batch.starts.float()), ("max_rows", -1)):
        with pytest.raises(ValueError, match=rf"^{name}\b"):
            call(**{name: bad})
    with pytest.raises(ValueError, match="heads"):
        call(v=batch.v[:, :3], g=batch.g[:, :3], beta=batch.beta[:, :3])


@pytest.mark.gpu
@pytest.mark.parametrize("refined", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_real_sizes_on_gpu(dtype: torch.dtype, refined: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gdn_chunk, "REFINED", refined)
    check_values(REAL, REAL_LANES, dtype, "cuda", REAL_TOL)
    check_split(REAL, REAL_LANES, dtype, "cuda")
    check_alone(REAL, REAL_LANES, dtype, "cuda")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_output_formed_in_the_walk_has_the_bits_of_its_own_launch(
        device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # fused, phase two forms each chunk's output; apart, phase three's launch reads the entering S and
    # V' back: the same products on the same values
    dims, lanes = (WIDE, MIXED) if device == "cpu" else (REAL, REAL_LANES)
    monkeypatch.setattr(gdn_prefill, "FUSE_PROGRAMS", 0)
    fused = launched(dims, lanes, torch.bfloat16, device)
    monkeypatch.setattr(gdn_prefill, "FUSE_PROGRAMS", 1 << 30)
    apart = launched(dims, lanes, torch.bfloat16, device)
    assert fused.out.any()
    assert torch.equal(fused.out, apart.out)
    assert torch.equal(fused.after, apart.after)


def test_the_walk_forms_the_output_from_two_programs_an_sm() -> None:
    # the walk's programs: value blocks (of BLOCK_V columns) x value heads x lanes, against 264
    assert gdn_prefill.FUSE_PROGRAMS == 264 and gdn_prefill.BLOCK_V == 32
    assert not gdn_prefill.fuses(128, 48, 1)  # Flash Next's one lane: 192
    assert gdn_prefill.fuses(128, 32, 8)  # the MoE shapes' eight: 1,024
    assert not gdn_prefill.fuses(128, 65, 1) and gdn_prefill.fuses(128, 66, 1)  # 260, 264
    assert not gdn_prefill.fuses(80, 21, 4) and gdn_prefill.fuses(80, 22, 4)  # 3 blocks of 80: 252, 264


@pytest.fixture
def tf32_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter's products as the tensor cores make them in one tf32 pass: fp32 operands rounded
    to 10 mantissa bits (the interpreter multiplies every dot in fp32 whatever its precision; tf32x3's
    products stay so)."""
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    exact = interpreter.InterpreterBuilder.create_dot

    def rounded(x: Any) -> Any:  # to nearest, ties away from zero, as cvt.rna.tf32.f32 rounds
        if x.data.dtype != np.float32:
            return x
        bits = (x.data.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
        return interpreter.TensorHandle(bits.view(np.float32), x.dtype)

    def create_dot(builder: Any, a: Any, b: Any, d: Any, precision: Any, imprecise: Any) -> Any:
        if precision == ir.INPUT_PRECISION.TF32:
            a, b = rounded(a), rounded(b)
        return exact(builder, a, b, d, precision, imprecise)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)


@pytest.mark.parametrize("refined", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_either_inverse_gives_the_values_split_and_alone(dtype: torch.dtype, refined: bool,
                                                         monkeypatch: pytest.MonkeyPatch, tf32_passes: None
                                                         ) -> None:
    # refined (the default): one-pass T and a Newton step, W and U in two passes from the raw 16-bit rows
    # (fp32 rows: at PRECISION), its products rounded as the GPU's: the one-pass T alone errs ~5e-4, past
    # TOL; not refined: every product at PRECISION (tf32x3)
    monkeypatch.setattr(gdn_chunk, "REFINED", refined)
    lanes = [Lane(0, 150), Lane(37, 100), Lane(70, 20), Lane(5, 1), Lane(3, 30, padding=True)]
    launch = launched(TINY, lanes, dtype, "cpu")  # the whole batch's pass, once for values and alone
    check_values(TINY, lanes, dtype, "cpu", TOL, launch)
    check_split(TINY, lanes[:3], dtype, "cpu")
    check_alone(TINY, lanes, dtype, "cpu", launch)
