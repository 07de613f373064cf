"""MTP heads against a direct transcription of reference/model.md 2.8 and 3.9.

transformers ignores ``mtp.*``, so there is no library reference: this file writes the formulas
out once more in plain torch, independently of tfd.model, and holds the head to them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import tiny_models
import torch
import torch.nn.functional as F
from reference_loop import LanePool
from safetensors.torch import load_file

from support import CACHE
from tfd.checkpoint import Checkpoint
from tfd.families.hybrid import HybridModel, load_model
from tfd.model.memory import Span

LENGTH = 60
TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=tiny_models.FAMILIES)
def headed(request: pytest.FixtureRequest) -> Iterator[tuple[HybridModel, dict[str, torch.Tensor]]]:
    path = tiny_models.save(str(request.param), CACHE / "tiny-plain", head=True)
    model = load_model(Checkpoint.open(path), dtype=torch.float32, progress=False)
    yield model, load_file(path / "model.safetensors")


def zrms(x: torch.Tensor, w: torch.Tensor, group: int | None = None) -> torch.Tensor:
    shaped = x if group is None else x.unflatten(-1, (-1, group))
    normed = shaped / torch.sqrt(shaped.pow(2).mean(-1, keepdim=True) + 1e-6)
    return normed.reshape(x.shape) * (1 + w)


def rope(x: torch.Tensor, dim: int, positions: torch.Tensor | None = None, theta: float = 10000.0
         ) -> torch.Tensor:
    """x [n, heads, d], rotate-half on the first ``dim`` lanes at ``positions`` (0..n-1)."""
    positions = torch.arange(x.shape[0]) if positions is None else positions
    angles = positions[:, None].float() * theta ** (-torch.arange(0, dim, 2).float() / dim)
    cos, sin = torch.cat((angles, angles), -1).cos()[:, None], torch.cat((angles, angles), -1).sin()[:, None]
    head, rest = x[..., :dim], x[..., dim:]
    turned = torch.cat((-head[..., dim // 2:], head[..., :dim // 2]), -1)
    return torch.cat((head * cos + turned * sin, rest), -1)


def qsa_mask(t: dict[str, torch.Tensor], at: str, x: torch.Tensor, dim: int) -> torch.Tensor:
    """[n, n] True where query i may attend key j: the 2 best complete blocks of 4, and the tail."""
    heads, size = 8, 16
    qk = x @ t[f"{at}.indexer.index_qk_proj.weight"].T
    q = rope(zrms(qk[:, :heads * size].view(-1, heads, size), t[f"{at}.indexer.q_layernorm.weight"]), dim)
    raw = qk[:, heads * size:]
    n = x.shape[0]
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        blocks = (i + 1) // 4
        tail = list(range(4 * blocks, i + 1))
        chosen = []
        if blocks:
            means = raw[:4 * blocks].view(blocks, 4, size).mean(1)
            pooled = zrms(means, t[f"{at}.indexer.k_layernorm.weight"])
            pooled = rope(pooled[:, None], dim, torch.arange(blocks) * 4)[:, 0]  # at each block's start
            scores = torch.relu(q[i] @ pooled.T).sum(0) / math.sqrt(size)
            best = torch.sort(scores, descending=True, stable=True).indices[:16 // 4]
            chosen = [4 * int(b) + k for b in best for k in range(4)]
        mask[i, chosen + tail] = True
    return mask


def layer(t: dict[str, torch.Tensor], at: str, x: torch.Tensor, model: HybridModel) -> torch.Tensor:
    """One attention decoder layer over the block input x [n, width] (causal, or QSA-selected)."""
    cfg = model.cfg
    d, dim = cfg.head_dim, int(cfg.head_dim * cfg.rotary_fraction)
    qg = (x @ t[f"{at}.self_attn.q_proj.weight"].T).view(-1, cfg.heads, 2 * d)
    q = rope(zrms(qg[..., :d], t[f"{at}.self_attn.q_norm.weight"]), dim)
    k = rope(zrms((x @ t[f"{at}.self_attn.k_proj.weight"].T).view(-1, cfg.kv_heads, d),
                  t[f"{at}.self_attn.k_norm.weight"]), dim)
    v = (x @ t[f"{at}.self_attn.v_proj.weight"].T).view(-1, cfg.kv_heads, d)
    group = cfg.heads // cfg.kv_heads
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(d)
    n = x.shape[0]
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    if cfg.indexer is not None:
        allowed &= qsa_mask(t, f"{at}.self_attn", x, dim)
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
    out = torch.einsum("hij,jhd->ihd", weights, v).reshape(n, -1) * torch.sigmoid(qg[..., d:].reshape(n, -1))
    return out @ t[f"{at}.self_attn.o_proj.weight"].T


def feed_forward(t: dict[str, torch.Tensor], at: str, x: torch.Tensor, model: HybridModel) -> torch.Tensor:
    def swiglu(prefix: str, rows: torch.Tensor) -> torch.Tensor:
        gate, up = rows @ t[f"{prefix}.gate_proj.weight"].T, rows @ t[f"{prefix}.up_proj.weight"].T
        return (F.silu(gate) * up) @ t[f"{prefix}.down_proj.weight"].T

    if f"{at}.gate.weight" not in t:
        return swiglu(at, x)
    probs = torch.softmax(x @ t[f"{at}.gate.weight"].T, -1)
    top, experts = probs.topk(model.cfg.top_k, -1)
    top = top / top.sum(-1, keepdim=True)
    inner = model.cfg.expert_inner
    gate_up, down = t[f"{at}.experts.gate_up_proj"], t[f"{at}.experts.down_proj"]
    out = torch.stack([
        sum(w * ((F.silu(x[i] @ gate_up[e, :inner].T) * (x[i] @ gate_up[e, inner:].T)) @ down[e].T)
            for w, e in zip(top[i], experts[i].tolist(), strict=True))
        for i in range(x.shape[0])])
    shared = swiglu(f"{at}.shared_expert", x) * torch.sigmoid(x @ t[f"{at}.shared_expert_gate.weight"].T)
    return out + shared


def hyper_read(t: dict[str, torch.Tensor], at: str, stack: torch.Tensor, streams: int
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    width = stack.shape[-1] // streams
    normed = zrms(stack, t[f"{at}.hc_norm.weight"], width)
    mix = torch.sigmoid(F.silu(normed @ t[f"{at}.input_mix_weight_down.weight"].T / streams)
                        @ t[f"{at}.input_mix_weight_up.weight"].T)
    block = (mix * normed).view(-1, streams, width).mean(1)
    inject = t.get(f"{at}.block_inject_weight.weight")
    return block, None if inject is None else 2 * torch.sigmoid(normed @ inject.T / streams)


def transcribed(model: HybridModel, t: dict[str, torch.Tensor], previous: torch.Tensor,
                nexts: torch.Tensor) -> torch.Tensor:
    cfg, embed = model.cfg, t["model.embed_tokens.weight"]
    at = "mtp.layers.0"
    if cfg.streams == 1:  # model.md 2.8
        u = torch.cat((zrms(embed[nexts], t["mtp.pre_fc_norm_embedding.weight"]),
                       zrms(previous, t["mtp.pre_fc_norm_hidden.weight"])), -1) @ t["mtp.fc.weight"].T
        u = u + layer(t, at, zrms(u, t[f"{at}.input_layernorm.weight"]), model)
        u = u + feed_forward(t, f"{at}.mlp", zrms(u, t[f"{at}.post_attention_layernorm.weight"]), model)
        return zrms(u, t["mtp.norm.weight"]) @ t["lm_head.weight"].T
    # model.md 3.9: one norm statistic over all streams, fc_hidden per stream, embedding to each.
    e = zrms(embed[nexts], t["mtp.pre_fc_norm_embedding.weight"]) @ t["mtp.fc_embedding.weight"].T
    hn = zrms(previous, t["mtp.pre_fc_norm_hidden.weight"]).view(-1, cfg.streams, cfg.hidden)
    stack = ((hn @ t["mtp.fc_hidden.weight"].T) + e[:, None]).flatten(1)
    for part, block in (("attn", layer), ("mlp", feed_forward)):
        block_input, weights = hyper_read(t, f"{at}.{part}_hyper_connection", stack, cfg.streams)
        assert weights is not None
        name = f"{at}.self_attn" if part == "attn" else f"{at}.mlp"
        output = block(t, at if part == "attn" else name, block_input, model)
        stack = stack + (output[:, None] * weights[..., None]).flatten(1)
    mixed, _ = hyper_read(t, "mtp.hyper_connection_mixer", stack, cfg.streams)
    return mixed @ t["lm_head.weight"].T


def test_the_head_matches_its_formulas(headed: tuple[HybridModel, dict[str, torch.Tensor]]) -> None:
    model, tensors = headed
    tensors = {name.replace("model.language_model.", "model."): value for name, value in tensors.items()}
    ids = torch.randint(0, tiny_models.VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(2))
    lanes = LanePool(model, LENGTH, head=True)
    lane = lanes.open()
    main = lanes.forward([Span(lane, 0, ids)])
    previous = model.draft_input(main)[:-1]
    with torch.no_grad():
        cells = model.draft([Span(lane, 0, ids[1:])], previous, lanes.rows)
        ours = model.logits(cells.hidden)
        expected = transcribed(model, tensors, previous, ids[1:])
    assert float((ours - expected).abs().max() / expected.abs().max()) < TOLERANCE


Headed = tuple[HybridModel, dict[str, torch.Tensor]]


def test_cells_one_at_a_time_equal_cells_together(headed: Headed) -> None:
    model, _ = headed
    ids = torch.randint(0, tiny_models.VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(3))
    together, apart = LanePool(model, LENGTH, head=True), LanePool(model, LENGTH, head=True)
    lanes = (together.open(), apart.open())
    previous = model.draft_input(together.forward([Span(lanes[0], 0, ids)]))[:-1]
    apart.forward([Span(lanes[1], 0, ids)])
    with torch.no_grad():
        whole = model.draft([Span(lanes[0], 0, ids[1:])], previous, together.rows).hidden
        single = [model.draft([Span(lanes[1], t, ids[t + 1:t + 2], decode=True)], previous[t:t + 1],
                              apart.rows).hidden for t in range(LENGTH - 1)]
    assert torch.equal(torch.cat(single), whole)
