"""Gated DeltaNet: the token mixer (causal for the backbone, bidirectional in block mode, SPEC §3.2) and
the gated delta rule it runs.

Gated DeltaNet token mixer: causal (the backbone) and bidirectional block mode (SPEC §3.2).

The gated delta rule, three ways: `naive` (reference), `recurrent` (token steps), `chunk` (UT transform).

All take q, k [B, T, H, K] (already l2-normalised, heads already expanded to the value heads),
v [B, T, H, V], log-decay g [B, T, H] (<= 0) and beta [B, T, H]; queries are multiplied by `scale`.
The state S [B, H, K, V] evolves as  S_t = e^{g_t} (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ
and the output is o_t = S_tᵀ (scale · q_t). They return (o [B, T, H, V], S_T [B, H, K, V]).
Computation is in fp32 (fp64 for fp64 inputs, so tests can use an exact reference); the output is
cast back to v's dtype and the state is returned in the compute dtype.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from .cache import GatedDeltaNetLayerCache
from .norms import RMSNormGated

def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _to_heads_first(*xs):
    # [B, T, H, ...] -> [B, H, T, ...] in the compute dtype
    dtype = _compute_dtype(xs[2])
    return [x.transpose(1, 2).to(dtype) for x in xs]


def _zero_state(q, v):
    b, h, _, k = q.shape
    return q.new_zeros(b, h, k, v.shape[-1])


def naive_gated_delta_rule(q, k, v, g, beta, scale, initial_state=None):
    """Reference twin: builds each transition matrix e^{g}(I - β k kᵀ) explicitly."""
    out_dtype = v.dtype
    q, k, v, g, beta = _to_heads_first(q, k, v, g, beta)
    state = _zero_state(q, v) if initial_state is None else initial_state.to(q.dtype)
    eye = torch.eye(q.shape[-1], device=q.device, dtype=q.dtype)
    outs = []
    for t in range(q.shape[2]):
        kt, vt, bt = k[:, :, t], v[:, :, t], beta[:, :, t, None, None]
        transition = g[:, :, t, None, None].exp() * (eye - bt * kt[..., :, None] * kt[..., None, :])
        state = transition @ state + bt * kt[..., :, None] * vt[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t] * scale, state))
    return torch.stack(outs, 1).to(out_dtype), state


def recurrent_gated_delta_rule(q, k, v, g, beta, scale, initial_state=None):
    """One rank-1 update per token; the decode path (T = 1) and a second twin for tests."""
    out_dtype = v.dtype
    q, k, v, g, beta = _to_heads_first(q, k, v, g, beta)
    state = _zero_state(q, v) if initial_state is None else initial_state.to(q.dtype)
    out = torch.empty_like(v)
    for t in range(q.shape[2]):
        state = state * g[:, :, t, None, None].exp()
        kt = k[:, :, t]
        memory = torch.einsum("bhk,bhkv->bhv", kt, state)  # what S already predicts for k_t
        delta = (v[:, :, t] - memory) * beta[:, :, t, None]
        state = state + kt[..., :, None] * delta[..., None, :]
        out[:, :, t] = torch.einsum("bhk,bhkv->bhv", q[:, :, t] * scale, state)
    return out.transpose(1, 2).to(out_dtype), state


def chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state=None, chunk_size=64):
    """Chunked form. Inside a chunk with cumulative log-decay γ and written values u:
        S_i = e^{γ_i} S_0 + Σ_{j≤i} e^{γ_i-γ_j} k_j u_jᵀ,  u_i = β_i (v_i - e^{γ_i} S_0ᵀ k_i - Σ_{j<i} e^{γ_i-γ_j} (k_i·k_j) u_j)
    so (I + A) U = βV - β e^{γ} K S_0 with A strictly lower triangular: one triangular solve per
    chunk (for both right-hand sides), then one matmul per chunk carries S across chunks. A sequence
    shorter than `chunk_size` is one chunk of its own length (no padding).
    """
    out_dtype = v.dtype
    q, k, v, g, beta = _to_heads_first(q, k, v, g, beta)
    b, h, t, dk = q.shape
    c = min(chunk_size, t)
    pad = (c - t % c) % c
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (t + pad) // c
    q, k, v = (x.reshape(b, h, n, c, -1) for x in (q, k, v))  # [B, H, N, C, D]
    g, beta = g.reshape(b, h, n, c), beta.reshape(b, h, n, c)
    q = q * scale

    gamma = g.cumsum(-1)  # [B, H, N, C]
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    kk = k @ k.transpose(-1, -2)
    lower = (beta[..., :, None] * kk * decay).tril(-1)  # A
    system = lower + torch.eye(c, device=q.device, dtype=q.dtype)
    rhs = torch.cat((beta[..., None] * v, (beta * gamma.exp())[..., None] * k), dim=-1)  # [.., C, V+K]
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    w_values, w_keys = solved.split((v.shape[-1], dk), dim=-1)
    qk = (q @ k.transpose(-1, -2)) * decay
    q_decayed = q * gamma.exp()[..., None]
    k_to_end = k * (gamma[..., -1:] - gamma).exp()[..., None]
    chunk_decay = gamma[..., -1].exp()[..., None, None]  # [B, H, N, 1, 1]

    state = q.new_zeros(b, h, dk, v.shape[-1]) if initial_state is None else initial_state.to(q.dtype)
    out = torch.empty_like(v)
    for i in range(n):
        u = w_values[:, :, i] - w_keys[:, :, i] @ state
        out[:, :, i] = q_decayed[:, :, i] @ state + qk[:, :, i] @ u
        state = state * chunk_decay[:, :, i] + k_to_end[:, :, i].transpose(-1, -2) @ u
    out = out.reshape(b, h, n * c, -1)[:, :, :t]
    return out.transpose(1, 2).to(out_dtype), state


def _fla_available(x: torch.Tensor) -> bool:
    if not x.is_cuda:
        return False
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
    except ImportError:
        return False
    return True


def gated_delta_rule(q, k, v, g, beta, scale, initial_state=None):
    """Dispatch: flash-linear-attention kernels on CUDA when installed, the PyTorch twins elsewhere."""
    if _fla_available(q):
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_recurrent

        kernel = fla_recurrent if q.shape[1] == 1 else fla_chunk
        o, state = kernel(q, k, v, g=g.float(), beta=beta, scale=scale,
                          initial_state=None if initial_state is None else initial_state.float(),
                          output_final_state=True)
        return o.to(v.dtype), state.float()
    if q.shape[1] == 1:
        return recurrent_gated_delta_rule(q, k, v, g, beta, scale, initial_state)
    return chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state)


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
    bf16 forward turns oneDNN off (`modeling_clover_moe.matmul_kernels`), and PyTorch's own depthwise conv then loops
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
    right branch (zero past the block end). x [B, C, L]; context [B, C, K-1]; left/right [C, K].
    One depthwise conv with the 2K taps [left, right] over [context, x, K zeros]: output i reads
    x_{i-K+1..i} with the left taps and x_{i+1..i+K} with the right ones. Its twin,
    `causal_conv(x, context, left) + right_conv(x, right)`, is compared in the tests; one kernel
    call instead of two is 1.5x faster at the embedded model's and the released widths."""
    k = left.shape[-1]
    full = F.pad(torch.cat((context.to(x.dtype), x), dim=-1), (0, k))  # [B, C, K-1 + L + K]
    taps = torch.cat((left, right), dim=-1).unsqueeze(1)  # [C, 1, 2K]
    return F.conv1d(full, taps, groups=x.shape[1])  # [B, C, L]


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
