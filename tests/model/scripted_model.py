"""A stand-in for `CloverMoeForCausalLM` with hand-made block-mode logits, to pin down stopping."""

from types import SimpleNamespace

import torch
from torch import nn

from clover.model import CloverCache
from tiny import tiny_config

VOCAB, MASK = 128, 127


def confidence_logit(confidence: float) -> float:
    """The logit x that gives probability `confidence` against VOCAB - 2 zero logits (mask excluded)."""
    return float(torch.tensor(confidence * (VOCAB - 2) / (1 - confidence)).log())


class ScriptedModel(nn.Module):
    """At real position `prompt_width + n` (padding not counted), block-mode logits favour
    `script[n] = (token, confidence)`; causal logits are zeros. Records every call's shape. A row
    whose prompt is shorter than `prompt_width` meets the script that many positions later."""

    def __init__(self, prompt_width: int, script: dict[int, tuple[int, float]], **config):
        super().__init__()
        self.config = tiny_config(**config)
        self.prompt_width, self.script = prompt_width, script
        self.anchor = nn.Parameter(torch.zeros(1))
        self.calls: list[tuple[int, int, int]] = []  # (batch, length, block_len)

    def new_cache(self, capacity: int = 0):
        return CloverCache([], capacity)

    def forward(self, input_ids, attention_mask=None, past_key_values=None, block_len=None,
                logits_to_keep=0, **kwargs):
        b, t = input_ids.shape
        block_len = block_len or 0
        self.calls.append((b, t, block_len))
        positions = (attention_mask.long().cumsum(-1) - 1)[:, -t:]  # [B, T] real positions
        logits = torch.zeros(b, t, VOCAB)
        for row in range(b):
            for i in range(t - block_len, t):
                n = int(positions[row, i]) - self.prompt_width
                token, confidence = self.script.get(n, (8, 0.2))
                logits[row, i, token] = confidence_logit(confidence)
        past_key_values.seq_length += t - block_len
        if isinstance(logits_to_keep, torch.Tensor):
            return SimpleNamespace(logits=logits[:, logits_to_keep])
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)
