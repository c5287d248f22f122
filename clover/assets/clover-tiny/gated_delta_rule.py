"""The gated delta rule, three ways: `naive` (reference), `recurrent` (token steps), `chunk` (UT transform).

All take q, k [B, T, H, K] (already l2-normalised, heads already expanded to the value heads),
v [B, T, H, V], log-decay g [B, T, H] (<= 0) and beta [B, T, H]; queries are multiplied by `scale`.
The state S [B, H, K, V] evolves as  S_t = e^{g_t} (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ
and the output is o_t = S_tᵀ (scale · q_t). They return (o [B, T, H, V], S_T [B, H, K, V]).
Computation is in fp32 (fp64 for fp64 inputs, so tests can use an exact reference); the output is
cast back to v's dtype and the state is returned in the compute dtype.
"""

import torch
import torch.nn.functional as F


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
