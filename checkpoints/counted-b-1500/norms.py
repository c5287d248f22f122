"""RMS norms of the Qwen3.5 backbone: zero-centred (`x̂·(1+w)`) and gated (`x̂·w·SiLU(z)`).

Both normalise in fp32 (fp64 for an fp64 model, so tests can build an exact reference)."""

import torch
import torch.nn.functional as F
from torch import nn


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: the weight starts at 0 and the scale is `1 + weight`."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = _wide(x)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + _wide(self.weight))).type_as(x)


class RMSNormGated(nn.Module):
    """RMSNorm over the head dim, scaled by `weight`, then gated by `SiLU(gate)`."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = _wide(x)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * xf.to(dtype)
        return (out * F.silu(_wide(gate))).to(dtype)
