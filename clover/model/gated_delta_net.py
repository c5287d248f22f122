"""Gated DeltaNet token mixer: causal (the backbone) and bidirectional block mode (SPEC §3.2)."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from .cache import GatedDeltaNetLayerCache
from .gated_delta_rule import gated_delta_rule
from .norms import RMSNormGated


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def causal_conv(x: torch.Tensor, context: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv. x [B, C, T]; context [B, C, K-1] (earlier inputs); weight [C, K]."""
    full = torch.cat((context.to(x.dtype), x), dim=-1)
    return F.conv1d(full, weight.unsqueeze(1), groups=x.shape[1])  # [B, C, T]


def right_conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Anti-causal branch: out_i = Σ_{k=1..K} w[:, k-1] · x_{i+k}, zero past the block end."""
    k = weight.shape[-1]
    shifted = F.pad(x, (0, k))[..., 1:]  # [B, C, T+K-1], starts at x_{i+1}
    return F.conv1d(shifted, weight.unsqueeze(1), groups=x.shape[1])


def block_softmax_readout(q, k, v, history, logit_scale, history_bias, history_c):
    """One softmax over the history unit and the block. q, k [B, H, L, K] (l2-normalised);
    v [B, H, L, V]; history [B, H, L, V] (= Sᵀ q̂)."""
    length = q.shape[2]
    scores = logit_scale * (q @ k.transpose(-1, -2))  # [B, H, L, L]
    history_score = (history_bias + history_c * math.log(length)).expand(*scores.shape[:-1], 1)
    p = torch.cat((history_score, scores), dim=-1).softmax(-1)
    return p[..., :1] * history + p[..., 1:] @ v


class GatedDeltaNet(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.head_k_dim = config.linear_key_head_dim
        self.head_v_dim = config.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.kernel = config.linear_conv_kernel_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        hidden = config.hidden_size

        self.in_proj_qkv = nn.Linear(hidden, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(hidden, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(hidden, self.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(hidden, self.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim,
                                bias=False, padding=self.kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads).uniform_(0.01, 16).log())
        self.norm = RMSNormGated(self.head_v_dim, eps=config.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, hidden, bias=False)
        # block-mode parameters (bd_gdn_* files)
        self.conv_right_weight = nn.Parameter(torch.zeros(self.conv_dim, self.kernel))
        self.logit_scale = nn.Parameter(torch.tensor(math.sqrt(self.head_k_dim)))
        self.history_bias = nn.Parameter(torch.tensor(0.0))
        self.history_c = nn.Parameter(torch.tensor(1.0))

    def _split_heads(self, mixed: torch.Tensor):
        """mixed [B, T, conv_dim] -> l2-normalised q, k [B, T, H_v, d_k] and v [B, T, H_v, d_v]."""
        b, t, _ = mixed.shape
        q, k, v = mixed.split((self.key_dim, self.key_dim, self.value_dim), dim=-1)
        q = l2norm(q.reshape(b, t, self.num_k_heads, self.head_k_dim).float())
        k = l2norm(k.reshape(b, t, self.num_k_heads, self.head_k_dim).float())
        groups = self.num_v_heads // self.num_k_heads
        if groups > 1:  # each q/k head serves `groups` consecutive value heads
            q, k = q.repeat_interleave(groups, dim=2), k.repeat_interleave(groups, dim=2)
        return q, k, v.reshape(b, t, self.num_v_heads, self.head_v_dim)

    def _causal(self, x_conv, a, b, context, state):
        """Backbone path over T causal tokens. Returns output [B, T, H_v, d_v], new context, new state."""
        weight = self.conv1d.weight.squeeze(1)
        mixed = F.silu(causal_conv(x_conv, context, weight)).transpose(1, 2)
        q, k, v = self._split_heads(mixed)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        out, state = gated_delta_rule(q, k, v, g, beta, self.head_k_dim ** -0.5, state)
        new_context = torch.cat((context.to(x_conv.dtype), x_conv), dim=-1)[..., -(self.kernel - 1):]
        return out, new_context, state

    def _block(self, x_conv, context, state):
        """Bidirectional block mode; reads context/state, writes nothing."""
        left = causal_conv(x_conv, context, self.conv1d.weight.squeeze(1))
        mixed = F.silu(left + right_conv(x_conv, self.conv_right_weight)).transpose(1, 2)
        q, k, v = self._split_heads(mixed)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H_v, L, d]
        history = (q * self.head_k_dim ** -0.5) @ state  # h_i = Sᵀ q̂_i, [B, H_v, L, d_v]
        out = block_softmax_readout(q, k, v.float(), history, self.logit_scale.float(),
                                    self.history_bias.float(), self.history_c.float())
        return out.transpose(1, 2).to(v.dtype)

    def forward(self, x, is_real, cache: GatedDeltaNetLayerCache | None, block_len: int):
        """x [B, T, hidden]; is_real [B, T] (False on left padding). The first T - block_len tokens
        run causally and update `cache`; the last `block_len` run in block mode and do not."""
        bsz, t, _ = x.shape
        x = x * is_real[..., None].to(x.dtype)
        x_conv = self.in_proj_qkv(x).transpose(1, 2)  # [B, conv_dim, T]
        z = self.in_proj_z(x).view(bsz, t, self.num_v_heads, self.head_v_dim)
        b, a = self.in_proj_b(x), self.in_proj_a(x)

        context = x_conv.new_zeros(bsz, self.conv_dim, self.kernel - 1)
        state = x_conv.new_zeros(bsz, self.num_v_heads, self.head_k_dim, self.head_v_dim, dtype=torch.float)
        if cache is not None and cache.conv_state is not None:
            context, state = cache.conv_state, cache.recurrent_state

        num_causal = t - block_len
        outs = []
        if num_causal:
            out, context, state = self._causal(x_conv[..., :num_causal], a[:, :num_causal],
                                               b[:, :num_causal], context, state)
            outs.append(out)
            if cache is not None:
                cache.conv_state, cache.recurrent_state = context, state
        if block_len:
            outs.append(self._block(x_conv[..., num_causal:], context, state))
        out = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]
        out = self.norm(out.reshape(-1, self.head_v_dim).to(x.dtype), z.reshape(-1, self.head_v_dim))
        return self.out_proj(out.reshape(bsz, t, -1))
