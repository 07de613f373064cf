"""SwiGLU's middle and the GDN gates: the kernels against the model's torch arithmetic."""

from __future__ import annotations

import pytest
import torch

from tfd.model import ops
from tfd.model.gdn import gates
from tfd_kernels import gdn_gates, rope, sigmoid_gate, swiglu


def rand(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def test_swiglu_matches_the_model() -> None:
    h = rand(5, 2 * 1500, scale=3.0)  # more columns than a block
    assert torch.allclose(swiglu.swiglu(h), ops.swiglu(h), rtol=1e-6, atol=1e-6)


def test_swiglu_refuses_an_odd_width() -> None:
    with pytest.raises(ValueError, match="h must be"):
        swiglu.swiglu(torch.zeros(2, 7))


def test_gates_match_the_model_on_a_strided_projection() -> None:
    out = rand(4, 40, scale=8.0)  # b and a are column slices of one projection, as in the model
    b, a = out[:, 32:36], out[:, 36:40]
    a_log, dt_bias = rand(4, seed=1), rand(4, seed=2)
    a[0, 0] = 30.0  # past softplus's threshold
    beta, g = gdn_gates.gates(b, a, a_log, dt_bias)
    want_beta, want_g = gates(b, a, a_log, dt_bias)
    assert torch.allclose(beta, want_beta, rtol=1e-6, atol=1e-7)
    assert torch.allclose(g, want_g, rtol=1e-5, atol=1e-6)


def test_gates_refuse_mismatched_heads() -> None:
    with pytest.raises(ValueError, match="a_log"):
        gdn_gates.gates(torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(3), torch.zeros(4))


@pytest.mark.gpu
def test_on_the_device_rows_do_not_depend_on_the_batch() -> None:
    h = torch.randn(64, 2 * 12288, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(swiglu.swiglu(h[:3]), swiglu.swiglu(h)[:3])
    want = (ops.silu(h[:, :12288].cpu()) * h[:, 12288:].cpu()).float()
    assert ((swiglu.swiglu(h).cpu().float() - want).abs() <= 2 ** -7 * want.abs() + 1e-3).all()
    out = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    a_log, dt_bias = torch.rand(32, device="cuda"), torch.ones(32, device="cuda")
    beta, g = gdn_gates.gates(out[:, :32], out[:, 32:], a_log, dt_bias)
    one_beta, one_g = gdn_gates.gates(out[:1, :32], out[:1, 32:], a_log, dt_bias)
    assert torch.equal(one_beta, beta[:1]) and torch.equal(one_g, g[:1])


@pytest.mark.parametrize("rotary_dim", [8, 32])
def test_norm_rope_matches_the_model_on_a_strided_query(rotary_dim: int) -> None:
    from tfd.model.rope import Rotary

    rotary = Rotary.of(32, rotary_dim / 32, 10000.0)
    both = rand(5, 3, 64, scale=2.0)  # per head [query | gate], as attention's product lays them out
    query, weight = both[..., :32], rand(32, seed=3, scale=0.2)
    cos, sin = rotary.angles(torch.arange(100, 105), torch.float32)
    want = rotary.apply(ops.zrms(query, weight, 1e-6), cos, sin)
    assert torch.allclose(rope.norm_rope(query, weight, cos, sin, 1e-6), want, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_q_and_k_in_one_launch_are_two_launches_bit_for_bit(dtype: torch.dtype) -> None:
    from tfd.model.rope import Rotary

    rotary = Rotary.of(32, 0.5, 10000.0)
    projected = rand(5, 3 * 64 + 32, scale=2.0).to(dtype)  # [q|gate heads x 3 | k head], as the product
    query = projected[:, :192].view(5, 3, 64)[..., :32]
    key = projected[:, 192:].view(5, 1, 32)
    q_weight, k_weight = rand(32, seed=3, scale=0.2).to(dtype), rand(32, seed=4, scale=0.2).to(dtype)
    cos, sin = rotary.angles(torch.arange(100, 105), dtype)
    q, k = rope.norm_rope_pair(query, q_weight, key, k_weight, cos, sin, 1e-6)
    assert torch.equal(q, rope.norm_rope(query, q_weight, cos, sin, 1e-6))
    assert torch.equal(k, rope.norm_rope(key, k_weight, cos, sin, 1e-6))
    with pytest.raises(ValueError, match="do not fit"):  # k of other rows than the angles
        rope.norm_rope_pair(query, q_weight, key[:4], k_weight, cos, sin, 1e-6)


def test_sigmoid_gate_per_element_from_a_projection_slice() -> None:
    both = rand(3, 4, 2 * 8, scale=3.0)  # per head [query | gate], as attention's projection
    gate, out = both[..., 8:], rand(3, 32, seed=1)
    assert gate.stride(2) == 1 and not gate.is_contiguous()
    got = sigmoid_gate.sigmoid_gate(out, gate)
    assert torch.allclose(got, out * ops.sigmoid(gate.reshape(3, 32)), rtol=1e-6, atol=1e-7)


def test_sigmoid_gate_one_gate_a_row_plus_a_base() -> None:
    shared, gate, routed = rand(5, 1500, scale=2.0), rand(5, 1, seed=1), rand(5, 1500, seed=2)
    got = sigmoid_gate.sigmoid_gate(shared, gate, routed)
    assert torch.allclose(got, routed + ops.sigmoid(gate) * shared, rtol=1e-6, atol=1e-6)
    assert torch.equal(sigmoid_gate.sigmoid_gate(shared[2:3], gate[2:3], routed[2:3])[0], got[2])


def test_sigmoid_gate_refuses_a_gate_of_another_width() -> None:
    with pytest.raises(ValueError, match="gate"):
        sigmoid_gate.sigmoid_gate(torch.zeros(2, 8), torch.zeros(2, 3))


@pytest.mark.gpu
def test_sigmoid_gate_on_the_device() -> None:
    both = torch.randn(48, 16, 512, device="cuda", dtype=torch.bfloat16)  # q|gate heads of 256
    out = torch.randn(48, 4096, device="cuda", dtype=torch.bfloat16)
    got = sigmoid_gate.sigmoid_gate(out, both[..., 256:])
    assert torch.equal(sigmoid_gate.sigmoid_gate(out[:5], both[:5, :, 256:]), got[:5])
    want = (out.cpu() * ops.sigmoid(both[..., 256:].cpu().reshape(48, -1))).float()
    assert ((got.cpu().float() - want).abs() <= 2 ** -7 * want.abs() + 1e-3).all()


@pytest.mark.gpu
def test_on_the_device_a_base_is_added_to_the_rounded_product() -> None:
    """The shared expert's add: the product rounded to bf16 first, then the sum (the compiler left to
    itself contracts the two into one fma, a different value in a third of the elements)."""
    shared, routed = (torch.randn(33, 1500, device="cuda").bfloat16() for _ in range(2))
    gate = torch.randn(33, 1, device="cuda").bfloat16()
    assert torch.equal(sigmoid_gate.sigmoid_gate(shared, gate, routed),
                       routed + sigmoid_gate.sigmoid_gate(shared, gate))


@pytest.mark.gpu
def test_q_and_k_in_one_launch_on_the_device() -> None:
    from tfd.model.rope import Rotary

    rotary = Rotary.of(256, 0.25, 10000000.0, "cuda")  # the 9B's attention: 16 q heads, 4 kv heads of 256
    projected = torch.randn(33, 16 * 512 + 4 * 256, device="cuda", dtype=torch.bfloat16)
    query, key = projected[:, :8192].view(33, 16, 512)[..., :256], projected[:, 8192:].view(33, 4, 256)
    q_weight, k_weight = (torch.randn(256, device="cuda", dtype=torch.bfloat16) * 0.1 for _ in range(2))
    cos, sin = rotary.angles(torch.arange(1000, 1033, device="cuda"), torch.bfloat16)
    q, k = rope.norm_rope_pair(query, q_weight, key, k_weight, cos, sin, 1e-6)
    assert torch.equal(q, rope.norm_rope(query, q_weight, cos, sin, 1e-6))
    assert torch.equal(k, rope.norm_rope(key, k_weight, cos, sin, 1e-6))


def loads_first_and_after(monkeypatch: pytest.MonkeyPatch, device: str, rotary_dim: int) -> None:
    """q and k normalised and rotated with every read asked for before the norm's sum: the same bits."""
    from tfd.model.rope import Rotary

    rotary = Rotary.of(64, rotary_dim / 64, 10000.0)
    query, key = rand(5, 4, 64, scale=2.0).to(device).bfloat16(), rand(5, 1, 64, seed=1).to(device).bfloat16()
    q_weight, k_weight = rand(64, seed=3, scale=0.2).to(device), rand(64, seed=4, scale=0.2).to(device)
    cos, sin = (t.to(device) for t in rotary.angles(torch.arange(100, 105), torch.bfloat16))
    outputs = []
    for first in (False, True):
        monkeypatch.setattr(rope, "LOADS_FIRST", first)
        outputs.append(rope.norm_rope_pair(query, q_weight.bfloat16(), key, k_weight.bfloat16(), cos, sin,
                                           1e-6))
    assert torch.equal(outputs[0][0], outputs[1][0]) and torch.equal(outputs[0][1], outputs[1][1])


@pytest.mark.parametrize("rotary_dim", [16, 64])
def test_rope_reads_first_give_the_same_bits(monkeypatch: pytest.MonkeyPatch, rotary_dim: int) -> None:
    loads_first_and_after(monkeypatch, "cpu", rotary_dim)


@pytest.mark.gpu
def test_rope_reads_first_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    loads_first_and_after(monkeypatch, "cuda", 64)
