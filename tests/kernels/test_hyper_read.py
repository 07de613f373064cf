"""A hyper read in one launch (``tfd_kernels.hyper_read``) against the launches it replaces: the
write and norm (``hyper.write_norm``), the down product (``gemm.matmul``) and the mix (``hyper.mix``),
bit for bit, a row alone as in a batch, and twice in a row (its counters rearmed). Widths whose down
product has two K segments and two column tiles (the spread form's partials and arrival counts), rows
either side of the one row tile it serves."""

from __future__ import annotations

import pytest
import torch

from tfd.model import hyper as model_hyper
from tfd.model.fp8 import Joined
from tfd_kernels import gemm, gemm_plan, hyper, hyper_read

STREAMS, WIDTH, RANK = 4, 272, 80  # K = 1,088: two segments of the down rows [84 or 80, 1,088]


def inputs(rows: int, injects: bool, dtype: torch.dtype, width: int = WIDTH, rank: int = RANK,
           device: str = "cpu", seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    wide = STREAMS * width

    def draw(*shape: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale + shift).to(dtype).to(device)

    return {"stack": draw(rows, wide), "output": draw(rows, width),
            "scale": draw(rows, STREAMS, scale=0.2, shift=1), "norm": draw(wide, scale=0.1),
            "projections": draw(rank + (STREAMS if injects else 0), wide, scale=wide ** -0.5),
            "up": draw(wide, rank, scale=rank ** -0.5)}


def three_launches(x: dict[str, torch.Tensor], width: int = WIDTH
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(written, normed, block input, injection weights) by the launches one after another."""
    written, normed = hyper.write_norm(x["stack"], x["output"], x["scale"], x["norm"], 1e-6)
    block, weights = hyper.mix(gemm.matmul(normed, x["projections"]), x["up"], normed, STREAMS, width)
    return written, normed, block, weights


def same(got: torch.Tensor | None, want: torch.Tensor | None) -> bool:
    return (got is None and want is None) or (got is not None and want is not None and torch.equal(got, want))


def test_the_widths_tried_make_two_segments_and_two_column_tiles() -> None:
    choice = gemm_plan.plan(RANK + STREAMS, STREAMS * WIDTH)
    assert choice.segments == 2 and -(-(RANK + STREAMS) // choice.spread_tiles(1).block_n) == 2


@pytest.mark.parametrize("rows", [1, 16])  # one row; the most one launch serves (17: refused, below)
@pytest.mark.parametrize("injects", [True, False])
def test_a_read_in_one_launch_has_the_three_launches_bits(rows: int, injects: bool) -> None:
    x = inputs(rows, injects, torch.bfloat16)
    written, normed, block, weights = three_launches(x)
    for _ in range(2):  # the second launch finds its counters rearmed
        got_written, got_block, got_weights = hyper_read.written_mixed(
            x["stack"], x["output"], x["scale"], x["norm"], 1e-6, x["projections"], x["up"], STREAMS, WIDTH)
        assert torch.equal(got_written, written) and torch.equal(got_block, block)
        assert same(got_weights, weights)
        got_block, got_weights = hyper_read.mixed(normed, x["projections"], x["up"], STREAMS, WIDTH)
        assert torch.equal(got_block, block) and same(got_weights, weights)
    if rows > 1:  # a row alone, as in the batch
        alone = {name: value[3:4] if value.shape[0] == rows else value for name, value in x.items()}
        got = hyper_read.written_mixed(alone["stack"], alone["output"], alone["scale"], alone["norm"], 1e-6,
                                       alone["projections"], alone["up"], STREAMS, WIDTH)
        assert torch.equal(got[0][0], written[3]) and torch.equal(got[1][0], block[3])


def test_in_fp32_the_one_launch_has_the_three_launches_bits() -> None:
    x = inputs(3, True, torch.float32, width=40, rank=12)  # one segment, one column tile
    written, _, block, weights = three_launches(x, width=40)
    got = hyper_read.written_mixed(x["stack"], x["output"], x["scale"], x["norm"], 1e-6, x["projections"],
                                   x["up"], STREAMS, 40)
    assert torch.equal(got[0], written) and torch.equal(got[1], block) and same(got[2], weights)


def test_what_one_launch_does_not_serve_is_refused_by_name() -> None:
    x = inputs(17, True, torch.bfloat16, width=16, rank=12)
    assert hyper_read.fits(16, STREAMS, x["projections"], x["up"])
    assert not hyper_read.fits(17, STREAMS, x["projections"], x["up"])  # past one row tile
    assert not hyper_read.fits(0, STREAMS, x["projections"], x["up"])
    assert not hyper_read.fits(1, 3, x["projections"], x["up"])  # streams not a power of two
    joined = Joined((x["projections"][:12], x["projections"][12:]))
    assert not hyper_read.fits(1, STREAMS, joined, x["up"])  # parts multiplied each alone
    assert not hyper_read.fits(1, STREAMS, x["projections"].float(), x["up"])  # two dtypes
    with pytest.raises(ValueError, match=r"streams \[17, 64\].*1 to 16 rows"):
        hyper_read.mixed(x["stack"], x["projections"], x["up"], STREAMS, 16)
    with pytest.raises(ValueError, match=r"up \[64, 11\]"):
        hyper_read.mixed(x["stack"][:2], x["projections"], x["up"][:, :11], STREAMS, 16)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize("injects", [True, False])  # a layer's two modules; the final mixer
def test_on_the_gpu_a_read_in_one_launch_has_the_three_launches_bits(rows: int, injects: bool) -> None:
    """Flash Next's sizes (4 streams of 2,560, rank 320, bf16): the one launch (its 8 warps with the
    write, 4 without) against the three, eagerly and replayed from a CUDA graph three times."""
    x = inputs(rows, injects, torch.bfloat16, width=2560, rank=320, device="cuda", seed=rows)
    written, normed, block, weights = three_launches(x, width=2560)

    def one() -> tuple[torch.Tensor, ...]:
        w, b, i = hyper_read.written_mixed(x["stack"], x["output"], x["scale"], x["norm"], 1e-6,
                                           x["projections"], x["up"], STREAMS, 2560)
        b2, i2 = hyper_read.mixed(normed, x["projections"], x["up"], STREAMS, 2560)
        return (w, b, b2) if i is None else (w, b, b2, i, i2)

    want = (written, block, block) if weights is None else (written, block, block, weights, weights)
    assert all(torch.equal(g, w) for g, w in zip(one(), want, strict=True))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        one()  # compiled and allocated before the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = one()
    for _ in range(3):
        for out in captured:
            out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(g, w) for g, w in zip(captured, want, strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16, 17])  # either side of the one launch's rows
def test_on_the_gpu_the_models_read_is_the_same_in_one_two_or_three_launches(
        rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    x = inputs(rows, True, torch.bfloat16, width=2560, rank=320, device="cuda", seed=7)
    w = model_hyper.HyperWeights(norm=x["norm"], projections=x["projections"], up=x["up"], streams=STREAMS,
                                 width=2560, eps=1e-6)
    results = []
    for launches in (3, 2, 1):
        monkeypatch.setattr(hyper_read, "LAUNCHES", launches)
        results.append(model_hyper.read_after(w, x["stack"], (x["output"], x["scale"])))
    for got in results[1:]:
        assert all(same(g, want) for g, want in zip(got, results[0], strict=True))
