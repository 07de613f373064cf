"""A differentiable, whole-sequence forward of the qwen3_5 family (dense), MTP head included.

Training needs gradients through batches of whole sequences from position 0, with no cache. The
serving forward (``tfd.model``) is written for the other case: rows of several lanes flattened,
state and K/V rows written in place into the pool, products in fixed blocks of rows on the CPU and
Triton kernels without autograd on CUDA. So the layers are written again here from
reference/model.md 2.1-2.8 in plain torch, batched ``[batch, time, ...]``, with no in-place write
into a tensor that needs grad; what of ``tfd.model`` is pure and autograd-safe is reused (the
rotary angles and rotation, ``l2norm``, ``softplus``). Tests hold this forward to the serving one.

The weights are a dict of leaf tensors named exactly as the checkpoint names them
(``tfd.families.qwen3_5.expect``), so saving is ``safetensors`` of the dict. Under CUDA autocast the
products run in bf16; the residual stream, the norms' statistics and the delta rule stay fp32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch
import torch.nn.functional as F

from tfd.families.config import LINEAR, HybridConfig
from tfd.families.hybrid import expected_tensors
from tfd.families.random_weights import random_tensors
from tfd.model.ops import l2norm, softplus
from tfd.model.rope import Rotary
from tfd.train import delta_rule

FAMILY = "qwen3_5"
MTP_LAYER = "mtp.layers.0"


@attrs.frozen
class Output:
    """Per position t: the main model's logits (for x_{t+1}), its final hidden, and the MTP head's
    logits (for x_{t+2}) when the next tokens were given."""

    logits: torch.Tensor
    hidden: torch.Tensor
    draft_logits: torch.Tensor | None


@attrs.frozen
class TrainModel:
    """The model's shape and its weights by checkpoint name (leaf tensors, fp32 masters)."""

    cfg: HybridConfig
    params: dict[str, torch.Tensor] = attrs.field(repr=False)
    rotary: Rotary = attrs.field(repr=False)
    trunk: str = "model."

    @classmethod
    def random(cls, text_config: Mapping[str, Any], seed: int, device: torch.device | str = "cpu"
               ) -> TrainModel:
        """The config's weights drawn as ``tfd.families.random_weights`` draws them on the CPU
        (so a demo and its training start agree bit for bit), MTP head included, then moved."""
        _, _, shapes = expected_tensors(FAMILY, text_config, {"mtp.head"})
        return cls.from_tensors(text_config, random_tensors(shapes, seed), device)

    @classmethod
    def from_tensors(cls, text_config: Mapping[str, Any], tensors: Mapping[str, torch.Tensor],
                     device: torch.device | str = "cpu") -> TrainModel:
        """Fresh fp32 leaf copies of ``tensors`` on ``device`` that need grad.

        Refuses (``ValueError``) a config this forward does not cover (MoE, no MTP head) and a
        tensor missing or misshapen, by name.
        """
        cfg, naming, shapes = expected_tensors(FAMILY, text_config, tensors.keys())
        if cfg.experts or cfg.intermediate is None:
            raise ValueError("the training forward covers dense qwen3_5 models only (no MoE)")
        if not naming.has_mtp:
            raise ValueError("the training forward needs an MTP head (mtp.* tensors)")
        params: dict[str, torch.Tensor] = {}
        for name, shape in shapes.items():
            if name not in tensors:
                raise ValueError(f"tensor {name} is missing")
            if tuple(tensors[name].shape) != shape:
                raise ValueError(f"tensor {name} has shape {tuple(tensors[name].shape)}, expected {shape}")
            params[name] = tensors[name].detach().to(device=device, dtype=torch.float32).clone()
            params[name].requires_grad_(True)
        rotary = Rotary.of(cfg.head_dim, cfg.rotary_fraction, cfg.rope_theta, device)
        return cls(cfg, params, rotary, naming.trunk)

    def bf16(self) -> dict[str, torch.Tensor]:
        """The weights as a checkpoint stores them: bf16, contiguous, on the CPU."""
        return {name: t.detach().to(device="cpu", dtype=torch.bfloat16).contiguous()
                for name, t in self.params.items()}

    def forward(self, ids: torch.Tensor, nexts: torch.Tensor | None = None) -> Output:
        """``ids`` [batch, time] at positions 0..time-1; ``nexts`` [batch, time], the token after
        each position (x_{t+1}), asks for the MTP head's logits too."""
        p, cfg = self.params, self.cfg
        time = ids.shape[1]
        angles = self.rotary.angles(torch.arange(time, device=ids.device), torch.float32)
        x = p[f"{self.trunk}embed_tokens.weight"][ids]
        for i, kind in enumerate(cfg.layer_types):
            x = self.layer(f"{self.trunk}layers.{i}", kind, x, angles)
        hidden = zrms(x, p[f"{self.trunk}norm.weight"], cfg.eps)
        head = self.head_weight()
        drafts = None if nexts is None else F.linear(self.draft(hidden, nexts, angles), head)
        return Output(F.linear(hidden, head), hidden, drafts)

    def head_weight(self) -> torch.Tensor:
        if self.cfg.tie_embeddings:
            return self.params[f"{self.trunk}embed_tokens.weight"]
        return self.params["lm_head.weight"]

    def draft(self, hidden: torch.Tensor, nexts: torch.Tensor,
              angles: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The MTP head's final hidden per position t (model.md 2.8): fc of the normed embedding
        of x_{t+1} beside the normed main hidden h_t, one attention layer over the head's own
        positions, the head's norm."""
        p, eps = self.params, self.cfg.eps
        embed = p[f"{self.trunk}embed_tokens.weight"]
        embedded = zrms(embed[nexts], p["mtp.pre_fc_norm_embedding.weight"], eps)
        normed = zrms(hidden, p["mtp.pre_fc_norm_hidden.weight"], eps)
        u = F.linear(torch.cat((embedded, normed), dim=-1), p["mtp.fc.weight"]).float()  # an fp32 residual
        u = self.layer(MTP_LAYER, "full_attention", u, angles)
        return zrms(u, p["mtp.norm.weight"], eps)

    def layer(self, at: str, kind: str, x: torch.Tensor, angles: tuple[torch.Tensor, torch.Tensor]
              ) -> torch.Tensor:
        """One decoder layer (model.md 2.7): mixer and SwiGLU MLP between zero-centred norms."""
        p, eps = self.params, self.cfg.eps
        block = zrms(x, p[f"{at}.input_layernorm.weight"], eps)
        if kind == LINEAR:
            x = x + self.gdn(f"{at}.linear_attn", block)
        else:
            x = x + self.attention(f"{at}.self_attn", block, angles)
        block = zrms(x, p[f"{at}.post_attention_layernorm.weight"], eps)
        gate, up = (F.linear(block, p[f"{at}.mlp.{name}_proj.weight"]) for name in ("gate", "up"))
        return x + F.linear(F.silu(gate) * up, p[f"{at}.mlp.down_proj.weight"])

    def attention(self, at: str, x: torch.Tensor, angles: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Gated full attention (model.md 2.5), causal, through torch's fused attention."""
        p, cfg = self.params, self.cfg
        batch, time, _ = x.shape
        d = cfg.head_dim
        both = F.linear(x, p[f"{at}.q_proj.weight"]).view(batch, time, cfg.heads, 2 * d)
        query, gate = both[..., :d], both[..., d:]
        key = F.linear(x, p[f"{at}.k_proj.weight"]).view(batch, time, cfg.kv_heads, d)
        value = F.linear(x, p[f"{at}.v_proj.weight"]).view(batch, time, cfg.kv_heads, d)
        query = self.rotate(zrms(query, p[f"{at}.q_norm.weight"], cfg.eps), angles)
        key = self.rotate(zrms(key, p[f"{at}.k_norm.weight"], cfg.eps), angles)
        group = cfg.heads // cfg.kv_heads  # query head h reads kv head h // group
        out = F.scaled_dot_product_attention(
            query.transpose(1, 2), key.transpose(1, 2).repeat_interleave(group, dim=1),
            value.transpose(1, 2).repeat_interleave(group, dim=1), is_causal=True)
        out = out.transpose(1, 2).reshape(batch, time, -1) * torch.sigmoid(gate.reshape(batch, time, -1))
        return F.linear(out, p[f"{at}.o_proj.weight"])

    def rotate(self, x: torch.Tensor, angles: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Partial rotate-half RoPE of ``x`` [batch, time, heads, d] at positions 0..time-1 (text
        M-RoPE: every section at the same position, model.md 2.3)."""
        batch, time = x.shape[:2]
        cos, sin = (a.to(x.dtype).repeat(batch, 1) for a in angles)
        return self.rotary.apply(x.reshape(batch * time, *x.shape[2:]), cos, sin).view(x.shape)

    def gdn(self, at: str, x: torch.Tensor) -> torch.Tensor:
        """A Gated DeltaNet layer (model.md 2.4) over whole sequences from a zero state."""
        p, cfg = self.params, self.cfg
        batch, time, _ = x.shape
        key_width = cfg.key_heads * cfg.key_dim
        mixed = F.linear(x, p[f"{at}.in_proj_qkv.weight"])
        z = F.linear(x, p[f"{at}.in_proj_z.weight"]).view(batch, time, cfg.value_heads, cfg.value_dim)
        b, a = F.linear(x, p[f"{at}.in_proj_b.weight"]), F.linear(x, p[f"{at}.in_proj_a.weight"])
        mixed = F.silu(causal_conv(mixed, p[f"{at}.conv1d.weight"]))
        q, k, v = torch.split(mixed, [key_width, key_width, cfg.value_heads * cfg.value_dim], dim=-1)
        ratio = cfg.value_heads // cfg.key_heads  # value head j reads key head j // ratio
        q = l2norm(q.float().view(batch, time, cfg.key_heads, -1)).repeat_interleave(ratio, dim=2)
        k = l2norm(k.float().view(batch, time, cfg.key_heads, -1)).repeat_interleave(ratio, dim=2)
        v = v.float().view(batch, time, cfg.value_heads, -1)
        beta = torch.sigmoid(b.float())
        g = -torch.exp(p[f"{at}.A_log"].float()) * softplus(a.float() + p[f"{at}.dt_bias"].float())
        with torch.autocast(x.device.type, enabled=False):  # the rule's products stay fp32
            out = delta_rule.chunked(q * cfg.key_dim ** -0.5, k, v, g, beta)
        normed = gated_rms(out, z, p[f"{at}.norm.weight"], cfg.eps)
        return F.linear(normed.reshape(batch, time, -1), p[f"{at}.out_proj.weight"])


def causal_conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The depthwise causal conv of ``x`` [batch, time, channels] with ``weight`` [channels, 1,
    kernel]: row t is sum_j weight[:, j] x[t - kernel + 1 + j], zeros before the start. Written as
    shifted products: torch's grouped conv1d in bf16 on the CPU took seconds a call."""
    kernel, time = weight.shape[-1], x.shape[1]
    padded = F.pad(x, (0, 0, kernel - 1, 0))
    taps = weight[:, 0, :]
    out = padded[:, :time] * taps[:, 0]
    for j in range(1, kernel):
        out = out + padded[:, j:j + time] * taps[:, j]
    return out


def zrms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm (model.md 2.1): fp32 statistics, scale by 1 + weight, x's dtype back."""
    values = x.float()
    values = values * torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + eps)
    return (values * (1.0 + weight.float())).to(x.dtype)


def gated_rms(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The GDN output norm (model.md 2.2) per head: plain weight, times silu(gate), in fp32; the
    result in the gate's dtype."""
    values = x.float()
    values = values * torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * values * F.silu(gate.float())).to(gate.dtype)
