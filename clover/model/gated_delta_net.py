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


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The delta rule and the block readout run in fp32 (fp64 for an fp64 model, for references)."""
    return torch.promote_types(x.dtype, torch.float32)


def causal_conv(x: torch.Tensor, context: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv. x [B, C, T]; context [B, C, K-1] (earlier inputs); weight [C, K]."""
    full = torch.cat((context.to(x.dtype), x), dim=-1)
    if x.shape[-1] == 1:
        return recurrent_conv_step(full, weight)
    return F.conv1d(full, weight.unsqueeze(1), groups=x.shape[1])  # [B, C, T]


def recurrent_conv_step(window: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """One output of the depthwise conv: window [B, C, K] (the last K inputs), weight [C, K] -> [B, C, 1].
    A decode step runs this instead of `F.conv1d` (its twin, compared in the tests): a one-token
    bf16 forward turns oneDNN off (`cpu_kernels`), and PyTorch's own depthwise conv then loops
    over the channels (~170 ms for 8192 channels)."""
    dtype = compute_dtype(window)
    return (window.to(dtype) * weight.to(dtype)).sum(-1, keepdim=True).to(window.dtype)


def right_conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Anti-causal branch: out_i = Σ_{k=1..K} w[:, k-1] · x_{i+k}, zero past the block end."""
    k = weight.shape[-1]
    shifted = F.pad(x, (0, k))[..., 1:]  # [B, C, T+K-1], starts at x_{i+1}
    return F.conv1d(shifted, weight.unsqueeze(1), groups=x.shape[1])


def block_conv(x: torch.Tensor, context: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """Block-mode conv before SiLU: the causal taps (reading `context` before the block) plus the
    right branch (zero past the block end). x [B, C, L]; context [B, C, K-1]; left/right [C, K]."""
    return causal_conv(x, context, left) + right_conv(x, right)


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
        dtype = compute_dtype(mixed)
        q = l2norm(q.reshape(b, t, self.num_k_heads, self.head_k_dim).to(dtype))
        k = l2norm(k.reshape(b, t, self.num_k_heads, self.head_k_dim).to(dtype))
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
        dtype = compute_dtype(a)
        g = -self.A_log.to(dtype).exp() * F.softplus(a.to(dtype) + self.dt_bias)
        out, state = gated_delta_rule(q, k, v, g, beta, self.head_k_dim ** -0.5, state)
        full = torch.cat((context.to(x_conv.dtype), x_conv), dim=-1)
        # the last K-1 inputs (none if K=1); a copy, so the cache does not pin the whole prefill
        new_context = full[..., full.shape[-1] - (self.kernel - 1):].contiguous()
        return out, new_context, state

    def _block(self, x_conv, context, state):
        """Bidirectional block mode; reads context/state, writes nothing."""
        conv = block_conv(x_conv, context, self.conv1d.weight.squeeze(1), self.conv_right_weight)
        mixed = F.silu(conv).transpose(1, 2)
        q, k, v = self._split_heads(mixed)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H_v, L, d]
        history = (q * self.head_k_dim ** -0.5) @ state  # h_i = Sᵀ q̂_i, [B, H_v, L, d_v]
        scalars = (p.to(q.dtype) for p in (self.logit_scale, self.history_bias, self.history_c))
        out = block_softmax_readout(q, k, v.to(q.dtype), history, *scalars)
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
        state = x_conv.new_zeros(bsz, self.num_v_heads, self.head_k_dim, self.head_v_dim,
                                 dtype=compute_dtype(x_conv))
        if cache is not None and cache.conv_state is not None:
            context, state = cache.conv_state, cache.recurrent_state

        num_causal = t - block_len
        outs = []
        if num_causal:
            out, context, state = self._causal(x_conv[..., :num_causal], a[:, :num_causal],
                                               b[:, :num_causal], context, state)
            outs.append(out)
            if cache is not None:
                cache.write(context, state)
        if block_len:
            outs.append(self._block(x_conv[..., num_causal:], context, state))
        out = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]
        out = self.norm(out.reshape(-1, self.head_v_dim).to(x.dtype), z.reshape(-1, self.head_v_dim))
        return self.out_proj(out.reshape(bsz, t, -1))
