"""Sparse MoE: softmax top-k router, grouped expert dispatch, shared expert, block coreset (SPEC §5)."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Routing:
    weights: torch.Tensor  # [N, k], rows sum to 1 (zeros where an expert slot is unused)
    experts: torch.Tensor  # [N, k] expert ids


def topk_routing(probs: torch.Tensor, top_k: int) -> Routing:
    """probs [N, E] (softmax of router logits) -> each token's top-k, renormalised."""
    weights, experts = probs.topk(top_k, dim=-1)
    return Routing(weights / weights.sum(-1, keepdim=True), experts)


def coreset_keep(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """probs [B, L, E] of one block per row -> kept experts [B, E] (bool).

    A[e] sums P[t, e] over the tokens whose top-k contains e; the kept set is the smallest prefix
    of experts sorted by A whose mass reaches top_p · ΣA (never an expert with A = 0).
    """
    top_w, top_e = probs.topk(top_k, dim=-1)
    mass = torch.zeros(probs.shape[0], probs.shape[-1], dtype=probs.dtype, device=probs.device)
    mass.scatter_add_(1, top_e.flatten(1), top_w.flatten(1))  # A [B, E]
    chosen = mass > 0
    if top_p >= 1.0:  # exact C5: a rounding-saturated cumsum must not drop a chosen expert
        return chosen
    sorted_mass, order = mass.sort(dim=-1, descending=True)
    cumulative = sorted_mass.cumsum(-1)
    n_keep = (cumulative < top_p * cumulative[:, -1:]).sum(-1, keepdim=True) + 1
    n_keep = torch.minimum(n_keep, chosen.sum(-1, keepdim=True))
    keep_sorted = torch.arange(mass.shape[-1], device=mass.device)[None] < n_keep
    return torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)


