"""Partial rotary position embedding: only the first `head_dim · partial_rotary_factor` dims rotate."""

import torch
from torch import nn


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
