"""The rows of one forward: their inputs (`stack_inputs`, both paths) and, for the engine's plain
twin (`EngineConfig(cache_pool=False)`), per-request growing caches stacked into one batched cache
and split back after the forward (a copy of every row's cache per step; the cache pool reads
the rows in place instead, `clover.model.cache_rows`).

Every row of a forward appends the same number of tokens, except prefill rows, whose caches are
empty: a prompt is left-padded, which is exact (padding keys are masked out, and a zero GDN input
leaves the zero state and conv context as they were). Cached prefixes of different lengths are
left-padded in the attention KV only; GDN states have no length. Padding never sits between real
tokens, so each row computes what it would compute alone (C4).
"""

from dataclasses import dataclass

import torch

from clover.model import CloverCache
from clover.model.cache import AttentionLayerCache


@dataclass
class BatchedCache:
    cache: CloverCache  # batch G, left-padded to the longest row
    key_mask: torch.Tensor  # [G, T_cached] long, 0 on padding
    pads: list[int]  # per row: left padding in front of its cached keys


@dataclass
class BatchedInput:
    input_ids: torch.Tensor  # [G, T_new]: [left pad, causal tokens, block]
    new_mask: torch.Tensor  # [G, T_new] long, 0 on padding
    pads: list[int]  # per row: left padding in front of its causal tokens


def _left_pad_cat(tensors: list[torch.Tensor], length: int) -> torch.Tensor:
    """[1, H, L_i, D] each -> [G, H, length, D], each row right-aligned."""
    first = tensors[0]
    out = first.new_zeros(len(tensors), first.shape[1], length, first.shape[3])
    for row, t in enumerate(tensors):
        if t.shape[2]:
            out[row, :, length - t.shape[2]:] = t[0]
    return out


def stack_caches(caches: list[CloverCache], empty: CloverCache) -> BatchedCache:
    """One batched cache from per-request caches (batch 1 each); `empty` receives the tensors.
    The per-request caches are not modified."""
    length = max(c.seq_length for c in caches)
    for i, layer in enumerate(empty.layers):
        parts = [c.layers[i] for c in caches]
        if isinstance(layer, AttentionLayerCache):
            layer.key = _left_pad_cat([p.key for p in parts], length)
            layer.value = _left_pad_cat([p.value for p in parts], length)
        else:
            layer.conv_state = torch.cat([p.conv_state for p in parts])
            layer.recurrent_state = torch.cat([p.recurrent_state for p in parts])
    empty.seq_length = length
    pads = [length - c.seq_length for c in caches]
    device = next(t for t in empty.layers[0].tensors().values() if t is not None).device
    mask = torch.tensor([[0] * p + [1] * (length - p) for p in pads], dtype=torch.long, device=device)
    return BatchedCache(empty, mask, pads)


def split_cache(batched: CloverCache, starts: list[int], empties: list[CloverCache]) -> list[CloverCache]:
    """Row r of `batched` from key index `starts[r]` on, copied so that no row pins the batch."""
    for row, (start, cache) in enumerate(zip(starts, empties)):
        for layer, src in zip(cache.layers, batched.layers):
            if isinstance(layer, AttentionLayerCache):
                layer.key = src.key[row:row + 1, :, start:].clone()
                layer.value = src.value[row:row + 1, :, start:].clone()
            else:
                layer.conv_state = src.conv_state[row:row + 1].clone()
                layer.recurrent_state = src.recurrent_state[row:row + 1].clone()
        cache.seq_length = batched.seq_length - start
    return empties


def stack_inputs(causal: list[list[int]], blocks: list[torch.Tensor], pad_id: int, device) -> BatchedInput:
    """Rows `[left pad, causal_r, block_r]`; blocks share one length."""
    width = max(len(c) for c in causal)
    pads = [width - len(c) for c in causal]
    prefix = torch.tensor([[pad_id] * p + c for p, c in zip(pads, causal)], dtype=torch.long, device=device)
    ids = torch.cat((prefix.view(len(causal), width), torch.stack(blocks).to(device)), dim=1)
    mask = torch.ones_like(ids)
    for row, p in enumerate(pads):
        mask[row, :p] = 0
    return BatchedInput(ids, mask, pads)