def coreset_routing(probs: torch.Tensor, top_k: int, top_p: float) -> Routing:
    """Route each block token to its top-k among the row's kept experts, renormalised. probs [B, L, E]."""
    keep = coreset_keep(probs, top_k, top_p)
    masked = probs.masked_fill(~keep[:, None, :], 0.0)
    weights, experts = masked.topk(top_k, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    return Routing(weights.flatten(0, 1), experts.flatten(0, 1))


def distinct_experts(routing: Routing, batch: int, num_experts: int) -> torch.Tensor:
    """Number of distinct experts with nonzero weight per batch row -> [B]."""
    hits = torch.zeros(batch, num_experts, dtype=torch.int32, device=routing.weights.device)
    # scatter_add, not scatter_: an expert can appear in several slots with and without weight
    hits.scatter_add_(1, routing.experts.view(batch, -1), (routing.weights.view(batch, -1) > 0).int())
    return (hits > 0).sum(-1)


def use_grouped_mm(rows: torch.Tensor, weight: torch.Tensor) -> bool:
    """`F.grouped_mm` (torch >= 2.10) for inference on CPU in fp32/bf16/fp16: faster than the
    per-expert loop in benchmarks/forward.py (decode ~3%, 32-token block steps 5-15%, prefill ~5-10%).
    Not under autograd (its CPU backward fails in torch 2.13) and not on CUDA until measured there;
    the loop serves everything else."""
    return (hasattr(F, "grouped_mm") and rows.device.type == "cpu" and rows.shape[0] > 0
            and rows.dtype in (torch.float32, torch.bfloat16, torch.float16) and rows.dtype == weight.dtype
            and not (torch.is_grad_enabled() and (rows.requires_grad or weight.requires_grad)))


class Experts(nn.Module):
    """All routed experts as stacked weights (the fused checkpoint layout)."""

    def __init__(self, config):
        super().__init__()
        e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.num_experts = e
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))

    @staticmethod
    def _project(x: torch.Tensor, stacked, e: int) -> torch.Tensor:
        """x · expert e's weightᵀ: a slice of the float stack, or a `quantized.QuantizedWeight`."""
        return F.linear(x, stacked[e]) if isinstance(stacked, torch.Tensor) else stacked.matmul(x, e)

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = self._project(x, self.gate_up_proj, e).chunk(2, dim=-1)
        return self._project(F.silu(gate) * up, self.down_proj, e)

    def forward(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        """Grouped dispatch: sort the (token, slot) pairs by expert, run each expert on its rows, then
        add the weighted rows back per token. Slots with weight 0 (a coreset token with fewer than k
        kept experts) are skipped, so an expert no token keeps is never read."""
        k = routing.experts.shape[1]
        flat_experts = routing.experts.reshape(-1)
        flat_weights = routing.weights.reshape(-1)
        slots = flat_weights.nonzero().squeeze(-1)
        slots = slots[flat_experts[slots].argsort(stable=True)]  # grouped by expert
        tokens = slots // k
        counts = torch.bincount(flat_experts[slots], minlength=self.num_experts)  # rows per expert
        rows = x[tokens]  # [S, hidden], S = kept slots, in expert order
        if isinstance(self.gate_up_proj, nn.Parameter) and use_grouped_mm(rows, self.gate_up_proj):
            y = self.grouped_mm_forward(rows, counts)
        else:
            y = self.loop_forward(rows, counts)
        return torch.zeros_like(x).index_add_(0, tokens, y * flat_weights[slots, None].to(x.dtype))

    def grouped_mm_forward(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """rows [S, hidden] sorted by expert, counts [E] -> [S, hidden]: one grouped GEMM per projection."""
        offsets = counts.cumsum(0).to(torch.int32)
        gate, up = F.grouped_mm(rows, self.gate_up_proj.transpose(-2, -1), offs=offsets).chunk(2, dim=-1)
        return F.grouped_mm(F.silu(gate) * up, self.down_proj.transpose(-2, -1), offs=offsets)

    def loop_forward(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Same contract as `grouped_mm_forward`, one matmul pair per expert hit (differentiable twin)."""
        # split, not slices: under autograd each slice's backward writes a zero-filled copy of all
        # of `rows`, where split's backward concatenates the pieces once
        pieces = rows.split(counts.tolist())
        outs = [self._expert(e, piece) for e, piece in enumerate(pieces) if piece.shape[0]]
        if len(outs) == 1:
            return outs[0]
        return torch.cat(outs) if outs else rows

    def naive_forward(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        """Reference twin: every expert on every token, combined by dense routing weights."""
        dense = torch.zeros(x.shape[0], self.num_experts, dtype=x.dtype, device=x.device)
        dense.scatter_add_(1, routing.experts, routing.weights.to(x.dtype))
        all_out = torch.stack([self._expert(e, x) for e in range(self.num_experts)], dim=1)  # [N, E, H]
        return (dense[..., None] * all_out).sum(1)


class SharedExpert(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)
        return logits.to(torch.promote_types(logits.dtype, torch.float32)).softmax(-1)  # [N, E] fp32


class SparseMoeBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.gate = Router(config)
        self.experts = Experts(config)
        self.shared_expert = SharedExpert(config.hidden_size, config.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def route(self, probs: torch.Tensor, batch: int, block_len: int, coreset_top_p: float | None) -> Routing:
        """probs [B*T, E]. The last `block_len` tokens of each row form the block; with a coreset
        top-p they route among the row's kept experts, every other token routes plainly."""
        plain = topk_routing(probs, self.top_k)
        if not block_len or coreset_top_p is None:
            return plain
        t = probs.shape[0] // batch
        block = coreset_routing(probs.view(batch, t, -1)[:, t - block_len:], self.top_k, coreset_top_p)
        weights = plain.weights.view(batch, t, -1).clone()
        experts = plain.experts.view(batch, t, -1).clone()
        weights[:, t - block_len:] = block.weights.view(batch, block_len, -1).to(weights.dtype)
        experts[:, t - block_len:] = block.experts.view(batch, block_len, -1)
        return Routing(weights.flatten(0, 1), experts.flatten(0, 1))

    def forward(self, x: torch.Tensor, block_len: int = 0, coreset_top_p: float | None = None):
        """x [B, T, hidden] -> (out [B, T, hidden], distinct experts of the block per row [B] or None)."""
        bsz, t, h = x.shape
        flat = x.reshape(-1, h)
        routing = self.route(self.gate(flat), bsz, block_len, coreset_top_p)
        out = self.experts(flat, Routing(routing.weights.to(x.dtype), routing.experts))
        out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        counts = None
        if block_len:
            w = routing.weights.view(bsz, t, -1)[:, t - block_len:].reshape(-1, self.top_k)
            e = routing.experts.view(bsz, t, -1)[:, t - block_len:].reshape(-1, self.top_k)
            counts = distinct_experts(Routing(w, e), bsz, self.experts.num_experts)
        return out.view(bsz, t, h), counts
