"""The GDN decode kernels on a fake pool: values against the torch reference, bytes left untouched,
a lane's bits alone and in a batch, and verify plus replay giving exactly decode's bits."""

from __future__ import annotations

import attrs
import pytest
import torch
from gdn_shapes import ALIGN, TOL, Dims

from tfd.model.gdn import recurrent
from tfd_kernels import gdn_decode, gdn_gates, gdn_reference

TINY = Dims(key_heads=2, value_heads=4, key_dim=16, value_dim=64)  # several value blocks a head
REAL = [Dims(16, heads, 128, 128) for heads in (32, 48, 64)]


def make_pool(lanes: int, sizes: list[int], padding: list[int],
              device: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Random bytes holding one piece of each fp32 size a lane, scattered, 256-byte aligned, with gaps;
    the pieces' element offsets into the fp32 view, one tensor per size, -1 for padding lanes."""
    gen = torch.Generator().manual_seed(lanes)
    slot = (max(sizes) * 4 // ALIGN + 2) * ALIGN
    pool = torch.randint(0, 256, (lanes * len(sizes) * slot + ALIGN,), dtype=torch.uint8, generator=gen)
    places = torch.randperm(lanes * len(sizes), generator=gen).view(len(sizes), lanes)
    offsets = (places * slot + ALIGN) // 4
    offsets[:, padding] = -1
    view = pool.view(torch.float32)
    for at in offsets[0].tolist():  # the states hold small numbers; other pieces keep their noise
        if at >= 0:
            view[at:at + sizes[0]] = torch.randn(sizes[0], generator=gen) * 0.1
    return pool.to(device), [at.to(device) for at in offsets]


def inputs(dims: Dims, lanes: int, rows: int, dtype: torch.dtype, device: str) -> list[torch.Tensor]:
    """q, k, v as the model has them: views of one conv output [lanes, rows, q | k | v]; g, beta."""
    gen = torch.Generator().manual_seed(rows)
    key_width = dims.key_heads * dims.key_dim
    mixed = torch.randn(lanes, rows, 2 * key_width + dims.value_heads * dims.value_dim, generator=gen)
    q, k, v = mixed.to(dtype).to(device).split([key_width, key_width, dims.value_heads * dims.value_dim], -1)
    g = -torch.rand(lanes, rows, dims.value_heads, generator=gen) * 2
    beta = torch.rand(lanes, rows, dims.value_heads, generator=gen)
    return [q.unflatten(-1, (dims.key_heads, dims.key_dim)), k.unflatten(-1, (dims.key_heads, dims.key_dim)),
            v.unflatten(-1, (dims.value_heads, dims.value_dim)), g.to(device), beta.to(device)]


def pieces(pool: torch.Tensor, at: torch.Tensor, size: int) -> torch.Tensor:
    """Each lane's fp32 piece as a row; zeros for padding lanes."""
    view = pool.view(torch.float32)
    return torch.stack([view[a:a + size] if a >= 0 else view.new_zeros(size) for a in at.tolist()])


def splice(into: torch.Tensor, src: torch.Tensor, ats: list[torch.Tensor], size: int) -> torch.Tensor:
    """``into`` with the live pieces at ``ats`` copied from ``src``: equal to src iff nothing else moved."""
    out = into.clone()
    for at in ats:
        for a in at.tolist():
            if a >= 0:
                out[4 * a:4 * (a + size)] = src[4 * a:4 * (a + size)]
    return out


def row(tensors: list[torch.Tensor], r: int) -> list[torch.Tensor]:
    return [t[:, r] for t in tensors]


def check_decode(dims: Dims, lanes: int, dtype: torch.dtype, device: str) -> None:
    pool, (state_at,) = make_pool(lanes, [dims.state], [1], device)
    args = row(inputs(dims, lanes, 1, dtype, device), 0)
    expected = pool.clone()
    ref = gdn_reference.reference(*args, expected.view(torch.float32), state_at, dims.scale)
    out = gdn_decode.decode(*args, pool.view(torch.float32), state_at, dims.scale)
    live = state_at >= 0
    torch.testing.assert_close(out[live], ref[live], **TOL)
    assert not out[~live].any()
    torch.testing.assert_close(pieces(pool, state_at, dims.state), pieces(expected, state_at, dims.state),
                               **TOL)
    assert torch.equal(splice(expected, pool, [state_at], dims.state), pool)


def check_gated(dims: Dims, lanes: int, dtype: torch.dtype, device: str) -> None:
    """Gates formed in the kernel from the projection's b and a: decode's bits with gdn_gates' g, beta."""
    pool, (state_at,) = make_pool(lanes, [dims.state], [1], device)
    q, k, v, _, _ = row(inputs(dims, lanes, 1, dtype, device), 0)
    gen = torch.Generator().manual_seed(lanes)
    projected = (torch.randn(lanes, 3 * dims.value_heads, generator=gen) * 4).to(dtype).to(device)
    b, a = projected[:, dims.value_heads:2 * dims.value_heads], projected[:, 2 * dims.value_heads:]
    a[0, 0] = 30.0  # past softplus's threshold
    a_log = torch.rand(dims.value_heads, generator=gen).to(device)
    dt_bias = torch.randn(dims.value_heads, generator=gen).to(dtype).to(device)
    beta, g = gdn_gates.gates(b, a, a_log, dt_bias)
    plain = pool.clone()
    want = gdn_decode.decode(q, k, v, g, beta, plain.view(torch.float32), state_at, dims.scale)
    got = gdn_decode.decode_gated(q, k, v, b, a, a_log, dt_bias, pool.view(torch.float32), state_at,
                                  dims.scale)
    assert torch.equal(got, want)
    assert torch.equal(pool, plain)
    check_verify_gated(dims, lanes, 3, dtype, device)


def check_verify_gated(dims: Dims, lanes: int, rows: int, dtype: torch.dtype, device: str) -> None:
    """A verify window's gates formed in the kernel: verify's bits (outputs, spare, log) with gdn_gates'."""
    size = max(dims.state, rows * dims.log_row)
    pool, (state_at, spare_at, log_at) = make_pool(lanes, [dims.state, size, size], [lanes - 1], device)
    q, k, v, _, _ = inputs(dims, lanes, rows, dtype, device)
    gen = torch.Generator().manual_seed(rows)
    projected = (torch.randn(lanes, rows, 3 * dims.value_heads, generator=gen) * 4).to(dtype).to(device)
    b, a = projected[..., dims.value_heads:2 * dims.value_heads], projected[..., 2 * dims.value_heads:]
    a[0, 1, 0] = 30.0  # past softplus's threshold
    a_log = torch.rand(dims.value_heads, generator=gen).to(device)
    dt_bias = torch.randn(dims.value_heads, generator=gen).to(dtype).to(device)
    beta, g = gdn_gates.gates(b.flatten(0, 1), a.flatten(0, 1), a_log, dt_bias)
    plain = pool.clone()
    view = plain.view(torch.float32)
    want = gdn_decode.verify(q, k, v, g.view(lanes, rows, -1), beta.view(lanes, rows, -1), view, state_at,
                             spare_at, view, log_at, dims.scale)
    view = pool.view(torch.float32)
    got = gdn_decode.verify_gated(q, k, v, b, a, a_log, dt_bias, view, state_at, spare_at, view, log_at,
                                  dims.scale)
    assert torch.equal(got, want)
    assert torch.equal(pool, plain)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gates_formed_in_the_kernel_give_decodes_bits(dtype: torch.dtype) -> None:
    check_gated(TINY, 3, dtype, "cpu")
    q, k, v, g, beta = row(inputs(TINY, 2, 1, dtype, "cpu"), 0)
    pool, (state_at,) = make_pool(2, [TINY.state], [1], "cpu")
    with pytest.raises(ValueError, match="a_log"):  # three heads' A_log for four value heads
        gdn_decode.decode_gated(q, k, v, g.to(dtype), beta.to(dtype), g[0, :3], g[0],
                                pool.view(torch.float32), state_at, TINY.scale)


def check_alone(dims: Dims, lanes: int, dtype: torch.dtype, device: str) -> None:
    pool, (state_at,) = make_pool(lanes, [dims.state], [1], device)
    args = row(inputs(dims, lanes, 1, dtype, device), 0)
    batch = pool.clone()
    out = gdn_decode.decode(*args, batch.view(torch.float32), state_at, dims.scale)
    for lane in range(lanes):
        alone = pool.clone()
        one = gdn_decode.decode(*(t[lane:lane + 1] for t in args), alone.view(torch.float32),
                                state_at[lane:lane + 1], dims.scale)
        assert torch.equal(one[0], out[lane])
        assert torch.equal(pieces(alone, state_at[lane:lane + 1], dims.state),
                           pieces(batch, state_at[lane:lane + 1], dims.state))


def check_verify(dims: Dims, lanes: int, rows: int, dtype: torch.dtype, device: str) -> None:
    size = max(dims.state, rows * dims.log_row)
    pool, (state_at, spare_at, log_at) = make_pool(lanes, [dims.state, size, size], [1], device)
    args = inputs(dims, lanes, rows, dtype, device)
    expected = pool.clone()
    ref = gdn_reference.reference_verify(*args, expected.view(torch.float32), state_at, spare_at,
                                      expected.view(torch.float32), log_at, dims.scale)
    view = pool.view(torch.float32)
    out = gdn_decode.verify(*args, view, state_at, spare_at, view, log_at, dims.scale)
    live = state_at >= 0
    torch.testing.assert_close(out[live], ref[live], **TOL)
    assert not out[~live].any()
    for at, width in ((spare_at, dims.state), (log_at, rows * dims.log_row)):
        torch.testing.assert_close(pieces(pool, at, width), pieces(expected, at, width), **TOL)
    expected = splice(expected, pool, [spare_at], dims.state)
    assert torch.equal(splice(expected, pool, [log_at], rows * dims.log_row), pool)


def check_identities(dims: Dims, lanes: int, rows: int, dtype: torch.dtype, device: str,
                     torch_path: bool = False) -> None:
    """Decode a launch a row == verify (outputs, spare) == replay of the first n logged rows, bit for bit:
    the kernels, or (``torch_path``) their torch references, which the CPU path decodes and commits with."""
    decode, verify, replay = gdn_decode.decode, gdn_decode.verify, gdn_decode.replay
    if torch_path:
        decode, verify = gdn_reference.reference, gdn_reference.reference_verify
        replay = gdn_reference.reference_replay
    size = max(dims.state, rows * dims.log_row)
    pool, (state_at, spare_at, log_at) = make_pool(lanes, [dims.state, size, size], [1], device)
    args = inputs(dims, lanes, rows, dtype, device)
    stepped = pool.clone()
    outs, states = [], [pieces(stepped, state_at, dims.state)]
    for r in range(rows):
        outs.append(decode(*row(args, r), stepped.view(torch.float32), state_at, dims.scale))
        states.append(pieces(stepped, state_at, dims.state))
    view = pool.view(torch.float32)
    out = verify(*args, view, state_at, spare_at, view, log_at, dims.scale)
    live = state_at >= 0
    assert torch.equal(out[live], torch.stack(outs, dim=1)[live])
    assert torch.equal(pieces(pool, spare_at, dims.state), states[rows])
    assert torch.equal(pieces(pool, state_at, dims.state), states[0])  # the committed state only read
    shape = {f.name: getattr(dims, f.name) for f in attrs.fields(Dims)}
    for n in range(rows + 1):
        scratch = pool.clone()
        kept = torch.full((lanes,), n, dtype=torch.int32, device=device)
        spare = scratch.view(torch.float32)
        replay(spare, log_at, spare, state_at, spare_at, kept, **shape)
        assert torch.equal(pieces(scratch, spare_at, dims.state), states[n])
        assert torch.equal(splice(pool, scratch, [spare_at], dims.state), scratch)
    kept = torch.arange(lanes, dtype=torch.int32, device=device) % (rows + 1)
    # two layers in one launch (offsets [layers, lanes]): the second a copy of the state in the spare's place
    copied = pool.clone()
    for at, to in zip(state_at.tolist(), spare_at.tolist(), strict=True):
        if at >= 0:
            copied.view(torch.float32)[to:to + dims.state] = copied.view(torch.float32)[at:at + dims.state]
    both = torch.stack((state_at, spare_at))
    replay(copied.view(torch.float32), torch.stack((log_at, log_at)), copied.view(torch.float32), both, both,
           kept, **shape)
    replay(view, log_at, view, state_at, state_at, kept, **shape)  # in place, a count a lane
    after = pieces(pool, state_at, dims.state)
    for lane, n in enumerate(kept.tolist()):
        assert torch.equal(after[lane], states[n][lane])
    for at in (state_at, spare_at):
        assert torch.equal(pieces(copied, at, dims.state), after)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_matches_reference_and_touches_only_live_states(dtype: torch.dtype) -> None:
    check_decode(TINY, 4, dtype, "cpu")


def test_grouped_heads_and_odd_dims() -> None:
    check_decode(Dims(key_heads=1, value_heads=3, key_dim=12, value_dim=40), 3, torch.float32, "cpu")


def test_a_lane_alone_is_the_lane_in_a_batch() -> None:
    check_alone(TINY, 4, torch.bfloat16, "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_matches_reference_and_leaves_the_committed_state(dtype: torch.dtype) -> None:
    check_verify(TINY, 4, 3, dtype, "cpu")


def test_decode_row_by_row_is_verify_and_replay_bit_for_bit() -> None:
    check_identities(TINY, 4, 3, torch.bfloat16, "cpu")


def test_reference_is_the_model_recurrence() -> None:
    dims, rows = TINY, 3
    q, k, v, g, beta = (t[0] for t in inputs(dims, 1, rows, torch.float32, "cpu"))
    ratio = dims.value_heads // dims.key_heads

    def prepared(x: torch.Tensor) -> torch.Tensor:  # as tfd.model.gdn.gdn prepares q and k
        return (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(ratio, dim=1)

    state = torch.randn(dims.value_heads, dims.key_dim, dims.value_dim) * 0.1
    states = torch.cat((torch.zeros(64), state.flatten(), torch.zeros(dims.state + 64 + rows * dims.log_row)))
    expected = recurrent(prepared(q) * dims.scale, prepared(k), v, g, beta, state, 0)
    at = torch.tensor([64]), torch.tensor([64 + dims.state]), torch.tensor([64 + 2 * dims.state])
    out = gdn_reference.reference_verify(q[None], k[None], v[None], g[None], beta[None], states, *at[:2],
                                         states, at[2], dims.scale)
    assert torch.equal(out[0], expected)
    assert torch.equal(states[64 + dims.state:64 + 2 * dims.state], state.flatten())


def test_launchers_name_the_bad_argument() -> None:
    pool, (state_at,) = make_pool(2, [TINY.state], [], "cpu")
    q, k, v, g, beta = row(inputs(TINY, 2, 1, torch.float32, "cpu"), 0)
    view = pool.view(torch.float32)
    with pytest.raises(ValueError, match="beta"):
        gdn_decode.decode(q, k, v, g, beta.double(), view, state_at, TINY.scale)
    with pytest.raises(ValueError, match="state_at"):
        gdn_decode.decode(q, k, v, g, beta, view, state_at.int(), TINY.scale)
    with pytest.raises(ValueError, match="states"):
        gdn_decode.decode(q, k, v, g, beta, pool, state_at, TINY.scale)
    with pytest.raises(ValueError, match="heads"):
        gdn_decode.decode(q, k, v[:, :3], g[:, :3], beta[:, :3], view, state_at, TINY.scale)
    with pytest.raises(ValueError, match="kept"):
        gdn_decode.replay(view, state_at, view, state_at, state_at, state_at, key_heads=2, value_heads=4,
                          key_dim=16, value_dim=64)


@pytest.mark.gpu
@pytest.mark.parametrize("dims", REAL, ids=lambda d: f"hv{d.value_heads}")
def test_real_sizes_on_gpu(dims: Dims) -> None:
    check_decode(dims, 64, torch.bfloat16, "cuda")
    check_gated(dims, 64, torch.bfloat16, "cuda")
    check_alone(dims, 8, torch.bfloat16, "cuda")
    check_verify(dims, 64, 4, torch.bfloat16, "cuda")
    check_identities(dims, 64, 4, torch.bfloat16, "cuda")


@pytest.mark.gpu
def test_decode_replays_in_a_cuda_graph() -> None:
    dims, lanes = REAL[0], 16
    pool, (state_at,) = make_pool(lanes, [dims.state], [1], "cuda")
    args = row(inputs(dims, lanes, 1, torch.bfloat16, "cuda"), 0)
    eager = pool.clone()
    expected = gdn_decode.decode(*args, eager.view(torch.float32), state_at, dims.scale)
    warm = pool.clone()
    gdn_decode.decode(*args, warm.view(torch.float32), state_at, dims.scale)  # compiles outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gdn_decode.decode(*args, pool.view(torch.float32), state_at, dims.scale)
    graph.replay()
    assert torch.equal(out, expected)
    assert torch.equal(pool, eager)


def check_loads_first(monkeypatch: pytest.MonkeyPatch, dims: Dims, lanes: int, dtype: torch.dtype,
                      device: str) -> None:
    """With a row's loads all asked for before the norms' reductions, decode gives the bits it gives
    without, the gated form decode's, and verify and replay decode's row by row."""
    pool, (state_at,) = make_pool(lanes, [dims.state], [1], device)
    args = row(inputs(dims, lanes, 1, dtype, device), 0)
    got = []
    for first in (False, True):
        monkeypatch.setattr(gdn_decode, "LOADS_FIRST", first)
        states = pool.clone()
        got.append((gdn_decode.decode(*args, states.view(torch.float32), state_at, dims.scale), states))
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])
    check_gated(dims, lanes, dtype, device)
    check_identities(dims, lanes, 3, dtype, device)


def test_loads_first_give_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    check_loads_first(monkeypatch, TINY, 3, torch.bfloat16, "cpu")


@pytest.mark.gpu
def test_loads_first_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    check_loads_first(monkeypatch, REAL[0], 32, torch.bfloat16, "cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_torch_verify_and_replay_give_the_torch_decode_bits(dtype: torch.dtype) -> None:
    # the CPU path's identities (tfd.model.verify commits with them)
    check_identities(TINY, 4, 3, dtype, "cpu", torch_path=True)
