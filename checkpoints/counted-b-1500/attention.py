"""Gated full attention (Qwen3.5): causal over the prefix, bidirectional inside the block, with partial
rotary position embedding (only the first `head_dim · partial_rotary_factor` dims rotate).
"""

import torch
import torch.nn.functional as F
from torch import nn

from .cache import AttentionLayerCache, AttentionRows
from .norms import RMSNorm

class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, partial_rotary_factor: float, theta: float):
        super().__init__()
        self.rotary_dim = int(head_dim * partial_rotary_factor)
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.float) / self.rotary_dim
        self.register_buffer("inv_freq", 1.0 / (theta ** exponents), persistent=False)

    @torch.no_grad()
    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype):
        """position_ids [B, T] -> (cos, sin), each [B, T, rotary_dim]."""
        freqs = position_ids[..., None].float() * self.inv_freq.to(position_ids.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos/sin [B, T, R] with R <= D. Dims past R pass through."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    return torch.cat((rot * cos + _rotate_half(rot) * sin, rest), dim=-1)


def prefix_block_mask(key_is_real: torch.Tensor, num_new: int, block_len: int) -> torch.Tensor:
    """Boolean visibility [B, 1, T_new, T_key] for T_new new tokens after T_key - T_new cached ones.

    New token i sits at key index P + i. It sees real keys j <= P + i (causal); the last `block_len`
    new tokens also see each other (the bidirectional block). Every query sees itself, so padding
    rows stay finite.
    """
    t_key = key_is_real.shape[1]
    past = t_key - num_new
    q_idx = torch.arange(num_new, device=key_is_real.device)[:, None] + past
    k_idx = torch.arange(t_key, device=key_is_real.device)[None, :]
    in_block = q_idx >= t_key - block_len
    visible = (k_idx <= q_idx) | (in_block & (k_idx >= t_key - block_len))
    visible = (visible[None] & key_is_real[:, None, :]) | (k_idx == q_idx)[None]
    return visible[:, None]


def attention_scores(q, k, mask, scale):
    """fp32 scores [B, H, T, S] of q [B,H,T,D] against k [B,Hkv,S,D] (GQA), -inf where `mask` hides."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    return ((q.float() @ k.float().transpose(-1, -2)) * scale).masked_fill(~mask, float("-inf"))


def naive_attention(q, k, v, mask, scale):
    """Reference twin of `F.scaled_dot_product_attention` with GQA: q [B,H,T,D], k/v [B,Hkv,S,D]."""
    v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    return (attention_scores(q, k, mask, scale).softmax(-1) @ v.float()).to(q.dtype)


class GatedAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.scale = self.head_dim ** -0.5
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim * 2, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.recorded: list | None = None  # a list: each call appends (query, keys, mask, num_causal)

    def forward(self, x, rotary, key_is_real, cache: AttentionLayerCache | None, block_len: int,
                num_causal: int):
        """x [B, T, hidden]; key_is_real [B, T_cache + T]. The first `num_causal` tokens are appended
        to `cache`; the block's keys are used for this call only."""
        b, t, _ = x.shape
        q_gate = self.q_proj(x).view(b, t, self.num_heads, 2 * self.head_dim)
        query, gate = q_gate.chunk(2, dim=-1)  # [B, T, H, D] each
        gate = gate.reshape(b, t, -1)
        query = self.q_norm(query).transpose(1, 2)  # [B, H, T, D]
        key = self.k_norm(self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        value = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rotary
        query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)

        if isinstance(cache, AttentionRows):
            out = self._attend_rows(query, key, value, cache, block_len)
        else:
            if cache is None:
                keys, values = key, value
            else:
                past = cache.length
                keys, values = cache.read(key, value)
                if num_causal:
                    cache.keep(keys, values, past + num_causal)
            mask = prefix_block_mask(key_is_real, t, block_len)
            if self.recorded is not None:  # the inputs of the attention weights, for copy supervision
                self.recorded.append((query, keys, mask, num_causal))
            out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=self.scale,
                                                 enable_gqa=self.num_heads != self.num_kv_heads)
        out = out.transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out * torch.sigmoid(gate))

    def _attend_rows(self, query, key, value, rows: AttentionRows, block_len: int) -> torch.Tensor:
        """Each row over its own cache, unpadded (`cache.RowsCache`): query [G, H, T, D], key/value
        [G, H_kv, T, D]. Row r's new tokens follow its `rows.pads[r]` padding, whose outputs stay 0."""
        out = query.new_zeros(query.shape)
        for r, (keys, values) in enumerate(rows.read(key, value)):  # [1, H_kv, L_r + T - pad, D]
            pad = rows.pads[r]
            real = torch.ones(1, keys.shape[2], dtype=torch.bool, device=keys.device)
            mask = prefix_block_mask(real, query.shape[2] - pad, block_len)
            out[r:r + 1, :, pad:] = F.scaled_dot_product_attention(
                query[r:r + 1, :, pad:], keys, values, attn_mask=mask, scale=self.scale,
                enable_gqa=self.num_heads != self.num_kv_heads)
        return out
